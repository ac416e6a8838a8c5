//! Partitioners: which downstream subtask(s) a record goes to.
//!
//! Pure decisions, tested in isolation; [`crate::runtime::output`] applies them to batches.

use crate::keygroup::KeyGroupMath;

/// How an edge distributes records over the downstream subtasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partition {
    /// Subtask `i` sends to subtask `i` (equal parallelism).
    Forward,
    /// By key group of the record's key (keyed state needs this).
    Hash,
    /// Every record to every downstream subtask.
    Broadcast,
    /// Round-robin over downstream subtasks.
    Rebalance,
}

impl Partition {
    /// Parses the job file spelling.
    pub fn parse(s: &str) -> Option<Partition> {
        Some(match s {
            "forward" => Partition::Forward,
            "hash" | "key" | "keyed" => Partition::Hash,
            "broadcast" => Partition::Broadcast,
            "rebalance" | "round-robin" => Partition::Rebalance,
            _ => return None,
        })
    }

    /// The job file spelling.
    pub fn name(self) -> &'static str {
        match self {
            Partition::Forward => "forward",
            Partition::Hash => "hash",
            Partition::Broadcast => "broadcast",
            Partition::Rebalance => "rebalance",
        }
    }
}

/// Where one record goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// To the target with this index (in the edge's target list), tagged with `tag`.
    One {
        /// Index into the edge's targets.
        index: usize,
        /// Key group for hash edges, [`crate::record::NO_KEY_GROUP`] otherwise.
        tag: u32,
    },
    /// To every target.
    All,
}

/// Chooses targets for one edge from one upstream subtask.
#[derive(Clone, Debug)]
pub struct Selector {
    partition: Partition,
    targets: usize,
    math: KeyGroupMath,
    next: usize,
}

impl Selector {
    /// A selector over `targets` downstream channels (1 for forward). `start` spreads
    /// round-robin of different upstream subtasks.
    pub fn new(partition: Partition, targets: usize, max_parallelism: u32, start: usize) -> Self {
        let math = KeyGroupMath::new(max_parallelism, targets as u32);
        Selector { partition, targets, math, next: start % targets.max(1) }
    }

    /// Every record goes to the one target with no key group: [`Partition::Forward`].
    pub fn is_forward(&self) -> bool {
        self.partition == Partition::Forward
    }

    /// Where the record with `key` goes.
    #[inline]
    pub fn select(&mut self, key: &[u8]) -> Target {
        match self.partition {
            Partition::Forward => Target::One { index: 0, tag: crate::record::NO_KEY_GROUP },
            Partition::Broadcast => Target::All,
            Partition::Rebalance => {
                let index = self.next;
                self.next += 1;
                if self.next == self.targets {
                    self.next = 0;
                }
                Target::One { index, tag: crate::record::NO_KEY_GROUP }
            }
            Partition::Hash => {
                let kg = self.math.key_group(key);
                let index = self.math.operator_index(kg) as usize;
                Target::One { index, tag: kg }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keygroup::key_group_range;
    use proptest::prelude::*;

    #[test]
    fn rebalance_cycles_through_all_targets() {
        let mut s = Selector::new(Partition::Rebalance, 3, 128, 1);
        let got: Vec<_> = (0..6)
            .map(|_| match s.select(b"x") {
                Target::One { index, .. } => index,
                Target::All => usize::MAX,
            })
            .collect();
        assert_eq!(got, vec![1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn broadcast_and_forward() {
        assert_eq!(Selector::new(Partition::Broadcast, 4, 128, 0).select(b"k"), Target::All);
        assert!(matches!(Selector::new(Partition::Forward, 1, 128, 0).select(b"k"), Target::One { index: 0, .. }));
    }

    proptest! {
        #[test]
        fn hash_sends_each_key_to_the_owner_of_its_key_group(
            key in proptest::collection::vec(any::<u8>(), 0..32), p in 1u32..16, max_p in 16u32..512) {
            let mut s = Selector::new(Partition::Hash, p as usize, max_p, 0);
            let (a, b) = (s.select(&key), s.select(&key));
            prop_assert_eq!(a, b, "hash routing is deterministic");
            match a {
                Target::One { index, tag } => {
                    prop_assert!(key_group_range(max_p, p, index as u32).contains(&tag));
                }
                Target::All => prop_assert!(false),
            }
        }
    }
}
