//! The stateless Nexmark stages, one component (no keyed state, so they chain `forward` after
//! the source); the job's `config.query` picks one:
//!
//! | stage | does |
//! |---|---|
//! | `q0` | passes every bid through: `auction,bidder,price,date_time,extra` |
//! | `q1` | bids with the price in euro cents: `auction,bidder,price * 908 / 1000,date_time` |
//! | `q2` | `auction,price` of the bids on every 123rd auction |
//! | `rekey` | re-keys bids by bidder (`by = "bidder"`, q11) or auctions by seller (`by = "seller"`) |
//! | `split` | persons / side output `auctions` / side output `bids`, for the two-input joins |
//!
//! The stateful stages are in `examples/nexmark/queries`.

mod rekey;
mod simple;
mod split;

use weir_guest::{Context, Error, OpenContext, Operator, OperatorInfo, Record, Result};

/// One stage of a query.
trait Stage {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()>;
}

struct Stateless {
    stage: Box<dyn Stage>,
}

impl Operator for Stateless {
    const INFO: OperatorInfo =
        OperatorInfo { side_outputs: &["auctions", "bids"], ..OperatorInfo::new("nexmark-stateless", "1.0.0") };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let query: String = ctx.config_or("query", String::new())?;
        let stage: Box<dyn Stage> = match query.as_str() {
            "q0" => Box::new(simple::Q0),
            "q1" => Box::new(simple::Q1),
            "q2" => Box::new(simple::Q2),
            "rekey" => Box::new(rekey::Rekey::open(ctx)?),
            "split" => Box::new(split::Split::open(ctx)?),
            other => {
                return Err(Error::msg(format!("config query = `{other}`: use q0, q1, q2, rekey or split")));
            }
        };
        Ok(Stateless { stage })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        self.stage.process(ctx, rec)
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

weir_guest::export_operator!(Stateless);
