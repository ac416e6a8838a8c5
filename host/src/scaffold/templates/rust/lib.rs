//! {{name}}: a keyed counter. For every record, adds one to the count of the record's key and
//! emits `<key> <count>`. The count is keyed state: checkpointed, restored after a failure,
//! moved by key group when the parallelism changes.

use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};

struct Counter {
    count: ValueState<u64>,
}

impl Operator for Counter {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("count")],
        ..OperatorInfo::new("{{name}}", "0.1.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Counter { count: ctx.value_state("count")? })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let n = self.count.update_or_default(ctx, |c| {
            *c += 1;
            *c
        });
        let mut value = rec.key.to_vec();
        value.extend_from_slice(format!(" {n}").as_bytes());
        ctx.emit(rec.key, &value);
        Ok(())
    }
}

weir_guest::export_operator!(Counter);
