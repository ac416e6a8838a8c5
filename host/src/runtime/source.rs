//! The source subtask loop: read a batch from the connector, route it, repeat; then end of
//! stream on every output.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::connectors::file_source::{FileSource, FileSourceError};
use crate::connectors::generator::Generator;
use crate::ids::TaskId;
use crate::runtime::error::TaskFailure;
use crate::runtime::message::Message;
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::output::Output;

/// The connector behind a source subtask.
pub enum SourceReader {
    /// Deterministic generator.
    Generator(Generator),
    /// Text file lines.
    File(FileSource),
}

/// Everything a source subtask needs.
pub struct SourceTask {
    /// Who.
    pub id: TaskId,
    /// The connector.
    pub reader: SourceReader,
    /// Output edges.
    pub output: Output,
    /// Records per batch.
    pub batch_size: u32,
    /// Counters of the node.
    pub metrics: Arc<NodeMetrics>,
    /// Set when the job is being torn down.
    pub cancel: Arc<AtomicBool>,
}

/// Generator sources emit a watermark every this many batches.
const WATERMARK_EVERY: u32 = 16;

impl SourceTask {
    /// Runs the source to exhaustion.
    pub fn run(mut self) -> Result<(), TaskFailure> {
        let disconnected = |id: &TaskId| TaskFailure::Disconnected { task: id.clone() };
        let mut batches = 0u32;
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskFailure::Cancelled {
                    task: self.id.clone(),
                });
            }
            let n = match &mut self.reader {
                SourceReader::Generator(g) => g
                    .emit(self.batch_size, &mut self.output)
                    .map_err(|_| disconnected(&self.id))?,
                SourceReader::File(f) => {
                    f.emit(self.batch_size, &mut self.output)
                        .map_err(|e| match e {
                            FileSourceError::Io(e) => TaskFailure::Connector {
                                task: self.id.clone(),
                                message: format!("reading the input failed: {e}"),
                            },
                            FileSourceError::Disconnected(_) => disconnected(&self.id),
                        })?
                }
            };
            if n == 0 {
                break;
            }
            self.metrics.add_out(n as u64);
            batches += 1;
            if let SourceReader::Generator(g) = &self.reader
                && batches.is_multiple_of(WATERMARK_EVERY)
            {
                let wm = g.last_timestamp();
                self.output
                    .broadcast(|| Message::Watermark(wm))
                    .map_err(|_| disconnected(&self.id))?;
            }
        }
        self.output
            .broadcast(|| Message::EndOfStream)
            .map_err(|_| disconnected(&self.id))?;
        Ok(())
    }
}
