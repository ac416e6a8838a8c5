//! The job file as written (TOML), before validation. Unknown fields are errors, so a typo
//! never silently falls back to a default.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// A whole job file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// `[job]`
    pub job: JobSection,
    /// `[checkpoint]`
    #[serde(default)]
    pub checkpoint: Option<CheckpointSpec>,
    /// `[restart]`
    #[serde(default)]
    pub restart: Option<RestartSpec>,
    /// `[limits]`
    #[serde(default)]
    pub limits: Option<Spanned<LimitsSpec>>,
    /// `[[source]]`
    #[serde(default)]
    pub source: Vec<SourceSpec>,
    /// `[[operator]]`
    #[serde(default)]
    pub operator: Vec<OperatorSpec>,
    /// `[[sink]]`
    #[serde(default)]
    pub sink: Vec<SinkSpec>,
}

/// `[limits]`: per operator instance (every subtask of every operator).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// Linear memory, MiB.
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// CPU (wall) time of one guest call, ms.
    #[serde(default)]
    pub call_timeout_ms: Option<u64>,
    /// Bytes one guest call may emit, MiB.
    #[serde(default)]
    pub max_emit_mb: Option<u64>,
    /// Bytes one snapshot may return, MiB.
    #[serde(default)]
    pub max_snapshot_mb: Option<u64>,
    /// Bytes of one state value, MiB.
    #[serde(default)]
    pub max_state_value_mb: Option<u64>,
    /// Bytes of timers one instance may hold (keys plus bookkeeping), MiB.
    #[serde(default)]
    pub max_timer_mb: Option<u64>,
    /// Bytes of records in flight on the job's back-edges, MiB.
    #[serde(default)]
    pub max_feedback_mb: Option<u64>,
}

/// `[job]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// Job name (checkpoint directories and logs use it).
    pub name: Spanned<String>,
    /// Number of key groups; the upper bound of any keyed operator's parallelism.
    #[serde(default = "default_max_parallelism")]
    pub max_parallelism: Spanned<u32>,
    /// Default parallelism of nodes that do not set one.
    #[serde(default)]
    pub parallelism: Option<Spanned<u32>>,
    /// Records per batch on channels and across the WASM boundary.
    #[serde(default)]
    pub batch_size: Option<Spanned<u32>>,
    /// Batches buffered per channel before the sender blocks.
    #[serde(default)]
    pub channel_capacity: Option<Spanned<u32>>,
    /// `exactly-once` (default) or `at-least-once` (admits sources that cannot rewind).
    #[serde(default)]
    pub guarantee: Option<Spanned<String>>,
}

fn default_max_parallelism() -> Spanned<u32> {
    Spanned::new(0..0, 128)
}

/// `[[source]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// Unique node id.
    pub id: Spanned<String>,
    /// `file`, `generator` or `stdin`.
    #[serde(rename = "type")]
    pub kind: Spanned<String>,
    /// Parallel instances.
    #[serde(default)]
    pub parallelism: Option<Spanned<u32>>,
    /// file: path of the input, relative to the job file.
    #[serde(default)]
    pub path: Option<Spanned<String>>,
    /// file: use this 0-based comma-separated column as the record key.
    #[serde(default)]
    pub key_column: Option<Spanned<u32>>,
    /// file: event time (ms) = this 0-based comma-separated column; with watermarks.
    #[serde(default)]
    pub timestamp_column: Option<Spanned<u32>>,
    /// nexmark: event-time rate, events per second (spacing of timestamps).
    #[serde(default)]
    pub events_per_second: Option<Spanned<u64>>,
    /// nexmark: timestamp of the first event, ms since the epoch.
    #[serde(default)]
    pub base_time_ms: Option<Spanned<i64>>,
    /// nexmark: positions shuffled within groups of this many (1: in order).
    #[serde(default)]
    pub out_of_order_group_size: Option<Spanned<u64>>,
    /// nexmark: how many of the newest persons bid and sell besides the hot ones (1000).
    #[serde(default)]
    pub active_people: Option<Spanned<u64>>,
    /// generator: number of records.
    #[serde(default)]
    pub count: Option<Spanned<u64>>,
    /// generator: number of distinct keys (record i has key i mod keys).
    #[serde(default)]
    pub keys: Option<Spanned<u64>>,
    /// generator: value = this many pseudo-random bytes instead of the sequence number.
    #[serde(default)]
    pub value_bytes: Option<Spanned<u32>>,
    /// generator, file and kafka: records per second per subtask (unlimited when absent).
    #[serde(default)]
    pub rate: Option<Spanned<u64>>,
    /// generator: seed of the value bytes.
    #[serde(default)]
    pub seed: Option<Spanned<u64>>,
    /// Generator: `sequence` (record i has time i, the default) or `ingestion` (the wall
    /// clock in ms when the record is created; for latency measurement).
    #[serde(default)]
    pub timestamps: Option<Spanned<String>>,
    /// kafka: `host:port[,host:port...]`.
    #[serde(default)]
    pub bootstrap_servers: Option<Spanned<String>>,
    /// kafka: the topics read.
    #[serde(default)]
    pub topics: Option<Spanned<Vec<String>>>,
    /// kafka: read every topic whose name matches this regular expression.
    #[serde(default)]
    pub topic_pattern: Option<Spanned<String>>,
    /// kafka: `earliest` (default), `latest`, `timestamp` or `group`.
    #[serde(default)]
    pub start: Option<Spanned<String>>,
    /// kafka, start = "timestamp": ms since the epoch.
    #[serde(default)]
    pub start_timestamp_ms: Option<Spanned<i64>>,
    /// kafka: the consumer group (default `weir-<job>-<source>`).
    #[serde(default)]
    pub group: Option<Spanned<String>>,
    /// kafka: stop at the end offsets of the first start.
    #[serde(default)]
    pub bounded: Option<Spanned<bool>>,
    /// kafka: how often to look for new partitions (0: never).
    #[serde(default)]
    pub discovery_interval_ms: Option<Spanned<u64>>,
    /// kafka: a partition silent this long stops holding back the watermark (0: never).
    #[serde(default)]
    pub idle_timeout_ms: Option<Spanned<u64>>,
    /// kafka and file (with `timestamp_column`): how far the watermark trails the largest
    /// timestamp read (kafka: the smallest per-partition maximum).
    #[serde(default)]
    pub watermark_delay_ms: Option<Spanned<u64>>,
    /// kafka: `read_committed` (default) or `read_uncommitted`.
    #[serde(default)]
    pub isolation: Option<Spanned<String>>,
}

/// `[[operator]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorSpec {
    /// Unique node id: the operator's uid.
    pub id: Spanned<String>,
    /// Path of the `.wasm` component, relative to the job file.
    pub component: Spanned<String>,
    /// Parallel instances.
    #[serde(default)]
    pub parallelism: Option<Spanned<u32>>,
    /// Where records come from.
    #[serde(default)]
    pub inputs: Vec<InputSpec>,
    /// Handed to the operator's `open` as strings.
    #[serde(default)]
    pub config: BTreeMap<String, toml::Value>,
    /// `fail` (default) or `dead-letter`: what a record the operator returns an error for does.
    #[serde(default)]
    pub on_error: Option<Spanned<String>>,
    /// `memory` (default) or `disk`: where the operator's keyed state lives.
    #[serde(default)]
    pub state_backend: Option<Spanned<String>>,
    /// The disk backend's cache of keys in the guest, MiB (default: a quarter of `memory_mb`).
    #[serde(default)]
    pub state_cache_mb: Option<Spanned<u64>>,
}

/// `[[sink]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkSpec {
    /// Unique node id.
    pub id: Spanned<String>,
    /// `file`, `stdout` or `blackhole`.
    #[serde(rename = "type")]
    pub kind: Spanned<String>,
    /// Parallel instances.
    #[serde(default)]
    pub parallelism: Option<Spanned<u32>>,
    /// file: output directory, relative to the job file.
    #[serde(default)]
    pub path: Option<Spanned<String>>,
    /// `value` (default): one line per record value; `key_value`: `<key> <value>`.
    #[serde(default)]
    pub format: Option<Spanned<String>>,
    /// Blackhole: measure each record's latency from its (ingestion) timestamp.
    #[serde(default)]
    pub latency: Option<Spanned<bool>>,
    /// postgres: the libpq connection string.
    #[serde(default)]
    pub url: Option<Spanned<String>>,
    /// postgres: the table (`schema.table` or `table`).
    #[serde(default)]
    pub table: Option<Spanned<String>>,
    /// postgres: `append` (default) or `upsert`.
    #[serde(default)]
    pub mode: Option<Spanned<String>>,
    /// postgres upsert: the key columns.
    #[serde(default)]
    pub key: Option<Spanned<Vec<String>>>,
    /// postgres: the columns written (CSV: in field order).
    #[serde(default)]
    pub columns: Option<Spanned<Vec<String>>>,
    /// postgres CSV: the field separator (one character, default `,`).
    #[serde(default)]
    pub delimiter: Option<Spanned<String>>,
    /// postgres: prefix of the prepared transactions' ids (default `weir/<job>/<sink>`).
    #[serde(default)]
    pub transaction_prefix: Option<Spanned<String>>,
    /// postgres: PEM file of the CA that signed the server's certificate (TLS).
    #[serde(default)]
    pub ca_cert: Option<Spanned<String>>,
    /// kafka: `host:port[,host:port...]`.
    #[serde(default)]
    pub bootstrap_servers: Option<Spanned<String>>,
    /// file and blackhole: at most this many records per second per subtask (a slow sink,
    /// for backpressure tests and benchmarks).
    #[serde(default)]
    pub rate: Option<Spanned<u64>>,
    /// kafka: the topic written.
    #[serde(default)]
    pub topic: Option<Spanned<String>>,
    /// kafka: `exactly-once` or `at-least-once` (default: the job's guarantee when
    /// checkpointing, else at-least-once).
    #[serde(default)]
    pub delivery: Option<Spanned<String>>,
    /// kafka: `transaction.timeout.ms` of its producers.
    #[serde(default)]
    pub transaction_timeout_ms: Option<Spanned<u64>>,
    /// kafka: `key` (default) or `subtask`.
    #[serde(default)]
    pub partitioner: Option<Spanned<String>>,
    /// kafka: `event` (default: the record's event time) or `now` (the producer's clock).
    #[serde(default)]
    pub timestamps: Option<Spanned<String>>,
    /// Where records come from.
    #[serde(default)]
    pub inputs: Vec<InputSpec>,
}

/// One input of an operator or sink.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    /// Upstream node id.
    pub from: Spanned<String>,
    /// `forward`, `hash`, `broadcast` or `rebalance`.
    #[serde(default)]
    pub partition: Option<Spanned<String>>,
    /// For two-input operators: `left` or `right`.
    #[serde(default)]
    pub side: Option<Spanned<String>>,
    /// A side output of the upstream operator instead of its main output.
    #[serde(default)]
    pub output: Option<Spanned<String>>,
    /// This edge closes a loop (a back-edge): its channel never blocks the sender, and
    /// checkpoints log the records in transit on it (ABS, cyclic graphs).
    #[serde(default)]
    pub feedback: Option<Spanned<bool>>,
}

/// `[checkpoint]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Trigger interval; 0 turns checkpointing off.
    pub interval_ms: Spanned<u64>,
    /// Directory for checkpoints, relative to the job file (`<dir>/<job>/chk-<id>`), or
    /// `s3://bucket/prefix` for S3-compatible object storage.
    #[serde(default)]
    pub dir: Option<Spanned<String>>,
    /// With object storage: the local directory checkpoints are written to before upload and
    /// downloaded to before a restore (default `checkpoints`, relative to the job file).
    #[serde(default)]
    pub staging_dir: Option<Spanned<String>>,
    /// Abort a checkpoint not complete within this time.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Minimum pause between the end of one checkpoint and the next trigger.
    #[serde(default)]
    pub min_pause_ms: Option<u64>,
    /// Checkpoints in flight at once.
    #[serde(default)]
    pub max_concurrent: Option<Spanned<u32>>,
    /// Completed checkpoints kept.
    #[serde(default)]
    pub retained: Option<Spanned<u32>>,
    /// Write only the keyed state changed since the previous checkpoint (referencing the
    /// earlier files); savepoints stay full.
    #[serde(default)]
    pub incremental: bool,
    /// With `incremental`: the most files a checkpoint's keyed state may build on (its chain,
    /// the full snapshot first) before the chain is compacted (default 8; 64 for operators on
    /// the disk backend, whose chains are folded in the background).
    #[serde(default)]
    pub max_chain_links: Option<Spanned<u32>>,
    /// `aligned` (the default) or `unaligned`: barriers overtake queued records, which are
    /// written with the checkpoint (checkpoints stay short under backpressure).
    #[serde(default)]
    pub alignment: Option<Spanned<String>>,
    /// With aligned checkpoints: a checkpoint still aligning this long after its trigger
    /// switches to unaligned (barriers overtake the queued records, which are written with it).
    #[serde(default)]
    pub alignment_timeout_ms: Option<Spanned<u64>>,
}

/// `[restart]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSpec {
    /// `none`, `fixed-delay` or `exponential-backoff`.
    pub strategy: Spanned<String>,
    /// Restarts allowed before the job fails.
    #[serde(default)]
    pub attempts: Option<u32>,
    /// fixed-delay: delay; exponential-backoff: first delay.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// exponential-backoff: upper bound.
    #[serde(default)]
    pub max_delay_ms: Option<u64>,
    /// exponential-backoff: growth factor.
    #[serde(default)]
    pub multiplier: Option<f64>,
}
