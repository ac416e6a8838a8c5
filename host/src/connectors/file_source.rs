//! The text file source: one record per line (without the line break).
//!
//! Subtask `s` of `p` takes the lines whose 0-based number is `s mod p`. Its position is the
//! byte offset and line number of the next line, so it can rewind.
//!
//! A record's event time is its line number, or with `timestamp_column` the integer in that
//! column (ms); then the source also emits watermarks: the largest timestamp it has read minus
//! `watermark_delay_ms` (bounded out-of-orderness), never moving back. After a restore the
//! watermark starts again from the records read (as Flink's sources do).

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

use crate::connectors::throttle::Throttle;
use crate::connectors::{Disconnected, Emit};
use crate::graph::logical::EventTimeColumn;
use crate::record::RecordRef;

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
    event_time: Option<EventTimeColumn>,
    /// The input, as errors name it.
    name: String,
    /// Largest event time read (with `event_time`).
    max_timestamp: i64,
    /// The last watermark handed out.
    watermark: i64,
    /// A restored watermark not yet announced.
    announce: bool,
}

/// Why a file source stopped.
pub enum FileSourceError {
    /// Reading failed.
    Io(std::io::Error),
    /// Downstream is gone.
    Disconnected(Disconnected),
    /// A line has no integer in the timestamp column: the message names the file and line.
    Timestamp(String),
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
            event_time: None,
            name: path.display().to_string(),
            max_timestamp: i64::MIN,
            watermark: i64::MIN,
            announce: false,
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
            event_time: None,
            name: "standard input".to_string(),
            max_timestamp: i64::MIN,
            watermark: i64::MIN,
            announce: false,
        }
    }

    /// Takes event time from a column, with watermarks.
    pub fn with_event_time(mut self, event_time: Option<EventTimeColumn>) -> Self {
        self.event_time = event_time;
        self
    }

    /// A new watermark, if the records read since the last call moved it (or one was restored
    /// and not announced yet).
    pub fn watermark(&mut self) -> Option<i64> {
        let delay = self.event_time?.watermark_delay_ms;
        if std::mem::take(&mut self.announce) {
            return Some(self.watermark);
        }
        let wm = self.max_timestamp.saturating_sub(delay.min(i64::MAX as u64) as i64);
        (self.max_timestamp != i64::MIN && wm > self.watermark).then(|| {
            self.watermark = wm;
            wm
        })
    }

    /// With event time: the largest timestamp read and the last watermark emitted.
    pub fn watermark_state(&self) -> Option<(i64, i64)> {
        self.event_time.map(|_| (self.max_timestamp, self.watermark))
    }

    /// Restores [`FileSource::watermark_state`]; the watermark is announced again first.
    pub fn restore_watermark(&mut self, max_timestamp: i64, watermark: i64) {
        self.max_timestamp = max_timestamp;
        self.watermark = watermark;
        self.announce = watermark != i64::MIN;
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
    pub fn emit(&mut self, max: u32, out: &mut impl Emit) -> Result<Option<u32>, FileSourceError> {
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
            let timestamp = match self.event_time {
                None => no as i64,
                Some(et) => {
                    let ts = column_timestamp(text, et.column)
                        .map_err(|m| FileSourceError::Timestamp(format!("line {} of {}: {m}", no + 1, self.name)))?;
                    self.max_timestamp = self.max_timestamp.max(ts);
                    ts
                }
            };
            out.emit(RecordRef { tag: 0, timestamp, key, value: text }).map_err(FileSourceError::Disconnected)?;
            n += 1;
        }
        if let Some(t) = self.throttle.as_mut() {
            t.record(n);
        }
        Ok(if n == 0 && eof { None } else { Some(n) })
    }
}

/// The integer in 0-based comma-separated column `column` of `line`, or what is wrong.
fn column_timestamp(line: &[u8], column: u32) -> Result<i64, String> {
    let Some(field) = line.split(|&b| b == b',').nth(column as usize) else {
        return Err(format!("it has no column {column} (timestamp_column; columns count from 0)"));
    };
    let text = String::from_utf8_lossy(field);
    text.trim().parse::<i64>().map_err(|_| {
        let shown: String = text.chars().take(40).collect();
        format!("its column {column} is `{shown}`, not a timestamp in milliseconds (an integer)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_come_from_the_column_and_say_what_is_wrong() {
        assert_eq!(column_timestamp(b"a,17,x", 1), Ok(17));
        assert_eq!(column_timestamp(b"a, -5 ", 1), Ok(-5));
        assert!(column_timestamp(b"a,b", 2).unwrap_err().contains("no column 2"));
        assert!(column_timestamp(b"a,12:00", 1).unwrap_err().contains("`12:00`, not a timestamp"));
    }
}
