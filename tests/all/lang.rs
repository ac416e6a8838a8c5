//! Operators in other languages: the same contract, state, checkpoints and savepoints as Rust.
//! C (clang + wasi-libc + wit-bindgen c: `guest-sdk/c`), JavaScript (QuickJS, componentize-qjs:
//! `guest-sdk/js/weir.js`) and Python (componentize-py: `guest-sdk/python/src/weir.py`); the
//! wordcount counter in `examples/wordcount/counter-c`, `counter-js` and `counter-py`.

use std::sync::Arc;
use std::time::Duration;

use weir::job;
use weir::runtime::executor::{self, RunOptions};
use weir::runtime::faults::{Fault, FaultKind, FaultPlan};
use weir::sandbox::engine::new_engine;

use crate::savepoints::{start, wait_records, wordcount_expected, wordcount_job_with};
use crate::support::{
    c_component, committed_lines, component, js_component, py_component, run_job_in, scratch, toml_path,
};

const C_COUNTER: &str = "examples/wordcount/counter-c/counter.c";
const JS_COUNTER: &str = "examples/wordcount/counter-js/counter.js";
const PY_COUNTER: &str = "examples/wordcount/counter-py/app.py";

/// examples/wordcount with the counter at `counter`, in `dir`.
fn example_wordcount(counter: &std::path::Path) -> String {
    let ex = crate::support::root().join("examples/wordcount");
    std::fs::read_to_string(ex.join("job.toml"))
        .unwrap()
        .replace("path = \"input.txt\"", &format!("path = {}", toml_path(&ex.join("input.txt"))))
        .replace(
            "component = \"../../target/wasm32-unknown-unknown/guest/wordcount_tokenizer.wasm\"",
            &format!("component = {}", toml_path(&component("wordcount_tokenizer"))),
        )
        .replace(
            "component = \"../../target/wasm32-unknown-unknown/guest/wordcount_counter.wasm\"",
            &format!("component = {}", toml_path(counter)),
        )
}

fn output_matches_the_rust_counter(counter: std::path::PathBuf) {
    let (rust, other) = (scratch(), scratch());
    run_job_in(rust.path(), &example_wordcount(&component("wordcount_counter"))).unwrap();
    run_job_in(other.path(), &example_wordcount(&counter)).unwrap();
    let (r, o) = (committed_lines(&rust.path().join("out")), committed_lines(&other.path().join("out")));
    assert_eq!(r.len(), 457);
    assert!(r == o, "the counter's output differs from the Rust counter's");
}

#[test]
fn lang_c_wordcount_output_is_byte_identical_to_the_rust_counter() {
    output_matches_the_rust_counter(c_component(C_COUNTER));
}

#[test]
fn lang_js_wordcount_output_is_byte_identical_to_the_rust_counter() {
    output_matches_the_rust_counter(js_component(JS_COUNTER));
}

#[test]
fn lang_python_wordcount_output_is_byte_identical_to_the_rust_counter() {
    output_matches_the_rust_counter(py_component(PY_COUNTER));
}

fn restores_after_a_failure(counter: std::path::PathBuf) {
    let d = scratch();
    let toml = wordcount_job_with(&counter, 2, 3000);
    let path = d.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), job::parse(&path, &toml).unwrap()).unwrap();
    let fault = Fault {
        attempt: 0,
        node: "count".into(),
        subtask: 0,
        after_records: 1500,
        after_checkpoints: 2,
        kind: FaultKind::GuestTrap,
    };
    let opts =
        RunOptions { quiet_guests: true, faults: Some(Arc::new(FaultPlan::new(vec![fault]))), ..Default::default() };
    let s = executor::run(&bound, &opts).unwrap();
    assert_eq!(s.attempts, 2, "the injected failure happened and the job restarted from its checkpoint");
    assert_eq!(committed_lines(&d.path().join("out")), wordcount_expected(), "no word lost or counted twice");
}

#[test]
fn lang_c_checkpoint_restores_after_a_failure_with_exactly_once() {
    restores_after_a_failure(c_component(C_COUNTER));
}

#[test]
fn lang_js_checkpoint_restores_after_a_failure_with_exactly_once() {
    restores_after_a_failure(js_component(JS_COUNTER));
}

#[test]
fn lang_python_checkpoint_restores_after_a_failure_with_exactly_once() {
    restores_after_a_failure(py_component(PY_COUNTER));
}

#[test]
fn lang_savepoints_move_between_rust_c_javascript_and_python_counters() {
    // Rust (p=2) -> C (p=1) -> JavaScript (p=3) -> Python (p=2) -> Rust (p=1), a savepoint
    // between each: state is language-independent by contract.
    let d = scratch();
    let chain = [
        (component("wordcount_counter"), 2),
        (c_component(C_COUNTER), 1),
        (js_component(JS_COUNTER), 3),
        (py_component(PY_COUNTER), 2),
        (component("wordcount_counter"), 1),
    ];
    let mut restore = None;
    for (i, (counter, p)) in chain.iter().enumerate() {
        let last = i + 1 == chain.len();
        let mut r =
            start(d.path(), &wordcount_job_with(counter, *p, if last { 0 } else { 2000 }), restore.take(), false);
        if !last {
            wait_records(&r, "count", 1000);
            let sp = d.path().join(format!("sp{i}"));
            r.handle.savepoint(Some(sp.clone()), true, Duration::from_secs(60)).unwrap();
            restore = Some(sp);
        }
        r.join().unwrap();
    }
    assert_eq!(committed_lines(&d.path().join("out")), wordcount_expected());
}

/// Rust v1 (schema 1) -> savepoint -> `v2` in another language (schema 2, migrates from 1)
/// -> savepoint -> Rust v2 (examples/upgrade/counter-v2) to the end: the migration ran, and
/// wrote exactly the layout the Rust v2 reads.
fn migrates_like_rust(v2: std::path::PathBuf) {
    let d = scratch();
    let (sp1, sp2) = (d.path().join("sp1"), d.path().join("sp2"));
    let mut r = start(d.path(), &wordcount_job_with(&component("wordcount_counter"), 2, 2000), None, false);
    wait_records(&r, "count", 1000);
    r.handle.savepoint(Some(sp1.clone()), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let mut r = start(d.path(), &wordcount_job_with(&v2, 2, 2000), Some(sp1), false);
    wait_records(&r, "count", 1000);
    r.handle.savepoint(Some(sp2.clone()), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let m = weir::checkpoint::storage::load(&sp2).unwrap().manifest;
    assert_eq!(m.operator("count").unwrap().component.as_ref().unwrap().schema_version, 2);
    let mut r = start(d.path(), &wordcount_job_with(&component("wordcount_counter_v2"), 2, 0), Some(sp2), false);
    r.join().unwrap();
    assert_eq!(committed_lines(&d.path().join("out")), wordcount_expected());
}

#[test]
fn lang_c_migrates_schema_1_state_like_rust() {
    migrates_like_rust(c_component("examples/upgrade/counter-v2-c/counter.c"));
}

#[test]
fn lang_js_migrates_schema_1_state_like_rust() {
    migrates_like_rust(js_component("examples/upgrade/counter-v2-js/counter.js"));
}

#[test]
fn lang_python_migrates_schema_1_state_like_rust() {
    migrates_like_rust(py_component("examples/upgrade/counter-v2-py/app.py"));
}
