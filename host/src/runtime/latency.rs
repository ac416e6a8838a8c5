//! Source-to-sink latency of records, as a fixed-bucket histogram.
//!
//! Records carry their ingestion time (a generator with `timestamps = "ingestion"` stamps
//! each record with the wall clock, in milliseconds, when it creates it); a `blackhole` sink
//! with `latency = true` records `now - timestamp` for every record.
//!
//! Invariants: recording is O(1) and allocation-free; a quantile is the upper edge of the
//! bucket holding it (buckets are 100 µs wide up to 1 s, one overflow bucket above that keeps
//! the exact maximum); the first `warmup_ms` of records (by timestamp) are not recorded, so
//! instantiation and JIT warm-up do not count.

use std::time::{SystemTime, UNIX_EPOCH};

const BUCKET_US: u64 = 100;
const BUCKETS: usize = 10_000;

/// A latency histogram.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    buckets: Vec<u64>,
    overflow: u64,
    max_us: u64,
    count: u64,
    sum_us: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { buckets: vec![0; BUCKETS], overflow: 0, max_us: 0, count: 0, sum_us: 0 }
    }
}

/// Quantiles of a histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencySummary {
    /// Samples.
    pub samples: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

/// A histogram as it crosses the network: only the buckets that hold samples.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WireLatency {
    /// (bucket index, samples) of the non-empty buckets.
    pub buckets: Vec<(u32, u64)>,
    /// Samples above the last bucket.
    pub overflow: u64,
    /// Largest sample, µs.
    pub max_us: u64,
    /// Samples.
    pub count: u64,
    /// Sum of the samples, µs.
    pub sum_us: u64,
}

impl LatencyHistogram {
    /// The histogram for the wire.
    pub fn to_wire(&self) -> WireLatency {
        let buckets = self.buckets.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (i as u32, *n)).collect();
        WireLatency { buckets, overflow: self.overflow, max_us: self.max_us, count: self.count, sum_us: self.sum_us }
    }

    /// A histogram from the wire; `None` if a bucket index is out of range.
    pub fn from_wire(w: &WireLatency) -> Option<LatencyHistogram> {
        let mut h = LatencyHistogram::default();
        for &(i, n) in &w.buckets {
            *h.buckets.get_mut(i as usize)? += n;
        }
        (h.overflow, h.max_us, h.count, h.sum_us) = (w.overflow, w.max_us, w.count, w.sum_us);
        Some(h)
    }

    /// Records one latency.
    #[inline]
    pub fn record(&mut self, us: u64) {
        let b = (us / BUCKET_US) as usize;
        if b < BUCKETS {
            self.buckets[b] += 1;
        } else {
            self.overflow += 1;
        }
        self.max_us = self.max_us.max(us);
        self.count += 1;
        self.sum_us += us;
    }

    /// Adds `other`'s samples.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.overflow += other.overflow;
        self.max_us = self.max_us.max(other.max_us);
        self.count += other.count;
        self.sum_us += other.sum_us;
    }

    /// The latency below which a fraction `q` of the samples are (bucket upper edge), in µs.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return ((i as u64 + 1) * BUCKET_US).min(self.max_us.max(1));
            }
        }
        self.max_us
    }

    /// p50, p99, p99.9, max, mean.
    pub fn summary(&self) -> LatencySummary {
        let ms = |us: u64| us as f64 / 1e3;
        LatencySummary {
            samples: self.count,
            p50_ms: ms(self.quantile_us(0.5)),
            p99_ms: ms(self.quantile_us(0.99)),
            p999_ms: ms(self.quantile_us(0.999)),
            max_ms: ms(self.max_us),
            mean_ms: if self.count == 0 { 0.0 } else { self.sum_us as f64 / self.count as f64 / 1e3 },
        }
    }
}

/// What a latency-measuring sink subtask keeps.
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    /// The histogram so far.
    pub histogram: LatencyHistogram,
    warmup_ms: i64,
    first_ms: Option<i64>,
}

impl LatencyRecorder {
    /// Skips records stamped within `warmup_ms` of the first one seen.
    pub fn new(warmup_ms: i64) -> Self {
        LatencyRecorder { histogram: LatencyHistogram::default(), warmup_ms, first_ms: None }
    }

    /// Records a batch's timestamps (ingestion times, ms) against the clock now.
    pub fn record_batch(&mut self, timestamps: impl Iterator<Item = i64>) {
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        for ts in timestamps {
            let first = *self.first_ms.get_or_insert(ts);
            if ts < first + self.warmup_ms {
                continue;
            }
            self.histogram.record((now_us - ts * 1000).max(0) as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bucket_upper_edges_and_merge_adds_up() {
        let mut h = LatencyHistogram::default();
        for us in 1..=1000u64 {
            h.record(us * 10); // 10 µs .. 10 ms, uniform
        }
        let s = h.summary();
        assert_eq!(s.samples, 1000);
        assert!((s.p50_ms - 5.0).abs() <= 0.1, "{s:?}");
        assert!((s.p99_ms - 9.9).abs() <= 0.1, "{s:?}");
        assert_eq!(s.max_ms, 10.0);
        let mut g = LatencyHistogram::default();
        g.record(5_000_000); // 5 s: overflow bucket, exact max
        h.merge(&g);
        assert_eq!(h.summary().samples, 1001);
        assert_eq!(h.summary().max_ms, 5000.0);
        assert_eq!(h.quantile_us(1.0), 5_000_000);
        assert_eq!(LatencyHistogram::default().summary().p99_ms, 0.0);
    }

    #[test]
    fn cluster_latency_a_histogram_crosses_the_wire_unchanged_and_a_bad_bucket_is_refused() {
        let mut h = LatencyHistogram::default();
        for us in [150, 2_500, 2_500, 3_000_000] {
            h.record(us);
        }
        let w = h.to_wire();
        assert_eq!(w.buckets.len(), 2, "{w:?}");
        assert_eq!(LatencyHistogram::from_wire(&w).unwrap().summary(), h.summary());
        let bad = WireLatency { buckets: vec![(BUCKETS as u32, 1)], ..w };
        assert!(LatencyHistogram::from_wire(&bad).is_none());
    }

    #[test]
    fn warm_up_records_are_skipped() {
        let mut r = LatencyRecorder::new(1000);
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        r.record_batch([now_ms - 5000, now_ms - 4500, now_ms - 10].into_iter());
        assert_eq!(r.histogram.summary().samples, 1, "only the record after the first second");
        assert!(r.histogram.summary().max_ms < 1000.0);
    }
}
