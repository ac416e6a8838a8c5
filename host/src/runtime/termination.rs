//! Termination of jobs with loops. End of stream cannot simply flow around a loop (the head
//! would wait for its own end), so the job counts records in flight: every subtask adds the
//! record copies it pushes towards channels and then subtracts the records it consumed.
//!
//! Invariant: a subtask adds its output before it subtracts the input that caused it, so the
//! count is 0 only when no record is queued, buffered or being processed anywhere. Once
//! every source has finished and the count is 0, nothing can create a record any more: loop
//! heads may end the loop's edges.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

/// Shared by every subtask of a job with loops.
#[derive(Debug)]
pub struct LoopTermination {
    in_flight: AtomicI64,
    sources_running: AtomicUsize,
}

impl LoopTermination {
    /// A job with `sources` source subtasks.
    pub fn new(sources: usize) -> Self {
        LoopTermination { in_flight: AtomicI64::new(0), sources_running: AtomicUsize::new(sources) }
    }

    /// A subtask pushed `produced` record copies, then finished with `consumed` records.
    #[inline]
    pub fn account(&self, produced: u64, consumed: u64) {
        if produced > 0 {
            self.in_flight.fetch_add(produced as i64, Ordering::SeqCst);
        }
        if consumed > 0 {
            self.in_flight.fetch_sub(consumed as i64, Ordering::SeqCst);
        }
    }

    /// A source subtask finished.
    pub fn source_finished(&self) {
        self.sources_running.fetch_sub(1, Ordering::SeqCst);
    }

    /// No source runs and no record is in flight.
    pub fn quiescent(&self) -> bool {
        self.sources_running.load(Ordering::SeqCst) == 0 && self.in_flight.load(Ordering::SeqCst) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiescent_only_when_sources_are_done_and_nothing_is_in_flight() {
        let t = LoopTermination::new(1);
        t.account(10, 0);
        t.source_finished();
        assert!(!t.quiescent());
        // A subtask consumes 10 and, in doing so, sends 3 around the loop.
        t.account(3, 10);
        assert!(!t.quiescent());
        t.account(0, 3);
        assert!(t.quiescent());
    }
}
