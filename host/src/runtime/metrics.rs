//! Per-node record counters, updated once per batch (relaxed atomics) and read by the
//! progress reporter.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::runtime::latency::LatencyHistogram;

/// Counters of one node (all its subtasks).
#[derive(Debug, Default)]
pub struct NodeMetrics {
    /// Records received.
    pub records_in: AtomicU64,
    /// Records emitted.
    pub records_out: AtomicU64,
    /// Nanoseconds its subtasks spent blocked sending to a full channel (backpressure),
    /// summed over subtasks.
    pub backpressured_ns: AtomicU64,
    /// Records sent to the dead-letter output (`on_error = "dead-letter"`).
    pub dead_letters: AtomicU64,
    /// Snapshots abandoned half-drained because their checkpoint was aborted.
    pub snapshots_abandoned: AtomicU64,
    /// Nanoseconds its subtasks spent in guest calls for records, timers and watermarks
    /// (operators), summed over subtasks.
    pub busy_ns: AtomicU64,
    /// Nanoseconds its subtasks spent waiting for input with nothing to do, summed.
    pub idle_ns: AtomicU64,
    /// Bytes of the records received (keys and values).
    pub bytes_in: AtomicU64,
    /// Bytes of the records emitted.
    pub bytes_out: AtomicU64,
    /// Guest calls for records, timers and watermarks (operators): `busy_ns / calls` is the
    /// mean guest time per call.
    pub calls: AtomicU64,
    /// Per subtask: its current event-time watermark (operators and sinks, once one arrived).
    pub watermarks: Mutex<std::collections::BTreeMap<u32, i64>>,
    /// Loop heads: most batches seen queued on one back-edge (the feedback channels grow
    /// instead of blocking; this is their reported bound).
    pub feedback_peak_batches: AtomicU64,
    /// Latency-measuring sinks: the merged histogram of the subtasks that finished.
    pub latency: Mutex<Option<LatencyHistogram>>,
}

impl NodeMetrics {
    /// Adds to `records_in`.
    #[inline]
    pub fn add_in(&self, n: u64) {
        self.records_in.fetch_add(n, Ordering::Relaxed);
    }
    /// Adds to `records_out`.
    #[inline]
    pub fn add_out(&self, n: u64) {
        self.records_out.fetch_add(n, Ordering::Relaxed);
    }
    /// Adds a guest call's time to `busy_ns`, and the call to `calls`.
    #[inline]
    pub fn add_busy(&self, d: std::time::Duration) {
        self.busy_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
    /// Adds time spent waiting for input.
    #[inline]
    pub fn add_idle(&self, d: std::time::Duration) {
        self.idle_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
    /// Subtask `subtask`'s watermark advanced to `wm`.
    pub fn set_watermark(&self, subtask: u32, wm: i64) {
        self.watermarks.lock().unwrap_or_else(|p| p.into_inner()).insert(subtask, wm);
    }
    /// The node's watermark: the least of its subtasks', once all `parallelism` have one.
    pub fn watermark(&self, parallelism: u32) -> Option<i64> {
        let w = self.watermarks.lock().unwrap_or_else(|p| p.into_inner());
        (w.len() as u32 >= parallelism && parallelism > 0).then(|| w.values().copied().min()).flatten()
    }
    /// (in, out).
    pub fn read(&self) -> (u64, u64) {
        (self.records_in.load(Ordering::Relaxed), self.records_out.load(Ordering::Relaxed))
    }
}
