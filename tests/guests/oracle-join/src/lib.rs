//! Two-input exactly-once oracle: like `test-oracle`, but checks two generator streams (left
//! and right) with separate per-key sequence state. Outputs `L <key> <seq>` / `R <key> <seq>`.

use weir_guest::{
    CoOperator, Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState,
};

struct OracleJoin {
    keys_left: u64,
    keys_right: u64,
    next_left: ValueState<u64>,
    next_right: ValueState<u64>,
}

fn check(ctx: &mut Context<'_>, rec: Record<'_>, keys: u64, state: &ValueState<u64>, side: &str) -> Result<()> {
    if rec.value == b"panic" {
        panic!("oracle-join: injected trap");
    }
    let seq = rec.value_str()?.parse::<u64>()? / keys;
    let expected = state.update_or_default(ctx, |n| {
        let e = *n;
        *n = seq + 1;
        e
    });
    let key = rec.key_str()?;
    if seq != expected {
        let kind = if seq < expected { "duplicate" } else { "gap" };
        ctx.emit_side(
            "violations",
            rec.key,
            format!("{kind}: {side} key {key} expected {expected} got {seq}").as_bytes(),
        )?;
    }
    ctx.emit(rec.key, format!("{side} {key} {seq}").as_bytes());
    Ok(())
}

impl Operator for OracleJoin {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("next_left"), StateDescriptor::keyed_value("next_right")],
        side_outputs: &["violations"],
        ..OperatorInfo::new("test-oracle-join", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(OracleJoin {
            keys_left: ctx.config_or("keys_left", 0u64)?,
            keys_right: ctx.config_or("keys_right", 0u64)?,
            next_left: ctx.value_state("next_left")?,
            next_right: ctx.value_state("next_right")?,
        })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        check(ctx, rec, self.keys_left, &self.next_left, "L")
    }
}

impl CoOperator for OracleJoin {
    fn process_right(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        check(ctx, rec, self.keys_right, &self.next_right, "R")
    }
}

weir_guest::export_co_operator!(OracleJoin);
