//! Operating Weir: `/metrics` in the Prometheus text format, read with an independent parser.

use std::time::{Duration, Instant};

use weir::api::http::send;
use weir::api::server::Api;
use weir::api::tenants::{ServerConfig, Tenant};

use crate::support::{component, scratch};

const OPS: &str = "ops-token-0123456789";
const OTHER: &str = "other-token-0123456789";

fn scrape(addr: &str, token: &str) -> prometheus_parse::Scrape {
    let (s, text) = send(addr, "GET", "/metrics", token, b"", Duration::from_secs(60)).unwrap();
    assert_eq!(s, 200, "{text}");
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid Prometheus text")
}

fn value(s: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.samples.iter().find(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v))).map(|x| {
        match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        }
    })
}

/// A `weir serve` API in this process (no CPU groups) for tenants `(name, token)`.
fn hosting(dir: &std::path::Path, tenants: &[(&str, &str)]) -> weir::api::server::ApiServer {
    let tenants = tenants.iter().map(|(n, t)| Tenant { max_jobs: 2, max_disk_mb: 1024, ..Tenant::new(n, t) }).collect();
    let mut cfg = ServerConfig::new("127.0.0.1:0".into(), dir.join("data"), tenants);
    cfg.cpu_cgroup = "".into();
    let api = Api::hosting(&cfg, weir::sandbox::engine::new_engine().unwrap()).unwrap();
    api.serve("127.0.0.1:0").unwrap()
}

/// Calls the API as tenant `ops`, expecting 200; the JSON answer.
fn call(addr: &str, method: &str, path: &str, body: &[u8]) -> serde_json::Value {
    let (s, v) = send(addr, method, path, OPS, body, Duration::from_secs(60)).unwrap();
    assert_eq!(s, 200, "{method} {path}: {v}");
    serde_json::from_str(&v).unwrap()
}

/// Uploads test component `name` as tenant `ops`; its `sha256:` name.
fn upload(addr: &str, name: &str) -> String {
    call(addr, "POST", "/v1/components", &std::fs::read(component(name)).unwrap())["component"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn ops_metrics_parse_as_prometheus_text_and_counters_move_as_the_job_runs() {
    let d = scratch();
    let server = hosting(d.path(), &[("ops", OPS), ("other", OTHER)]);
    let addr = server.addr.to_string();
    let comp = upload(&addr, "test_oracle");
    let job = format!(
        "[job]\nname = \"metered\"\nmax_parallelism = 16\n[limits]\nmemory_mb = 32\n\
         [checkpoint]\ninterval_ms = 100\ndir = \"chk\"\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000000000000\nkeys = 16\nrate = 20000\n\
         [[operator]]\nid = \"op\"\ncomponent = \"{comp}\"\nconfig = {{ keys = \"16\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"op\" }}]\n"
    );
    let id = call(&addr, "POST", "/v1/jobs", job.as_bytes())["id"].as_str().unwrap().to_string();
    let labels = [("tenant", "ops"), ("job", id.as_str()), ("node", "op")];
    let t0 = Instant::now();
    let first = loop {
        let s = scrape(&addr, OPS);
        if value(&s, "weir_checkpoints_completed_total", &labels[..2]).unwrap_or(0.0) >= 1.0 {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no checkpoint completed");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(value(&first, "weir_job_state", &[("job", id.as_str()), ("state", "RUNNING")]), Some(1.0));
    assert_eq!(value(&first, "weir_job_state", &[("job", id.as_str()), ("state", "FAILED")]), Some(0.0));
    assert!(value(&first, "weir_checkpoint_last_duration_seconds", &labels[..2]).is_some_and(|v| v >= 0.0));
    assert!(value(&first, "weir_checkpoint_last_size_bytes", &labels[..2]).is_some_and(|v| v > 0.0));
    let before = value(&first, "weir_records_in_total", &labels).expect("records of node op");
    let busy_before = value(&first, "weir_busy_seconds_total", &labels).expect("busy time of node op");
    // The counters move while the job runs (busy time: the guest's calls add up).
    let t0 = Instant::now();
    loop {
        let s = scrape(&addr, OPS);
        let now = value(&s, "weir_records_in_total", &labels).unwrap();
        let busy = value(&s, "weir_busy_seconds_total", &labels).unwrap();
        if now > before && busy > busy_before {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "weir_records_in_total stayed at {now}, busy at {busy}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Another tenant sees none of it; no token, nothing at all.
    let theirs = scrape(&addr, OTHER);
    assert!(theirs.samples.iter().all(|s| s.labels.get("job") != Some(id.as_str())), "another tenant's metrics leak");
    let (s, _) = send(&addr, "GET", "/metrics", "no-such-token-0000000", b"", Duration::from_secs(60)).unwrap();
    assert_eq!(s, 401);
    call(&addr, "POST", &format!("/v1/jobs/{id}/cancel"), b"");
}

/// A fast source in front of a slow operator: the source's time blocked on its full output
/// channel shows as `weir_backpressured_seconds_total` and keeps rising; the slow operator,
/// in front of a blackhole, is blocked far less.
#[test]
fn ops_backpressured_time_rises_behind_a_slow_consumer() {
    let d = scratch();
    let server = hosting(d.path(), &[("ops", OPS)]);
    let addr = server.addr.to_string();
    let comp = upload(&addr, "test_hostile");
    let job = format!(
        "[job]\nname = \"slow\"\nmax_parallelism = 16\nchannel_capacity = 2\n[limits]\nmemory_mb = 32\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000000000000\nkeys = 16\n\
         [[operator]]\nid = \"slow\"\ncomponent = \"{comp}\"\nconfig = {{ mode = \"burn\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"slow\" }}]\n"
    );
    let id = call(&addr, "POST", "/v1/jobs", job.as_bytes())["id"].as_str().unwrap().to_string();
    let blocked = |node: &str| {
        // No sample yet while the job is still starting (its nodes are listed once it runs).
        value(&scrape(&addr, OPS), "weir_backpressured_seconds_total", &[("job", id.as_str()), ("node", node)])
            .unwrap_or(0.0)
    };
    let wait_above = |node: &str, floor: f64| {
        let t0 = Instant::now();
        loop {
            let v = blocked(node);
            if v > floor {
                return v;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "{node} stayed at {v} s blocked");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let first = wait_above("gen", 0.0);
    let later = wait_above("gen", first);
    let slow = blocked("slow");
    assert!(
        slow < later,
        "the operator in front of a blackhole is blocked far less ({slow} s) than the source ({later} s)"
    );
    call(&addr, "POST", &format!("/v1/jobs/{id}/cancel"), b"");
}
