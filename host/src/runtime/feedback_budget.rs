//! Records in flight on a job's back-edges, bounded.
//!
//! Back-edge channels are unbounded, so that a loop never deadlocks under backpressure (ABS
//! §3.3): what a loop produces faster than it consumes piles up in host memory. A job's
//! back-edges share one budget (`[limits] max_feedback_mb`): every batch sent on a back-edge
//! adds its bytes, every batch a loop head takes off one subtracts them, and the subtask whose
//! emit takes the total past the limit fails naming it. The records a loop head logs for a
//! checkpoint in progress count too, until the log is handed to the writer or dropped.
//! Memory held thus stays within the limit plus one batch per sender.

use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes on a job's back-edges and their limit.
#[derive(Debug)]
pub struct FeedbackBudget {
    held: AtomicU64,
    limit: u64,
}

impl FeedbackBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        FeedbackBudget { held: AtomicU64::new(0), limit }
    }

    /// A batch of `bytes` was sent on a back-edge.
    pub fn add(&self, bytes: u64) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A batch of `bytes` was taken off a back-edge.
    pub fn sub(&self, bytes: u64) {
        let _ = self.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| Some(h.saturating_sub(bytes)));
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// (held, limit) when over the limit.
    pub fn over(&self) -> Option<(u64, u64)> {
        let h = self.held();
        (h > self.limit).then_some((h, self.limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_what_is_in_flight_and_says_when_it_is_over() {
        let b = FeedbackBudget::new(100);
        b.add(60);
        b.add(40);
        assert_eq!(b.over(), None);
        b.add(1);
        assert_eq!(b.over(), Some((101, 100)));
        b.sub(50);
        assert_eq!((b.held(), b.over()), (51, None));
        b.sub(1000);
        assert_eq!(b.held(), 0, "never below zero");
    }
}
