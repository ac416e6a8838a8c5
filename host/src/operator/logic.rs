//! The operator interface the subtask loop drives, and the factory a job binds per operator.
//!
//! Invariant: both implementations speak the same contract — the WIT record framing, the
//! per-key-group state layout, the same host state (timers, watermark) — so a subtask
//! cannot tell them apart, and a snapshot of one restores into the other.

use std::sync::Arc;

use crate::declared::OperatorInfo;
use crate::graph::logical::Side;
use crate::operator::native::NativeKeyedCount;
use crate::record::Batch;
use crate::sandbox::bindings::types::{KeyGroupState, OperatorSnapshot, SnapshotMode, TimeDomain};
use crate::sandbox::host::HostState;
use crate::sandbox::instance::{GuestError, LoadedComponent, OperatorInstance};

/// One operator instance of one subtask.
pub trait OperatorLogic: Send {
    /// Host-side state: task identity, watermark, timers.
    fn host(&mut self) -> &mut HostState;
    /// `open`.
    fn open(&mut self, config: &[(String, String)]) -> Result<(), GuestError>;
    /// `process` / `process-left` / `process-right`.
    fn process(&mut self, side: Side, batch: &Batch) -> Result<(), GuestError>;
    /// `on-timer`.
    fn on_timer(&mut self, domain: TimeDomain, timers: &Batch) -> Result<(), GuestError>;
    /// `on-watermark`.
    fn on_watermark(&mut self, watermark: i64) -> Result<(), GuestError>;
    /// `snapshot`.
    fn snapshot(&mut self, checkpoint: u64, mode: SnapshotMode) -> Result<OperatorSnapshot, GuestError>;
    /// `restore`.
    fn restore(&mut self, schema_version: u32, state: &OperatorSnapshot) -> Result<(), GuestError>;
    /// `close`.
    fn close(&mut self) -> Result<(), GuestError>;
    /// Records emitted since the last call.
    fn take_emitted(&mut self) -> Batch;
    /// `query-state`: a key's current value in a keyed state, as JSON text.
    fn query_state(&mut self, state: &str, key_group: u32, key: &[u8]) -> Result<Option<String>, GuestError> {
        let _ = (state, key_group, key);
        Err(GuestError::Failed { call: "query-state", message: "this operator does not answer state queries".into() })
    }
    /// Whether the keyed state a snapshot hands out comes from a store on the host (the
    /// disk backend) rather than from the guest: it is then bounded by the tenant's disk, not
    /// by `max_snapshot_mb` (what the guest hands out itself still is).
    fn keyed_state_on_disk(&self) -> bool {
        false
    }
    /// The disk backend, after a restore: what the restore wrote is the base the next
    /// incremental snapshot builds on, not a change since it.
    fn restored_as_base(&mut self) -> Result<(), GuestError> {
        Err(GuestError::Failed { call: "restore", message: "this operator keeps no record of changes".into() })
    }
    /// The instance that replaces this one in a live upgrade: `inner` (a new component's
    /// instance, not yet opened) with the same state backend. On the disk backend that is a
    /// new store of its own (`keyed_states` in the new component's order), so a rolled-back
    /// upgrade leaves this one's store as it was; in memory it is `inner` itself. `schema_version`
    /// is the new component's.
    fn successor(
        &self,
        inner: Box<dyn OperatorLogic>,
        keyed_states: Vec<String>,
        schema_version: u32,
    ) -> Result<Box<dyn OperatorLogic>, String> {
        let _ = (keyed_states, schema_version);
        Ok(inner)
    }
    /// The disk backend, for a live upgrade that migrates nothing: whether the store holds
    /// exactly `keyed_states` (names and order), so a new component's instance can take it
    /// over as it is ([`OperatorLogic::hand_over`]).
    fn can_hand_over(&self, keyed_states: &[String]) -> bool {
        let _ = keyed_states;
        false
    }
    /// The disk backend: puts `inner` (opened, paged, non-keyed state and timers restored) in
    /// place of the running guest, whose changes the barrier's snapshot took into the store;
    /// the new guest starts with an empty cache. Returns the old guest.
    fn hand_over(&mut self, inner: Box<dyn OperatorLogic>) -> Box<dyn OperatorLogic> {
        inner
    }
    /// `page-in` (the disk backend): these keys' state into the guest's cache.
    fn page_in(&mut self, state: Vec<KeyGroupState>) -> Result<(), GuestError> {
        let _ = state;
        Err(GuestError::Failed { call: "page-in", message: "this operator cannot page its keyed state".into() })
    }
    /// `page-out` (the disk backend): the changes since the previous one; then the guest
    /// forgets `evict` (record framing) or every key.
    fn page_out(&mut self, evict: Vec<u8>, all: bool) -> Result<Vec<KeyGroupState>, GuestError> {
        let _ = (evict, all);
        Err(GuestError::Failed { call: "page-out", message: "this operator cannot page its keyed state".into() })
    }
}

impl OperatorLogic for OperatorInstance {
    fn host(&mut self) -> &mut HostState {
        OperatorInstance::host(self)
    }
    fn open(&mut self, config: &[(String, String)]) -> Result<(), GuestError> {
        OperatorInstance::open(self, config)
    }
    fn process(&mut self, side: Side, batch: &Batch) -> Result<(), GuestError> {
        OperatorInstance::process(self, side, batch)
    }
    fn on_timer(&mut self, domain: TimeDomain, timers: &Batch) -> Result<(), GuestError> {
        OperatorInstance::on_timer(self, domain, timers)
    }
    fn on_watermark(&mut self, watermark: i64) -> Result<(), GuestError> {
        OperatorInstance::on_watermark(self, watermark)
    }
    fn snapshot(&mut self, checkpoint: u64, mode: SnapshotMode) -> Result<OperatorSnapshot, GuestError> {
        OperatorInstance::snapshot(self, checkpoint, mode)
    }
    fn restore(&mut self, schema_version: u32, state: &OperatorSnapshot) -> Result<(), GuestError> {
        OperatorInstance::restore(self, schema_version, state)
    }
    fn close(&mut self) -> Result<(), GuestError> {
        OperatorInstance::close(self)
    }
    fn take_emitted(&mut self) -> Batch {
        OperatorInstance::take_emitted(self)
    }
    fn query_state(&mut self, state: &str, key_group: u32, key: &[u8]) -> Result<Option<String>, GuestError> {
        OperatorInstance::query_state(self, state, key_group, key)
    }
    fn page_in(&mut self, state: Vec<KeyGroupState>) -> Result<(), GuestError> {
        OperatorInstance::page_in(self, state)
    }
    fn page_out(&mut self, evict: Vec<u8>, all: bool) -> Result<Vec<KeyGroupState>, GuestError> {
        OperatorInstance::page_out(self, evict, all)
    }
}

/// Makes the operator instances of one job node.
#[derive(Clone)]
pub enum OperatorFactory {
    /// A compiled, checked WebAssembly component.
    Wasm(Arc<LoadedComponent>),
    /// `component = "native:keyed-count"`: the benchmark-only native keyed counter.
    NativeKeyedCount(Arc<OperatorInfo>),
}

impl OperatorFactory {
    /// What the operator declares.
    pub fn info(&self) -> &OperatorInfo {
        match self {
            OperatorFactory::Wasm(c) => &c.info,
            OperatorFactory::NativeKeyedCount(i) => i,
        }
    }

    /// SHA-256 of the component's bytes (WASM components).
    pub fn sha256(&self) -> Option<&str> {
        match self {
            OperatorFactory::Wasm(c) => Some(&c.sha256),
            OperatorFactory::NativeKeyedCount(_) => None,
        }
    }

    /// A new instance for the subtask described by `host`.
    pub fn instantiate(&self, host: HostState) -> Result<Box<dyn OperatorLogic>, GuestError> {
        Ok(match self {
            OperatorFactory::Wasm(c) => Box::new(c.instantiate(host)?),
            OperatorFactory::NativeKeyedCount(_) => Box::new(NativeKeyedCount::new(host)),
        })
    }
}
