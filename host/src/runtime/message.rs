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

/// An unaligned checkpoint's barrier on its way to one input of a subtask, ahead of the
/// records queued on that input's channel (`checkpoint/unaligned.rs`).
///
/// The sender took its snapshot after putting `sent` messages into the channel; `carried`
/// are the messages it had produced by then but not yet put in (its pending batch and
/// what a full channel held back), handed over with the barrier instead. So the records in
/// flight across the snapshot are the channel's messages up to number `sent` that the
/// receiver has not taken yet, then `carried`, in that order.
#[derive(Debug)]
pub struct Priority {
    /// The receiver's input index.
    pub input: usize,
    /// The checkpoint.
    pub id: CheckpointId,
    /// Messages put into the channel before the snapshot (counted from the channel's start).
    pub sent: u64,
    /// Messages produced before the snapshot that never enter the channel.
    pub carried: Vec<Message>,
    /// When the checkpoint was triggered (its alignment timeout counts from there).
    pub started: std::time::Instant,
}
