//! A guest's snapshot is evidence, not truth: before the key groups a subtask's operator hands
//! out become part of a checkpoint, the host checks that each is one the subtask owns and that
//! none comes twice across the chunks of one snapshot. (The layout of every blob, and that it
//! names only states the operator declared, of its kind, each once, is checked where it is
//! received, `sandbox/instance.rs` `snapshot`.) A buggy SDK in any language thus
//! fails its own checkpoint loudly instead of overwriting another subtask's key group, or a
//! group of its own with a stale copy, on restore.
//!
//! Pure: one ledger per snapshot, fed each chunk's key groups.

use std::collections::BTreeSet;

use thiserror::Error;

/// What a snapshot's key groups may not do.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GroupViolation {
    /// A key group this subtask does not own.
    #[error("handed out key group {key_group}, outside this subtask's key groups [{start}, {end})")]
    NotOwned {
        /// The group.
        key_group: u32,
        /// First owned group.
        start: u32,
        /// One past the last owned group.
        end: u32,
    },
    /// The same key group twice in one snapshot.
    #[error("handed out key group {key_group} twice in one snapshot")]
    Twice {
        /// The group.
        key_group: u32,
    },
}

/// The key groups one snapshot has handed out so far.
#[derive(Debug, Clone)]
pub struct GroupLedger {
    start: u32,
    end: u32,
    seen: BTreeSet<u32>,
}

impl GroupLedger {
    /// A ledger for a subtask owning key groups `[start, end)`.
    pub fn new(start: u32, end: u32) -> Self {
        GroupLedger { start, end, seen: BTreeSet::new() }
    }

    /// Admits one chunk's key groups, or names the first violation.
    pub fn admit(&mut self, groups: impl IntoIterator<Item = u32>) -> Result<(), GroupViolation> {
        for kg in groups {
            if kg < self.start || kg >= self.end {
                return Err(GroupViolation::NotOwned { key_group: kg, start: self.start, end: self.end });
            }
            if !self.seen.insert(kg) {
                return Err(GroupViolation::Twice { key_group: kg });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_groups_pass_once_across_chunks() {
        let mut l = GroupLedger::new(4, 8);
        assert_eq!(l.admit([4, 6]), Ok(()));
        assert_eq!(l.admit([5, 7]), Ok(()));
        assert_eq!(l.admit([6]), Err(GroupViolation::Twice { key_group: 6 }));
        assert_eq!(l.admit([8]), Err(GroupViolation::NotOwned { key_group: 8, start: 4, end: 8 }));
        assert_eq!(l.admit([3]), Err(GroupViolation::NotOwned { key_group: 3, start: 4, end: 8 }));
        let mut fresh = GroupLedger::new(0, 1);
        assert_eq!(fresh.admit([0, 0]), Err(GroupViolation::Twice { key_group: 0 }));
    }
}
