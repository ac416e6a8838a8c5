//! `cargo bench -p weir --bench cycles`: checkpoints of a cyclic job. Runs the iterate
//! example's job (connected components through a feedback loop) on a generated random
//! graph with a checkpoint every 100 ms, and prints per checkpoint: duration, sync/async
//! parts, bytes, and the records in transit on back-edges that loop heads logged.
//!
//! Environment: `WEIR_BENCH_VERTICES` (default 200 000), `WEIR_BENCH_EDGES` (default 300 000).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use weir::checkpoint::metadata::CheckpointMetrics;
use weir::connectors::generator::splitmix64;
use weir::job;
use weir::runtime::executor::{self, RunOptions};
use weir::sandbox::engine::new_engine;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let st = Command::new(env!("CARGO"))
        .args([
            "build",
            "--profile",
            "guest",
            "--target",
            "wasm32-unknown-unknown",
            "-p",
            "iterate-split",
            "-p",
            "iterate-components",
        ])
        .current_dir(root())
        .status()
        .expect("cargo");
    assert!(st.success());
    let (n, m) = (env_u64("WEIR_BENCH_VERTICES", 200_000), env_u64("WEIR_BENCH_EDGES", 300_000));
    let dir = tempfile::tempdir().unwrap();
    let mut s = 3u64;
    let mut text = String::new();
    for _ in 0..m {
        s = splitmix64(s);
        let u = s % n;
        s = splitmix64(s);
        text.push_str(&format!("{u} {}\n", s % n));
    }
    std::fs::write(dir.path().join("edges.txt"), text).unwrap();
    let toml = std::fs::read_to_string(root().join("examples/iterate/job.toml"))
        .unwrap()
        .replace("\"../../target/", &format!("\"{}/target/", root().display()))
        .replace("interval_ms = 200", "interval_ms = 100");
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), job::parse(&path, &toml).unwrap()).unwrap();
    let t = Instant::now();
    let summary = executor::run(&bound, &RunOptions { quiet_guests: true, ..Default::default() }).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let history: Vec<CheckpointMetrics> =
        serde_json::from_slice(&std::fs::read(dir.path().join("checkpoints/iterate/history.json")).unwrap()).unwrap();
    let head = summary.nodes.iter().find(|x| x.id.as_str() == "components").unwrap();
    println!("iterate: {n} vertices, {m} edges, p=2, checkpoint every 100 ms");
    println!(
        "{:.2} s, {} records through the loop head ({:.2} M/s), {} checkpoints, back-edge backlog peak {} batches",
        secs,
        head.records_in,
        head.records_in as f64 / secs / 1e6,
        history.len(),
        head.feedback_peak_batches
    );
    println!("\n| checkpoint | duration | max sync | max async | bytes | back-edge records logged | logged bytes |");
    println!("|---|---|---|---|---|---|---|");
    for c in &history {
        println!(
            "| {} | {:.1} ms | {:.2} ms | {:.2} ms | {} | {} | {} |",
            c.id, c.duration_ms, c.sync_ms_max, c.async_ms_max, c.bytes, c.backedge_log_records, c.backedge_log_bytes
        );
    }
}
