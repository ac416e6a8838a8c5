//! `weir bench backpressure`: checkpoint durations with aligned barriers, unaligned ones, and
//! aligned ones that switch to unaligned after `alignment_timeout_ms`, while the sink runs at
//! a tenth of the source's rate and every channel is full (`examples/bench/backpressure.toml`),
//! interleaved round by round.
//!
//! Invariant: every configuration runs the same job file and the same records; a run whose
//! sink did not receive every record is an error, not a row.

use crate::bench::report::RunReport;
use crate::bench::variant::Variant;
use crate::bench::{BenchError, BenchOptions, expect_in, median, run_variant, source_count};

const JOB: &str = "backpressure.toml";

/// The timeout of the third configuration.
const TIMEOUT_MS: u64 = 200;

/// Runs every alignment `opts.runs` times and prints their table.
pub fn backpressure(opts: &BenchOptions) -> Result<(), BenchError> {
    let n = source_count(opts, JOB)?;
    println!(
        "\n## Checkpoints under backpressure: sink at 10 % of the source rate, {n} records, checkpoint every 1 s, {} rounds\n",
        opts.runs
    );
    println!(
        "| alignment | checkpoints per run | median duration | max duration | median in flight written | run time |"
    );
    println!("|---|---|---|---|---|---|");
    let timed = format!("aligned, alignment_timeout_ms = {TIMEOUT_MS}");
    let configs =
        [("aligned", None, "aligned"), ("unaligned", None, "unaligned"), ("aligned", Some(TIMEOUT_MS), &*timed)];
    let mut results: Vec<Vec<RunReport>> = vec![Vec::new(); configs.len()];
    for _ in 0..opts.runs {
        for (c, (a, timeout, _)) in configs.iter().enumerate() {
            let v = Variant { alignment: Some(a), alignment_timeout_ms: *timeout, ..Default::default() };
            let r = run_variant(opts, JOB, &v)?;
            expect_in(&r, JOB, "out", n)?;
            results[c].push(r);
        }
    }
    let mut medians = Vec::new();
    for (c, (_, _, a)) in configs.iter().enumerate() {
        let rs = &results[c];
        // The final checkpoint (after the input ended) is not one taken under backpressure.
        let cps: Vec<_> =
            rs.iter().flat_map(|r| r.checkpoints.iter().take(r.checkpoints.len().saturating_sub(1))).collect();
        let m = median(cps.iter().map(|c| c.duration_ms).collect());
        medians.push(m);
        println!(
            "| {a} | {:.1} | {:.0} ms | {:.0} ms | {:.0} records | {:.1} s |",
            cps.len() as f64 / rs.len().max(1) as f64,
            m,
            cps.iter().map(|c| c.duration_ms).fold(0.0, f64::max),
            median(cps.iter().map(|c| c.backedge_log_records as f64).collect()),
            median(rs.iter().map(|r| r.elapsed_ms / 1e3).collect()),
        );
    }
    println!(
        "\naligned / unaligned median checkpoint duration: {:.1}x; aligned / aligned with a {TIMEOUT_MS} ms timeout: {:.1}x",
        medians[0] / medians[1].max(1e-9),
        medians[0] / medians[2].max(1e-9)
    );
    Ok(())
}
