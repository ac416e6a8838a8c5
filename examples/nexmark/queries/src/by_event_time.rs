//! q4 and q6, second half: running averages over winning bids, taken in event-time order
//! (buffered until the watermark passes them, then by time and auction), so every run — with
//! any parallelism, after any failure — emits the same sequence of averages.
//!
//! Input: `auction,category,seller,price` keyed by category (q4) or seller (q6).

use weir_guest::{Context, Error, OpenContext, Record, Result, TimeDomain, ValueState};

use crate::Stage;

/// Winning bids waiting for the watermark: (time, auction, price).
type Pending = ValueState<Vec<(i64, u64, u64)>>;

fn buffer(pending: &Pending, ctx: &mut Context<'_>, rec: &Record<'_>, stage: &str) -> Result<()> {
    let text = rec.value_str()?;
    let fields: Vec<&str> = text.split(',').collect();
    let (Some(auction), Some(price)) = (fields.first(), fields.get(3)) else {
        return Err(Error::msg(format!("stage `{stage}` reads winning-bids output; this record is `{text}`")));
    };
    let (auction, price) = (auction.parse()?, price.parse()?);
    pending.update_or_default(ctx, |p| p.push((rec.timestamp, auction, price)));
    ctx.register_event_timer(rec.timestamp);
    Ok(())
}

/// The buffered winning bids the watermark has passed, in (time, auction) order.
fn due(pending: &Pending, ctx: &Context<'_>) -> Vec<(i64, u64, u64)> {
    let now = ctx.timestamp();
    let Some(mut all) = pending.take(ctx) else { return Vec::new() };
    all.sort_unstable();
    let later = all.split_off(all.partition_point(|(t, ..)| *t <= now));
    if !later.is_empty() {
        pending.set(ctx, later);
    }
    all
}

/// q4: `category,average closing price` after each auction of the category closes.
pub struct CategoryAverage {
    pending: Pending,
    sums: ValueState<(u64, u64)>,
}

impl CategoryAverage {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(CategoryAverage { pending: ctx.value_state("pending")?, sums: ctx.value_state("average")? })
    }
}

impl Stage for CategoryAverage {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        buffer(&self.pending, ctx, &rec, "category-avg")
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        if domain != TimeDomain::EventTime {
            return Ok(());
        }
        let category = weir_guest::nexmark::key(ctx.key()).unwrap_or_default();
        for (_, _, price) in due(&self.pending, ctx) {
            let avg = self.sums.update_or_default(ctx, |(sum, n)| {
                *sum += price;
                *n += 1;
                *sum / *n
            });
            ctx.emit(ctx.key(), format!("{category},{avg}").as_bytes());
        }
        Ok(())
    }
}

/// How many of a seller's last closing prices q6 averages.
const LAST: usize = 10;

/// q6: `seller,average of its last 10 closing prices` after each of its auctions closes.
pub struct SellerAverage {
    pending: Pending,
    last: ValueState<Vec<u64>>,
}

impl SellerAverage {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(SellerAverage { pending: ctx.value_state("pending")?, last: ctx.value_state("average")? })
    }
}

impl Stage for SellerAverage {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        buffer(&self.pending, ctx, &rec, "seller-avg")
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        if domain != TimeDomain::EventTime {
            return Ok(());
        }
        let seller = weir_guest::nexmark::key(ctx.key()).unwrap_or_default();
        for (_, _, price) in due(&self.pending, ctx) {
            let avg = self.last.update_or_default(ctx, |last| {
                if last.len() == LAST {
                    last.remove(0);
                }
                last.push(price);
                last.iter().sum::<u64>() / last.len() as u64
            });
            ctx.emit(ctx.key(), format!("{seller},{avg}").as_bytes());
        }
        Ok(())
    }
}
