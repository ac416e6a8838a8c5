//! Channels between subtasks on different workers: one HTTP/2 connection per pair of workers
//! (the `h2` crate, hyper's), one stream per channel. HTTP/2's per-stream flow-control window
//! is the channel's credit, as in Flink's credit-based network stack: a channel whose receiver
//! does not read stops only its own stream, never the connection, and backpressure reaches the
//! sending subtask, which blocks on its channel's queue. Both ends look like the in-process
//! channels to the subtasks: the sender a queue it blocks on, the receiver a bounded
//! crossbeam channel. When that channel is full, the stream's task waits for the receiving
//! subtask to say it took a message off (a `Notify` its input holds), never on a timer: a
//! polling wait there capped a channel at a few thousand messages a second and kept its window
//! full, a standing queue of ~100 ms at any rate.
//!
//! Invariants: a channel's messages arrive in order, exactly as sent (`frame.rs`); the
//! receiver releases window only for bytes whose messages are in the local channel, so what a
//! stalled channel holds is bounded by its window, its queues and one partial frame; a stream
//! is accepted only with the cluster secret (compared in constant time) and for a channel the
//! receiving worker expects for that attempt, so a worker of an older attempt (one that was
//! paused and fenced) delivers nothing; a sender that goes away without ending its channel
//! closes the stream, and the receiver sees a disconnect, as a neighbour's thread ending would
//! look in one process (after the messages it did send).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Sender, TrySendError};
use tokio::net::{TcpListener, TcpStream};

use crate::runtime::net::tls::{self, ClusterTls, Stream};

use crate::io_runtime::io_runtime;
use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::message::Message;
use crate::runtime::net::frame::{Decoder, encode};
use crate::runtime::output::Disconnected;

/// Bytes a channel may have on the wire unread (its credit).
pub const CHANNEL_WINDOW: u32 = 256 << 10;
/// The connection's window: never the limit (a stalled channel must not hold up the others).
const CONNECTION_WINDOW: u32 = i32::MAX as u32;

/// A channel of one attempt of a job's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChannelKey {
    /// The attempt (restarts increase it; older ones are fenced).
    pub attempt: u64,
    /// Index into the physical plan's channels.
    pub channel: u64,
}

pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Where an expected channel's messages go: the local channel, and the notification its
/// receiving subtask gives each time it takes a message off.
/// Where a channel's messages go: its local queue, the notification its receiver gives when it
/// takes one off, and (a back-edge) the receiving worker's in-flight budget its batches count
/// against once here.
type Delivery = (Sender<Message>, Arc<tokio::sync::Notify>, Option<Arc<FeedbackBudget>>);

type Registry = Arc<Mutex<HashMap<ChannelKey, Delivery>>>;

/// A worker's receiving side: accepts its peers' connections and delivers each stream into
/// the local channel registered for it.
pub struct Inbound {
    addr: SocketAddr,
    expected: Registry,
}

impl Inbound {
    /// Listens on `addr`; peers must present `secret` (and, with `tls`, a certificate of the
    /// cluster).
    pub fn bind(addr: SocketAddr, secret: &str, tls: Option<ClusterTls>) -> std::io::Result<Inbound> {
        let listener = io_runtime().block_on(TcpListener::bind(addr))?;
        let addr = listener.local_addr()?;
        let expected: Registry = Arc::default();
        let (reg, secret) = (expected.clone(), Arc::<str>::from(secret));
        io_runtime().spawn(async move {
            loop {
                // An accept error (out of file descriptors, say) must not close the port for good.
                let sock = match listener.accept().await {
                    Ok((sock, _)) => sock,
                    Err(e) => {
                        tracing::warn!("accepting a channel connection on {addr}: {e}; retrying");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (reg, secret, tls) = (reg.clone(), secret.clone(), tls.clone());
                tokio::spawn(async move {
                    if let Ok(sock) = tls::accept(tls.as_ref(), sock).await {
                        serve(sock, reg, secret).await;
                    }
                });
            }
        });
        Ok(Inbound { addr, expected })
    }

    /// Where peers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Delivers channel `key`'s messages into `tx` once its sender connects; while `tx` is
    /// full, waits for `space`, which its receiver notifies whenever it takes a message off. A
    /// back-edge's batches are charged to `budget` as they arrive (its receiver gives them
    /// back as it takes them off).
    pub fn expect(
        &self,
        key: ChannelKey,
        tx: Sender<Message>,
        space: Arc<tokio::sync::Notify>,
        budget: Option<Arc<FeedbackBudget>>,
    ) {
        self.expected.lock().unwrap().insert(key, (tx, space, budget));
    }

    /// Forgets every channel of attempts before `attempt`: their senders are refused.
    pub fn fence(&self, attempt: u64) {
        self.expected.lock().unwrap().retain(|k, _| k.attempt >= attempt);
    }
}

/// One connection: routes each incoming stream after checking it.
async fn serve(sock: Stream, expected: Registry, secret: Arc<str>) {
    let handshake = h2::server::Builder::new()
        .initial_window_size(CHANNEL_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake::<_, Bytes>(sock);
    let Ok(Ok(mut conn)) = tokio::time::timeout(CONNECT_TIMEOUT, handshake).await else { return };
    while let Some(Ok((req, mut respond))) = conn.accept().await {
        // Taken on acceptance: one sender per channel and attempt.
        let routed = channel_of(&req, &secret).and_then(|key| expected.lock().unwrap().remove(&key).ok_or(410));
        let code = match &routed {
            Ok(_) => 200,
            Err(code) => *code,
        };
        let response = http::Response::builder().status(code).body(()).expect("a status-only response");
        if respond.send_response(response, true).is_err() {
            continue;
        }
        if let Ok(to) = routed {
            tokio::spawn(deliver_stream(req.into_body(), to));
        }
    }
}

/// The channel a stream is for, or the status refusing it: 403 without the secret, 400
/// without a well-formed attempt and channel.
fn channel_of(req: &http::Request<h2::RecvStream>, secret: &str) -> Result<ChannelKey, u16> {
    let header = |name: &str| req.headers().get(name).map(|v| v.as_bytes());
    if !header("weir-secret").is_some_and(|s| same_secret(s, secret.as_bytes())) {
        return Err(403);
    }
    let num = |name: &str| header(name).and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok());
    match (num("weir-attempt"), num("weir-channel")) {
        (Some(attempt), Some(channel)) => Ok(ChannelKey { attempt, channel }),
        _ => Err(400),
    }
}

/// Decodes a stream into its local channel, releasing window as messages get in.
async fn deliver_stream(mut body: h2::RecvStream, (tx, space, budget): Delivery) {
    let mut decoder = Decoder::default();
    let mut messages = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        if decoder.push(&chunk, &mut messages).is_err() {
            return;
        }
        for m in messages.drain(..) {
            if let (Some(b), Message::Data(batch)) = (&budget, &m) {
                b.add(batch.as_bytes().len() as u64);
            }
            if deliver(&tx, &space, m).await.is_err() {
                return;
            }
        }
        if body.flow_control().release_capacity(chunk.len()).is_err() {
            return;
        }
    }
}

/// Puts `m` into the local channel, waiting (without holding a runtime thread) while it is
/// full until its receiver takes a message off. No wake-up is lost: a message taken off
/// between the failed `try_send` and the wait leaves a permit in `space`, so the wait returns
/// at once. A receiver that is gone disconnects the channel, which `try_send` reports; the
/// periodic look is only a guard against a receiver that stops notifying.
async fn deliver(tx: &Sender<Message>, space: &tokio::sync::Notify, mut m: Message) -> Result<(), Disconnected> {
    loop {
        match tx.try_send(m) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(back)) => {
                m = back;
                let _ = tokio::time::timeout(Duration::from_millis(100), space.notified()).await;
            }
            Err(TrySendError::Disconnected(_)) => return Err(Disconnected),
        }
    }
}

/// Why a channel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Connecting or talking HTTP/2 failed.
    #[error("worker {addr}: {message}")]
    Network {
        /// The peer.
        addr: SocketAddr,
        /// What failed.
        message: String,
    },
    /// The peer refused the stream.
    #[error("worker {addr} refused channel {channel} of attempt {attempt}: {why}")]
    Refused {
        /// The peer.
        addr: SocketAddr,
        /// The channel.
        channel: u64,
        /// The attempt.
        attempt: u64,
        /// Why, from the status.
        why: &'static str,
    },
}

/// How long connecting to a peer (or a peer's handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A worker's connection to one peer, on which it opens the channels it sends on.
pub struct Outbound {
    addr: SocketAddr,
    secret: String,
    send: h2::client::SendRequest<Bytes>,
}

impl Outbound {
    /// Connects to the peer listening on `addr` (over TLS with `tls`).
    pub fn connect(addr: SocketAddr, secret: &str, tls: Option<&ClusterTls>) -> Result<Outbound, OpenError> {
        let net = |e: &dyn std::fmt::Display| OpenError::Network { addr, message: e.to_string() };
        let send = io_runtime().block_on(async {
            // A paused peer's kernel still accepts: connecting must not wait for it forever.
            let sock = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
                .await
                .map_err(|_| net(&"no answer to connecting"))?
                .map_err(|e| net(&e))?;
            let sock = tls::connect(tls, sock).await.map_err(|e| net(&e))?;
            let handshake = h2::client::Builder::new()
                .initial_window_size(CHANNEL_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .handshake::<_, Bytes>(sock);
            let (send, conn) = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
                .await
                .map_err(|_| net(&"no HTTP/2 handshake"))?
                .map_err(|e| net(&e))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok::<_, OpenError>(send)
        })?;
        Ok(Outbound { addr, secret: secret.to_string(), send })
    }

    /// Opens channel `key`; the returned sender queues up to `capacity` messages before it
    /// blocks.
    pub fn open(&self, key: ChannelKey, capacity: usize) -> Result<RemoteSender, OpenError> {
        let addr = self.addr;
        let net = |e: &dyn std::fmt::Display| OpenError::Network { addr, message: e.to_string() };
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/channel"))
            .header("weir-secret", &self.secret)
            .header("weir-attempt", key.attempt.to_string())
            .header("weir-channel", key.channel.to_string())
            .body(())
            .map_err(|e| net(&e))?;
        let send = self.send.clone();
        let stream = io_runtime().block_on(async move {
            let mut send = send.ready().await.map_err(|e| net(&e))?;
            let (response, stream) = send.send_request(request, false).map_err(|e| net(&e))?;
            let status = response.await.map_err(|e| net(&e))?.status().as_u16();
            let why = match status {
                200 => return Ok(stream),
                403 => "wrong cluster secret",
                410 => "it expects no such channel for that attempt (a fenced attempt, or opened twice)",
                _ => "malformed request",
            };
            Err(OpenError::Refused { addr, channel: key.channel, attempt: key.attempt, why })
        })?;
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        io_runtime().spawn(send_stream(stream, rx));
        Ok(RemoteSender { tx })
    }
}

/// Writes queued messages to the stream as the window allows.
async fn send_stream(mut stream: h2::SendStream<Bytes>, mut rx: tokio::sync::mpsc::Receiver<Message>) {
    let mut buf = Vec::new();
    while let Some(m) = rx.recv().await {
        encode(&m, &mut buf);
        let end = matches!(m, Message::EndOfStream);
        if !send_all(&mut stream, Bytes::from(std::mem::take(&mut buf)), end).await {
            return;
        }
        if end {
            return;
        }
    }
    // The sending subtask went away without ending its channel: close the stream after what
    // was sent (a reset would discard it); with no end of stream in it, the receiver sees a
    // disconnect, as in one process.
    let _ = stream.send_data(Bytes::new(), true);
}

/// Sends `data` on `stream` as its window allows, ending the stream after it if `end`; false
/// if the stream is gone.
pub(crate) async fn send_all(stream: &mut h2::SendStream<Bytes>, mut data: Bytes, end: bool) -> bool {
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted = std::future::poll_fn(|cx| stream.poll_capacity(cx)).await;
        let Some(Ok(n)) = granted else { return false };
        if n == 0 {
            continue;
        }
        let chunk = data.split_to(n.min(data.len()));
        if stream.send_data(chunk, end && data.is_empty()).is_err() {
            return false;
        }
    }
    true
}

/// The sending end of a channel to another worker.
pub struct RemoteSender {
    tx: tokio::sync::mpsc::Sender<Message>,
}

impl RemoteSender {
    /// Queues `m`, blocking while the channel's queue is full (backpressure). Call from a
    /// subtask thread, not from async code.
    pub fn send(&self, m: Message) -> Result<(), Disconnected> {
        self.tx.blocking_send(m).map_err(|_| Disconnected)
    }

    /// [`send`](Self::send), giving up once `cancel` is set: a peer that stopped reading
    /// (paused, partitioned) must not hold the sender past its attempt's cancellation.
    pub fn send_unless(&self, mut m: Message, cancel: &std::sync::atomic::AtomicBool) -> Result<(), Disconnected> {
        use tokio::sync::mpsc::error::SendTimeoutError;
        loop {
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Disconnected);
            }
            match io_runtime().block_on(self.tx.send_timeout(m, Duration::from_millis(50))) {
                Ok(()) => return Ok(()),
                Err(SendTimeoutError::Timeout(back)) => m = back,
                Err(SendTimeoutError::Closed(_)) => return Err(Disconnected),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::record::Batch;

    fn batch(i: u64) -> Message {
        let mut b = Batch::default();
        b.push(0, i as i64, &i.to_le_bytes(), &[7; 10 << 10]);
        Message::Data(b)
    }

    /// A local channel of `cap` expected for `key`, and a reader that takes a message off as
    /// a subtask's input does (telling the network side).
    fn expect(inbound: &Inbound, key: ChannelKey, cap: usize) -> impl Fn() -> Message {
        let (tx, rx) = crossbeam_channel::bounded(cap);
        let space = Arc::new(tokio::sync::Notify::new());
        inbound.expect(key, tx, space.clone(), None);
        move || {
            let m = rx.recv().unwrap();
            space.notify_one();
            m
        }
    }

    fn ts(m: &Message) -> i64 {
        match m {
            Message::Data(b) => b.iter().next().unwrap().timestamp,
            other => panic!("{other:?}"),
        }
    }

    /// A back-edge between workers: its batches count against the receiving worker's
    /// in-flight budget from their arrival (an unbounded queue, so the sender never waits),
    /// and its receiver gives them back.
    #[test]
    fn cluster_net_a_back_edge_from_another_worker_is_charged_to_this_workers_budget() {
        let inbound = Inbound::bind("127.0.0.1:0".parse().unwrap(), "secret", None).unwrap();
        let key = ChannelKey { attempt: 1, channel: 0 };
        let (tx, rx) = crossbeam_channel::unbounded();
        let budget = Arc::new(FeedbackBudget::new(1 << 30));
        inbound.expect(key, tx, Arc::default(), Some(budget.clone()));
        let out = Outbound::connect(inbound.addr(), "secret", None).unwrap();
        let s = out.open(key, 2).unwrap();
        let mut bytes = 0;
        for i in 0..20 {
            let m = batch(i);
            if let Message::Data(b) = &m {
                bytes += b.as_bytes().len() as u64;
            }
            s.send(m).unwrap();
        }
        s.send(Message::EndOfStream).unwrap();
        // Taken off raw (no subtask input gives the bytes back): all of it is charged here.
        let mut got = Vec::new();
        while got.len() < 21 {
            got.push(rx.recv_timeout(Duration::from_secs(30)).expect("a back-edge never waits for its reader"));
        }
        assert_eq!(budget.held(), bytes);
        assert!(matches!(got.last(), Some(Message::EndOfStream)));
    }

    #[test]
    fn cluster_net_a_stalled_channel_holds_back_only_its_sender_and_every_channel_arrives_in_order() {
        let inbound = Inbound::bind("127.0.0.1:0".parse().unwrap(), "secret", None).unwrap();
        let (a, b) = (ChannelKey { attempt: 1, channel: 0 }, ChannelKey { attempt: 1, channel: 1 });
        let (a_rx, b_rx) = (expect(&inbound, a, 2), expect(&inbound, b, 2));
        let out = Outbound::connect(inbound.addr(), "secret", None).unwrap();
        let (sa, sb) = (out.open(a, 2).unwrap(), out.open(b, 2).unwrap());
        // Nobody reads channel A: its sender must block after a bounded number of batches.
        let sent_a = Arc::new(AtomicU64::new(0));
        let counter = sent_a.clone();
        let writer = std::thread::spawn(move || {
            for i in 0..200 {
                sa.send(batch(i)).unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
            }
            sa.send(Message::EndOfStream).unwrap();
        });
        // Channel B on the same connection flows freely meanwhile, in order.
        std::thread::spawn(move || {
            for i in 0..300 {
                sb.send(batch(i)).unwrap();
                if i % 50 == 0 {
                    sb.send(Message::Watermark(i as i64)).unwrap();
                    sb.send(Message::Barrier(crate::ids::CheckpointId(i))).unwrap();
                }
            }
            sb.send(Message::EndOfStream).unwrap();
        });
        let mut next = 0;
        loop {
            match b_rx() {
                Message::EndOfStream => break,
                Message::Watermark(w) => assert_eq!(w, next - 1),
                Message::Barrier(id) => assert_eq!(id.0 as i64, next - 1),
                m => {
                    assert_eq!(ts(&m), next);
                    next += 1;
                }
            }
        }
        assert_eq!(next, 300);
        // A's backlog is bounded by its credit and queues (256 KiB window / 10 KiB batches,
        // plus queues of 2 at both ends), whatever the machine's speed.
        let held = sent_a.load(Ordering::SeqCst);
        assert!(held < 40, "{held} batches sent on a channel nobody reads");
        for i in 0..200 {
            assert_eq!(ts(&a_rx()), i);
        }
        assert!(matches!(a_rx(), Message::EndOfStream));
        writer.join().unwrap();
    }

    #[test]
    fn cluster_net_a_wrong_secret_or_a_fenced_attempt_is_refused_and_delivers_nothing() {
        let inbound = Inbound::bind("127.0.0.1:0".parse().unwrap(), "secret", None).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(4);
        let old = ChannelKey { attempt: 1, channel: 5 };
        inbound.expect(old, tx.clone(), Arc::default(), None);
        let e = Outbound::connect(inbound.addr(), "guess", None).unwrap().open(old, 1).err().unwrap().to_string();
        assert!(e.contains("wrong cluster secret") && e.contains("channel 5"), "{e}");
        inbound.fence(2);
        let e = Outbound::connect(inbound.addr(), "secret", None).unwrap().open(old, 1).err().unwrap().to_string();
        assert!(e.contains("attempt 1") && e.contains("fenced"), "{e}");
        let new = ChannelKey { attempt: 2, channel: 5 };
        inbound.expect(new, tx, Arc::default(), None);
        let s = Outbound::connect(inbound.addr(), "secret", None).unwrap().open(new, 1).unwrap();
        s.send(Message::Watermark(9)).unwrap();
        assert!(matches!(rx.recv().unwrap(), Message::Watermark(9)), "the current attempt's channel delivers");
        assert!(rx.try_recv().is_err(), "nothing from the refused streams");
    }

    #[test]
    fn cluster_net_a_sender_that_goes_away_without_ending_its_channel_disconnects_the_receiver() {
        let inbound = Inbound::bind("127.0.0.1:0".parse().unwrap(), "secret", None).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(4);
        let key = ChannelKey { attempt: 1, channel: 0 };
        inbound.expect(key, tx, Arc::default(), None);
        let s = Outbound::connect(inbound.addr(), "secret", None).unwrap().open(key, 1).unwrap();
        s.send(Message::Watermark(1)).unwrap();
        drop(s);
        assert!(matches!(rx.recv().unwrap(), Message::Watermark(1)));
        assert!(rx.recv().is_err(), "the receiver must see the sender gone");
    }

    /// A full local channel is refilled the moment its receiver takes a message off, not on a
    /// timer (virtual time does not move): a timer there capped a channel at a few thousand
    /// messages a second and kept a standing queue of ~100 ms in its window.
    #[test]
    fn cluster_net_a_full_channel_is_refilled_as_soon_as_its_receiver_takes_a_message() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let space = Arc::new(tokio::sync::Notify::new());
            tx.send(Message::Watermark(1)).unwrap();
            let start = tokio::time::Instant::now();
            let (t2, s2) = (tx.clone(), space.clone());
            let waiting = tokio::spawn(async move { deliver(&t2, &s2, Message::Watermark(2)).await });
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert!(!waiting.is_finished(), "the channel is full: the delivery waits");
            assert!(matches!(rx.try_recv().unwrap(), Message::Watermark(1)));
            space.notify_one();
            waiting.await.unwrap().unwrap();
            assert_eq!(start.elapsed(), Duration::ZERO, "delivered on the notification, not after a timer");
            assert!(matches!(rx.try_recv().unwrap(), Message::Watermark(2)));
            // A receiver that is gone ends the delivery.
            drop(rx);
            assert!(deliver(&tx, &space, Message::Watermark(6)).await.is_err());
        });
    }
}
