//! Exactly-once oracle: the input is a generator stream (key `i mod keys`, value `i`), so
//! each key's sequence numbers `i / keys` must arrive as 0, 1, 2, ... with no gap and no
//! duplicate. The next expected number lives in keyed state, so a restore that loses or
//! replays a record shows up as a violation on the `violations` side output. The main output
//! is `<key> <seq>` per record. A record whose value is `panic` makes the guest panic (a real
//! trap, used by failure injection).
//!
//! With `remove_every = R`, a key's state is removed after every R-th record of it (sequence
//! numbers R-1, 2R-1, ...), so snapshots carry removals (tombstones in incremental chains):
//! a key without state must next see a multiple of R, and a key whose removal a restore lost
//! shows its old number. With `pad = B`, each key's value carries B more bytes (state large
//! enough to be handed out in many chunks).

use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};

struct Oracle {
    keys: u64,
    next: Next,
    remove_every: u64,
    pad: usize,
}

/// The one keyed state `next`: the next number, or with `remove_every`/`pad` the next number and
/// its padding (one declared state either way, so live queries and upgrades see the same shape).
enum Next {
    Plain(ValueState<u64>),
    Padded(ValueState<(u64, Vec<u8>)>),
}

impl Operator for Oracle {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("next")],
        side_outputs: &["violations"],
        ..OperatorInfo::new("test-oracle", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let remove_every = ctx.config_or("remove_every", 0u64)?;
        let pad = ctx.config_or("pad", 0usize)?;
        let next = if remove_every > 0 || pad > 0 {
            Next::Padded(ctx.value_state("next")?)
        } else {
            Next::Plain(ctx.value_state("next")?)
        };
        Ok(Oracle { keys: ctx.config_or("keys", 0u64)?, next, remove_every, pad })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if rec.value == b"panic" {
            panic!("oracle: injected trap");
        }
        let i: u64 = rec.value_str()?.parse()?;
        let seq = i / self.keys;
        let key = rec.key_str()?;
        let next = match &self.next {
            Next::Plain(next) => next,
            Next::Padded(padded) => return self.removing(padded, ctx, &rec, seq),
        };
        let expected = next.update_or_default(ctx, |n| {
            let e = *n;
            *n = seq + 1;
            e
        });
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

impl Oracle {
    /// The `remove_every` / `pad` mode (see the crate docs).
    fn removing(
        &self,
        padded: &ValueState<(u64, Vec<u8>)>,
        ctx: &mut Context<'_>,
        rec: &Record<'_>,
        seq: u64,
    ) -> Result<()> {
        let every = self.remove_every.max(1);
        let key = rec.key_str()?;
        let expected = match padded.with(ctx, |v| v.map(|(next, _)| *next)) {
            Some(next) => Some(next),
            // No state: never seen, or removed after the last record of a block.
            None if (if self.remove_every == 0 { seq == 0 } else { seq.is_multiple_of(every) }) => None,
            None => {
                let v = format!("absent: key {key} has no state at {seq} (a record lost, or a removal replayed)");
                ctx.emit_side("violations", rec.key, v.as_bytes())?;
                None
            }
        };
        if let Some(e) = expected.filter(|e| *e != seq) {
            let kind = if seq < e { "duplicate" } else { "gap" };
            let v = format!("{kind}: key {key} expected {e} got {seq}");
            ctx.emit_side("violations", rec.key, v.as_bytes())?;
        }
        if self.remove_every == 0 || !(seq + 1).is_multiple_of(every) {
            padded.set(ctx, (seq + 1, vec![(seq % 251) as u8; self.pad]));
        } else {
            padded.clear(ctx);
        }
        ctx.emit(rec.key, format!("{key} {seq}").as_bytes());
        Ok(())
    }
}

weir_guest::export_operator!(Oracle);
