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

use crate::process_recovery::{job_into, write_input};
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
    let l = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            let mut l = l.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    log
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
    let mut child = weir()
        .args(["coordinator", "--listen", "127.0.0.1:0", "--heartbeat-timeout-ms", &heartbeat_timeout_ms.to_string()])
        .args(["--workers", &workers.to_string(), "--secret-file"])
        .arg(secret)
        .arg(job)
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

pub(crate) fn secret(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("secret");
    std::fs::write(&p, "0123456789abcdef0123456789abcdef\n").unwrap();
    p
}

#[test]
fn cluster_a_job_over_two_workers_commits_the_output_of_one_process() {
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 20_000, 11);
    let job = job_into(dir.path(), "wc-cluster", "type = \"file\"\npath = \"out\"");
    let secret = secret(dir.path());
    let mut procs = Procs::default();
    let mut c = coordinator(&job, &secret, 2);
    procs.0.push(worker(&c, &secret, "w1", 1, dir.path()));
    procs.0.push(worker(&c, &secret, "w2", 1, dir.path()));
    let log = finish(&mut c);
    // Both workers ran a slice: the hash edge crossed the network.
    let attempt = log.lines().find(|l| l.contains("attempt 1:")).unwrap_or_else(|| panic!("{log}"));
    assert!(attempt.contains("w1 (") && attempt.contains("w2 ("), "{attempt}");
    assert!(log.contains("1 attempt(s)"), "{log}");
    let got = committed_lines(&dir.path().join("out"));
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "committed output differs from the expected wordcount");
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
    let deadline = Instant::now() + Duration::from_secs(120);
    while !store.list().iter().any(|l| l.status.is_ok()) {
        assert!(c.child.try_wait().unwrap().is_none(), "the job ended before its first checkpoint");
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", c.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(c.child.try_wait().unwrap().is_none(), "the job must still run when w2 is killed");
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

/// `examples/cluster/run.sh` runs the wordcount example over a coordinator and two workers and
/// checks its output against `expected/`.
#[test]
fn cluster_example_runs_the_wordcount_over_two_workers() {
    let out = crate::support::example_script("examples/cluster/run.sh");
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
    let (tx, rx) = weir::cluster::pipe::connect::<ToWorker, ToCoordinator>(addr, text.trim()).unwrap();
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
