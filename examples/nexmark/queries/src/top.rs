//! The second half of q5 and q7: candidates arrive keyed by their window's start, each with a
//! score; when the watermark passes the window, the candidates with the highest score go out
//! as `window_start,window_end,<candidate>`.
//!
//! A candidate's value is its score (i64, little-endian) followed by its text; its timestamp is
//! its window's last millisecond, where this stage sets the timer.

use serde::{Deserialize, Serialize};
use weir_guest::window::Window;
use weir_guest::{Context, Error, OpenContext, Record, Result, TimeDomain, ValueState};

use crate::Stage;

/// Emits a candidate for window `w` (keyed by the window's start).
pub fn candidate(ctx: &mut Context<'_>, w: Window, score: i64, text: &[u8]) {
    let mut value = score.to_le_bytes().to_vec();
    value.extend_from_slice(text);
    ctx.emit_at(&w.start.to_le_bytes(), &value, w.max_timestamp());
}

#[derive(Default, Serialize, Deserialize)]
struct Best {
    score: i64,
    candidates: Vec<String>,
}

/// Keeps the best candidates of each window.
pub struct Top {
    best: ValueState<Best>,
}

impl Top {
    pub fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Top { best: ctx.value_state("top")? })
    }
}

impl Stage for Top {
    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        let text = rec.value.get(8..).filter(|t| !t.is_empty() && t.iter().all(|b| (0x20..0x7f).contains(b)));
        let (Some(score), Some(text)) = (rec.value.get(..8), text.and_then(|t| std::str::from_utf8(t).ok())) else {
            return Err(Error::msg("stage `top` reads candidates of hot-bids or max-bids; check the job's inputs"));
        };
        let score = i64::from_le_bytes(score.try_into().unwrap());
        let first = self.best.update_or_default(ctx, |b| {
            let first = b.candidates.is_empty();
            if first || score > b.score {
                *b = Best { score, candidates: vec![text.to_string()] };
            } else if score == b.score {
                b.candidates.push(text.to_string());
            }
            first
        });
        if first {
            ctx.register_event_timer(rec.timestamp);
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, domain: TimeDomain) -> Result<()> {
        if domain != TimeDomain::EventTime {
            return Ok(());
        }
        let Some(best) = self.best.take(ctx) else { return Ok(()) };
        let start = i64::from_le_bytes(ctx.key().try_into().unwrap_or_default());
        let end = ctx.timestamp() + 1;
        for c in best.candidates {
            ctx.emit(ctx.key(), format!("{start},{end},{c}").as_bytes());
        }
        Ok(())
    }
}
