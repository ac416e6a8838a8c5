//! The language-independent state blob layout (`wit/operator.wit`, "Keyed state layout"):
//! `u32 state-count, { name, u32 entry-count, { key, value } }`, every length a u32 LE.
//! Keyed key-group blobs and the non-keyed `operator-state` share it.
//!
//! The host reads it only where it must: to redistribute non-keyed state on rescale, to
//! drop state an upgraded operator no longer declares, and to fold incremental snapshots
//! (delta blobs) into full ones on restore. Invariants: `decode(encode(x)) == x`;
//! `apply_delta(a, delta(a → b)) == b`; a malformed blob is an error, never a panic or a
//! partial result.
//!
//! A **delta blob** (what an `incremental` snapshot may return for a key group) has bit 31
//! of the state count set; its entries are upserts, and an entry whose value length is
//! `0xFFFF_FFFF` (no value bytes follow) removes the key.

use thiserror::Error;

/// One named state and its entries (key, value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedState {
    /// Declared name.
    pub name: String,
    /// Entries: (key, value) — keys are empty for non-keyed state.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// A blob that does not follow the layout.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("state blob is malformed at byte {at}: {what}")]
pub struct LayoutError {
    /// Offset.
    pub at: usize,
    /// What was expected.
    pub what: &'static str,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn u32(&mut self, what: &'static str) -> Result<u32, LayoutError> {
        let b = self.buf.get(self.pos..self.pos + 4).ok_or(LayoutError { at: self.pos, what })?;
        self.pos += 4;
        Ok(u32::from_le_bytes(b.try_into().unwrap()))
    }
    fn chunk(&mut self, what: &'static str) -> Result<&'a [u8], LayoutError> {
        let n = self.u32(what)? as usize;
        let b = self.buf.get(self.pos..self.pos + n).ok_or(LayoutError { at: self.pos, what })?;
        self.pos += n;
        Ok(b)
    }
}

/// Bit 31 of the state count: the blob is a delta.
pub const DELTA_FLAG: u32 = 0x8000_0000;
/// Value length of a removed key in a delta blob.
pub const TOMBSTONE: u32 = u32::MAX;

/// Whether `blob` is a delta (see the module docs).
pub fn is_delta(blob: &[u8]) -> bool {
    blob.len() >= 4 && u32::from_le_bytes(blob[..4].try_into().unwrap()) & DELTA_FLAG != 0
}

/// Decodes a full blob; empty means no state. A delta blob is an error (fold it into its
/// base with [`apply_delta`] first).
pub fn decode(blob: &[u8]) -> Result<Vec<NamedState>, LayoutError> {
    if blob.is_empty() {
        return Ok(Vec::new());
    }
    if is_delta(blob) {
        return Err(LayoutError { at: 0, what: "a full blob (this is a delta of an incremental snapshot)" });
    }
    let mut c = Cursor { buf: blob, pos: 0 };
    let n = c.u32("state count")?;
    let mut out = Vec::new();
    for _ in 0..n {
        let name = std::str::from_utf8(c.chunk("state name")?)
            .map_err(|_| LayoutError { at: c.pos, what: "UTF-8 state name" })?
            .to_string();
        let m = c.u32("entry count")?;
        let mut entries = Vec::new();
        for _ in 0..m {
            let k = c.chunk("entry key")?.to_vec();
            let v = c.chunk("entry value")?.to_vec();
            entries.push((k, v));
        }
        out.push(NamedState { name, entries });
    }
    if c.pos != blob.len() {
        return Err(LayoutError { at: c.pos, what: "end of blob" });
    }
    Ok(out)
}

/// The longest value in a blob, without decoding it (lengths are walked, nothing is copied).
pub fn max_value_len(blob: &[u8]) -> Result<usize, LayoutError> {
    walk(blob).map(|s| s.max_value)
}

/// What a walk over a blob found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobShape<'a> {
    /// The longest value.
    pub max_value: usize,
    /// The state names, in blob order.
    pub states: Vec<&'a [u8]>,
}

/// Walks a blob's framing (lengths only, nothing copied): its longest value and its state
/// names, or where it breaks the layout.
pub fn walk(blob: &[u8]) -> Result<BlobShape<'_>, LayoutError> {
    let mut shape = BlobShape::default();
    if blob.is_empty() {
        return Ok(shape);
    }
    let mut c = Cursor { buf: blob, pos: 0 };
    let mut max = 0;
    let count = c.u32("state count")?;
    let delta = count & DELTA_FLAG != 0;
    for _ in 0..count & !DELTA_FLAG {
        shape.states.push(c.chunk("state name")?);
        for _ in 0..c.u32("entry count")? {
            c.chunk("entry key")?;
            if delta && c.buf.get(c.pos..c.pos + 4) == Some(&TOMBSTONE.to_le_bytes()[..]) {
                c.pos += 4;
                continue;
            }
            max = max.max(c.chunk("entry value")?.len());
        }
    }
    if c.pos != blob.len() {
        return Err(LayoutError { at: c.pos, what: "end of blob" });
    }
    shape.max_value = max;
    Ok(shape)
}

/// One state's changes in a delta blob: (key, `Some(value)` upsert or `None` removal).
pub type DeltaState = (String, Vec<(Vec<u8>, Option<Vec<u8>>)>);

/// Decodes a delta blob.
pub fn decode_delta(blob: &[u8]) -> Result<Vec<DeltaState>, LayoutError> {
    let mut c = Cursor { buf: blob, pos: 0 };
    let count = c.u32("state count")?;
    if count & DELTA_FLAG == 0 {
        return Err(LayoutError { at: 0, what: "a delta blob (bit 31 of the state count)" });
    }
    let mut out = Vec::new();
    for _ in 0..count & !DELTA_FLAG {
        let name = std::str::from_utf8(c.chunk("state name")?)
            .map_err(|_| LayoutError { at: c.pos, what: "UTF-8 state name" })?
            .to_string();
        let mut entries = Vec::new();
        for _ in 0..c.u32("entry count")? {
            let k = c.chunk("entry key")?.to_vec();
            if c.buf.get(c.pos..c.pos + 4) == Some(&TOMBSTONE.to_le_bytes()[..]) {
                c.pos += 4;
                entries.push((k, None));
            } else {
                entries.push((k, Some(c.chunk("entry value")?.to_vec())));
            }
        }
        out.push((name, entries));
    }
    if c.pos != blob.len() {
        return Err(LayoutError { at: c.pos, what: "end of blob" });
    }
    Ok(out)
}

/// Encodes a delta blob (used by tests and native operators; guests write their own).
pub fn encode_delta(states: &[DeltaState]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(states.len() as u32 | DELTA_FLAG).to_le_bytes());
    for (name, entries) in states {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (k, v) in entries {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            match v {
                Some(v) => {
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    out.extend_from_slice(v);
                }
                None => out.extend_from_slice(&TOMBSTONE.to_le_bytes()),
            }
        }
    }
    out
}

/// Folds `next` (a key group's blob from a newer snapshot: full, which replaces, or a
/// delta, which patches) onto `base` (a full blob, empty = no state); returns a full blob.
/// Entries keep their order; new keys go to the end of their state; a state left with no
/// entries is dropped.
pub fn apply_delta(base: &[u8], next: &[u8]) -> Result<Vec<u8>, LayoutError> {
    fold([base, next])
}

/// Folds a key group's blobs, oldest first, into one full blob: what applying them one by
/// one with [`apply_delta`] gives, with the base decoded and the result encoded once (a
/// chain of many deltas costs one pass over the base per delta, not a decode and an encode).
pub fn fold<'a>(layers: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>, LayoutError> {
    let layers: Vec<&[u8]> = layers.into_iter().collect();
    // A full blob replaces everything below it.
    let from = layers.iter().rposition(|l| !is_delta(l));
    let (base, deltas) = match from {
        Some(i) => (layers[i], &layers[i + 1..]),
        None => (&[][..], &layers[..]),
    };
    if deltas.is_empty() {
        return Ok(base.to_vec());
    }
    let mut states = decode(base)?;
    for d in deltas {
        patch(&mut states, decode_delta(d)?);
    }
    Ok(encode(&states))
}

/// Applies one delta's changes to `states` in place (see [`apply_delta`]). A key changed
/// twice in the delta takes its last change.
fn patch(states: &mut Vec<NamedState>, delta: Vec<DeltaState>) {
    for (name, changes) in delta {
        let i = match states.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                states.push(NamedState { name, entries: Vec::new() });
                states.len() - 1
            }
        };
        let last: std::collections::HashMap<&[u8], usize> =
            changes.iter().enumerate().map(|(j, (k, _))| (k.as_slice(), j)).collect();
        let mut found = vec![false; changes.len()];
        states[i].entries.retain_mut(|(k, v)| match last.get(k.as_slice()) {
            None => true,
            Some(&j) => {
                found[j] = true;
                match &changes[j].1 {
                    Some(new) => {
                        v.clone_from(new);
                        true
                    }
                    None => false,
                }
            }
        });
        for (j, (k, v)) in changes.iter().enumerate() {
            if let Some(v) = v.as_ref().filter(|_| !found[j] && last[k.as_slice()] == j) {
                states[i].entries.push((k.clone(), v.clone()));
            }
        }
    }
    states.retain(|s| !s.entries.is_empty());
}

/// Encodes states; no states encode as an empty blob.
pub fn encode(states: &[NamedState]) -> Vec<u8> {
    if states.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    out.extend_from_slice(&(states.len() as u32).to_le_bytes());
    for s in states {
        out.extend_from_slice(&(s.name.len() as u32).to_le_bytes());
        out.extend_from_slice(s.name.as_bytes());
        out.extend_from_slice(&(s.entries.len() as u32).to_le_bytes());
        for (k, v) in &s.entries {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

/// Removes the states not in `keep` from a blob (for `--allow-non-restored-state` after an
/// upgrade dropped a state).
pub fn retain(blob: &[u8], keep: impl Fn(&str) -> bool) -> Result<Vec<u8>, LayoutError> {
    let mut states = decode(blob)?;
    states.retain(|s| keep(&s.name));
    Ok(encode(&states))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn states() -> impl Strategy<Value = Vec<NamedState>> {
        proptest::collection::vec(
            ("[a-z]{1,6}", proptest::collection::vec((any::<Vec<u8>>(), any::<Vec<u8>>()), 0..4))
                .prop_map(|(name, entries)| NamedState { name, entries }),
            0..4,
        )
    }

    proptest! {
        /// Fuzz (`PROPTEST_CASES=100000` for a longer run): every decoder of guest blobs and
        /// deltas on arbitrary bytes, and on a valid blob with bytes flipped, fails or
        /// succeeds, never panics.
        #[test]
        fn sandbox_fuzz_state_blobs_and_deltas_never_panic(
            s in states(),
            garbage in any::<Vec<u8>>(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        ) {
            let mut blob = encode(&s);
            for (at, x) in &flips {
                if !blob.is_empty() {
                    let i = at % blob.len();
                    blob[i] ^= x;
                }
            }
            for b in [&garbage[..], &blob[..]] {
                let _ = decode(b);
                let _ = decode_delta(b);
                let _ = max_value_len(b);
                let _ = retain(b, |n| n.len() % 2 == 0);
                let _ = apply_delta(&encode(&s), b);
                let _ = apply_delta(b, &garbage);
            }
        }

        #[test]
        fn round_trips_and_never_panics_on_garbage(s in states(), garbage in any::<Vec<u8>>()) {
            prop_assert_eq!(decode(&encode(&s)).unwrap(), s);
            let _ = decode(&garbage);
        }

        #[test]
        fn any_truncation_is_an_error(s in states().prop_filter("non-empty", |s| !s.is_empty())) {
            let b = encode(&s);
            for cut in 1..b.len() {
                prop_assert!(decode(&b[..cut]).is_err());
            }
        }
    }

    fn delta_between(a: &[NamedState], b: &[NamedState]) -> Vec<DeltaState> {
        let mut out = Vec::new();
        for sb in b {
            let old = a.iter().find(|s| s.name == sb.name);
            let mut ch = Vec::new();
            for (k, v) in &sb.entries {
                if old.and_then(|o| o.entries.iter().find(|e| &e.0 == k)).map(|e| &e.1) != Some(v) {
                    ch.push((k.clone(), Some(v.clone())));
                }
            }
            if let Some(o) = old {
                for (k, _) in &o.entries {
                    if !sb.entries.iter().any(|e| &e.0 == k) {
                        ch.push((k.clone(), None));
                    }
                }
            }
            out.push((sb.name.clone(), ch));
        }
        for sa in a {
            if !b.iter().any(|s| s.name == sa.name) {
                out.push((sa.name.clone(), sa.entries.iter().map(|e| (e.0.clone(), None)).collect()));
            }
        }
        out
    }

    /// Unique keys per state, non-empty states (what a guest's snapshot holds).
    fn table() -> impl Strategy<Value = Vec<NamedState>> {
        proptest::collection::btree_map(
            "[a-c]",
            proptest::collection::btree_map(proptest::collection::vec(0u8..4, 0..2), any::<Vec<u8>>(), 1..5),
            0..3,
        )
        .prop_map(|m| m.into_iter().map(|(name, e)| NamedState { name, entries: e.into_iter().collect() }).collect())
    }

    fn sorted(mut s: Vec<NamedState>) -> Vec<NamedState> {
        s.sort_by(|a, b| a.name.cmp(&b.name));
        for n in &mut s {
            n.entries.sort();
        }
        s
    }

    proptest! {
        #[test]
        fn a_delta_applied_to_its_base_gives_the_new_state(a in table(), b in table(), garbage in any::<Vec<u8>>()) {
            let d = encode_delta(&delta_between(&a, &b));
            prop_assert!(is_delta(&d));
            prop_assert_eq!(decode_delta(&d).unwrap(), delta_between(&a, &b));
            let folded = apply_delta(&encode(&a), &d).unwrap();
            prop_assert_eq!(sorted(decode(&folded).unwrap()), sorted(b.clone()));
            // A full blob replaces; deltas never decode as full blobs; garbage never panics.
            prop_assert_eq!(apply_delta(&encode(&a), &encode(&b)).unwrap(), encode(&b));
            prop_assert!(decode(&d).is_err());
            let _ = apply_delta(&encode(&a), &garbage);
            let _ = max_value_len(&garbage);
        }
    }

    proptest! {
        /// A chain (a full blob, then the deltas between successive states, maybe a full blob
        /// amid them) folds in one pass to the newest state, as applying it link by link does.
        #[test]
        fn a_chain_folds_in_one_pass_to_its_newest_state(
            tables in proptest::collection::vec(table(), 1..6), full_at in any::<proptest::sample::Index>()) {
            let full_at = full_at.index(tables.len());
            let mut layers = vec![encode(&tables[0])];
            for i in 1..tables.len() {
                layers.push(if i == full_at { encode(&tables[i]) } else { encode_delta(&delta_between(&tables[i - 1], &tables[i])) });
            }
            let folded = fold(layers.iter().map(|l| &l[..])).unwrap();
            prop_assert_eq!(sorted(decode(&folded).unwrap()), sorted(tables.last().unwrap().clone()));
            let stepwise = layers[1..].iter().try_fold(layers[0].clone(), |acc, l| apply_delta(&acc, l)).unwrap();
            prop_assert_eq!(sorted(decode(&stepwise).unwrap()), sorted(decode(&folded).unwrap()));
            // Deltas alone fold onto no state.
            let only: Vec<&[u8]> = layers[1..].iter().map(|l| &l[..]).collect();
            let from_nothing = fold(only.iter().copied()).unwrap();
            prop_assert!(decode(&from_nothing).is_ok());
        }
    }

    #[test]
    fn max_value_len_skips_removals_in_deltas() {
        let d = encode_delta(&[("s".into(), vec![(vec![1], None), (vec![2], Some(vec![0; 7]))])]);
        assert_eq!(max_value_len(&d).unwrap(), 7);
        assert!(max_value_len(&d[..d.len() - 1]).is_err());
    }

    #[test]
    fn max_value_len_walks_every_entry() {
        let s = vec![
            NamedState { name: "a".into(), entries: vec![(vec![1], vec![0; 3]), (vec![], vec![0; 9])] },
            NamedState { name: "b".into(), entries: vec![(vec![], vec![0; 5])] },
        ];
        assert_eq!(max_value_len(&encode(&s)).unwrap(), 9);
        assert_eq!(max_value_len(&[]).unwrap(), 0);
        assert!(max_value_len(&encode(&s)[..7]).is_err());
    }

    #[test]
    fn retain_removes_named_states() {
        let s = vec![
            NamedState { name: "a".into(), entries: vec![(vec![], vec![1])] },
            NamedState { name: "b".into(), entries: vec![(vec![], vec![2])] },
        ];
        let kept = decode(&retain(&encode(&s), |n| n == "b").unwrap()).unwrap();
        assert_eq!(kept, vec![s[1].clone()]);
        assert!(retain(&encode(&s), |_| false).unwrap().is_empty());
    }
}
