//! `cargo bench -p weir --bench sandbox`: what the sandbox costs and how well it isolates.
//!
//! 1. CPU-limit cost: the wordcount counter alone (batches of 1024 records through the
//!    component), on an engine with epoch interruption vs one without, interleaved rounds.
//! 2. Instance start: `instantiate` + `open` of the counter, pooling allocator vs on-demand.
//! 3. Memory per idle instance: RSS growth over 500 opened, idle counter instances.
//! 4. Fairness: a normal keyed-count job (checkpoint every 100 ms) alone, then next to a
//!    hostile job (another tenant) whose guest spins until its CPU deadline, restarting with
//!    the default backoff: throughput and checkpoint duration ratios.
//! 5. CPU shares between tenants: the same job alone, then next to a tenant whose 8 threads
//!    burn CPU below every call limit, with each tenant's threads in a CPU cgroup of equal
//!    weight (`runtime/cpu_shares.rs`) and without: the victim's throughput ratios.
//!    (`WEIR_SANDBOX_ONLY=5` runs this part alone.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::checkpoint::metadata::CheckpointMetrics;
use weir::graph::logical::Side;
use weir::job;
use weir::keygroup::{key_group, key_group_range};
use weir::record::Batch;
use weir::runtime::executor::{self, RunOptions};
use weir::sandbox::bindings::types::TaskInfo;
use weir::sandbox::engine::{EngineOptions, engine_with};
use weir::sandbox::host::HostState;
use weir::sandbox::instance::LoadedComponent;

const MAX_P: u32 = 128;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn build_guests() -> PathBuf {
    let st = Command::new(env!("CARGO"))
        .args(["build", "--profile", "guest", "--target", "wasm32-unknown-unknown"])
        .args(["-p", "wordcount-counter", "-p", "test-hostile"])
        .current_dir(root())
        .status()
        .expect("cargo");
    assert!(st.success(), "building the components failed");
    root().join("target/wasm32-unknown-unknown/guest")
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

fn batches() -> Vec<Batch> {
    let mut out = Vec::new();
    let mut i = 0u64;
    for _ in 0..64 {
        let mut b = Batch::default();
        for _ in 0..1024 {
            let key = (i % 10_000).to_string();
            b.push(key_group(key.as_bytes(), MAX_P), i as i64, key.as_bytes(), i.to_string().as_bytes());
            i += 1;
        }
        out.push(b);
    }
    out
}

fn operator_rate(c: &LoadedComponent, input: &[Batch], rounds: usize) -> f64 {
    let mut inst = c.instantiate(HostState::new(task(), 0)).unwrap();
    inst.open(&[]).unwrap();
    let t = Instant::now();
    for i in 0..rounds {
        inst.process(Side::Left, &input[i % input.len()]).unwrap();
        let _ = inst.take_emitted();
    }
    rounds as f64 * 1024.0 / t.elapsed().as_secs_f64()
}

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Runs the keyed-count job; returns (records/s, mean checkpoint duration ms, max).
fn normal_job(engine: &wasmtime::Engine, guests: &Path, n: u64) -> (f64, f64, f64) {
    normal_job_in(engine, guests, n, None, None)
}

/// The keyed-count job with its threads in `group`.
fn normal_job_in(
    engine: &wasmtime::Engine,
    guests: &Path,
    n: u64,
    group: Option<Arc<weir::runtime::cpu_shares::CpuGroup>>,
    rate: Option<u64>,
) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[job]\nname = \"normal\"\nmax_parallelism = {MAX_P}\n[checkpoint]\ninterval_ms = 100\ndir = \"chk\"\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {n}\nkeys = 10000\n{}\
         [[operator]]\nid = \"count\"\ncomponent = {:?}\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"count\" }}]\n",
        rate.map(|r| format!("rate = {r}\n")).unwrap_or_default(),
        guests.join("wordcount_counter.wasm").display().to_string()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let bound = job::bind::bind(engine, job::parse(&path, &toml).unwrap()).unwrap();
    let t = Instant::now();
    executor::run(&bound, &RunOptions { quiet_guests: true, cpu_group: group, ..Default::default() }).unwrap();
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let h: Vec<CheckpointMetrics> =
        serde_json::from_slice(&std::fs::read(dir.path().join("chk/normal/history.json")).unwrap()).unwrap();
    let d: Vec<f64> = h.iter().map(|m| m.duration_ms).collect();
    (rate, d.iter().sum::<f64>() / d.len().max(1) as f64, d.iter().cloned().fold(0.0, f64::max))
}

/// Starts the spinning tenant; it ends when `stop` is set (cancel) or its restarts run out.
fn hostile_job(
    engine: Arc<wasmtime::Engine>,
    guests: &Path,
) -> (weir::runtime::handle::JobHandle, std::thread::JoinHandle<()>) {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[job]\nname = \"spinner\"\n[limits]\ncall_timeout_ms = 200\n\
         [restart]\nstrategy = \"exponential-backoff\"\nattempts = 1000\ndelay_ms = 100\nmax_delay_ms = 400\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000000000\nkeys = 8\nrate = 1000\n\
         [[operator]]\nid = \"spin\"\ncomponent = {:?}\nconfig = {{ mode = \"spin\" }}\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"spin\" }}]\n",
        guests.join("test_hostile.wasm").display().to_string()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let graph = job::parse(&path, &toml).unwrap();
    let (handle, endpoint) = weir::runtime::handle::JobHandle::new("spinner");
    let t = std::thread::spawn(move || {
        let _dir = dir;
        let bound = job::bind::bind(&engine, graph).unwrap();
        let _ =
            executor::run(&bound, &RunOptions { quiet_guests: true, endpoint: Some(endpoint), ..Default::default() });
    });
    (handle, t)
}

/// Starts a tenant whose 8 operator threads burn CPU below every limit, in `group`.
fn burning_job(
    engine: Arc<wasmtime::Engine>,
    guests: &Path,
    group: Option<Arc<weir::runtime::cpu_shares::CpuGroup>>,
) -> (weir::runtime::handle::JobHandle, std::thread::JoinHandle<()>) {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[job]\nname = \"burner\"\nmax_parallelism = 16\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000000000000\nkeys = 64\n\
         [[operator]]\nid = \"burn\"\ncomponent = {:?}\nparallelism = 8\nconfig = {{ mode = \"burn\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"burn\" }}]\n",
        guests.join("test_hostile.wasm").display().to_string()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let graph = job::parse(&path, &toml).unwrap();
    let (handle, endpoint) = weir::runtime::handle::JobHandle::new("burner");
    let t = std::thread::spawn(move || {
        let _dir = dir;
        let bound = job::bind::bind(&engine, graph).unwrap();
        let opts = RunOptions { quiet_guests: true, endpoint: Some(endpoint), cpu_group: group, ..Default::default() };
        let _ = executor::run(&bound, &opts);
    });
    (handle, t)
}

/// Part 5: the victim's throughput alone and next to a burning tenant, with and without
/// shares, for each way of keeping shares the host offers.
fn cpu_shares(guests: &Path) {
    use weir::runtime::cpu_shares::{CpuShares, Fairness};
    let n = std::env::var("WEIR_SANDBOX_N").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000_000u64);
    let engine = Arc::new(engine_with(EngineOptions::default()).unwrap());
    let mechanisms = [
        ("cgroup", CpuShares::cgroup(Path::new("/sys/fs/cgroup/cpu"))),
        ("priorities", CpuShares::choose(Fairness::Priorities, Path::new(""), &[100, 100])),
    ];
    for (name, shares) in mechanisms {
        let shares = match shares {
            Ok(s) => s,
            Err(why) => {
                println!("5. CPU shares by {name}: not measured ({why})");
                continue;
            }
        };
        let group = |tenant: &str| Some(Arc::new(shares.group(tenant, 100, None).unwrap()));
        println!(
            "5. CPU shares by {name}: keyed count next to a tenant burning 8 threads, equal weights, median of 3 rounds"
        );
        // Unthrottled (the job alone wants more than half the cores), then at 4 M records/s (it
        // needs less than its half).
        for (label, rate, n) in [("unthrottled", None, n), ("4 M/s      ", Some(4_000_000), n / 2)] {
            let (mut alone, mut shared, mut unshared) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..3 {
                alone.push(normal_job_in(&engine, guests, n, group("victim"), rate).0);
                for (with, out) in [(true, &mut shared), (false, &mut unshared)] {
                    let (h, t) = burning_job(engine.clone(), guests, if with { group("attacker") } else { None });
                    std::thread::sleep(Duration::from_millis(500));
                    out.push(normal_job_in(&engine, guests, n, if with { group("victim") } else { None }, rate).0);
                    h.cancel();
                    t.join().unwrap();
                }
            }
            let (a, s, u) = (median(alone), median(shared), median(unshared));
            println!(
                "   {label}  alone {:>6.2} M/s | next to it: shares {:>6.2} M/s ({:.3}) | no shares {:>6.2} M/s ({:.3})",
                a / 1e6,
                s / 1e6,
                s / a,
                u / 1e6,
                u / a
            );
        }
    }
}

fn main() {
    let guests = build_guests();
    if std::env::var("WEIR_SANDBOX_ONLY").as_deref() == Ok("5") {
        cpu_shares(&guests);
        return;
    }
    let counter = std::fs::read(guests.join("wordcount_counter.wasm")).unwrap();
    let input = batches();
    let rounds = std::env::var("WEIR_SANDBOX_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000usize);

    // 1. CPU-limit cost.
    let opts = |epoch, pooling| EngineOptions { epoch_interruption: epoch, pooling };
    let with =
        LoadedComponent::from_bytes(&engine_with(opts(true, true)).unwrap(), "c", Path::new("c"), &counter).unwrap();
    let without =
        LoadedComponent::from_bytes(&engine_with(opts(false, true)).unwrap(), "c", Path::new("c"), &counter).unwrap();
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        on.push(operator_rate(&with, &input, rounds));
        off.push(operator_rate(&without, &input, rounds));
    }
    let (on, off) = (median(on), median(off));
    println!("1. CPU limit (epoch interruption) cost, counter alone, median of 5 interleaved rounds");
    println!("   epoch on  {:>7.2} M records/s", on / 1e6);
    println!("   epoch off {:>7.2} M records/s   on/off = {:.3}", off / 1e6, on / off);

    // 2. Instance start.
    println!("2. instance start (instantiate + open), 2000 instances each");
    for (label, pooling) in [("pooling  ", true), ("on-demand", false)] {
        let c = LoadedComponent::from_bytes(&engine_with(opts(true, pooling)).unwrap(), "c", Path::new("c"), &counter)
            .unwrap();
        let mut times = Vec::new();
        for _ in 0..2000 {
            let t = Instant::now();
            let mut i = c.instantiate(HostState::new(task(), 0)).unwrap();
            i.open(&[]).unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e6);
            drop(i);
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("   {label} p50 {:>6.1} us  p99 {:>6.1} us", times[times.len() / 2], times[times.len() * 99 / 100]);
    }

    // 3. Memory per idle instance.
    let c =
        LoadedComponent::from_bytes(&engine_with(opts(true, true)).unwrap(), "c", Path::new("c"), &counter).unwrap();
    let before = rss_kb();
    let mut keep = Vec::new();
    for _ in 0..500 {
        let mut i = c.instantiate(HostState::new(task(), 0)).unwrap();
        i.open(&[]).unwrap();
        i.process(Side::Left, &input[0]).unwrap();
        let _ = i.take_emitted();
        keep.push(i);
    }
    let per = (rss_kb() - before) as f64 / 500.0;
    println!("3. memory per idle counter instance (opened, 1024 keys of state): {per:.0} KiB RSS");
    drop(keep);

    // 4. Fairness.
    let n = std::env::var("WEIR_SANDBOX_N").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000_000u64);
    let engine = Arc::new(engine_with(EngineOptions::default()).unwrap());
    let mut alone = Vec::new();
    let mut next_to = Vec::new();
    for _ in 0..3 {
        alone.push(normal_job(&engine, &guests, n));
        let (h, t) = hostile_job(engine.clone(), &guests);
        std::thread::sleep(Duration::from_millis(300));
        next_to.push(normal_job(&engine, &guests, n));
        h.cancel();
        t.join().unwrap();
    }
    let pick = |v: &[(f64, f64, f64)], f: fn(&(f64, f64, f64)) -> f64| median(v.iter().map(f).collect());
    let (ra, rn) = (pick(&alone, |x| x.0), pick(&next_to, |x| x.0));
    let (ca, cn) = (pick(&alone, |x| x.1), pick(&next_to, |x| x.1));
    let (ma, mn) = (pick(&alone, |x| x.2), pick(&next_to, |x| x.2));
    println!("4. fairness: keyed count (N = {n}, checkpoint every 100 ms), median of 3 rounds");
    println!("   alone          {:>6.2} M records/s  checkpoint mean {ca:>6.1} ms  max {ma:>6.1} ms", ra / 1e6);
    println!("   next to spin   {:>6.2} M records/s  checkpoint mean {cn:>6.1} ms  max {mn:>6.1} ms", rn / 1e6);
    println!("   throughput ratio {:.3}, checkpoint duration ratio {:.2}", rn / ra, cn / ca);

    cpu_shares(&guests);
}
