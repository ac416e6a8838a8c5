//! Re-keys events for a query keyed by something other than the event's own id: bids by
//! bidder (q11), auctions by seller.

use weir_guest::nexmark::{self, Event};
use weir_guest::{Context, Error, OpenContext, Record, Result};

use crate::{Stage, not_an_event};

/// What to key by.
#[derive(Clone, Copy)]
enum By {
    Bidder,
    Seller,
}

/// Emits bids keyed by bidder, or auctions keyed by seller; drops the other events.
pub struct Rekey {
    by: By,
}

impl Rekey {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let by = match ctx.config_or("by", String::new())?.as_str() {
            "bidder" => By::Bidder,
            "seller" => By::Seller,
            other => return Err(Error::msg(format!("rekey: by = `{other}`: use `bidder` or `seller`"))),
        };
        Ok(Rekey { by })
    }
}

impl Stage for Rekey {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let key = match (self.by, nexmark::decode(rec.value).map_err(|e| not_an_event("rekey", e))?) {
            (By::Bidder, Event::Bid(b)) => b.bidder,
            (By::Seller, Event::Auction(a)) => a.seller,
            _ => return Ok(()),
        };
        ctx.emit(&key.to_le_bytes(), rec.value);
        Ok(())
    }
}
