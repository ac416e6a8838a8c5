//! Windows under test: the input is file lines `key,timestamp,value` (key and event time from
//! the source's `key_column` and `timestamp_column`); config picks the windows (`kind` =
//! `tumbling` | `sliding` | `session`, `size_ms`, `slide_ms`, `gap_ms`, `offset_ms`,
//! `lateness_ms`) and the aggregate (`count`, `sum` of the values, or `all`: every value of
//! the window, sorted). Each firing emits `<key> <start> <end> <result>` at the window's last
//! millisecond; late records go to the `late` side output as they came.

use serde::{Deserialize, Serialize};
use weir_guest::window::{Sessions, Sliding, Tumbling, Window, Windows};
use weir_guest::{Context, Error, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, TimeDomain};

#[derive(Default, Serialize, Deserialize)]
struct Acc {
    count: u64,
    sum: i64,
    values: Vec<String>,
}

fn merge(into: &mut Acc, from: Acc) {
    into.count += from.count;
    into.sum += from.sum;
    into.values.extend(from.values);
}

#[derive(Clone, Copy, PartialEq)]
enum Aggregate {
    Count,
    Sum,
    All,
}

struct WindowsUnderTest {
    windows: Windows<Acc>,
    aggregate: Aggregate,
}

impl Operator for WindowsUnderTest {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("windows")],
        side_outputs: &["late"],
        ..OperatorInfo::new("test-windows", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let kind: String = ctx.config_or("kind", "tumbling".to_string())?;
        let size: i64 = ctx.config_or("size_ms", 10)?;
        let windows = match kind.as_str() {
            "tumbling" => Windows::new(ctx, "windows", Tumbling::new(size, ctx.config_or("offset_ms", 0)?)?)?,
            "sliding" => Windows::new(ctx, "windows", Sliding::new(size, ctx.config_or("slide_ms", size)?)?)?,
            "session" => Windows::sessions(ctx, "windows", Sessions::new(ctx.config_or("gap_ms", 10)?)?, merge)?,
            other => return Err(Error::msg(format!("kind = `{other}`: use tumbling, sliding or session"))),
        };
        let windows = windows.allowed_lateness(ctx.config_or("lateness_ms", 0)?)?.late_records_to(ctx, "late")?;
        let aggregate = match ctx.config_or("aggregate", "count".to_string())?.as_str() {
            "count" => Aggregate::Count,
            "sum" => Aggregate::Sum,
            "all" => Aggregate::All,
            other => return Err(Error::msg(format!("aggregate = `{other}`: use count, sum or all"))),
        };
        Ok(WindowsUnderTest { windows, aggregate })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let value = rec.value_str()?.split(',').nth(2).unwrap_or("").trim().to_string();
        let n: i64 = if self.aggregate == Aggregate::Sum { value.parse()? } else { 0 };
        let all = self.aggregate == Aggregate::All;
        let aggregate = self.aggregate;
        self.windows.add(
            ctx,
            &rec,
            |acc| {
                acc.count += 1;
                acc.sum += n;
                if all {
                    acc.values.push(value.clone());
                }
            },
            |ctx, w, acc| fire(ctx, aggregate, w, acc),
        )?;
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        let aggregate = self.aggregate;
        self.windows.on_timer(ctx, domain, |ctx, w, acc| fire(ctx, aggregate, w, acc))
    }
}

fn fire(ctx: &mut Context<'_>, aggregate: Aggregate, w: Window, acc: &Acc) {
    let result = match aggregate {
        Aggregate::Count => acc.count.to_string(),
        Aggregate::Sum => acc.sum.to_string(),
        Aggregate::All => {
            let mut v = acc.values.clone();
            v.sort();
            v.join("+")
        }
    };
    let key = ctx.key();
    let line = format!("{} {} {} {result}", String::from_utf8_lossy(key), w.start, w.end);
    ctx.emit_at(key, line.as_bytes(), w.max_timestamp());
}

weir_guest::export_operator!(WindowsUnderTest);
