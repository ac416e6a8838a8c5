//! The examples run through the real `weir` binary and real components, and variations of
//! them through the library: parallelism, union, broadcast, rebalance, forward.

use std::collections::BTreeMap;
use std::path::Path;

use crate::support::{committed_lines, component, guests, root, run_job_in, scratch, toml_path, weir};

fn expected(example: &str) -> Vec<String> {
    committed_lines(&root().join("examples").join(example).join("expected"))
}

/// Copies an example (job, inputs, expected) into a scratch dir with component paths made
/// absolute, so tests never write into the source tree and can run concurrently.
fn copy_example(example: &str) -> tempfile::TempDir {
    guests();
    let src = root().join("examples").join(example);
    let dir = scratch();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        }
    }
    let job = std::fs::read_to_string(src.join("job.toml")).unwrap();
    let job = job.replace("\"../../target/", &format!("\"{}/target/", root().display()));
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    dir
}

fn run_binary(job: &Path) -> std::process::Output {
    let out = weir().args(["run", "--progress", "0"]).arg(job).output().unwrap();
    assert!(out.status.success(), "weir run failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn wordcount_example_writes_expected_output() {
    let dir = copy_example("wordcount");
    let out = run_binary(&dir.path().join("job.toml"));
    assert_eq!(committed_lines(&dir.path().join("out")), expected("wordcount"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("count") && stderr.contains("finished"), "{stderr}");
    // Only committed files are visible: no in-progress file is left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("part-")), "{names:?}");
}

#[test]
fn enrich_example_writes_expected_output() {
    let dir = copy_example("enrich");
    run_binary(&dir.path().join("job.toml"));
    for sub in ["enriched", "invalid"] {
        assert_eq!(
            committed_lines(&dir.path().join("out").join(sub)),
            committed_lines(&root().join("examples/enrich/expected").join(sub)),
            "{sub}"
        );
    }
    assert_eq!(committed_lines(&dir.path().join("out")), expected("enrich"));
}

fn wordcount_job(input: &Path, extra_sources: usize, tok_p: u32, tok_part: &str, count_p: u32, sink_p: u32) -> String {
    let mut s = String::from("[job]\nname = \"wc\"\nmax_parallelism = 64\n");
    let mut froms = Vec::new();
    for i in 0..=extra_sources {
        s += &format!("[[source]]\nid = \"lines{i}\"\ntype = \"file\"\npath = {}\n", toml_path(input));
        froms.push(format!("{{ from = \"lines{i}\", partition = \"{tok_part}\" }}"));
    }
    s += &format!(
        "[[operator]]\nid = \"tokenize\"\ncomponent = {}\nparallelism = {tok_p}\ninputs = [{}]\n",
        toml_path(&component("wordcount_tokenizer")),
        froms.join(", ")
    );
    s += &format!(
        "[[operator]]\nid = \"count\"\ncomponent = {}\nparallelism = {count_p}\ninputs = [{{ from = \"tokenize\", partition = \"hash\" }}]\n",
        toml_path(&component("wordcount_counter"))
    );
    s += &format!(
        "[[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = {sink_p}\ninputs = [{{ from = \"count\", partition = \"rebalance\" }}]\n"
    );
    s
}

/// Expected wordcount lines when every word occurs `factor` times as often.
fn scaled_expected(factor: u64) -> Vec<String> {
    let mut max: BTreeMap<String, u64> = BTreeMap::new();
    for l in expected("wordcount") {
        let (w, n) = l.rsplit_once(' ').unwrap();
        let e = max.entry(w.to_string()).or_default();
        *e = (*e).max(n.parse().unwrap());
    }
    let mut out: Vec<String> =
        max.iter().flat_map(|(w, n)| (1..=n * factor).map(move |i| format!("{w} {i}"))).collect();
    out.sort();
    out
}

#[test]
fn wordcount_output_is_the_same_at_every_parallelism() {
    let input = root().join("examples/wordcount/input.txt");
    for (tok_p, count_p, sink_p) in [(1, 1, 1), (3, 4, 2), (2, 7, 3)] {
        let dir = scratch();
        run_job_in(dir.path(), &wordcount_job(&input, 0, tok_p, "rebalance", count_p, sink_p)).unwrap();
        assert_eq!(committed_lines(&dir.path().join("out")), expected("wordcount"), "p = {tok_p}/{count_p}/{sink_p}");
    }
}

#[test]
fn union_of_several_sources_feeds_one_input() {
    let input = root().join("examples/wordcount/input.txt");
    let dir = scratch();
    run_job_in(dir.path(), &wordcount_job(&input, 2, 2, "rebalance", 2, 1)).unwrap();
    assert_eq!(committed_lines(&dir.path().join("out")), scaled_expected(3));
}

#[test]
fn broadcast_sends_every_record_to_every_subtask() {
    let input = root().join("examples/wordcount/input.txt");
    let dir = scratch();
    let summary = run_job_in(dir.path(), &wordcount_job(&input, 0, 3, "broadcast", 2, 2)).unwrap();
    assert_eq!(committed_lines(&dir.path().join("out")), scaled_expected(3));
    let tok = summary.nodes.iter().find(|n| n.id.as_str() == "tokenize").unwrap();
    let src = summary.nodes.iter().find(|n| n.id.as_str() == "lines0").unwrap();
    assert_eq!(tok.records_in, 3 * src.records_out);
}

#[test]
fn hash_partitioning_spreads_a_generator_over_subtasks_without_loss() {
    let dir = scratch();
    let job = format!(
        r#"
[job]
name = "gen"
max_parallelism = 32
batch_size = 100
channel_capacity = 2
[[source]]
id = "gen"
type = "generator"
count = 50000
keys = 500
parallelism = 2
[[operator]]
id = "count"
component = {}
parallelism = 3
inputs = [{{ from = "gen", partition = "hash" }}]
[[sink]]
id = "out"
type = "file"
path = "out"
format = "key_value"
parallelism = 3
inputs = [{{ from = "count" }}]
"#,
        toml_path(&component("wordcount_counter"))
    );
    let summary = run_job_in(dir.path(), &job).unwrap();
    assert_eq!(summary.nodes[1].records_in, 50_000);
    // key k occurs 100 times: lines "k k 1" .. "k k 100", each exactly once.
    let lines = committed_lines(&dir.path().join("out"));
    assert_eq!(lines.len(), 50_000);
    let mut want: Vec<String> = (0..500).flat_map(|k| (1..=100).map(move |i| format!("{k} {k} {i}"))).collect();
    want.sort();
    assert_eq!(lines, want);
}

#[test]
fn end_of_stream_fires_event_timers_then_closes_operators() {
    let dir = scratch();
    std::fs::write(dir.path().join("in.csv"), "a,timer:5\nb,timer:7\na,count\n").unwrap();
    let job = format!(
        r#"
[job]
name = "timers"
[[source]]
id = "in"
type = "file"
path = "in.csv"
key_column = 0
[[operator]]
id = "probe"
component = {}
inputs = [{{ from = "in", partition = "hash" }}]
[[sink]]
id = "events"
type = "file"
path = "events"
inputs = [{{ from = "probe", output = "events" }}]
[[sink]]
id = "main"
type = "file"
path = "main"
inputs = [{{ from = "probe" }}]
"#,
        toml_path(&component("test_probe"))
    );
    run_job_in(dir.path(), &job).unwrap();
    let events = std::fs::read_to_string(dir.path().join("events/part-0-0")).unwrap();
    assert_eq!(
        events, "timer event a@5\ntimer event b@7\nwatermark 9223372036854775807\nclosed after 3\n",
        "end of stream is watermark +inf: timers fire in time order, then on-watermark, then close"
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("main/part-0-0")).unwrap(), "a=1\n");
}

#[test]
fn native_benchmark_counter_matches_the_component_byte_for_byte() {
    // `native:keyed-count` exists only to measure the engine without the WASM boundary; it
    // must be the same operator, or the comparison means nothing.
    let job = |component: &str| {
        format!(
            "[job]\nname = \"n\"\nmax_parallelism = 32\n[[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 20000\nkeys = 300\n\
             [[operator]]\nid = \"count\"\ncomponent = {component}\nparallelism = 3\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
             [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nformat = \"key_value\"\ninputs = [{{ from = \"count\" }}]\n"
        )
    };
    let (a, b) = (scratch(), scratch());
    run_job_in(a.path(), &job(&toml_path(&component("wordcount_counter")))).unwrap();
    run_job_in(b.path(), &job("\"native:keyed-count\"")).unwrap();
    let (wasm, native) = (committed_lines(&a.path().join("out")), committed_lines(&b.path().join("out")));
    assert_eq!(wasm.len(), 20_000);
    assert_eq!(wasm, native);
}

#[test]
fn native_benchmark_counter_restores_the_components_snapshot() {
    use weir::graph::logical::Side;
    use weir::keygroup::key_group;
    use weir::operator::OperatorLogic;
    use weir::record::Batch;
    use weir::sandbox::bindings::types::{SnapshotMode, TaskInfo};
    use weir::sandbox::host::HostState;
    let task = TaskInfo {
        job_name: "j".into(),
        operator_uid: "count".into(),
        subtask_index: 0,
        parallelism: 1,
        max_parallelism: 16,
        key_group_start: 0,
        key_group_end: 16,
    };
    let batch = |keys: &[&str]| {
        let mut b = Batch::default();
        for k in keys {
            b.push(key_group(k.as_bytes(), 16), 0, k.as_bytes(), b"");
        }
        b
    };
    let c = weir::sandbox::instance::LoadedComponent::load(
        &weir::sandbox::engine::new_engine().unwrap(),
        "count",
        &component("wordcount_counter"),
    )
    .unwrap();
    let mut wasm = c.instantiate(HostState::new(task.clone(), 0)).unwrap();
    wasm.open(&[]).unwrap();
    wasm.process(Side::Left, &batch(&["a", "b", "a"])).unwrap();
    let snap = wasm.snapshot(1, SnapshotMode::Full).unwrap();
    let mut native = weir::operator::native::NativeKeyedCount::new(HostState::new(task, 0));
    native.restore(1, &snap).unwrap();
    native.process(Side::Left, &batch(&["a", "b"])).unwrap();
    let out: Vec<String> = native.take_emitted().iter().map(|r| String::from_utf8_lossy(r.value).into()).collect();
    assert_eq!(out, vec!["a 3", "b 2"]);
}

/// `weir bench` end to end on the example job files (tiny sizes): every configuration runs
/// in its own `weir run --report` process and lands in the printed tables.
#[test]
fn bench_cli_runs_the_reference_jobs_and_prints_their_tables() {
    guests();
    let out = weir().args(["bench", "j1", "--records", "200000", "--runs", "1"]).current_dir(root()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for row in ["| 1 | off |", "| 1 | every 100 ms |", "| 2 | off, NATIVE operator |"] {
        assert!(stdout.contains(row), "missing row `{row}` in:\n{stdout}");
    }
    // A bad directory is a clear error naming what is missing.
    let out = weir().args(["bench", "j1", "--dir", "/nonexistent"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/j1.toml"));
}

/// Ingestion timestamps and a latency-measuring blackhole: `weir run --report` carries
/// per-record latency quantiles (first second not measured), plus checkpoints and memory.
#[test]
fn bench_latency_sink_measures_every_record_after_the_warm_up() {
    guests();
    let d = scratch();
    let job = d.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"lat\"\n[checkpoint]\ninterval_ms = 200\ndir = \"chk\"\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 40000\nkeys = 100\nrate = 20000\ntimestamps = \"ingestion\"\n\
             [[operator]]\nid = \"count\"\ncomponent = {}\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
             [[sink]]\nid = \"out\"\ntype = \"blackhole\"\nlatency = true\ninputs = [{{ from = \"count\" }}]\n",
            toml_path(&component("wordcount_counter"))
        ),
    )
    .unwrap();
    let report = d.path().join("report.json");
    let out = weir().arg("run").arg(&job).args(["--progress", "0", "--report"]).arg(&report).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("latency p50") && stderr.contains("peak memory"), "{stderr}");
    let r: weir::bench::report::RunReport = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let sink = r.nodes.iter().find(|n| n.id == "out").unwrap();
    assert_eq!(sink.records_in, 40_000);
    let l = sink.latency.expect("the sink measured latency");
    // 2 s of input at 20 000/s; the first second is warm-up.
    assert!(l.samples > 10_000 && l.samples < 40_000, "{l:?}");
    assert!(l.p50_ms <= l.p99_ms && l.p99_ms <= l.max_ms, "{l:?}");
    assert!(!r.checkpoints.is_empty() && r.peak_rss_bytes > 0);
}
