//! The open windows of one key, as a pure state machine: adding a record (assign, merge
//! sessions, decide lateness) and a timer coming due (fire, clean up) say what the shell must
//! do with the host — timers to register or delete, windows to fire now — so the rules are
//! tested without one.
//!
//! Rules (Flink's `WindowOperator` with its event-time trigger):
//! - a window is *late* once the watermark reaches its cleanup time, `max_timestamp +
//!   allowed_lateness`; a record none of whose windows is open any more is late (dropped, or
//!   sent to the late side output by the shell);
//! - a window fires when the watermark reaches its `max_timestamp` (its timer), and again for
//!   every record added after that and before its cleanup time (a late firing);
//! - a window is removed when the watermark reaches its cleanup time (its second timer, the
//!   same one without lateness).
//!
//! Invariant: `open` is sorted and its windows distinct (sessions: disjoint and not touching);
//! every open window not yet fired has a timer at its `max_timestamp`, every open window one at
//! its cleanup time; so a key's list is empty once the watermark has passed all its windows
//! plus lateness.

use super::assign::{Assigner, Sessions, Window};

/// What adding a record asks of the host.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Event-time timers to register for the key.
    pub register: Vec<i64>,
    /// Event-time timers no open window of the key needs any more.
    pub delete: Vec<i64>,
    /// Windows the record changed after they fired: fire them again now.
    pub fire_now: Vec<Window>,
    /// No window took the record: it is late.
    pub late: bool,
}

/// How one operator's windows behave.
pub struct Rules<A> {
    /// Which windows a record belongs to.
    pub assigner: Assigner,
    /// How long after its end a window still takes records, ms (≥ 0).
    pub lateness: i64,
    /// How two sessions' accumulators become one (sessions only).
    pub merge: Option<fn(&mut A, A)>,
}

impl<A: Default> Rules<A> {
    /// When `w` is removed: the watermark reaching `max_timestamp + lateness`.
    pub fn cleanup_time(&self, w: Window) -> i64 {
        w.max_timestamp().saturating_add(self.lateness)
    }

    fn is_late(&self, w: Window, watermark: i64) -> bool {
        self.cleanup_time(w) <= watermark
    }

    /// The timers `w` needs at `watermark`: its firing (unless already due) and its cleanup.
    fn timers(&self, w: Window, watermark: i64) -> impl Iterator<Item = i64> {
        let (fire, cleanup) = (w.max_timestamp(), self.cleanup_time(w));
        (fire > watermark).then_some(fire).into_iter().chain((cleanup != fire).then_some(cleanup))
    }

    /// Adds a record at `ts` (through `add`, once per window it lands in) to the key's `open`
    /// windows, with the watermark at `watermark`.
    pub fn add(&self, open: &mut Vec<(Window, A)>, ts: i64, watermark: i64, add: impl FnMut(&mut A)) -> Effects {
        match self.assigner {
            Assigner::Tumbling(t) => self.add_fixed(open, std::iter::once(t.assign(ts)), watermark, add),
            Assigner::Sliding(s) => self.add_fixed(open, s.assign(ts), watermark, add),
            Assigner::Sessions(s) => self.add_session(open, s.assign(ts), watermark, add),
        }
    }

    fn add_fixed(
        &self,
        open: &mut Vec<(Window, A)>,
        windows: impl Iterator<Item = Window>,
        watermark: i64,
        mut add: impl FnMut(&mut A),
    ) -> Effects {
        let mut fx = Effects { late: true, ..Effects::default() };
        for w in windows {
            if self.is_late(w, watermark) {
                continue;
            }
            fx.late = false;
            let i = match open.binary_search_by(|(o, _)| o.cmp(&w)) {
                Ok(i) => i,
                Err(i) => {
                    open.insert(i, (w, A::default()));
                    fx.register.extend(self.timers(w, watermark));
                    i
                }
            };
            add(&mut open[i].1);
            if w.max_timestamp() <= watermark {
                fx.fire_now.push(w);
            }
        }
        fx
    }

    fn add_session(
        &self,
        open: &mut Vec<(Window, A)>,
        new: Window,
        watermark: i64,
        mut add: impl FnMut(&mut A),
    ) -> Effects {
        let (run, merged) = Sessions::reach(open, |(w, _)| *w, new);
        let (lo, hi) = (run.start, run.end);
        if self.is_late(merged, watermark) {
            return Effects { late: true, ..Effects::default() };
        }
        let mut fx = Effects::default();
        if hi == lo + 1 && open[lo].0 == merged {
            add(&mut open[lo].1);
        } else {
            let old: Vec<Window> = open[lo..hi].iter().map(|(w, _)| *w).collect();
            let mut run = open.drain(lo..hi).map(|(_, a)| a);
            let mut acc = run.next().unwrap_or_default();
            let merge = self.merge.expect("session windows are built with a merge function");
            for a in run {
                merge(&mut acc, a);
            }
            add(&mut acc);
            open.insert(lo, (merged, acc));
            fx.register.extend(self.timers(merged, watermark));
            for w in old {
                for t in self.timers(w, i64::MIN) {
                    let used = open.iter().any(|(o, _)| o.max_timestamp() == t || self.cleanup_time(*o) == t);
                    if !used && !fx.delete.contains(&t) {
                        fx.delete.push(t);
                    }
                }
            }
        }
        if merged.max_timestamp() <= watermark {
            fx.fire_now.push(merged);
        }
        fx
    }

    /// The key's timer at `time` came due: fires (through `fire`) every window whose last
    /// millisecond it is, then removes every window whose cleanup time it reached.
    pub fn due(&self, open: &mut Vec<(Window, A)>, time: i64, mut fire: impl FnMut(Window, &A)) {
        for (w, a) in open.iter() {
            if w.max_timestamp() == time {
                fire(*w, a);
            }
        }
        open.retain(|(w, _)| self.cleanup_time(*w) > time);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::{Sessions, Sliding, Tumbling};

    fn rules(assigner: impl Into<Assigner>, lateness: i64) -> Rules<u64> {
        Rules { assigner: assigner.into(), lateness, merge: Some(|a, b| *a += b) }
    }

    fn w(start: i64, end: i64) -> Window {
        Window { start, end }
    }

    #[test]
    fn tumbling_counts_fire_at_the_last_millisecond_and_clean_up() {
        let r = rules(Tumbling::new(10, 0).unwrap(), 0);
        let mut open = Vec::new();
        let fx = r.add(&mut open, 3, i64::MIN, |c| *c += 1);
        assert_eq!(fx, Effects { register: vec![9], ..Effects::default() });
        let fx = r.add(&mut open, 9, 5, |c| *c += 1);
        assert_eq!(fx, Effects::default(), "same window: no new timer");
        r.add(&mut open, 10, 5, |c| *c += 1);
        assert_eq!(open, [(w(0, 10), 2), (w(10, 20), 1)]);
        let mut fired = Vec::new();
        r.due(&mut open, 9, |w, c| fired.push((w, *c)));
        assert_eq!(fired, [(w(0, 10), 2)]);
        assert_eq!(open, [(w(10, 20), 1)], "fired and removed at once without lateness");
        // The watermark is at 9: a record for [0, 10) is late.
        let fx = r.add(&mut open, 9, 9, |c| *c += 1);
        assert!(fx.late && fx.register.is_empty());
        assert_eq!(open, [(w(10, 20), 1)], "a late record changes nothing");
    }

    #[test]
    fn allowed_lateness_refires_on_late_records_then_cleans_up() {
        let r = rules(Tumbling::new(10, 0).unwrap(), 5);
        let mut open = Vec::new();
        let fx = r.add(&mut open, 1, i64::MIN, |c| *c += 1);
        assert_eq!(fx.register, [9, 14]);
        let mut fired = Vec::new();
        r.due(&mut open, 9, |w, c| fired.push((w, *c)));
        assert_eq!(fired, [(w(0, 10), 1)]);
        assert_eq!(open.len(), 1, "kept for the allowed lateness");
        // Watermark 12: still within lateness; the record fires the window again at once.
        let fx = r.add(&mut open, 2, 12, |c| *c += 1);
        assert_eq!(fx, Effects { fire_now: vec![w(0, 10)], ..Effects::default() });
        // A window first opened within its lateness fires now and only needs its cleanup timer.
        let fx = r.add(&mut open, 15, 21, |c| *c += 1);
        assert_eq!(fx, Effects { register: vec![24], fire_now: vec![w(10, 20)], late: false, delete: vec![] });
        r.due(&mut open, 14, |_, _| panic!("cleanup does not fire"));
        assert_eq!(open, [(w(10, 20), 1)]);
        assert!(r.add(&mut open, 3, 14, |c| *c += 1).late, "past max_timestamp + lateness");
    }

    #[test]
    fn sliding_records_land_in_every_window_and_late_only_when_all_are() {
        let r = rules(Sliding::new(10, 5).unwrap(), 0);
        let mut open = Vec::new();
        let fx = r.add(&mut open, 7, i64::MIN, |c| *c += 1);
        assert_eq!(fx.register, [14, 9]);
        assert_eq!(open, [(w(0, 10), 1), (w(5, 15), 1)]);
        // Watermark 9: [0, 10) is gone, [5, 15) still takes the record.
        r.due(&mut open, 9, |_, _| {});
        let fx = r.add(&mut open, 8, 9, |c| *c += 1);
        assert!(!fx.late);
        assert_eq!(open, [(w(5, 15), 2)]);
    }

    #[test]
    fn sessions_merge_their_accumulators_and_move_their_timers() {
        let r = rules(Sessions::new(10).unwrap(), 0);
        let mut open = Vec::new();
        assert_eq!(r.add(&mut open, 0, i64::MIN, |c| *c += 1).register, [9]);
        assert_eq!(r.add(&mut open, 22, i64::MIN, |c| *c += 1).register, [31]);
        // Inside the first session without extending it: nothing moves.
        assert_eq!(r.add(&mut open, 0, i64::MIN, |c| *c += 1), Effects::default());
        // Extends the first session: its timer moves.
        let fx = r.add(&mut open, 5, i64::MIN, |c| *c += 1);
        assert_eq!((fx.register, fx.delete), (vec![14], vec![9]));
        // [15, 25) touches [0, 15) and overlaps [22, 32): one session of all five records.
        let fx = r.add(&mut open, 15, i64::MIN, |c| *c += 1);
        assert_eq!(open, [(w(0, 32), 5)]);
        assert_eq!((fx.register, fx.delete), (vec![31], vec![14]), "31 stays: the merged session needs it");
        // A record whose own session would be late merges into an open one and is taken.
        r.due(&mut open, 29, |_, _| {});
        assert!(!r.add(&mut open, 12, 29, |c| *c += 1).late);
        assert_eq!(open, [(w(0, 32), 6)]);
        let mut fired = Vec::new();
        r.due(&mut open, 31, |w, c| fired.push((w, *c)));
        assert_eq!((fired, open.len()), (vec![(w(0, 32), 6)], 0));
        assert!(r.add(&mut open, 20, 31, |c| *c += 1).late);
    }

    #[test]
    fn a_timer_another_session_still_needs_is_not_deleted() {
        // Lateness longer than the gap: session X = [0, 10) cleans up at 24, when Y = [15, 25)
        // fires.
        let r = rules(Sessions::new(10).unwrap(), 15);
        let mut open = Vec::new();
        assert_eq!(r.add(&mut open, 0, i64::MIN, |c| *c += 1).register, [9, 24]);
        assert_eq!(r.add(&mut open, 15, i64::MIN, |c| *c += 1).register, [24, 39]);
        // Extending X to [0, 12) drops its timer 9 but keeps 24, Y's firing.
        let fx = r.add(&mut open, 2, i64::MIN, |c| *c += 1);
        assert_eq!((fx.register, fx.delete), (vec![11, 26], vec![9]));
        assert_eq!(open, [(w(0, 12), 2), (w(15, 25), 1)]);
    }
}
