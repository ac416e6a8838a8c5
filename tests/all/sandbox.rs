//! The sandbox: hostile guests fail their own job with an error naming the limit, the
//! operator and the subtask, while a well-behaved job sharing the engine and the process
//! runs to completion with correct output.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::Engine;
use weir::job;
use weir::runtime::error::RunError;
use weir::runtime::executor::{self, RunOptions};

use crate::support::{committed_lines, component, scratch, toml_path};

const LIMITS: &str = "[limits]\nmemory_mb = 32\ncall_timeout_ms = 200\nmax_emit_mb = 4\nmax_snapshot_mb = 1\n";

fn hostile_job(mode: &str) -> String {
    format!(
        "[job]\nname = \"hostile-{mode}\"\nmax_parallelism = 16\nbatch_size = 16\n{LIMITS}\
         [checkpoint]\ninterval_ms = 50\ndir = \"chk\"\n[restart]\nstrategy = \"fixed-delay\"\nattempts = 1\ndelay_ms = 10\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 2000\nkeys = 8\nrate = 2000\n\
         [[operator]]\nid = \"hostile\"\ncomponent = {}\nparallelism = 2\nconfig = {{ mode = \"{mode}\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"hostile\" }}]\n",
        toml_path(&component("test_hostile"))
    )
}

fn run_with(engine: &Engine, dir: &Path, toml: &str) -> Result<executor::RunSummary, RunError> {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let graph = job::parse(&path, toml)?;
    let bound = job::bind::bind(engine, graph)?;
    executor::run(&bound, &RunOptions { quiet_guests: true, ..Default::default() })
}

/// Runs `mode` and returns its failure message.
fn fails(engine: &Engine, mode: &str) -> String {
    let d = scratch();
    let t0 = Instant::now();
    let e =
        run_with(engine, d.path(), &hostile_job(mode)).err().unwrap_or_else(|| panic!("mode `{mode}` did not fail"));
    assert!(t0.elapsed() < Duration::from_secs(30), "mode `{mode}` took {:?} to fail", t0.elapsed());
    assert!(matches!(e, RunError::Failed { .. }), "mode `{mode}`: {e}");
    e.to_string()
}

#[test]
fn sandbox_hostile_guests_get_their_documented_error_while_a_good_job_completes() {
    let engine = Arc::new(weir::sandbox::engine::new_engine().unwrap());
    // A well-behaved job on the same engine, in the same process, the whole time.
    let good_dir = scratch();
    let good = {
        let (engine, dir) = (engine.clone(), good_dir.path().to_path_buf());
        let toml = format!(
            "[job]\nname = \"good\"\nmax_parallelism = 16\n[checkpoint]\ninterval_ms = 50\ndir = \"chk\"\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 40000\nkeys = 16\nrate = 4000\n\
             [[operator]]\nid = \"oracle\"\ncomponent = {}\nparallelism = 2\nconfig = {{ keys = \"16\" }}\n\
             inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
             [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"oracle\" }}]\n\
             [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\ninputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
            toml_path(&component("test_oracle"))
        );
        std::thread::spawn(move || run_with(&engine, &dir, &toml))
    };
    let cases = [
        ("spin", "exceeded its CPU time limit: the call ran longer than call_timeout_ms = 200 ms"),
        ("grow", "exceeded its memory limit: linear memory may not grow past memory_mb = 32 MiB"),
        ("recurse", "exhausted its call stack"),
        ("recurse-frames", "out of bounds memory access (a Rust or C guest also gets this when its shadow stack"),
        ("flood", "emitted more than 4194304 bytes in one call (limit max_emit_mb)"),
        ("huge-snapshot", "exceeded its snapshot size limit"),
        ("trap-snapshot", "guest trapped in `snapshot`"),
        ("poison-restore", "guest trapped in `restore`"),
        ("bad-timer", "timer for key group 9999, outside this subtask's key groups"),
        ("bad-emit", "malformed emit-batch"),
    ];
    for (mode, expected) in cases {
        let e = fails(&engine, mode);
        assert!(e.contains(expected), "mode `{mode}`: expected `{expected}` in: {e}");
        assert!(e.contains("subtask hostile#"), "mode `{mode}`: the error names the subtask: {e}");
        assert!(e.contains(&format!("job `hostile-{mode}` failed")), "mode `{mode}`: the error names the job: {e}");
    }
    // A huge log line is truncated, not fatal.
    let d = scratch();
    let s = run_with(&engine, d.path(), &hostile_job("huge-log")).unwrap();
    assert_eq!(s.nodes.iter().find(|n| n.id.as_str() == "out").unwrap().records_in, 2000);
    good.join().unwrap().unwrap();
    assert!(committed_lines(&good_dir.path().join("violations")).is_empty());
    let mut expected: Vec<String> = (0..40000u64).map(|i| format!("{} {}", i % 16, i / 16)).collect();
    expected.sort();
    assert!(committed_lines(&good_dir.path().join("out")) == expected, "the good job's output is exact");
}

#[test]
fn sandbox_limits_above_the_host_ceiling_are_refused_at_load() {
    let d = scratch();
    let toml = hostile_job("spin").replace("memory_mb = 32", "memory_mb = 100000");
    let e = crate::support::run_job_in(d.path(), &toml).unwrap_err();
    assert!(
        e.to_string()
            .contains("[limits] memory_mb = 100000 is above this host's ceiling of 4096; ask for at most 4096"),
        "{e}"
    );
    assert!(e.to_string().contains("job.toml:5: "), "the error names the line: {e}");
}
