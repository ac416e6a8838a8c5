//! The deterministic generator source.
//!
//! Subtask `s` of `p` produces records `i = s, s + p, s + 2p, ...` below `count`: key
//! `i mod keys` as decimal text, timestamp `i`, value `i` as decimal text or `value_bytes`
//! bytes of a splitmix64 stream seeded by `(seed, i)`. Its position is the next `i`, so it
//! can rewind to any position.

use crate::connectors::throttle::Throttle;
use crate::connectors::{Disconnected, Emit};
use crate::graph::logical::GeneratorConfig;
use crate::record::Decimal;

/// splitmix64 step.
#[inline]
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One generator subtask.
pub struct Generator {
    cfg: GeneratorConfig,
    next: u64,
    /// `next % keys`, kept by addition (no division per record).
    key_index: u64,
    step: u64,
    value: Vec<u8>,
    throttle: Option<Throttle>,
}

impl Generator {
    /// Subtask `subtask` of `parallelism`.
    pub fn new(cfg: GeneratorConfig, subtask: u32, parallelism: u32) -> Self {
        Generator {
            cfg,
            next: subtask as u64,
            key_index: subtask as u64 % cfg.keys.max(1),
            step: parallelism as u64,
            value: Vec::with_capacity(cfg.value_bytes.unwrap_or(24) as usize),
            throttle: cfg.rate.map(Throttle::new),
        }
    }

    /// The position: the next sequence number.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Rewinds (or forwards) to a position taken with [`Generator::position`].
    pub fn seek(&mut self, next: u64) {
        self.next = next;
        self.key_index = next % self.cfg.keys.max(1);
    }

    /// Emits up to `max` records; returns how many (`Some(0)`: none due yet under `rate`;
    /// `None`: exhausted).
    pub fn emit(&mut self, max: u32, out: &mut impl Emit) -> Result<Option<u32>, Disconnected> {
        if self.next >= self.cfg.count {
            return Ok(None);
        }
        let mut max = max;
        if let Some(t) = self.throttle.as_mut() {
            // About to idle: send what is buffered first, so throttling never adds
            // batching latency.
            out.flush()?;
            max = t.admit(max);
        }
        let mut n = 0;
        let ingested = self.cfg.ingestion_time.then(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
        });
        while n < max && self.next < self.cfg.count {
            let i = self.next;
            let key = Decimal::new(self.key_index);
            let number;
            let value = match self.cfg.value_bytes {
                None => {
                    number = Decimal::new(i);
                    number.as_bytes()
                }
                Some(len) => {
                    self.value.clear();
                    let mut s = splitmix64(self.cfg.seed ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
                    while self.value.len() < len as usize {
                        s = splitmix64(s);
                        let take = (len as usize - self.value.len()).min(8);
                        self.value.extend_from_slice(&s.to_le_bytes()[..take]);
                    }
                    &self.value
                }
            };
            let timestamp = ingested.unwrap_or(i as i64);
            let rec = crate::record::RecordRef { tag: 0, timestamp, key: key.as_bytes(), value };
            out.emit(rec)?;
            self.next += self.step;
            self.key_index += self.step;
            if self.key_index >= self.cfg.keys {
                self.key_index %= self.cfg.keys.max(1);
            }
            n += 1;
        }
        if let Some(t) = self.throttle.as_mut() {
            t.record(n);
        }
        Ok(Some(n))
    }

    /// Timestamp of the last record emitted (for watermarks).
    pub fn last_timestamp(&self) -> i64 {
        self.next as i64 - self.step as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_matches_std() {
        for v in [0u64, 7, 10, 12345, u64::MAX] {
            let mut s = Vec::new();
            s.extend_from_slice(Decimal::new(v).as_bytes());
            assert_eq!(String::from_utf8(s).unwrap(), v.to_string());
        }
    }

    struct Collect(Vec<(String, String, i64)>);

    impl Emit for Collect {
        fn emit(&mut self, rec: crate::record::RecordRef<'_>) -> Result<(), Disconnected> {
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            self.0.push((text(rec.key), text(rec.value), rec.timestamp));
            Ok(())
        }
        fn flush(&mut self) -> Result<(), Disconnected> {
            Ok(())
        }
    }

    #[test]
    fn keys_follow_the_sequence_number_across_subtasks_and_seeks() {
        let cfg =
            GeneratorConfig { count: 100, keys: 7, value_bytes: None, rate: None, seed: 0, ingestion_time: false };
        for (subtask, p, seek) in [(0, 1, None), (1, 3, None), (2, 3, Some(41)), (0, 2, Some(13)), (1, 9, Some(95))] {
            let mut g = Generator::new(cfg, subtask, p);
            if let Some(s) = seek {
                g.seek(s);
            }
            let mut out = Collect(Vec::new());
            while g.emit(5, &mut out).unwrap().is_some() {}
            let first = seek.unwrap_or(subtask as u64);
            let want: Vec<_> =
                (first..100).step_by(p as usize).map(|i| ((i % 7).to_string(), i.to_string(), i as i64)).collect();
            assert_eq!(out.0, want, "subtask {subtask} of {p}, seek {seek:?}");
        }
    }
}
