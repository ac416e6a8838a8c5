//! The routes of the control API, over the jobs this process runs — one job for `weir run`,
//! many tenants' jobs for `weir serve` (run here, or on a cluster's workers for
//! `weir coordinator --serve`).
//!
//! ```text
//! GET  /v1/jobs                                   the caller's jobs' status
//! GET  /v1/jobs/{job}                             one job's status
//! GET  /v1/jobs/{job}/checkpoints                 its completed checkpoints' metrics
//! GET  /v1/jobs/{job}/checkpoints/{id}            one checkpoint's manifest (per subtask)
//! GET  /metrics (or /v1/metrics)                  the caller's jobs, Prometheus text format
//! POST /v1/jobs/{job}/savepoints   {"dir": D}     take a savepoint (D optional)
//! POST /v1/jobs/{job}/stop         {"dir": D}     savepoint, commit, stop
//! GET  /v1/jobs/{job}/operators/{uid}/state?key=K[&state=S]
//!                                                 a key's current value (runtime/query.rs)
//! POST /v1/jobs/{job}/cancel                      cancel (nothing more is committed)
//! POST /v1/jobs/{job}/operators/{uid}/upgrade     body: the new component's bytes
//! server mode only:
//! POST /v1/components                             body: a component; answers its sha256
//! POST /v1/files?name=REL                         body: a file for the tenant's jobs to read
//! POST /v1/jobs                                   body: a job file; answers the job id
//! ```
//!
//! GET  / and /ui/                                 the web dashboard (`dashboard.rs`; no token:
//!                                                 the page asks for one, then calls the above)
//!
//! Every other request needs `Authorization: Bearer <token>`, which says which tenant calls.
//! Invariants: a request never blocks the others (the front door in `listener.rs` runs each
//! handler on a blocking pool, within per-tenant and per-connection bounds); a tenant only
//! ever sees its own jobs (another tenant's job id answers 404, like no job); every failure
//! is a JSON `{"error": ...}` naming the job, operator, quota or file concerned.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Deserialize;
use wasmtime::Engine;

use crate::api::http::{self, Response};
use crate::api::listener::{self, Caller, FrontDoor, Listening, Routes};
use crate::api::submit::Launcher;
use crate::api::tenants::{ServerConfig, Tenant, confined};
use crate::disk_budget::DiskBudget;
use crate::operator::OperatorFactory;
use crate::runtime::cpu_shares::{CpuGroup, CpuShares};
use crate::runtime::handle::JobHandle;
use crate::sandbox::instance::{LoadedComponent, sha256_hex};

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

#[derive(Clone)]
pub(super) struct Entry {
    pub(super) tenant: String,
    pub(super) job: ServedJob,
    /// Guest memory it may use: `memory_mb` x operator subtasks.
    pub(super) memory_mb: u64,
    /// Subtasks (threads) it runs.
    pub(super) subtasks: u64,
    /// Operator instances it holds.
    pub(super) instances: u64,
}

/// Operator instances one server runs at once (the pooling allocator's slots, minus room
/// for `describe` at upload and a live upgrade's second instance).
pub const SERVER_INSTANCES: u64 = crate::sandbox::engine::POOL_INSTANCES as u64 / 2;

/// The shared state of the API.
pub struct Api {
    pub(super) tenants: Vec<Tenant>,
    pub(super) engine: Engine,
    pub(super) jobs: Mutex<BTreeMap<String, Entry>>,
    /// Server mode: `<data_dir>`, under which each tenant has its directory.
    data_dir: Option<PathBuf>,
    pub(super) next_id: AtomicU64,
    /// Per tenant, held while compiling its uploaded or submitted components: a tenant
    /// compiles one component at a time, in one of the process's compile slots
    /// (`sandbox::compile_cache`), so it never holds up another tenant's compiles.
    compiling: Mutex<BTreeMap<String, Arc<Mutex<()>>>>,
    /// Each tenant's disk budget, shared by its running jobs.
    disk_budgets: Mutex<BTreeMap<String, Arc<DiskBudget>>>,
    /// The front door's bounds.
    door: FrontDoor,
    /// `[tls]`: the API speaks only TLS.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Server mode: the tenants' CPU groups (kept alive for as long as the API).
    cpu: CpuShares,
    /// Each tenant's CPU group, where the host offers them.
    pub(super) cpu_groups: BTreeMap<String, Arc<CpuGroup>>,
    /// Where submitted jobs run, if not in this process (`weir coordinator --serve`).
    pub(super) launcher: OnceLock<Arc<dyn Launcher>>,
}

/// A running API server; dropping it stops accepting, then lets requests in flight write
/// their answers (e.g. the reply to the `stop` that ended the job), for up to 5 s.
pub struct ApiServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The API.
    pub api: Arc<Api>,
    _listening: Listening,
}

#[derive(Deserialize, Default)]
struct SavepointBody {
    dir: Option<PathBuf>,
}

pub(super) type Answer = Result<Response, Response>;

/// The tenants' CPU shares as `config` asks; an error names the setting a host cannot keep (a
/// required cgroup, a tenant's cap without one).
fn cpu_shares(config: &ServerConfig) -> Result<(CpuShares, BTreeMap<String, Arc<CpuGroup>>), String> {
    let weights: Vec<u32> = config.tenant.iter().map(|t| t.cpu_weight).collect();
    let cpu = CpuShares::choose(config.cpu_fairness, &config.cpu_cgroup, &weights)?;
    let mut groups = BTreeMap::new();
    for t in &config.tenant {
        match cpu.group(&t.name, t.cpu_weight, t.max_cpu_cores) {
            Ok(g) => {
                groups.insert(t.name.clone(), Arc::new(g));
                if let Some(x) = cpu.excess(t.cpu_weight, t.max_subtasks).filter(|&x| x > 1.5) {
                    tracing::warn!(
                        tenant = %t.name,
                        "tenant `{}`: with cpu_weight = {} and max_subtasks = {}, thread priorities keep its \
                         threads to no less than {x:.1}× its CPU share when all are busy (nice 19 is the lowest); \
                         raise its cpu_weight, lower its max_subtasks, or give the server a CPU cgroup",
                        t.name,
                        t.cpu_weight,
                        t.max_subtasks
                    );
                }
            }
            Err(e) if t.max_cpu_cores.is_some() => {
                return Err(format!(
                    "tenant `{}`: {e}; remove its max_cpu_cores or give the server a CPU cgroup",
                    t.name
                ));
            }
            Err(e) if cpu.unavailable().is_none() => {
                tracing::warn!(tenant = %t.name, "tenant `{}` gets no CPU share: {e}", t.name);
            }
            Err(_) => {}
        }
    }
    Ok((cpu, groups))
}

impl Api {
    /// The API of one `weir run`: one tenant (`local`) holding `token`; uploaded components
    /// compile with `engine`.
    pub fn new(token: String, engine: Engine) -> Arc<Api> {
        Arc::new(Api {
            tenants: vec![Tenant::local(token)],
            engine,
            jobs: Mutex::new(BTreeMap::new()),
            data_dir: None,
            next_id: AtomicU64::new(1),
            compiling: Mutex::default(),
            disk_budgets: Mutex::default(),
            door: FrontDoor::default(),
            tls: None,
            cpu: CpuShares::off("one job per process"),
            cpu_groups: BTreeMap::new(),
            launcher: OnceLock::new(),
        })
    }

    /// The API of `weir serve`: the tenants of `config`, their jobs on `engine`; over TLS when
    /// `config.tls` says so (a certificate or key that does not load is an error here).
    pub fn hosting(config: &ServerConfig, engine: Engine) -> std::io::Result<Arc<Api>> {
        let tls = match &config.tls {
            Some(files) => Some(files.server_config().map_err(std::io::Error::other)?),
            None => None,
        };
        for t in &config.tenant {
            std::fs::create_dir_all(config.data_dir.join(&t.name).join("components"))?;
            std::fs::create_dir_all(config.data_dir.join(&t.name).join("files"))?;
        }
        let (cpu, cpu_groups) = cpu_shares(config).map_err(std::io::Error::other)?;
        Ok(Arc::new(Api {
            tenants: config.tenant.clone(),
            engine,
            jobs: Mutex::new(BTreeMap::new()),
            data_dir: Some(config.data_dir.clone()),
            next_id: AtomicU64::new(1),
            compiling: Mutex::default(),
            disk_budgets: Mutex::default(),
            door: config.front_door(),
            tls,
            cpu,
            cpu_groups,
            launcher: OnceLock::new(),
        }))
    }

    /// Submitted jobs run through `launcher` from now on, not in this process (set once).
    pub fn launch_with(&self, launcher: Arc<dyn Launcher>) {
        let _ = self.launcher.set(launcher);
    }

    /// Whether the API speaks TLS (`https://`).
    pub fn speaks_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Why tenants do not get CPU shares, if they do not.
    pub fn cpu_shares_unavailable(&self) -> Option<&str> {
        self.cpu.unavailable()
    }

    /// How tenants get their CPU shares, for the server's log.
    pub fn cpu_shares(&self) -> String {
        self.cpu.describe()
    }

    /// Serves `job` under `id` (single-job mode: for the `local` tenant).
    pub fn add_job(&self, id: &str, job: ServedJob) {
        let e = Entry { tenant: self.tenants[0].name.clone(), job, memory_mb: 0, subtasks: 0, instances: 0 };
        self.jobs.lock().unwrap().insert(id.to_string(), e);
    }

    /// Serves `routes` instead of this API on `addr`, through the same front door (bounds,
    /// TLS), until the returned value is dropped.
    pub fn serve_other<R: Routes>(&self, routes: Arc<R>, addr: &str) -> std::io::Result<Listening> {
        listener::listen(routes, addr, self.door, self.tls.clone())
    }

    /// Listens on `addr` (port 0: any free port) until the returned server is dropped.
    pub fn serve(self: &Arc<Self>, addr: &str) -> std::io::Result<ApiServer> {
        let listening = listener::listen(self.clone(), addr, self.door, self.tls.clone())?;
        Ok(ApiServer { addr: listening.addr, api: self.clone(), _listening: listening })
    }

    /// The caller's job `id` — 404 also when it is another tenant's.
    fn job(&self, tenant: &Tenant, id: &str) -> Result<ServedJob, Response> {
        self.jobs
            .lock()
            .unwrap()
            .get(id)
            .filter(|e| e.tenant == tenant.name)
            .map(|e| e.job.clone())
            .ok_or_else(|| Response::error(404, format!("no job `{id}` here")))
    }

    /// Answers one request.
    pub fn handle(&self, req: &http::Request) -> Response {
        let Some(tenant) = self.tenants.iter().find(|t| req.token.as_deref() == Some(t.token.as_str())) else {
            return Response::error(401, "missing or wrong bearer token");
        };
        let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
        let r = match (req.method.as_str(), parts.as_slice()) {
            ("GET", ["metrics"] | ["v1", "metrics"]) => Ok(self.metrics(tenant)),
            ("GET", ["v1", "jobs"]) => {
                let jobs: Vec<_> = self
                    .jobs
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, e)| e.tenant == tenant.name)
                    .map(|(id, e)| {
                        let mut v = serde_json::to_value(e.job.handle.status()).unwrap_or_default();
                        v["id"] = serde_json::Value::String(id.clone());
                        v
                    })
                    .collect();
                Ok(Response::ok(&jobs))
            }
            ("GET", ["v1", "jobs", id]) => self.job(tenant, id).map(|j| Response::ok(&j.handle.status())),
            ("GET", ["v1", "jobs", id, "checkpoints"]) => self.job(tenant, id).map(|j| {
                let history = j
                    .checkpoint_root
                    .and_then(|r| std::fs::read(r.join("history.json")).ok())
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .unwrap_or(serde_json::json!([]));
                Response::ok(&history)
            }),
            ("GET", ["v1", "jobs", id, "checkpoints", cid]) => {
                self.job(tenant, id).and_then(|j| checkpoint_detail(&j, id, cid))
            }
            ("POST", ["v1", "jobs", id, op @ ("savepoints" | "stop")]) => self.job(tenant, id).and_then(|j| {
                let body: SavepointBody = if req.body.is_empty() {
                    SavepointBody::default()
                } else {
                    serde_json::from_slice(&req.body)
                        .map_err(|e| Response::error(400, format!("bad JSON body: {e}")))?
                };
                let dir = match (&self.data_dir, body.dir) {
                    // Server mode: savepoints stay in the tenant's directory.
                    (Some(_), Some(d)) => Some(self.tenant_path(tenant, &d)?),
                    (_, d) => d,
                };
                j.handle
                    .savepoint(dir, *op == "stop", REQUEST_TIMEOUT)
                    .map(|info| Response::ok(&info))
                    .map_err(|e| Response::error(409, format!("job `{id}`: {e}")))
            }),
            ("GET", ["v1", "jobs", id, "operators", uid, "state"]) => {
                self.job(tenant, id).and_then(|j| query_state(&j, id, uid, req))
            }
            ("POST", ["v1", "jobs", id, "cancel"]) => self.job(tenant, id).map(|j| {
                j.handle.cancel();
                Response::ok(&serde_json::json!({ "cancelled": id }))
            }),
            ("POST", ["v1", "jobs", id, "operators", uid, "upgrade"]) => self.job(tenant, id).and_then(|j| {
                let name = req.param("name").map(http::decode).unwrap_or_else(|| "uploaded component".into());
                let lc = {
                    let lock = self.compile_lock(tenant);
                    let _compiling = lock.lock().unwrap_or_else(|p| p.into_inner());
                    self.charged(tenant, || LoadedComponent::from_bytes(&self.engine, uid, Path::new(&name), &req.body))
                        .map_err(|e| Response::error(400, e.to_string()))?
                };
                j.handle
                    .upgrade(uid, OperatorFactory::Wasm(Arc::new(lc)), REQUEST_TIMEOUT)
                    .map(|info| Response::ok(&info))
                    .map_err(|e| Response::error(409, format!("job `{id}`: {e}")))
            }),
            ("POST", ["v1", "components"]) => self.upload_component(tenant, &req.body),
            ("POST", ["v1", "files"]) => self.upload_file(tenant, req),
            ("POST", ["v1", "jobs"]) => self.submit(tenant, req),
            (_, ["v1", ..]) => Err(Response::error(404, format!("no route {} {}", req.method, req.path))),
            _ => Err(Response::error(404, format!("no route {} {} (the API lives under /v1)", req.method, req.path))),
        };
        r.unwrap_or_else(|e| e)
    }

    /// Refuses `adding` bytes that would take the tenant's directory (uploads, outputs,
    /// checkpoints, savepoints) past its `max_disk_mb`.
    pub(super) fn check_disk(&self, tenant: &Tenant, adding: u64) -> Result<(), Response> {
        let used = crate::disk_budget::disk_usage(&self.hosting_dir(tenant)?);
        let quota = tenant.max_disk_mb.saturating_mul(1 << 20);
        if used.saturating_add(adding) > quota {
            return Err(Response::error(
                507,
                format!(
                    "tenant `{}` uses {} MiB of its {} MiB on disk (max_disk_mb), and this adds {} MiB; delete \
                     outputs, checkpoints or uploads first",
                    tenant.name,
                    used >> 20,
                    tenant.max_disk_mb,
                    adding.div_ceil(1 << 20)
                ),
            ));
        }
        Ok(())
    }

    /// `tenant`'s disk budget, shared by its running jobs (made at its first job).
    pub(super) fn disk_budget(&self, tenant: &Tenant) -> Result<Arc<DiskBudget>, Response> {
        let dir = self.hosting_dir(tenant)?;
        let mut budgets = self.disk_budgets.lock().unwrap_or_else(|p| p.into_inner());
        Ok(budgets
            .entry(tenant.name.clone())
            .or_insert_with(|| Arc::new(DiskBudget::new(&tenant.name, &dir, tenant.max_disk_mb)))
            .clone())
    }

    /// Runs `f` (which may compile) with its compilations' CPU charged to `tenant`'s group.
    pub(super) fn charged<R>(&self, tenant: &Tenant, f: impl FnOnce() -> R) -> R {
        let charge = self.cpu_groups.get(&tenant.name).cloned().map(|g| g as crate::sandbox::isolated_compile::Charge);
        crate::sandbox::isolated_compile::charged_to(charge, f)
    }

    pub(super) fn compile_lock(&self, tenant: &Tenant) -> Arc<Mutex<()>> {
        self.compiling.lock().unwrap_or_else(|p| p.into_inner()).entry(tenant.name.clone()).or_default().clone()
    }

    /// The caller's jobs in the Prometheus text format.
    fn metrics(&self, tenant: &Tenant) -> Response {
        let jobs: Vec<(String, ServedJob)> = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, e)| e.tenant == tenant.name)
            .map(|(id, e)| (id.clone(), e.job.clone()))
            .collect();
        let rendered: Vec<crate::api::metrics::JobMetrics<'_>> = jobs
            .iter()
            .map(|(id, j)| crate::api::metrics::JobMetrics {
                tenant: &tenant.name,
                id,
                status: j.handle.status(),
                checkpoints: j
                    .checkpoint_root
                    .as_ref()
                    .and_then(|r| std::fs::read(r.join("history.json")).ok())
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .unwrap_or_default(),
            })
            .collect();
        Response::prometheus(crate::api::metrics::render(&rendered))
    }

    pub(super) fn hosting_dir(&self, tenant: &Tenant) -> Result<PathBuf, Response> {
        self.data_dir
            .as_ref()
            .map(|d| d.join(&tenant.name))
            .ok_or_else(|| Response::error(404, "this API serves one job; submitting needs `weir serve`"))
    }

    /// Server mode: the directory of tenant `name`, if it is one of the server's.
    pub fn tenant_dir(&self, name: &str) -> Option<PathBuf> {
        let t = self.tenants.iter().find(|t| t.name == name)?;
        self.hosting_dir(t).ok()
    }

    /// A path the tenant named, inside its files directory.
    pub(super) fn tenant_path(&self, tenant: &Tenant, rel: &Path) -> Result<PathBuf, Response> {
        let files = self.hosting_dir(tenant)?.join("files");
        let p = files.join(rel);
        if rel.is_absolute() || !confined(&files, &p) {
            return Err(Response::error(
                400,
                format!("{} is outside your directory; use a relative path without `..`", rel.display()),
            ));
        }
        Ok(p)
    }

    fn upload_component(&self, tenant: &Tenant, bytes: &[u8]) -> Answer {
        let dir = self.hosting_dir(tenant)?.join("components");
        let sha = sha256_hex(bytes);
        // Checked now (imports, world, describe), so a bad component is refused at upload.
        self.check_disk(tenant, bytes.len() as u64)?;
        let lc = {
            let lock = self.compile_lock(tenant);
            let _compiling = lock.lock().unwrap_or_else(|p| p.into_inner());
            self.charged(tenant, || {
                LoadedComponent::from_bytes(&self.engine, "uploaded", Path::new("uploaded component"), bytes)
            })
            .map_err(|e| Response::error(400, e.to_string()))?
        };
        crate::checkpoint::storage::write_atomic(&dir.join(format!("{sha}.wasm")), bytes)
            .map_err(|e| Response::error(500, format!("storing the component: {e}")))?;
        Ok(Response::ok(&serde_json::json!({
            "sha256": sha, "component": format!("sha256:{sha}"), "name": lc.info.name, "version": lc.info.version
        })))
    }

    fn upload_file(&self, tenant: &Tenant, req: &http::Request) -> Answer {
        let name = req.param("name").map(http::decode).ok_or_else(|| Response::error(400, "missing ?name="))?;
        let p = self.tenant_path(tenant, Path::new(&name))?;
        self.check_disk(tenant, req.body.len() as u64)?;
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Response::error(500, e.to_string()))?;
        }
        crate::checkpoint::storage::write_atomic(&p, &req.body)
            .map_err(|e| Response::error(500, format!("storing {name}: {e}")))?;
        Ok(Response::ok(&serde_json::json!({ "stored": name, "bytes": req.body.len() })))
    }
}

impl Routes for Api {
    fn caller(&self, token: Option<&str>) -> Option<Caller> {
        let t = self.tenants.iter().find(|t| Some(t.token.as_str()) == token)?;
        Some(Caller { tenant: t.name.clone(), max_requests: t.max_requests })
    }

    fn handle(&self, req: &http::Request) -> Response {
        Api::handle(self, req)
    }
}

/// `GET /v1/jobs/{id}/operators/{uid}/state?key=K[&state=S]`: a key's current value.
fn query_state(j: &ServedJob, id: &str, uid: &str, req: &http::Request) -> Answer {
    let key = req.param("key").map(http::decode).ok_or_else(|| Response::error(400, "name the key: ?key=..."))?;
    let state = req.param("state").map(http::decode);
    let uid = http::decode(uid);
    let a = j.handle.query(&uid, key.as_bytes(), state.as_deref(), REQUEST_TIMEOUT).map_err(|e| {
        let status = if e.contains("has no operator") {
            404
        } else if e.contains("declares no state") || e.contains("not keyed") || e.contains("several keyed") {
            400
        } else {
            409
        };
        Response::error(status, format!("job `{id}`: {e}"))
    })?;
    if !a.found {
        return Err(Response::error(
            404,
            format!(
                "job `{id}`: key `{}` has no value in state `{}` of operator `{}` (subtask {}, key group {})",
                a.key, a.state, a.operator, a.subtask, a.key_group
            ),
        ));
    }
    Ok(Response::ok(&a))
}

/// The manifest of job `id`'s completed checkpoint `cid`: its operators, component versions
/// and per-subtask files, sizes, incremental chains and timings.
fn checkpoint_detail(j: &ServedJob, id: &str, cid: &str) -> Answer {
    let n: u64 = cid.parse().map_err(|_| Response::error(400, format!("`{cid}` is not a checkpoint id (a number)")))?;
    let root = j.checkpoint_root.as_ref().ok_or_else(|| {
        Response::error(404, format!("job `{id}` takes no checkpoints ([checkpoint] in its job file)"))
    })?;
    let manifest = crate::checkpoint::storage::read_manifest(&root.join(format!("chk-{n}"))).map_err(|e| {
        Response::error(404, format!("job `{id}` has no completed checkpoint {n} (retained ones are listed by GET /v1/jobs/{id}/checkpoints): {e}"))
    })?;
    Ok(Response::ok(&manifest))
}

#[cfg(test)]
mod tests {
    /// `docs/api.md` lists exactly the routes `Api::handle` answers: each match arm's method
    /// and path (parameters as `{...}`) must appear in the page's route table, and each row of
    /// the table must be an arm.
    #[test]
    fn the_api_page_lists_every_route_and_only_those() {
        let src = include_str!("server.rs");
        let doc = include_str!("../../../docs/api.md");
        let mut routes = Vec::new();
        for line in src.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("(\"GET\", [").or_else(|| line.strip_prefix("(\"POST\", [")) else {
                continue;
            };
            let method = if line.starts_with("(\"GET\"") { "GET" } else { "POST" };
            let Some(end) = rest.find("])") else { continue };
            for alt in rest[..end].split("] | [") {
                let path: Vec<String> = alt
                    .split(", ")
                    .map(|p| match p.trim() {
                        s if s.starts_with('"') => s.trim_matches('"').to_string(),
                        s if s.contains('@') => {
                            s.split('@').nth(1).unwrap().trim_matches(|c| c == ' ' || c == '(' || c == ')').to_string()
                        }
                        s => format!("{{{s}}}"),
                    })
                    .collect();
                for path in expand(&path) {
                    routes.push((method, path));
                }
            }
        }
        assert!(routes.len() >= 13, "parsed the routes: {routes:?}");
        let rows: Vec<(&str, String)> = doc
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells.len() > 3 && (cells[1] == "GET" || cells[1] == "POST")).then(|| (cells[1], cells[2].to_string()))
            })
            .collect();
        let normal = |p: &str| p.replace("{id}", "{cid}").replace("{job}", "{id}");
        for (m, p) in &routes {
            assert!(
                rows.iter()
                    .any(|(dm, dp)| dm == m && dp.split('`').any(|seg| normal(seg.split('?').next().unwrap()) == *p)),
                "{m} {p} is answered but not in docs/api.md"
            );
        }
        for (m, p) in &rows {
            let first = normal(p.split('`').nth(1).unwrap().split('?').next().unwrap());
            assert!(
                routes.iter().any(|(rm, rp)| rm == m && *rp == first),
                "docs/api.md lists {m} {first}, which is not answered"
            );
        }
    }

    /// `["v1", "jobs", {id}, "savepoints" | "stop"]` as two paths.
    fn expand(parts: &[String]) -> Vec<String> {
        let mut out = vec![String::new()];
        for p in parts {
            let alts: Vec<&str> = p.split(" | ").map(|a| a.trim_matches('"')).collect();
            out = out.iter().flat_map(|o| alts.iter().map(move |a| format!("{o}/{a}"))).collect();
        }
        out
    }
}
