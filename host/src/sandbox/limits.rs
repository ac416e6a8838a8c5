//! Resource limits of one operator instance, set per job (`[limits]`) under host-wide
//! ceilings.
//!
//! Invariants: every guest call runs under a CPU deadline (epoch interruption: a ticker
//! thread advances the engine's epoch every [`TICK`], and each call may run for
//! `call_timeout_ms` worth of ticks); linear memory, tables and instances are capped by a
//! `StoreLimits`, and growing past the cap traps (rather than making `memory.grow` fail
//! quietly); output per call, snapshot size, the size of every state value and the bytes of
//! timers (held in host memory) are checked by the host. A breach traps the
//! instance with an error that names the limit and its value; the instance is then dropped.

use std::time::Duration;

use wasmtime::{StoreLimits, StoreLimitsBuilder};

/// How often the engine's epoch advances.
pub const TICK: Duration = Duration::from_millis(5);

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
    /// Bytes of timers one instance may hold in host memory (keys plus
    /// [`crate::sandbox::timers::TIMER_OVERHEAD`] each, both domains), MiB.
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

    /// The store limiter for these limits.
    pub fn store_limits(&self) -> StoreLimits {
        StoreLimitsBuilder::new()
            .memory_size((self.memory_mb << 20) as usize)
            .instances(64)
            .tables(64)
            .memories(16)
            .table_elements(1 << 20)
            .trap_on_grow_failure(true)
            .build()
    }

    /// Epoch ticks one call may run.
    pub fn deadline_ticks(&self) -> u64 {
        (self.call_timeout_ms / TICK.as_millis() as u64).max(1) + 1
    }

    /// Bytes one call may emit.
    pub fn max_emit_bytes(&self) -> usize {
        (self.max_emit_mb << 20) as usize
    }

    /// Bytes one snapshot may return.
    pub fn max_snapshot_bytes(&self) -> u64 {
        self.max_snapshot_mb << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_and_deadlines() {
        assert_eq!(Limits::default().above(&CEILING), None);
        let l = Limits { memory_mb: 5000, ..Limits::default() };
        assert_eq!(l.above(&CEILING), Some(("memory_mb", 5000, 4096)));
        assert_eq!(Limits { call_timeout_ms: 100, ..Limits::default() }.deadline_ticks(), 21);
        assert_eq!(Limits { call_timeout_ms: 1, ..Limits::default() }.deadline_ticks(), 2);
    }
}
