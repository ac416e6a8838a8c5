//! The source subtask loop: read a batch from the connector, route it, repeat; between
//! batches, answer checkpoint triggers by recording the position and injecting the barrier.
//!
//! Invariant: the recorded position is exactly the first record after the barrier, so a
//! restore rewinds to it and nothing is skipped or read twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::checkpoint::snapshot::{SourcePosition, SubtaskState};
use crate::connectors::file_source::{FileSource, FileSourceError};
use crate::connectors::generator::Generator;
use crate::connectors::kafka::source::{KafkaReader, KafkaSourceError};
use crate::connectors::nexmark::NexmarkSource;
use crate::ids::TaskId;
use crate::runtime::control::{Control, Timing};
use crate::runtime::error::TaskFailure;
use crate::runtime::message::Message;
use crate::runtime::metrics::{NodeMetrics, SubtaskMetrics};
use crate::runtime::output::{Drained, Output};
use crate::runtime::participant::Participant;
use crate::runtime::termination::LoopTermination;

/// The connector behind a source subtask.
pub enum SourceReader {
    /// Deterministic generator.
    Generator(Generator),
    /// Text file lines.
    File(FileSource),
    /// Kafka partitions (positioned at open).
    Kafka(Box<KafkaReader>),
    /// Nexmark events.
    Nexmark(NexmarkSource),
}

impl SourceReader {
    /// Where the next record comes from.
    pub fn position(&self) -> SourcePosition {
        match self {
            SourceReader::Generator(g) => SourcePosition::Generator { next: g.position() },
            SourceReader::File(f) => {
                let (offset, line) = f.position();
                match f.watermark_state() {
                    None => SourcePosition::File { offset, line },
                    Some((max_timestamp, watermark)) => {
                        SourcePosition::TimedFile { offset, line, max_timestamp, watermark }
                    }
                }
            }
            SourceReader::Kafka(k) => SourcePosition::Kafka { partitions: k.position() },
            SourceReader::Nexmark(x) => SourcePosition::Nexmark { next: x.position() },
        }
    }

    /// Rewinds to `pos`.
    pub fn seek(&mut self, pos: SourcePosition) -> Result<(), String> {
        match (self, pos) {
            (SourceReader::Generator(g), SourcePosition::Generator { next }) => {
                g.seek(next);
                Ok(())
            }
            (SourceReader::File(f), SourcePosition::File { offset, line }) => {
                f.seek(offset, line).map_err(|e| format!("cannot seek the input to byte {offset}: {e}"))
            }
            (SourceReader::File(f), SourcePosition::TimedFile { offset, line, max_timestamp, watermark }) => {
                f.seek(offset, line).map_err(|e| format!("cannot seek the input to byte {offset}: {e}"))?;
                f.restore_watermark(max_timestamp, watermark);
                Ok(())
            }
            (SourceReader::Nexmark(x), SourcePosition::Nexmark { next }) => {
                x.seek(next);
                Ok(())
            }
            (_, pos) => Err(format!("the checkpoint holds a position of another source type: {pos:?}")),
        }
    }
}

/// A Kafka connector's failure: an outage when the broker could not be reached.
pub fn kafka_failure(task: &TaskId, e: crate::connectors::kafka::KafkaError) -> TaskFailure {
    let message = format!("Kafka: {e}");
    if e.transient {
        TaskFailure::Unavailable { task: task.clone(), message }
    } else {
        TaskFailure::Connector { task: task.clone(), message }
    }
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
    /// This subtask's counters (the node's `subtask(i)`).
    pub counters: Arc<SubtaskMetrics>,
    /// Set when the job is being torn down.
    pub cancel: Arc<AtomicBool>,
    /// Checkpointing links (`None`: checkpointing is off).
    pub checkpoints: Option<Participant>,
    /// Records-in-flight accounting (jobs with loops only).
    pub termination: Option<Arc<LoopTermination>>,
    /// Stop emitting after the barrier of this savepoint.
    pub suspend_after: Option<crate::ids::CheckpointId>,
    /// Suspended after a stop-with-savepoint barrier.
    pub suspended: bool,
    /// Failure injection (tests): the end of input waits for the attempt's planned faults.
    pub faults: Option<crate::runtime::task::Faults>,
    /// Tests: the end of input waits while this is set.
    pub hold_input: Option<Arc<AtomicBool>>,
}

/// Whether the source goes on.
enum Flow {
    Go,
    Stop,
}

/// Generator sources emit a watermark every this many batches.
const WATERMARK_EVERY: u32 = 16;

impl SourceTask {
    fn disconnected(&self) -> TaskFailure {
        TaskFailure::Disconnected { task: self.id.clone() }
    }

    fn state(&self) -> SubtaskState {
        SubtaskState { source: Some(self.reader.position()), ..Default::default() }
    }

    /// Handles one coordinator message: a trigger records the position and injects the
    /// barrier (and suspends the source after a stop-with-savepoint barrier).
    fn on_control(&mut self, c: Control) -> Result<Flow, TaskFailure> {
        let Some(p) = self.checkpoints.as_mut() else { return Ok(Flow::Go) };
        match c {
            Control::Trigger(id) => {
                let state = self.state();
                if let (SourceReader::Kafka(k), Some(SourcePosition::Kafka { partitions })) =
                    (&mut self.reader, &state.source)
                {
                    k.on_barrier(id.0, partitions.clone());
                }
                if self.output.is_unaligned() {
                    // Ahead of everything queued, carrying what waits for room.
                    self.output.unaligned_barrier(id, std::time::Instant::now());
                } else {
                    self.output.broadcast(|| Message::Barrier(id)).map_err(|_| self.disconnected())?;
                    self.output.flush().map_err(|_| self.disconnected())?;
                }
                if let Some(p) = self.checkpoints.as_mut() {
                    p.submit(id, state, Timing::default());
                }
                if self.suspend_after == Some(id) {
                    self.suspended = true;
                }
            }
            Control::Complete(id) => {
                p.completed += 1;
                if let SourceReader::Kafka(k) = &mut self.reader {
                    k.on_complete(id.0);
                }
            }
            Control::SuspendAfter(id) => self.suspend_after = Some(id),
            Control::Abort(id) => {
                if self.suspend_after == Some(id) {
                    // The stop's savepoint failed: the job goes on.
                    self.suspend_after = None;
                    self.suspended = false;
                }
            }
            Control::Stop => return Ok(Flow::Stop),
            Control::Shutdown
            | Control::PrepareUpgrade { .. }
            | Control::FullSnapshot(_)
            | Control::UpgradeDecision { .. } => {}
            Control::Query(q) => q.answer(Err("only operators keep state that can be queried".into())),
        }
        Ok(Flow::Go)
    }

    /// Answers pending coordinator messages; while suspended (stop with savepoint), waits
    /// for the stop or for the savepoint's abort.
    fn poll_control(&mut self) -> Result<Flow, TaskFailure> {
        loop {
            let Some(p) = self.checkpoints.as_mut() else { return Ok(Flow::Go) };
            let c = if self.suspended {
                match p.control.recv_timeout(std::time::Duration::from_millis(50)) {
                    Ok(c) => c,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if self.cancel.load(Ordering::Relaxed) {
                            return Err(TaskFailure::Cancelled { task: self.id.clone() });
                        }
                        continue;
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        return Err(TaskFailure::Cancelled { task: self.id.clone() });
                    }
                }
            } else {
                let Ok(c) = p.control.try_recv() else { return Ok(Flow::Go) };
                c
            };
            if let Flow::Stop = self.on_control(c)? {
                return Ok(Flow::Stop);
            }
        }
    }

    /// Tests: the input ends only after every fault planned for this attempt fired (the
    /// failure cancels the attempt; see `runtime::faults`) and while the test holds it;
    /// meanwhile checkpoints, savepoints and stops go on.
    fn hold_end_of_input(&mut self) -> Result<Flow, TaskFailure> {
        let faults = self.faults.clone();
        let gate = self.hold_input.clone();
        let held = || {
            faults.as_ref().is_some_and(|f| f.plan.holds_input(f.attempt))
                || gate.as_ref().is_some_and(|g| g.load(Ordering::Acquire))
        };
        while held() {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskFailure::Cancelled { task: self.id.clone() });
            }
            if let Flow::Stop = self.poll_control()? {
                return Ok(Flow::Stop);
            }
            self.output.flush().map_err(|_| self.disconnected())?;
            if let Flow::Stop = self.drain_output()? {
                return Ok(Flow::Stop);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Ok(Flow::Go)
    }

    /// Waits until the output held back for room has gone out (unaligned checkpoints),
    /// answering coordinator messages meanwhile: a trigger's barrier overtakes it.
    fn drain_output(&mut self) -> Result<Flow, TaskFailure> {
        while self.output.blocked() {
            let control = self.checkpoints.as_ref().map(|p| p.control.clone());
            let got = self
                .output
                .drain(None, control.as_ref(), std::time::Duration::from_millis(50))
                .map_err(|_| self.disconnected())?;
            match got {
                Drained::Control(c) => {
                    if let Flow::Stop = self.on_control(c)? {
                        return Ok(Flow::Stop);
                    }
                }
                Drained::Timeout if self.cancel.load(Ordering::Relaxed) => {
                    return Err(TaskFailure::Cancelled { task: self.id.clone() });
                }
                Drained::Timeout | Drained::Progress | Drained::Priority(_) | Drained::InboxClosed => {}
            }
        }
        Ok(Flow::Go)
    }

    /// A watermark the file or Nexmark reader has moved to since it was last asked.
    fn reader_watermark(&mut self) -> Option<i64> {
        match &mut self.reader {
            SourceReader::File(f) => f.watermark(),
            SourceReader::Nexmark(x) => x.watermark(),
            _ => None,
        }
    }

    /// Runs the source to exhaustion (and, with checkpointing, until the job's final
    /// checkpoint is complete).
    pub fn run(mut self) -> Result<(), TaskFailure> {
        let mut batches = 0u32;
        // A restored watermark goes out before any record.
        if let Some(wm) = self.reader_watermark() {
            self.output.broadcast(|| Message::Watermark(wm)).map_err(|_| self.disconnected())?;
        }
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskFailure::Cancelled { task: self.id.clone() });
            }
            if let Flow::Stop = self.poll_control()? {
                return Ok(());
            }
            let n = match &mut self.reader {
                SourceReader::Generator(g) => g
                    .emit(self.batch_size, &mut self.output)
                    .map_err(|_| TaskFailure::Disconnected { task: self.id.clone() })?,
                SourceReader::File(f) => f.emit(self.batch_size, &mut self.output).map_err(|e| match e {
                    FileSourceError::Io(e) => TaskFailure::Connector {
                        task: self.id.clone(),
                        message: format!("reading the input failed: {e}"),
                    },
                    FileSourceError::Disconnected(_) => TaskFailure::Disconnected { task: self.id.clone() },
                    FileSourceError::Timestamp(message) => TaskFailure::Connector { task: self.id.clone(), message },
                })?,
                SourceReader::Nexmark(x) => x
                    .emit(self.batch_size, &mut self.output)
                    .map_err(|_| TaskFailure::Disconnected { task: self.id.clone() })?,
                SourceReader::Kafka(k) => {
                    let n = k.emit(self.batch_size, &mut self.output).map_err(|e| match e {
                        KafkaSourceError::Kafka(e) => kafka_failure(&self.id, e),
                        KafkaSourceError::Disconnected(_) => TaskFailure::Disconnected { task: self.id.clone() },
                    })?;
                    // Idle partitions move the watermark without records.
                    if let Some(wm) = k.watermark() {
                        self.output.broadcast(|| Message::Watermark(wm)).map_err(|_| self.disconnected())?;
                    }
                    n
                }
            };
            if let Some(t) = &self.termination {
                t.account(self.output.take_copies(), 0);
            }
            if let Flow::Stop = self.drain_output()? {
                return Ok(());
            }
            let Some(n) = n else { break };
            if n == 0 {
                continue;
            }
            self.counters.add_out(n as u64, 0);
            batches += 1;
            if let Some(wm) = self.reader_watermark() {
                self.output.broadcast(|| Message::Watermark(wm)).map_err(|_| self.disconnected())?;
            }
            if let SourceReader::Generator(g) = &self.reader
                && batches.is_multiple_of(WATERMARK_EVERY)
            {
                let wm = g.last_timestamp();
                self.output.broadcast(|| Message::Watermark(wm)).map_err(|_| self.disconnected())?;
            }
        }
        if let Flow::Stop = self.hold_end_of_input()? {
            return Ok(());
        }
        if let Flow::Stop = self.poll_control()? {
            return Ok(());
        }
        self.output.broadcast(|| Message::EndOfStream).map_err(|_| self.disconnected())?;
        if let Flow::Stop = self.drain_output()? {
            return Ok(());
        }
        if let Some(t) = &self.termination {
            t.source_finished();
        }
        let Some(mut p) = self.checkpoints.take() else { return Ok(()) };
        let final_state = std::sync::Arc::new(self.state());
        let (id, cancel) = (self.id.clone(), self.cancel.clone());
        let reader = std::cell::RefCell::new(&mut self.reader);
        let output = std::cell::RefCell::new(&mut self.output);
        let state = |c: crate::ids::CheckpointId| {
            // Unaligned checkpoints: the barrier overtakes the output still queued, so the
            // subtasks downstream need not wait for it to drain (one that ended takes none).
            let mut out = output.borrow_mut();
            if out.is_unaligned() {
                out.unaligned_barrier(c, std::time::Instant::now());
            }
            if let (SourceReader::Kafka(k), Some(SourcePosition::Kafka { partitions })) =
                (&mut **reader.borrow_mut(), &final_state.source)
            {
                k.on_barrier(c.0, partitions.clone());
            }
            Ok(final_state.clone())
        };
        // The final checkpoints' offsets reach the Kafka consumer group too.
        let complete = |c: crate::ids::CheckpointId| {
            if let SourceReader::Kafka(k) = &mut **reader.borrow_mut() {
                k.on_complete(c.0);
            }
            Ok(())
        };
        p.finish(&id, &cancel, state, complete)
    }
}
