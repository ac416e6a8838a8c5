//! Turns each undirected edge `u v` into two keyed records: (u, `n v`) and (v, `n u`), so
//! each endpoint learns its neighbour.

use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, bail};

struct Split;

impl Operator for Split {
    const INFO: OperatorInfo = OperatorInfo::new("iterate-split", "1.0.0");

    fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Split)
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let line = rec.value_str()?.trim();
        if line.is_empty() || line.starts_with('#') {
            return Ok(());
        }
        let mut it = line.split_whitespace();
        let (Some(u), Some(v), None) = (it.next(), it.next(), it.next()) else {
            bail!("edge line `{line}` is not `<u> <v>`");
        };
        let (u, v): (u64, u64) = (u.parse()?, v.parse()?);
        ctx.emit(u.to_string().as_bytes(), format!("n {v}").as_bytes());
        ctx.emit(v.to_string().as_bytes(), format!("n {u}").as_bytes());
        Ok(())
    }
}

weir_guest::export_operator!(Split);
