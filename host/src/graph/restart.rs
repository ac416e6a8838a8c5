//! Restart strategies: after a failure, wait how long, or give up.

use std::time::Duration;

/// What to do after the `n`-th failure of a job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RestartStrategy {
    /// Fail the job at the first failure.
    None,
    /// Restart up to `attempts` times, `delay_ms` apart.
    FixedDelay {
        /// Restarts allowed.
        attempts: u32,
        /// Delay before each.
        delay_ms: u64,
    },
    /// Restart up to `attempts` times, waiting `initial_ms * multiplier^(n-1)`, at most `max_ms`.
    ExponentialBackoff {
        /// Restarts allowed.
        attempts: u32,
        /// First delay.
        initial_ms: u64,
        /// Upper bound of a delay.
        max_ms: u64,
        /// Growth per failure.
        multiplier: f64,
    },
}

impl RestartStrategy {
    /// The delay before restarting after failure number `failures` (1-based), or `None`
    /// when the job must fail.
    pub fn delay(&self, failures: u32) -> Option<Duration> {
        match *self {
            RestartStrategy::None => None,
            RestartStrategy::FixedDelay { attempts, delay_ms } => {
                (failures <= attempts).then(|| Duration::from_millis(delay_ms))
            }
            RestartStrategy::ExponentialBackoff { attempts, initial_ms, max_ms, multiplier } => (failures <= attempts)
                .then(|| {
                    let ms = initial_ms as f64 * multiplier.powi(failures.saturating_sub(1) as i32);
                    Duration::from_millis(ms.min(max_ms as f64) as u64)
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_delay_gives_up_after_its_attempts() {
        let s = RestartStrategy::FixedDelay { attempts: 2, delay_ms: 5 };
        assert_eq!(s.delay(1), Some(Duration::from_millis(5)));
        assert_eq!(s.delay(2), Some(Duration::from_millis(5)));
        assert_eq!(s.delay(3), None);
        assert_eq!(RestartStrategy::None.delay(1), None);
    }

    #[test]
    fn exponential_backoff_grows_to_its_cap() {
        let s = RestartStrategy::ExponentialBackoff { attempts: 5, initial_ms: 10, max_ms: 50, multiplier: 2.0 };
        let d: Vec<_> = (1..=6).map(|n| s.delay(n).map(|d| d.as_millis())).collect();
        assert_eq!(d, vec![Some(10), Some(20), Some(40), Some(50), Some(50), None]);
    }
}
