//! The Nexmark source (`type = "nexmark"`): the online-auction benchmark's persons, auctions
//! and bids, generated in the host as the reference generator does ([`generator`]), encoded
//! compactly ([`model`]).
//!
//! Subtask `s` of `p` emits stream positions `s, s + p, ...` below `count`; its position is the
//! next one, so it rewinds exactly (the stream is a pure function of position and seed). After
//! each batch it emits a watermark that no later position of its own can undercut.

pub mod generator;
pub mod model;

use crate::connectors::throttle::Throttle;
use crate::connectors::{Disconnected, Emit};
pub use crate::graph::logical::NexmarkConfig;
use crate::record::RecordRef;

/// One `nexmark` source subtask.
pub struct NexmarkSource {
    cfg: NexmarkConfig,
    next: u64,
    step: u64,
    value: Vec<u8>,
    throttle: Option<Throttle>,
    watermark: i64,
}

impl NexmarkSource {
    /// Subtask `subtask` of `parallelism`.
    pub fn new(cfg: NexmarkConfig, subtask: u32, parallelism: u32) -> Self {
        NexmarkSource {
            cfg,
            next: subtask as u64,
            step: parallelism.max(1) as u64,
            value: Vec::with_capacity(512),
            throttle: cfg.rate.map(Throttle::new),
            watermark: i64::MIN,
        }
    }

    /// The next stream position.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Rewinds to a position taken with [`NexmarkSource::position`].
    pub fn seek(&mut self, next: u64) {
        self.next = next;
    }

    /// Emits up to `max` events; returns how many (`Some(0)`: none due yet under `rate`;
    /// `None`: all emitted).
    pub fn emit(&mut self, max: u32, out: &mut impl Emit) -> Result<Option<u32>, Disconnected> {
        if self.next >= self.cfg.count {
            return Ok(None);
        }
        let mut max = max;
        if let Some(t) = self.throttle.as_mut() {
            out.flush()?;
            max = t.admit(max);
        }
        let mut n = 0;
        while n < max && self.next < self.cfg.count {
            self.value.clear();
            let (key, timestamp) = self.cfg.params.encode(self.next, &mut self.value);
            out.emit(RecordRef { tag: 0, timestamp, key: &key.to_le_bytes(), value: &self.value })?;
            self.next += self.step;
            n += 1;
        }
        if let Some(t) = self.throttle.as_mut() {
            t.record(n);
        }
        Ok(Some(n))
    }

    /// A new watermark, if the events emitted since the last call moved it: below every
    /// timestamp this subtask has still to emit.
    pub fn watermark(&mut self) -> Option<i64> {
        let wm = self.cfg.params.watermark_before(self.next);
        (wm > self.watermark).then(|| {
            self.watermark = wm;
            wm
        })
    }
}
