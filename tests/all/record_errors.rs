//! An operator error names the record it failed on (its position in the input: the source,
//! file and line; its key; its timestamp), in every SDK, and `on_error = "dead-letter"` sends
//! such records to a dead-letter output instead of failing the job.

use std::path::Path;

use crate::support::{
    c_component, committed_lines, component, guests, js_component, py_component, scratch, toml_path, weir,
};

/// Runs the job `toml` with `weir run` in `dir`; returns (success, stderr).
fn run_weir(dir: &Path, toml: &str) -> (bool, String) {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let out = weir().args(["run", "--progress", "0", "--quiet-guests"]).arg(&path).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn failing_job(component: &Path, parallelism: u32) -> String {
    format!(
        r#"[job]
name = "rec-err"
max_parallelism = 8

[restart]
strategy = "none"

[[source]]
id = "input"
type = "file"
path = "input.txt"
key_column = 0

[[operator]]
id = "op"
component = {}
parallelism = {parallelism}
inputs = [{{ from = "input", partition = "hash" }}]

[[sink]]
id = "out"
type = "file"
path = "out"
inputs = [{{ from = "op" }}]
"#,
        toml_path(component)
    )
}

fn names_the_record(component: &Path, input: &str, line: u32, key: &str, message: &str) {
    let dir = scratch();
    std::fs::write(dir.path().join("input.txt"), input).unwrap();
    let (ok, err) = run_weir(dir.path(), &failing_job(component, 2));
    assert!(!ok, "the job must fail:\n{err}");
    let at = format!("/input.txt line {line}: key `{key}`, timestamp {}", line - 1);
    assert!(err.contains(message) && err.contains(&at) && err.contains("source `input`"), "want `{at}`:\n{err}");
}

#[test]
fn newcomer_operator_error_names_the_file_line_and_key_of_the_record_in_rust() {
    guests();
    let input = "a,count\nb,count\na,count\nzed,error\nb,count\n";
    names_the_record(&component("test_probe"), input, 4, "zed", "probe failed on request");
}

#[test]
fn newcomer_operator_error_names_the_file_line_and_key_of_the_record_in_c_js_and_python() {
    let input = "x\ny\nx\nz\npanic\ny\n";
    for c in [
        c_component("examples/wordcount/counter-c/counter.c"),
        js_component("examples/wordcount/counter-js/counter.js"),
        py_component("examples/wordcount/counter-py/app.py"),
    ] {
        names_the_record(&c, input, 5, "panic", "counter: failing on request");
    }
}

fn dead_letter_job(on_error: &str) -> String {
    format!(
        r#"[job]
name = "dead-letters"
max_parallelism = 8

[checkpoint]
interval_ms = 50
dir = "checkpoints"

[[source]]
id = "input"
type = "file"
path = "input.txt"
key_column = 0

[[operator]]
id = "probe"
component = {}
parallelism = 2
{on_error}
inputs = [{{ from = "input", partition = "hash" }}]

[[sink]]
id = "out"
type = "file"
path = "out"
inputs = [{{ from = "probe" }}]

[[sink]]
id = "dead"
type = "file"
path = "dead"
inputs = [{{ from = "probe", output = "dead-letter" }}]
"#,
        toml_path(&component("test_probe"))
    )
}

/// 300 lines of `k<i%7>,count` with every tenth an error of one of two kinds; returns the
/// input, the sorted output the counts must give and the sorted dead letters.
fn dead_letter_input() -> (String, Vec<String>, Vec<String>) {
    let mut input = String::new();
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for i in 0..300 {
        let key = format!("k{}", i % 7);
        if i % 10 == 3 {
            // Errors of two kinds, both returned (not trapped) by the operator.
            let line = if i % 20 == 3 { format!("{key},error") } else { format!("{key},bogus:{i}") };
            bad.push(line.clone());
            input += &line;
        } else {
            input += &format!("{key},count");
            let n = good.iter().filter(|l: &&String| l.starts_with(&format!("{key}="))).count() + 1;
            good.push(format!("{key}={n}"));
        }
        input.push('\n');
    }
    good.sort();
    bad.sort();
    (input, good, bad)
}

#[test]
fn newcomer_dead_letters_go_to_their_output_and_the_job_goes_on() {
    guests();
    let dir = scratch();
    let (input, good, bad) = dead_letter_input();
    std::fs::write(dir.path().join("input.txt"), input).unwrap();
    let (ok, err) = run_weir(dir.path(), &dead_letter_job("on_error = \"dead-letter\""));
    assert!(ok, "{err}");
    assert_eq!(committed_lines(&dir.path().join("out")), good);
    assert_eq!(committed_lines(&dir.path().join("dead")), bad);
    assert!(err.contains("dead letter: record") && err.contains("probe failed on request"), "{err}");
}

#[test]
fn newcomer_a_dead_letter_output_without_on_error_is_refused_naming_the_fix() {
    guests();
    let dir = scratch();
    std::fs::write(dir.path().join("input.txt"), "a,count\n").unwrap();
    let (ok, err) = run_weir(dir.path(), &dead_letter_job(""));
    assert!(!ok && err.contains("no side output `dead-letter`") && err.contains("on_error = \"dead-letter\""), "{err}");
    let (ok, err) = run_weir(dir.path(), &dead_letter_job("on_error = \"skip\""));
    assert!(!ok && err.contains("unknown on_error `skip`") && err.contains("job.toml:"), "{err}");
}

/// Dead letters are output like any other: after a host panic and a guest trap (each once a
/// checkpoint completed, on events the test controls), both outputs hold every line once.
#[test]
fn newcomer_dead_letters_are_exactly_once_across_failures() {
    use std::sync::Arc;
    use weir::runtime::executor::{self, RunOptions};
    use weir::runtime::faults::{Fault, FaultKind, FaultPlan};
    guests();
    let dir = scratch();
    let (input, good, bad) = dead_letter_input();
    std::fs::write(dir.path().join("input.txt"), input).unwrap();
    let toml = dead_letter_job("on_error = \"dead-letter\"")
        .replace("[[source]]", "[restart]\nstrategy = \"fixed-delay\"\nattempts = 5\ndelay_ms = 5\n\n[[source]]");
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let fault = |attempt, subtask, kind| Fault {
        attempt,
        node: "probe".into(),
        subtask,
        after_records: 40,
        after_checkpoints: 1,
        kind,
    };
    let plan = Arc::new(FaultPlan::new(vec![fault(0, 0, FaultKind::HostPanic), fault(1, 1, FaultKind::GuestTrap)]));
    let bound =
        weir::job::bind::bind(&weir::sandbox::engine::new_engine().unwrap(), weir::job::parse(&path, &toml).unwrap())
            .unwrap();
    let opts = RunOptions { quiet_guests: true, faults: Some(plan.clone()), ..Default::default() };
    let summary = executor::run(&bound, &opts).unwrap_or_else(|e| panic!("run failed: {e}"));
    assert_eq!(summary.attempts, 3, "both planned failures fired");
    assert_eq!(committed_lines(&dir.path().join("out")), good);
    assert_eq!(committed_lines(&dir.path().join("dead")), bad);
}
