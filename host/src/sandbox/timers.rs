//! The timer service of one subtask: keyed timers registered by the guest, fired in time
//! order when the watermark (event time) or the clock (processing time) passes them.
//!
//! Invariant: a (domain, key group, key, time) timer is stored at most once and fires at
//! most once.

use std::collections::BTreeSet;

use crate::record::Batch;

/// The host's clock in milliseconds since the Unix epoch: what processing-time timers fire
/// by, and what `context.current-processing-time` answers.
pub fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Host bytes charged per timer besides its key (the entry and its share of the tree).
pub const TIMER_OVERHEAD: usize = 64;

/// Timers of one domain, ordered by time.
#[derive(Default, Debug)]
pub struct TimerQueue {
    timers: BTreeSet<(i64, u32, Vec<u8>)>,
    bytes: usize,
}

impl TimerQueue {
    /// Registers a timer.
    pub fn register(&mut self, time: i64, key_group: u32, key: &[u8]) {
        if self.timers.insert((time, key_group, key.to_vec())) {
            self.bytes += key.len() + TIMER_OVERHEAD;
        }
    }

    /// Deletes a timer, if present.
    pub fn delete(&mut self, time: i64, key_group: u32, key: &[u8]) {
        if self.timers.remove(&(time, key_group, key.to_vec())) {
            self.bytes -= key.len() + TIMER_OVERHEAD;
        }
    }

    /// Host bytes the timers are charged (keys plus [`TIMER_OVERHEAD`] each).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Removes and returns, as a batch, every timer with `time <= now`.
    pub fn pop_due(&mut self, now: i64) -> Batch {
        let mut out = Batch::default();
        while let Some(first) = self.timers.first() {
            if first.0 > now {
                break;
            }
            let (t, kg, key) = self.timers.pop_first().unwrap();
            self.bytes -= key.len() + TIMER_OVERHEAD;
            out.push(kg, t, &key, &[]);
        }
        out
    }

    /// The timers grouped by key group: key group → [(time, key)].
    pub fn by_key_group(&self) -> std::collections::BTreeMap<u32, Vec<(i64, Vec<u8>)>> {
        let mut m: std::collections::BTreeMap<u32, Vec<(i64, Vec<u8>)>> = std::collections::BTreeMap::new();
        for (t, kg, key) in &self.timers {
            m.entry(*kg).or_default().push((*t, key.clone()));
        }
        m
    }

    /// Earliest timer time.
    pub fn next_time(&self) -> Option<i64> {
        self.timers.first().map(|t| t.0)
    }

    /// Number of timers.
    pub fn len(&self) -> usize {
        self.timers.len()
    }

    /// No timers.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_due_timers_in_time_order_once() {
        let mut q = TimerQueue::default();
        q.register(30, 1, b"b");
        q.register(10, 2, b"a");
        q.register(10, 2, b"a");
        q.register(50, 1, b"c");
        q.delete(50, 1, b"c");
        assert_eq!(q.bytes(), 2 * TIMER_OVERHEAD + 2, "a duplicate or deleted timer is not charged");
        let due = q.pop_due(30);
        let got: Vec<_> = due.iter().map(|r| (r.timestamp, r.tag, r.key.to_vec())).collect();
        assert_eq!(got, vec![(10, 2, b"a".to_vec()), (30, 1, b"b".to_vec())]);
        assert!(q.pop_due(i64::MAX).is_empty());
        assert_eq!(q.bytes(), 0);
    }
}
