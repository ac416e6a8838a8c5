//! An operator that tries to read the host's files through WASI: built for `wasm32-wasip2`,
//! so its component imports WASI (environment, stdio, streams: what Rust's std pulls in).
//! Weir grants no ambient capability, so it must be refused at load, with the imports listed.

use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result};

struct Snoop;

impl Operator for Snoop {
    const INFO: OperatorInfo = OperatorInfo::new("test-wasi-fs", "1.0.0");

    fn open(_: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Snoop)
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let secret = std::fs::read("/etc/passwd").unwrap_or_default();
        ctx.emit(rec.key, &secret);
        Ok(())
    }
}

weir_guest::export_operator!(Snoop);
