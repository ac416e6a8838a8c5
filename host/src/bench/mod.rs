//! `weir bench`: the reference benchmarks (J1 keyed count, J3 large state, end-to-end
//! latency) run from the job files in `examples/bench/`, each configuration in a fresh
//! `weir run` process, printed as tables of ratios taken in one run.
//!
//! Invariants: configurations are interleaved round by round, so drift on a shared machine
//! hits them alike; every number printed comes from the runs of this invocation (nothing is
//! remembered between invocations); a run whose record counts do not add up is an error, not
//! a row.

pub mod backpressure;
pub mod disk;
pub mod nexmark;
pub mod report;
pub mod startup;
pub mod variant;

use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

use crate::bench::report::RunReport;
use crate::bench::variant::{Variant, apply};
use crate::checkpoint::metadata::CheckpointMetrics;

/// Flink 2.3's J1 at p=1 on this machine kind on an earlier day (the reference figure),
/// records/s: a fixed yardstick, not a measurement of this host (Flink ran at 4.2-5.7 M/s on a
/// faster day); `examples/bench/flink/run.sh` measures the two side by side.
pub const FLINK_J1_P1: f64 = 2.9e6;

/// A benchmark that could not run.
#[derive(Debug, Error)]
pub enum BenchError {
    /// The job file.
    #[error(transparent)]
    Variant(#[from] variant::VariantError),
    /// I/O around a run.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The run failed.
    #[error("benchmark run of {job} failed ({status}); its last output:\n{tail}")]
    Run {
        /// Job file.
        job: String,
        /// Exit status.
        status: String,
        /// End of its stderr.
        tail: String,
    },
    /// The run's numbers are not what the job must produce.
    #[error("benchmark run of {job}: {what}")]
    Check {
        /// Job file.
        job: String,
        /// What did not add up.
        what: String,
    },
}

/// Where and how often.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The `weir` executable to run configurations with.
    pub exe: PathBuf,
    /// The directory holding `j1.toml`, `j3.toml`, `latency.toml`.
    pub dir: PathBuf,
    /// Rounds per configuration (the median is reported).
    pub runs: usize,
    /// J1 records per run (default: the job file's).
    pub j1_records: Option<u64>,
    /// Seconds of the latency runs.
    pub latency_secs: u64,
}

/// Runs `job` with `v` applied in a fresh process; returns its report.
pub fn run_variant(opts: &BenchOptions, job: &str, v: &Variant) -> Result<RunReport, BenchError> {
    let path = opts.dir.join(job);
    let io = |what: String| move |source| BenchError::Io { what, source };
    let text = std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
    let toml = apply(&text, &std::path::absolute(&path).unwrap_or(path.clone()), v)?;
    let tmp = std::env::temp_dir().join(format!("weir-bench-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
    let job_file = tmp.join("job.toml");
    std::fs::write(&job_file, toml).map_err(io(format!("writing {}", job_file.display())))?;
    let report_file = tmp.join("report.json");
    let out = Command::new(&opts.exe)
        .arg("run")
        .arg(&job_file)
        .args(["--progress", "0", "--quiet-guests", "--report"])
        .arg(&report_file)
        .output()
        .map_err(io(format!("starting {}", opts.exe.display())))?;
    let result = if out.status.success() {
        std::fs::read(&report_file).map_err(io(format!("reading {}", report_file.display()))).and_then(|b| {
            serde_json::from_slice::<RunReport>(&b).map_err(|e| BenchError::Check {
                job: path.display().to_string(),
                what: format!("unreadable report: {e}"),
            })
        })
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        Err(BenchError::Run {
            job: path.display().to_string(),
            status: out.status.to_string(),
            tail: lines[lines.len().saturating_sub(15)..].join("\n"),
        })
    };
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

fn mb(bytes: f64) -> String {
    format!("{:.1} MB", bytes / 1e6)
}

fn rate(r: &RunReport, records: u64) -> f64 {
    records as f64 / (r.elapsed_ms / 1e3).max(1e-9)
}

/// Checks that the node `id` received `n` records.
pub(crate) fn expect_in(r: &RunReport, job: &str, id: &str, n: u64) -> Result<(), BenchError> {
    let got = r.nodes.iter().find(|x| x.id == id).map_or(0, |x| x.records_in);
    if got != n {
        return Err(BenchError::Check { job: job.into(), what: format!("`{id}` received {got} records, not {n}") });
    }
    Ok(())
}

/// The job file `job` in `dir`, as a TOML table.
fn read_job(dir: &Path, job: &str) -> Result<toml::Table, BenchError> {
    let path = dir.join(job);
    let text = std::fs::read_to_string(&path)
        .map_err(|source| BenchError::Io { what: format!("reading {}", path.display()), source })?;
    Ok(text.parse().map_err(|e| variant::VariantError {
        path: path.display().to_string(),
        what: format!("not valid TOML: {e}"),
    })?)
}

/// The first generator's `count`.
pub(crate) fn source_count(opts: &BenchOptions, job: &str) -> Result<u64, BenchError> {
    let t = read_job(&opts.dir, job)?;
    Ok(t.get("source")
        .and_then(|s| s.as_array())
        .and_then(|a| a.first())
        .and_then(|s| s.get("count"))
        .and_then(|c| c.as_integer())
        .unwrap_or(0) as u64)
}

/// J1: p = 1 and 2; checkpoints off, every 1 s, every 100 ms; the native operator.
/// Returns the median records/s at p = 1 with checkpoints off (for the latency runs).
pub fn j1(opts: &BenchOptions) -> Result<f64, BenchError> {
    let n = match opts.j1_records {
        Some(n) => n,
        None => source_count(opts, "j1.toml")?,
    };
    println!("\n## J1 keyed count: generator -> hash -> counter -> blackhole, N = {n}, {} rounds\n", opts.runs);
    println!(
        "\"vs 2.9 M/s\" divides by Flink 2.3's J1 measured on this machine kind on another day, not on this \
         host now: for a ratio to Flink, run examples/bench/flink/run.sh (both side by side).\n"
    );
    println!(
        "| p | checkpoints | records/s (median) | vs off | vs native | vs 2.9 M/s | per run | mean duration | max sync | max async | mean bytes | peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let configs: [(&str, Option<u64>, Option<&str>); 4] = [
        ("off", Some(0), None),
        ("every 1 s", Some(1000), None),
        ("every 100 ms", Some(100), None),
        ("off, NATIVE operator", Some(0), Some("native:keyed-count")),
    ];
    let mut p1_off = 0.0;
    for p in [1u32, 2] {
        let mut results: Vec<Vec<RunReport>> = configs.iter().map(|_| Vec::new()).collect();
        for _ in 0..opts.runs {
            for (c, (_, interval, comp)) in configs.iter().enumerate() {
                let v = Variant {
                    parallelism: Some(p),
                    interval_ms: *interval,
                    count: Some(n),
                    component: comp.map(str::to_string),
                    ..Default::default()
                };
                let r = run_variant(opts, "j1.toml", &v)?;
                expect_in(&r, "j1.toml", "out", n)?;
                results[c].push(r);
            }
        }
        let rates: Vec<f64> = results.iter().map(|rs| median(rs.iter().map(|r| rate(r, n)).collect())).collect();
        if p == 1 {
            p1_off = rates[0];
        }
        for (c, (label, _, _)) in configs.iter().enumerate() {
            let cps: Vec<&CheckpointMetrics> = results[c].iter().flat_map(|r| r.checkpoints.iter()).collect();
            let rss = median(results[c].iter().map(|r| r.peak_rss_bytes as f64).collect());
            println!(
                "| {p} | {label} | {:.2} M | {:.3} | {:.2} | {:.1}x | {:.1} | {:.1} ms | {:.2} ms | {:.2} ms | {} | {} |",
                rates[c] / 1e6,
                rates[c] / rates[0],
                rates[c] / rates[3],
                rates[c] / FLINK_J1_P1,
                cps.len() as f64 / results[c].len().max(1) as f64,
                mean(cps.iter().map(|c| c.duration_ms)),
                cps.iter().map(|c| c.sync_ms_max).fold(0.0, f64::max),
                cps.iter().map(|c| c.async_ms_max).fold(0.0, f64::max),
                if cps.is_empty() {
                    "–".into()
                } else {
                    format!("{:.0} kB", mean(cps.iter().map(|c| c.bytes as f64)) / 1e3)
                },
                mb(rss),
            );
        }
    }
    Ok(p1_off)
}

/// J3: 1 M keys x 100-byte values, checkpoint every 1 s: full vs incremental snapshots, at
/// full speed and at a fixed rate (where incremental checkpoints should be proportional to
/// the keys changed per interval).
pub fn j3(opts: &BenchOptions) -> Result<(), BenchError> {
    let n = source_count(opts, "j3.toml")?;
    let t = read_job(&opts.dir, "j3.toml")?;
    let src = t.get("source").and_then(|s| s.as_array()).and_then(|a| a.first());
    let keys = src.and_then(|s| s.get("keys")).and_then(|v| v.as_integer()).unwrap_or(0) as u64;
    let vb = src.and_then(|s| s.get("value_bytes")).and_then(|v| v.as_integer()).unwrap_or(0) as u64;
    let key_bytes: u64 = (0..keys).map(|k| k.to_string().len() as u64).sum();
    let raw = key_bytes + keys * vb;
    let fixed_rate = 200_000u64;
    let fixed_n = fixed_rate * 10;
    println!(
        "\n## J3 large state: {keys} keys x {vb}-byte values (raw state {}), checkpoint every 1 s, {} rounds\n",
        mb(raw as f64),
        opts.runs
    );
    println!(
        "| input | snapshots | records/s | checkpoints per run | mean duration | max duration | max sync | max async | first (full) | later (median) | peak RSS | RSS / raw |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let long = format!("N = {}M, unthrottled", 5 * n / 1_000_000);
    let configs = [
        ("N = 3M, unthrottled", false, None, n),
        ("N = 3M, unthrottled", true, None, n),
        // Long enough for checkpoints while the operator runs at full speed.
        (long.as_str(), false, None, 5 * n),
        (long.as_str(), true, None, 5 * n),
        ("200 k/s for 10 s", false, Some(fixed_rate), fixed_n),
        ("200 k/s for 10 s", true, Some(fixed_rate), fixed_n),
    ];
    let mut results: Vec<Vec<RunReport>> = configs.iter().map(|_| Vec::new()).collect();
    for _ in 0..opts.runs {
        for (c, (_, incremental, rate_limit, count)) in configs.iter().enumerate() {
            let v = Variant {
                interval_ms: Some(1000),
                incremental: Some(*incremental),
                count: Some(*count),
                rate: Some(rate_limit.unwrap_or(0)),
                ..Default::default()
            };
            let r = run_variant(opts, "j3.toml", &v)?;
            expect_in(&r, "j3.toml", "store", *count)?;
            results[c].push(r);
        }
    }
    for (c, (label, incremental, _, count)) in configs.iter().enumerate() {
        let rs = &results[c];
        // The final checkpoint (after the input ended) is not a steady-state one.
        let cps: Vec<&CheckpointMetrics> =
            rs.iter().flat_map(|r| r.checkpoints.iter().take(r.checkpoints.len().saturating_sub(1))).collect();
        let firsts: Vec<f64> = rs.iter().filter_map(|r| r.checkpoints.first()).map(|c| c.bytes as f64).collect();
        let later: Vec<f64> = rs
            .iter()
            .flat_map(|r| r.checkpoints.iter().skip(1).take(r.checkpoints.len().saturating_sub(2)))
            .map(|c| c.bytes as f64)
            .collect();
        let rss = median(rs.iter().map(|r| r.peak_rss_bytes as f64).collect());
        println!(
            "| {label} | {} | {:.2} M | {:.1} | {:.0} ms | {:.0} ms | {:.2} ms | {:.0} ms | {} | {} | {} | {:.2} |",
            if *incremental { "incremental" } else { "full" },
            median(rs.iter().map(|r| rate(r, *count)).collect()) / 1e6,
            cps.len() as f64 / rs.len().max(1) as f64,
            mean(cps.iter().map(|c| c.duration_ms)),
            cps.iter().map(|c| c.duration_ms).fold(0.0, f64::max),
            cps.iter().map(|c| c.sync_ms_max).fold(0.0, f64::max),
            cps.iter().map(|c| c.async_ms_max).fold(0.0, f64::max),
            if firsts.is_empty() { "–".into() } else { mb(median(firsts)) },
            if later.is_empty() { "–".into() } else { mb(median(later)) },
            mb(rss),
            rss / raw as f64,
        );
    }
    Ok(())
}

/// End-to-end latency of J1 at a fixed input rate (`fraction` of `max_rate`), with
/// checkpoints off, every 1 s and every 100 ms.
pub fn latency(opts: &BenchOptions, max_rate: f64, fraction: f64) -> Result<(), BenchError> {
    let rate_limit = (max_rate * fraction) as u64;
    let n = rate_limit * opts.latency_secs;
    println!(
        "\n## End-to-end latency: J1 at {:.2} M records/s ({:.0} % of the {:.2} M/s measured), {} s per run, first 1 s not measured\n",
        rate_limit as f64 / 1e6,
        fraction * 100.0,
        max_rate / 1e6,
        opts.latency_secs
    );
    println!("| checkpoints | achieved records/s | p50 | p99 | p99.9 | max | samples |");
    println!("|---|---|---|---|---|---|---|");
    for (label, interval) in [("off", 0u64), ("every 1 s", 1000), ("every 100 ms", 100)] {
        let v = Variant {
            interval_ms: Some(interval),
            count: Some(n),
            rate: Some(rate_limit),
            parallelism: Some(1),
            ..Default::default()
        };
        let r = run_variant(opts, "latency.toml", &v)?;
        expect_in(&r, "latency.toml", "out", n)?;
        let l = r.nodes.iter().find_map(|x| x.latency).ok_or_else(|| BenchError::Check {
            job: "latency.toml".into(),
            what: "the sink measured no latency (is `latency = true` set on it?)".into(),
        })?;
        println!(
            "| {label} | {:.2} M | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {} |",
            rate(&r, n) / 1e6,
            l.p50_ms,
            l.p99_ms,
            l.p999_ms,
            l.max_ms,
            l.samples
        );
    }
    Ok(())
}

/// Checks that the components the job files name exist, with the command that builds them.
pub fn check_components(dir: &Path) -> Result<(), BenchError> {
    for job in ["j1.toml", "j3.toml", "latency.toml"] {
        let path = dir.join(job);
        let t = read_job(dir, job)?;
        for op in t.get("operator").and_then(|o| o.as_array()).into_iter().flatten() {
            let c = op.get("component").and_then(|c| c.as_str()).unwrap_or_default();
            if !c.starts_with("native:") && !dir.join(c).exists() {
                return Err(BenchError::Check {
                    job: path.display().to_string(),
                    what: format!(
                        "component {} does not exist; build the benchmark components first: cargo build \
                         --profile guest --target wasm32-unknown-unknown -p wordcount-counter -p bench-kv-store \
                         (or run examples/bench/run.sh)",
                        dir.join(c).display()
                    ),
                });
            }
        }
    }
    Ok(())
}
