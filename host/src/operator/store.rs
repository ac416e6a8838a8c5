//! The disk backend's store: one subtask's keyed state in an LSM tree (fjall) on local disk.
//!
//! Layout: key = key group (u32 big-endian, so a group is one contiguous range in key order)
//! ‖ state ordinal (u16 big-endian, the operator's declared keyed states in order) ‖ the
//! record key; value = the encoded value, exactly as in the state layout
//! (`wit/operator.wit`). Pages in and out are blobs of that layout, so the store never
//! decodes a value.
//!
//! Incremental checkpoints record every write of a change epoch a second time, with its value
//! (or a removal marker), in that epoch's record of changes ([`ChangeLog`], beside the
//! store), so a checkpoint's delta is a scan of the epochs it covers, newest winning, with no
//! lookup in the state and no bookkeeping per key; an epoch is dropped whole once a snapshot
//! handed every group out.
//!
//! Invariants: the store is scratch space of one attempt — created empty in a fresh
//! directory, filled from the checkpoint it restores (bulk-loaded while nothing else was
//! written, the load finished before anything reads or writes it), deleted when the
//! subtask ends —
//! so durability comes from checkpoints and the journal is never synced; a group's blob for
//! a checkpoint is read from a read snapshot taken at the barrier, so writes after the barrier
//! never show in it; a malformed page or an over-long key is an error naming it, never a
//! panic or a partial write (a page is one atomic batch; a restore's load is not, and a
//! failed one fails the store for good: the attempt restarts with a new one).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use fjall::{Config, Keyspace, PartitionCreateOptions, PartitionHandle, Snapshot};
use thiserror::Error;

use crate::checkpoint::layout::{self, DeltaState, NamedState};
use crate::operator::bulk_load::{BulkLoad, Run, sorted_run};
use crate::operator::changes::ChangeLog;
use crate::sandbox::bindings::types::KeyGroupState;

/// Bytes of the key prefix: key group and state ordinal.
const PREFIX: usize = 6;
/// fjall sleeps writers (100-500 ms at a time) when its memtables pass 90 % of the write
/// buffer or its journals 90 % of the journal limit: both are sized far above what one
/// memtable takes, so flushing keeps up and nobody sleeps.
const MEMTABLE: u32 = 8 << 20;
const WRITE_BUFFER: u64 = 32 << 20;
const JOURNAL: u64 = 128 << 20;
/// The longest record key the store takes (fjall's key limit of 65,535 bytes, less the
/// prefix; fjall asserts it, so it is checked here first).
pub const MAX_KEY_BYTES: usize = 65_535 - PREFIX;

/// A failure of the store.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The LSM tree failed (I/O: a full disk, a removed directory).
    #[error("the disk state backend's store at {dir}: {source}{hint}")]
    Io {
        /// The store's directory.
        dir: PathBuf,
        /// The cause.
        source: fjall::Error,
        /// What to do, when the disk is full.
        hint: String,
    },
    /// A restore's bulk load failed.
    #[error("the disk state backend's store at {dir}: loading the restored state failed: {message}")]
    BulkLoad {
        /// The store's directory.
        dir: PathBuf,
        /// The cause.
        message: String,
    },
    /// A page that breaks the state layout or names an undeclared state.
    #[error("key group {key_group}: {what}")]
    Page {
        /// The page's key group.
        key_group: u32,
        /// What is wrong.
        what: String,
    },
}

/// One subtask's keyed state on disk.
pub struct StateStore {
    /// A restore's bulk load in progress, finished before anything else touches `data`
    /// (first: dropped, and so waited for, before the store goes).
    bulk: Mutex<Option<BulkLoad>>,
    dir: PathBuf,
    keyspace: Keyspace,
    data: PartitionHandle,
    /// Bookkeeping: a write here after a bulk load moves the keyspace's sequence number past
    /// the loaded entries' (0), so read views see them.
    meta: PartitionHandle,
    /// Nothing was ever written: a restore may bulk-load it.
    fresh: bool,
    /// Incremental checkpoints: per change epoch not yet handed out by a whole snapshot,
    /// the writes of that epoch (keys as in `data`; values tagged [`UPSERT`] or [`REMOVED`]).
    changes: ChangeLog,
    /// Declared keyed states, in ordinal order.
    states: Vec<String>,
}

impl StateStore {
    /// Opens a new, empty store in `dir` (deleted again when the store is dropped) for the
    /// keyed states `states`, with `cache_bytes` of block cache and twice as much write
    /// buffer (memtables: smaller ones flush and compact so often that writes stall).
    pub fn open(dir: &Path, states: Vec<String>, cache_bytes: u64) -> Result<StateStore, StoreError> {
        let io = |source| io_error(dir, source);
        let keyspace = Config::new(dir)
            .temporary(true)
            .manual_journal_persist(true)
            .cache_size(cache_bytes)
            .max_write_buffer_size(WRITE_BUFFER)
            .max_journaling_size(JOURNAL)
            .flush_workers(1)
            .compaction_workers(1)
            .open()
            .map_err(io)?;
        let opts = || PartitionCreateOptions::default().max_memtable_size(MEMTABLE);
        let data = keyspace.open_partition("keyed", opts()).map_err(io)?;
        let meta = keyspace.open_partition("meta", opts()).map_err(io)?;
        let mut changes_dir = dir.as_os_str().to_owned();
        changes_dir.push(".changes");
        let changes = ChangeLog::new(Path::new(&changes_dir));
        Ok(StateStore {
            dir: dir.to_path_buf(),
            keyspace,
            data,
            meta,
            fresh: true,
            bulk: Mutex::new(None),
            changes,
            states,
        })
    }

    /// The keyed states it holds, in ordinal order.
    pub fn states(&self) -> &[String] {
        &self.states
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn io<E: Into<fjall::Error>>(&self) -> impl Fn(E) -> StoreError + '_ {
        |e| io_error(&self.dir, e.into())
    }

    /// The page-in blobs of `keys` (key group, key), one full blob per key group that has
    /// state for any of them (keys without state are left out), and the entries they hold.
    pub fn read(&self, keys: &[(u32, &[u8])]) -> Result<(Vec<KeyGroupState>, usize), StoreError> {
        self.settle()?;
        let (mut out, mut found) = (Vec::new(), 0);
        let mut at = 0;
        while at < keys.len() {
            let group = keys[at].0;
            let end = at + keys[at..].iter().take_while(|k| k.0 == group).count();
            let mut named: Vec<NamedState> = Vec::new();
            for (ordinal, name) in self.states.iter().enumerate() {
                let mut entries = Vec::new();
                // A key too long for the store was never written to it: no state.
                for &(_, key) in keys[at..end].iter().filter(|(_, k)| k.len() <= MAX_KEY_BYTES) {
                    if let Some(v) = self.data.get(store_key(group, ordinal, key)).map_err(self.io())? {
                        entries.push((key.to_vec(), v.to_vec()));
                    }
                }
                if !entries.is_empty() {
                    found += entries.len();
                    named.push(NamedState { name: name.clone(), entries });
                }
            }
            if !named.is_empty() {
                out.push(KeyGroupState { key_group: group, data: layout::encode(&named) });
            }
            at = end;
        }
        Ok((out, found))
    }

    /// Writes pages (delta blobs: upserts and removals) in one atomic batch, with `epoch`
    /// recording each key as changed in that epoch; returns the entries and bytes written.
    pub fn apply(&mut self, pages: &[KeyGroupState], epoch: Option<u64>) -> Result<(usize, usize), StoreError> {
        self.write(pages, epoch, layout::decode_delta)
    }

    /// Writes restored key groups (full blobs, as a checkpoint holds them), recording no
    /// change; returns the entries and bytes written. Into a store never written, groups in
    /// ascending order are bulk-loaded (`operator/bulk_load.rs`); otherwise, and from the
    /// first group out of order on, they are written as one atomic batch.
    pub fn load(&mut self, groups: &[KeyGroupState]) -> Result<(usize, usize), StoreError> {
        let (mut entries, mut bytes) = (0, 0);
        for (i, p) in groups.iter().enumerate() {
            let loading = self.bulk.get_mut().unwrap_or_else(|e| e.into_inner()).is_some();
            let run = if self.fresh || loading { Some(self.run_of(p)?) } else { None };
            let dir = self.dir.clone();
            let failed = move |message: String| StoreError::BulkLoad { dir: dir.clone(), message };
            let slot = self.bulk.get_mut().unwrap_or_else(|e| e.into_inner());
            if let Some(run) = run {
                if slot.is_none() {
                    self.fresh = false;
                    *slot = Some(BulkLoad::start(self.data.clone()).map_err(|e| failed(e.to_string()))?);
                }
                let bulk = slot.as_mut().expect("started");
                if bulk.follows(&run) {
                    entries += run.len();
                    bytes += run.iter().map(|(k, v)| k.len() - PREFIX + v.len()).sum::<usize>();
                    bulk.push(run).map_err(failed)?;
                    continue;
                }
            }
            // Written before, or out of order: the rest the ordinary way.
            let (e, b) = self.write(&groups[i..], None, decode_full)?;
            return Ok((entries + e, bytes + b));
        }
        Ok((entries, bytes))
    }

    /// Group `p`'s entries (a full blob) as a bulk load's run: store keys, sorted.
    fn run_of(&self, p: &KeyGroupState) -> Result<Run, StoreError> {
        let bad = |what: String| StoreError::Page { key_group: p.key_group, what };
        let mut run = Vec::new();
        for n in layout::decode(&p.data).map_err(|e| bad(e.to_string()))? {
            let ordinal = self.ordinal(&n.name).ok_or_else(|| bad(format!("undeclared keyed state `{}`", n.name)))?;
            for (key, value) in n.entries {
                check_key(&key, &n.name).map_err(bad)?;
                run.push((store_key(p.key_group, ordinal, &key), value));
            }
        }
        Ok(sorted_run(run))
    }

    /// Finishes a bulk load in progress: after it, every restored entry is in `data`.
    /// A load that failed stays in place and fails every later call: the store then lacks
    /// restored state, and nothing may read or write it as if it did not.
    fn settle(&self) -> Result<(), StoreError> {
        let mut slot = self.bulk.lock().unwrap_or_else(|e| e.into_inner());
        let Some(b) = slot.as_mut() else { return Ok(()) };
        let failed = |message: String| StoreError::BulkLoad { dir: self.dir.clone(), message };
        b.finish().map_err(failed)?;
        // Loaded entries carry sequence number 0, which a read view taken at the keyspace's
        // instant sees only once a write moved it past 0.
        if let Err(e) = self.meta.insert("bulk-loaded", []) {
            let why = format!("marking the load done: {e}");
            *slot = Some(BulkLoad::failed(why.clone()));
            return Err(failed(why));
        }
        *slot = None;
        Ok(())
    }

    /// Writes pages, each decoded by `decode`, in one atomic batch (see [`apply`](Self::apply)).
    fn write(
        &mut self,
        pages: &[KeyGroupState],
        epoch: Option<u64>,
        decode: impl Fn(&[u8]) -> Result<Vec<DeltaState>, layout::LayoutError>,
    ) -> Result<(usize, usize), StoreError> {
        self.settle()?;
        self.fresh = false;
        let mut batch = self.keyspace.batch();
        // Recorded once the batch is in: a malformed page records nothing.
        let mut changed = Vec::new();
        let (mut entries, mut bytes) = (0, 0);
        for p in pages {
            let bad = |what: String| StoreError::Page { key_group: p.key_group, what };
            let delta = decode(&p.data).map_err(|e| bad(e.to_string()))?;
            for (name, changes) in delta {
                let ordinal = self.ordinal(&name).ok_or_else(|| bad(format!("undeclared keyed state `{name}`")))?;
                for (key, value) in changes {
                    check_key(&key, &name).map_err(bad)?;
                    let k = store_key(p.key_group, ordinal, &key);
                    entries += 1;
                    bytes += key.len() + value.as_ref().map_or(0, Vec::len);
                    if epoch.is_some() {
                        let mut tagged = Vec::with_capacity(1 + value.as_ref().map_or(0, Vec::len));
                        tagged.push(if value.is_some() { UPSERT } else { REMOVED });
                        tagged.extend_from_slice(value.as_deref().unwrap_or_default());
                        changed.push((k.clone(), tagged));
                    }
                    match value {
                        Some(v) => batch.insert(&self.data, k, v),
                        None => batch.remove(&self.data, k),
                    }
                }
            }
        }
        batch.commit().map_err(self.io())?;
        if let Some(e) = epoch {
            self.changes.record(e, changed).map_err(|e| io_error(&self.dir, e.into()))?;
        }
        Ok((entries, bytes))
    }

    fn ordinal(&self, name: &str) -> Option<usize> {
        self.states.iter().position(|s| s == name)
    }

    /// A read view of the store as it is now (a checkpoint's barrier).
    pub fn read_view(&self) -> Result<ReadView, StoreError> {
        self.settle()?;
        Ok(ReadView { data: self.data.snapshot_at(self.keyspace.instant()) })
    }

    /// Key group `group`'s full blob in `view` (empty: no state).
    pub fn group_blob(&self, view: &ReadView, group: u32) -> Result<Vec<u8>, StoreError> {
        let mut named: Vec<NamedState> = Vec::new();
        let mut current = usize::MAX;
        for kv in view.data.prefix(group.to_be_bytes()) {
            let (k, v) = kv.map_err(self.io())?;
            let ordinal = u16::from_be_bytes([k[4], k[5]]) as usize;
            if ordinal != current {
                let name = self.states.get(ordinal).cloned().unwrap_or_default();
                named.push(NamedState { name, entries: Vec::new() });
                current = ordinal;
            }
            named.last_mut().expect("pushed").entries.push((k[PREFIX..].to_vec(), v.to_vec()));
        }
        Ok(layout::encode(&named))
    }

    /// Key group `group`'s delta blob in `view`: the keys written in change epochs up to
    /// `epoch` (closed: nothing writes to them any more) that no whole snapshot handed out
    /// yet, each with its newest write (an upsert, which is its value in the view, or a
    /// removal). Empty when the group has no state in the view (its absence says so; a delta
    /// would patch a state it no longer has).
    pub fn group_delta(&self, view: &ReadView, group: u32, epoch: u64) -> Result<Vec<u8>, StoreError> {
        if view.data.prefix(group.to_be_bytes()).next().transpose().map_err(self.io())?.is_none() {
            return Ok(Vec::new());
        }
        let changed = self.changes.changed(&group.to_be_bytes(), epoch).map_err(self.io())?;
        let mut states: Vec<DeltaState> = Vec::new();
        let mut current = usize::MAX;
        for (k, v) in changed {
            let ordinal = u16::from_be_bytes([k[4], k[5]]) as usize;
            if ordinal != current {
                states.push((self.states.get(ordinal).cloned().unwrap_or_default(), Vec::new()));
                current = ordinal;
            }
            let value = (v.first() == Some(&UPSERT)).then(|| v[1..].to_vec());
            states.last_mut().expect("pushed").1.push((k[PREFIX..].to_vec(), value));
        }
        Ok(layout::encode_delta(&states))
    }

    /// Forgets the changes of epochs up to `epoch`: a snapshot at that epoch handed every
    /// group out (full or delta), so no later delta needs them; later epochs' stay.
    pub fn forget_changes(&mut self, epoch: u64) -> Result<(), StoreError> {
        self.changes.forget(epoch).map_err(self.io())
    }

    /// Bytes the store takes on disk (a bulk load in progress counts once it is finished).
    pub fn disk_bytes(&self) -> u64 {
        self.keyspace.disk_space() + self.changes.disk_bytes()
    }
}

/// `source` at the store in `dir`, saying so when its disk is full (fjall reports a failed
/// write as a poisoned tree from then on, so the file system is asked).
fn io_error(dir: &Path, source: fjall::Error) -> StoreError {
    let hint = match free_bytes(dir) {
        Some((free, total)) if free < total / 100 + (1 << 20) => format!(
            " (its disk is full: {} MiB free of {} MiB; give the disk backend more room: WEIR_STATE_DIR)",
            free >> 20,
            total >> 20
        ),
        _ => String::new(),
    };
    StoreError::Io { dir: dir.to_path_buf(), source, hint }
}

/// Free and total bytes of the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` a writable statvfs the call fills.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let block = st.f_frsize as u64;
    Some((st.f_bavail as u64 * block, st.f_blocks as u64 * block))
}

/// A read view of the store at one instant: what a checkpoint hands out.
pub struct ReadView {
    data: Snapshot,
}

/// The tag of a recorded change: the key was written (its value follows) or removed.
const UPSERT: u8 = 1;
const REMOVED: u8 = 0;

fn store_key(group: u32, ordinal: usize, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(PREFIX + key.len());
    k.extend_from_slice(&group.to_be_bytes());
    k.extend_from_slice(&(ordinal as u16).to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// A full blob's entries as upserts.
fn decode_full(blob: &[u8]) -> Result<Vec<DeltaState>, layout::LayoutError> {
    let full = layout::decode(blob)?;
    Ok(full.into_iter().map(|n| (n.name, n.entries.into_iter().map(|(k, v)| (k, Some(v))).collect())).collect())
}

/// A record key the store can take (fjall's key limit), or why not.
fn check_key(key: &[u8], state: &str) -> Result<(), String> {
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "a key of {} bytes in state `{state}`: the disk backend takes keys of at most {MAX_KEY_BYTES} bytes \
             (use state_backend = \"memory\" for this operator)",
            key.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::layout::{apply_delta, decode, decode_delta, encode_delta};

    fn store(dir: &Path) -> StateStore {
        StateStore::open(&dir.join("s"), vec!["count".into(), "seen".into()], 1 << 20).unwrap()
    }

    fn page(group: u32, states: &[DeltaState]) -> KeyGroupState {
        KeyGroupState { key_group: group, data: encode_delta(states) }
    }

    fn up(name: &str, entries: &[(&str, Option<&str>)]) -> DeltaState {
        let e = entries.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))).collect();
        (name.into(), e)
    }

    fn full(group: u32, states: &[(&str, &[(&str, &str)])]) -> KeyGroupState {
        let named: Vec<NamedState> = states
            .iter()
            .map(|(n, e)| NamedState {
                name: n.to_string(),
                entries: e.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect(),
            })
            .collect();
        KeyGroupState { key_group: group, data: layout::encode(&named) }
    }

    fn sorted_groups(s: &StateStore, view: &ReadView, group: u32) -> Vec<NamedState> {
        let mut states = decode(&s.group_blob(view, group).unwrap()).unwrap();
        for n in &mut states {
            n.entries.sort();
        }
        states
    }

    /// A restore into a new store is bulk-loaded: groups in order (keys unsorted within a
    /// blob, a key given twice keeps its last value) are read back from point reads and from
    /// a read view (the first checkpoint after it), with nothing recorded as a change; a group
    /// out of order and everything after it are written the ordinary way; later writes win.
    #[test]
    fn a_restore_into_a_new_store_is_bulk_loaded_and_reads_back_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = store(tmp.path());
        let groups = [
            full(1, &[("count", &[("b", "2"), ("a", "1"), ("b", "3")]), ("seen", &[("a", "x")])]),
            full(4, &[("seen", &[("z", "9")])]),
            full(2, &[("count", &[("c", "5")])]),
            full(7, &[("count", &[("d", "6")])]),
        ];
        assert_eq!(s.load(&groups).unwrap().0, 6);
        assert!(s.bulk.get_mut().unwrap().is_none(), "the out-of-order group finished the load");
        let (pages, found) = s.read(&[(1, b"a"), (1, b"b"), (2, b"c"), (4, b"z"), (7, b"d")]).unwrap();
        assert_eq!((pages.len(), found), (4, 6));
        let view = s.read_view().unwrap();
        let want = |e: &[(&str, &str)]| -> Vec<(Vec<u8>, Vec<u8>)> {
            e.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
        };
        assert_eq!(
            sorted_groups(&s, &view, 1),
            vec![
                NamedState { name: "count".into(), entries: want(&[("a", "1"), ("b", "3")]) },
                NamedState { name: "seen".into(), entries: want(&[("a", "x")]) },
            ]
        );
        assert_eq!(
            sorted_groups(&s, &view, 7),
            vec![NamedState { name: "count".into(), entries: want(&[("d", "6")]) }]
        );
        assert!(decode_delta(&s.group_delta(&view, 1, 1).unwrap()).unwrap().iter().all(|(_, c)| c.is_empty()));
        s.apply(&[page(1, &[up("count", &[("a", Some("10")), ("b", None)])])], Some(1)).unwrap();
        let view = s.read_view().unwrap();
        let now = sorted_groups(&s, &view, 1);
        assert_eq!(now[0].entries, want(&[("a", "10")]));

        // Loaded whole, then read only through a view (no write after it): still all there.
        let mut s = StateStore::open(&tmp.path().join("t"), vec!["count".into()], 1 << 20).unwrap();
        s.load(&[full(3, &[("count", &[("k", "v")])])]).unwrap();
        assert!(s.bulk.get_mut().unwrap().is_some(), "still loading until something reads");
        let view = s.read_view().unwrap();
        assert_eq!(sorted_groups(&s, &view, 3)[0].entries, want(&[("k", "v")]));
        // A store written before takes a restore as ordinary writes; a bad group names itself.
        let mut s = StateStore::open(&tmp.path().join("u"), vec!["count".into()], 1 << 20).unwrap();
        s.apply(&[page(0, &[up("count", &[("q", Some("1"))])])], None).unwrap();
        s.load(&[full(5, &[("count", &[("k", "v")])])]).unwrap();
        assert!(s.bulk.get_mut().unwrap().is_none());
        let e = s.load(&[full(6, &[("nope", &[("k", "v")])])]).unwrap_err().to_string();
        assert!(e.contains("key group 6") && e.contains("nope"), "{e}");
    }

    /// A load that failed fails every later read, view and write of the store, not only the
    /// first: the store lacks restored state.
    #[test]
    fn a_failed_bulk_load_fails_every_later_use_of_the_store() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = store(tmp.path());
        s.load(&[full(1, &[("count", &[("a", "1")])])]).unwrap();
        *s.bulk.get_mut().unwrap() = Some(BulkLoad::failed("no space left on device".into()));
        for _ in 0..2 {
            let e = s.read(&[(1, b"a")]).unwrap_err().to_string();
            assert!(e.contains("loading the restored state failed: no space left"), "{e}");
            assert!(s.read_view().is_err());
        }
        assert!(s.apply(&[page(1, &[up("count", &[("a", Some("2"))])])], None).is_err());
        assert!(s.load(&[full(2, &[("count", &[("b", "1")])])]).is_err());
    }

    #[test]
    fn pages_out_and_in_again_by_key_and_a_group_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path());
        s.apply(
            &[
                page(3, &[up("count", &[("a", Some("1")), ("b", Some("2"))]), up("seen", &[("a", Some("x"))])]),
                page(4, &[up("count", &[("a", Some("9"))])]),
            ],
            None,
        )
        .unwrap();
        let before = s.read_view().unwrap();
        s.apply(&[page(3, &[up("count", &[("b", None), ("c", Some("3"))])])], None).unwrap();
        let (got, entries) = s.read(&[(3, b"a"), (3, b"b"), (4, b"zz")]).unwrap();
        assert_eq!(entries, 2, "a's count and seen");
        assert_eq!(got.len(), 1, "group 4 has no state for zz");
        let named = decode(&got[0].data).unwrap();
        assert_eq!(named.len(), 2);
        assert_eq!(named[0].entries, vec![(b"a".to_vec(), b"1".to_vec())], "b was removed");
        assert_eq!(named[1].name, "seen");
        // The view taken before the second page still shows b and not c.
        let old = decode(&s.group_blob(&before, 3).unwrap()).unwrap();
        let keys: Vec<&[u8]> = old[0].entries.iter().map(|(k, _)| &k[..]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b"]);
        let now = decode(&s.group_blob(&s.read_view().unwrap(), 3).unwrap()).unwrap();
        let keys: Vec<&[u8]> = now[0].entries.iter().map(|(k, _)| &k[..]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"c"]);
        assert!(s.group_blob(&s.read_view().unwrap(), 5).unwrap().is_empty());
    }

    #[test]
    fn a_bad_page_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path());
        let e = s.apply(&[page(1, &[up("count", &[("a", Some("1"))]), up("nope", &[("a", Some("1"))])])], Some(1));
        assert!(e.unwrap_err().to_string().contains("undeclared keyed state `nope`"));
        assert!(s.group_blob(&s.read_view().unwrap(), 1).unwrap().is_empty(), "nothing of it was written");
        let e = s.apply(&[KeyGroupState { key_group: 2, data: vec![1, 0, 0, 0x80, 9] }], None).unwrap_err();
        assert!(e.to_string().starts_with("key group 2: state blob is malformed"), "{e}");
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let e = s.apply(&[page(1, &[up("count", &[(&long, Some("1"))])])], None).unwrap_err();
        assert!(e.to_string().contains("at most 65529 bytes"), "{e}");
        // The longest key that fits is written and read back; a longer one reads as no state.
        let longest = "k".repeat(MAX_KEY_BYTES);
        s.apply(&[page(1, &[up("count", &[(&longest, Some("1"))])])], None).unwrap();
        assert_eq!(s.read(&[(1, longest.as_bytes())]).unwrap().0.len(), 1);
        assert!(s.read(&[(1, long.as_bytes())]).unwrap().0.is_empty());
    }

    /// Deltas list exactly the keys changed up to the barrier's epoch, with their values at
    /// the barrier; folded onto the previous full blob they give the group's full blob, and
    /// changes after the barrier survive forgetting the ones that went out.
    #[test]
    fn deltas_fold_onto_the_previous_snapshot_and_later_changes_stay_tracked() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path());
        s.apply(&[page(0, &[up("count", &[("a", Some("1")), ("b", Some("2")), ("c", Some("3"))])])], Some(1)).unwrap();
        let v1 = s.read_view().unwrap();
        let base = s.group_blob(&v1, 0).unwrap();
        s.forget_changes(1).unwrap();
        // Epoch 2: b changes twice, c goes, d comes; the barrier at 2; then epoch 3 changes a.
        s.apply(&[page(0, &[up("count", &[("b", Some("19")), ("c", None), ("d", Some("4"))])])], Some(2)).unwrap();
        s.apply(&[page(0, &[up("count", &[("b", Some("20"))])])], Some(2)).unwrap();
        let v2 = s.read_view().unwrap();
        s.apply(&[page(0, &[up("count", &[("a", Some("10"))])])], Some(3)).unwrap();
        let delta = s.group_delta(&v2, 0, 2).unwrap();
        let d = crate::checkpoint::layout::decode_delta(&delta).unwrap();
        assert_eq!(d.len(), 1);
        let keys: Vec<&[u8]> = d[0].1.iter().map(|(k, _)| &k[..]).collect();
        assert_eq!(keys, vec![&b"b"[..], b"c", b"d"], "a changed after the barrier only");
        assert_eq!(apply_delta(&base, &delta).unwrap(), s.group_blob(&v2, 0).unwrap());
        s.forget_changes(2).unwrap();
        let v3 = s.read_view().unwrap();
        let d = crate::checkpoint::layout::decode_delta(&s.group_delta(&v3, 0, 3).unwrap()).unwrap();
        assert_eq!(d[0].1, vec![(b"a".to_vec(), Some(b"10".to_vec()))], "a's change in epoch 3 is still tracked");
        // A group emptied by removals has no state: no delta either.
        s.apply(&[page(0, &[up("count", &[("a", None), ("b", None), ("d", None)])])], Some(4)).unwrap();
        assert!(s.group_delta(&s.read_view().unwrap(), 0, 4).unwrap().is_empty());
    }

    /// A snapshot abandoned half-way forgets nothing: the next delta covers both epochs,
    /// the newer write of a key winning, and removals after an upsert stay removals.
    #[test]
    fn a_delta_after_an_abandoned_snapshot_covers_its_epochs_too() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path());
        s.apply(&[page(0, &[up("count", &[("a", Some("1")), ("z", Some("0"))])])], Some(1)).unwrap();
        s.forget_changes(1).unwrap();
        s.apply(&[page(0, &[up("count", &[("a", Some("2")), ("b", Some("2")), ("c", Some("2"))])])], Some(2)).unwrap();
        // The snapshot at epoch 2 is abandoned: nothing forgotten. Epoch 3 changes a and c.
        s.apply(&[page(0, &[up("count", &[("a", Some("3")), ("c", None)])])], Some(3)).unwrap();
        let view = s.read_view().unwrap();
        let d = crate::checkpoint::layout::decode_delta(&s.group_delta(&view, 0, 3).unwrap()).unwrap();
        let got: Vec<(&[u8], Option<&[u8]>)> = d[0].1.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
        assert_eq!(got, vec![(&b"a"[..], Some(&b"3"[..])), (b"b", Some(b"2")), (b"c", None)]);
        s.forget_changes(3).unwrap();
        assert_eq!(s.changes.open_epochs(), 0, "every epoch's record is dropped");
        let d = s.group_delta(&s.read_view().unwrap(), 0, 3).unwrap();
        assert!(crate::checkpoint::layout::decode_delta(&d).unwrap().is_empty(), "nothing changed since");
    }
}
