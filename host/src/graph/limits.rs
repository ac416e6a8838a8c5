//! The resource limits a job sets for each of its operator instances (`[limits]`), and the
//! host-wide ceilings they must stay under. Plain data: the sandbox enforces them
//! (`sandbox/limits.rs`).

/// Limits of one operator instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Linear memory per instance, MiB.
    pub memory_mb: u64,
    /// Wall time one guest call may run, ms.
    pub call_timeout_ms: u64,
    /// Bytes one guest call may emit, MiB.
    pub max_emit_mb: u64,
    /// Bytes one `snapshot` may return, MiB.
    pub max_snapshot_mb: u64,
    /// Bytes of one state value (one key's value, list or map; one operator-state entry), MiB.
    pub max_state_value_mb: u64,
    /// Bytes of timers one instance may hold in host memory (keys plus a fixed overhead
    /// each, both domains), MiB.
    pub max_timer_mb: u64,
    /// Bytes of records in flight on the job's back-edges (loops), all together, MiB.
    pub max_feedback_mb: u64,
}

/// The host-wide ceilings a job's limits must stay under.
pub const CEILING: Limits = Limits {
    memory_mb: 4096,
    call_timeout_ms: 60_000,
    max_emit_mb: 1024,
    max_snapshot_mb: 8192,
    max_state_value_mb: 1024,
    max_timer_mb: 1024,
    max_feedback_mb: 4096,
};

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mb: 512,
            call_timeout_ms: 10_000,
            max_emit_mb: 256,
            max_snapshot_mb: 2048,
            max_state_value_mb: 64,
            max_timer_mb: 64,
            max_feedback_mb: 256,
        }
    }
}

impl Limits {
    /// The first limit above the ceiling: (name, value, ceiling).
    pub fn above(&self, ceiling: &Limits) -> Option<(&'static str, u64, u64)> {
        [
            ("memory_mb", self.memory_mb, ceiling.memory_mb),
            ("call_timeout_ms", self.call_timeout_ms, ceiling.call_timeout_ms),
            ("max_emit_mb", self.max_emit_mb, ceiling.max_emit_mb),
            ("max_snapshot_mb", self.max_snapshot_mb, ceiling.max_snapshot_mb),
            ("max_state_value_mb", self.max_state_value_mb, ceiling.max_state_value_mb),
            ("max_timer_mb", self.max_timer_mb, ceiling.max_timer_mb),
            ("max_feedback_mb", self.max_feedback_mb, ceiling.max_feedback_mb),
        ]
        .into_iter()
        .find(|(_, v, c)| v > c)
    }
}
