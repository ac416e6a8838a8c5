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
//!   are indexed (group → frame offset) in one pass and read group by group in a second
//!   (`checkpoint/keyed_files.rs`, which a restore reads through too).

use std::fs::File;
use std::path::PathBuf;

use thiserror::Error;

use crate::checkpoint::incremental::ChainLink;
use crate::checkpoint::keyed_files::{ChainError, ChainIndex};
use crate::checkpoint::snapshot::{StateFileWriter, SubtaskState};
use crate::checkpoint::storage::CheckpointStore;
use crate::ids::CheckpointId;

/// Why a chain was not compacted (the chain stays as it was).
#[derive(Debug, Error)]
pub enum CompactError {
    /// A file of the chain could not be read, is damaged, or does not fold.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// The folded file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The tenant's disk budget refused the folded file.
    #[error("{0}")]
    Budget(String),
}

/// Folds the keyed state of `files` (a chain, oldest first: the first full) into `out`, key
/// group by key group, charging each folded group's bytes first. Returns the keyed bytes
/// written. Timers are the newest file's (as on restore).
pub fn fold_files(
    files: &[PathBuf],
    out: &mut StateFileWriter<File>,
    mut charge: impl FnMut(u64) -> Result<(), String>,
) -> Result<u64, CompactError> {
    let (chain, _) = ChainIndex::open(files)?;
    let mut reader = chain.reader()?;
    let mut keyed = 0;
    for g in chain.groups() {
        let Some(group) = reader.group(g)? else { continue };
        charge(group.data.len() as u64).map_err(CompactError::Budget)?;
        keyed += group.data.len() as u64;
        out.group(&group).map_err(|source| CompactError::Io { path: PathBuf::from("(folded file)"), source })?;
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
    use crate::checkpoint::incremental::tests::kg;
    use crate::checkpoint::keyed_files::tests::{chain, write};
    use crate::checkpoint::layout::encode_delta;
    use crate::checkpoint::snapshot::{KeyGroupSnapshot, StateFileError};
    use std::path::Path;

    fn delta(entries: &[(&[u8], Option<&[u8]>)]) -> Vec<u8> {
        encode_delta(&[("s".into(), entries.iter().map(|(k, v)| (k.to_vec(), v.map(|v| v.to_vec()))).collect())])
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
            matches!(&e, CompactError::Chain(ChainError::State { path, source: StateFileError::Checksum { .. } }) if *path == files[1]),
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
