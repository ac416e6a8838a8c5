//! Where the subtasks of a physical plan run when they are spread over workers' slots:
//! Flink's default slot sharing. Subtask `i` of every node forms slice `i`, and one slice takes
//! one slot, so a forward-connected pipeline stays inside one worker (its channels stay in
//! memory); slices go round-robin over the workers that have a free slot, so the subtasks of one
//! operator spread over as many workers as there are.
//!
//! Invariants: every subtask is placed exactly once; a slice is never split; no worker holds
//! more slices than it has slots; a plan needs as many slots as its largest parallelism, and
//! too few is an error naming both numbers. One process is the special case of one worker.

use thiserror::Error;

use crate::graph::logical::JobGraph;
use crate::graph::physical::{ChannelPlan, PhysicalPlan};

/// The workers' slots do not fit the plan.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "the job needs {needed} slots (its largest parallelism) but the workers have {available}; add workers or \
     slots, or lower the parallelism"
)]
pub struct NotEnoughSlots {
    /// Slots the plan needs.
    pub needed: u32,
    /// Slots the workers offer.
    pub available: u32,
}

/// The worker of every subtask of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Per subtask of the plan (same order): the index of its worker.
    pub worker_of: Vec<usize>,
}

impl Placement {
    /// Places `plan` into workers offering `slots[w]` slots each.
    pub fn spread(plan: &PhysicalPlan, slots: &[u32]) -> Result<Placement, NotEnoughSlots> {
        let needed = plan.subtasks.iter().map(|s| s.subtask + 1).max().unwrap_or(0);
        let available = slots.iter().sum();
        if needed > available {
            return Err(NotEnoughSlots { needed, available });
        }
        let mut free = slots.to_vec();
        let mut next = 0;
        let mut slice_worker = Vec::with_capacity(needed as usize);
        for _ in 0..needed {
            while free[next % free.len()] == 0 {
                next += 1;
            }
            let w = next % free.len();
            free[w] -= 1;
            slice_worker.push(w);
            next += 1;
        }
        Ok(Placement { worker_of: plan.subtasks.iter().map(|s| slice_worker[s.subtask as usize]).collect() })
    }

    /// Every subtask in one process.
    pub fn single(plan: &PhysicalPlan) -> Placement {
        Placement { worker_of: vec![0; plan.subtasks.len()] }
    }

    /// Whether channel `c` connects two subtasks of the same worker (in memory) rather than
    /// two workers (over the network).
    pub fn is_local(&self, plan: &PhysicalPlan, g: &JobGraph, c: &ChannelPlan) -> bool {
        let e = &g.edges[c.edge];
        let at = |node: usize, subtask: u32| {
            plan.subtasks.iter().position(|s| s.node == node && s.subtask == subtask).map(|i| self.worker_of[i])
        };
        at(e.from, c.from) == at(e.to, c.to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::physical::SubtaskPlan;

    fn plan(parallelisms: &[u32]) -> PhysicalPlan {
        let subtasks = parallelisms
            .iter()
            .enumerate()
            .flat_map(|(node, &p)| (0..p).map(move |subtask| SubtaskPlan { node, subtask, key_groups: 0..0 }))
            .collect();
        PhysicalPlan { subtasks, channels: Vec::new() }
    }

    fn workers_of(p: &PhysicalPlan, pl: &Placement, node: usize) -> Vec<usize> {
        p.subtasks.iter().zip(&pl.worker_of).filter(|(s, _)| s.node == node).map(|(_, &w)| w).collect()
    }

    #[test]
    fn the_subtasks_of_an_operator_spread_and_a_slice_stays_together() {
        let p = plan(&[3, 3, 1]);
        let pl = Placement::spread(&p, &[2, 2, 2]).unwrap();
        assert_eq!(workers_of(&p, &pl, 0), [0, 1, 2]);
        assert_eq!(workers_of(&p, &pl, 1), [0, 1, 2]);
        assert_eq!(workers_of(&p, &pl, 2), [0]);
    }

    #[test]
    fn slots_bound_each_worker_and_too_few_is_refused() {
        let p = plan(&[4, 2]);
        let pl = Placement::spread(&p, &[3, 1, 0]).unwrap();
        assert_eq!(workers_of(&p, &pl, 0), [0, 1, 0, 0]);
        assert_eq!(Placement::spread(&p, &[1, 2]).unwrap_err(), NotEnoughSlots { needed: 4, available: 3 });
        assert!(Placement::spread(&plan(&[]), &[]).unwrap().worker_of.is_empty());
    }
}
