//! Word counter v2: the same output as v1 (`<word> <count>` per word), but its state also
//! remembers where each word was first seen (the event timestamp of its first occurrence).
//!
//! State schema 2 stores `Count { n, first_seen }` where schema 1 stored a bare `u64`; v2
//! migrates schema-1 state on restore (`first_seen` = `UNKNOWN` for words counted by v1).

use serde::{Deserialize, Serialize};
use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState, push_u64};

/// `first_seen` of words counted before the upgrade.
const UNKNOWN: i64 = i64::MIN;

#[derive(Clone, Default, Serialize, Deserialize)]
struct Count {
    n: u64,
    first_seen: i64,
}

struct Counter {
    count: ValueState<Count>,
}

impl Operator for Counter {
    const INFO: OperatorInfo = OperatorInfo {
        schema_version: 2,
        migrates_from: &[1],
        states: &[StateDescriptor::keyed_value("count")],
        ..OperatorInfo::new("wordcount-counter", "2.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Counter { count: ctx.value_state("count")? })
    }

    fn migrate_value(state: &str, from_schema: u32, bytes: &[u8]) -> Result<Vec<u8>> {
        match (state, from_schema) {
            ("count", 1) => {
                let n: u64 = weir_guest::bincode::deserialize(bytes)?;
                Ok(weir_guest::bincode::serialize(&Count { n, first_seen: UNKNOWN })?)
            }
            _ => Err(weir_guest::Error::msg(format!("no migration for state `{state}` from schema {from_schema}"))),
        }
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let ts = rec.timestamp;
        let n = self.count.update_or_default(ctx, |c| {
            if c.n == 0 {
                c.first_seen = ts;
            }
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
