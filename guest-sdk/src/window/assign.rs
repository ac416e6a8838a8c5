//! Window assignment, as pure functions: which windows a timestamp belongs to (tumbling,
//! sliding), and how session windows merge. Keeping the arithmetic here makes its edge cases
//! (negative timestamps, offsets, the last millisecond of a window, overflow near `i64::MAX`)
//! testable without a host.
//!
//! Windows are half-open, `[start, end)`, in milliseconds, as in Flink: a record at `end` is in
//! the next window. A window is complete when the watermark reaches `end - 1`.

use serde::{Deserialize, Serialize};

/// One window, `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Window {
    /// First millisecond in the window.
    pub start: i64,
    /// First millisecond after it.
    pub end: i64,
}

impl Window {
    /// The last timestamp inside the window: a watermark at or past it completes the window.
    pub fn max_timestamp(&self) -> i64 {
        self.end - 1
    }

    /// Whether `ts` falls in the window.
    pub fn contains(&self, ts: i64) -> bool {
        self.start <= ts && ts < self.end
    }
}

/// A window definition that cannot work, with what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowError(pub String);

impl std::fmt::Display for WindowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WindowError {}

/// The start of the window of `size` (shifted by `offset`) that holds `ts`: the largest
/// `start <= ts` with `start ≡ offset (mod size)`, for negative timestamps too.
pub fn window_start(ts: i64, offset: i64, size: i64) -> i64 {
    let r = (ts - offset).rem_euclid(size);
    ts - r
}

/// Tumbling windows: fixed size, no overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tumbling {
    size: i64,
    offset: i64,
}

impl Tumbling {
    /// Windows of `size_ms`, starting at multiples of the size plus `offset_ms`.
    pub fn new(size_ms: i64, offset_ms: i64) -> Result<Self, WindowError> {
        if size_ms <= 0 {
            return Err(WindowError(format!("a tumbling window's size must be positive, not {size_ms} ms")));
        }
        if offset_ms.unsigned_abs() >= size_ms as u64 {
            return Err(WindowError(format!(
                "a tumbling window's offset ({offset_ms} ms) must be smaller than its size ({size_ms} ms)"
            )));
        }
        Ok(Tumbling { size: size_ms, offset: offset_ms })
    }

    /// The one window holding `ts`.
    pub fn assign(&self, ts: i64) -> Window {
        let start = window_start(ts, self.offset, self.size);
        Window { start, end: start.saturating_add(self.size) }
    }
}

/// Sliding (hopping) windows: `size` long, one starting every `slide`; a timestamp is in
/// `size / slide` of them (rounded up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sliding {
    size: i64,
    slide: i64,
}

impl Sliding {
    /// Windows of `size_ms` every `slide_ms`.
    pub fn new(size_ms: i64, slide_ms: i64) -> Result<Self, WindowError> {
        if size_ms <= 0 || slide_ms <= 0 {
            return Err(WindowError(format!(
                "a sliding window's size and slide must be positive, not {size_ms} ms and {slide_ms} ms"
            )));
        }
        if slide_ms > size_ms {
            return Err(WindowError(format!(
                "a sliding window's slide ({slide_ms} ms) is longer than its size ({size_ms} ms): records \
                 between windows would belong to none; use a slide of at most the size"
            )));
        }
        Ok(Sliding { size: size_ms, slide: slide_ms })
    }

    /// Every window holding `ts`, latest first.
    pub fn assign(&self, ts: i64) -> impl Iterator<Item = Window> + '_ {
        let last = window_start(ts, 0, self.slide);
        let mut start = Some(last);
        std::iter::from_fn(move || {
            let s = start?;
            let w = Window { start: s, end: s.saturating_add(self.size) };
            if w.end <= ts {
                return None;
            }
            start = s.checked_sub(self.slide);
            Some(w)
        })
    }
}

/// Session windows: a record opens `[ts, ts + gap)`; windows that overlap merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sessions {
    gap: i64,
}

impl Sessions {
    /// Sessions that close after `gap_ms` without records.
    pub fn new(gap_ms: i64) -> Result<Self, WindowError> {
        if gap_ms <= 0 {
            return Err(WindowError(format!("a session gap must be positive, not {gap_ms} ms")));
        }
        Ok(Sessions { gap: gap_ms })
    }

    /// The window a record at `ts` opens on its own.
    pub fn assign(&self, ts: i64) -> Window {
        Window { start: ts, end: ts.saturating_add(self.gap) }
    }

    /// Adds `new` to a key's open sessions (sorted, disjoint): returns the merged session and
    /// removes from `open` every session it absorbed (their state merges into it), then
    /// inserts it, keeping `open` sorted and disjoint.
    pub fn merge(open: &mut Vec<Window>, new: Window) -> (Window, Vec<Window>) {
        let (run, merged) = Sessions::reach(open, |w| *w, new);
        let at = run.start;
        let absorbed = open.drain(run).collect();
        open.insert(at, merged);
        (merged, absorbed)
    }

    /// The sessions of `open` (sorted, disjoint, not touching; `window` reads one) that `new`
    /// reaches, and the session they make with it. Overlapping or touching windows merge (as
    /// Flink's `intersects`), so the ones reached are one run: from the first that does not end
    /// before `new`, while they start by the merged end.
    pub fn reach<T>(open: &[T], window: impl Fn(&T) -> Window, new: Window) -> (std::ops::Range<usize>, Window) {
        let lo = open.partition_point(|t| window(t).end < new.start);
        let (mut merged, mut hi) = (new, lo);
        while hi < open.len() && window(&open[hi]).start <= merged.end {
            let w = window(&open[hi]);
            merged = Window { start: merged.start.min(w.start), end: merged.end.max(w.end) };
            hi += 1;
        }
        (lo..hi, merged)
    }
}

/// How records are assigned to windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assigner {
    /// [`Tumbling`] windows.
    Tumbling(Tumbling),
    /// [`Sliding`] windows.
    Sliding(Sliding),
    /// [`Sessions`] (merging windows).
    Sessions(Sessions),
}

impl From<Tumbling> for Assigner {
    fn from(t: Tumbling) -> Self {
        Assigner::Tumbling(t)
    }
}

impl From<Sliding> for Assigner {
    fn from(s: Sliding) -> Self {
        Assigner::Sliding(s)
    }
}

impl From<Sessions> for Assigner {
    fn from(s: Sessions) -> Self {
        Assigner::Sessions(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tumbling_windows_are_half_open_and_handle_negative_time_and_offsets() {
        let t = Tumbling::new(10, 0).unwrap();
        assert_eq!(t.assign(0), Window { start: 0, end: 10 });
        assert_eq!(t.assign(9), Window { start: 0, end: 10 });
        assert_eq!(t.assign(10), Window { start: 10, end: 20 });
        assert_eq!(t.assign(-1), Window { start: -10, end: 0 });
        let o = Tumbling::new(10, 3).unwrap();
        assert_eq!(o.assign(2), Window { start: -7, end: 3 });
        assert_eq!(o.assign(3), Window { start: 3, end: 13 });
        assert!(t.assign(9).contains(9) && !t.assign(9).contains(10));
        assert_eq!(t.assign(9).max_timestamp(), 9);
        assert_eq!(Tumbling::new(10, 0).unwrap().assign(i64::MAX).end, i64::MAX);
    }

    #[test]
    fn sliding_windows_hold_a_timestamp_size_over_slide_times() {
        let s = Sliding::new(10, 5).unwrap();
        let ws: Vec<Window> = s.assign(7).collect();
        assert_eq!(ws, [Window { start: 5, end: 15 }, Window { start: 0, end: 10 }]);
        let ws: Vec<Window> = s.assign(10).collect();
        assert_eq!(ws, [Window { start: 10, end: 20 }, Window { start: 5, end: 15 }]);
        let odd = Sliding::new(10, 3).unwrap();
        for ts in -20..40 {
            let ws: Vec<Window> = odd.assign(ts).collect();
            assert!(ws.iter().all(|w| w.contains(ts)), "{ts}: {ws:?}");
            assert!(ws.len() == 3 || ws.len() == 4, "{ts}: {ws:?}");
            // Exactly the windows starting at multiples of 3 that hold ts.
            let all = (-40..40).filter(|s| s % 3 == 0 && *s <= ts && ts < s + 10).count();
            assert_eq!(ws.len(), all, "{ts}");
        }
        assert_eq!(Sliding::new(10, 10).unwrap().assign(4).count(), 1, "slide = size is tumbling");
    }

    #[test]
    fn sessions_merge_overlapping_and_touching_windows() {
        let s = Sessions::new(10).unwrap();
        let mut open = Vec::new();
        let (w, gone) = Sessions::merge(&mut open, s.assign(0));
        assert_eq!((w, gone.len()), (Window { start: 0, end: 10 }, 0));
        let (w, _) = Sessions::merge(&mut open, s.assign(18));
        assert_eq!(w, Window { start: 18, end: 28 });
        assert_eq!(open.len(), 2);
        // A record between them bridges both sessions into one.
        let (w, gone) = Sessions::merge(&mut open, s.assign(9));
        assert_eq!(w, Window { start: 0, end: 28 });
        assert_eq!(gone.len(), 2);
        assert_eq!(open, [Window { start: 0, end: 28 }]);
        // Touching ends merge; a gap of one millisecond does not.
        let (w, _) = Sessions::merge(&mut open, s.assign(28));
        assert_eq!(w, Window { start: 0, end: 38 });
        Sessions::merge(&mut open, s.assign(39));
        assert_eq!(open, [Window { start: 0, end: 38 }, Window { start: 39, end: 49 }]);
        // Out of order: an earlier record lands before the open sessions, sorted.
        Sessions::merge(&mut open, s.assign(-20));
        assert_eq!(open[0], Window { start: -20, end: -10 });
    }

    #[test]
    fn bad_definitions_are_refused_with_what_to_do() {
        assert!(Tumbling::new(0, 0).unwrap_err().0.contains("size must be positive"));
        assert!(Tumbling::new(10, 10).unwrap_err().0.contains("smaller than its size"));
        assert!(Sliding::new(10, 20).unwrap_err().0.contains("at most the size"));
        assert!(Sliding::new(10, 0).is_err());
        assert!(Sessions::new(0).unwrap_err().0.contains("gap must be positive"));
    }
}
