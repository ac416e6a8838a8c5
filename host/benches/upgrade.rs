//! `cargo bench -p weir --bench upgrade`: the pause of a live upgrade — how long the upgraded
//! operator's subtasks did not process records (barrier → first record after it: snapshot the
//! old instance, instantiate the new component, `open`, `restore` with migration, wait for the
//! slowest sibling) — against the size of the operator's state.
//!
//! Job: generator (K keys, 4 records per key, rate-limited so the job is still running) →
//! `test-oracle` v1 (one u64 per key in keyed state) at parallelism 2 → blackhole. Once every key
//! has state, the oracle is upgraded live to v2 (schema 2: every value migrated to a new layout)
//! and, in a second run, to v1 itself (same schema, no migration). Each on the memory backend
//! and on the disk backend (`state_backend = "disk"`, 1 MiB cache: the store moves chunk by
//! chunk into the new instance's own store). Printed: state bytes, pause (max over subtasks),
//! and the upgrade's end-to-end time as the caller saw it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::job;
use weir::operator::OperatorFactory;
use weir::runtime::executor::{self, RunOptions};
use weir::runtime::handle::JobHandle;
use weir::sandbox::engine::new_engine;
use weir::sandbox::instance::LoadedComponent;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn build_guests() -> PathBuf {
    let st = Command::new(env!("CARGO"))
        .args([
            "build",
            "--profile",
            "guest",
            "--target",
            "wasm32-unknown-unknown",
            "-p",
            "test-oracle",
            "-p",
            "test-oracle-v2",
        ])
        .current_dir(root())
        .status()
        .expect("cargo");
    assert!(st.success(), "building the oracle components failed");
    root().join("target/wasm32-unknown-unknown/guest")
}

/// Runs one job, upgrades once the state is complete; returns (state bytes, pause ms, call ms).
fn run(guests: &Path, keys: u64, to: &str, backend: &str) -> (u64, f64, f64) {
    let cache = if backend == "disk" { "state_cache_mb = 1\n" } else { "" };
    let dir = tempfile::tempdir().unwrap();
    let count = keys * 4;
    // Fill every key in ~1 s, then keep running ~3 s more.
    let rate = count / 4;
    let toml = format!(
        "[job]\nname = \"upgrade-bench\"\nmax_parallelism = 128\n[checkpoint]\ninterval_ms = 100000\ndir = \"chk\"\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = {keys}\nrate = {rate}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {:?}\nparallelism = 2\nconfig = {{ keys = \"{keys}\" }}\n\
         state_backend = \"{backend}\"\n{cache}inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"oracle\" }}]\n",
        guests.join("test_oracle.wasm").display().to_string()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let graph = job::parse(&path, &toml).unwrap();
    let (handle, endpoint) = JobHandle::new(&graph.name);
    let t = std::thread::spawn(move || {
        let engine = new_engine().unwrap();
        let bound = job::bind::bind(&engine, graph).unwrap();
        executor::run(&bound, &RunOptions { quiet_guests: true, endpoint: Some(endpoint), ..Default::default() })
            .unwrap();
    });
    while handle.status().nodes.iter().find(|n| n.uid == "oracle").is_none_or(|n| n.records_in < keys + keys / 10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let engine = new_engine().unwrap();
    let new = LoadedComponent::load(&engine, "oracle", &guests.join(to)).unwrap();
    let t0 = Instant::now();
    let info = handle.upgrade("oracle", OperatorFactory::Wasm(Arc::new(new)), Duration::from_secs(120)).unwrap();
    let call_ms = t0.elapsed().as_secs_f64() * 1e3;
    t.join().unwrap();
    (info.state_bytes, info.pause_ms_max, call_ms)
}

fn main() {
    let guests = build_guests();
    println!("live upgrade pause, test-oracle at parallelism 2 (pause = max over subtasks, barrier to resumed)");
    println!("{:>9} {:>12} {:>26} {:>8} {:>12} {:>12}", "keys", "state", "upgrade", "backend", "pause ms", "call ms");
    let sizes: Vec<u64> = std::env::var("WEIR_UPGRADE_KEYS")
        .ok()
        .map(|s| s.split(',').filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 500_000, 1_000_000]);
    let backends: Vec<String> = std::env::var("WEIR_UPGRADE_BACKENDS")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|_| vec!["memory".into(), "disk".into()]);
    for keys in sizes {
        for (to, label) in
            [("test_oracle_v2.wasm", "v1 -> v2 (migrate 1 -> 2)"), ("test_oracle.wasm", "v1 -> v1 (same schema)")]
        {
            for backend in &backends {
                let (bytes, pause, call) = run(&guests, keys, to, backend);
                println!(
                    "{keys:>9} {:>9.2} MB {label:>26} {backend:>8} {pause:>12.1} {call:>12.1}",
                    bytes as f64 / 1e6
                );
            }
        }
    }
}
