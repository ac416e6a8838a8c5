//! A Kafka source subtask's watermark, from its partitions' watermarks.
//!
//! Each partition's watermark is the largest record timestamp read from it (minus the
//! configured delay); the subtask's is the smallest over its partitions, so one partition
//! that lags holds event time back, as in Flink's per-partition watermarks. A partition with
//! no record for the idle timeout stops holding it back until it has records again (an empty
//! partition must not stall event time), and a partition read to its end never does again.
//!
//! Invariant: the watermarks handed out only increase. Time is passed in (milliseconds of
//! any monotonic clock), so this is a pure state machine tested without waiting.

/// One partition's view.
#[derive(Debug, Clone, Copy)]
struct Partition {
    /// Largest timestamp read (None: nothing read yet).
    max_ts: Option<i64>,
    /// When a record was last read (or the partition was added).
    last_active_ms: u64,
    /// Read to its end (bounded reads).
    finished: bool,
}

/// Per-partition watermarks of one subtask; partitions are numbered by the caller.
#[derive(Debug, Clone)]
pub struct Watermarks {
    parts: Vec<Partition>,
    idle_timeout_ms: u64,
    delay_ms: u64,
    emitted: Option<i64>,
}

impl Watermarks {
    /// `idle_timeout_ms` 0: a partition is never idle.
    pub fn new(idle_timeout_ms: u64, delay_ms: u64) -> Self {
        Watermarks { parts: Vec::new(), idle_timeout_ms, delay_ms, emitted: None }
    }

    /// Adds a partition (number = the count before it), active from `now_ms`.
    pub fn add(&mut self, now_ms: u64) -> usize {
        self.parts.push(Partition { max_ts: None, last_active_ms: now_ms, finished: false });
        self.parts.len() - 1
    }

    /// A record with timestamp `ts` was read from partition `i`.
    pub fn record(&mut self, i: usize, ts: i64, now_ms: u64) {
        let p = &mut self.parts[i];
        p.max_ts = Some(p.max_ts.map_or(ts, |m| m.max(ts)));
        p.last_active_ms = now_ms;
    }

    /// Partition `i` was read to its end: it no longer holds the watermark back.
    pub fn finish(&mut self, i: usize) {
        self.parts[i].finished = true;
    }

    fn holds_back(&self, p: &Partition, now_ms: u64) -> bool {
        let idle = self.idle_timeout_ms > 0 && now_ms.saturating_sub(p.last_active_ms) >= self.idle_timeout_ms;
        !p.finished && !idle
    }

    /// The watermark to send now, if it moved past the last one sent.
    pub fn advance(&mut self, now_ms: u64) -> Option<i64> {
        let mut min: Option<i64> = None;
        for p in self.parts.iter().filter(|p| self.holds_back(p, now_ms)) {
            // An active partition with nothing read yet: its watermark is unknown.
            let ts = p.max_ts?;
            min = Some(min.map_or(ts, |m| m.min(ts)));
        }
        let wm = min?.saturating_sub(self.delay_ms as i64);
        if self.emitted.is_some_and(|e| wm <= e) {
            return None;
        }
        self.emitted = Some(wm);
        Some(wm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_partition_holds_the_watermark() {
        let mut w = Watermarks::new(0, 0);
        let (a, b) = (w.add(0), w.add(0));
        w.record(a, 100, 1);
        assert_eq!(w.advance(1), None, "b has read nothing yet");
        w.record(b, 40, 2);
        assert_eq!(w.advance(2), Some(40));
        w.record(a, 200, 3);
        assert_eq!(w.advance(3), None, "b still at 40");
        w.record(b, 150, 4);
        assert_eq!(w.advance(4), Some(150));
    }

    #[test]
    fn an_idle_partition_stops_holding_back_until_it_has_records_again() {
        let mut w = Watermarks::new(1000, 0);
        let (a, b) = (w.add(0), w.add(0));
        w.record(a, 500, 10);
        assert_eq!(w.advance(500), None, "b not idle yet");
        assert_eq!(w.advance(1000), Some(500), "b idle after 1000 ms without records");
        w.record(a, 900, 1100);
        assert_eq!(w.advance(1100), Some(900));
        w.record(b, 950, 1200);
        w.record(a, 2000, 1200);
        assert_eq!(w.advance(1200), Some(950), "b active again and holds back");
    }

    #[test]
    fn watermarks_only_increase_and_apply_the_delay() {
        let mut w = Watermarks::new(0, 10);
        let a = w.add(0);
        w.record(a, 100, 0);
        assert_eq!(w.advance(0), Some(90));
        w.record(a, 50, 1);
        assert_eq!(w.advance(1), None);
        let b = w.add(2);
        w.record(b, 60, 3);
        assert_eq!(w.advance(3), None, "a new partition behind the last watermark does not move it back");
        w.finish(b);
        w.record(a, 120, 4);
        assert_eq!(w.advance(4), Some(110));
    }

    #[test]
    fn without_an_idle_timeout_a_silent_partition_holds_back_forever() {
        let mut w = Watermarks::new(0, 0);
        let (a, _b) = (w.add(0), w.add(0));
        w.record(a, 5, 0);
        assert_eq!(w.advance(u64::MAX / 2), None);
    }
}
