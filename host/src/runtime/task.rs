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
use std::time::{Duration, Instant};

use crate::checkpoint::alignment::{AlignOutcome, Aligner};
use crate::checkpoint::alignment_timeout::{Step, TimedAligner};
use crate::checkpoint::backedge::{HeadOutcome, LoopHead};
use crate::checkpoint::evidence::GroupLedger;
use crate::checkpoint::keyed_files::StreamError;
use crate::checkpoint::snapshot::LoggedBatch;
use crate::checkpoint::snapshot::{KeyGroupSnapshot, SubtaskState};
use crate::checkpoint::unaligned::UnalignOutcome;
use crate::graph::logical::Side;
use crate::ids::{CheckpointId, TaskId};
use crate::operator::{OperatorFactory, OperatorLogic};
use crate::record::{Batch, NO_KEY_GROUP};
use crate::runtime::control::{Control, Timing};
use crate::runtime::error::TaskFailure;
use crate::runtime::failed_record;
use crate::runtime::faults::{FaultKind, FaultPlan};
use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::input::{Inputs, Received};
use crate::runtime::message::Message;
use crate::runtime::metrics::{NodeMetrics, SubtaskMetrics};
use crate::runtime::output::{Disconnected, Drained, Output};
use crate::runtime::participant::{self, Participant};
use crate::runtime::query::StateQuery;
use crate::runtime::termination::LoopTermination;
use crate::sandbox::bindings::types::{KeyGroupState, OperatorSnapshot, SnapshotMode, TimeDomain};
use crate::sandbox::instance::GuestError;

mod upgrade;
use crate::sandbox::timers::now_ms;

/// Timers handed to the guest per `on-timer` call: a watermark that passes a million timers
/// fires them in bounded calls, and what each call emits is routed on before the next, so
/// neither the timer batch nor the guest's output grows with the number due.
const TIMERS_PER_CALL: usize = 4096;

/// State to restore before the first record.
pub struct Restore {
    /// The state schema version it was written with.
    pub schema_version: u32,
    /// The state.
    pub state: SubtaskState,
}

/// Failure injection for this subtask.
#[derive(Clone)]
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
    /// This subtask's counters (the node's `subtask(i)`).
    pub counters: Arc<SubtaskMetrics>,
    /// Set when the job is being torn down.
    pub cancel: Arc<AtomicBool>,
    /// Checkpointing links (`None`: checkpointing is off).
    pub checkpoints: Option<Participant>,
    /// State to restore.
    pub restore: Option<Restore>,
    /// Schema of the state the running instance holds (for a live upgrade's restore).
    pub schema_version: u32,
    /// Failure injection (tests).
    pub faults: Option<Faults>,
    /// Records-in-flight accounting (jobs with loops only).
    pub termination: Option<Arc<LoopTermination>>,
    /// Control messages read early (while looking for an upgrade at a barrier), handled
    /// before anything else.
    pub deferred: std::collections::VecDeque<Control>,
    /// A live upgrade armed for the barrier of this checkpoint.
    pub upgrade: Option<(CheckpointId, OperatorFactory)>,
    /// The new instance of a live upgrade, once its state is restored (or why it could not
    /// be), until the decision.
    pub(crate) upgrade_ready: Option<Result<upgrade::Prepared, String>>,
    /// A snapshot the operator is still handing out in chunks (copy-on-write): pulled
    /// between batches, completed before anything else is snapshotted.
    pub draining: Option<Draining>,
    /// The key groups the snapshot being taken has handed out so far.
    pub ledger: GroupLedger,
    /// The output port of dead letters (`on_error = "dead-letter"`), else `None`.
    pub dead_letter: Option<u32>,
}

/// A checkpoint in progress whose in-flight records are still being logged: a loop head's
/// (the state copied at alignment, the back-edge records since) or an unaligned one's (the
/// state copied at the first barrier, the records in flight on the other inputs).
pub(crate) struct PendingLog {
    pub(crate) id: CheckpointId,
    pub(crate) state: SubtaskState,
    log: Vec<LoggedBatch>,
    pub(crate) timing: Timing,
    /// The job's in-flight budget: the log's bytes count against `max_feedback_mb` until
    /// the log is handed to the writer or dropped.
    budget: Option<Arc<FeedbackBudget>>,
    log_bytes: u64,
}

impl PendingLog {
    /// The state copied for `id`, with nothing logged yet and no budget to charge.
    pub(crate) fn new(id: CheckpointId, state: SubtaskState, timing: Timing) -> Self {
        PendingLog { id, state, log: Vec::new(), timing, budget: None, log_bytes: 0 }
    }

    /// Charges what it logs to `budget` (a loop's in-flight budget).
    fn charged(mut self, budget: Option<Arc<FeedbackBudget>>) -> Self {
        self.budget = budget;
        self
    }

    /// Keeps a batch that was in transit on a back-edge, charging it to the budget.
    pub(crate) fn log(&mut self, side: u8, batch: &Batch) {
        let bytes = batch.as_bytes().to_vec();
        self.log_bytes += bytes.len() as u64;
        if let Some(b) = &self.budget {
            b.add(bytes.len() as u64);
        }
        self.log.push(LoggedBatch { side, records: batch.len(), bytes });
    }

    /// The log, handed on: its bytes leave the budget.
    pub(crate) fn take_log(&mut self) -> Vec<LoggedBatch> {
        if let Some(b) = &self.budget {
            b.sub(std::mem::take(&mut self.log_bytes));
        }
        std::mem::take(&mut self.log)
    }
}

impl Drop for PendingLog {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.sub(self.log_bytes);
        }
    }
}

/// Extra state of a task whose barriers overtake records (unaligned checkpoints, also those
/// that align first for `alignment_timeout_ms`).
pub(crate) struct Unaligned {
    pub(crate) t: TimedAligner,
    pub(crate) pending: Option<PendingLog>,
}

impl Unaligned {
    /// A task with `inputs` inputs whose checkpoints align for up to `aligned_for`.
    pub(crate) fn new(inputs: usize, aligned_for: Duration) -> Self {
        Unaligned { t: TimedAligner::new(inputs, aligned_for), pending: None }
    }

    /// Declines `old`, superseded here by checkpoint `id`.
    pub(crate) fn decline(old: Option<CheckpointId>, id: CheckpointId, participant: Option<&mut Participant>) {
        if let (Some(old), Some(p)) = (old, participant) {
            p.decline(old, format!("the barrier of checkpoint {id} arrived before checkpoint {old} was complete here"));
        }
    }

    /// Gives `old` up for `id`: declined, its snapshot and log dropped.
    pub(crate) fn give_up(&mut self, old: CheckpointId, id: CheckpointId, participant: Option<&mut Participant>) {
        Self::decline(Some(old), id, participant);
        self.pending.take_if(|p| p.id == old);
    }

    /// When the switched checkpoint was triggered (its barriers carry it on) and how long it
    /// aligned here, in ms.
    pub(crate) fn opened(&self) -> (Instant, f64) {
        self.t.opened().map_or((Instant::now(), 0.0), |(t, d)| (t, d.as_secs_f64() * 1e3))
    }

    /// Every input delivered the open checkpoint's barrier: the state copied at the first one
    /// and the records in flight go to the writer.
    pub(crate) fn finish(&mut self, metrics: &NodeMetrics, participant: Option<&mut Participant>) {
        if let Some(mut p) = self.pending.take() {
            let mut state = std::mem::take(&mut p.state);
            state.backedge_log = p.take_log();
            let records: u64 = state.backedge_log.iter().map(|b| b.records as u64).sum();
            metrics.inflight_logged.fetch_add(records, Ordering::Relaxed);
            if let Some(part) = participant {
                part.submit(p.id, state, p.timing);
            }
        }
    }
}

/// Extra state of a task with feedback inputs (a loop head).
struct Head {
    lh: LoopHead,
    pending: Option<PendingLog>,
    align_started: Option<Instant>,
    loop_closed: bool,
}

/// A snapshot whose key groups the operator hands out in chunks (`wit/operator.wit`: a
/// `key-group-state` with key group `0xFFFFFFFF` means "more follows").
pub struct Draining {
    id: CheckpointId,
    full: bool,
    /// What goes last into the file: non-keyed state, timers of groups not handed out yet.
    state: SubtaskState,
    /// Timers captured at the barrier, by key group, until the group's data comes.
    timers: std::collections::BTreeMap<u32, KeyGroupSnapshot>,
    /// Key-group bytes so far, as `max_snapshot_mb` counts them (not what a disk operator
    /// reads from its store).
    bytes: u64,
    /// Key-group bytes so far, all of them (the chain's bookkeeping weighs deltas by them).
    keyed: u64,
    /// Longest single call so far (the barrier's included): the stream's longest pause.
    pause_ms: f64,
    align_ms: f64,
    calls: u32,
    /// A live upgrade of a disk operator: every part also goes into the new instance.
    tee: Option<upgrade::Tee>,
}

/// The "more follows" marker of a chunked snapshot.
const MORE: u32 = u32::MAX;

/// Strips the "more follows" marker; returns whether it was there.
fn strip_more(snap: &mut OperatorSnapshot) -> bool {
    let before = snap.keyed.len();
    snap.keyed.retain(|k| k.key_group != MORE);
    snap.keyed.len() != before
}

/// Adds a later chunk's key groups to `state` (whose groups may already hold timers).
fn add_chunk(state: &mut SubtaskState, chunk: Vec<KeyGroupState>) {
    let mut at: std::collections::HashMap<u32, usize> =
        state.keyed.iter().enumerate().map(|(i, k)| (k.key_group, i)).collect();
    for k in chunk {
        match at.get(&k.key_group) {
            Some(&i) => state.keyed[i].data = k.data,
            None => {
                at.insert(k.key_group, state.keyed.len());
                state.keyed.push(KeyGroupSnapshot {
                    key_group: k.key_group,
                    data: k.data,
                    event_timers: Default::default(),
                    processing_timers: Default::default(),
                });
            }
        }
    }
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
                event_timers: Default::default(),
                processing_timers: Default::default(),
            };
            (k.key_group, s)
        })
        .collect();
    let empty = |kg| KeyGroupSnapshot {
        key_group: kg,
        data: vec![],
        event_timers: Default::default(),
        processing_timers: Default::default(),
    };
    let host = instance.host();
    for (kg, t) in host.event_timers.by_key_group() {
        groups.entry(kg).or_insert_with(|| empty(kg)).event_timers = t;
    }
    for (kg, t) in host.processing_timers.by_key_group() {
        groups.entry(kg).or_insert_with(|| empty(kg)).processing_timers = t;
    }
    SubtaskState { keyed: groups.into_values().collect(), operator_state: snap.operator_state, ..Default::default() }
}

/// Why a subtask's state could not be put into its operator.
#[derive(Debug, thiserror::Error)]
pub enum PutStateError {
    /// The operator refused or trapped.
    #[error(transparent)]
    Guest(#[from] GuestError),
    /// A file of the checkpoint could not be read as the state streamed in.
    #[error("reading its keyed state from the checkpoint failed: {0}")]
    Checkpoint(crate::checkpoint::keyed_files::ChainError),
}

/// Key-group bytes handed to a disk operator per `restore` call while its state streams in
/// from the checkpoint's files (each call's groups go to its store before the next is read).
const STREAMED_RESTORE_CHUNK: usize = 16 << 20;

/// Restores `state` (written by schema `schema_version`) into `instance`: the guest's state,
/// then the host's timers. Key groups still in the checkpoint's files (`state.streamed`) are
/// read one at a time: a disk operator takes them in chunks of [`STREAMED_RESTORE_CHUNK`]
/// bytes, so its state never sits in memory whole; an operator keeping its state in memory
/// takes them in one call, as it holds them all anyway.
pub fn put_state(
    instance: &mut dyn OperatorLogic,
    schema_version: u32,
    state: &SubtaskState,
) -> Result<(), PutStateError> {
    let mut snap = OperatorSnapshot {
        keyed: state
            .keyed
            .iter()
            .filter(|k| !k.data.is_empty())
            .map(|k| KeyGroupState { key_group: k.key_group, data: k.data.clone() })
            .collect(),
        operator_state: state.operator_state.clone(),
    };
    for k in &state.keyed {
        restore_timers(instance, k)?;
    }
    let Some(streamed) = state.streamed.as_ref().filter(|s| !s.is_empty()) else {
        return Ok(instance.restore(schema_version, &snap)?);
    };
    let chunked = instance.keyed_state_on_disk();
    let mut bytes: usize = snap.keyed.iter().map(|k| k.data.len()).sum();
    let mut called = false;
    let read = streamed.read(|k| {
        restore_timers(instance, &k)?;
        if k.data.is_empty() {
            return Ok(());
        }
        bytes += k.data.len();
        snap.keyed.push(KeyGroupState { key_group: k.key_group, data: k.data });
        if chunked && bytes >= STREAMED_RESTORE_CHUNK {
            instance.restore(schema_version, &snap)?;
            snap = OperatorSnapshot { keyed: Vec::new(), operator_state: Vec::new() };
            (bytes, called) = (0, true);
        }
        Ok(())
    });
    read.map_err(|e| match e {
        StreamError::Consumer(e) => PutStateError::Guest(e),
        StreamError::Chain(e) => PutStateError::Checkpoint(e),
    })?;
    if !called || !snap.keyed.is_empty() {
        instance.restore(schema_version, &snap)?;
    }
    Ok(())
}

/// Registers the timers of restored key group `k`. Timers in a checkpoint count against the
/// same limits as registered ones: a savepoint (a tenant's upload, or one taken at a higher
/// parallelism) cannot make the host hold more.
fn restore_timers(instance: &mut dyn OperatorLogic, k: &KeyGroupSnapshot) -> Result<(), GuestError> {
    let host = instance.host();
    let refuse = |why: String| GuestError::Failed {
        call: "restore",
        message: format!(
            "the restored state's timers do not fit: {why}; restore at a higher parallelism (fewer timers per \
             subtask), or raise [limits] max_timer_mb"
        ),
    };
    for (domain, timers) in
        [(TimeDomain::EventTime, &k.event_timers), (TimeDomain::ProcessingTime, &k.processing_timers)]
    {
        for (t, key) in timers {
            host.admit_timer(key.len()).map_err(refuse)?;
            host.timers(domain).register(t, k.key_group, key);
        }
    }
    Ok(())
}

impl OperatorTask {
    fn guest(&self, e: GuestError) -> TaskFailure {
        TaskFailure::Guest { task: self.id.clone(), source: e }
    }

    /// Counts a guest call begun at `started`, and the guest memory it left.
    fn count_call(&mut self, started: Instant) {
        let elapsed = started.elapsed();
        let memory = self.instance.host().store_limits.memory_bytes();
        self.counters.add_call(elapsed, memory);
    }

    fn disconnected(&self, _: Disconnected) -> TaskFailure {
        TaskFailure::Disconnected { task: self.id.clone() }
    }

    /// Routes what the guest emitted in its last call.
    fn route_emitted(&mut self) -> Result<(), TaskFailure> {
        let out = self.instance.take_emitted();
        if !out.is_empty() {
            self.counters.add_out(out.len() as u64, out.byte_len() as u64);
            self.output.emit_batch(out).map_err(|d| self.disconnected(d))?;
            // Either budget: the one this subtask's back-edges charge, or (a loop head fed over
            // the network) the one its incoming back-edges charge on this worker.
            let over = self.output.feedback_over().or_else(|| self.inputs.feedback_budget().and_then(|b| b.over()));
            if let Some((held, limit)) = over {
                return Err(TaskFailure::Limit {
                    task: self.id.clone(),
                    message: format!(
                        "exceeded the in-flight limit of the job's loops: {held} bytes of records wait on its back-edges, \
                         and max_feedback_mb = {} MiB ([limits] in the job file); the loop produces records faster than \
                         it consumes them",
                        limit >> 20
                    ),
                });
            }
            if self.output.dropped_after_end > 0 {
                return Err(TaskFailure::Connector {
                    task: self.id.clone(),
                    message: format!(
                        "emitted {} record(s) into a loop after the loop terminated; an operator inside a loop \
                         must not emit into the loop while closing",
                        self.output.dropped_after_end
                    ),
                });
            }
        }
        Ok(())
    }

    /// Hands `batch` (from input `input`) to the operator and routes what it emits. An error
    /// the operator returns for one record names that record ([`failed_record`]); with
    /// dead letters on, the record goes to the dead-letter output with a warning, what the
    /// operator emitted before it is kept, and the rest of the batch is processed.
    fn process_batch(&mut self, input: usize, side: Side, batch: Batch) -> Result<(), TaskFailure> {
        let mut batch = batch;
        loop {
            let started = Instant::now();
            let r = self.instance.process(side, &batch);
            self.count_call(started);
            let (call, message) = match r {
                Ok(()) => return self.route_emitted(),
                Err(GuestError::Failed { call, message }) => (call, message),
                Err(e) => return Err(self.guest(e)),
            };
            // Only `process` names a record (the disk backend's page-in and page-out run around
            // it: an error there is the call's, whatever its text says).
            let named = if call == "process" { failed_record::failing_record(&message, &batch) } else { None };
            let Some((index, rec, why)) = named else {
                return Err(self.guest(GuestError::Failed { call, message }));
            };
            let at = failed_record::describe(index, &rec, self.inputs.origin(input));
            let Some(port) = self.dead_letter else {
                return Err(self.guest(GuestError::Failed { call, message: format!("{why}; at {at}") }));
            };
            tracing::warn!(
                job = %self.instance.host().task.job_name,
                operator = %self.id.node,
                subtask = self.id.subtask.0,
                "[{}] dead letter: {at}: {}",
                self.id,
                crate::sandbox::guest_text::tame(&why)
            );
            self.route_emitted()?;
            let mut letter = Batch::default();
            letter.push(port, rec.timestamp, rec.key, rec.value);
            self.counters.add_dead_letter();
            self.output.emit_batch(letter).map_err(|d| self.disconnected(d))?;
            let mut rest = Batch::default();
            for r in batch.iter().skip(index as usize + 1) {
                rest.push(r.tag, r.timestamp, r.key, r.value);
            }
            if rest.is_empty() {
                return Ok(());
            }
            batch = rest;
        }
    }

    /// Records-in-flight accounting: what was pushed, then what was consumed.
    fn account(&mut self, consumed: u64) {
        if let Some(t) = &self.termination {
            t.account(self.output.take_copies(), consumed);
        }
    }

    /// Fires due timers of `domain` at `now`, repeatedly (a timer may register another due one).
    /// A guest that keeps re-registering due timers never ends this loop by itself: each
    /// round checks cancellation, and the rounds together get the CPU time of one call
    /// (`call_timeout_ms`), like every other guest call, however short each round is.
    fn fire_timers(&mut self, domain: TimeDomain, now: i64) -> Result<(), TaskFailure> {
        let started = Instant::now();
        let budget = Duration::from_millis(self.instance.host().limits.call_timeout_ms);
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskFailure::Cancelled { task: self.id.clone() });
            }
            if started.elapsed() > budget {
                return Err(self.guest(GuestError::Trap {
                    call: "on-timer",
                    message: format!(
                        "exceeded its CPU time limit: timers kept coming due at {now} for longer than \
                         call_timeout_ms = {} ms (a timer that registers an already-due timer loops)",
                        budget.as_millis()
                    ),
                    detail: None,
                }));
            }
            let due = self.instance.host().timers(domain).pop_due(now, TIMERS_PER_CALL);
            if due.is_empty() {
                return Ok(());
            }
            self.call_on_timer(domain, &due)?;
        }
    }

    /// Hands `due` timers to the guest and routes what it emitted.
    fn call_on_timer(&mut self, domain: TimeDomain, due: &Batch) -> Result<(), TaskFailure> {
        let t = Instant::now();
        let r = self.instance.on_timer(domain, due);
        self.count_call(t);
        r.map_err(|e| self.guest(e))?;
        self.route_emitted()
    }

    /// Fires the processing-time timers the clock has passed: when idle and after every
    /// batch, so a busy subtask's processing-time windows close on time too. (Costs one
    /// comparison per batch while none is due.)
    fn fire_processing_timers(&mut self) -> Result<(), TaskFailure> {
        let Some(next) = self.instance.host().processing_timers.next_time() else { return Ok(()) };
        // "Passes": a timer at t fires once the clock reads t + 1, so a window ending at t + 1
        // (timer at its last millisecond t) has taken every record the clock put in it.
        let passed = now_ms() - 1;
        if next <= passed {
            self.fire_timers(TimeDomain::ProcessingTime, passed)?;
            self.account(0);
        }
        Ok(())
    }

    /// The stream ended: the processing-time timers pending now fire once, in time order,
    /// before `finish` (the end of a bounded input closes processing-time windows as the final
    /// watermark closes event-time ones). Timers registered while they fire are dropped, so a
    /// timer that re-arms itself (a periodic flush) cannot keep the subtask from ending.
    fn fire_pending_processing_timers(&mut self) -> Result<(), TaskFailure> {
        let due = self.instance.host().processing_timers.pop_due(i64::MAX, usize::MAX);
        if due.is_empty() {
            return Ok(());
        }
        // In bounded calls, each one's output flushed before the next (as `fire_timers`).
        let mut records = due.iter().peekable();
        while records.peek().is_some() {
            let mut chunk = Batch::default();
            for r in records.by_ref().take(TIMERS_PER_CALL) {
                chunk.push(r.tag, r.timestamp, r.key, r.value);
            }
            self.call_on_timer(TimeDomain::ProcessingTime, &chunk)?;
        }
        self.instance.host().processing_timers.pop_due(i64::MAX, usize::MAX);
        self.account(0);
        Ok(())
    }

    fn advance_watermark(&mut self, wm: i64) -> Result<(), TaskFailure> {
        self.instance.host().watermark = wm;
        self.counters.set_watermark(wm);
        self.fire_timers(TimeDomain::EventTime, wm)?;
        let t = Instant::now();
        let r = self.instance.on_watermark(wm);
        self.count_call(t);
        r.map_err(|e| self.guest(e))?;
        self.route_emitted()?;
        if wm != i64::MAX {
            self.output.broadcast(|| Message::Watermark(wm)).map_err(|d| self.disconnected(d))?;
        }
        Ok(())
    }

    fn restore_state(&mut self) -> Result<(), TaskFailure> {
        let Some(r) = self.restore.take() else { return Ok(()) };
        put_state(self.instance.as_mut(), r.schema_version, &r.state).map_err(|e| match e {
            PutStateError::Guest(e) => self.guest(e),
            PutStateError::Checkpoint(e) => TaskFailure::Checkpoint {
                task: self.id.clone(),
                message: format!(
                    "cannot read its state from the checkpoint: {e}; {}",
                    crate::checkpoint::storage::UNLOADABLE_ADVICE
                ),
            },
        })?;
        // A disk operator restored whole from the job's own chain, unmigrated: its next
        // snapshot is a delta on that chain, not a full scan of its store.
        if let Some(chain) = r.state.resume.clone()
            && let Some(p) = self.checkpoints.as_mut()
            && r.schema_version == self.schema_version
            && self.instance.keyed_state_on_disk()
        {
            self.instance.restored_as_base().map_err(|source| TaskFailure::Guest { task: self.id.clone(), source })?;
            p.resume_chain(chain);
        }
        // The records in flight at the checkpoint (a loop head's back-edges', an unaligned
        // checkpoint's inputs') are processed first, like any input: dead letters included
        // (counted in flight since the part was built: see `local::build_part`).
        for lb in &r.state.backedge_log {
            let batch = Batch::from_validated(lb.bytes.clone(), lb.records);
            let side = if lb.side == 1 { Side::Right } else { Side::Left };
            self.counters.add_in(lb.records as u64, batch.byte_len() as u64);
            self.process_batch(usize::MAX, side, batch)?;
            self.account(lb.records as u64);
        }
        Ok(())
    }

    /// Full, or incremental when the job asks for it and the chain allows
    /// (`checkpoint/incremental.rs`).
    fn snapshot_mode(&mut self, id: CheckpointId) -> bool {
        // A `FullSnapshot` for this checkpoint may still be queued (an upgrade's forces its
        // own: `task/upgrade.rs`).
        self.read_control_ahead();
        match self.checkpoints.as_mut() {
            Some(p) => p.snapshot_is_full(id),
            None => true,
        }
    }

    /// Starts the snapshot for `id` at its barrier: the state as of now, all of it or (when
    /// the operator hands it out in chunks) its first chunk plus everything the host keeps.
    /// Returns the state and whether more chunks follow. Finishes a snapshot still
    /// draining first.
    fn begin_snapshot(&mut self, id: CheckpointId) -> Result<(SubtaskState, bool, bool), TaskFailure> {
        self.drain_all()?;
        if let Some(p) = self.checkpoints.as_mut() {
            p.snapshot_begun(id);
        }
        let full = self.snapshot_mode(id);
        let mode = if full { SnapshotMode::Full } else { SnapshotMode::Incremental };
        let mut snap = self.instance.snapshot(id.0, mode).map_err(|e| self.guest(e))?;
        let more = strip_more(&mut snap);
        let task = &self.instance.host().task;
        self.ledger = GroupLedger::new(task.key_group_start, task.key_group_end);
        self.admit_groups(&snap.keyed)?;
        Ok((capture(self.instance.as_mut(), snap), full, more))
    }

    /// Checks the key groups a snapshot call handed out against the ledger of this snapshot.
    fn admit_groups(&mut self, groups: &[KeyGroupState]) -> Result<(), TaskFailure> {
        self.ledger.admit(groups.iter().map(|k| k.key_group)).map_err(|v| {
            self.guest(GuestError::Trap {
                call: "snapshot",
                message: format!("the snapshot is refused: it {v} (a bug in the operator's SDK)"),
                detail: None,
            })
        })
    }

    /// One more chunk of the snapshot of `id` into `state`; returns whether more follow.
    /// A chunked snapshot is held to the same limits as a whole one: at most
    /// `max_snapshot_mb` in total (keyed state read from the disk backend's store excepted:
    /// the tenant's disk bounds it, and a checkpoint's writes are charged to it), and at most
    /// one call per owned key group.
    fn pull_chunk(
        &mut self,
        id: CheckpointId,
        full: bool,
        calls: &mut u32,
        total: &mut u64,
    ) -> Result<(Vec<KeyGroupState>, bool), TaskFailure> {
        let mode = if full { SnapshotMode::Full } else { SnapshotMode::Incremental };
        let mut snap = self.instance.snapshot(id.0, mode).map_err(|e| self.guest(e))?;
        let more = strip_more(&mut snap);
        self.admit_groups(&snap.keyed)?;
        *calls += 1;
        self.metrics.snapshot_chunks_max.fetch_max(*calls as u64, Ordering::Relaxed);
        if !self.instance.keyed_state_on_disk() {
            *total += snap.keyed.iter().map(|k| k.data.len() as u64).sum::<u64>();
        }
        let bytes = *total;
        let host = self.instance.host();
        let groups = host.task.key_group_end.saturating_sub(host.task.key_group_start);
        let limit = host.limits.max_snapshot_bytes();
        let fail = |message: String| GuestError::Trap { call: "snapshot", message, detail: None };
        if bytes > limit {
            return Err(self.guest(fail(format!(
                "exceeded its snapshot size limit: {bytes} bytes > max_snapshot_mb = {} MiB ([limits] in the job file)",
                limit >> 20
            ))));
        }
        if more && *calls > groups + 1 {
            return Err(self.guest(fail(format!(
                "kept answering `more follows` after {calls} calls for {groups} key groups (an operator hands out at \
                 least one key group per call)"
            ))));
        }
        Ok((snap.keyed, more))
    }

    /// Pulls the next chunk of the snapshot being drained; completes it (to the writer) when
    /// it was the last.
    fn drain_step(&mut self) -> Result<(), TaskFailure> {
        let Some(mut d) = self.draining.take() else { return Ok(()) };
        let t = Instant::now();
        let (chunk, more) = self.pull_chunk(d.id, d.full, &mut d.calls, &mut d.bytes)?;
        d.keyed += chunk.iter().map(|k| k.data.len() as u64).sum::<u64>();
        if let Some(t) = d.tee.as_mut() {
            t.put_chunk(&chunk);
        }
        d.pause_ms = d.pause_ms.max(t.elapsed().as_secs_f64() * 1e3);
        let groups = chunk
            .into_iter()
            .map(|k| match d.timers.remove(&k.key_group) {
                Some(t) => KeyGroupSnapshot { data: k.data, ..t },
                None => KeyGroupSnapshot {
                    key_group: k.key_group,
                    data: k.data,
                    event_timers: Default::default(),
                    processing_timers: Default::default(),
                },
            })
            .collect();
        if let Some(p) = self.checkpoints.as_ref() {
            p.submit_part(d.id, groups);
        }
        let id = d.id;
        self.draining = Some(d);
        if !more {
            self.drain_finish()?;
        } else {
            self.fault_while_draining(id)?;
        }
        Ok(())
    }

    /// Failure injection: decline checkpoint `id` in the middle of its drain and wait for
    /// the abort (queued for the task loop, which handles it before anything else).
    fn fault_while_draining(&mut self, id: CheckpointId) -> Result<(), TaskFailure> {
        let Some(f) = &self.faults else { return Ok(()) };
        let (records, done) = (self.metrics.records_in(), self.checkpoints.as_ref().map_or(0, |p| p.completed));
        if !f.plan.due_while_draining(f.attempt, self.id.node.as_str(), self.id.subtask.0, records, done) {
            return Ok(());
        }
        let Some(p) = self.checkpoints.as_mut() else { return Ok(()) };
        p.decline(id, "injected: declined while its snapshot was being drained".into());
        loop {
            match p.control.recv() {
                Ok(Control::Abort(a)) if a == id => {
                    self.deferred.push_back(Control::Abort(a));
                    return Ok(());
                }
                Ok(other) => self.deferred.push_back(other),
                Err(_) => return Err(TaskFailure::Disconnected { task: self.id.clone() }),
            }
        }
    }

    /// Hands a snapshot whose last chunk arrived to the writer.
    fn drain_finish(&mut self) -> Result<(), TaskFailure> {
        let Some(mut d) = self.draining.take() else { return Ok(()) };
        d.state.keyed.extend(std::mem::take(&mut d.timers).into_values());
        d.state.keyed.sort_by_key(|k| k.key_group);
        if let Some(t) = d.tee.take() {
            // Before the last part goes to the writer: the report precedes the ack.
            self.upgrade_prepared(d.id, t.finish(d.full));
        }
        if let Some(p) = self.checkpoints.as_mut() {
            p.snapshot_taken(d.id, d.full, d.keyed);
            p.submit(d.id, d.state, Timing { align_ms: d.align_ms, sync_ms: d.pause_ms, async_ms: 0.0 });
        }
        Ok(())
    }

    /// Completes the snapshot being drained, if any.
    fn drain_all(&mut self) -> Result<(), TaskFailure> {
        while let Some(id) = self.draining.as_ref().map(|d| d.id) {
            if self.deferred.iter().any(|c| matches!(c, Control::Abort(a) if *a == id)) {
                self.abandon_drain(id);
                break;
            }
            self.drain_step()?;
        }
        Ok(())
    }

    /// Checkpoint `id` was aborted: if its snapshot is still being drained, stop pulling it
    /// (the writer drops its partial file; see [`Participant::abandon`] for what follows).
    fn abandon_drain(&mut self, id: CheckpointId) {
        if let Some(d) = self.draining.take_if(|d| d.id == id)
            && let Some(p) = self.checkpoints.as_mut()
        {
            p.abandon(id, d.full);
            self.metrics.snapshots_abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A whole snapshot, now (loop heads, upgrades, the final state).
    fn snapshot_state(&mut self, id: CheckpointId) -> Result<SubtaskState, TaskFailure> {
        let (mut state, full, mut more) = self.begin_snapshot(id)?;
        let (mut calls, mut total) = (1, state.keyed.iter().map(|k| k.data.len() as u64).sum());
        while more {
            let (chunk, m) = self.pull_chunk(id, full, &mut calls, &mut total)?;
            add_chunk(&mut state, chunk);
            more = m;
        }
        state.keyed.sort_by_key(|k| k.key_group);
        if let Some(p) = self.checkpoints.as_mut() {
            p.snapshot_taken(id, full, state.keyed.iter().map(|k| k.data.len() as u64).sum());
        }
        Ok(state)
    }

    /// An aligned barrier: forward it, capture the state (synchronous part), hand it to the
    /// writer (asynchronous part). If a live upgrade is armed for this barrier, the state is
    /// also restored into the new component (`task/upgrade.rs`).
    fn checkpoint(&mut self, id: CheckpointId, align_started: Option<Instant>) -> Result<(), TaskFailure> {
        let align_ms = align_started.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        self.output.broadcast(|| Message::Barrier(id)).map_err(|d| self.disconnected(d))?;
        // The upgrade's control message may still be queued behind data: look for it.
        self.read_control_ahead();
        if let Some(factory) = self.armed_upgrade(id) {
            return self.upgrade_at_barrier(id, align_ms, factory);
        }
        // The common case: the operator's state is copied out at the barrier (in chunks
        // between the next batches if it is large), the stream goes on.
        self.snapshot_streaming(id, align_ms, None)?;
        self.fault_at_barrier(id)
    }

    /// Moves every control message already queued into `deferred`, arming an upgrade if one
    /// is among them.
    fn read_control_ahead(&mut self) {
        let Some(p) = self.checkpoints.as_mut() else { return };
        while let Ok(c) = p.control.try_recv() {
            match c {
                Control::PrepareUpgrade { id, factory } => self.upgrade = Some((id, factory)),
                Control::FullSnapshot(id) => p.force_full(id),
                other => self.deferred.push_back(other),
            }
        }
    }

    /// Failure injection: fail here, while a loop head's back-edge log for `id` is open.
    fn fault_while_logging(&self, id: CheckpointId) -> Result<(), TaskFailure> {
        if let Some(f) = &self.faults {
            let (records, done) = (self.metrics.records_in(), self.checkpoints.as_ref().map_or(0, |p| p.completed));
            if f.plan.due_while_logging(f.attempt, self.id.node.as_str(), self.id.subtask.0, records, done) {
                return Err(TaskFailure::Connector {
                    task: self.id.clone(),
                    message: format!("injected failure while logging back-edge records for checkpoint {id}"),
                });
            }
        }
        Ok(())
    }

    /// Failure injection at a log that just opened: a `WhileLogging` fault fires here once the
    /// sources hold their input for it (records may no longer circulate to be logged).
    fn fault_at_log_start(&self, id: CheckpointId) -> Result<(), TaskFailure> {
        match &self.faults {
            Some(f) if f.plan.is_held(f.attempt) => self.fault_while_logging(id),
            _ => Ok(()),
        }
    }

    /// Failure injection: fail here, with checkpoint `id` in flight, if the plan says so.
    fn fault_at_barrier(&self, id: CheckpointId) -> Result<(), TaskFailure> {
        if let Some(f) = &self.faults {
            let (records, done) = (self.metrics.records_in(), self.checkpoints.as_ref().map_or(0, |p| p.completed));
            if f.plan.due_at_barrier(f.attempt, self.id.node.as_str(), self.id.subtask.0, records, done) {
                return Err(TaskFailure::Connector {
                    task: self.id.clone(),
                    message: format!("injected failure during checkpoint {id}"),
                });
            }
        }
        Ok(())
    }

    /// Waits for room for the output held back (unaligned checkpoints), or for a barrier or a
    /// control message meanwhile: returns what to handle, or `None` to look again.
    fn drain_output(
        &mut self,
        control: Option<&crossbeam_channel::Receiver<Control>>,
    ) -> Result<Option<Received>, TaskFailure> {
        let inbox = self.inputs.priority();
        let got =
            self.output.drain(inbox.as_ref(), control, Duration::from_millis(50)).map_err(|d| self.disconnected(d))?;
        Ok(match got {
            Drained::Progress => None,
            Drained::Timeout => {
                if self.cancel.load(Ordering::Relaxed) {
                    return Err(TaskFailure::Cancelled { task: self.id.clone() });
                }
                None
            }
            Drained::Priority(p) => Some(self.inputs.accept(p)),
            Drained::Control(c) => Some(Received::Control(c)),
            Drained::InboxClosed => {
                self.inputs.close_priority();
                None
            }
        })
    }

    /// Carries out an unaligned checkpoint's decision on a barrier delivered on `input` (`None`:
    /// a loop head starting at the trigger).
    fn unaligned_outcome(
        &mut self,
        un: &mut Unaligned,
        input: Option<usize>,
        o: UnalignOutcome,
    ) -> Result<(), TaskFailure> {
        let complete = match o {
            UnalignOutcome::Obsolete => return Ok(()),
            UnalignOutcome::Delivered { complete } => complete,
            UnalignOutcome::Start { id, declined, complete } => {
                Unaligned::decline(declined, id, self.checkpoints.as_mut());
                // Downstream can start at once: the barrier goes ahead of the queued output.
                let (started, align_ms) = un.opened();
                self.output.unaligned_barrier(id, started);
                let t0 = Instant::now();
                let state = self.snapshot_state(id)?;
                let timing = Timing { align_ms, sync_ms: t0.elapsed().as_secs_f64() * 1e3, async_ms: 0.0 };
                // A loop's records in flight count against its in-flight budget until written.
                un.pending = Some(PendingLog::new(id, state, timing).charged(self.inputs.feedback_budget()));
                self.fault_at_barrier(id)?;
                self.fault_at_log_start(id)?;
                complete
            }
        };
        // The input's records in flight across its sender's snapshot, queued before the barrier.
        if let (Some(p), Some(input)) = (un.pending.as_mut(), input) {
            let side = if self.inputs.side(input) == Side::Right { 1 } else { 0 };
            for b in self.inputs.front_batches(input) {
                p.log(side, b);
            }
        }
        if complete {
            self.finish_unaligned(un);
        }
        Ok(())
    }

    /// Every input delivered the open unaligned checkpoint's barrier: its state and log go to
    /// the writer.
    fn finish_unaligned(&mut self, un: &mut Unaligned) {
        un.finish(&self.metrics, self.checkpoints.as_mut());
    }

    /// Carries out, in order, what a checkpoint whose barriers overtake records asks for.
    fn unaligned_steps(&mut self, un: &mut Unaligned, steps: Vec<Step>) -> Result<(), TaskFailure> {
        for s in steps {
            match s {
                Step::Unalign(input, o) => self.unaligned_outcome(un, input, o)?,
                Step::Decline { old, new } => un.give_up(old, new, self.checkpoints.as_mut()),
                Step::Complete => self.finish_unaligned(un),
            }
        }
        Ok(())
    }

    /// Carries out a loop head's checkpoint decision.
    fn head_outcome(&mut self, h: &mut Head, o: HeadOutcome) -> Result<(), TaskFailure> {
        match o {
            HeadOutcome::Park => {
                h.align_started.get_or_insert_with(Instant::now);
            }
            HeadOutcome::StartLogging { id, declined } => {
                if let (Some(old), Some(p)) = (declined, self.checkpoints.as_mut()) {
                    p.decline(old, format!("loop head aligned checkpoint {id} before {old} returned around the loop"));
                }
                let align_ms = h.align_started.take().map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
                self.output.broadcast(|| Message::Barrier(id)).map_err(|d| self.disconnected(d))?;
                let t0 = Instant::now();
                let state = self.snapshot_state(id)?;
                let timing = Timing { align_ms, sync_ms: t0.elapsed().as_secs_f64() * 1e3, async_ms: 0.0 };
                h.pending = Some(PendingLog::new(id, state, timing).charged(self.inputs.feedback_budget()));
                self.fault_at_barrier(id)?;
                self.fault_at_log_start(id)?;
                if let Some(c) = h.lh.complete_now() {
                    self.head_outcome(h, HeadOutcome::Complete(c))?;
                }
            }
            HeadOutcome::Complete(id) => {
                if let Some(mut p) = h.pending.take().filter(|p| p.id == id) {
                    let mut state = std::mem::take(&mut p.state);
                    state.backedge_log = p.take_log();
                    let records: u64 = state.backedge_log.iter().map(|b| b.records as u64).sum();
                    self.metrics.backedge_logged.fetch_add(records, Ordering::Relaxed);
                    if let Some(part) = self.checkpoints.as_mut() {
                        part.submit(id, state, p.timing);
                    }
                }
            }
            HeadOutcome::Obsolete | HeadOutcome::Continue => {}
        }
        Ok(())
    }

    fn inject_faults(&mut self) -> Result<(), TaskFailure> {
        let Some(f) = &self.faults else { return Ok(()) };
        let (records, done) = (self.metrics.records_in(), self.checkpoints.as_ref().map_or(0, |p| p.completed));
        match f.plan.due(f.attempt, self.id.node.as_str(), self.id.subtask.0, records, done) {
            None | Some(FaultKind::DuringCheckpoint | FaultKind::WhileLogging | FaultKind::DeclineWhileDraining) => {
                Ok(())
            }
            Some(FaultKind::HostPanic) => panic!("injected host panic in {}", self.id),
            Some(FaultKind::GuestTrap) => {
                let kg = self.instance.host().task.key_group_start;
                let tag = if self.instance.host().task.key_group_end > kg { kg } else { NO_KEY_GROUP };
                let mut b = Batch::default();
                b.push(tag, 0, b"__weir_fault__", b"panic");
                self.instance.process(Side::Left, &b).map_err(|e| self.guest(e))?;
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
        let flags = self.inputs.feedback_flags();
        let mut head = flags.iter().any(|f| *f).then(|| Head {
            lh: LoopHead::new(flags.clone()),
            pending: None,
            align_started: None,
            loop_closed: false,
        });
        let mut aligner = Aligner::new(self.inputs.len());
        let mut align_started: Option<Instant> = None;
        // A loop head cannot align (its back-edges bring its own barrier back only after it
        // snapshots): its checkpoints are unaligned from the first barrier.
        let aligned_for = if head.is_some() { Duration::ZERO } else { self.inputs.aligned_for() };
        let mut una = self.inputs.priority().is_some().then(|| Unaligned::new(self.inputs.len(), aligned_for));
        loop {
            let control = self.checkpoints.as_ref().map(|p| p.control.clone());
            let is_parked = |head: &Option<Head>, aligner: &Aligner, una: &Option<Unaligned>, i: usize| match head {
                Some(h) => h.lh.is_parked(i),
                None => aligner.is_parked(i) || una.as_ref().is_some_and(|u| u.t.is_parked(i)),
            };
            if let Some(un) = una.as_mut().filter(|u| u.t.is_aligning()) {
                // A checkpoint aligning here switches to unaligned when its timeout is over.
                let steps = un.t.poll(Instant::now());
                self.unaligned_steps(un, steps)?;
            }
            let mut received = match self.deferred.pop_front() {
                Some(c) => Received::Control(c),
                // Output waits for room (unaligned checkpoints): no input is read meanwhile,
                // but barriers and control messages are.
                None if self.output.blocked() => match self.drain_output(control.as_ref())? {
                    Some(r) => r,
                    None => continue,
                },
                None => self.inputs.recv(None, &|i| is_parked(&head, &aligner, &una, i), control.as_ref()),
            };
            if matches!(received, Received::Idle) {
                // No data ready: flush, fire processing timers, check cancellation and loop
                // termination, then wait. (Control messages may keep arriving, so these
                // checks must not depend on the wait timing out.)
                if self.cancel.load(Ordering::Relaxed) {
                    return Err(TaskFailure::Cancelled { task: self.id.clone() });
                }
                self.inject_faults()?;
                self.output.flush().map_err(|d| self.disconnected(d))?;
                self.fire_processing_timers()?;
                if let Some(h) = head.as_mut() {
                    let quiet = self.termination.as_ref().is_some_and(|t| t.quiescent());
                    if !h.loop_closed && h.lh.regular_inputs_ended() && quiet {
                        // Nothing is in flight anywhere and no source runs: end the loop.
                        self.output.end_loop_edges().map_err(|d| self.disconnected(d))?;
                        h.loop_closed = true;
                    }
                }
                let wait =
                    if head.as_ref().is_some_and(|h| !h.loop_closed && h.lh.regular_inputs_ended()) { 5 } else { 50 };
                if self.draining.is_some() {
                    // Nothing to process: pull the snapshot's next chunk instead of waiting.
                    self.drain_step()?;
                } else if !self.output.blocked() {
                    let idle = Instant::now();
                    received = self.inputs.recv(
                        Some(Duration::from_millis(wait)),
                        &|i| is_parked(&head, &aligner, &una, i),
                        control.as_ref(),
                    );
                    self.counters.add_idle(idle.elapsed());
                }
            }
            let from = if let Received::Message(i, _) = &received { Some(*i) } else { None };
            match received {
                Received::Idle => {}
                Received::Disconnected => return Err(TaskFailure::Disconnected { task: self.id.clone() }),
                Received::AllDone => break,
                Received::Control(c) => match c {
                    Control::Trigger(id) => {
                        if let Some(p) = self.checkpoints.as_mut() {
                            p.on_trigger(id)
                        }
                        if let Some(un) = una.as_mut() {
                            // A loop head whose regular inputs all ended gets no barrier from
                            // them any more: it starts at the trigger (its back-edges return
                            // the barrier).
                            if head.as_ref().is_some_and(|h| h.lh.regular_inputs_ended()) {
                                let steps = un.t.on_trigger(id, Instant::now());
                                self.unaligned_steps(un, steps)?;
                            }
                        } else if let Some(mut h) = head.take() {
                            let o = h.lh.on_trigger(id);
                            let r = self.head_outcome(&mut h, o);
                            head = Some(h);
                            r?;
                        }
                    }
                    Control::Complete(_) => {
                        if let Some(p) = self.checkpoints.as_mut() {
                            p.completed += 1
                        }
                    }
                    Control::Abort(id) => {
                        // An aborted checkpoint stops pulling from the guest at once.
                        self.abandon_drain(id);
                        self.upgrade.take_if(|(u, _)| *u == id);
                        if let Some(p) = self.checkpoints.as_mut() {
                            p.aborted(id);
                        }
                        if aligner.on_cancel(id) {
                            align_started = None;
                        }
                        if let Some(un) = una.as_mut() {
                            un.t.on_cancel(id);
                            un.pending.take_if(|p| p.id == id);
                        }
                        if let Some(h) = head.as_mut() {
                            h.lh.on_cancel(id);
                            if h.pending.as_ref().is_some_and(|p| p.id == id) {
                                h.pending = None;
                            }
                        }
                    }
                    Control::PrepareUpgrade { id, factory } => self.upgrade = Some((id, factory)),
                    Control::FullSnapshot(id) => {
                        if let Some(p) = self.checkpoints.as_mut() {
                            p.force_full(id);
                        }
                    }
                    // Stop with savepoint: exit without `close` or end of stream, so the
                    // savepoint is exactly where the job resumes.
                    Control::Stop => return Ok(()),
                    Control::Query(q) => self.answer_query(q)?,
                    Control::Shutdown | Control::SuspendAfter(_) | Control::UpgradeDecision { .. } => {}
                },
                Received::Message(i, Message::Data(batch)) => {
                    let n = batch.len() as u64;
                    self.counters.add_in(n, batch.byte_len() as u64);
                    let side = self.inputs.side(i);
                    if head.is_some() && self.inputs.is_feedback(i) {
                        let b = self.inputs.feedback_backlog() as u64 + 1;
                        self.metrics.feedback_peak_batches.fetch_max(b, Ordering::Relaxed);
                    }
                    if let Some(h) = head.as_mut()
                        && h.lh.must_log(i)
                        && let Some(p) = h.pending.as_mut()
                    {
                        // In transit on a back-edge in the checkpoint being taken: keep it.
                        let s = if side == Side::Right { 1 } else { 0 };
                        p.log(s, &batch);
                    }
                    if let Some(un) = una.as_mut()
                        && un.t.must_log(i)
                        && let Some(p) = un.pending.as_mut()
                    {
                        // In flight across an unaligned checkpoint: its input's barrier has
                        // not come yet.
                        p.log(if side == Side::Right { 1 } else { 0 }, &batch);
                    }
                    self.process_batch(i, side, batch)?;
                    self.account(n);
                    self.fire_processing_timers()?;
                    self.inject_faults()?;
                    // One chunk of a snapshot being drained per batch: short pauses.
                    self.drain_step()?;
                    let logging = head.as_ref().and_then(|h| h.pending.as_ref());
                    let logging = logging.or(una.as_ref().and_then(|u| u.pending.as_ref())).map(|p| p.id);
                    if let Some(id) = logging {
                        self.fault_while_logging(id)?;
                    }
                }
                Received::Message(i, Message::Watermark(wm)) => {
                    if let Some(wm) = self.inputs.on_watermark(i, wm) {
                        self.advance_watermark(wm)?;
                        self.account(0);
                    }
                }
                Received::Message(i, Message::Barrier(id)) => {
                    if let Some(mut h) = head.take() {
                        let o = h.lh.on_barrier(i, id);
                        let r = self.head_outcome(&mut h, o);
                        head = Some(h);
                        r?;
                        continue;
                    }
                    if let Some((id, started)) =
                        participant::on_barrier(&mut aligner, &mut align_started, self.checkpoints.as_mut(), i, id)
                    {
                        self.checkpoint(id, started)?;
                    }
                }
                Received::Marker(i, id, started) => {
                    if let Some(un) = una.as_mut() {
                        let drained = self.inputs.in_flight(i) == 0;
                        let steps = un.t.on_marker(i, id, started, drained, Instant::now());
                        self.unaligned_steps(un, steps)?;
                    }
                }
                Received::Message(i, Message::EndOfStream) if una.is_some() => {
                    self.inputs.finish(i);
                    if let Some(h) = head.as_mut() {
                        // Only to know when the regular inputs have ended (no barrier goes
                        // through the loop head's aligner with unaligned checkpoints).
                        let _ = h.lh.on_end_of_stream(i);
                    }
                    if let Some(un) = una.as_mut() {
                        let steps = un.t.on_end_of_stream(i, Instant::now());
                        self.unaligned_steps(un, steps)?;
                    }
                    if let Some(wm) = self.inputs.advance() {
                        self.advance_watermark(wm)?;
                        self.account(0);
                    }
                }
                Received::Message(i, Message::EndOfStream) => {
                    self.inputs.finish(i);
                    if let Some(mut h) = head.take() {
                        let o = h.lh.on_end_of_stream(i);
                        let r = self.head_outcome(&mut h, o);
                        head = Some(h);
                        r?;
                    } else if let AlignOutcome::Aligned(id) = aligner.on_end_of_stream(i) {
                        let started = align_started.take();
                        self.checkpoint(id, started)?;
                    }
                    if let Some(wm) = self.inputs.advance() {
                        self.advance_watermark(wm)?;
                        self.account(0);
                    }
                }
            }
            if let (Some(un), Some(i)) = (una.as_mut().filter(|u| u.t.is_aligning()), from)
                && self.inputs.in_flight(i) == 0
            {
                // The input's records before the aligning checkpoint's barrier are consumed:
                // it reached the barrier.
                let steps = un.t.on_drained(i, Instant::now());
                self.unaligned_steps(un, steps)?;
            }
        }
        self.fire_pending_processing_timers()?;
        self.instance.close().map_err(|e| self.guest(e))?;
        self.route_emitted()?;
        self.account(0);
        self.output.broadcast(|| Message::EndOfStream).map_err(|d| self.disconnected(d))?;
        self.after_input()
    }

    /// After the input ended: answer every checkpoint with a snapshot of the final state,
    /// taken when its trigger comes (full or incremental like any other, streamed in chunks,
    /// so a large final state is never held in memory whole), until the job shuts down.
    fn after_input(&mut self) -> Result<(), TaskFailure> {
        // A snapshot still being drained is its checkpoint's answer: finish it first.
        self.drain_all()?;
        // No input is read any more: barriers from upstream are not taken either.
        self.inputs.close_priority();
        let Some(p) = self.checkpoints.as_mut() else { return Ok(()) };
        let control = p.control.clone();
        for c in p.announce_finished() {
            self.final_snapshot(c)?;
        }
        let mut early: Vec<Control> = self.deferred.drain(..).collect();
        loop {
            let next = if !early.is_empty() {
                Ok(early.remove(0))
            } else if self.output.blocked() {
                // The output (its end of stream last) still waits for room (unaligned
                // checkpoints): keep moving it while answering the coordinator.
                match self.output.drain(None, Some(&control), Duration::from_millis(50)) {
                    Ok(Drained::Control(c)) => Ok(c),
                    Ok(Drained::Timeout) => Err(crossbeam_channel::RecvTimeoutError::Timeout),
                    Ok(Drained::Progress | Drained::Priority(_) | Drained::InboxClosed) => continue,
                    Err(d) => return Err(self.disconnected(d)),
                }
            } else {
                control.recv_timeout(Duration::from_millis(50))
            };
            let Some(p) = self.checkpoints.as_mut() else { return Ok(()) };
            match next {
                Ok(Control::Trigger(c)) => {
                    if p.is_new(c) {
                        self.final_snapshot(c)?;
                    }
                }
                Ok(Control::Complete(_)) => p.completed += 1,
                Ok(Control::FullSnapshot(c)) => p.force_full(c),
                Ok(Control::Query(q)) => self.answer_query(q)?,
                Ok(Control::Shutdown) | Ok(Control::Stop) => return Ok(()),
                Ok(Control::Abort(_))
                | Ok(Control::SuspendAfter(_))
                | Ok(Control::PrepareUpgrade { .. })
                | Ok(Control::UpgradeDecision { .. }) => {}
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    if self.cancel.load(Ordering::Relaxed) {
                        return Err(TaskFailure::Cancelled { task: self.id.clone() });
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(TaskFailure::Cancelled { task: self.id.clone() });
                }
            }
        }
    }

    /// Answers a live state query from the guest's state as it is now, between batches
    /// (`runtime/query.rs`). A trap fails the subtask like any other; a refusal is the answer.
    fn answer_query(&mut self, q: StateQuery) -> Result<(), TaskFailure> {
        let r = self.instance.query_state(&q.state, q.key_group, &q.key);
        // A query reads: whatever the guest emitted while answering is dropped.
        let _ = self.instance.take_emitted();
        match r {
            Ok(v) => q.answer(Ok(v)),
            Err(GuestError::Failed { message, .. }) => {
                let who = format!("operator `{}` subtask {}", q.operator, q.subtask);
                q.answer(Err(format!("{who}: {message}")))
            }
            Err(trap) => {
                q.answer(Err(format!("the subtask failed while answering: {trap}")));
                return Err(self.guest(trap));
            }
        }
        Ok(())
    }

    /// Checkpoint `c` after the input ended: a snapshot like at a barrier, drained at once.
    /// With unaligned checkpoints its barrier goes downstream too, ahead of the output still
    /// queued (carrying what waits for room, the end of stream included), so the subtasks
    /// downstream need not wait for it to drain.
    fn final_snapshot(&mut self, c: CheckpointId) -> Result<(), TaskFailure> {
        self.snapshot_streaming(c, 0.0, None)?;
        if self.output.is_unaligned() {
            // A subtask downstream that has ended takes no barrier any more: that is fine.
            self.output.unaligned_barrier(c, Instant::now());
        }
        self.drain_all()
    }

    /// Takes the snapshot of `id` at its barrier: the first chunk now (the stream's pause),
    /// the rest drained between the next batches and appended to the file as it comes.
    /// With `tee`, every part also goes into a live upgrade's new instance.
    fn snapshot_streaming(
        &mut self,
        id: CheckpointId,
        align_ms: f64,
        mut tee: Option<upgrade::Tee>,
    ) -> Result<(), TaskFailure> {
        self.drain_all()?;
        let t0 = Instant::now();
        let (mut state, full, more) = self.begin_snapshot(id)?;
        if let Some(t) = tee.as_mut() {
            t.put(&state);
        }
        if let Some(t) = tee.take_if(|t| t.hands_over()) {
            // A hand-over needs nothing of the keyed state: it reports now, and the rest of
            // the snapshot drains between batches as usual.
            self.upgrade_prepared(id, t.finish(full));
        }
        let pause_ms = t0.elapsed().as_secs_f64() * 1e3;
        let bytes = state.keyed.iter().map(|k| k.data.len() as u64).sum();
        let mut timers = std::collections::BTreeMap::new();
        if more {
            // Large state: the groups handed out so far go to disk now; groups with only
            // timers wait for their data.
            let (with_data, only_timers): (Vec<_>, Vec<_>) =
                std::mem::take(&mut state.keyed).into_iter().partition(|k| !k.data.is_empty());
            timers = only_timers.into_iter().map(|k| (k.key_group, k)).collect();
            if let Some(p) = self.checkpoints.as_ref() {
                p.submit_part(id, with_data);
            }
        }
        let keyed = bytes;
        self.draining = Some(Draining { id, full, state, timers, bytes, keyed, pause_ms, align_ms, calls: 1, tee });
        if !more {
            self.drain_finish()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::host::HostState;

    /// Restored timers are charged like registered ones: a checkpoint holding more timers than
    /// the subtask may hold is refused naming the limit, not loaded into host memory.
    #[test]
    fn restored_timers_count_against_the_timer_limit() {
        use crate::checkpoint::timer_list::TimerList;
        use crate::operator::native::NativeKeyedCount;
        let instance = || {
            let task = crate::sandbox::bindings::types::TaskInfo {
                job_name: "j".into(),
                operator_uid: "count".into(),
                subtask_index: 0,
                parallelism: 1,
                max_parallelism: 4,
                key_group_start: 0,
                key_group_end: 4,
            };
            let mut host = HostState::new(task, 0);
            host.limits.max_timer_mb = 1;
            NativeKeyedCount::new(host)
        };
        let state = |n: u64| {
            let mut timers = TimerList::default();
            for i in 0..n {
                timers.push(i as i64, &i.to_le_bytes());
            }
            SubtaskState {
                keyed: vec![KeyGroupSnapshot {
                    key_group: 2,
                    data: vec![],
                    event_timers: timers,
                    processing_timers: Default::default(),
                }],
                ..Default::default()
            }
        };
        let mut ok = instance();
        put_state(&mut ok, 1, &state(1000)).unwrap();
        assert_eq!(ok.host().event_timers.len(), 1000);
        // 1 MiB holds 16 384 timers of 64 bytes.
        let mut refused = instance();
        let e = put_state(&mut refused, 1, &state(20_000)).unwrap_err().to_string();
        assert!(e.contains("timers do not fit") && e.contains("max_timer_mb = 1 MiB"), "{e}");
        // A key longer than a guest may register is refused on restore too.
        let mut long = state(0);
        long.keyed[0].event_timers.push(1, &vec![0; crate::sandbox::host::MAX_TIMER_KEY + 1]);
        let e = put_state(&mut instance(), 1, &long).unwrap_err().to_string();
        assert!(e.contains("timer key of 65537 bytes exceeds 65536"), "{e}");
    }

    /// Keyed state still in the checkpoint's files reaches a disk operator in chunks of about
    /// [`STREAMED_RESTORE_CHUNK`] bytes, never whole: every group once, in order, the operator
    /// state in the first call only, timers registered. An operator that keeps its state in
    /// memory gets it in one call.
    #[test]
    fn streamed_keyed_state_reaches_a_disk_operator_in_bounded_chunks() {
        use crate::checkpoint::incremental::tests::{kg, state};
        use crate::checkpoint::keyed_files::{ChainIndex, StreamedKeyed, tests::write};
        let tmp = tempfile::tempdir().unwrap();
        let group = 1 << 20;
        let mut groups: Vec<_> = (0..40u32).map(|g| kg(g, state(&[(b"k", &vec![g as u8; group])]))).collect();
        groups[7].event_timers.push(99, b"k");
        let file = write(tmp.path(), "op-0.state", &groups);
        let (chain, rest) = ChainIndex::open(&[file]).unwrap();
        let restored = SubtaskState {
            keyed: vec![kg(40, state(&[(b"eager", b"1")]))],
            streamed: Some(StreamedKeyed::whole(chain)),
            ..rest
        };
        let task = crate::sandbox::bindings::types::TaskInfo {
            job_name: "j".into(),
            operator_uid: "op".into(),
            subtask_index: 0,
            parallelism: 1,
            max_parallelism: 64,
            key_group_start: 0,
            key_group_end: 64,
        };
        let run = |disk| {
            let mut r = crate::operator::recording::Recording::new(task.clone(), disk);
            put_state(&mut r, 1, &restored).unwrap();
            assert_eq!(r.host.event_timers.len(), 1);
            r.calls.lock().unwrap().clone()
        };
        let calls = run(true);
        assert!(calls.len() >= 3, "{} calls", calls.len());
        for (i, (_, bytes, op)) in calls.iter().enumerate() {
            assert!(*bytes <= STREAMED_RESTORE_CHUNK + group + 64, "call {i}: {bytes} bytes");
            assert_eq!(*op, if i == 0 { 2 } else { 0 }, "call {i}");
        }
        let order: Vec<u32> = calls.iter().flat_map(|c| c.0.clone()).collect();
        assert_eq!(order, std::iter::once(40).chain(0..40).collect::<Vec<_>>());
        let calls = run(false);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].0.len(), 41);
    }

    /// The records a loop head keeps for a checkpoint in progress are in flight too: they
    /// count against the job's budget until handed to the writer or dropped (abort).
    #[test]
    fn a_loop_heads_log_counts_against_the_in_flight_budget_until_handed_on_or_dropped() {
        let budget = Arc::new(FeedbackBudget::new(1 << 20));
        let mut batch = Batch::default();
        batch.push(0, 0, b"k", &[7u8; 1000]);
        let one = batch.as_bytes().len() as u64;
        let pending = |budget: &Arc<FeedbackBudget>| PendingLog {
            id: CheckpointId(1),
            state: SubtaskState::default(),
            log: Vec::new(),
            timing: Timing { align_ms: 0.0, sync_ms: 0.0, async_ms: 0.0 },
            budget: Some(budget.clone()),
            log_bytes: 0,
        };
        let mut p = pending(&budget);
        p.log(0, &batch);
        p.log(1, &batch);
        assert_eq!(budget.held(), 2 * one);
        let log = p.take_log();
        assert_eq!((log.len(), log[1].side, budget.held()), (2, 1, 0));
        p.log(0, &batch);
        drop(p);
        assert_eq!(budget.held(), 0, "an aborted checkpoint's log gives its bytes back");
    }
}
