//! Incremental checkpoints: which snapshot a subtask asks its operator for, and how a chain
//! of state files folds back into full state.
//!
//! A subtask's keyed state in checkpoint `n` is its own state file plus a **chain**: the
//! files of earlier checkpoints it builds on, oldest first, the oldest a full snapshot.
//! Each later file holds, per key group, either a full blob (replacing the group) or a delta
//! blob (patching it; `checkpoint/layout.rs`); a key group absent from a file has no state.
//!
//! Invariants (all enforced here, tested below):
//! - a chain starts with a full snapshot: after a restore, a live upgrade, a lost base
//!   (a write failed, a snapshot was declined before it was written) the next snapshot is
//!   full — except for a disk operator restored whole and unmigrated from its job's own
//!   checkpoint: its store then holds exactly that chain's state, and the chain goes on
//!   ([`IncrementalPolicy::resume`]), as a full scan of a store far larger than memory could
//!   outlast the checkpoint timeout;
//! - forced snapshots are full: every operator's in a savepoint, so a savepoint never
//!   depends on another directory, and in a live upgrade's checkpoint the upgraded
//!   operator's when its new instances restore from it (not on a disk hand-over, whose
//!   store stays; the other operators' chains go on too);
//! - a chain is compacted once it has `max_links` files or its deltas add up to more than
//!   the full snapshot they patch, so restore reads at most about twice the state: by a full
//!   next snapshot, or (disk operators, whose full snapshot scans their whole store) by
//!   folding its files into one in the background (`checkpoint/compaction.rs`), which later
//!   snapshots build on once it is written — the chain it replaces must still be theirs;
//! - folding `[full, d1, …, dn]` gives the state the operator had at `dn`: only keyed data
//!   comes from the chain; timers, non-keyed state, positions and logs come from the newest
//!   file alone (they are written whole every time).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checkpoint::layout::{self, LayoutError};
use crate::checkpoint::snapshot::KeyGroupSnapshot;
use crate::ids::CheckpointId;

/// One earlier state file a subtask's state builds on: `chk-<checkpoint>/<file>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainLink {
    /// The checkpoint whose directory holds the file.
    pub checkpoint: u64,
    /// The file name in that directory.
    pub file: String,
}

/// Default compaction threshold: at most this many files in a chain (base included).
pub const MAX_LINKS: usize = 8;

/// Per-subtask bookkeeping of the chain (pure; the task asks it, then reports).
#[derive(Debug, Clone)]
pub struct IncrementalPolicy {
    enabled: bool,
    max_links: usize,
    /// Files the next incremental snapshot builds on, oldest (full) first, with the keyed
    /// bytes of each.
    chain: Vec<(ChainLink, u64)>,
    /// Snapshots taken and not yet handed to the writer: the chain each one references.
    pending: BTreeMap<CheckpointId, Vec<ChainLink>>,
    /// A long chain is folded into one file in the background (`checkpoint/compaction.rs`)
    /// instead of being restarted by a full snapshot.
    background: bool,
    /// The chain prefix being folded in the background.
    compacting: Option<Vec<ChainLink>>,
}

impl IncrementalPolicy {
    /// `enabled` = `[checkpoint] incremental` in the job file.
    pub fn new(enabled: bool) -> Self {
        IncrementalPolicy {
            enabled,
            max_links: MAX_LINKS,
            chain: Vec::new(),
            pending: BTreeMap::new(),
            background: false,
            compacting: None,
        }
    }

    /// With a different compaction threshold.
    pub fn with_max_links(mut self, n: usize) -> Self {
        self.max_links = n.max(1);
        self
    }

    /// Long chains are folded in the background ([`IncrementalPolicy::compaction`]), so only
    /// the first snapshot, forced ones and those after a reset are full.
    pub fn in_background(mut self) -> Self {
        self.background = true;
        self
    }

    /// The chain has as many files as it may, or its deltas outweigh the full state they patch.
    fn too_long(&self) -> bool {
        let full = self.chain.first().map_or(0, |(_, b)| *b);
        let deltas: u64 = self.chain.iter().skip(1).map(|(_, b)| *b).sum();
        self.chain.len() >= self.max_links || deltas > full
    }

    /// Whether the snapshot for checkpoint `forced_full = false` may be incremental.
    pub fn wants_full(&self, forced_full: bool) -> bool {
        !self.enabled || forced_full || self.chain.is_empty() || (!self.background && self.too_long())
    }

    /// With background compaction: the chain to fold into one file now, if it is too long
    /// and none is being folded. Report the outcome with [`IncrementalPolicy::compacted`] or
    /// [`IncrementalPolicy::compaction_failed`].
    pub fn compaction(&mut self) -> Option<Vec<ChainLink>> {
        if !self.enabled || !self.background || self.compacting.is_some() || self.chain.len() < 2 || !self.too_long() {
            return None;
        }
        let links: Vec<ChainLink> = self.chain.iter().map(|(l, _)| l.clone()).collect();
        self.compacting = Some(links.clone());
        Some(links)
    }

    /// The chain [`IncrementalPolicy::compaction`] handed out was folded into `into`
    /// (`keyed_bytes` of keyed data): later snapshots build on it instead, if the chain still
    /// starts with what was folded (a reset since leaves the folded file unused). Returns
    /// whether the chain now builds on `into`.
    pub fn compacted(&mut self, into: ChainLink, keyed_bytes: u64) -> bool {
        let Some(prefix) = self.compacting.take() else { return false };
        let still = self.chain.len() >= prefix.len() && self.chain.iter().zip(&prefix).all(|((l, _), p)| l == p);
        if still {
            self.chain.splice(..prefix.len(), [(into, keyed_bytes)]);
        }
        still
    }

    /// The background fold failed: from now on this chain is restarted by full snapshots.
    pub fn compaction_failed(&mut self) {
        self.compacting = None;
        self.background = false;
    }

    /// A snapshot for `id` was taken (`full` or not) with `keyed_bytes` of keyed data, to be
    /// written as `file`. Returns the chain it references (empty for a full one).
    pub fn taken(&mut self, id: CheckpointId, file: &str, full: bool, keyed_bytes: u64) -> Vec<ChainLink> {
        if full {
            self.chain.clear();
        }
        let refs: Vec<ChainLink> = self.chain.iter().map(|(l, _)| l.clone()).collect();
        if self.enabled {
            self.chain.push((ChainLink { checkpoint: id.0, file: file.to_string() }, keyed_bytes));
        }
        self.pending.insert(id, refs.clone());
        refs
    }

    /// The chain the snapshot of `id` references, when it goes to the writer.
    pub fn submitted(&mut self, id: CheckpointId) -> Vec<ChainLink> {
        self.pending.remove(&id).unwrap_or_default()
    }

    /// A snapshot of `id` will never be written (declined before submission): whatever
    /// builds on it must start over.
    pub fn dropped(&mut self, id: CheckpointId) {
        if self.pending.remove(&id).is_some() {
            self.reset();
        }
    }

    /// The operator's state was restored whole from the files of `chain` (oldest first, with
    /// their keyed bytes) and nothing changed since: the next snapshot may build on them.
    pub fn resume(&mut self, chain: Vec<(ChainLink, u64)>) {
        if self.enabled {
            self.chain = chain;
        }
    }

    /// The operator's state no longer matches the chain (restore, upgrade, lost write):
    /// the next snapshot is full.
    pub fn reset(&mut self) {
        self.chain.clear();
    }

    /// Files in the current chain.
    pub fn links(&self) -> usize {
        self.chain.len()
    }
}

/// Folds the keyed state of a chain, oldest (full) first, into full key-group blobs.
/// Timers are taken from the newest file only.
pub fn fold_keyed(files: Vec<Vec<KeyGroupSnapshot>>) -> Result<Vec<KeyGroupSnapshot>, (u32, LayoutError)> {
    let mut acc: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let n = files.len();
    let mut newest = Vec::new();
    for (i, groups) in files.into_iter().enumerate() {
        let mut next = BTreeMap::new();
        for g in &groups {
            let base = acc.remove(&g.key_group).unwrap_or_default();
            let folded = if layout::is_delta(&g.data) {
                layout::apply_delta(&base, &g.data).map_err(|e| (g.key_group, e))?
            } else {
                g.data.clone()
            };
            next.insert(g.key_group, folded);
        }
        acc = next;
        if i + 1 == n {
            newest = groups;
        }
    }
    Ok(newest
        .into_iter()
        .map(|g| KeyGroupSnapshot { data: acc.remove(&g.key_group).unwrap_or_default(), ..g })
        .filter(|g| !g.data.is_empty() || !g.event_timers.is_empty() || !g.processing_timers.is_empty())
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::checkpoint::layout::{NamedState, encode, encode_delta};

    fn id(n: u64) -> CheckpointId {
        CheckpointId(n)
    }

    #[test]
    fn the_first_snapshot_after_a_reset_or_a_forced_one_is_full() {
        let mut p = IncrementalPolicy::new(true);
        assert!(p.wants_full(false), "no chain yet");
        assert!(p.taken(id(1), "f", true, 100).is_empty());
        assert_eq!(p.submitted(id(1)), vec![]);
        assert!(!p.wants_full(false));
        assert!(p.wants_full(true), "savepoints and upgrades are full");
        let refs = p.taken(id(2), "f", false, 10);
        assert_eq!(refs, vec![ChainLink { checkpoint: 1, file: "f".into() }]);
        assert_eq!(p.submitted(id(2)), refs);
        assert_eq!(p.taken(id(3), "f", false, 10).len(), 2);
        p.reset();
        assert!(p.wants_full(false), "after restore/upgrade/lost write");
    }

    #[test]
    fn a_snapshot_dropped_before_writing_restarts_the_chain() {
        let mut p = IncrementalPolicy::new(true);
        p.taken(id(1), "f", true, 100);
        p.submitted(id(1));
        p.taken(id(2), "f", false, 10);
        p.dropped(id(2));
        assert!(p.wants_full(false));
        p.dropped(id(7));
    }

    #[test]
    fn chains_are_compacted_by_length_and_by_size() {
        let mut p = IncrementalPolicy::new(true).with_max_links(3);
        p.taken(id(1), "f", true, 100);
        p.taken(id(2), "f", false, 10);
        p.taken(id(3), "f", false, 10);
        assert!(p.wants_full(false), "3 links");
        let mut p = IncrementalPolicy::new(true);
        p.taken(id(1), "f", true, 100);
        p.taken(id(2), "f", false, 60);
        assert!(!p.wants_full(false));
        p.taken(id(3), "f", false, 60);
        assert!(p.wants_full(false), "deltas outweigh the base");
    }

    fn link(c: u64) -> ChainLink {
        ChainLink { checkpoint: c, file: "f".into() }
    }

    #[test]
    fn a_chain_restored_whole_is_built_on_and_folded_like_its_own() {
        let mut p = IncrementalPolicy::new(true).in_background().with_max_links(3);
        p.resume(vec![(link(1), 100), (link(2), 10)]);
        assert!(!p.wants_full(false), "a delta on the restored chain");
        assert_eq!(p.taken(id(5), "g", false, 10), vec![link(1), link(2)]);
        assert_eq!(p.compaction(), Some(vec![link(1), link(2), ChainLink { checkpoint: 5, file: "g".into() }]));
        let mut off = IncrementalPolicy::new(false);
        off.resume(vec![(link(1), 100)]);
        assert!(off.wants_full(false), "incremental checkpoints are off");
    }

    #[test]
    fn in_the_background_a_long_chain_is_folded_not_restarted() {
        let mut p = IncrementalPolicy::new(true).with_max_links(3).in_background();
        p.taken(id(1), "f", true, 100);
        assert_eq!(p.compaction(), None, "one file is nothing to fold");
        p.taken(id(2), "f", false, 10);
        assert_eq!(p.compaction(), None);
        p.taken(id(3), "f", false, 10);
        assert!(!p.wants_full(false), "3 links: folded in the background, the snapshot stays a delta");
        let prefix = p.compaction().expect("3 links: fold");
        assert_eq!(prefix, vec![link(1), link(2), link(3)]);
        assert_eq!(p.compaction(), None, "one fold at a time");
        // Snapshots go on building on the whole chain while it is folded.
        assert_eq!(p.taken(id(4), "f", false, 10).len(), 3);
        let base = ChainLink { checkpoint: 3, file: "f.base".into() };
        assert!(p.compacted(base.clone(), 100));
        assert_eq!(p.taken(id(5), "f", false, 10), vec![base.clone(), link(4)]);
        // A fold that finishes after a reset is not used; the chain starts over with a full.
        assert!(p.compaction().is_some(), "3 links again");
        p.reset();
        assert!(p.wants_full(false));
        p.taken(id(6), "f", true, 100);
        assert!(!p.compacted(ChainLink { checkpoint: 5, file: "f.base".into() }, 1));
        assert_eq!(p.taken(id(7), "f", false, 1), vec![link(6)]);
        // A failed fold falls back to full snapshots.
        p.taken(id(8), "f", false, 1);
        assert!(p.compaction().is_some());
        p.compaction_failed();
        assert!(p.wants_full(false));
        assert_eq!(p.compaction(), None);
        // Deltas outweighing the base are folded too.
        let mut p = IncrementalPolicy::new(true).in_background();
        p.taken(id(1), "f", true, 100);
        p.taken(id(2), "f", false, 60);
        assert_eq!(p.compaction(), None);
        p.taken(id(3), "f", false, 60);
        assert!(!p.wants_full(false));
        assert_eq!(p.compaction(), Some(vec![link(1), link(2), link(3)]));
    }

    #[test]
    fn disabled_means_always_full_and_no_chain() {
        let mut p = IncrementalPolicy::new(false);
        p.taken(id(1), "f", true, 1);
        assert!(p.wants_full(false));
        assert_eq!(p.links(), 0);
    }

    /// A key group's snapshot without timers.
    pub(crate) fn kg(key_group: u32, data: Vec<u8>) -> KeyGroupSnapshot {
        KeyGroupSnapshot { key_group, data, event_timers: Default::default(), processing_timers: Default::default() }
    }

    /// A full blob of the one state `s`.
    pub(crate) fn state(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
        encode(&[NamedState {
            name: "s".into(),
            entries: entries.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect(),
        }])
    }

    #[test]
    fn folding_applies_deltas_replaces_full_groups_and_removes_absent_ones() {
        let base = vec![
            kg(0, state(&[(b"a", b"1"), (b"b", b"2")])),
            kg(1, state(&[(b"c", b"3")])),
            kg(2, state(&[(b"d", b"4")])),
        ];
        let d1 = vec![
            kg(0, encode_delta(&[("s".into(), vec![(b"a".to_vec(), Some(b"9".to_vec())), (b"b".to_vec(), None)])])),
            kg(1, encode_delta(&[])),
            // group 2 absent: it has no state any more
            kg(3, state(&[(b"e", b"5")])),
        ];
        let mut d2 = vec![
            kg(0, encode_delta(&[])),
            kg(1, encode_delta(&[("s".into(), vec![(b"f".to_vec(), Some(b"6".to_vec()))])])),
            kg(3, encode_delta(&[])),
        ];
        d2[1].event_timers = vec![(5, b"f".to_vec())].into();
        let folded = fold_keyed(vec![base, d1, d2]).unwrap();
        assert_eq!(folded.len(), 3);
        assert_eq!(folded[0].data, state(&[(b"a", b"9")]));
        assert_eq!(folded[1].data, state(&[(b"c", b"3"), (b"f", b"6")]));
        assert_eq!(folded[1].event_timers, vec![(5, b"f".to_vec())].into());
        assert_eq!(folded[2], kg(3, state(&[(b"e", b"5")])));
        let bad = vec![vec![kg(0, state(&[(b"a", b"1")]))], vec![kg(0, vec![0, 0, 0, 0x80, 1])]];
        assert_eq!(fold_keyed(bad).unwrap_err().0, 0);
    }
}
