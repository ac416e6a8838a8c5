//! Operating Weir: `/metrics` in the Prometheus text format, read with an independent parser.

use std::time::{Duration, Instant};

use weir::api::http::send;
use weir::api::server::Api;
use weir::api::tenants::{ServerConfig, Tenant};

use crate::support::{component, scratch};

pub(crate) const OPS: &str = "ops-token-0123456789";
pub(crate) const OTHER: &str = "other-token-0123456789";

fn scrape(addr: &str, token: &str) -> prometheus_parse::Scrape {
    let (s, text) = send(addr, "GET", "/metrics", token, b"", Duration::from_secs(60)).unwrap();
    assert_eq!(s, 200, "{text}");
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid Prometheus text")
}

/// The sum of `metric`'s samples with `labels` (a node's figure over its subtasks), `None`
/// when there is no such sample.
fn value(s: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching =
        s.samples.iter().filter(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)));
    matching
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .reduce(|a, b| a + b)
}

/// A `weir serve` API in this process (no CPU groups) for tenants `(name, token)`.
pub(crate) fn hosting(dir: &std::path::Path, tenants: &[(&str, &str)]) -> weir::api::server::ApiServer {
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
         [[operator]]\nid = \"op\"\ncomponent = \"{comp}\"\nconfig = {{ keys = \"16\" }}\nparallelism = 2\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"op\" }}]\n"
    );
    let id = call(&addr, "POST", "/v1/jobs", job.as_bytes())["id"].as_str().unwrap().to_string();
    let labels = [("tenant", "ops"), ("job", id.as_str()), ("node", "op")];
    // One subtask's series (watermarks are levels, not summed).
    let sub0 = [("tenant", "ops"), ("job", id.as_str()), ("node", "op"), ("subtask", "0")];
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
    // Per subtask, as Flink's subtask_index: both of op's, no third; each guest's memory, under
    // its memory_mb.
    for sub in ["0", "1"] {
        let l = [("job", id.as_str()), ("node", "op"), ("subtask", sub)];
        assert!(value(&first, "weir_records_in_total", &l).is_some(), "no series for subtask {sub} of op");
        let mem = value(&first, "weir_guest_memory_bytes", &l).expect("guest memory of op");
        assert!(mem > 0.0 && mem <= (32 << 20) as f64, "subtask {sub} of op holds {mem} bytes of guest memory");
    }
    let third = [("job", id.as_str()), ("node", "op"), ("subtask", "2")];
    assert_eq!(value(&first, "weir_records_in_total", &third), None);
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
    // Bytes, idle time, guest calls and the watermark (the generator's, as the operator has it).
    let t0 = Instant::now();
    let wm_first = loop {
        let s = scrape(&addr, OPS);
        if let Some(w) = value(&s, "weir_watermark_milliseconds", &sub0) {
            assert!(value(&s, "weir_bytes_in_total", &labels).is_some_and(|v| v > 0.0));
            assert!(value(&s, "weir_bytes_out_total", &labels).is_some_and(|v| v > 0.0));
            assert!(value(&s, "weir_guest_calls_total", &labels).is_some_and(|v| v > 0.0));
            assert!(value(&s, "weir_idle_seconds_total", &labels).is_some_and(|v| v >= 0.0));
            assert!(value(&s, "weir_watermark_lag_seconds", &sub0).is_some());
            break w;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no watermark for node op");
        std::thread::sleep(Duration::from_millis(50));
    };
    let t0 = Instant::now();
    while value(&scrape(&addr, OPS), "weir_watermark_milliseconds", &sub0).unwrap() <= wm_first {
        assert!(t0.elapsed() < Duration::from_secs(120), "the watermark stayed at {wm_first}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A guest that runs into its CPU limit: counted by the limit's name.
    let hostile = upload(&addr, "test_hostile");
    let spin = format!(
        "[job]\nname = \"spinner\"\n[limits]\ncall_timeout_ms = 100\n[restart]\nstrategy = \"none\"\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 10\nkeys = 2\n\
         [[operator]]\nid = \"bad\"\ncomponent = \"{hostile}\"\nconfig = {{ mode = \"spin\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"bad\" }}]\n"
    );
    let spinner = call(&addr, "POST", "/v1/jobs", spin.as_bytes())["id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    loop {
        let s = scrape(&addr, OPS);
        let traps = value(&s, "weir_traps_total", &[("job", spinner.as_str()), ("limit", "cpu_time")]);
        if traps == Some(1.0) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no CPU-limit trap counted: {traps:?}");
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

/// Submits a job file as tenant `ops`; its id.
fn submit(addr: &str, job: &str) -> String {
    call(addr, "POST", "/v1/jobs", job.as_bytes())["id"].as_str().unwrap().to_string()
}

/// Polls the job's status until `done` holds (bounded: a failure, not a trigger).
fn await_status(addr: &str, id: &str, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let st = call(addr, "GET", &format!("/v1/jobs/{id}"), b"");
        if done(&st) {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(180), "job {id} never {what}: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Evaluates `js` in the page until it yields something other than null/false/undefined;
/// that value. (Bounded: the page's own events decide when; the bound only fails the test.)
fn page_until(tab: &headless_chrome::Tab, what: &str, js: &str) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let v = tab.evaluate(js, false).expect("evaluating in the page").value;
        if let Some(v) = v.filter(|v| !v.is_null() && *v != serde_json::Value::Bool(false)) {
            return v;
        }
        if t0.elapsed() > Duration::from_secs(180) {
            let text = tab.evaluate("document.body.innerText", false).ok().and_then(|r| r.value);
            panic!("the page never showed {what} ({js}); its text:\n{}", text.unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The dashboard in a real browser (Debian's headless Chromium over the DevTools protocol):
/// without a token it asks for one; with it, the job list, a running job's graph with live
/// rates on its nodes and edges, a completed checkpoint and its per-subtask detail, a failed
/// job's root cause, and a savepoint taken by clicking the page's button (then found on
/// disk, loadable). Another tenant's token shows none of it. A screenshot is saved to
/// `target/tmp/ops-dashboard.png`.
#[test]
fn ops_dashboard_in_headless_chromium_shows_jobs_rates_checkpoints_failures_and_takes_a_savepoint() {
    use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
    use headless_chrome::{Browser, LaunchOptions};

    let d = scratch();
    let server = hosting(d.path(), &[("ops", OPS), ("other", OTHER)]);
    let addr = server.addr.to_string();
    let oracle = upload(&addr, "test_oracle");
    let hostile = upload(&addr, "test_hostile");
    let running = submit(
        &addr,
        &format!(
            "[job]\nname = \"counting\"\nmax_parallelism = 16\n\
             [checkpoint]\ninterval_ms = 200\ndir = \"chk\"\nretained = 100000\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000000000000\nkeys = 16\nrate = 5000\n\
             [[operator]]\nid = \"op\"\ncomponent = \"{oracle}\"\nparallelism = 2\nconfig = {{ keys = \"16\" }}\n\
             inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
             [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"op\" }}]\n"
        ),
    );
    let failing = submit(
        &addr,
        &format!(
            "[job]\nname = \"doomed\"\n[restart]\nstrategy = \"none\"\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 100\nkeys = 4\n\
             [[operator]]\nid = \"bad\"\ncomponent = \"{hostile}\"\nconfig = {{ mode = \"bad-emit\" }}\n\
             inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
             [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"bad\" }}]\n"
        ),
    );
    let failed = await_status(&addr, &failing, "failed", |s| s["state"] == "FAILED");
    let cause = failed["cause"].as_str().unwrap().to_string();
    await_status(&addr, &running, "completed a checkpoint", |s| s["checkpoints"].as_u64() >= Some(1));

    let options = LaunchOptions::default_builder()
        .path(Some(crate::support::chromium()))
        .headless(true)
        // Root in a container: Chromium's own sandbox needs user namespaces it may not have.
        .sandbox(false)
        .window_size(Some((1400, 1300)))
        .idle_browser_timeout(Duration::from_secs(600))
        .args(vec![std::ffi::OsStr::new("--disable-dev-shm-usage"), std::ffi::OsStr::new("--disable-gpu")])
        .build()
        .unwrap();
    let browser = Browser::new(options).expect("starting headless Chromium");
    let anonymous = browser.new_tab().unwrap();
    anonymous.set_default_timeout(Duration::from_secs(120));

    // No token: the page asks for one and shows nothing else.
    anonymous.navigate_to(&format!("http://{addr}/ui/")).unwrap().wait_until_navigated().unwrap();
    page_until(
        &anonymous,
        "the token form",
        "!document.querySelector('#login').hidden && document.querySelector('#main').hidden",
    );

    // The token in the fragment (never sent to the server) opens the jobs list, and leaves the URL.
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(120));
    tab.navigate_to(&format!("http://{addr}/ui/#token={OPS}")).unwrap().wait_until_navigated().unwrap();
    page_until(&tab, "both jobs", "document.querySelectorAll('#jobs tbody tr').length === 2");
    let url = tab.evaluate("location.href", false).unwrap().value.unwrap();
    assert!(!url.as_str().unwrap().contains(OPS), "the token stays in the address bar: {url}");
    page_until(
        &tab,
        "the failed job's state and cause in the list",
        &format!(
            "(r => r && r.dataset.state === 'FAILED' && r.querySelector('.cause-cell').textContent.length > 0)\
             (document.querySelector('#jobs tr[data-job=\"{failing}\"]'))"
        ),
    );

    // The failed job: its root cause, as the API reports it.
    tab.find_element(&format!("#jobs tr[data-job=\"{failing}\"]")).unwrap().click().unwrap();
    let shown = page_until(
        &tab,
        "the failed job's root cause",
        &format!(
            "document.querySelector('#job-id').textContent === '{failing}' && !document.querySelector('#job-cause').hidden \
             && document.querySelector('#job-cause').textContent"
        ),
    );
    assert!(shown.as_str().unwrap().contains(&cause), "the page shows {shown}, the API {cause}");
    assert!(cause.contains("bad"), "the cause names the operator: {cause}");

    // The running job: its graph, with rates on the nodes, and its edges.
    tab.find_element(&format!("#jobs tr[data-job=\"{running}\"]")).unwrap().click().unwrap();
    page_until(
        &tab,
        "a rate on the operator's node",
        "Number(document.querySelector('#graph g.node[data-uid=\"op\"]')?.getAttribute('data-rate-in')) > 0",
    );
    page_until(
        &tab,
        "a rate on the source's node",
        "Number(document.querySelector('#graph g.node[data-uid=\"gen\"]')?.getAttribute('data-rate-out')) > 0",
    );
    for (from, to) in [("gen", "op"), ("op", "out")] {
        let sel = format!("#graph path.edge[data-from=\"{from}\"][data-to=\"{to}\"]");
        page_until(&tab, &format!("the edge {from} -> {to}"), &format!("!!document.querySelector('{sel}')"));
    }
    let label = page_until(
        &tab,
        "the node's label",
        "document.querySelector('#graph g.node[data-uid=\"op\"] .rate')?.textContent",
    );
    assert!(label.as_str().unwrap().contains("/s"), "{label}");

    // A completed checkpoint in the history, and its per-subtask detail.
    page_until(
        &tab,
        "a completed checkpoint",
        "!!document.querySelector('#checkpoints tr.ckpt[data-status=\"COMPLETED\"]')",
    );
    tab.find_element("#checkpoints tr.ckpt[data-status=\"COMPLETED\"] button.detail").unwrap().click().unwrap();
    let rows = page_until(
        &tab,
        "the checkpoint's subtasks",
        "(t => t && t.querySelectorAll('tbody tr').length)(document.querySelector('#ckpt-subtasks'))",
    );
    assert_eq!(rows.as_u64(), Some(4), "gen#0, op#0, op#1, out#0");

    // A live state query from the page: the operator's value for key 3.
    tab.find_element("#query-key").unwrap().click().unwrap();
    tab.type_str("3").unwrap();
    tab.find_element("#btn-query").unwrap().click().unwrap();
    let answer = page_until(
        &tab,
        "the query's answer",
        "(e => e.className === 'ok' && e.textContent)(document.querySelector('#query-result'))",
    );
    let answer: serde_json::Value = serde_json::from_str(answer.as_str().unwrap()).unwrap();
    assert!(answer["found"] == true && answer["operator"] == "op" && answer["key"] == "3", "{answer}");
    assert!(answer["value"].as_u64().is_some_and(|n| n > 0), "the oracle's next sequence number: {answer}");

    // A savepoint from the page's button: the page names it, and it is on disk and loads.
    tab.find_element("#btn-savepoint").unwrap().click().unwrap();
    let said = page_until(
        &tab,
        "the savepoint's path",
        "(e => e.className === 'ok' && e.textContent)(document.querySelector('#action-result'))",
    );
    let said = said.as_str().unwrap();
    let path = said.strip_prefix("Savepoint written: ").and_then(|s| s.split(" (checkpoint").next()).expect(said);
    let sp = weir::checkpoint::storage::load(std::path::Path::new(path)).expect("the savepoint loads");
    assert!(sp.states.keys().any(|(uid, _)| uid == "op"), "{said}");

    let png = tab.capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a screenshot of the page");
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ops-dashboard.png");
    std::fs::write(&shot, &png).unwrap();

    // Another tenant's token: none of these jobs.
    let theirs = browser.new_tab().unwrap();
    // Like the other tabs: navigation on a loaded machine can take longer than the default.
    theirs.set_default_timeout(Duration::from_secs(120));
    theirs.navigate_to(&format!("http://{addr}/ui/#token={OTHER}")).unwrap().wait_until_navigated().unwrap();
    page_until(&theirs, "an empty job list", "!document.querySelector('#no-jobs').hidden");
    assert_eq!(theirs.evaluate("document.querySelectorAll('#jobs tbody tr').length", false).unwrap().value.unwrap(), 0);

    call(&addr, "POST", &format!("/v1/jobs/{running}/cancel"), b"");
}

/// The dashboard's files are served without a token (they hold no data), with a policy
/// that runs only their own script; the data behind them still needs the token.
#[test]
fn ops_dashboard_assets_are_public_and_locked_down_while_the_data_needs_a_token() {
    let d = scratch();
    let server = hosting(d.path(), &[("ops", OPS)]);
    let addr = server.addr.to_string();
    for path in ["/", "/ui/", "/ui/app.js", "/ui/app.css"] {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        std::io::Write::write_all(
            &mut s,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut raw = String::new();
        std::io::Read::read_to_string(&mut s, &mut raw).unwrap();
        let head = raw.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{path}: {head}");
        assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{path}: {head}");
        assert!(head.contains("x-content-type-options: nosniff") && head.contains("frame-ancestors 'none'"), "{head}");
    }
    let (s, _) = send(&addr, "GET", "/v1/jobs", "", b"", Duration::from_secs(60)).unwrap();
    assert_eq!(s, 401, "the API behind the page needs the token");
}

/// `weir --log-format json run`: every line of stderr is one JSON object; the guest's log
/// lines are events with `job`, `operator`, `subtask` and `guest` fields, and a newline in a
/// guest's message cannot start a line of its own (it stays escaped inside the message). In
/// text, the same line names its subtask.
#[test]
fn ops_logs_are_structured_and_json_lines_carry_job_operator_subtask_and_guest_lines() {
    let d = scratch();
    let job = format!(
        "[job]\nname = \"logjob\"\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 20\nkeys = 4\n\
         [[operator]]\nid = \"bad\"\ncomponent = {}\nconfig = {{ mode = \"forge-log\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"bad\" }}]\n",
        crate::support::toml_path(&component("test_hostile"))
    );
    let path = d.path().join("job.toml");
    std::fs::write(&path, job).unwrap();
    let out = crate::support::weir()
        .args(["--log-format", "json", "run", "--progress", "0"])
        .arg(&path)
        .env("WEIR_HOME", d.path().join("home"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let mut guest = 0;
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let f = &v["fields"];
        if f["guest"] == true {
            guest += 1;
            assert!(f["job"] == "logjob" && f["operator"] == "bad" && f["subtask"] == 0, "{line}");
            let m = f["message"].as_str().unwrap();
            assert!(m.contains("[logjob/bad#0] record") && m.contains("\\n[victim/count#0] info: forged"), "{m}");
            assert_eq!(v["level"], "INFO", "{line}");
        }
    }
    assert_eq!(guest, 20, "one event per record's log line:\n{stderr}");
    let text = crate::support::weir()
        .args(["run", "--progress", "0"])
        .arg(&path)
        .env("WEIR_HOME", d.path().join("home"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(text.status.success() && stderr.contains("[logjob/bad#0] record"), "{stderr}");
    assert!(stderr.lines().all(|l| !l.starts_with("[victim")), "a forged line: {stderr}");
}

/// `[tls]` in server.toml: a real `weir serve` speaks only TLS. The CLI, trusting the
/// server's self-signed certificate with `--ca-cert`, submits a job, follows it to the end and
/// lists it (the job's output is right); without `--ca-cert` the CLI refuses the unknown
/// certificate; a plain-HTTP request gets no HTTP answer; a client that never starts its
/// handshake is closed by the head's deadline.
#[test]
fn ops_api_over_tls_serves_the_cli_and_refuses_plain_or_untrusted_clients() {
    use std::io::Read;
    let d = scratch();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    std::fs::create_dir(d.path().join("tls")).unwrap();
    std::fs::write(d.path().join("tls/cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(d.path().join("tls/key.pem"), cert.signing_key.serialize_pem()).unwrap();
    let token = "tls-tenant-token-0123456789";
    let serve = crate::sandbox::weir_serve(
        d.path(),
        &format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"data\"\nheader_timeout_ms = 2000\n\
             [tls]\ncert = \"tls/cert.pem\"\nkey = \"tls/key.pem\"\n\
             [[tenant]]\nname = \"tls\"\ntoken = \"{token}\"\n"
        ),
    );
    let url = serve.url.clone();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let addr = url.trim_start_matches("https://").to_string();
    let ca = d.path().join("tls/cert.pem");
    let weir = |args: &[&str], trusted: bool| {
        let mut c = crate::support::weir();
        c.args(["--server", &url, "--token", token]);
        if trusted {
            c.arg("--ca-cert").arg(&ca);
        }
        c.args(args).output().unwrap()
    };
    let cli = |args: &[&str]| {
        let out = weir(args, true);
        assert!(out.status.success(), "weir {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };

    let id = crate::sandbox::wordcount_through_the_cli(&cli, &d.path().join("data/tls/files/out"));

    // The library client too, and the token still matters over TLS.
    let client = weir::api::client::Client::with_ca(&url, token, &ca).unwrap();
    assert!(client.call("GET", "/v1/jobs", b"").unwrap().to_string().contains(&id));
    let stranger = weir::api::client::Client::with_ca(&url, "no-such-token-0000000", &ca).unwrap();
    assert!(stranger.call("GET", "/v1/jobs", b"").unwrap_err().to_string().contains("token"));

    // Not trusted: the usual web roots do not know a self-signed certificate.
    let out = weir(&["list"], false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("cannot reach the Weir API") && err.contains("ertificate"), "{err}");
    // Plain HTTP on the TLS port: no HTTP answer.
    let plain = send(&addr, "GET", "/v1/jobs", token, b"", Duration::from_secs(60));
    assert!(plain.is_err(), "a plain-HTTP request was answered: {plain:?}");
    // A client that connects and never starts its handshake is closed (EOF or reset).
    let mut idle = std::net::TcpStream::connect(&addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut buf = [0u8; 64];
    match idle.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0, "the server wrote {n} bytes to a client that never spoke"),
        Err(e) => assert!(
            !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "the idle connection was kept open: {e}"
        ),
    }
    drop(serve);
}
