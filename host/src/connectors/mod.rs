//! Host-native sources and sinks.

pub mod file_sink;
pub mod file_source;
pub mod generator;
pub mod kafka;
pub mod nexmark;
pub mod postgres_sink;
pub mod throttle;

use crate::record::RecordRef;

/// The downstream side is gone (its task stopped): the job is being torn down.
#[derive(Debug)]
pub struct Disconnected;

/// Where a source puts what it reads: the subtask's output (`runtime/output.rs`), which
/// partitions records into batches and blocks when a channel is full. Sources are generic
/// over it, so they know nothing of channels and the call is inlined.
pub trait Emit {
    /// Routes one record emitted on port `rec.tag`.
    fn emit(&mut self, rec: RecordRef<'_>) -> Result<(), Disconnected>;
    /// Sends every pending batch.
    fn flush(&mut self) -> Result<(), Disconnected>;
}
