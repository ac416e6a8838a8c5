//! Counts records per key and emits `(key, "<key> <count>")` for every record.

use weir_guest::{
    Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState, push_bytes, push_u64,
};

struct Counter {
    count: ValueState<u64>,
}

impl Operator for Counter {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("count")],
        ..OperatorInfo::new("wordcount-counter", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Counter { count: ctx.value_state("count")? })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let n = self.count.update_or_default(ctx, |c| {
            *c += 1;
            *c
        });
        // The value is written straight into the output buffer: no allocation per record.
        ctx.emit_with(rec.key, |v| {
            push_bytes(v, rec.key);
            v.push(b' ');
            push_u64(v, n);
        });
        Ok(())
    }
}

weir_guest::export_operator!(Counter);
