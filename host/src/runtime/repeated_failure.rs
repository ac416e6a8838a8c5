//! A failure that repeats the same way from the same restore point is deterministic: a bad
//! record in the input or a bug in the operator. Restarting again cannot help, so the job stops
//! with that diagnosis instead of burning every restart attempt with its delays.
//!
//! Pure: fed each failure (where its attempt started, what failed), it says when to stop.

/// Consecutive failures that are the same before the job stops.
pub const LIMIT: u32 = 3;

/// Watches a job's failures for repetition.
#[derive(Debug, Default)]
pub struct RepeatedFailure {
    last: Option<(Option<u64>, String)>,
    count: u32,
}

impl RepeatedFailure {
    /// Records a failure with message `cause` of an attempt restored from checkpoint `from`
    /// (`None`: the beginning); returns whether it is the [`LIMIT`]-th same one in a row.
    pub fn observe(&mut self, from: Option<u64>, cause: &str) -> bool {
        let same = self.last.as_ref().is_some_and(|(f, c)| *f == from && c == cause);
        self.count = if same { self.count + 1 } else { 1 };
        self.last = Some((from, cause.to_string()));
        self.count >= LIMIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_failure_from_the_same_point_halts_at_the_limit() {
        let mut r = RepeatedFailure::default();
        assert!(!r.observe(Some(3), "op#0: bad record"));
        assert!(!r.observe(Some(3), "op#0: bad record"));
        assert!(r.observe(Some(3), "op#0: bad record"));
    }

    #[test]
    fn progress_or_another_cause_resets_the_count() {
        let mut r = RepeatedFailure::default();
        assert!(!r.observe(Some(3), "a"));
        assert!(!r.observe(Some(3), "a"));
        assert!(!r.observe(Some(4), "a"), "a newer checkpoint: the job made progress");
        assert!(!r.observe(Some(4), "b"), "another cause");
        assert!(!r.observe(None, "b"));
        assert!(!r.observe(None, "b"));
        assert!(r.observe(None, "b"));
    }
}
