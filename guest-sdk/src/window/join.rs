//! Window joins of two inputs ([`CoOperator`](crate::CoOperator)): [`WindowJoin`] puts the
//! records of each side of a key into the same event-time windows and hands both sides of a
//! window to the operator when the watermark passes it (Flink's window join / coGroup); the
//! window and its records go when the watermark passes its end plus the allowed lateness.
//!
//! It is [`Windows`] with an accumulator holding both sides, so it checkpoints, rescales and
//! cleans up the same way.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::assign::{Assigner, Sessions, Window};
use super::windows::Windows;
use crate::{Context, OpenContext, Record, Result, TimeDomain};

/// The records of both sides in one window.
#[derive(Serialize, Deserialize)]
pub struct Sides<L, R> {
    /// Left records, in arrival order.
    pub left: Vec<L>,
    /// Right records, in arrival order.
    pub right: Vec<R>,
}

impl<L, R> Default for Sides<L, R> {
    fn default() -> Self {
        Sides { left: Vec::new(), right: Vec::new() }
    }
}

/// Two inputs joined per key and window.
///
/// ```text
/// // process:        self.join.add_left(ctx, &rec, person, fire)?;
/// // process_right:  self.join.add_right(ctx, &rec, auction, fire)?;
/// // on_timer:       self.join.on_timer(ctx, domain, fire)
/// fn fire(ctx: &mut Context<'_>, w: Window, persons: &[Person], auctions: &[u64]) { ... }
/// ```
pub struct WindowJoin<L, R> {
    windows: Windows<Sides<L, R>>,
}

impl<L, R> WindowJoin<L, R>
where
    L: Serialize + DeserializeOwned + Clone + 'static,
    R: Serialize + DeserializeOwned + Clone + 'static,
{
    /// Tumbling or sliding windows kept in keyed value state `state`.
    pub fn new(ctx: &mut OpenContext<'_>, state: &'static str, assigner: impl Into<Assigner>) -> Result<Self> {
        Ok(WindowJoin { windows: Windows::new(ctx, state, assigner)? })
    }

    /// Session windows over both sides' records (a record of either side extends the session).
    pub fn sessions(ctx: &mut OpenContext<'_>, state: &'static str, sessions: Sessions) -> Result<Self> {
        let merge = |into: &mut Sides<L, R>, from: Sides<L, R>| {
            into.left.extend(from.left);
            into.right.extend(from.right);
        };
        Ok(WindowJoin { windows: Windows::sessions(ctx, state, sessions, merge)? })
    }

    /// See [`Windows::allowed_lateness`]: a late firing hands over the whole window again.
    pub fn allowed_lateness(self, ms: i64) -> Result<Self> {
        Ok(WindowJoin { windows: self.windows.allowed_lateness(ms)? })
    }

    /// See [`Windows::late_records_to`].
    pub fn late_records_to(self, ctx: &OpenContext<'_>, name: &'static str) -> Result<Self> {
        Ok(WindowJoin { windows: self.windows.late_records_to(ctx, name)? })
    }

    /// Adds a left record (`value`, taken from `rec`) to its windows; `false` when late.
    pub fn add_left(
        &self,
        ctx: &mut Context<'_>,
        rec: &Record<'_>,
        value: L,
        mut fire: impl FnMut(&mut Context<'_>, Window, &[L], &[R]),
    ) -> Result<bool> {
        self.windows.add(ctx, rec, |s| s.left.push(value.clone()), |c, w, s| fire(c, w, &s.left, &s.right))
    }

    /// Adds a right record to its windows; `false` when late.
    pub fn add_right(
        &self,
        ctx: &mut Context<'_>,
        rec: &Record<'_>,
        value: R,
        mut fire: impl FnMut(&mut Context<'_>, Window, &[L], &[R]),
    ) -> Result<bool> {
        self.windows.add(ctx, rec, |s| s.right.push(value.clone()), |c, w, s| fire(c, w, &s.left, &s.right))
    }

    /// Call from `on_timer`: hands over both sides of each window that ends now.
    pub fn on_timer(
        &self,
        ctx: &mut Context<'_>,
        domain: TimeDomain,
        mut fire: impl FnMut(&mut Context<'_>, Window, &[L], &[R]),
    ) -> Result<()> {
        self.windows.on_timer(ctx, domain, |c, w, s| fire(c, w, &s.left, &s.right))
    }
}
