//! `cargo bench -p weir --bench lang`: the wordcount counter in Rust, C, JavaScript (QuickJS)
//! and Python (componentize-py), same host, same batches: records/s through the operator alone, compile time,
//! instance start (instantiate + open) and RSS per idle instance.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use weir::graph::logical::Side;
use weir::keygroup::{key_group, key_group_range};
use weir::record::Batch;
use weir::sandbox::bindings::types::TaskInfo;
use weir::sandbox::engine::new_engine;
use weir::sandbox::host::HostState;
use weir::sandbox::instance::LoadedComponent;

const MAX_P: u32 = 128;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn build() -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let st = Command::new(env!("CARGO"))
        .args(["build", "--profile", "guest", "--target", "wasm32-unknown-unknown", "-p", "wordcount-counter"])
        .current_dir(root())
        .status()
        .unwrap();
    assert!(st.success());
    let js = root().join("target/js/wordcount_counter_js.wasm");
    let st = Command::new("bash")
        .arg(root().join("guest-sdk/js/build.sh"))
        .arg(root().join("examples/wordcount/counter-js/counter.js"))
        .arg(&js)
        .status()
        .unwrap();
    assert!(st.success());
    let py = root().join("target/python/wordcount_counter_py.wasm");
    let st = Command::new("bash")
        .arg(root().join("guest-sdk/python/build.sh"))
        .arg(root().join("examples/wordcount/counter-py/app.py"))
        .arg(&py)
        .status()
        .unwrap();
    assert!(st.success());
    let c = root().join("target/c/counter_c.wasm");
    let st = Command::new("bash")
        .arg(root().join("guest-sdk/c/build.sh"))
        .arg(root().join("examples/wordcount/counter-c/counter.c"))
        .arg(&c)
        .status()
        .unwrap();
    assert!(st.success());
    (root().join("target/wasm32-unknown-unknown/guest/wordcount_counter.wasm"), c, js, py)
}

fn task() -> TaskInfo {
    let r = key_group_range(MAX_P, 1, 0);
    TaskInfo {
        job_name: "bench".into(),
        operator_uid: "count".into(),
        subtask_index: 0,
        parallelism: 1,
        max_parallelism: MAX_P,
        key_group_start: r.start,
        key_group_end: r.end,
    }
}

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    s.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4
}

fn main() {
    let (rust, c_counter, js, py) = build();
    let mut input = Vec::new();
    let mut i = 0u64;
    for _ in 0..16 {
        let mut b = Batch::default();
        for _ in 0..1024 {
            let key = format!("w{}", i % 1000);
            b.push(key_group(key.as_bytes(), MAX_P), i as i64, key.as_bytes(), key.as_bytes());
            i += 1;
        }
        input.push(b);
    }
    let engine = new_engine().unwrap();
    println!(
        "{:<12} {:>9} {:>11} {:>12} {:>12} {:>14}",
        "counter", "size", "compile", "start p50", "idle RSS", "records/s"
    );
    for (label, path, rounds) in
        [("Rust", &rust, 4000usize), ("C", &c_counter, 4000), ("JavaScript", &js, 300), ("Python", &py, 300)]
    {
        let bytes = std::fs::read(path).unwrap();
        let t = Instant::now();
        let c = LoadedComponent::from_bytes(&engine, "count", path, &bytes).unwrap();
        let compile = t.elapsed();
        let mut starts = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            let mut inst = c.instantiate(HostState::new(task(), 0)).unwrap();
            inst.open(&[]).unwrap();
            starts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        starts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let before = rss_kb();
        let mut keep = Vec::new();
        for _ in 0..100 {
            let mut inst = c.instantiate(HostState::new(task(), 0)).unwrap();
            inst.open(&[]).unwrap();
            keep.push(inst);
        }
        let idle = (rss_kb().saturating_sub(before)) as f64 / 100.0;
        drop(keep);
        let mut inst = c.instantiate(HostState::new(task(), 0)).unwrap();
        inst.open(&[]).unwrap();
        let t = Instant::now();
        for r in 0..rounds {
            inst.process(Side::Left, &input[r % input.len()]).unwrap();
            let _ = inst.take_emitted();
        }
        let rate = rounds as f64 * 1024.0 / t.elapsed().as_secs_f64();
        println!(
            "{label:<12} {:>6.0} KB {:>8.0} ms {:>9.0} us {:>8.0} KiB {:>14.0}",
            bytes.len() as f64 / 1e3,
            compile.as_secs_f64() * 1e3,
            starts[starts.len() / 2],
            idle,
            rate
        );
    }
}
