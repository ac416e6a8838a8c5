//! Unaligned checkpoints (`[checkpoint] alignment = "unaligned"`, and aligned ones that switch
//! after `alignment_timeout_ms`): under backpressure the barriers overtake the records queued
//! in the channels; those records are written with the checkpoint and replayed on restore —
//! also at another parallelism — so exactly-once holds.
//!
//! Every job here throttles its output sink below the sources' rate, so the channels are
//! full whenever a checkpoint is taken, and each test asserts that records in flight were
//! really written (else it would prove nothing about overtaking).

use std::time::Duration;

use weir::checkpoint::storage;

use crate::cycles::{check_loop_exactly_once, oracle_job};
use crate::exactly_once::{Topology, check_topology, parallel, two_input};
use crate::savepoints::{start, wait_records};
use crate::support::{committed_lines, component, scratch, toml_path};

#[test]
fn unaligned_exactly_once_at_parallelism_three_under_seeded_failures() {
    check_topology(Topology { name: "un-p3", unaligned: Some(6_000), ..parallel() }, 0);
}

/// `alignment_timeout_ms`: checkpoints start aligned; under backpressure (the sink throttled
/// below the sources) they switch to unaligned after 20 ms — records in flight are written —
/// and exactly-once holds through seeded failures.
#[test]
fn unaligned_an_alignment_timeout_switches_under_backpressure_exactly_once_under_seeded_failures() {
    check_topology(
        Topology { name: "un-timeout", unaligned: Some(6_000), alignment_timeout_ms: Some(20), ..parallel() },
        2,
    );
}

/// With a timeout no checkpoint reaches, every checkpoint aligns (the barriers still overtake
/// the records, and each input is parked once it consumed those before its barrier): nothing
/// in flight is written, and exactly-once holds through seeded failures.
#[test]
fn unaligned_checkpoints_within_their_alignment_timeout_align_and_write_nothing_in_flight() {
    check_topology(Topology { name: "un-aligns", alignment_timeout_ms: Some(50_000), ..two_input() }, 0);
}

#[test]
fn unaligned_exactly_once_with_a_two_input_operator_under_seeded_failures() {
    check_topology(Topology { name: "un-join", unaligned: Some(5_000), ..two_input() }, 1);
}

/// The loop oracle (a hash back-edge across two subtasks) with `setting` in `[checkpoint]` and
/// its output sink slower than its sources, exactly-once through seeded failures.
fn check_loop(setting: &str) {
    let toml = oracle_job(3, 4, 12_000)
        .replace("rate = 20000\n", "rate = 8000\n")
        .replace("retained = 2\n", &format!("retained = 2\n{setting}\n"))
        .replace("path = \"done\"\n", "path = \"done\"\nrate = 6000\n");
    assert!(toml.contains(setting) && toml.contains("rate = 6000"));
    check_loop_exactly_once(&toml, 12_000);
}

/// Chandy–Lamport's snapshot at the first barrier on any input, back-edges logged like every
/// other input until their barrier returns.
#[test]
fn unaligned_a_loop_stays_exactly_once_under_seeded_failures() {
    check_loop("alignment = \"unaligned\"");
}

/// With `alignment_timeout_ms`: the loop head is unaligned from its first barrier (it cannot
/// align: its back-edges return its own barrier), the loop body aligns and switches.
#[test]
fn unaligned_a_loop_with_an_alignment_timeout_stays_exactly_once_under_seeded_failures() {
    check_loop("alignment_timeout_ms = 10");
}

pub(crate) const COUNT: u64 = 24_000;
const KEYS: u64 = 48;

/// generator → oracle (hash, parallelism `p`) → file sink (forward, parallelism `p`, throttled).
pub(crate) fn job(p: u32, sink_rate: u64) -> String {
    format!(
        "[job]\nname = \"un\"\nmax_parallelism = 32\nbatch_size = 64\nchannel_capacity = 4\n\
         [checkpoint]\ninterval_ms = 50\ndir = \"chk\"\nalignment = \"unaligned\"\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {COUNT}\nkeys = {KEYS}\nrate = 20000\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nparallelism = {p}\nconfig = {{ keys = \"{KEYS}\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = {p}\nrate = {sink_rate}\n\
         inputs = [{{ from = \"oracle\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\n\
         inputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        toml_path(&component("test_oracle"))
    )
}

/// A stop with a savepoint while the channels are full: the savepoint holds records in
/// flight, and restoring it at parallelism 2 → 3 and 3 → 1 (the records re-routed by key
/// group or spread over the new subtasks) gives every (key, seq) exactly once.
fn rescale(from: u32, to: u32) {
    let d = scratch();
    let sp = d.path().join("sp");
    let r = start(d.path(), &job(from, 3_000), None, false);
    wait_records(&r, "oracle", COUNT / 3);
    let mut r = r;
    r.handle.savepoint(Some(sp.clone()), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let m = storage::load(&sp).unwrap().manifest;
    assert!(m.metrics.backedge_log_records > 0, "the savepoint holds no records in flight: nothing was overtaken");
    let before = committed_lines(&d.path().join("out")).len() as u64;
    assert!(before < COUNT, "stopped mid-stream ({before} lines committed)");
    let mut r = start(d.path(), &job(to, 1_000_000), Some(sp), false);
    let s = r.join().unwrap();
    assert!(s.restored_from.is_some());
    let v = committed_lines(&d.path().join("violations"));
    assert!(v.is_empty(), "oracle violations: {:?}", &v[..v.len().min(5)]);
    let mut golden: Vec<String> = (0..COUNT).map(|i| format!("{} {}", i % KEYS, i / KEYS)).collect();
    golden.sort();
    let lines = committed_lines(&d.path().join("out"));
    assert_eq!(lines.len(), golden.len(), "committed {} lines, expected {}", lines.len(), golden.len());
    assert!(lines == golden, "committed output differs from the uninterrupted run");
}

#[test]
fn unaligned_a_savepoint_with_records_in_flight_restores_at_a_higher_parallelism_exactly_once() {
    rescale(2, 3);
}

#[test]
fn unaligned_a_savepoint_with_records_in_flight_restores_at_a_lower_parallelism_exactly_once() {
    rescale(3, 1);
}
