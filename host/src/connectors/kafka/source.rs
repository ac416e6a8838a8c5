//! The Kafka source: one consumer per subtask, reading the partitions `assign::owner` gives
//! it, with manual assignment (no group rebalancing: the checkpoint, not the group, says where
//! each partition is).
//!
//! Invariant: a partition's `next` is the offset of the first record not yet emitted, so the
//! position recorded at a barrier rewinds exactly to the first record after it. Offsets of
//! completed checkpoints are committed to the consumer group for monitoring only; they are
//! read back only when the job asks to start from them.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Message, Timestamp};
use rdkafka::metadata::Metadata;
use rdkafka::{Offset, TopicPartitionList};

use super::assign::owner;
use super::watermarks::Watermarks;
use super::{KafkaError, REQUEST_TIMEOUT, client_config};
use crate::checkpoint::snapshot::KafkaOffset;
use crate::connectors::throttle::Throttle;
use crate::connectors::{Disconnected, Emit};
use crate::graph::logical::{KafkaSource, KafkaStart, KafkaTopics};
use crate::record::RecordRef;

type Result<T> = std::result::Result<T, KafkaError>;

/// Why a Kafka source stopped.
pub enum KafkaSourceError {
    /// The broker or a topic failed.
    Kafka(KafkaError),
    /// Downstream is gone.
    Disconnected(Disconnected),
}

impl From<KafkaError> for KafkaSourceError {
    fn from(e: KafkaError) -> Self {
        KafkaSourceError::Kafka(e)
    }
}

/// One partition this subtask reads.
struct Part {
    pos: KafkaOffset,
    /// Its number in `Watermarks`.
    wm: usize,
    done: bool,
}

/// One Kafka source subtask.
pub struct KafkaReader {
    consumer: BaseConsumer,
    cfg: KafkaSource,
    subtask: u32,
    parallelism: u32,
    parts: Vec<Part>,
    watermarks: Watermarks,
    clock: Instant,
    last_discovery: Instant,
    /// Positions recorded at barriers, committed to the group when their checkpoint completes.
    pending_commits: Vec<(u64, Vec<KafkaOffset>)>,
    /// The last partition a record came from (records come in runs per partition).
    last_hit: usize,
    throttle: Option<Throttle>,
}

impl KafkaReader {
    /// Connects, finds this subtask's partitions and where each starts: from `restored` (the
    /// checkpointed offsets of every partition the job read, whichever subtask read it), else
    /// from the configured start.
    pub fn open(cfg: &KafkaSource, subtask: u32, parallelism: u32, restored: Option<&[KafkaOffset]>) -> Result<Self> {
        let mut c = client_config(&cfg.bootstrap);
        c.set("group.id", &cfg.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", if cfg.read_committed { "read_committed" } else { "read_uncommitted" })
            .set("allow.auto.create.topics", "false");
        let consumer: BaseConsumer =
            c.create().map_err(|e| KafkaError::fatal(format!("cannot create a Kafka consumer: {e}")))?;
        let now = Instant::now();
        let mut r = KafkaReader {
            consumer,
            cfg: cfg.clone(),
            subtask,
            parallelism,
            parts: Vec::new(),
            watermarks: Watermarks::new(cfg.idle_timeout_ms, cfg.watermark_delay_ms),
            clock: now,
            last_discovery: now,
            pending_commits: Vec::new(),
            last_hit: 0,
            throttle: cfg.rate.map(Throttle::new),
        };
        let partitions = r.partitions(true)?;
        // Checkpointed partitions of the configured topics that this subtask owns are read from
        // their offsets even if the broker's metadata does not list them right now.
        let wanted = r.selector()?;
        for o in restored.unwrap_or_default() {
            if owner(&o.topic, o.partition, parallelism) == subtask && wanted(&o.topic) {
                r.add(o.clone());
            }
        }
        // Partitions the checkpoint does not know were created after it: from their start.
        let start = if restored.is_some() { KafkaStart::Earliest } else { cfg.start };
        for (topic, partition) in partitions {
            if !r.has(&topic, partition) {
                let pos = r.resolve(&topic, partition, start)?;
                r.add(pos);
            }
        }
        r.assign()?;
        Ok(r)
    }

    fn has(&self, topic: &str, partition: i32) -> bool {
        self.parts.iter().any(|p| p.pos.topic == topic && p.pos.partition == partition)
    }

    /// Whether a topic is one this source reads.
    fn selector(&self) -> Result<impl Fn(&str) -> bool + use<>> {
        let (list, re) = match &self.cfg.topics {
            KafkaTopics::List(l) => (Some(l.clone()), None),
            KafkaTopics::Pattern(p) => (
                None,
                Some(
                    regex::Regex::new(&format!("^(?:{p})$"))
                        .map_err(|e| KafkaError::fatal(format!("topic_pattern `{p}`: {e}")))?,
                ),
            ),
        };
        Ok(move |t: &str| {
            list.as_ref().is_some_and(|l| l.iter().any(|x| x == t)) || re.as_ref().is_some_and(|r| r.is_match(t))
        })
    }

    fn metadata(&self) -> Result<Metadata> {
        self.consumer
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map_err(|e| KafkaError::from_client("reading the topic list", &self.cfg.bootstrap, &e))
    }

    /// This subtask's partitions of the configured topics; `strict`: a listed topic that does
    /// not exist is an error (at start), else it is skipped (discovery).
    fn partitions(&self, strict: bool) -> Result<Vec<(String, i32)>> {
        let md = self.metadata()?;
        let topics: Vec<(&str, Vec<i32>)> = md
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| (t.name(), t.partitions().iter().map(|p| p.id()).collect()))
            .collect();
        let chosen: Vec<&(&str, Vec<i32>)> = match &self.cfg.topics {
            KafkaTopics::List(list) => {
                let mut out = Vec::new();
                for name in list {
                    match topics.iter().find(|t| t.0 == name) {
                        Some(t) => out.push(t),
                        None if strict => {
                            return Err(KafkaError::fatal(format!(
                                "topic `{name}` does not exist at broker {}; create it (this source does not create \
                                 topics) or fix `topics`",
                                self.cfg.bootstrap
                            )));
                        }
                        None => {}
                    }
                }
                out
            }
            KafkaTopics::Pattern(p) => {
                let re = regex::Regex::new(&format!("^(?:{p})$"))
                    .map_err(|e| KafkaError::fatal(format!("topic_pattern `{p}`: {e}")))?;
                let out: Vec<_> = topics.iter().filter(|t| !t.0.starts_with("__") && re.is_match(t.0)).collect();
                if out.is_empty() && strict && !self.cfg.bounded && self.cfg.discovery_interval_ms == 0 {
                    return Err(KafkaError::fatal(format!(
                        "no topic at broker {} matches topic_pattern `{p}`, and discovery is off \
                         (discovery_interval_ms = 0): nothing would ever be read",
                        self.cfg.bootstrap
                    )));
                }
                out
            }
        };
        let mut mine = Vec::new();
        for (topic, parts) in chosen {
            for &p in parts {
                if owner(topic, p, self.parallelism) == self.subtask {
                    mine.push((topic.to_string(), p));
                }
            }
        }
        mine.sort();
        Ok(mine)
    }

    /// The concrete start offset of a partition without a checkpointed one (and, for bounded
    /// reads, its end now).
    fn resolve(&self, topic: &str, partition: i32, start: KafkaStart) -> Result<KafkaOffset> {
        let at = |what: &str| format!("{what} of {topic}/{partition}");
        let (low, high) = self
            .consumer
            .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
            .map_err(|e| KafkaError::from_client(&at("reading the offsets"), &self.cfg.bootstrap, &e))?;
        let one = |offset: Offset| -> Result<TopicPartitionList> {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, offset)
                .map_err(|e| KafkaError::fatal(format!("{}: {e}", at("the offset"))))?;
            Ok(tpl)
        };
        let first = |tpl: TopicPartitionList| tpl.elements().first().map(|e| e.offset());
        let next = match start {
            KafkaStart::Earliest => low,
            KafkaStart::Latest => high,
            KafkaStart::Timestamp(ts) => {
                let tpl = self.consumer.offsets_for_times(one(Offset::Offset(ts))?, REQUEST_TIMEOUT).map_err(|e| {
                    KafkaError::from_client(&at("finding the timestamp's offset"), &self.cfg.bootstrap, &e)
                })?;
                match first(tpl) {
                    Some(Offset::Offset(o)) => o,
                    // No record at or after the timestamp.
                    _ => high,
                }
            }
            KafkaStart::Group => {
                let tpl = self
                    .consumer
                    .committed_offsets(one(Offset::Invalid)?, REQUEST_TIMEOUT)
                    .map_err(|e| KafkaError::from_client(&at("reading the group's offset"), &self.cfg.bootstrap, &e))?;
                match first(tpl) {
                    Some(Offset::Offset(o)) => o.clamp(low, high),
                    _ => low,
                }
            }
        };
        Ok(KafkaOffset { topic: topic.to_string(), partition, next, stop: self.cfg.bounded.then_some(high) })
    }

    fn add(&mut self, pos: KafkaOffset) {
        let now = self.now_ms();
        let wm = self.watermarks.add(now);
        let done = pos.stop.is_some_and(|s| pos.next >= s);
        if done {
            self.watermarks.finish(wm);
        }
        self.parts.push(Part { pos, wm, done });
    }

    fn assign(&mut self) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for p in self.parts.iter().filter(|p| !p.done) {
            tpl.add_partition_offset(&p.pos.topic, p.pos.partition, Offset::Offset(p.pos.next))
                .map_err(|e| KafkaError::fatal(format!("assigning {}/{}: {e}", p.pos.topic, p.pos.partition)))?;
        }
        self.consumer.assign(&tpl).map_err(|e| KafkaError::from_client("assigning partitions", &self.cfg.bootstrap, &e))
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// The read position of every partition of this subtask.
    pub fn position(&self) -> Vec<KafkaOffset> {
        self.parts.iter().map(|p| p.pos.clone()).collect()
    }

    /// Remembers the position recorded for checkpoint `id`, to commit to the group when it
    /// completes.
    pub fn on_barrier(&mut self, id: u64, pos: Vec<KafkaOffset>) {
        self.pending_commits.push((id, pos));
    }

    /// Checkpoint `id` completed: its offsets go to the consumer group (monitoring: lag
    /// tools read them; a failed commit is harmless, the checkpoint holds the truth).
    pub fn on_complete(&mut self, id: u64) {
        let Some(i) = self.pending_commits.iter().rposition(|(c, _)| *c == id) else { return };
        let (_, pos) = self.pending_commits.remove(i);
        self.pending_commits.drain(..i);
        let mut tpl = TopicPartitionList::new();
        for p in &pos {
            let _ = tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(p.next));
        }
        if tpl.count() > 0
            && let Err(e) = self.consumer.commit(&tpl, CommitMode::Async)
        {
            tracing::debug!(group = %self.cfg.group, "committing offsets to the group failed: {e}");
        }
    }

    /// The watermark to send, if it advanced.
    pub fn watermark(&mut self) -> Option<i64> {
        let now = self.now_ms();
        self.watermarks.advance(now)
    }

    /// Reads up to `max` records into `out`; `None` at the end of a bounded read.
    pub fn emit(&mut self, max: u32, out: &mut impl Emit) -> std::result::Result<Option<u32>, KafkaSourceError> {
        if !self.cfg.bounded
            && self.cfg.discovery_interval_ms > 0
            && self.last_discovery.elapsed() >= Duration::from_millis(self.cfg.discovery_interval_ms)
        {
            self.discover()?;
        }
        if self.cfg.bounded && self.parts.iter().all(|p| p.done) {
            return Ok(None);
        }
        let mut max = max;
        if let Some(t) = self.throttle.as_mut() {
            out.flush().map_err(KafkaSourceError::Disconnected)?;
            max = t.admit(max);
        }
        let mut n = 0;
        let mut wait = Duration::from_millis(20);
        // One clock reading per batch for the partitions' activity (not one per record).
        let now = self.now_ms();
        while n < max {
            let Some(m) = self.consumer.poll(wait) else { break };
            wait = Duration::ZERO;
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    if super::is_outage(&e) {
                        // librdkafka reconnects by itself; the records wait in the broker.
                        tracing::debug!("kafka source: {e}");
                        std::thread::sleep(Duration::from_millis(20));
                        break;
                    }
                    return Err(
                        KafkaError::fatal(format!("reading from broker {} failed: {e}", self.cfg.bootstrap)).into()
                    );
                }
            };
            let Some(i) = find(&self.parts, &mut self.last_hit, m.topic(), m.partition()) else { continue };
            let part = &mut self.parts[i];
            if part.done || m.offset() < part.pos.next {
                continue;
            }
            if part.pos.stop.is_some_and(|s| m.offset() >= s) {
                part.done = true;
                self.watermarks.finish(part.wm);
                continue;
            }
            let timestamp = match m.timestamp() {
                Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => t,
                Timestamp::NotAvailable => 0,
            };
            let rec = RecordRef {
                tag: 0,
                timestamp,
                key: m.key().unwrap_or_default(),
                value: m.payload().unwrap_or_default(),
            };
            out.emit(rec).map_err(KafkaSourceError::Disconnected)?;
            part.pos.next = m.offset() + 1;
            if part.pos.stop.is_some_and(|s| part.pos.next >= s) {
                part.done = true;
                self.watermarks.finish(part.wm);
            }
            self.watermarks.record(part.wm, timestamp, now);
            n += 1;
        }
        if let Some(t) = self.throttle.as_mut() {
            t.record(n);
        }
        if n == 0 && self.cfg.bounded {
            self.check_ends()?;
            if self.parts.iter().all(|p| p.done) {
                return Ok(None);
            }
        }
        Ok(Some(n))
    }

    fn part_of(&mut self, topic: &str, partition: i32) -> Option<usize> {
        find(&self.parts, &mut self.last_hit, topic, partition)
    }

    /// Bounded reads: a partition whose consumer position passed its end is done (the last
    /// offsets before the end may be transaction markers or aborted records, never
    /// delivered).
    fn check_ends(&mut self) -> Result<()> {
        let pos = self
            .consumer
            .position()
            .map_err(|e| KafkaError::from_client("reading the consumer position", &self.cfg.bootstrap, &e))?;
        for e in pos.elements() {
            let Offset::Offset(o) = e.offset() else { continue };
            if let Some(i) = self.part_of(e.topic(), e.partition()) {
                let part = &mut self.parts[i];
                if part.pos.stop.is_some_and(|s| o >= s) && !part.done {
                    part.done = true;
                    // Nothing below the end is left to deliver.
                    part.pos.next = part.pos.next.max(part.pos.stop.unwrap_or(o));
                    self.watermarks.finish(part.wm);
                }
            }
        }
        Ok(())
    }

    /// Picks up partitions (and matching topics) created since the last look; they start at
    /// their earliest offset (they are new: everything in them is unread).
    fn discover(&mut self) -> Result<()> {
        self.last_discovery = Instant::now();
        let found = match self.partitions(false) {
            Ok(f) => f,
            Err(e) if e.transient => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut added = false;
        for (topic, partition) in found {
            if self.has(&topic, partition) {
                continue;
            }
            let pos = self.resolve(&topic, partition, KafkaStart::Earliest)?;
            tracing::info!(topic = %topic, partition, subtask = self.subtask, "kafka source: reading a new partition");
            self.add(pos);
            added = true;
        }
        if added {
            self.assign()?;
        }
        Ok(())
    }
}

/// The index of `topic`/`partition` in `parts`, trying `last_hit` first (records come in runs
/// per partition).
fn find(parts: &[Part], last_hit: &mut usize, topic: &str, partition: i32) -> Option<usize> {
    let hit = |p: &Part| p.pos.partition == partition && p.pos.topic == topic;
    if parts.get(*last_hit).is_some_and(hit) {
        return Some(*last_hit);
    }
    let i = parts.iter().position(hit)?;
    *last_hit = i;
    Some(i)
}
