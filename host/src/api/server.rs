//! The routes of the control API, over the jobs this process runs.
//!
//! ```text
//! GET  /v1/jobs                                   every job's status
//! GET  /v1/jobs/{job}                             one job's status
//! GET  /v1/jobs/{job}/checkpoints                 its completed checkpoints' metrics
//! POST /v1/jobs/{job}/savepoints   {"dir": D}     take a savepoint (D optional)
//! POST /v1/jobs/{job}/stop         {"dir": D}     savepoint, commit, stop
//! POST /v1/jobs/{job}/cancel                      cancel (nothing more is committed)
//! POST /v1/jobs/{job}/operators/{uid}/upgrade     body: the new component's bytes
//! ```
//!
//! Every request needs `Authorization: Bearer <token>`. Invariant: a request never blocks
//! the others (one thread per connection) and every failure is a JSON `{"error": ...}`
//! naming the job, operator or file concerned.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use wasmtime::Engine;

use crate::api::http::{self, Response};
use crate::operator::OperatorFactory;
use crate::runtime::handle::JobHandle;
use crate::sandbox::instance::LoadedComponent;

/// How long a savepoint, stop or upgrade may take before the API answers with a timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A job the API serves.
#[derive(Clone)]
pub struct ServedJob {
    /// Its handle.
    pub handle: JobHandle,
    /// `<checkpoint dir>/<job>` (for the checkpoint history), if it checkpoints.
    pub checkpoint_root: Option<PathBuf>,
}

/// The shared state of the API.
pub struct Api {
    token: String,
    engine: Engine,
    jobs: Mutex<BTreeMap<String, ServedJob>>,
}

/// A running API server.
pub struct ApiServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The API.
    pub api: Arc<Api>,
    stop: Arc<AtomicBool>,
    inflight: Arc<AtomicUsize>,
}

impl Drop for ApiServer {
    /// Stops accepting, then lets requests in flight write their answers (e.g. the reply to
    /// the `stop` that ended the job), for up to 5 s.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = std::net::TcpStream::connect(self.addr);
        let t0 = std::time::Instant::now();
        while self.inflight.load(Ordering::Acquire) > 0 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[derive(Deserialize, Default)]
struct SavepointBody {
    dir: Option<PathBuf>,
}

impl Api {
    /// An API guarded by `token`; uploaded components compile with `engine`.
    pub fn new(token: String, engine: Engine) -> Arc<Api> {
        Arc::new(Api { token, engine, jobs: Mutex::new(BTreeMap::new()) })
    }

    /// Serves `job` under `id`.
    pub fn add_job(&self, id: &str, job: ServedJob) {
        self.jobs.lock().unwrap().insert(id.to_string(), job);
    }

    /// Listens on `addr` (port 0: any free port) until the returned server is dropped.
    pub fn serve(self: &Arc<Self>, addr: &str) -> std::io::Result<ApiServer> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let inflight = Arc::new(AtomicUsize::new(0));
        let (api, stop2, inflight2) = (self.clone(), stop.clone(), inflight.clone());
        std::thread::Builder::new().name("api".into()).spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut s) = conn else { continue };
                let (api, inflight) = (api.clone(), inflight2.clone());
                inflight.fetch_add(1, Ordering::AcqRel);
                let spawned = std::thread::Builder::new().name("api-request".into()).spawn(move || {
                    let resp = match http::read_request(&mut s) {
                        Ok(req) => api.handle(&req),
                        Err(resp) => resp,
                    };
                    http::write_response(&mut s, &resp);
                    inflight.fetch_sub(1, Ordering::AcqRel);
                });
                if spawned.is_err() {
                    inflight2.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
        Ok(ApiServer { addr: local, api: self.clone(), stop, inflight })
    }

    fn job(&self, id: &str) -> Result<ServedJob, Response> {
        self.jobs.lock().unwrap().get(id).cloned().ok_or_else(|| Response::error(404, format!("no job `{id}` here")))
    }

    /// Answers one request.
    pub fn handle(&self, req: &http::Request) -> Response {
        if req.token.as_deref() != Some(self.token.as_str()) {
            return Response::error(401, "missing or wrong bearer token");
        }
        let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
        let r = match (req.method.as_str(), parts.as_slice()) {
            ("GET", ["v1", "jobs"]) => {
                let jobs: Vec<_> = self.jobs.lock().unwrap().values().map(|j| j.handle.status()).collect();
                Ok(Response::ok(&jobs))
            }
            ("GET", ["v1", "jobs", id]) => self.job(id).map(|j| Response::ok(&j.handle.status())),
            ("GET", ["v1", "jobs", id, "checkpoints"]) => self.job(id).map(|j| {
                let history = j
                    .checkpoint_root
                    .and_then(|r| std::fs::read(r.join("history.json")).ok())
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .unwrap_or(serde_json::json!([]));
                Response::ok(&history)
            }),
            ("POST", ["v1", "jobs", id, op @ ("savepoints" | "stop")]) => self.job(id).and_then(|j| {
                let body: SavepointBody = if req.body.is_empty() {
                    SavepointBody::default()
                } else {
                    serde_json::from_slice(&req.body)
                        .map_err(|e| Response::error(400, format!("bad JSON body: {e}")))?
                };
                let stop = *op == "stop";
                j.handle
                    .savepoint(body.dir, stop, REQUEST_TIMEOUT)
                    .map(|info| Response::ok(&info))
                    .map_err(|e| Response::error(409, format!("job `{id}`: {e}")))
            }),
            ("POST", ["v1", "jobs", id, "cancel"]) => self.job(id).map(|j| {
                j.handle.cancel();
                Response::ok(&serde_json::json!({ "cancelled": id }))
            }),
            ("POST", ["v1", "jobs", id, "operators", uid, "upgrade"]) => self.job(id).and_then(|j| {
                let name = req.param("name").map(http::decode).unwrap_or_else(|| "uploaded component".into());
                let lc = LoadedComponent::from_bytes(&self.engine, uid, Path::new(&name), &req.body)
                    .map_err(|e| Response::error(400, e.to_string()))?;
                j.handle
                    .upgrade(uid, OperatorFactory::Wasm(Arc::new(lc)), REQUEST_TIMEOUT)
                    .map(|info| Response::ok(&info))
                    .map_err(|e| Response::error(409, format!("job `{id}`: {e}")))
            }),
            (_, ["v1", ..]) => Err(Response::error(404, format!("no route {} {}", req.method, req.path))),
            _ => Err(Response::error(404, format!("no route {} {} (the API lives under /v1)", req.method, req.path))),
        };
        r.unwrap_or_else(|e| e)
    }
}
