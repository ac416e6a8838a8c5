//! Exactly-once oracle for loops. Fresh records come from a generator (key `i mod keys`,
//! value `i`): their per-key sequence `i / keys` is checked against keyed state like
//! `test-oracle` (gaps and duplicates go to the `violations` side output). Each fresh record
//! then circulates `hops` times through the operator's own feedback loop as `i:<remaining>`,
//! and when it has no hop left it leaves on the `done` side output as `<key> <seq>`. A lost
//! or replayed record in transit on the back-edge shows up as a missing or duplicate `done`
//! line. A record whose value is `panic` makes the guest trap (failure injection).

use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};

struct LoopOracle {
    keys: u64,
    hops: u64,
    next: ValueState<u64>,
}

impl Operator for LoopOracle {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("next")],
        side_outputs: &["done", "violations"],
        ..OperatorInfo::new("test-loop-oracle", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(LoopOracle {
            keys: ctx.config_or("keys", 0u64)?,
            hops: ctx.config_or("hops", 3u64)?,
            next: ctx.value_state("next")?,
        })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if rec.value == b"panic" {
            panic!("loop oracle: injected trap");
        }
        let v = rec.value_str()?;
        let key = rec.key_str()?.to_string();
        match v.split_once(':') {
            None => {
                let i: u64 = v.parse()?;
                let seq = i / self.keys;
                let expected = self.next.update_or_default(ctx, |n| {
                    let e = *n;
                    *n = seq + 1;
                    e
                });
                if seq != expected {
                    let kind = if seq < expected { "duplicate" } else { "gap" };
                    let line = format!("{kind}: key {key} expected {expected} got {seq}");
                    ctx.emit_side("violations", rec.key, line.as_bytes())?;
                }
                ctx.emit(rec.key, format!("{i}:{}", self.hops).as_bytes());
            }
            Some((i, hops)) => {
                let (i, hops): (u64, u64) = (i.parse()?, hops.parse()?);
                if hops == 0 {
                    ctx.emit_side("done", rec.key, format!("{key} {}", i / self.keys).as_bytes())?;
                } else {
                    ctx.emit(rec.key, format!("{i}:{}", hops - 1).as_bytes());
                }
            }
        }
        Ok(())
    }
}

weir_guest::export_operator!(LoopOracle);
