//! Rate limiting for sources and slow sinks (`rate = R` records per second).
//!
//! Invariant: a throttled source never sleeps more than [`MAX_NAP`] at a time, so it keeps
//! answering checkpoint triggers promptly (a barrier is never stuck behind a long sleep), and
//! it emits in small batches as records come due instead of a full batch after a long wait.

use std::time::{Duration, Instant};

/// Longest single sleep of a throttled source.
pub const MAX_NAP: Duration = Duration::from_millis(5);

/// A source's rate budget.
#[derive(Debug, Clone)]
pub struct Throttle {
    rate: u64,
    started: Instant,
    emitted: u64,
}

impl Throttle {
    /// `rate` records per second from now.
    pub fn new(rate: u64) -> Self {
        Throttle { rate: rate.max(1), started: Instant::now(), emitted: 0 }
    }

    /// Records due by `elapsed` since the start that have not been emitted, at most `max`.
    pub fn due_at(&self, elapsed: Duration, max: u32) -> u32 {
        let due = (elapsed.as_secs_f64() * self.rate as f64) as u64 + 1;
        due.saturating_sub(self.emitted).min(max as u64) as u32
    }

    /// Records that may go now, at most `max`; if none, naps (at most [`MAX_NAP`]) and
    /// answers again — 0 then means "nothing due yet, come back".
    pub fn admit(&mut self, max: u32) -> u32 {
        let n = self.due_at(self.started.elapsed(), max);
        if n > 0 {
            return n;
        }
        let next = self.started + Duration::from_secs_f64(self.emitted as f64 / self.rate as f64);
        std::thread::sleep(next.saturating_duration_since(Instant::now()).min(MAX_NAP));
        self.due_at(self.started.elapsed(), max)
    }

    /// Waits until `n` more records are due, in naps of at most [`MAX_NAP`]; returns early
    /// when `cancel` is set (a slow sink stays cancellable).
    pub fn hold(&mut self, n: u32, cancel: &std::sync::atomic::AtomicBool) {
        let mut left = n;
        while left > 0 && !cancel.load(std::sync::atomic::Ordering::Relaxed) {
            let k = self.admit(left);
            self.record(k);
            left -= k;
        }
    }

    /// `n` records went out.
    pub fn record(&mut self, n: u32) {
        self.emitted += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_what_is_due_never_a_burst_of_the_future() {
        let mut t = Throttle::new(1000);
        assert_eq!(t.due_at(Duration::ZERO, 64), 1);
        assert_eq!(t.due_at(Duration::from_millis(10), 64), 11);
        assert_eq!(t.due_at(Duration::from_secs(10), 64), 64);
        t.record(11);
        assert_eq!(t.due_at(Duration::from_millis(10), 64), 0);
        assert_eq!(t.due_at(Duration::from_millis(20), 64), 10);
    }
}
