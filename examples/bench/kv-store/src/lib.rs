//! J3 (large state): every record overwrites its key's value with the record's value.
//! Nothing is emitted; the state is the point (1 000 000 keys x 100 bytes in the benchmark).

use weir_guest::{Bytes, Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};

struct KvStore {
    value: ValueState<Bytes>,
}

impl Operator for KvStore {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("value")],
        ..OperatorInfo::new("bench-kv-store", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(KvStore { value: ctx.value_state("value")? })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        // Rewrites in place: no allocation once the key exists.
        self.value.update_or_default(ctx, |v| {
            v.0.clear();
            v.0.extend_from_slice(rec.value);
        });
        Ok(())
    }
}

weir_guest::export_operator!(KvStore);
