//! A checkpoint that aligns first and switches to unaligned after a timeout (Flink's
//! `execution.checkpointing.aligned-checkpoint-timeout`), as a pure state machine over
//! [`Unaligner`].
//!
//! Barriers travel ahead of the records: `runtime/input.rs` moves an input's records up to
//! the barrier's position into the input's front when the barrier comes. While a checkpoint
//! **aligns** here, that front is processed as usual; an input whose front up to the barrier
//! is consumed has *reached* the barrier and is parked (its later records stay queued and
//! backpressure their sender, as in ABS), and once every input reached it (or ended) the task
//! snapshots with nothing in flight: an aligned checkpoint. If the checkpoint still aligns
//! `timeout` after it was triggered (the trigger's time travels with the barriers, so every
//! task of the job switches at about the same moment), the task **switches**: it snapshots at
//! once, every input unparks, and what is still in flight is logged as in an unaligned
//! checkpoint — the unconsumed fronts of the inputs whose barrier came, and the records of the
//! others until theirs comes. With a zero timeout every checkpoint is unaligned from its first
//! barrier (`alignment = "unaligned"`).
//!
//! The driver (`runtime/task.rs`, `runtime/sink.rs`) carries the [`Step`]s out in order,
//! through the same code as an unaligned checkpoint: an aligned completion is a switch at
//! which every input has reached the barrier, so every front it logs is empty.
//!
//! Invariants: an input is parked only while its checkpoint aligns and only once its records
//! before the barrier were consumed; records are logged only after a switch, and only those
//! that cross the snapshot; at most one checkpoint is open here (aligning or switched), and a
//! newer barrier declines the older; a barrier of a finished, declined or cancelled checkpoint
//! is obsolete.

use std::time::{Duration, Instant};

use crate::checkpoint::unaligned::{UnalignOutcome, Unaligner};
use crate::ids::CheckpointId;

/// What the driver must do, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// An unaligned checkpoint's outcome for the barrier on `input` (`None`: the snapshot at
    /// a switch, before the inputs' fronts are logged).
    Unalign(Option<usize>, UnalignOutcome),
    /// Checkpoint `old` was still open here when a barrier of `new` came: give it up.
    Decline {
        /// The checkpoint given up.
        old: CheckpointId,
        /// The one that replaced it.
        new: CheckpointId,
    },
    /// The last open input ended: the open checkpoint is complete here.
    Complete,
}

/// A checkpoint aligning here.
#[derive(Debug, Clone)]
struct Aligning {
    id: CheckpointId,
    /// When it was triggered.
    started: Instant,
    /// Inputs whose barrier came.
    marked: Vec<bool>,
    /// Inputs whose records before the barrier were consumed (parked).
    reached: Vec<bool>,
}

/// Checkpoint state of one task whose barriers overtake records.
#[derive(Debug, Clone)]
pub struct TimedAligner {
    un: Unaligner,
    timeout: Duration,
    aligning: Option<Aligning>,
    /// The open (or last) checkpoint's trigger time and how long it aligned here.
    opened: Option<(Instant, Duration)>,
}

impl TimedAligner {
    /// A task with `inputs` inputs whose checkpoints align for up to `timeout`.
    pub fn new(inputs: usize, timeout: Duration) -> Self {
        TimedAligner { un: Unaligner::new(inputs), timeout, aligning: None, opened: None }
    }

    /// The checkpoint open here (aligning or switched), if any.
    pub fn current(&self) -> Option<CheckpointId> {
        self.aligning.as_ref().map(|a| a.id).or(self.un.current())
    }

    /// Whether a checkpoint is aligning here (the driver polls for its timeout).
    pub fn is_aligning(&self) -> bool {
        self.aligning.is_some()
    }

    /// Whether `input` is parked: it reached the barrier of the aligning checkpoint.
    pub fn is_parked(&self, input: usize) -> bool {
        self.aligning.as_ref().is_some_and(|a| a.reached[input])
    }

    /// Whether a record applied from `input` now must be logged (after a switch, until the
    /// input's barrier is delivered).
    pub fn must_log(&self, input: usize) -> bool {
        self.un.must_log(input)
    }

    /// The switched checkpoint's trigger time (for the barriers it sends on) and how long it
    /// aligned here.
    pub fn opened(&self) -> Option<(Instant, Duration)> {
        self.opened
    }

    /// Barrier `id`, triggered at `started`, came on `input` at `now`; `drained` if nothing
    /// of the input is in flight before it (the input reached it at once).
    pub fn on_marker(
        &mut self,
        input: usize,
        id: CheckpointId,
        started: Instant,
        drained: bool,
        now: Instant,
    ) -> Vec<Step> {
        if self.un.is_obsolete(id) || self.aligning.as_ref().is_some_and(|a| id < a.id) {
            return Vec::new();
        }
        let mut steps = Vec::new();
        if let Some(c) = self.un.current() {
            if c == id {
                return vec![Step::Unalign(Some(input), self.un.on_barrier(input, id))];
            }
            self.un.on_cancel(c);
            steps.push(Step::Decline { old: c, new: id });
        }
        match &mut self.aligning {
            Some(a) if a.id == id => {
                if a.marked[input] {
                    return steps;
                }
                a.marked[input] = true;
                a.reached[input] = drained;
            }
            aligning => {
                if let Some(old) = aligning.take() {
                    self.un.on_cancel(old.id);
                    steps.push(Step::Decline { old: old.id, new: id });
                }
                let n = self.inputs();
                let mut a = Aligning { id, started, marked: vec![false; n], reached: vec![false; n] };
                a.marked[input] = true;
                a.reached[input] = drained;
                self.aligning = Some(a);
            }
        }
        steps.extend(self.check(now));
        steps
    }

    /// `input`'s records before the aligning checkpoint's barrier have all been consumed.
    pub fn on_drained(&mut self, input: usize, now: Instant) -> Vec<Step> {
        match &mut self.aligning {
            Some(a) if a.marked[input] && !a.reached[input] => a.reached[input] = true,
            _ => return Vec::new(),
        }
        self.check(now)
    }

    /// Time passed: switches the aligning checkpoint if its timeout is over.
    pub fn poll(&mut self, now: Instant) -> Vec<Step> {
        self.check(now)
    }

    /// `input` ended.
    pub fn on_end_of_stream(&mut self, input: usize, now: Instant) -> Vec<Step> {
        let mut steps = Vec::new();
        if self.un.on_end_of_stream(input).is_some() {
            steps.push(Step::Complete);
        }
        steps.extend(self.check(now));
        steps
    }

    /// Checkpoint `id` was triggered at a task none of whose open inputs can deliver its
    /// barrier first (a loop head whose regular inputs ended): it starts unaligned now.
    pub fn on_trigger(&mut self, id: CheckpointId, now: Instant) -> Vec<Step> {
        let mut steps = Vec::new();
        if let Some(old) = self.aligning.take_if(|a| a.id < id) {
            self.un.on_cancel(old.id);
            steps.push(Step::Decline { old: old.id, new: id });
        }
        if self.aligning.is_some() {
            return steps;
        }
        let o = self.un.on_trigger(id);
        if matches!(o, UnalignOutcome::Start { .. }) {
            self.opened = Some((now, Duration::ZERO));
        }
        steps.push(Step::Unalign(None, o));
        steps
    }

    /// Checkpoint `id` was cancelled. Returns true if it was switched here (the driver drops
    /// its snapshot and log).
    pub fn on_cancel(&mut self, id: CheckpointId) -> bool {
        if self.aligning.take_if(|a| a.id == id).is_some() {
            self.un.on_cancel(id);
            return false;
        }
        self.un.on_cancel(id)
    }

    fn inputs(&self) -> usize {
        self.un.inputs()
    }

    /// Completes the aligning checkpoint if every input reached its barrier or ended, or
    /// switches it if its timeout is over.
    fn check(&mut self, now: Instant) -> Vec<Step> {
        let Some(a) = &self.aligning else { return Vec::new() };
        let aligned = (0..self.inputs()).all(|i| a.reached[i] || self.un.is_ended(i));
        let waited = now.saturating_duration_since(a.started);
        if !aligned && waited < self.timeout {
            return Vec::new();
        }
        let a = self.aligning.take().expect("aligning");
        self.opened = Some((a.started, waited));
        let mut steps = vec![Step::Unalign(None, self.un.on_trigger(a.id))];
        for i in (0..self.inputs()).filter(|&i| a.marked[i]) {
            steps.push(Step::Unalign(Some(i), self.un.on_barrier(i, a.id)));
        }
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C1: CheckpointId = CheckpointId(1);
    const C2: CheckpointId = CheckpointId(2);
    const T: Duration = Duration::from_millis(100);

    fn start(complete: bool) -> Step {
        Step::Unalign(None, UnalignOutcome::Start { id: C1, declined: None, complete })
    }

    fn delivered(i: usize, complete: bool) -> Step {
        Step::Unalign(Some(i), UnalignOutcome::Delivered { complete })
    }

    #[test]
    fn alignment_timeout_a_checkpoint_that_aligns_in_time_logs_nothing() {
        let t0 = Instant::now();
        let mut a = TimedAligner::new(2, T);
        assert_eq!(a.on_marker(0, C1, t0, false, t0), vec![], "input 0 still has records before the barrier");
        assert!(!a.is_parked(0) && !a.must_log(0) && !a.must_log(1));
        assert_eq!(a.on_drained(0, t0), vec![]);
        assert!(a.is_parked(0) && !a.is_parked(1), "input 0 reached the barrier: parked");
        assert_eq!(a.on_marker(1, C1, t0, true, t0), vec![start(false), delivered(0, false), delivered(1, true)]);
        assert!(!a.is_parked(0) && !a.must_log(0) && !a.must_log(1) && a.current().is_none());
        assert_eq!(a.on_marker(1, C1, t0, true, t0), vec![], "obsolete");
    }

    #[test]
    fn alignment_timeout_after_the_timeout_the_checkpoint_switches_and_logs_what_is_in_flight() {
        let t0 = Instant::now();
        let mut a = TimedAligner::new(3, T);
        a.on_marker(0, C1, t0, true, t0);
        a.on_marker(1, C1, t0, false, t0 + T / 2);
        assert!(a.is_parked(0) && !a.is_parked(1));
        assert_eq!(a.poll(t0 + T / 2), vec![]);
        // Input 1's front is logged (delivered now); input 2 logs until its barrier comes.
        assert_eq!(a.poll(t0 + T), vec![start(false), delivered(0, false), delivered(1, false)]);
        assert!(!a.is_parked(0) && !a.must_log(0) && !a.must_log(1) && a.must_log(2));
        assert_eq!(a.opened(), Some((t0, T)));
        assert_eq!(a.on_drained(1, t0 + T), vec![], "no longer aligning");
        assert_eq!(a.on_marker(2, C1, t0, false, t0 + T), vec![delivered(2, true)]);
        assert!(!a.must_log(2) && a.current().is_none());
    }

    #[test]
    fn alignment_timeout_zero_is_unaligned_from_the_first_barrier() {
        let t0 = Instant::now();
        let mut a = TimedAligner::new(2, Duration::ZERO);
        assert_eq!(a.on_marker(1, C1, t0, false, t0), vec![start(false), delivered(1, false)]);
        assert!(a.must_log(0) && !a.must_log(1) && !a.is_parked(1));
        assert_eq!(a.on_marker(0, C1, t0, false, t0), vec![delivered(0, true)]);
    }

    #[test]
    fn alignment_timeout_a_newer_barrier_declines_the_aligning_or_switched_checkpoint() {
        let t0 = Instant::now();
        let mut a = TimedAligner::new(2, T);
        a.on_marker(0, C1, t0, true, t0);
        assert_eq!(a.on_marker(1, C2, t0, true, t0), vec![Step::Decline { old: C1, new: C2 }]);
        assert!(!a.is_parked(0) && a.is_parked(1) && a.current() == Some(C2));
        assert_eq!(a.on_marker(0, C1, t0, true, t0), vec![], "the declined checkpoint's late barrier");
        // C2 switches; a C3 barrier declines it too.
        assert_eq!(a.poll(t0 + T).len(), 2);
        assert!(a.must_log(0));
        let c3 = CheckpointId(3);
        assert_eq!(a.on_marker(0, c3, t0 + T, false, t0 + T), vec![Step::Decline { old: C2, new: c3 }]);
        assert!(!a.must_log(0) && !a.must_log(1), "C3 aligns: nothing logged");
    }

    #[test]
    fn alignment_timeout_an_ended_input_counts_as_reached_and_a_cancel_unparks() {
        let t0 = Instant::now();
        let mut a = TimedAligner::new(2, T);
        a.on_marker(0, C1, t0, true, t0);
        assert_eq!(a.on_end_of_stream(1, t0), vec![start(false), delivered(0, true)]);
        let mut a = TimedAligner::new(2, T);
        a.on_marker(0, C1, t0, true, t0);
        assert!(!a.on_cancel(C1), "nothing was snapshotted");
        assert!(!a.is_parked(0) && a.current().is_none());
        assert_eq!(a.on_marker(1, C1, t0, true, t0), vec![], "cancelled: obsolete");
    }

    /// Random barriers, drains, ends, polls and cancels: the invariants hold.
    #[derive(Debug, Clone)]
    enum Ev {
        Marker(usize, u64, bool),
        Drained(usize),
        End(usize),
        Poll(u64),
        Cancel(u64),
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            (0..3usize, 1..4u64, any::<bool>()).prop_map(|(i, c, d)| Ev::Marker(i, c, d)),
            (0..3usize).prop_map(Ev::Drained),
            (0..3usize).prop_map(Ev::End),
            (0..300u64).prop_map(Ev::Poll),
            (1..4u64).prop_map(Ev::Cancel),
        ]
    }

    proptest! {
        #[test]
        fn alignment_timeout_never_parks_and_logs_at_once_and_starts_each_checkpoint_once(evs in proptest::collection::vec(ev(), 0..40)) {
            let t0 = Instant::now();
            let mut a = TimedAligner::new(3, T);
            let mut started: Vec<CheckpointId> = Vec::new();
            let mut now = t0;
            for e in evs {
                let steps = match e {
                    Ev::Marker(i, c, d) => a.on_marker(i, CheckpointId(c), t0, d, now),
                    Ev::Drained(i) => a.on_drained(i, now),
                    Ev::End(i) => a.on_end_of_stream(i, now),
                    Ev::Poll(ms) => { now += Duration::from_millis(ms); a.poll(now) }
                    Ev::Cancel(c) => { a.on_cancel(CheckpointId(c)); Vec::new() }
                };
                for s in steps {
                    if let Step::Unalign(_, UnalignOutcome::Start { id, .. }) = s {
                        prop_assert!(!started.contains(&id), "{id} started twice");
                        started.push(id);
                    }
                }
                for i in 0..3 {
                    prop_assert!(!(a.is_parked(i) && a.must_log(i)), "input {i} parked and logged");
                    prop_assert!(!a.must_log(i) || !a.is_aligning(), "logging while aligning");
                }
            }
        }
    }
}
