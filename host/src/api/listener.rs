//! The API's front door: HTTP/1.1 served by hyper on a small tokio runtime of its own, in
//! front of the blocking route handlers of [`crate::api::server`].
//!
//! hyper parses every request (request smuggling, malformed or oversized heads and bodies are
//! its job, and it answers them with 400/431). This file adds what a shared server needs on top,
//! each bound chosen so that no client, authenticated or not, can hold what others need:
//!
//! - the **head** of a request must arrive within [`FrontDoor::header_timeout`] of the connection
//!   opening, however slowly it trickles (hyper's header read timeout, a deadline, not an idle
//!   timer); the **body** within [`FrontDoor::body_deadline`]; a whole connection lives at most
//!   [`FrontDoor::connection_deadline`];
//! - **connections** are capped per peer address ([`FrontDoor::max_connections_per_ip`]) and in
//!   all ([`FrontDoor::max_connections`]); a connection over a cap gets a 503 at once and costs a
//!   task for the microseconds it takes to write it;
//! - the **token** is checked from the head before any body byte is read, and the body is read
//!   through a length limit ([`FrontDoor::max_body`]), so an unauthenticated peer makes the
//!   server neither allocate nor wait;
//! - **requests in flight** are capped per tenant (its `max_requests` quota), and a handler runs
//!   on the runtime's blocking pool: a slow savepoint or compile of one tenant holds a thread of
//!   that tenant's, never the accept loop, and a handler that panics answers 500 and takes
//!   nothing else down;
//! - the **dashboard's files** (`dashboard.rs`) are answered before authentication: they are
//!   static, hold no data, and cost no handler or tenant slot;
//! - with **TLS** (`tls.rs`), the handshake must finish within [`FrontDoor::header_timeout`]
//!   too, and the head's deadline starts after it (a head by twice that at worst); a
//!   connection over a cap is closed without an answer (a plain-text 503 means nothing to a TLS
//!   client).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Notify;

use crate::api::dashboard::{self, Asset};
use crate::api::http::{Request, Response};

/// The bounds of the front door (defaults in [`FrontDoor::default`]; `weir serve` takes them
/// from `server.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontDoor {
    /// The request line and headers must have arrived by then, counted from the connection's
    /// first byte.
    pub header_timeout: Duration,
    /// The body must have arrived by then, counted from the end of the head.
    pub body_deadline: Duration,
    /// A connection is closed this long after it opened, whatever it is doing.
    pub connection_deadline: Duration,
    /// Largest body (a component upload).
    pub max_body: usize,
    /// Connections open at once, in all.
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    pub max_connections_per_ip: usize,
}

impl Default for FrontDoor {
    fn default() -> Self {
        FrontDoor {
            header_timeout: Duration::from_secs(10),
            body_deadline: Duration::from_secs(60),
            connection_deadline: Duration::from_secs(300),
            max_body: crate::api::http::MAX_BODY,
            max_connections: 1024,
            max_connections_per_ip: 64,
        }
    }
}

/// Who a token belongs to, as far as the front door needs to know.
pub struct Caller {
    /// The tenant's name.
    pub tenant: String,
    /// Requests it may have in flight at once.
    pub max_requests: u32,
}

/// What the front door serves.
pub trait Routes: Send + Sync + 'static {
    /// The caller a bearer token authenticates, if any.
    fn caller(&self, token: Option<&str>) -> Option<Caller>;
    /// Answers an authenticated request (may block: it runs on the blocking pool).
    fn handle(&self, req: &Request) -> Response;
}

/// A running front door; dropping it stops accepting, then lets requests in flight write
/// their answers (e.g. the reply to the `stop` that ended the job) for up to 5 s.
pub struct Listening {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Arc<Notify>,
    open: Arc<AtomicUsize>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.stop.notify_one();
        let t0 = std::time::Instant::now();
        while self.open.load(Ordering::Acquire) > 0 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Counts held per key (peer address or tenant); a slot is given back when dropped.
struct Slots<K: std::hash::Hash + Eq + Clone> {
    held: Mutex<HashMap<K, usize>>,
}

impl<K: std::hash::Hash + Eq + Clone> Default for Slots<K> {
    fn default() -> Self {
        Slots { held: Mutex::new(HashMap::new()) }
    }
}

struct Slot<K: std::hash::Hash + Eq + Clone> {
    slots: Arc<Slots<K>>,
    key: K,
}

impl<K: std::hash::Hash + Eq + Clone> Slots<K> {
    fn take(self: &Arc<Self>, key: &K, max: usize) -> Option<Slot<K>> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(key.clone()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot { slots: self.clone(), key: key.clone() })
    }
}

impl<K: std::hash::Hash + Eq + Clone> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

struct Shared<R> {
    routes: Arc<R>,
    door: FrontDoor,
    per_tenant: Arc<Slots<String>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Listens on `addr` (port 0: any free port) until the returned value is dropped; with `tls`,
/// every connection is TLS.
pub fn listen<R: Routes>(
    routes: Arc<R>,
    addr: &str,
    door: FrontDoor,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<Listening> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let local = std_listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(512)
        .thread_name("api")
        .enable_all()
        .build()?;
    let stop = Arc::new(Notify::new());
    let open = Arc::new(AtomicUsize::new(0));
    let (stop2, open2) = (stop.clone(), open.clone());
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let shared = Arc::new(Shared { routes, door, per_tenant: Arc::default(), tls });
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(std_listener)?
    };
    std::thread::Builder::new().name("api".into()).spawn(move || {
        rt.block_on(accept_loop(listener, shared, stop2, open2));
        // Handlers still blocked (a savepoint waiting for its job) are not waited for.
        rt.shutdown_timeout(Duration::from_millis(100));
    })?;
    Ok(Listening { addr: local, stop, open })
}

async fn accept_loop<R: Routes>(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared<R>>,
    stop: Arc<Notify>,
    open: Arc<AtomicUsize>,
) {
    let per_ip: Arc<Slots<IpAddr>> = Arc::default();
    loop {
        let accepted = tokio::select! {
            _ = stop.notified() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(_) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let door = shared.door;
        let slot = if open.load(Ordering::Acquire) >= door.max_connections {
            None
        } else {
            per_ip.take(&peer.ip(), door.max_connections_per_ip)
        };
        let Some(slot) = slot else {
            if shared.tls.is_none() {
                refuse(stream, door, peer);
            }
            continue;
        };
        open.fetch_add(1, Ordering::AcqRel);
        let (shared, open) = (shared.clone(), open.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match shared.tls.clone() {
                None => serve_connection(stream, shared).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(door.header_timeout, acceptor.accept(stream)).await;
                    if let Ok(Ok(tls)) = handshake {
                        serve_connection(tls, shared).await;
                    }
                }
            }
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
    // Stopped: wait (bounded by the caller) for connections in flight to finish.
    while open.load(Ordering::Acquire) > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A connection over a cap: a 503 if the socket takes it at once, then closed.
fn refuse(stream: tokio::net::TcpStream, door: FrontDoor, peer: SocketAddr) {
    let body = format!(
        "{{\"error\":\"too many connections (at most {} from {} and {} in all); retry later\"}}",
        door.max_connections_per_ip,
        peer.ip(),
        door.max_connections
    );
    let msg = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(msg.as_bytes());
}

async fn serve_connection<R, S>(stream: S, shared: Arc<Shared<R>>)
where
    R: Routes,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let door = shared.door;
    let svc = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(answer(&shared, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(door.header_timeout)
        .keep_alive(false)
        .max_buf_size(crate::api::http::MAX_HEAD.max(8192))
        .serve_connection(TokioIo::new(stream), svc);
    let _ = tokio::time::timeout(door.connection_deadline, conn).await;
}

/// Authenticates, reads the body within its bounds, and runs the route on the blocking pool.
async fn answer<R: Routes>(shared: &Arc<Shared<R>>, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
    let door = shared.door;
    if matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD)
        && let Some(a) = dashboard::asset(req.uri().path())
    {
        return asset_reply(a);
    }
    let token = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let Some(caller) = shared.routes.caller(token.as_deref()) else {
        return reply(Response::error(401, "missing or wrong bearer token"));
    };
    let Some(slot) = shared.per_tenant.take(&caller.tenant, caller.max_requests as usize) else {
        return reply(Response::error(
            429,
            format!(
                "tenant `{}` already has {} requests in flight, its quota (max_requests); retry when one is answered",
                caller.tenant, caller.max_requests
            ),
        ));
    };
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > door.max_body as u64) {
        return reply(too_large(door));
    }
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let body =
        match tokio::time::timeout(door.body_deadline, Limited::new(req.into_body(), door.max_body).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return reply(too_large(door)),
            Ok(Err(e)) => return reply(Response::error(400, format!("reading the body: {e}"))),
            Err(_) => {
                return reply(Response::error(
                    408,
                    format!("the body did not arrive within {} s", door.body_deadline.as_secs()),
                ));
            }
        };
    let request = Request { method, path, query, token, body: body.to_vec() };
    let routes = shared.routes.clone();
    // The slot goes with the handler: a client that hangs up does not free it early.
    let run = move || {
        let _slot = slot;
        routes.handle(&request)
    };
    let resp = tokio::task::spawn_blocking(run).await.unwrap_or_else(|_| {
        Response::error(500, "internal error while answering this request (reported in the server's log); retry")
    });
    reply(resp)
}

/// One of the dashboard's files, with the headers that keep it to its own script.
fn asset_reply(a: Asset) -> hyper::Response<Full<Bytes>> {
    use hyper::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, HeaderValue, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS};
    let mut resp = hyper::Response::new(Full::new(Bytes::from_static(a.body)));
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(a.content_type));
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(dashboard::CONTENT_SECURITY_POLICY));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

fn too_large(door: FrontDoor) -> Response {
    Response::error(413, format!("the body exceeds {} bytes", door.max_body))
}

fn reply(r: Response) -> hyper::Response<Full<Bytes>> {
    let mut resp = hyper::Response::new(Full::new(Bytes::from(r.body)));
    *resp.status_mut() = hyper::StatusCode::from_u16(r.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(r.content_type));
    resp.headers_mut()
        .insert(hyper::header::X_CONTENT_TYPE_OPTIONS, hyper::header::HeaderValue::from_static("nosniff"));
    resp
}

/// `key=value` pairs, left undecoded (the routes decode the values they use).
fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|q| !q.is_empty())
        .map(|q| q.split_once('=').map_or((q.to_string(), String::new()), |(k, v)| (k.into(), v.into())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_per_key_and_given_back() {
        let s: Arc<Slots<u8>> = Arc::default();
        let a = s.take(&1, 2).unwrap();
        let _b = s.take(&1, 2).unwrap();
        assert!(s.take(&1, 2).is_none(), "third slot of key 1");
        assert!(s.take(&2, 2).is_some(), "another key has its own slots");
        drop(a);
        assert!(s.take(&1, 2).is_some(), "a dropped slot is given back");
    }

    #[test]
    fn queries_split_into_undecoded_pairs() {
        assert_eq!(
            parse_query("name=a%20b&flag&&x="),
            vec![("name".into(), "a%20b".into()), ("flag".into(), String::new()), ("x".into(), String::new())]
        );
    }
}
