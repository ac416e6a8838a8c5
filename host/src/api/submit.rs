//! `POST /v1/jobs` of `weir serve`: a tenant's job file is checked against the tenant's
//! directory (every path inside it, components only uploaded ones) and quotas, compiled, and
//! started in this process or through a [`Launcher`] (on a cluster's workers, for
//! `weir coordinator --serve`). A launcher may also take back a job another coordinator
//! accepted (`Api::resume`), which passes the same checks again.
//!
//! Invariants: quotas are checked and the job's slot taken under one lock, before anything
//! is compiled; a refused job holds nothing afterwards (its slot is released); errors go
//! back to the tenant without the server's directory layout; a launcher hears of a job
//! (`admit`) only once every check passed, and the tenant hears its id only after that.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::api::http::{self, Response};
use crate::api::server::{Answer, Api, Entry, SERVER_INSTANCES, ServedJob};
use crate::api::tenants::{Tenant, confined};
use crate::graph::logical::{JobGraph, NodeKind, SinkKind, SourceKind};
use crate::job::bind::BoundJob;
pub use crate::job::submission::Submission;
use crate::runtime::error::RunError;
use crate::runtime::executor::{self, RestoreFrom, RunOptions, RunSummary};
use crate::runtime::handle::JobHandle;

/// The largest job file a tenant may submit (a launcher may keep it where values are small:
/// etcd takes at most 1.5 MiB per request).
pub const MAX_JOB_FILE: usize = 1 << 20;

/// Runs submitted jobs elsewhere than in this process (on a cluster's workers).
pub trait Launcher: Send + Sync {
    /// Told of a job that passed every check, before the tenant hears its id (e.g. to store it
    /// so another coordinator can take it over). An error refuses the job (503, retry later).
    fn admit(&self, job: &Submission) -> Result<(), String>;

    /// Told that an admitted job will not run after all (its thread could not start).
    fn abandon(&self, job: &Submission);

    /// Runs `job`, bound as `bound`, its job file at `path` holding `text` (as the tenant's
    /// directory holds it), with the options a job of its tenant runs with. Returns when the
    /// job has ended.
    fn run(
        &self,
        job: &Submission,
        bound: &BoundJob,
        path: &Path,
        text: &str,
        opts: &RunOptions,
    ) -> Result<RunSummary, RunError>;
}

/// Where a job starts from.
enum Origin {
    /// Submitted now: the launcher is told before the tenant hears its id.
    Submitted,
    /// Taken back from a stored submission, from its newest checkpoint if it has one.
    Resumed(Option<PathBuf>),
}

/// What a job needs of its tenant's quotas.
struct Needs {
    memory_mb: u64,
    subtasks: u64,
    instances: u64,
}

impl Needs {
    fn of(graph: &JobGraph) -> Needs {
        let instances: u64 =
            graph.nodes.iter().filter(|n| matches!(n.kind, NodeKind::Operator(_))).map(|n| n.parallelism as u64).sum();
        let subtasks: u64 = graph.nodes.iter().map(|n| n.parallelism as u64).sum();
        Needs { memory_mb: instances * graph.limits.memory_mb, subtasks, instances }
    }
}

impl Api {
    /// `POST /v1/jobs`: checks a submitted job against the tenant's directory and quotas,
    /// then starts it; answers its id.
    pub(super) fn submit(&self, tenant: &Tenant, req: &http::Request) -> Answer {
        if req.body.len() > MAX_JOB_FILE {
            return Err(Response::error(
                413,
                format!(
                    "the job file has {} bytes, more than a job file may have ({MAX_JOB_FILE}); put data in files \
                     (POST /v1/files) and name them in the job",
                    req.body.len()
                ),
            ));
        }
        self.check_disk(tenant, req.body.len() as u64)?;
        let text = std::str::from_utf8(&req.body).map_err(|_| Response::error(400, "the job file is not UTF-8"))?;
        let number = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut job = Submission::new(&tenant.name, &self.hosting_dir(tenant)?, number, text);
        job.restore = req.param("restore").map(http::decode);
        if job.restore.as_ref().is_some_and(|r| r.len() > 4096) {
            return Err(Response::error(400, "?restore= names a path of more than 4096 bytes"));
        }
        job.allow_non_restored_state = req.param("allow_non_restored_state") == Some("true");
        let id = self.start(tenant, job, Origin::Submitted)?;
        Ok(Response::ok(&serde_json::json!({ "id": id })))
    }

    /// Starts a job another coordinator accepted (stored by its launcher), under the same id
    /// and checked as when it was submitted; from `checkpoint`, if it has one, else from what
    /// the submission named. Job numbers handed out later are past its number.
    /// A job that cannot start again is listed to its tenant as failed, naming why.
    pub fn resume(&self, mut job: Submission, checkpoint: Option<PathBuf>) -> Result<(), String> {
        self.next_id.fetch_max(job.number + 1, Ordering::Relaxed);
        let Some(tenant) = self.tenants.iter().find(|t| t.name == job.tenant) else {
            return Err(format!("job `{}`: tenant `{}` is not in the server's configuration", job.id, job.tenant));
        };
        let id = job.id.clone();
        let dir = self.hosting_dir(tenant).map_err(|r| r.body)?;
        let started = match job.load_text(&dir) {
            Ok(()) => self.start(tenant, job, Origin::Resumed(checkpoint)).map(drop).map_err(|r| r.body),
            Err(e) => Err(e),
        };
        started.map_err(|e| {
            // Without the server's directory layout.
            let e = e.replace(&format!("{}/", dir.display()), "");
            let cause = format!("job `{id}` could not be taken over by the coordinator elected next: {e}");
            self.list_failed(tenant, &id, &cause);
            cause
        })
    }

    /// Lists job `id` to `tenant` as failed with `cause` (holding none of its quotas).
    fn list_failed(&self, tenant: &Tenant, id: &str, cause: &str) {
        let name = id.rsplit_once('-').map_or(id, |(name, _)| name);
        let (handle, endpoint) = JobHandle::new(name);
        endpoint.status.lock().unwrap().state = crate::runtime::handle::JobState::Failed { cause: cause.to_string() };
        let job = ServedJob { handle, checkpoint_root: None };
        let e = Entry { tenant: tenant.name.clone(), job, memory_mb: 0, subtasks: 0, instances: 0 };
        self.jobs.lock().unwrap().entry(id.to_string()).or_insert(e);
    }

    /// Hands out job numbers from `next` on (or past every number handed out already).
    pub fn number_jobs_from(&self, next: u64) {
        self.next_id.fetch_max(next, Ordering::Relaxed);
    }

    /// Checks `job` against `tenant`'s directory and quotas, compiles it and starts it; its id.
    fn start(&self, tenant: &Tenant, mut job: Submission, origin: Origin) -> Result<String, Response> {
        let root = self.hosting_dir(tenant)?;
        let files = root.join("files");
        let scrub = |status: u16, m: String| Response::error(status, m.replace(&format!("{}/", files.display()), ""));
        let restore = match (&origin, job.restore.as_deref()) {
            // Recorded by a leader from the job's own checkpoints, and checked again.
            (Origin::Resumed(Some(chk)), _) if confined(&files, chk) => Some(RestoreFrom::Path(chk.clone())),
            (Origin::Resumed(Some(_)), _) => {
                return Err(Response::error(409, "the checkpoint recorded for it is outside its directory"));
            }
            (_, None) => None,
            (_, Some("latest")) => Some(RestoreFrom::Latest),
            // A savepoint directory in the tenant's files.
            (_, Some(r)) => Some(RestoreFrom::Path(self.tenant_path(tenant, Path::new(r))?)),
        };
        // Paths are checked as written, before anything looks at the filesystem.
        let text = preprocess(&job.text, &root.join("components")).map_err(|e| Response::error(400, e))?;
        // Relative paths in the job resolve against the tenant's files directory.
        let path = files.join(format!(".job-{}.toml", job.number));
        std::fs::write(&path, &text).map_err(|e| Response::error(500, e.to_string()))?;
        let mut graph = crate::job::parse(&path, &text).map_err(|e| scrub(400, e.to_string()))?;
        confine(&mut graph, &root).map_err(|e| scrub(400, format!("job `{}`: {e}", graph.name)))?;
        let id = format!("{}-{}", graph.name, job.number);
        if !job.id.is_empty() && job.id != id {
            return Err(Response::error(409, format!("job `{}`: its job file now names job `{id}`", job.id)));
        }
        job.id = id.clone();
        let (handle, endpoint) = JobHandle::new(&graph.name);
        self.take_slot(tenant, &graph, &id, handle)?;
        let release = |r: Response| {
            self.jobs.lock().unwrap().remove(&id);
            r
        };
        let bound = {
            // One compile at a time per tenant (cached by digest: an uploaded component is
            // not compiled again here).
            let lock = self.compile_lock(tenant);
            let _compiling = lock.lock().unwrap_or_else(|p| p.into_inner());
            self.charged(tenant, || crate::job::bind::bind(&self.engine, graph.clone()))
                .map_err(|e| release(scrub(400, e.to_string())))?
        };
        let opts = RunOptions {
            quiet_guests: true,
            restore,
            allow_non_restored_state: job.allow_non_restored_state,
            cpu_group: self.cpu_groups.get(&tenant.name).cloned(),
            disk_budget: Some(self.disk_budget(tenant).map_err(release)?),
            // Disk-backed operators' stores live in the tenant's directory, charged to its
            // quota like its sinks' output.
            state_dir: Some(self.hosting_dir(tenant).map_err(release)?),
            endpoint: Some(endpoint),
            ..Default::default()
        };
        // Refused before it starts: a savepoint its components cannot take over, and so on.
        executor::preflight(&bound, &opts).map_err(|e| release(scrub(409, e.to_string())))?;
        let launcher = self.launcher.get().cloned();
        if let (Some(l), Origin::Submitted) = (&launcher, &origin) {
            l.admit(&job)
                .map_err(|e| release(Response::error(503, format!("job `{id}` not started: {e}; retry later"))))?;
        }
        let abandon = launcher.clone().map(|l| (l, job.clone()));
        std::thread::Builder::new()
            .name(format!("job-{id}"))
            .spawn(move || {
                let ran = match launcher {
                    Some(l) => l.run(&job, &bound, &path, &text, &opts),
                    None => executor::run(&bound, &opts),
                };
                if let Err(e) = ran {
                    tracing::error!(job = %job.id, "{e}");
                }
            })
            .map_err(|e| {
                if let Some((l, job)) = &abandon {
                    l.abandon(job);
                }
                release(Response::error(500, format!("cannot start job: {e}")))
            })?;
        Ok(id)
    }

    /// Checks the tenant's quotas and the server's instances for `graph`, and takes its slot
    /// under `id` in one step (under the jobs' lock).
    fn take_slot(&self, tenant: &Tenant, graph: &JobGraph, id: &str, handle: JobHandle) -> Result<(), Response> {
        let bad = |m: String| Response::error(409, format!("job `{}` refused: {m}", graph.name));
        if let Some(n) = graph.nodes.iter().find(|n| n.parallelism > tenant.max_parallelism) {
            return Err(bad(format!(
                "node `{}` has parallelism {}, above tenant `{}`'s quota of {} (max_parallelism)",
                n.id, n.parallelism, tenant.name, tenant.max_parallelism
            )));
        }
        let Needs { memory_mb, subtasks, instances } = Needs::of(graph);
        let mut jobs = self.jobs.lock().unwrap();
        let live = |e: &&Entry| !e.job.handle.status().state.is_terminal();
        let running: Vec<&Entry> = jobs.values().filter(live).filter(|e| e.tenant == tenant.name).collect();
        if running.len() as u32 >= tenant.max_jobs {
            return Err(bad(format!(
                "tenant `{}` already runs {} job(s), its quota (max_jobs)",
                tenant.name, tenant.max_jobs
            )));
        }
        if running.iter().any(|e| e.job.handle.status().name == graph.name) {
            return Err(bad(format!("a job named `{}` is already running; stop it or rename this one", graph.name)));
        }
        let used: u64 = running.iter().map(|e| e.memory_mb).sum();
        if used + memory_mb > tenant.max_memory_mb {
            return Err(bad(format!(
                "it needs {memory_mb} MiB of guest memory ({instances} operator subtasks x memory_mb = {}), and \
                 tenant `{}` has {} of {} MiB left (max_memory_mb)",
                graph.limits.memory_mb,
                tenant.name,
                tenant.max_memory_mb.saturating_sub(used),
                tenant.max_memory_mb
            )));
        }
        let used_subtasks: u64 = running.iter().map(|e| e.subtasks).sum();
        if used_subtasks + subtasks > tenant.max_subtasks as u64 {
            return Err(bad(format!(
                "it runs {subtasks} subtasks (threads), and tenant `{}` has {} of {} left (max_subtasks)",
                tenant.name,
                (tenant.max_subtasks as u64).saturating_sub(used_subtasks),
                tenant.max_subtasks
            )));
        }
        let all_instances: u64 = jobs.values().filter(live).map(|e| e.instances).sum();
        if all_instances + instances > SERVER_INSTANCES {
            return Err(Response::error(
                503,
                format!("the server runs {all_instances} operator instances of {SERVER_INSTANCES}; retry later"),
            ));
        }
        let checkpoint_root = graph.checkpoint.as_ref().map(|c| c.dir.join(&graph.name));
        let job = ServedJob { handle, checkpoint_root };
        jobs.insert(id.to_string(), Entry { tenant: tenant.name.clone(), job, memory_mb, subtasks, instances });
        Ok(())
    }
}

/// Server mode: every path a job uses must lie in its tenant's directory, components must be
/// uploaded ones (`sha256:<digest>`), and there is no stdin or stdout to share.
fn confine(graph: &mut JobGraph, root: &Path) -> Result<(), String> {
    let files = root.join("files");
    let inside = |p: &Path, what: &str| {
        if confined(&files, p) {
            Ok(())
        } else {
            Err(format!("{what} {} is outside your directory; use a relative path without `..`", p.display()))
        }
    };
    if let Some(c) = &graph.checkpoint {
        if let Some(url) = &c.remote {
            // Object storage would be reached with the server's own credentials.
            return Err(format!(
                "checkpoint dir {url}: object storage is not available to a server's tenants; use a relative directory"
            ));
        }
        inside(&c.dir, "checkpoint dir")?;
    }
    for n in &mut graph.nodes {
        match &mut n.kind {
            NodeKind::Source(SourceKind::File { path, .. }) => inside(path, &format!("source `{}` path", n.id))?,
            NodeKind::Source(SourceKind::Stdin) => {
                return Err(format!("source `{}`: a server has no stdin to give; upload a file", n.id));
            }
            NodeKind::Source(SourceKind::Generator(_) | SourceKind::Nexmark(_)) => {}
            NodeKind::Sink(SinkKind::File { path, .. }) => inside(path, &format!("sink `{}` path", n.id))?,
            NodeKind::Sink(SinkKind::Stdout { .. }) => {
                return Err(format!("sink `{}`: a server's stdout is shared; use a file sink", n.id));
            }
            NodeKind::Sink(SinkKind::Blackhole { .. }) => {}
            NodeKind::Sink(SinkKind::Postgres(_)) => {
                return Err(format!(
                    "sink `{}`: a shared server does not open network connections for tenants' jobs yet \
                     (their destinations are not confined); run a PostgreSQL sink with `weir run`",
                    n.id
                ));
            }
            NodeKind::Source(SourceKind::Kafka(_)) | NodeKind::Sink(SinkKind::Kafka(_)) => {
                return Err(format!(
                    "`{}`: a shared server does not open network connections for tenants' jobs yet \
                     (their destinations are not confined); run Kafka sources and sinks with `weir run`",
                    n.id
                ));
            }
            NodeKind::Operator(op) => {
                if !confined(&root.join("components"), &op.component) {
                    return Err(format!("operator `{}`: its component is not one you uploaded", n.id));
                }
            }
        }
    }
    Ok(())
}

/// Checks the paths of a submitted job as written (relative, no `..`), and rewrites every
/// operator's `component = "sha256:<digest>"` (what POST /v1/components answered) to the
/// tenant's stored component, in place so error lines still match what the tenant sent;
/// anything else is refused.
fn preprocess(text: &str, components: &Path) -> Result<String, String> {
    let doc: toml::Table = text.parse().map_err(|e| format!("the job file is not valid TOML: {e}"))?;
    let relative = |p: &str, what: String| {
        let p = Path::new(p);
        if p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            Err(format!("{what} {} is outside your directory; use a relative path without `..`", p.display()))
        } else {
            Ok(())
        }
    };
    if let Some(dir) = doc.get("checkpoint").and_then(|c| c.get("dir")).and_then(|d| d.as_str()) {
        relative(dir, "checkpoint dir".into())?;
    }
    for section in ["source", "sink"] {
        for node in doc.get(section).and_then(|s| s.as_array()).into_iter().flatten() {
            if let Some(p) = node.get("path").and_then(|p| p.as_str()) {
                let id = node.get("id").and_then(|v| v.as_str()).unwrap_or("?");
                relative(p, format!("{section} `{id}` path"))?;
            }
        }
    }
    let mut out = text.to_string();
    if let Some(ops) = doc.get("operator").and_then(|o| o.as_array()) {
        for op in ops {
            let Some(t) = op.as_table() else { continue };
            let id = t.get("id").and_then(|v| v.as_str()).unwrap_or("?").to_string();
            let Some(c) = t.get("component").and_then(|c| c.as_str()) else { continue };
            let Some(sha) = c.strip_prefix("sha256:") else {
                return Err(format!(
                    "operator `{id}`: name its component as `sha256:<digest>`, as POST /v1/components answered \
                     (`weir submit` does this for you)"
                ));
            };
            let p = components.join(format!("{sha}.wasm"));
            if sha.is_empty() || !sha.chars().all(|c| c.is_ascii_hexdigit()) || !p.exists() {
                return Err(format!("operator `{id}`: no uploaded component sha256:{sha}; upload it first"));
            }
            let path = format!("{:?}", p.display().to_string());
            out = out.replace(&format!("\"{c}\""), &path).replace(&format!("'{c}'"), &path);
        }
    }
    Ok(out)
}
