//! The cluster as real processes on loopback: `weir coordinator` runs the wordcount job over
//! `weir worker`s whose subtasks talk over the network; the committed output must equal the
//! failure-free output, also after a worker is killed with SIGKILL mid-job (the job restarts
//! from its newest checkpoint on the remaining slots).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir::checkpoint::storage::CheckpointStore;

use crate::process_recovery::{job_into, rescale_wordcount, write_input};
use crate::support::{committed_lines, scratch, weir};

/// Child processes killed when the test ends, whatever happens.
#[derive(Default)]
pub(crate) struct Procs(pub(crate) Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What a process wrote to stderr so far.
pub(crate) fn collect(r: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    collect_into(r, &log);
    log
}

/// Appends what `r` writes, line by line, to `log`.
pub(crate) fn collect_into(r: impl Read + Send + 'static, log: &Arc<Mutex<String>>) {
    let l = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            let mut l = l.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
}

struct Coordinator {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

/// A coordinator whose job starts once `workers` workers have registered.
fn coordinator(job: &Path, secret: &Path, workers: u32) -> Coordinator {
    coordinator_with(job, secret, workers, 10_000)
}

fn coordinator_with(job: &Path, secret: &Path, workers: u32, heartbeat_timeout_ms: u64) -> Coordinator {
    coordinator_args(job, secret, workers, heartbeat_timeout_ms, &[])
}

fn coordinator_args(job: &Path, secret: &Path, workers: u32, heartbeat_timeout_ms: u64, extra: &[&str]) -> Coordinator {
    coordinator_env(job, secret, workers, heartbeat_timeout_ms, extra, &[])
}

fn coordinator_env(
    job: &Path,
    secret: &Path,
    workers: u32,
    heartbeat_timeout_ms: u64,
    extra: &[&str],
    env: &[(&'static str, String)],
) -> Coordinator {
    coordinator_of(&[job], secret, workers, heartbeat_timeout_ms, extra, env)
}

/// A coordinator of the jobs of `jobs`.
fn coordinator_of(
    jobs: &[&Path],
    secret: &Path,
    workers: u32,
    heartbeat_timeout_ms: u64,
    extra: &[&str],
    env: &[(&'static str, String)],
) -> Coordinator {
    let mut child = weir()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(["coordinator", "--listen", "127.0.0.1:0", "--heartbeat-timeout-ms", &heartbeat_timeout_ms.to_string()])
        .args(extra)
        .args(["--workers", &workers.to_string(), "--secret-file"])
        .arg(secret)
        .args(jobs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = collect(child.stderr.take().unwrap());
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let addr = first.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{first:?}")).to_string();
    Coordinator { child, addr, log }
}

fn worker(c: &Coordinator, secret: &Path, name: &str, slots: u32, home: &Path) -> Child {
    worker_cmd(c, secret, name, slots, home).stderr(Stdio::null()).spawn().unwrap()
}

fn worker_cmd(c: &Coordinator, secret: &Path, name: &str, slots: u32, home: &Path) -> std::process::Command {
    let mut cmd = weir();
    cmd.args(["worker", "--coordinator", &c.addr, "--name", name, "--slots", &slots.to_string(), "--secret-file"])
        .arg(secret)
        .arg("--dir")
        .arg(home.join(name))
        .stdout(Stdio::null());
    cmd
}

/// Waits until `log` has a line containing `what`.
pub(crate) fn wait_for(log: &Arc<Mutex<String>>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !log.lock().unwrap().contains(what) {
        assert!(Instant::now() < deadline, "no `{what}` within 120 s:\n{}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn signal(child: &Child, sig: &str) {
    let ok = std::process::Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(ok.success());
}

/// Waits for the coordinator to end; returns its log.
fn finish(c: &mut Coordinator) -> String {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = c.child.try_wait().unwrap() {
            std::thread::sleep(Duration::from_millis(100));
            let log = c.log.lock().unwrap().clone();
            assert!(status.success(), "the coordinator failed:\n{log}");
            return log;
        }
        assert!(Instant::now() < deadline, "the job did not finish within 300 s:\n{}", c.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `store` holds a complete checkpoint, the job still running.
fn first_checkpoint(c: &mut Coordinator, store: &CheckpointStore) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !store.list().iter().any(|l| l.status.is_ok()) {
        assert!(c.child.try_wait().unwrap().is_none(), "the job ended before its first checkpoint");
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", c.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(c.child.try_wait().unwrap().is_none(), "the job must still run after its first checkpoint");
}

pub(crate) fn secret(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("secret");
    std::fs::write(&p, "0123456789abcdef0123456789abcdef\n").unwrap();
    p
}

/// The wordcount job at parallelism 3 (its slices on three one-slot workers).
fn job_p3(dir: &Path, name: &str) -> std::path::PathBuf {
    let job = job_into(dir, name, "type = \"file\"\npath = \"out\"");
    let text = std::fs::read_to_string(&job).unwrap().replace("parallelism = 2", "parallelism = 3");
    std::fs::write(&job, text).unwrap();
    job
}

#[test]
fn cluster_a_job_over_three_workers_commits_the_output_of_one_process() {
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 20_000, 11);
    let job = job_p3(dir.path(), "wc-cluster");
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 3);
    for w in ["w1", "w2", "w3"] {
        procs.0.push(worker(&c, &secret, w, 1, dir.path()));
    }
    let log = finish(&mut c);
    // Every worker ran a slice: the hash edge crossed the network between all of them.
    let attempt = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(["w1 (", "w2 (", "w3 ("].iter().all(|w| attempt.contains(w)), "{attempt}");
    assert!(log.contains("1 attempt(s)"), "{log}");
    let got = committed_lines(&dir.path().join("out"));
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "committed output differs from the expected wordcount");
}

/// The per-key sequence oracle over the wordcount's output (`<word> <i>` for its i-th
/// occurrence): per word, the committed counts must be exactly 1..=n, n its number of
/// occurrences in the input. Returns one line per violation (a duplicate, a gap, an extra).
fn sequence_violations(got: &[String], expected: &[String]) -> Vec<String> {
    let split = |l: &String| {
        let (w, n) = l.rsplit_once(' ').unwrap_or_else(|| panic!("not `<word> <count>`: {l:?}"));
        (w.to_string(), n.parse::<u64>().unwrap_or_else(|_| panic!("bad count in {l:?}")))
    };
    let mut want: std::collections::BTreeMap<String, u64> = Default::default();
    for (w, n) in expected.iter().map(split) {
        let e = want.entry(w).or_default();
        *e = (*e).max(n);
    }
    let mut seen: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for (w, n) in got.iter().map(split) {
        seen.entry(w).or_default().push(n);
    }
    let mut out = Vec::new();
    for (w, n) in &want {
        let mut v = seen.remove(w).unwrap_or_default();
        v.sort_unstable();
        for pair in v.windows(2).filter(|p| p[0] == p[1]) {
            out.push(format!("`{w}`: count {} committed twice", pair[0]));
        }
        v.dedup();
        let missing = (1..=*n).filter(|i| v.binary_search(i).is_err()).count();
        if missing > 0 {
            out.push(format!("`{w}`: {missing} of counts 1..={n} missing"));
        }
        if let Some(x) = v.iter().find(|&&i| i > *n) {
            out.push(format!("`{w}`: count {x} beyond its {n} occurrences"));
        }
    }
    out.extend(seen.keys().map(|w| format!("`{w}`: not in the input")));
    out
}

/// Runs to seed `seed`'s end: three one-slot workers, one of them (chosen by the seed) killed
/// with SIGKILL once checkpoint 1–4 (chosen by the seed) is complete, and replaced.
fn seeded_worker_kill(seed: u64) {
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 200_000, 100 + seed);
    let job = job_p3(dir.path(), "wc-seeded");
    // 200 000 lines at 50 000/s: 4 s of input outlast checkpoint 4 (100 ms apart) on a
    // loaded machine.
    let text = std::fs::read_to_string(&job).unwrap();
    assert!(text.contains("rate = 100000\n"));
    std::fs::write(&job, text.replace("rate = 100000\n", "rate = 50000\n")).unwrap();
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "wc-seeded");
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 3);
    let (victim, after) = ((seed % 3) as usize, 1 + (seed / 3) % 4);
    let names = ["w1", "w2", "w3"];
    let mut workers: Vec<Child> = names.iter().map(|w| worker(&c, &secret, w, 1, dir.path())).collect();
    // The event the test controls: checkpoint `after` complete.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !store.list().iter().any(|l| l.status.is_ok() && l.id >= after) {
        assert!(c.child.try_wait().unwrap().is_none(), "seed {seed}: the job ended before checkpoint {after}");
        assert!(
            Instant::now() < deadline,
            "seed {seed}: no checkpoint {after} within 120 s:\n{}",
            c.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(c.child.try_wait().unwrap().is_none(), "seed {seed}: the job must still run at the kill");
    workers[victim].kill().unwrap(); // SIGKILL
    workers[victim].wait().unwrap();
    // A replacement under the same name rejoins and takes the lost slot.
    workers[victim] = worker(&c, &secret, names[victim], 1, dir.path());
    procs.0.extend(workers);
    let log = finish(&mut c);
    assert!(log.contains(&format!("worker {} (", names[victim])) && log.contains("is gone"), "seed {seed}:\n{log}");
    assert!(!log.contains("1 attempt(s)"), "seed {seed}: the kill must have failed an attempt:\n{log}");
    let got = committed_lines(&dir.path().join("out"));
    let violations = sequence_violations(&got, &expected);
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations, first: {:?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
    assert!(got == expected, "seed {seed}: committed output differs from the failure-free output");
}

/// SIGKILL of a worker at a seeded moment, over seeded runs (20; `WEIR_CLUSTER_SEEDS=N` for
/// more): zero sequence violations, and the committed output of the failure-free run.
#[test]
fn cluster_seeded_sigkills_of_a_worker_among_three_keep_every_key_exactly_once() {
    let seeds: u64 = std::env::var("WEIR_CLUSTER_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    for seed in 0..seeds {
        seeded_worker_kill(seed);
    }
}

/// The oracle itself finds duplicates, gaps and strangers.
#[test]
fn cluster_sequence_oracle_finds_duplicates_gaps_and_extras() {
    let expected: Vec<String> = ["a 1", "a 2", "a 3", "b 1"].iter().map(|s| s.to_string()).collect();
    assert!(sequence_violations(&expected, &expected).is_empty());
    let bad: Vec<String> = ["a 1", "a 1", "a 3", "b 1", "b 2", "c 1"].iter().map(|s| s.to_string()).collect();
    let v = sequence_violations(&bad, &expected);
    assert_eq!(v.len(), 4, "{v:?}");
}

#[test]
fn cluster_sigkill_of_a_worker_restarts_the_job_on_the_remaining_slots_exactly_once() {
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 200_000, 12);
    let job = job_into(dir.path(), "wc-cluster-kill", "type = \"file\"\npath = \"out\"");
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "wc-cluster-kill");
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 2);
    // w1 can take the whole job alone once w2 is gone.
    procs.0.push(worker(&c, &secret, "w1", 2, dir.path()));
    let mut w2 = worker(&c, &secret, "w2", 1, dir.path());
    // The event the test controls: a complete checkpoint of the two-worker attempt.
    first_checkpoint(&mut c, &store);
    w2.kill().unwrap(); // SIGKILL
    w2.wait().unwrap();
    let log = finish(&mut c);
    let first = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(first.contains("w1 (") && first.contains("w2 ("), "{first}");
    assert!(log.contains("worker w2 (") && log.contains("is gone"), "{log}");
    assert!(log.contains("2 attempt(s)"), "{log}");
    // From its newest checkpoint, not from the beginning.
    assert!(log.contains("restoring job `wc-cluster-kill` from checkpoint"), "{log}");
    let restarted = log.lines().find(|l| l.contains("attempt 2:")).unwrap_or_else(|| panic!("{log}"));
    assert!(restarted.contains("w1 (") && !restarted.contains("w2 ("), "{restarted}");
    let got = committed_lines(&dir.path().join("out"));
    assert_eq!(got.len(), expected.len(), "line count after the kill");
    assert!(got == expected, "committed output differs from the failure-free output");
    // The restarted attempt's checkpoints name their state files by its attempt number, so no
    // straggler of an older attempt (or a deposed leader's) can overwrite them.
    let listed = store.list();
    let newest = listed.iter().rev().find_map(|l| l.status.as_ref().ok()).expect("a complete checkpoint");
    let files: Vec<&str> = newest.operators.iter().flat_map(|o| o.subtasks.iter().map(|s| s.file.as_str())).collect();
    assert!(!files.is_empty() && files.iter().all(|f| f.ends_with(".a2.state")), "{files:?}");
}

/// The workers a coordinator's log says attempt `attempt` of job `job` runs on.
fn attempt_workers(log: &str, job: &str, nth: usize) -> Vec<String> {
    let prefix = format!("job `{job}` attempt ");
    let line = log.lines().filter(|l| l.contains(&prefix)).nth(nth).unwrap_or_else(|| panic!("{log}"));
    let on = line.split(" subtasks on ").nth(1).unwrap_or_else(|| panic!("{line}"));
    on.split(", ").map(|w| w.split(' ').next().unwrap().to_string()).collect()
}

/// Two jobs on one coordinator and five one-slot workers: each job's attempt runs on workers
/// of its own; a worker of the first SIGKILLed after its first checkpoint restarts that job
/// alone (on its remaining worker and the spare one), from its checkpoint; both commit
/// exactly the failure-free output (the other ran one attempt throughout).
#[test]
fn cluster_two_jobs_share_the_workers_and_a_worker_kill_restarts_only_its_job() {
    let dir = scratch();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let mut expected = Vec::new();
    let mut jobs = Vec::new();
    for (i, (d, name)) in [(&a, "wc-two-a"), (&b, "wc-two-b")].into_iter().enumerate() {
        std::fs::create_dir_all(d).unwrap();
        expected.push(write_input(&d.join("input.txt"), 200_000, 40 + i as u64));
        jobs.push(job_into(d, name, "type = \"file\"\npath = \"out\""));
    }
    let store = CheckpointStore::new(&a.join("checkpoints"), "wc-two-a");
    let secret = secret(dir.path());
    let mut c = coordinator_of(&[&jobs[0], &jobs[1]], &secret, 5, 10_000, &[], &[]);
    let mut procs = Procs::default();
    let mut children = Vec::new();
    for w in ["w1", "w2", "w3", "w4", "w5"] {
        children.push((w, worker(&c, &secret, w, 1, dir.path())));
    }
    first_checkpoint(&mut c, &store);
    let log = c.log.lock().unwrap().clone();
    let (on_a, on_b) = (attempt_workers(&log, "wc-two-a", 0), attempt_workers(&log, "wc-two-b", 0));
    assert!(on_a.len() == 2 && on_b.len() == 2, "{log}");
    assert!(on_a.iter().all(|w| !on_b.contains(w)), "each worker runs one job's part: {on_a:?} {on_b:?}");
    let victim = children.iter().position(|(w, _)| *w == on_a[0]).unwrap();
    let (_, mut killed) = children.remove(victim);
    killed.kill().unwrap(); // SIGKILL
    killed.wait().unwrap();
    procs.0.extend(children.into_iter().map(|(_, c)| c));
    let log = finish(&mut c);
    let again = attempt_workers(&log, "wc-two-a", 1);
    assert!(!again.contains(&on_a[0]), "{again:?}\n{log}");
    assert!(log.contains("restoring job `wc-two-a` from checkpoint"), "{log}");
    assert!(log.contains("job `wc-two-a` finished") && log.contains("(2 attempt(s)"), "{log}");
    let b_end = log.lines().find(|l| l.contains("job `wc-two-b` finished")).unwrap_or_else(|| panic!("{log}"));
    assert!(b_end.contains("(1 attempt(s)"), "the other job ran on: {b_end}");
    for (d, want) in [&a, &b].into_iter().zip(&expected) {
        let got = committed_lines(&d.join("out"));
        assert_eq!(got.len(), want.len(), "line count of {}", d.display());
        assert!(&got == want, "committed output of {} differs from the failure-free output", d.display());
    }
}

/// Runs `job` on a coordinator and two one-slot workers until `store` holds a complete
/// checkpoint, then SIGKILLs them all.
fn killed_after_first_checkpoint(dir: &Path, job: &Path, secret: &Path, store: &CheckpointStore) {
    let mut procs = Procs::default();
    let mut c = coordinator(job, secret, 2);
    for w in ["w1", "w2"] {
        procs.0.push(worker(&c, secret, w, 1, dir));
    }
    first_checkpoint(&mut c, store);
    c.child.kill().unwrap(); // SIGKILL, then the workers too
    c.child.wait().unwrap();
}

/// Rescaling across workers: the job at parallelism 2 on two workers, every process SIGKILLed
/// after a complete checkpoint, restored with `--restore latest` with the keyed counter at
/// parallelism 3 (tokenizer at 1) on three new workers: key groups move to the new subtasks
/// across processes and the committed output is the failure-free output.
#[test]
fn cluster_rescale_restoring_at_another_parallelism_on_more_workers_keeps_exactly_once() {
    let dir = scratch();
    let name = "wc-cluster-rescale";
    let expected = write_input(&dir.path().join("input.txt"), 200_000, 31);
    let job = job_into(dir.path(), name, "type = \"file\"\npath = \"out\"");
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), name);
    let secret = secret(dir.path());
    killed_after_first_checkpoint(dir.path(), &job, &secret, &store);
    rescale_wordcount(&job);
    let mut c = coordinator_args(&job, &secret, 3, 10_000, &["--restore", "latest"]);
    let mut after = Procs::default();
    for w in ["w3", "w4", "w5"] {
        after.0.push(worker(&c, &secret, w, 1, dir.path()));
    }
    let log = finish(&mut c);
    assert!(log.contains(&format!("restoring job `{name}` from checkpoint")), "{log}");
    let first = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(["w3 (", "w4 (", "w5 ("].iter().all(|w| first.contains(w)), "{first}");
    let got = committed_lines(&dir.path().join("out"));
    assert_eq!(got.len(), expected.len(), "line count after rescaling");
    assert!(got == expected, "committed output differs from the failure-free output");
    let newest = store.latest(|_| {}).unwrap();
    assert_eq!(newest.manifest.operator("count").unwrap().parallelism, 3);
    assert_eq!(newest.manifest.operator("tokenize").unwrap().parallelism, 1);
}

/// Each worker loads only its own part of a checkpoint (the coordinator reads the sinks'),
/// so a damaged state file of an operator is found by the worker that runs it. That is no
/// passing failure to retry: the job fails at once, naming the file and what to do, as it
/// does when one process loads the whole checkpoint.
#[test]
fn cluster_a_damaged_state_file_of_a_workers_part_fails_the_job_naming_it() {
    let dir = scratch();
    let name = "wc-cluster-damaged";
    write_input(&dir.path().join("input.txt"), 200_000, 33);
    let job = job_into(dir.path(), name, "type = \"file\"\npath = \"out\"");
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), name);
    let secret = secret(dir.path());
    killed_after_first_checkpoint(dir.path(), &job, &secret, &store);
    let newest = store.latest(|_| {}).unwrap();
    let entry = newest.manifest.operator("count").unwrap().subtasks[0].clone();
    let path = newest.path.join(&entry.file);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let mut c = coordinator_args(&job, &secret, 2, 10_000, &["--restore", "latest"]);
    let mut after = Procs::default();
    for w in ["w3", "w4"] {
        after.0.push(worker(&c, &secret, w, 1, dir.path()));
    }
    let (status, log) = exited(&mut c);
    assert!(!status.success(), "the job must fail:\n{log}");
    assert!(log.contains(&entry.file) && log.contains("does not fall back"), "names the file and what to do:\n{log}");
    assert!(!log.contains("attempt 2:"), "no restart from a checkpoint that does not load:\n{log}");
}

#[test]
fn cluster_a_paused_worker_is_dropped_and_when_it_wakes_up_it_commits_nothing() {
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 200_000, 13);
    let job = job_into(dir.path(), "wc-cluster-zombie", "type = \"file\"\npath = \"out\"");
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "wc-cluster-zombie");
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator_with(&job, &secret, 2, 3000);
    procs.0.push(worker(&c, &secret, "w1", 2, dir.path()));
    let mut w2 = worker_cmd(&c, &secret, "w2", 1, dir.path()).stderr(Stdio::piped()).spawn().unwrap();
    let w2_log = collect(w2.stderr.take().unwrap());
    procs.0.push(w2);
    let w2 = procs.0.last().unwrap();
    while !store.list().iter().any(|l| l.status.is_ok()) {
        assert!(c.child.try_wait().unwrap().is_none(), "the job ended before its first checkpoint");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Paused, not dead: its connections stay open, only its heartbeats stop.
    signal(w2, "-STOP");
    let log = finish(&mut c);
    assert!(log.contains("worker w2 (") && log.contains("heartbeat timeout"), "{log}");
    let restarted = log.lines().find(|l| l.contains("attempt 2:")).unwrap_or_else(|| panic!("{log}"));
    assert!(restarted.contains("w1 (") && !restarted.contains("w2 ("), "{restarted}");
    let got = committed_lines(&dir.path().join("out"));
    assert!(got == expected, "committed output differs from the failure-free output");
    // The zombie wakes up with the old attempt's subtasks mid-flight: it must find itself cut
    // off and cancel them without touching the committed output.
    signal(w2, "-CONT");
    wait_for(&w2_log, "lost the coordinator");
    wait_for(&w2_log, "waiting for a coordinator");
    assert!(committed_lines(&dir.path().join("out")) == expected, "the woken worker changed the committed output");
}

/// `examples/cluster/run.sh` runs the wordcount example on etcd, an S3 server, two
/// coordinators and three workers, kills a worker and then the leader, and checks its output
/// against `expected/`.
#[test]
fn cluster_example_runs_the_wordcount_through_a_worker_kill_and_a_leader_kill() {
    let out = crate::support::example_script("examples/cluster/run.sh");
    assert!(out.contains("cluster: killed worker w3 after chk-"), "{out}");
    assert!(out.contains("cluster: killed the leader after chk-"), "{out}");
    assert!(out.contains("cluster: out/ equals expected/"), "{out}");
}

/// A worker with another secret is refused at the door and exits with an error that says so;
/// a client speaking another protocol version is refused with the reason.
#[test]
fn cluster_a_worker_with_a_wrong_secret_or_protocol_is_refused_with_a_clear_error() {
    use weir::cluster::protocol::{PROTOCOL_VERSION, ToCoordinator, ToWorker};
    let dir = scratch();
    write_input(&dir.path().join("input.txt"), 100, 14);
    let job = job_into(dir.path(), "wc-cluster-refused", "type = \"file\"\npath = \"out\"");
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let c = coordinator(&job, &secret, 1);
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "fedcba9876543210fedcba9876543210\n").unwrap();
    let out = worker_cmd(&c, &wrong, "intruder", 1, dir.path()).stderr(Stdio::piped()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("refused the cluster secret") && err.contains("intruder"), "{err}");

    let addr = c.addr.parse().unwrap();
    let text = std::fs::read_to_string(&secret).unwrap();
    let (tx, rx) = weir::cluster::pipe::connect::<ToWorker, ToCoordinator>(addr, text.trim(), None).unwrap();
    let register = ToCoordinator::Register {
        name: "future".into(),
        data_addr: "127.0.0.1:9".parse().unwrap(),
        slots: 1,
        protocol: PROTOCOL_VERSION + 1,
    };
    tx.send(&register).unwrap();
    match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
        ToWorker::Refused(why) => assert!(why.contains("protocol") && why.contains("same weir version"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    procs.0.push(c.child);
}

/// Peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).expect("VmHWM in /proc/PID/status");
    kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
}

/// A slow sink on one worker throttles the source on another through the network channel:
/// 600 MB of records go to a sink that takes 50,000 1-KB records a second on the other worker,
/// yet neither worker's memory grows past a bound far below that, and checkpoints complete
/// while the backpressure lasts.
#[test]
fn cluster_a_slow_sink_on_one_worker_throttles_the_source_on_another_with_bounded_memory() {
    use weir::keygroup::{key_group, operator_index};
    let dir = scratch();
    // Every record has key "0"; pick key groups so it belongs to sink subtask 1 (the second
    // worker's slice), away from the source (slice 0).
    let max_p = (2..=128).find(|&m| operator_index(key_group(b"0", m), m, 2) == 1).unwrap();
    let records = 600_000;
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            r#"[job]
name = "backpressure"
max_parallelism = {max_p}

[checkpoint]
interval_ms = 200
dir = "checkpoints"

[[source]]
id = "gen"
type = "generator"
count = {records}
keys = 1
value_bytes = 1000

[[sink]]
id = "slow"
type = "blackhole"
rate = 50000
parallelism = 2
inputs = [{{ from = "gen", partition = "hash" }}]
"#
        ),
    )
    .unwrap();
    let store = CheckpointStore::new(&dir.path().join("checkpoints"), "backpressure");
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 2);
    procs.0.push(worker(&c, &secret, "w1", 1, dir.path()));
    procs.0.push(worker(&c, &secret, "w2", 1, dir.path()));
    // At 50,000 records a second the job lasts at least 12 s: a checkpoint must complete
    // while the sink holds the source back.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !store.list().iter().any(|l| l.status.as_ref().is_ok_and(|m| !m.finished)) {
        assert!(c.child.try_wait().unwrap().is_none(), "the job ended before a checkpoint completed");
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", c.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
    let log = finish(&mut c);
    let attempt = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(attempt.contains("w1 (") && attempt.contains("w2 ("), "{attempt}");
    assert!(log.contains(&records.to_string()), "{log}");
    for (w, child) in ["w1", "w2"].iter().zip(&procs.0) {
        let peak = peak_rss(child.id());
        // 600 MB of records crossed to w2; buffered rather than held back, they would show here.
        assert!(peak < 150 << 20, "worker {w} peaked at {} MB", peak >> 20);
    }
}

/// With `--tls-cert`, members speak only mutual TLS: the job runs over TLS on the control and
/// data planes, while a worker without TLS, or with a certificate the cluster does not trust,
/// never registers (and the job waits for the right ones).
#[test]
fn cluster_members_speak_mutual_tls_and_refuse_peers_without_the_clusters_certificate() {
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 20_000, 15);
    let job = job_into(dir.path(), "wc-cluster-tls", "type = \"file\"\npath = \"out\"");
    let secret = secret(dir.path());
    let pem = |name: &str| {
        let c = rcgen::generate_simple_self_signed(vec!["weir-cluster".to_string()]).unwrap();
        let (cert, key) = (dir.path().join(format!("{name}.pem")), dir.path().join(format!("{name}.key")));
        std::fs::write(&cert, c.cert.pem()).unwrap();
        std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
        (cert.to_string_lossy().into_owned(), key.to_string_lossy().into_owned())
    };
    let (cert, key) = pem("cluster");
    let (other_cert, other_key) = pem("stranger");
    let tls = ["--tls-cert", cert.as_str(), "--tls-key", key.as_str()];
    let mut procs = Procs::default();
    let mut c = coordinator_args(&job, &secret, 2, 10_000, &tls);
    let spawn = |name: &str, args: &[&str]| {
        let mut child = worker_cmd(&c, &secret, name, 1, dir.path()).args(args).stderr(Stdio::piped()).spawn().unwrap();
        let log = collect(child.stderr.take().unwrap());
        (child, log)
    };
    let (plain, plain_log) = spawn("plain", &[]);
    let (stranger, stranger_log) = spawn("stranger", &["--tls-cert", &other_cert, "--tls-key", &other_key]);
    procs.0.extend([plain, stranger]);
    wait_for(&plain_log, "waiting for a coordinator");
    wait_for(&stranger_log, "waiting for a coordinator");
    for w in ["w1", "w2"] {
        procs.0.push(spawn(w, &tls).0);
    }
    let log = finish(&mut c);
    let attempt = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(attempt.contains("w1 (") && attempt.contains("w2 ("), "{attempt}");
    assert!(!log.contains("`plain` registered") && !log.contains("`stranger` registered"), "{log}");
    assert!(!stranger_log.lock().unwrap().contains("registered with"), "{}", stranger_log.lock().unwrap());
    let got = committed_lines(&dir.path().join("out"));
    assert!(got == expected, "committed output differs from the expected wordcount");
}

/// Checkpoints in `chk/` beside the job file.
pub(crate) const CHK: &str = "dir = \"chk\"";

/// The oracle job on a cluster: an endless generator (until `count`) → the exactly-once oracle
/// (`component`, parallelism `p`) → file sinks; `checkpoints` says where checkpoints go.
pub(crate) fn oracle_cluster_job(
    dir: &Path,
    name: &str,
    component_name: &str,
    p: u32,
    count: u64,
    rate: &str,
    checkpoints: &str,
) -> std::path::PathBuf {
    let toml = format!(
        "[job]\nname = \"{name}\"\nmax_parallelism = 32\nbatch_size = 64\n\
         [checkpoint]\ninterval_ms = 100\n{checkpoints}\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = 48\n{rate}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nparallelism = {p}\nconfig = {{ keys = \"48\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = {p}\ninputs = [{{ from = \"oracle\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\n\
         inputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        crate::support::toml_path(&crate::support::component(component_name))
    );
    let p = dir.join("job.toml");
    std::fs::write(&p, toml).unwrap();
    p
}

/// The endless oracle job `name` (v1, parallelism 2) on two one-slot workers; the
/// coordinator, the workers and the cluster secret.
fn endless_oracle_on_two_workers(dir: &Path, name: &str) -> (Coordinator, Procs, std::path::PathBuf) {
    let job = oracle_cluster_job(dir, name, "test_oracle", 2, u64::MAX / 2, "rate = 3000", CHK);
    let secret = secret(dir);
    let mut procs = Procs::default();
    let c = coordinator(&job, &secret, 2);
    for w in ["w1", "w2"] {
        procs.0.push(worker(&c, &secret, w, 1, dir));
    }
    (c, procs, secret)
}

/// `weir ARGS` (the CLI, finding the job in the registry the coordinator wrote); its stdout.
pub(crate) fn cli(args: &[&str]) -> String {
    let out = weir().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "weir {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Asks `weir query` until `done` holds for the answer (the state it waits for is made by
/// records the test cannot time); returns that answer.
fn query_until(
    job: &str,
    key: &str,
    c: &mut Coordinator,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(c.child.try_wait().unwrap().is_none(), "the coordinator ended:\n{}", c.log.lock().unwrap());
        let out = weir().args(["query", job, "--operator", "oracle", "--key", key]).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        // Before the first record of the key, the owner says it has no value.
        assert!(out.status.success() || said.contains("has no value"), "weir query failed: {said}");
        let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if done(&a) {
            return a;
        }
        assert!(Instant::now() < deadline, "no answer to satisfy the test within 120 s: {a} {said}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The control API on a cluster's coordinator, through the CLI, on a job whose subtasks run on
/// two workers: live state queries answered by the worker that owns the key, a live upgrade of
/// the oracle to v2 (which migrates its state) shipped to the workers and kept through a
/// worker's SIGKILL and the restart, a savepoint, a stop with
/// a savepoint, and a restore from it at another parallelism on three new workers. The oracle
/// finds no violation and the committed output is every record exactly once.
#[test]
fn cluster_api_queries_upgrades_savepoints_and_stop_then_restore_at_another_parallelism_exactly_once() {
    let dir = scratch();
    let name = "cluster-api";
    let (mut c, mut before, secret) = endless_oracle_on_two_workers(dir.path(), name);
    // Key 5 has state once records reach its subtask: v1 keeps a bare number.
    let a = query_until(name, "5", &mut c, |a| a["found"] == true && a["value"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(a["operator"], "oracle", "{a}");
    let status: serde_json::Value = serde_json::from_str(&cli(&["status", name])).unwrap();
    assert_eq!(status["state"], "RUNNING", "{status}");
    // A live upgrade: the component travels to both workers, every subtask migrates.
    let v2 = crate::support::component("test_oracle_v2");
    let up = cli(&["upgrade", name, "--operator", "oracle", "--component", v2.to_str().unwrap()]);
    assert!(up.contains("upgraded"), "{up}");
    // v2's state is `{seq, by_v2}`, and v2 counts what it has seen.
    let a = query_until(name, "5", &mut c, |a| a["value"]["by_v2"].as_u64().is_some_and(|n| n > 0));
    assert!(a["value"]["seq"].as_u64().is_some(), "{a}");
    // The upgrade stays in force through a restart: w2 is killed (SIGKILL), w3 takes its
    // slot, and the restarted attempt runs v2 again (shipped from the coordinator's live
    // components), its state restored from a checkpoint.
    let seen = a["value"]["by_v2"].as_u64().unwrap();
    before.0[1].kill().unwrap();
    before.0[1].wait().unwrap();
    before.0.push(worker(&c, &secret, "w3", 1, dir.path()));
    wait_for(&c.log, "w3 (");
    query_until(name, "5", &mut c, |a| a["value"]["by_v2"].as_u64().is_some_and(|n| n > seen));
    let sp1 = dir.path().join("sp1");
    let out = cli(&["savepoint", name, "--dir", sp1.to_str().unwrap()]);
    assert!(out.contains("savepoint") && sp1.join("_metadata").is_file(), "{out}");
    let sp2 = dir.path().join("sp2");
    let out = cli(&["stop", name, "--savepoint", sp2.to_str().unwrap()]);
    assert!(out.contains("stopped with savepoint"), "{out}");
    let log = finish(&mut c);
    assert!(log.contains("stopped with savepoint"), "{log}");
    drop(before);
    // The stop committed exactly the records before the savepoint: the generator's first
    // `pos` of them. The restored job runs to `pos` + 4800.
    let pos = stopped_at(&committed_lines(&dir.path().join("out")));
    let count = pos + 4800;
    let job = oracle_cluster_job(dir.path(), name, "test_oracle_v2", 3, count, "", CHK);
    let mut c = coordinator_args(&job, &secret, 3, 10_000, &["--restore", sp2.to_str().unwrap()]);
    let mut after = Procs::default();
    for w in ["w3", "w4", "w5"] {
        after.0.push(worker(&c, &secret, w, 1, dir.path()));
    }
    let log = finish(&mut c);
    assert!(log.contains(&format!("restoring job `{name}` from savepoint")), "{log}");
    assert_oracle_golden(dir.path(), count);
}

/// `weir cancel` on a cluster's job: every worker's part stops, the coordinator ends with the
/// job cancelled, and the workers stay up for the next job.
#[test]
fn cluster_api_cancel_stops_the_job_on_every_worker() {
    let dir = scratch();
    let name = "cluster-cancel";
    let (mut c, mut procs, _) = endless_oracle_on_two_workers(dir.path(), name);
    query_until(name, "7", &mut c, |a| a["found"] == true);
    // The workers' counters reach the coordinator's status while the job runs.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status: serde_json::Value = serde_json::from_str(&cli(&["status", name])).unwrap();
        let oracle = status["nodes"].as_array().unwrap().iter().find(|n| n["uid"] == "oracle").unwrap().clone();
        let per_subtask: Vec<u64> =
            oracle["subtasks"].as_array().unwrap().iter().map(|s| s["records_in"].as_u64().unwrap()).collect();
        if per_subtask.iter().all(|&n| n > 0) {
            assert_eq!(oracle["records_in"].as_u64().unwrap(), per_subtask.iter().sum::<u64>(), "{oracle}");
            break;
        }
        assert!(Instant::now() < deadline, "no live counters from the workers within 120 s: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    cli(&["cancel", name]);
    let (status, log) = exited(&mut c);
    assert!(!status.success() && log.contains("cancelled"), "{status:?}\n{log}");
    assert!(!log.contains("attempt 2"), "a cancel is not a failure to restart from:\n{log}");
    for w in &mut procs.0 {
        assert!(w.try_wait().unwrap().is_none(), "a worker exited with the job");
    }
}

/// The golden output of the oracle job up to `count`, after a stop that committed `first`:
/// checks that `first` is a prefix of the stream and returns where it ends.
fn stopped_at(first: &[String]) -> u64 {
    let pos = first
        .iter()
        .map(|l| {
            let (k, s) = l.split_once(' ').unwrap();
            s.parse::<u64>().unwrap() * 48 + k.parse::<u64>().unwrap() + 1
        })
        .max()
        .expect("output committed before the stop");
    assert_eq!(first.len() as u64, pos, "the stop commits a prefix of the stream");
    pos
}

fn assert_oracle_golden(dir: &Path, count: u64) {
    let v = committed_lines(&dir.join("violations"));
    assert!(v.is_empty(), "oracle violations: {:?}", &v[..v.len().min(5)]);
    let mut golden: Vec<String> = (0..count).map(|i| format!("{} {}", i % 48, i / 48)).collect();
    golden.sort();
    let got = committed_lines(&dir.join("out"));
    assert_eq!(got.len(), golden.len(), "committed lines after the restore");
    assert!(got == golden, "committed output differs from every record exactly once");
}

/// A bucket job stopped with a savepoint in its default place, the bucket
/// (`<checkpoints>/savepoints/sp-<id>`): the coordinator, which holds none of the workers' state
/// files, downloads the checkpoint to copy it, uploads the savepoint and creates its manifest
/// last. Every local directory is then deleted, and new workers restore the savepoint from
/// its URL at another parallelism, exactly once.
#[test]
fn cluster_s3_a_savepoint_in_the_bucket_restores_on_new_workers_at_another_parallelism_exactly_once() {
    let s3 = crate::s3::S3Server::start();
    let env = s3.env();
    let dir = scratch();
    let name = "cluster-s3-sp";
    let bucket = "dir = \"s3://weir/sp\"\nstaging_dir = \"staging\"\nincremental = true";
    let job = oracle_cluster_job(dir.path(), name, "test_oracle", 2, u64::MAX / 2, "rate = 3000", bucket);
    let secret = secret(dir.path());
    let mut before = Procs::default();
    let mut c = coordinator_env(&job, &secret, 2, 10_000, &[], &env);
    for w in ["w1", "w2"] {
        before
            .0
            .push(worker_cmd(&c, &secret, w, 1, dir.path()).envs(env.clone()).stderr(Stdio::null()).spawn().unwrap());
    }
    query_until(name, "3", &mut c, |a| a["value"].as_u64().is_some_and(|n| n > 2));
    let out = cli(&["stop", name]);
    let url = out.split_whitespace().find(|w| w.starts_with("s3://")).unwrap_or_else(|| panic!("{out}")).to_string();
    assert!(url.starts_with(&format!("s3://weir/sp/{name}/savepoints/sp-")), "{out}");
    finish(&mut c);
    drop(before);
    let key = format!("{}/_metadata", url.trim_start_matches("s3://weir/"));
    assert!(s3.keys("sp").contains(&key), "{key} not in the bucket");
    let pos = stopped_at(&committed_lines(&dir.path().join("out")));
    for gone in ["staging", "w1", "w2"] {
        std::fs::remove_dir_all(dir.path().join(gone)).unwrap();
    }
    let count = pos + 4800;
    let job = oracle_cluster_job(dir.path(), name, "test_oracle", 3, count, "", bucket);
    // A place in the bucket that holds no savepoint is refused, saying what to name.
    let nothing = format!("s3://weir/sp/{name}/savepoints/none");
    let out = weir().args(["run", "--quiet-guests"]).arg(&job).args(["--restore", &nothing]).envs(env.clone()).output();
    let said = String::from_utf8_lossy(&out.unwrap().stderr).to_string();
    assert!(said.contains("holds no savepoint") && said.contains("chk-<id>"), "{said}");
    let mut c = coordinator_env(&job, &secret, 3, 10_000, &["--restore", &url], &env);
    let mut after = Procs::default();
    for w in ["w3", "w4", "w5"] {
        after
            .0
            .push(worker_cmd(&c, &secret, w, 1, dir.path()).envs(env.clone()).stderr(Stdio::null()).spawn().unwrap());
    }
    let log = finish(&mut c);
    assert!(log.contains(&format!("restoring job `{name}` from savepoint")), "{log}");
    assert_oracle_golden(dir.path(), count);
}

/// Waits for the coordinator to exit; its status and log.
fn exited(c: &mut Coordinator) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = c.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the coordinator did not exit within 120 s:\n{}", c.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(100));
    let log = c.log.lock().unwrap().clone();
    (status, log)
}

/// A cancel while the job still waits for slots ends it at once, cancelled (not after the
/// slot wait, as a failure a standby would run again).
#[test]
fn cluster_api_a_cancel_while_the_job_waits_for_slots_ends_it_at_once() {
    let dir = scratch();
    let name = "cluster-cancel-waiting";
    let job = oracle_cluster_job(dir.path(), name, "test_oracle", 2, u64::MAX / 2, "rate = 3000", CHK);
    let secret = secret(dir.path());
    // Three workers wanted, none started; the slot wait is far longer than the test.
    let mut c = coordinator_args(&job, &secret, 3, 10_000, &["--slot-wait-secs", "3600"]);
    wait_for(&c.log, "waits for 2 slot(s)");
    cli(&["cancel", name]);
    let (status, log) = exited(&mut c);
    assert!(!status.success() && log.contains("cancelled"), "{status:?}\n{log}");
}

/// A cluster job without `[checkpoint]` refuses savepoints, upgrades and queries at once,
/// saying why, instead of leaving them to time out.
#[test]
fn cluster_api_requests_of_a_job_without_checkpoints_are_refused_saying_why() {
    let dir = scratch();
    let name = "cluster-no-checkpoints";
    let job = oracle_cluster_job(dir.path(), name, "test_oracle", 2, u64::MAX / 2, "rate = 3000", CHK);
    let text = std::fs::read_to_string(&job).unwrap().replace("[checkpoint]\ninterval_ms = 100\ndir = \"chk\"\n", "");
    std::fs::write(&job, text).unwrap();
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 2);
    for w in ["w1", "w2"] {
        procs.0.push(worker(&c, &secret, w, 1, dir.path()));
    }
    wait_for(&c.log, "attempt 1:");
    let started = Instant::now();
    let out = weir().args(["savepoint", name]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("[checkpoint]"), "{said}");
    assert!(started.elapsed() < Duration::from_secs(60), "refused only after {:?}", started.elapsed());
    cli(&["cancel", name]);
    let (status, log) = exited(&mut c);
    assert!(!status.success() && log.contains("cancelled"), "{status:?}\n{log}");
}

/// The loop oracle (`cycles.rs`) for a cluster: every record goes `hops` times around a loop
/// whose feedback edge is hash-partitioned, so it crosses workers.
fn loop_oracle_job(dir: &Path, name: &str, count: u64) -> std::path::PathBuf {
    let toml = format!(
        "[job]\nname = \"{name}\"\nmax_parallelism = 16\nbatch_size = 64\nchannel_capacity = 8\n\
         [checkpoint]\ninterval_ms = 50\ndir = \"chk\"\nretained = 2\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = 32\nparallelism = 2\nrate = 5000\n\
         [[operator]]\nid = \"loop\"\ncomponent = {}\nparallelism = 2\nconfig = {{ keys = \"32\", hops = \"3\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}, {{ from = \"loop\", partition = \"hash\", feedback = true }}]\n\
         [[sink]]\nid = \"done\"\ntype = \"file\"\npath = \"done\"\nparallelism = 2\ninputs = [{{ from = \"loop\", output = \"done\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\ninputs = [{{ from = \"loop\", output = \"violations\" }}]\n",
        crate::support::toml_path(&crate::support::component("test_loop_oracle"))
    );
    let p = dir.join("job.toml");
    std::fs::write(&p, toml).unwrap();
    p
}

/// The loop oracle's output for `count` records: each (key, sequence number) once.
fn loop_golden(count: u64) -> Vec<String> {
    let mut golden: Vec<String> = (0..count).map(|i| format!("{} {}", i % 32, i / 32)).collect();
    golden.sort();
    golden
}

/// A job whose loop spans two workers: its end is found by counting records across the
/// workers in waves (`runtime/termination.rs`), its checkpoints log the back-edge records
/// that cross the network, and a worker killed with SIGKILL after a complete checkpoint is
/// replaced by a third: the oracle finds no violation and every record leaves the loop
/// exactly once.
#[test]
fn cluster_a_loop_across_workers_ends_and_stays_exactly_once_through_a_worker_kill() {
    let dir = scratch();
    let name = "cluster-loop";
    let count = 60_000;
    let job = loop_oracle_job(dir.path(), name, count);
    let store = CheckpointStore::new(&dir.path().join("chk"), name);
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 2);
    procs.0.push(worker(&c, &secret, "w1", 1, dir.path()));
    let mut w2 = worker(&c, &secret, "w2", 1, dir.path());
    // The event the test controls: a complete checkpoint of the attempt over both workers.
    first_checkpoint(&mut c, &store);
    w2.kill().unwrap(); // SIGKILL
    w2.wait().unwrap();
    procs.0.push(worker(&c, &secret, "w3", 1, dir.path()));
    let log = finish(&mut c);
    let first = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(first.contains("w1 (") && first.contains("w2 ("), "{first}");
    let last = log.lines().rfind(|l| l.contains(" subtasks on ")).unwrap();
    assert!(last.contains("w1 (") && last.contains("w3 ("), "the restarted loop spans workers too: {last}");
    let v = committed_lines(&dir.path().join("violations"));
    assert!(v.is_empty(), "oracle violations: {:?}", &v[..v.len().min(5)]);
    let golden = loop_golden(count);
    let got = committed_lines(&dir.path().join("done"));
    assert_eq!(got.len(), golden.len(), "records out of the loop");
    assert!(got == golden, "committed output differs from every record exactly once");
}

/// A loop across workers without checkpoints, where one worker runs only a source subtask:
/// its part ends long before the loop does, and its counts must still close every wave (else
/// the job never ends).
#[test]
fn cluster_a_loop_ends_when_a_workers_part_ended_first() {
    let dir = scratch();
    let name = "cluster-loop-ended-part";
    let count = 6_000;
    let job = loop_oracle_job(dir.path(), name, count);
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("[checkpoint]\ninterval_ms = 50\ndir = \"chk\"\nretained = 2\n", "")
        .replace("parallelism = 2\nconfig", "parallelism = 1\nconfig")
        .replace("path = \"done\"\nparallelism = 2", "path = \"done\"\nparallelism = 1");
    assert!(!text.contains("[checkpoint]") && text.matches("\nparallelism = 1\n").count() == 2, "{text}");
    std::fs::write(&job, text).unwrap();
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 2);
    for w in ["w1", "w2"] {
        procs.0.push(worker(&c, &secret, w, 1, dir.path()));
    }
    let log = finish(&mut c);
    let first = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(first.contains("w1 (") && first.contains("w2 ("), "{first}");
    let golden = loop_golden(count);
    assert!(committed_lines(&dir.path().join("done")) == golden, "every record out of the loop exactly once");
}

/// Unaligned checkpoints on a cluster: the oracle job with its sink throttled (channels
/// full, also the hash channel between the two workers), barriers on each channel's priority
/// stream overtaking what is queued at both ends; the worker holding one oracle subtask is
/// killed with SIGKILL once a checkpoint holding records in flight is complete, and the job
/// restarts from its newest checkpoint on the other worker, replaying them: every (key, seq)
/// exactly once.
#[test]
fn cluster_unaligned_checkpoints_overtake_the_network_and_stay_exactly_once_through_a_worker_kill() {
    let dir = scratch();
    let toml = crate::unaligned::job(2, 3_000).replace("name = \"un\"", "name = \"un-cluster\"");
    let job = dir.path().join("job.toml");
    std::fs::write(&job, &toml).unwrap();
    let store = CheckpointStore::new(&dir.path().join("chk"), "un-cluster");
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 2);
    // w1 can take the whole job alone once w2 is gone.
    procs.0.push(worker(&c, &secret, "w1", 2, dir.path()));
    let mut w2 = worker(&c, &secret, "w2", 1, dir.path());
    // The event the test controls: a complete checkpoint with records in flight.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !store.list().iter().any(|l| l.status.as_ref().is_ok_and(|m| m.metrics.backedge_log_records > 0)) {
        assert!(c.child.try_wait().unwrap().is_none(), "the job ended before a checkpoint held records in flight");
        assert!(
            Instant::now() < deadline,
            "no checkpoint with records in flight within 120 s:\n{}",
            c.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    w2.kill().unwrap(); // SIGKILL
    w2.wait().unwrap();
    let log = finish(&mut c);
    let first = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(first.contains("w1 (") && first.contains("w2 ("), "{first}");
    assert!(log.contains("2 attempt(s)") && log.contains("restoring job `un-cluster` from checkpoint"), "{log}");
    assert_oracle_golden(dir.path(), crate::unaligned::COUNT);
}

/// The digest of a component the workers of [`serving_coordinator`] start with.
const STALE: &str = "00000000000000000000000000000000000000000000000000000000000000aa";

/// `weir coordinator --serve` of the tenants in `tenants` (server.toml lines) over two
/// one-slot workers: the processes, the coordinator's log and the tenants' API URL.
fn serving_coordinator(d: &Path, tenants: &str) -> (Procs, Arc<Mutex<String>>, String) {
    let secret = secret(d);
    let config = d.join("server.toml");
    std::fs::write(&config, format!("listen = \"127.0.0.1:0\"\ndata_dir = \"data\"\n{tenants}")).unwrap();
    let c = coordinator_of(&[], &secret, 2, 5000, &["--serve", config.to_str().unwrap()], &[]);
    let mut procs = Procs::default();
    for w in ["w1", "w2"] {
        // A component kept from earlier work, beyond a cap of 0: removed at the next deploy.
        std::fs::create_dir_all(d.join(w).join("components")).unwrap();
        std::fs::write(d.join(w).join(format!("components/{STALE}.wasm")), b"stale").unwrap();
        let mut cmd = worker_cmd(&c, &secret, w, 1, d);
        procs.0.push(cmd.args(["--components-max-mb", "0"]).stderr(Stdio::null()).spawn().unwrap());
    }
    let Coordinator { child, log, .. } = c;
    procs.0.push(child);
    wait_for(&log, "tenant(s) at ");
    let url = {
        let l = log.lock().unwrap();
        l.split("tenant(s) at ").nth(1).unwrap().split_whitespace().next().unwrap().to_string()
    };
    (procs, log, url)
}

#[test]
fn cluster_serve_tenants_submit_jobs_to_the_coordinator_that_run_on_its_workers() {
    let d = scratch();
    let (alpha, beta) = ("alpha-token-0123456789", "beta-token-0123456789");
    let (procs, log, url) = serving_coordinator(
        d.path(),
        &format!(
            "[[tenant]]\nname = \"alpha\"\ntoken = \"{alpha}\"\n\
             [[tenant]]\nname = \"beta\"\ntoken = \"{beta}\"\nmax_parallelism = 1\n"
        ),
    );
    let run =
        |token: &str, args: &[&str]| weir().args(["--server", &url, "--token", token]).args(args).output().unwrap();
    let cli = |args: &[&str]| {
        let out = run(alpha, args);
        assert!(out.status.success(), "weir {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // Submitted over the API, run on the workers, its output committed in the tenant's files.
    let id = crate::sandbox::wordcount_through_the_cli(&cli, &d.path().join("data/alpha/files/out"));
    let text = log.lock().unwrap().clone();
    assert!(text.contains("job `wordcount` attempt") && text.contains("subtasks on w"), "{text}");
    // The workers keep no component beyond their cap but those of the job they ran.
    for w in ["w1", "w2"] {
        let kept: Vec<String> = std::fs::read_dir(d.path().join(w).join("components"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(kept.len() == 2 && !kept.iter().any(|k| k.starts_with(STALE)), "worker {w} keeps {kept:?}");
    }
    // A job without components runs there next (the wordcount's are removed at its deploy);
    // the wordcount then runs again, its components shipped anew.
    let plain = d.path().join("gen.toml");
    std::fs::write(
        &plain,
        "[job]\nname = \"gen\"\n[[source]]\nid = \"g\"\ntype = \"generator\"\ncount = 1000\nkeys = 4\n\
         [[sink]]\nid = \"o\"\ntype = \"file\"\npath = \"gen-out\"\nparallelism = 2\ninputs = [{ from = \"g\" }]\n",
    )
    .unwrap();
    let gen_id = cli(&["submit", plain.to_str().unwrap()]).trim().to_string();
    let t0 = Instant::now();
    while !cli(&["status", &gen_id]).contains("\"state\": \"FINISHED\"") {
        assert!(t0.elapsed() < Duration::from_secs(120), "{}", cli(&["status", &gen_id]));
        std::thread::sleep(Duration::from_millis(50));
    }
    crate::sandbox::wordcount_through_the_cli(&cli, &d.path().join("data/alpha/files/out"));
    // Another tenant does not see it, and its own quota holds on the coordinator.
    let out = run(beta, &["status", &id]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && err.contains(&format!("no job `{id}`")), "{err}");
    let job = crate::support::root().join("examples/wordcount/job.toml");
    let out = run(beta, &["submit", job.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && err.contains("max_parallelism"), "{err}");
    drop(procs);
}

#[test]
fn cluster_serve_a_tenants_job_writing_past_its_disk_quota_on_the_workers_fails_naming_it() {
    let d = scratch();
    let token = "writer-token-0123456789";
    let (procs, _log, url) = serving_coordinator(
        d.path(),
        &format!("[[tenant]]\nname = \"writer\"\ntoken = \"{token}\"\nmax_disk_mb = 8\n"),
    );
    // Two sink subtasks on two workers write into the tenant's shared directory.
    let cause = crate::sandbox::fill_the_disk(&url, token, Duration::from_secs(300));
    assert!(cause.contains("max_disk_mb = 8 MiB") && cause.contains("`writer`"), "{cause}");
    // Two workers' budgets of one directory pass it by at most a sixteenth, and a chunk and a
    // write buffer per writer (disk_budget.rs).
    let used = weir::disk_budget::disk_usage(&d.path().join("data/writer"));
    let slack = (8 << 20) / 16 + 2 * (weir::disk_budget::CHUNK + (256 << 10));
    assert!(used <= (8 << 20) + slack, "{used} bytes on disk, quota 8 MiB + {slack}");
    drop(procs);
}
