//! A real Kafka-protocol broker for a test: noida-db (PyPI; a Rust broker that implements
//! Kafka transactions and `read_committed`), installed once per machine into a virtualenv under
//! `target/`, started as its own process on a free loopback port with its data in a temporary
//! directory, and stopped when dropped. Plus small rdkafka clients the tests read and write with.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

const NOIDA: &str = "noida-db==0.2.3";

/// The broker's executable, installing it once (a virtualenv in `target/kafka-broker`).
pub(crate) fn broker_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/kafka-broker");
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            "set -e; cd '{}'; [ -x venv/bin/python ] || python3 -m venv venv; \
             venv/bin/python -c 'import noida_db' 2>/dev/null || venv/bin/pip install -q '{NOIDA}'; \
             venv/bin/python -c 'import noida_db,pathlib;print(pathlib.Path(noida_db.__file__).parent/\"noida-db\")'",
            dir.display()
        );
        let out = Command::new("bash").args(["-c", &script]).output().expect("running bash");
        assert!(
            out.status.success(),
            "installing the Kafka broker ({NOIDA} from PyPI) failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// A running broker.
pub struct KafkaServer {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl KafkaServer {
    /// A fresh broker on a free port.
    pub fn start() -> KafkaServer {
        let dir = tempfile::Builder::new().prefix("weir-kafka").tempdir_in("/tmp").unwrap();
        let mut s = KafkaServer { dir, port: 0, child: None };
        s.spawn(0);
        s
    }

    /// Starts the broker on `port` (0: any) and waits for its address line.
    fn spawn(&mut self, port: u16) {
        let mut child = Command::new(broker_bin())
            .args(["start", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--host", "127.0.0.1", "--only", "kafka", "--kafka-port", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.dir.path().join("broker.log")).unwrap())
            .spawn()
            .expect("starting the Kafka broker");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.trim().strip_prefix("kafka") {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "the Kafka broker did not start: {}",
                std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
            )
        });
        self.port = addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("broker address");
        self.child = Some(child);
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops the broker (SIGKILL: as a crash) and waits for it to be gone.
    pub fn crash(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the broker as an operator would (SIGTERM: it saves its data) and starts it again
    /// on the same data and port.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
        let t0 = Instant::now();
        while std::net::TcpListener::bind(("127.0.0.1", self.port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(30), "port {} stayed taken", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
        self.spawn(self.port);
    }

    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", self.bootstrap()).set("log_level", "3");
        c
    }

    /// Creates `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self.config().create().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let r = rt
            .block_on(admin.create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            ))
            .unwrap_or_else(|e| panic!("creating topic {topic}: {e}"));
        for x in r {
            x.unwrap_or_else(|e| panic!("creating topic {topic}: {e:?}"));
        }
    }

    /// Writes `(key, value)` records to partitions by `partition(i)` and waits for them.
    pub fn produce(&self, topic: &str, records: &[(String, String)], partition: impl Fn(usize) -> i32) {
        self.produce_at(topic, records, partition, |_| None)
    }

    /// The same, record `i` with timestamp `timestamp(i)` (ms; `None`: the producer's clock).
    pub fn produce_at(
        &self,
        topic: &str,
        records: &[(String, String)],
        partition: impl Fn(usize) -> i32,
        timestamp: impl Fn(usize) -> Option<i64>,
    ) {
        let p: ThreadedProducer<DefaultProducerContext> =
            self.config().set("linger.ms", "5").set("enable.idempotence", "true").create().unwrap();
        for (i, (k, v)) in records.iter().enumerate() {
            let mut r = BaseRecord::to(topic).key(k.as_bytes()).payload(v.as_bytes()).partition(partition(i));
            if let Some(t) = timestamp(i) {
                r = r.timestamp(t);
            }
            loop {
                match p.send(r) {
                    Ok(()) => break,
                    Err((e, back)) => {
                        assert!(
                            matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::QueueFull)),
                            "producing to {topic}: {e}"
                        );
                        r = back;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
        p.flush(Duration::from_secs(60)).expect("flushing test records");
    }

    /// Every committed record of `topic` (`read_committed`), per partition in offset order:
    /// (partition, key, value). Reads until the end offsets seen at the start.
    pub fn read_committed(&self, topic: &str) -> Vec<(i32, String, String)> {
        let c: BaseConsumer = self
            .config()
            .set("group.id", "weir-test-reader")
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        let md = c.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
        let partitions: Vec<i32> = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
        let mut tpl = rdkafka::TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for &p in &partitions {
            let (_, hi) = c.fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap();
            tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning).unwrap();
            ends.insert(p, hi);
        }
        c.assign(&tpl).unwrap();
        let mut out = Vec::new();
        let mut pos: BTreeMap<i32, i64> = partitions.iter().map(|&p| (p, 0)).collect();
        let t0 = Instant::now();
        // The end offset counts aborted records and control markers; a partition is read when
        // the consumer's position reaches it.
        while pos.iter().any(|(p, &o)| o < ends[p]) {
            assert!(t0.elapsed() < Duration::from_secs(60), "reading {topic} did not reach its end offsets");
            if let Some(m) = c.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
                out.push((m.partition(), text(m.key()), text(m.payload())));
            }
            let now = c.position().unwrap();
            for e in now.elements() {
                if let rdkafka::Offset::Offset(o) = e.offset() {
                    pos.insert(e.partition(), o);
                }
            }
        }
        out
    }
}

impl Drop for KafkaServer {
    fn drop(&mut self) {
        self.crash();
    }
}

#[test]
fn connector_kafka_broker_keeps_aborted_transactions_from_read_committed() {
    let k = KafkaServer::start();
    k.create_topic("t", 2);
    k.produce("t", &[("a".into(), "1".into()), ("b".into(), "2".into())], |i| i as i32 % 2);
    let p: ThreadedProducer<DefaultProducerContext> = k.config().set("transactional.id", "probe").create().unwrap();
    p.init_transactions(Duration::from_secs(10)).unwrap();
    p.begin_transaction().unwrap();
    p.send(BaseRecord::to("t").key("c").payload("aborted").partition(0)).map_err(|(e, _)| e).unwrap();
    p.flush(Duration::from_secs(10)).unwrap();
    p.abort_transaction(Duration::from_secs(10)).unwrap();
    p.begin_transaction().unwrap();
    p.send(BaseRecord::to("t").key("d").payload("committed").partition(1)).map_err(|(e, _)| e).unwrap();
    p.commit_transaction(Duration::from_secs(10)).unwrap();
    let mut got: Vec<String> = k.read_committed("t").into_iter().map(|(_, _, v)| v).collect();
    got.sort();
    assert_eq!(got, ["1", "2", "committed"]);
}
