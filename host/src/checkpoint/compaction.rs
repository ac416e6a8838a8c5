//! Background compaction of an incremental chain: the keyed state of a chain's files, folded
//! into one new file, so later checkpoints build on it instead of on the whole chain.
//!
//! A disk operator's full snapshot scans its whole store: with state far larger than memory
//! it takes longer than a checkpoint may (the 100 M-key J3 run's fulls outgrew the 60 s
//! timeout, and an aborted full forced another: no checkpoint completed again). So its chain
//! is compacted here instead, off the checkpoint path, from files already written — as
//! Flink's changelog state backend materializes in the background, and as RocksDB compacts
//! the immutable files Flink's incremental checkpoints share. A checkpoint stays a delta.
//!
//! Invariants:
//! - the folded file's keyed state equals [`fold_keyed`](crate::checkpoint::incremental::fold_keyed)
//!   of the chain (a later delta patches it exactly as it patched the chain's last file);
//! - every input file is checked whole against its CRC, and the output is committed
//!   (fsynced, renamed into place) only after all of them verified: a damaged chain yields
//!   an error, never a file;
//! - memory is bounded by one key group of every file at once, not the state: the files
//!   are indexed (group → frame offset) in one pass and read group by group in a second.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bincode::Options as _;
use thiserror::Error;

use crate::checkpoint::incremental::ChainLink;
use crate::checkpoint::layout::{self, LayoutError};
use crate::checkpoint::snapshot::{
    FRAME_GROUP, FRAME_REST, KeyGroupSnapshot, MAGIC2, StateFileError, StateFileWriter, SubtaskState, bounded,
};
use crate::checkpoint::storage::CheckpointStore;
use crate::ids::CheckpointId;

/// Why a chain was not compacted (the chain stays as it was).
#[derive(Debug, Error)]
pub enum CompactError {
    /// A file could not be read or the folded one not written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file of the chain is damaged or not a state file of format 2.
    #[error("{path}: {source}")]
    State {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: StateFileError,
    },
    /// A key group's blobs do not fold.
    #[error("{path}: key group {key_group} does not fold onto its chain: {source}")]
    Fold {
        /// The chain's newest file.
        path: PathBuf,
        /// The key group.
        key_group: u32,
        /// The layout error.
        source: LayoutError,
    },
    /// The tenant's disk budget refused the folded file.
    #[error("{0}")]
    Budget(String),
}

/// The key-group frames of one state file, verified.
struct Indexed {
    path: PathBuf,
    file: File,
    /// Key group → offset and length of its frame's value.
    groups: BTreeMap<u32, (u64, u64)>,
}

/// Counts and checksums what is read through it.
struct Hashing<R> {
    inner: R,
    hasher: crc32fast::Hasher,
    read: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

impl Indexed {
    /// Reads `path` once: where each key group's frame starts, and whether the body matches
    /// its length and CRC.
    fn open(path: &Path) -> Result<Indexed, CompactError> {
        let io = |source| CompactError::Io { path: path.to_path_buf(), source };
        let bad = |source| CompactError::State { path: path.to_path_buf(), source };
        let decode = |e: String| bad(StateFileError::Decode(e));
        let mut file = File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        let mut header = [0u8; 20];
        file.read_exact(&mut header).map_err(|_| bad(StateFileError::BadMagic))?;
        if &header[..8] != MAGIC2 {
            return Err(decode("not a state file of format 2 (WEIRST02): it folds only on restore".into()));
        }
        let stored = u32::from_le_bytes(header[8..12].try_into().unwrap());
        let len = u64::from_le_bytes(header[12..20].try_into().unwrap());
        if size != 20 + len {
            return Err(bad(StateFileError::Truncated { expected: len, found: size.saturating_sub(20) }));
        }
        let mut r = Hashing {
            inner: BufReader::with_capacity(1 << 20, file.try_clone().map_err(io)?),
            hasher: crc32fast::Hasher::new(),
            read: 0,
        };
        let mut groups = BTreeMap::new();
        loop {
            let mut tag = [0u8; 1];
            r.read_exact(&mut tag).map_err(|_| decode("no final frame".into()))?;
            match tag[0] {
                FRAME_GROUP => {
                    let at = 20 + r.read;
                    let g: KeyGroupSnapshot =
                        bounded(len - r.read).deserialize_from(&mut r).map_err(|e| decode(e.to_string()))?;
                    if groups.insert(g.key_group, (at, 20 + r.read - at)).is_some() {
                        return Err(decode(format!("key group {} appears twice", g.key_group)));
                    }
                }
                FRAME_REST => {
                    std::io::copy(&mut r, &mut std::io::sink()).map_err(io)?;
                    break;
                }
                t => return Err(decode(format!("unknown frame tag {t}"))),
            }
        }
        let computed = r.hasher.finalize();
        if r.read != len {
            return Err(bad(StateFileError::Truncated { expected: len, found: r.read }));
        }
        if computed != stored {
            return Err(bad(StateFileError::Checksum { stored, computed }));
        }
        Ok(Indexed { path: path.to_path_buf(), file, groups })
    }

    /// The frame at `(offset, length)` (from [`Indexed::groups`]): exactly its bytes are read
    /// (a buffered reader would read ahead a buffer per group and file).
    fn read(&mut self, (at, len): (u64, u64)) -> Result<KeyGroupSnapshot, CompactError> {
        let path = self.path.clone();
        let io = |source| CompactError::Io { path: path.clone(), source };
        self.file.seek(SeekFrom::Start(at)).map_err(io)?;
        let mut frame = vec![0u8; len as usize];
        self.file.read_exact(&mut frame).map_err(io)?;
        bounded(len)
            .deserialize(&frame)
            .map_err(|e| CompactError::State { path: path.clone(), source: StateFileError::Decode(e.to_string()) })
    }
}

/// Folds the keyed state of `files` (a chain, oldest first: the first full) into `out`, key
/// group by key group, charging each folded group's bytes first. Returns the keyed bytes
/// written. Timers are the newest file's (as on restore).
pub fn fold_files(
    files: &[PathBuf],
    out: &mut StateFileWriter<File>,
    mut charge: impl FnMut(u64) -> Result<(), String>,
) -> Result<u64, CompactError> {
    let mut indexed = files.iter().map(|p| Indexed::open(p)).collect::<Result<Vec<_>, _>>()?;
    let Some(newest) = indexed.last() else { return Ok(0) };
    let groups: Vec<u32> = newest.groups.keys().copied().collect();
    let newest_path = newest.path.clone();
    let mut keyed = 0;
    for g in groups {
        // A group absent from a file had no state there: only the files after the last such
        // gap fold into it.
        let from = indexed.iter().rposition(|f| !f.groups.contains_key(&g)).map_or(0, |i| i + 1);
        let mut data = Vec::new();
        let mut last = None;
        for f in &mut indexed[from..] {
            let at = f.groups[&g];
            let mut kg = f.read(at)?;
            data = if layout::is_delta(&kg.data) {
                layout::apply_delta(&data, &kg.data).map_err(|source| CompactError::Fold {
                    path: newest_path.clone(),
                    key_group: g,
                    source,
                })?
            } else {
                std::mem::take(&mut kg.data)
            };
            last = Some(kg);
        }
        let Some(last) = last else { continue };
        if data.is_empty() && last.event_timers.is_empty() && last.processing_timers.is_empty() {
            continue;
        }
        charge(data.len() as u64).map_err(CompactError::Budget)?;
        keyed += data.len() as u64;
        out.group(&KeyGroupSnapshot { data, ..last })
            .map_err(|source| CompactError::Io { path: PathBuf::from("(folded file)"), source })?;
    }
    Ok(keyed)
}

/// Folds the chain `links` into the new file `into` of the same store, then uploads it when
/// the store is mirrored. Returns its keyed bytes.
pub fn compact(
    store: &CheckpointStore,
    links: &[ChainLink],
    into: &ChainLink,
    charge: impl FnMut(u64) -> Result<(), String>,
) -> Result<u64, CompactError> {
    let path_of = |l: &ChainLink| store.chk_dir(CheckpointId(l.checkpoint)).join(&l.file);
    let target = path_of(into);
    let io = |source| CompactError::Io { path: target.clone(), source };
    let files: Vec<PathBuf> = links.iter().map(path_of).collect();
    let f = store.begin_state(CheckpointId(into.checkpoint), &into.file).map_err(io)?;
    let mut out = StateFileWriter::new(f.file.try_clone().map_err(io)?).map_err(io)?;
    let keyed = fold_files(&files, &mut out, charge)?;
    out.finish(&SubtaskState::default()).map_err(io)?;
    f.commit().map_err(io)?;
    store.upload_state(CheckpointId(into.checkpoint), &into.file).map_err(io)?;
    Ok(keyed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::incremental::fold_keyed;
    use crate::checkpoint::incremental::tests::{kg, state};
    use crate::checkpoint::layout::encode_delta;

    fn delta(entries: &[(&[u8], Option<&[u8]>)]) -> Vec<u8> {
        encode_delta(&[("s".into(), entries.iter().map(|(k, v)| (k.to_vec(), v.map(|v| v.to_vec()))).collect())])
    }

    /// A chain of three files: removals, absent groups, a group replaced by a full blob,
    /// timers; groups written out of order (a drained snapshot's timer-only groups come last).
    fn chain() -> Vec<Vec<KeyGroupSnapshot>> {
        let base = vec![
            kg(0, state(&[(b"a", b"1"), (b"b", b"2")])),
            kg(1, state(&[(b"c", b"3")])),
            kg(2, state(&[(b"d", b"4")])),
        ];
        let d1 =
            vec![kg(3, state(&[(b"e", b"5")])), kg(0, delta(&[(b"a", Some(b"9")), (b"b", None)])), kg(1, delta(&[]))];
        let mut d2 = vec![kg(1, delta(&[(b"f", Some(b"6"))])), kg(3, delta(&[])), kg(0, delta(&[]))];
        d2[0].event_timers = vec![(5, b"f".to_vec())].into();
        d2.push(KeyGroupSnapshot { processing_timers: vec![(7, b"x".to_vec())].into(), ..kg(5, Vec::new()) });
        vec![base, d1, d2]
    }

    fn write(dir: &Path, name: &str, groups: &[KeyGroupSnapshot]) -> PathBuf {
        let path = dir.join(name);
        let mut w = StateFileWriter::new(File::create(&path).unwrap()).unwrap();
        for g in groups {
            w.group(g).unwrap();
        }
        w.finish(&SubtaskState { operator_state: b"op".to_vec(), ..Default::default() }).unwrap();
        path
    }

    fn folded(dir: &Path, files: &[PathBuf]) -> Result<Vec<KeyGroupSnapshot>, CompactError> {
        let out = dir.join("folded");
        let mut w = StateFileWriter::new(File::create(&out).unwrap()).unwrap();
        fold_files(files, &mut w, |_| Ok(()))?;
        w.finish(&SubtaskState::default()).unwrap();
        Ok(SubtaskState::decode(&std::fs::read(&out).unwrap()).unwrap().keyed)
    }

    #[test]
    fn a_folded_chain_is_what_folding_it_on_restore_gives() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> =
            chain().iter().enumerate().map(|(i, g)| write(dir.path(), &format!("f{i}"), g)).collect();
        let mut expected = fold_keyed(chain()).unwrap();
        expected.sort_by_key(|g| g.key_group);
        let got = folded(dir.path(), &files).unwrap();
        assert_eq!(got, expected);
        assert_eq!(got.len(), 4, "groups 0, 1, 3 with state and 5 with a timer only; 2 was dropped");
        // A later delta patches the folded file as it patched the chain.
        let next = vec![kg(0, delta(&[(b"z", Some(b"1"))]))];
        let mut with_next = chain();
        with_next.push(next.clone());
        assert_eq!(fold_keyed(vec![got, next]).unwrap(), fold_keyed(with_next).unwrap());
    }

    #[test]
    fn a_damaged_file_of_the_chain_is_an_error_naming_it_not_a_folded_file() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> =
            chain().iter().enumerate().map(|(i, g)| write(dir.path(), &format!("f{i}"), g)).collect();
        let mut bytes = std::fs::read(&files[1]).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 0x40;
        std::fs::write(&files[1], &bytes).unwrap();
        let e = folded(dir.path(), &files).unwrap_err();
        assert!(
            matches!(&e, CompactError::State { path, source: StateFileError::Checksum { .. } } if *path == files[1]),
            "{e}"
        );
        std::fs::write(&files[1], &bytes[..n - 10]).unwrap();
        let e = folded(dir.path(), &files).unwrap_err();
        assert!(e.to_string().contains("f1") && e.to_string().contains("truncated"), "{e}");
    }

    #[test]
    fn compacting_writes_the_folded_file_beside_the_chain_and_charges_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::at(dir.path());
        let links: Vec<ChainLink> =
            (1..=3).map(|c| ChainLink { checkpoint: c, file: "op-0.a0.state".into() }).collect();
        for (l, g) in links.iter().zip(chain()) {
            let s = SubtaskState { keyed: g, ..Default::default() };
            store.write_state(CheckpointId(l.checkpoint), &l.file, &s).unwrap();
        }
        let into = ChainLink { checkpoint: 3, file: "op-0.a0.state.base".into() };
        let mut charged = 0;
        let keyed = compact(&store, &links, &into, |b| {
            charged += b;
            Ok(())
        })
        .unwrap();
        assert_eq!(keyed, charged);
        let path = store.chk_dir(CheckpointId(3)).join(&into.file);
        let got = SubtaskState::decode(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(got.keyed.iter().map(|g| g.data.len() as u64).sum::<u64>(), keyed);
        let refused = compact(&store, &links, &into, |_| Err("over max_disk_mb".into())).unwrap_err();
        assert!(refused.to_string().contains("max_disk_mb"));
        let names: Vec<_> =
            std::fs::read_dir(store.chk_dir(CheckpointId(3))).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 2, "a refused compaction leaves no temporary file: {names:?}");
    }
}
