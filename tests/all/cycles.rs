//! Cyclic dataflows: validation of loops, termination, no deadlock under backpressure, the
//! iterate example's golden output, exactly-once with back-edge logging under seeded
//! failures (including failures while back-edge records are being logged), and SIGKILL +
//! `--restore latest` on a connected-components job.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::checkpoint::storage::CheckpointStore;
use weir::connectors::generator::splitmix64;
use weir::job;
use weir::runtime::executor::{self, RunOptions, RunSummary};
use weir::runtime::faults::{FaultKind, FaultPlan};
use weir::sandbox::engine::new_engine;

use crate::support::{committed_lines, component, root, run_job_in, scratch, toml_path, weir};

fn validate_err(toml: &str) -> String {
    let dir = scratch();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let out = weir().arg("validate").arg(&path).output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn loop_job(feedback: bool, extra_edge: &str) -> String {
    format!(
        "[job]\nname = \"l\"\n[[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 10\n\
         [[operator]]\nid = \"a\"\ncomponent = {c}\ninputs = [{{ from = \"gen\", partition = \"hash\" }}, {{ from = \"b\", partition = \"hash\"{fb} }}]\n\
         [[operator]]\nid = \"b\"\ncomponent = {c}\ninputs = [{{ from = \"a\", partition = \"hash\" }}{extra_edge}]\n\
         [[sink]]\nid = \"o\"\ntype = \"blackhole\"\ninputs = [{{ from = \"b\" }}]\n",
        c = toml_path(&component("wordcount_counter")),
        fb = if feedback { ", feedback = true" } else { "" }
    )
}

#[test]
fn cycle_without_a_feedback_edge_is_refused_naming_the_loop() {
    let e = validate_err(&loop_job(false, ""));
    assert!(e.contains("job.toml:"), "{e}");
    assert!(e.contains("a -> b -> a") || e.contains("b -> a -> b"), "{e}");
    assert!(e.contains("feedback = true"), "{e}");
}

#[test]
fn cycle_feedback_edge_that_closes_no_loop_is_refused() {
    let job = loop_job(true, "").replace(
        "{ from = \"gen\", partition = \"hash\" }, { from = \"b\", partition = \"hash\", feedback = true }",
        "{ from = \"gen\", partition = \"hash\", feedback = true }",
    );
    let e = validate_err(&job);
    assert!(e.contains("marked feedback but closes no loop"), "{e}");
}

#[test]
fn cycle_with_a_feedback_edge_validates_and_a_self_loop_needs_the_mark() {
    let dir = scratch();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, loop_job(true, "")).unwrap();
    let out = weir().arg("validate").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let self_loop = loop_job(true, ", { from = \"b\", partition = \"hash\" }");
    assert!(validate_err(&self_loop).contains("self-loop must be marked `feedback = true`"));
}

#[test]
fn cycle_iterate_example_writes_expected_output() {
    crate::support::guests();
    let src = root().join("examples/iterate");
    let dir = scratch();
    std::fs::copy(src.join("edges.txt"), dir.path().join("edges.txt")).unwrap();
    let job = std::fs::read_to_string(src.join("job.toml")).unwrap();
    let job = job.replace("\"../../target/", &format!("\"{}/target/", root().display()));
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    let out = weir().args(["run", "--progress", "0"]).arg(dir.path().join("job.toml")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(committed_lines(&dir.path().join("out")), committed_lines(&src.join("expected")));
}

pub(crate) fn oracle_job(hops: u32, capacity: u32, count: u64) -> String {
    format!(
        "[job]\nname = \"loop-eo\"\nmax_parallelism = 16\nbatch_size = 64\nchannel_capacity = {capacity}\n\
         [checkpoint]\ninterval_ms = 15\ndir = \"chk\"\nretained = 2\n\
         [restart]\nstrategy = \"fixed-delay\"\nattempts = 10\ndelay_ms = 5\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = 32\nparallelism = 2\nrate = 20000\n\
         [[operator]]\nid = \"loop\"\ncomponent = {}\nparallelism = 2\nconfig = {{ keys = \"32\", hops = \"{hops}\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}, {{ from = \"loop\", partition = \"hash\", feedback = true }}]\n\
         [[sink]]\nid = \"done\"\ntype = \"file\"\npath = \"done\"\nparallelism = 2\ninputs = [{{ from = \"loop\", output = \"done\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\ninputs = [{{ from = \"loop\", output = \"violations\" }}]\n",
        toml_path(&component("test_loop_oracle"))
    )
}

struct Outcome {
    done: Vec<String>,
    violations: Vec<String>,
    state: BTreeMap<Vec<u8>, Vec<u8>>,
    summary: RunSummary,
    checkpoint_log_records: u64,
}

fn run_oracle(dir: &Path, toml: &str, faults: Option<Arc<FaultPlan>>) -> Outcome {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), job::parse(&path, toml).unwrap()).unwrap();
    let summary = executor::run(&bound, &RunOptions { quiet_guests: true, faults, ..Default::default() })
        .unwrap_or_else(|e| panic!("run failed: {e}"));
    let store = CheckpointStore::new(&dir.join("chk"), "loop-eo");
    let last = store.latest(|e| panic!("{e}")).unwrap().materialize().unwrap();
    assert!(last.manifest.finished);
    let mut state = BTreeMap::new();
    for ((uid, _), st) in &last.states {
        if uid == "loop" {
            for kg in &st.keyed {
                // One value state: u32 1, name, u32 n, entries (klen key vlen value).
                let d = &kg.data;
                let rd = |p: usize| u32::from_le_bytes(d[p..p + 4].try_into().unwrap()) as usize;
                let mut p = 8 + rd(4);
                let n = rd(p);
                p += 4;
                for _ in 0..n {
                    let k = rd(p);
                    let key = d[p + 4..p + 4 + k].to_vec();
                    p += 4 + k;
                    let v = rd(p);
                    state.insert(key, d[p + 4..p + 4 + v].to_vec());
                    p += 4 + v;
                }
            }
        }
    }
    // Back-edge records logged across the checkpoints still on disk.
    let checkpoint_log_records = store
        .list()
        .iter()
        .filter_map(|l| weir::checkpoint::storage::load(&l.path).ok())
        .flat_map(|c| c.states.into_values())
        .flat_map(|s| s.backedge_log)
        .map(|b| b.records as u64)
        .sum();
    Outcome {
        done: committed_lines(&dir.join("done")),
        violations: committed_lines(&dir.join("violations")),
        state,
        summary,
        checkpoint_log_records,
    }
}

fn golden(count: u64) -> Vec<String> {
    let mut v: Vec<String> = (0..count).map(|i| format!("{} {}", i % 32, i / 32)).collect();
    v.sort();
    v
}

#[test]
fn cycle_exactly_once_with_back_edge_logging_under_seeded_failures() {
    // A `WhileLogging` fault fires on a back-edge record logged after its conditions are met,
    // or, once the sources hold their input for it, when the loop head's next log opens. At
    // 8 000 records/s per source subtask the data phase lasts at least 0.75 s, some fifty
    // checkpoint intervals, so most fire on a logged record.
    let toml = oracle_job(3, 4, 12_000).replace("rate = 20000\n", "rate = 8000\n");
    check_loop_exactly_once(&toml, 12_000);
}

/// The loop oracle `toml` (of `count` records) failure-free, then under seeded failures
/// (guest traps, host panics, failures during a checkpoint and while records in flight are
/// being logged): no violation, and output and final state equal the failure-free run's.
pub(crate) fn check_loop_exactly_once(toml: &str, count: u64) {
    let toml = toml.to_string();
    let base_dir = scratch();
    let base = run_oracle(base_dir.path(), &toml, None);
    assert!(base.violations.is_empty(), "{:?}", base.violations);
    assert_eq!(base.done, golden(count));
    assert!(base.summary.checkpoints >= 3, "{}", base.summary.checkpoints);
    // Counted over every snapshot of the runs (the retained checkpoints alone may all have
    // been taken after the loop drained).
    let mut logged_any = logged_by_the_head(&base.summary);

    let seeds = std::env::var("WEIR_CYCLE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20u64);
    let kinds = [FaultKind::GuestTrap, FaultKind::HostPanic, FaultKind::DuringCheckpoint, FaultKind::WhileLogging];
    let mut while_logging = 0;
    for seed in 0..seeds {
        let failures = 1 + (seed % 2) as u32;
        let plan = Arc::new(FaultPlan::seeded(seed ^ 0xc1c1e, failures, &[("loop", 2)], 2000, 1, &kinds));
        while_logging += plan.faults().iter().filter(|f| f.kind == FaultKind::WhileLogging).count();
        let dir = scratch();
        let got = run_oracle(dir.path(), &toml, Some(plan.clone()));
        let ctx = format!("seed {seed}, faults {:?}", plan.faults());
        let unfired: Vec<_> = (0..=failures).flat_map(|a| plan.unfired(a)).collect();
        assert_eq!(got.summary.attempts, failures + 1, "every planned failure must fire: {ctx}, unfired {unfired:?}");
        assert!(got.violations.is_empty(), "violations {:?} ({ctx})", &got.violations[..got.violations.len().min(5)]);
        if got.done != base.done {
            let (a, b): (std::collections::BTreeSet<_>, std::collections::BTreeSet<_>) =
                (base.done.iter().collect(), got.done.iter().collect());
            let missing: Vec<_> = a.difference(&b).take(5).collect();
            let extra: Vec<_> = b.difference(&a).take(5).collect();
            panic!(
                "loop output differs from the failure-free run: {} lines vs {}, missing {missing:?}, extra {extra:?}, duplicates {} ({ctx})",
                got.done.len(),
                base.done.len(),
                got.done.len() - b.len()
            );
        }
        assert!(got.state == base.state, "final state differs from the failure-free run ({ctx})");
        logged_any += got.checkpoint_log_records + logged_by_the_head(&got.summary);
    }
    assert!(while_logging >= 3, "the seeds must include failures while logging back-edge records");
    assert!(logged_any > 0, "checkpoints must have logged records in transit on the back-edge");
}

/// Back-edge records the loop head logged into its snapshots (in the run's last attempt),
/// aligned or not.
fn logged_by_the_head(s: &RunSummary) -> u64 {
    s.nodes.iter().filter(|n| n.id.as_str() == "loop").map(|n| n.backedge_logged + n.inflight_logged).sum()
}

#[test]
fn cycle_backpressure_does_not_deadlock_and_the_backlog_is_reported() {
    // Capacity 1 and 40 hops per record: with a blocking back-edge this loop would deadlock.
    let toml = oracle_job(40, 1, 4000).replace("rate = 20000\n", "");
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = scratch();
    let d = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(run_oracle(&d, &toml, None));
    });
    let got = rx.recv_timeout(Duration::from_secs(120)).expect("the loop deadlocked (no result within 120 s)");
    assert_eq!(got.done, golden(4000));
    let head = got.summary.nodes.iter().find(|n| n.id.as_str() == "loop").unwrap();
    assert!(head.feedback_peak_batches >= 1, "the back-edge backlog is measured: {}", head.feedback_peak_batches);
    assert_eq!(head.records_in, 4000 * 42, "every record: once fresh, then 41 passes round the loop (hops 40..=0)");
}

/// A larger graph for the kill test: `n` vertices, `m` edges.
fn write_graph(path: &Path, n: u64, m: usize, seed: u64) -> Vec<String> {
    let mut s = seed;
    let mut edges = Vec::new();
    let mut parent: BTreeMap<u64, u64> = BTreeMap::new();
    fn find(p: &mut BTreeMap<u64, u64>, x: u64) -> u64 {
        let mut x = x;
        while let Some(&q) = p.get(&x) {
            if q == x {
                break;
            }
            x = q;
        }
        x
    }
    for _ in 0..m {
        s = splitmix64(s);
        let u = s % n;
        s = splitmix64(s);
        let v = s % n;
        if u == v {
            continue;
        }
        edges.push(format!("{u} {v}\n"));
        parent.entry(u).or_insert(u);
        parent.entry(v).or_insert(v);
        let (a, b) = (find(&mut parent, u), find(&mut parent, v));
        if a != b {
            parent.insert(a.max(b), a.min(b));
        }
    }
    std::fs::write(path, edges.concat()).unwrap();
    let verts: Vec<u64> = parent.keys().copied().collect();
    let mut out: Vec<String> = verts.iter().map(|&x| format!("{x} {}", find(&mut parent, x))).collect();
    out.sort();
    out
}

#[test]
fn cycle_sigkill_then_restore_latest_equals_the_failure_free_output() {
    crate::support::guests();
    let dir = scratch();
    let expected = write_graph(&dir.path().join("edges.txt"), 3000, 4000, 5);
    let job = std::fs::read_to_string(root().join("examples/iterate/job.toml"))
        .unwrap()
        .replace("\"../../target/", &format!("\"{}/target/", root().display()))
        .replace("interval_ms = 200", "interval_ms = 50")
        // 3 000 edges at 800/s: ~4 s of input, so two checkpoints complete and the kill lands
        // before the job ends however busy the machine is (at 4 000/s it ended first next to
        // a CPU hog).
        .replace("path = \"edges.txt\"", "path = \"edges.txt\"\nrate = 800");
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &job).unwrap();
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "iterate");
    let mut child = weir()
        .args(["run", "--progress", "0", "--quiet-guests"])
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.list().iter().filter(|l| l.status.is_ok()).count() < 2 {
        assert!(child.try_wait().unwrap().is_none(), "the job ended before it could be killed");
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(splitmix64(expected.len() as u64) % 100));
    assert!(child.try_wait().unwrap().is_none(), "the job ended before it could be killed");
    child.kill().unwrap();
    child.wait().unwrap();
    let out =
        weir().args(["run", "--progress", "0", "--quiet-guests", "--restore", "latest"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(committed_lines(&dir.path().join("out")) == expected, "labels after SIGKILL + restore differ");
    // And the same job without failures gives the same (failure-free) output.
    let clean = scratch();
    std::fs::copy(dir.path().join("edges.txt"), clean.path().join("edges.txt")).unwrap();
    run_job_in(clean.path(), &job.replace("rate = 800", "")).unwrap();
    assert!(committed_lines(&clean.path().join("out")) == expected);
}
