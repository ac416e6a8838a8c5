//! The transactional file sink: part files in a directory, made visible only when the
//! checkpoint that covers them is complete (two-phase commit on checkpoints).
//!
//! Lifecycle of part `n` of subtask `s`:
//! 1. written as `.part-<s>-<n>.inprogress` (opened lazily, so no empty parts);
//! 2. **pre-committed** at a checkpoint barrier: flushed, fsynced, renamed to
//!    `.part-<s>-<n>.pending`, and recorded in the subtask's checkpointed [`SinkState`];
//! 3. **committed** when that checkpoint completes: renamed to `part-<s>-<n>`.
//!
//! On recovery the sink commits every part the restored checkpoint pre-committed and
//! deletes every other hidden file of its subtask (work after the checkpoint, replayed
//! anyway) and every committed part the checkpoint does not know of (a restore from an
//! older checkpoint). Invariant: a visible file is complete, and every record in a visible
//! file is covered by exactly one complete checkpoint.
//!
//! Without checkpointing, a part is committed when the subtask reaches end of stream.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::checkpoint::snapshot::SinkState;
use crate::graph::logical::SinkFormat;
use crate::ids::CheckpointId;
use crate::record::RecordRef;

/// Writes one line per record in `format`.
#[inline]
pub fn write_line(w: &mut impl Write, format: SinkFormat, rec: RecordRef<'_>) -> std::io::Result<()> {
    if format == SinkFormat::KeyValue {
        w.write_all(rec.key)?;
        w.write_all(b" ")?;
    }
    w.write_all(rec.value)?;
    w.write_all(b"\n")
}

fn in_progress(dir: &Path, subtask: u32, part: u64) -> PathBuf {
    dir.join(format!(".part-{subtask}-{part}.inprogress"))
}

fn pending(dir: &Path, subtask: u32, part: u64) -> PathBuf {
    dir.join(format!(".part-{subtask}-{part}.pending"))
}

/// The committed name of a part.
pub fn committed(dir: &Path, subtask: u32, part: u64) -> PathBuf {
    dir.join(format!("part-{subtask}-{part}"))
}

/// Parses `part-<s>-<n>` / `.part-<s>-<n>.<suffix>` into (hidden, s, n).
fn parse_name(name: &str) -> Option<(bool, u32, u64)> {
    let (hidden, rest) = match name.strip_prefix('.') {
        Some(r) => (true, r),
        None => (false, name),
    };
    let rest = rest.strip_prefix("part-")?;
    let rest = if hidden { rest.rsplit_once('.')?.0 } else { rest };
    let (s, n) = rest.split_once('-')?;
    Some((hidden, s.parse().ok()?, n.parse().ok()?))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// One sink subtask's transactional writer.
pub struct FileSink {
    dir: PathBuf,
    subtask: u32,
    format: SinkFormat,
    next_part: u64,
    current: Option<(u64, BufWriter<File>)>,
    pending: Vec<(u64, u64)>,
    /// The tenant's disk budget (`weir serve`), charged in chunks as lines are written.
    budget: Option<std::sync::Arc<crate::disk_budget::DiskBudget>>,
    uncharged: u64,
}

impl FileSink {
    /// Opens subtask `subtask`'s sink in `dir`. With `restored` state, finishes the restored
    /// checkpoint's transactions and discards everything after it.
    pub fn open(dir: &Path, subtask: u32, format: SinkFormat, restored: Option<&SinkState>) -> std::io::Result<Self> {
        Self::open_adopting(dir, subtask, format, restored, &[])
    }

    /// Like [`FileSink::open`], and also finishes the transactions of `adopted` subtasks
    /// (which no longer exist after a rescale to fewer subtasks): commits their pending
    /// parts and removes their uncommitted ones.
    pub fn open_adopting(
        dir: &Path,
        subtask: u32,
        format: SinkFormat,
        restored: Option<&SinkState>,
        adopted: &[(u32, SinkState)],
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut sink = FileSink {
            dir: dir.into(),
            subtask,
            format,
            next_part: 0,
            current: None,
            pending: Vec::new(),
            budget: None,
            uncharged: 0,
        };
        if let Some(st) = restored {
            sink.next_part = st.next_part;
            recover(dir, subtask, st)?;
        }
        for (old, st) in adopted {
            recover(dir, *old, st)?;
        }
        Ok(sink)
    }

    /// Charges what it writes to `budget` (a tenant's disk quota).
    pub fn with_budget(mut self, budget: Option<std::sync::Arc<crate::disk_budget::DiskBudget>>) -> Self {
        self.budget = budget;
        self
    }

    /// Appends a record.
    #[inline]
    pub fn write(&mut self, rec: RecordRef<'_>) -> std::io::Result<()> {
        if let Some(b) = &self.budget {
            self.uncharged += (rec.key.len() + rec.value.len() + 2) as u64;
            if self.uncharged >= crate::disk_budget::CHUNK {
                b.charge(std::mem::take(&mut self.uncharged)).map_err(std::io::Error::other)?;
            }
        }
        if self.current.is_none() {
            let part = self.next_part;
            self.next_part += 1;
            let f = OpenOptions::new().create(true).write(true).truncate(true).open(in_progress(
                &self.dir,
                self.subtask,
                part,
            ))?;
            self.current = Some((part, BufWriter::with_capacity(256 * 1024, f)));
        }
        let (_, w) = self.current.as_mut().unwrap();
        write_line(w, self.format, rec)
    }

    fn close_current(&mut self) -> std::io::Result<Option<u64>> {
        let Some((part, w)) = self.current.take() else { return Ok(None) };
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok(Some(part))
    }

    /// Phase 1 at checkpoint `id`: makes the current part durable and pending; returns the
    /// state to checkpoint.
    pub fn precommit(&mut self, id: CheckpointId) -> std::io::Result<SinkState> {
        if let Some(part) = self.close_current()? {
            std::fs::rename(in_progress(&self.dir, self.subtask, part), pending(&self.dir, self.subtask, part))?;
            sync_dir(&self.dir)?;
            self.pending.push((id.0, part));
        }
        Ok(SinkState { next_part: self.next_part, pending: self.pending.clone() })
    }

    /// Phase 2: checkpoint `id` is complete; makes every part it (or an older one)
    /// pre-committed visible.
    pub fn commit(&mut self, id: CheckpointId) -> std::io::Result<usize> {
        let (done, rest): (Vec<_>, Vec<_>) = self.pending.iter().partition(|(c, _)| *c <= id.0);
        for (_, part) in &done {
            std::fs::rename(pending(&self.dir, self.subtask, *part), committed(&self.dir, self.subtask, *part))?;
        }
        if !done.is_empty() {
            sync_dir(&self.dir)?;
        }
        self.pending = rest;
        Ok(done.len())
    }

    /// Without checkpointing: commits the current part directly at end of stream.
    pub fn commit_at_end(&mut self) -> std::io::Result<()> {
        if let Some(part) = self.close_current()? {
            std::fs::rename(in_progress(&self.dir, self.subtask, part), committed(&self.dir, self.subtask, part))?;
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

/// Removes every part file (committed and hidden) in `dir`: a fresh run owns its directory.
pub fn clear_parts(dir: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(0) };
    for e in entries {
        let e = e?;
        if parse_name(&e.file_name().to_string_lossy()).is_some() {
            std::fs::remove_file(e.path())?;
            n += 1;
        }
    }
    Ok(n)
}

/// Restores subtask `subtask`'s transactions to `st`: its pending parts are committed (the
/// checkpoint that pre-committed them is complete), so every hidden file left is work after
/// the checkpoint, and a committed part at or past `next_part` is from the future of an older
/// checkpoint being restored; both are removed.
fn recover(dir: &Path, subtask: u32, st: &SinkState) -> std::io::Result<()> {
    for &(_, part) in &st.pending {
        let (p, c) = (pending(dir, subtask, part), committed(dir, subtask, part));
        if p.exists() {
            std::fs::rename(&p, &c)?;
        } else if !c.exists() {
            return Err(std::io::Error::other(format!(
                "part {} pre-committed by the restored checkpoint is missing (neither {} nor {} exists)",
                part,
                p.display(),
                c.display()
            )));
        }
    }
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some((hidden, s, n)) = parse_name(&name) else { continue };
        if s != subtask {
            continue;
        }
        if hidden || n >= st.next_part {
            std::fs::remove_file(e.path())?;
        }
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(v: &str) -> RecordRef<'_> {
        RecordRef { tag: 0, timestamp: 0, key: b"", value: v.as_bytes() }
    }

    fn visible(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| !n.starts_with('.'))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn parts_become_visible_only_when_their_checkpoint_completes() {
        let d = tempfile::tempdir().unwrap();
        let mut s = FileSink::open(d.path(), 0, SinkFormat::Value, None).unwrap();
        s.write(rec("a")).unwrap();
        assert!(visible(d.path()).is_empty());
        let st = s.precommit(CheckpointId(1)).unwrap();
        assert_eq!(st, SinkState { next_part: 1, pending: vec![(1, 0)] });
        s.write(rec("b")).unwrap();
        s.precommit(CheckpointId(2)).unwrap();
        assert!(visible(d.path()).is_empty(), "pre-committed is still hidden");
        assert_eq!(s.commit(CheckpointId(1)).unwrap(), 1);
        assert_eq!(visible(d.path()), vec!["part-0-0"]);
        s.precommit(CheckpointId(3)).unwrap();
        assert_eq!(s.commit(CheckpointId(3)).unwrap(), 1, "an empty part is never created");
        assert_eq!(visible(d.path()), vec!["part-0-0", "part-0-1"]);
    }

    #[test]
    fn recovery_commits_what_the_checkpoint_precommitted_and_discards_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let mut s = FileSink::open(d.path(), 0, SinkFormat::Value, None).unwrap();
        s.write(rec("a")).unwrap();
        let st1 = s.precommit(CheckpointId(1)).unwrap();
        s.write(rec("b")).unwrap();
        s.precommit(CheckpointId(2)).unwrap();
        s.commit(CheckpointId(2)).unwrap();
        s.write(rec("c")).unwrap();
        // Crash. Restoring checkpoint 1 (pre-committed part 0, next part 1): part 0 becomes
        // visible, part 1 (after the checkpoint) and the in-progress part 2 disappear.
        drop(s);
        let _r = FileSink::open(d.path(), 0, SinkFormat::Value, Some(&st1)).unwrap();
        assert_eq!(visible(d.path()), vec!["part-0-0"]);
        let all: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(all.len(), 1, "no hidden leftovers");
        assert_eq!(std::fs::read_to_string(d.path().join("part-0-0")).unwrap(), "a\n");
    }

    #[test]
    fn names_parse() {
        assert_eq!(parse_name("part-3-12"), Some((false, 3, 12)));
        assert_eq!(parse_name(".part-3-12.pending"), Some((true, 3, 12)));
        assert_eq!(parse_name("notes.txt"), None);
    }
}
