//! What one subtask contributes to a checkpoint, and its on-disk encoding.
//!
//! A state file is `WEIRST01` + u32 CRC-32 of the body + u64 body length + the body
//! (bincode). Invariant: a file whose length or checksum does not match is rejected, never
//! half-read.
//!
//! A checksum detects damage, not forgery: a tenant can upload a savepoint whose CRCs match and
//! whose lengths lie. Decoding therefore never allocates what a length field claims before
//! checking it against the bytes that remain ([`bounded`]), and fails with an error instead.

use crate::checkpoint::keyed_files::{ChainError, StreamError, StreamedKeyed};
use bincode::Options as _;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Timers of one key group: (time, key), packed (encoded as `Vec<(i64, Vec<u8>)>`).
pub type Timers = crate::checkpoint::timer_list::TimerList;

/// The state of one key group of one operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGroupSnapshot {
    /// The key group.
    pub key_group: u32,
    /// The guest's blob (see "Keyed state layout" in `wit/operator.wit`).
    #[serde(with = "bytes")]
    pub data: Vec<u8>,
    /// Event-time timers.
    pub event_timers: Timers,
    /// Processing-time timers.
    pub processing_timers: Timers,
}

/// Where a source subtask was when the barrier was injected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourcePosition {
    /// Next sequence number of a generator.
    Generator {
        /// Next `i`.
        next: u64,
    },
    /// Byte offset and line number of the next line of a file.
    File {
        /// Byte offset.
        offset: u64,
        /// Line number.
        line: u64,
    },
    /// Kafka: each partition the subtask reads (appended last: older checkpoints decode).
    Kafka {
        /// Offsets by partition.
        partitions: Vec<KafkaOffset>,
    },
    /// A file with event time from a column: the position, and the watermark state, so a
    /// restored source announces the watermark its downstream had at the barrier before any
    /// record, and late records stay late (appended last: older checkpoints decode).
    TimedFile {
        /// Byte offset.
        offset: u64,
        /// Line number.
        line: u64,
        /// Largest timestamp read.
        max_timestamp: i64,
        /// The last watermark emitted.
        watermark: i64,
    },
    /// The next stream position of a Nexmark source (appended last: older checkpoints decode).
    Nexmark {
        /// Next position.
        next: u64,
    },
}

/// A Kafka partition's read position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaOffset {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The offset of the first record after the barrier.
    pub next: i64,
    /// Bounded reads: the end offset (exclusive) fixed when the job first started.
    pub stop: Option<i64>,
}

/// A transactional file sink's state: parts pre-committed and not yet known committed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkState {
    /// Number of the next part file.
    pub next_part: u64,
    /// Pre-committed parts: (checkpoint that pre-committed it, part number).
    pub pending: Vec<(u64, u64)>,
}

/// Records that were in transit on a loop's back-edges in the checkpoint (ABS §3.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedBatch {
    /// 0 = left/only input, 1 = right input.
    pub side: u8,
    /// Number of records.
    pub records: u32,
    /// The batch in record framing.
    #[serde(with = "bytes")]
    pub bytes: Vec<u8>,
}

/// Everything one subtask hands over at a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskState {
    /// Keyed state by key group (operators).
    pub keyed: Vec<KeyGroupSnapshot>,
    /// Non-keyed operator state (opaque).
    #[serde(with = "bytes")]
    pub operator_state: Vec<u8>,
    /// Source position (sources).
    pub source: Option<SourcePosition>,
    /// Sink transaction state (file sinks).
    pub sink: Option<SinkState>,
    /// Loop heads: records in transit on back-edges, replayed after the state on recovery.
    #[serde(default)]
    pub backedge_log: Vec<LoggedBatch>,
    /// Restore plans only (never written): file sink transactions of subtasks that no
    /// longer exist after a rescale, committed by the subtask that adopts them.
    #[serde(skip)]
    pub adopted_sinks: Vec<(u32, SinkState)>,
    /// Restore plans only (never written): the `operator_state` of sink subtasks that no
    /// longer run after a rescale (Kafka sinks' pre-committed transactions).
    #[serde(skip)]
    pub adopted_blobs: Vec<(u32, Vec<u8>)>,
    /// Loaded checkpoints and restore plans only (never written): keyed state still in its
    /// checkpoint files, besides `keyed`, read key group by key group as the subtask restores
    /// (`checkpoint/keyed_files.rs`).
    #[serde(skip)]
    pub streamed: Option<StreamedKeyed>,
    /// Restore plans only: the chain of files (with their keyed bytes, oldest first) this
    /// subtask's keyed state is restored from whole, unchanged: a disk operator's next
    /// snapshot may be a delta on it instead of a full one (`runtime/local.rs` keeps it only
    /// for the job's own checkpoints).
    #[serde(skip)]
    pub resume: Option<Vec<(crate::checkpoint::incremental::ChainLink, u64)>>,
}

impl SubtaskState {
    /// Reads [`SubtaskState::streamed`] into `keyed` (tools and tests; a restore reads it
    /// group by group).
    pub fn materialize(&mut self) -> Result<(), ChainError> {
        if let Some(s) = self.streamed.take() {
            self.keyed.extend(s.collect()?);
            self.keyed.sort_by_key(|g| g.key_group);
        }
        Ok(())
    }
}

const MAGIC: &[u8; 8] = b"WEIRST01";
pub(crate) const MAGIC2: &[u8; 8] = b"WEIRST02";

/// Byte strings as one piece (`serialize_bytes`): the same bincode encoding as a `Vec<u8>`
/// (u64 length, then the bytes), without a serializer call per byte.
mod bytes {
    use serde::de::{SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    struct V;

    impl<'de> Visitor<'de> for V {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
            while let Some(b) = seq.next_element()? {
                out.push(b);
            }
            Ok(out)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_byte_buf(V)
    }
}

/// A state file that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StateFileError {
    /// Not a Weir state file, or another version.
    #[error("not a Weir state file (bad magic)")]
    BadMagic,
    /// Shorter than its header says.
    #[error("truncated: header says {expected} bytes, found {found}")]
    Truncated {
        /// Bytes expected.
        expected: u64,
        /// Bytes found.
        found: u64,
    },
    /// Checksum mismatch.
    #[error("checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    Checksum {
        /// Stored CRC.
        stored: u32,
        /// Computed CRC.
        computed: u32,
    },
    /// Body does not decode.
    #[error("cannot decode: {0}")]
    Decode(String),
    /// Not in the object store as written (only there: a cluster's workers wrote it).
    #[error("{0}")]
    NotStored(String),
}

/// Frame tags of a version 2 state file.
pub(crate) const FRAME_GROUP: u8 = 1;
pub(crate) const FRAME_REST: u8 = 2;

struct Crc<W> {
    inner: W,
    hasher: crc32fast::Hasher,
    len: u64,
}

impl<W: std::io::Write> std::io::Write for Crc<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(b)?;
        self.hasher.update(&b[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a state file piece by piece: key groups as they come (a snapshot drained in
/// chunks goes to disk while the operator still hands it out), then the rest.
///
/// Format `WEIRST02`: magic, u32 CRC-32 of the body, u64 body length, body = frames, each a
/// tag byte and a bincode value: `1` a [`KeyGroupSnapshot`], `2` the [`SubtaskState`] (its
/// own `keyed` empty), which is last. `WEIRST01` files (one bincode `SubtaskState`) still
/// decode.
pub struct StateFileWriter<W: std::io::Write + std::io::Seek> {
    out: Crc<std::io::BufWriter<W>>,
    start: u64,
}

impl<W: std::io::Write + std::io::Seek> StateFileWriter<W> {
    /// Starts a file at `w`'s position.
    pub fn new(mut w: W) -> std::io::Result<Self> {
        let start = w.stream_position()?;
        w.write_all(MAGIC2)?;
        w.write_all(&[0u8; 12])?;
        let out =
            Crc { inner: std::io::BufWriter::with_capacity(1 << 20, w), hasher: crc32fast::Hasher::new(), len: 0 };
        Ok(StateFileWriter { out, start })
    }

    /// Appends one key group.
    pub fn group(&mut self, g: &KeyGroupSnapshot) -> std::io::Result<()> {
        std::io::Write::write_all(&mut self.out, &[FRAME_GROUP])?;
        bincode::serialize_into(&mut self.out, g).map_err(std::io::Error::other)
    }

    /// Appends `rest` (its key groups first) and completes the file; returns the bytes
    /// written and the body's CRC-32. The file is not synced.
    pub fn finish(mut self, rest: &SubtaskState) -> std::io::Result<(u64, u32)> {
        for g in &rest.keyed {
            self.group(g)?;
        }
        std::io::Write::write_all(&mut self.out, &[FRAME_REST])?;
        // `rest` without its key groups, in `SubtaskState`'s bincode layout (a struct is its
        // fields in order): an empty `keyed`, then the other fields.
        let o = &mut self.out;
        let err = std::io::Error::other;
        bincode::serialize_into(&mut *o, &0u64).map_err(err)?;
        bincode::serialize_into(&mut *o, &ByteStr(&rest.operator_state)).map_err(err)?;
        bincode::serialize_into(&mut *o, &rest.source).map_err(err)?;
        bincode::serialize_into(&mut *o, &rest.sink).map_err(err)?;
        bincode::serialize_into(&mut *o, &rest.backedge_log).map_err(err)?;
        std::io::Write::flush(o)?;
        let (crc, len) = (self.out.hasher.clone().finalize(), self.out.len);
        let mut w = self.out.inner.into_inner().map_err(|e| e.into_error())?;
        w.seek(std::io::SeekFrom::Start(self.start + 8))?;
        w.write_all(&crc.to_le_bytes())?;
        w.write_all(&len.to_le_bytes())?;
        w.seek(std::io::SeekFrom::Start(self.start + 20 + len))?;
        Ok((len + 20, crc))
    }
}

struct ByteStr<'a>(&'a [u8]);

impl serde::Serialize for ByteStr<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// Why a state file's header could not be read.
#[derive(Debug)]
pub enum HeaderError {
    /// The file could not be opened or read.
    Io(std::io::Error),
    /// It is not a state file, or its header disagrees with its length.
    File(StateFileError),
}

impl SubtaskState {
    /// A state file's length and body checksum, from its header and size alone (the body is
    /// not read): refuses a file that is not a state file or whose header's body length
    /// disagrees with the file's.
    pub fn read_header(path: &std::path::Path) -> Result<(u64, u32), HeaderError> {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(HeaderError::Io)?;
        let len = f.metadata().map_err(HeaderError::Io)?.len();
        let mut h = [0u8; 20];
        if len < 20 {
            return Err(HeaderError::File(StateFileError::BadMagic));
        }
        f.read_exact(&mut h).map_err(HeaderError::Io)?;
        if &h[..8] != MAGIC && &h[..8] != MAGIC2 {
            return Err(HeaderError::File(StateFileError::BadMagic));
        }
        let crc = u32::from_le_bytes(h[8..12].try_into().unwrap());
        let body = u64::from_le_bytes(h[12..20].try_into().unwrap());
        if body != len - 20 {
            return Err(HeaderError::File(StateFileError::Truncated { expected: body, found: len - 20 }));
        }
        Ok((len, crc))
    }

    /// Encodes to the state file format; returns the bytes and the body's CRC-32.
    pub fn encode(&self) -> (Vec<u8>, u32) {
        let mut c = std::io::Cursor::new(Vec::new());
        let (_, crc) = self.encode_to(&mut c).expect("in-memory state always serializes");
        (c.into_inner(), crc)
    }

    /// Writes the state file format to `w` without building it in memory first. Returns
    /// the bytes written and the body's CRC-32.
    /// Streamed key groups are read and written one at a time.
    pub fn encode_to<W: std::io::Write + std::io::Seek>(&self, w: W) -> std::io::Result<(u64, u32)> {
        let mut out = StateFileWriter::new(w)?;
        if let Some(s) = &self.streamed {
            s.read(|g| out.group(&g)).map_err(|e| match e {
                StreamError::Chain(c) => std::io::Error::other(c.to_string()),
                StreamError::Consumer(io) => io,
            })?;
        }
        out.finish(self)
    }

    /// Decodes and verifies a state file (format 2, or 1 as older Weir versions wrote).
    pub fn decode(bytes: &[u8]) -> Result<Self, StateFileError> {
        if bytes.len() < 20 || (&bytes[..8] != MAGIC && &bytes[..8] != MAGIC2) {
            return Err(StateFileError::BadMagic);
        }
        let stored = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        let len = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
        let body = &bytes[20..];
        if body.len() as u64 != len {
            return Err(StateFileError::Truncated { expected: len, found: body.len() as u64 });
        }
        let computed = crc32fast::hash(body);
        if computed != stored {
            return Err(StateFileError::Checksum { stored, computed });
        }
        let bad = |e: String| StateFileError::Decode(e);
        if &bytes[..8] == MAGIC {
            return bounded(body.len() as u64).deserialize(body).map_err(|e| bad(e.to_string()));
        }
        let mut c = std::io::Cursor::new(body);
        let mut groups = Vec::new();
        loop {
            let mut tag = [0u8; 1];
            std::io::Read::read_exact(&mut c, &mut tag).map_err(|_| bad("no final frame".into()))?;
            match tag[0] {
                FRAME_GROUP => {
                    let left = len - c.position();
                    groups.push(bounded(left).deserialize_from(&mut c).map_err(|e| bad(e.to_string()))?)
                }
                FRAME_REST => {
                    let left = len - c.position();
                    let mut rest: SubtaskState =
                        bounded(left).deserialize_from(&mut c).map_err(|e| bad(e.to_string()))?;
                    if c.position() != len {
                        return Err(bad(format!("{} bytes after the final frame", len - c.position())));
                    }
                    groups.append(&mut rest.keyed);
                    groups.sort_by_key(|g: &KeyGroupSnapshot| g.key_group);
                    if groups.windows(2).any(|w| w[0].key_group == w[1].key_group) {
                        return Err(bad("a key group appears twice".into()));
                    }
                    rest.keyed = groups;
                    return Ok(rest);
                }
                t => return Err(bad(format!("unknown frame tag {t}"))),
            }
        }
    }
}

/// bincode as `bincode::deserialize` reads it (fixed-width integers, trailing bytes allowed),
/// refusing any length prefix that claims more than `left` bytes before allocating for it.
pub(crate) fn bounded(left: u64) -> impl bincode::Options {
    bincode::DefaultOptions::new().with_fixint_encoding().allow_trailing_bytes().with_limit(left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A state file of format 2 around `body`, with a valid length and CRC.
    fn framed(body: &[u8]) -> Vec<u8> {
        let mut f = MAGIC2.to_vec();
        f.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        f.extend_from_slice(&(body.len() as u64).to_le_bytes());
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn a_forged_length_is_an_error_not_an_allocation() {
        // A key group whose data claims 1 TiB, with a checksum that matches: decoding used to
        // abort the process allocating it.
        let mut body = vec![FRAME_GROUP];
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(&(1u64 << 40).to_le_bytes());
        body.extend_from_slice(b"only a few bytes");
        let e = SubtaskState::decode(&framed(&body)).unwrap_err();
        assert!(matches!(e, StateFileError::Decode(_)), "{e}");
        let mut v1 = MAGIC.to_vec();
        let rest = [&[0u8; 8][..], &(1u64 << 40).to_le_bytes()].concat();
        v1.extend_from_slice(&crc32fast::hash(&rest).to_le_bytes());
        v1.extend_from_slice(&(rest.len() as u64).to_le_bytes());
        v1.extend_from_slice(&rest);
        assert!(SubtaskState::decode(&v1).is_err());
    }

    proptest! {
        /// Fuzz: arbitrary frames with a valid header and checksum decode or fail, never
        /// panic, and never allocate what their lengths claim (a 1 TiB claim would abort).
        #[test]
        fn sandbox_fuzz_state_files_never_panic_or_allocate_what_lengths_claim(
            frames in proptest::collection::vec((0u8..4, any::<Vec<u8>>(), any::<u64>()), 0..6)
        ) {
            let mut body = Vec::new();
            for (tag, bytes, claim) in &frames {
                body.push(*tag);
                body.extend_from_slice(&claim.to_le_bytes()[..(*claim % 9) as usize]);
                body.extend_from_slice(bytes);
            }
            let _ = SubtaskState::decode(&framed(&body));
            let mut v1 = framed(&body);
            v1[..8].copy_from_slice(MAGIC);
            let _ = SubtaskState::decode(&v1);
        }
    }

    fn sample() -> SubtaskState {
        SubtaskState {
            keyed: vec![KeyGroupSnapshot {
                key_group: 3,
                data: vec![1, 2, 3],
                event_timers: vec![(5, b"k".to_vec())].into(),
                processing_timers: Default::default(),
            }],
            operator_state: vec![9],
            source: Some(SourcePosition::File { offset: 10, line: 2 }),
            sink: Some(SinkState { next_part: 4, pending: vec![(7, 3)] }),
            backedge_log: vec![LoggedBatch { side: 0, records: 1, bytes: vec![1, 2] }],
            adopted_sinks: vec![],
            adopted_blobs: vec![],
            streamed: None,
            resume: None,
        }
    }

    #[test]
    fn round_trips() {
        let (bytes, _) = sample().encode();
        assert_eq!(SubtaskState::decode(&bytes).unwrap(), sample());
        let kafka = SubtaskState {
            source: Some(SourcePosition::Kafka {
                partitions: vec![KafkaOffset { topic: "t".into(), partition: 3, next: 42, stop: Some(50) }],
            }),
            ..Default::default()
        };
        assert_eq!(SubtaskState::decode(&kafka.encode().0).unwrap(), kafka);
    }

    #[test]
    fn byte_fields_keep_the_vec_encoding() {
        // Files written before byte strings were serialized in one piece still decode.
        // So do files written before timers were packed (`Vec<(i64, Vec<u8>)>`).
        #[derive(serde::Serialize)]
        struct Old {
            key_group: u32,
            data: Vec<u8>,
            event_timers: Vec<(i64, Vec<u8>)>,
            processing_timers: Vec<(i64, Vec<u8>)>,
        }
        let (event, processing) = (vec![(5, b"k".to_vec()), (-9, vec![])], vec![(7, vec![0; 30])]);
        let old = Old {
            key_group: 3,
            data: vec![1, 2, 3],
            event_timers: event.clone(),
            processing_timers: processing.clone(),
        };
        let new = KeyGroupSnapshot {
            key_group: 3,
            data: vec![1, 2, 3],
            event_timers: event.into(),
            processing_timers: processing.into(),
        };
        assert_eq!(bincode::serialize(&old).unwrap(), bincode::serialize(&new).unwrap());
        assert_eq!(bincode::deserialize::<KeyGroupSnapshot>(&bincode::serialize(&old).unwrap()).unwrap(), new);
    }

    #[test]
    fn version_1_files_still_decode() {
        let body = bincode::serialize(&sample()).unwrap();
        let mut v1 = MAGIC.to_vec();
        v1.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        v1.extend_from_slice(&(body.len() as u64).to_le_bytes());
        v1.extend_from_slice(&body);
        assert_eq!(SubtaskState::decode(&v1).unwrap(), sample());
    }

    #[test]
    fn groups_streamed_before_the_rest_decode_sorted_with_it() {
        let mut c = std::io::Cursor::new(Vec::new());
        let mut w = StateFileWriter::new(&mut c).unwrap();
        let g = |kg: u32| KeyGroupSnapshot {
            key_group: kg,
            data: vec![kg as u8],
            event_timers: Default::default(),
            processing_timers: Default::default(),
        };
        w.group(&g(9)).unwrap();
        w.group(&g(2)).unwrap();
        let rest = SubtaskState { keyed: vec![g(5)], operator_state: vec![7], ..Default::default() };
        let (n, _) = w.finish(&rest).unwrap();
        let bytes = c.into_inner();
        assert_eq!(n, bytes.len() as u64);
        let d = SubtaskState::decode(&bytes).unwrap();
        assert_eq!(d.keyed, vec![g(2), g(5), g(9)]);
        assert_eq!(d.operator_state, vec![7]);
    }

    #[test]
    fn streaming_encoding_is_byte_identical() {
        let mut cur = std::io::Cursor::new(Vec::new());
        let (n, crc) = sample().encode_to(&mut cur).unwrap();
        let (bytes, crc2) = sample().encode();
        assert_eq!((cur.into_inner(), n, crc), (bytes.clone(), bytes.len() as u64, crc2));
    }

    #[test]
    fn any_flipped_byte_or_truncation_is_detected() {
        let (bytes, _) = sample().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(SubtaskState::decode(&b).is_err(), "flip at {i}");
        }
        for cut in 0..bytes.len() {
            assert!(SubtaskState::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
