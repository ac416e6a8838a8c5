//! The two-input Nexmark queries, one component (the `co-operator` world): the job's
//! `config.query` picks one. Both inputs come from the `split` stage of
//! `examples/nexmark/stateless`.
//!
//! | query | left | right | emits |
//! |---|---|---|---|
//! | `q3` | persons (id) | auctions (seller) | `name,city,state,auction` for every auction of a person (an unbounded join) |
//! | `q8` | persons (id) | auctions (seller) | `id,name,window_start`: persons who opened an auction in the 10 s window they registered in (a window join) |
//! | `early-bids` | auctions (id) | bids (auction) | `auction,bidder,price,date_time` of bids made within `upper_ms` of the auction opening (an interval join) |

use serde::{Deserialize, Serialize};
use weir_guest::nexmark::{self, Event};
use weir_guest::window::{IntervalJoin, Tumbling, Window, WindowJoin};
use weir_guest::{
    CoOperator, Context, Error, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, TimeDomain,
    ValueState, push_i64, push_u64,
};

#[derive(Clone, Default, Serialize, Deserialize)]
struct PersonRow {
    id: u64,
    name: String,
    city: String,
    state: String,
}

enum Query {
    Q3 { person: ValueState<PersonRow>, pending: ValueState<Vec<u64>> },
    Q8(WindowJoin<PersonRow, u64>),
    EarlyBids(IntervalJoin<u64, (u64, u64, i64)>),
}

struct Joins {
    query: Query,
}

fn person(rec: &Record<'_>) -> Result<PersonRow> {
    match nexmark::decode(rec.value)? {
        Event::Person(p) => Ok(PersonRow { id: p.id, name: p.name.into(), city: p.city.into(), state: p.state.into() }),
        _ => Err(Error::msg("the left input of q3/q8 takes persons (the main output of `split`)")),
    }
}

fn auction(rec: &Record<'_>) -> Result<u64> {
    match nexmark::decode(rec.value)? {
        Event::Auction(a) => Ok(a.id),
        _ => Err(Error::msg("this input takes auctions (side output `auctions` of `split`)")),
    }
}

fn q3_line(ctx: &mut Context<'_>, p: &PersonRow, auction: u64) {
    let key = ctx.key();
    ctx.emit(key, format!("{},{},{},{auction}", p.name, p.city, p.state).as_bytes());
}

fn q8_fire(ctx: &mut Context<'_>, w: Window, persons: &[PersonRow], auctions: &[u64]) {
    if auctions.is_empty() {
        return;
    }
    let key = ctx.key();
    for p in persons {
        ctx.emit_at(key, format!("{},{},{}", p.id, p.name, w.start).as_bytes(), w.max_timestamp());
    }
}

fn early_bid(ctx: &mut Context<'_>, auction: &u64, bid: &(u64, u64, i64)) {
    let key = ctx.key();
    // Written in place: `format!` was a sixth of the join's time at a match per bid.
    ctx.emit_with(key, |v| {
        push_u64(v, *auction);
        v.push(b',');
        push_u64(v, bid.0);
        v.push(b',');
        push_u64(v, bid.1);
        v.push(b',');
        push_i64(v, bid.2);
    });
}

impl Operator for Joins {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[
            StateDescriptor::keyed_value("person"),
            StateDescriptor::keyed_value("pending"),
            StateDescriptor::keyed_value("windows"),
            StateDescriptor::keyed_value("intervals"),
        ],
        ..OperatorInfo::new("nexmark-joins", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let query = match ctx.config_or("query", String::new())?.as_str() {
            "q3" => Query::Q3 { person: ctx.value_state("person")?, pending: ctx.value_state("pending")? },
            "q8" => {
                let size = ctx.config_or("size_ms", 10_000)?;
                Query::Q8(WindowJoin::new(ctx, "windows", Tumbling::new(size, 0)?)?)
            }
            "early-bids" => Query::EarlyBids(IntervalJoin::new(ctx, "intervals", 0, ctx.config_or("upper_ms", 1000)?)?),
            other => return Err(Error::msg(format!("config query = `{other}`: use q3, q8 or early-bids"))),
        };
        Ok(Joins { query })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        match &self.query {
            Query::Q3 { person: persons, pending } => {
                let p = person(&rec)?;
                for auction in pending.take(ctx).unwrap_or_default() {
                    q3_line(ctx, &p, auction);
                }
                persons.set(ctx, p);
            }
            Query::Q8(join) => {
                join.add_left(ctx, &rec, person(&rec)?, q8_fire)?;
            }
            Query::EarlyBids(join) => {
                join.add_left(ctx, auction(&rec)?, early_bid);
            }
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        match &self.query {
            Query::Q3 { .. } => Ok(()),
            Query::Q8(join) => join.on_timer(ctx, domain, q8_fire),
            Query::EarlyBids(join) => {
                join.on_timer(ctx, domain);
                Ok(())
            }
        }
    }
}

impl CoOperator for Joins {
    fn process_right(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        match &self.query {
            Query::Q3 { person, pending } => {
                let a = auction(&rec)?;
                match person.get(ctx) {
                    Some(p) => q3_line(ctx, &p, a),
                    None => pending.update_or_default(ctx, |v| v.push(a)),
                }
            }
            Query::Q8(join) => {
                join.add_right(ctx, &rec, auction(&rec)?, q8_fire)?;
            }
            Query::EarlyBids(join) => {
                let b = nexmark::bid(rec.value).ok_or_else(|| {
                    Error::msg("the right input of early-bids takes bids (side output `bids` of `split`)")
                })?;
                join.add_right(ctx, (b.bidder, b.price, b.date_time), early_bid);
            }
        }
        Ok(())
    }
}

weir_guest::export_co_operator!(Joins);
