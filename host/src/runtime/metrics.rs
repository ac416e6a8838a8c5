//! Record and time counters per subtask, updated once per batch or guest call (relaxed
//! atomics) by the subtask's own thread and read by the progress reporter, the status and
//! `/metrics`.
//!
//! Invariant: a counter is written only by the thread of the subtask it belongs to; a node's
//! figures are the sums of its subtasks' (its watermark: their least, once every subtask has
//! one), so per-subtask and per-node views never disagree.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::runtime::latency::LatencyHistogram;

/// Counters of one subtask.
#[derive(Debug, Default)]
pub struct SubtaskMetrics {
    records_in: AtomicU64,
    records_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    backpressured_ns: AtomicU64,
    busy_ns: AtomicU64,
    idle_ns: AtomicU64,
    calls: AtomicU64,
    dead_letters: AtomicU64,
    guest_memory_bytes: AtomicU64,
    watermark: AtomicI64,
    has_watermark: AtomicBool,
}

/// A reading of counters (one subtask's, or a node's sums).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Records received.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Bytes of the records received (keys and values).
    pub bytes_in: u64,
    /// Bytes of the records emitted.
    pub bytes_out: u64,
    /// Time blocked sending to a full channel (backpressure), ms.
    pub backpressured_ms: u64,
    /// Time in guest calls for records, timers and watermarks (operators), ms.
    pub busy_ms: u64,
    /// Time waiting for input with nothing to do, ms.
    pub idle_ms: u64,
    /// Guest calls for records, timers and watermarks: `busy_ms / guest_calls` is the mean
    /// guest time per call.
    pub guest_calls: u64,
    /// Records sent to the dead-letter output (`on_error = "dead-letter"`).
    pub dead_letters: u64,
    /// Linear memory the guest instance holds, bytes (operators).
    pub guest_memory_bytes: u64,
}

impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, o: Counters) {
        self.records_in += o.records_in;
        self.records_out += o.records_out;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.backpressured_ms += o.backpressured_ms;
        self.busy_ms += o.busy_ms;
        self.idle_ms += o.idle_ms;
        self.guest_calls += o.guest_calls;
        self.dead_letters += o.dead_letters;
        self.guest_memory_bytes += o.guest_memory_bytes;
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl SubtaskMetrics {
    /// `n` records of `bytes` bytes received.
    #[inline]
    pub fn add_in(&self, n: u64, bytes: u64) {
        add(&self.records_in, n);
        add(&self.bytes_in, bytes);
    }
    /// `n` records of `bytes` bytes emitted.
    #[inline]
    pub fn add_out(&self, n: u64, bytes: u64) {
        add(&self.records_out, n);
        add(&self.bytes_out, bytes);
    }
    /// A guest call that took `d`; the guest holds `memory` bytes after it.
    #[inline]
    pub fn add_call(&self, d: Duration, memory: u64) {
        add(&self.busy_ns, nanos(d));
        add(&self.calls, 1);
        self.guest_memory_bytes.store(memory, Ordering::Relaxed);
    }
    /// Time spent waiting for input.
    #[inline]
    pub fn add_idle(&self, d: Duration) {
        add(&self.idle_ns, nanos(d));
    }
    /// Time spent blocked on a full channel.
    #[inline]
    pub fn add_backpressured(&self, d: Duration) {
        add(&self.backpressured_ns, nanos(d));
    }
    /// One record sent to the dead-letter output.
    pub fn add_dead_letter(&self) {
        add(&self.dead_letters, 1);
    }
    /// The guest's linear memory, bytes (after instantiation, before any call).
    pub fn set_guest_memory(&self, bytes: u64) {
        self.guest_memory_bytes.store(bytes, Ordering::Relaxed);
    }
    /// The subtask's watermark advanced to `wm`.
    pub fn set_watermark(&self, wm: i64) {
        self.watermark.store(wm, Ordering::Relaxed);
        self.has_watermark.store(true, Ordering::Release);
    }
    /// The subtask's watermark, once one arrived.
    pub fn watermark(&self) -> Option<i64> {
        self.has_watermark.load(Ordering::Acquire).then(|| self.watermark.load(Ordering::Relaxed))
    }
    /// Takes a reading made elsewhere (a subtask on another worker of a cluster): every
    /// counter becomes what it says.
    pub fn set(&self, c: Counters, watermark: Option<i64>) {
        let ns = |ms: u64| ms.saturating_mul(1_000_000);
        for (a, v) in [
            (&self.records_in, c.records_in),
            (&self.records_out, c.records_out),
            (&self.bytes_in, c.bytes_in),
            (&self.bytes_out, c.bytes_out),
            (&self.backpressured_ns, ns(c.backpressured_ms)),
            (&self.busy_ns, ns(c.busy_ms)),
            (&self.idle_ns, ns(c.idle_ms)),
            (&self.calls, c.guest_calls),
            (&self.dead_letters, c.dead_letters),
            (&self.guest_memory_bytes, c.guest_memory_bytes),
        ] {
            a.store(v, Ordering::Relaxed);
        }
        if let Some(wm) = watermark {
            self.set_watermark(wm);
        }
    }
    /// Records received so far.
    pub fn records_in(&self) -> u64 {
        self.records_in.load(Ordering::Relaxed)
    }
    /// A reading of every counter.
    pub fn read(&self) -> Counters {
        let ms = |c: &AtomicU64| c.load(Ordering::Relaxed) / 1_000_000;
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            records_in: n(&self.records_in),
            records_out: n(&self.records_out),
            bytes_in: n(&self.bytes_in),
            bytes_out: n(&self.bytes_out),
            backpressured_ms: ms(&self.backpressured_ns),
            busy_ms: ms(&self.busy_ns),
            idle_ms: ms(&self.idle_ns),
            guest_calls: n(&self.calls),
            dead_letters: n(&self.dead_letters),
            guest_memory_bytes: n(&self.guest_memory_bytes),
        }
    }
}

/// Counters of one node: its subtasks', and what only the node as a whole reports.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    subtasks: Vec<Arc<SubtaskMetrics>>,
    /// Snapshots abandoned half-drained because their checkpoint was aborted.
    pub snapshots_abandoned: AtomicU64,
    /// Most `snapshot` calls (chunks) one subtask's snapshot took.
    pub snapshot_chunks_max: AtomicU64,
    /// Records in flight written with unaligned checkpoints (the barriers overtook them).
    pub inflight_logged: AtomicU64,
    /// Loop heads: back-edge records logged into their snapshots (in transit when the
    /// checkpoint passed the head).
    pub backedge_logged: AtomicU64,
    /// The disk state backend's paging (operators with `state_backend = "disk"`).
    pub paging: Arc<crate::operator::paged::PagingCounters>,
    /// Loop heads: most batches seen queued on one back-edge (the feedback channels grow
    /// instead of blocking; this is their reported bound).
    pub feedback_peak_batches: AtomicU64,
    /// Latency-measuring sinks: the merged histogram of the subtasks that finished.
    pub latency: Mutex<Option<LatencyHistogram>>,
}

impl NodeMetrics {
    /// Counters for a node of `parallelism` subtasks.
    pub fn new(parallelism: u32) -> Self {
        NodeMetrics { subtasks: (0..parallelism).map(|_| Arc::default()).collect(), ..Default::default() }
    }

    /// Subtask `i`'s counters. A subtask outside the node's parallelism is a wiring bug; it
    /// gets counters of its own that nobody reads rather than a panic.
    pub fn subtask(&self, i: u32) -> Arc<SubtaskMetrics> {
        self.subtasks.get(i as usize).cloned().unwrap_or_default()
    }

    /// Every subtask's counters, by subtask index.
    pub fn per_subtask(&self) -> Vec<Counters> {
        self.subtasks.iter().map(|s| s.read()).collect()
    }

    /// Subtask `i`'s watermark, once one arrived.
    pub fn watermark_of(&self, i: u32) -> Option<i64> {
        self.subtasks.get(i as usize).and_then(|s| s.watermark())
    }

    /// The node's watermark: the least of its subtasks', once all have one.
    pub fn watermark(&self) -> Option<i64> {
        self.subtasks.iter().map(|s| s.watermark()).collect::<Option<Vec<_>>>()?.into_iter().min()
    }

    /// The sums over the node's subtasks.
    pub fn totals(&self) -> Counters {
        let mut t = Counters::default();
        for s in &self.subtasks {
            t += s.read();
        }
        t
    }

    /// Records received by all subtasks (what fault triggers count).
    pub fn records_in(&self) -> u64 {
        self.subtasks.iter().map(|s| s.records_in()).sum()
    }

    /// (records in, records out) of the whole node.
    pub fn read(&self) -> (u64, u64) {
        let t = self.totals();
        (t.records_in, t.records_out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_sums_its_subtasks_and_waits_for_every_watermark() {
        let node = NodeMetrics::new(2);
        let (a, b) = (node.subtask(0), node.subtask(1));
        a.add_in(3, 30);
        b.add_in(4, 40);
        b.add_out(1, 7);
        a.add_call(Duration::from_millis(5), 65536);
        b.add_call(Duration::from_millis(2), 131072);
        a.add_backpressured(Duration::from_millis(9));
        b.add_dead_letter();
        let t = node.totals();
        assert_eq!((t.records_in, t.bytes_in, t.records_out, t.bytes_out), (7, 70, 1, 7));
        assert_eq!((t.busy_ms, t.guest_calls, t.guest_memory_bytes), (7, 2, 196608));
        assert_eq!((t.backpressured_ms, t.dead_letters), (9, 1));
        assert_eq!(node.per_subtask()[0].records_in, 3);
        assert_eq!(node.per_subtask()[1].guest_memory_bytes, 131072);
        assert_eq!(node.records_in(), 7);

        assert_eq!(node.watermark(), None);
        a.set_watermark(10);
        assert_eq!((node.watermark(), node.watermark_of(0), node.watermark_of(1)), (None, Some(10), None));
        b.set_watermark(4);
        assert_eq!(node.watermark(), Some(4));
        // Memory is a level, not a sum over time.
        a.add_call(Duration::ZERO, 1024);
        assert_eq!(node.per_subtask()[0].guest_memory_bytes, 1024);
    }

    #[test]
    fn a_subtask_outside_the_node_is_counted_apart() {
        let node = NodeMetrics::new(1);
        node.subtask(5).add_in(1, 1);
        assert_eq!(node.totals().records_in, 0);
        assert_eq!(NodeMetrics::new(0).watermark(), None);
    }
}
