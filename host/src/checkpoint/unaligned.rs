//! An unaligned checkpoint at one task, as a pure state machine: Chandy–Lamport snapshots
//! whose markers overtake the records queued on a channel (Flink's unaligned checkpoints,
//! FLIP-76).
//!
//! A task snapshots at the **first** barrier of a checkpoint on any input, without waiting
//! for the others, and forwards the barrier at once, ahead of its own queued output. The
//! records in flight on each input (sent before the sender's snapshot, not applied before
//! this task's) become part of the checkpoint: those queued on the input when its barrier
//! is delivered (`runtime/input.rs` moves them into the input's front), plus those the task
//! applies from an input between its snapshot and that input's barrier. The driver
//! (`runtime/task.rs`, `runtime/sink.rs`) feeds barriers, ends of stream and cancellations in
//! and carries out the outcomes: snapshot and forward, log a front, log a record, finish.
//!
//! Invariants: nothing is ever parked (no input waits for another); records are logged only
//! while a checkpoint is open here and only from inputs whose barrier has not been delivered;
//! a checkpoint completes here once every input delivered its barrier or ended; at most one
//! checkpoint is open (a newer barrier declines the older); an ended input delivers every
//! later barrier; a barrier no newer than the last finished, declined or cancelled
//! checkpoint is obsolete.

use crate::ids::CheckpointId;

/// What the driver must do after a barrier was delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnalignOutcome {
    /// The first barrier of `id` here: snapshot now, forward the barrier ahead of the
    /// output, log the input's front. If `declined` is set, that older checkpoint was still
    /// open here: decline it. If `complete`, no other input is open: finish at once.
    Start {
        /// The checkpoint.
        id: CheckpointId,
        /// An older checkpoint given up.
        declined: Option<CheckpointId>,
        /// Every input delivered (or ended).
        complete: bool,
    },
    /// The open checkpoint's barrier on another input: log the input's front; if
    /// `complete`, every input delivered: finish.
    Delivered {
        /// Every input delivered (or ended).
        complete: bool,
    },
    /// Nothing to log: a barrier of a finished, declined or cancelled checkpoint, or one
    /// delivered twice.
    Obsolete,
}

/// Unaligned checkpoint state of one task.
#[derive(Debug, Clone)]
pub struct Unaligner {
    delivered: Vec<bool>,
    ended: Vec<bool>,
    current: Option<CheckpointId>,
    last: Option<CheckpointId>,
}

impl Unaligner {
    /// A task with `inputs` inputs.
    pub fn new(inputs: usize) -> Self {
        Unaligner { delivered: vec![false; inputs], ended: vec![false; inputs], current: None, last: None }
    }

    /// The checkpoint open here, if any.
    pub fn current(&self) -> Option<CheckpointId> {
        self.current
    }

    /// Whether a barrier of `id` would be obsolete here: no newer than the last finished,
    /// declined or cancelled checkpoint, or older than the open one.
    pub fn is_obsolete(&self, id: CheckpointId) -> bool {
        self.last.is_some_and(|l| id <= l) || self.current.is_some_and(|c| id < c)
    }

    /// Number of inputs.
    pub fn inputs(&self) -> usize {
        self.ended.len()
    }

    /// Whether `input` ended.
    pub fn is_ended(&self, input: usize) -> bool {
        self.ended[input]
    }

    /// Whether a record applied from `input` now must be logged: a checkpoint is open and
    /// `input`'s barrier has not been delivered.
    pub fn must_log(&self, input: usize) -> bool {
        self.current.is_some() && !self.delivered[input] && !self.ended[input]
    }

    fn try_finish(&mut self) -> bool {
        let done = self.delivered.iter().zip(&self.ended).all(|(d, e)| *d || *e);
        if done {
            self.last = self.current.take();
        }
        done
    }

    fn start(&mut self, input: usize, id: CheckpointId, declined: Option<CheckpointId>) -> UnalignOutcome {
        self.current = Some(id);
        self.delivered.clone_from(&self.ended);
        self.delivered[input] = true;
        UnalignOutcome::Start { id, declined, complete: self.try_finish() }
    }

    /// Barrier `id` was delivered on `input`.
    pub fn on_barrier(&mut self, input: usize, id: CheckpointId) -> UnalignOutcome {
        if self.last.is_some_and(|l| id <= l) {
            return UnalignOutcome::Obsolete;
        }
        match self.current {
            None => self.start(input, id, None),
            Some(c) if id == c => {
                if std::mem::replace(&mut self.delivered[input], true) {
                    return UnalignOutcome::Obsolete;
                }
                UnalignOutcome::Delivered { complete: self.try_finish() }
            }
            Some(c) if id < c => UnalignOutcome::Obsolete,
            Some(c) => {
                self.last = Some(c);
                self.start(input, id, Some(c))
            }
        }
    }

    /// Checkpoint `id` was triggered at a task none of whose open inputs can deliver its
    /// barrier first (a loop head whose regular inputs ended: only its back-edges are open,
    /// and they return what it sends): start now, every open input still to deliver.
    pub fn on_trigger(&mut self, id: CheckpointId) -> UnalignOutcome {
        if self.last.is_some_and(|l| id <= l) || self.current.is_some_and(|c| id <= c) {
            return UnalignOutcome::Obsolete;
        }
        let declined = self.current.inspect(|c| self.last = Some(*c));
        self.current = Some(id);
        self.delivered.clone_from(&self.ended);
        UnalignOutcome::Start { id, declined, complete: self.try_finish() }
    }

    /// `input` ended; returns the open checkpoint if that completed it.
    pub fn on_end_of_stream(&mut self, input: usize) -> Option<CheckpointId> {
        self.ended[input] = true;
        let open = self.current?;
        self.try_finish().then_some(open)
    }

    /// Checkpoint `id` was cancelled. Returns true if it was open here (the driver drops its
    /// snapshot and log). A barrier of `id` still on its way is obsolete when it comes.
    pub fn on_cancel(&mut self, id: CheckpointId) -> bool {
        match self.current {
            Some(c) if c == id => {
                self.current = None;
                self.last = Some(self.last.map_or(id, |l| l.max(id)));
                true
            }
            None => {
                self.last = Some(self.last.map_or(id, |l| l.max(id)));
                false
            }
            Some(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C1: CheckpointId = CheckpointId(1);
    const C2: CheckpointId = CheckpointId(2);

    #[test]
    fn unaligned_the_first_barrier_snapshots_and_the_others_only_end_the_logging() {
        let mut u = Unaligner::new(3);
        assert!(!u.must_log(0), "nothing is logged outside a checkpoint");
        assert_eq!(u.on_barrier(1, C1), UnalignOutcome::Start { id: C1, declined: None, complete: false });
        assert!(u.must_log(0) && !u.must_log(1) && u.must_log(2));
        assert_eq!(u.on_barrier(0, C1), UnalignOutcome::Delivered { complete: false });
        assert!(!u.must_log(0));
        assert_eq!(u.on_barrier(0, C1), UnalignOutcome::Obsolete, "delivered twice");
        assert_eq!(u.on_barrier(2, C1), UnalignOutcome::Delivered { complete: true });
        assert_eq!(u.current(), None);
        assert!(!u.must_log(2));
        assert_eq!(u.on_barrier(1, C1), UnalignOutcome::Obsolete);
    }

    #[test]
    fn unaligned_a_single_input_completes_at_its_barrier() {
        let mut u = Unaligner::new(1);
        assert_eq!(u.on_barrier(0, C1), UnalignOutcome::Start { id: C1, declined: None, complete: true });
        assert!(!u.must_log(0));
    }

    #[test]
    fn unaligned_a_newer_barrier_declines_the_open_checkpoint() {
        let mut u = Unaligner::new(2);
        u.on_barrier(0, C1);
        assert_eq!(u.on_barrier(1, C2), UnalignOutcome::Start { id: C2, declined: Some(C1), complete: false });
        assert!(u.must_log(0) && !u.must_log(1));
        assert_eq!(u.on_barrier(0, C1), UnalignOutcome::Obsolete, "the declined checkpoint's late barrier");
        assert_eq!(u.on_barrier(0, C2), UnalignOutcome::Delivered { complete: true });
    }

    #[test]
    fn unaligned_a_trigger_starts_a_checkpoint_every_open_input_still_delivers() {
        let mut u = Unaligner::new(2);
        u.on_end_of_stream(0);
        assert_eq!(u.on_trigger(C1), UnalignOutcome::Start { id: C1, declined: None, complete: false });
        assert!(u.must_log(1) && !u.must_log(0));
        assert_eq!(u.on_trigger(C1), UnalignOutcome::Obsolete, "already open");
        assert_eq!(u.on_barrier(1, C1), UnalignOutcome::Delivered { complete: true });
        assert_eq!(u.on_trigger(C1), UnalignOutcome::Obsolete, "already complete");
        assert_eq!(u.on_trigger(C2), UnalignOutcome::Start { id: C2, declined: None, complete: false });
        let c3 = CheckpointId(3);
        assert_eq!(u.on_trigger(c3), UnalignOutcome::Start { id: c3, declined: Some(C2), complete: false });
        u.on_end_of_stream(1);
        assert_eq!(
            u.on_trigger(CheckpointId(4)),
            UnalignOutcome::Start { id: CheckpointId(4), declined: None, complete: true }
        );
    }

    #[test]
    fn unaligned_ended_inputs_deliver_every_barrier() {
        let mut u = Unaligner::new(3);
        assert_eq!(u.on_end_of_stream(2), None);
        assert_eq!(u.on_barrier(0, C1), UnalignOutcome::Start { id: C1, declined: None, complete: false });
        assert!(!u.must_log(2));
        assert_eq!(u.on_end_of_stream(1), Some(C1), "the last open input ended");
        assert_eq!(u.on_barrier(0, C2), UnalignOutcome::Start { id: C2, declined: None, complete: true });
    }

    #[test]
    fn unaligned_a_cancelled_checkpoint_stops_logging_and_its_late_barriers_are_obsolete() {
        let mut u = Unaligner::new(2);
        u.on_barrier(0, C1);
        assert!(u.on_cancel(C1));
        assert!(!u.must_log(1));
        assert_eq!(u.on_barrier(1, C1), UnalignOutcome::Obsolete);
        assert!(!u.on_cancel(C2), "not open here yet");
        assert_eq!(u.on_barrier(0, C2), UnalignOutcome::Obsolete, "cancelled before its barrier came");
    }

    proptest! {
        /// Random interleavings of barriers (in id order per input, as one sender's barriers
        /// come), ends of stream and cancellations: a checkpoint completes only after every
        /// input delivered it or ended, completed ids increase, and records are logged only
        /// while a checkpoint is open, never from an input that delivered it.
        #[test]
        fn unaligned_invariants_hold_under_any_interleaving(
            inputs in 1usize..5,
            evs in proptest::collection::vec((0u8..3, 0usize..5), 0..200),
        ) {
            let mut u = Unaligner::new(inputs);
            let mut next = vec![1u64; inputs];
            let mut ended = vec![false; inputs];
            let mut delivered: Vec<Vec<u64>> = vec![Vec::new(); inputs];
            let mut last_done = 0u64;
            for (kind, i) in evs {
                let i = i % inputs;
                match kind {
                    0 if !ended[i] => {
                        let id = CheckpointId(next[i]);
                        next[i] += 1;
                        delivered[i].push(id.0);
                        let done = match u.on_barrier(i, id) {
                            UnalignOutcome::Start { id, complete: true, .. } => Some(id),
                            UnalignOutcome::Delivered { complete: true } => Some(id),
                            _ => None,
                        };
                        if let Some(c) = done {
                            prop_assert!(c.0 > last_done);
                            for j in 0..inputs {
                                prop_assert!(ended[j] || delivered[j].contains(&c.0), "input {j} had not delivered {c:?}");
                            }
                            last_done = c.0;
                        }
                    }
                    1 if !ended[i] => {
                        ended[i] = true;
                        if let Some(c) = u.on_end_of_stream(i) {
                            prop_assert!(c.0 > last_done);
                            last_done = c.0;
                        }
                    }
                    2 => {
                        if let Some(c) = u.current() { u.on_cancel(c); }
                    }
                    _ => {}
                }
                for j in 0..inputs {
                    if u.must_log(j) {
                        let c = u.current().expect("logging only while a checkpoint is open");
                        prop_assert!(!ended[j] && !delivered[j].contains(&c.0));
                    }
                }
            }
        }
    }
}
