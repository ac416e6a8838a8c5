//! Bad input gets a clear error that names the file, line, object and fix, and a non-zero
//! exit: malformed job files, invalid graphs, bad components, failing guests.

use std::path::Path;

use crate::support::{component, guests, run_job_in, scratch, toml_path, weir};

/// Writes `job` into a scratch dir, runs `weir validate` on it, expects failure; returns stderr.
fn validate_fails(job: &str, setup: impl FnOnce(&Path)) -> String {
    guests();
    let dir = scratch();
    setup(dir.path());
    let path = dir.path().join("job.toml");
    std::fs::write(&path, job).unwrap();
    let out = weir().arg("validate").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "validate must fail, stderr: {stderr}");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

/// Writes `job` into a scratch dir and expects `weir validate` to accept it.
fn validate_ok(job: &str) {
    guests();
    let dir = scratch();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, job).unwrap();
    let out = weir().arg("validate").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn counter() -> String {
    toml_path(&component("wordcount_counter"))
}

fn good_job() -> String {
    format!(
        r#"[job]
name = "j"
max_parallelism = 8

[[source]]
id = "gen"
type = "generator"
count = 10

[[operator]]
id = "count"
component = {}
parallelism = 2
inputs = [{{ from = "gen", partition = "hash" }}]

[[sink]]
id = "out"
type = "blackhole"
inputs = [{{ from = "count" }}]
"#,
        counter()
    )
}

#[test]
fn good_job_validates() {
    guests();
    let dir = scratch();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, good_job()).unwrap();
    let out = weir().arg("validate").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("wordcount-counter 1.0.0"), "{stdout}");
}

#[test]
fn toml_syntax_error_names_the_line() {
    let e = validate_fails("[job]\nname = \"j\"\n[[source]\nid = 1\n", |_| {});
    assert!(e.contains("job.toml:3:"), "{e}");
}

#[test]
fn newcomer_unquoted_text_in_a_job_file_is_explained_in_plain_words() {
    let e = validate_fails("[job]\nname = wordcount\n", |_| {});
    assert!(e.contains("job.toml:2:") && e.contains("text needs quotes in TOML: write `name = \"wordcount\"`"), "{e}");
}

#[test]
fn misspelled_field_is_an_error_not_a_default() {
    let job = good_job().replace("parallelism = 2", "paralelism = 2");
    let e = validate_fails(&job, |_| {});
    assert!(e.contains("job.toml:13:") && e.contains("unknown field `paralelism`"), "{e}");
}

#[test]
fn unknown_input_id_names_the_line_and_the_known_ids() {
    let job = good_job().replace("from = \"gen\"", "from = \"gne\"");
    let e = validate_fails(&job, |_| {});
    assert!(e.contains("job.toml:14:"), "{e}");
    assert!(e.contains("unknown id `gne`") && e.contains("known ids: count, gen, out"), "{e}");
}

#[test]
fn duplicate_id_names_both_lines() {
    let job = good_job().replace("id = \"out\"", "id = \"count\"");
    let e = validate_fails(&job, |_| {});
    assert!(
        e.contains("job.toml:17:") && e.contains("duplicate id `count`") && e.contains("first defined on line 11"),
        "{e}"
    );
}

#[test]
fn parallelism_above_max_parallelism_is_refused() {
    let job = good_job().replace("parallelism = 2", "parallelism = 9");
    let e = validate_fails(&job, |_| {});
    assert!(e.contains("job.toml:13:") && e.contains("greater than the job's max_parallelism 8"), "{e}");
}

#[test]
fn missing_component_file_says_how_to_build_it() {
    let job = good_job().replace(&counter(), "\"nope/counter.wasm\"");
    let e = validate_fails(&job, |_| {});
    assert!(
        e.contains("job.toml:12:") && e.contains("does not exist") && e.contains("cargo build --profile guest"),
        "{e}"
    );
}

#[test]
fn keyed_operator_without_hash_input_is_refused() {
    let job = good_job().replace("partition = \"hash\"", "partition = \"rebalance\"");
    let e = validate_fails(&job, |_| {});
    assert!(
        e.contains("job.toml:14:") && e.contains("keeps keyed state (count)") && e.contains("partition = \"hash\""),
        "{e}"
    );
}

#[test]
fn cycles_are_named() {
    let job = format!(
        "{}\n[[operator]]\nid = \"b\"\ncomponent = {}\ninputs = [{{ from = \"count\", partition = \"hash\" }}]\n",
        good_job().replace(
            "inputs = [{ from = \"gen\", partition = \"hash\" }]",
            "inputs = [{ from = \"gen\", partition = \"hash\" }, { from = \"b\", partition = \"hash\" }]"
        ),
        counter()
    );
    let e = validate_fails(&job, |_| {});
    assert!(
        e.contains("loop")
            && e.contains("feedback = true")
            && (e.contains("count -> b -> count") || e.contains("b -> count -> b")),
        "{e}"
    );
}

#[test]
fn two_input_operator_needs_sides() {
    let job = format!(
        "[job]\nname = \"j\"\n[[source]]\nid = \"a\"\ntype = \"generator\"\ncount = 1\n[[source]]\nid = \"b\"\ntype = \"generator\"\ncount = 1\n\
         [[operator]]\nid = \"join\"\ncomponent = {}\ninputs = [{{ from = \"a\", partition = \"hash\" }}, {{ from = \"b\", partition = \"hash\", side = \"right\" }}]\n\
         [[sink]]\nid = \"o\"\ntype = \"blackhole\"\ninputs = [{{ from = \"join\" }}]\n",
        toml_path(&component("enrich_enricher"))
    );
    let e = validate_fails(&job, |_| {});
    assert!(e.contains("job.toml:14:") && e.contains("two-input operator") && e.contains("side = \"left\""), "{e}");
}

#[test]
fn unknown_side_output_lists_the_declared_ones() {
    let job = format!(
        "[job]\nname = \"j\"\n[[source]]\nid = \"a\"\ntype = \"generator\"\ncount = 1\n\
         [[operator]]\nid = \"p\"\ncomponent = {}\ninputs = [{{ from = \"a\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"o\"\ntype = \"blackhole\"\ninputs = [{{ from = \"p\", output = \"late\" }}]\n",
        toml_path(&component("test_probe"))
    );
    let e = validate_fails(&job, |_| {});
    assert!(e.contains("no side output `late`") && e.contains("[side, events]"), "{e}");
}

#[test]
fn a_text_file_is_not_a_component() {
    let job = good_job().replace(&counter(), "\"bad.wasm\"");
    let e = validate_fails(&job, |d| std::fs::write(d.join("bad.wasm"), "hello").unwrap());
    assert!(e.contains("operator `count`") && e.contains("bad.wasm") && e.contains("magic bytes"), "{e}");
}

#[test]
fn a_core_module_is_not_a_component() {
    let job = good_job().replace(&counter(), "\"core.wasm\"");
    let e = validate_fails(&job, |d| std::fs::write(d.join("core.wasm"), b"\0asm\x01\0\0\0").unwrap());
    assert!(e.contains("core WebAssembly module") && e.contains("component"), "{e}");
}

#[test]
fn a_truncated_component_is_refused() {
    let job = good_job().replace(&counter(), "\"cut.wasm\"");
    let e = validate_fails(&job, |d| {
        let bytes = std::fs::read(component("wordcount_counter")).unwrap();
        std::fs::write(d.join("cut.wasm"), &bytes[..bytes.len() / 2]).unwrap()
    });
    assert!(e.contains("operator `count`") && e.contains("not a WebAssembly component"), "{e}");
}

#[test]
fn a_component_of_another_world_is_refused() {
    let job = good_job().replace(&counter(), &toml_path(&component("test_wrong_world")));
    let e = validate_fails(&job, |_| {});
    assert!(e.contains("neither world `operator` nor `co-operator`"), "{e}");
}

/// A record that fails the operator every time it is replayed: the job stops after the third
/// identical failure from the same restore point, saying so, instead of burning all 50
/// attempts (and their delays).
#[test]
fn newcomer_a_record_that_fails_every_restart_ends_the_job_with_that_diagnosis() {
    let dir = scratch();
    std::fs::write(dir.path().join("in.csv"), "a,count\nb,panic\n").unwrap();
    let job = format!(
        "[job]\nname = \"boom\"\n[restart]\nstrategy = \"fixed-delay\"\nattempts = 50\ndelay_ms = 10\n\
         [[source]]\nid = \"in\"\ntype = \"file\"\npath = \"in.csv\"\nkey_column = 0\n\
         [[operator]]\nid = \"probe\"\ncomponent = {}\nparallelism = 1\ninputs = [{{ from = \"in\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"o\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"probe\" }}]\n",
        toml_path(&component("test_probe"))
    );
    let e = run_job_in(dir.path(), &job).unwrap_err();
    assert!(matches!(e, weir::runtime::error::RunError::Repeated { attempts: 3, .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains(
            "stopped after 3 attempt(s): it failed the same way each time from the same restore point (the beginning)"
        ) && e.contains("probe panicked on request"),
        "{e}"
    );
}

#[test]
fn a_failing_guest_fails_the_job_naming_operator_and_subtask() {
    let dir = scratch();
    std::fs::write(dir.path().join("in.csv"), "a,count\nb,panic\n").unwrap();
    let job = format!(
        "[job]\nname = \"boom\"\n[[source]]\nid = \"in\"\ntype = \"file\"\npath = \"in.csv\"\nkey_column = 0\n\
         [[operator]]\nid = \"probe\"\ncomponent = {}\nparallelism = 1\ninputs = [{{ from = \"in\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"o\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"probe\" }}]\n",
        toml_path(&component("test_probe"))
    );
    let e = run_job_in(dir.path(), &job).unwrap_err().to_string();
    assert!(e.contains("job `boom` failed") && e.contains("probe#0") && e.contains("probe panicked on request"), "{e}");
    // Nothing is committed by a failed run.
    assert!(crate::support::committed_lines(&dir.path().join("out")).is_empty());

    // Through the binary: non-zero exit, same message.
    let out = weir().args(["run", "--progress", "0"]).arg(dir.path().join("job.toml")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("probe#0") && stderr.contains("probe panicked on request"), "{stderr}");
}

#[test]
fn an_operator_that_refuses_its_config_is_refused_before_the_job_starts() {
    let dir = scratch();
    let job = format!(
        "[job]\nname = \"j\"\n[[source]]\nid = \"a\"\ntype = \"generator\"\ncount = 10\n\
         [[operator]]\nid = \"p\"\ncomponent = {}\nconfig = {{ fail_open = true }}\ninputs = [{{ from = \"a\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"o\"\ntype = \"blackhole\"\ninputs = [{{ from = \"p\" }}]\n",
        toml_path(&component("test_probe"))
    );
    let e = run_job_in(dir.path(), &job).unwrap_err().to_string();
    // A probe instance runs `setup` while the job is bound: no task started, nothing ran.
    assert!(e.contains("operator `p` refuses its configuration") && e.contains("open failed on request"), "{e}");
    assert!(e.contains("job.toml:") && !e.contains("p#0"), "names the job file's line, not a subtask: {e}");
}

#[test]
fn a_stdout_sink_in_a_checkpointed_job_is_flagged_at_least_once() {
    let dir = scratch();
    let job = format!(
        "[job]\nname = \"j\"\n[checkpoint]\ninterval_ms = 1000\ndir = \"chk\"\n[[source]]\nid = \"a\"\ntype = \"generator\"\ncount = 3\nkeys = 3\n\
         [[operator]]\nid = \"c\"\ncomponent = {}\ninputs = [{{ from = \"a\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"screen\"\ntype = \"stdout\"\ninputs = [{{ from = \"c\" }}]\n",
        counter()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, job).unwrap();
    let out = weir().args(["run", "--progress", "0"]).arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("WARN sink `screen` writes to stdout") && stderr.contains("at-least-once"), "{stderr}");
    let mut stdout: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    stdout.sort();
    assert_eq!(stdout, vec!["0 1", "1 1", "2 1"]);
}

fn stdin_job(guarantee: &str) -> String {
    format!(
        "[job]\nname = \"j\"\n{guarantee}\n[checkpoint]\ninterval_ms = 1000\ndir = \"chk\"\n[[source]]\nid = \"in\"\ntype = \"stdin\"\n\
         [[operator]]\nid = \"tok\"\ncomponent = {}\ninputs = [{{ from = \"in\" }}]\n\
         [[operator]]\nid = \"c\"\ncomponent = {}\ninputs = [{{ from = \"tok\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"o\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"c\" }}]\n",
        toml_path(&component("wordcount_tokenizer")),
        counter()
    )
}

#[test]
fn a_non_replayable_source_is_refused_in_an_exactly_once_job() {
    let e = validate_fails(&stdin_job(""), |_| {});
    assert!(e.contains("job.toml:8:") && e.contains("source `in` cannot rewind"), "{e}");
    assert!(e.contains("guarantee = \"at-least-once\""), "{e}");
}

#[test]
fn a_non_replayable_source_runs_at_least_once_with_a_warning_when_asked() {
    use std::io::Write;
    let dir = scratch();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, stdin_job("guarantee = \"at-least-once\"")).unwrap();
    let mut child = weir()
        .args(["run", "--progress", "0"])
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"to be or\nnot to be\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("WARN source `in` cannot rewind") && stderr.contains("at-least-once"), "{stderr}");
    assert_eq!(
        crate::support::committed_lines(&dir.path().join("out")),
        vec!["be 1", "be 2", "not 1", "or 1", "to 1", "to 2"]
    );
}

#[test]
fn a_component_built_against_another_contract_version_is_refused_naming_it() {
    // The probe component with its import names rewritten to an older contract version.
    let bytes = std::fs::read(crate::support::component("test_probe")).unwrap();
    let mut old = bytes.clone();
    let mut renamed = 0;
    for iface in ["types", "context", "collector", "timers", "logging"] {
        let needle = format!("weir:operator/{iface}@{}", weir::sandbox::instance::CONTRACT).into_bytes();
        let mut i = 0;
        while let Some(p) = old[i..].windows(needle.len()).position(|w| w == needle) {
            let at = i + p + needle.len() - 5;
            old[at..at + 5].copy_from_slice(b"0.2.0");
            i = at + 5;
            renamed += 1;
        }
    }
    assert!(renamed > 0, "the probe imports Weir's interfaces");
    let engine = weir::sandbox::engine::new_engine().unwrap();
    let e = weir::sandbox::instance::LoadedComponent::from_bytes(&engine, "p", std::path::Path::new("old.wasm"), &old)
        .err()
        .expect("an older contract is refused");
    assert_eq!(
        e.to_string(),
        "operator `p`: component old.wasm was built against weir:operator@0.2.0, but this Weir speaks \
         weir:operator@0.3.2 (and loads 0.3.0 and 0.3.1); rebuild it with the current SDK (Rust: weir-guest) or against \
         wit/operator.wit"
    );
}

#[test]
fn benchmark_options_in_the_wrong_place_are_refused_naming_the_fix() {
    let e = validate_fails(&good_job().replace("count = 10\n", "count = 10\ntimestamps = \"wall\"\n"), |_| {});
    assert!(e.contains("unknown timestamps `wall`") && e.contains("ingestion"), "{e}");
    let e = validate_fails(
        &good_job().replace("type = \"blackhole\"", "type = \"file\"\npath = \"out\"\nlatency = true"),
        |_| {},
    );
    assert!(e.contains("sink `out`") && e.contains("`latency` is an option of `blackhole` sinks only"), "{e}");
}

#[test]
fn a_sink_rate_of_zero_or_on_a_sink_that_cannot_throttle_is_refused_naming_the_line() {
    let zero = good_job().replace("type = \"blackhole\"", "type = \"blackhole\"\nrate = 0");
    let e = validate_fails(&zero, |_| {});
    assert!(e.contains("sink `out`: `rate` must be at least 1") && e.contains("job.toml:"), "{e}");
    let stdout = good_job().replace("type = \"blackhole\"", "type = \"stdout\"\nrate = 10");
    let e = validate_fails(&stdout, |_| {});
    assert!(e.contains("`rate` is an option of `file` and `blackhole` sinks only"), "{e}");
}

#[test]
fn unaligned_checkpoints_refuse_an_unknown_alignment_and_concurrent_checkpoints_naming_the_line() {
    let with = |alignment: &str| {
        good_job().replace(
            "[[source]]",
            &format!("[checkpoint]\ninterval_ms = 100\nalignment = \"{alignment}\"\n\n[[source]]"),
        )
    };
    let e = validate_fails(&with("sideways"), |_| {});
    assert!(e.contains("[checkpoint] alignment must be \"aligned\" or \"unaligned\", got \"sideways\""), "{e}");
    assert!(e.contains("job.toml:"), "{e}");
    let concurrent = with("unaligned").replace("alignment =", "max_concurrent = 2\nalignment =");
    let e = validate_fails(&concurrent, |_| {});
    assert!(e.contains("max_concurrent = 2 with unaligned checkpoints") && e.contains("one at a time"), "{e}");
}

#[test]
fn state_disk_max_chain_links_is_refused_at_zero_and_past_its_bound() {
    let with = |n: u32| {
        good_job().replace(
            "[[source]]",
            &format!("[checkpoint]\ninterval_ms = 100\nincremental = true\nmax_chain_links = {n}\n[[source]]"),
        )
    };
    let e = validate_fails(&with(0), |_| {});
    assert!(e.contains("[checkpoint] max_chain_links must be at least 1") && e.contains("job.toml:"), "{e}");
    let e = validate_fails(&with(1001), |_| {});
    assert!(e.contains("[checkpoint] max_chain_links is at most 1000") && e.contains("job.toml:"), "{e}");
}

#[test]
fn unaligned_an_alignment_timeout_is_refused_with_unaligned_zero_past_the_checkpoint_timeout_or_concurrent() {
    let with = |lines: &str| {
        good_job().replace("[[source]]", &format!("[checkpoint]\ninterval_ms = 100\n{lines}\n[[source]]"))
    };
    let e = validate_fails(&with("alignment = \"unaligned\"\nalignment_timeout_ms = 50\n"), |_| {});
    assert!(e.contains("alignment_timeout_ms = 50 applies to aligned checkpoints") && e.contains("remove one"), "{e}");
    let e = validate_fails(&with("alignment_timeout_ms = 0\n"), |_| {});
    assert!(e.contains("must be at least 1") && e.contains("alignment = \"unaligned\""), "{e}");
    let e = validate_fails(&with("timeout_ms = 500\nalignment_timeout_ms = 500\n"), |_| {});
    assert!(e.contains("must be below the checkpoint's timeout_ms (500)"), "{e}");
    assert!(e.contains("job.toml:"), "{e}");
    let e = validate_fails(&with("max_concurrent = 3\nalignment_timeout_ms = 50\n"), |_| {});
    assert!(e.contains("max_concurrent = 3 with unaligned checkpoints"), "{e}");
    let ok = with("alignment = \"aligned\"\nalignment_timeout_ms = 50\n");
    assert!(ok.contains("alignment_timeout_ms = 50"));
    validate_ok(&ok);
}
