//! `weir bench nexmark`: every Nexmark query of `examples/nexmark/` at p = 1 and p = 2, with
//! checkpoints off and every second, sinks replaced by blackholes, N events each; events/s,
//! events per CPU-second (the process's user + system time during the run: "per core" without
//! guessing how many cores a pipeline of threads kept busy), what the checkpoints cost, their
//! durations and the peak RSS.
//!
//! What checkpoints cost, three ways, because on a small shared machine the wall-clock one
//! alone is noise of ±10 %: the throughput lost (wall clock), the CPU time added per event
//! (snapshots, serialization and writes are CPU the job would not otherwise spend, on whatever
//! core), and the stall: the synchronous parts (the only time a subtask's stream stops for a
//! checkpoint), summed over the run's checkpoints as the slowest subtask's, as a share of the run.
//!
//! The comparison: Flink's Nexmark figures as the issue quotes them (Alibaba's run on 8 CUs:
//! q0-q2 at 4-6.5 M events/s, i.e. about 0.5-0.8 M/s per core; q4, q5 at 0.15-0.63 M/s, i.e.
//! about 20-80 k/s per core), printed beside ours, not measured here.

use super::report::RunReport;
use super::variant::Variant;
use super::{BenchError, BenchOptions, mb, mean, median, rate, run_variant};
use crate::checkpoint::metadata::CheckpointMetrics;

/// The queries, in order, and Flink's published per-core events/s (low, high) for the
/// comparison column (None where the issue quotes no figure).
pub const QUERIES: [(&str, Option<(f64, f64)>); 12] = [
    ("q0", Some((0.5e6, 0.8e6))),
    ("q1", Some((0.5e6, 0.8e6))),
    ("q2", Some((0.5e6, 0.8e6))),
    ("q3", None),
    ("q4", Some((20e3, 80e3))),
    ("q5", Some((20e3, 80e3))),
    ("q6", None),
    ("q7", None),
    ("q8", None),
    ("q11", None),
    ("q12", None),
    ("early-bids", None),
];

/// Checks that the Nexmark components exist, with the command that builds them.
pub fn check_components(dir: &std::path::Path) -> Result<(), BenchError> {
    let target = dir.join("../../target/wasm32-unknown-unknown/guest");
    for c in ["nexmark_queries", "nexmark_stateless", "nexmark_joins"] {
        let path = target.join(format!("{c}.wasm"));
        if !path.exists() {
            return Err(BenchError::Check {
                job: dir.display().to_string(),
                what: format!(
                    "component {} does not exist; build the Nexmark components first: cargo build --profile guest \
                     --target wasm32-unknown-unknown -p nexmark-queries -p nexmark-stateless -p nexmark-joins",
                    path.display()
                ),
            });
        }
    }
    Ok(())
}

/// Runs the queries named in `only` (all when empty) over `events` events each.
pub fn nexmark(opts: &BenchOptions, events: u64, only: &[String]) -> Result<(), BenchError> {
    println!(
        "\n## Nexmark: events -> query -> blackhole, N = {events} events per run, checkpoints off and every 1 s, {} rounds\n",
        opts.runs
    );
    println!(
        "Flink per core: the issue's figures from Alibaba's 8-CU Flink run (q0-q2 0.5-0.8 M/s, q4/q5 20-80 k/s); \
         the ratio uses the upper end.\n"
    );
    println!(
        "| query | p | events/s (off) | per CPU-second | vs Flink per core | events/s (1 s) | checkpoint cost | CPU per event | stall | checkpoints per run | mean duration | max duration | peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (query, flink) in QUERIES.iter().filter(|(q, _)| only.is_empty() || only.iter().any(|o| o == q)) {
        let job = format!("{query}.toml");
        for p in [1u32, 2] {
            let mut off: Vec<RunReport> = Vec::new();
            let mut on: Vec<RunReport> = Vec::new();
            for _ in 0..opts.runs {
                for (interval, into) in [(0u64, &mut off), (1000, &mut on)] {
                    let v = Variant {
                        parallelism: Some(p),
                        interval_ms: Some(interval),
                        count: Some(events),
                        blackhole_sinks: true,
                        ..Default::default()
                    };
                    let r = run_variant(opts, &job, &v)?;
                    let emitted = r.nodes.first().map_or(0, |n| n.records_out);
                    if emitted != events {
                        return Err(BenchError::Check {
                            job: job.clone(),
                            what: format!("the source emitted {emitted} events, not {events}"),
                        });
                    }
                    into.push(r);
                }
            }
            let r_off = median(off.iter().map(|r| rate(r, events)).collect());
            let r_on = median(on.iter().map(|r| rate(r, events)).collect());
            let cps: Vec<&CheckpointMetrics> =
                on.iter().flat_map(|r| r.checkpoints.iter().take(r.checkpoints.len().saturating_sub(1))).collect();
            let rss = median(on.iter().map(|r| r.peak_rss_bytes as f64).collect());
            let per_core = median(off.iter().map(|r| events as f64 / (r.cpu_ms / 1e3).max(1e-9)).collect());
            let cpu = |runs: &[RunReport]| median(runs.iter().map(|r| r.cpu_ms).collect());
            let (cpu_off, cpu_on) = (cpu(&off), cpu(&on));
            let cpu_cost = (cpu_on - cpu_off) / cpu_off.max(1e-9) * 100.0;
            let stall = median(
                on.iter()
                    .map(|r| r.checkpoints.iter().map(|c| c.sync_ms_max).sum::<f64>() / r.elapsed_ms.max(1e-9) * 100.0)
                    .collect(),
            );
            println!(
                "| {query} | {p} | {:.2} M | {:.2} M | {} | {:.2} M | {:+.1} % | {:+.1} % | {:.2} % | {:.1} | {:.1} ms | {:.1} ms | {} |",
                r_off / 1e6,
                per_core / 1e6,
                flink.map_or("–".to_string(), |(_, high)| format!("{:.1}x", per_core / high)),
                r_on / 1e6,
                (r_off - r_on) / r_off.max(1e-9) * 100.0,
                cpu_cost,
                stall,
                cps.len() as f64 / on.len().max(1) as f64,
                mean(cps.iter().map(|c| c.duration_ms)),
                cps.iter().map(|c| c.duration_ms).fold(0.0, f64::max),
                mb(rss),
            );
        }
    }
    Ok(())
}
