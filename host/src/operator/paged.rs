//! The disk state backend (`state_backend = "disk"`): an operator whose keyed state lives in
//! a store on local disk ([`StateStore`]), with the guest's memory as a bounded cache of the
//! keys in use ([`Residency`]). It wraps the operator's instance and looks like any other
//! [`OperatorLogic`] to the subtask.
//!
//! Invariants:
//! - before a call, every key of its batch (records or timers) is resident: the missing
//!   ones are read from the store and paged in with one `page-in` call, so the per-record path
//!   makes no host call;
//! - after a call, when the cache passes its budget, one `page-out` takes every change since
//!   the previous one into the store and drops the coldest quarter of the keys;
//! - at a checkpoint barrier (the first `snapshot` call of a checkpoint) every change is paged
//!   out and a read view of the store is taken: the snapshot is that view, handed out in
//!   chunks of whole key groups in the canonical layout (a savepoint restores into either
//!   backend), while records go on changing the store;
//! - with incremental checkpoints the store records which keys each page-out changed, in
//!   the current change epoch; a barrier closes the epoch, and an incremental snapshot is, per
//!   key group with state, a delta of the keys changed up to it with their values in the view
//!   (what the memory backend's SDKs write too); the changes up to the barrier are forgotten
//!   once every group of a delta went out, or at the barrier of a full one; later epochs'
//!   stay. A delta abandoned half-way forgets nothing (the next snapshot covers its epochs);
//! - a restore of state written at the component's own schema version goes into the store
//!   as it is, the guest getting only the non-keyed state; one written at another version
//!   goes through the guest in chunks of key groups (so it migrates state as on the memory
//!   backend) and each chunk is paged out into the store at once: the cache never holds more
//!   than a chunk.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::graph::logical::Side;
use crate::operator::OperatorLogic;
use crate::operator::residency::Residency;
use crate::operator::store::{ReadView, StateStore, StoreError};
use crate::record::Batch;
use crate::sandbox::bindings::types::{KeyGroupState, OperatorSnapshot, SnapshotMode, TimeDomain};
use crate::sandbox::host::HostState;
use crate::sandbox::instance::GuestError;

/// Bytes of key-group blobs one `snapshot` call hands out (about; whole groups), as the
/// SDKs' chunks on the memory backend.
pub const CHUNK_BYTES: usize = 256 << 10;

/// The key group of the entry that says "more follows" (`wit/operator.wit`).
const MORE: u32 = u32::MAX;

/// What the disk backend did, summed over a node's subtasks.
#[derive(Debug, Default)]
pub struct PagingCounters {
    /// Keys read from the store into a guest's cache (with state; keys without are not read).
    pub keys_paged_in: AtomicU64,
    /// Keys dropped from a guest's cache to keep it within its budget.
    pub keys_evicted: AtomicU64,
    /// Entries written to the store (upserts and removals).
    pub entries_written: AtomicU64,
}

/// A checkpoint's snapshot being handed out.
struct InProgress {
    checkpoint: u64,
    view: ReadView,
    next: u32,
    /// Full blobs (else deltas of the changes up to `epoch`).
    full: bool,
    /// The change epoch the barrier closed.
    epoch: u64,
}

/// What a disk-backed subtask pages.
pub struct Setup {
    /// The operator's declared keyed states, in order.
    pub states: Vec<String>,
    /// The key groups the subtask owns.
    pub groups: Range<u32>,
    /// Bytes of the guest's cache.
    pub cache_bytes: usize,
    /// Incremental checkpoints: the store tracks what changed between barriers.
    pub track: bool,
    /// The tenant's disk budget (`weir serve`): what goes into the store is charged to it.
    pub budget: Option<Arc<crate::disk_budget::DiskBudget>>,
    /// The state schema version the component declares: state restored at another one goes
    /// through the guest, which migrates it.
    pub schema_version: u32,
}

/// An operator instance on the disk backend.
pub struct Paged {
    inner: Box<dyn OperatorLogic>,
    store: StateStore,
    resident: Residency,
    groups: Range<u32>,
    snapshot: Option<InProgress>,
    /// Bytes of keyed state one restore call hands the guest (about; whole groups).
    restore_chunk: usize,
    /// Bytes of the guest's cache.
    cache_bytes: usize,
    counters: Arc<PagingCounters>,
    /// The guest's linear memory after the previous call.
    guest_memory: u64,
    /// Incremental checkpoints: changes are recorded with `epoch`, which each barrier closes.
    track: bool,
    epoch: u64,
    budget: Option<Arc<crate::disk_budget::DiskBudget>>,
    schema_version: u32,
}

impl Paged {
    /// Wraps `inner` (opened later through [`OperatorLogic::open`]) with a new store in `dir`.
    pub fn new(
        inner: Box<dyn OperatorLogic>,
        dir: &Path,
        setup: Setup,
        counters: Arc<PagingCounters>,
    ) -> Result<Paged, StoreError> {
        let Setup { states, groups, cache_bytes, track, budget, schema_version } = setup;
        let count = states.len();
        let store = StateStore::open(dir, states, (cache_bytes as u64 / 2).max(8 << 20))?;
        Ok(Paged {
            inner,
            store,
            resident: Residency::new(cache_bytes, count),
            groups,
            snapshot: None,
            restore_chunk: (cache_bytes / 4).max(CHUNK_BYTES),
            cache_bytes,
            counters,
            guest_memory: 0,
            track,
            epoch: 1,
            budget,
            schema_version,
        })
    }

    /// Pages in the keys of `batch` the guest does not hold, after making room for them
    /// (older keys go first: the batch's are the newest).
    fn ensure_resident(&mut self, batch: &Batch, call: &'static str) -> Result<(), GuestError> {
        self.resident.next_call();
        let mut missing: Vec<(u32, &[u8])> = Vec::new();
        for r in batch.iter() {
            if self.groups.contains(&r.tag) && !self.resident.touch(r.tag, r.key) {
                missing.push((r.tag, r.key));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        self.settle()?;
        self.fetch(missing, call)
    }

    /// Reads `keys` from the store and hands their state to the guest, in calls of at most a
    /// restore chunk each (a batch of large values never needs one huge allocation).
    fn fetch(&mut self, mut keys: Vec<(u32, &[u8])>, call: &'static str) -> Result<(), GuestError> {
        keys.sort_unstable();
        let (pages, entries) = self.store.read(&keys).map_err(store_failed(call))?;
        self.counters.keys_paged_in.fetch_add(keys.len() as u64, Ordering::Relaxed);
        let bytes: usize = pages.iter().map(|p| p.data.len()).sum();
        self.resident.observe(entries, bytes);
        let mut part = Vec::new();
        let mut part_bytes = 0;
        for p in pages {
            if part_bytes + p.data.len() > self.restore_chunk && !part.is_empty() {
                self.inner.page_in(std::mem::take(&mut part))?;
                part_bytes = 0;
            }
            part_bytes += p.data.len();
            part.push(p);
        }
        if !part.is_empty() {
            self.inner.page_in(part)?;
        }
        Ok(())
    }

    /// Takes the guest's changes into the store, dropping `evict` (or every key) from it.
    /// The guest hands its changes out in chunks (so a page-out never needs more guest
    /// memory than a chunk); each is written as it comes.
    fn write_back(&mut self, evict: Vec<u8>, all: bool) -> Result<(), GuestError> {
        let mut evict = Some(evict);
        // One call per owned group at most, plus the last: a guest that keeps saying "more"
        // is refused, not followed forever.
        let mut calls_left = self.groups.len() + 2;
        loop {
            let mut pages = self.inner.page_out(evict.take().unwrap_or_default(), all)?;
            let more = pages.last().is_some_and(|p| p.key_group == MORE);
            if more {
                pages.pop();
            }
            calls_left -= 1;
            let refused = |message: String| GuestError::Failed { call: "page-out", message };
            if more && calls_left == 0 {
                return Err(refused(format!(
                    "still \"more follows\" after {} calls for {} key groups",
                    self.groups.len() + 1,
                    self.groups.len()
                )));
            }
            if let Some(p) = pages.iter().find(|p| !self.groups.contains(&p.key_group)) {
                return Err(refused(format!(
                    "a page of key group {}, which this subtask does not own ([{}, {}))",
                    p.key_group, self.groups.start, self.groups.end
                )));
            }
            let epoch = self.track.then_some(self.epoch);
            self.charge(&pages, epoch.is_some(), "page-out")?;
            let (entries, bytes) = self.store.apply(&pages, epoch).map_err(store_failed("page-out"))?;
            self.resident.observe(entries, bytes);
            self.counters.entries_written.fetch_add(entries as u64, Ordering::Relaxed);
            if !more {
                break;
            }
        }
        if all {
            self.resident.clear();
        }
        Ok(())
    }

    /// Charges what `pages` put into the store (`recorded`: and into a change epoch) to the
    /// tenant's disk budget.
    fn charge(&self, pages: &[KeyGroupState], recorded: bool, call: &'static str) -> Result<(), GuestError> {
        let Some(b) = &self.budget else { return Ok(()) };
        // Incremental checkpoints write every change twice: to the state and to its epoch's
        // record of changes (`operator/store.rs`).
        let copies = if recorded { 2 } else { 1 };
        let bytes = copies * pages.iter().map(|p| p.data.len() as u64).sum::<u64>();
        b.charge(bytes).map_err(|message| GuestError::Failed { call, message })
    }

    /// Restored key groups written at the component's own schema version: the checkpoint's
    /// blobs are in the store's layout, so they go into the store as they are, without the
    /// guest (which would decode each one into its cache only to page it out again). The
    /// guest gets the non-keyed state alone. Nothing is recorded as a change: the first
    /// snapshot after a restore is full, or a delta on the very chain restored
    /// ([`OperatorLogic::restored_as_base`]). A malformed blob fails the restore naming its
    /// key group, as the guest would.
    fn restore_unmigrated(&mut self, state: &OperatorSnapshot) -> Result<(), GuestError> {
        let failed = |message: String| GuestError::Failed { call: "restore", message };
        // What the guest's page-out would have been held to: owned groups, the state layout,
        // values within `max_state_value_mb` (declared states: `StateStore::load`).
        let max_value = (self.inner.host().limits.max_state_value_mb << 20) as usize;
        for g in &state.keyed {
            if !self.groups.contains(&g.key_group) {
                return Err(failed(format!(
                    "restored key group {}, which this subtask does not own ([{}, {}))",
                    g.key_group, self.groups.start, self.groups.end
                )));
            }
            let shape = crate::checkpoint::layout::walk(&g.data)
                .map_err(|e| failed(format!("restored key group {}: not the state layout: {e}", g.key_group)))?;
            if shape.max_value > max_value {
                return Err(failed(format!(
                    "restored key group {}: a value of {} bytes > max_state_value_mb = {} MiB ([limits] in the job file)",
                    g.key_group,
                    shape.max_value,
                    max_value >> 20
                )));
            }
        }
        if !state.operator_state.is_empty() {
            let rest = OperatorSnapshot { keyed: Vec::new(), operator_state: state.operator_state.clone() };
            self.inner.restore(self.schema_version, &rest)?;
        }
        // In batches of about a restore chunk (a checkpoint of the older format arrives whole).
        let mut at = 0;
        while at < state.keyed.len() {
            let take = chunk_len(&state.keyed[at..], self.restore_chunk);
            let part = &state.keyed[at..at + take];
            self.charge(part, false, "restore")?;
            let (entries, bytes) = self.store.load(part).map_err(store_failed("restore"))?;
            self.resident.observe(entries, bytes);
            self.counters.entries_written.fetch_add(entries as u64, Ordering::Relaxed);
            at += take;
        }
        Ok(())
    }

    /// After a call: evicts the coldest keys when the cache is over its budget, or when the
    /// guest's memory grew past half its limit (values grow inside the guest, where the
    /// estimate cannot see them; the allocator reuses what eviction frees, so memory grows
    /// again only once the cache is full again).
    fn settle(&mut self) -> Result<(), GuestError> {
        let host = self.inner.host();
        let (used, limit) = (host.store_limits.memory_bytes(), host.limits.memory_mb << 20);
        let heap_full = used > self.guest_memory && used > limit / 2;
        self.guest_memory = used;
        if !self.resident.over_budget() && !heap_full {
            return Ok(());
        }
        let mut evict = Batch::default();
        let cold = self.resident.evict_coldest();
        self.counters.keys_evicted.fetch_add(cold.len() as u64, Ordering::Relaxed);
        for (group, key) in cold {
            evict.push(group, 0, &key, &[]);
        }
        self.write_back(evict.as_bytes().to_vec(), false)
    }

    /// The next chunk of the snapshot in progress: whole key groups' full blobs from the
    /// read view, and "more follows" while groups remain.
    fn next_chunk(&mut self) -> Result<Vec<KeyGroupState>, GuestError> {
        let Some(p) = self.snapshot.as_mut() else { return Ok(Vec::new()) };
        let (mut keyed, mut bytes) = (Vec::new(), 0);
        while p.next < self.groups.end && bytes < CHUNK_BYTES {
            let data = if p.full {
                self.store.group_blob(&p.view, p.next)
            } else {
                self.store.group_delta(&p.view, p.next, p.epoch)
            }
            .map_err(store_failed("snapshot"))?;
            if !data.is_empty() {
                bytes += data.len();
                keyed.push(KeyGroupState { key_group: p.next, data });
            }
            p.next += 1;
        }
        if p.next < self.groups.end {
            keyed.push(KeyGroupState { key_group: MORE, data: Vec::new() });
        } else {
            let epoch = p.epoch;
            self.snapshot = None;
            // Every group went out: no later delta needs the changes up to the barrier.
            self.store.forget_changes(epoch).map_err(store_failed("snapshot"))?;
        }
        Ok(keyed)
    }
}

fn store_failed(call: &'static str) -> impl Fn(StoreError) -> GuestError {
    move |e| GuestError::Failed { call, message: e.to_string() }
}

impl OperatorLogic for Paged {
    fn host(&mut self) -> &mut HostState {
        self.inner.host()
    }

    fn open(&mut self, config: &[(String, String)]) -> Result<(), GuestError> {
        self.inner.open(config)?;
        // From here on the guest's keyed state is this cache (see `paged-operator`).
        self.inner.page_in(Vec::new())
    }

    fn process(&mut self, side: Side, batch: &Batch) -> Result<(), GuestError> {
        self.ensure_resident(batch, "process")?;
        self.inner.process(side, batch)?;
        self.settle()
    }

    fn on_timer(&mut self, domain: TimeDomain, timers: &Batch) -> Result<(), GuestError> {
        self.ensure_resident(timers, "on-timer")?;
        self.inner.on_timer(domain, timers)?;
        self.settle()
    }

    fn on_watermark(&mut self, watermark: i64) -> Result<(), GuestError> {
        self.inner.on_watermark(watermark)
    }

    fn snapshot(&mut self, checkpoint: u64, mode: SnapshotMode) -> Result<OperatorSnapshot, GuestError> {
        let mut operator_state = Vec::new();
        if self.snapshot.as_ref().is_none_or(|p| p.checkpoint != checkpoint) {
            // The barrier: every change into the store, the non-keyed state from the guest,
            // then a read view of the store is the keyed state.
            self.write_back(Vec::new(), false)?;
            let snap = self.inner.snapshot(checkpoint, mode)?;
            if !snap.keyed.is_empty() {
                return Err(GuestError::Failed {
                    call: "snapshot",
                    message: "the operator handed out keyed state from its snapshot while its state is paged \
                              (the disk backend keeps it): an SDK bug"
                        .into(),
                });
            }
            operator_state = snap.operator_state;
            let view = self.store.read_view().map_err(store_failed("snapshot"))?;
            let full = !self.track || matches!(mode, SnapshotMode::Full);
            if full && self.track {
                // A full snapshot covers every change up to the barrier; should it be
                // abandoned, the next one is full again. So no delta needs them any more,
                // and abandoned snapshots never pile change epochs up.
                self.store.forget_changes(self.epoch).map_err(store_failed("snapshot"))?;
            }
            self.snapshot = Some(InProgress { checkpoint, view, next: self.groups.start, full, epoch: self.epoch });
            self.epoch += 1;
        }
        Ok(OperatorSnapshot { keyed: self.next_chunk()?, operator_state })
    }

    fn restore(&mut self, schema_version: u32, state: &OperatorSnapshot) -> Result<(), GuestError> {
        if state.keyed.is_empty() {
            return self.inner.restore(schema_version, state);
        }
        if schema_version == self.schema_version {
            return self.restore_unmigrated(state);
        }
        let mut operator_state = state.operator_state.clone();
        let mut at = 0;
        while at < state.keyed.len() {
            let end = at + chunk_len(&state.keyed[at..], self.restore_chunk);
            let part = OperatorSnapshot {
                keyed: state.keyed[at..end].to_vec(),
                operator_state: std::mem::take(&mut operator_state),
            };
            self.inner.restore(schema_version, &part)?;
            self.write_back(Vec::new(), true)?;
            at = end;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), GuestError> {
        self.inner.close()
    }

    fn take_emitted(&mut self) -> Batch {
        self.inner.take_emitted()
    }

    fn query_state(&mut self, state: &str, key_group: u32, key: &[u8]) -> Result<Option<String>, GuestError> {
        if self.groups.contains(&key_group)
            && !self.resident.touch(key_group, key)
            && let Err(e) = self.fetch(vec![(key_group, key)], "query-state")
        {
            // Not in the guest: the next batch with this key must page it in.
            self.resident.forget(key_group, key);
            return Err(e);
        }
        let answer = self.inner.query_state(state, key_group, key);
        // Queries page keys in too: they count against the cache like batches.
        self.settle()?;
        answer
    }

    fn page_in(&mut self, state: Vec<KeyGroupState>) -> Result<(), GuestError> {
        self.inner.page_in(state)
    }

    fn page_out(&mut self, evict: Vec<u8>, all: bool) -> Result<Vec<KeyGroupState>, GuestError> {
        self.inner.page_out(evict, all)
    }
    fn keyed_state_on_disk(&self) -> bool {
        true
    }

    fn can_hand_over(&self, keyed_states: &[String]) -> bool {
        self.store.states() == keyed_states
    }

    fn hand_over(&mut self, inner: Box<dyn OperatorLogic>) -> Box<dyn OperatorLogic> {
        self.resident.clear();
        self.guest_memory = 0;
        std::mem::replace(&mut self.inner, inner)
    }

    fn successor(
        &self,
        inner: Box<dyn OperatorLogic>,
        keyed_states: Vec<String>,
        schema_version: u32,
    ) -> Result<Box<dyn OperatorLogic>, String> {
        let root = self.store.dir().parent().unwrap_or(Path::new("."));
        let setup = Setup {
            states: keyed_states,
            groups: self.groups.clone(),
            cache_bytes: self.cache_bytes,
            track: self.track,
            budget: self.budget.clone(),
            schema_version,
        };
        let next = Paged::new(inner, &fresh_store_dir(root), setup, self.counters.clone())
            .map_err(|e| format!("{e} (give the disk backend a writable directory with space: WEIR_STATE_DIR)"))?;
        Ok(Box::new(next))
    }

    fn restored_as_base(&mut self) -> Result<(), GuestError> {
        if self.track {
            // Every restored key was paged out in a change epoch: none is a change.
            self.store.forget_changes(self.epoch).map_err(store_failed("restore"))?;
            self.epoch += 1;
        }
        Ok(())
    }
}

/// How many of `groups` (at least one) make a chunk of at most `limit` bytes.
fn chunk_len(groups: &[KeyGroupState], limit: usize) -> usize {
    let mut bytes = 0;
    groups
        .iter()
        .take_while(|g| {
            bytes += g.data.len();
            bytes <= limit
        })
        .count()
        .max(1)
}

/// Where the disk backend's stores live: `$WEIR_STATE_DIR`, else the system's temporary
/// directory, under `weir-state/`.
pub fn state_root() -> std::path::PathBuf {
    std::env::var_os("WEIR_STATE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("weir-state")
}

/// A fresh directory for one subtask's store under `root` (created private, `0700`):
/// `<host>-<pid>-<n>`, never a name a tenant chose. Stores this host's processes left behind
/// when they were killed are removed first; other hosts' (a shared directory, containers with
/// their own process ids) are never touched.
pub fn fresh_store_dir(root: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(root);
    let host = host_name();
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_dead(root, &host));
    root.join(format!("{host}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// This host's name, reduced to `[A-Za-z0-9.]` (it becomes part of a path).
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = name.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '.').take(64).collect();
    if name.is_empty() { "host".into() } else { name }
}

/// Removes the stores of `host`'s processes that no longer run (best effort).
fn sweep_dead(root: &Path, host: &str) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(host)).and_then(|n| n.strip_prefix('-')) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::layout::{NamedState, encode};
    use crate::operator::recording::{Recording, Restores};
    use crate::sandbox::bindings::types::TaskInfo;

    fn paged(dir: &Path, track: bool) -> (Paged, Restores) {
        let task = TaskInfo {
            job_name: "j".into(),
            operator_uid: "op".into(),
            subtask_index: 0,
            parallelism: 1,
            max_parallelism: 8,
            key_group_start: 0,
            key_group_end: 4,
        };
        let inner = Recording::new(task, false);
        let restores = Arc::clone(&inner.calls);
        let setup = Setup {
            states: vec!["s".into()],
            groups: 0..4,
            cache_bytes: 1 << 20,
            track,
            budget: None,
            schema_version: 3,
        };
        (Paged::new(Box::new(inner), dir, setup, Arc::default()).unwrap(), restores)
    }

    fn group(g: u32, entries: &[(&[u8], &[u8])]) -> KeyGroupState {
        let entries = entries.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
        KeyGroupState { key_group: g, data: encode(&[NamedState { name: "s".into(), entries }]) }
    }

    /// State restored at the component's own schema version goes into the store as it is:
    /// the guest sees only the non-keyed state, the keys read back from the store, and no
    /// restored key counts as a change of the next incremental snapshot. At another version
    /// the guest gets the key groups (it migrates them).
    #[test]
    fn an_unmigrated_restore_writes_the_store_without_the_guest() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut p, restores) = paged(&tmp.path().join("a"), true);
        let keyed = vec![group(1, &[(b"a", b"1"), (b"b", b"2")]), group(3, &[(b"c", b"3")])];
        p.restore(3, &OperatorSnapshot { keyed: keyed.clone(), operator_state: vec![9; 5] }).unwrap();
        assert_eq!(*restores.lock().unwrap(), vec![(vec![], 0, 5)], "the guest got the non-keyed state alone");
        let (pages, found) = p.store.read(&[(1, b"a"), (1, b"b"), (3, b"c"), (3, b"zz")]).unwrap();
        assert_eq!(found, 3);
        let as_read: Vec<(u32, Vec<u8>)> = pages.into_iter().map(|p| (p.key_group, p.data)).collect();
        assert_eq!(as_read, keyed.iter().map(|k| (k.key_group, k.data.clone())).collect::<Vec<_>>());
        assert_eq!(p.counters.entries_written.load(Ordering::Relaxed), 3);
        // A delta right after it holds nothing restored.
        let view = p.store.read_view().unwrap();
        let delta = p.store.group_delta(&view, 1, p.epoch).unwrap();
        let changes = crate::checkpoint::layout::decode_delta(&delta).unwrap();
        assert!(changes.iter().all(|(_, c)| c.is_empty()), "{changes:?}");

        let (mut p, restores) = paged(&tmp.path().join("b"), false);
        p.restore(2, &OperatorSnapshot { keyed: keyed.clone(), operator_state: Vec::new() }).unwrap();
        assert_eq!(
            *restores.lock().unwrap(),
            vec![(vec![1, 3], keyed[0].data.len() + keyed[1].data.len(), 0)],
            "migrated by the guest"
        );

        let (mut p, _) = paged(&tmp.path().join("c"), false);
        let e = p.restore(3, &OperatorSnapshot { keyed: vec![group(6, &[])], operator_state: Vec::new() }).unwrap_err();
        assert!(e.to_string().contains("key group 6"), "{e}");
        p.inner.host().limits.max_state_value_mb = 1;
        let big = group(2, &[(b"k", &vec![0u8; (1 << 20) + 1])]);
        let e = p.restore(3, &OperatorSnapshot { keyed: vec![big], operator_state: Vec::new() }).unwrap_err();
        assert!(e.to_string().contains("max_state_value_mb"), "{e}");
        let bad = KeyGroupState { key_group: 2, data: vec![1, 2, 3] };
        let e = p.restore(3, &OperatorSnapshot { keyed: vec![bad], operator_state: Vec::new() }).unwrap_err();
        assert!(e.to_string().contains("key group 2"), "{e}");
    }
}
