//! The stateless queries: q0 (pass-through), q1 (currency conversion), q2 (selection).

use weir_guest::nexmark;
use weir_guest::{Context, Error, Record, Result, push_bytes, push_i64, push_u64};

use crate::{Stage, not_an_event};

/// q0: every bid, as `auction,bidder,price,date_time,extra` (the cost of reading and writing
/// the stream).
pub struct Q0;

impl Stage for Q0 {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if nexmark::kind(rec.value) != Some(nexmark::BID) {
            return check_event("q0", rec.value);
        }
        let b = nexmark::raw_bid(rec.value).ok_or_else(|| not_an_event("q0", Error::msg("a malformed bid")))?;
        let n = b.numbers;
        ctx.emit_with(rec.key, |v| {
            for x in [n.auction, n.bidder, n.price] {
                push_u64(v, x);
                v.push(b',');
            }
            push_i64(v, n.date_time);
            v.push(b',');
            push_bytes(v, b.extra);
        });
        Ok(())
    }
}

/// q1: bids with the price converted to euros, `auction,bidder,euro cents,date_time` (integer
/// cents, `price * 908 / 1000`, as Beam's Query1 keeps prices integral).
pub struct Q1;

impl Stage for Q1 {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if nexmark::kind(rec.value) != Some(nexmark::BID) {
            return check_event("q1", rec.value);
        }
        let b = nexmark::bid(rec.value).ok_or_else(|| not_an_event("q1", Error::msg("a short bid")))?;
        ctx.emit_with(rec.key, |v| {
            for x in [b.auction, b.bidder, euros(b.price)] {
                push_u64(v, x);
                v.push(b',');
            }
            push_i64(v, b.date_time);
        });
        Ok(())
    }
}

/// A price in dollar cents as euro cents: `price * 908 / 1000` (no overflow below 2^64 / 908).
pub fn euros(price: u64) -> u64 {
    (price as u128 * 908 / 1000) as u64
}

/// q2: `auction,price` of the bids on auctions whose id is a multiple of 123.
pub struct Q2;

impl Stage for Q2 {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if nexmark::kind(rec.value) != Some(nexmark::BID) {
            return check_event("q2", rec.value);
        }
        let b = nexmark::bid(rec.value).ok_or_else(|| not_an_event("q2", Error::msg("a short bid")))?;
        if b.auction % 123 == 0 {
            ctx.emit_with(rec.key, |v| {
                push_u64(v, b.auction);
                v.push(b',');
                push_u64(v, b.price);
            });
        }
        Ok(())
    }
}

/// Persons and auctions are skipped by the bid queries, anything else is refused.
fn check_event(stage: &str, value: &[u8]) -> Result<()> {
    match nexmark::kind(value) {
        Some(nexmark::PERSON | nexmark::AUCTION) => Ok(()),
        _ => nexmark::decode(value).map(|_| ()).map_err(|e| not_an_event(stage, e)),
    }
}
