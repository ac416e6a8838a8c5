//! Exactly-once oracle: the input is a generator stream (key `i mod keys`, value `i`), so
//! each key's sequence numbers `i / keys` must arrive as 0, 1, 2, ... with no gap and no
//! duplicate. The next expected number lives in keyed state, so a restore that loses or
//! replays a record shows up as a violation on the `violations` side output. The main output
//! is `<key> <seq>` per record. A record whose value is `panic` makes the guest panic (a real
//! trap, used by failure injection).

use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};

struct Oracle {
    keys: u64,
    next: ValueState<u64>,
}

impl Operator for Oracle {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("next")],
        side_outputs: &["violations"],
        ..OperatorInfo::new("test-oracle", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Oracle { keys: ctx.config_or("keys", 0u64)?, next: ctx.value_state("next")? })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if rec.value == b"panic" {
            panic!("oracle: injected trap");
        }
        let i: u64 = rec.value_str()?.parse()?;
        let seq = i / self.keys;
        let expected = self.next.update_or_default(ctx, |n| {
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
                format!("{kind}: key {key} expected {expected} got {seq}").as_bytes(),
            )?;
        }
        ctx.emit(rec.key, format!("{key} {seq}").as_bytes());
        Ok(())
    }
}

weir_guest::export_operator!(Oracle);
