//! The Kafka sink: a producer per subtask. At-least-once flushes at every barrier.
//! Exactly-once writes in a Kafka transaction (`transactional.id` = `<prefix>-<subtask>`),
//! flushed and pre-committed at the barrier and committed when the checkpoint completes, as
//! Flink's KafkaSink; records that arrive while a pre-committed transaction waits for its
//! checkpoint are held until it commits, so each transaction holds exactly one checkpoint's
//! records and commits in checkpoint order.
//!
//! librdkafka cannot resume another session's transaction (Flink does, through reflection on
//! the Java producer), so a pre-committed transaction left open by a crash is aborted when
//! the restarted producer initializes (which also fences any zombie with the same id). Its
//! records are therefore part of the checkpoint (the sink's state), and each transaction
//! commits, atomically with its records, a *marker*: the checkpoint id as the offset of
//! consumer group `<prefix>-<subtask>` on the topic's partition 0. On restore the sink reads
//! the marker: a pre-committed transaction whose checkpoint is above it never committed and
//! is written again in a new transaction with its marker; one at or below it is not.
//!
//! A transaction during which the connection to the broker dropped is not trusted to have
//! kept its records: it is aborted and its records (kept for the checkpoint anyway) are
//! written again in a fresh one before it is pre-committed or committed. Kafka keeps open
//! transactions across broker restarts; a broker that forgets them (the test broker does,
//! and still acknowledges their commit) then loses nothing either.
//!
//! Invariant: every record reaches the topic in exactly one committed transaction, whose
//! checkpoint completed; nothing of a transaction is visible to `read_committed` readers
//! before its checkpoint completed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as RdError;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::{KafkaError, REQUEST_TIMEOUT, client_config};
use crate::graph::logical::{KafkaPartitioner, KafkaTarget};
use crate::ids::CheckpointId;
use crate::record::Batch;

type Result<T> = std::result::Result<T, KafkaError>;

/// How long a flush or commit may take.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// What librdkafka reports on the producer's poll: the first failed delivery, and whether a
/// connection to the broker dropped.
#[derive(Default, Clone)]
pub struct Deliveries(Arc<Mutex<Option<(String, bool)>>>, Arc<AtomicBool>);

impl ClientContext for Deliveries {
    fn error(&self, error: RdError, reason: &str) {
        if super::is_outage(&error) {
            self.1.store(true, Ordering::Release);
        }
        tracing::debug!("kafka producer: {error}: {reason}");
    }
}

impl Deliveries {
    /// Whether a connection dropped since the last call.
    fn took_disconnect(&self) -> bool {
        self.1.swap(false, Ordering::AcqRel)
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let transient = super::is_outage(e)
                || matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::MessageTimedOut));
            let mut first = self.0.lock().unwrap_or_else(|e| e.into_inner());
            first.get_or_insert_with(|| (e.to_string(), transient));
        }
    }
}

/// One pre-committed transaction in the sink's checkpointed state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingTxn {
    /// The checkpoint whose barrier pre-committed it.
    pub checkpoint: u64,
    /// Its records.
    pub records: u32,
    /// The records in batch framing.
    pub bytes: Vec<u8>,
}

/// What a Kafka sink subtask checkpoints (in `SubtaskState::operator_state`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaSinkState {
    /// Pre-committed transactions not yet known committed.
    pub pending: Vec<PendingTxn>,
}

impl KafkaSinkState {
    /// Encodes the state.
    pub fn encode(&self) -> Vec<u8> {
        bincode::serialize(self).expect("serializing to memory")
    }

    /// Decodes a state blob (empty: no state), checking every record's framing.
    pub fn decode(blob: &[u8]) -> std::result::Result<Self, String> {
        if blob.is_empty() {
            return Ok(KafkaSinkState::default());
        }
        let s: KafkaSinkState =
            bincode::deserialize(blob).map_err(|e| format!("the sink state does not decode: {e}"))?;
        if bincode::serialized_size(&s).ok() != Some(blob.len() as u64) {
            return Err("the sink state has bytes after its end".into());
        }
        // One transaction per subtask waits for its checkpoint at a time.
        if s.pending.len() > 1 {
            return Err(format!(
                "the sink state holds {} pre-committed transactions, not at most one",
                s.pending.len()
            ));
        }
        for t in &s.pending {
            if t.checkpoint == 0 || t.checkpoint > i64::MAX as u64 {
                return Err(format!("checkpoint id {} is out of range", t.checkpoint));
            }
            let n = crate::record::validate(&t.bytes)
                .map_err(|e| format!("the records of checkpoint {}'s transaction are malformed: {e}", t.checkpoint))?;
            if n != t.records {
                return Err(format!("checkpoint {}'s transaction holds {n} records, not {}", t.checkpoint, t.records));
            }
        }
        Ok(s)
    }
}

/// A pre-committed transaction waiting for its checkpoint.
struct Pending {
    checkpoint: u64,
    records: Batch,
}

/// Where a sink subtask's transactions go, and its marker.
struct Txns {
    producer: BaseProducer<Deliveries>,
    marker: BaseConsumer,
    transactional_id: String,
}

/// Everything `open` needs besides the target.
pub struct Opening<'a> {
    /// This subtask.
    pub subtask: u32,
    /// Its `operator_state` from the restored checkpoint.
    pub restored: Option<&'a [u8]>,
    /// States of subtasks that no longer run after a rescale: (their index, state).
    pub adopted: &'a [(u32, Vec<u8>)],
}

/// One Kafka sink subtask.
pub struct KafkaSink {
    target: KafkaTarget,
    producer: BaseProducer<Deliveries>,
    deliveries: Deliveries,
    /// Exactly-once: the marker consumer; `None`: at-least-once.
    marker: Option<BaseConsumer>,
    subtask: u32,
    partitions: i32,
    /// A transaction is begun.
    open: bool,
    /// Records written into the open transaction (exactly-once), for the checkpoint.
    current: Batch,
    pending: Option<Pending>,
    /// Records that arrived while `pending` waits.
    deferred: Batch,
    /// The newest checkpoint whose barrier came here.
    last_precommit: Option<u64>,
}

impl KafkaSink {
    /// Connects, checks the topic, and settles what the restored checkpoint pre-committed
    /// (its own and, after a rescale down, that of subtasks that no longer run).
    pub fn open(target: &KafkaTarget, o: Opening<'_>) -> Result<Self> {
        let deliveries = Deliveries::default();
        let (producer, marker, partitions) = if target.exactly_once {
            let t = Txns::new(target, o.subtask, deliveries.clone())?;
            let partitions = partition_count(&t.producer, target)?;
            for (old, blob) in o.adopted {
                let state = KafkaSinkState::decode(blob).map_err(|e| restored_err(target, *old, &e))?;
                // Initializing its id aborts what that subtask left open, even with nothing to recover.
                let adopted = Txns::new(target, *old, Deliveries::default())?;
                adopted.recover(target, &state, subtask_partition(target, *old, partitions))?;
            }
            let state = KafkaSinkState::decode(o.restored.unwrap_or_default())
                .map_err(|e| restored_err(target, o.subtask, &e))?;
            t.recover(target, &state, subtask_partition(target, o.subtask, partitions))?;
            (t.producer, Some(t.marker), partitions)
        } else {
            let p = producer(target, None, deliveries.clone())?;
            let partitions = partition_count(&p, target)?;
            (p, None, partitions)
        };
        Ok(KafkaSink {
            target: target.clone(),
            producer,
            deliveries,
            marker,
            subtask: o.subtask,
            partitions,
            open: false,
            current: Batch::default(),
            pending: None,
            deferred: Batch::default(),
            last_precommit: None,
        })
    }

    fn client(&self, what: &str) -> impl Fn(RdError) -> KafkaError + '_ {
        let what = format!("{what} (topic `{}`, sink subtask {})", self.target.topic, self.subtask);
        move |e| KafkaError::from_client(&what, &self.target.bootstrap, &e)
    }

    /// Writes `batch` (into the open transaction, or held while one waits for its checkpoint).
    pub fn write(&mut self, batch: &Batch) -> Result<()> {
        if self.pending.is_some() {
            for r in batch.iter() {
                self.deferred.push(0, r.timestamp, r.key, r.value);
            }
            return Ok(());
        }
        self.send_all(batch)
    }

    fn send_all(&mut self, batch: &Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.marker.is_some() && !self.open {
            self.producer.begin_transaction().map_err(self.client("beginning a transaction"))?;
            self.open = true;
        }
        for r in batch.iter() {
            send(&self.producer, &self.target, self.partition(), r.timestamp, r.key, r.value)?;
            if self.marker.is_some() {
                self.current.push(0, r.timestamp, r.key, r.value);
            }
        }
        self.check_deliveries()
    }

    fn partition(&self) -> Option<i32> {
        subtask_partition(&self.target, self.subtask, self.partitions)
    }

    fn check_deliveries(&self) -> Result<()> {
        let failed = self.deliveries.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        match failed {
            Some((e, transient)) => Err(KafkaError {
                message: format!(
                    "writing to topic `{}` at broker {} failed: {e}",
                    self.target.topic, self.target.bootstrap
                ),
                transient,
            }),
            None => Ok(()),
        }
    }

    /// Whether records wait behind a pre-committed transaction (the next barrier must wait
    /// for its checkpoint's outcome).
    pub fn must_settle(&self) -> bool {
        self.pending.is_some()
    }

    /// Flushes and pre-commits for checkpoint `id`; returns the state to checkpoint.
    pub fn precommit(&mut self, id: CheckpointId) -> Result<Vec<u8>> {
        self.last_precommit = Some(id.0);
        self.producer.flush(FLUSH_TIMEOUT).map_err(self.client("flushing"))?;
        self.check_deliveries()?;
        if let Some(p) = &self.pending {
            // After the end of input nothing waits for an outcome before the next barrier:
            // the older transaction is still pending, and this checkpoint must carry it too
            // (its completion commits it).
            let t =
                PendingTxn { checkpoint: p.checkpoint, records: p.records.len(), bytes: p.records.as_bytes().to_vec() };
            return Ok(KafkaSinkState { pending: vec![t] }.encode());
        }
        if self.marker.is_none() || !self.open {
            return Ok(Vec::new());
        }
        if self.deliveries.took_disconnect() {
            let records = self.current.take();
            self.rewrite(&records)?;
        }
        let marker = self.marker.as_ref().expect("exactly-once");
        send_marker(&self.producer, marker, &self.target, id.0)?;
        let records = self.current.take();
        let state = KafkaSinkState {
            pending: vec![PendingTxn { checkpoint: id.0, records: records.len(), bytes: records.as_bytes().to_vec() }],
        };
        self.open = false;
        self.pending = Some(Pending { checkpoint: id.0, records });
        Ok(state.encode())
    }

    /// Checkpoint `id` completed: commits its transaction, then writes what waited.
    pub fn commit(&mut self, id: CheckpointId) -> Result<()> {
        let Some(chk) = self.pending.as_ref().map(|p| p.checkpoint).filter(|&c| c <= id.0) else { return Ok(()) };
        self.producer.poll(Duration::ZERO);
        if self.deliveries.took_disconnect() {
            let records = self.pending.take().expect("checked").records;
            self.rewrite(&records)?;
            let marker = self.marker.as_ref().expect("exactly-once");
            send_marker(&self.producer, marker, &self.target, chk)?;
            self.current.clear();
        }
        self.producer.commit_transaction(FLUSH_TIMEOUT).map_err(self.client("committing"))?;
        self.open = false;
        self.pending = None;
        let waited = std::mem::take(&mut self.deferred);
        self.send_all(&waited)
    }

    /// Checkpoint `id` was aborted: its transaction is aborted and its records are written
    /// again, into the next one, ahead of what waited. Returns whether this sink had seen
    /// that checkpoint's barrier.
    pub fn abort(&mut self, id: CheckpointId) -> Result<bool> {
        let seen = self.last_precommit.is_some_and(|l| l >= id.0);
        // A newer pre-commit that carries the pending transaction decides its outcome.
        if self.pending.as_ref().is_none_or(|p| p.checkpoint != id.0) || self.last_precommit != Some(id.0) {
            return Ok(seen);
        }
        self.producer.abort_transaction(FLUSH_TIMEOUT).map_err(self.client("aborting"))?;
        let again = self.pending.take().expect("checked").records;
        let waited = std::mem::take(&mut self.deferred);
        self.send_all(&again)?;
        self.send_all(&waited)?;
        Ok(true)
    }

    /// The open transaction lost its connection: aborts it and writes `records` again in a
    /// new one, flushed (until one goes through without a disconnect).
    fn rewrite(&mut self, records: &Batch) -> Result<()> {
        for _ in 0..10 {
            if let Err(e) = self.producer.abort_transaction(FLUSH_TIMEOUT) {
                tracing::debug!("kafka sink: aborting the disconnected transaction: {e}");
            }
            self.open = false;
            self.current.clear();
            self.send_all(records)?;
            if !self.open {
                self.producer.begin_transaction().map_err(self.client("beginning a transaction"))?;
                self.open = true;
            }
            self.producer.flush(FLUSH_TIMEOUT).map_err(self.client("flushing"))?;
            self.check_deliveries()?;
            if !self.deliveries.took_disconnect() {
                tracing::info!(records = records.len(), "kafka sink: wrote a disconnected transaction again");
                return Ok(());
            }
        }
        Err(KafkaError {
            message: "the broker connection kept dropping while rewriting a transaction".into(),
            transient: true,
        })
    }

    /// End of input without checkpointing (at-least-once): flushes.
    pub fn flush_at_end(&mut self) -> Result<()> {
        self.producer.flush(FLUSH_TIMEOUT).map_err(self.client("flushing"))?;
        self.check_deliveries()
    }
}

impl Txns {
    /// The transactional producer and marker consumer of `subtask`'s id, initialized: a
    /// transaction that id left open is aborted and any older producer with it is fenced.
    fn new(target: &KafkaTarget, subtask: u32, deliveries: Deliveries) -> Result<Self> {
        let transactional_id = format!("{}-{subtask}", target.transaction_prefix);
        let producer = producer(target, Some(&transactional_id), deliveries)?;
        producer.init_transactions(REQUEST_TIMEOUT).map_err(|e| {
            KafkaError::from_client(
                &format!("initializing transactions of `{transactional_id}` (topic `{}`)", target.topic),
                &target.bootstrap,
                &e,
            )
        })?;
        let mut c = client_config(&target.bootstrap);
        c.set("group.id", &transactional_id).set("enable.auto.commit", "false");
        let marker: BaseConsumer =
            c.create().map_err(|e| KafkaError::fatal(format!("cannot create the marker consumer: {e}")))?;
        Ok(Txns { producer, marker, transactional_id })
    }

    /// The last checkpoint whose transaction committed under this id (0: none).
    fn committed_checkpoint(&self, target: &KafkaTarget) -> Result<u64> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&target.topic, 0, Offset::Invalid)
            .map_err(|e| KafkaError::fatal(format!("marker of `{}`: {e}", self.transactional_id)))?;
        let got = self.marker.committed_offsets(tpl, REQUEST_TIMEOUT).map_err(|e| {
            KafkaError::from_client(
                &format!("reading the commit marker of `{}` (group of that name)", self.transactional_id),
                &target.bootstrap,
                &e,
            )
        })?;
        Ok(match got.elements().first().map(|e| e.offset()) {
            Some(Offset::Offset(o)) if o > 0 => o as u64,
            _ => 0,
        })
    }

    /// Writes again, each in a transaction of its own with its marker, the restored
    /// pre-committed transactions that never committed.
    ///
    /// Then the marker is set to the restored transaction's checkpoint (0 without one): a
    /// marker left by a run that went on past the restored checkpoint (and was rolled back)
    /// must not cover this run's next checkpoints, whose ids continue from the restored one.
    fn recover(&self, target: &KafkaTarget, state: &KafkaSinkState, partition: Option<i32>) -> Result<()> {
        let committed = self.committed_checkpoint(target)?;
        let restored = state.pending.iter().map(|t| t.checkpoint).max().unwrap_or(0);
        let mut marker = committed;
        let client = |what: &str| {
            let what = format!("{what} of `{}` (topic `{}`)", self.transactional_id, target.topic);
            move |e: RdError| KafkaError::from_client(&what, &target.bootstrap, &e)
        };
        for t in state.pending.iter().filter(|t| t.checkpoint > committed) {
            let batch = Batch::from_validated(t.bytes.clone(), t.records);
            self.producer.begin_transaction().map_err(client("beginning the recovery transaction"))?;
            for r in batch.iter() {
                send(&self.producer, target, partition, r.timestamp, r.key, r.value)?;
            }
            send_marker(&self.producer, &self.marker, target, t.checkpoint)?;
            self.producer.commit_transaction(FLUSH_TIMEOUT).map_err(client("committing the recovery transaction"))?;
            marker = t.checkpoint;
            tracing::info!(
                transactional_id = %self.transactional_id,
                checkpoint = t.checkpoint,
                records = t.records,
                "kafka sink: committed the restored checkpoint's transaction again"
            );
        }
        if marker != restored {
            self.producer.begin_transaction().map_err(client("beginning the marker transaction"))?;
            send_marker(&self.producer, &self.marker, target, restored)?;
            self.producer.commit_transaction(FLUSH_TIMEOUT).map_err(client("committing the marker"))?;
        }
        Ok(())
    }
}

fn restored_err(target: &KafkaTarget, subtask: u32, e: &str) -> KafkaError {
    KafkaError::fatal(format!(
        "the restored state of sink subtask {subtask} (topic `{}`) is unusable: {e}; restore from another checkpoint",
        target.topic
    ))
}

/// The partition sink subtask `subtask` writes with the `subtask` partitioner (`None`: by key).
fn subtask_partition(target: &KafkaTarget, subtask: u32, partitions: i32) -> Option<i32> {
    match target.partitioner {
        KafkaPartitioner::Key => None,
        KafkaPartitioner::Subtask => Some((subtask % partitions.max(1) as u32) as i32),
    }
}

/// A producer for `target`; transactional with `transactional_id`.
fn producer(target: &KafkaTarget, transactional_id: Option<&str>, d: Deliveries) -> Result<BaseProducer<Deliveries>> {
    let mut c = client_config(&target.bootstrap);
    c.set("enable.idempotence", "true")
        .set("linger.ms", "5")
        // Kafka's Java client's partitioner: a key lands where Java producers put it.
        .set("partitioner", "murmur2_random");
    if let Some(id) = transactional_id {
        c.set("transactional.id", id).set("transaction.timeout.ms", target.transaction_timeout_ms.to_string());
    }
    c.create_with_context(d).map_err(|e| KafkaError::fatal(format!("cannot create a Kafka producer: {e}")))
}

/// The topic's partition count; an error naming it when it does not exist.
fn partition_count(p: &BaseProducer<Deliveries>, target: &KafkaTarget) -> Result<i32> {
    let md = p
        .client()
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .map_err(|e| KafkaError::from_client("reading the topic list", &target.bootstrap, &e))?;
    match md.topics().iter().find(|t| t.name() == target.topic && t.error().is_none()) {
        Some(t) => Ok(t.partitions().len() as i32),
        None => Err(KafkaError::fatal(format!(
            "topic `{}` does not exist at broker {}; create it (this sink does not create topics) or fix `topic`",
            target.topic, target.bootstrap
        ))),
    }
}

/// Queues one record, waiting while librdkafka's queue is full.
fn send(
    p: &BaseProducer<Deliveries>,
    target: &KafkaTarget,
    partition: Option<i32>,
    timestamp: i64,
    key: &[u8],
    value: &[u8],
) -> Result<()> {
    let mut r = BaseRecord::to(&target.topic).payload(value);
    if target.event_timestamps {
        r = r.timestamp(timestamp);
    }
    if !key.is_empty() {
        r = r.key(key);
    }
    if let Some(p) = partition {
        r = r.partition(p);
    }
    loop {
        match p.send(r) {
            Ok(()) => return Ok(()),
            Err((e, back)) if matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::QueueFull)) => {
                r = back;
                p.poll(Duration::from_millis(10));
            }
            Err((e, _)) => {
                return Err(KafkaError::from_client(
                    &format!("writing to topic `{}`", target.topic),
                    &target.bootstrap,
                    &e,
                ));
            }
        }
    }
}

/// Adds the commit marker of checkpoint `chk` to the open transaction.
fn send_marker(p: &BaseProducer<Deliveries>, marker: &BaseConsumer, target: &KafkaTarget, chk: u64) -> Result<()> {
    let what = format!("pre-committing checkpoint {chk} (topic `{}`)", target.topic);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&target.topic, 0, Offset::Offset(chk as i64))
        .map_err(|e| KafkaError::fatal(format!("{what}: {e}")))?;
    let group = marker.group_metadata().ok_or_else(|| KafkaError::fatal(format!("{what}: no group metadata")))?;
    p.send_offsets_to_transaction(&tpl, &group, FLUSH_TIMEOUT)
        .map_err(|e| KafkaError::from_client(&what, &target.bootstrap, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_state_round_trips_and_refuses_bad_records() {
        let mut b = Batch::default();
        b.push(0, 7, b"k", b"v");
        b.push(0, 8, b"", b"w");
        let s =
            KafkaSinkState { pending: vec![PendingTxn { checkpoint: 3, records: 2, bytes: b.as_bytes().to_vec() }] };
        assert_eq!(KafkaSinkState::decode(&s.encode()).unwrap(), s);
        assert_eq!(KafkaSinkState::decode(&[]).unwrap(), KafkaSinkState::default());
        let mut wrong_count = s.clone();
        wrong_count.pending[0].records = 3;
        assert!(KafkaSinkState::decode(&wrong_count.encode()).unwrap_err().contains("holds 2 records, not 3"));
        let mut torn = s.clone();
        torn.pending[0].bytes.truncate(30);
        assert!(KafkaSinkState::decode(&torn.encode()).unwrap_err().contains("malformed"));
        assert!(KafkaSinkState::decode(&[1, 2, 3]).is_err());
        let mut two = s.clone();
        two.pending.push(s.pending[0].clone());
        assert!(KafkaSinkState::decode(&two.encode()).unwrap_err().contains("not at most one"));
        let mut trailing = s.encode();
        trailing.push(0);
        assert!(KafkaSinkState::decode(&trailing).unwrap_err().contains("bytes after its end"));
        let mut zero = s.clone();
        zero.pending[0].checkpoint = 0;
        assert!(KafkaSinkState::decode(&zero.encode()).unwrap_err().contains("out of range"));
    }
}
