//! The flat record framing shared with the host (see `wit/operator.wit`): one buffer per
//! batch, records back to back, a 20-byte little-endian header each.
//!
//! Invariant: [`RecordReader`] never reads past the buffer; a malformed batch is an error,
//! not a panic.

use crate::{Error, Result};

/// Tag of a record that did not arrive through a key partitioner.
pub const NO_KEY_GROUP: u32 = u32::MAX;

/// Size of the per-record header.
pub const HEADER_LEN: usize = 20;

/// One input record, borrowed from the batch.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// Key group (or [`NO_KEY_GROUP`]).
    pub key_group: u32,
    /// Event time, milliseconds.
    pub timestamp: i64,
    /// The record's key.
    pub key: &'a [u8],
    /// The record's value.
    pub value: &'a [u8],
}

impl<'a> Record<'a> {
    /// The key as UTF-8 text (lossless when it is text).
    pub fn key_str(&self) -> Result<&'a str> {
        std::str::from_utf8(self.key).map_err(|e| Error::msg(format!("record key is not UTF-8: {e}")))
    }

    /// The value as UTF-8 text.
    pub fn value_str(&self) -> Result<&'a str> {
        std::str::from_utf8(self.value).map_err(|e| Error::msg(format!("record value is not UTF-8: {e}")))
    }
}

/// Iterates over the records of a batch.
pub struct RecordReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> RecordReader<'a> {
    /// Reads `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        RecordReader { buf, pos: 0 }
    }

    /// The next record, `Ok(None)` at the end, an error on a truncated record.
    #[inline]
    pub fn next_record(&mut self) -> Result<Option<Record<'a>>> {
        let rest = &self.buf[self.pos..];
        if rest.is_empty() {
            return Ok(None);
        }
        if rest.len() < HEADER_LEN {
            return Err(Error::msg("malformed batch: truncated record header"));
        }
        let tag = u32::from_le_bytes(rest[0..4].try_into().unwrap());
        let timestamp = i64::from_le_bytes(rest[4..12].try_into().unwrap());
        let klen = u32::from_le_bytes(rest[12..16].try_into().unwrap()) as usize;
        let vlen = u32::from_le_bytes(rest[16..20].try_into().unwrap()) as usize;
        let end = HEADER_LEN
            .checked_add(klen)
            .and_then(|n| n.checked_add(vlen))
            .filter(|&n| n <= rest.len())
            .ok_or_else(|| Error::msg("malformed batch: record longer than the batch"))?;
        let key = &rest[HEADER_LEN..HEADER_LEN + klen];
        let value = &rest[HEADER_LEN + klen..end];
        self.pos += end;
        Ok(Some(Record { key_group: tag, timestamp, key, value }))
    }
}

/// Appends one record to `out`.
#[inline]
pub fn write_record(out: &mut Vec<u8>, tag: u32, timestamp: i64, key: &[u8], value: &[u8]) {
    out.reserve(HEADER_LEN + key.len() + value.len());
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&timestamp.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    crate::context::push_bytes(out, key);
    crate::context::push_bytes(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_records() {
        let mut buf = Vec::new();
        write_record(&mut buf, 7, -3, b"k", b"value");
        write_record(&mut buf, NO_KEY_GROUP, 9, b"", b"");
        let mut r = RecordReader::new(&buf);
        let a = r.next_record().unwrap().unwrap();
        assert_eq!((a.key_group, a.timestamp, a.key, a.value), (7, -3, &b"k"[..], &b"value"[..]));
        let b = r.next_record().unwrap().unwrap();
        assert_eq!((b.key_group, b.key.len(), b.value.len()), (NO_KEY_GROUP, 0, 0));
        assert!(r.next_record().unwrap().is_none());
    }

    #[test]
    fn truncated_batches_are_errors() {
        let mut buf = Vec::new();
        write_record(&mut buf, 1, 0, b"key", b"value");
        for cut in 1..buf.len() {
            let mut r = RecordReader::new(&buf[..cut]);
            assert!(r.next_record().is_err(), "cut at {cut} must fail");
        }
    }
}
