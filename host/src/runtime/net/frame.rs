//! The bytes of a channel on the network: each [`Message`] as one length-prefixed frame, and
//! a decoder that reassembles frames from chunks cut anywhere (HTTP/2 DATA frames follow the
//! flow-control window, not message boundaries).
//!
//! Frame: `len: u32 LE` (of what follows), `kind: u8`, then `Data`: `records: u32 LE` and the
//! batch bytes in the record framing; `Watermark`: `i64 LE`; `Barrier`: `u64 LE`;
//! `EndOfStream`: nothing; `Marker`: `u64 LE`, a checkpoint id: with unaligned checkpoints,
//! where in the data stream that checkpoint's barrier sits (it travels on the priority
//! stream). A channel's priority stream carries barriers: `Priority`: `id: u64 LE`, `sent: u64 LE`, `elapsed_us: u64 LE` (since the
//! checkpoint's trigger, as the sender saw it), `carried: u32 LE`, then that many message
//! frames (the messages the barrier carries).
//!
//! Invariants: the decoder holds at most one partial frame, never more than [`MAX_FRAME`]
//! bytes; a frame that claims more, an unknown kind, a wrong size for its kind or a batch whose
//! records do not match its framing and count is an error, and nothing after it is decoded.
//! Pure: no I/O.

use thiserror::Error;

use crate::ids::CheckpointId;
use crate::record::{Batch, validate};
use crate::runtime::message::{Message, Priority};

/// Largest frame accepted (a batch with a record at the host's emit ceiling fits).
pub const MAX_FRAME: usize = 1 << 30;

const DATA: u8 = 0;
const WATERMARK: u8 = 1;
const BARRIER: u8 = 2;
const END: u8 = 3;
const PRIORITY: u8 = 4;
const MARKER: u8 = 5;

/// What a channel's data stream carries: its messages, and with unaligned checkpoints where
/// each barrier sent on the priority stream sits among them.
#[derive(Debug)]
pub enum Item {
    /// A message of the channel.
    Message(Message),
    /// The place of checkpoint `id`'s barrier: nothing after it may reach the receiver
    /// before that barrier does.
    Marker(CheckpointId),
}

/// Most messages one barrier may carry (a sender carries its channel's overflow, bounded by
/// the channel's capacity, and one batch).
pub const MAX_CARRIED: u32 = 1 << 20;

/// A decoded frame: a channel's message, or the head of a barrier on a priority stream.
#[derive(Debug)]
pub enum Frame {
    /// A message.
    Message(Message),
    /// Where a barrier sits in a data stream.
    Marker(CheckpointId),
    /// A barrier; its carried messages follow as `carried` message frames.
    Priority {
        /// The checkpoint.
        id: CheckpointId,
        /// Messages of the channel's stream before the barrier.
        sent: u64,
        /// Microseconds since the checkpoint's trigger when it was sent.
        elapsed_us: u64,
        /// Message frames that follow, carried by the barrier.
        carried: u32,
    },
}

/// A frame that cannot be decoded.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix is beyond [`MAX_FRAME`] or too short for any frame.
    #[error("a frame of {0} bytes is out of bounds (1..={MAX_FRAME})")]
    Length(usize),
    /// Unknown kind byte.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// The body does not fit its kind.
    #[error("a frame of kind {kind} has {len} bytes")]
    Size {
        /// Kind byte.
        kind: u8,
        /// Body length.
        len: usize,
    },
    /// The batch's records are malformed or not as many as it claims.
    #[error("a data frame's batch is malformed: {0}")]
    Batch(String),
    /// A barrier claims to carry more than [`MAX_CARRIED`] messages.
    #[error("a barrier carrying {0} messages (at most {MAX_CARRIED})")]
    Carried(u32),
}

/// Appends `m`'s frame to `out`.
pub fn encode(m: &Message, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    match m {
        Message::Data(b) => {
            out.push(DATA);
            out.extend_from_slice(&b.len().to_le_bytes());
            out.extend_from_slice(b.as_bytes());
        }
        Message::Watermark(w) => {
            out.push(WATERMARK);
            out.extend_from_slice(&w.to_le_bytes());
        }
        Message::Barrier(id) => {
            out.push(BARRIER);
            out.extend_from_slice(&id.0.to_le_bytes());
        }
        Message::EndOfStream => out.push(END),
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends `item`'s frame to `out`.
pub fn encode_item(item: &Item, out: &mut Vec<u8>) {
    match item {
        Item::Message(m) => encode(m, out),
        Item::Marker(id) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.push(MARKER);
            out.extend_from_slice(&id.0.to_le_bytes());
        }
    }
}

/// Appends the frames of unaligned barrier `p` to `out`: its head, then what it carries.
pub fn encode_priority(p: &Priority, out: &mut Vec<u8>) {
    out.extend_from_slice(&(1 + 8 + 8 + 8 + 4u32).to_le_bytes());
    out.push(PRIORITY);
    out.extend_from_slice(&p.id.0.to_le_bytes());
    out.extend_from_slice(&p.sent.to_le_bytes());
    out.extend_from_slice(&(p.started.elapsed().as_micros() as u64).to_le_bytes());
    out.extend_from_slice(&(p.carried.len() as u32).to_le_bytes());
    for m in &p.carried {
        encode(m, out);
    }
}

/// Reassembles messages from chunks of a channel's byte stream.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    failed: bool,
}

impl Decoder {
    /// Adds `chunk` and appends every message it completes to `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Message>) -> Result<(), FrameError> {
        self.push_with(chunk, out, decode)
    }

    /// Adds `chunk` of a priority stream and appends every frame it completes to `out`.
    pub fn push_frames(&mut self, chunk: &[u8], out: &mut Vec<Frame>) -> Result<(), FrameError> {
        self.push_with(chunk, out, decode_frame)
    }

    fn push_with<T>(
        &mut self,
        chunk: &[u8],
        out: &mut Vec<T>,
        decode: fn(&[u8]) -> Result<T, FrameError>,
    ) -> Result<(), FrameError> {
        if self.failed {
            return Ok(());
        }
        self.buf.extend_from_slice(chunk);
        let mut at = 0;
        let r = loop {
            let rest = &self.buf[at..];
            if rest.len() < 4 {
                break Ok(());
            }
            let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
            if len == 0 || len > MAX_FRAME {
                break Err(FrameError::Length(len));
            }
            if rest.len() < 4 + len {
                break Ok(());
            }
            match decode(&rest[4..4 + len]) {
                Ok(m) => out.push(m),
                Err(e) => break Err(e),
            }
            at += 4 + len;
        };
        self.buf.drain(..at);
        if r.is_err() {
            self.failed = true;
            self.buf = Vec::new();
        }
        r
    }

    /// Bytes of a partial frame held.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

fn decode_frame(body: &[u8]) -> Result<Frame, FrameError> {
    let (kind, rest) = (body[0], &body[1..]);
    if kind == MARKER {
        if rest.len() != 8 {
            return Err(FrameError::Size { kind, len: rest.len() });
        }
        return Ok(Frame::Marker(CheckpointId(u64::from_le_bytes(rest.try_into().unwrap()))));
    }
    if kind != PRIORITY {
        return decode(body).map(Frame::Message);
    }
    if rest.len() != 28 {
        return Err(FrameError::Size { kind, len: rest.len() });
    }
    let u64_at = |at: usize| u64::from_le_bytes(rest[at..at + 8].try_into().unwrap());
    let carried = u32::from_le_bytes(rest[24..28].try_into().unwrap());
    if carried > MAX_CARRIED {
        return Err(FrameError::Carried(carried));
    }
    Ok(Frame::Priority { id: CheckpointId(u64_at(0)), sent: u64_at(8), elapsed_us: u64_at(16), carried })
}

fn decode(body: &[u8]) -> Result<Message, FrameError> {
    let (kind, rest) = (body[0], &body[1..]);
    let size = |want: usize| {
        if rest.len() == want { Ok(()) } else { Err(FrameError::Size { kind, len: rest.len() }) }
    };
    match kind {
        DATA => {
            if rest.len() < 4 {
                return Err(FrameError::Size { kind, len: rest.len() });
            }
            let claimed = u32::from_le_bytes(rest[..4].try_into().unwrap());
            let bytes = &rest[4..];
            let n = validate(bytes).map_err(|e| FrameError::Batch(e.to_string()))?;
            if n != claimed {
                return Err(FrameError::Batch(format!("{n} records, {claimed} claimed")));
            }
            Ok(Message::Data(Batch::from_validated(bytes.to_vec(), n)))
        }
        WATERMARK => {
            size(8)?;
            Ok(Message::Watermark(i64::from_le_bytes(rest.try_into().unwrap())))
        }
        BARRIER => {
            size(8)?;
            Ok(Message::Barrier(CheckpointId(u64::from_le_bytes(rest.try_into().unwrap()))))
        }
        END => {
            size(0)?;
            Ok(Message::EndOfStream)
        }
        k => Err(FrameError::Kind(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Vec<Message> {
        let mut b = Batch::default();
        b.push(0, 7, b"key", b"value");
        b.push(1, -3, b"", &[9; 300]);
        vec![Message::Data(b), Message::Watermark(-5), Message::Barrier(CheckpointId(42)), Message::EndOfStream]
    }

    fn same(a: &[Message], b: &[Message]) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    proptest! {
        #[test]
        fn messages_survive_any_cut_of_the_stream(cuts in proptest::collection::vec(0usize..400, 0..8)) {
            let mut bytes = Vec::new();
            for m in &sample() {
                encode(m, &mut bytes);
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort();
            let (mut d, mut out, mut from) = (Decoder::default(), Vec::new(), 0);
            for c in cuts.into_iter().chain([bytes.len()]) {
                d.push(&bytes[from..c], &mut out).unwrap();
                from = c;
            }
            prop_assert!(same(&out, &sample()));
            prop_assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn a_barrier_and_what_it_carries_survive_the_priority_stream_and_a_data_stream_refuses_it() {
        let started = std::time::Instant::now() - std::time::Duration::from_millis(5);
        let p = Priority { input: 3, id: CheckpointId(9), sent: 17, carried: sample(), started };
        let mut bytes = Vec::new();
        encode_priority(&p, &mut bytes);
        let mut out = Vec::new();
        Decoder::default().push_frames(&bytes, &mut out).unwrap();
        let Some(Frame::Priority { id, sent, elapsed_us, carried }) = out.first() else { panic!("{out:?}") };
        assert_eq!((*id, *sent, *carried), (CheckpointId(9), 17, 4));
        assert!(*elapsed_us >= 5_000, "{elapsed_us}");
        let msgs: Vec<Message> = out
            .into_iter()
            .skip(1)
            .map(|f| match f {
                Frame::Message(m) => m,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(same(&msgs, &sample()));
        assert_eq!(Decoder::default().push(&bytes, &mut Vec::new()), Err(FrameError::Kind(PRIORITY)));
        // A marker: in a data stream's frames; not a message.
        let mut marker = Vec::new();
        encode_item(&Item::Marker(CheckpointId(9)), &mut marker);
        let mut out = Vec::new();
        Decoder::default().push_frames(&marker, &mut out).unwrap();
        assert!(matches!(out.as_slice(), [Frame::Marker(CheckpointId(9))]), "{out:?}");
        assert_eq!(Decoder::default().push(&marker, &mut Vec::new()), Err(FrameError::Kind(MARKER)));
        // A head claiming more carried messages than any sender carries.
        let mut head = bytes[..33].to_vec();
        head[29..33].copy_from_slice(&(MAX_CARRIED + 1).to_le_bytes());
        assert_eq!(Decoder::default().push_frames(&head, &mut Vec::new()), Err(FrameError::Carried(MAX_CARRIED + 1)));
    }

    #[test]
    fn bad_frames_are_refused_and_nothing_after_them_is_decoded() {
        let frame = |body: &[u8]| {
            let mut f = (body.len() as u32).to_le_bytes().to_vec();
            f.extend_from_slice(body);
            f
        };
        let cases: Vec<(Vec<u8>, FrameError)> = vec![
            (u32::MAX.to_le_bytes().to_vec(), FrameError::Length(u32::MAX as usize)),
            (0u32.to_le_bytes().to_vec(), FrameError::Length(0)),
            (frame(&[9]), FrameError::Kind(9)),
            (frame(&[WATERMARK, 1, 2]), FrameError::Size { kind: WATERMARK, len: 2 }),
            (frame(&[END, 0]), FrameError::Size { kind: END, len: 1 }),
            (frame(&[DATA, 5, 0, 0, 0]), FrameError::Batch("0 records, 5 claimed".into())),
        ];
        for (bytes, want) in cases {
            let (mut d, mut out) = (Decoder::default(), Vec::new());
            let mut all = bytes.clone();
            encode(&Message::EndOfStream, &mut all);
            assert_eq!(d.push(&all, &mut out), Err(want));
            assert!(out.is_empty());
            d.push(&frame(&[END]), &mut out).unwrap();
            assert!(out.is_empty(), "decoded after an error");
        }
        // A batch whose records overrun its bytes.
        let mut b = Vec::new();
        encode(&sample().remove(0), &mut b);
        let cut = b.len() - 10;
        b.truncate(cut);
        b[..4].copy_from_slice(&((cut - 4) as u32).to_le_bytes());
        assert!(matches!(Decoder::default().push(&b, &mut Vec::new()), Err(FrameError::Batch(_))));
    }
}
