//! Operators in other languages: the same contract, state, checkpoints and savepoints as Rust.
//! JavaScript (QuickJS, componentize-qjs) so far: `guest-sdk/js/weir.js` and the wordcount
//! counter in `examples/wordcount/counter-js`.

use std::sync::Arc;
use std::time::Duration;

use weir::job;
use weir::runtime::executor::{self, RunOptions};
use weir::runtime::faults::{Fault, FaultKind, FaultPlan};
use weir::sandbox::engine::new_engine;

use crate::savepoints::{start, wait_records, wordcount_expected, wordcount_job_with};
use crate::support::{committed_lines, component, js_component, run_job_in, scratch, toml_path};

const JS_COUNTER: &str = "examples/wordcount/counter-js/counter.js";

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

#[test]
fn lang_js_wordcount_output_is_byte_identical_to_the_rust_counter() {
    let (rust, js) = (scratch(), scratch());
    run_job_in(rust.path(), &example_wordcount(&component("wordcount_counter"))).unwrap();
    run_job_in(js.path(), &example_wordcount(&js_component(JS_COUNTER))).unwrap();
    let (r, j) = (committed_lines(&rust.path().join("out")), committed_lines(&js.path().join("out")));
    assert_eq!(r.len(), 457);
    assert!(r == j, "the JavaScript counter's output differs from the Rust counter's");
}

#[test]
fn lang_js_checkpoint_restores_after_a_failure_with_exactly_once() {
    let d = scratch();
    let toml = wordcount_job_with(&js_component(JS_COUNTER), 2, 3000);
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
fn lang_js_savepoints_move_between_the_rust_and_javascript_counters() {
    // Rust (p=2) -> savepoint -> JavaScript (p=3) -> savepoint -> Rust (p=1): state is
    // language-independent by contract.
    let d = scratch();
    let (js, rust) = (js_component(JS_COUNTER), component("wordcount_counter"));
    let (sp1, sp2) = (d.path().join("sp1"), d.path().join("sp2"));
    let r = start(d.path(), &wordcount_job_with(&rust, 2, 2000), None, false);
    wait_records(&r, "count", 1500);
    r.handle.savepoint(Some(sp1.clone()), true, Duration::from_secs(60)).unwrap();
    r.thread.join().unwrap().unwrap();
    let r = start(d.path(), &wordcount_job_with(&js, 3, 2000), Some(sp1), false);
    wait_records(&r, "count", 1500);
    r.handle.savepoint(Some(sp2.clone()), true, Duration::from_secs(60)).unwrap();
    r.thread.join().unwrap().unwrap();
    let r = start(d.path(), &wordcount_job_with(&rust, 1, 0), Some(sp2), false);
    r.thread.join().unwrap().unwrap();
    assert_eq!(committed_lines(&d.path().join("out")), wordcount_expected());
}
