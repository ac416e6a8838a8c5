//! The messages between the coordinator and its workers (the control plane), and their bytes:
//! each message one frame, `len: u32 LE` then the message in bincode.
//!
//! Invariants: every message that concerns an attempt carries it, and a receiver drops
//! messages of any attempt but its current one (a zombie's acks, a late trigger); a frame that
//! claims more than [`MAX_MESSAGE`] bytes, or whose body does not decode to exactly its length,
//! is an error and ends the connection. Pure: no I/O.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use bincode::Options as _;
use serde::{Deserialize, Serialize};

use crate::ids::{CheckpointId, NodeId, SubtaskIndex, TaskId};
use crate::runtime::control::{Control, Event};
use crate::runtime::error::TaskFailure;
use crate::runtime::latency::WireLatency;
use crate::runtime::metrics::Counters;
use crate::runtime::termination::LoopCounts;

/// Bumped when a message changes; a worker of another version is refused at registration.
pub const PROTOCOL_VERSION: u32 = 6;

/// The largest message (a component is shipped in one).
pub const MAX_MESSAGE: usize = 256 << 20;

/// An attempt of the job, numbered by the coordinator (restarts increase it): the leader's
/// epoch in the high bits ([`attempt_base`]), so every attempt of a later leader outranks
/// every attempt of an earlier one and workers' fences hold across leader changes.
pub type AttemptNo = u64;

/// The first attempt number of a leader of `epoch` (0 without high availability).
pub fn attempt_base(epoch: u64) -> AttemptNo {
    (epoch << 24) + 1
}

/// Worker → coordinator.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToCoordinator {
    /// The first message on a connection.
    Register {
        /// The worker's name (for logs and errors).
        name: String,
        /// Where its peers open channels to it.
        data_addr: SocketAddr,
        /// How many slices of a job it runs.
        slots: u32,
        /// [`PROTOCOL_VERSION`].
        protocol: u32,
    },
    /// Alive (sent every heartbeat interval).
    Heartbeat,
    /// The attempt is deployed: its subtasks are built and its incoming channels expected.
    Ready(AttemptNo),
    /// The attempt could not be deployed here.
    DeployFailed {
        /// The attempt.
        attempt: AttemptNo,
        /// Why.
        failure: WireFailure,
    },
    /// A checkpointing event of one of its subtasks.
    Event {
        /// The attempt.
        attempt: AttemptNo,
        /// The event.
        event: Event,
    },
    /// Its subtasks' counters and watermarks, now (sent every second while a part runs, and
    /// once more before `PartEnded`).
    Progress {
        /// The attempt.
        attempt: AttemptNo,
        /// Per subtask it runs: global task index, counters, watermark.
        subtasks: Vec<(u64, Counters, Option<i64>)>,
        /// Per node it runs subtasks of: what only the node as a whole reports.
        nodes: Vec<NodeProgress>,
    },
    /// Every subtask of its part of the attempt has exited.
    PartEnded {
        /// The attempt.
        attempt: AttemptNo,
        /// Failures of its subtasks (empty: all finished or stopped as told).
        failures: Vec<WireFailure>,
        /// Latency-measuring sinks' histograms per node uid.
        latency: BTreeMap<String, WireLatency>,
    },
    /// The answer to [`WireControl::Query`] number `query`: the [`QueryAnswer`] as JSON, or
    /// why there is none.
    ///
    /// [`QueryAnswer`]: crate::runtime::query::QueryAnswer
    QueryAnswer {
        /// The query's number.
        query: u64,
        /// The answer.
        answer: Result<String, String>,
    },
    /// The answer to [`ToWorker::LoopProbe`].
    LoopCounts {
        /// The attempt.
        attempt: AttemptNo,
        /// The wave.
        wave: u64,
        /// The part's counts.
        counts: LoopCounts,
    },
    /// [`WireControl::PrepareUpgrade`] for checkpoint `id` is in subtask `task`'s queue, its
    /// component compiled: the checkpoint's barrier may now reach the subtask.
    UpgradeArmed {
        /// The attempt.
        attempt: AttemptNo,
        /// Global task index.
        task: u64,
        /// The upgrade's checkpoint.
        id: CheckpointId,
    },
}

/// Coordinator → worker.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    /// Registration accepted.
    Welcome {
        /// Send a heartbeat this often; the coordinator sends one as often, and a worker that
        /// hears nothing for five of them leaves it (a paused or cut-off coordinator).
        heartbeat_ms: u64,
        /// The coordinator's leader epoch (0 without high availability): a worker never
        /// follows a coordinator of an older epoch than one it followed before.
        epoch: u64,
    },
    /// Alive (sent every heartbeat interval).
    Heartbeat,
    /// Registration refused: the worker should exit with this message.
    Refused(String),
    /// A component the worker will need, by its SHA-256 (sent once per connection).
    Component {
        /// SHA-256 of `bytes`, hex.
        digest: String,
        /// The component.
        bytes: Vec<u8>,
    },
    /// Build your part of an attempt and expect its incoming channels; answer `Ready`.
    Deploy(Box<Deploy>),
    /// Every worker of the attempt is ready: open the outgoing channels and start.
    Start(AttemptNo),
    /// To one subtask.
    Control {
        /// The attempt.
        attempt: AttemptNo,
        /// Global task index.
        task: u64,
        /// The message.
        control: WireControl,
    },
    /// Stop every subtask of the attempt now.
    Cancel(AttemptNo),
    /// A job with loops: report your part's record counts for this wave
    /// ([`ToCoordinator::LoopCounts`]; `runtime/termination.rs`).
    LoopProbe {
        /// The attempt.
        attempt: AttemptNo,
        /// The wave.
        wave: u64,
    },
    /// A job with loops is quiescent: loop heads end their loops.
    LoopQuiescent(AttemptNo),
}

/// What a worker's subtasks of one node report together (see `runtime/metrics.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeProgress {
    /// Node index in the job graph.
    pub node: u32,
    /// Most batches seen queued on one back-edge.
    pub feedback_peak_batches: u64,
    /// Snapshots abandoned half-drained.
    pub snapshots_abandoned: u64,
    /// Most `snapshot` calls one subtask's snapshot took.
    pub snapshot_chunks_max: u64,
}

/// One worker's part of an attempt.
#[derive(Debug, Serialize, Deserialize)]
pub struct Deploy {
    /// The attempt.
    pub attempt: AttemptNo,
    /// The job file's path (its relative paths resolve against its directory).
    pub job_path: PathBuf,
    /// The job file's text.
    pub job_source: String,
    /// Component digest per operator uid (shipped before).
    pub components: BTreeMap<String, String>,
    /// The checkpoint directory to restore.
    pub restore: Option<PathBuf>,
    /// `--allow-non-restored-state`.
    pub allow_non_restored_state: bool,
    /// Failed attempts before this one (0: the job's first start, when an unreachable
    /// connector refuses the job rather than failing the attempt).
    pub restarts: u32,
    /// Per subtask of the physical plan: the index of its worker in `peers`.
    pub worker_of: Vec<u32>,
    /// Data addresses of the attempt's workers.
    pub peers: Vec<SocketAddr>,
    /// The receiving worker's index in `peers`.
    pub you: u32,
    /// A served tenant's job (`weir coordinator --serve`): the bounds the worker keeps.
    pub tenant: Option<TenantBounds>,
}

/// What a worker keeps of a tenant's bounds for its part of the tenant's job: the disk its
/// sinks, checkpoints and disk-backed state write is charged to the tenant's quota (each
/// worker measures the tenant's shared directory), disk-backed state lives in that
/// directory, and the guests' log lines are dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantBounds {
    /// The tenant's name.
    pub name: String,
    /// Its directory (on storage the workers share).
    pub dir: PathBuf,
    /// Its `max_disk_mb`.
    pub max_disk_mb: u64,
}

/// A subtask's failure as it crosses the network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireFailure {
    /// Node uid.
    pub node: String,
    /// Subtask index.
    pub subtask: u32,
    /// The failure, as it reads where it happened.
    pub message: String,
    /// Caused by another failure.
    pub secondary: bool,
    /// Likely to pass on a retry.
    pub transient: bool,
    /// A refusal of the job itself (not a failed attempt): the job stops.
    pub setup: bool,
}

impl WireFailure {
    /// `f` on its way to the coordinator.
    pub fn of(f: &TaskFailure) -> Self {
        let t = f.task();
        WireFailure {
            node: t.node.to_string(),
            subtask: t.subtask.0,
            message: match f {
                // The worker adds where; the subtask is named once.
                TaskFailure::Remote { message, .. } => message.clone(),
                other => other.to_string().trim_start_matches(&format!("subtask {t}: ")).to_string(),
            },
            secondary: f.is_secondary(),
            transient: f.is_transient(),
            setup: false,
        }
    }

    /// The failure at the coordinator, naming the worker it happened on.
    pub fn into_failure(self, worker: &str) -> TaskFailure {
        TaskFailure::Remote {
            task: TaskId { node: NodeId::new(&self.node), subtask: SubtaskIndex(self.subtask) },
            worker: worker.to_string(),
            message: self.message,
            secondary: self.secondary,
            transient: self.transient,
        }
    }
}

/// The control messages that cross the network. Two carry what cannot travel as it is in one
/// process: a live upgrade's component goes ahead by its digest ([`ToWorker::Component`]), and
/// a state query's reply channel stays with the coordinator, which matches the worker's
/// [`ToCoordinator::QueryAnswer`] to it by number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireControl {
    /// [`Control::Trigger`].
    Trigger(CheckpointId),
    /// [`Control::Complete`].
    Complete(CheckpointId),
    /// [`Control::Abort`].
    Abort(CheckpointId),
    /// [`Control::Shutdown`].
    Shutdown,
    /// [`Control::SuspendAfter`].
    SuspendAfter(CheckpointId),
    /// [`Control::Stop`].
    Stop,
    /// [`Control::FullSnapshot`].
    FullSnapshot(CheckpointId),
    /// [`Control::UpgradeDecision`].
    UpgradeDecision {
        /// Checkpoint.
        id: CheckpointId,
        /// Switch.
        commit: bool,
    },
    /// [`Control::PrepareUpgrade`], its component shipped before under `digest`.
    PrepareUpgrade {
        /// The checkpoint whose barrier switches the version.
        id: CheckpointId,
        /// The operator's uid.
        operator: String,
        /// SHA-256 of the new component.
        digest: String,
    },
    /// [`Control::Query`] number `query`.
    Query {
        /// The query's number (its answer carries it back).
        query: u64,
        /// Operator uid.
        operator: String,
        /// The subtask that owns the key's group.
        subtask: u32,
        /// The keyed state.
        state: String,
        /// The key's group.
        key_group: u32,
        /// The key.
        key: Vec<u8>,
    },
}

impl WireControl {
    /// `c` for the network, or `None` for a message that cannot leave the process.
    pub fn of(c: &Control) -> Option<Self> {
        Some(match c {
            Control::Trigger(id) => WireControl::Trigger(*id),
            Control::Complete(id) => WireControl::Complete(*id),
            Control::Abort(id) => WireControl::Abort(*id),
            Control::Shutdown => WireControl::Shutdown,
            Control::SuspendAfter(id) => WireControl::SuspendAfter(*id),
            Control::Stop => WireControl::Stop,
            Control::FullSnapshot(id) => WireControl::FullSnapshot(*id),
            Control::UpgradeDecision { id, commit } => WireControl::UpgradeDecision { id: *id, commit: *commit },
            Control::PrepareUpgrade { .. } | Control::Query(_) => return None,
        })
    }

    /// Back to the subtask's message; `Err(self)` for the two the worker must complete
    /// (`PrepareUpgrade` needs the compiled component, `Query` a reply channel).
    pub fn into_control(self) -> Result<Control, WireControl> {
        Ok(match self {
            WireControl::Trigger(id) => Control::Trigger(id),
            WireControl::Complete(id) => Control::Complete(id),
            WireControl::Abort(id) => Control::Abort(id),
            WireControl::Shutdown => Control::Shutdown,
            WireControl::SuspendAfter(id) => Control::SuspendAfter(id),
            WireControl::Stop => Control::Stop,
            WireControl::FullSnapshot(id) => Control::FullSnapshot(id),
            WireControl::UpgradeDecision { id, commit } => Control::UpgradeDecision { id, commit },
            w @ (WireControl::PrepareUpgrade { .. } | WireControl::Query { .. }) => return Err(w),
        })
    }
}

fn options() -> impl bincode::Options {
    bincode::DefaultOptions::new().with_fixint_encoding().with_limit(MAX_MESSAGE as u64)
}

/// Why bytes are not a message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// A frame claims more than [`MAX_MESSAGE`].
    #[error("a control message claims {0} bytes (the limit is {MAX_MESSAGE})")]
    TooLarge(u64),
    /// The body does not decode.
    #[error("a control message does not decode: {0}")]
    Malformed(String),
}

/// Appends `m` as one frame to `out`.
pub fn encode<T: Serialize>(m: &T, out: &mut Vec<u8>) -> Result<(), WireError> {
    let body = options().serialize(m).map_err(|e| WireError::Malformed(e.to_string()))?;
    if body.len() > MAX_MESSAGE {
        return Err(WireError::TooLarge(body.len() as u64));
    }
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// Reassembles frames from chunks cut anywhere.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// Takes `chunk`; returns every message it completes, in order.
    pub fn push<T: for<'de> Deserialize<'de>>(&mut self, chunk: &[u8]) -> Result<Vec<T>, WireError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut at = 0;
        while self.buf.len() - at >= 4 {
            let len = u32::from_le_bytes(self.buf[at..at + 4].try_into().expect("4 bytes")) as usize;
            if len > MAX_MESSAGE {
                return Err(WireError::TooLarge(len as u64));
            }
            if self.buf.len() - at - 4 < len {
                break;
            }
            let body = &self.buf[at + 4..at + 4 + len];
            // Trailing bytes are rejected too: a body decodes to exactly its length.
            let m: T = options().deserialize(body).map_err(|e| WireError::Malformed(e.to_string()))?;
            out.push(m);
            at += 4 + len;
        }
        self.buf.drain(..at);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::control::{Ack, Timing};

    #[test]
    fn cluster_wire_messages_survive_any_chunking_and_bad_frames_are_refused() {
        let msgs = vec![
            ToCoordinator::Register {
                name: "w1".into(),
                data_addr: "127.0.0.1:9".parse().unwrap(),
                slots: 2,
                protocol: PROTOCOL_VERSION,
            },
            ToCoordinator::Event {
                attempt: 3,
                event: Event::Ack {
                    task: 4,
                    id: CheckpointId(7),
                    ack: Ack {
                        file: "count-1.state".into(),
                        bytes: 99,
                        crc32: 5,
                        timing: Timing { align_ms: 1.0, sync_ms: 2.0, async_ms: 3.0 },
                        chain: vec![],
                        logged_records: 0,
                        logged_bytes: 0,
                    },
                },
            },
            ToCoordinator::Progress {
                attempt: 3,
                subtasks: vec![(1, Counters { records_in: 5, busy_ms: 2, ..Counters::default() }, Some(-4))],
                nodes: vec![NodeProgress {
                    node: 2,
                    feedback_peak_batches: 7,
                    snapshots_abandoned: 1,
                    snapshot_chunks_max: 3,
                }],
            },
            ToCoordinator::PartEnded { attempt: 3, failures: vec![], latency: BTreeMap::new() },
        ];
        let mut bytes = Vec::new();
        for m in &msgs {
            encode(m, &mut bytes).unwrap();
        }
        for cut in [1, 3, 7, bytes.len()] {
            let mut d = Decoder::default();
            let mut got: Vec<ToCoordinator> = Vec::new();
            for chunk in bytes.chunks(cut) {
                got.extend(d.push::<ToCoordinator>(chunk).unwrap());
            }
            assert_eq!(format!("{got:?}"), format!("{msgs:?}"), "chunks of {cut}");
        }
        let mut d = Decoder::default();
        let huge = ((MAX_MESSAGE + 1) as u32).to_le_bytes();
        assert!(matches!(d.push::<ToWorker>(&huge), Err(WireError::TooLarge(_))));
        let mut d = Decoder::default();
        assert!(matches!(d.push::<ToWorker>(&[2, 0, 0, 0, 200, 1]), Err(WireError::Malformed(_))));
    }

    #[test]
    fn cluster_wire_failures_keep_their_class_and_controls_their_meaning() {
        let task = TaskId { node: NodeId::new("count"), subtask: SubtaskIndex(1) };
        let f = TaskFailure::Unavailable { task: task.clone(), message: "broker down".into() };
        let back = WireFailure::of(&f).into_failure("w2 (127.0.0.1:5)");
        assert!(back.is_transient() && !back.is_secondary());
        assert_eq!(back.to_string(), "subtask count#1 on worker w2 (127.0.0.1:5): broker down");
        let d = WireFailure::of(&TaskFailure::Disconnected { task }).into_failure("w");
        assert!(d.is_secondary());
        for c in [
            Control::Trigger(CheckpointId(3)),
            Control::Shutdown,
            Control::UpgradeDecision { id: CheckpointId(4), commit: true },
        ] {
            let w = WireControl::of(&c).unwrap();
            assert_eq!(format!("{:?}", w.clone().into_control().unwrap()), format!("{c:?}"));
        }
        // The two a worker completes come back as they are.
        let q = WireControl::Query {
            query: 9,
            operator: "count".into(),
            subtask: 1,
            state: "n".into(),
            key_group: 3,
            key: b"k".to_vec(),
        };
        assert_eq!(q.clone().into_control().unwrap_err(), q);
        let u = WireControl::PrepareUpgrade { id: CheckpointId(5), operator: "count".into(), digest: "ab".into() };
        assert_eq!(u.clone().into_control().unwrap_err(), u);
    }
}
