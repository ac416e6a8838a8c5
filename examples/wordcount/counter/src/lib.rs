//! Counts records per key and emits `(key, "<key> <count>")` for every record.

use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};

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
        let mut line = Vec::with_capacity(rec.key.len() + 12);
        line.extend_from_slice(rec.key);
        line.push(b' ');
        line.extend_from_slice(n.to_string().as_bytes());
        ctx.emit(rec.key, &line);
        Ok(())
    }
}

weir_guest::export_operator!(Counter);
