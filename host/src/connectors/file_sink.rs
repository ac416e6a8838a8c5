//! The file sink: part files in a directory, written hidden and made visible atomically.
//!
//! Invariant: only complete files are visible. A part is written as
//! `.part-<subtask>-<n>.inprogress`, then flushed, fsynced and renamed to
//! `part-<subtask>-<n>` (and the directory fsynced). Readers never see a partial file.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::graph::logical::SinkFormat;
use crate::record::RecordRef;

/// Writes one line per record in `format`.
#[inline]
pub fn write_line(
    w: &mut impl Write,
    format: SinkFormat,
    rec: RecordRef<'_>,
) -> std::io::Result<()> {
    if format == SinkFormat::KeyValue {
        w.write_all(rec.key)?;
        w.write_all(b" ")?;
    }
    w.write_all(rec.value)?;
    w.write_all(b"\n")
}

/// The open part file of one sink subtask.
pub struct FileSink {
    dir: PathBuf,
    subtask: u32,
    part: u64,
    format: SinkFormat,
    file: BufWriter<File>,
}

fn in_progress(dir: &Path, subtask: u32, part: u64) -> PathBuf {
    dir.join(format!(".part-{subtask}-{part}.inprogress"))
}

/// The committed name of a part.
pub fn committed(dir: &Path, subtask: u32, part: u64) -> PathBuf {
    dir.join(format!("part-{subtask}-{part}"))
}

impl FileSink {
    /// Starts part `part` of subtask `subtask` in `dir` (created if missing).
    pub fn open(dir: &Path, subtask: u32, part: u64, format: SinkFormat) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(in_progress(dir, subtask, part))?;
        Ok(FileSink {
            dir: dir.into(),
            subtask,
            part,
            format,
            file: BufWriter::with_capacity(256 * 1024, f),
        })
    }

    /// Appends a record.
    #[inline]
    pub fn write(&mut self, rec: RecordRef<'_>) -> std::io::Result<()> {
        write_line(&mut self.file, self.format, rec)
    }

    /// Makes the part visible: flush, fsync, rename, fsync the directory.
    pub fn commit(self) -> std::io::Result<PathBuf> {
        let f = self.file.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        let to = committed(&self.dir, self.subtask, self.part);
        std::fs::rename(in_progress(&self.dir, self.subtask, self.part), &to)?;
        File::open(&self.dir)?.sync_all()?;
        Ok(to)
    }
}

/// Removes the part files (committed and in progress) a previous run left in `dir`.
pub fn clear_parts(dir: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    for e in entries {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("part-") || name.starts_with(".part-") {
            std::fs::remove_file(e.path())?;
            n += 1;
        }
    }
    Ok(n)
}
