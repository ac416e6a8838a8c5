//! Live state queries (`weir query`, `GET /v1/jobs/{id}/operators/{uid}/state`): a key's
//! current value read from the running job, checked against the job's committed output.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use weir::api::http::send;

use crate::ops::{OPS, OTHER};
use crate::support::{c_component, committed_lines, component, js_component, scratch};

/// A `weir serve` API in this process for tenants `ops` and `other` (the ops tests' helper).
fn hosting(dir: &Path) -> weir::api::server::ApiServer {
    crate::ops::hosting(dir, &[("ops", OPS), ("other", OTHER)])
}

/// `(status, JSON answer)` of a call as `token`.
fn ask(addr: &str, token: &str, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
    let (s, text) = send(addr, method, path, token, body, Duration::from_secs(120)).unwrap();
    (s, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
}

fn ok(addr: &str, method: &str, path: &str, body: &[u8]) -> serde_json::Value {
    let (s, v) = ask(addr, OPS, method, path, body);
    assert_eq!(s, 200, "{method} {path}: {v}");
    v
}

/// Submits a counting job (generator keys 0..8 -> `component` at parallelism 2 -> file sink
/// `out`) and waits until it checkpointed and key `3` was counted.
fn counting_job(addr: &str, component: &Path) -> String {
    let bytes = std::fs::read(component).unwrap();
    let comp = ok(addr, "POST", "/v1/components", &bytes)["component"].as_str().unwrap().to_string();
    let job = format!(
        "[job]\nname = \"counts\"\nmax_parallelism = 32\n[checkpoint]\ninterval_ms = 100\ndir = \"chk\"\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000000000000\nkeys = 8\nrate = 4000\n\
         [[operator]]\nid = \"count\"\ncomponent = \"{comp}\"\nparallelism = 2\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"count\" }}]\n"
    );
    let id = ok(addr, "POST", "/v1/jobs", job.as_bytes())["id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    loop {
        let st = ok(addr, "GET", &format!("/v1/jobs/{id}"), b"");
        let counted =
            st["nodes"].as_array().unwrap().iter().any(|n| n["uid"] == "count" && n["records_in"].as_u64() > Some(100));
        if st["checkpoints"].as_u64() >= Some(1) && counted {
            return id;
        }
        assert!(t0.elapsed() < Duration::from_secs(180), "job {id} never got going: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Committed output lines `<key> <count>` as key -> every count seen.
fn counts(out: &Path) -> BTreeMap<String, Vec<u64>> {
    let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for l in committed_lines(out) {
        let (k, n) = l.split_once(' ').unwrap();
        m.entry(k.to_string()).or_default().push(n.parse().unwrap());
    }
    m.values_mut().for_each(|v| v.sort());
    m
}

/// For a Rust and a JavaScript counter: queries of key `3` while the job runs (API and CLI)
/// give counts that never go back, each of which the committed output (after a stop with
/// savepoint) shows as reached, in a gap-free 1..n sequence; asked offline, the savepoint
/// answers exactly n. Refused with a clear error: a key with no value, an undeclared state, a
/// source, an unknown operator, another tenant's job, a stopped job.
#[test]
fn ops_live_state_query_answers_the_running_counters_value_in_rust_and_javascript() {
    let js = js_component("examples/wordcount/counter-js/counter.js");
    for (lang, comp) in [("rust", component("wordcount_counter")), ("js", js)] {
        let d = scratch();
        let server = hosting(d.path());
        let addr = server.addr.to_string();
        let id = counting_job(&addr, &comp);
        let q = |token: &str, query: &str| ask(&addr, token, "GET", &format!("/v1/jobs/{id}/operators/{query}"), b"");

        let (s, first) = q(OPS, "count/state?key=3");
        assert_eq!(s, 200, "{lang}: {first}");
        assert!(first["found"] == true && first["state"] == "count" && first["key"] == "3", "{lang}: {first}");
        let v1 = first["value"].as_u64().unwrap_or_else(|| panic!("{lang}: a count: {first}"));
        let t0 = Instant::now();
        let v2 = loop {
            let (s, a) = q(OPS, "count/state?key=3&state=count");
            assert_eq!(s, 200, "{lang}: {a}");
            assert_eq!(a["subtask"], first["subtask"], "the key's owner answers");
            let v = a["value"].as_u64().unwrap();
            assert!(v >= v1, "{lang}: the count went back from {v1} to {v}");
            if v > v1 {
                break v;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "{lang}: the count stayed at {v1}");
            std::thread::sleep(Duration::from_millis(20));
        };

        // The CLI speaks the same route.
        let out = crate::support::weir()
            .args(["--server", &format!("http://{addr}"), "--token", OPS, "query", &id, "--operator", "count"])
            .args(["--key", "3"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(cli["value"].as_u64().unwrap() >= v2, "{lang}: {cli}");

        // Refusals, each naming what is wrong.
        let (s, e) = q(OPS, "count/state?key=no-such-key");
        assert!(s == 404 && e["error"].as_str().unwrap().contains("has no value in state `count`"), "{s} {e}");
        let (s, e) = q(OPS, "count/state?key=3&state=nope");
        assert!(s == 400 && e["error"].as_str().unwrap().contains("declares no state `nope`"), "{s} {e}");
        let (s, e) = q(OPS, "gen/state?key=3");
        assert!(s == 409 && e["error"].as_str().unwrap().contains("source or sink"), "{s} {e}");
        let (s, e) = q(OPS, "nope/state?key=3");
        assert!(s == 404 && e["error"].as_str().unwrap().contains("no operator `nope`"), "{s} {e}");
        let (s, e) = q(OTHER, "count/state?key=3");
        assert!(s == 404 && e["error"].as_str().unwrap().contains("no job"), "another tenant's job: {s} {e}");

        // Stop with a savepoint: the output is committed up to it, which comes after the queries.
        let sp = ok(&addr, "POST", &format!("/v1/jobs/{id}/stop"), b"");
        let out = counts(&d.path().join("data/ops/files/out"));
        let seen = &out["3"];
        let n = *seen.last().unwrap();
        assert_eq!(seen, &(1..=n).collect::<Vec<_>>(), "{lang}: key 3's counts are 1..n, exactly once");
        assert!(seen.contains(&v1) && seen.contains(&v2) && v2 <= n, "{lang}: queried {v1}, {v2}; output up to {n}");
        // Offline, the savepoint answers exactly what the committed output ends with.
        let out = crate::support::weir()
            .args(["query", "--checkpoint", sp["path"].as_str().unwrap(), "--operator", "count", "--key", "3"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{lang}: {}", String::from_utf8_lossy(&out.stderr));
        let offline: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(offline["value"].as_u64(), Some(n), "{lang}: the savepoint's count is the output's last: {offline}");
        let out = crate::support::weir()
            .args(["query", "--checkpoint", sp["path"].as_str().unwrap(), "--operator", "count", "--key", "zz"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("key `zz` has no value in state `count`"), "{lang}: {err}");
        let (s, e) = q(OPS, "count/state?key=3");
        assert!(s == 409 && e["error"].as_str().unwrap().contains("not running"), "a stopped job: {s} {e}");
    }
}

/// A component built for contract 0.3.0 (the C SDK's committed bindings) still loads and
/// runs under contract 0.3.1; asked for state, it answers that it cannot, and runs on.
#[test]
fn ops_a_component_of_the_previous_contract_runs_and_refuses_state_queries_clearly() {
    let c = c_component("examples/wordcount/counter-c/counter.c");
    let d = scratch();
    let server = hosting(d.path());
    let addr = server.addr.to_string();
    let id = counting_job(&addr, &c);
    let (s, e) = ask(&addr, OPS, "GET", &format!("/v1/jobs/{id}/operators/count/state?key=3"), b"");
    assert_eq!(s, 409, "{e}");
    assert!(e["error"].as_str().unwrap().contains("does not answer state queries (built for contract 0.3.0"), "{e}");
    let st = ok(&addr, "GET", &format!("/v1/jobs/{id}"), b"");
    assert_eq!(st["state"], "RUNNING", "the refusal is not a failure: {st}");
    ok(&addr, "POST", &format!("/v1/jobs/{id}/cancel"), b"");
}
