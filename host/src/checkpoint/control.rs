//! Messages between the checkpoint coordinator and the subtasks (outside the data channels).

use crate::checkpoint::snapshot::SubtaskState;
use crate::ids::CheckpointId;

/// Coordinator → subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// Timings of one subtask's part of a checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// First barrier to last (multi-input tasks).
    pub align_ms: f64,
    /// Synchronous part: guest snapshot export and capture.
    pub sync_ms: f64,
    /// Asynchronous part: serialize, write, fsync.
    pub async_ms: f64,
}

/// A subtask's acknowledgement: where its state went.
#[derive(Debug, Clone, PartialEq)]
pub struct Ack {
    /// File name in the checkpoint directory.
    pub file: String,
    /// Size.
    pub bytes: u64,
    /// CRC-32 of the body.
    pub crc32: u32,
    /// Timings.
    pub timing: Timing,
    /// Loop heads: records in transit on back-edges, logged into this state.
    pub logged_records: u64,
    /// Their size.
    pub logged_bytes: u64,
}

/// Subtask → coordinator.
#[derive(Debug)]
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
    /// The state.
    pub state: SubtaskState,
    /// Timings so far (align, sync).
    pub timing: Timing,
}
