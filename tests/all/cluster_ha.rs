//! High availability of the coordinator on a real etcd: two `weir coordinator`s of one cluster
//! elect a leader, the standby takes every job over from its newest checkpoint recorded in etcd
//! when the leader is killed or paused, and a deposed leader that wakes up stops at once.
//! The committed output must equal the failure-free output either way.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster::{Procs, collect, collect_into, secret, signal, wait_for};
use crate::etcd::Etcd;
use crate::process_recovery::{job_into, write_input};
use crate::support::{committed_lines, scratch, weir};

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A coordinator of cluster `ha` on `etcd`, listening on `addr` once it leads; its stdout and
/// stderr go to one log.
fn coordinator(job: &Path, secret: &Path, addr: SocketAddr, etcd: &Etcd) -> (Child, Arc<Mutex<String>>) {
    coordinator_env(job, secret, addr, etcd, &[])
}

fn coordinator_env(
    job: &Path,
    secret: &Path,
    addr: SocketAddr,
    etcd: &Etcd,
    env: &[(&str, String)],
) -> (Child, Arc<Mutex<String>>) {
    coordinator_on(&[job], secret, &addr.to_string(), etcd, env)
}

/// A coordinator listening on every interface at `addr`'s port, advertising `addr` in etcd.
fn coordinator_advertising(job: &Path, secret: &Path, addr: SocketAddr, etcd: &Etcd) -> (Child, Arc<Mutex<String>>) {
    let listen = format!("0.0.0.0:{} --advertise {addr}", addr.port());
    coordinator_on(&[job], secret, &listen, etcd, &[])
}

/// `listen`: its --listen value, possibly followed by more arguments.
fn coordinator_on(
    jobs: &[&Path],
    secret: &Path,
    listen: &str,
    etcd: &Etcd,
    env: &[(&str, String)],
) -> (Child, Arc<Mutex<String>>) {
    let mut child = weir()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg("coordinator")
        .arg("--listen")
        .args(listen.split(' '))
        .args(["--heartbeat-timeout-ms", "3000", "--workers", "2"])
        .args(["--etcd", etcd.endpoint(), "--cluster", "ha", "--lease-ttl-secs", "5", "--secret-file"])
        .arg(secret)
        .args(jobs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = collect(child.stderr.take().unwrap());
    collect_into(child.stdout.take().unwrap(), &log);
    (child, log)
}

fn worker(coordinators: &str, secret: &Path, name: &str, home: &Path) -> Child {
    worker_env(coordinators, secret, name, home, &[])
}

/// A worker of cluster `ha` that reads the leader's address from etcd (`--etcd`), not a list.
fn worker_by_etcd(etcd: &Etcd, secret: &Path, name: &str, home: &Path) -> Child {
    worker_env(&format!("--etcd={}", etcd.endpoint()), secret, name, home, &[])
}

/// `coordinators`: a comma-separated list, or `--etcd=URL` (then of cluster `ha`).
fn worker_env(coordinators: &str, secret: &Path, name: &str, home: &Path, env: &[(&str, String)]) -> Child {
    let find: Vec<&str> = match coordinators.strip_prefix("--etcd=") {
        Some(etcd) => vec!["--etcd", etcd, "--cluster", "ha"],
        None => vec!["--coordinator", coordinators],
    };
    weir()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg("worker")
        .args(find)
        .args(["--name", name, "--slots", "1", "--secret-file"])
        .arg(secret)
        .arg("--dir")
        .arg(home.join(name))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(home.join(format!("{name}.log"))).unwrap())
        .spawn()
        .unwrap()
}

/// Waits for `child` to exit; its status code.
fn exit_code(child: &mut Child, log: &Arc<Mutex<String>>) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            std::thread::sleep(Duration::from_millis(100));
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "no exit within 300 s:\n{}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A leader (c1) and a standby (c2) of one cluster, two workers following whichever leads (w1
/// tries both addresses in turn, w2 reads the leader's from etcd), the wordcount at p=2
/// running until its first complete checkpoint. The job needs both workers, so a takeover
/// completes only if each way of finding the new leader works.
struct Setup {
    etcd: Etcd,
    dir: tempfile::TempDir,
    job: std::path::PathBuf,
    secret: std::path::PathBuf,
    /// The standby's address.
    b: SocketAddr,
    expected: Vec<String>,
    procs: Procs,
    c1: (Child, Arc<Mutex<String>>),
    c2: (Child, Arc<Mutex<String>>),
}

fn setup(name: &str, seed: u64) -> Setup {
    let etcd = Etcd::start();
    let dir = scratch();
    let expected = write_input(&dir.path().join("input.txt"), 400_000, seed);
    let job = job_into(dir.path(), name, "type = \"file\"\npath = \"out\"");
    let secret = secret(dir.path());
    let (a, b) = (free_addr(), free_addr());
    let c1 = coordinator(&job, &secret, a, &etcd);
    wait_for(&c1.1, "leading cluster `ha`");
    // The standby listens on every interface and advertises a loopback address: what a worker
    // that reads etcd must connect to.
    let c2 = coordinator_advertising(&job, &secret, b, &etcd);
    wait_for(&c2.1, "standby: cluster `ha` is led by the coordinator at");
    let mut procs = Procs::default();
    let list = format!("{a},{b}");
    procs.0.push(worker(&list, &secret, "w1", dir.path()));
    procs.0.push(worker_by_etcd(&etcd, &secret, "w2", dir.path()));
    let mut c1 = c1;
    // The event the test controls: a checkpoint the leader recorded in etcd (published and
    // announced), not merely one whose manifest exists.
    let deadline = Instant::now() + Duration::from_secs(120);
    while etcd.get(&format!("/weir/ha/checkpoint/{name}")).is_none() {
        assert!(
            c1.0.try_wait().unwrap().is_none(),
            "the leader ended before its first checkpoint:\n{}",
            c1.1.lock().unwrap()
        );
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", c1.1.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(c1.0.try_wait().unwrap().is_none(), "the job must still run on the leader");
    Setup { etcd, dir, job, secret, b, expected, procs, c1, c2 }
}

/// Checks the standby's run: it led, restored the recorded checkpoint, and the committed
/// output equals the failure-free output.
fn check_takeover(s: &mut Setup, name: &str) {
    let code = exit_code(&mut s.c2.0, &s.c2.1);
    // The worker that reads etcd found the standby at the address it advertised.
    let w2 = std::fs::read_to_string(s.dir.path().join("w2.log")).unwrap();
    assert!(w2.contains(&format!("registered with the coordinator at {}", s.b)), "{w2}");
    let log = s.c2.1.lock().unwrap().clone();
    assert_eq!(code, 0, "the standby failed:\n{log}");
    assert!(log.contains("leading cluster `ha`"), "{log}");
    assert!(log.contains("taking over from checkpoint"), "{log}");
    assert!(log.contains(&format!("restoring job `{name}` from checkpoint")), "{log}");
    let got = committed_lines(&s.dir.path().join("out"));
    assert_eq!(got.len(), s.expected.len(), "line count after the takeover");
    assert!(got == s.expected, "committed output differs from the failure-free output");
}

#[test]
fn cluster_ha_sigkill_of_the_leader_hands_the_job_to_the_standby_exactly_once() {
    let mut s = setup("wc-ha-kill", 21);
    s.c1.0.kill().unwrap(); // SIGKILL
    s.c1.0.wait().unwrap();
    check_takeover(&mut s, "wc-ha-kill");
    drop(s.procs);
}

#[test]
fn cluster_ha_a_paused_leader_is_deposed_and_stops_when_it_wakes_up() {
    let mut s = setup("wc-ha-pause", 22);
    // Paused, not dead: its connections stay open, only its lease renewals and heartbeats
    // stop. The standby takes over once the lease lapses; the workers leave the silent leader.
    signal(&s.c1.0, "-STOP");
    check_takeover(&mut s, "wc-ha-pause");
    let committed = committed_lines(&s.dir.path().join("out"));
    signal(&s.c1.0, "-CONT");
    let code = exit_code(&mut s.c1.0, &s.c1.1);
    let log = s.c1.1.lock().unwrap().clone();
    assert_eq!(code, 3, "a deposed leader exits with status 3:\n{log}");
    assert!(log.contains("stops at once") || log.contains("stopping at once"), "{log}");
    assert!(committed_lines(&s.dir.path().join("out")) == committed, "the deposed leader changed the committed output");
}

/// etcd not running: the coordinator fails with an error naming etcd and its address, and
/// has published nothing.
#[test]
fn cluster_ha_an_unreachable_etcd_is_a_clear_error() {
    let dir = scratch();
    write_input(&dir.path().join("input.txt"), 100, 23);
    let job = job_into(dir.path(), "wc-ha-no-etcd", "type = \"file\"\npath = \"out\"");
    let secret = secret(dir.path());
    let nowhere = format!("http://{}", free_addr());
    let coordinator = |listen: &str| {
        weir()
            .args(["coordinator", "--listen", listen, "--etcd", &nowhere, "--secret-file"])
            .arg(&secret)
            .arg(&job)
            .output()
            .unwrap()
    };
    let out = coordinator(&free_addr().to_string());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("etcd at") && err.contains(&nowhere["http://".len()..]), "{err}");
    assert!(out.stdout.is_empty(), "it must not listen for workers: {}", String::from_utf8_lossy(&out.stdout));
    assert!(!dir.path().join("checkpoints").exists() && !dir.path().join("out").exists());
    // An address workers could not reach from the leader's value in etcd is refused first.
    for listen in ["0.0.0.0:7070", "127.0.0.1:0"] {
        let out = coordinator(listen);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(&format!("--listen {listen} is not an address workers can reach")),
            "{err}"
        );
        assert!(err.contains("--advertise"), "{err}");
    }
}

/// Every process of the cluster killed (coordinator and workers, SIGKILL) and the local staging
/// directory gone: a new coordinator and new workers resume the job from the checkpoint etcd
/// names in the bucket, and the committed output is the failure-free output. The members
/// share no checkpoint files: workers stage state files under their own `--dir`, upload them
/// and drop them; the coordinator checks them in the bucket before it publishes; restores
/// download them.
#[test]
fn cluster_ha_the_whole_cluster_stopped_and_started_again_resumes_from_its_checkpoint_in_s3() {
    let etcd = Etcd::start();
    let s3 = crate::s3::S3Server::start();
    let env = s3.env();
    let dir = scratch();
    let name = "wc-ha-s3";
    let expected = write_input(&dir.path().join("input.txt"), 400_000, 24);
    let job = job_into(dir.path(), name, "type = \"file\"\npath = \"out\"");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("dir = \"checkpoints\"", "dir = \"s3://weir/ha\"\nstaging_dir = \"staging\"");
    std::fs::write(&job, text).unwrap();
    let secret = secret(dir.path());
    let start = |tag: &str| {
        let addr = free_addr();
        let c = coordinator_env(&job, &secret, addr, &etcd, &env);
        wait_for(&c.1, "leading cluster `ha`");
        let mut procs = Procs::default();
        for w in ["w1", "w2"] {
            procs.0.push(worker_env(&addr.to_string(), &secret, &format!("{w}{tag}"), dir.path(), &env));
        }
        (c, procs)
    };
    let (mut c, procs) = start("a");
    let deadline = Instant::now() + Duration::from_secs(120);
    let recorded = loop {
        if let Some(chk) = etcd.get(&format!("/weir/ha/checkpoint/{name}")) {
            break chk;
        }
        assert!(
            c.0.try_wait().unwrap().is_none(),
            "the job ended before its first checkpoint:\n{}",
            c.1.lock().unwrap()
        );
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", c.1.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(recorded.starts_with(&format!("s3://weir/ha/{name}/chk-")), "{recorded}");
    let chk = recorded.rsplit('/').next().unwrap().to_string();
    let state_files = |d: std::path::PathBuf| -> Vec<String> {
        let names = std::fs::read_dir(&d).into_iter().flatten().flatten();
        names.map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(".state")).collect()
    };
    // The coordinator published it holding only the manifest: the state files are the
    // workers' (verified in the bucket), and the workers dropped theirs once uploaded.
    let here = dir.path().join("staging").join(name).join(&chk);
    assert!(here.join("_metadata").is_file(), "the coordinator's copy of {chk} has its manifest");
    assert_eq!(state_files(here), Vec::<String>::new(), "state files of {chk} on the coordinator's disk");
    for w in ["w1a", "w2a"] {
        let theirs = dir.path().join(w).join("staging").join(name);
        assert!(theirs.is_dir(), "{w} staged its state files under its own --dir");
        let theirs = theirs.join(&chk);
        assert_eq!(state_files(theirs), Vec::<String>::new(), "{w} kept state files of {chk} after uploading them");
    }
    assert!(c.0.try_wait().unwrap().is_none(), "the job must still run when the cluster stops");
    c.0.kill().unwrap();
    c.0.wait().unwrap();
    drop(procs); // SIGKILL of every worker
    std::fs::remove_dir_all(dir.path().join("staging")).unwrap();
    let taken = etcd.get(&format!("/weir/ha/checkpoint/{name}")).unwrap(); // newer than `recorded`, maybe

    let (mut c, procs) = start("b");
    let code = exit_code(&mut c.0, &c.1);
    let log = c.1.lock().unwrap().clone();
    assert_eq!(code, 0, "the restarted cluster failed:\n{log}");
    assert!(log.contains("taking over from checkpoint s3://weir/ha/"), "{log}");
    assert!(log.contains(&format!("restoring job `{name}` from checkpoint")), "{log}");
    // Each worker downloaded the checkpoint from the bucket itself (nothing of the
    // coordinator's disk is theirs to read).
    // And only its own part of it: at unchanged parallelism the workers' parts add up to
    // the checkpoint, each subtask's state loaded once in the cluster.
    let mut parts = Vec::new();
    for w in ["w1b", "w2b"] {
        let theirs = std::fs::read_to_string(dir.path().join(format!("{w}.log"))).unwrap();
        assert!(theirs.contains(&format!("restores from {taken}")), "{w}:\n{theirs}");
        parts.push(loaded_part(&theirs, &taken).unwrap_or_else(|| panic!("{w} says what it loaded:\n{theirs}")));
    }
    let total = parts[0].1;
    assert!(parts.iter().all(|&(k, n)| n == total && k > 0 && k < n), "each worker loads part of it: {parts:?}");
    assert_eq!(parts.iter().map(|p| p.0).sum::<u32>(), total, "every subtask's state loaded once: {parts:?}");
    let got = committed_lines(&dir.path().join("out"));
    assert_eq!(got.len(), expected.len(), "line count after the restart");
    assert!(got == expected, "committed output differs from the failure-free output");
    drop(procs);

    // etcd replaced by an empty one (reset, wiped, a new etcd): it knows no checkpoint, the
    // bucket holds the job's. A new leader does not start the job over (that would clear
    // its committed output): it stops, naming the newest checkpoint and how to resume.
    let fresh = Etcd::start();
    let mut c = coordinator_env(&job, &secret, free_addr(), &fresh, &env);
    let code = exit_code(&mut c.0, &c.1);
    let log = c.1.lock().unwrap().clone();
    assert_ne!(code, 0, "the leader must refuse to start over:\n{log}");
    assert!(log.contains(&format!("etcd holds no checkpoint of job `{name}`")), "{log}");
    assert!(log.contains(&format!("--restore s3://weir/ha/{name}/chk-")), "{log}");
    assert!(committed_lines(&dir.path().join("out")) == expected, "the committed output is untouched");
}

/// What a worker's log says it loaded of checkpoint `url` (`s3://…/chk-<id>`) when its first
/// attempt restored it: (subtask states loaded, of how many).
fn loaded_part(log: &str, url: &str) -> Option<(u32, u32)> {
    let id = url.rsplit("chk-").next()?;
    let line = log.lines().find(|l| l.contains(" subtask states ") && l.ends_with(&format!("of checkpoint {id}")))?;
    let mut words = line.split(" loaded ").nth(1)?.split(' ');
    let k = words.next()?.parse().ok()?;
    let n = words.nth(1)?.parse().ok()?;
    Some((k, n))
}

/// etcd stops answering mid-job (SIGSTOP): the leader cannot renew its lease and stops at
/// once (exit 3) without committing anything it could not record; once etcd is back, a
/// coordinator started in its place (as a supervisor would) takes the job over from the
/// recorded checkpoint, exactly-once.
#[test]
fn cluster_ha_etcd_unreachable_mid_job_stops_the_leader_and_a_new_one_finishes_exactly_once() {
    let mut s = setup("wc-ha-etcd", 25);
    s.c2.0.kill().unwrap(); // one coordinator at a time here: the replacement below
    s.c2.0.wait().unwrap();
    let etcd = std::process::Command::new("kill").args(["-STOP", &s.etcd.pid().to_string()]).status().unwrap();
    assert!(etcd.success());
    let code = exit_code(&mut s.c1.0, &s.c1.1);
    let log = s.c1.1.lock().unwrap().clone();
    assert_eq!(code, 3, "a leader that cannot renew its lease exits with status 3:\n{log}");
    assert!(log.contains("stops at once"), "{log}");
    let before = committed_lines(&s.dir.path().join("out"));
    assert!(before.len() < s.expected.len(), "the job must not have finished");
    let etcd = std::process::Command::new("kill").args(["-CONT", &s.etcd.pid().to_string()]).status().unwrap();
    assert!(etcd.success());
    s.c2 = coordinator(&s.job, &s.secret, s.b, &s.etcd);
    check_takeover(&mut s, "wc-ha-etcd");
}

/// A job stopped with a savepoint is over for the cluster: the leader records that in etcd
/// before it confirms the stop, so the standby, elected once the leader has exited, does not
/// run the job again (which would commit past the savepoint a user may resume elsewhere).
#[test]
fn cluster_ha_a_job_stopped_with_a_savepoint_is_not_run_again_by_the_standby() {
    let etcd = Etcd::start();
    let dir = scratch();
    let name = "cluster-ha-stop";
    let job = crate::cluster::oracle_cluster_job(
        dir.path(),
        name,
        "test_oracle",
        2,
        u64::MAX / 2,
        "rate = 3000",
        crate::cluster::CHK,
    );
    let secret = secret(dir.path());
    let (a, b) = (free_addr(), free_addr());
    let mut c1 = coordinator(&job, &secret, a, &etcd);
    wait_for(&c1.1, "leading cluster `ha`");
    let mut c2 = coordinator(&job, &secret, b, &etcd);
    wait_for(&c2.1, "standby: cluster `ha` is led by the coordinator at");
    let mut procs = Procs::default();
    let list = format!("{a},{b}");
    procs.0.push(worker(&list, &secret, "w1", dir.path()));
    procs.0.push(worker(&list, &secret, "w2", dir.path()));
    let deadline = Instant::now() + Duration::from_secs(120);
    while etcd.get(&format!("/weir/ha/checkpoint/{name}")).is_none() {
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", c1.1.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    let sp = dir.path().join("sp");
    let out = crate::cluster::cli(&["stop", name, "--savepoint", sp.to_str().unwrap()]);
    assert!(out.contains("stopped with savepoint"), "{out}");
    assert_eq!(exit_code(&mut c1.0, &c1.1), 0, "{}", c1.1.lock().unwrap());
    assert!(etcd.get(&format!("/weir/ha/finished/{name}")).is_some(), "the stop is recorded in etcd");
    assert_eq!(exit_code(&mut c2.0, &c2.1), 0, "{}", c2.1.lock().unwrap());
    let log = c2.1.lock().unwrap().clone();
    assert!(log.contains("already run to its end") && !log.contains("restoring job"), "{log}");
}

#[test]
fn cluster_ha_sigkill_of_a_leader_of_two_jobs_hands_both_to_the_standby_exactly_once() {
    let etcd = Etcd::start();
    let dir = scratch();
    let names = ["wc-ha-two-a", "wc-ha-two-b"];
    let mut jobs = Vec::new();
    let mut expected = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        expected.push(write_input(&d.join("input.txt"), 600_000, 31 + i as u64));
        jobs.push(job_into(&d, name, "type = \"file\"\npath = \"out\""));
    }
    let job_refs: Vec<&Path> = jobs.iter().map(|j| j.as_path()).collect();
    let secret = secret(dir.path());
    let (a, b) = (free_addr(), free_addr());
    let mut c1 = coordinator_on(&job_refs, &secret, &a.to_string(), &etcd, &[]);
    wait_for(&c1.1, "leading cluster `ha`");
    let mut c2 = coordinator_on(&job_refs, &secret, &b.to_string(), &etcd, &[]);
    wait_for(&c2.1, "standby: cluster `ha` is led by the coordinator at");
    // Each job (p=2) holds two one-slot workers.
    let mut procs = Procs::default();
    for w in ["w1", "w2", "w3", "w4"] {
        procs.0.push(worker_by_etcd(&etcd, &secret, w, dir.path()));
    }
    // The event the test controls: both jobs have a checkpoint recorded in etcd.
    let deadline = Instant::now() + Duration::from_secs(120);
    while names.iter().any(|n| etcd.get(&format!("/weir/ha/checkpoint/{n}")).is_none()) {
        assert!(c1.0.try_wait().unwrap().is_none(), "the leader ended early:\n{}", c1.1.lock().unwrap());
        assert!(Instant::now() < deadline, "no checkpoint of each job within 120 s:\n{}", c1.1.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    for n in names {
        assert!(etcd.get(&format!("/weir/ha/finished/{n}")).is_none(), "job `{n}` ended before the kill");
    }
    c1.0.kill().unwrap(); // SIGKILL
    c1.0.wait().unwrap();
    let code = exit_code(&mut c2.0, &c2.1);
    let log = c2.1.lock().unwrap().clone();
    assert_eq!(code, 0, "the standby failed:\n{log}");
    for (i, n) in names.iter().enumerate() {
        assert!(log.contains(&format!("job `{n}`: taking over from checkpoint")), "{log}");
        assert!(log.contains(&format!("restoring job `{n}` from checkpoint")), "{log}");
        assert!(etcd.get(&format!("/weir/ha/finished/{n}")).is_some(), "job `{n}`'s end is recorded");
        let got = committed_lines(&dir.path().join(n).join("out"));
        assert_eq!(got.len(), expected[i].len(), "job `{n}`: line count after the takeover");
        assert!(got == expected[i], "job `{n}`: committed output differs from the failure-free output");
    }
    drop(procs);
}

#[test]
fn cluster_ha_a_cluster_stored_by_an_earlier_weir_keeps_its_job_and_its_end() {
    // An earlier Weir kept one job per cluster under `job`, `checkpoint` and `finished`. The
    // new leader moves them to the job's keys: this job has run to its end, so it is not run
    // again (without the move it would count as new and wait for workers).
    let etcd = Etcd::start();
    let dir = scratch();
    let name = "wc-ha-old-keys";
    write_input(&dir.path().join("input.txt"), 1_000, 41);
    let job = job_into(dir.path(), name, "type = \"file\"\npath = \"out\"");
    let text = std::fs::read_to_string(&job).unwrap();
    etcd.put("/weir/ha/job", &serde_json::json!({ "path": job, "text": text }).to_string());
    etcd.put("/weir/ha/checkpoint", "/elsewhere/chk-7");
    etcd.put("/weir/ha/finished", "1");
    let secret = secret(dir.path());
    let mut c = coordinator(&job, &secret, free_addr(), &etcd);
    let code = exit_code(&mut c.0, &c.1);
    let log = c.1.lock().unwrap().clone();
    assert_eq!(code, 0, "{log}");
    assert!(log.contains(&format!("moved job `{name}`, stored by an earlier Weir")), "{log}");
    assert!(log.contains("already run to its end") && !log.contains("running job"), "{log}");
    let stored = etcd.get(&format!("/weir/ha/jobs/{name}")).expect("the job under its name");
    assert!(stored.contains(&format!("\"name\":\"{name}\"")), "{stored}");
    assert_eq!(etcd.get(&format!("/weir/ha/checkpoint/{name}")).as_deref(), Some("/elsewhere/chk-7"));
    assert_eq!(etcd.get(&format!("/weir/ha/finished/{name}")).as_deref(), Some("1"));
    for old in ["job", "checkpoint", "finished"] {
        assert_eq!(etcd.get(&format!("/weir/ha/{old}")), None, "old key `{old}` removed");
    }
    assert!(!dir.path().join("out").exists(), "the finished job must not run again");
}

/// The URL of the tenants' API a serving coordinator logged once it served.
fn api_url(log: &Arc<Mutex<String>>) -> String {
    wait_for(log, "tenant(s) at ");
    let l = log.lock().unwrap();
    l.split("tenant(s) at ").nth(1).unwrap().split_whitespace().next().unwrap().to_string()
}

/// Two coordinators serving tenants on one cluster, a leader and a standby, with two workers
/// that find the leader in etcd; the config and the tenants' data under `d`.
fn serving_pair(etcd: &Etcd, d: &Path, token: &str) -> [(Child, Arc<Mutex<String>>); 2] {
    let config = d.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n[[tenant]]\nname = \"alpha\"\ntoken = \"{token}\"\n",
            d.join("data").display().to_string()
        ),
    )
    .unwrap();
    let secret = secret(d);
    let serving =
        |addr: SocketAddr| coordinator_on(&[], &secret, &format!("{addr} --serve {}", config.display()), etcd, &[]);
    let c1 = serving(free_addr());
    wait_for(&c1.1, "tenant(s) at ");
    let c2 = serving(free_addr());
    wait_for(&c2.1, "standby: cluster `ha` is led by the coordinator at");
    [c1, c2]
}

/// A tenant's job stopped with a savepoint on the leader is over: removed from etcd, so the
/// standby that takes over after the leader's SIGKILL does not run it again.
#[test]
fn cluster_ha_serve_a_tenants_job_stopped_with_a_savepoint_is_not_run_again_by_the_standby() {
    let etcd = Etcd::start();
    let dir = scratch();
    let d = dir.path();
    let token = "alpha-token-0123456789";
    let [mut c1, mut c2] = serving_pair(&etcd, d, token);
    let mut procs = Procs::default();
    for w in ["w1", "w2"] {
        procs.0.push(worker_by_etcd(&etcd, &secret(d), w, d));
    }
    let addr = api_url(&c1.1).trim_start_matches("http://").to_string();
    let call = |addr: &str, method: &str, path: &str, body: &[u8]| {
        let (s, v) = weir::api::http::send(addr, method, path, token, body, Duration::from_secs(60)).unwrap();
        (s, serde_json::from_str::<serde_json::Value>(&v).unwrap())
    };
    let job = "[job]\nname = \"ticks\"\n[checkpoint]\ninterval_ms = 100\ndir = \"checkpoints\"\n\
               [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000000000\nkeys = 8\nrate = 2000\n\
               [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = 2\ninputs = [{ from = \"gen\" }]\n";
    let (s, v) = call(&addr, "POST", "/v1/jobs", job.as_bytes());
    assert_eq!(s, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    while etcd.get(&format!("/weir/ha/served-checkpoint/alpha/{id}")).is_none() {
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", c1.1.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    let (s, v) = call(&addr, "POST", &format!("/v1/jobs/{id}/stop"), br#"{"dir": "sp"}"#);
    assert_eq!(s, 200, "{v}");
    assert_eq!(etcd.get(&format!("/weir/ha/served/alpha/{id}")), None, "the stop removed the job from etcd");
    c1.0.kill().unwrap();
    c1.0.wait().unwrap();
    let addr2 = api_url(&c2.1).trim_start_matches("http://").to_string();
    let log = c2.1.lock().unwrap().clone();
    assert!(log.contains("took over 0 tenants' job(s)") && !log.contains("restoring job"), "{log}");
    let (s, v) = call(&addr2, "GET", &format!("/v1/jobs/{id}"), b"");
    assert_eq!(s, 404, "a stopped job is not run again: {v}");
    c2.0.kill().unwrap();
    c2.0.wait().unwrap();
    drop(procs);
}

/// `weir coordinator --serve --etcd`: a tenant submits a job to the leader; the leader is
/// killed after the job's first checkpoint recorded in etcd; the standby takes the job back
/// under the same id and tenant from that checkpoint, and the tenant follows it to its end on
/// the standby's API with output equal to the failure-free run's.
#[test]
fn cluster_ha_serve_sigkill_of_the_leader_hands_tenants_jobs_to_the_standby_exactly_once() {
    let etcd = Etcd::start();
    let dir = scratch();
    let d = dir.path();
    let token = "alpha-token-0123456789";
    let data = d.join("data");
    let job_dir = d.join("job");
    std::fs::create_dir_all(&job_dir).unwrap();
    let expected = write_input(&job_dir.join("input.txt"), 500_000, 43);
    let job = job_into(&job_dir, "wc-ha-serve", "type = \"file\"\npath = \"out\"");
    let secret = secret(d);
    let [mut c1, mut c2] = serving_pair(&etcd, d, token);
    let url1 = api_url(&c1.1);
    assert!(!c2.1.lock().unwrap().contains("tenant(s) at "), "a standby must not serve tenants");
    // Its API port points tenants at the leader's (announced in etcd); strangers get 401.
    wait_for(&c2.1, "standby: answering tenants at ");
    let standby = {
        let l = c2.1.lock().unwrap();
        l.split("standby: answering tenants at ").nth(1).unwrap().split_whitespace().next().unwrap().to_string()
    };
    let ask =
        |token: &str| weir::api::http::send(&standby, "GET", "/v1/jobs", token, b"", Duration::from_secs(60)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (status, body) = loop {
        let (status, body) = ask(token);
        if body.contains(&url1) || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status == 503 && body.contains(&format!("its leader serves the API at {url1}")), "{status} {body}");
    assert_eq!(ask("not-a-token").0, 401);
    let mut procs = Procs::default();
    for w in ["w1", "w2"] {
        procs.0.push(worker_by_etcd(&etcd, &secret, w, d));
    }
    let cli = |url: &str, args: &[&str]| {
        let out = weir().args(["--server", url, "--token", token]).args(args).output().unwrap();
        assert!(out.status.success(), "weir {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let id = cli(&url1, &["submit", job.to_str().unwrap()]).trim().to_string();
    let number: u64 = id.rsplit('-').next().unwrap().parse().unwrap();
    let stored = format!("/weir/ha/served/alpha/{id}");
    assert!(etcd.get(&stored).is_some_and(|v| v.contains("wc-ha-serve")), "the job is stored before its id is given");
    // The event the test controls: a checkpoint of the job recorded in etcd.
    let recorded = format!("/weir/ha/served-checkpoint/alpha/{id}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while etcd.get(&recorded).is_none() {
        assert!(c1.0.try_wait().unwrap().is_none(), "the leader ended:\n{}", c1.1.lock().unwrap());
        assert!(Instant::now() < deadline, "no checkpoint within 120 s:\n{}", c1.1.lock().unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(etcd.get(&stored).is_some(), "the job must still run on the leader");
    // etcd holds a small record; the job file stays in the tenant's directory.
    let kept = data.join(format!("alpha/jobs/{number}.toml"));
    assert!(etcd.get(&stored).unwrap().len() < 1024 && kept.exists(), "{:?}", etcd.get(&stored));
    // A stored job whose file is gone cannot be taken over: its tenant sees why, and it is removed.
    let lost = "/weir/ha/served/alpha/lost-99";
    etcd.put(
        lost,
        r#"{"tenant":"alpha","id":"lost-99","number":99,"restore":null,"allow_non_restored_state":false,"sha256":"00"}"#,
    );
    c1.0.kill().unwrap(); // SIGKILL
    c1.0.wait().unwrap();
    let url2 = api_url(&c2.1);
    let t0 = Instant::now();
    while !cli(&url2, &["status", &id]).contains("\"state\": \"FINISHED\"") {
        assert!(t0.elapsed() < Duration::from_secs(180), "not finished: {}", cli(&url2, &["status", &id]));
        assert!(c2.0.try_wait().unwrap().is_none(), "the standby ended:\n{}", c2.1.lock().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = c2.1.lock().unwrap().clone();
    assert!(log.contains(&format!("tenant `alpha`'s job `{id}`: taking over from checkpoint")), "{log}");
    assert!(log.contains("restoring job `wc-ha-serve` from checkpoint"), "{log}");
    let got = committed_lines(&data.join("alpha/files/out"));
    assert_eq!(got.len(), expected.len(), "line count after the takeover");
    assert!(got == expected, "committed output differs from the failure-free output");
    // Over: no later leader runs it again; and no later job gets its number.
    assert_eq!(etcd.get(&stored), None, "the finished job is removed from etcd");
    assert_eq!(etcd.get(&recorded), None);
    assert!(!kept.exists(), "its job file is removed with it");
    let st = cli(&url2, &["status", "lost-99"]);
    assert!(st.contains("FAILED") && st.contains("could not be taken over") && st.contains("jobs/99.toml"), "{st}");
    assert!(!st.contains(&d.display().to_string()), "no server paths in a tenant's error: {st}");
    assert_eq!(etcd.get(lost), None, "a job that cannot be taken over is removed");
    let next: u64 = etcd.get("/weir/ha/served-next").unwrap().parse().unwrap();
    assert!(next > number, "served-next {next} after job number {number}");
    c2.0.kill().unwrap();
    c2.0.wait().unwrap();
    drop(procs);
}
