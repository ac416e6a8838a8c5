//! `cargo bench -p weir --bench keyed_count`: the keyed count (J1), measured as ratios taken
//! in one run on this machine.
//!
//! 1. Operator alone: the `wordcount-counter` component fed batches of 1024 records through
//!    the real boundary (one `process` call, one `emit-batch` host call per batch) versus the
//!    same logic compiled natively (same framing, per-key-group tables, same output).
//! 2. J1 job: generator (key = i mod 10 000) → hash → counter (WASM) → blackhole, at
//!    parallelism 1 and 2, with checkpointing off, every 1 s and every 100 ms, and the same
//!    job with the counter compiled into the host (`native:keyed-count`): the engine's limit.
//!
//! Environment: `WEIR_BENCH_N` records per job run (default 20 000 000), `WEIR_BENCH_RUNS`
//! repetitions per configuration (default 3, the best is reported).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use weir::checkpoint::metadata::CheckpointMetrics;
use weir::graph::logical::Side;
use weir::job;
use weir::keygroup::{key_group, key_group_range};
use weir::operator::OperatorLogic;
use weir::operator::native::NativeKeyedCount;
use weir::record::Batch;
use weir::runtime::executor::{self, RunOptions};
use weir::sandbox::bindings::types::TaskInfo;
use weir::sandbox::engine::new_engine;
use weir::sandbox::host::HostState;
use weir::sandbox::instance::LoadedComponent;

const KEYS: u64 = 10_000;
const MAX_P: u32 = 128;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn build_guests() -> PathBuf {
    let st = Command::new(env!("CARGO"))
        .args(["build", "--profile", "guest", "--target", "wasm32-unknown-unknown", "-p", "wordcount-counter"])
        .current_dir(root())
        .status()
        .expect("cargo");
    assert!(st.success(), "building the counter component failed");
    root().join("target/wasm32-unknown-unknown/guest")
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Pre-built input batches: 1024 records each, key = i mod KEYS, tagged with the key group.
fn batches(count: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut i = 0u64;
    for _ in 0..count {
        let mut b = Batch::default();
        for _ in 0..1024 {
            let key = (i % KEYS).to_string();
            b.push(key_group(key.as_bytes(), MAX_P), i as i64, key.as_bytes(), i.to_string().as_bytes());
            i += 1;
        }
        out.push(b);
    }
    out
}

fn operator_bench(components: &Path, records: u64) -> (f64, f64) {
    let input = batches(64);
    let rounds = (records / 1024) as usize;
    // WASM.
    let c = LoadedComponent::load(&new_engine().unwrap(), "count", &components.join("wordcount_counter.wasm")).unwrap();
    let r = key_group_range(MAX_P, 1, 0);
    let task = TaskInfo {
        job_name: "bench".into(),
        operator_uid: "count".into(),
        subtask_index: 0,
        parallelism: 1,
        max_parallelism: MAX_P,
        key_group_start: r.start,
        key_group_end: r.end,
    };
    let mut inst = c.instantiate(HostState::new(task.clone(), 0)).unwrap();
    inst.open(&[]).unwrap();
    let mut sink = 0u64;
    let t = Instant::now();
    for i in 0..rounds {
        inst.process(Side::Left, &input[i % input.len()]).unwrap();
        sink += inst.take_emitted().len() as u64;
    }
    let wasm = rounds as f64 * 1024.0 / t.elapsed().as_secs_f64();
    // Native: the same operator compiled into the host, behind the same interface.
    let mut n = NativeKeyedCount::new(HostState::new(task, 0));
    let t = Instant::now();
    for i in 0..rounds {
        n.process(Side::Left, &input[i % input.len()]).unwrap();
        sink += n.take_emitted().len() as u64;
    }
    let native = rounds as f64 * 1024.0 / t.elapsed().as_secs_f64();
    assert_eq!(sink, 2 * rounds as u64 * 1024);
    (wasm, native)
}

struct JobResult {
    rate: f64,
    checkpoints: Vec<CheckpointMetrics>,
}

/// J1 with `component` (a quoted TOML string: a component path or `"native:keyed-count"`).
fn j1_with(component: &str, n: u64, p: u32, interval_ms: Option<u64>) -> JobResult {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = interval_ms
        .map(|ms| format!("[checkpoint]\ninterval_ms = {ms}\ndir = \"chk\"\n[restart]\nstrategy = \"none\"\n"))
        .unwrap_or_default();
    let toml = format!(
        "[job]\nname = \"j1\"\nmax_parallelism = {MAX_P}\n{checkpoint}\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {n}\nkeys = {KEYS}\nparallelism = {p}\n\
         [[operator]]\nid = \"count\"\ncomponent = {component}\nparallelism = {p}\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\nparallelism = {p}\ninputs = [{{ from = \"count\" }}]\n"
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), job::parse(&path, &toml).unwrap()).unwrap();
    let t = Instant::now();
    let summary = executor::run(&bound, &RunOptions { quiet_guests: true, ..Default::default() }).unwrap();
    let rate = n as f64 / t.elapsed().as_secs_f64();
    assert_eq!(summary.nodes[2].records_in, n);
    let history = dir.path().join("chk/j1/history.json");
    let checkpoints = std::fs::read(history).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    JobResult { rate, checkpoints }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass nothing useful.
    let components = build_guests();
    let n = env_u64("WEIR_BENCH_N", 20_000_000);
    let runs = env_u64("WEIR_BENCH_RUNS", 3);
    println!(
        "keyed count, {KEYS} keys, batches of 1024, {} cores",
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );

    let (wasm, native) = operator_bench(&components, 10_000_000);
    println!("\n## operator alone (10M records)");
    println!("| operator | records/s | ratio |");
    println!("|---|---|---|");
    println!("| native Rust (same logic, in the host) | {:.2} M | 1.00 |", native / 1e6);
    println!("| WASM component (wordcount-counter) | {:.2} M | {:.2} |", wasm / 1e6, wasm / native);

    println!("\n## J1 job: generator -> hash -> counter (WASM) -> blackhole, N = {n}, {runs} interleaved rounds");
    println!(
        "| parallelism | checkpoints | records/s (median) | vs off (median) | records/s (best) | checkpoints done | mean duration | max sync | max async |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let wasm_c = format!("{:?}", components.join("wordcount_counter.wasm").display().to_string());
    let native_c = "\"native:keyed-count\"".to_string();
    let configs = [
        ("off", None, &wasm_c),
        ("every 1 s", Some(1000), &wasm_c),
        ("every 100 ms", Some(100), &wasm_c),
        ("off, NATIVE operator", None, &native_c),
    ];
    for p in [1u32, 2] {
        // Rounds interleave the configurations, so drift on a shared machine hits all alike.
        let mut results: Vec<Vec<JobResult>> = configs.iter().map(|_| Vec::new()).collect();
        for _ in 0..runs {
            for (c, (_, interval, comp)) in configs.iter().enumerate() {
                results[c].push(j1_with(comp, n, p, *interval));
            }
        }
        let median = |rs: &[JobResult]| {
            let mut v: Vec<f64> = rs.iter().map(|r| r.rate).collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let off = median(&results[0]);
        for (c, (label, _, _)) in configs.iter().enumerate() {
            let rs = &results[c];
            let cps: Vec<&CheckpointMetrics> = rs.iter().flat_map(|r| r.checkpoints.iter()).collect();
            let best = rs.iter().map(|r| r.rate).fold(0.0, f64::max);
            println!(
                "| {p} | {label} | {:.2} M | {:.3} | {:.2} M | {} | {:.1} ms | {:.2} ms | {:.2} ms |",
                median(rs) / 1e6,
                median(rs) / off,
                best / 1e6,
                cps.len() / rs.len(),
                mean(cps.iter().map(|c| c.duration_ms)),
                cps.iter().map(|c| c.sync_ms_max).fold(0.0, f64::max),
                cps.iter().map(|c| c.async_ms_max).fold(0.0, f64::max),
            );
        }
    }
}
