//! Non-keyed list state across a rescale. `pending` (split) collects every value the subtask
//! processed; `marks` (union) gets one mark per subtask that ever ran, `"<subtask>/<parallelism>"`.
//! On close each subtask emits `pending <value>` for every element it holds and `marks <m1,m2,..>`
//! once: after a rescale, every value must come out exactly once (split deals each element to
//! one subtask) and every subtask must report every old subtask's mark (union).

use weir_guest::{
    Context, OpenContext, Operator, OperatorInfo, OperatorList, Record, Redistribution, Result, StateDescriptor,
};

struct Lists {
    pending: OperatorList<u64>,
    marks: OperatorList<String>,
    mark: Option<String>,
}

impl Operator for Lists {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[
            StateDescriptor::operator_list("pending", Redistribution::Split),
            StateDescriptor::operator_list("marks", Redistribution::Union),
        ],
        ..OperatorInfo::new("test-lists", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let t = ctx.task();
        let mark = Some(format!("{}/{}", t.subtask_index, t.parallelism));
        Ok(Lists { pending: ctx.operator_list("pending")?, marks: ctx.operator_list("marks")?, mark })
    }

    fn process(&mut self, _ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        if let Some(m) = self.mark.take()
            && !self.marks.get().contains(&m)
        {
            self.marks.push(m);
        }
        self.pending.push(rec.value_str()?.parse()?);
        Ok(())
    }

    fn close(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        for v in self.pending.get() {
            ctx.emit(b"", format!("pending {v}").as_bytes());
        }
        let mut marks = self.marks.get();
        marks.sort();
        ctx.emit(b"", format!("marks {}", marks.join(",")).as_bytes());
        Ok(())
    }
}

weir_guest::export_operator!(Lists);
