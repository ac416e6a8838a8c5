//! Messages between the checkpoint coordinator and the subtasks (outside the data channels).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;

use crate::checkpoint::incremental::ChainLink;
use crate::checkpoint::snapshot::{KeyGroupSnapshot, SubtaskState};
use crate::ids::CheckpointId;
use crate::operator::OperatorFactory;

/// Where the checkpoint coordinator's messages to its subtasks go.
#[derive(Clone)]
pub enum Controls {
    /// One channel per subtask (in one process).
    PerTask(Vec<crossbeam_channel::Sender<Control>>),
    /// One stream of `(task, message)` in the order they were sent (a cluster's coordinator
    /// forwards them to the workers in that order, and holds an upgrade's trigger until the
    /// workers have its component ready).
    Ordered(crossbeam_channel::Sender<(usize, Control)>),
}

impl Controls {
    /// Sends `c` to subtask `task` (a subtask that has exited is skipped).
    pub fn send(&self, task: usize, c: Control) {
        match self {
            Controls::PerTask(v) => {
                if let Some(tx) = v.get(task) {
                    let _ = tx.send(c);
                }
            }
            Controls::Ordered(tx) => {
                let _ = tx.send((task, c));
            }
        }
    }
}

/// Coordinator → subtask.
#[derive(Clone)]
pub enum Control {
    /// Checkpoint `id` was triggered: sources inject its barrier; finished subtasks ack it
    /// with their final state; running subtasks remember it (they get the barrier in-band).
    Trigger(CheckpointId),
    /// Checkpoint `id` is complete (its manifest is published): commit what it pre-committed.
    Complete(CheckpointId),
    /// Checkpoint `id` was aborted: stop aligning it.
    Abort(CheckpointId),
    /// The job finished (its final checkpoint is complete): exit.
    Shutdown,
    /// Sources: after injecting the barrier of savepoint `id`, emit nothing more (stop with
    /// savepoint); resume if `id` is aborted. Sent before its `Trigger`.
    SuspendAfter(CheckpointId),
    /// Savepoint `id` of a stop is complete and committed: exit now without draining
    /// (no `close`, no end of stream), so the savepoint is exactly where the job resumes.
    Stop,
    /// Subtasks of the upgraded operator: at the barrier of checkpoint `id`, snapshot the
    /// running instance, restore it into a new instance of `factory`, report, and wait for
    /// the coordinator's decision. Sent before its `Trigger`.
    PrepareUpgrade {
        /// The checkpoint whose barrier switches the version.
        id: CheckpointId,
        /// The new component.
        factory: OperatorFactory,
    },
    /// Checkpoint `id` must be a full snapshot (a savepoint): no delta, no chain. Sent
    /// before its `Trigger`.
    FullSnapshot(CheckpointId),
    /// Every subtask of the operator prepared the upgrade at `id` (`commit`) or at least one
    /// failed (roll back to the old instance).
    UpgradeDecision {
        /// Checkpoint.
        id: CheckpointId,
        /// Switch to the new instance.
        commit: bool,
    },
    /// The subtask that owns the key: answer this live state query between two batches.
    Query(crate::runtime::query::StateQuery),
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Control::Trigger(id) => write!(f, "Trigger({id})"),
            Control::Complete(id) => write!(f, "Complete({id})"),
            Control::Abort(id) => write!(f, "Abort({id})"),
            Control::Shutdown => write!(f, "Shutdown"),
            Control::SuspendAfter(id) => write!(f, "SuspendAfter({id})"),
            Control::Stop => write!(f, "Stop"),
            Control::FullSnapshot(id) => write!(f, "FullSnapshot({id})"),
            Control::PrepareUpgrade { id, factory } => {
                write!(f, "PrepareUpgrade({id}, {} {})", factory.info().name, factory.info().version)
            }
            Control::UpgradeDecision { id, commit } => write!(f, "UpgradeDecision({id}, commit: {commit})"),
            Control::Query(q) => write!(f, "Query({}#{}, {})", q.operator, q.subtask, q.state),
        }
    }
}

/// Timings of one subtask's part of a checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// First barrier to last (multi-input tasks).
    pub align_ms: f64,
    /// Synchronous part: guest snapshot export and capture.
    pub sync_ms: f64,
    /// Asynchronous part: serialize, write, fsync.
    pub async_ms: f64,
}

/// A subtask's acknowledgement: where its state went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    /// File name in the checkpoint directory.
    pub file: String,
    /// Size.
    pub bytes: u64,
    /// CRC-32 of the body.
    pub crc32: u32,
    /// Timings.
    pub timing: Timing,
    /// Incremental snapshots: the earlier files this one builds on.
    pub chain: Vec<ChainLink>,
    /// Loop heads: records in transit on back-edges, logged into this state.
    pub logged_records: u64,
    /// Their size.
    pub logged_bytes: u64,
}

/// Subtask → coordinator.
#[derive(Debug, Serialize, Deserialize)]
pub enum Event {
    /// State of checkpoint `id` is durable.
    Ack {
        /// Global task index.
        task: usize,
        /// Checkpoint.
        id: CheckpointId,
        /// Where.
        ack: Ack,
    },
    /// The subtask cannot take part in checkpoint `id`.
    Decline {
        /// Global task index.
        task: usize,
        /// Checkpoint.
        id: CheckpointId,
        /// Why.
        reason: String,
    },
    /// The subtask processed all its input; it now answers triggers with its final state.
    Finished {
        /// Global task index.
        task: usize,
    },
    /// A subtask of an upgraded operator restored its state into the new instance (`Ok`)
    /// or could not (`Err`: why). Sent before its `Ack` for `id`.
    UpgradePrepared {
        /// Global task index.
        task: usize,
        /// Checkpoint.
        id: CheckpointId,
        /// Outcome.
        result: Result<(), String>,
        /// Bytes of state moved into the new instance.
        state_bytes: u64,
    },
    /// A subtask of an upgraded operator resumed processing (on the new instance if
    /// `committed`) after pausing `pause_ms` at the barrier.
    UpgradeResumed {
        /// Global task index.
        task: usize,
        /// Checkpoint.
        id: CheckpointId,
        /// Switched to the new instance.
        committed: bool,
        /// Barrier to first record after it: the time it did not process records.
        pause_ms: f64,
    },
}

/// To the asynchronous writer.
#[derive(Debug)]
pub enum WriteMsg {
    /// Key groups of a snapshot the operator hands out in chunks, to append to its file now
    /// (the rest follows as a [`WriteMsg::Done`] with the same task and checkpoint).
    Part {
        /// Global task index.
        task: usize,
        /// Checkpoint.
        id: CheckpointId,
        /// File name in the checkpoint directory.
        file: String,
        /// The key groups.
        groups: Vec<KeyGroupSnapshot>,
    },
    /// The (rest of the) snapshot: write, fsync, ack.
    Done(WriteJob),
    /// The checkpoint was aborted while its snapshot was handed out in parts: close and drop
    /// what was written of it (no `Done` follows).
    Abandon {
        /// Global task index.
        task: usize,
        /// Checkpoint.
        id: CheckpointId,
    },
    /// Fold the chain `links` of a task's state files into the new file `into`, in the
    /// background (`checkpoint/compaction.rs`); the keyed bytes written, or why not, go to
    /// `reply`.
    Compact {
        /// Global task index.
        task: usize,
        /// The chain, oldest (full) first.
        links: Vec<crate::checkpoint::incremental::ChainLink>,
        /// The file to write.
        into: crate::checkpoint::incremental::ChainLink,
        /// The outcome.
        reply: crossbeam_channel::Sender<Result<u64, String>>,
    },
}

/// A snapshot handed from a subtask to the asynchronous writer.
#[derive(Debug)]
pub struct WriteJob {
    /// Global task index.
    pub task: usize,
    /// Checkpoint.
    pub id: CheckpointId,
    /// File name in the checkpoint directory.
    pub file: String,
    /// The state (shared: a finished subtask answers every later checkpoint with the same).
    pub state: Arc<SubtaskState>,
    /// Timings so far (align, sync).
    pub timing: Timing,
    /// Incremental snapshots: the earlier files this one builds on.
    pub chain: Vec<ChainLink>,
    /// Set by the writer when this task's file could not be written (or builds on one
    /// that was not): the task's next snapshot must be full.
    pub base_lost: Arc<AtomicBool>,
}
