//! The Nexmark queries as one Weir operator component: the job's `config.query` picks the
//! stage. Each query is a short pipeline of these stages (see `examples/nexmark/q*.toml`):
//!
//! | stage | input (keyed by) | does |
//! |---|---|---|
//! | `hot-bids` | bids (auction) | q5: bids per auction in sliding windows, to `top` |
//! | `max-bids` | bids (auction) | q7: each auction's highest bids per tumbling window, to `top` |
//! | `top` | candidates (window) | q5, q7: the candidates with the highest score of each window |
//! | `winning-bids` | auctions and bids (auction) | q4, q6: the highest valid bid of each auction when it closes |
//! | `category-avg` | winning bids (category) | q4: average closing price per category |
//! | `seller-avg` | winning bids (seller) | q6: average of each seller's last 10 closing prices |
//! | `sessions` | bids (bidder) | q11: bids per bidder session (gap 10 s) |
//! | `bidder-counts` | bids (bidder) | q12: bids per bidder in processing-time windows (10 s) |
//!
//! Windows come from `weir_guest::window`; events are decoded with `weir_guest::nexmark`. The
//! stateless stages (q0, q1, q2, re-keying) are in `examples/nexmark/stateless`.

mod by_event_time;
mod top;
mod windows;
mod winning;

use weir_guest::{Context, Error, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, TimeDomain};

/// One stage of a query.
trait Stage {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()>;
    fn on_timer(&mut self, _ctx: &mut Context<'_>, _domain: TimeDomain) -> Result<()> {
        Ok(())
    }
}

struct Nexmark {
    stage: Box<dyn Stage>,
}

impl Operator for Nexmark {
    const INFO: OperatorInfo = OperatorInfo {
        // Every stage's state; a stage registers only its own.
        states: &[
            StateDescriptor::keyed_value("windows"),
            StateDescriptor::keyed_value("top"),
            StateDescriptor::keyed_value("auction"),
            StateDescriptor::keyed_value("pending"),
            StateDescriptor::keyed_value("average"),
        ],
        ..OperatorInfo::new("nexmark-queries", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let query: String = ctx.config_or("query", String::new())?;
        let stage: Box<dyn Stage> = match query.as_str() {
            "hot-bids" => Box::new(windows::HotBids::open(ctx)?),
            "max-bids" => Box::new(windows::MaxBids::open(ctx)?),
            "sessions" => Box::new(windows::BidderSessions::open(ctx)?),
            "bidder-counts" => Box::new(windows::BidderCounts::open(ctx)?),
            "top" => Box::new(top::Top::open(ctx)?),
            "winning-bids" => Box::new(winning::WinningBids::open(ctx)?),
            "category-avg" => Box::new(by_event_time::CategoryAverage::open(ctx)?),
            "seller-avg" => Box::new(by_event_time::SellerAverage::open(ctx)?),
            other => {
                return Err(Error::msg(format!(
                    "config query = `{other}`: use hot-bids, max-bids, top, sessions, \
                     bidder-counts, winning-bids, category-avg or seller-avg"
                )));
            }
        };
        Ok(Nexmark { stage })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        self.stage.process(ctx, rec)
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        self.stage.on_timer(ctx, domain)
    }
}

/// A stage that needs Nexmark events got something else: the job wires it wrong.
fn not_an_event(stage: &str, e: Error) -> Error {
    Error::msg(format!(
        "stage `{stage}` reads the events of a `nexmark` source, and this record is not one ({}); \
         check the job's inputs",
        e.message()
    ))
}

weir_guest::export_operator!(Nexmark);
