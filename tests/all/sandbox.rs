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

const LIMITS: &str =
    "[limits]\nmemory_mb = 32\ncall_timeout_ms = 200\nmax_emit_mb = 4\nmax_snapshot_mb = 1\nmax_state_value_mb = 2\n";

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
        ("huge-value", "exceeded its state value limit: a value of"),
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

mod server {
    use super::*;
    use weir::api::http::send;
    use weir::api::server::Api;
    use weir::api::tenants::{ServerConfig, Tenant};

    const ACME: &str = "acme-token-0123456789";
    const EVIL: &str = "evil-token-0123456789";

    fn call(addr: &str, method: &str, path: &str, token: &str, body: &[u8]) -> (u16, serde_json::Value) {
        let (status, text) = send(addr, method, path, token, body, Duration::from_secs(60)).unwrap();
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
    }

    fn upload(addr: &str, token: &str, name: &str) -> String {
        let (s, v) = call(addr, "POST", "/v1/components", token, &std::fs::read(component(name)).unwrap());
        assert_eq!(s, 200, "{v}");
        v["component"].as_str().unwrap().to_string()
    }

    fn oracle_job(name: &str, comp: &str, p: u32, extra: &str) -> String {
        format!(
            "[job]\nname = \"{name}\"\nmax_parallelism = 16\n{extra}[checkpoint]\ninterval_ms = 50\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 20000\nkeys = 16\nrate = 10000\n\
             [[operator]]\nid = \"oracle\"\ncomponent = \"{comp}\"\nparallelism = {p}\nconfig = {{ keys = \"16\" }}\n\
             inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
             [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"{name}-out\"\ninputs = [{{ from = \"oracle\" }}]\n"
        )
    }

    fn wait_state(addr: &str, token: &str, id: &str, want: &str) -> serde_json::Value {
        let t0 = Instant::now();
        loop {
            let (s, v) = call(addr, "GET", &format!("/v1/jobs/{id}"), token, b"");
            assert_eq!(s, 200, "{v}");
            if v["state"] == want {
                return v;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "job {id} never reached {want}: {v}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn sandbox_server_isolates_tenants_and_refuses_quota_breaches_at_submission() {
        let d = scratch();
        let tenant = |name: &str, token: &str| Tenant {
            name: name.into(),
            token: token.into(),
            max_jobs: 2,
            max_memory_mb: 512,
            max_parallelism: 4,
            max_subtasks: 12,
        };
        let cfg = ServerConfig {
            listen: "127.0.0.1:0".into(),
            data_dir: d.path().join("data"),
            tenant: vec![tenant("acme", ACME), tenant("evil", EVIL)],
        };
        let api = Api::hosting(&cfg, weir::sandbox::engine::new_engine().unwrap()).unwrap();
        let server = api.serve("127.0.0.1:0").unwrap();
        let addr = server.addr.to_string();

        let oracle = upload(&addr, ACME, "test_oracle");
        let (s, v) = call(
            &addr,
            "POST",
            "/v1/jobs",
            ACME,
            oracle_job("good", &oracle, 2, "[limits]\nmemory_mb = 64\n").as_bytes(),
        );
        assert_eq!(s, 200, "{v}");
        let good = v["id"].as_str().unwrap().to_string();

        // The other tenant: a job that spins into its CPU limit, fails for good, and says why.
        let hostile = upload(&addr, EVIL, "test_hostile");
        let spin = format!(
            "[job]\nname = \"spin\"\n[limits]\ncall_timeout_ms = 100\nmemory_mb = 64\n[restart]\nstrategy = \"none\"\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 100\n\
             [[operator]]\nid = \"hostile\"\ncomponent = \"{hostile}\"\nconfig = {{ mode = \"spin\" }}\n\
             inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
             [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"hostile\" }}]\n"
        );
        let (s, v) = call(&addr, "POST", "/v1/jobs", EVIL, spin.as_bytes());
        assert_eq!(s, 200, "{v}");
        let spin_id = v["id"].as_str().unwrap().to_string();
        let failed = wait_state(&addr, EVIL, &spin_id, "FAILED");
        assert!(failed["cause"].as_str().unwrap().contains("exceeded its CPU time limit"), "{failed}");
        let (_, list) = call(&addr, "GET", "/v1/jobs", EVIL, b"");
        assert_eq!(list.as_array().unwrap().len(), 1, "evil sees only its own job: {list}");
        assert_eq!(list[0]["state"], "FAILED");

        // Everything of acme's is unreachable for evil, as if it did not exist.
        for (method, path, body) in [
            ("GET", format!("/v1/jobs/{good}"), &b""[..]),
            ("GET", format!("/v1/jobs/{good}/checkpoints"), b""),
            ("POST", format!("/v1/jobs/{good}/savepoints"), b""),
            ("POST", format!("/v1/jobs/{good}/stop"), b""),
            ("POST", format!("/v1/jobs/{good}/cancel"), b""),
            ("POST", format!("/v1/jobs/{good}/operators/oracle/upgrade"), b"x"),
        ] {
            let (s, v) = call(&addr, method, &path, EVIL, body);
            assert_eq!(s, 404, "{method} {path} by another tenant: {v}");
        }
        // ... including its files, its components and paths outside its directory.
        let escape =
            oracle_job("esc", &hostile, 1, "").replace("path = \"esc-out\"", "path = \"../../acme/files/good-out\"");
        let (s, v) = call(&addr, "POST", "/v1/jobs", EVIL, escape.as_bytes());
        assert!(s == 400 && v["error"].as_str().unwrap().contains("outside your directory"), "{v}");
        let abs = oracle_job("abs", &hostile, 1, "").replace("path = \"abs-out\"", "path = \"/tmp/weir-escape\"");
        let (s, v) = call(&addr, "POST", "/v1/jobs", EVIL, abs.as_bytes());
        assert!(s == 400 && v["error"].as_str().unwrap().contains("outside your directory"), "{v}");
        // Probing for another tenant's files answers the same whether they exist or not.
        let probe = |p: &str| {
            let job = oracle_job("probe", &hostile, 1, "").replace(
                "[[operator]]",
                &format!("[[source]]\nid = \"f\"\ntype = \"file\"\npath = \"{p}\"\n[[operator]]"),
            );
            call(&addr, "POST", "/v1/jobs", EVIL, job.as_bytes())
        };
        let (s1, v1) = probe("../../acme/files/.job-1.toml");
        let (s2, v2) = probe("../../acme/files/no-such-file");
        for (s, v) in [(s1, &v1), (s2, &v2)] {
            assert!(s == 400 && v["error"].as_str().unwrap().contains("outside your directory"), "{v}");
        }
        assert!(!v1.to_string().contains(&d.path().display().to_string()), "no server paths in errors: {v1}");
        let theirs = oracle_job("theirs", &oracle, 1, "");
        let (s, v) = call(&addr, "POST", "/v1/jobs", EVIL, theirs.as_bytes());
        assert!(s == 400 && v["error"].as_str().unwrap().contains("no uploaded component"), "{v}");
        let (s, _) = call(&addr, "POST", "/v1/files?name=../../acme/files/x", EVIL, b"x");
        assert_eq!(s, 400);
        let (s, _) = call(&addr, "GET", "/v1/jobs", "no-such-token", b"");
        assert_eq!(s, 401);
        // No ambient capabilities: a WASI importer is refused at upload, its imports listed.
        let wasi = std::fs::read(crate::support::wasi_component()).unwrap();
        let (s, v) = call(&addr, "POST", "/v1/components", EVIL, &wasi);
        assert!(s == 400 && v["error"].as_str().unwrap().contains("wasi:cli/environment@"), "{v}");
        let (s, v) = call(&addr, "POST", "/v1/components", EVIL, b"\0asm garbage");
        assert!(s == 400 && v["error"].as_str().unwrap().contains("not a WebAssembly component"), "{v}");

        // Quotas, refused at submission with the quota named.
        let too_wide = oracle_job("wide", &oracle, 5, "");
        let (s, v) = call(&addr, "POST", "/v1/jobs", ACME, too_wide.as_bytes());
        assert!(s == 409 && v["error"].as_str().unwrap().contains("max_parallelism"), "{v}");
        let too_big = oracle_job("big", &oracle, 2, "[limits]\nmemory_mb = 256\n");
        let (s, v) = call(&addr, "POST", "/v1/jobs", ACME, too_big.as_bytes());
        assert!(s == 409 && v["error"].as_str().unwrap().contains("max_memory_mb"), "{v}");
        // Threads count too: threads beyond acme's 12 subtasks (`good` runs 4, this one 9).
        let many = oracle_job("many", &oracle, 4, "[limits]\nmemory_mb = 1\n")
            .replace("id = \"gen\"\ntype = \"generator\"", "id = \"gen\"\nparallelism = 4\ntype = \"generator\"");
        let (s, v) = call(&addr, "POST", "/v1/jobs", ACME, many.as_bytes());
        assert!(s == 409 && v["error"].as_str().unwrap().contains("max_subtasks"), "{v}");
        let second =
            oracle_job("second", &oracle, 1, "[limits]\nmemory_mb = 64\n").replace("rate = 10000", "rate = 2000");
        let (s, v) = call(&addr, "POST", "/v1/jobs", ACME, second.as_bytes());
        assert_eq!(s, 200, "{v}");
        let second_id = v["id"].as_str().unwrap().to_string();
        let third = oracle_job("third", &oracle, 1, "[limits]\nmemory_mb = 64\n");
        let (s, v) = call(&addr, "POST", "/v1/jobs", ACME, third.as_bytes());
        assert!(s == 409 && v["error"].as_str().unwrap().contains("max_jobs"), "{v}");

        // The well-behaved tenant's job was never disturbed.
        wait_state(&addr, ACME, &good, "FINISHED");
        let mut expected: Vec<String> = (0..20000u64).map(|i| format!("{} {}", i % 16, i / 16)).collect();
        expected.sort();
        assert!(committed_lines(&d.path().join("data/acme/files/good-out")) == expected, "acme's output is exact");
        let (_, list) = call(&addr, "GET", "/v1/jobs", ACME, b"");
        assert_eq!(list.as_array().unwrap().len(), 2, "acme sees its two jobs: {list}");

        // Stop the second job with a savepoint in acme's directory and resume it from there.
        let (s, v) = call(&addr, "POST", &format!("/v1/jobs/{second_id}/stop"), ACME, br#"{"dir": "sp/second"}"#);
        assert_eq!(s, 200, "{v}");
        assert!(d.path().join("data/acme/files/sp/second/_metadata").exists(), "{v}");
        let (s, v) = call(&addr, "POST", "/v1/jobs?restore=../../evil/files/x", ACME, second.as_bytes());
        assert!(s == 400 && v["error"].as_str().unwrap().contains("outside your directory"), "{v}");
        let (s, v) = call(&addr, "POST", "/v1/jobs?restore=sp/missing", ACME, second.as_bytes());
        assert!(s == 409 && v["error"].as_str().unwrap().contains("cannot restore"), "refused before it starts: {v}");
        let (s, v) = call(&addr, "POST", "/v1/jobs?restore=sp/second", ACME, second.as_bytes());
        assert_eq!(s, 200, "{v}");
        wait_state(&addr, ACME, v["id"].as_str().unwrap(), "FINISHED");
        assert!(committed_lines(&d.path().join("data/acme/files/second-out")) == expected, "resumed exactly once");
    }
}

#[test]
fn sandbox_weir_serve_and_submit_run_a_tenants_job_from_the_cli() {
    use std::io::BufRead;
    let d = scratch();
    let token = "cli-tenant-token-0123456789";
    std::fs::write(
        d.path().join("server.toml"),
        format!("listen = \"127.0.0.1:0\"\ndata_dir = \"data\"\n[[tenant]]\nname = \"cli\"\ntoken = \"{token}\"\n"),
    )
    .unwrap();
    let mut serve = crate::support::weir()
        .args(["serve", "--config"])
        .arg(d.path().join("server.toml"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(serve.stderr.take().unwrap()).lines();
    let url = loop {
        let l = lines.next().expect("weir serve printed its address").unwrap();
        if let Some(rest) = l.split("at ").nth(1).filter(|_| l.starts_with("weir serving")) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let cli = |args: &[&str]| {
        let out = crate::support::weir().args(["--server", &url, "--token", token]).args(args).output().unwrap();
        assert!(out.status.success(), "weir {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    crate::support::guests();
    let job = crate::support::root().join("examples/wordcount/job.toml");
    let id = cli(&["submit", job.to_str().unwrap()]).trim().to_string();
    assert!(id.starts_with("wordcount-"), "{id}");
    let t0 = Instant::now();
    while !cli(&["status", &id]).contains("\"state\": \"FINISHED\"") {
        assert!(t0.elapsed() < Duration::from_secs(60), "the job did not finish: {}", cli(&["status", &id]));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(cli(&["list"]).contains(&id));
    let expected =
        std::fs::read_to_string(crate::support::root().join("examples/wordcount/expected/counts.txt")).unwrap();
    let mut expected: Vec<String> = expected.lines().map(str::to_string).collect();
    expected.sort();
    assert_eq!(committed_lines(&d.path().join("data/cli/files/out")), expected);
    serve.kill().unwrap();
    serve.wait().unwrap();
}

#[test]
fn sandbox_a_component_importing_wasi_is_refused_at_load_listing_its_imports() {
    let engine = weir::sandbox::engine::new_engine().unwrap();
    let path = crate::support::wasi_component();
    let e = weir::sandbox::instance::LoadedComponent::load(&engine, "snoop", &path).err().expect("refused");
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("operator `snoop`: component {} imports ", path.display())), "{msg}");
    assert!(msg.contains("wasi:cli/environment@") && msg.contains("wasi:io/streams@"), "imports listed: {msg}");
    assert!(msg.contains("which Weir does not provide"), "{msg}");
}
