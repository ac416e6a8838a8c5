//! Event-time windows of the Rust SDK (`weir_guest::window`), end to end through the
//! `test-windows` component: a file source with event time from a column and watermarks
//! trailing the largest timestamp, hash-partitioned into the windows, two file sinks (fired
//! windows and late records).
//!
//! Every run is checked against a reference: the obvious loop over the input lines (no windows
//! library), which applies the watermark after each source batch exactly as the source emits it.
//! Batches are deterministic (`batch_size` lines, one source subtask), so the expected output
//! is exact, late firings and late records included.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::graph::logical::Side;
use weir::keygroup::key_group;
use weir::record::Batch;
use weir::runtime::faults::{FaultKind, FaultPlan};
use weir::sandbox::bindings::types::TaskInfo;
use weir::sandbox::engine::new_engine;
use weir::sandbox::host::HostState;
use weir::sandbox::instance::LoadedComponent;

use crate::savepoints::{load_factory, start, wait_records};
use crate::support::{committed_lines, component, scratch, toml_path};

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Tumbling,
    Sliding,
    Session,
}

#[derive(Clone, Copy)]
pub(crate) struct Spec {
    pub(crate) kind: Kind,
    pub(crate) size: i64,
    pub(crate) slide: i64,
    pub(crate) gap: i64,
    pub(crate) lateness: i64,
    pub(crate) aggregate: &'static str,
    pub(crate) delay: i64,
    pub(crate) batch: usize,
}

pub(crate) const TUMBLING: Spec =
    Spec { kind: Kind::Tumbling, size: 10, slide: 10, gap: 0, lateness: 5, aggregate: "count", delay: 3, batch: 4 };

pub(crate) struct Line {
    key: String,
    ts: i64,
    value: String,
}

impl Line {
    fn text(&self) -> String {
        format!("{},{},{}", self.key, self.ts, self.value)
    }
}

/// `n` lines over 7 keys, timestamps rising 2 ms per line with jitter in [-15, +5] (so some
/// records arrive behind the watermark), after a few lines that sit on window edges and at
/// negative times.
pub(crate) fn input(n: usize, seed: u64) -> Vec<Line> {
    let mut s = seed;
    let mut next = |m: u64| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    let edges = [("neg", -1), ("neg", -10), ("neg", -11), ("edge", 0), ("edge", 9), ("edge", 10)];
    let mut lines: Vec<Line> = edges
        .iter()
        .enumerate()
        .map(|(i, (k, ts))| Line { key: k.to_string(), ts: *ts, value: i.to_string() })
        .collect();
    for i in 0..n {
        let ts = 20 + 2 * i as i64 + next(21) as i64 - 15;
        lines.push(Line { key: format!("k{}", next(7)), ts, value: (1000 + i).to_string() });
    }
    lines
}

/// A window under way in the reference: its records' values.
struct Open {
    start: i64,
    end: i64,
    values: Vec<String>,
}

impl Open {
    fn max_ts(&self) -> i64 {
        self.end - 1
    }
}

/// What the job must write: (fired windows, late records), each sorted.
fn reference(spec: &Spec, lines: &[Line]) -> (Vec<String>, Vec<String>) {
    let mut open: BTreeMap<&str, Vec<Open>> = BTreeMap::new();
    let (mut out, mut late) = (Vec::new(), Vec::new());
    let (mut wm, mut max_ts) = (i64::MIN, i64::MIN);
    let result = |key: &str, w: &Open| {
        let r = match spec.aggregate {
            "count" => w.values.len().to_string(),
            "sum" => w.values.iter().map(|v| v.parse::<i64>().unwrap()).sum::<i64>().to_string(),
            _ => {
                let mut v = w.values.clone();
                v.sort();
                v.join("+")
            }
        };
        format!("{key} {} {} {r}", w.start, w.end)
    };
    for chunk in lines.chunks(spec.batch) {
        for l in chunk {
            let windows = open.entry(&l.key).or_default();
            let accepted = if spec.kind == Kind::Session {
                add_to_session(spec, windows, l, wm, &mut |w| out.push(result(&l.key, w)))
            } else {
                add_to_fixed(spec, windows, l, wm, &mut |w| out.push(result(&l.key, w)))
            };
            if !accepted {
                late.push(l.text());
            }
            max_ts = max_ts.max(l.ts);
        }
        let new = wm.max(max_ts - spec.delay);
        advance(spec, &mut open, wm, new, &mut |k, w| out.push(result(k, w)));
        wm = new;
    }
    advance(spec, &mut open, wm, i64::MAX, &mut |k, w| out.push(result(k, w)));
    out.sort();
    late.sort();
    (out, late)
}

/// Tumbling and sliding: every window `[s, s + size)` with `s` a multiple of the slide that
/// holds the timestamp; each not yet past its lateness takes the record.
fn add_to_fixed(spec: &Spec, windows: &mut Vec<Open>, l: &Line, wm: i64, fire: &mut dyn FnMut(&Open)) -> bool {
    let mut accepted = false;
    for start in (l.ts - spec.size + 1..=l.ts).filter(|s| s.rem_euclid(spec.slide) == 0) {
        let end = start + spec.size;
        if end - 1 + spec.lateness <= wm {
            continue;
        }
        accepted = true;
        let i = match windows.iter().position(|w| w.start == start) {
            Some(i) => i,
            None => {
                windows.push(Open { start, end, values: Vec::new() });
                windows.len() - 1
            }
        };
        windows[i].values.push(l.value.clone());
        if end - 1 <= wm {
            fire(&windows[i]);
        }
    }
    accepted
}

/// Sessions: the record's `[ts, ts + gap)` absorbs every session it overlaps or touches,
/// repeatedly; the merged session takes it unless that one is past its lateness.
fn add_to_session(spec: &Spec, windows: &mut Vec<Open>, l: &Line, wm: i64, fire: &mut dyn FnMut(&Open)) -> bool {
    let (mut start, mut end) = (l.ts, l.ts + spec.gap);
    let mut absorbed = vec![false; windows.len()];
    loop {
        let mut grew = false;
        for (i, w) in windows.iter().enumerate() {
            if !absorbed[i] && w.start <= end && start <= w.end {
                (start, end) = (start.min(w.start), end.max(w.end));
                absorbed[i] = true;
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    if end - 1 + spec.lateness <= wm {
        return false;
    }
    let mut values = vec![l.value.clone()];
    let mut kept = Vec::new();
    for (i, w) in windows.drain(..).enumerate() {
        if absorbed[i] { values.extend(w.values) } else { kept.push(w) }
    }
    kept.push(Open { start, end, values });
    *windows = kept;
    let merged = windows.last().unwrap();
    if merged.max_ts() <= wm {
        fire(merged);
    }
    true
}

/// The watermark moves from `old` to `new`: windows whose last millisecond it crosses fire,
/// windows past their lateness go.
fn advance(spec: &Spec, open: &mut BTreeMap<&str, Vec<Open>>, old: i64, new: i64, fire: &mut dyn FnMut(&str, &Open)) {
    for (key, windows) in open.iter_mut() {
        for w in windows.iter().filter(|w| old < w.max_ts() && w.max_ts() <= new) {
            fire(key, w);
        }
        windows.retain(|w| w.max_ts().saturating_add(spec.lateness) > new);
    }
}

pub(crate) fn job(spec: &Spec, component: &Path, p: u32, extra_source: &str, checkpoints: bool) -> String {
    let kind = match spec.kind {
        Kind::Tumbling => "tumbling",
        Kind::Sliding => "sliding",
        Kind::Session => "session",
    };
    let checkpoint = if checkpoints { "[checkpoint]\ninterval_ms = 50\ndir = \"chk\"\n" } else { "" };
    format!(
        "[job]\nname = \"win\"\nmax_parallelism = 32\nbatch_size = {batch}\n{checkpoint}\
         [[source]]\nid = \"in\"\ntype = \"file\"\npath = \"input.txt\"\nkey_column = 0\ntimestamp_column = 1\n\
         watermark_delay_ms = {delay}\n{extra_source}\
         [[operator]]\nid = \"win\"\ncomponent = {comp}\nparallelism = {p}\n\
         config = {{ kind = \"{kind}\", size_ms = \"{size}\", slide_ms = \"{slide}\", gap_ms = \"{gap}\", \
         lateness_ms = \"{lateness}\", aggregate = \"{aggregate}\" }}\n\
         inputs = [{{ from = \"in\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"win\" }}]\n\
         [[sink]]\nid = \"late\"\ntype = \"file\"\npath = \"late\"\ninputs = [{{ from = \"win\", output = \"late\" }}]\n",
        batch = spec.batch,
        delay = spec.delay,
        comp = toml_path(component),
        size = spec.size,
        slide = spec.slide,
        gap = spec.gap,
        lateness = spec.lateness,
        aggregate = spec.aggregate,
    )
}

pub(crate) fn write_input(dir: &Path, lines: &[Line]) {
    let text: String = lines.iter().map(|l| l.text() + "\n").collect();
    std::fs::write(dir.join("input.txt"), text).unwrap();
}

/// Runs `spec` through `component` at parallelism `p` over `lines` (with `faults`,
/// checkpointing then) and checks both outputs against the reference; returns the reference.
pub(crate) fn check(
    component: &Path,
    spec: &Spec,
    p: u32,
    lines: &[Line],
    faults: Option<Arc<FaultPlan>>,
) -> (Vec<String>, Vec<String>) {
    let d = scratch();
    write_input(d.path(), lines);
    let summary =
        crate::connectors::run(d.path(), &job(spec, component, p, "", faults.is_some()), faults.clone()).unwrap();
    if faults.is_some() {
        assert!(summary.attempts > 1, "the planned failures happened");
    }
    let expected = reference(spec, lines);
    assert_same(&committed_lines(&d.path().join("out")), &expected.0, "fired windows");
    assert_same(&committed_lines(&d.path().join("late")), &expected.1, "late records");
    expected
}

fn assert_same(got: &[String], want: &[String], what: &str) {
    if got != want {
        let missing: Vec<&String> = want.iter().filter(|l| !got.contains(l)).take(5).collect();
        let extra: Vec<&String> = got.iter().filter(|l| !want.contains(l)).take(5).collect();
        panic!("{what}: {} lines, the reference {}; missing {missing:?}, extra {extra:?}", got.len(), want.len());
    }
}

#[test]
fn window_tumbling_counts_with_lateness_and_late_side_output_match_the_reference() {
    let lines = input(3000, 1);
    let (out, late) = check(&component("test_windows"), &TUMBLING, 2, &lines, None);
    // Edges: half-open windows, negative time.
    for l in ["edge 0 10 2", "edge 10 20 1", "neg -10 0 2", "neg -20 -10 1"] {
        assert!(out.contains(&l.to_string()), "{l} in {:?}", &out[..8]);
    }
    // The input exercises every path: late records, and windows fired again within lateness.
    assert!(late.len() > 20, "late records: {}", late.len());
    let mut firings: BTreeMap<String, usize> = BTreeMap::new();
    for l in &out {
        let w: Vec<&str> = l.split(' ').take(3).collect();
        *firings.entry(w.join(" ")).or_default() += 1;
    }
    assert!(firings.values().filter(|&&n| n > 1).count() > 20, "late firings are exercised");
}

#[test]
fn window_sliding_sums_match_the_reference() {
    let spec = Spec { kind: Kind::Sliding, size: 30, slide: 10, lateness: 0, aggregate: "sum", ..TUMBLING };
    let (out, _) = check(&component("test_windows"), &spec, 3, &input(3000, 2), None);
    // Values of the edge lines: 3 at 0, 4 at 9, 5 at 10.
    assert!(out.contains(&"edge 0 30 12".to_string()) && out.contains(&"edge -20 10 7".to_string()), "{:?}", &out[..8]);
}

#[test]
fn window_sessions_merge_and_hand_every_record_to_their_window() {
    let spec = Spec { kind: Kind::Session, gap: 8, lateness: 4, aggregate: "all", ..TUMBLING };
    let lines = input(3000, 3);
    let (out, late) = check(&component("test_windows"), &spec, 2, &lines, None);
    // edge: [0, 8) ends before 9's [9, 17) starts; 10's [10, 18) merges with it.
    assert!(out.contains(&"edge 0 8 3".to_string()) && out.contains(&"edge 9 18 4+5".to_string()), "{:?}", &out[..8]);
    let merged = out.iter().filter(|l| l.split(' ').nth(3).unwrap().contains('+')).count();
    assert!(merged > 100 && !late.is_empty(), "sessions of several records: {merged}, late records: {}", late.len());
}

#[test]
fn window_results_hold_through_seeded_failures_and_restores() {
    let lines = input(4000, 4);
    for seed in 0..3 {
        let plan = FaultPlan::seeded(
            seed,
            1 + seed as u32 % 2,
            &[("win", 2)],
            1500,
            3,
            &[FaultKind::GuestTrap, FaultKind::HostPanic, FaultKind::DuringCheckpoint],
        );
        check(&component("test_windows"), &TUMBLING, 2, &lines, Some(Arc::new(plan)));
    }
}

#[test]
fn window_open_windows_move_with_a_savepoint_to_another_parallelism() {
    // One line per batch: the throttle cannot change where watermarks fall.
    let spec = Spec { kind: Kind::Session, gap: 8, lateness: 4, aggregate: "all", batch: 1, ..TUMBLING };
    let lines = input(3000, 5);
    let d = scratch();
    write_input(d.path(), &lines);
    let r = start(d.path(), &job(&spec, &component("test_windows"), 2, "rate = 3000\n", true), None, false);
    wait_records(&r, "win", 1000);
    let sp = d.path().join("sp");
    let mut r = r;
    r.handle.savepoint(Some(sp.clone()), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let before = committed_lines(&d.path().join("out")).len();
    let mut r = start(d.path(), &job(&spec, &component("test_windows"), 3, "", true), Some(sp), false);
    r.join().unwrap();
    let expected = reference(&spec, &lines);
    assert!(before > 0 && before < expected.0.len(), "stopped midway: {before} of {}", expected.0.len());
    assert_same(&committed_lines(&d.path().join("out")), &expected.0, "fired windows");
    assert_same(&committed_lines(&d.path().join("late")), &expected.1, "late records");
}

/// A live upgrade of a windowed operator on the disk backend, mid-stream with sessions open:
/// the new guest takes the store over with the windows' timers (restored into its host) and
/// non-keyed state, so every window still fires exactly as in the reference.
#[test]
fn state_disk_live_upgrade_of_open_windows_keeps_their_timers() {
    let spec = Spec { kind: Kind::Session, gap: 8, lateness: 4, aggregate: "all", batch: 1, ..TUMBLING };
    let lines = input(3000, 6);
    let d = scratch();
    write_input(d.path(), &lines);
    let toml = job(&spec, &component("test_windows"), 2, "rate = 3000\n", true).replace(
        "inputs = [{ from = \"in\", partition = \"hash\" }]",
        "state_backend = \"disk\"\nstate_cache_mb = 1\ninputs = [{ from = \"in\", partition = \"hash\" }]",
    );
    assert!(toml.contains("state_backend = \"disk\""));
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "win", 1000);
    let info = r.handle.upgrade("win", load_factory("test_windows"), Duration::from_secs(60)).unwrap();
    assert_eq!(info.migrated_from, None);
    let before = committed_lines(&d.path().join("out")).len();
    r.join().unwrap();
    let expected = reference(&spec, &lines);
    assert!(before < expected.0.len(), "upgraded midway: {before} of {} windows out", expected.0.len());
    assert_same(&committed_lines(&d.path().join("out")), &expected.0, "fired windows");
    assert_same(&committed_lines(&d.path().join("late")), &expected.1, "late records");
}

#[test]
fn window_state_is_gone_once_the_watermark_passes_the_window_and_its_lateness() {
    let spec = Spec { lateness: 20, ..TUMBLING };
    let mut lines: Vec<Line> =
        (0..100).map(|i| Line { key: format!("k{}", i % 5), ts: i, value: i.to_string() }).collect();
    lines.push(Line { key: "z".into(), ts: 1000, value: "z".into() });
    let d = scratch();
    write_input(d.path(), &lines);
    let mut r = start(d.path(), &job(&spec, &component("test_windows"), 2, "", true), None, false);
    // The end of input is held: the watermark stops at 1000 - 3, past every k window + 20.
    let t0 = Instant::now();
    while !r.handle.status().nodes.iter().any(|n| n.uid == "win" && n.watermark == Some(997)) {
        assert!(t0.elapsed() < Duration::from_secs(60), "the watermark never reached 997: {:?}", r.handle.status());
        std::thread::sleep(Duration::from_millis(5));
    }
    for key in ["k0", "k1", "k2", "k3", "k4"] {
        let a = r.handle.query("win", key.as_bytes(), Some("windows"), Duration::from_secs(30)).unwrap();
        assert!(!a.found, "{key} still has windows: {a:?}");
    }
    let z = r.handle.query("win", b"z", Some("windows"), Duration::from_secs(30)).unwrap();
    assert!(z.found, "z's window [1000, 1010) is open");
    r.join().unwrap();
    let out = committed_lines(&d.path().join("out"));
    assert_eq!(out.len(), 51, "ten windows of each k, one of z: {out:?}");
}

#[test]
fn window_definitions_that_cannot_work_are_refused_before_any_record() {
    let d = scratch();
    write_input(d.path(), &input(10, 6));
    for (spec, says) in [
        (Spec { size: 0, ..TUMBLING }, "size must be positive"),
        (
            Spec { kind: Kind::Sliding, size: 10, slide: 20, ..TUMBLING },
            "slide (20 ms) is longer than its size (10 ms)",
        ),
        (Spec { kind: Kind::Session, gap: 0, ..TUMBLING }, "session gap must be positive"),
        (Spec { lateness: -1, ..TUMBLING }, "allowed lateness must be 0 or more"),
    ] {
        let e =
            crate::connectors::run(d.path(), &job(&spec, &component("test_windows"), 1, "", false), None).unwrap_err();
        assert!(e.contains(says) && e.contains("win"), "{e}");
    }
    assert!(committed_lines(&d.path().join("out")).is_empty());
    // The source's own options.
    let bad = job(&TUMBLING, &component("test_windows"), 1, "", false).replace("timestamp_column = 1\n", "");
    let e = crate::connectors::run(d.path(), &bad, None).unwrap_err();
    assert!(e.contains("`watermark_delay_ms` needs `timestamp_column"), "{e}");
    std::fs::write(d.path().join("input.txt"), "a,1,x\nb,noon,y\n").unwrap();
    let e =
        crate::connectors::run(d.path(), &job(&TUMBLING, &component("test_windows"), 1, "", false), None).unwrap_err();
    assert!(e.contains("line 2 of") && e.contains("input.txt") && e.contains("`noon`, not a timestamp"), "{e}");
}

/// A guest opened mid-stream (a live upgrade's new instance) starts from the host's running
/// watermark, not from "no watermark yet": opened at 1 000 000, a record at 0 is late at once
/// and goes to the late side output, with no window opened. Driven on the component itself, so
/// it holds however the records of a running job fall around the upgrade; the windows of every
/// SDK run it (`lang_windows.rs`).
pub(crate) fn assert_opens_at_the_running_watermark(component: &Path) {
    let c = LoadedComponent::load(&new_engine().unwrap(), "win", component).unwrap();
    let task = TaskInfo {
        job_name: "win".into(),
        operator_uid: "win".into(),
        subtask_index: 0,
        parallelism: 1,
        max_parallelism: 32,
        key_group_start: 0,
        key_group_end: 32,
    };
    let mut host = HostState::new(task, c.info.side_outputs.len() as u32);
    host.echo_logs = false;
    host.watermark = 1_000_000;
    let mut i = c.instantiate(host).unwrap();
    let config = [("kind", "tumbling"), ("size_ms", "10"), ("lateness_ms", "5"), ("aggregate", "count")];
    i.open(&config.map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
    let mut batch = Batch::default();
    batch.push(key_group(b"k", 32), 0, b"k", b"k,0,v");
    i.process(Side::Left, &batch).unwrap();
    let late = 1 + c.info.side_outputs.iter().position(|s| s == "late").unwrap() as u32;
    let out: Vec<(u32, String)> =
        i.take_emitted().iter().map(|r| (r.tag, String::from_utf8_lossy(r.value).into_owned())).collect();
    assert_eq!(
        out,
        [(late, "k,0,v".to_string())],
        "{}: a record behind the watermark it opened at",
        component.display()
    );
    assert!(i.host().event_timers.is_empty(), "{}: no window opened", component.display());
}

#[test]
fn window_a_guest_opened_mid_stream_starts_from_the_running_watermark() {
    assert_opens_at_the_running_watermark(&component("test_windows"));
}

/// The same through a live upgrade of a running job, on both backends (the disk one hands its
/// store over): after a first record far ahead the watermark jumps there and stays, so every
/// later record is late, also each one the new guest takes before any further watermark.
#[test]
fn window_a_live_upgrade_keeps_late_records_late() {
    let spec = Spec { batch: 1, ..TUMBLING };
    let mut lines = vec![Line { key: "k0".into(), ts: 1_000_000, value: "first".into() }];
    lines.extend((1..3000).map(|i| Line { key: format!("k{}", i % 7), ts: i % 1000, value: i.to_string() }));
    let expected = reference(&spec, &lines);
    assert_eq!(expected.0, ["k0 1000000 1000010 1"], "only the first record is on time");
    for backend in ["memory", "disk"] {
        // Three seconds of input: the upgrade (its component compiled beforehand) lands well
        // inside it. A machine stalled past the whole input is retried, not taken for a pass.
        let midway = (0..3).any(|_| upgraded_midway(&spec, &lines, &expected, backend));
        assert!(midway, "{backend}: three runs ended their input before the upgrade");
    }
}

/// One run of [`window_a_live_upgrade_keeps_late_records_late`] on `backend`: checks the
/// output, returns whether the upgrade came before the input's end.
fn upgraded_midway(spec: &Spec, lines: &[Line], expected: &(Vec<String>, Vec<String>), backend: &str) -> bool {
    let d = scratch();
    write_input(d.path(), lines);
    let toml = job(spec, &component("test_windows"), 2, "rate = 1000\n", true).replace(
        "inputs = [{ from = \"in\", partition = \"hash\" }]",
        &format!("state_backend = \"{backend}\"\ninputs = [{{ from = \"in\", partition = \"hash\" }}]"),
    );
    let factory = load_factory("test_windows");
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "win", 100);
    r.handle.upgrade("win", factory, Duration::from_secs(60)).unwrap();
    let seen = r.handle.status().nodes.iter().find(|n| n.uid == "win").unwrap().records_in;
    r.join().unwrap();
    assert_same(&committed_lines(&d.path().join("out")), &expected.0, &format!("{backend}: fired windows"));
    assert_same(&committed_lines(&d.path().join("late")), &expected.1, &format!("{backend}: late records"));
    seen < lines.len() as u64
}
