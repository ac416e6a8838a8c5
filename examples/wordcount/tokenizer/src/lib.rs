//! Splits lines into lowercase words and emits each word as the key of a record.

use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result};

struct Tokenizer;

impl Operator for Tokenizer {
    const INFO: OperatorInfo = OperatorInfo::new("wordcount-tokenizer", "1.0.0");

    fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Tokenizer)
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let mut word = Vec::new();
        for &b in rec.value {
            if b.is_ascii_alphanumeric() || b >= 0x80 || b == b'\'' {
                word.push(b.to_ascii_lowercase());
            } else if !word.is_empty() {
                ctx.emit(&word, b"");
                word.clear();
            }
        }
        if !word.is_empty() {
            ctx.emit(&word, b"");
        }
        Ok(())
    }
}

weir_guest::export_operator!(Tokenizer);
