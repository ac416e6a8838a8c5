//! The windowed stages: q5's bid counts per auction in sliding windows, q7's highest bids per
//! auction in tumbling windows, q11's bids per bidder session, q12's bids per bidder in
//! processing-time windows. The first two hand candidates to
//! [`top`](crate::top), keyed by window start, which keeps the best of each window.

use serde::{Deserialize, Serialize};
use weir_guest::nexmark;
use weir_guest::window::{Sessions, Sliding, Tumbling, Window, Windows};
use weir_guest::{Context, Error, OpenContext, Record, Result, TimeDomain};

use crate::Stage;
use crate::top::candidate;

/// A bid's numbers, or an error naming the stage when the record is not a bid.
fn bid_of(stage: &str, rec: &Record<'_>) -> Result<Option<nexmark::BidNumbers>> {
    match nexmark::kind(rec.value) {
        Some(nexmark::BID) => nexmark::bid(rec.value)
            .map(Some)
            .ok_or_else(|| crate::not_an_event(stage, Error::msg("a bid shorter than its numbers"))),
        Some(nexmark::PERSON | nexmark::AUCTION) => Ok(None),
        _ => Err(crate::not_an_event(stage, Error::msg("unknown kind byte"))),
    }
}

/// q5, first half: bids per auction in sliding windows (`size_ms` 10 s every `slide_ms` 2 s).
pub struct HotBids {
    counts: Windows<u64>,
}

impl HotBids {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let size = ctx.config_or("size_ms", 10_000)?;
        let slide = ctx.config_or("slide_ms", 2_000)?;
        Ok(HotBids { counts: Windows::new(ctx, "windows", Sliding::new(size, slide)?)? })
    }
}

fn emit_count(ctx: &mut Context<'_>, w: Window, n: &u64) {
    let auction = nexmark::key(ctx.key()).unwrap_or_default();
    candidate(ctx, w, *n as i64, format!("{auction},{n}").as_bytes());
}

impl Stage for HotBids {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if bid_of("hot-bids", &rec)?.is_some() {
            self.counts.add(ctx, &rec, |n| *n += 1, emit_count)?;
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        self.counts.on_timer(ctx, domain, emit_count)
    }
}

/// The highest bids of one auction in one window.
#[derive(Default, Serialize, Deserialize)]
pub struct Highest {
    price: u64,
    /// (bidder, date_time) of every bid at that price.
    bids: Vec<(u64, i64)>,
}

/// q7, first half: each auction's highest bids per tumbling window (`size_ms` 10 s).
pub struct MaxBids {
    highest: Windows<Highest>,
}

impl MaxBids {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let size = ctx.config_or("size_ms", 10_000)?;
        Ok(MaxBids { highest: Windows::new(ctx, "windows", Tumbling::new(size, 0)?)? })
    }
}

fn emit_highest(ctx: &mut Context<'_>, w: Window, h: &Highest) {
    let auction = nexmark::key(ctx.key()).unwrap_or_default();
    for (bidder, at) in &h.bids {
        candidate(ctx, w, h.price as i64, format!("{auction},{},{bidder},{at}", h.price).as_bytes());
    }
}

impl Stage for MaxBids {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let Some(b) = bid_of("max-bids", &rec)? else { return Ok(()) };
        self.highest.add(
            ctx,
            &rec,
            |h| {
                if b.price > h.price || h.bids.is_empty() {
                    *h = Highest { price: b.price, bids: vec![(b.bidder, b.date_time)] };
                } else if b.price == h.price {
                    h.bids.push((b.bidder, b.date_time));
                }
            },
            emit_highest,
        )?;
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        self.highest.on_timer(ctx, domain, emit_highest)
    }
}

/// q11: bids per bidder session (`gap_ms` 10 s), input keyed by bidder:
/// `bidder,bids,session_start,session_end`.
pub struct BidderSessions {
    sessions: Windows<u64>,
}

impl BidderSessions {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let gap = ctx.config_or("gap_ms", 10_000)?;
        Ok(BidderSessions { sessions: Windows::sessions(ctx, "windows", Sessions::new(gap)?, |a, b| *a += b)? })
    }
}

fn emit_session(ctx: &mut Context<'_>, w: Window, n: &u64) {
    let key = ctx.key();
    let bidder = nexmark::key(key).unwrap_or_default();
    ctx.emit_at(key, format!("{bidder},{n},{},{}", w.start, w.end).as_bytes(), w.max_timestamp());
}

impl Stage for BidderSessions {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if bid_of("sessions", &rec)?.is_some() {
            self.sessions.add(ctx, &rec, |n| *n += 1, emit_session)?;
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        self.sessions.on_timer(ctx, domain, emit_session)
    }
}

/// q12: bids per bidder in tumbling processing-time windows (`size_ms` 10 s: by the host's
/// clock when the bid arrives, not its event time), input keyed by bidder:
/// `bidder,bids,window_start,window_end`.
pub struct BidderCounts {
    counts: Windows<u64>,
}

impl BidderCounts {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let size = ctx.config_or("size_ms", 10_000)?;
        Ok(BidderCounts { counts: Windows::new(ctx, "windows", Tumbling::new(size, 0)?)?.processing_time()? })
    }
}

impl Stage for BidderCounts {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if bid_of("bidder-counts", &rec)?.is_some() {
            self.counts.add(ctx, &rec, |n| *n += 1, emit_session)?;
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        self.counts.on_timer(ctx, domain, emit_session)
    }
}
