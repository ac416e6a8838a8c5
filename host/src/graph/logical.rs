//! The validated job: nodes (sources, operators, sinks) and edges between them.
//!
//! Invariants established by [`crate::job::load`]: ids are unique; every edge connects
//! existing nodes, never leaves a sink or enters a source; parallelism is in
//! `1..=max_parallelism`; forward edges join equal parallelism; the graph is acyclic;
//! component and input files exist.

use std::path::PathBuf;

use crate::graph::partition::Partition;
use crate::graph::restart::RestartStrategy;
use crate::ids::NodeId;

/// A validated job.
#[derive(Debug, Clone)]
pub struct JobGraph {
    /// `[job] name`.
    pub name: String,
    /// The job file.
    pub file: PathBuf,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Records per batch.
    pub batch_size: u32,
    /// Batches per channel.
    pub channel_capacity: usize,
    /// Nodes in file order: sources, then operators, then sinks.
    pub nodes: Vec<Node>,
    /// Edges.
    pub edges: Vec<Edge>,
    /// Checkpointing (`None`: off).
    pub checkpoint: Option<CheckpointConfig>,
    /// What to do after a failure.
    pub restart: RestartStrategy,
    /// The processing guarantee the job asks for.
    pub guarantee: Guarantee,
    /// Resource limits of every operator instance.
    pub limits: crate::graph::limits::Limits,
}

/// `[job] guarantee`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarantee {
    /// State and committed output as if every record were processed once (needs replayable
    /// sources when checkpointing).
    ExactlyOnce,
    /// Admits sources that cannot rewind: records they delivered after the last checkpoint
    /// are not read again after a failure.
    AtLeastOnce,
}

/// `[checkpoint]`, validated.
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// Absolute directory holding `<job>/chk-<id>` (with an object store: its local copy).
    pub dir: PathBuf,
    /// `s3://bucket/prefix` when the checkpoints live in object storage (`dir = "s3://..."`).
    pub remote: Option<String>,
    /// Trigger, timeout and retention settings.
    pub settings: CheckpointSettings,
    /// Incremental snapshots of keyed state (`checkpoint/incremental.rs`).
    pub incremental: bool,
    /// `max_chain_links`: the longest chain before it is compacted (`None`: the default).
    pub max_chain_links: Option<usize>,
    /// How barriers pass buffered records (`checkpoint/unaligned.rs`).
    pub alignment: Alignment,
}

/// `[checkpoint] alignment`: whether a barrier waits behind the records queued before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Alignment {
    /// Barriers travel in line with the records and are aligned at multi-input tasks (ABS).
    #[default]
    Aligned,
    /// Barriers overtake queued records. A checkpoint still aligns first, for up to
    /// `aligned_for` (`alignment_timeout_ms`; zero with `alignment = "unaligned"`), and then
    /// switches: what its barriers overtook is written with the checkpoint and replayed on
    /// restore (Flink's unaligned checkpoints, FLIP-76, and its aligned-checkpoint timeout;
    /// `checkpoint/alignment_timeout.rs`).
    Unaligned {
        /// How long a checkpoint aligns at a task before it switches, counted from its trigger.
        aligned_for: std::time::Duration,
    },
}

impl Alignment {
    /// Whether barriers overtake records (so checkpoints may hold records in flight).
    pub fn overtakes(&self) -> bool {
        matches!(self, Alignment::Unaligned { .. })
    }

    /// How long a checkpoint aligns before it switches to unaligned (zero: never aligns).
    pub fn aligned_for(&self) -> std::time::Duration {
        match self {
            Alignment::Aligned => std::time::Duration::MAX,
            Alignment::Unaligned { aligned_for } => *aligned_for,
        }
    }
}

/// Checkpoint settings (`[checkpoint]` in the job file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// Trigger every this many milliseconds.
    pub interval_ms: u64,
    /// A pending checkpoint older than this is aborted.
    pub timeout_ms: u64,
    /// Minimum time between the end of one checkpoint and the trigger of the next.
    pub min_pause_ms: u64,
    /// Pending checkpoints allowed at once.
    pub max_concurrent: usize,
    /// Completed checkpoints kept on disk.
    pub retained: usize,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings { interval_ms: 1000, timeout_ms: 60_000, min_pause_ms: 0, max_concurrent: 1, retained: 3 }
    }
}

impl JobGraph {
    /// Index of the node with uid `id`.
    pub fn node_index(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id.as_str() == id)
    }

    /// Edges into node `i`, in file order.
    pub fn inputs_of(&self, i: usize) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(move |e| e.to == i)
    }

    /// Edges out of node `i`.
    pub fn outputs_of(&self, i: usize) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(move |e| e.from == i)
    }

    /// Whether `to` can be reached from `from` along edges (feedback edges included).
    pub fn reaches(&self, from: usize, to: usize) -> bool {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            if n == to {
                return true;
            }
            if std::mem::replace(&mut seen[n], true) {
                continue;
            }
            stack.extend(self.outputs_of(n).map(|e| e.to));
        }
        false
    }

    /// Whether the job has loops.
    pub fn is_cyclic(&self) -> bool {
        self.edges.iter().any(|e| e.feedback)
    }

    /// Whether edge `e` (an index into `edges`) stays inside a loop: its target can reach its
    /// source again. Loop heads end such edges first when the loop terminates.
    pub fn edge_in_loop(&self, e: usize) -> bool {
        let e = &self.edges[e];
        self.reaches(e.to, e.from)
    }
}

/// A node.
#[derive(Debug, Clone)]
pub struct Node {
    /// Uid.
    pub id: NodeId,
    /// Parallel instances.
    pub parallelism: u32,
    /// What it is.
    pub kind: NodeKind,
    /// Line in the job file (for errors).
    pub line: usize,
}

impl Node {
    /// An operator whose keyed state lives on the disk backend (`state_backend = "disk"`).
    pub fn state_on_disk(&self) -> bool {
        matches!(&self.kind, NodeKind::Operator(o) if o.state_backend == StateBackend::Disk)
    }
}

/// The kinds of nodes.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// Host-native source.
    Source(SourceKind),
    /// A WASM operator.
    Operator(OperatorNode),
    /// Host-native sink.
    Sink(SinkKind),
}

/// A file source's event time: an integer column (milliseconds), and watermarks that trail
/// the largest timestamp read by a bound on out-of-orderness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTimeColumn {
    /// 0-based comma-separated column holding the timestamp.
    pub column: u32,
    /// Watermark = largest timestamp read minus this.
    pub watermark_delay_ms: u64,
}

/// Sources.
#[derive(Debug, Clone)]
pub enum SourceKind {
    /// Lines of a text file.
    File {
        /// Absolute path.
        path: PathBuf,
        /// Key = this comma-separated column, if set.
        key_column: Option<u32>,
        /// Lines per second per subtask (unlimited when absent).
        rate: Option<u64>,
        /// Event time from a column, with watermarks (else: the line number, no watermarks).
        event_time: Option<EventTimeColumn>,
    },
    /// Deterministic generator.
    Generator(GeneratorConfig),
    /// Lines of standard input. Cannot rewind: not replayable.
    Stdin,
    /// Records of Kafka topics; offsets in checkpoints.
    Kafka(KafkaSource),
    /// Nexmark events (persons, auctions, bids), generated.
    Nexmark(NexmarkConfig),
}

/// A Kafka source's topics, start, bounds and watermarks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSource {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// Which topics.
    pub topics: KafkaTopics,
    /// Where partitions without a checkpointed offset start.
    pub start: KafkaStart,
    /// Consumer group: offsets of completed checkpoints are committed to it (monitoring), and
    /// `start = "group"` starts from its committed offsets.
    pub group: String,
    /// Stop at the end offsets seen when the job first started (a bounded read), instead of
    /// running until stopped.
    pub bounded: bool,
    /// Look for new partitions (and topics matching the pattern) this often; 0: never.
    pub discovery_interval_ms: u64,
    /// A partition with no record for this long does not hold back the watermark; 0: never.
    pub idle_timeout_ms: u64,
    /// Watermark = the smallest per-partition maximum timestamp minus this.
    pub watermark_delay_ms: u64,
    /// Read only committed transactional records (`isolation.level = read_committed`).
    pub read_committed: bool,
    /// Records per second per subtask (unlimited when absent).
    pub rate: Option<u64>,
}

/// A Kafka source's topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KafkaTopics {
    /// These topics.
    List(Vec<String>),
    /// Every topic whose whole name matches this regular expression.
    Pattern(String),
}

/// Where a Kafka partition without a checkpointed offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaStart {
    /// The first retained offset.
    Earliest,
    /// The end of the partition when the job starts.
    Latest,
    /// The first record with a timestamp at or after this (ms since the epoch).
    Timestamp(i64),
    /// The group's committed offset (earliest where it has none).
    Group,
}

impl SourceKind {
    /// Whether the source can rewind to a checkpointed position (exactly-once needs it).
    pub fn replayable(&self) -> bool {
        !matches!(self, SourceKind::Stdin)
    }
}

/// A deterministic generator: record `i` (`0 <= i < count`, split round-robin over the
/// subtasks) has key `i mod keys` (decimal text), timestamp `i`, and value `i` (decimal
/// text) or `value_bytes` pseudo-random bytes.
#[derive(Debug, Clone, Copy)]
pub struct GeneratorConfig {
    /// Records in total.
    pub count: u64,
    /// Distinct keys.
    pub keys: u64,
    /// Random value bytes instead of the sequence number.
    pub value_bytes: Option<u32>,
    /// Records per second per subtask.
    pub rate: Option<u64>,
    /// Seed for value bytes.
    pub seed: u64,
    /// Timestamps are the wall clock at creation (ms), not `i` (`timestamps = "ingestion"`).
    pub ingestion_time: bool,
}

/// A `nexmark` source's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NexmarkConfig {
    /// Events in total (all subtasks).
    pub count: u64,
    /// The stream's shape.
    pub params: NexmarkParams,
    /// Events per second per subtask, wall clock (unlimited when absent).
    pub rate: Option<u64>,
}

/// What shapes a `nexmark` stream (the source's options; the generator is
/// `connectors/nexmark/generator.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NexmarkParams {
    /// Seed of every random choice.
    pub seed: u64,
    /// Event-time rate: events per second of event time (> 0).
    pub events_per_second: u64,
    /// Timestamp of event 0, ms.
    pub base_time_ms: i64,
    /// Positions are shuffled within groups of this many (1: in order).
    pub out_of_order_group_size: u64,
    /// How many of the newest persons sell and bid besides the hot ones (the reference's
    /// `numActivePeople`, 1000); more spreads bids over more bidders (more open sessions).
    pub active_people: u64,
}

/// A WASM operator.
#[derive(Debug, Clone)]
pub struct OperatorNode {
    /// Absolute path of the component.
    pub component: PathBuf,
    /// The `config` table, as strings.
    pub config: Vec<(String, String)>,
    /// What a record the operator returns an error for does.
    pub on_error: OnError,
    /// Where its keyed state lives.
    pub state_backend: StateBackend,
    /// The disk backend's cache in the guest, MiB, and the job file line that set it.
    pub state_cache_mb: Option<(u64, usize)>,
}

/// `state_backend` of an operator: where its keyed state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateBackend {
    /// In the guest's linear memory (bounded by `memory_mb`): the fastest.
    #[default]
    Memory,
    /// In a store on local disk, with the guest's memory as a bounded cache of the keys in
    /// use (`operator/paged.rs`): state far larger than `memory_mb`.
    Disk,
}

/// `on_error` of an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// The subtask fails; the job restarts from its last checkpoint (or stops, when the
    /// same record fails again and again).
    #[default]
    Fail,
    /// The record goes to the operator's `dead-letter` output (key, value and timestamp as
    /// they arrived) with a warning naming it and the error, and processing goes on with the
    /// next record. Only for errors the operator returns naming the record; a trap still fails.
    DeadLetter,
}

/// The output name of an operator's dead letters.
pub const DEAD_LETTER: &str = "dead-letter";

/// How sinks write records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkFormat {
    /// The value, one line per record.
    Value,
    /// `<key> <value>`.
    KeyValue,
}

/// Sinks.
#[derive(Debug, Clone)]
pub enum SinkKind {
    /// Committed part files in a directory.
    File {
        /// Absolute path of the directory.
        path: PathBuf,
        /// Line format.
        format: SinkFormat,
        /// At most this many records per second per subtask.
        rate: Option<u64>,
    },
    /// Standard output.
    Stdout {
        /// Line format.
        format: SinkFormat,
    },
    /// Counts records, writes nothing (benchmarks); `latency`: also measures each record's
    /// latency from its ingestion timestamp.
    Blackhole {
        /// Measure latency.
        latency: bool,
        /// At most this many records per second per subtask.
        rate: Option<u64>,
    },
    /// Rows of a PostgreSQL table, exactly-once by two-phase commit.
    Postgres(PostgresTarget),
    /// Records of a Kafka topic, exactly-once through Kafka transactions.
    Kafka(KafkaTarget),
}

/// A Kafka sink's topic and delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaTarget {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The topic written.
    pub topic: String,
    /// Transactions committed when checkpoints complete (else: flushed at each checkpoint,
    /// at-least-once).
    pub exactly_once: bool,
    /// Producers' `transactional.id` is `<prefix>-<subtask>`.
    pub transaction_prefix: String,
    /// `transaction.timeout.ms`: longer than the checkpoint interval.
    pub transaction_timeout_ms: u64,
    /// How records pick partitions.
    pub partitioner: KafkaPartitioner,
    /// Kafka timestamps are the records' event time (else the producer's clock).
    pub event_timestamps: bool,
}

/// How a Kafka sink's records pick partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaPartitioner {
    /// By a hash of the record key (murmur2, as Kafka's Java client: records of one key stay
    /// in order in one partition).
    Key,
    /// Sink subtask `s` writes partition `s mod partitions` (no shuffle between subtasks).
    Subtask,
}

/// A PostgreSQL sink's table and how record values map onto it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresTarget {
    /// libpq connection string (`host=... dbname=...` or `postgres://...`).
    pub url: String,
    /// Table, optionally schema-qualified (`schema.table`).
    pub table: String,
    /// Upsert on these columns (a unique index on exactly them); empty: append.
    pub upsert_key: Vec<String>,
    /// Columns written, in the CSV's field order; empty (JSON only): every column of the table.
    pub columns: Vec<String>,
    /// What a record's value is.
    pub format: ValueFormat,
    /// Prepared transactions are named `<prefix>/<subtask>/<checkpoint>`.
    pub transaction_prefix: String,
    /// PEM file of the CA to trust for TLS (`sslmode=require` in `url`); else the web roots.
    pub ca_cert: Option<PathBuf>,
}

/// How a connector reads a record's value as columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueFormat {
    /// A JSON object, column name to value.
    Json,
    /// One CSV line, fields in the order of the configured columns; an empty field is NULL.
    Csv {
        /// Field separator.
        delimiter: u8,
    },
}

/// Which input of a two-input operator an edge feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A one-input operator's input, or the left input.
    Left,
    /// The right input of a two-input operator.
    Right,
}

/// An edge.
#[derive(Debug, Clone)]
pub struct Edge {
    /// Upstream node index.
    pub from: usize,
    /// Side output name of the upstream operator (`None` = main output).
    pub output: Option<String>,
    /// Output port (0 = main), resolved against the component's side outputs.
    pub port: u32,
    /// Downstream node index.
    pub to: usize,
    /// Which input of the downstream node.
    pub side: Side,
    /// `side` was given explicitly in the job file.
    pub side_given: bool,
    /// Partitioning.
    pub partition: Partition,
    /// A back-edge closing a loop.
    pub feedback: bool,
    /// Line in the job file.
    pub line: usize,
}
