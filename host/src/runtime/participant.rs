//! A subtask's side of checkpointing: hand snapshots to the asynchronous writer, decline,
//! remember triggers, count completions, and — after the subtask's input is exhausted —
//! answer every later trigger with the subtask's final state until the job shuts down.
//!
//! Why a finished subtask's final state is a valid part of checkpoint `n` although the
//! barrier never reached it: end of stream counts as every later barrier on that channel
//! (see `checkpoint/alignment.rs`), so downstream snapshots for `n` include everything this
//! subtask ever emitted, which is exactly what its final state covers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::checkpoint::alignment::{AlignOutcome, Aligner};
use crate::checkpoint::incremental::{ChainLink, IncrementalPolicy};
use crate::checkpoint::snapshot::KeyGroupSnapshot;
use crate::checkpoint::snapshot::SubtaskState;
use crate::ids::{CheckpointId, TaskId};
use crate::runtime::control::{Control, Event, Timing, WriteJob, WriteMsg};
use crate::runtime::error::TaskFailure;

/// The longest chain of an operator on the disk backend (base included): its deltas reach the
/// size of a full snapshot first unless little of its state changes per checkpoint, and a
/// restore then reads at most this many files.
pub const DISK_MAX_LINKS: usize = 64;

/// Checkpointing links of one subtask.
pub struct Participant {
    /// Global task index (the coordinator's numbering).
    pub task: usize,
    /// State file name, `<uid>-<subtask>.a<writer>.state` (see `local::Attempt::writer`).
    pub file: String,
    /// From the coordinator.
    pub control: Receiver<Control>,
    /// To the coordinator.
    pub events: Sender<Event>,
    /// To the asynchronous writer.
    pub writer: Sender<WriteMsg>,
    /// Checkpoints completed so far (as notified).
    pub completed: u64,
    triggered: BTreeSet<CheckpointId>,
    last: Option<CheckpointId>,
    /// Which snapshots may be incremental and what they build on.
    incremental: IncrementalPolicy,
    /// Checkpoints announced as full (`Control::FullSnapshot`).
    forced_full: BTreeSet<CheckpointId>,
    /// Set by the writer when a file of this task was not written.
    base_lost: Arc<AtomicBool>,
    /// The operator's keyed state is on the disk backend.
    disk: bool,
    /// The chain being folded in the background.
    compacting: Option<Compacting>,
}

/// A fold of the chain in flight (`checkpoint/compaction.rs`; the policy knows which chain).
struct Compacting {
    into: ChainLink,
    reply: Receiver<Result<u64, String>>,
}

impl Participant {
    /// Links for global task `task`.
    pub fn new(
        task: usize,
        file: String,
        control: Receiver<Control>,
        events: Sender<Event>,
        writer: Sender<WriteMsg>,
    ) -> Self {
        Participant {
            task,
            file,
            control,
            events,
            writer,
            completed: 0,
            triggered: BTreeSet::new(),
            last: None,
            incremental: IncrementalPolicy::new(false),
            forced_full: BTreeSet::new(),
            base_lost: Arc::new(AtomicBool::new(false)),
            disk: false,
            compacting: None,
        }
    }

    /// Takes incremental snapshots (`[checkpoint] incremental = true`) with chains of at most
    /// `max_links` files (`[checkpoint] max_chain_links`). `disk`: the operator's keyed state is
    /// on the disk backend, whose full snapshot scans its whole store, so its chains are folded
    /// in the background instead of restarted by a full snapshot, and are at most
    /// [`DISK_MAX_LINKS`] long by default instead of
    /// [`MAX_LINKS`](crate::checkpoint::incremental::MAX_LINKS).
    pub fn with_incremental(mut self, enabled: bool, disk: bool, max_links: Option<usize>) -> Self {
        let default = if disk { DISK_MAX_LINKS } else { crate::checkpoint::incremental::MAX_LINKS };
        self.incremental = IncrementalPolicy::new(enabled).with_max_links(max_links.unwrap_or(default));
        if disk {
            self.incremental = self.incremental.in_background();
        }
        self.disk = disk;
        self
    }

    /// Checkpoint `id` must be full (`Control::FullSnapshot`).
    pub fn force_full(&mut self, id: CheckpointId) {
        self.forced_full.insert(id);
    }

    /// Whether the snapshot for `id` must be full (else it may be incremental).
    pub fn snapshot_is_full(&mut self, id: CheckpointId) -> bool {
        self.poll_compaction();
        if self.base_lost.swap(false, Ordering::Relaxed) {
            self.incremental.reset();
        }
        self.forced_full.retain(|f| *f >= id);
        let forced = self.forced_full.remove(&id);
        self.incremental.wants_full(forced)
    }

    /// Checkpoint `id` was aborted: a snapshot of it held back (a loop head's, waiting for
    /// its back-edge log) will never be written.
    pub fn aborted(&mut self, id: CheckpointId) {
        self.incremental.dropped(id);
        // Nobody waits for its answer: a subtask whose input ended does not snapshot it.
        self.triggered.remove(&id);
    }

    /// A snapshot for `id` was taken.
    pub fn snapshot_taken(&mut self, id: CheckpointId, full: bool, keyed_bytes: u64) {
        self.incremental.taken(id, &self.file, full, keyed_bytes);
    }

    /// The operator's keyed state was restored whole from `chain`'s files, unchanged: the next
    /// snapshot may be a delta on them (`IncrementalPolicy::resume`).
    pub fn resume_chain(&mut self, chain: Vec<(ChainLink, u64)>) {
        self.incremental.resume(chain);
    }

    /// The operator's state no longer matches what was snapshotted (a live upgrade
    /// switched instances): the next snapshot is full.
    pub fn state_replaced(&mut self) {
        self.incremental.reset();
    }

    /// Hands the state of checkpoint `id` to the writer (the asynchronous part); asks it to
    /// fold the chain in the background when it is long (after this file: the writer handles
    /// its messages in order, so the chain's files are written or known lost by then).
    pub fn submit(&mut self, id: CheckpointId, state: SubtaskState, timing: Timing) {
        let chain = self.incremental.submitted(id);
        self.submit_shared(id, Arc::new(state), timing, chain);
        if self.compacting.is_none()
            && let Some(prefix) = self.incremental.compaction()
        {
            let last = prefix.last().expect("a chain to fold has files");
            let into = ChainLink { checkpoint: last.checkpoint, file: format!("{}.base", last.file) };
            let (reply, rx) = crossbeam_channel::bounded(1);
            let _ = self.writer.send(WriteMsg::Compact { task: self.task, links: prefix, into: into.clone(), reply });
            self.compacting = Some(Compacting { into, reply: rx });
        }
    }

    /// Takes the outcome of a fold in flight, if it arrived: later snapshots build on the
    /// folded file, or (it failed) the chain is restarted by full snapshots from now on.
    fn poll_compaction(&mut self) {
        let Some(c) = &self.compacting else { return };
        let outcome = match c.reply.try_recv() {
            Ok(outcome) => outcome,
            Err(crossbeam_channel::TryRecvError::Empty) => return,
            Err(crossbeam_channel::TryRecvError::Disconnected) => Err("the writer stopped".into()),
        };
        let c = self.compacting.take().expect("checked above");
        match outcome {
            Ok(bytes) => {
                self.incremental.compacted(c.into, bytes);
            }
            Err(why) => {
                tracing::warn!(
                    "{}: folding its chain of state files into {} failed ({why}); its chain is restarted by full \
                     snapshots from now on",
                    self.file,
                    c.into.file
                );
                self.incremental.compaction_failed();
            }
        }
    }

    fn submit_shared(&mut self, id: CheckpointId, state: Arc<SubtaskState>, timing: Timing, chain: Vec<ChainLink>) {
        self.answered(id);
        let base_lost = self.base_lost.clone();
        let job = WriteJob { task: self.task, id, file: self.file.clone(), state, timing, chain, base_lost };
        let _ = self.writer.send(WriteMsg::Done(job));
    }

    /// Appends key groups of the snapshot of `id` (drained in chunks) to its file; the rest
    /// follows with [`Participant::submit`].
    pub fn submit_part(&self, id: CheckpointId, groups: Vec<KeyGroupSnapshot>) {
        if !groups.is_empty() {
            let _ = self.writer.send(WriteMsg::Part { task: self.task, id, file: self.file.clone(), groups });
        }
    }

    /// The snapshot for `id` begins (its first chunk is taken now; the rest may be drained
    /// later): from here on `id` is answered, so the end of input never snapshots it again
    /// (a second snapshot of the same checkpoint would replace the acknowledged file).
    pub fn snapshot_begun(&mut self, id: CheckpointId) {
        self.answered(id);
    }

    fn answered(&mut self, id: CheckpointId) {
        self.last = Some(self.last.map_or(id, |l| l.max(id)));
        self.triggered.retain(|t| *t > id);
    }

    /// Checkpoint `id` was aborted while its snapshot (`full` or not) was being handed out in
    /// parts: the writer drops what it has of it, and the next snapshot is full (the guest
    /// abandons the unfinished one when asked for the next, and what it handed out of a delta
    /// is in no checkpoint) — except after a delta of the disk backend, whose next delta
    /// covers the abandoned one's changes too (`operator/paged.rs`): its chain goes on, so a
    /// checkpoint timing out does not make the next one a scan of the whole store.
    pub fn abandon(&mut self, id: CheckpointId, full: bool) {
        let _ = self.writer.send(WriteMsg::Abandon { task: self.task, id });
        if full || !self.disk {
            self.incremental.reset();
        }
    }

    /// Declines checkpoint `id`.
    pub fn decline(&mut self, id: CheckpointId, reason: String) {
        self.answered(id);
        self.incremental.dropped(id);
        let _ = self.events.send(Event::Decline { task: self.task, id, reason });
    }

    /// Remembers a trigger seen while running (the barrier comes in-band, or never if the
    /// inputs end first).
    pub fn on_trigger(&mut self, id: CheckpointId) {
        if self.last.is_none_or(|l| id > l) {
            self.triggered.insert(id);
        }
    }

    /// The subtask's input is exhausted: tells the coordinator, returns the triggers seen
    /// but not answered yet (an operator answers them, and every later one, with fresh
    /// snapshots of its final state).
    pub fn announce_finished(&mut self) -> Vec<CheckpointId> {
        let _ = self.events.send(Event::Finished { task: self.task });
        let last = self.last;
        std::mem::take(&mut self.triggered).into_iter().filter(|c| last.is_none_or(|l| *c > l)).collect()
    }

    /// Whether checkpoint `c` still needs this subtask's state.
    pub fn is_new(&self, c: CheckpointId) -> bool {
        self.last.is_none_or(|l| c > l)
    }

    /// Runs after the subtask's input is exhausted: acks every trigger with `state` (after
    /// `before_ack` for sinks, which pre-commit), applies `on_complete`, until `Shutdown`.
    /// (Sources and sinks: their state is small and shared by every later checkpoint.)
    pub fn finish(
        &mut self,
        id: &TaskId,
        cancel: &Arc<AtomicBool>,
        mut state: impl FnMut(CheckpointId) -> Result<Arc<SubtaskState>, TaskFailure>,
        mut on_complete: impl FnMut(CheckpointId) -> Result<(), TaskFailure>,
    ) -> Result<(), TaskFailure> {
        for c in self.announce_finished() {
            let s = state(c)?;
            self.submit_shared(c, s, Timing::default(), Vec::new());
        }
        loop {
            match self.control.recv_timeout(Duration::from_millis(50)) {
                Ok(Control::Trigger(c)) => {
                    if self.is_new(c) {
                        let s = state(c)?;
                        self.submit_shared(c, s, Timing::default(), Vec::new());
                    }
                }
                Ok(Control::Complete(c)) => {
                    self.completed += 1;
                    on_complete(c)?;
                }
                Ok(Control::Shutdown) | Ok(Control::Stop) => return Ok(()),
                Ok(Control::Abort(_))
                | Ok(Control::SuspendAfter(_))
                | Ok(Control::PrepareUpgrade { .. })
                | Ok(Control::FullSnapshot(_))
                | Ok(Control::UpgradeDecision { .. }) => {}
                Ok(Control::Query(q)) => q.answer(Err("only operators keep state that can be queried".into())),
                Err(RecvTimeoutError::Timeout) => {
                    if cancel.load(Ordering::Relaxed) {
                        return Err(TaskFailure::Cancelled { task: id.clone() });
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return Err(TaskFailure::Cancelled { task: id.clone() }),
            }
        }
    }
}

/// Feeds a barrier on input `input` to the `aligner` of a task without loops and does the
/// bookkeeping (alignment start time, declining a superseded checkpoint). Returns the
/// checkpoint to snapshot now, with when its alignment started.
pub fn on_barrier(
    aligner: &mut Aligner,
    align_started: &mut Option<Instant>,
    participant: Option<&mut Participant>,
    input: usize,
    id: CheckpointId,
) -> Option<(CheckpointId, Option<Instant>)> {
    match aligner.on_barrier(input, id) {
        AlignOutcome::Park => {
            align_started.get_or_insert_with(Instant::now);
            None
        }
        AlignOutcome::Aligned(id) => Some((id, align_started.take())),
        AlignOutcome::Superseded { aborted, started, aligned } => {
            if let Some(p) = participant {
                p.decline(aborted, format!("barrier {started} arrived while aligning {aborted}"));
            }
            *align_started = Some(Instant::now());
            aligned.then(|| (started, align_started.take()))
        }
        AlignOutcome::Obsolete | AlignOutcome::Continue => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn participant() -> (Participant, Receiver<WriteMsg>) {
        let (_ctl_tx, ctl_rx) = crossbeam_channel::unbounded();
        let (ev_tx, _ev_rx) = crossbeam_channel::unbounded();
        let (w_tx, w_rx) = crossbeam_channel::unbounded();
        (Participant::new(0, "op-0.state".into(), ctl_rx, ev_tx, w_tx), w_rx)
    }

    /// A snapshot still being drained in chunks when the input ends is that checkpoint's
    /// answer: the end of input must not take a second snapshot of it (which replaced the
    /// acknowledged file under the same name and broke the checkpoint).
    #[test]
    fn a_checkpoint_whose_snapshot_began_is_not_answered_again_at_the_end_of_input() {
        let (mut p, _w) = participant();
        p.on_trigger(CheckpointId(4));
        p.on_trigger(CheckpointId(5));
        p.on_trigger(CheckpointId(6));
        p.snapshot_begun(CheckpointId(5));
        assert!(!p.is_new(CheckpointId(5)) && !p.is_new(CheckpointId(4)));
        assert_eq!(p.announce_finished(), vec![CheckpointId(6)], "only triggers after the begun snapshot");
    }

    #[test]
    fn triggers_seen_before_the_end_of_input_are_answered_once() {
        let (mut p, w) = participant();
        p.on_trigger(CheckpointId(7));
        assert_eq!(p.announce_finished(), vec![CheckpointId(7)]);
        p.submit(CheckpointId(7), SubtaskState::default(), Timing::default());
        assert!(matches!(w.try_recv(), Ok(WriteMsg::Done(j)) if j.id == CheckpointId(7)));
        assert!(!p.is_new(CheckpointId(7)) && p.is_new(CheckpointId(8)));
        p.on_trigger(CheckpointId(7));
        assert!(p.announce_finished().is_empty());
    }

    /// A memory operator's chain is restarted by a full snapshot at
    /// [`MAX_LINKS`](crate::checkpoint::incremental::MAX_LINKS) files; a disk operator's (whose
    /// full snapshot scans its whole store) is folded in the background at [`DISK_MAX_LINKS`]
    /// and its snapshots stay deltas, building on the folded file once the writer reports it.
    #[test]
    fn a_disk_operators_chain_is_folded_in_the_background_not_restarted() {
        for (disk, limit) in [(false, crate::checkpoint::incremental::MAX_LINKS), (true, DISK_MAX_LINKS)] {
            let (p, w) = participant();
            let mut p = p.with_incremental(true, disk, None);
            let (mut fulls, mut folds) = (Vec::new(), Vec::new());
            for n in 1..=(2 * limit as u64) {
                let full = p.snapshot_is_full(CheckpointId(n));
                p.snapshot_taken(CheckpointId(n), full, if full { 1 << 30 } else { 1 });
                p.submit(CheckpointId(n), SubtaskState::default(), Timing::default());
                if full {
                    fulls.push(n);
                }
                for msg in w.try_iter() {
                    match msg {
                        WriteMsg::Done(j) if n == limit as u64 + 1 && disk => {
                            let first = j.chain.first().expect("a delta");
                            assert_eq!(first.file, format!("op-0.state.base"), "builds on the folded file");
                            assert_eq!(j.chain.len(), 1, "{:?}", j.chain);
                        }
                        WriteMsg::Compact { links, into, reply, .. } => {
                            folds.push((n, links.len(), into.checkpoint));
                            reply.send(Ok(1 << 30)).unwrap();
                        }
                        _ => {}
                    }
                }
            }
            if disk {
                assert_eq!(fulls, vec![1]);
                assert_eq!(
                    folds,
                    vec![(limit as u64, limit, limit as u64), (2 * limit as u64 - 1, limit, 2 * limit as u64 - 1)]
                );
            } else {
                assert_eq!(fulls, vec![1, limit as u64 + 1]);
                assert!(folds.is_empty());
            }
        }
    }

    /// An aborted delta of a disk operator leaves its chain as it was (the next delta covers
    /// the abandoned one's changes); an aborted full, or any abort on the memory backend,
    /// makes the next snapshot full.
    #[test]
    fn an_abandoned_disk_delta_keeps_the_chain() {
        for (disk, full, next_full) in [(true, false, false), (true, true, true), (false, false, true)] {
            let (p, _w) = participant();
            let mut p = p.with_incremental(true, disk, None);
            assert!(p.snapshot_is_full(CheckpointId(1)));
            p.snapshot_taken(CheckpointId(1), true, 10);
            p.submit(CheckpointId(1), SubtaskState::default(), Timing::default());
            assert!(!p.snapshot_is_full(CheckpointId(2)));
            p.abandon(CheckpointId(2), full);
            assert_eq!(p.snapshot_is_full(CheckpointId(3)), next_full, "disk {disk}, abandoned full {full}");
        }
    }
}
