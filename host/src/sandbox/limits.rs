//! Resource limits of one operator instance, set per job (`[limits]`) under host-wide
//! ceilings.
//!
//! Invariants: every guest call runs under a CPU deadline (epoch interruption: a ticker
//! thread advances the engine's epoch every [`TICK`], and each call may run for
//! `call_timeout_ms` worth of ticks); linear memory, tables and instances are capped by a
//! `StoreLimits`, and growing past the cap traps; a meter around it counts the memory the guest
//! holds (the `guest_memory_bytes` metric) (rather than making `memory.grow` fail
//! quietly); output per call, snapshot size, the size of every state value and the bytes of
//! timers (held in host memory) are checked by the host. A breach traps the
//! instance with an error that names the limit and its value; the instance is then dropped.

use std::time::Duration;

use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

pub use crate::graph::limits::{CEILING, Limits};

/// How often the engine's epoch advances.
pub const TICK: Duration = Duration::from_millis(5);

impl Limits {
    /// The store limiter for these limits, metering the linear memory it lets the guest have.
    pub fn store_limits(&self) -> MeteredLimits {
        MeteredLimits { caps: self.caps(), memory_bytes: 0, last_growth: 0 }
    }

    /// wasmtime's caps for these limits.
    fn caps(&self) -> StoreLimits {
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

/// wasmtime's [`StoreLimits`] plus a meter: the bytes of linear memory the store's instances
/// hold (every memory's creation is a growth from 0, so the sum of allowed growths is the
/// memory in use; a growth that then fails is taken back).
#[derive(Debug)]
pub struct MeteredLimits {
    caps: StoreLimits,
    memory_bytes: usize,
    last_growth: usize,
}

impl MeteredLimits {
    /// Bytes of linear memory the guest holds (all its memories).
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes as u64
    }
}

impl ResourceLimiter for MeteredLimits {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allowed = self.caps.memory_growing(current, desired, maximum)?;
        if allowed {
            self.last_growth = desired.saturating_sub(current);
            self.memory_bytes = self.memory_bytes.saturating_add(self.last_growth);
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.memory_bytes = self.memory_bytes.saturating_sub(std::mem::take(&mut self.last_growth));
        self.caps.memory_grow_failed(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.caps.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.caps.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.caps.instances()
    }

    fn tables(&self) -> usize {
        self.caps.tables()
    }

    fn memories(&self) -> usize {
        self.caps.memories()
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

    #[test]
    fn the_meter_counts_allowed_growth_only() {
        let mut m = Limits { memory_mb: 1, ..Limits::default() }.store_limits();
        assert!(m.memory_growing(0, 65536, None).unwrap());
        assert!(m.memory_growing(65536, 131072, None).unwrap());
        assert_eq!(m.memory_bytes(), 131072);
        // Past the cap: a trap, nothing counted.
        assert!(m.memory_growing(131072, 2 << 20, None).is_err());
        assert_eq!(m.memory_bytes(), 131072);
        // Allowed, then failed: taken back.
        assert!(m.memory_growing(131072, 196608, None).unwrap());
        assert!(m.memory_grow_failed(wasmtime::Error::msg("no")).is_err());
        assert_eq!(m.memory_bytes(), 131072);
    }
}
