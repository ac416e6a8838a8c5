//! Interval joins of two inputs (Flink's `IntervalJoin`): a left record at `t` joins every right
//! record of the same key with a time in `[t + lower, t + upper]`, whichever arrives first.
//! Each side is buffered until the watermark shows no partner can still come: a left record
//! until the watermark passes `t + max(upper, 0)`, a right one until it passes `t - min(lower, 0)`.
//! A record behind the watermark is late and dropped (as in Flink).
//!
//! [`IntervalRules`] is the pure part (which buffered records match, when each goes);
//! [`IntervalJoin`] applies it to one keyed value state and the key's timers.
//!
//! Invariant: a pair is handed over exactly once, by whichever of its two records came second.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Context, Error, OpenContext, Result, TimeDomain, ValueState};

/// Both sides' buffered records of one key: (time, record).
#[derive(Serialize, Deserialize)]
pub struct Buffers<L, R> {
    /// Left records.
    pub left: Vec<(i64, L)>,
    /// Right records.
    pub right: Vec<(i64, R)>,
}

impl<L, R> Default for Buffers<L, R> {
    fn default() -> Self {
        Buffers { left: Vec::new(), right: Vec::new() }
    }
}

/// The bounds of an interval join, relative to the left record's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalRules {
    lower: i64,
    upper: i64,
}

impl IntervalRules {
    /// Rights within `[left + lower, left + upper]` (ms) join.
    pub fn new(lower: i64, upper: i64) -> std::result::Result<Self, String> {
        if lower > upper {
            return Err(format!(
                "an interval join's lower bound ({lower} ms) is above its upper bound ({upper} ms): no record \
                 could ever match; swap them"
            ));
        }
        Ok(IntervalRules { lower, upper })
    }

    /// When a left record at `t` can go.
    pub fn left_cleanup(&self, t: i64) -> i64 {
        t.saturating_add(self.upper.max(0))
    }

    /// When a right record at `t` can go.
    pub fn right_cleanup(&self, t: i64) -> i64 {
        t.saturating_sub(self.lower.min(0))
    }

    /// Whether a left record at `l` and a right one at `r` join.
    pub fn matches(&self, l: i64, r: i64) -> bool {
        l.saturating_add(self.lower) <= r && r <= l.saturating_add(self.upper)
    }

    /// Drops every buffered record whose cleanup time `now` has reached.
    pub fn expire<L, R>(&self, b: &mut Buffers<L, R>, now: i64) {
        b.left.retain(|(t, _)| self.left_cleanup(*t) > now);
        b.right.retain(|(t, _)| self.right_cleanup(*t) > now);
    }
}

/// An interval join of two inputs keyed alike.
pub struct IntervalJoin<L, R> {
    state: ValueState<Buffers<L, R>>,
    rules: IntervalRules,
}

impl<L, R> IntervalJoin<L, R>
where
    L: Serialize + DeserializeOwned + 'static,
    R: Serialize + DeserializeOwned + 'static,
{
    /// Joins rights within `[left + lower_ms, left + upper_ms]`, buffered in keyed value state
    /// `state`.
    pub fn new(ctx: &mut OpenContext<'_>, state: &'static str, lower_ms: i64, upper_ms: i64) -> Result<Self> {
        let rules = IntervalRules::new(lower_ms, upper_ms).map_err(Error::msg)?;
        Ok(IntervalJoin { state: ctx.value_state(state)?, rules })
    }

    /// A left record at the current timestamp: `join` gets it with every buffered right it
    /// matches; `false` when it was late (behind the watermark) and dropped.
    pub fn add_left(&self, ctx: &mut Context<'_>, value: L, mut join: impl FnMut(&mut Context<'_>, &L, &R)) -> bool {
        let t = ctx.timestamp();
        if t < ctx.rt.watermark {
            return false;
        }
        let mut b = self.state.take(ctx).unwrap_or_default();
        for (r_t, r) in &b.right {
            if self.rules.matches(t, *r_t) {
                join(ctx, &value, r);
            }
        }
        b.left.push((t, value));
        self.state.set(ctx, b);
        ctx.register_event_timer(self.rules.left_cleanup(t));
        true
    }

    /// A right record at the current timestamp; see [`IntervalJoin::add_left`].
    pub fn add_right(&self, ctx: &mut Context<'_>, value: R, mut join: impl FnMut(&mut Context<'_>, &L, &R)) -> bool {
        let t = ctx.timestamp();
        if t < ctx.rt.watermark {
            return false;
        }
        let mut b = self.state.take(ctx).unwrap_or_default();
        for (l_t, l) in &b.left {
            if self.rules.matches(*l_t, t) {
                join(ctx, l, &value);
            }
        }
        b.right.push((t, value));
        self.state.set(ctx, b);
        ctx.register_event_timer(self.rules.right_cleanup(t));
        true
    }

    /// Call from `on_timer`: drops the records no partner can reach any more, and the key's
    /// state with the last of them.
    pub fn on_timer(&self, ctx: &mut Context<'_>, domain: TimeDomain) {
        if domain != TimeDomain::EventTime {
            return;
        }
        let Some(mut b) = self.state.take(ctx) else { return };
        self.rules.expire(&mut b, ctx.timestamp());
        if !b.left.is_empty() || !b.right.is_empty() {
            self.state.set(ctx, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_match_inclusively_and_records_stay_until_no_partner_can_come() {
        let r = IntervalRules::new(-5, 10).unwrap();
        assert!(r.matches(100, 95) && r.matches(100, 110) && r.matches(100, 100));
        assert!(!r.matches(100, 94) && !r.matches(100, 111));
        // A left at 100 waits for rights up to 110; a right at 100 for lefts up to 105.
        assert_eq!((r.left_cleanup(100), r.right_cleanup(100)), (110, 105));
        let mut b = Buffers { left: vec![(100, 'a'), (120, 'b')], right: vec![(100, 'x'), (104, 'y')] };
        r.expire(&mut b, 109);
        assert_eq!((b.left.len(), b.right.len()), (2, 0), "rights at 100 and 104 can meet no new left");
        r.expire(&mut b, 110);
        assert_eq!(b.left, [(120, 'b')]);
        // Only-future intervals: a left waits until its upper bound; a right goes at once.
        let f = IntervalRules::new(2, 4).unwrap();
        assert_eq!((f.left_cleanup(10), f.right_cleanup(10)), (14, 10));
        assert!(IntervalRules::new(5, 1).unwrap_err().contains("swap them"));
    }
}
