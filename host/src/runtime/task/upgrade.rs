//! A live upgrade at one operator subtask: at the barrier of the upgrade's checkpoint the
//! running instance's state is snapshotted (in full: this operator's part of that checkpoint
//! is what the new instance restores from) and restored, through
//! the new component's `restore` (which migrates it), into a new instance; the subtask
//! reports, waits for the coordinator's decision (`checkpoint/upgrade.rs`) with its inputs
//! unread, and switches only on `commit`.
//!
//! Invariants: the running instance is never changed by a prepare, so a rollback simply
//! goes on with it; the report precedes the subtask's ack of the checkpoint (the
//! coordinator treats a complete checkpoint without every report as a rollback); on the
//! disk backend the new instance gets a store of its own and the state moves in chunks —
//! each chunk of the snapshot goes to the checkpoint writer and into the new instance, so
//! neither side ever holds the whole state in memory — unless nothing needs migrating (same
//! schema, same keyed states): then the new guest takes the running store over as it is
//! (its non-keyed state and timers restored), and neither the pause nor the checkpoint (a
//! delta on the store's chain) depends on the store's size.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{OperatorTask, put_state};
use crate::checkpoint::snapshot::{KeyGroupSnapshot, SubtaskState};
use crate::ids::CheckpointId;
use crate::operator::{OperatorFactory, OperatorLogic};
use crate::runtime::control::{Control, Event, Timing};
use crate::runtime::error::TaskFailure;
use crate::sandbox::bindings::types::{KeyGroupState, OperatorSnapshot};
use crate::sandbox::host::HostState;

/// What a prepared upgrade switches to.
pub(crate) enum Prepared {
    /// A new instance, its state restored, in place of the running one.
    Replace(Box<dyn OperatorLogic>),
    /// A new guest taking over the running disk operator's store
    /// ([`OperatorLogic::hand_over`]).
    HandOver(Box<dyn OperatorLogic>),
}

/// A live upgrade's new instance taking the snapshot's parts as they are pulled.
pub(crate) struct Tee {
    new: Result<Box<dyn OperatorLogic>, String>,
    /// A hand-over: only the non-keyed state and the timers go in.
    hand_over: bool,
    /// Schema of the state the running instance holds.
    schema: u32,
    /// State bytes put so far (keyed and non-keyed).
    bytes: u64,
}

impl Tee {
    fn new(new: Result<Box<dyn OperatorLogic>, String>, schema: u32) -> Tee {
        Tee { new, hand_over: false, schema, bytes: 0 }
    }

    /// A hand-over to `guest`: of the snapshot's first part it takes the non-keyed state and
    /// the timers; it needs no other part.
    fn hand_over(guest: Result<Box<dyn OperatorLogic>, String>, schema: u32) -> Tee {
        Tee { new: guest, hand_over: true, schema, bytes: 0 }
    }

    pub(super) fn hands_over(&self) -> bool {
        self.hand_over
    }

    /// Restores `part` (the first carries the non-keyed state and every timer) into the new
    /// instance; the first failure is kept and later parts are skipped.
    pub(super) fn put(&mut self, part: &SubtaskState) {
        if !self.hand_over {
            self.bytes += part.keyed.iter().map(|k| k.data.len() as u64).sum::<u64>();
            return self.call(|new, schema| put_state(new, schema, part), part.operator_state.len());
        }
        // The store stays where it is: of the part, the non-keyed state and the timers.
        let keyed = part.keyed.iter().map(|k| KeyGroupSnapshot { data: Vec::new(), ..k.clone() }).collect();
        let carried = SubtaskState { keyed, operator_state: part.operator_state.clone(), ..Default::default() };
        self.call(|new, schema| put_state(new, schema, &carried), carried.operator_state.len());
    }

    /// Restores a later chunk: key-group data only (the timers came with the first part).
    pub(super) fn put_chunk(&mut self, chunk: &[KeyGroupState]) {
        let keyed: Vec<KeyGroupState> = chunk.iter().filter(|k| !k.data.is_empty()).cloned().collect();
        if self.hand_over || keyed.is_empty() {
            return;
        }
        let bytes = keyed.iter().map(|k| k.data.len()).sum();
        let snap = OperatorSnapshot { keyed, operator_state: Vec::new() };
        self.call(|new, schema| new.restore(schema, &snap), bytes);
    }

    /// One restore call into the new instance, counting `bytes`; the first failure is kept
    /// and later calls are skipped.
    fn call<E: std::fmt::Display>(
        &mut self,
        restore: impl FnOnce(&mut dyn OperatorLogic, u32) -> Result<(), E>,
        bytes: usize,
    ) {
        self.bytes += bytes as u64;
        let Ok(new) = self.new.as_mut() else { return };
        let result = restore(new.as_mut(), self.schema);
        // Records a guest emits while restoring are not part of the stream.
        let _ = new.take_emitted();
        if let Err(e) = result {
            self.new = Err(e.to_string());
        }
    }

    /// The new instance once every part is in; `full`: the snapshot held the whole state.
    pub(super) fn finish(self, full: bool) -> (Result<Prepared, String>, u64) {
        if self.hand_over {
            return (self.new.map(Prepared::HandOver), self.bytes);
        }
        if !full {
            let why =
                "the upgrade's checkpoint was taken as a delta, not a full snapshot (a bug): nothing to migrate from";
            return (Err(why.into()), self.bytes);
        }
        let new = self.new.and_then(|mut new| {
            if new.keyed_state_on_disk() {
                // Its next snapshot is full (a new chain): the restore's record of changes
                // is not needed, and its files go now.
                new.restored_as_base().map_err(|e| e.to_string())?;
            }
            Ok(Prepared::Replace(new))
        });
        (new, self.bytes)
    }
}

impl OperatorTask {
    /// The upgrade armed for the barrier of `id`, unless `id` was already aborted or decided
    /// (a rollback) before this subtask got there.
    pub(super) fn armed_upgrade(&mut self, id: CheckpointId) -> Option<OperatorFactory> {
        let factory = self.upgrade.take_if(|(u, _)| *u == id).map(|(_, f)| f)?;
        let decided = self
            .deferred
            .iter()
            .any(|c| matches!(c, Control::Abort(a) | Control::UpgradeDecision { id: a, .. } if *a == id));
        (!decided).then_some(factory)
    }

    /// The barrier of upgrade checkpoint `id` (already forwarded): snapshot, prepare the new
    /// instance, report, wait for the decision, switch or go on.
    pub(super) fn upgrade_at_barrier(
        &mut self,
        id: CheckpointId,
        align_ms: f64,
        factory: OperatorFactory,
    ) -> Result<(), TaskFailure> {
        let t0 = Instant::now();
        let disk = self.instance.keyed_state_on_disk();
        let hand_over = disk
            && factory.info().schema_version == self.schema_version
            && self.instance.can_hand_over(&keyed_states(&factory));
        // The new instances restore from this snapshot: it is full. A hand-over restores no
        // keyed state (the store stays), so its chain goes on and the snapshot may be a delta.
        if let Some(p) = self.checkpoints.as_mut().filter(|_| !hand_over) {
            p.force_full(id);
        }
        if disk {
            // The previous checkpoint's chunks must not go into the new instance.
            self.drain_all()?;
            let tee = if hand_over {
                Tee::hand_over(self.new_paged_guest(&factory), self.schema_version)
            } else {
                Tee::new(self.new_instance(&factory), self.schema_version)
            };
            self.snapshot_streaming(id, align_ms, Some(tee))?;
            if self.upgrade_ready.is_none() {
                self.drain_upgrade(id)?;
            }
        } else {
            self.prepare_in_memory(id, align_ms, &factory)?;
        }
        // Nothing prepared: the checkpoint was aborted while its snapshot was drained.
        let Some(prepared) = self.upgrade_ready.take() else { return self.fault_at_barrier(id) };
        let commit = self.await_decision(id)?;
        let committed = match (commit, prepared) {
            (true, Ok(Prepared::Replace(new))) => {
                self.instance = new;
                self.schema_version = factory.info().schema_version;
                if let Some(p) = self.checkpoints.as_mut() {
                    p.state_replaced();
                }
                true
            }
            (true, Ok(Prepared::HandOver(guest))) => {
                drop(self.instance.hand_over(guest));
                true
            }
            _ => false,
        };
        let pause_ms = t0.elapsed().as_secs_f64() * 1e3;
        if let Some(p) = self.checkpoints.as_ref() {
            let _ = p.events.send(Event::UpgradeResumed { task: p.task, id, committed, pause_ms });
        }
        self.route_emitted()?;
        self.fault_at_barrier(id)
    }

    /// Pulls the rest of the upgrade's snapshot (and through it the migration), between
    /// chunks looking for an abort of `id` (which abandons both) and for cancellation: a
    /// store can be far larger than memory, so this can take a while.
    fn drain_upgrade(&mut self, id: CheckpointId) -> Result<(), TaskFailure> {
        while self.draining.as_ref().is_some_and(|d| d.id == id) {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskFailure::Cancelled { task: self.id.clone() });
            }
            self.read_control_ahead();
            if self.deferred.iter().any(|c| matches!(c, Control::Abort(a) if *a == id)) {
                self.abandon_drain(id);
                break;
            }
            self.drain_step()?;
        }
        Ok(())
    }

    /// The memory backend: the whole state is captured at once (the guest holds it anyway),
    /// restored into the new instance, then handed to the writer.
    fn prepare_in_memory(
        &mut self,
        id: CheckpointId,
        align_ms: f64,
        factory: &OperatorFactory,
    ) -> Result<(), TaskFailure> {
        let t0 = Instant::now();
        let state = self.snapshot_state(id)?;
        let sync_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut tee = Tee::new(self.new_instance(factory), self.schema_version);
        tee.put(&state);
        self.upgrade_prepared(id, tee.finish(true));
        if let Some(p) = self.checkpoints.as_mut() {
            p.submit(id, state, Timing { align_ms, sync_ms, async_ms: 0.0 });
        }
        Ok(())
    }

    /// Reports the prepared upgrade at `id` to the coordinator and keeps the new instance
    /// until the decision.
    pub(super) fn upgrade_prepared(&mut self, id: CheckpointId, (new, state_bytes): (Result<Prepared, String>, u64)) {
        if let Some(p) = self.checkpoints.as_ref() {
            let result = new.as_ref().map(|_| ()).map_err(|e| e.clone());
            let _ = p.events.send(Event::UpgradePrepared { task: p.task, id, result, state_bytes });
        }
        self.upgrade_ready = Some(new);
    }

    /// A new instance of `factory` for this subtask, on the running instance's state
    /// backend, opened. The running instance is not touched.
    fn new_instance(&mut self, factory: &OperatorFactory) -> Result<Box<dyn OperatorLogic>, String> {
        let guest = self.new_guest(factory)?;
        let mut new = self.instance.successor(guest, keyed_states(factory), factory.info().schema_version)?;
        new.open(&self.config).map_err(|e| e.to_string())?;
        Ok(new)
    }

    /// A new guest of `factory` for this subtask, opened with its keyed state paged (for a
    /// hand-over of the running store).
    fn new_paged_guest(&mut self, factory: &OperatorFactory) -> Result<Box<dyn OperatorLogic>, String> {
        let mut guest = self.new_guest(factory)?;
        guest.open(&self.config).map_err(|e| e.to_string())?;
        guest.page_in(Vec::new()).map_err(|e| e.to_string())?;
        Ok(guest)
    }

    /// A new guest of `factory` for this subtask (task, limits, watermark as the running
    /// one's), not opened.
    fn new_guest(&mut self, factory: &OperatorFactory) -> Result<Box<dyn OperatorLogic>, String> {
        let old = self.instance.host();
        let mut host =
            HostState::new(old.task.clone(), factory.info().side_outputs.len() as u32).with_limits(old.limits);
        host.echo_logs = old.echo_logs;
        host.watermark = old.watermark;
        factory.instantiate(host).map_err(|e| e.to_string())
    }

    /// Waits for the coordinator's decision on the upgrade at `id` (the operator's inputs
    /// stay unread meanwhile); an abort of `id` is a rollback.
    fn await_decision(&mut self, id: CheckpointId) -> Result<bool, TaskFailure> {
        let Some(control) = self.checkpoints.as_ref().map(|p| p.control.clone()) else { return Ok(false) };
        // Messages read ahead come first.
        if let Some(i) =
            self.deferred.iter().position(|c| matches!(c, Control::UpgradeDecision { id: d, .. } if *d == id))
        {
            let Some(Control::UpgradeDecision { commit, .. }) = self.deferred.remove(i) else { unreachable!() };
            return Ok(commit);
        }
        if self.deferred.iter().any(|c| matches!(c, Control::Abort(a) if *a == id) || matches!(c, Control::Stop)) {
            return Ok(false);
        }
        loop {
            match control.recv_timeout(Duration::from_millis(50)) {
                Ok(Control::UpgradeDecision { id: d, commit }) if d == id => return Ok(commit),
                Ok(Control::Abort(a)) if a == id => {
                    self.deferred.push_back(Control::Abort(a));
                    return Ok(false);
                }
                Ok(Control::Stop) => {
                    self.deferred.push_back(Control::Stop);
                    return Ok(false);
                }
                Ok(other) => self.deferred.push_back(other),
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
}

/// `factory`'s keyed states, in declaration order (a disk store's order).
fn keyed_states(factory: &OperatorFactory) -> Vec<String> {
    factory.info().states.iter().filter(|s| s.keyed).map(|s| s.name.clone()).collect()
}
