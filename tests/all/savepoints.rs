//! Savepoints, rescaling and version-safe upgrades, end to end through real components.
//!
//! The workhorse is the exactly-once oracle (`test-oracle`, and its v2 with another state
//! layout): a generator emits per-key sequence numbers, the oracle reports any gap or
//! duplicate on a side output, and the committed output must equal the golden set — every
//! (key, seq) exactly once — however the job was stopped, moved, rescaled or upgraded.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weir::checkpoint::storage::{self, CheckpointStore};
use weir::job;
use weir::operator::OperatorFactory;
use weir::runtime::error::RunError;
use weir::runtime::executor::{self, RestoreFrom, RunOptions, RunSummary};
use weir::runtime::handle::{JobHandle, JobState};
use weir::sandbox::engine::new_engine;
use weir::sandbox::instance::LoadedComponent;

use crate::support::{committed_lines, component, scratch, toml_path};

const COUNT: u64 = 24_000;
const KEYS: u64 = 48;

/// The oracle job: generator → oracle (`comp`, parallelism `p`) → file sinks (parallelism `p`).
/// The oracle job; its checkpoints are incremental, so every savepoint, rescale and upgrade
/// test also checks that forced checkpoints are full and that chains fold on recovery.
fn oracle_job(comp: &str, p: u32, rate: u64, extra_config: &str) -> String {
    format!(
        "[job]\nname = \"sp\"\nmax_parallelism = 32\nbatch_size = 64\nchannel_capacity = 4\n\
         [checkpoint]\ninterval_ms = 100\ndir = \"chk\"\nincremental = true\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {COUNT}\nkeys = {KEYS}\nrate = {rate}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nparallelism = {p}\nconfig = {{ keys = \"{KEYS}\"{extra_config} }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = {p}\ninputs = [{{ from = \"oracle\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\n\
         inputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        toml_path(&component(comp))
    )
}

fn golden() -> Vec<String> {
    let mut v: Vec<String> = (0..COUNT).map(|i| format!("{} {}", i % KEYS, i / KEYS)).collect();
    v.sort();
    v
}

/// A job running on a thread. Its sources hold back their end of input until [`Running::join`],
/// so a test's savepoint, stop or upgrade always finds it running, however busy the machine.
pub struct Running {
    pub handle: JobHandle,
    thread: Option<JoinHandle<Result<RunSummary, RunError>>>,
    hold: Arc<std::sync::atomic::AtomicBool>,
}

impl Running {
    /// Lets the input end, then waits for the job.
    pub fn join(&mut self) -> Result<RunSummary, RunError> {
        self.hold.store(false, std::sync::atomic::Ordering::Release);
        self.thread.take().expect("joined once").join().unwrap()
    }
}

/// Starts `toml` (as `dir/job.toml`) on a thread with a handle.
pub fn start(dir: &Path, toml: &str, restore: Option<PathBuf>, allow: bool) -> Running {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let graph = job::parse(&path, toml).unwrap();
    let (handle, endpoint) = JobHandle::new(&graph.name);
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let held = hold.clone();
    let thread = std::thread::spawn(move || {
        let engine = new_engine().unwrap();
        let bound = job::bind::bind(&engine, graph)?;
        let opts = RunOptions {
            quiet_guests: true,
            restore: restore.map(RestoreFrom::Path),
            allow_non_restored_state: allow,
            endpoint: Some(endpoint),
            hold_input: Some(held),
            ..Default::default()
        };
        executor::run(&bound, &opts)
    });
    Running { handle, thread: Some(thread), hold }
}

/// Waits until the job's node `uid` has received at least `n` records. The deadline only
/// catches a job that hangs: next to other tests and CPU hogs, fsyncs behind another test's
/// gigabytes of writes have stalled a healthy job here for over a minute.
pub fn wait_records(r: &Running, uid: &str, n: u64) {
    let t0 = Instant::now();
    loop {
        let st = r.handle.status();
        if st.nodes.iter().any(|x| x.uid == uid && x.records_in >= n) {
            return;
        }
        assert!(!st.state.is_terminal(), "job ended before {uid} saw {n} records: {:?}", st.state);
        assert!(t0.elapsed() < Duration::from_secs(600), "no {n} records at {uid} within 600 s: {st:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn load_factory(name: &str) -> OperatorFactory {
    let engine = new_engine().unwrap();
    OperatorFactory::Wasm(Arc::new(LoadedComponent::load(&engine, "oracle", &component(name)).unwrap()))
}

/// Stops a running oracle job with a savepoint into `dir/sp` after `after` records.
fn stop_with_savepoint(mut r: Running, after: u64, sp: &Path) -> PathBuf {
    wait_records(&r, "oracle", after);
    let info = r.handle.savepoint(Some(sp.to_path_buf()), true, Duration::from_secs(60)).unwrap();
    let summary = r.join().unwrap();
    assert_eq!(summary.stopped_with.as_ref().map(|s| s.path.clone()), Some(sp.to_path_buf()));
    assert!(matches!(r.handle.status().state, JobState::Stopped { .. }));
    info.path
}

fn assert_golden(dir: &Path) {
    let v = committed_lines(&dir.join("violations"));
    assert!(v.is_empty(), "oracle violations: {:?}", &v[..v.len().min(5)]);
    let lines = committed_lines(&dir.join("out"));
    let g = golden();
    assert_eq!(lines.len(), g.len(), "committed {} lines, expected {}", lines.len(), g.len());
    assert!(lines == g, "committed output differs from the uninterrupted run");
}

#[test]
fn savepoint_stop_then_restore_from_a_moved_directory_equals_an_uninterrupted_run() {
    let d = scratch();
    let sp = d.path().join("savepoints/stop");
    let r = start(d.path(), &oracle_job("test_oracle", 2, 20_000, ""), None, false);
    stop_with_savepoint(r, COUNT / 3, &sp);
    let before = committed_lines(&d.path().join("out")).len();
    assert!(before > 0 && (before as u64) < COUNT, "stopped mid-stream with its output committed ({before} lines)");
    // Relocatable: move the savepoint (and the checkpoints it came from away too).
    let moved = d.path().join("elsewhere/sp");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    std::fs::rename(&sp, &moved).unwrap();
    std::fs::remove_dir_all(d.path().join("chk")).unwrap();
    let m = storage::load(&moved).unwrap().manifest;
    assert_eq!(m.kind, weir::checkpoint::metadata::SnapshotKind::Savepoint);
    assert!(m.operators.iter().flat_map(|o| &o.subtasks).all(|s| s.chain.is_empty()), "savepoints are full");
    let mut r = start(d.path(), &oracle_job("test_oracle", 2, 0, ""), Some(moved), false);
    let s = r.join().unwrap();
    assert!(s.restored_from.is_some());
    assert_golden(d.path());
}

#[test]
fn savepoint_taken_while_running_restores_to_the_same_output() {
    let d = scratch();
    let sp = d.path().join("sp");
    let mut r = start(d.path(), &oracle_job("test_oracle", 2, 30_000, ""), None, false);
    wait_records(&r, "oracle", COUNT / 4);
    let info = r.handle.savepoint(Some(sp.clone()), false, Duration::from_secs(60)).unwrap();
    assert!(info.bytes > 0);
    // A second savepoint into the same (now non-empty) directory is refused, naming it.
    let e = r.handle.savepoint(Some(sp.clone()), false, Duration::from_secs(60)).unwrap_err();
    assert!(e.contains("exists and is not empty"), "{e}");
    r.join().unwrap();
    assert_golden(d.path());
    // Going back to the savepoint rolls the sink back to it and reproduces the rest.
    let mut r = start(d.path(), &oracle_job("test_oracle", 2, 0, ""), Some(sp), false);
    r.join().unwrap();
    assert_golden(d.path());
}

fn rescale(from: u32, to: u32) {
    let d = scratch();
    let sp = d.path().join("sp");
    let r = start(d.path(), &oracle_job("test_oracle", from, 20_000, ""), None, false);
    stop_with_savepoint(r, COUNT / 2, &sp);
    let mut r = start(d.path(), &oracle_job("test_oracle", to, 0, ""), Some(sp), false);
    r.join().unwrap();
    assert_golden(d.path());
    // The sink's subtasks that no longer exist had their output committed and nothing left
    // in progress.
    let leftovers: Vec<_> = std::fs::read_dir(d.path().join("out"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "in-progress files left: {leftovers:?}");
}

#[test]
fn rescale_1_to_3_equals_an_uninterrupted_run() {
    rescale(1, 3);
}

#[test]
fn rescale_4_to_2_equals_an_uninterrupted_run() {
    rescale(4, 2);
}

#[test]
fn rescale_2_to_1_equals_an_uninterrupted_run() {
    rescale(2, 1);
}

#[test]
fn upgrade_live_under_load_keeps_exactly_once_and_survives_a_process_restart() {
    let d = scratch();
    let mut r = start(d.path(), &oracle_job("test_oracle", 2, 20_000, ""), None, false);
    wait_records(&r, "oracle", COUNT / 4);
    let info = r.handle.upgrade("oracle", load_factory("test_oracle_v2"), Duration::from_secs(60)).unwrap();
    assert_eq!(info.from, "test-oracle 1.0.0 (schema 1)");
    assert_eq!(info.to, "test-oracle 2.0.0 (schema 2)");
    assert_eq!(info.migrated_from, Some(1));
    let st = r.handle.status();
    let node = st.nodes.iter().find(|n| n.uid == "oracle").unwrap();
    assert_eq!(node.component.as_deref(), Some("test-oracle 2.0.0 (schema 2)"));
    assert_eq!(st.upgrades.len(), 1);
    // Stop, as if the process went away; the job file still names v1.
    wait_records(&r, "oracle", COUNT / 2);
    r.handle.savepoint(Some(d.path().join("sp")), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let store = CheckpointStore::new(&d.path().join("chk"), "sp");
    let latest = store.latest(|_| {}).unwrap();
    let c = latest.manifest.operator("oracle").unwrap().component.clone().unwrap();
    assert_eq!((c.version.as_str(), c.schema_version), ("2.0.0", 2), "the upgrade is in the checkpoint history");
    assert!(c.stored.is_some() && c.replaces.len() == 1, "{c:?}");
    let history = std::fs::read_to_string(d.path().join("chk/sp/history.json")).unwrap();
    assert!(
        history.contains("\"upgrade\": \"oracle: test-oracle 1.0.0 (schema 1) -> test-oracle 2.0.0 (schema 2)\""),
        "the upgrade is recorded in history.json: {history}"
    );
    // Recovery from the latest checkpoint runs v2 (v1 could not even read schema 2).
    let path = d.path().join("job.toml");
    std::fs::write(&path, oracle_job("test_oracle", 2, 0, "")).unwrap();
    let graph = job::load(&path).unwrap();
    let engine = new_engine().unwrap();
    let bound = job::bind::bind(&engine, graph).unwrap();
    let opts = RunOptions { quiet_guests: true, restore: Some(RestoreFrom::Latest), ..Default::default() };
    executor::run(&bound, &opts).unwrap();
    assert_golden(d.path());
}

#[test]
fn upgrade_rolls_back_every_subtask_when_one_traps_in_restore() {
    let d = scratch();
    // Subtask 1 of v2 traps while migrating; subtask 0 would succeed.
    let toml = oracle_job("test_oracle", 2, 20_000, ", trap_in_restore = \"1\"");
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "oracle", COUNT / 4);
    let e = r.handle.upgrade("oracle", load_factory("test_oracle_v2"), Duration::from_secs(60)).unwrap_err();
    assert!(e.contains("rolled back; every subtask runs test-oracle 1.0.0 (schema 1) again"), "{e}");
    assert!(e.contains("subtask 1: guest trapped in `restore`"), "{e}");
    assert!(!e.contains("subtask 0:"), "{e}");
    let st = r.handle.status();
    let node = st.nodes.iter().find(|n| n.uid == "oracle").unwrap();
    assert_eq!(node.component.as_deref(), Some("test-oracle 1.0.0 (schema 1)"));
    r.join().unwrap();
    assert_golden(d.path());
    let store = CheckpointStore::new(&d.path().join("chk"), "sp");
    let c = store.latest(|_| {}).unwrap().manifest.operator("oracle").unwrap().component.clone().unwrap();
    assert_eq!(c.version, "1.0.0");
}

/// The wordcount pipeline with counter `counter` at parallelism `p`, from a slow file.
fn wordcount_job(counter: &str, p: u32, rate: u64) -> String {
    wordcount_job_with(&component(counter), p, rate)
}

/// The wordcount pipeline with the counter component at `counter`.
pub fn wordcount_job_with(counter: &Path, p: u32, rate: u64) -> String {
    let input = crate::support::root().join("examples/upgrade/input.txt");
    format!(
        "[job]\nname = \"wc\"\nmax_parallelism = 64\n[checkpoint]\ninterval_ms = 100\ndir = \"chk\"\n\
         [[source]]\nid = \"lines\"\ntype = \"file\"\npath = {}\nrate = {rate}\n\
         [[operator]]\nid = \"tokenize\"\ncomponent = {}\nparallelism = 2\ninputs = [{{ from = \"lines\", partition = \"rebalance\" }}]\n\
         [[operator]]\nid = \"count\"\ncomponent = {}\nparallelism = {p}\ninputs = [{{ from = \"tokenize\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = {p}\ninputs = [{{ from = \"count\" }}]\n",
        toml_path(&input),
        toml_path(&component("wordcount_tokenizer")),
        toml_path(counter),
    )
}

pub fn wordcount_expected() -> Vec<String> {
    let text = std::fs::read_to_string(crate::support::root().join("examples/upgrade/expected/counts.txt")).unwrap();
    let mut v: Vec<String> = text.lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn upgrade_offline_migrates_a_v1_savepoint_into_v2_and_refuses_v3_and_downgrades_with_exact_errors() {
    let d = scratch();
    let sp = d.path().join("sp-v1");
    // Slow sources leave most of the input for the second run however late the savepoint
    // lands on a busy machine (the input is 2 400 lines of 5 words): 300 lines in at 200
    // lines/s, ~10 s of input left; then 800 lines at 500/s of the ~2 000 left.
    let mut r = start(d.path(), &wordcount_job("wordcount_counter", 2, 200), None, false);
    wait_records(&r, "count", 1500);
    r.handle.savepoint(Some(sp.clone()), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let committed = committed_lines(&d.path().join("out"));

    // v3 migrates only from schema 1... which this savepoint is: accepted. So take a v2
    // savepoint first and check v3 against that.
    let sp2 = d.path().join("sp-v2");
    let mut r = start(d.path(), &wordcount_job("wordcount_counter_v2", 3, 500), Some(sp.clone()), false);
    wait_records(&r, "count", 4000);
    r.handle.savepoint(Some(sp2.clone()), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let m = storage::load(&sp2).unwrap().manifest;
    let c = m.operator("count").unwrap().component.clone().unwrap();
    assert_eq!((c.name.as_str(), c.version.as_str(), c.schema_version), ("wordcount-counter", "2.0.0", 2));
    assert!(committed_lines(&d.path().join("out")).len() > committed.len());

    let refused = |counter: &str| {
        let before = committed_lines(&d.path().join("out"));
        let mut r = start(d.path(), &wordcount_job(counter, 3, 0), Some(sp2.clone()), false);
        let e = r.join().unwrap_err();
        assert!(matches!(e, RunError::Incompatible { .. }), "{e}");
        assert_eq!(committed_lines(&d.path().join("out")), before, "a refused job must not touch the output");
        e.to_string()
    };
    let source = format!("savepoint {} ({})", m.checkpoint_id, sp2.display());
    assert_eq!(
        refused("wordcount_counter_v3"),
        format!(
            "job `wc` refused to start: operator `count`: {source} holds state schema 2 written by \
             `wordcount-counter 2.0.0`; `wordcount-counter 3.0.0` writes schema 3 and migrates only from [1]. \
             Upgrade through a version that migrates from schema 2 (restore into it and take a new savepoint), \
             or add 2 to its migrates-from"
        )
    );
    assert_eq!(
        refused("wordcount_counter"),
        format!(
            "job `wc` refused to start: operator `count`: {source} holds state schema 2 written by \
             `wordcount-counter 2.0.0`, but `wordcount-counter 1.0.0` writes schema 1 (migrates from no older \
             schema): it cannot read state of a newer schema. Run a version that writes or migrates from schema \
             2, or restore a savepoint taken before the upgrade to schema 2"
        )
    );
    // v2 finishes the job: every word counted exactly once across v1, the migration, the
    // rescale 2 -> 3 and v2.
    let mut r = start(d.path(), &wordcount_job("wordcount_counter_v2", 3, 0), Some(sp2), false);
    r.join().unwrap();
    assert_eq!(committed_lines(&d.path().join("out")), wordcount_expected());
}

#[test]
fn upgrade_live_refusals_leave_the_job_running() {
    let d = scratch();
    // 2 400 lines at 600/s: the job is still running when the refusals come, even on a busy
    // machine.
    let mut r = start(d.path(), &wordcount_job("wordcount_counter_v2", 2, 600), None, false);
    wait_records(&r, "count", 500);
    let engine = new_engine().unwrap();
    let v3 = LoadedComponent::load(&engine, "count", &component("wordcount_counter_v3")).unwrap();
    let e = r.handle.upgrade("count", OperatorFactory::Wasm(Arc::new(v3)), Duration::from_secs(30)).unwrap_err();
    assert_eq!(
        e,
        "operator `count`: the running job holds state schema 2 written by `wordcount-counter 2.0.0`; \
         `wordcount-counter 3.0.0` writes schema 3 and migrates only from [1]. Upgrade through a version that \
         migrates from schema 2 (restore into it and take a new savepoint), or add 2 to its migrates-from"
    );
    let tok = LoadedComponent::load(&engine, "count", &component("wordcount_tokenizer")).unwrap();
    let e = r.handle.upgrade("nope", OperatorFactory::Wasm(Arc::new(tok)), Duration::from_secs(30)).unwrap_err();
    assert!(e.contains("has no operator `nope`"), "{e}");
    r.join().unwrap();
    assert_eq!(committed_lines(&d.path().join("out")), wordcount_expected());
}

#[test]
fn savepoint_without_checkpointing_is_refused_clearly() {
    let d = scratch();
    let toml = oracle_job("test_oracle", 1, 20_000, "")
        .replace("[checkpoint]\ninterval_ms = 100\ndir = \"chk\"\nincremental = true\n", "");
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "oracle", 100);
    let e = r.handle.savepoint(None, false, Duration::from_secs(10)).unwrap_err();
    assert!(e.contains("has no [checkpoint] section"), "{e}");
    r.handle.cancel();
    let e = r.join().unwrap_err();
    assert!(matches!(e, RunError::Cancelled { .. }), "{e}");
    assert_eq!(r.handle.status().state, JobState::Cancelled);
}

#[test]
fn upgrade_example_script_runs_the_whole_story() {
    let out = crate::support::example_script("examples/upgrade/run.sh");
    assert!(out.contains("no record lost or counted twice"), "{out}");
}

#[test]
fn rescale_splits_and_unions_non_keyed_list_state_as_declared() {
    let d = scratch();
    let job = |p: u32, rate: u64| {
        format!(
            "[job]\nname = \"lists\"\nmax_parallelism = 32\nbatch_size = 64\n[checkpoint]\ninterval_ms = 100\ndir = \"chk\"\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 6000\nkeys = 10\nrate = {rate}\n\
             [[operator]]\nid = \"lists\"\ncomponent = {}\nparallelism = {p}\ninputs = [{{ from = \"gen\", partition = \"rebalance\" }}]\n\
             [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"lists\" }}]\n",
            toml_path(&component("test_lists"))
        )
    };
    let sp = d.path().join("sp");
    let mut r = start(d.path(), &job(2, 6000), None, false);
    wait_records(&r, "lists", 2000);
    r.handle.savepoint(Some(sp.clone()), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    assert!(committed_lines(&d.path().join("out")).is_empty(), "nothing is emitted before close");
    let mut r = start(d.path(), &job(3, 0), Some(sp), false);
    r.join().unwrap();
    let lines = committed_lines(&d.path().join("out"));
    let mut values: Vec<u64> =
        lines.iter().filter_map(|l| l.strip_prefix("pending ")).map(|v| v.parse().unwrap()).collect();
    values.sort();
    assert_eq!(values, (0..6000).collect::<Vec<u64>>(), "split: every element on exactly one subtask");
    let marks: Vec<&str> = lines.iter().filter_map(|l| l.strip_prefix("marks ")).collect();
    assert_eq!(marks.len(), 3);
    for m in marks {
        assert!(m.contains("0/2") && m.contains("1/2"), "union: every subtask holds every old mark: {m}");
    }
}

#[test]
fn savepoint_and_upgrade_over_the_http_api_need_the_token() {
    use weir::api::http::send;
    use weir::api::server::{Api, ServedJob};
    let d = scratch();
    let mut r = start(d.path(), &oracle_job("test_oracle", 2, 20_000, ""), None, false);
    let api = Api::new("secret".into(), new_engine().unwrap());
    api.add_job("sp", ServedJob { handle: r.handle.clone(), checkpoint_root: Some(d.path().join("chk/sp")) });
    let server = api.serve("127.0.0.1:0").unwrap();
    let addr = server.addr.to_string();
    let t = Duration::from_secs(60);
    wait_records(&r, "oracle", COUNT / 4);
    let (status, _) = send(&addr, "GET", "/v1/jobs/sp", "wrong", b"", t).unwrap();
    assert_eq!(status, 401);
    let (status, body) = send(&addr, "GET", "/v1/jobs/nope", "secret", b"", t).unwrap();
    assert_eq!((status, body.contains("no job `nope`")), (404, true), "{body}");
    let (status, body) = send(&addr, "GET", "/v1/jobs/sp", "secret", b"", t).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"state\": \"RUNNING\"") && body.contains("test-oracle 1.0.0"), "{body}");
    let sp = d.path().join("via-api");
    let req = serde_json::json!({ "dir": sp }).to_string();
    let (status, body) = send(&addr, "POST", "/v1/jobs/sp/savepoints", "secret", req.as_bytes(), t).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(storage::load(&sp).is_ok());
    let (status, body) =
        send(&addr, "POST", "/v1/jobs/sp/operators/oracle/upgrade?name=junk.wasm", "secret", b"junk", t).unwrap();
    assert_eq!(status, 400);
    assert!(body.contains("junk.wasm is not a WebAssembly component"), "{body}");
    let (status, body) = send(&addr, "GET", "/v1/jobs/sp/checkpoints", "secret", b"", t).unwrap();
    assert!(status == 200 && body.contains("\"duration_ms\""), "{body}");
    let (status, body) = send(&addr, "POST", "/v1/jobs/sp/stop", "secret", b"", t).unwrap();
    assert_eq!(status, 200, "{body}");
    let s = r.join().unwrap();
    assert!(s.stopped_with.unwrap().path.starts_with(d.path().join("chk/sp/savepoints")));
}

#[test]
fn rescale_down_then_up_keeps_the_output_of_retired_sink_subtasks() {
    // 3 -> 2 retires sink subtask 2 (its output stays committed); 2 -> 3 revives index 2,
    // which must keep that output and continue after it.
    let d = scratch();
    let (sp1, sp2) = (d.path().join("sp1"), d.path().join("sp2"));
    let r = start(d.path(), &oracle_job("test_oracle", 3, 20_000, ""), None, false);
    stop_with_savepoint(r, COUNT / 3, &sp1);
    let r = start(d.path(), &oracle_job("test_oracle", 2, 20_000, ""), Some(sp1), false);
    stop_with_savepoint(r, COUNT / 4, &sp2);
    let m = storage::load(&sp2).unwrap().manifest;
    assert_eq!(m.operator("out").unwrap().retired.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2]);
    let mut r = start(d.path(), &oracle_job("test_oracle", 3, 0, ""), Some(sp2), false);
    r.join().unwrap();
    assert_golden(d.path());
}
