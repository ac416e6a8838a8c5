//! Connectors to real systems, against real servers started by the tests (`pg.rs`).
//!
//! The PostgreSQL sink is proven like the file sink: generator sources emit per-key sequence
//! numbers, the `test-oracle` operator reports every gap or duplicate it sees, seeded failures
//! break it mid-run, and the table must end equal to the golden output. A reader polls the
//! table *during* every run: a row once visible must never disappear or change (a sink that
//! committed at the barrier instead of at the checkpoint's completion would show rows that a
//! restore then replays twice, or values going back).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir::job;
use weir::runtime::executor::{self, RunOptions, RunSummary};
use weir::runtime::faults::{FaultKind, FaultPlan};
use weir::sandbox::engine::new_engine;

use crate::pg::PgServer;
use crate::support::{committed_lines, component, scratch, toml_path};

const KEYS: u64 = 40;

/// Rows of (k, seq), sorted.
type Rows = [(i32, i64)];

/// Generator (2 subtasks) -> oracle (2) -> PostgreSQL sink (2) writing `"<k> <seq>"` as CSV
/// columns (k, seq) into `table`; `sink` adds options (mode, key, partition).
fn oracle_job(name: &str, url: &str, table: &str, count: u64, rate: u64, sink: &str, restart: &str) -> String {
    format!(
        "[job]\nname = \"{name}\"\nmax_parallelism = 16\nbatch_size = 64\nchannel_capacity = 4\n\
         [checkpoint]\ninterval_ms = 20\ndir = \"chk\"\nretained = 2\n\
         [restart]\n{restart}\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = {KEYS}\nparallelism = 2\nrate = {rate}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {comp}\nparallelism = 2\nconfig = {{ keys = \"{KEYS}\" }}\n\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"db\"\ntype = \"postgres\"\nurl = \"{url}\"\ntable = \"{table}\"\nparallelism = 2\n{sink}\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\n\
         inputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        comp = toml_path(&component("test_oracle")),
    )
}

const CSV_APPEND: &str = "format = \"csv\"\ndelimiter = \" \"\ncolumns = [\"k\", \"seq\"]\n\
                          inputs = [{ from = \"oracle\", partition = \"rebalance\" }]";

/// Parses and runs a job file in-process.
pub(crate) fn run(dir: &Path, toml: &str, faults: Option<Arc<FaultPlan>>) -> Result<RunSummary, String> {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let graph = job::parse(&path, toml).map_err(|e| e.to_string())?;
    let bound = job::bind::bind(&new_engine().unwrap(), graph).map_err(|e| e.to_string())?;
    executor::run(&bound, &RunOptions { quiet_guests: true, faults, ..Default::default() }).map_err(|e| e.to_string())
}

/// Every `(k, seq)` the generator emits, sorted.
fn golden(count: u64) -> Vec<(i32, i64)> {
    let mut v: Vec<(i32, i64)> = (0..count).map(|i| ((i % KEYS) as i32, (i / KEYS) as i64)).collect();
    v.sort();
    v
}

fn rows(c: &mut postgres::Client, table: &str) -> Result<Vec<(i32, i64)>, postgres::Error> {
    let mut v: Vec<(i32, i64)> =
        c.query(&format!("SELECT k, seq FROM {table}"), &[])?.iter().map(|r| (r.get(0), r.get(1))).collect();
    v.sort();
    Ok(v)
}

fn prepared(pg: &PgServer) -> Vec<String> {
    pg.client().query("SELECT gid FROM pg_prepared_xacts", &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

/// Reads `table` over and over until stopped, checking each reading against the one before
/// with `check` (reconnecting while the server is down); returns how many readings it made.
fn poll(pg_url: String, table: String, stop: Arc<AtomicBool>, check: fn(&Rows, &Rows)) -> usize {
    let mut last: Vec<(i32, i64)> = Vec::new();
    let mut readings = 0;
    let mut client: Option<postgres::Client> = None;
    while !stop.load(Ordering::Relaxed) {
        if client.is_none() {
            client = postgres::Client::connect(&pg_url, postgres::NoTls).ok();
        }
        let Some(c) = client.as_mut() else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        match rows(c, &table) {
            Ok(now) => {
                check(&last, &now);
                last = now;
                readings += 1;
            }
            Err(_) => client = None,
        }
    }
    readings
}

/// Append mode: no duplicate ever, and every row seen stays.
fn never_retracted(before: &[(i32, i64)], now: &[(i32, i64)]) {
    let set: BTreeSet<_> = now.iter().collect();
    assert_eq!(set.len(), now.len(), "a row is visible twice");
    let gone: Vec<_> = before.iter().filter(|r| !set.contains(r)).take(5).collect();
    assert!(gone.is_empty(), "committed rows disappeared: {gone:?}");
}

/// Upsert mode: a key once visible stays, and its value never goes back.
fn never_goes_back(before: &[(i32, i64)], now: &[(i32, i64)]) {
    let now: BTreeMap<i32, i64> = now.iter().copied().collect();
    for (k, v) in before {
        match now.get(k) {
            None => panic!("key {k} disappeared (it had {v})"),
            Some(n) => assert!(n >= v, "key {k} went back from {v} to {n}"),
        }
    }
}

/// A PostgreSQL server with the oracle's append table `table`.
fn server_with_table(table: &str, ddl: &str) -> PgServer {
    let pg = PgServer::start(&[]);
    pg.exec(&format!("CREATE TABLE {table} {ddl}"));
    pg
}

#[test]
fn connector_postgres_sink_is_exactly_once_under_seeded_failures_and_never_retracts_a_row() {
    const COUNT: u64 = 16_000;
    let pg = PgServer::start(&[]);
    let kinds = [FaultKind::GuestTrap, FaultKind::HostPanic, FaultKind::DuringCheckpoint];
    let seeds: u64 = std::env::var("WEIR_CONNECTOR_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(6);
    // Seed `None`: the failure-free run.
    for seed in std::iter::once(None).chain((0..seeds).map(Some)) {
        let table = format!("eo_{}", seed.map_or("base".to_string(), |s| s.to_string()));
        pg.exec(&format!("CREATE TABLE {table} (k int NOT NULL, seq bigint NOT NULL)"));
        let failures = seed.map_or(0, |s| 1 + (s % 3) as u32);
        let plan = seed.map(|s| Arc::new(FaultPlan::seeded(s, failures, &[("oracle", 2)], COUNT / 2 / 5, 1, &kinds)));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (url, table, stop) = (pg.url(), table.clone(), stop.clone());
            std::thread::spawn(move || poll(url, table, stop, never_retracted))
        };
        let dir = scratch();
        let toml = oracle_job(
            &format!("pg-{table}"),
            &pg.url(),
            &table,
            COUNT,
            20_000,
            CSV_APPEND,
            "strategy = \"fixed-delay\"\nattempts = 10\ndelay_ms = 5",
        );
        let summary = run(dir.path(), &toml, plan.clone());
        stop.store(true, Ordering::Relaxed);
        let readings = poller.join().unwrap_or_else(|_| panic!("seed {seed:?}: the reader saw a retraction"));
        let ctx = format!(
            "seed {seed:?}, faults {:?}, {readings} readings during the run",
            plan.as_ref().map(|p| p.faults())
        );
        let summary = summary.unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(summary.attempts, failures + 1, "every planned failure must fire: {ctx}");
        assert!(committed_lines(&dir.path().join("violations")).is_empty(), "oracle violations: {ctx}");
        assert!(rows(&mut pg.client(), &table).unwrap() == golden(COUNT), "the table is not the golden output: {ctx}");
        assert!(prepared(&pg).is_empty(), "prepared transactions left behind: {:?} ({ctx})", prepared(&pg));
    }
}

#[test]
fn connector_postgres_upsert_survives_a_database_crash_mid_job_with_nothing_lost() {
    const COUNT: u64 = 60_000;
    let mut pg = server_with_table("latest", "(k int PRIMARY KEY, seq bigint NOT NULL)");
    let dir = scratch();
    let toml = oracle_job(
        "pg-upsert",
        &pg.url(),
        "latest",
        COUNT,
        10_000,
        "format = \"csv\"\ndelimiter = \" \"\ncolumns = [\"k\", \"seq\"]\nmode = \"upsert\"\nkey = [\"k\"]\n\
         inputs = [{ from = \"oracle\", partition = \"hash\" }]",
        "strategy = \"fixed-delay\"\nattempts = 1000\ndelay_ms = 20",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (url, stop) = (pg.url(), stop.clone());
        std::thread::spawn(move || poll(url, "latest".into(), stop, never_goes_back))
    };
    let job = {
        let (d, toml) = (dir.path().to_path_buf(), toml.clone());
        std::thread::spawn(move || run(&d, &toml, None))
    };
    // Once the first rows are committed (the job is under way), the database crashes and comes
    // back on the same data: its prepared transactions survive, its open ones are gone.
    let t0 = Instant::now();
    loop {
        let n: i64 = pg.client().query_one("SELECT count(*) FROM latest", &[]).unwrap().get(0);
        if n > 0 {
            break;
        }
        if job.is_finished() {
            panic!("the job ended before any row was visible: {:?}", job.join());
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no row became visible");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!job.is_finished(), "the job must still run when the database crashes");
    pg.crash();
    pg.restart(&[]);
    let summary = job.join().unwrap().unwrap_or_else(|e| panic!("the job failed: {e}"));
    stop.store(true, Ordering::Relaxed);
    let readings = poller.join().expect("the reader saw a key disappear or go back");
    assert!(summary.attempts >= 2, "the crash must have failed the sink: {} attempt(s)", summary.attempts);
    assert!(committed_lines(&dir.path().join("violations")).is_empty());
    let last: Vec<(i32, i64)> = (0..KEYS).map(|k| (k as i32, (COUNT / KEYS - 1) as i64)).collect();
    assert_eq!(rows(&mut pg.client(), "latest").unwrap(), last, "each key's last value ({readings} readings)");
    assert!(prepared(&pg).is_empty(), "prepared transactions left behind: {:?}", prepared(&pg));
}

#[test]
fn connector_postgres_bad_settings_tables_and_records_are_refused_naming_them() {
    let pg = server_with_table("plain", "(k int, seq bigint)");
    pg.exec("CREATE DATABASE impatient");
    pg.exec("ALTER DATABASE impatient SET idle_in_transaction_session_timeout = '20ms'");
    let none = "strategy = \"none\"";
    let fails = |url: &str, table: &str, sink: &str| {
        let dir = scratch();
        let e = run(dir.path(), &oracle_job("pg-bad", url, table, 1_000, 100_000, sink, none), None)
            .expect_err("the job must not run");
        assert!(e.contains("sink `db`") || e.contains("subtask db#"), "the sink is named: {e}");
        e
    };
    let port = pg.url().split("port=").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let at = format!("database `postgres` at 127.0.0.1:{port}");

    let e = fails(&pg.url(), "missing", CSV_APPEND);
    assert!(e.contains(&format!("table `missing` does not exist in {at}; create it")), "{e}");
    let e = fails(&pg.url(), "plain", &CSV_APPEND.replace("\"seq\"]", "\"nope\"]"));
    assert!(e.contains("table `plain`") && e.contains("has no column `nope` (it has k, seq)"), "{e}");
    let upsert = CSV_APPEND.replace("columns", "mode = \"upsert\"\nkey = [\"k\"]\ncolumns");
    let e = fails(&pg.url(), "plain", &upsert);
    assert!(e.contains("no unique index or primary key on exactly (k)") && e.contains("mode = \"append\""), "{e}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = fails(&format!("host=127.0.0.1 port={closed} user=postgres dbname=postgres"), "plain", CSV_APPEND);
    assert!(e.contains(&format!("cannot connect to database `postgres` at 127.0.0.1:{closed}")), "{e}");
    let e = fails(&pg.url().replace("dbname=postgres", "dbname=impatient"), "plain", CSV_APPEND);
    assert!(
        e.contains("idle_in_transaction_session_timeout = 20ms") && e.contains("interval_ms = 20"),
        "both settings are named: {e}"
    );

    // A record that is not what the sink was told: it fails naming the record.
    let e = fails(&pg.url(), "plain", "format = \"json\"\ninputs = [{ from = \"oracle\" }]");
    assert!(e.contains("record 0 of a batch from `oracle` subtask") && e.contains("the value is not JSON"), "{e}");
    assert!(rows(&mut pg.client(), "plain").unwrap().is_empty(), "nothing was committed");

    // Mistakes in the job file, before anything connects.
    let parse = |sink: &str| {
        let dir = scratch();
        run(dir.path(), &oracle_job("pg-bad", &pg.url(), "plain", 1_000, 100_000, sink, none), None).unwrap_err()
    };
    let e = parse("format = \"csv\"\ninputs = [{ from = \"oracle\" }]");
    assert!(e.contains("needs `columns = [...]` in field order"), "{e}");
    let e = parse(&CSV_APPEND.replace("columns", "key = [\"k\"]\ncolumns"));
    assert!(e.contains("`key` needs mode = \"upsert\""), "{e}");
    let e = parse(&CSV_APPEND.replace("\" \"", "\"ab\""));
    assert!(e.contains("`delimiter` must be one ASCII character"), "{e}");
    let dir = scratch();
    let file_with_table = "[job]\nname = \"x\"\n[[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1\n\
        [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\ntable = \"t\"\ninputs = [{ from = \"gen\" }]\n";
    let e = run(dir.path(), file_with_table, None).unwrap_err();
    assert!(e.contains("sink `out`: `table` is an option of `postgres` sinks only"), "{e}");
}

/// A shared server does not open connections for tenants' jobs: a `postgres` sink is refused
/// at submission, naming the sink.
#[test]
fn connector_postgres_sinks_are_refused_by_a_shared_server() {
    let d = scratch();
    let server = crate::ops::hosting(d.path(), &[("ops", crate::ops::OPS)]);
    let job = "[job]\nname = \"pgjob\"\n[[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 10\n\
        [[sink]]\nid = \"db\"\ntype = \"postgres\"\nurl = \"host=10.0.0.1 dbname=x\"\ntable = \"t\"\n\
        inputs = [{ from = \"gen\" }]\n";
    let (s, v) = weir::api::http::send(
        &server.addr.to_string(),
        "POST",
        "/v1/jobs",
        crate::ops::OPS,
        job.as_bytes(),
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(s, 400, "{v}");
    assert!(v.contains("sink `db`") && v.contains("does not open network connections"), "{v}");
}

/// `examples/postgres-sink/run.sh` starts its own PostgreSQL, runs the word count into a
/// table with the real `weir` binary and checks the table against `expected/`.
#[test]
fn connector_postgres_example_script_checks_its_table() {
    let out = crate::support::example_script("examples/postgres-sink/run.sh");
    assert!(out.contains("the table holds each word's final count (231 words)"), "{out}");
}

/// A server that takes only TLS: the sink verifies its certificate against `ca_cert`; without
/// it (the public web roots) or without TLS it is refused, naming the reason.
#[test]
fn connector_postgres_sink_speaks_tls_verified_against_its_ca() {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let pg = PgServer::start_tls(&cert.cert.pem(), &cert.signing_key.serialize_pem());
    pg.exec("CREATE TABLE secure (k int NOT NULL, seq bigint NOT NULL)");
    let d = scratch();
    std::fs::write(d.path().join("ca.pem"), cert.cert.pem()).unwrap();
    let none = "strategy = \"none\"";
    let job = |url: &str, extra: &str| {
        oracle_job("pg-tls", url, "secure", 400, 100_000, &format!("{extra}\n{CSV_APPEND}"), none)
    };
    let tls_url = format!("{} sslmode=require", pg.url());
    run(d.path(), &job(&tls_url, "ca_cert = \"ca.pem\""), None).expect("the job runs over TLS");
    assert_eq!(rows(&mut pg.client(), "secure").unwrap(), golden(400));

    let e = run(d.path(), &job(&tls_url, ""), None).unwrap_err();
    assert!(e.contains("cannot connect to database `postgres`") && e.contains("certificate"), "{e}");
    let e = run(d.path(), &job(&pg.url().replace("dbname", "sslmode=disable dbname"), ""), None).unwrap_err();
    assert!(e.contains("cannot connect") && e.contains("no encryption"), "{e}");
}
