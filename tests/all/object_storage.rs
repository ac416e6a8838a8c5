//! Checkpoints in S3-compatible object storage (#13): a real `weir` process checkpoints into a
//! real S3-protocol server (moto), is killed with SIGKILL, loses its local directory as a lost
//! machine would, and a new process restores from the object store alone, exactly once. An
//! unreachable store fails checkpoints and restores with errors naming it and publishes
//! nothing; a cluster's restart waits for it (a proxy the test cuts) and then resumes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use weir::checkpoint::metadata::Manifest;
use weir::checkpoint::storage::CheckpointStore;

use crate::process_recovery::{job_into, kill_after_checkpoint, write_input};
use crate::s3::{S3Server, env_for};
use crate::support::{committed_lines, scratch, weir};

/// The wordcount job `name` with its checkpoints in `s3://weir/<prefix>`, written locally to
/// `staging/` first.
fn s3_job(dir: &Path, name: &str, prefix: &str) -> std::path::PathBuf {
    let job = job_into(dir, name, "type = \"file\"\npath = \"out\"");
    let text = std::fs::read_to_string(&job).unwrap().replace(
        "dir = \"checkpoints\"",
        &format!("dir = \"s3://weir/{prefix}\"\nstaging_dir = \"staging\"\nretained = 2\nincremental = true"),
    );
    // Held to 20 000 lines/s, so the job outlasts two kills on any machine.
    std::fs::write(&job, text.replace("rate = 100000", "rate = 20000")).unwrap();
    job
}

fn spawn(job: &Path, env: &[(&'static str, String)], restore: bool) -> Child {
    let mut c = weir();
    c.args(["run", "--progress", "0", "--quiet-guests"]).arg(job).envs(env.iter().map(|(k, v)| (k, v)));
    if restore {
        c.args(["--restore", "latest"]);
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
}

#[test]
fn cluster_s3_a_new_process_with_no_local_files_restores_from_the_object_store_exactly_once() {
    // Killed twice; each time the local directory is deleted, and the next process restores
    // from the bucket alone: first a checkpoint named by its URL, then `--restore latest`.
    let s3 = S3Server::start();
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 150_000, 11);
    let job = s3_job(dir.path(), "wc-s3", "runs");
    let staging = dir.path().join("staging");
    let local = CheckpointStore::new(&staging, "wc-s3");

    let mut child = spawn(&job, &s3.env(), false);
    assert!(kill_after_checkpoint(&mut child, &local, 1, 0), "the job ended before it was killed");
    let newest = local.list().iter().filter(|l| l.status.is_ok()).map(|l| l.id).max().unwrap();
    // Published in the object store before locally, and every file it names is there.
    let keys = s3.keys("runs/wc-s3");
    let manifest = format!("runs/wc-s3/chk-{newest}/_metadata");
    assert!(keys.contains(&manifest), "{manifest} missing from {keys:?}");
    for f in std::fs::read_dir(local.chk_dir(weir::ids::CheckpointId(newest))).unwrap() {
        let name = f.unwrap().file_name().to_string_lossy().to_string();
        if !name.starts_with('.') {
            assert!(keys.contains(&format!("runs/wc-s3/chk-{newest}/{name}")), "{name} of chk-{newest} not uploaded");
        }
    }

    // The machine is gone: nothing local survives but the job file and its input. Restored
    // from that checkpoint by its URL, then killed again.
    std::fs::remove_dir_all(&staging).unwrap();
    let mut child = weir()
        .args(["run", "--progress", "0", "--quiet-guests"])
        .arg(&job)
        .args(["--restore", &format!("s3://weir/runs/wc-s3/chk-{newest}")])
        .envs(s3.env().iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed again after its next checkpoint, unless the rest of the input was too short for
    // that on a loaded machine (the first kill's moment depends on the machine's speed): then
    // it must have finished cleanly, and the last restore below only commits.
    let killed = kill_after_checkpoint(&mut child, &local, newest, 0);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(killed || child.wait().unwrap().success(), "the restored job failed: {stderr}");
    assert!(stderr.contains(&format!("restoring job `wc-s3` from checkpoint {newest}")), "{stderr}");
    let newest = local.list().iter().filter(|l| l.status.is_ok()).map(|l| l.id).max().unwrap();
    std::fs::remove_dir_all(&staging).unwrap();
    let out = spawn(&job, &s3.env(), true).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "restore run failed: {stderr}");
    assert!(stderr.contains(&format!("restoring job `wc-s3` from checkpoint {newest}")), "{stderr}");
    let got = committed_lines(&dir.path().join("out"));
    assert_eq!(got.len(), expected.len(), "line count after restoring from S3");
    assert!(got == expected, "committed output differs from the failure-free output");
    // Retention applies in the object store too: the newest `retained` complete checkpoints
    // and the earlier ones their incremental chains name, nothing else.
    let mut ids: Vec<u64> = s3
        .keys("runs/wc-s3")
        .iter()
        .filter_map(|k| k.strip_suffix("/_metadata")?.rsplit("chk-").next()?.parse().ok())
        .collect();
    ids.sort();
    let newest: Vec<u64> = ids.iter().rev().take(2).copied().collect();
    let mut needed = newest.clone();
    for id in &newest {
        let m = Manifest::decode(&s3.get(&format!("runs/wc-s3/chk-{id}/_metadata"))).unwrap();
        needed.extend(m.operators.iter().flat_map(|o| &o.subtasks).flat_map(|s| &s.chain).map(|l| l.checkpoint));
    }
    assert!(ids.iter().all(|id| needed.contains(id)), "S3 keeps {ids:?}; retention allows only {needed:?}");
}

#[test]
fn cluster_s3_an_unreachable_store_fails_checkpoints_and_restores_naming_it_and_publishes_nothing() {
    // A port nothing listens on: connections are refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let env = env_for(&format!("http://127.0.0.1:{port}"));
    let dir = scratch();
    write_input(&dir.path().join("input.txt"), 20_000, 3);
    let job = s3_job(dir.path(), "wc-s3-down", "down");

    let out = spawn(&job, &env, true).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a restore from an unreachable store must fail");
    assert!(
        stderr.contains("s3://weir/down/wc-s3-down") && stderr.contains("retry once it is reachable"),
        "the error names the store and what to do: {stderr}"
    );
    let out = weir()
        .args(["run", "--quiet-guests"])
        .arg(&job)
        .args(["--restore", "s3://weir/down/wc-s3-down/latest"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("s3://weir/down/wc-s3-down/latest") && stderr.contains("reachable"),
        "a savepoint URL in an unreachable store: {stderr}"
    );

    // Running: every checkpoint is declined naming the store; the job waits at its final
    // checkpoint rather than finish without one; nothing is published anywhere.
    let mut child = spawn(&job, &env, false);
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    let named = loop {
        assert!(Instant::now() < deadline, "no checkpoint failure reported within 120 s: {seen:?}");
        let Some(Ok(line)) = lines.next() else { break false };
        if line.contains("s3://weir/down/wc-s3-down") && line.contains("uploading") {
            break true;
        }
        seen.push(line);
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(named, "the process ended without naming the store: {seen:?}");
    let staging = CheckpointStore::new(&dir.path().join("staging"), "wc-s3-down");
    assert!(staging.list().iter().all(|l| l.status.is_err()), "a checkpoint was published without its store");
    assert!(committed_lines(&dir.path().join("out")).is_empty(), "output was committed without a checkpoint");
}

#[test]
fn cluster_s3_a_bad_store_url_or_a_stray_staging_dir_is_refused_naming_the_line() {
    let dir = scratch();
    let base = "[job]\nname = \"j\"\n[checkpoint]\ninterval_ms = 100\nCHK\n[[source]]\nid = \"g\"\ntype = \"generator\"\n\
                count = 10\n[[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{ from = \"g\" }]\n";
    for (chk, expect) in [
        ("dir = \"s3://\"", "no bucket"),
        ("dir = \"gs://bucket/p\"", "only s3://bucket/prefix"),
        ("dir = \"s3://bucket/a/../b\"", "`..`"),
        ("dir = \"chk\"\nstaging_dir = \"st\"", "staging_dir is the local copy of an object store"),
    ] {
        let path = dir.path().join("job.toml");
        std::fs::write(&path, base.replace("CHK", chk)).unwrap();
        let out = weir().arg("validate").arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "`{chk}` accepted");
        assert!(stderr.contains("job.toml:5") || stderr.contains("job.toml:6"), "`{chk}`: no line: {stderr}");
        assert!(stderr.contains(expect), "`{chk}`: {stderr}");
    }
}

/// A TCP proxy in front of the S3 server that the test can cut: while down it closes every
/// connection it holds and every new one at once (as a store that stopped answering, without
/// waiting for client timeouts).
struct Cut {
    addr: std::net::SocketAddr,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Cut {
    fn to(target: &str) -> Cut {
        use std::sync::atomic::Ordering;
        let target: std::net::SocketAddr = target.trim_start_matches("http://").parse().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (u, o) = (up.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !u.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = std::net::TcpStream::connect(target) else { continue };
                let mut o = o.lock().unwrap();
                o.push(client.try_clone().unwrap());
                o.push(server.try_clone().unwrap());
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Cut { addr, up, open }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, up: bool) {
        self.up.store(up, std::sync::atomic::Ordering::SeqCst);
        if !up {
            for s in self.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// On a cluster the coordinator keeps no state files, so restarting after a worker is lost
/// needs the bucket. While it does not answer, the restart waits (saying so) instead of going
/// back to an older checkpoint or failing the job; once it answers again the job restarts from
/// its newest checkpoint and finishes exactly once.
#[test]
fn cluster_s3_a_restart_waits_for_an_unreachable_bucket_and_then_resumes_exactly_once() {
    let s3 = S3Server::start();
    let cut = Cut::to(&s3.endpoint());
    let env = env_for(&cut.endpoint());
    let dir = scratch();
    let name = "wc-s3-wait";
    let expected = write_input(&dir.path().join("input.txt"), 200_000, 41);
    let job = s3_job(dir.path(), name, "wait");
    let secret = crate::cluster::secret(dir.path());
    let spawn_env = |args: &[&str]| {
        let mut c = weir();
        c.args(args).envs(env.iter().map(|(k, v)| (k, v)));
        c
    };
    let mut coordinator = spawn_env(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "2", "--secret-file"])
        .arg(&secret)
        .arg(&job)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut procs = crate::cluster::Procs::default();
    let log = crate::cluster::collect(coordinator.stderr.take().unwrap());
    let mut first = String::new();
    BufReader::new(coordinator.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let addr = first.trim().strip_prefix("listening on ").unwrap().to_string();
    let worker = |w: &str, slots: &str| {
        spawn_env(&["worker", "--coordinator", &addr, "--name", w, "--slots", slots, "--secret-file"])
            .arg(&secret)
            .arg("--dir")
            .arg(dir.path().join(w))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    procs.0.push(worker("w1", "2"));
    let mut w2 = worker("w2", "1");
    // The coordinator's copy of a published manifest: a checkpoint is complete in the bucket.
    let store = CheckpointStore::new(&dir.path().join("staging"), name);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !store.list().iter().any(|l| l.status.is_ok()) {
        assert!(coordinator.try_wait().unwrap().is_none(), "the job ended before its first checkpoint");
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    cut.set(false);
    w2.kill().unwrap();
    w2.wait().unwrap();
    crate::cluster::wait_for(&log, "waits to restart");
    assert!(coordinator.try_wait().unwrap().is_none(), "the job must wait, not end:\n{}", log.lock().unwrap());
    cut.set(true);
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = coordinator.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the job did not finish:\n{}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(100));
    let log = log.lock().unwrap().clone();
    assert!(status.success(), "{log}");
    assert!(log.contains("waits to restart") && log.contains("retry once it is reachable"), "{log}");
    assert!(log.contains(&format!("restoring job `{name}` from checkpoint")), "{log}");
    let got = committed_lines(&dir.path().join("out"));
    assert_eq!(got.len(), expected.len(), "line count after the wait");
    assert!(got == expected, "committed output differs from the failure-free output");
}
