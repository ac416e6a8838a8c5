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
use crossbeam_channel::Sender;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedSender;

use crate::runtime::net::tls::{self, ClusterTls, Stream};

use crate::io_runtime::io_runtime;
use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::message::{Message, Priority};
use crate::runtime::net::deliver::{BarrierInbox, Delivery, deliver_barriers, deliver_stream};
use crate::runtime::net::frame::{Item, encode_item, encode_priority};
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

/// Expected streams: each channel's data stream, and with unaligned checkpoints its priority
/// stream (whose barriers go to the data stream's task).
#[derive(Default)]
struct Expected {
    data: HashMap<ChannelKey, Delivery>,
    barriers: HashMap<ChannelKey, UnboundedSender<Priority>>,
}

type Registry = Arc<Mutex<Expected>>;

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
    /// back as it takes them off). With `barriers` (unaligned checkpoints) the channel's
    /// priority stream is expected too, its barriers going to that inbox.
    pub fn expect(
        &self,
        key: ChannelKey,
        tx: Sender<Message>,
        space: Arc<tokio::sync::Notify>,
        budget: Option<Arc<FeedbackBudget>>,
        barriers: Option<BarrierInbox>,
    ) {
        let mut e = self.expected.lock().unwrap();
        let barriers = barriers.map(|inbox| {
            let (to, from) = tokio::sync::mpsc::unbounded_channel();
            e.barriers.insert(key, to);
            (from, inbox)
        });
        e.data.insert(key, Delivery { tx, space, budget, barriers });
    }

    /// Forgets every channel of attempts before `attempt`: their senders are refused.
    pub fn fence(&self, attempt: u64) {
        let mut e = self.expected.lock().unwrap();
        e.data.retain(|k, _| k.attempt >= attempt);
        e.barriers.retain(|k, _| k.attempt >= attempt);
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
        let routed = channel_of(&req, &secret).and_then(|(key, barriers)| {
            let mut e = expected.lock().unwrap();
            match barriers {
                false => e.data.remove(&key).map(Route::Data),
                true => e.barriers.remove(&key).map(Route::Barriers),
            }
            .ok_or(410)
        });
        let code = match &routed {
            Ok(_) => 200,
            Err(code) => *code,
        };
        let response = http::Response::builder().status(code).body(()).expect("a status-only response");
        if respond.send_response(response, true).is_err() {
            continue;
        }
        match routed {
            Ok(Route::Data(to)) => drop(tokio::spawn(deliver_stream(req.into_body(), to))),
            Ok(Route::Barriers(to)) => drop(tokio::spawn(deliver_barriers(req.into_body(), to))),
            Err(_) => {}
        }
    }
}

/// Where an accepted stream goes.
enum Route {
    Data(Delivery),
    Barriers(UnboundedSender<Priority>),
}

/// The header that marks a channel's priority stream.
const BARRIERS: &str = "weir-barriers";

/// The channel a stream is for (and whether it is the channel's priority stream), or the
/// status refusing it: 403 without the secret, 400 without a well-formed attempt and channel.
fn channel_of(req: &http::Request<h2::RecvStream>, secret: &str) -> Result<(ChannelKey, bool), u16> {
    let header = |name: &str| req.headers().get(name).map(|v| v.as_bytes());
    if !header("weir-secret").is_some_and(|s| same_secret(s, secret.as_bytes())) {
        return Err(403);
    }
    let num = |name: &str| header(name).and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok());
    match (num("weir-attempt"), num("weir-channel")) {
        (Some(attempt), Some(channel)) => Ok((ChannelKey { attempt, channel }, header(BARRIERS).is_some())),
        _ => Err(400),
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
        let stream = self.stream(key, false)?;
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        io_runtime().spawn(send_stream(stream, rx));
        Ok(RemoteSender { tx })
    }

    /// Opens channel `key`'s priority stream (unaligned checkpoints): its barriers travel
    /// there, never behind the channel's data. Sending never blocks.
    pub fn open_barriers(&self, key: ChannelKey) -> Result<BarrierSender, OpenError> {
        let stream = self.stream(key, true)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        io_runtime().spawn(send_barriers(stream, rx));
        Ok(BarrierSender { tx })
    }

    /// A new stream for channel `key` (its priority stream if `barriers`), accepted.
    fn stream(&self, key: ChannelKey, barriers: bool) -> Result<h2::SendStream<Bytes>, OpenError> {
        let addr = self.addr;
        let net = |e: &dyn std::fmt::Display| OpenError::Network { addr, message: e.to_string() };
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/channel"))
            .header("weir-secret", &self.secret)
            .header("weir-attempt", key.attempt.to_string())
            .header("weir-channel", key.channel.to_string());
        if barriers {
            request = request.header(BARRIERS, "1");
        }
        let request = request.body(()).map_err(|e| net(&e))?;
        let send = self.send.clone();
        io_runtime().block_on(async move {
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
        })
    }
}

/// Writes barriers to a priority stream as they come; ends it when their sender is dropped.
async fn send_barriers(mut stream: h2::SendStream<Bytes>, mut rx: tokio::sync::mpsc::UnboundedReceiver<Priority>) {
    let mut buf = Vec::new();
    while let Some(p) = rx.recv().await {
        encode_priority(&p, &mut buf);
        if !send_all(&mut stream, Bytes::from(std::mem::take(&mut buf)), false).await {
            return;
        }
    }
    let _ = stream.send_data(Bytes::new(), true);
}

/// The sending end of a channel's priority stream.
pub struct BarrierSender {
    tx: tokio::sync::mpsc::UnboundedSender<Priority>,
}

impl BarrierSender {
    /// Queues barrier `p` for the network (never blocks).
    pub fn send(&self, p: Priority) -> Result<(), Disconnected> {
        self.tx.send(p).map_err(|_| Disconnected)
    }
}

/// Writes queued messages to the stream as the window allows.
async fn send_stream(mut stream: h2::SendStream<Bytes>, mut rx: tokio::sync::mpsc::Receiver<Item>) {
    let mut buf = Vec::new();
    while let Some(item) = rx.recv().await {
        encode_item(&item, &mut buf);
        let end = matches!(item, Item::Message(Message::EndOfStream));
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
    tx: tokio::sync::mpsc::Sender<Item>,
}

impl RemoteSender {
    /// Queues `m`, blocking while the channel's queue is full (backpressure). Call from a
    /// subtask thread, not from async code.
    pub fn send(&self, m: Message) -> Result<(), Disconnected> {
        self.tx.blocking_send(Item::Message(m)).map_err(|_| Disconnected)
    }

    /// Queues `item` if there is room within `wait`; else hands it back.
    pub fn send_within(&self, item: Item, wait: Duration) -> Result<Option<Item>, Disconnected> {
        use tokio::sync::mpsc::error::SendTimeoutError;
        match io_runtime().block_on(self.tx.send_timeout(item, wait)) {
            Ok(()) => Ok(None),
            Err(SendTimeoutError::Timeout(back)) => Ok(Some(back)),
            Err(SendTimeoutError::Closed(_)) => Err(Disconnected),
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
        inbound.expect(key, tx, space.clone(), None, None);
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
        inbound.expect(key, tx, Arc::default(), Some(budget.clone()), None);
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

    /// One channel between workers with unaligned checkpoints, sender side and receiver side:
    /// the receiver's channel (`cap`) and priority inbox (input `input`), the sending subtask's
    /// local queue (`queue` messages) and barriers, and the forwarding thread.
    struct Unaligned {
        rx: crossbeam_channel::Receiver<Message>,
        inbox: crossbeam_channel::Receiver<Priority>,
        queue: crossbeam_channel::Sender<Message>,
        barrier: crossbeam_channel::Sender<Priority>,
        forwarding: std::thread::JoinHandle<()>,
        _ends: (Inbound, Outbound),
    }

    fn unaligned(cap: usize, queue: usize, input: usize) -> Unaligned {
        use crate::runtime::net::forward::Forward;
        let inbound = Inbound::bind("127.0.0.1:0".parse().unwrap(), "secret", None).unwrap();
        let key = ChannelKey { attempt: 1, channel: 0 };
        let (tx, rx) = crossbeam_channel::bounded(cap);
        let (inbox_tx, inbox) = crossbeam_channel::unbounded();
        inbound.expect(key, tx, Arc::default(), None, Some((inbox_tx, input)));
        let out = Outbound::connect(inbound.addr(), "secret", None).unwrap();
        let (queue, local) = crossbeam_channel::bounded(queue);
        let (barrier, barriers) = crossbeam_channel::unbounded();
        let forward = Forward {
            rx: local,
            data: out.open(key, cap).unwrap(),
            barriers: Some((barriers, out.open_barriers(key).unwrap())),
            budget: None,
            cancel: Arc::default(),
        };
        let forwarding = std::thread::spawn(move || forward.run());
        Unaligned { rx, inbox, queue, barrier, forwarding, _ends: (inbound, out) }
    }

    /// Unaligned checkpoints between workers: a barrier overtakes a channel whose receiver
    /// reads nothing — what is queued at the sender, on the network and at the receiver —
    /// carrying those messages in order ahead of what it carried; the receiver's channel keeps
    /// what it held before the barrier, then what was sent after it.
    #[test]
    fn cluster_net_a_barrier_overtakes_a_stalled_channel_carrying_what_was_queued_in_order() {
        use crate::ids::CheckpointId;
        let Unaligned { rx, inbox, queue, barrier, forwarding: thread, _ends } = unaligned(2, 64, 5);
        // 40 batches of 10 KiB: more than the receiver's channel, the stream's window and the
        // sender's queues hold together, so they are spread over all of them.
        for i in 0..40 {
            queue.send(batch(i)).unwrap();
        }
        let started = std::time::Instant::now() - Duration::from_millis(700);
        barrier
            .send(Priority { input: 0, id: CheckpointId(3), sent: 40, carried: vec![batch(1000)], started })
            .unwrap();
        for i in 40..45 {
            queue.send(batch(i)).unwrap();
        }
        let p = inbox.recv_timeout(Duration::from_secs(30)).expect("the barrier overtook the stalled channel");
        assert_eq!((p.input, p.id), (5, CheckpointId(3)), "the receiving worker sets the input");
        assert!(p.started.elapsed() >= Duration::from_millis(700), "the trigger's time travels along");
        assert!(p.sent <= 2, "only what is in the receiver's channel stays before the barrier: {}", p.sent);
        let carried: Vec<i64> = p.carried.iter().map(ts).collect();
        let want: Vec<i64> = (p.sent as i64..40).chain([1000]).collect();
        assert_eq!(carried, want, "carried: the rest before the barrier, in order, then what it carried");
        let got: Vec<i64> = (0..p.sent + 5).map(|_| ts(&rx.recv_timeout(Duration::from_secs(30)).unwrap())).collect();
        let want: Vec<i64> = (0..p.sent as i64).chain(40..45).collect();
        assert_eq!(got, want, "the channel: what it held before the barrier, then what came after it");
        drop(queue);
        thread.join().unwrap();
    }

    /// Many barriers while a slow receiver keeps every queue full, as the receiving input
    /// reads (its inbox before each message; a message taken just as a barrier came goes after
    /// what the barrier carried): every message once, in order, each barrier's own carried
    /// message right after the messages put before it — the channel as in one process.
    #[test]
    fn cluster_net_barriers_between_workers_keep_every_channel_position_as_in_one_process() {
        use crate::ids::CheckpointId;
        let Unaligned { rx, inbox, queue, barrier, forwarding, _ends } = unaligned(4, 16, 0);
        let (n, every) = (600u64, 50u64);
        let sender = std::thread::spawn(move || {
            for i in 0..n {
                queue.send(batch(i)).unwrap();
                if (i + 1) % every == 0 {
                    let carried = vec![Message::Watermark(-((i + 1) as i64))];
                    let p = Priority {
                        input: 0,
                        id: CheckpointId(i + 1),
                        sent: i + 1,
                        carried,
                        started: std::time::Instant::now(),
                    };
                    barrier.send(p).unwrap();
                }
            }
            queue.send(Message::EndOfStream).unwrap();
        });
        let mut want = Vec::new();
        for i in 0..n as i64 {
            want.push(i);
            if (i + 1) % every as i64 == 0 {
                want.push(-(i + 1));
            }
        }
        let key_of = |m: &Message| match m {
            Message::Data(_) => ts(m),
            Message::Watermark(w) => *w,
            other => panic!("{other:?}"),
        };
        let (mut got, mut received, mut barriers_seen, mut overtook) = (Vec::new(), 0u64, 0, 0);
        loop {
            let m = rx.recv_timeout(Duration::from_secs(30)).expect("the channel goes on");
            std::thread::sleep(Duration::from_micros(500)); // a slow receiver: queues stay full
            received += 1;
            let mut beyond = Some(m);
            while let Ok(p) = inbox.try_recv() {
                barriers_seen += 1;
                // Taken off before the barrier was seen: at most the one just taken is beyond.
                assert!(received <= p.sent + 1, "{received} taken, the barrier at {}", p.sent);
                let racing = if received > p.sent { beyond.take() } else { None };
                if let Some(m) = beyond.take() {
                    got.push(key_of(&m));
                }
                while received < p.sent {
                    let m = rx.try_recv().expect("every message before a barrier's position is in the channel");
                    got.push(key_of(&m));
                    received += 1;
                }
                overtook += (p.carried.len() > 1) as u32;
                got.extend(p.carried.iter().map(key_of));
                beyond = racing;
            }
            match beyond {
                Some(Message::EndOfStream) => break,
                Some(m) => got.push(key_of(&m)),
                None => {}
            }
        }
        sender.join().unwrap();
        forwarding.join().unwrap();
        assert_eq!(barriers_seen, n / every);
        assert!(overtook > 0, "no barrier overtook anything: the test exercised nothing");
        assert_eq!(got, want);
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
        inbound.expect(old, tx.clone(), Arc::default(), None, None);
        let e = Outbound::connect(inbound.addr(), "guess", None).unwrap().open(old, 1).err().unwrap().to_string();
        assert!(e.contains("wrong cluster secret") && e.contains("channel 5"), "{e}");
        inbound.fence(2);
        let e = Outbound::connect(inbound.addr(), "secret", None).unwrap().open(old, 1).err().unwrap().to_string();
        assert!(e.contains("attempt 1") && e.contains("fenced"), "{e}");
        let new = ChannelKey { attempt: 2, channel: 5 };
        inbound.expect(new, tx, Arc::default(), None, None);
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
        inbound.expect(key, tx, Arc::default(), None, None);
        let s = Outbound::connect(inbound.addr(), "secret", None).unwrap().open(key, 1).unwrap();
        s.send(Message::Watermark(1)).unwrap();
        drop(s);
        assert!(matches!(rx.recv().unwrap(), Message::Watermark(1)));
        assert!(rx.recv().is_err(), "the receiver must see the sender gone");
    }
}
