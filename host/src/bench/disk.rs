//! `weir bench disk`: J1 and J3 on the disk state backend next to the memory backend, each
//! configuration in a fresh process, interleaved round by round; J3 on disk with a 64 MiB guest
//! (its ~120 MB of state does not fit: the cache pages), checkpoints every second.
//!
//! Invariant: both backends run the same job file and the same records; a run whose operator
//! did not receive every record is an error, not a row.

use crate::bench::report::RunReport;
use crate::bench::variant::Variant;
use crate::bench::{BenchError, BenchOptions, expect_in, median, run_variant, source_count};

/// Flink 2.3 with the RocksDB backend on this machine kind (the reference figures).
pub const FLINK_ROCKSDB_J1: f64 = 0.32e6;
/// The same for J3 with incremental checkpoints.
pub const FLINK_ROCKSDB_J3: f64 = 0.09e6;

struct Config {
    job: &'static str,
    /// The node whose input counts the records.
    node: &'static str,
    backend: &'static str,
    memory_mb: Option<u64>,
    incremental: bool,
    flink: f64,
}

/// Runs every configuration `opts.runs` times and prints their table.
pub fn disk(opts: &BenchOptions) -> Result<(), BenchError> {
    let j1 = opts.j1_records.unwrap_or(source_count(opts, "j1.toml")?.min(10_000_000));
    let j3 = source_count(opts, "j3.toml")?;
    let config = |job, node, backend, memory_mb, incremental, flink| Config {
        job,
        node,
        backend,
        memory_mb,
        incremental,
        flink,
    };
    let configs = [
        config("j1.toml", "out", "memory", None, false, FLINK_ROCKSDB_J1),
        config("j1.toml", "out", "disk", None, false, FLINK_ROCKSDB_J1),
        config("j3.toml", "store", "memory", None, true, FLINK_ROCKSDB_J3),
        config("j3.toml", "store", "disk", Some(64), true, FLINK_ROCKSDB_J3),
    ];
    println!(
        "\n## The disk state backend: J1 ({j1} records, 10k keys) and J3 ({j3} records, 1M keys x 100 B), checkpoint every 1 s, {} rounds\n",
        opts.runs
    );
    println!(
        "| job | backend | memory_mb | records/s | vs memory | vs Flink RocksDB | checkpoints per run | median checkpoint bytes | max sync | peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut results: Vec<Vec<RunReport>> = configs.iter().map(|_| Vec::new()).collect();
    for _ in 0..opts.runs {
        for (i, c) in configs.iter().enumerate() {
            let n = if c.job == "j1.toml" { j1 } else { j3 };
            let v = Variant {
                interval_ms: Some(1000),
                incremental: Some(c.incremental),
                count: Some(n),
                state_backend: Some(c.backend),
                memory_mb: c.memory_mb,
                ..Default::default()
            };
            let r = run_variant(opts, c.job, &v)?;
            expect_in(&r, c.job, c.node, n)?;
            results[i].push(r);
        }
    }
    let rates: Vec<f64> = configs
        .iter()
        .zip(&results)
        .map(|(c, rs)| {
            let n = if c.job == "j1.toml" { j1 } else { j3 };
            median(rs.iter().map(|r| n as f64 / (r.elapsed_ms / 1e3)).collect())
        })
        .collect();
    for (i, (c, rs)) in configs.iter().zip(&results).enumerate() {
        let memory = rates[i - i % 2];
        let cps: Vec<_> = rs.iter().flat_map(|r| r.checkpoints.iter()).collect();
        println!(
            "| {} | {} | {} | {:.2} M | {:.2} | {:.1}x | {:.1} | {:.1} MB | {:.1} ms | {:.0} MB |",
            c.job.trim_end_matches(".toml").to_uppercase(),
            c.backend,
            c.memory_mb.map_or("512".into(), |m| m.to_string()),
            rates[i] / 1e6,
            rates[i] / memory,
            rates[i] / c.flink,
            cps.len() as f64 / rs.len().max(1) as f64,
            median(cps.iter().map(|c| c.bytes as f64).collect()) / 1e6,
            cps.iter().map(|c| c.sync_ms_max).fold(0.0, f64::max),
            median(rs.iter().map(|r| r.peak_rss_bytes as f64).collect()) / 1e6,
        );
    }
    Ok(())
}
