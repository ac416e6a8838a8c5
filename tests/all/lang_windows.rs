//! Tumbling windows in the C, JavaScript and Python SDKs (`weir_tumbling` in
//! `guest-sdk/c/weir.h`, `tumbling` in `guest-sdk/js/weir.js` and `guest-sdk/python/src/weir.py`):
//! the operator of `tests/guests/windows`, tumbling only, written in each language
//! (`tests/guests/windows/windows-{c,js,py}`), runs the jobs of `windows.rs` and must write
//! exactly what its reference says: the same firings (late ones included) and late records.
//!
//! Each language runs the Rust test's job (counts, lateness 5, late side output), sums at
//! another parallelism, the counts again through a seeded failure and a restore from a
//! checkpoint (so the windows' state and timers round-trip), and two definitions that must be
//! refused before any record; opened mid-stream (a live upgrade), each starts from the running
//! watermark.

use std::path::Path;
use std::sync::Arc;

use weir::runtime::faults::{FaultKind, FaultPlan};

use crate::support::{c_component, committed_lines, js_component, py_component, scratch};
use crate::windows::{Spec, TUMBLING, assert_opens_at_the_running_watermark, check, input, job, write_input};

const C_WINDOWS: &str = "tests/guests/windows/windows-c/windows.c";
const JS_WINDOWS: &str = "tests/guests/windows/windows-js/windows.js";
const PY_WINDOWS: &str = "tests/guests/windows/windows-py/app.py";

fn matches_the_rust_reference(component: &Path) {
    assert_opens_at_the_running_watermark(component);
    // The job of `window_tumbling_counts_with_lateness_and_late_side_output_match_the_reference`.
    let (out, late) = check(component, &TUMBLING, 2, &input(3000, 1), None);
    let refired = out
        .iter()
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .fold(std::collections::BTreeMap::<String, usize>::new(), |mut m, w| {
            *m.entry(w).or_default() += 1;
            m
        })
        .values()
        .filter(|&&n| n > 1)
        .count();
    assert!(late.len() > 20 && refired > 20, "late records: {}, windows fired again: {refired}", late.len());

    check(component, &Spec { aggregate: "sum", ..TUMBLING }, 3, &input(2000, 2), None);

    let kinds = [FaultKind::GuestTrap, FaultKind::HostPanic, FaultKind::DuringCheckpoint];
    let plan = FaultPlan::seeded(0, 1, &[("win", 2)], 1500, 3, &kinds);
    check(component, &TUMBLING, 2, &input(4000, 4), Some(Arc::new(plan)));

    let d = scratch();
    write_input(d.path(), &input(10, 6));
    for (spec, says) in [
        (Spec { size: 0, ..TUMBLING }, "a tumbling window's size must be positive, not 0 ms"),
        (Spec { lateness: -1, ..TUMBLING }, "allowed lateness must be 0 or more, not -1 ms"),
    ] {
        let e = crate::connectors::run(d.path(), &job(&spec, component, 1, "", false), None).unwrap_err();
        assert!(e.contains(says) && e.contains("win"), "{e}");
    }
    assert!(committed_lines(&d.path().join("out")).is_empty());
}

#[test]
fn window_c_tumbling_windows_match_the_rust_reference() {
    matches_the_rust_reference(&c_component(C_WINDOWS));
}

#[test]
fn window_js_tumbling_windows_match_the_rust_reference() {
    matches_the_rust_reference(&js_component(JS_WINDOWS));
}

#[test]
fn window_python_tumbling_windows_match_the_rust_reference() {
    matches_the_rust_reference(&py_component(PY_WINDOWS));
}

/// The C SDK checks what a C operator cannot be trusted to: keyed state used with no current
/// key (here in `weir_on_open`) traps naming the mistake instead of reading through a null
/// record into whatever memory is there; the job is refused before it starts (its probe runs
/// `weir_on_open`).
#[test]
fn lang_c_keyed_state_without_a_current_key_traps_naming_the_mistake() {
    let d = scratch();
    write_input(d.path(), &input(10, 6));
    let toml = job(&TUMBLING, &c_component(C_WINDOWS), 1, "", false)
        .replace("aggregate = \"count\" }", "aggregate = \"count\", misuse = \"state_in_open\" }");
    assert!(toml.contains("misuse"), "{toml}");
    let e = crate::connectors::run(d.path(), &toml, None).unwrap_err();
    assert!(e.contains("keyed state used outside a record or timer") && e.contains("`win`"), "{e}");
    assert!(committed_lines(&d.path().join("out")).is_empty());
}
