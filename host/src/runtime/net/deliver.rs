//! The receiving end of a channel from another worker: a task per stream that decodes the
//! channel's messages into the receiving subtask's local channel and, with unaligned
//! checkpoints, a task for its priority stream whose barriers the data task hands to the
//! subtask's priority inbox after taking along what arrived before the barrier's position but
//! is not in the local channel yet (`splice.rs`).
//!
//! Invariants: messages enter the local channel in stream order; nothing after a barrier's
//! marker enters it before that barrier reached the inbox (the priority stream and the data
//! stream are not ordered with each other), and a barrier reaches the inbox only with every
//! message before its position in the local channel or carried by it — so the receiving
//! input sees the channel as in one process. Window is released for a chunk once it is
//! decoded, and the next chunk is read only when everything decoded is in the local channel
//! (bounded by the window and one chunk), except to reach a barrier's position, which the
//! sender handed to the network before the barrier (so it comes). A back-edge's batch is
//! charged to the worker's in-flight budget before it enters the local channel (one a barrier
//! carries is not: the receiving input never gives it back).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::ids::CheckpointId;
use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::message::{Message, Priority};
use crate::runtime::net::frame::{Decoder, Frame, Item};
use crate::runtime::net::splice::Hop;

/// Where a channel's unaligned barriers go at the receiving worker: the receiving subtask's
/// priority inbox and the channel's input index there (never taken from the wire).
pub type BarrierInbox = (Sender<Priority>, usize);

/// Where an expected channel's stream goes: the local channel, the notification its
/// receiving subtask gives each time it takes a message off, a back-edge's budget, and with
/// unaligned checkpoints the barriers decoded from its priority stream and their inbox.
pub struct Delivery {
    /// The local channel.
    pub tx: Sender<Message>,
    /// Notified when the receiver takes a message off.
    pub space: Arc<tokio::sync::Notify>,
    /// A back-edge's in-flight budget.
    pub budget: Option<Arc<FeedbackBudget>>,
    /// Unaligned checkpoints: barriers from the priority stream, and where they go.
    pub barriers: Option<(UnboundedReceiver<Priority>, BarrierInbox)>,
}

/// What one look at the stream, the barriers and the local channel brought.
enum Event {
    Barrier(Option<Priority>),
    Chunk(Option<bytes::Bytes>),
    Space,
}

/// A stream's bytes as they come, and the window given back for them.
pub trait Chunks: Send {
    /// The next chunk; `None` once the stream ended or broke.
    fn next(&mut self) -> impl std::future::Future<Output = Option<bytes::Bytes>> + Send;
    /// Gives `n` bytes of window back; false if the stream is gone.
    fn release(&mut self, n: usize) -> bool;
}

impl Chunks for h2::RecvStream {
    async fn next(&mut self) -> Option<bytes::Bytes> {
        self.data().await.and_then(Result::ok)
    }

    fn release(&mut self, n: usize) -> bool {
        self.flow_control().release_capacity(n).is_ok()
    }
}

/// The data task's state.
struct Stream<C> {
    body: C,
    decoder: Decoder,
    /// Decoded, not yet in the local channel: messages and barriers' markers.
    waiting: VecDeque<Item>,
    /// Messages in `waiting`.
    messages: u64,
    /// Position: stream messages that went into the local channel or into barriers.
    hop: Hop,
    /// The newest barrier handed to the inbox.
    handed: Option<CheckpointId>,
    ended: bool,
}

impl<C: Chunks> Stream<C> {
    /// Decodes `chunk` into `waiting` and releases its window. False on a malformed stream.
    fn take(&mut self, chunk: &[u8]) -> bool {
        let mut out = Vec::new();
        if self.decoder.push_frames(chunk, &mut out).is_err() {
            return false;
        }
        for f in out {
            match f {
                Frame::Message(m) => {
                    self.messages += 1;
                    self.waiting.push_back(Item::Message(m));
                }
                Frame::Marker(id) => self.waiting.push_back(Item::Marker(id)),
                Frame::Priority { .. } => return false,
            }
        }
        self.body.release(chunk.len())
    }

    /// Reads until `position` messages were decoded (or the stream ends).
    async fn reach(&mut self, position: u64) -> bool {
        while self.hop.taken + self.messages < position && !self.ended {
            match self.body.next().await {
                Some(chunk) => {
                    if !self.take(&chunk) {
                        return false;
                    }
                }
                None => self.ended = true,
            }
        }
        true
    }

    /// A marker whose barrier already reached the inbox.
    fn passed(&self, id: CheckpointId) -> bool {
        self.handed.is_some_and(|h| h >= id)
    }

    /// The next message waiting, dropping passed markers; `None` at an open marker.
    fn next_message(&mut self) -> Option<Message> {
        loop {
            match self.waiting.pop_front()? {
                Item::Message(m) => {
                    self.messages -= 1;
                    return Some(m);
                }
                Item::Marker(id) if self.passed(id) => {}
                marker => {
                    self.waiting.push_front(marker);
                    return None;
                }
            }
        }
    }

    /// Moves what waits into the local channel while it has room, up to an open marker.
    fn fill(&mut self, tx: &Sender<Message>, budget: Option<&FeedbackBudget>) -> Result<Fill, ()> {
        loop {
            let Some(m) = self.next_message() else {
                return Ok(if self.waiting.is_empty() { Fill::Done } else { Fill::Gated });
            };
            match put(tx, budget, m) {
                Put::In => self.hop.handed(),
                Put::Full(m) => {
                    self.messages += 1;
                    self.waiting.push_front(Item::Message(m));
                    return Ok(Fill::Full);
                }
                Put::Gone => return Err(()),
            }
        }
    }

    /// Barrier `p`: takes along what arrived before its position, then hands it on.
    async fn barrier(&mut self, mut p: Priority, (to, input): &BarrierInbox) -> bool {
        if !self.reach(p.sent).await {
            return false;
        }
        let mut hop = self.hop;
        let spliced = hop.splice(&mut p, || self.next_message());
        self.hop = hop;
        if spliced.is_err() {
            // The sender went away mid-stream: the attempt fails; the barrier is moot.
            return false;
        }
        self.handed = Some(p.id);
        p.input = *input;
        let _ = to.send(p);
        true
    }
}

/// How far [`Stream::fill`] got.
enum Fill {
    /// Everything decoded is in the local channel.
    Done,
    /// The local channel is full.
    Full,
    /// At a barrier's marker; the barrier has not come yet.
    Gated,
}

/// Decodes a stream into its local channel; hands its barriers on (see the module doc).
pub async fn deliver_stream(body: impl Chunks, d: Delivery) {
    let Delivery { tx, space, budget, barriers } = d;
    let (mut barriers, inbox) = match barriers {
        Some((rx, inbox)) => (Some(rx), Some(inbox)),
        None => (None, None),
    };
    let mut s = Stream {
        body,
        decoder: Decoder::default(),
        waiting: VecDeque::new(),
        messages: 0,
        hop: Hop::default(),
        handed: None,
        ended: false,
    };
    loop {
        let Ok(fill) = s.fill(&tx, budget.as_deref()) else { return };
        let (full, gated) = (matches!(fill, Fill::Full), matches!(fill, Fill::Gated));
        // Ended: every barrier's marker came before the end, so none is owed; gated with no
        // barriers to come: the peer went away.
        if (s.ended && matches!(fill, Fill::Done)) || (gated && barriers.is_none()) {
            return;
        }
        let event = tokio::select! {
            biased;
            p = async { barriers.as_mut().expect("guarded").recv().await }, if barriers.is_some() => Event::Barrier(p),
            _ = space.notified(), if full => Event::Space,
            // Only a guard against a receiver that stops notifying.
            _ = tokio::time::sleep(Duration::from_millis(100)), if full => Event::Space,
            c = s.body.next(), if !full && !gated && !s.ended => Event::Chunk(c),
        };
        match event {
            Event::Space => {}
            Event::Chunk(Some(chunk)) => {
                if !s.take(&chunk) {
                    return;
                }
            }
            Event::Chunk(None) => s.ended = true,
            Event::Barrier(None) => barriers = None,
            Event::Barrier(Some(p)) => {
                let inbox = inbox.as_ref().expect("barriers come with their inbox");
                if !s.barrier(p, inbox).await {
                    return;
                }
            }
        }
    }
}

enum Put {
    In,
    Full(Message),
    Gone,
}

/// Puts `m` into the local channel if it has room. A back-edge's batch is charged first (the
/// receiver may take it off and give it back at once) and refunded if it does not get in.
fn put(tx: &Sender<Message>, budget: Option<&FeedbackBudget>, m: Message) -> Put {
    let bytes = match (&budget, &m) {
        (Some(_), Message::Data(b)) => b.as_bytes().len() as u64,
        _ => 0,
    };
    let budget = budget.filter(|_| bytes > 0);
    if let Some(b) = budget {
        b.add(bytes);
    }
    let refund = || {
        if let Some(b) = budget {
            b.sub(bytes);
        }
    };
    match tx.try_send(m) {
        Ok(()) => Put::In,
        Err(TrySendError::Full(m)) => {
            refund();
            Put::Full(m)
        }
        Err(TrySendError::Disconnected(_)) => {
            refund();
            Put::Gone
        }
    }
}

/// Decodes a channel's priority stream into barriers for its data task.
pub async fn deliver_barriers(mut body: h2::RecvStream, to: UnboundedSender<Priority>) {
    let mut decoder = Decoder::default();
    let mut frames = Vec::new();
    let mut open: Option<(Priority, u32)> = None;
    while let Some(Ok(chunk)) = body.data().await {
        if decoder.push_frames(&chunk, &mut frames).is_err() {
            return;
        }
        for f in frames.drain(..) {
            match (f, open.as_mut()) {
                (Frame::Priority { id, sent, elapsed_us, carried }, None) => {
                    let started =
                        Instant::now().checked_sub(Duration::from_micros(elapsed_us)).unwrap_or_else(Instant::now);
                    let carried_msgs = Vec::with_capacity(carried.min(1024) as usize);
                    open = Some((Priority { input: 0, id, sent, carried: carried_msgs, started }, carried));
                }
                (Frame::Message(m), Some((p, left))) => {
                    p.carried.push(m);
                    *left -= 1;
                }
                // A message outside a barrier, or a barrier inside one: not our protocol.
                _ => return,
            }
            if open.as_ref().is_some_and(|(_, left)| *left == 0) {
                let (p, _) = open.take().expect("checked");
                if to.send(p).is_err() {
                    return;
                }
            }
        }
        if body.flow_control().release_capacity(chunk.len()).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::net::frame::encode_item;

    /// Chunks from a test: nothing to give window back to.
    impl Chunks for tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes> {
        async fn next(&mut self) -> Option<bytes::Bytes> {
            self.recv().await
        }

        fn release(&mut self, _: usize) -> bool {
            true
        }
    }

    fn frames(items: Vec<Item>) -> bytes::Bytes {
        let mut out = Vec::new();
        for i in &items {
            encode_item(i, &mut out);
        }
        out.into()
    }

    fn wms(r: std::ops::Range<i64>) -> Vec<Item> {
        r.map(|i| Item::Message(Message::Watermark(i))).collect()
    }

    fn mark(m: Message) -> i64 {
        match m {
            Message::Watermark(w) => w,
            other => panic!("{other:?}"),
        }
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn barrier(id: u64, sent: u64, carried: Vec<Message>) -> Priority {
        Priority { input: 0, id: CheckpointId(id), sent, carried, started: Instant::now() }
    }

    fn paused() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
    }

    /// A data task with barriers: the receiver's channel (`cap`) and inbox (input `input`),
    /// where barriers and chunks are sent in, and the task.
    #[allow(clippy::type_complexity)]
    fn with_barriers(
        cap: usize,
        input: usize,
    ) -> (
        crossbeam_channel::Receiver<Message>,
        crossbeam_channel::Receiver<Priority>,
        UnboundedSender<Priority>,
        UnboundedSender<bytes::Bytes>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = crossbeam_channel::bounded(cap);
        let (inbox_tx, inbox) = crossbeam_channel::unbounded();
        let (to, barriers) = tokio::sync::mpsc::unbounded_channel();
        let (chunks, body) = tokio::sync::mpsc::unbounded_channel();
        let d = Delivery { tx, space: Arc::default(), budget: None, barriers: Some((barriers, (inbox_tx, input))) };
        (rx, inbox, to, chunks, tokio::spawn(deliver_stream(body, d)))
    }

    /// A full local channel is refilled the moment its receiver takes a message off, not on a
    /// timer (virtual time does not move): a timer there capped a channel at a few thousand
    /// messages a second and kept a standing queue of ~100 ms in its window.
    #[test]
    fn cluster_net_a_full_channel_is_refilled_as_soon_as_its_receiver_takes_a_message() {
        paused().block_on(async {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let space = Arc::new(tokio::sync::Notify::new());
            let (chunks, body) = tokio::sync::mpsc::unbounded_channel();
            let d = Delivery { tx, space: space.clone(), budget: None, barriers: None };
            let task = tokio::spawn(deliver_stream(body, d));
            let start = tokio::time::Instant::now();
            chunks.send(frames(wms(1..3))).unwrap();
            settle().await;
            assert_eq!(mark(rx.try_recv().unwrap()), 1);
            assert!(rx.try_recv().is_err(), "the channel was full: the second waits");
            space.notify_one();
            settle().await;
            assert_eq!(mark(rx.try_recv().unwrap()), 2, "delivered on the notification");
            assert_eq!(start.elapsed(), Duration::ZERO, "not after a timer");
            // A receiver that is gone ends the delivery.
            drop(rx);
            chunks.send(frames(wms(3..4))).unwrap();
            settle().await;
            assert!(task.is_finished());
        });
    }

    /// The receiving hop: a barrier whose position lies beyond what the full channel took
    /// carries what arrived before its position (reading the stream up to it); what comes
    /// after its marker stays for the channel.
    #[test]
    fn cluster_net_a_barrier_takes_along_what_arrived_but_is_not_in_the_channel() {
        paused().block_on(async {
            let (rx, inbox, to, chunks, _task) = with_barriers(2, 4);
            chunks.send(frames(wms(0..5))).unwrap();
            settle().await;
            to.send(barrier(2, 7, vec![Message::Watermark(100)])).unwrap();
            settle().await;
            assert!(inbox.try_recv().is_err(), "positions 6 and 7 have not arrived: the barrier waits for them");
            let mut rest = wms(5..7);
            rest.push(Item::Marker(CheckpointId(2)));
            rest.extend(wms(7..9));
            chunks.send(frames(rest)).unwrap();
            settle().await;
            let p = inbox.try_recv().expect("the barrier");
            assert_eq!((p.input, p.sent), (4, 2), "the channel holds two; the receiving worker sets the input");
            assert_eq!(p.carried.into_iter().map(mark).collect::<Vec<_>>(), vec![2, 3, 4, 5, 6, 100]);
            let mut got: Vec<i64> = (0..2).map(|_| mark(rx.try_recv().unwrap())).collect();
            // No notification in this test: the guard timer refills the channel.
            tokio::time::sleep(Duration::from_millis(300)).await;
            settle().await;
            got.extend(rx.try_iter().map(mark));
            assert_eq!(got, vec![0, 1, 7, 8], "the channel: before the barrier, then after it");
        });
    }

    /// The streams are not ordered with each other: what follows a marker waits for its
    /// barrier; a later barrier's position leaves out what an earlier one carried.
    #[test]
    fn cluster_net_nothing_after_a_marker_reaches_the_channel_before_its_barrier() {
        paused().block_on(async {
            let (rx, inbox, to, chunks, task) = with_barriers(64, 0);
            let mut items = wms(0..2);
            items.push(Item::Marker(CheckpointId(1)));
            items.extend(wms(2..4));
            items.push(Item::Marker(CheckpointId(2)));
            items.extend(wms(4..5));
            items.push(Item::Message(Message::EndOfStream));
            chunks.send(frames(items)).unwrap();
            settle().await;
            assert_eq!(rx.try_iter().map(mark).collect::<Vec<_>>(), vec![0, 1], "held at the first marker");
            to.send(barrier(1, 2, vec![])).unwrap();
            settle().await;
            assert_eq!(inbox.try_recv().unwrap().sent, 2);
            assert_eq!(rx.try_iter().map(mark).collect::<Vec<_>>(), vec![2, 3], "held at the second marker");
            to.send(barrier(2, 4, vec![])).unwrap();
            settle().await;
            assert_eq!(inbox.try_recv().unwrap().sent, 4);
            assert_eq!(mark(rx.try_recv().unwrap()), 4);
            assert!(matches!(rx.try_recv(), Ok(Message::EndOfStream)));
            drop(chunks); // the stream ends after its end of stream (one HTTP/2 frame)
            settle().await;
            assert!(task.is_finished(), "ended: no barrier is owed after the end of stream");
        });
    }
}
