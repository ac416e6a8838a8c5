//! Version 2 of the exactly-once oracle (`test-oracle`), for live upgrades: the same checks
//! and output, but its state changes layout — schema 2 stores `Next { seq, by_v2 }` (the next
//! expected sequence number and how many records v2 has seen for the key) where schema 1
//! stored a bare `u64` — and it migrates schema-1 state on restore.
//!
//! Config `trap_in_restore = "<subtask>"` makes that subtask's instance trap while migrating
//! (a real WASM trap in `restore`), to prove an upgrade rolls back on every subtask when one
//! fails. v1 ignores the key.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};

static TRAP_IN_RESTORE: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Default, Serialize, Deserialize)]
struct Next {
    seq: u64,
    by_v2: u64,
}

struct Oracle {
    keys: u64,
    next: ValueState<Next>,
}

impl Operator for Oracle {
    const INFO: OperatorInfo = OperatorInfo {
        schema_version: 2,
        migrates_from: &[1],
        states: &[StateDescriptor::keyed_value("next")],
        side_outputs: &["violations"],
        ..OperatorInfo::new("test-oracle", "2.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let trap: i64 = ctx.config_or("trap_in_restore", -1i64)?;
        TRAP_IN_RESTORE.store(trap >= 0 && trap as u32 == ctx.task().subtask_index, Ordering::Relaxed);
        Ok(Oracle { keys: ctx.config_or("keys", 0u64)?, next: ctx.value_state("next")? })
    }

    fn migrate_value(state: &str, from_schema: u32, bytes: &[u8]) -> Result<Vec<u8>> {
        if TRAP_IN_RESTORE.load(Ordering::Relaxed) {
            panic!("oracle v2: injected trap while migrating `{state}` from schema {from_schema}");
        }
        let seq: u64 = weir_guest::bincode::deserialize(bytes)?;
        Ok(weir_guest::bincode::serialize(&Next { seq, by_v2: 0 })?)
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if rec.value == b"panic" {
            panic!("oracle v2: injected trap");
        }
        let i: u64 = rec.value_str()?.parse()?;
        let seq = i / self.keys;
        let expected = self.next.update_or_default(ctx, |n| {
            let e = n.seq;
            n.seq = seq + 1;
            n.by_v2 += 1;
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
