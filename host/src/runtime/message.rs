//! What flows through a channel between two subtasks.

use crate::ids::CheckpointId;
use crate::record::Batch;

/// One message on a channel. Channels are FIFO, so a message never overtakes another.
#[derive(Debug)]
pub enum Message {
    /// A batch of records.
    Data(Batch),
    /// Event time progressed on this channel: no later record has a smaller timestamp.
    Watermark(i64),
    /// Checkpoint barrier: everything before it on this channel belongs to the checkpoint.
    Barrier(CheckpointId),
    /// The upstream subtask finished; nothing follows on this channel.
    EndOfStream,
}
