//! The disk backend's record of changes for incremental checkpoints: per change epoch, a
//! sorted run of the keys written in that epoch, each with its newest write (the value, or a
//! removal marker), so a checkpoint's delta is a scan of the epochs it covers with no lookup
//! in the state.
//!
//! Each epoch is an LSM tree of its own (lsm-tree, the engine under fjall, used directly) in
//! a directory of its own. Nothing but this type touches it: memtables are flushed on the
//! writer's thread and an epoch's tree is never compacted (it is written once and read once
//! or twice), so forgetting an epoch is dropping its tree and removing its directory. (fjall's
//! `delete_partition` races its own flush thread in 2.11: the flusher panics and poisons the
//! keyspace's locks, and a later drop aborts the process.)
//!
//! Invariants: an epoch is written only while it is the newest (closed epochs are read-only);
//! within an epoch the newest write of a key wins (sequence numbers only grow), across epochs
//! the newest epoch wins; a forgotten epoch's directory is gone before `forget` returns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lsm_tree::{AbstractTree, Cache, Config, Slice, Tree};

/// A memtable is flushed to a sorted file once it holds this many bytes.
const MEMTABLE: u32 = 8 << 20;
/// Block cache shared by every epoch's tree: changes are scanned once, so little is reused.
const CACHE: u64 = 2 << 20;

/// The changes of the open change epochs.
pub struct ChangeLog {
    dir: PathBuf,
    epochs: BTreeMap<u64, Tree>,
    cache: Arc<Cache>,
    /// The next write's sequence number (shared by every epoch; only grows).
    seqno: u64,
}

impl ChangeLog {
    /// A log with no epochs, keeping its trees under `dir` (created on the first write).
    pub fn new(dir: &Path) -> ChangeLog {
        let cache = Arc::new(Cache::with_capacity_bytes(CACHE));
        ChangeLog { dir: dir.to_path_buf(), epochs: BTreeMap::new(), cache, seqno: 0 }
    }

    fn epoch(&mut self, epoch: u64) -> Result<&Tree, lsm_tree::Error> {
        if !self.epochs.contains_key(&epoch) {
            let tree = Config::new(self.dir.join(epoch.to_string()))
                .use_cache(self.cache.clone())
                // Never read by key: no bloom filters.
                .bloom_bits_per_key(-1)
                .open()?;
            self.epochs.insert(epoch, tree);
        }
        Ok(&self.epochs[&epoch])
    }

    /// Records each `(key, value)` of `writes`, in order, as the newest write of its key in
    /// `epoch` (the newest epoch).
    pub fn record(&mut self, epoch: u64, writes: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), lsm_tree::Error> {
        let first = self.seqno;
        self.seqno += writes.len() as u64;
        let tree = self.epoch(epoch)?;
        for (seqno, (key, value)) in (first..).zip(writes) {
            let (_, memtable) = tree.insert(key, value, seqno);
            if memtable >= MEMTABLE {
                flush(tree)?;
            }
        }
        Ok(())
    }

    /// The keys starting with `prefix` written in epochs up to `upto`, each with its newest
    /// write, in key order.
    pub fn changed(&self, prefix: &[u8], upto: u64) -> Result<BTreeMap<Slice, Slice>, lsm_tree::Error> {
        let mut changed = BTreeMap::new();
        // Oldest epoch first: a newer write of a key replaces an older one.
        for tree in self.epochs.range(..=upto).map(|(_, t)| t) {
            for kv in tree.prefix(prefix, None, None) {
                let (k, v) = kv?;
                changed.insert(k, v);
            }
        }
        Ok(changed)
    }

    /// Forgets the changes of epochs up to `upto`; later epochs' stay.
    pub fn forget(&mut self, upto: u64) -> std::io::Result<()> {
        let later = self.epochs.split_off(&(upto + 1));
        for (epoch, tree) in std::mem::replace(&mut self.epochs, later) {
            drop(tree);
            let dir = self.dir.join(epoch.to_string());
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// How many epochs are open.
    pub fn open_epochs(&self) -> usize {
        self.epochs.len()
    }

    /// Bytes the open epochs take on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.epochs.values().map(|t| t.disk_space()).sum()
    }
}

impl Drop for ChangeLog {
    fn drop(&mut self) {
        self.epochs.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `tree`'s memtable to a sorted file of its own.
fn flush(tree: &Tree) -> Result<(), lsm_tree::Error> {
    if let Some((id, memtable)) = tree.rotate_memtable() {
        // Every version is needed only until a newer one of the same key: keep the newest.
        if let Some(segment) = tree.flush_memtable(id, &memtable, u64::MAX)? {
            tree.register_segments(&[segment])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(map: &BTreeMap<Slice, Slice>) -> Vec<(String, String)> {
        map.iter().map(|(k, v)| (String::from_utf8_lossy(k).into(), String::from_utf8_lossy(v).into())).collect()
    }

    #[test]
    fn the_newest_write_wins_within_and_across_epochs_and_only_up_to_the_asked_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ChangeLog::new(dir.path());
        let w = |k: &[u8], v: &[u8]| vec![(k.to_vec(), v.to_vec())];
        log.record(1, w(b"ga", b"1")).unwrap();
        log.record(1, [w(b"ga", b"2"), w(b"gb", b"1")].concat()).unwrap();
        log.record(2, w(b"gb", b"3")).unwrap();
        log.record(3, w(b"gc", b"4")).unwrap();
        log.record(2, w(b"hx", b"5")).unwrap();
        let got = kv(&log.changed(b"g", 2).unwrap());
        assert_eq!(got, vec![("ga".into(), "2".into()), ("gb".into(), "3".into())]);
        log.forget(1).unwrap();
        assert!(!dir.path().join("1").exists(), "a forgotten epoch's directory is gone");
        assert_eq!(kv(&log.changed(b"g", 3).unwrap()), vec![("gb".into(), "3".into()), ("gc".into(), "4".into())]);
    }

    #[test]
    fn flushed_and_unflushed_writes_read_back_alike_and_forget_removes_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ChangeLog::new(dir.path());
        // Enough to flush several memtables: each key written twice, the second time later.
        let value = vec![7u8; 1000];
        let keys = 3 * MEMTABLE as usize / 1000;
        for round in 0..2u8 {
            for i in 0..keys {
                let mut v = value.clone();
                v[0] = round;
                log.record(5, vec![(format!("k{i:08}").into_bytes(), v)]).unwrap();
            }
        }
        assert!(log.disk_bytes() > MEMTABLE as u64, "memtables were flushed: {} bytes", log.disk_bytes());
        let got = log.changed(b"k", 5).unwrap();
        assert_eq!(got.len(), keys);
        assert!(got.values().all(|v| v[0] == 1), "every key's second write wins");
        log.forget(5).unwrap();
        assert_eq!(log.disk_bytes(), 0);
        assert!(!dir.path().join("5").exists());
    }
}
