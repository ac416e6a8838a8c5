//! The checkpoint coordinator's decisions, as a pure state machine: when to trigger, which
//! checkpoints are pending, which acks complete one, when one times out.
//!
//! Time comes in as a parameter (milliseconds on any monotonic clock); the driver
//! (`runtime/driver.rs`) carries out the decisions: inject barriers, publish manifests,
//! notify tasks.
//!
//! Invariants: ids are strictly increasing (also across restarts: the driver seeds
//! `next_id` past every id on disk); at most `max_concurrent` checkpoints are pending; a
//! checkpoint completes only when every expected task acked it, exactly once; a completed
//! checkpoint aborts every older pending one (it subsumes them).

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::logical::CheckpointSettings;
use crate::ids::CheckpointId;

/// Why a checkpoint did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortReason {
    /// Not all acks arrived within the timeout.
    Timeout,
    /// A task declined it (e.g. superseded during alignment, or its snapshot failed).
    Declined {
        /// Which task.
        task: String,
        /// Its reason.
        reason: String,
    },
    /// A newer checkpoint completed first.
    Subsumed,
    /// The job is restarting or stopping.
    JobStopped,
}

/// Whether to trigger now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerDecision {
    /// Trigger checkpoint `id` now.
    Trigger(CheckpointId),
    /// Not before `at`.
    Wait {
        /// When to ask again.
        at: u64,
    },
    /// Too many pending; ask again when one finishes.
    Busy,
}

/// What an ack led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckOutcome<A> {
    /// Still waiting for others.
    Pending,
    /// Every task acked: publish it. Carries the acks in task order.
    Complete {
        /// The checkpoint.
        id: CheckpointId,
        /// When it was triggered.
        triggered_at: u64,
        /// Every task's ack.
        acks: BTreeMap<usize, A>,
        /// Older pending checkpoints aborted because this one completed.
        subsumed: Vec<CheckpointId>,
    },
    /// Unknown, aborted or duplicate ack: ignore.
    Ignored,
}

#[derive(Debug)]
struct Pending<A> {
    triggered_at: u64,
    waiting: BTreeSet<usize>,
    acks: BTreeMap<usize, A>,
}

/// The coordinator's state. `A` is what a task reports with its ack (state handles).
#[derive(Debug)]
pub struct Coordinator<A> {
    settings: CheckpointSettings,
    tasks: usize,
    next_id: u64,
    pending: BTreeMap<CheckpointId, Pending<A>>,
    last_trigger: Option<u64>,
    last_finish: Option<u64>,
    latest_completed: Option<CheckpointId>,
}

impl<A> Coordinator<A> {
    /// A coordinator for a job with `tasks` subtasks; the first id it hands out is `first_id`.
    pub fn new(settings: CheckpointSettings, tasks: usize, first_id: u64) -> Self {
        Coordinator {
            settings,
            tasks,
            next_id: first_id.max(1),
            pending: BTreeMap::new(),
            last_trigger: None,
            last_finish: None,
            latest_completed: None,
        }
    }

    /// The newest completed checkpoint of this run.
    pub fn latest_completed(&self) -> Option<CheckpointId> {
        self.latest_completed
    }

    /// Pending checkpoint ids.
    pub fn pending(&self) -> Vec<CheckpointId> {
        self.pending.keys().copied().collect()
    }

    /// Decides whether to trigger at `now` (a periodic trigger; `force` ignores the
    /// interval and pause, for final checkpoints and savepoints).
    pub fn poll_trigger(&mut self, now: u64, force: bool) -> TriggerDecision {
        if self.pending.len() >= self.settings.max_concurrent {
            return TriggerDecision::Busy;
        }
        if !force {
            // The first checkpoint comes one interval after the start, like every later one.
            let by_interval = self.last_trigger.map_or(self.settings.interval_ms, |t| t + self.settings.interval_ms);
            let by_pause = self.last_finish.map_or(now, |t| t + self.settings.min_pause_ms);
            let at = by_interval.max(by_pause);
            if now < at {
                return TriggerDecision::Wait { at };
            }
        }
        let id = CheckpointId(self.next_id);
        self.next_id += 1;
        self.last_trigger = Some(now);
        self.pending
            .insert(id, Pending { triggered_at: now, waiting: (0..self.tasks).collect(), acks: BTreeMap::new() });
        TriggerDecision::Trigger(id)
    }

    /// Task `task` acked checkpoint `id` with `ack`.
    pub fn on_ack(&mut self, task: usize, id: CheckpointId, ack: A, now: u64) -> AckOutcome<A> {
        let Some(p) = self.pending.get_mut(&id) else { return AckOutcome::Ignored };
        if !p.waiting.remove(&task) {
            return AckOutcome::Ignored;
        }
        p.acks.insert(task, ack);
        if !p.waiting.is_empty() {
            return AckOutcome::Pending;
        }
        let p = self.pending.remove(&id).unwrap();
        let subsumed: Vec<CheckpointId> = self.pending.range(..id).map(|(k, _)| *k).collect();
        for s in &subsumed {
            self.pending.remove(s);
        }
        self.latest_completed = Some(id);
        self.last_finish = Some(now);
        AckOutcome::Complete { id, triggered_at: p.triggered_at, acks: p.acks, subsumed }
    }

    /// Task `task` declined checkpoint `id`: returns true if that aborted it.
    pub fn on_decline(&mut self, id: CheckpointId, now: u64) -> bool {
        let aborted = self.pending.remove(&id).is_some();
        if aborted {
            self.last_finish = Some(now);
        }
        aborted
    }

    /// Aborts every pending checkpoint older than the timeout at `now`; returns them.
    pub fn on_tick(&mut self, now: u64) -> Vec<CheckpointId> {
        let timeout = self.settings.timeout_ms;
        let expired: Vec<CheckpointId> = self
            .pending
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.triggered_at) >= timeout)
            .map(|(k, _)| *k)
            .collect();
        for id in &expired {
            self.pending.remove(id);
            self.last_finish = Some(now);
        }
        expired
    }

    /// Aborts everything pending (job stopping); returns what was pending.
    pub fn abort_all(&mut self) -> Vec<CheckpointId> {
        std::mem::take(&mut self.pending).into_keys().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> CheckpointSettings {
        CheckpointSettings { interval_ms: 100, timeout_ms: 1000, min_pause_ms: 30, max_concurrent: 1, retained: 3 }
    }

    #[test]
    fn triggers_by_interval_and_respects_max_concurrent() {
        let mut c: Coordinator<()> = Coordinator::new(settings(), 2, 1);
        assert_eq!(c.poll_trigger(0, false), TriggerDecision::Wait { at: 100 });
        assert_eq!(c.poll_trigger(0, true), TriggerDecision::Trigger(CheckpointId(1)));
        assert_eq!(c.poll_trigger(500, false), TriggerDecision::Busy);
        assert_eq!(c.on_ack(0, CheckpointId(1), (), 10), AckOutcome::Pending);
        assert!(matches!(c.on_ack(1, CheckpointId(1), (), 20), AckOutcome::Complete { id: CheckpointId(1), .. }));
        assert_eq!(c.poll_trigger(60, false), TriggerDecision::Wait { at: 100 });
        assert_eq!(c.poll_trigger(100, false), TriggerDecision::Trigger(CheckpointId(2)));
    }

    #[test]
    fn min_pause_counts_from_the_end_of_the_previous_checkpoint() {
        let mut c: Coordinator<()> = Coordinator::new(settings(), 1, 1);
        c.poll_trigger(0, true);
        c.on_ack(0, CheckpointId(1), (), 90);
        assert_eq!(c.poll_trigger(100, false), TriggerDecision::Wait { at: 120 });
    }

    #[test]
    fn ids_continue_from_the_seed_and_force_skips_the_interval() {
        let mut c: Coordinator<()> = Coordinator::new(settings(), 1, 42);
        assert_eq!(c.poll_trigger(100, false), TriggerDecision::Trigger(CheckpointId(42)));
        c.on_ack(0, CheckpointId(42), (), 1);
        assert_eq!(c.poll_trigger(2, true), TriggerDecision::Trigger(CheckpointId(43)));
    }

    #[test]
    fn duplicate_and_unknown_acks_are_ignored() {
        let mut c: Coordinator<u8> = Coordinator::new(settings(), 2, 1);
        c.poll_trigger(0, true);
        assert_eq!(c.on_ack(0, CheckpointId(1), 7, 1), AckOutcome::Pending);
        assert_eq!(c.on_ack(0, CheckpointId(1), 7, 1), AckOutcome::Ignored);
        assert_eq!(c.on_ack(0, CheckpointId(9), 7, 1), AckOutcome::Ignored);
        match c.on_ack(1, CheckpointId(1), 8, 2) {
            AckOutcome::Complete { acks, .. } => assert_eq!(acks.into_iter().collect::<Vec<_>>(), vec![(0, 7), (1, 8)]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn timeout_and_decline_abort() {
        let mut c: Coordinator<()> = Coordinator::new(CheckpointSettings { max_concurrent: 2, ..settings() }, 2, 1);
        c.poll_trigger(0, true);
        c.poll_trigger(100, false);
        assert_eq!(c.on_tick(999), vec![]);
        assert_eq!(c.on_tick(1000), vec![CheckpointId(1)]);
        assert!(c.on_decline(CheckpointId(2), 1001));
        assert!(!c.on_decline(CheckpointId(2), 1002));
        assert_eq!(c.on_ack(0, CheckpointId(2), (), 1003), AckOutcome::Ignored);
    }

    #[test]
    fn a_completed_checkpoint_subsumes_older_pending_ones() {
        let mut c: Coordinator<()> = Coordinator::new(CheckpointSettings { max_concurrent: 3, ..settings() }, 1, 1);
        c.poll_trigger(0, true);
        c.poll_trigger(1, true);
        match c.on_ack(0, CheckpointId(2), (), 2) {
            AckOutcome::Complete { subsumed, .. } => assert_eq!(subsumed, vec![CheckpointId(1)]),
            other => panic!("{other:?}"),
        }
        assert!(c.pending().is_empty());
        assert_eq!(c.latest_completed(), Some(CheckpointId(2)));
    }
}
