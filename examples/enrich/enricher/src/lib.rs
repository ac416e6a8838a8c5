//! Two-input enrichment join: orders (left) meet customers (right) on the customer id.
//!
//! Left records: `order_id,customer_id,amount`; right records: `customer_id,name,country`,
//! both keyed by customer id. An order whose customer is known is emitted at once as
//! `order_id,customer_id,amount,name,country`; one that arrives first waits in keyed list
//! state until its customer arrives. Malformed orders go to the side output `invalid`.

use weir_guest::{
    CoOperator, Context, ListState, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState,
};

struct Enricher {
    customer: ValueState<String>,
    pending: ListState<String>,
}

fn enrich(ctx: &mut Context<'_>, order: &str, customer: &str) {
    // customer = "customer_id,name,country": append "name,country".
    let details = customer.split_once(',').map(|(_, rest)| rest).unwrap_or("");
    let line = format!("{order},{details}");
    let key = ctx.key().to_vec();
    ctx.emit(&key, line.as_bytes());
}

impl Operator for Enricher {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("customer"), StateDescriptor::keyed_list("pending")],
        side_outputs: &["invalid"],
        ..OperatorInfo::new("enrich-enricher", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Enricher { customer: ctx.value_state("customer")?, pending: ctx.list_state("pending")? })
    }

    /// Orders.
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let order = rec.value_str()?;
        let fields: Vec<&str> = order.split(',').collect();
        if fields.len() != 3 || fields[2].trim().parse::<f64>().is_err() {
            return ctx.emit_side("invalid", rec.key, rec.value);
        }
        match self.customer.get(ctx) {
            Some(c) => enrich(ctx, order, &c),
            None => self.pending.push(ctx, order.to_string()),
        }
        Ok(())
    }
}

impl CoOperator for Enricher {
    /// Customers.
    fn process_right(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let customer = rec.value_str()?.to_string();
        let waiting = self.pending.with(ctx, |l| l.to_vec());
        for order in &waiting {
            enrich(ctx, order, &customer);
        }
        self.pending.clear(ctx);
        self.customer.set(ctx, customer);
        Ok(())
    }
}

weir_guest::export_co_operator!(Enricher);
