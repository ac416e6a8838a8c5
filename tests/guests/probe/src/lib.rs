//! Test guest: does what each record's value says, so tests can drive every part of the
//! host/guest boundary (emit, side outputs, every state kind, timers, traps, errors).
//! A value `key,command` (a CSV line) means `command`.

use weir_guest::{
    Context, ListState, MapState, OpenContext, Operator, OperatorInfo, OperatorValue, Record, Result, StateDescriptor,
    TimeDomain, ValueState, bail,
};

struct Probe {
    count: ValueState<u64>,
    seen: ListState<String>,
    tags: MapState<String, u64>,
    total: OperatorValue<u64>,
}

impl Operator for Probe {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[
            StateDescriptor::keyed_value("count"),
            StateDescriptor::keyed_list("seen"),
            StateDescriptor::keyed_map("tags"),
            StateDescriptor::operator_value("total"),
        ],
        side_outputs: &["side", "events"],
        ..OperatorInfo::new("test-probe", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        if ctx.config().contains_key("fail_open") {
            bail!("open failed on request");
        }
        Ok(Probe {
            count: ctx.value_state("count")?,
            seen: ctx.list_state("seen")?,
            tags: ctx.map_state("tags")?,
            total: ctx.operator_value("total")?,
        })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        self.total.set(self.total.get().unwrap_or(0) + 1);
        let key = rec.key_str()?.to_string();
        // A CSV line `key,command` (from a file source with key_column = 0) means `command`.
        let cmd = rec.value_str()?;
        let cmd = cmd.rsplit_once(',').map(|(_, c)| c).unwrap_or(cmd);
        let (verb, arg) = cmd.split_once(':').unwrap_or((cmd, ""));
        match verb {
            "count" => {
                let n = self.count.update_or_default(ctx, |c| {
                    *c += 1;
                    *c
                });
                ctx.emit(rec.key, format!("{key}={n}").as_bytes());
            }
            "forget" => self.count.clear(ctx),
            "emit" => {
                for i in 0..arg.parse::<u32>()? {
                    ctx.emit(rec.key, i.to_string().as_bytes());
                }
            }
            "side" => ctx.emit_side("side", rec.key, arg.as_bytes())?,
            "bad-side" => ctx.emit_side("no-such-output", rec.key, b"")?,
            "list" => {
                self.seen.push(ctx, arg.to_string());
                let all = self.seen.with(ctx, |l| l.join(","));
                ctx.emit(rec.key, all.as_bytes());
            }
            "map" => {
                let (k, v) = arg.split_once('=').unwrap_or((arg, "0"));
                self.tags.insert(ctx, k.to_string(), v.parse()?);
                let all = self.tags.with(ctx, |m| {
                    m.map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
                        .unwrap_or_default()
                });
                ctx.emit(rec.key, all.as_bytes());
            }
            "timer" => ctx.register_event_timer(arg.parse()?),
            "total" => {
                let t = self.total.get().unwrap_or(0);
                ctx.emit(rec.key, t.to_string().as_bytes());
            }
            "panic" => panic!("probe panicked on request"),
            "error" => bail!("probe failed on request"),
            "spin" => loop {
                std::hint::spin_loop()
            },
            other => bail!("unknown probe command `{other}`"),
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        let d = match domain {
            TimeDomain::EventTime => "event",
            TimeDomain::ProcessingTime => "processing",
        };
        let line = format!("timer {d} {}@{}", String::from_utf8_lossy(ctx.key()), ctx.timestamp());
        let key = ctx.key().to_vec();
        ctx.emit_side("events", &key, line.as_bytes())
    }

    fn on_watermark(&mut self, ctx: &mut Context<'_>, watermark: i64) -> Result<()> {
        ctx.emit_side("events", b"", format!("watermark {watermark}").as_bytes())
    }

    fn close(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        let t = self.total.get().unwrap_or(0);
        ctx.emit_side("events", b"", format!("closed after {t}").as_bytes())
    }
}

weir_guest::export_operator!(Probe);
