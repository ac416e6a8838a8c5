//! The sink subtask loop: write every record of every input; commit at the end.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::connectors::file_sink::{FileSink, write_line};
use crate::graph::logical::SinkFormat;
use crate::ids::TaskId;
use crate::runtime::error::TaskFailure;
use crate::runtime::input::{Inputs, Received};
use crate::runtime::message::Message;
use crate::runtime::metrics::NodeMetrics;

/// Where a sink subtask writes.
pub enum SinkWriter {
    /// Part files.
    File(FileSink),
    /// Standard output.
    Stdout(SinkFormat),
    /// Nowhere (counts only).
    Blackhole,
}

/// Everything a sink subtask needs.
pub struct SinkTask {
    /// Who.
    pub id: TaskId,
    /// The connector.
    pub writer: SinkWriter,
    /// Input channels.
    pub inputs: Inputs,
    /// Counters of the node.
    pub metrics: Arc<NodeMetrics>,
    /// Set when the job is being torn down.
    pub cancel: Arc<AtomicBool>,
}

impl SinkTask {
    fn io(&self, e: std::io::Error) -> TaskFailure {
        TaskFailure::Connector {
            task: self.id.clone(),
            message: format!("writing output failed: {e}"),
        }
    }

    /// Runs the sink to the end of its inputs.
    pub fn run(mut self) -> Result<(), TaskFailure> {
        let stdout = std::io::stdout();
        loop {
            match self.inputs.recv(Some(Duration::from_millis(50))) {
                Received::Idle => {
                    if self.cancel.load(Ordering::Relaxed) {
                        return Err(TaskFailure::Cancelled {
                            task: self.id.clone(),
                        });
                    }
                }
                Received::Disconnected => {
                    return Err(TaskFailure::Disconnected {
                        task: self.id.clone(),
                    });
                }
                Received::AllDone => break,
                Received::Message(_, Message::Data(batch)) => {
                    self.metrics.add_in(batch.len() as u64);
                    match &mut self.writer {
                        SinkWriter::File(f) => {
                            for r in batch.iter() {
                                if let Err(e) = f.write(r) {
                                    return Err(self.io(e));
                                }
                            }
                        }
                        SinkWriter::Stdout(format) => {
                            let mut lock = stdout.lock();
                            for r in batch.iter() {
                                if let Err(e) = write_line(&mut lock, *format, r) {
                                    return Err(self.io(e));
                                }
                            }
                            let _ = lock.flush();
                        }
                        SinkWriter::Blackhole => {}
                    }
                }
                Received::Message(_, Message::Watermark(_)) => {}
                Received::Message(i, Message::EndOfStream) => self.inputs.finish(i),
            }
        }
        if let SinkWriter::File(f) = std::mem::replace(&mut self.writer, SinkWriter::Blackhole) {
            f.commit().map_err(|e| self.io(e))?;
        }
        Ok(())
    }
}
