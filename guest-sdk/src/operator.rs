//! The traits an operator implements.

use crate::context::{Context, OpenContext};
use crate::info::OperatorInfo;
use crate::record::Record;
use crate::{Error, Result};

pub use crate::bindings::types::TimeDomain;

/// A stream operator. Implement it, then export the type with
/// [`export_operator!`](crate::export_operator) (one input) or, together with
/// [`CoOperator`], with [`export_co_operator!`](crate::export_co_operator) (two inputs).
///
/// One instance runs per subtask; the host calls it from one thread, batch by batch.
pub trait Operator: Sized + 'static {
    /// What the operator declares: name, version, schema version, state, side outputs.
    const INFO: OperatorInfo;

    /// Creates the instance: read config, register the declared state.
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self>;

    /// Handles one record (for a two-input operator: a record of the left input).
    fn process(&mut self, ctx: &mut Context<'_>, record: Record<'_>) -> Result<()>;

    /// A timer of `ctx.key()` fired at `ctx.timestamp()`.
    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        let _ = (ctx, domain);
        Ok(())
    }

    /// The watermark advanced (`ctx` has no key: keyed state is unavailable here).
    fn on_watermark(&mut self, ctx: &mut Context<'_>, watermark: i64) -> Result<()> {
        let _ = (ctx, watermark);
        Ok(())
    }

    /// Converts one stored value of state `state`, written by schema `from_schema`, into this
    /// version's encoding. Called on restore for every value when `from_schema` is listed in
    /// `INFO.migrates_from`.
    fn migrate_value(state: &str, from_schema: u32, bytes: &[u8]) -> Result<Vec<u8>> {
        let _ = bytes;
        Err(Error::msg(format!(
            "`{}` {} declares migration from schema {from_schema} but does not implement \
             Operator::migrate_value for state `{state}`",
            Self::INFO.name,
            Self::INFO.version
        )))
    }

    /// The input ended; emit what remains.
    fn close(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        let _ = ctx;
        Ok(())
    }
}

/// The second input of a two-input operator; [`Operator::process`] gets the first (left).
pub trait CoOperator: Operator {
    /// Handles one record of the right input.
    fn process_right(&mut self, ctx: &mut Context<'_>, record: Record<'_>) -> Result<()>;
}
