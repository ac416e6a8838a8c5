//! q4 and q6, first half: the winning bid of each auction, i.e. its highest bid made between
//! its opening and its expiry (inclusive, as Flink's q4), emitted when the watermark passes the
//! expiry as `auction,category,seller,price`, keyed by category (q4) or seller (q6).
//!
//! Input keyed by auction id: the auction and its bids. A bid may come before its auction (the
//! generator bids on auctions about to open, and out-of-order groups shuffle); it waits until
//! the watermark passes its own time, by which the auction, if it opened before the bid, has
//! arrived.

use serde::{Deserialize, Serialize};
use weir_guest::nexmark::{self, Event};
use weir_guest::{Context, Error, OpenContext, Record, Result, TimeDomain, ValueState};

use crate::{Stage, not_an_event};

#[derive(Clone, Serialize, Deserialize)]
struct Open {
    category: u64,
    seller: u64,
    date_time: i64,
    expires: i64,
    best: Option<u64>,
}

impl Open {
    fn offer(&mut self, price: u64, at: i64) {
        if (self.date_time..=self.expires).contains(&at) {
            self.best = Some(self.best.map_or(price, |b| b.max(price)));
        }
    }
}

#[derive(Clone, Copy)]
enum By {
    Category,
    Seller,
}

/// The winning bids.
pub struct WinningBids {
    auction: ValueState<Open>,
    /// Bids that came before their auction: (price, date_time).
    pending: ValueState<Vec<(u64, i64)>>,
    by: By,
}

impl WinningBids {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let by = match ctx.config_or("by", String::new())?.as_str() {
            "category" => By::Category,
            "seller" => By::Seller,
            other => return Err(Error::msg(format!("winning-bids: by = `{other}`: use `category` or `seller`"))),
        };
        Ok(WinningBids { auction: ctx.value_state("auction")?, pending: ctx.value_state("pending")?, by })
    }
}

impl Stage for WinningBids {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        match nexmark::decode(rec.value).map_err(|e| not_an_event("winning-bids", e))? {
            Event::Auction(a) => {
                let mut open = Open {
                    category: a.category,
                    seller: a.seller,
                    date_time: a.date_time,
                    expires: a.expires,
                    best: None,
                };
                for (price, at) in self.pending.take(ctx).unwrap_or_default() {
                    open.offer(price, at);
                }
                self.auction.set(ctx, open);
                ctx.register_event_timer(a.expires);
            }
            Event::Bid(b) => {
                if let Some(mut open) = self.auction.get(ctx) {
                    open.offer(b.price, b.date_time);
                    self.auction.set(ctx, open);
                } else {
                    self.pending.update_or_default(ctx, |p| p.push((b.price, b.date_time)));
                    ctx.register_event_timer(b.date_time);
                }
            }
            Event::Person(_) => {}
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        if domain != TimeDomain::EventTime {
            return Ok(());
        }
        let now = ctx.timestamp();
        // Bids whose auction had not opened by their own time never will.
        if let Some(mut p) = self.pending.take(ctx) {
            p.retain(|(_, at)| *at > now);
            if !p.is_empty() {
                self.pending.set(ctx, p);
            }
        }
        let closes = self.auction.with(ctx, |o| o.is_some_and(|o| o.expires == now));
        if !closes {
            return Ok(());
        }
        let open = self.auction.take(ctx).expect("checked above");
        let Some(price) = open.best else { return Ok(()) };
        let auction = nexmark::key(ctx.key()).unwrap_or_default();
        let key = match self.by {
            By::Category => open.category,
            By::Seller => open.seller,
        };
        let line = format!("{auction},{},{},{price}", open.category, open.seller);
        ctx.emit_at(&key.to_le_bytes(), line.as_bytes(), open.expires);
        Ok(())
    }
}
