//! A subtask's keyed state where its checkpoint left it: a chain of state files (oldest first,
//! the oldest a full snapshot; `checkpoint/incremental.rs`), indexed key group → frame and
//! read back one key group at a time. A restore and a background fold
//! (`checkpoint/compaction.rs`) both read keyed state this way, so state far larger than
//! memory is restored and folded within memory.
//!
//! Invariants:
//! - every file is checked whole against its length and CRC when it is indexed; a damaged
//!   file is an error naming it, before any of its groups is handed out;
//! - reading key group `g` yields what [`fold_keyed`](crate::checkpoint::incremental::fold_keyed)
//!   of the decoded chain holds for `g` (data folded over the files after the last one without
//!   `g`; timers from the newest file; nothing for a group with neither);
//! - memory is one key group of every file at once plus the index (20 bytes per group and
//!   file), never the state.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bincode::Options as _;
use thiserror::Error;

use crate::checkpoint::layout::{self, LayoutError};
use crate::checkpoint::snapshot::{
    FRAME_GROUP, FRAME_REST, KeyGroupSnapshot, MAGIC2, StateFileError, SubtaskState, bounded,
};

/// Why a chain's keyed state could not be read.
#[derive(Debug, Error)]
pub enum ChainError {
    /// A file could not be read.
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
    /// A key group's blobs do not fold, or do not follow the state layout.
    #[error("{path}: key group {key_group} does not fold onto its chain: {source}")]
    Fold {
        /// The chain's newest file.
        path: PathBuf,
        /// The key group.
        key_group: u32,
        /// The layout error.
        source: LayoutError,
    },
}

impl ChainError {
    /// Whether the file is not of format 2 (an older Weir's `WEIRST01`): it can only be decoded
    /// whole.
    pub fn is_old_format(&self) -> bool {
        matches!(self, ChainError::State { source: StateFileError::Decode(m), .. } if m.starts_with(NOT_FORMAT_2))
    }
}

const NOT_FORMAT_2: &str = "not a state file of format 2";

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

/// One verified state file: where each key group's frame lies, and which file it was (a
/// reader refuses a file that changed or was replaced since). Not held open: a restore of
/// many subtasks with long chains would run out of file descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileIndex {
    path: PathBuf,
    identity: Identity,
    /// (key group, offset of its frame's value, length), sorted by key group.
    groups: Vec<(u32, u64, u64)>,
}

/// Device, inode, length and modification time of a file.
type Identity = (u64, u64, u64, i64, i64);

fn identity(m: &std::fs::Metadata) -> Identity {
    use std::os::unix::fs::MetadataExt as _;
    (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec())
}

impl FileIndex {
    /// Reads `path` once: where each key group's frame starts, whether the body matches its
    /// length and CRC, and the final frame's non-keyed state (which must hold no key group:
    /// those would not be indexed).
    fn open(path: &Path) -> Result<(FileIndex, SubtaskState), ChainError> {
        let io = |source| ChainError::Io { path: path.to_path_buf(), source };
        let bad = |source| ChainError::State { path: path.to_path_buf(), source };
        let decode = |e: String| bad(StateFileError::Decode(e));
        let mut file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let size = meta.len();
        let mut header = [0u8; 20];
        file.read_exact(&mut header).map_err(|_| bad(StateFileError::BadMagic))?;
        if &header[..8] != MAGIC2 {
            return Err(decode(format!("{NOT_FORMAT_2} (WEIRST02): it is read whole")));
        }
        let stored = u32::from_le_bytes(header[8..12].try_into().unwrap());
        let len = u64::from_le_bytes(header[12..20].try_into().unwrap());
        if size.checked_sub(20) != Some(len) {
            return Err(bad(StateFileError::Truncated { expected: len, found: size.saturating_sub(20) }));
        }
        // Never past the length the header declared, even if the file grows meanwhile.
        let body = BufReader::with_capacity(1 << 20, (&file).take(len));
        let mut r = Hashing { inner: body, hasher: crc32fast::Hasher::new(), read: 0 };
        let mut groups = Vec::new();
        let scanned = Self::scan(&mut r, len, &mut groups, path);
        if scanned.is_err() {
            // A damaged file usually fails to decode before its end: its checksum names the
            // damage better than the decoder's complaint does.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
            if r.read == len && r.hasher.clone().finalize() != stored {
                return Err(bad(StateFileError::Checksum { stored, computed: r.hasher.finalize() }));
            }
        }
        let rest = scanned?;
        let computed = r.hasher.finalize();
        if r.read != len {
            return Err(bad(StateFileError::Truncated { expected: len, found: r.read }));
        }
        if computed != stored {
            return Err(bad(StateFileError::Checksum { stored, computed }));
        }
        groups.sort_unstable_by_key(|g| g.0);
        if let Some(w) = groups.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(decode(format!("key group {} appears twice", w[0].0)));
        }
        if !rest.keyed.is_empty() {
            // Format 2 allows it; the host's writer never puts any there.
            return Err(decode("key groups in the final frame".into()));
        }
        Ok((FileIndex { path: path.to_path_buf(), identity: identity(&meta), groups }, rest))
    }

    /// Reads the frames: each key group's position goes to `groups`; the final frame is
    /// decoded.
    fn scan<R: Read>(
        r: &mut Hashing<R>,
        len: u64,
        groups: &mut Vec<(u32, u64, u64)>,
        path: &Path,
    ) -> Result<SubtaskState, ChainError> {
        let decode = |e: String| ChainError::State { path: path.to_path_buf(), source: StateFileError::Decode(e) };
        loop {
            let mut tag = [0u8; 1];
            r.read_exact(&mut tag).map_err(|_| decode("no final frame".into()))?;
            let left = len - r.read;
            match tag[0] {
                FRAME_GROUP => {
                    let at = 20 + r.read;
                    // Only the key group is kept; the frame is read past, not held.
                    let g: KeyGroupSnapshot =
                        bounded(left).deserialize_from(&mut *r).map_err(|e| decode(e.to_string()))?;
                    groups.push((g.key_group, at, 20 + r.read - at));
                }
                FRAME_REST => {
                    let st: SubtaskState =
                        bounded(left).deserialize_from(&mut *r).map_err(|e| decode(e.to_string()))?;
                    if r.read != len {
                        return Err(decode(format!("{} bytes after the final frame", len - r.read)));
                    }
                    return Ok(st);
                }
                t => return Err(decode(format!("unknown frame tag {t}"))),
            }
        }
    }

    fn frame(&self, g: u32) -> Option<(u64, u64)> {
        self.groups.binary_search_by_key(&g, |e| e.0).ok().map(|i| (self.groups[i].1, self.groups[i].2))
    }
}

/// The keyed state of one subtask's chain of state files, indexed (its files held open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainIndex {
    /// Oldest first.
    files: Vec<FileIndex>,
}

impl ChainIndex {
    /// Indexes `files` (oldest first), checking each whole; returns the index and the newest
    /// file's non-keyed state (its `keyed` empty).
    pub fn open(files: &[PathBuf]) -> Result<(ChainIndex, SubtaskState), ChainError> {
        let mut indexed = Vec::with_capacity(files.len());
        let mut rest = SubtaskState::default();
        for p in files {
            let (f, r) = FileIndex::open(p)?;
            indexed.push(f);
            rest = r;
        }
        Ok((ChainIndex { files: indexed }, rest))
    }

    /// The key groups a read may yield (the newest file's), ascending.
    pub fn groups(&self) -> impl Iterator<Item = u32> + '_ {
        self.files.last().into_iter().flat_map(|f| f.groups.iter().map(|g| g.0))
    }

    /// Bytes of key-group frames in each file, oldest first.
    pub fn keyed_bytes(&self) -> Vec<u64> {
        self.files.iter().map(|f| f.groups.iter().map(|g| g.2).sum()).collect()
    }

    /// Its newest file.
    pub fn newest(&self) -> &Path {
        self.files.last().map_or(Path::new(""), |f| &f.path)
    }

    /// A reader of this chain's groups: opens its files, refusing one that is not the file
    /// that was verified (rewritten or replaced since).
    pub fn reader(&self) -> Result<ChainReader<'_>, ChainError> {
        let mut files = Vec::with_capacity(self.files.len());
        for f in &self.files {
            let io = |source| ChainError::Io { path: f.path.clone(), source };
            let file = File::open(&f.path).map_err(io)?;
            if identity(&file.metadata().map_err(io)?) != f.identity {
                return Err(ChainError::State {
                    path: f.path.clone(),
                    source: StateFileError::Decode(
                        "it changed since the checkpoint was loaded (written to, or replaced)".into(),
                    ),
                });
            }
            files.push(file);
        }
        Ok(ChainReader { chain: self, files })
    }
}

/// Reads a [`ChainIndex`]'s key groups, one at a time.
pub struct ChainReader<'a> {
    chain: &'a ChainIndex,
    files: Vec<File>,
}

impl ChainReader<'_> {
    /// Key group `g` folded over the chain: `None` if it holds neither data nor timers.
    pub fn group(&mut self, g: u32) -> Result<Option<KeyGroupSnapshot>, ChainError> {
        let files = &self.chain.files;
        let Some(newest) = files.last() else { return Ok(None) };
        if newest.frame(g).is_none() {
            return Ok(None);
        }
        // A group absent from a file had no state there: only the files after the last such
        // gap fold into it.
        let from = files.iter().rposition(|f| f.frame(g).is_none()).map_or(0, |i| i + 1);
        // Each file's state of the group (folded in one pass); the timers are the newest's.
        let mut layers = Vec::with_capacity(files.len() - from);
        let mut last = None;
        for i in from..files.len() {
            let mut kg = self.read(i, g)?;
            layers.push(std::mem::take(&mut kg.data));
            last = Some(kg);
        }
        let data = layout::fold(layers.iter().map(|d| &d[..])).map_err(|source| ChainError::Fold {
            path: newest.path.clone(),
            key_group: g,
            source,
        })?;
        let Some(last) = last else { return Ok(None) };
        if data.is_empty() && last.event_timers.is_empty() && last.processing_timers.is_empty() {
            return Ok(None);
        }
        Ok(Some(KeyGroupSnapshot { data, ..last }))
    }

    /// File `i`'s frame of group `g`: exactly its bytes are read (a buffered reader would
    /// read ahead a buffer per group and file).
    fn read(&self, i: usize, g: u32) -> Result<KeyGroupSnapshot, ChainError> {
        use std::os::unix::fs::FileExt as _;
        let index = &self.chain.files[i];
        let path = &index.path;
        let (at, len) = index.frame(g).expect("the caller checked the group is in the file");
        let mut frame = vec![0u8; len as usize];
        self.files[i].read_exact_at(&mut frame, at).map_err(|source| ChainError::Io { path: path.clone(), source })?;
        let kg: KeyGroupSnapshot = bounded(len)
            .deserialize(&frame)
            .map_err(|e| ChainError::State { path: path.clone(), source: StateFileError::Decode(e.to_string()) })?;
        if kg.key_group != g {
            // The file changed since it was opened.
            return Err(ChainError::State {
                path: path.clone(),
                source: StateFileError::Decode(format!("key group {g}'s frame holds key group {}", kg.key_group)),
            });
        }
        Ok(kg)
    }
}

/// Keyed state a restoring subtask reads from checkpoint files as it restores, instead of
/// holding it in memory from the checkpoint's load on: per chain, the key groups it takes.
/// Part of a restore plan only (never written to a state file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamedKeyed {
    /// Chains and the key groups taken from each (ascending).
    pub parts: Vec<(Arc<ChainIndex>, Vec<u32>)>,
    /// States dropped from every group as it is read (the user allowed them to be dropped).
    pub dropped: Vec<String>,
}

/// A streamed read that stopped: the chain could not be read, or the consumer refused.
#[derive(Debug)]
pub enum StreamError<E> {
    /// Reading the checkpoint's files.
    Chain(ChainError),
    /// The consumer's own error.
    Consumer(E),
}

impl StreamedKeyed {
    /// Every key group of `chain`.
    pub fn whole(chain: ChainIndex) -> StreamedKeyed {
        let groups = chain.groups().collect();
        StreamedKeyed { parts: vec![(Arc::new(chain), groups)], dropped: Vec::new() }
    }

    /// How many key groups it reads at most.
    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.1.len()).sum()
    }

    /// Whether it reads nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hands `f` every key group that holds data or timers, one at a time, in ascending key
    /// group order within each chain.
    pub fn read<E>(&self, mut f: impl FnMut(KeyGroupSnapshot) -> Result<(), E>) -> Result<(), StreamError<E>> {
        for (chain, groups) in &self.parts {
            let mut r = chain.reader().map_err(StreamError::Chain)?;
            for &g in groups {
                let Some(mut kg) = r.group(g).map_err(StreamError::Chain)? else { continue };
                if !self.dropped.is_empty() && !kg.data.is_empty() {
                    kg.data = layout::retain(&kg.data, |n| !self.dropped.iter().any(|d| d == n)).map_err(|source| {
                        StreamError::Chain(ChainError::Fold {
                            path: chain.newest().to_path_buf(),
                            key_group: g,
                            source,
                        })
                    })?;
                }
                f(kg).map_err(StreamError::Consumer)?;
            }
        }
        Ok(())
    }

    /// Every group, in memory (tools and tests; a restore reads them one at a time).
    pub fn collect(&self) -> Result<Vec<KeyGroupSnapshot>, ChainError> {
        let mut out = Vec::new();
        self.read(|kg| {
            out.push(kg);
            Ok::<_, std::convert::Infallible>(())
        })
        .map_err(|e| match e {
            StreamError::Chain(c) => c,
            StreamError::Consumer(never) => match never {},
        })?;
        out.sort_by_key(|g| g.key_group);
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::checkpoint::incremental::fold_keyed;
    use crate::checkpoint::incremental::tests::{kg, state};
    use crate::checkpoint::layout::encode_delta;
    use crate::checkpoint::snapshot::StateFileWriter;

    fn delta(entries: &[(&[u8], Option<&[u8]>)]) -> Vec<u8> {
        encode_delta(&[("s".into(), entries.iter().map(|(k, v)| (k.to_vec(), v.map(|v| v.to_vec()))).collect())])
    }

    /// Three files: removals, absent groups, a group replaced by a full blob, timers; groups
    /// written out of order.
    pub(crate) fn chain() -> Vec<Vec<KeyGroupSnapshot>> {
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

    pub(crate) fn write(dir: &Path, name: &str, groups: &[KeyGroupSnapshot]) -> PathBuf {
        let path = dir.join(name);
        let mut w = StateFileWriter::new(File::create(&path).unwrap()).unwrap();
        for g in groups {
            w.group(g).unwrap();
        }
        w.finish(&SubtaskState { operator_state: b"op".to_vec(), ..Default::default() }).unwrap();
        path
    }

    #[test]
    fn a_chain_read_group_by_group_is_what_folding_it_whole_gives() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> =
            chain().iter().enumerate().map(|(i, g)| write(dir.path(), &format!("f{i}"), g)).collect();
        let (index, rest) = ChainIndex::open(&files).unwrap();
        assert_eq!(rest.operator_state, b"op", "the newest file's non-keyed state comes along");
        let mut expected = fold_keyed(chain()).unwrap();
        expected.sort_by_key(|g| g.key_group);
        assert_eq!(StreamedKeyed::whole(index.clone()).collect().unwrap(), expected);
        // One file alone reads as it decodes.
        let (one, _) = ChainIndex::open(&files[..1]).unwrap();
        assert_eq!(StreamedKeyed::whole(one).collect().unwrap(), chain()[0]);
        // A subset of groups, with a state dropped.
        let part = StreamedKeyed { parts: vec![(Arc::new(index), vec![1, 5])], dropped: vec!["s".into()] };
        let got = part.collect().unwrap();
        assert_eq!(got.iter().map(|g| g.key_group).collect::<Vec<_>>(), [1, 5]);
        assert_eq!(layout::decode(&got[0].data).unwrap().len(), 0, "the dropped state is gone: {:?}", got[0]);
        assert_eq!(got[0].event_timers, expected[1].event_timers, "timers stay");
    }

    #[test]
    fn a_damaged_or_changed_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> =
            chain().iter().enumerate().map(|(i, g)| write(dir.path(), &format!("f{i}"), g)).collect();
        let good = std::fs::read(&files[1]).unwrap();
        let mut bytes = good.clone();
        let n = bytes.len();
        bytes[n - 3] ^= 0x40;
        std::fs::write(&files[1], &bytes).unwrap();
        let e = ChainIndex::open(&files).unwrap_err();
        assert!(matches!(&e, ChainError::State { path, source: StateFileError::Checksum { .. } } if *path == files[1]));
        std::fs::write(&files[1], &bytes[..n - 10]).unwrap();
        let e = ChainIndex::open(&files).unwrap_err().to_string();
        assert!(e.contains("f1") && e.contains("truncated"), "{e}");
        // Indexed, then rewritten in place: the read names it, it does not misread.
        std::fs::write(&files[1], &good).unwrap();
        let (index, _) = ChainIndex::open(&files).unwrap();
        write(dir.path(), "f1", &[kg(7, state(&[(b"q", b"1")])), kg(0, delta(&[]))]);
        let e = StreamedKeyed::whole(index).collect().unwrap_err().to_string();
        assert!(e.contains("f1"), "{e}");
        // Indexed, then another file renamed over it: refused before anything is read.
        std::fs::write(&files[1], &good).unwrap();
        let (index, _) = ChainIndex::open(&files).unwrap();
        let other = write(dir.path(), "other", &chain()[1]);
        std::fs::rename(&other, &files[1]).unwrap();
        let e = StreamedKeyed::whole(index).collect().unwrap_err().to_string();
        assert!(e.contains("f1") && e.contains("changed since"), "{e}");
        // An old format is told apart (it is decoded whole instead).
        std::fs::write(&files[0], b"WEIRST01\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
        assert!(ChainIndex::open(&files).unwrap_err().is_old_format());
    }
}
