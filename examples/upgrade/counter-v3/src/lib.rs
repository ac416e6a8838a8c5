//! Word counter v3: a version that must be refused when the running state is schema 2. It
//! writes schema 3 and migrates only from schema 1 (support for schema 2 was dropped), so
//! Weir refuses both a live upgrade of a v2 job and a restore of a v2 savepoint, before
//! anything runs, naming the operator and both versions.

use serde::{Deserialize, Serialize};
use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState, push_u64};

#[derive(Clone, Default, Serialize, Deserialize)]
struct Count {
    n: u64,
}

struct Counter {
    count: ValueState<Count>,
}

impl Operator for Counter {
    const INFO: OperatorInfo = OperatorInfo {
        schema_version: 3,
        migrates_from: &[1],
        states: &[StateDescriptor::keyed_value("count")],
        ..OperatorInfo::new("wordcount-counter", "3.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Counter { count: ctx.value_state("count")? })
    }

    fn migrate_value(state: &str, from_schema: u32, bytes: &[u8]) -> Result<Vec<u8>> {
        match (state, from_schema) {
            ("count", 1) => Ok(weir_guest::bincode::serialize(&Count { n: weir_guest::bincode::deserialize(bytes)? })?),
            _ => Err(weir_guest::Error::msg(format!("no migration for state `{state}` from schema {from_schema}"))),
        }
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let n = self.count.update_or_default(ctx, |c| {
            c.n += 1;
            c.n
        });
        ctx.emit_with(rec.key, |v| {
            v.extend_from_slice(rec.key);
            v.push(b' ');
            push_u64(v, n);
        });
        Ok(())
    }
}

weir_guest::export_operator!(Counter);
