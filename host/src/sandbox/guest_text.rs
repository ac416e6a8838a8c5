//! Text a guest hands the host (log lines, error messages), made safe to show, and the log
//! budget of one instance.
//!
//! Invariants: a shown message is at most [`MAX_TEXT`] bytes and holds no control character
//! (a newline or an escape sequence must not forge a line attributed to another job, or
//! rewrite a terminal); an instance prints at most [`LogBudget::BURST`] lines at once and
//! [`LogBudget::PER_SECOND`] a second after that, and the lines it was refused are counted
//! and reported with the next line it may print.

/// Longest message shown, in bytes.
pub const MAX_TEXT: usize = 4096;

/// `message` with control characters escaped (`\n`, `\u{1b}`, ...), cut to [`MAX_TEXT`]
/// bytes (`...` marks the cut).
pub fn tame(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_TEXT + 16));
    let mut chars = message.chars();
    for c in chars.by_ref() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() >= MAX_TEXT {
            break;
        }
    }
    if out.len() > MAX_TEXT || chars.next().is_some() {
        out.truncate(out.floor_char_boundary(MAX_TEXT));
        out.push_str("...");
    }
    out
}

/// A token bucket of log lines; time comes in as milliseconds from any fixed origin.
#[derive(Debug, Clone)]
pub struct LogBudget {
    tokens: f64,
    last_ms: u64,
    /// Lines refused since the last line printed.
    pub suppressed: u64,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget { tokens: Self::BURST as f64, last_ms: 0, suppressed: 0 }
    }
}

impl LogBudget {
    /// Lines an instance may print at once.
    pub const BURST: u64 = 200;
    /// Lines a second after a burst.
    pub const PER_SECOND: u64 = 50;

    /// Whether a line may be printed at `now_ms`; if so, returns how many were refused
    /// before it (to report), and resets that count.
    pub fn admit(&mut self, now_ms: u64) -> Option<u64> {
        let elapsed = now_ms.saturating_sub(self.last_ms);
        self.last_ms = self.last_ms.max(now_ms);
        self.tokens = (self.tokens + elapsed as f64 * Self::PER_SECOND as f64 / 1000.0).min(Self::BURST as f64);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_length_is_capped() {
        assert_eq!(tame("a\nb\u{1b}[2Jc"), "a\\nb\\u{1b}[2Jc");
        let long = "é".repeat(5000);
        let t = tame(&long);
        assert!(t.len() <= MAX_TEXT + 3 && t.ends_with("..."), "{}", t.len());
        assert!(!tame(&"\n".repeat(10_000)).contains('\n'));
        assert_eq!(tame("short"), "short");
    }

    #[test]
    fn the_budget_allows_a_burst_then_a_rate_and_counts_what_it_refused() {
        let mut b = LogBudget::default();
        for _ in 0..LogBudget::BURST {
            assert_eq!(b.admit(0), Some(0));
        }
        assert_eq!(b.admit(0), None);
        assert_eq!(b.admit(1), None);
        assert_eq!(b.suppressed, 2);
        // 20 ms later one token (50/s) has come back: the line reports the two refused.
        assert_eq!(b.admit(21), Some(2));
        assert_eq!(b.admit(21), None);
        // A long quiet time refills the burst, never more.
        for _ in 0..LogBudget::BURST {
            assert!(b.admit(1_000_000).is_some());
        }
        assert!(b.admit(1_000_000).is_none());
    }
}
