//! Barrier alignment of one task (ABS, Algorithm 1), as a pure state machine.
//!
//! A task with several input channels must not snapshot until every input has delivered
//! barrier `n`; an input whose barrier arrived is **parked** (not read) until then, so no
//! record after barrier `n` is applied before the snapshot. The driver (`runtime/task.rs`)
//! feeds events in and carries out the outcomes: park, snapshot and forward, unpark, decline.
//!
//! Edge cases, each an explicit outcome (after Flink's `BarrierHandlerState`):
//! - an **obsolete** barrier (id not newer than the current or last finished alignment) is
//!   ignored;
//! - a **newer barrier mid-alignment** aborts the current checkpoint (declined, every parked
//!   input unparked) and starts aligning the newer one;
//! - **cancellation** of the checkpoint being aligned unparks every input;
//! - **end of stream** on an input counts as "barrier delivered" for the current and every
//!   later checkpoint on that input, so it can complete an alignment.
//!
//! Invariant: an input is parked only while an alignment is open and its barrier for that
//! alignment has arrived; when no alignment is open, nothing is parked.

use crate::ids::CheckpointId;

/// What the driver must do after a barrier or an end of stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignOutcome {
    /// Park this input; wait for the others.
    Park,
    /// Every input delivered barrier `id`: snapshot, forward the barrier, unpark all.
    Aligned(CheckpointId),
    /// A barrier no newer than the current/last alignment: ignore it.
    Obsolete,
    /// A newer barrier arrived mid-alignment: decline `aborted`, unpark every input, then
    /// park this one for `started` (or snapshot at once if `started` is already aligned).
    Superseded {
        /// The checkpoint that can no longer complete here.
        aborted: CheckpointId,
        /// The newer checkpoint now being aligned.
        started: CheckpointId,
        /// `started` is already aligned (every other input has ended).
        aligned: bool,
    },
    /// Nothing to do (end of stream outside an alignment).
    Continue,
}

/// Alignment state of one task.
#[derive(Debug, Clone)]
pub struct Aligner {
    arrived: Vec<bool>,
    ended: Vec<bool>,
    current: Option<CheckpointId>,
    /// Highest checkpoint id aligned, aborted or cancelled here.
    last: Option<CheckpointId>,
}

impl Aligner {
    /// A task with `inputs` input channels.
    pub fn new(inputs: usize) -> Self {
        Aligner { arrived: vec![false; inputs], ended: vec![false; inputs], current: None, last: None }
    }

    /// The checkpoint being aligned, if any.
    pub fn current(&self) -> Option<CheckpointId> {
        self.current
    }

    /// Whether `input` is parked (its barrier arrived, others' not yet).
    pub fn is_parked(&self, input: usize) -> bool {
        self.current.is_some() && self.arrived[input]
    }

    fn complete(&self) -> bool {
        self.arrived.iter().zip(&self.ended).all(|(a, e)| *a || *e)
    }

    fn open(&mut self, id: CheckpointId, input: usize) -> bool {
        self.arrived.iter_mut().for_each(|a| *a = false);
        self.arrived[input] = true;
        self.current = Some(id);
        self.try_finish()
    }

    fn try_finish(&mut self) -> bool {
        if self.complete() {
            self.last = self.current.take();
            self.arrived.iter_mut().for_each(|a| *a = false);
            true
        } else {
            false
        }
    }

    /// Barrier `id` arrived on `input`.
    pub fn on_barrier(&mut self, input: usize, id: CheckpointId) -> AlignOutcome {
        if self.last.is_some_and(|l| id <= l) {
            return AlignOutcome::Obsolete;
        }
        match self.current {
            None => {
                if self.open(id, input) {
                    AlignOutcome::Aligned(id)
                } else {
                    AlignOutcome::Park
                }
            }
            Some(cur) if id == cur => {
                self.arrived[input] = true;
                if self.try_finish() { AlignOutcome::Aligned(id) } else { AlignOutcome::Park }
            }
            Some(cur) if id < cur => AlignOutcome::Obsolete,
            Some(cur) => {
                self.last = Some(cur);
                let aligned = self.open(id, input);
                AlignOutcome::Superseded { aborted: cur, started: id, aligned }
            }
        }
    }

    /// `input` ended: it delivers every barrier from now on.
    pub fn on_end_of_stream(&mut self, input: usize) -> AlignOutcome {
        self.ended[input] = true;
        match self.current {
            Some(id) => {
                if self.try_finish() {
                    AlignOutcome::Aligned(id)
                } else {
                    AlignOutcome::Continue
                }
            }
            None => AlignOutcome::Continue,
        }
    }

    /// Checkpoint `id` was cancelled (timeout, decline elsewhere). Returns true if it was
    /// being aligned here: the driver unparks every input.
    pub fn on_cancel(&mut self, id: CheckpointId) -> bool {
        if self.current == Some(id) {
            self.current = None;
            self.last = Some(self.last.map_or(id, |l| l.max(id)));
            self.arrived.iter_mut().for_each(|a| *a = false);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C1: CheckpointId = CheckpointId(1);
    const C2: CheckpointId = CheckpointId(2);
    const C3: CheckpointId = CheckpointId(3);

    #[test]
    fn single_input_aligns_at_once() {
        let mut a = Aligner::new(1);
        assert_eq!(a.on_barrier(0, C1), AlignOutcome::Aligned(C1));
        assert!(!a.is_parked(0));
    }

    #[test]
    fn parks_each_input_until_all_delivered() {
        let mut a = Aligner::new(3);
        assert_eq!(a.on_barrier(1, C1), AlignOutcome::Park);
        assert!(a.is_parked(1) && !a.is_parked(0));
        assert_eq!(a.on_barrier(0, C1), AlignOutcome::Park);
        assert_eq!(a.on_barrier(2, C1), AlignOutcome::Aligned(C1));
        assert!((0..3).all(|i| !a.is_parked(i)));
        assert_eq!(a.current(), None);
    }

    #[test]
    fn obsolete_barrier_is_ignored() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, C2);
        a.on_barrier(1, C2);
        assert_eq!(a.on_barrier(0, C1), AlignOutcome::Obsolete);
        assert_eq!(a.on_barrier(0, C2), AlignOutcome::Obsolete);
        assert_eq!(a.on_barrier(0, C3), AlignOutcome::Park);
        assert_eq!(a.on_barrier(1, C2), AlignOutcome::Obsolete, "older than the open alignment");
    }

    #[test]
    fn newer_barrier_mid_alignment_aborts_current_checkpoint() {
        let mut a = Aligner::new(3);
        assert_eq!(a.on_barrier(0, C1), AlignOutcome::Park);
        assert_eq!(a.on_barrier(1, C2), AlignOutcome::Superseded { aborted: C1, started: C2, aligned: false });
        assert!(!a.is_parked(0), "inputs parked for the aborted checkpoint are released");
        assert!(a.is_parked(1));
        assert_eq!(a.on_barrier(0, C1), AlignOutcome::Obsolete, "a late barrier of the aborted checkpoint");
        assert_eq!(a.on_barrier(0, C2), AlignOutcome::Park);
        assert_eq!(a.on_barrier(2, C2), AlignOutcome::Aligned(C2));
    }

    #[test]
    fn cancellation_releases_parked_inputs() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, C1);
        assert!(!a.on_cancel(C2), "not the open alignment");
        assert!(a.on_cancel(C1));
        assert!(!a.is_parked(0));
        assert_eq!(a.on_barrier(1, C1), AlignOutcome::Obsolete);
    }

    #[test]
    fn end_of_stream_during_alignment_counts_as_the_barrier() {
        let mut a = Aligner::new(3);
        assert_eq!(a.on_barrier(0, C1), AlignOutcome::Park);
        assert_eq!(a.on_end_of_stream(2), AlignOutcome::Continue);
        assert_eq!(a.on_end_of_stream(1), AlignOutcome::Aligned(C1));
        // Later checkpoints need only the input that is still open.
        assert_eq!(a.on_barrier(0, C2), AlignOutcome::Aligned(C2));
    }

    #[test]
    fn end_of_stream_outside_alignment_changes_nothing_else() {
        let mut a = Aligner::new(2);
        assert_eq!(a.on_end_of_stream(0), AlignOutcome::Continue);
        assert_eq!(a.on_barrier(1, C1), AlignOutcome::Aligned(C1));
    }

    #[derive(Debug, Clone)]
    enum Ev {
        Data(usize),
        Barrier(usize),
        Eos(usize),
        Cancel,
    }

    proptest! {
        /// Random interleavings of data, barriers (in order per input, as FIFO channels
        /// deliver them), cancellations and ends of stream. Checks the invariants: no data is
        /// consumed from a parked input; a checkpoint aligns only after every open input
        /// delivered its barrier; aligned ids increase; nothing stays parked without an open
        /// alignment.
        #[test]
        fn alignment_invariants_hold_under_any_interleaving(
            inputs in 1usize..5,
            evs in proptest::collection::vec((0u8..4, 0usize..5), 0..200),
        ) {
            let mut a = Aligner::new(inputs);
            let mut next_barrier = vec![1u64; inputs];
            let mut ended = vec![false; inputs];
            let mut delivered: Vec<Vec<u64>> = vec![Vec::new(); inputs];
            let mut last_aligned = 0u64;
            for (kind, i) in evs {
                let i = i % inputs;
                let ev = match kind { 0 => Ev::Data(i), 1 => Ev::Barrier(i), 2 => Ev::Eos(i), _ => Ev::Cancel };
                match ev {
                    Ev::Data(i) => {
                        // The driver never reads a parked input.
                        if !ended[i] && a.is_parked(i) { continue; }
                    }
                    Ev::Barrier(i) => {
                        if ended[i] || a.is_parked(i) { continue; }
                        let id = CheckpointId(next_barrier[i]);
                        next_barrier[i] += 1;
                        delivered[i].push(id.0);
                        match a.on_barrier(i, id) {
                            AlignOutcome::Aligned(c) | AlignOutcome::Superseded { started: c, aligned: true, .. } => {
                                prop_assert!(c.0 > last_aligned);
                                for j in 0..inputs {
                                    prop_assert!(ended[j] || delivered[j].contains(&c.0), "input {j} had not delivered {c:?}");
                                }
                                last_aligned = c.0;
                            }
                            _ => {}
                        }
                    }
                    Ev::Eos(i) => {
                        if ended[i] || a.is_parked(i) { continue; }
                        ended[i] = true;
                        if let AlignOutcome::Aligned(c) = a.on_end_of_stream(i) {
                            prop_assert!(c.0 > last_aligned);
                            last_aligned = c.0;
                        }
                    }
                    Ev::Cancel => {
                        if let Some(c) = a.current() { a.on_cancel(c); }
                    }
                }
                if a.current().is_none() {
                    prop_assert!((0..inputs).all(|j| !a.is_parked(j)));
                }
                // Deadlock freedom: while aligning, some open input is not parked.
                if a.current().is_some() {
                    prop_assert!((0..inputs).any(|j| !ended[j] && !a.is_parked(j)));
                }
            }
        }
    }
}
