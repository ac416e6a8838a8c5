//! Process recovery: the real `weir` binary runs wordcount on a large input with a short
//! checkpoint interval, is killed with SIGKILL at a random moment (twice), and is restarted
//! with `--restore latest`; the committed output must equal the failure-free output, every
//! `w k` line exactly once, in part files or in a PostgreSQL table. Also: a torn checkpoint is
//! skipped with a warning, a corrupt complete one refused with an error.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use weir::checkpoint::storage::CheckpointStore;
use weir::connectors::generator::splitmix64;

use crate::support::{committed_lines, component, scratch, toml_path, weir};

const WORDS: &[&str] = &[
    "weir",
    "river",
    "barrier",
    "snapshot",
    "stream",
    "state",
    "key",
    "group",
    "flink",
    "wasm",
    "component",
    "checkpoint",
    "align",
    "commit",
    "sink",
    "source",
    "tenant",
    "sandbox",
    "operator",
    "record",
];

/// Writes `lines` lines of pseudo-random words; returns the expected wordcount output.
pub(crate) fn write_input(path: &Path, lines: usize, seed: u64) -> Vec<String> {
    let mut s = seed;
    let mut text = String::new();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for l in 0..lines {
        for w in 0..(3 + l % 6) {
            s = splitmix64(s);
            // Word variety: the base words, some with a numeric suffix.
            let word = format!(
                "{}{}",
                WORDS[(s % WORDS.len() as u64) as usize],
                if s.is_multiple_of(7) { (s % 50).to_string() } else { String::new() }
            );
            if w > 0 {
                text.push(' ');
            }
            text.push_str(&word);
            *counts.entry(word).or_default() += 1;
        }
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
    let mut v: Vec<String> = counts.iter().flat_map(|(w, n)| (1..=*n).map(move |i| format!("{w} {i}"))).collect();
    v.sort();
    v
}

/// The wordcount job of these tests, its source slowed to 20 000 lines/s: the input then
/// outlasts the checkpoints a test waits for before its kill on a loaded machine (at 100 000
/// lines/s the 40 000 lines of one test were read in 0.4 s, less than two checkpoints take).
fn job(dir: &Path) -> std::path::PathBuf {
    let job = job_into(dir, "wc-kill", "type = \"file\"\npath = \"out\"");
    let text = std::fs::read_to_string(&job).unwrap();
    assert!(text.contains("rate = 100000\n"));
    std::fs::write(&job, text.replace("rate = 100000\n", "rate = 20000\n")).unwrap();
    job
}

/// The wordcount job named `name`, its sink of kind `sink` (a TOML fragment).
pub(crate) fn job_into(dir: &Path, name: &str, sink: &str) -> std::path::PathBuf {
    let toml = format!(
        r#"[job]
name = "{name}"
max_parallelism = 32

[checkpoint]
interval_ms = 100
dir = "checkpoints"

[[source]]
id = "lines"
type = "file"
path = "input.txt"
rate = 100000

[[operator]]
id = "tokenize"
component = {}
parallelism = 2
inputs = [{{ from = "lines", partition = "rebalance" }}]

[[operator]]
id = "count"
component = {}
parallelism = 2
inputs = [{{ from = "tokenize", partition = "hash" }}]

[[sink]]
id = "out"
{sink}
parallelism = 2
inputs = [{{ from = "count" }}]
"#,
        toml_path(&component("wordcount_tokenizer")),
        toml_path(&component("wordcount_counter"))
    );
    let p = dir.join("job.toml");
    std::fs::write(&p, toml).unwrap();
    p
}

pub(crate) fn spawn(job: &Path, restore: bool) -> Child {
    let mut c = weir();
    c.args(["run", "--progress", "0", "--quiet-guests"]).arg(job);
    if restore {
        c.args(["--restore", "latest"]);
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
}

/// Waits until the job has a complete checkpoint newer than `after`, then a random extra
/// delay, then SIGKILLs it. Returns false if the process ended by itself first.
pub(crate) fn kill_after_checkpoint(child: &mut Child, store: &CheckpointStore, after: u64, extra_ms: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        let newest = store.list().iter().filter(|l| l.status.is_ok()).map(|l| l.id).max().unwrap_or(0);
        if newest > after {
            break;
        }
        assert!(Instant::now() < deadline, "no checkpoint completed within 120 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(extra_ms));
    if child.try_wait().unwrap().is_some() {
        return false;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    true
}

#[test]
fn exactly_once_sigkill_then_restore_latest_commits_the_failure_free_output() {
    let dir = scratch();
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("sigkill test seed {seed}");
    let expected = write_input(&dir.path().join("input.txt"), 150_000, 42);
    let job = job(dir.path());
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "wc-kill");

    let mut kills = 0;
    let mut after = 0;
    let mut restore = false;
    let mut s = seed;
    for round in 0..2 {
        let mut child = spawn(&job, restore);
        s = splitmix64(s);
        if kill_after_checkpoint(&mut child, &store, after, s % 150) {
            kills += 1;
            after = store.max_id();
            // A killed run may leave hidden in-progress and pending files; never visible ones
            // beyond what completed checkpoints cover (checked by the final comparison).
            restore = true;
        } else {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
            break;
        }
    }
    assert!(kills >= 1, "the job must have been killed at least once while running (seed {seed})");
    let out = spawn(&job, true).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "restore run failed: {stderr}");
    assert!(stderr.contains("restoring job `wc-kill` from checkpoint"), "{stderr}");
    let got = committed_lines(&dir.path().join("out"));
    assert_eq!(got.len(), expected.len(), "line count after {kills} kill(s), seed {seed}");
    assert!(got == expected, "committed output differs from the failure-free output (seed {seed})");
}

/// A torn checkpoint (no manifest) never completed and is passed over; a completed one whose
/// file no longer verifies may have committed output, so `--restore latest` refuses it with an
/// error naming the file instead of silently going back to an older one (which would repeat
/// that output), and touches nothing. The user can then choose an older one explicitly.
#[test]
fn exactly_once_restore_skips_a_torn_checkpoint_and_refuses_a_corrupt_complete_one() {
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 40_000, 7);
    let job = job(dir.path());
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "wc-kill");
    let mut child = spawn(&job, false);
    assert!(kill_after_checkpoint(&mut child, &store, 1, 0), "the job finished before it could be killed");
    // Corrupt the newest complete checkpoint and tear a newer one.
    let listed = store.list();
    let mut complete = listed.iter().rev().filter_map(|l| l.status.as_ref().ok());
    let newest = complete.next().unwrap();
    let older = complete.next().expect("two complete checkpoints").checkpoint_id;
    let count = newest.operators.iter().find(|o| o.uid == "count").unwrap();
    // State files are named per writer (attempt), so no other writer can overwrite them.
    assert_eq!(count.subtasks[0].file, "count-0.a0.state");
    let newest = newest.checkpoint_id;
    let f = store.chk_dir(weir::ids::CheckpointId(newest)).join(&count.subtasks[0].file);
    let mut b = std::fs::read(&f).unwrap();
    let n = b.len() - 1;
    b[n] ^= 0x55;
    std::fs::write(&f, b).unwrap();
    std::fs::create_dir_all(store.chk_dir(weir::ids::CheckpointId(newest + 1))).unwrap();
    let before = committed_lines(&dir.path().join("out"));
    let out = spawn(&job, true).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a corrupt complete checkpoint must not be restored past: {stderr}");
    assert!(stderr.contains("skipping checkpoint") && stderr.contains(&format!("chk-{}", newest + 1)), "{stderr}");
    assert!(stderr.contains("incomplete"), "{stderr}");
    assert!(stderr.contains(&format!("chk-{newest}")) && stderr.contains("count-0.a0.state"), "{stderr}");
    assert!(stderr.contains("checksum mismatch") && stderr.contains("--restore <older chk-N"), "{stderr}");
    assert!(committed_lines(&dir.path().join("out")) == before, "a refused restore changed the output");
    // Chosen explicitly, the older checkpoint restores; the file sink withdraws the parts it
    // does not know of, so the output is still exactly once.
    let out = weir()
        .args(["run", "--progress", "0", "--quiet-guests"])
        .arg(&job)
        .arg("--restore")
        .arg(store.chk_dir(weir::ids::CheckpointId(older)))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("from checkpoint {older}")), "{stderr}");
    assert!(committed_lines(&dir.path().join("out")) == expected, "output after restoring an older checkpoint");
}

#[test]
fn exactly_once_checkpoint_ids_keep_increasing_across_restarts() {
    let dir = scratch();
    write_input(&dir.path().join("input.txt"), 30_000, 9);
    let job = job(dir.path());
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "wc-kill");
    let mut child = spawn(&job, false);
    assert!(kill_after_checkpoint(&mut child, &store, 0, 0));
    let before = store.max_id();
    let out = spawn(&job, true).wait_with_output().unwrap();
    assert!(out.status.success());
    let ids: Vec<u64> = store.list().iter().map(|l| l.id).collect();
    assert!(*ids.last().unwrap() > before, "a restarted job continues the ids: {ids:?} after {before}");
    // `weir checkpoints list` shows them; `inspect` verifies the newest.
    let list = weir().args(["checkpoints", "list"]).arg(dir.path().join("checkpoints")).output().unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success() && text.contains("complete (final)"), "{text}");
    let newest = store.chk_dir(weir::ids::CheckpointId(*ids.last().unwrap()));
    let inspect = weir().args(["checkpoints", "inspect"]).arg(&newest).output().unwrap();
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        inspect.status.success() && text.contains("state files verified") && text.contains("wordcount-counter 1.0.0"),
        "{text}"
    );
}

#[test]
fn rescale_restoring_a_checkpoint_at_another_operator_parallelism_keeps_exactly_once() {
    // Kill wordcount mid-run, then restore its latest checkpoint with the keyed counter at
    // another parallelism (2 -> 3, tokenizer 2 -> 1): keyed state moves by key group.
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 120_000, 11);
    let job = job(dir.path());
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "wc-kill");
    let mut child = spawn(&job, false);
    assert!(kill_after_checkpoint(&mut child, &store, 1, 20), "the job finished before it could be killed");
    rescale_wordcount(&job);
    let out = spawn(&job, true).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("restoring job `wc-kill` from checkpoint"), "{stderr}");
    assert!(committed_lines(&dir.path().join("out")) == expected, "output after restoring at another parallelism");
    // The new checkpoints record the new parallelism.
    let newest = store.latest(|_| {}).unwrap();
    assert_eq!(newest.manifest.operator("count").unwrap().parallelism, 3);
    assert_eq!(newest.manifest.operator("tokenize").unwrap().parallelism, 1);
}

/// Rewrites the wordcount job of [`job_into`] with the tokenizer at parallelism 1 and the keyed
/// counter at 3 (from 2 each).
pub(crate) fn rescale_wordcount(job: &Path) {
    let rescaled = std::fs::read_to_string(job)
        .unwrap()
        .replace("parallelism = 2\ninputs = [{ from = \"lines\"", "parallelism = 1\ninputs = [{ from = \"lines\"")
        .replace(
            "parallelism = 2\ninputs = [{ from = \"tokenize\"",
            "parallelism = 3\ninputs = [{ from = \"tokenize\"",
        );
    assert!(rescaled.contains("parallelism = 1\ninputs = [{ from = \"lines\""), "{rescaled}");
    assert!(rescaled.contains("parallelism = 3"), "{rescaled}");
    std::fs::write(job, rescaled).unwrap();
}

/// Runs `job` with the real process, SIGKILLs it at up to two random moments after
/// checkpoints (within `jitter_ms` of one completing), restarting it with `--restore latest`
/// each time, then lets a last restore run to its end. Returns the number of kills (at least
/// one is asserted).
pub(crate) fn kill_twice_then_finish(job: &Path, store: &CheckpointStore, seed: u64, jitter_ms: u64) -> u32 {
    let (mut kills, mut after, mut restore, mut s) = (0, 0, false, seed);
    for _ in 0..2 {
        let mut child = spawn(job, restore);
        s = splitmix64(s);
        if !kill_after_checkpoint(&mut child, store, after, s % jitter_ms) {
            assert!(child.wait().unwrap().success());
            break;
        }
        kills += 1;
        after = store.max_id();
        restore = true;
    }
    assert!(kills >= 1, "the job must have been killed at least once while running (seed {seed})");
    let out = spawn(job, true).wait_with_output().unwrap();
    assert!(out.status.success(), "restore run failed: {}", String::from_utf8_lossy(&out.stderr));
    kills
}

/// The same with the PostgreSQL sink appending `(word, n)` rows: killed with SIGKILL at random
/// moments (the killed process's open transaction dies with its connection, its prepared ones
/// linger), restarted with `--restore latest`: the table holds every `w k` row exactly once and
/// no prepared transaction is left.
#[test]
fn connector_postgres_sigkill_then_restore_latest_leaves_the_failure_free_table() {
    let pg = crate::pg::PgServer::start(&[]);
    pg.exec("CREATE TABLE wc (word text NOT NULL, n bigint NOT NULL)");
    let dir = scratch();
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("postgres sigkill test seed {seed}");
    let expected = write_input(&dir.path().join("input.txt"), 100_000, 43);
    let sink = format!(
        "type = \"postgres\"\nurl = \"{}\"\ntable = \"wc\"\nformat = \"csv\"\ndelimiter = \" \"\ncolumns = [\"word\", \"n\"]",
        pg.url()
    );
    let job = job_into(dir.path(), "wc-kill-pg", &sink);
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "wc-kill-pg");
    let kills = kill_twice_then_finish(&job, &store, seed, 150);
    let mut got: Vec<String> =
        (pg.client().query("SELECT word || ' ' || n FROM wc", &[]).unwrap().iter()).map(|r| r.get(0)).collect();
    got.sort();
    assert_eq!(got.len(), expected.len(), "rows after {kills} kill(s), seed {seed}");
    assert!(got == expected, "the table differs from the failure-free output (seed {seed})");
    let left = pg.client().query("SELECT gid FROM pg_prepared_xacts", &[]).unwrap().len();
    assert_eq!(left, 0, "prepared transactions left behind (seed {seed})");
}
