//! A handle on a running job: what the control API (and tests) use to take savepoints, stop
//! with a savepoint, upgrade an operator's component live, cancel, and read the status.
//!
//! Requests go to the job's checkpoint coordinator (savepoints and upgrades are barriers like
//! any checkpoint); replies come back on a one-shot channel. Invariant: every request gets
//! exactly one reply — an error if the job ends first — so a caller never hangs.

use crate::runtime::query::QueryAnswer;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use serde::{Deserialize, Serialize};

use crate::operator::OperatorFactory;
use crate::runtime::metrics::NodeMetrics;

/// A completed savepoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavepointInfo {
    /// Its directory.
    pub path: PathBuf,
    /// The checkpoint id it was taken as.
    pub checkpoint_id: u64,
    /// Bytes of state and manifest.
    pub bytes: u64,
    /// Trigger to savepoint written.
    pub duration_ms: f64,
}

/// A completed live upgrade.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradeInfo {
    /// Operator uid.
    pub operator: String,
    /// Old component `name version (schema n)`.
    pub from: String,
    /// New component.
    pub to: String,
    /// The checkpoint at whose barrier the version switched.
    pub checkpoint_id: u64,
    /// State migrated from this older schema.
    pub migrated_from: Option<u32>,
    /// Longest time a subtask of the operator did not process records.
    pub pause_ms_max: f64,
    /// Bytes of the operator's state moved into the new instances.
    pub state_bytes: u64,
}

/// A request to the running job.
pub enum Request {
    /// A key's current value in operator `uid`'s keyed state (`runtime/query.rs`).
    Query {
        /// Operator uid.
        uid: String,
        /// The key.
        key: Vec<u8>,
        /// The state (`None`: the operator's only keyed state).
        state: Option<String>,
        /// The reply (sent by the subtask that owns the key).
        reply: Sender<Result<QueryAnswer, String>>,
    },
    /// Take a savepoint into `dir` (and stop the job after it if `stop`).
    Savepoint {
        /// Target directory (`None`: the job's default savepoint directory).
        dir: Option<PathBuf>,
        /// Stop the job once the savepoint is complete and its output committed.
        stop: bool,
        /// The reply.
        reply: Sender<Result<SavepointInfo, String>>,
    },
    /// Replace operator `uid`'s component at the next barrier.
    Upgrade {
        /// Operator uid.
        uid: String,
        /// The new component, compiled and checked.
        factory: OperatorFactory,
        /// The reply.
        reply: Sender<Result<UpgradeInfo, String>>,
    },
}

/// Lifecycle of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Starting.
    Created,
    /// Running.
    Running,
    /// Restarting after a failure.
    Restarting {
        /// The failure.
        cause: String,
    },
    /// Sources exhausted, output committed.
    Finished,
    /// Stopped with a savepoint.
    Stopped {
        /// The savepoint.
        savepoint: PathBuf,
    },
    /// Cancelled by a user.
    Cancelled,
    /// Failed for good.
    Failed {
        /// Why.
        cause: String,
    },
}

impl JobState {
    /// Finished, stopped, cancelled or failed.
    pub fn is_terminal(&self) -> bool {
        matches!(self, JobState::Finished | JobState::Stopped { .. } | JobState::Cancelled | JobState::Failed { .. })
    }
}

/// One operator as the status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Uid.
    pub uid: String,
    /// Parallelism.
    pub parallelism: u32,
    /// Running component `name version (schema n)`, for WASM operators.
    pub component: Option<String>,
    /// Records received.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Milliseconds its subtasks spent blocked on full output channels (summed).
    #[serde(default)]
    pub backpressured_ms: u64,
    /// Records the operator failed on, sent to its dead-letter output.
    #[serde(default)]
    pub dead_letters: u64,
    /// Milliseconds its subtasks spent in guest calls (operators; summed).
    #[serde(default)]
    pub busy_ms: u64,
    /// `source`, `operator` or `sink`.
    #[serde(default)]
    pub kind: String,
    /// Where its inputs come from: the job graph's edges into it.
    #[serde(default)]
    pub inputs: Vec<NodeInput>,
    /// Milliseconds its subtasks spent waiting for input (operators and sinks; summed).
    #[serde(default)]
    pub idle_ms: u64,
    /// Bytes of the records received (operators and sinks).
    #[serde(default)]
    pub bytes_in: u64,
    /// Bytes of the records emitted (operators).
    #[serde(default)]
    pub bytes_out: u64,
    /// Guest calls for records, timers and watermarks (operators).
    #[serde(default)]
    pub guest_calls: u64,
    /// Its event-time watermark: the least of its subtasks', once each has one.
    #[serde(default)]
    pub watermark: Option<i64>,
    /// Linear memory its guest instances hold, bytes (operators; summed).
    #[serde(default)]
    pub guest_memory_bytes: u64,
    /// The same counters per subtask, by subtask index.
    #[serde(default)]
    pub subtasks: Vec<SubtaskStatus>,
}

/// One subtask's counters, as the status shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskStatus {
    /// Subtask index.
    pub subtask: u32,
    /// Its counters.
    #[serde(flatten)]
    pub counters: crate::runtime::metrics::Counters,
    /// Its event-time watermark, once one arrived.
    #[serde(default)]
    pub watermark: Option<i64>,
}

/// One edge into a node, as the status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInput {
    /// Upstream node's uid.
    pub from: String,
    /// A back-edge closing a loop.
    pub feedback: bool,
}

/// A checkpoint that failed (timed out, declined, or did not verify).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointFailure {
    /// Checkpoint id.
    pub id: u64,
    /// Why.
    pub reason: String,
    /// When it failed, ms since the Unix epoch.
    pub unix_ms: u64,
}

/// How many of the newest failed checkpoints the status keeps.
pub const FAILURES_KEPT: usize = 50;

/// What `status` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// Job name.
    pub name: String,
    /// Lifecycle.
    #[serde(flatten)]
    pub state: JobState,
    /// Attempts so far (1 + restarts).
    pub attempts: u32,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Newest completed checkpoint id.
    pub last_checkpoint: Option<u64>,
    /// Checkpoints that timed out or were declined.
    #[serde(default)]
    pub checkpoints_failed: u64,
    /// Why the newest of those failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_failure: Option<String>,
    /// Subtask failures by the sandbox limit they ran into (`cpu_time`, `memory`, ...).
    #[serde(default)]
    pub traps_by_limit: std::collections::BTreeMap<String, u64>,
    /// The newest failed checkpoints (at most [`FAILURES_KEPT`]), oldest first.
    #[serde(default)]
    pub checkpoint_failures: Vec<CheckpointFailure>,
    /// Per node.
    pub nodes: Vec<NodeStatus>,
    /// Live upgrades done.
    pub upgrades: Vec<UpgradeInfo>,
}

/// The job's side of the handle.
#[derive(Clone)]
pub struct Endpoint {
    /// Requests to the coordinator.
    pub requests: Receiver<Request>,
    /// The status, updated by the executor.
    pub status: Arc<Mutex<JobStatus>>,
    /// Set by `cancel`.
    pub cancel: Arc<AtomicBool>,
    /// Counters of the current attempt, per node.
    pub metrics: Arc<Mutex<Vec<Arc<NodeMetrics>>>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").finish_non_exhaustive()
    }
}

/// A cloneable handle on one running job.
#[derive(Clone)]
pub struct JobHandle {
    requests: Sender<Request>,
    status: Arc<Mutex<JobStatus>>,
    cancel: Arc<AtomicBool>,
    metrics: Arc<Mutex<Vec<Arc<NodeMetrics>>>>,
}

impl JobHandle {
    /// A handle and the endpoint to give the executor (`RunOptions::endpoint`).
    pub fn new(name: &str) -> (JobHandle, Endpoint) {
        let (tx, rx) = unbounded();
        let status = Arc::new(Mutex::new(JobStatus {
            name: name.to_string(),
            state: JobState::Created,
            attempts: 0,
            checkpoints: 0,
            last_checkpoint: None,
            checkpoints_failed: 0,
            last_checkpoint_failure: None,
            checkpoint_failures: Vec::new(),
            traps_by_limit: Default::default(),
            nodes: Vec::new(),
            upgrades: Vec::new(),
        }));
        let cancel = Arc::new(AtomicBool::new(false));
        let metrics: Arc<Mutex<Vec<Arc<NodeMetrics>>>> = Arc::default();
        (
            JobHandle { requests: tx, status: status.clone(), cancel: cancel.clone(), metrics: metrics.clone() },
            Endpoint { requests: rx, status, cancel, metrics },
        )
    }

    /// The current status.
    pub fn status(&self) -> JobStatus {
        let mut st = self.status.lock().unwrap().clone();
        for (n, m) in st.nodes.iter_mut().zip(self.metrics.lock().unwrap().iter()) {
            n.subtasks = (m.per_subtask().into_iter().enumerate())
                .map(|(i, counters)| SubtaskStatus { subtask: i as u32, counters, watermark: m.watermark_of(i as u32) })
                .collect();
            let mut t = crate::runtime::metrics::Counters::default();
            for s in &n.subtasks {
                t += s.counters;
            }
            (n.records_in, n.records_out, n.bytes_in, n.bytes_out) =
                (t.records_in, t.records_out, t.bytes_in, t.bytes_out);
            (n.backpressured_ms, n.busy_ms, n.idle_ms) = (t.backpressured_ms, t.busy_ms, t.idle_ms);
            (n.dead_letters, n.guest_calls, n.guest_memory_bytes) =
                (t.dead_letters, t.guest_calls, t.guest_memory_bytes);
            n.watermark = m.watermark();
        }
        st
    }

    fn ask<T>(&self, make: impl FnOnce(Sender<Result<T, String>>) -> Request, timeout: Duration) -> Result<T, String> {
        if self.status().state.is_terminal() {
            return Err(format!("job `{}` is not running ({:?})", self.status().name, self.status().state));
        }
        let (tx, rx) = bounded(1);
        self.requests.send(make(tx)).map_err(|_| "the job is not running".to_string())?;
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                Err(format!("no answer within {} s; the request may still complete", timeout.as_secs()))
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err("the job ended before answering".to_string()),
        }
    }

    /// Takes a savepoint (into `dir`, or the job's default savepoint directory); with `stop`,
    /// stops the job after it, its output committed.
    pub fn savepoint(&self, dir: Option<PathBuf>, stop: bool, timeout: Duration) -> Result<SavepointInfo, String> {
        self.ask(|reply| Request::Savepoint { dir, stop, reply }, timeout)
    }

    /// Replaces operator `uid`'s component at the next barrier.
    pub fn upgrade(&self, uid: &str, factory: OperatorFactory, timeout: Duration) -> Result<UpgradeInfo, String> {
        self.ask(|reply| Request::Upgrade { uid: uid.to_string(), factory, reply }, timeout)
    }

    /// A key's current value in operator `uid`'s keyed state `state` (or its only one), read
    /// between two batches on the subtask that owns the key.
    pub fn query(&self, uid: &str, key: &[u8], state: Option<&str>, timeout: Duration) -> Result<QueryAnswer, String> {
        let (uid, key, state) = (uid.to_string(), key.to_vec(), state.map(str::to_string));
        self.ask(|reply| Request::Query { uid, key, state, reply }, timeout)
    }

    /// Cancels the job: every subtask stops, nothing more is committed.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
