//! The disk backend's store: one subtask's keyed state in an LSM tree (fjall) on local disk.
//!
//! Layout: key = key group (u32 big-endian, so a group is one contiguous range in key order)
//! ‖ state ordinal (u16 big-endian, the operator's declared keyed states in order) ‖ the
//! record key; value = the encoded value, exactly as in the state layout
//! (`wit/operator.wit`). Pages in and out are blobs of that layout, so the store never
//! decodes a value.
//!
//! Invariants: the store is scratch space of one attempt — created empty in a fresh
//! directory, filled from the checkpoint it restores, deleted when the subtask ends —
//! so durability comes from checkpoints and the journal is never synced; a group's blob for
//! a checkpoint is read from a read snapshot taken at the barrier, so writes after the barrier
//! never show in it; a malformed page or an over-long key is an error naming it, never a
//! panic or a partial write (a page is one atomic batch).

use std::path::{Path, PathBuf};

use fjall::{Config, Keyspace, PartitionCreateOptions, PartitionHandle, Snapshot};
use thiserror::Error;

use crate::checkpoint::layout::{self, NamedState};
use crate::sandbox::bindings::types::KeyGroupState;

/// Bytes of the key prefix: key group and state ordinal.
const PREFIX: usize = 6;
/// fjall sleeps writers (100-500 ms at a time) when its memtables pass 90 % of the write
/// buffer or its journals 90 % of the journal limit: both are sized far above what one
/// memtable takes, so flushing keeps up and nobody sleeps.
const WRITE_BUFFER: u64 = 64 << 20;
const JOURNAL: u64 = 256 << 20;
/// The longest record key the store takes (fjall's key limit, less the prefix).
pub const MAX_KEY_BYTES: usize = 65_536 - PREFIX;

/// A failure of the store.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The LSM tree failed (I/O: a full disk, a removed directory).
    #[error("the disk state backend's store at {dir}: {source}")]
    Io {
        /// The store's directory.
        dir: PathBuf,
        /// The cause.
        source: fjall::Error,
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
    dir: PathBuf,
    keyspace: Keyspace,
    data: PartitionHandle,
    /// Declared keyed states, in ordinal order.
    states: Vec<String>,
}

impl StateStore {
    /// Opens a new, empty store in `dir` (deleted again when the store is dropped) for the
    /// keyed states `states`, with `cache_bytes` of block cache and twice as much write
    /// buffer (memtables: smaller ones flush and compact so often that writes stall).
    pub fn open(dir: &Path, states: Vec<String>, cache_bytes: u64) -> Result<StateStore, StoreError> {
        let io = |source| StoreError::Io { dir: dir.to_path_buf(), source };
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
        let data = keyspace.open_partition("keyed", PartitionCreateOptions::default()).map_err(io)?;
        Ok(StateStore { dir: dir.to_path_buf(), keyspace, data, states })
    }

    fn io<E: Into<fjall::Error>>(&self) -> impl Fn(E) -> StoreError + '_ {
        |e| StoreError::Io { dir: self.dir.clone(), source: e.into() }
    }

    /// The page-in blobs of `keys` (key group, key), one full blob per key group that has
    /// state for any of them; keys without state are left out.
    pub fn read(&self, keys: &[(u32, &[u8])]) -> Result<Vec<KeyGroupState>, StoreError> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < keys.len() {
            let group = keys[at].0;
            let end = at + keys[at..].iter().take_while(|k| k.0 == group).count();
            let mut named: Vec<NamedState> = Vec::new();
            for (ordinal, name) in self.states.iter().enumerate() {
                let mut entries = Vec::new();
                for &(_, key) in &keys[at..end] {
                    if let Some(v) = self.data.get(store_key(group, ordinal, key)).map_err(self.io())? {
                        entries.push((key.to_vec(), v.to_vec()));
                    }
                }
                if !entries.is_empty() {
                    named.push(NamedState { name: name.clone(), entries });
                }
            }
            if !named.is_empty() {
                out.push(KeyGroupState { key_group: group, data: layout::encode(&named) });
            }
            at = end;
        }
        Ok(out)
    }

    /// Writes pages (delta blobs: upserts and removals) in one atomic batch; returns the
    /// entries and bytes written.
    pub fn apply(&self, pages: &[KeyGroupState]) -> Result<(usize, usize), StoreError> {
        let mut batch = self.keyspace.batch();
        let (mut entries, mut bytes) = (0, 0);
        for p in pages {
            let bad = |what: String| StoreError::Page { key_group: p.key_group, what };
            let delta = layout::decode_delta(&p.data).map_err(|e| bad(e.to_string()))?;
            for (name, changes) in delta {
                let ordinal = self.ordinal(&name).ok_or_else(|| bad(format!("undeclared keyed state `{name}`")))?;
                for (key, value) in changes {
                    if key.len() > MAX_KEY_BYTES {
                        return Err(bad(format!(
                            "a key of {} bytes in state `{name}`: the disk backend takes keys of at most \
                             {MAX_KEY_BYTES} bytes (use state_backend = \"memory\" for this operator)",
                            key.len()
                        )));
                    }
                    let k = store_key(p.key_group, ordinal, &key);
                    entries += 1;
                    bytes += key.len() + value.as_ref().map_or(0, Vec::len);
                    match value {
                        Some(v) => batch.insert(&self.data, k, v),
                        None => batch.remove(&self.data, k),
                    }
                }
            }
        }
        batch.commit().map_err(self.io())?;
        Ok((entries, bytes))
    }

    fn ordinal(&self, name: &str) -> Option<usize> {
        self.states.iter().position(|s| s == name)
    }

    /// A read view of the store as it is now (a checkpoint's barrier).
    pub fn read_view(&self) -> Snapshot {
        self.data.snapshot()
    }

    /// Key group `group`'s full blob in `view` (empty: no state).
    pub fn group_blob(&self, view: &Snapshot, group: u32) -> Result<Vec<u8>, StoreError> {
        let mut named: Vec<NamedState> = Vec::new();
        let mut current = usize::MAX;
        for kv in view.prefix(group.to_be_bytes()) {
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

    /// Bytes the store takes on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.keyspace.disk_space()
    }
}

fn store_key(group: u32, ordinal: usize, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(PREFIX + key.len());
    k.extend_from_slice(&group.to_be_bytes());
    k.extend_from_slice(&(ordinal as u16).to_be_bytes());
    k.extend_from_slice(key);
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::layout::{DeltaState, decode, encode_delta};

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

    #[test]
    fn pages_out_and_in_again_by_key_and_a_group_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        s.apply(&[
            page(3, &[up("count", &[("a", Some("1")), ("b", Some("2"))]), up("seen", &[("a", Some("x"))])]),
            page(4, &[up("count", &[("a", Some("9"))])]),
        ])
        .unwrap();
        let before = s.read_view();
        s.apply(&[page(3, &[up("count", &[("b", None), ("c", Some("3"))])])]).unwrap();
        let got = s.read(&[(3, b"a"), (3, b"b"), (4, b"zz")]).unwrap();
        assert_eq!(got.len(), 1, "group 4 has no state for zz");
        let named = decode(&got[0].data).unwrap();
        assert_eq!(named.len(), 2);
        assert_eq!(named[0].entries, vec![(b"a".to_vec(), b"1".to_vec())], "b was removed");
        assert_eq!(named[1].name, "seen");
        // The view taken before the second page still shows b and not c.
        let old = decode(&s.group_blob(&before, 3).unwrap()).unwrap();
        let keys: Vec<&[u8]> = old[0].entries.iter().map(|(k, _)| &k[..]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b"]);
        let now = decode(&s.group_blob(&s.read_view(), 3).unwrap()).unwrap();
        let keys: Vec<&[u8]> = now[0].entries.iter().map(|(k, _)| &k[..]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"c"]);
        assert!(s.group_blob(&s.read_view(), 5).unwrap().is_empty());
    }

    #[test]
    fn a_bad_page_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let e = s.apply(&[page(1, &[up("count", &[("a", Some("1"))]), up("nope", &[("a", Some("1"))])])]);
        assert!(e.unwrap_err().to_string().contains("undeclared keyed state `nope`"));
        assert!(s.group_blob(&s.read_view(), 1).unwrap().is_empty(), "nothing of it was written");
        let e = s.apply(&[KeyGroupState { key_group: 2, data: vec![1, 0, 0, 0x80, 9] }]).unwrap_err();
        assert!(e.to_string().starts_with("key group 2: state blob is malformed"), "{e}");
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let e = s.apply(&[page(1, &[up("count", &[(&long, Some("1"))])])]).unwrap_err();
        assert!(e.to_string().contains("at most 65530 bytes"), "{e}");
    }
}
