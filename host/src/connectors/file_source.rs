//! The text file source: one record per line (without the line break).
//!
//! Subtask `s` of `p` takes the lines whose 0-based number is `s mod p`. Its position is the
//! byte offset and line number of the next line, so it can rewind.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

use crate::connectors::throttle::Throttle;
use crate::record::RecordRef;
use crate::runtime::output::{Disconnected, Output};

/// One file source subtask.
pub struct FileSource {
    reader: Box<dyn BufRead + Send>,
    seekable: Option<File>,
    line: Vec<u8>,
    line_no: u64,
    offset: u64,
    subtask: u64,
    parallelism: u64,
    key_column: Option<u32>,
    throttle: Option<Throttle>,
}

/// Why a file source stopped.
pub enum FileSourceError {
    /// Reading failed.
    Io(std::io::Error),
    /// Downstream is gone.
    Disconnected(Disconnected),
}

impl FileSource {
    /// Opens `path` for subtask `subtask` of `parallelism`.
    pub fn open(
        path: &Path,
        subtask: u32,
        parallelism: u32,
        key_column: Option<u32>,
        rate: Option<u64>,
    ) -> std::io::Result<Self> {
        let f = File::open(path)?;
        Ok(FileSource {
            seekable: Some(f.try_clone()?),
            reader: Box::new(BufReader::with_capacity(256 * 1024, f)),
            line: Vec::new(),
            line_no: 0,
            offset: 0,
            subtask: subtask as u64,
            parallelism: parallelism as u64,
            key_column,
            throttle: rate.map(Throttle::new),
        })
    }

    /// Byte offset and number of the next line.
    pub fn position(&self) -> (u64, u64) {
        (self.offset, self.line_no)
    }

    /// Lines of standard input (subtask 0 only reads; it cannot rewind).
    pub fn stdin(subtask: u32, parallelism: u32) -> Self {
        FileSource {
            seekable: None,
            reader: Box::new(BufReader::new(std::io::stdin())),
            line: Vec::new(),
            line_no: 0,
            offset: 0,
            subtask: subtask as u64,
            parallelism: parallelism as u64,
            key_column: None,
            throttle: None,
        }
    }

    /// Rewinds to a position taken with [`FileSource::position`]. A stdin source cannot
    /// rewind: it goes on from where it is (the job was admitted as at-least-once).
    pub fn seek(&mut self, offset: u64, line: u64) -> std::io::Result<()> {
        let Some(f) = self.seekable.as_mut() else { return Ok(()) };
        f.seek(SeekFrom::Start(offset))?;
        self.reader = Box::new(BufReader::with_capacity(256 * 1024, f.try_clone()?));
        self.offset = offset;
        self.line_no = line;
        Ok(())
    }

    /// Emits up to `max` lines; returns how many (`Some(0)`: none due yet under `rate`;
    /// `None`: end of file).
    pub fn emit(&mut self, max: u32, out: &mut Output) -> Result<Option<u32>, FileSourceError> {
        let mut max = max;
        if let Some(t) = self.throttle.as_mut() {
            out.flush().map_err(FileSourceError::Disconnected)?;
            max = t.admit(max);
            if max == 0 {
                return Ok(Some(0));
            }
        }
        let mut n = 0;
        let mut eof = false;
        while n < max {
            self.line.clear();
            let read = self.reader.read_until(b'\n', &mut self.line).map_err(FileSourceError::Io)?;
            if read == 0 {
                eof = true;
                break;
            }
            self.offset += read as u64;
            let no = self.line_no;
            self.line_no += 1;
            if no % self.parallelism != self.subtask {
                continue;
            }
            let mut text: &[u8] = &self.line;
            if text.ends_with(b"\n") {
                text = &text[..text.len() - 1];
            }
            if text.ends_with(b"\r") {
                text = &text[..text.len() - 1];
            }
            let key = match self.key_column {
                None => &[][..],
                Some(c) => text.split(|&b| b == b',').nth(c as usize).unwrap_or(&[]),
            };
            out.emit(RecordRef { tag: 0, timestamp: no as i64, key, value: text })
                .map_err(FileSourceError::Disconnected)?;
            n += 1;
        }
        if let Some(t) = self.throttle.as_mut() {
            t.record(n);
        }
        Ok(if n == 0 && eof { None } else { Some(n) })
    }
}
