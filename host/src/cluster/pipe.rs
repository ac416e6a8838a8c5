//! A control connection between a worker and the coordinator: one HTTP/2 request whose body
//! carries the worker's messages and whose response body carries the coordinator's, both as
//! [`protocol`](super::protocol) frames. HTTP/2 (the `h2` crate, as for the data plane) gives
//! the cluster secret a header and flow control per direction.
//!
//! Invariants: a connection is served only with the cluster secret (compared in constant
//! time); the messages of one connection arrive in order, after its `Opened` and before its
//! `Closed`, which always comes (a peer that goes away, a malformed frame, or [`PipeTx::close`]).

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use crossbeam_channel::Sender;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::cluster::protocol::{Decoder, WireError, encode};
use crate::io_runtime::io_runtime;
use crate::runtime::net::link::{same_secret, send_all};
use crate::runtime::net::tls::{self, ClusterTls, Stream};

/// Window of each direction: messages are small but for components.
const WINDOW: u32 = 4 << 20;

/// What the listener reports about a connection (by its number).
pub enum Incoming<In, Out> {
    /// A peer connected with the secret; send to it through this.
    Opened(PipeTx<Out>),
    /// A message from it.
    Message(In),
    /// It went away (or sent something malformed: logged).
    Closed,
}

enum Outgoing {
    Frame(Bytes),
    Close,
}

/// The sending half of a connection (cheap to clone).
pub struct PipeTx<T> {
    tx: mpsc::UnboundedSender<Outgoing>,
    _m: PhantomData<fn(T)>,
}

impl<T> Clone for PipeTx<T> {
    fn clone(&self) -> Self {
        PipeTx { tx: self.tx.clone(), _m: PhantomData }
    }
}

/// The connection is gone.
#[derive(Debug, thiserror::Error)]
#[error("the connection is closed")]
pub struct Closed;

impl<T: Serialize> PipeTx<T> {
    /// Queues `m` (never blocks).
    pub fn send(&self, m: &T) -> Result<(), Closed> {
        let mut b = Vec::new();
        if let Err(e) = encode(m, &mut b) {
            tracing::error!("cannot send a control message: {e}");
            return Err(Closed);
        }
        self.tx.send(Outgoing::Frame(Bytes::from(b))).map_err(|_| Closed)
    }

    /// Ends the connection after what is queued (the peer sees it closed).
    pub fn close(&self) {
        let _ = self.tx.send(Outgoing::Close);
    }
}

fn pipe<T>() -> (PipeTx<T>, mpsc::UnboundedReceiver<Outgoing>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (PipeTx { tx, _m: PhantomData }, rx)
}

/// Listens on `addr`; reports every connection's life to `inbox` under a number of its own.
pub fn listen<In, Out>(
    addr: SocketAddr,
    secret: &str,
    tls: Option<ClusterTls>,
    inbox: Sender<(u64, Incoming<In, Out>)>,
) -> std::io::Result<SocketAddr>
where
    In: DeserializeOwned + Send + 'static,
    Out: Serialize + Send + 'static,
{
    let listener = io_runtime().block_on(TcpListener::bind(addr))?;
    let addr = listener.local_addr()?;
    let secret = Arc::<str>::from(secret);
    let next = Arc::new(AtomicU64::new(1));
    io_runtime().spawn(async move {
        loop {
            // An accept error (out of file descriptors, say) must not close the port for good.
            let sock = match listener.accept().await {
                Ok((sock, _)) => sock,
                Err(e) => {
                    tracing::warn!("accepting a control connection on {addr}: {e}; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let id = next.fetch_add(1, Ordering::Relaxed);
            let (secret, inbox, tls) = (secret.clone(), inbox.clone(), tls.clone());
            tokio::spawn(async move {
                if let Ok(sock) = tls::accept(tls.as_ref(), sock).await {
                    serve(sock, id, secret, inbox).await;
                }
            });
        }
    });
    Ok(addr)
}

async fn serve<In, Out>(sock: Stream, id: u64, secret: Arc<str>, inbox: Sender<(u64, Incoming<In, Out>)>)
where
    In: DeserializeOwned + Send + 'static,
    Out: Serialize + Send + 'static,
{
    let handshake = h2::server::Builder::new()
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .handshake::<_, Bytes>(sock);
    let Ok(Ok(mut conn)) = tokio::time::timeout(CONNECT_TIMEOUT, handshake).await else { return };
    // A peer gets this long to open its stream (an idle connection is not held forever).
    let Ok(Some(Ok((req, mut respond)))) = tokio::time::timeout(CONNECT_TIMEOUT, conn.accept()).await else { return };
    let authorised = req.headers().get("weir-secret").is_some_and(|s| same_secret(s.as_bytes(), secret.as_bytes()));
    let status = if authorised { 200 } else { 403 };
    let response = http::Response::builder().status(status).body(()).expect("a status-only response");
    let Ok(stream) = respond.send_response(response, !authorised) else { return };
    if !authorised {
        // The refusal goes out, then the connection closes.
        conn.graceful_shutdown();
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, async { while conn.accept().await.is_some() {} }).await;
        return;
    }
    {
        let (tx, rx) = pipe::<Out>();
        if inbox.send((id, Incoming::Opened(tx))).is_err() {
            return;
        }
        tokio::spawn(write_frames(stream, rx));
        let inbox = inbox.clone();
        tokio::spawn(async move {
            read_frames(req.into_body(), |m| inbox.send((id, Incoming::Message(m))).is_ok()).await;
            let _ = inbox.send((id, Incoming::Closed));
        });
    }
    // Drive the connection; one stream per connection.
    while let Some(Ok((_, mut respond))) = conn.accept().await {
        let refused = http::Response::builder().status(400).body(()).expect("a status-only response");
        let _ = respond.send_response(refused, true);
    }
}

/// How long connecting to a coordinator may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a connection to the coordinator could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The coordinator answered and refused: retrying will not help.
    #[error("{0}")]
    Refused(String),
    /// Not reachable (not running, not leading, or not answering): worth retrying.
    #[error("{0}")]
    Unreachable(String),
}

/// Connects to the coordinator at `addr`; its messages arrive on the returned receiver, which
/// disconnects when the connection ends.
pub fn connect<In, Out>(
    addr: SocketAddr,
    secret: &str,
    tls: Option<&ClusterTls>,
) -> Result<(PipeTx<Out>, crossbeam_channel::Receiver<In>), ConnectError>
where
    In: DeserializeOwned + Send + 'static,
    Out: Serialize + Send + 'static,
{
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/control"))
        .header("weir-secret", secret)
        .body(())
        .map_err(|e| ConnectError::Refused(e.to_string()))?;
    // A paused coordinator's kernel still accepts the connection: the handshake must not
    // wait for it forever.
    let tls = tls.cloned();
    let handshake = async move {
        let sock = TcpStream::connect(addr)
            .await
            .map_err(|e| ConnectError::Unreachable(format!("cannot connect to {addr}: {e}")))?;
        let sock = tls::connect(tls.as_ref(), sock)
            .await
            .map_err(|e| ConnectError::Unreachable(format!("{addr}: TLS: {e}")))?;
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(WINDOW)
            .initial_connection_window_size(WINDOW)
            .handshake::<_, Bytes>(sock)
            .await
            .map_err(|e| ConnectError::Unreachable(format!("{addr}: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut send = send.ready().await.map_err(|e| ConnectError::Unreachable(format!("{addr}: {e}")))?;
        let (response, stream) =
            send.send_request(request, false).map_err(|e| ConnectError::Unreachable(format!("{addr}: {e}")))?;
        let response = response.await.map_err(|e| ConnectError::Unreachable(format!("{addr}: {e}")))?;
        match response.status().as_u16() {
            200 => Ok((stream, response.into_body())),
            403 => Err(ConnectError::Refused(format!(
                "the coordinator at {addr} refused the cluster secret; give every member the same --secret-file"
            ))),
            s => Err(ConnectError::Unreachable(format!("{addr} answered {s}"))),
        }
    };
    let (send, body) = io_runtime().block_on(async move {
        tokio::time::timeout(CONNECT_TIMEOUT, handshake).await.unwrap_or_else(|_| {
            Err(ConnectError::Unreachable(format!("{addr} did not answer within {} s", CONNECT_TIMEOUT.as_secs())))
        })
    })?;
    let (tx, rx) = pipe::<Out>();
    io_runtime().spawn(write_frames(send, rx));
    let (in_tx, in_rx) = crossbeam_channel::unbounded();
    io_runtime().spawn(async move {
        read_frames(body, |m| in_tx.send(m).is_ok()).await;
    });
    Ok((tx, in_rx))
}

/// Decodes frames from `body` until it ends, fails, or `deliver` refuses one.
async fn read_frames<In: DeserializeOwned>(mut body: h2::RecvStream, mut deliver: impl FnMut(In) -> bool) {
    let mut decoder = Decoder::default();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        let messages: Result<Vec<In>, WireError> = decoder.push(&chunk);
        match messages {
            Ok(ms) => {
                for m in ms {
                    if !deliver(m) {
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!("control connection closed: {e}");
                return;
            }
        }
    }
}

/// Writes queued frames as the window allows; ends the stream when told or when every sender
/// is gone.
async fn write_frames(mut stream: h2::SendStream<Bytes>, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    while let Some(Outgoing::Frame(data)) = rx.recv().await {
        if !send_all(&mut stream, data, false).await {
            return;
        }
    }
    // Ended after what was queued (a reset would discard it: a refusal's reason).
    let _ = stream.send_data(Bytes::new(), true);
}
