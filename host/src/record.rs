//! Batches of records in the flat framing of `wit/operator.wit`: the same bytes travel
//! through channels and across the WASM boundary, so routing a batch into a guest is one
//! copy and no per-record allocation.
//!
//! Invariant: a [`Batch`] always holds well-formed records (`push` writes them, guest
//! output is checked by [`validate`] before it becomes a batch).

use thiserror::Error;

/// Tag of a record that did not arrive through a key partitioner.
pub const NO_KEY_GROUP: u32 = u32::MAX;

/// Bytes of the per-record header: u32 tag, i64 timestamp, u32 key length, u32 value length.
pub const HEADER_LEN: usize = 20;

/// One record, borrowed from a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// Key group (input side) or output port (guest output).
    pub tag: u32,
    /// Event time, milliseconds.
    pub timestamp: i64,
    /// Key bytes.
    pub key: &'a [u8],
    /// Value bytes.
    pub value: &'a [u8],
}

/// A batch of records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    buf: Vec<u8>,
    len: u32,
}

impl Batch {
    /// An empty batch with room for `bytes`.
    pub fn with_capacity(bytes: usize) -> Self {
        Batch { buf: Vec::with_capacity(bytes), len: 0 }
    }

    /// Appends a record.
    #[inline]
    pub fn push(&mut self, tag: u32, timestamp: i64, key: &[u8], value: &[u8]) {
        let b = &mut self.buf;
        b.reserve(HEADER_LEN + key.len() + value.len());
        let mut header = [0u8; HEADER_LEN];
        header[..4].copy_from_slice(&tag.to_le_bytes());
        header[4..12].copy_from_slice(&timestamp.to_le_bytes());
        header[12..16].copy_from_slice(&(key.len() as u32).to_le_bytes());
        header[16..].copy_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(&header);
        b.extend_from_slice(key);
        b.extend_from_slice(value);
        self.len += 1;
    }

    /// Appends a record whose value `value` writes in place.
    #[inline]
    pub fn push_with(&mut self, tag: u32, timestamp: i64, key: &[u8], value: impl FnOnce(&mut Vec<u8>)) {
        let b = &mut self.buf;
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&timestamp.to_le_bytes());
        b.extend_from_slice(&(key.len() as u32).to_le_bytes());
        let vlen_at = b.len();
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(key);
        let start = b.len();
        value(b);
        let vlen = (b.len() - start) as u32;
        b[vlen_at..vlen_at + 4].copy_from_slice(&vlen.to_le_bytes());
        self.len += 1;
    }

    /// Number of records.
    #[inline]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// No records.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Encoded size.
    #[inline]
    pub fn byte_len(&self) -> usize {
        self.buf.len()
    }

    /// The encoded records.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Wraps bytes already checked by [`validate`].
    pub fn from_validated(buf: Vec<u8>, len: u32) -> Self {
        Batch { buf, len }
    }

    /// Iterates over the records.
    #[inline]
    pub fn iter(&self) -> Records<'_> {
        Records { buf: &self.buf }
    }

    /// Empties the batch, keeping its allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.len = 0;
    }

    /// Replaces the tag of every record with `to` if every record's tag is `from`; returns
    /// whether it did (else the batch is as it was). One pass over the headers.
    pub fn retag_all(&mut self, from: u32, to: u32) -> bool {
        let mut at = 0;
        while at + HEADER_LEN <= self.buf.len() {
            if self.buf[at..at + 4] != from.to_le_bytes() {
                self.retag_before(at, from);
                return false;
            }
            self.buf[at..at + 4].copy_from_slice(&to.to_le_bytes());
            at = self.next_header(at);
        }
        true
    }

    /// Gives the records before offset `end` the tag `tag` back.
    fn retag_before(&mut self, end: usize, tag: u32) {
        let mut at = 0;
        while at < end {
            self.buf[at..at + 4].copy_from_slice(&tag.to_le_bytes());
            at = self.next_header(at);
        }
    }

    /// Appends every record of `other`.
    pub fn append(&mut self, other: &Batch) {
        self.buf.extend_from_slice(&other.buf);
        self.len += other.len;
    }

    /// The offset of the record after the one whose header is at `at` (the batch is well
    /// formed, by its invariant).
    #[inline]
    fn next_header(&self, at: usize) -> usize {
        let word = |o: usize| u32::from_le_bytes(self.buf[at + o..at + o + 4].try_into().unwrap()) as usize;
        at + HEADER_LEN + word(12) + word(16)
    }

    /// Takes the contents, leaving an empty batch with the same capacity hint.
    pub fn take(&mut self) -> Batch {
        let cap = self.buf.capacity();
        std::mem::replace(self, Batch::with_capacity(cap))
    }
}

/// Iterator over well-formed records.
pub struct Records<'a> {
    buf: &'a [u8],
}

impl<'a> Iterator for Records<'a> {
    type Item = RecordRef<'a>;

    #[inline]
    fn next(&mut self) -> Option<RecordRef<'a>> {
        let (rec, rest) = split_record(self.buf).ok()??;
        self.buf = rest;
        Some(rec)
    }
}

/// A malformed batch (from a guest).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FramingError {
    /// A tag (output port) out of range.
    #[error("record at byte {offset} is tagged {tag}, above the highest valid tag {max}")]
    Tag {
        /// Where the record starts.
        offset: usize,
        /// Its tag.
        tag: u32,
        /// Highest valid tag.
        max: u32,
    },
    /// Fewer than 20 bytes where a header should be.
    #[error("truncated record header at byte {offset}")]
    TruncatedHeader {
        /// Where the record starts.
        offset: usize,
    },
    /// Key and value lengths run past the end.
    #[error("record at byte {offset} claims {claimed} bytes but only {available} remain")]
    TruncatedBody {
        /// Where the record starts.
        offset: usize,
        /// Bytes the header claims.
        claimed: usize,
        /// Bytes left.
        available: usize,
    },
}

/// A record and the bytes after it; or (bytes claimed, bytes available) when truncated.
type Split<'a> = Result<Option<(RecordRef<'a>, &'a [u8])>, (usize, usize)>;

#[inline]
fn split_record(buf: &[u8]) -> Split<'_> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.len() < HEADER_LEN {
        return Err((HEADER_LEN, buf.len()));
    }
    let tag = u32::from_le_bytes(buf[0..4].try_into().unwrap());
    let timestamp = i64::from_le_bytes(buf[4..12].try_into().unwrap());
    let klen = u32::from_le_bytes(buf[12..16].try_into().unwrap()) as usize;
    let vlen = u32::from_le_bytes(buf[16..20].try_into().unwrap()) as usize;
    let total = HEADER_LEN + klen + vlen;
    if total > buf.len() {
        return Err((total, buf.len()));
    }
    let key = &buf[HEADER_LEN..HEADER_LEN + klen];
    let value = &buf[HEADER_LEN + klen..total];
    Ok(Some((RecordRef { tag, timestamp, key, value }, &buf[total..])))
}

/// Checks that `buf` is a sequence of well-formed records; returns how many.
pub fn validate(buf: &[u8]) -> Result<u32, FramingError> {
    validate_tags(buf, u32::MAX)
}

/// Like [`validate`], and checks in the same pass that every tag is at most `max_tag`.
pub fn validate_tags(buf: &[u8], max_tag: u32) -> Result<u32, FramingError> {
    let mut rest = buf;
    let mut n = 0u32;
    loop {
        let offset = buf.len() - rest.len();
        match split_record(rest) {
            Ok(None) => return Ok(n),
            Ok(Some((rec, r))) => {
                if rec.tag > max_tag {
                    return Err(FramingError::Tag { offset, tag: rec.tag, max: max_tag });
                }
                rest = r;
                n += 1;
            }
            Err((claimed, available)) if available < HEADER_LEN && claimed == HEADER_LEN => {
                return Err(FramingError::TruncatedHeader { offset });
            }
            Err((claimed, available)) => {
                return Err(FramingError::TruncatedBody { offset, claimed, available });
            }
        }
    }
}

/// Appends `v` in decimal.
#[inline]
pub fn write_decimal(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(Decimal::new(v).as_bytes());
}

/// A `u64` in decimal text, formatted on the stack two digits at a time (what a generator
/// writes per record, so no heap buffer and no copy call per number).
#[derive(Clone, Copy)]
pub struct Decimal {
    buf: [u8; 20],
    start: u8,
}

/// "00".."99".
const DIGIT_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

impl Decimal {
    /// `v` formatted.
    #[inline]
    pub fn new(mut v: u64) -> Self {
        let mut buf = [0u8; 20];
        let mut i = buf.len();
        while v >= 100 {
            let pair = (v % 100) as usize * 2;
            v /= 100;
            i -= 2;
            buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        }
        if v >= 10 {
            let pair = v as usize * 2;
            i -= 2;
            buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        } else {
            i -= 1;
            buf[i] = b'0' + v as u8;
        }
        Decimal { buf, start: i as u8 }
    }

    /// The digits.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start as usize..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decimals_match_std(v in any::<u64>(), small in 0u64..100_000) {
            for x in [v, small, v >> 32, 0, 9, 10, 99, 100, u64::MAX] {
                let (d, s) = (Decimal::new(x), x.to_string());
                prop_assert_eq!(d.as_bytes(), s.as_bytes());
            }
        }

        #[test]
        fn retagging_all_or_nothing_then_appending_equals_pushing_each_record(
            first in proptest::collection::vec((0u32..3, proptest::collection::vec(any::<u8>(), 0..20)), 0..20),
            second in proptest::collection::vec((0u32..3, proptest::collection::vec(any::<u8>(), 0..20)), 0..20),
            from in 0u32..3,
            to in any::<u32>(),
        ) {
            let batch = |recs: &[(u32, Vec<u8>)]| {
                let mut b = Batch::default();
                for (t, k) in recs {
                    b.push(*t, *t as i64 - 7, k, &k[k.len() / 2..]);
                }
                b
            };
            let (mut got, mut other) = (batch(&first), batch(&second));
            let uniform = second.iter().all(|(t, _)| *t == from);
            prop_assert_eq!(other.retag_all(from, to), uniform);
            if !uniform {
                prop_assert_eq!(&other, &batch(&second), "a refused retag changes nothing");
                return Ok(());
            }
            got.append(&other);
            let mut want = batch(&first);
            for (t, k) in &second {
                want.push(to, *t as i64 - 7, k, &k[k.len() / 2..]);
            }
            prop_assert_eq!(&got, &want);
        }

        #[test]
        fn batches_round_trip(recs in proptest::collection::vec(
            (any::<u32>(), any::<i64>(), proptest::collection::vec(any::<u8>(), 0..40),
             proptest::collection::vec(any::<u8>(), 0..80)), 0..50)) {
            let mut b = Batch::default();
            for (t, ts, k, v) in &recs {
                b.push(*t, *ts, k, v);
            }
            prop_assert_eq!(validate(b.as_bytes()), Ok(recs.len() as u32));
            let back: Vec<_> = b.iter().map(|r| (r.tag, r.timestamp, r.key.to_vec(), r.value.to_vec())).collect();
            prop_assert_eq!(back, recs);
        }

        /// Fuzz: guest output framing on arbitrary bytes is counted or refused, never panics,
        /// and a counted buffer iterates to exactly that many records.
        #[test]
        fn sandbox_fuzz_guest_output_framing_never_panics(buf in any::<Vec<u8>>(), max_tag in any::<u32>()) {
            if let Ok(n) = validate_tags(&buf, max_tag) {
                let b = Batch::from_validated(buf.clone(), n);
                prop_assert_eq!(b.iter().count() as u32, n);
            }
        }

        #[test]
        fn every_truncation_is_rejected(k in proptest::collection::vec(any::<u8>(), 0..20),
                                        v in proptest::collection::vec(any::<u8>(), 0..20),
                                        cut_seed in any::<usize>()) {
            let mut b = Batch::default();
            b.push(1, 2, &k, &v);
            let cut = 1 + cut_seed % (b.byte_len() - 1);
            prop_assert!(validate(&b.as_bytes()[..cut]).is_err());
        }
    }
}
