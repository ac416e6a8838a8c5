//! The head of a loop (a task with feedback inputs) during a checkpoint: ABS Algorithm 2
//! (section 3.3 of the paper), as a pure state machine.
//!
//! The head aligns the barrier on its **regular** inputs only (feedback inputs are never
//! parked: that would deadlock the loop), then copies its state, forwards the barrier into
//! the loop and starts **logging** every record that arrives on a feedback input — while
//! still processing it — until the barrier has come back on every feedback input. The
//! snapshot is the state copy plus that log: exactly the records in transit on the
//! back-edges in the consistent cut. Recovery restores the state, re-processes the log, then
//! reads the inputs.
//!
//! Invariants: at most one checkpoint is being logged (a newer aligned barrier supersedes
//! it: the older is declined); a feedback input that ended counts as having returned the
//! barrier; when every regular input has ended, a trigger aligns at once (end of stream is
//! every later barrier), so checkpoints keep completing while a loop drains.

use crate::checkpoint::alignment::{AlignOutcome, Aligner};
use crate::ids::CheckpointId;

/// What the driver must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadOutcome {
    /// Nothing.
    Continue,
    /// Park this regular input.
    Park,
    /// Ignore this barrier.
    Obsolete,
    /// Regular inputs aligned on `id`: copy the state, forward the barrier, start logging.
    /// If `declined` is set, that older checkpoint was still being logged: decline it.
    StartLogging {
        /// The checkpoint.
        id: CheckpointId,
        /// An older checkpoint whose logging is abandoned.
        declined: Option<CheckpointId>,
    },
    /// The barrier of `id` came back on every feedback input: the snapshot (state copy +
    /// log) is complete.
    Complete(CheckpointId),
}

/// Checkpoint state of a loop head.
#[derive(Debug, Clone)]
pub struct LoopHead {
    /// `is_feedback[input]`.
    is_feedback: Vec<bool>,
    /// Index among regular inputs, for each input (usize::MAX for feedback inputs).
    regular_index: Vec<usize>,
    aligner: Aligner,
    regular_ended: Vec<bool>,
    logging: Option<CheckpointId>,
    returned: Vec<bool>,
    feedback_ended: Vec<bool>,
    last: Option<CheckpointId>,
}

impl LoopHead {
    /// A head whose inputs are feedback inputs where `is_feedback[i]`.
    pub fn new(is_feedback: Vec<bool>) -> Self {
        let mut n = 0;
        let regular_index = is_feedback
            .iter()
            .map(|f| {
                if *f {
                    usize::MAX
                } else {
                    n += 1;
                    n - 1
                }
            })
            .collect();
        let inputs = is_feedback.len();
        LoopHead {
            is_feedback,
            regular_index,
            aligner: Aligner::new(n),
            regular_ended: vec![false; n],
            logging: None,
            returned: vec![false; inputs],
            feedback_ended: vec![false; inputs],
            last: None,
        }
    }

    /// Whether input `i` is a feedback input.
    pub fn is_feedback(&self, i: usize) -> bool {
        self.is_feedback[i]
    }

    /// Whether input `i` is parked (only regular inputs ever are).
    pub fn is_parked(&self, i: usize) -> bool {
        !self.is_feedback[i] && self.aligner.is_parked(self.regular_index[i])
    }

    /// The checkpoint being logged.
    pub fn logging(&self) -> Option<CheckpointId> {
        self.logging
    }

    /// Whether a record arriving on input `i` now must be logged: a back-edge whose barrier
    /// has not returned yet. After its barrier, a back-edge carries records its sender
    /// emitted after its own snapshot: those are not in transit in this checkpoint (the
    /// sender re-emits them after a restore), so logging them would duplicate them.
    pub fn must_log(&self, i: usize) -> bool {
        self.logging.is_some() && self.is_feedback[i] && !self.returned[i]
    }

    /// Every regular input has ended.
    pub fn regular_inputs_ended(&self) -> bool {
        self.regular_ended.iter().all(|e| *e)
    }

    fn start(&mut self, id: CheckpointId) -> HeadOutcome {
        let declined = self.logging.take();
        self.logging = Some(id);
        for (i, r) in self.returned.iter_mut().enumerate() {
            *r = self.feedback_ended[i];
        }
        HeadOutcome::StartLogging { id, declined }
    }

    fn check_complete(&mut self) -> HeadOutcome {
        let Some(id) = self.logging else { return HeadOutcome::Continue };
        let all = (0..self.is_feedback.len()).filter(|&i| self.is_feedback[i]).all(|i| self.returned[i]);
        if all {
            self.logging = None;
            HeadOutcome::Complete(id)
        } else {
            HeadOutcome::Continue
        }
    }

    /// After `StartLogging`, whether the snapshot is already complete (no feedback input
    /// still open); the driver then completes it at once.
    pub fn complete_now(&mut self) -> Option<CheckpointId> {
        match self.check_complete() {
            HeadOutcome::Complete(id) => Some(id),
            _ => None,
        }
    }

    /// Barrier `id` arrived on input `i`.
    pub fn on_barrier(&mut self, i: usize, id: CheckpointId) -> HeadOutcome {
        if self.is_feedback[i] {
            // A back-edge delivers barrier `n` only after this subtask took its snapshot for
            // `n` (back-edges are chosen so: see `runtime/executor.rs`), so a barrier here
            // either returns the checkpoint being logged or is stale.
            if self.logging == Some(id) {
                self.returned[i] = true;
                return self.check_complete();
            }
            return HeadOutcome::Obsolete;
        }
        if self.last.is_some_and(|l| id <= l) {
            return HeadOutcome::Obsolete;
        }
        match self.aligner.on_barrier(self.regular_index[i], id) {
            AlignOutcome::Park => HeadOutcome::Park,
            AlignOutcome::Aligned(id) | AlignOutcome::Superseded { started: id, aligned: true, .. } => {
                self.last = Some(id);
                self.start(id)
            }
            AlignOutcome::Superseded { .. } => HeadOutcome::Park,
            AlignOutcome::Obsolete | AlignOutcome::Continue => HeadOutcome::Obsolete,
        }
    }

    /// Checkpoint `id` was triggered. Once every regular input has ended, no barrier can
    /// arrive on them any more: align at once.
    pub fn on_trigger(&mut self, id: CheckpointId) -> HeadOutcome {
        if self.regular_inputs_ended() && self.last.is_none_or(|l| id > l) {
            self.last = Some(id);
            return self.start(id);
        }
        HeadOutcome::Continue
    }

    /// Input `i` ended.
    pub fn on_end_of_stream(&mut self, i: usize) -> HeadOutcome {
        if self.is_feedback[i] {
            self.feedback_ended[i] = true;
            if self.logging.is_some() {
                self.returned[i] = true;
                return self.check_complete();
            }
            return HeadOutcome::Continue;
        }
        let r = self.regular_index[i];
        self.regular_ended[r] = true;
        match self.aligner.on_end_of_stream(r) {
            AlignOutcome::Aligned(id) => {
                self.last = Some(id);
                self.start(id)
            }
            _ => HeadOutcome::Continue,
        }
    }

    /// Checkpoint `id` was aborted.
    pub fn on_cancel(&mut self, id: CheckpointId) {
        self.aligner.on_cancel(id);
        if self.logging == Some(id) {
            self.logging = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C1: CheckpointId = CheckpointId(1);
    const C2: CheckpointId = CheckpointId(2);

    /// Inputs: 0 regular, 1 regular, 2 feedback.
    fn head() -> LoopHead {
        LoopHead::new(vec![false, false, true])
    }

    #[test]
    fn aligns_on_regular_inputs_only_and_never_parks_feedback() {
        let mut h = head();
        assert_eq!(h.on_barrier(0, C1), HeadOutcome::Park);
        assert!(h.is_parked(0) && !h.is_parked(2));
        assert_eq!(h.on_barrier(1, C1), HeadOutcome::StartLogging { id: C1, declined: None });
        assert!(!h.is_parked(0) && !h.is_parked(1));
    }

    #[test]
    fn logs_feedback_records_until_the_barrier_returns() {
        let mut h = head();
        assert!(!h.must_log(2));
        h.on_barrier(0, C1);
        h.on_barrier(1, C1);
        assert!(h.must_log(2), "feedback records after the state copy are in transit");
        assert!(!h.must_log(0), "regular records are never logged");
        assert_eq!(h.on_barrier(2, C1), HeadOutcome::Complete(C1));
        assert!(!h.must_log(2));
    }

    #[test]
    fn a_back_edge_ends_logging_once_its_own_barrier_returned() {
        // Inputs: 0 regular, 1 and 2 feedback (e.g. from two subtasks of the loop).
        let mut h = LoopHead::new(vec![false, true, true]);
        assert_eq!(h.on_barrier(0, C1), HeadOutcome::StartLogging { id: C1, declined: None });
        assert!(h.must_log(1) && h.must_log(2));
        assert_eq!(h.on_barrier(1, C1), HeadOutcome::Continue);
        assert!(!h.must_log(1), "records after the barrier on input 1 are post-snapshot: not in transit");
        assert!(h.must_log(2), "input 2 still carries records in transit");
        assert_eq!(h.on_barrier(2, C1), HeadOutcome::Complete(C1));
    }

    #[test]
    fn a_newer_alignment_while_logging_declines_the_older_checkpoint() {
        let mut h = head();
        h.on_barrier(0, C1);
        h.on_barrier(1, C1);
        h.on_barrier(0, C2);
        assert_eq!(h.on_barrier(1, C2), HeadOutcome::StartLogging { id: C2, declined: Some(C1) });
        assert_eq!(h.on_barrier(2, C1), HeadOutcome::Obsolete, "the older barrier returning is ignored");
        assert_eq!(h.on_barrier(2, C2), HeadOutcome::Complete(C2));
    }

    #[test]
    fn ended_feedback_counts_as_returned_and_ended_regular_inputs_align_on_trigger() {
        let mut h = head();
        h.on_end_of_stream(0);
        assert_eq!(h.on_end_of_stream(1), HeadOutcome::Continue);
        assert!(h.regular_inputs_ended());
        // The loop is draining: a trigger aligns at once.
        assert_eq!(h.on_trigger(C1), HeadOutcome::StartLogging { id: C1, declined: None });
        assert_eq!(h.on_end_of_stream(2), HeadOutcome::Complete(C1));
        assert_eq!(h.on_trigger(C2), HeadOutcome::StartLogging { id: C2, declined: None });
        assert_eq!(h.complete_now(), Some(C2), "no feedback input left open: complete at once");
    }

    #[test]
    fn cancellation_ends_logging() {
        let mut h = head();
        h.on_barrier(0, C1);
        h.on_barrier(1, C1);
        h.on_cancel(C1);
        assert!(!h.must_log(2));
        assert_eq!(h.on_barrier(2, C1), HeadOutcome::Obsolete);
    }

    proptest! {
        /// Interleavings of barriers (in order per input), feedback data and ends of stream:
        /// feedback inputs are never parked; a snapshot completes only after every open
        /// feedback input returned its barrier; logging happens exactly between
        /// StartLogging and Complete.
        #[test]
        fn back_edge_invariants_hold(evs in proptest::collection::vec((0u8..3, 0usize..3), 0..150)) {
            let mut h = head();
            let mut next = [1u64; 3];
            let mut ended = [false; 3];
            let mut logging: Option<u64> = None;
            let mut returned = [false; 3];
            for (kind, i) in evs {
                if ended[i] || h.is_parked(i) { continue; }
                prop_assert!(!(i == 2 && h.is_parked(2)));
                match kind {
                    0 => {
                        prop_assert_eq!(h.must_log(i), logging.is_some() && i == 2 && !returned[2]);
                    }
                    1 => {
                        // Regular inputs carry fresh barriers; the feedback input returns the
                        // barrier being logged (if any).
                        let id = if i == 2 {
                            match logging { Some(l) if !returned[2] => l, _ => continue }
                        } else {
                            next[i] += 1;
                            next[i] - 1
                        };
                        if i == 2 { returned[2] = true; }
                        match h.on_barrier(i, CheckpointId(id)) {
                            HeadOutcome::StartLogging { id, .. } => { logging = Some(id.0); returned = [false, false, ended[2]]; if let Some(c) = h.complete_now() { prop_assert_eq!(Some(c.0), logging); logging = None; } }
                            HeadOutcome::Complete(c) => { prop_assert_eq!(Some(c.0), logging); prop_assert!(returned[2] || ended[2]); logging = None; }
                            _ => {}
                        }
                    }
                    _ => {
                        ended[i] = true;
                        match h.on_end_of_stream(i) {
                            HeadOutcome::StartLogging { id, .. } => { logging = Some(id.0); returned = [false, false, ended[2]]; if let Some(c) = h.complete_now() { prop_assert_eq!(Some(c.0), logging); logging = None; } }
                            HeadOutcome::Complete(c) => { prop_assert_eq!(Some(c.0), logging); logging = None; }
                            _ => {}
                        }
                    }
                }
                prop_assert_eq!(h.logging().map(|c| c.0), logging);
            }
        }
    }
}
