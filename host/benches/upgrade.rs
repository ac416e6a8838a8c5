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
//!
//! Then the neighbour's cost: the same generator → oracle on the disk backend (incremental
//! checkpoints every 500 ms) with a small counter (`wordcount-counter`, memory) behind it, and
//! the *counter* upgraded live. Printed: the upgrade's checkpoint (its duration, and the bytes
//! the oracle wrote into it, full or a delta on its chain) next to the checkpoint before it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::checkpoint::storage::{self, CheckpointStore};
use weir::ids::CheckpointId;
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
            "-p",
            "wordcount-counter",
        ])
        .current_dir(root())
        .status()
        .expect("cargo");
    assert!(st.success(), "building the oracle components failed");
    root().join("target/wasm32-unknown-unknown/guest")
}

/// Starts the job `toml` (as `dir/job.toml`) on a thread, with a handle on it.
fn start(dir: &Path, toml: &str) -> (JobHandle, std::thread::JoinHandle<()>) {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let graph = job::parse(&path, toml).unwrap();
    let (handle, endpoint) = JobHandle::new(&graph.name);
    let t = std::thread::spawn(move || {
        let engine = new_engine().unwrap();
        let bound = job::bind::bind(&engine, graph).unwrap();
        executor::run(&bound, &RunOptions { quiet_guests: true, endpoint: Some(endpoint), ..Default::default() })
            .unwrap();
    });
    (handle, t)
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
    let (handle, t) = start(dir.path(), &toml);
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

/// One checkpoint as its manifest records it: (duration ms, bytes the oracle wrote, whether
/// the oracle's files build on a chain).
fn checkpoint(store: &CheckpointStore, id: u64) -> (f64, u64, bool) {
    let m = storage::load(&store.chk_dir(CheckpointId(id))).unwrap().manifest;
    let oracle = &m.operator("oracle").unwrap().subtasks;
    (m.metrics.duration_ms, oracle.iter().map(|s| s.bytes).sum(), oracle.iter().all(|s| !s.chain.is_empty()))
}

/// Upgrades the small counter behind a disk oracle holding `keys` keys; prints the upgrade's
/// checkpoint next to the one before it.
fn neighbour(guests: &Path, keys: u64) {
    let dir = tempfile::tempdir().unwrap();
    let count = keys * 4;
    let rate = count / 6;
    let toml = format!(
        "[job]\nname = \"upgrade-bench\"\nmax_parallelism = 128\n\
         [checkpoint]\ninterval_ms = 500\ndir = \"chk\"\nincremental = true\nretained = 1000\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = {keys}\nrate = {rate}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {:?}\nparallelism = 2\nconfig = {{ keys = \"{keys}\" }}\n\
         state_backend = \"disk\"\nstate_cache_mb = 4\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[operator]]\nid = \"count\"\ncomponent = {:?}\ninputs = [{{ from = \"oracle\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"count\" }}]\n",
        guests.join("test_oracle.wasm").display().to_string(),
        guests.join("wordcount_counter.wasm").display().to_string()
    );
    let (handle, t) = start(dir.path(), &toml);
    // Every key has state and a checkpoint holds it all.
    while handle.status().nodes.iter().find(|n| n.uid == "oracle").is_none_or(|n| n.records_in < keys * 2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let engine = new_engine().unwrap();
    let new = LoadedComponent::load(&engine, "count", &guests.join("wordcount_counter.wasm")).unwrap();
    let t0 = Instant::now();
    let info = handle.upgrade("count", OperatorFactory::Wasm(Arc::new(new)), Duration::from_secs(120)).unwrap();
    let call_ms = t0.elapsed().as_secs_f64() * 1e3;
    t.join().unwrap();
    let store = CheckpointStore::new(&dir.path().join("chk"), "upgrade-bench");
    let id = info.checkpoint_id;
    let (before_ms, before_bytes, before_delta) = checkpoint(&store, id - 1);
    let (ms, bytes, delta) = checkpoint(&store, id);
    let kind = |d: bool| if d { "delta" } else { "full" };
    println!(
        "{keys:>9} {:>12.1} {:>9.2} MB {:>6} {:>12.1} {:>9.2} MB {:>6} {call_ms:>12.1}",
        before_ms,
        before_bytes as f64 / 1e6,
        kind(before_delta),
        ms,
        bytes as f64 / 1e6,
        kind(delta)
    );
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
    println!();
    println!("upgrading a small counter behind a disk oracle (p = 2): the checkpoint before, the upgrade's");
    println!(
        "{:>9} {:>12} {:>12} {:>6} {:>12} {:>12} {:>6} {:>12}",
        "keys", "before ms", "oracle", "", "upgrade ms", "oracle", "", "call ms"
    );
    let neighbour_keys: Vec<u64> = std::env::var("WEIR_UPGRADE_NEIGHBOUR_KEYS")
        .ok()
        .map(|s| s.split(',').filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000_000]);
    for keys in neighbour_keys {
        neighbour(&guests, keys);
    }
}
