//! Event-time (or processing-time) windows on keyed state: [`Windows`] keeps each key's open windows and their
//! accumulators in one keyed value state, registers a host timer per window, fires windows
//! through the operator's callback and removes them when the watermark passes their end plus
//! the allowed lateness. The rules live in [`book`](super::book); this is the thin shell that
//! applies them to the current key, its timers and the late side output.
//!
//! Because the windows are ordinary keyed state and host timers, they checkpoint, move with
//! their key groups on rescale and migrate on upgrade like any other state.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::assign::{Assigner, Sessions, Window};
use super::book::Rules;
use crate::{Context, Error, OpenContext, Record, Result, TimeDomain, ValueState};

/// The open windows of every key, with an accumulator `A` each.
///
/// ```no_run
/// # use weir_guest::{*, window::*};
/// struct PerMinute { counts: Windows<u64> }
/// impl Operator for PerMinute {
///     const INFO: OperatorInfo = OperatorInfo {
///         states: &[StateDescriptor::keyed_value("counts")],
///         side_outputs: &["late"],
///         ..OperatorInfo::new("per-minute", "1.0.0")
///     };
///     fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
///         let counts = Windows::new(ctx, "counts", Tumbling::new(60_000, 0)?)?
///             .allowed_lateness(5_000)?
///             .late_records_to(ctx, "late")?;
///         Ok(PerMinute { counts })
///     }
///     fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
///         self.counts.add(ctx, &rec, |n| *n += 1, emit).map(|_| ())
///     }
///     fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
///         self.counts.on_timer(ctx, domain, emit)
///     }
/// }
/// fn emit(ctx: &mut Context<'_>, w: Window, n: &u64) {
///     let key = ctx.key();
///     ctx.emit_at(key, format!("{} {n}", w.start).as_bytes(), w.max_timestamp());
/// }
/// # fn main() {}
/// ```
///
/// The `fire` callbacks must not use this same `Windows` (its state is borrowed while they
/// run); they get the window and its accumulator.
pub struct Windows<A> {
    state: ValueState<Vec<(Window, A)>>,
    rules: Rules<A>,
    late_output: Option<&'static str>,
    domain: TimeDomain,
}

impl<A: Serialize + DeserializeOwned + Default + 'static> Windows<A> {
    /// Tumbling or sliding windows kept in the keyed value state `state` (declared with
    /// `StateDescriptor::keyed_value`). Sessions need a merge function: [`Windows::sessions`].
    pub fn new(ctx: &mut OpenContext<'_>, state: &'static str, assigner: impl Into<Assigner>) -> Result<Self> {
        let assigner = assigner.into();
        if let Assigner::Sessions(_) = assigner {
            return Err(Error::msg(format!(
                "windows `{state}`: session windows merge, so they need Windows::sessions with a merge function"
            )));
        }
        Ok(Windows {
            state: ctx.value_state(state)?,
            rules: Rules { assigner, lateness: 0, merge: None },
            late_output: None,
            domain: TimeDomain::EventTime,
        })
    }

    /// Session windows kept in the keyed value state `state`; `merge` folds the accumulator of
    /// a session into another's when a record bridges them.
    pub fn sessions(
        ctx: &mut OpenContext<'_>,
        state: &'static str,
        sessions: Sessions,
        merge: fn(&mut A, A),
    ) -> Result<Self> {
        let rules = Rules { assigner: sessions.into(), lateness: 0, merge: Some(merge) };
        Ok(Windows { state: ctx.value_state(state)?, rules, late_output: None, domain: TimeDomain::EventTime })
    }

    /// Windows take records for `ms` after their end (each such record fires the window again)
    /// and are removed after that. Default 0.
    pub fn allowed_lateness(mut self, ms: i64) -> Result<Self> {
        if ms < 0 {
            return Err(Error::msg(format!("allowed lateness must be 0 or more, not {ms} ms")));
        }
        if ms != 0 && self.domain == TimeDomain::ProcessingTime {
            return Err(Error::msg(
                "allowed lateness is for event-time windows; processing-time windows have no late records",
            ));
        }
        self.rules.lateness = ms;
        Ok(self)
    }

    /// The windows run in processing time: a record lands in the windows of the host's clock
    /// when it arrives ([`Context::processing_time`], not its timestamp) and a window fires
    /// when the clock passes its end (a processing-time timer), or when the stream ends. No
    /// record is late, so there is no allowed lateness. Exactly-once still holds for what the
    /// windows count (each record in exactly one committed window of each assignment), but
    /// which window a record lands in depends on when it arrives, also after a restore.
    pub fn processing_time(mut self) -> Result<Self> {
        if self.rules.lateness != 0 {
            return Err(Error::msg(
                "allowed lateness is for event-time windows; processing-time windows have no late records",
            ));
        }
        self.domain = TimeDomain::ProcessingTime;
        Ok(self)
    }

    /// Late records (no window of theirs still open) go to the side output `name` (declared in
    /// `OperatorInfo::side_outputs`) as they arrived, instead of being dropped.
    pub fn late_records_to(mut self, ctx: &OpenContext<'_>, name: &'static str) -> Result<Self> {
        if !ctx.rt.info.side_outputs.contains(&name) {
            return Err(Error::msg(format!(
                "late records go to side output `{name}`, which `{}` does not declare in OperatorInfo::side_outputs",
                ctx.rt.info.name
            )));
        }
        self.late_output = Some(name);
        Ok(self)
    }

    /// Adds `rec` (of the current key) to its windows: `add` updates the accumulator of each
    /// window it lands in; `fire` runs for a window the record changed after it fired (allowed
    /// lateness). Returns `false` when the record was late (dropped, or sent to the late side
    /// output).
    pub fn add(
        &self,
        ctx: &mut Context<'_>,
        rec: &Record<'_>,
        add: impl FnMut(&mut A),
        mut fire: impl FnMut(&mut Context<'_>, Window, &A),
    ) -> Result<bool> {
        let (time, watermark) = match self.domain {
            TimeDomain::EventTime => (rec.timestamp, ctx.rt.watermark),
            // Nothing is late in processing time: the record joins the windows of now.
            TimeDomain::ProcessingTime => (ctx.processing_time(), i64::MIN),
        };
        let (slot, key) = (ctx.slot(), ctx.key());
        let mut table = self.state.table.borrow_mut();
        let fx = match table.get_mut(slot, key) {
            Some(open) => self.rules.add(open, time, watermark, add),
            None => {
                // Most keys have one window open at a time (sessions, tumbling): a `Vec::new()`
                // would reserve four on its first push, tripling the key's allocation.
                let mut open = Vec::with_capacity(1);
                let fx = self.rules.add(&mut open, time, watermark, add);
                if !open.is_empty() {
                    table.insert(slot, key, open);
                }
                fx
            }
        };
        if fx.late {
            drop(table);
            if let Some(side) = self.late_output {
                ctx.emit_side(side, rec.key, rec.value)?;
            }
            return Ok(false);
        }
        let processing = self.domain == TimeDomain::ProcessingTime;
        for t in fx.register {
            if processing { ctx.register_processing_timer(t) } else { ctx.register_event_timer(t) }
        }
        for t in fx.delete {
            if processing { ctx.delete_processing_timer(t) } else { ctx.delete_event_timer(t) }
        }
        if let Some(open) = table.get(slot, key) {
            for w in fx.fire_now {
                if let Ok(i) = open.binary_search_by(|(o, _)| o.cmp(&w)) {
                    fire(ctx, w, &open[i].1);
                }
            }
        }
        Ok(true)
    }

    /// Call from [`Operator::on_timer`](crate::Operator::on_timer): fires the current key's
    /// windows that end at the timer (`fire` gets each) and removes those whose lateness ran
    /// out. Timers of the other time domain are not the windows' and are ignored.
    pub fn on_timer(
        &self,
        ctx: &mut Context<'_>,
        domain: TimeDomain,
        mut fire: impl FnMut(&mut Context<'_>, Window, &A),
    ) -> Result<()> {
        if domain != self.domain {
            return Ok(());
        }
        let (slot, key, time) = (ctx.slot(), ctx.key(), ctx.timestamp());
        let mut table = self.state.table.borrow_mut();
        let Some(open) = table.get_mut(slot, key) else { return Ok(()) };
        self.rules.due(open, time, |w, a| fire(ctx, w, a));
        if open.is_empty() {
            table.remove(slot, key);
        }
        Ok(())
    }

    /// How many windows the current key has open.
    pub fn open_windows(&self, ctx: &Context<'_>) -> usize {
        self.state.with(ctx, |o| o.map_or(0, Vec::len))
    }
}
