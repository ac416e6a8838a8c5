//! Connected components by minimum-label propagation through a feedback loop.
//!
//! Keyed by vertex. A vertex's label starts as its own id; it learns neighbours (`n <v>`)
//! from the edge stream and label proposals (`l <label>`) from the loop. Whenever its label
//! drops, or it learns a neighbour, it sends its label to its neighbours — around the loop
//! (the operator's main output feeds back into itself). The loop ends when no proposal is
//! in flight; then the end-of-stream watermark fires one timer per vertex, which writes
//! `<vertex> <component>` (the smallest vertex id of its component) to the `labels` side
//! output.

use weir_guest::{
    Context, ListState, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, TimeDomain, ValueState,
    bail,
};

struct Components {
    label: ValueState<u64>,
    neighbors: ListState<u64>,
}

impl Components {
    /// The vertex's label, creating the vertex (label = its id, final-output timer) if new.
    fn label_of(&self, ctx: &mut Context<'_>, vertex: u64) -> u64 {
        match self.label.get(ctx) {
            Some(l) => l,
            None => {
                self.label.set(ctx, vertex);
                ctx.register_event_timer(i64::MAX);
                vertex
            }
        }
    }
}

fn propose(ctx: &mut Context<'_>, to: u64, label: u64) {
    ctx.emit(to.to_string().as_bytes(), format!("l {label}").as_bytes());
}

impl Operator for Components {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[StateDescriptor::keyed_value("label"), StateDescriptor::keyed_list("neighbors")],
        side_outputs: &["labels"],
        ..OperatorInfo::new("iterate-components", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Components { label: ctx.value_state("label")?, neighbors: ctx.list_state("neighbors")? })
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let vertex: u64 = rec.key_str()?.parse()?;
        let msg = rec.value_str()?;
        let (kind, arg) = msg.split_once(' ').unwrap_or((msg, ""));
        let arg: u64 = arg.parse()?;
        let label = self.label_of(ctx, vertex);
        match kind {
            "n" => {
                self.neighbors.push(ctx, arg);
                propose(ctx, arg, label);
            }
            "l" if arg < label => {
                self.label.set(ctx, arg);
                let neighbors = self.neighbors.with(ctx, |n| n.to_vec());
                for nb in neighbors {
                    propose(ctx, nb, arg);
                }
            }
            "l" => {}
            other => bail!("unknown message `{other}` for vertex {vertex}"),
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, _domain: TimeDomain) -> Result<()> {
        let label = self.label.get(ctx).unwrap_or(0);
        let key = ctx.key().to_vec();
        let line = format!("{} {label}", String::from_utf8_lossy(&key));
        ctx.emit_side("labels", &key, line.as_bytes())
    }
}

weir_guest::export_operator!(Components);
