//! Splits the events for the two-input queries: persons on the main output (keyed by id,
//! optionally only those of some US states), auctions on side output `auctions` (keyed by seller
//! or id, optionally of one category), bids on side output `bids` (keyed by auction).

use weir_guest::nexmark::{self, Event};
use weir_guest::{Context, Error, OpenContext, Record, Result};

use crate::{Stage, not_an_event};

/// The split stage (`query = "split"`).
pub struct Split {
    states: Option<Vec<String>>,
    category: Option<u64>,
    auctions_by_seller: bool,
}

impl Split {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let states: String = ctx.config_or("states", String::new())?;
        let states = (!states.is_empty()).then(|| states.split(',').map(|s| s.trim().to_string()).collect());
        let category: i64 = ctx.config_or("category", -1)?;
        let auctions_by_seller = match ctx.config_or("auctions_by", "seller".to_string())?.as_str() {
            "seller" => true,
            "id" => false,
            other => return Err(Error::msg(format!("split: auctions_by = `{other}`: use `seller` or `id`"))),
        };
        Ok(Split { states, category: u64::try_from(category).ok(), auctions_by_seller })
    }
}

impl Stage for Split {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        match nexmark::decode(rec.value).map_err(|e| not_an_event("split", e))? {
            Event::Person(p) => {
                if self.states.as_ref().is_none_or(|s| s.iter().any(|s| s == p.state)) {
                    ctx.emit(&p.id.to_le_bytes(), rec.value);
                }
            }
            Event::Auction(a) => {
                if self.category.is_none_or(|c| c == a.category) {
                    let key = if self.auctions_by_seller { a.seller } else { a.id };
                    ctx.emit_side("auctions", &key.to_le_bytes(), rec.value)?;
                }
            }
            Event::Bid(b) => ctx.emit_side("bids", &b.auction.to_le_bytes(), rec.value)?,
        }
        Ok(())
    }
}
