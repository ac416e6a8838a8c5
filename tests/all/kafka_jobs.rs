//! Kafka in and out, against a real broker (`kafka.rs`): wordcount reads lines from a Kafka
//! topic and writes `w n` counts to another in Kafka transactions. Under seeded failures,
//! SIGKILLs of the process, a broker restart and a rescale, a `read_committed` reader of the
//! output must end with exactly the failure-free records, and a reader polling it *during*
//! the run must never see a record twice (a sink that committed at the barrier rather than at
//! the checkpoint's completion would show records that the restore then writes again).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use weir::runtime::faults::{FaultKind, FaultPlan};

use crate::connectors::run;
use crate::kafka::KafkaServer;
use crate::support::{component, scratch, toml_path};

const WORDS: &[&str] = &["weir", "river", "barrier", "snapshot", "stream", "kafka", "commit", "offset", "fence", "txn"];

/// `lines` lines of words, keyed by line number; returns them and the expected `w n` values.
fn input(lines: usize, seed: u64) -> (Vec<(String, String)>, Vec<String>) {
    let mut s = seed;
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut recs = Vec::new();
    for l in 0..lines {
        let mut words = Vec::new();
        for _ in 0..(1 + l % 5) {
            s = weir::connectors::generator::splitmix64(s);
            let w = format!("{}{}", WORDS[(s % WORDS.len() as u64) as usize], (s >> 20) % 7);
            *counts.entry(w.clone()).or_default() += 1;
            words.push(w);
        }
        recs.push((l.to_string(), words.join(" ")));
    }
    let mut expected: Vec<String> =
        counts.iter().flat_map(|(w, n)| (1..=*n).map(move |i| format!("{w} {i}"))).collect();
    expected.sort();
    (recs, expected)
}

/// Kafka `input` (source parallelism `source_p`, bounded) -> tokenizer -> counter -> Kafka
/// `output`, exactly-once, checkpoints every `interval_ms`.
pub fn wordcount_job(
    name: &str,
    bootstrap: &str,
    input: &str,
    output: &str,
    source_p: u32,
    interval_ms: u64,
) -> String {
    let sink = format!("type = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"{output}\"");
    wordcount_into(name, bootstrap, input, source_p, interval_ms, &sink)
}

/// The same wordcount into a sink of kind `sink` (a TOML fragment; parallelism 2).
pub fn wordcount_into(name: &str, bootstrap: &str, input: &str, source_p: u32, interval_ms: u64, sink: &str) -> String {
    format!(
        "[job]\nname = \"{name}\"\nmax_parallelism = 32\nbatch_size = 64\n\
         [checkpoint]\ninterval_ms = {interval_ms}\ndir = \"chk\"\n\
         [restart]\nstrategy = \"fixed-delay\"\nattempts = 100\ndelay_ms = 10\n\
         [[source]]\nid = \"lines\"\ntype = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"{input}\"]\n\
         bounded = true\nparallelism = {source_p}\n\
         [[operator]]\nid = \"tokenize\"\ncomponent = {tok}\nparallelism = 2\ninputs = [{{ from = \"lines\", partition = \"rebalance\" }}]\n\
         [[operator]]\nid = \"count\"\ncomponent = {cnt}\nparallelism = 2\ninputs = [{{ from = \"tokenize\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\n{sink}\n\
         parallelism = 2\ninputs = [{{ from = \"count\" }}]\n",
        tok = toml_path(&component("wordcount_tokenizer")),
        cnt = toml_path(&component("wordcount_counter")),
    )
}

/// Values of every committed record of `topic`, sorted.
pub fn committed_values(k: &KafkaServer, topic: &str) -> Vec<String> {
    let mut v: Vec<String> = k.read_committed(topic).into_iter().map(|(_, _, v)| v).collect();
    v.sort();
    v
}

/// Reads `topic` with `read_committed` until stopped, failing on a value seen twice (committed
/// records never go away in Kafka: a duplicate is what a retraction-free log shows instead).
/// Returns the records read.
pub fn watch(bootstrap: String, topic: String, stop: Arc<AtomicBool>) -> usize {
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", format!("watcher-{topic}"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("log_level", "0")
        .create()
        .unwrap();
    c.subscribe(&[&topic]).unwrap();
    let mut seen = BTreeSet::new();
    while !stop.load(Ordering::Relaxed) {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(20)) {
            let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            assert!(seen.insert(v.clone()), "`{v}` became visible twice in {topic}");
        }
    }
    seen.len()
}

#[test]
fn connector_kafka_wordcount_is_exactly_once_under_seeded_failures() {
    let k = KafkaServer::start();
    let (lines, expected) = input(3_000, 7);
    k.create_topic("lines", 4);
    k.produce("lines", &lines, |i| (i % 4) as i32);
    let kinds = [FaultKind::GuestTrap, FaultKind::HostPanic, FaultKind::DuringCheckpoint];
    let seeds: u64 = std::env::var("WEIR_CONNECTOR_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    // Seed `None`: the failure-free run.
    for seed in std::iter::once(None).chain((0..seeds).map(Some)) {
        let out = format!("counts-{}", seed.map_or("base".to_string(), |s| s.to_string()));
        k.create_topic(&out, 3);
        let failures = seed.map_or(0, |s| 1 + (s % 3) as u32);
        let plan = seed.map(|s| Arc::new(FaultPlan::seeded(s, failures, &[("count", 2)], 2_000, 1, &kinds)));
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (b, t, s) = (k.bootstrap(), out.clone(), stop.clone());
            std::thread::spawn(move || watch(b, t, s))
        };
        let dir = scratch();
        let toml = wordcount_job(&format!("kwc{}", out.len()), &k.bootstrap(), "lines", &out, 2, 20);
        let summary = run(dir.path(), &toml, plan.clone());
        stop.store(true, Ordering::Relaxed);
        let seen = watcher.join().expect("the watcher saw a record twice");
        let summary = summary.unwrap_or_else(|e| panic!("seed {seed:?}: {e}"));
        assert_eq!(summary.attempts, failures + 1, "seed {seed:?}: every planned failure must fire");
        let got = committed_values(&k, &out);
        assert_eq!(got.len(), expected.len(), "seed {seed:?}: records in {out}");
        assert!(got == expected, "seed {seed:?}: {out} differs from the failure-free output");
        assert!(seen <= expected.len());
    }
}

/// Waits until `topic` holds at least `n` committed records.
fn wait_for_output(k: &KafkaServer, topic: &str, n: usize) {
    let t0 = std::time::Instant::now();
    while k.read_committed(topic).len() < n {
        assert!(t0.elapsed() < Duration::from_secs(120), "no output in {topic} within 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The broker restarted while the job runs: an unbounded job has read and committed the first
/// half of the input; the broker is stopped and started again (its consumers, producers,
/// transactions and group commits reconnect); the second half, written after the restart, is
/// read, counted and committed too; stopped with a savepoint, the output is exactly the
/// failure-free one. The restart falls between the sink's transactions: noida-db, the test
/// broker, forgets transactions open across its restart (and still acknowledges their commit),
/// which Kafka does not; the sink rewrites a transaction whose connection it saw drop, but a
/// restart racing its commit cannot be told from a harmless reconnect.
#[test]
fn connector_kafka_broker_restarted_mid_job_loses_nothing() {
    use crate::savepoints::start;
    let mut k = KafkaServer::start();
    let (first, first_expected) = input(5_000, 11);
    let (lines, expected) = input(10_000, 11);
    assert!(lines[..5_000] == first[..]);
    k.create_topic("lines", 4);
    k.produce("lines", &first, |i| (i % 4) as i32);
    k.create_topic("counts", 3);
    let dir = scratch();
    let toml = wordcount_job("kbroker", &k.bootstrap(), "lines", "counts", 2, 50).replace("bounded = true\n", "");
    let mut r = start(dir.path(), &toml, None, false);
    wait_for_output(&k, "counts", first_expected.len());
    k.restart();
    k.produce("lines", &lines[5_000..], |i| (i % 4) as i32);
    wait_for_output(&k, "counts", expected.len());
    r.handle.savepoint(Some(dir.path().join("sp")), true, Duration::from_secs(60)).unwrap();
    let summary = r.join().expect("the job recovers from the broker restart");
    let got = committed_values(&k, "counts");
    eprintln!("broker restart: {} attempts, {} records", summary.attempts, got.len());
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "the output differs from the failure-free output");
}

/// The real `weir` process SIGKILLed at two random moments after checkpoints, restarted with
/// `--restore latest`: the output topic holds exactly the failure-free records.
#[test]
fn connector_kafka_sigkill_then_restore_latest_is_exactly_once() {
    use crate::process_recovery::kill_twice_then_finish;
    use weir::checkpoint::storage::CheckpointStore;
    let k = KafkaServer::start();
    let (lines, expected) = input(20_000, 5);
    k.create_topic("lines", 4);
    k.produce("lines", &lines, |i| (i % 4) as i32);
    k.create_topic("counts", 3);
    let dir = scratch();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kafka sigkill test seed {seed}");
    let toml = wordcount_job("kkill", &k.bootstrap(), "lines", "counts", 2, 100)
        .replace("bounded = true\n", "bounded = true\nrate = 5000\n");
    let job = dir.path().join("job.toml");
    std::fs::write(&job, toml).unwrap();
    let store = CheckpointStore::new(&dir.path().join("chk"), "kkill");
    let kills = kill_twice_then_finish(&job, &store, seed, 300);
    let got = committed_values(&k, "counts");
    assert_eq!(got.len(), expected.len(), "records after {kills} kill(s), seed {seed}");
    assert!(got == expected, "the output differs from the failure-free output (seed {seed})");
}

/// Stop with a savepoint at source parallelism 2 (sink 2), restore at source parallelism 3
/// (sink 1, which adopts the other sink subtask's transactions): every partition's offset
/// goes to its new owner, and the output is exactly the failure-free records.
#[test]
fn connector_kafka_rescale_from_a_savepoint_moves_offsets_with_their_partitions() {
    use crate::savepoints::{start, wait_records};
    let k = KafkaServer::start();
    let (lines, expected) = input(12_000, 3);
    k.create_topic("lines", 5);
    k.produce("lines", &lines, |i| (i % 5) as i32);
    k.create_topic("counts", 3);
    let dir = scratch();
    let toml = wordcount_job("kscale", &k.bootstrap(), "lines", "counts", 2, 50)
        .replace("bounded = true\n", "bounded = true\nrate = 3000\n");
    let mut r = start(dir.path(), &toml, None, false);
    wait_records(&r, "count", 5_000);
    let sp = dir.path().join("sp");
    r.handle.savepoint(Some(sp.clone()), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let before = committed_values(&k, "counts").len();
    assert!(before > 0 && before < expected.len(), "the savepoint was taken mid-input ({before} records)");
    let rescaled = wordcount_job("kscale", &k.bootstrap(), "lines", "counts", 3, 50).replace(
        "parallelism = 2\ninputs = [{ from = \"count\" }]",
        "parallelism = 1\ninputs = [{ from = \"count\" }]",
    );
    assert!(rescaled.contains("parallelism = 1\ninputs"), "the sink runs at parallelism 1");
    let mut r = start(dir.path(), &rescaled, Some(sp), false);
    let summary = r.join().unwrap();
    assert!(summary.restored_from.is_some());
    let got = committed_values(&k, "counts");
    assert_eq!(got.len(), expected.len(), "records after the rescale ({before} before it)");
    assert!(got == expected, "the output differs from the failure-free output");
}

/// Kafka `input` -> Kafka `output` directly (no operator), with `source` and `sink` extra
/// options and `[checkpoint]` text `chk`.
fn passthrough(bootstrap: &str, input: &str, output: &str, source: &str, sink: &str, chk: &str) -> String {
    format!(
        "[job]\nname = \"kbad\"\n{chk}\n[restart]\nstrategy = \"none\"\n\
         [[source]]\nid = \"in\"\ntype = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"{input}\"]\nbounded = true\n{source}\n\
         [[sink]]\nid = \"out\"\ntype = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"{output}\"\n{sink}\n\
         inputs = [{{ from = \"in\" }}]\n"
    )
}

#[test]
fn connector_kafka_bad_brokers_topics_and_settings_are_refused_naming_them() {
    let k = KafkaServer::start();
    k.create_topic("in", 2);
    k.create_topic("out", 1);
    k.produce("in", &[("a".into(), "1".into()), ("b".into(), "2".into())], |i| i as i32 % 2);
    let chk = "[checkpoint]\ninterval_ms = 1000\ndir = \"chk\"";
    let dir = scratch();
    let b = k.bootstrap();
    let err = |toml: String| run(dir.path(), &toml, None).expect_err("refused");

    // Nothing listens on port 1: named, with what to check.
    let e = err(passthrough("127.0.0.1:1", "in", "out", "", "", chk));
    assert!(e.contains("source `in`") && e.contains("127.0.0.1:1") && e.contains("check bootstrap_servers"), "{e}");
    let e = err(
        passthrough(&b, "in", "out", "", "", chk).replace(&format!("\"{b}\"\ntopic ="), "\"127.0.0.1:1\"\ntopic =")
    );
    assert!(e.contains("sink `out`") && e.contains("127.0.0.1:1"), "{e}");

    // Missing topics, on either side.
    let e = err(passthrough(&b, "nope", "out", "", "", chk));
    assert!(e.contains("topic `nope` does not exist") && e.contains(&b), "{e}");
    let e = err(passthrough(&b, "in", "gone", "", "", chk));
    assert!(e.contains("topic `gone` does not exist") && e.contains("sink `out`"), "{e}");

    // A transaction timeout that a checkpoint interval can outlast.
    let e = err(passthrough(&b, "in", "out", "", "transaction_timeout_ms = 500", chk));
    assert!(
        e.contains("transaction_timeout_ms = 500")
            && e.contains("interval_ms = 1000")
            && e.contains("kafka sink `out`"),
        "{e}"
    );
    // Exactly-once without checkpoints.
    let e = err(passthrough(&b, "in", "out", "", "delivery = \"exactly-once\"", ""));
    assert!(e.contains("no checkpoints") && e.contains("at-least-once"), "{e}");
    // Options that are not this type's, and values that are not options.
    let e = err(passthrough(&b, "in", "out", "", "", chk)
        .replace("type = \"kafka\"\nbootstrap_servers", "type = \"file\"\nbootstrap_servers"));
    assert!(e.contains("is an option of `kafka` sources only"), "{e}");
    let e = err(passthrough(&b, "in", "out", "start = \"yesterday\"", "", chk));
    assert!(e.contains("unknown start `yesterday`"), "{e}");
    let e =
        err(passthrough(&b, "in", "out", "", "", chk).replace(&format!("\"{b}\"\ntopics"), "\"localhost\"\ntopics"));
    assert!(e.contains("bootstrap_servers `localhost` is not a list of host:port"), "{e}");
    let e = err(passthrough(&b, "in", "out", "topic_pattern = \"(\"", "", chk));
    assert!(e.contains("set `topics` or `topic_pattern`, not both"), "{e}");

    // And the same job with good settings runs, at-least-once without checkpoints.
    run(dir.path(), &passthrough(&b, "in", "out", "", "", ""), None).unwrap();
    let mut got = committed_values(&k, "out");
    got.sort();
    assert_eq!(got, ["1", "2"]);
}

/// The PostgreSQL sink's `(word, n)` rows as `w n` lines, sorted.
fn table_lines(pg: &crate::pg::PgServer, table: &str) -> Vec<String> {
    let q = format!("SELECT word || ' ' || n FROM {table}");
    let mut v: Vec<String> = pg.client().query(&q, &[]).unwrap().iter().map(|r| r.get(0)).collect();
    v.sort();
    v
}

fn pg_sink(pg: &crate::pg::PgServer, table: &str) -> String {
    format!(
        "type = \"postgres\"\nurl = \"{}\"\ntable = \"{table}\"\nformat = \"csv\"\ndelimiter = \" \"\ncolumns = [\"word\", \"n\"]",
        pg.url()
    )
}

/// Kafka -> WASM wordcount -> PostgreSQL, under seeded failures and then SIGKILLs of the real
/// process: the table ends equal to the failure-free output, no prepared transaction left.
#[test]
fn connector_kafka_to_postgres_is_exactly_once_under_failures_and_sigkill() {
    use crate::process_recovery::kill_twice_then_finish;
    use weir::checkpoint::storage::CheckpointStore;
    let k = KafkaServer::start();
    let pg = crate::pg::PgServer::start(&[]);
    let (lines, expected) = input(8_000, 17);
    k.create_topic("lines", 4);
    k.produce("lines", &lines, |i| (i % 4) as i32);
    let kinds = [FaultKind::GuestTrap, FaultKind::HostPanic, FaultKind::DuringCheckpoint];
    let seeds: u64 = std::env::var("WEIR_CONNECTOR_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    for seed in std::iter::once(None).chain((0..seeds).map(Some)) {
        let table = format!("wc_{}", seed.map_or("base".to_string(), |s| s.to_string()));
        pg.exec(&format!("CREATE TABLE {table} (word text NOT NULL, n bigint NOT NULL)"));
        let failures = seed.map_or(0, |s| 1 + (s % 3) as u32);
        let plan = seed.map(|s| Arc::new(FaultPlan::seeded(s, failures, &[("count", 2)], 4_000, 1, &kinds)));
        let dir = scratch();
        let toml = wordcount_into(&format!("kpg-{table}"), &k.bootstrap(), "lines", 2, 20, &pg_sink(&pg, &table));
        let summary = run(dir.path(), &toml, plan).unwrap_or_else(|e| panic!("seed {seed:?}: {e}"));
        assert_eq!(summary.attempts, failures + 1, "seed {seed:?}: every planned failure must fire");
        assert!(table_lines(&pg, &table) == expected, "seed {seed:?}: the table differs from the failure-free output");
    }

    // The real process, SIGKILLed twice at random moments after checkpoints.
    pg.exec("CREATE TABLE wc_kill (word text NOT NULL, n bigint NOT NULL)");
    let dir = scratch();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kafka->postgres sigkill seed {seed}");
    let toml = wordcount_into("kpg-kill", &k.bootstrap(), "lines", 2, 100, &pg_sink(&pg, "wc_kill"))
        .replace("bounded = true\n", "bounded = true\nrate = 2000\n");
    let job = dir.path().join("job.toml");
    std::fs::write(&job, toml).unwrap();
    let store = CheckpointStore::new(&dir.path().join("chk"), "kpg-kill");
    let kills = kill_twice_then_finish(&job, &store, seed, 300);
    assert!(table_lines(&pg, "wc_kill") == expected, "the table differs after {kills} kill(s) (seed {seed})");
    let left = pg.client().query("SELECT gid FROM pg_prepared_xacts", &[]).unwrap().len();
    assert_eq!(left, 0, "prepared transactions left behind (seed {seed})");
}

/// `examples/kafka-to-postgres/run.sh` starts its own broker and PostgreSQL, loads the topic
/// and runs the word count into a table with the real `weir` binary, checking the table
/// against `expected/`.
#[test]
fn connector_kafka_example_script_checks_its_table() {
    // The broker's virtualenv is ready before the script adds its client to it.
    crate::kafka::broker_bin();
    let out = crate::support::example_script("examples/kafka-to-postgres/run.sh");
    assert!(out.contains("the table holds each word's final count (231 words)"), "{out}");
}

/// Kafka `topic` (bounded unless `source` says otherwise) -> file sink `out`, with the
/// source's extra options `source`.
fn to_files(name: &str, bootstrap: &str, topics: &str, source: &str) -> String {
    format!(
        "[job]\nname = \"{name}\"\n[checkpoint]\ninterval_ms = 20\ndir = \"chk\"\n[restart]\nstrategy = \"none\"\n\
         [[source]]\nid = \"in\"\ntype = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\n{topics}\nparallelism = 2\n{source}\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"in\" }}]\n"
    )
}

fn values(range: std::ops::Range<usize>) -> Vec<String> {
    let mut v: Vec<String> = range.map(|i| format!("v{i:02}")).collect();
    v.sort();
    v
}

/// Where partitions start: earliest, latest, a timestamp (Kafka timestamps are event time),
/// and the consumer group's offsets, which a finished job committed there.
#[test]
fn connector_kafka_source_starts_from_earliest_latest_timestamp_and_group() {
    let k = KafkaServer::start();
    k.create_topic("t", 2);
    let recs = |r: std::ops::Range<usize>| r.map(|i| (format!("k{i}"), format!("v{i:02}"))).collect::<Vec<_>>();
    // Recent timestamps: a broker deletes records older than its retention (7 days).
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 60_000;
    k.produce_at("t", &recs(0..20), |i| (i % 2) as i32, |i| Some(base + i as i64));
    let b = k.bootstrap();
    let read = |name: &str, source: &str| {
        let dir = scratch();
        run(dir.path(), &to_files(name, &b, "topics = [\"t\"]", &format!("bounded = true\n{source}")), None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut got = crate::support::committed_lines(&dir.path().join("out"));
        got.sort();
        got
    };
    assert_eq!(read("earliest", "group = \"g\""), values(0..20), "earliest, committing to group g");
    assert_eq!(read("latest", "start = \"latest\""), Vec::<String>::new());
    assert_eq!(read("ts", &format!("start = \"timestamp\"\nstart_timestamp_ms = {}", base + 10)), values(10..20));
    // The first run committed its final offsets to group g: only newer records are read.
    k.produce_at("t", &[("k20".into(), "v20".into()), ("k21".into(), "v21".into())], |i| i as i32, |_| None);
    assert_eq!(read("group", "start = \"group\"\ngroup = \"g\""), values(20..22));
}

/// An unbounded source with a topic pattern picks up a matching topic created while it runs;
/// stopped with a savepoint, its output holds every record once.
#[test]
fn connector_kafka_source_discovers_new_topics_while_running() {
    use crate::savepoints::{start, wait_records};
    let k = KafkaServer::start();
    k.create_topic("ev-a", 2);
    let recs = |r: std::ops::Range<usize>| r.map(|i| (format!("k{i}"), format!("v{i:02}"))).collect::<Vec<_>>();
    k.produce("ev-a", &recs(0..10), |i| (i % 2) as i32);
    let dir = scratch();
    let toml = to_files("discover", &k.bootstrap(), "topic_pattern = \"ev-.*\"", "discovery_interval_ms = 50");
    let mut r = start(dir.path(), &toml, None, false);
    wait_records(&r, "out", 10);
    k.create_topic("ev-b", 3);
    k.create_topic("other", 1);
    k.produce("ev-b", &recs(10..16), |i| (i % 3) as i32);
    k.produce("other", &recs(90..95), |_| 0);
    wait_records(&r, "out", 16);
    r.handle.savepoint(Some(dir.path().join("sp")), true, Duration::from_secs(60)).unwrap();
    r.join().unwrap();
    let mut got = crate::support::committed_lines(&dir.path().join("out"));
    got.sort();
    assert_eq!(got, values(0..16), "every record of ev-a and ev-b once, nothing of `other`");
}

/// The sink's restore step on its own: a restored pre-committed transaction is written again
/// when its marker says it never committed, once (a second restore of the same state finds
/// the marker), records in order; a subtask removed by a rescale has its transactions
/// recovered by the adopter.
#[test]
fn connector_kafka_sink_restore_commits_a_pre_committed_transaction_exactly_once() {
    use weir::connectors::kafka::sink::{KafkaSink, KafkaSinkState, Opening, PendingTxn};
    use weir::graph::logical::{KafkaPartitioner, KafkaTarget};
    let k = KafkaServer::start();
    k.create_topic("o", 1);
    let target = KafkaTarget {
        bootstrap: k.bootstrap(),
        topic: "o".into(),
        exactly_once: true,
        transaction_prefix: "restore-test".into(),
        transaction_timeout_ms: 60_000,
        partitioner: KafkaPartitioner::Key,
        event_timestamps: true,
    };
    // Recent timestamps: a broker deletes records older than its retention (7 days).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let state = |chk: u64, vals: &[&str]| {
        let mut b = weir::record::Batch::default();
        for v in vals {
            b.push(0, now, b"", v.as_bytes());
        }
        KafkaSinkState { pending: vec![PendingTxn { checkpoint: chk, records: b.len(), bytes: b.as_bytes().to_vec() }] }
            .encode()
    };
    let open = |restored: Option<&[u8]>, adopted: &[(u32, Vec<u8>)]| {
        KafkaSink::open(&target, Opening { subtask: 0, restored, adopted }).map(drop).unwrap()
    };
    let values = |k: &KafkaServer| k.read_committed("o").into_iter().map(|(_, _, v)| v).collect::<Vec<_>>();
    open(None, &[]);
    assert!(values(&k).is_empty());
    let s5 = state(5, &["a", "b", "c"]);
    open(Some(&s5), &[]);
    assert_eq!(values(&k), ["a", "b", "c"], "written again, in order");
    open(Some(&s5), &[]);
    assert_eq!(values(&k), ["a", "b", "c"], "a second restore of the same state writes nothing");
    // Subtask 0 adopts subtask 3 (removed by a rescale) with its pending checkpoint 7.
    open(Some(&state(7, &["d"])), &[(3, state(7, &["e"]))]);
    let mut got = values(&k);
    got.sort();
    assert_eq!(got, ["a", "b", "c", "d", "e"]);
    // A fresh start resets the marker: that run's own checkpoint 5 is not taken as committed.
    open(None, &[]);
    open(Some(&state(5, &["f"])), &[]);
    assert_eq!(values(&k).last().map(String::as_str), Some("f"));
}
