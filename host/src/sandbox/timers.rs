//! The timer service of one subtask: keyed timers registered by the guest, fired in time
//! order when the watermark (event time) or the clock (processing time) passes them.
//!
//! Invariant: a (domain, key group, key, time) timer is stored at most once and fires at
//! most once.

use std::collections::BTreeSet;

use crate::checkpoint::timer_list::TimerList;
use crate::record::Batch;

/// The host's clock in milliseconds since the Unix epoch: what processing-time timers fire
/// by, and what `context.current-processing-time` answers.
pub fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Host bytes charged per timer whose key is stored inline (the entry and its share of the
/// tree's nodes, which an ascending stream of timers leaves about half full).
pub const TIMER_OVERHEAD: usize = 64;

/// Keys up to this many bytes are stored in the timer itself, with no allocation of their own.
const INLINE: usize = 18;

/// A timer's key group and key: inline up to [`INLINE`] bytes, so that a timer of a short key
/// (a u64, a small tuple) is one 32-byte entry of the tree and no allocation.
#[derive(Clone, Debug)]
enum TimerKey {
    Inline { key_group: u32, len: u8, bytes: [u8; INLINE] },
    Heap { key_group: u32, key: Box<[u8]> },
}

impl TimerKey {
    fn new(key_group: u32, key: &[u8]) -> Self {
        if key.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            TimerKey::Inline { key_group, len: key.len() as u8, bytes }
        } else {
            TimerKey::Heap { key_group, key: key.into() }
        }
    }

    fn key_group(&self) -> u32 {
        match self {
            TimerKey::Inline { key_group, .. } | TimerKey::Heap { key_group, .. } => *key_group,
        }
    }

    fn key(&self) -> &[u8] {
        match self {
            TimerKey::Inline { len, bytes, .. } => &bytes[..*len as usize],
            TimerKey::Heap { key, .. } => key,
        }
    }
}

/// One timer, ordered by time, then key group, then key bytes.
#[derive(Clone, Debug)]
struct Timer {
    time: i64,
    key: TimerKey,
}

impl Timer {
    fn parts(&self) -> (i64, u32, &[u8]) {
        (self.time, self.key.key_group(), self.key.key())
    }
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Timer {}

impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Timer {
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Times differ in almost every comparison of the tree's search: the key group and
        // key are looked at only when they are equal.
        self.time
            .cmp(&other.time)
            .then_with(|| self.key.key_group().cmp(&other.key.key_group()))
            .then_with(|| self.key.key().cmp(other.key.key()))
    }
}

/// Timers of one domain, ordered by time.
#[derive(Default, Debug)]
pub struct TimerQueue {
    timers: BTreeSet<Timer>,
    bytes: usize,
}

impl TimerQueue {
    /// Host bytes a timer of a `key_len`-byte key is charged.
    pub fn charge(key_len: usize) -> usize {
        // A key too long to be inline is an allocation of its own: its bytes and a header.
        if key_len <= INLINE { TIMER_OVERHEAD } else { TIMER_OVERHEAD + key_len + 16 }
    }

    /// Registers a timer.
    pub fn register(&mut self, time: i64, key_group: u32, key: &[u8]) {
        if self.timers.insert(Timer { time, key: TimerKey::new(key_group, key) }) {
            self.bytes += Self::charge(key.len());
        }
    }

    /// Deletes a timer, if present.
    pub fn delete(&mut self, time: i64, key_group: u32, key: &[u8]) {
        if self.timers.remove(&Timer { time, key: TimerKey::new(key_group, key) }) {
            self.bytes -= Self::charge(key.len());
        }
    }

    /// Host bytes the timers are charged ([`TimerQueue::charge`] each).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Removes and returns, as a batch in time order, the first `max` timers with
    /// `time <= now`: a watermark that passes a million timers fires them a bounded batch at
    /// a time, and what the guest emits for one batch is flushed before the next.
    pub fn pop_due(&mut self, now: i64, max: usize) -> Batch {
        let mut out = Batch::default();
        let mut n = 0;
        while n < max {
            match self.timers.first() {
                Some(first) if first.time <= now => {}
                _ => break,
            }
            let t = self.timers.pop_first().expect("a first timer was just seen");
            let (time, key_group, key) = t.parts();
            self.bytes -= Self::charge(key.len());
            out.push(key_group, time, key, &[]);
            n += 1;
        }
        out
    }

    /// The timers grouped by key group, each group's in time order (what a snapshot holds).
    pub fn by_key_group(&self) -> std::collections::BTreeMap<u32, TimerList> {
        let mut m: std::collections::BTreeMap<u32, TimerList> = std::collections::BTreeMap::new();
        for t in &self.timers {
            let (time, key_group, key) = t.parts();
            m.entry(key_group).or_default().push(time, key);
        }
        m
    }

    /// Earliest timer time.
    pub fn next_time(&self) -> Option<i64> {
        self.timers.first().map(|t| t.time)
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
        assert_eq!(q.bytes(), 2 * TIMER_OVERHEAD, "a duplicate or deleted timer is not charged");
        let due = q.pop_due(30, usize::MAX);
        let got: Vec<_> = due.iter().map(|r| (r.timestamp, r.tag, r.key.to_vec())).collect();
        assert_eq!(got, vec![(10, 2, b"a".to_vec()), (30, 1, b"b".to_vec())]);
        assert!(q.pop_due(i64::MAX, usize::MAX).is_empty());
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn a_timer_of_a_short_key_is_one_32_byte_entry() {
        assert_eq!(std::mem::size_of::<Timer>(), 32);
    }

    #[test]
    fn due_timers_fire_a_bounded_batch_at_a_time() {
        let mut q = TimerQueue::default();
        for i in 0..10u64 {
            q.register(i as i64, 0, &i.to_le_bytes());
        }
        let first = q.pop_due(6, 4);
        assert_eq!(first.iter().map(|r| r.timestamp).collect::<Vec<_>>(), [0, 1, 2, 3]);
        let second = q.pop_due(6, 4);
        assert_eq!(second.iter().map(|r| r.timestamp).collect::<Vec<_>>(), [4, 5, 6], "only what is due");
        assert!(q.pop_due(6, 4).is_empty());
        assert_eq!(q.len(), 3);
    }

    proptest::proptest! {
        /// Inline and allocated keys together behave as a set of (time, key group, key bytes)
        /// in that order: what fires, when, and what is charged.
        #[test]
        fn timers_match_an_ordered_set_of_tuples(
            ops in proptest::collection::vec(
                (0u8..3, 0i64..40, 0u32..4, proptest::collection::vec(0u8..3, 0..(INLINE + 6)), 1usize..5),
                1..300,
            )
        ) {
            let mut q = TimerQueue::default();
            let mut model: BTreeSet<(i64, u32, Vec<u8>)> = BTreeSet::new();
            for (op, time, kg, key, max) in ops {
                match op {
                    0 => {
                        q.register(time, kg, &key);
                        model.insert((time, kg, key));
                    }
                    1 => {
                        q.delete(time, kg, &key);
                        model.remove(&(time, kg, key));
                    }
                    _ => {
                        let got: Vec<_> =
                            q.pop_due(time, max).iter().map(|r| (r.timestamp, r.tag, r.key.to_vec())).collect();
                        let want: Vec<_> = model.iter().take_while(|t| t.0 <= time).take(max).cloned().collect();
                        for t in &want {
                            model.remove(t);
                        }
                        proptest::prop_assert_eq!(got, want);
                    }
                }
                let charged: usize = model.iter().map(|t| TimerQueue::charge(t.2.len())).sum();
                proptest::prop_assert_eq!(q.bytes(), charged);
                proptest::prop_assert_eq!(q.len(), model.len());
            }
            let groups: Vec<_> = q
                .by_key_group()
                .into_iter()
                .flat_map(|(kg, ts)| ts.iter().map(|(t, k)| (kg, t, k.to_vec())).collect::<Vec<_>>())
                .collect();
            let mut want: Vec<_> = model.into_iter().map(|(t, kg, k)| (kg, t, k)).collect();
            want.sort();
            proptest::prop_assert_eq!(groups, want);
        }
    }
}
