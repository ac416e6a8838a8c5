//! The language-independent state blob layout (`wit/operator.wit`, "Keyed state layout"):
//! `u32 state-count, { name, u32 entry-count, { key, value } }`, every length a u32 LE.
//! Keyed key-group blobs and the non-keyed `operator-state` share it.
//!
//! The host reads it only where it must: to redistribute non-keyed state on rescale and to
//! drop state an upgraded operator no longer declares. Invariant: `decode(encode(x)) == x`,
//! and a malformed blob is an error, never a panic or a partial result.

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

/// Decodes a blob; empty means no state.
pub fn decode(blob: &[u8]) -> Result<Vec<NamedState>, LayoutError> {
    if blob.is_empty() {
        return Ok(Vec::new());
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
    if blob.is_empty() {
        return Ok(0);
    }
    let mut c = Cursor { buf: blob, pos: 0 };
    let mut max = 0;
    for _ in 0..c.u32("state count")? {
        c.chunk("state name")?;
        for _ in 0..c.u32("entry count")? {
            c.chunk("entry key")?;
            max = max.max(c.chunk("entry value")?.len());
        }
    }
    Ok(max)
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
    fn retain_drops_named_states() {
        let s = vec![
            NamedState { name: "a".into(), entries: vec![(vec![], vec![1])] },
            NamedState { name: "b".into(), entries: vec![(vec![], vec![2])] },
        ];
        let kept = decode(&retain(&encode(&s), |n| n == "b").unwrap()).unwrap();
        assert_eq!(kept, vec![s[1].clone()]);
        assert!(retain(&encode(&s), |_| false).unwrap().is_empty());
    }
}
