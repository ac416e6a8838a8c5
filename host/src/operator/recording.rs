//! A test double of a guest: it records the `restore` calls it gets (key groups, their
//! bytes, operator-state bytes) and holds no state (its page-outs are empty).

use std::sync::{Arc, Mutex};

use crate::graph::logical::Side;
use crate::operator::OperatorLogic;
use crate::record::Batch;
use crate::sandbox::bindings::types::{KeyGroupState, OperatorSnapshot, SnapshotMode, TaskInfo, TimeDomain};
use crate::sandbox::host::HostState;
use crate::sandbox::instance::GuestError;

/// The `restore` calls a [`Recording`] got: (key groups, their bytes, operator-state bytes).
pub(crate) type Restores = Arc<Mutex<Vec<(Vec<u32>, usize, usize)>>>;

/// A guest that records its `restore` calls.
pub(crate) struct Recording {
    pub host: HostState,
    /// Whether it says its keyed state is on disk.
    pub disk: bool,
    pub calls: Restores,
}

impl Recording {
    pub fn new(task: TaskInfo, disk: bool) -> Recording {
        Recording { host: HostState::new(task, 0), disk, calls: Restores::default() }
    }
}

impl OperatorLogic for Recording {
    fn host(&mut self) -> &mut HostState {
        &mut self.host
    }
    fn open(&mut self, _: &[(String, String)]) -> Result<(), GuestError> {
        Ok(())
    }
    fn process(&mut self, _: Side, _: &Batch) -> Result<(), GuestError> {
        Ok(())
    }
    fn on_timer(&mut self, _: TimeDomain, _: &Batch) -> Result<(), GuestError> {
        Ok(())
    }
    fn on_watermark(&mut self, _: i64) -> Result<(), GuestError> {
        Ok(())
    }
    fn snapshot(&mut self, _: u64, _: SnapshotMode) -> Result<OperatorSnapshot, GuestError> {
        Ok(OperatorSnapshot { keyed: Vec::new(), operator_state: Vec::new() })
    }
    fn restore(&mut self, _: u32, state: &OperatorSnapshot) -> Result<(), GuestError> {
        let bytes = state.keyed.iter().map(|k| k.data.len()).sum();
        let groups = state.keyed.iter().map(|k| k.key_group).collect();
        self.calls.lock().unwrap().push((groups, bytes, state.operator_state.len()));
        Ok(())
    }
    fn close(&mut self) -> Result<(), GuestError> {
        Ok(())
    }
    fn take_emitted(&mut self) -> Batch {
        Batch::default()
    }
    fn keyed_state_on_disk(&self) -> bool {
        self.disk
    }
    fn page_out(&mut self, _: Vec<u8>, _: bool) -> Result<Vec<KeyGroupState>, GuestError> {
        Ok(Vec::new())
    }
}
