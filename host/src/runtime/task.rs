//! The operator subtask loop: read a batch, call the guest once, route what it emitted;
//! align barriers, snapshot, forward them.
//!
//! Invariants: the guest is called from this thread only, one call at a time; pending
//! output is flushed whenever the inputs are idle (a latency bound without timers) and
//! before any control message is forwarded; at an aligned barrier the barrier is forwarded
//! and the guest state captured before any further record is processed (ABS Algorithm 1);
//! end of stream goes downstream only after `close` and the final flush.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::checkpoint::alignment::{AlignOutcome, Aligner};
use crate::checkpoint::control::{Control, Timing};
use crate::checkpoint::snapshot::{KeyGroupSnapshot, SubtaskState};
use crate::ids::{CheckpointId, TaskId};
use crate::operator::OperatorLogic;
use crate::record::{Batch, NO_KEY_GROUP};
use crate::runtime::error::TaskFailure;
use crate::runtime::faults::{FaultKind, FaultPlan};
use crate::runtime::input::{Inputs, Received};
use crate::runtime::message::Message;
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::output::{Disconnected, Output};
use crate::runtime::participant::Participant;
use crate::sandbox::bindings::types::{KeyGroupState, OperatorSnapshot, SnapshotMode, TimeDomain};
use crate::sandbox::instance::GuestError;

/// State to restore before the first record.
pub struct Restore {
    /// The state schema version it was written with.
    pub schema_version: u32,
    /// The state.
    pub state: SubtaskState,
}

/// Failure injection for this subtask.
pub struct Faults {
    /// The plan.
    pub plan: Arc<FaultPlan>,
    /// Which attempt of the run this is.
    pub attempt: u32,
}

/// Everything an operator subtask needs.
pub struct OperatorTask {
    /// Who.
    pub id: TaskId,
    /// The guest.
    pub instance: Box<dyn OperatorLogic>,
    /// Its `config` table.
    pub config: Vec<(String, String)>,
    /// Input channels.
    pub inputs: Inputs,
    /// Output edges.
    pub output: Output,
    /// Counters of the node.
    pub metrics: Arc<NodeMetrics>,
    /// Set when the job is being torn down.
    pub cancel: Arc<AtomicBool>,
    /// Checkpointing links (`None`: checkpointing is off).
    pub checkpoints: Option<Participant>,
    /// State to restore.
    pub restore: Option<Restore>,
    /// Failure injection (tests).
    pub faults: Option<Faults>,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Converts a guest snapshot plus the host's timers into a subtask's checkpoint state.
pub fn capture(instance: &mut dyn OperatorLogic, snap: OperatorSnapshot) -> SubtaskState {
    let mut groups: std::collections::BTreeMap<u32, KeyGroupSnapshot> = snap
        .keyed
        .into_iter()
        .map(|k| {
            let s = KeyGroupSnapshot {
                key_group: k.key_group,
                data: k.data,
                event_timers: vec![],
                processing_timers: vec![],
            };
            (k.key_group, s)
        })
        .collect();
    let empty = |kg| KeyGroupSnapshot { key_group: kg, data: vec![], event_timers: vec![], processing_timers: vec![] };
    let host = instance.host();
    for (kg, t) in host.event_timers.by_key_group() {
        groups.entry(kg).or_insert_with(|| empty(kg)).event_timers = t;
    }
    for (kg, t) in host.processing_timers.by_key_group() {
        groups.entry(kg).or_insert_with(|| empty(kg)).processing_timers = t;
    }
    SubtaskState {
        keyed: groups.into_values().collect(),
        operator_state: snap.operator_state,
        source: None,
        sink: None,
    }
}

impl OperatorTask {
    fn guest(&self, e: GuestError) -> TaskFailure {
        TaskFailure::Guest { task: self.id.clone(), source: e }
    }

    fn disconnected(&self, _: Disconnected) -> TaskFailure {
        TaskFailure::Disconnected { task: self.id.clone() }
    }

    /// Routes what the guest emitted in its last call.
    fn route_emitted(&mut self) -> Result<(), TaskFailure> {
        let out = self.instance.take_emitted();
        if !out.is_empty() {
            self.metrics.add_out(out.len() as u64);
            self.output.emit_batch(&out).map_err(|d| self.disconnected(d))?;
        }
        Ok(())
    }

    /// Fires due timers of `domain` at `now`, repeatedly (a timer may register another due one).
    fn fire_timers(&mut self, domain: TimeDomain, now: i64) -> Result<(), TaskFailure> {
        loop {
            let host = self.instance.host();
            let due = match domain {
                TimeDomain::EventTime => host.event_timers.pop_due(now),
                TimeDomain::ProcessingTime => host.processing_timers.pop_due(now),
            };
            if due.is_empty() {
                return Ok(());
            }
            self.instance.on_timer(domain, &due).map_err(|e| self.guest(e))?;
            self.route_emitted()?;
        }
    }

    fn advance_watermark(&mut self, wm: i64) -> Result<(), TaskFailure> {
        self.instance.host().watermark = wm;
        self.fire_timers(TimeDomain::EventTime, wm)?;
        self.instance.on_watermark(wm).map_err(|e| self.guest(e))?;
        self.route_emitted()?;
        if wm != i64::MAX {
            self.output.broadcast(|| Message::Watermark(wm)).map_err(|d| self.disconnected(d))?;
        }
        Ok(())
    }

    fn restore_state(&mut self) -> Result<(), TaskFailure> {
        let Some(r) = self.restore.take() else { return Ok(()) };
        let snap = OperatorSnapshot {
            keyed: r
                .state
                .keyed
                .iter()
                .filter(|k| !k.data.is_empty())
                .map(|k| KeyGroupState { key_group: k.key_group, data: k.data.clone() })
                .collect(),
            operator_state: r.state.operator_state,
        };
        self.instance.restore(r.schema_version, &snap).map_err(|e| self.guest(e))?;
        let host = self.instance.host();
        for k in &r.state.keyed {
            for (t, key) in &k.event_timers {
                host.event_timers.register(*t, k.key_group, key);
            }
            for (t, key) in &k.processing_timers {
                host.processing_timers.register(*t, k.key_group, key);
            }
        }
        Ok(())
    }

    fn snapshot_state(&mut self, id: CheckpointId) -> Result<SubtaskState, TaskFailure> {
        let snap = self.instance.snapshot(id.0, SnapshotMode::Full).map_err(|e| self.guest(e))?;
        Ok(capture(self.instance.as_mut(), snap))
    }

    /// An aligned barrier: forward it, capture the state (synchronous part), hand it to the
    /// writer (asynchronous part).
    fn checkpoint(&mut self, id: CheckpointId, align_started: Option<Instant>) -> Result<(), TaskFailure> {
        let align_ms = align_started.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        self.output.broadcast(|| Message::Barrier(id)).map_err(|d| self.disconnected(d))?;
        let t0 = Instant::now();
        let state = self.snapshot_state(id)?;
        let sync_ms = t0.elapsed().as_secs_f64() * 1e3;
        if let Some(p) = self.checkpoints.as_mut() {
            p.submit(id, state, Timing { align_ms, sync_ms, async_ms: 0.0 });
        }
        if let Some(f) = &self.faults {
            let (records, done) = (self.metrics.read().0, self.checkpoints.as_ref().map_or(0, |p| p.completed));
            if f.plan.due_at_barrier(f.attempt, self.id.node.as_str(), self.id.subtask.0, records, done) {
                return Err(TaskFailure::Connector {
                    task: self.id.clone(),
                    message: format!("injected failure during checkpoint {id}"),
                });
            }
        }
        Ok(())
    }

    fn inject_faults(&mut self) -> Result<(), TaskFailure> {
        let Some(f) = &self.faults else { return Ok(()) };
        let (records, done) = (self.metrics.read().0, self.checkpoints.as_ref().map_or(0, |p| p.completed));
        match f.plan.due(f.attempt, self.id.node.as_str(), self.id.subtask.0, records, done) {
            None | Some(FaultKind::DuringCheckpoint) => Ok(()),
            Some(FaultKind::HostPanic) => panic!("injected host panic in {}", self.id),
            Some(FaultKind::GuestTrap) => {
                let kg = self.instance.host().task.key_group_start;
                let tag = if self.instance.host().task.key_group_end > kg { kg } else { NO_KEY_GROUP };
                let mut b = Batch::default();
                b.push(tag, 0, b"__weir_fault__", b"panic");
                self.instance.process(crate::graph::logical::Side::Left, &b).map_err(|e| self.guest(e))?;
                Err(TaskFailure::Connector {
                    task: self.id.clone(),
                    message: "injected guest trap: the guest did not trap on `panic`".into(),
                })
            }
        }
    }

    /// Runs the subtask to the end of its inputs (and, with checkpointing, until the job's
    /// final checkpoint is complete).
    pub fn run(mut self) -> Result<(), TaskFailure> {
        self.instance.open(&self.config).map_err(|e| self.guest(e))?;
        self.restore_state()?;
        let mut aligner = Aligner::new(self.inputs.len());
        let mut align_started: Option<Instant> = None;
        loop {
            let control = self.checkpoints.as_ref().map(|p| p.control.clone());
            let mut received = self.inputs.recv(None, &aligner, control.as_ref());
            if matches!(received, Received::Idle) {
                self.output.flush().map_err(|d| self.disconnected(d))?;
                if !self.instance.host().processing_timers.is_empty() {
                    self.fire_timers(TimeDomain::ProcessingTime, now_ms())?;
                }
                received = self.inputs.recv(Some(Duration::from_millis(50)), &aligner, control.as_ref());
            }
            match received {
                Received::Idle => {
                    if self.cancel.load(Ordering::Relaxed) {
                        return Err(TaskFailure::Cancelled { task: self.id.clone() });
                    }
                }
                Received::Disconnected => return Err(TaskFailure::Disconnected { task: self.id.clone() }),
                Received::AllDone => break,
                Received::Control(c) => match c {
                    Control::Trigger(id) => {
                        if let Some(p) = self.checkpoints.as_mut() {
                            p.on_trigger(id)
                        }
                    }
                    Control::Complete(_) => {
                        if let Some(p) = self.checkpoints.as_mut() {
                            p.completed += 1
                        }
                    }
                    Control::Abort(id) => {
                        if aligner.on_cancel(id) {
                            align_started = None;
                        }
                    }
                    Control::Shutdown => {}
                },
                Received::Message(i, Message::Data(batch)) => {
                    self.metrics.add_in(batch.len() as u64);
                    let side = self.inputs.side(i);
                    self.instance.process(side, &batch).map_err(|e| self.guest(e))?;
                    self.route_emitted()?;
                    self.inject_faults()?;
                }
                Received::Message(i, Message::Watermark(wm)) => {
                    if let Some(wm) = self.inputs.on_watermark(i, wm) {
                        self.advance_watermark(wm)?;
                    }
                }
                Received::Message(i, Message::Barrier(id)) => match aligner.on_barrier(i, id) {
                    AlignOutcome::Park => {
                        align_started.get_or_insert_with(Instant::now);
                    }
                    AlignOutcome::Aligned(id) => {
                        let started = align_started.take();
                        self.checkpoint(id, started)?;
                    }
                    AlignOutcome::Superseded { aborted, started, aligned } => {
                        if let Some(p) = self.checkpoints.as_mut() {
                            p.decline(aborted, format!("barrier {started} arrived while aligning {aborted}"));
                        }
                        align_started = Some(Instant::now());
                        if aligned {
                            let s = align_started.take();
                            self.checkpoint(started, s)?;
                        }
                    }
                    AlignOutcome::Obsolete | AlignOutcome::Continue => {}
                },
                Received::Message(i, Message::EndOfStream) => {
                    self.inputs.finish(i);
                    if let AlignOutcome::Aligned(id) = aligner.on_end_of_stream(i) {
                        let started = align_started.take();
                        self.checkpoint(id, started)?;
                    }
                    if let Some(wm) = self.inputs.advance() {
                        self.advance_watermark(wm)?;
                    }
                }
            }
        }
        self.instance.close().map_err(|e| self.guest(e))?;
        self.route_emitted()?;
        self.output.broadcast(|| Message::EndOfStream).map_err(|d| self.disconnected(d))?;
        let Some(mut p) = self.checkpoints.take() else { return Ok(()) };
        let final_state = self.snapshot_state(CheckpointId(u64::MAX))?;
        let (id, cancel) = (self.id.clone(), self.cancel.clone());
        p.finish(&id, &cancel, |_| Ok(final_state.clone()), |_| Ok(()))
    }
}
