//! The sink subtask loop: write every record of every input; align barriers; pre-commit at
//! each checkpoint and commit when it completes (two-phase commit, see
//! `connectors/file_sink.rs`, `connectors/postgres_sink.rs`).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::checkpoint::alignment::{AlignOutcome, Aligner};
use crate::checkpoint::alignment_timeout::{Step, TimedAligner};
use crate::checkpoint::snapshot::{LoggedBatch, SubtaskState};
use crate::checkpoint::unaligned::UnalignOutcome;
use crate::connectors::file_sink::{FileSink, write_line};
use crate::connectors::kafka::sink::KafkaSink;
use crate::connectors::postgres_sink::{PgSinkError, PostgresSink};
use crate::connectors::throttle::Throttle;
use crate::graph::logical::SinkFormat;
use crate::ids::{CheckpointId, TaskId};
use crate::record::Batch;
use crate::runtime::control::{Control, Timing};
use crate::runtime::error::TaskFailure;
use crate::runtime::input::{Inputs, Received};
use crate::runtime::latency::LatencyRecorder;
use crate::runtime::message::Message;
use crate::runtime::metrics::{NodeMetrics, SubtaskMetrics};
use crate::runtime::participant::{self, Participant};
use crate::runtime::source::kafka_failure;
use crate::runtime::task::{PendingLog, Unaligned};
use crate::runtime::termination::LoopTermination;

/// Where a sink subtask writes.
pub enum SinkWriter {
    /// Transactional part files.
    File(FileSink),
    /// Standard output (not transactional: at-least-once under failures).
    Stdout(SinkFormat),
    /// Nowhere (counts only; with a recorder, also the records' latency).
    Blackhole(Option<LatencyRecorder>),
    /// Rows of a PostgreSQL table, in prepared transactions.
    Postgres(Box<PostgresSink>),
    /// Records of a Kafka topic, in Kafka transactions (or flushed at barriers).
    Kafka(Box<KafkaSink>),
}

impl SinkWriter {
    /// Whether records wait behind a pre-committed transaction, so the next barrier must
    /// wait for its checkpoint's outcome.
    fn must_settle(&self) -> bool {
        match self {
            SinkWriter::Postgres(pg) => pg.must_settle(),
            SinkWriter::Kafka(k) => k.must_settle(),
            _ => false,
        }
    }
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
    /// This subtask's counters (the node's `subtask(i)`).
    pub counters: Arc<SubtaskMetrics>,
    /// Set when the job is being torn down.
    pub cancel: Arc<AtomicBool>,
    /// Checkpointing links (`None`: checkpointing is off).
    pub checkpoints: Option<Participant>,
    /// Records-in-flight accounting (jobs with loops only).
    pub termination: Option<Arc<LoopTermination>>,
    /// Checkpoints aborted before their barrier got here: not pre-committed when it does
    /// (nothing would ever complete or abort that transaction again).
    pub aborted_early: Vec<CheckpointId>,
    /// `rate`: a slow sink.
    pub throttle: Option<Throttle>,
    /// Records in flight at the restored checkpoint (unaligned checkpoints), written first.
    pub replay: Vec<LoggedBatch>,
    /// Aborts seen by `on_control`, for the run loop to apply (unaligned checkpoints).
    pub aborted: Vec<CheckpointId>,
}

fn io_failure(task: &TaskId, what: &str, e: std::io::Error) -> TaskFailure {
    TaskFailure::Connector { task: task.clone(), message: format!("{what} failed: {e}") }
}

/// A PostgreSQL sink's failure: an outage when the database could not be reached.
pub fn pg_failure(task: &TaskId, e: PgSinkError) -> TaskFailure {
    let message = format!("PostgreSQL sink: {e}");
    if e.transient {
        TaskFailure::Unavailable { task: task.clone(), message }
    } else {
        TaskFailure::Connector { task: task.clone(), message }
    }
}

impl SinkTask {
    /// Pre-commits for checkpoint `id`; returns the state to checkpoint.
    fn precommit(writer: &mut SinkWriter, task: &TaskId, id: CheckpointId) -> Result<SubtaskState, TaskFailure> {
        let sink = match writer {
            SinkWriter::File(f) => Some(f.precommit(id).map_err(|e| io_failure(task, "pre-committing output", e))?),
            SinkWriter::Postgres(p) => Some(p.precommit(id).map_err(|e| pg_failure(task, e))?),
            SinkWriter::Kafka(k) => {
                let blob = k.precommit(id).map_err(|e| kafka_failure(task, e))?;
                return Ok(SubtaskState { operator_state: blob, ..Default::default() });
            }
            _ => None,
        };
        Ok(SubtaskState { sink, ..Default::default() })
    }

    fn commit(writer: &mut SinkWriter, task: &TaskId, id: CheckpointId) -> Result<(), TaskFailure> {
        match writer {
            SinkWriter::File(f) => {
                f.commit(id).map_err(|e| io_failure(task, "committing output", e))?;
            }
            SinkWriter::Postgres(p) => {
                p.commit(id).map_err(|e| pg_failure(task, e))?;
            }
            SinkWriter::Kafka(k) => k.commit(id).map_err(|e| kafka_failure(task, e))?,
            _ => {}
        }
        Ok(())
    }

    fn checkpoint(&mut self, id: CheckpointId, align_started: Option<Instant>) -> Result<(), TaskFailure> {
        if let Some(i) = self.aborted_early.iter().position(|a| *a == id) {
            self.aborted_early.drain(..=i);
            return Ok(());
        }
        let align_ms = align_started.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        let t0 = Instant::now();
        let state = Self::precommit(&mut self.writer, &self.id, id)?;
        let sync_ms = t0.elapsed().as_secs_f64() * 1e3;
        if let Some(p) = self.checkpoints.as_mut() {
            p.submit(id, state, Timing { align_ms, sync_ms, async_ms: 0.0 });
        }
        Ok(())
    }

    /// Handles a control message; returns whether it was `Stop` (stop with savepoint: the
    /// savepoint's output is committed, its `Complete` came first; anything after its barrier
    /// stays uncommitted).
    fn on_control(
        &mut self,
        c: Control,
        aligner: &mut Aligner,
        align_started: &mut Option<Instant>,
    ) -> Result<bool, TaskFailure> {
        match c {
            Control::Trigger(id) => {
                if let Some(p) = self.checkpoints.as_mut() {
                    p.on_trigger(id)
                }
            }
            Control::Complete(id) => {
                if let Some(p) = self.checkpoints.as_mut() {
                    p.completed += 1
                }
                Self::commit(&mut self.writer, &self.id, id)?;
            }
            Control::Abort(id) => {
                if aligner.on_cancel(id) {
                    *align_started = None;
                }
                self.aborted.push(id);
                let seen = match &mut self.writer {
                    SinkWriter::Postgres(pg) => pg.abort(id).map_err(|e| pg_failure(&self.id, e))?,
                    SinkWriter::Kafka(k) => k.abort(id).map_err(|e| kafka_failure(&self.id, e))?,
                    _ => true,
                };
                // Not pre-committed here yet: its barrier may still be on its way.
                if !seen {
                    self.aborted_early.push(id);
                    let n = self.aborted_early.len();
                    self.aborted_early.drain(..n.saturating_sub(16));
                }
            }
            Control::Stop => return Ok(true),
            Control::Shutdown
            | Control::SuspendAfter(_)
            | Control::PrepareUpgrade { .. }
            | Control::FullSnapshot(_)
            | Control::UpgradeDecision { .. } => {}
            Control::Query(q) => q.answer(Err("only operators keep state that can be queried".into())),
        }
        Ok(false)
    }

    /// A sink whose records wait behind a pre-committed transaction: handles control
    /// messages until that transaction's checkpoint completes or aborts (the coordinator
    /// decides either way; the sink has acknowledged it). Returns whether `Stop` arrived.
    fn settle(&mut self, aligner: &mut Aligner, align_started: &mut Option<Instant>) -> Result<bool, TaskFailure> {
        loop {
            let Some(control) = self.checkpoints.as_ref().map(|p| p.control.clone()) else { return Ok(false) };
            if !self.writer.must_settle() {
                return Ok(false);
            }
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskFailure::Cancelled { task: self.id.clone() });
            }
            match control.recv_timeout(Duration::from_millis(50)) {
                Ok(c) => {
                    if self.on_control(c, aligner, align_started)? {
                        return Ok(true);
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(TaskFailure::Disconnected { task: self.id.clone() });
                }
            }
        }
    }

    /// Runs the sink to the end of its inputs (and, with checkpointing, until the job's final
    /// checkpoint is complete and committed).
    pub fn run(mut self) -> Result<(), TaskFailure> {
        let r = self.run_inner();
        if let SinkWriter::Blackhole(Some(l)) = &self.writer {
            let mut m = self.metrics.latency.lock().unwrap_or_else(|e| e.into_inner());
            m.get_or_insert_with(Default::default).merge(&l.histogram);
        }
        r
    }

    /// Writes a batch that came from `input` (`None`: replayed from a checkpoint).
    fn write(&mut self, input: Option<usize>, batch: &Batch) -> Result<(), TaskFailure> {
        match &mut self.writer {
            SinkWriter::File(f) => {
                for r in batch.iter() {
                    f.write(r).map_err(|e| io_failure(&self.id, "writing output", e))?;
                }
            }
            SinkWriter::Stdout(format) => {
                let stdout = std::io::stdout();
                let mut lock = stdout.lock();
                for r in batch.iter() {
                    write_line(&mut lock, *format, r).map_err(|e| io_failure(&self.id, "writing output", e))?;
                }
                let _ = lock.flush();
            }
            SinkWriter::Postgres(p) => {
                let origin = input.and_then(|i| self.inputs.origin(i));
                let name = |i: u32| {
                    let rec = batch.iter().nth(i as usize).expect("an index of the batch");
                    crate::runtime::failed_record::describe(i, &rec, origin)
                };
                p.write(batch, name).map_err(|e| pg_failure(&self.id, e))?;
            }
            SinkWriter::Kafka(k) => k.write(batch).map_err(|e| kafka_failure(&self.id, e))?,
            SinkWriter::Blackhole(None) => {}
            SinkWriter::Blackhole(Some(l)) => l.record_batch(batch.iter().map(|r| r.timestamp)),
        }
        Ok(())
    }

    /// Carries out an unaligned checkpoint's decision on a barrier delivered on `input`;
    /// returns whether `Stop` arrived meanwhile.
    fn unaligned_outcome(
        &mut self,
        un: &mut Unaligned,
        input: Option<usize>,
        o: UnalignOutcome,
        aligner: &mut Aligner,
        align_started: &mut Option<Instant>,
    ) -> Result<bool, TaskFailure> {
        let complete = match o {
            UnalignOutcome::Obsolete => return Ok(false),
            UnalignOutcome::Delivered { complete } => complete,
            UnalignOutcome::Start { id, declined, complete } => {
                Unaligned::decline(declined, id, self.checkpoints.as_mut());
                if self.settle(aligner, align_started)? {
                    return Ok(true);
                }
                if let Some(i) = self.aborted_early.iter().position(|a| *a == id) {
                    // Aborted before its barrier got here: nothing to pre-commit or log.
                    self.aborted_early.drain(..=i);
                    un.t.on_cancel(id);
                    return Ok(false);
                }
                let t0 = Instant::now();
                let state = Self::precommit(&mut self.writer, &self.id, id)?;
                let align_ms = un.opened().1;
                let timing = Timing { align_ms, sync_ms: t0.elapsed().as_secs_f64() * 1e3, async_ms: 0.0 };
                un.pending = Some(PendingLog::new(id, state, timing));
                complete
            }
        };
        if let (Some(p), Some(input)) = (un.pending.as_mut(), input) {
            for b in self.inputs.front_batches(input) {
                p.log(0, b);
            }
        }
        if complete {
            self.finish_unaligned(un);
        }
        Ok(false)
    }

    /// Every input delivered the open unaligned checkpoint's barrier: the pre-committed state
    /// and the records in flight go to the writer.
    fn finish_unaligned(&mut self, un: &mut Unaligned) {
        un.finish(&self.metrics, self.checkpoints.as_mut());
    }

    /// Carries out, in order, what `event` (fed to the task's checkpoint state machine) asks
    /// for, if barriers overtake records here; returns whether `Stop` arrived meanwhile.
    fn unaligned_steps(
        &mut self,
        una: &mut Option<Unaligned>,
        aligner: &mut Aligner,
        align_started: &mut Option<Instant>,
        event: impl FnOnce(&mut TimedAligner, &Inputs) -> Vec<Step>,
    ) -> Result<bool, TaskFailure> {
        let Some(mut un) = una.take() else { return Ok(false) };
        let steps = event(&mut un.t, &self.inputs);
        let r = self.run_steps(&mut un, steps, aligner, align_started);
        *una = Some(un);
        r
    }

    fn run_steps(
        &mut self,
        un: &mut Unaligned,
        steps: Vec<Step>,
        aligner: &mut Aligner,
        align_started: &mut Option<Instant>,
    ) -> Result<bool, TaskFailure> {
        for s in steps {
            match s {
                Step::Unalign(input, o) => {
                    if self.unaligned_outcome(un, input, o, aligner, align_started)? {
                        return Ok(true);
                    }
                }
                Step::Decline { old, new } => un.give_up(old, new, self.checkpoints.as_mut()),
                Step::Complete => self.finish_unaligned(un),
            }
        }
        Ok(false)
    }

    fn run_inner(&mut self) -> Result<(), TaskFailure> {
        // Records in flight at the restored checkpoint are written first.
        for lb in std::mem::take(&mut self.replay) {
            let batch = Batch::from_validated(lb.bytes, lb.records);
            self.write(None, &batch)?;
            // Counted in flight when the part was built (loops: `local::build_part`).
            if let Some(t) = &self.termination {
                t.account(0, lb.records as u64);
            }
        }
        let mut aligner = Aligner::new(self.inputs.len());
        let mut align_started: Option<Instant> = None;
        let aligned_for = self.inputs.aligned_for();
        let mut una = self.inputs.priority().is_some().then(|| Unaligned::new(self.inputs.len(), aligned_for));
        loop {
            let control = self.checkpoints.as_ref().map(|p| p.control.clone());
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskFailure::Cancelled { task: self.id.clone() });
            }
            for id in self.aborted.drain(..) {
                if let Some(un) = una.as_mut() {
                    un.t.on_cancel(id);
                    un.pending.take_if(|p| p.id == id);
                }
            }
            // A checkpoint aligning here switches to unaligned when its timeout is over.
            if una.as_ref().is_some_and(|u| u.t.is_aligning())
                && self.unaligned_steps(&mut una, &mut aligner, &mut align_started, |t, _| t.poll(Instant::now()))?
            {
                return Ok(());
            }
            let parked = |i: usize| aligner.is_parked(i) || una.as_ref().is_some_and(|u| u.t.is_parked(i));
            let waited = std::time::Instant::now();
            let received = self.inputs.recv(Some(Duration::from_millis(50)), &parked, control.as_ref());
            self.counters.add_idle(waited.elapsed());
            let from = if let Received::Message(i, _) = &received { Some(*i) } else { None };
            match received {
                Received::Idle => {}
                Received::Disconnected => return Err(TaskFailure::Disconnected { task: self.id.clone() }),
                Received::AllDone => break,
                Received::Control(c) => {
                    if self.on_control(c, &mut aligner, &mut align_started)? {
                        return Ok(());
                    }
                }
                Received::Message(input, Message::Data(batch)) => {
                    self.counters.add_in(batch.len() as u64, batch.byte_len() as u64);
                    if let Some(un) = una.as_mut()
                        && un.t.must_log(input)
                        && let Some(p) = un.pending.as_mut()
                    {
                        // In flight across an unaligned checkpoint: its input's barrier has
                        // not come yet.
                        p.log(0, &batch);
                    }
                    if let Some(t) = &mut self.throttle {
                        t.hold(batch.len(), &self.cancel);
                    }
                    self.write(Some(input), &batch)?;
                    if let Some(t) = &self.termination {
                        t.account(0, batch.len() as u64);
                    }
                }
                Received::Marker(input, id, started) => {
                    let marker = |t: &mut TimedAligner, inputs: &Inputs| {
                        t.on_marker(input, id, started, inputs.in_flight(input) == 0, Instant::now())
                    };
                    if self.unaligned_steps(&mut una, &mut aligner, &mut align_started, marker)? {
                        return Ok(());
                    }
                }
                Received::Message(i, Message::EndOfStream) if una.is_some() => {
                    self.inputs.finish(i);
                    let ended = |t: &mut TimedAligner, _: &Inputs| t.on_end_of_stream(i, Instant::now());
                    if self.unaligned_steps(&mut una, &mut aligner, &mut align_started, ended)? {
                        return Ok(());
                    }
                }
                Received::Message(i, Message::Watermark(wm)) => {
                    if let Some(w) = self.inputs.on_watermark(i, wm) {
                        self.counters.set_watermark(w);
                    }
                }
                Received::Message(i, Message::Barrier(id)) => {
                    if let Some((id, started)) =
                        participant::on_barrier(&mut aligner, &mut align_started, self.checkpoints.as_mut(), i, id)
                    {
                        if self.settle(&mut aligner, &mut align_started)? {
                            return Ok(());
                        }
                        self.checkpoint(id, started)?;
                    }
                }
                Received::Message(i, Message::EndOfStream) => {
                    self.inputs.finish(i);
                    if let AlignOutcome::Aligned(id) = aligner.on_end_of_stream(i) {
                        let s = align_started.take();
                        if self.settle(&mut aligner, &mut align_started)? {
                            return Ok(());
                        }
                        self.checkpoint(id, s)?;
                    }
                }
            }
            // The input's records before the aligning checkpoint's barrier are written: it
            // reached the barrier.
            if let Some(i) = from.filter(|&i| self.inputs.in_flight(i) == 0)
                && una.as_ref().is_some_and(|u| u.t.is_aligning())
                && self.unaligned_steps(&mut una, &mut aligner, &mut align_started, |t, _| {
                    t.on_drained(i, Instant::now())
                })?
            {
                return Ok(());
            }
        }
        // Every input ended: barriers from upstream are not taken any more.
        self.inputs.close_priority();
        if self.settle(&mut aligner, &mut align_started)? {
            return Ok(());
        }
        let Some(mut p) = self.checkpoints.take() else {
            match &mut self.writer {
                SinkWriter::File(f) => f.commit_at_end().map_err(|e| io_failure(&self.id, "committing output", e))?,
                SinkWriter::Postgres(pg) => pg.commit_at_end().map_err(|e| pg_failure(&self.id, e))?,
                SinkWriter::Kafka(k) => k.flush_at_end().map_err(|e| kafka_failure(&self.id, e))?,
                _ => {}
            }
            return Ok(());
        };
        let (id, cancel) = (self.id.clone(), self.cancel.clone());
        let writer = std::cell::RefCell::new(&mut self.writer);
        p.finish(
            &id,
            &cancel,
            |c| Self::precommit(&mut writer.borrow_mut(), &id, c).map(Arc::new),
            |c| Self::commit(&mut writer.borrow_mut(), &id, c),
        )
    }
}
