//! Runs a bound job and keeps it running: chooses the components and the checkpoint to
//! restore, runs attempts (each deployed by `runtime/local.rs` from the job's physical plan),
//! and after a failure restarts from the latest complete checkpoint as the restart strategy
//! allows.
//!
//! Invariants: an attempt starts only after every thread of the previous one has exited; a
//! run restarts only from its own checkpoints or from where it started; the same failure
//! from the same restore point stops the job instead of looping.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::checkpoint::compat;
use crate::checkpoint::metadata::ComponentEntry;
use crate::checkpoint::mirror;
use crate::checkpoint::recovery;
use crate::checkpoint::storage::{self, CheckpointStore, LoadedCheckpoint};
use crate::checkpoint::subset::{Scope, everything};
use crate::declared::Redistribution;
use crate::graph::logical::NodeKind;
use crate::ids::NodeId;
use crate::job::bind::BoundJob;
use crate::operator::OperatorFactory;
use crate::runtime::driver::Completed;
use crate::runtime::error::{RunError, TaskFailure};
use crate::runtime::faults::FaultPlan;
use crate::runtime::handle::{Endpoint, JobState, NodeInput, NodeStatus, SavepointInfo};
use crate::runtime::latency::LatencySummary;
use crate::runtime::local::{Attempt, run_attempt};
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::priority;
use crate::runtime::upgrade::{self, component_entry};
use crate::sandbox::instance::LoadedComponent;

/// Where to restore a run from.
#[derive(Debug, Clone)]
pub enum RestoreFrom {
    /// The newest complete checkpoint in the job's checkpoint directory.
    Latest,
    /// A checkpoint (or savepoint) directory.
    Path(PathBuf),
}

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Print a progress line to stderr this often.
    pub progress: Option<Duration>,
    /// Do not echo guest log lines.
    pub quiet_guests: bool,
    /// Restore before starting.
    pub restore: Option<RestoreFrom>,
    /// Drop checkpointed state of nodes the job no longer has.
    pub allow_non_restored_state: bool,
    /// Failure injection (tests).
    pub faults: Option<Arc<FaultPlan>>,
    /// The job's end of a [`JobHandle`](crate::runtime::handle::JobHandle): savepoints,
    /// stop, upgrades, cancel, status.
    pub endpoint: Option<Endpoint>,
    /// The CPU group (its tenant's share) every subtask thread joins before it runs.
    pub cpu_group: Option<Arc<crate::runtime::cpu_shares::CpuGroup>>,
    /// Tests: while set, sources hold back their end of input, so the job cannot finish
    /// before the test has taken its savepoint, upgrade or stop (an event it controls, not a
    /// race with the machine's speed).
    pub hold_input: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The tenant's disk budget: file sinks charge what they write (`weir serve`).
    pub disk_budget: Option<Arc<crate::disk_budget::DiskBudget>>,
    /// Where disk-backed operators (`state_backend = "disk"`) keep their stores (a
    /// `weir-state/` directory in it); default `$WEIR_STATE_DIR`, else the system's
    /// temporary directory.
    pub state_dir: Option<PathBuf>,
    /// Consulted between publishing each checkpoint and announcing it (a cluster's leader
    /// records it in etcd).
    pub gate: Option<crate::runtime::driver::PublishGate>,
}

/// Counters of one node at the end of a run.
#[derive(Debug, Clone)]
pub struct NodeSummary {
    /// Node uid.
    pub id: NodeId,
    /// Records received.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Loop heads: most batches queued on one back-edge.
    pub feedback_peak_batches: u64,
    /// Latency-measuring sinks: quantiles over every record after the warm-up.
    pub latency: Option<LatencySummary>,
    /// Snapshots abandoned half-drained because their checkpoint was aborted.
    pub snapshots_abandoned: u64,
    /// Most `snapshot` calls (chunks) one subtask's snapshot took.
    pub snapshot_chunks_max: u64,
    /// Records in flight written with unaligned checkpoints (the barriers overtook them).
    pub inflight_logged: u64,
    /// Loop heads: back-edge records logged into their snapshots.
    pub backedge_logged: u64,
    /// The disk backend: keys read from its store into the guests' caches.
    pub keys_paged_in: u64,
    /// The disk backend: keys dropped from the guests' caches to keep them in budget.
    pub keys_evicted: u64,
}

/// Records stamped within this long of a latency sink's first record are not measured
/// (instantiation, first compilation of hot paths).
pub const LATENCY_WARMUP_MS: i64 = 1000;

/// What a finished run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Wall time.
    pub elapsed: Duration,
    /// Per node, in job file order (counters of the last attempt).
    pub nodes: Vec<NodeSummary>,
    /// Attempts (1 + restarts).
    pub attempts: u32,
    /// Checkpoints completed over all attempts.
    pub checkpoints: u64,
    /// The checkpoint the first attempt restored, if any.
    pub restored_from: Option<u64>,
    /// The job was stopped with this savepoint (instead of running to its end).
    pub stopped_with: Option<SavepointInfo>,
}

/// How one attempt ended.
pub(crate) enum AttemptEnd {
    /// Every subtask finished.
    Done(Vec<NodeSummary>),
    /// Stopped with this savepoint.
    Stopped(Vec<NodeSummary>, SavepointInfo),
    /// This root cause.
    Failed(TaskFailure),
}

/// The running component of every operator node and how manifests record it.
pub(crate) type Live = Arc<Mutex<BTreeMap<usize, (OperatorFactory, ComponentEntry)>>>;

/// Chooses each operator's component for a run that restores `chk`: the job file's, unless
/// the checkpoint records a live upgrade away from exactly that component, in which case the
/// upgraded component stored with the checkpoints runs (the upgrade outlives the process).
/// Then checks every operator's state against its component (`checkpoint::compat`) and
/// returns the states to drop per node.
pub(crate) fn resolve_components(
    job: &BoundJob,
    chk: Option<&LoadedCheckpoint>,
    allow_dropped: bool,
    live: &Live,
) -> Result<BTreeMap<usize, Vec<String>>, String> {
    let g = &job.graph;
    let mut dropped = BTreeMap::new();
    for (&i, f) in &job.components {
        let uid = g.nodes[i].id.as_str();
        let mut factory = f.clone();
        let mut entry = component_entry(f);
        let recorded = chk.and_then(|c| c.manifest.operator(uid)).and_then(|o| o.component.as_ref());
        if let (Some(c), Some(rec)) = (chk, recorded)
            && let (Some(stored), Some(sha), OperatorFactory::Wasm(lc)) = (&rec.stored, f.sha256(), f)
            && rec.sha256.as_deref() != Some(sha)
            && rec.replaces.iter().any(|r| r == sha)
        {
            let path = c.path.join(stored);
            let up = LoadedComponent::load(lc.engine(), uid, &path).map_err(|e| e.to_string())?;
            if rec.sha256.as_deref() != Some(up.sha256.as_str()) {
                return Err(format!(
                    "operator `{uid}`: the upgraded component stored at {} does not match its recorded digest; \
                     restore an older checkpoint or run with the job file's component after removing the upgrade",
                    path.display()
                ));
            }
            tracing::info!(
                operator = %uid,
                "operator `{uid}`: running {} {} (live-upgraded; stored with the checkpoints) instead of the job \
                 file's {} {}",
                up.info.name,
                up.info.version,
                f.info().name,
                f.info().version
            );
            factory = OperatorFactory::Wasm(Arc::new(up));
            entry = component_entry(&factory);
            entry.replaces = rec.replaces.clone();
        }
        if let (Some(c), Some(rec)) = (chk, recorded) {
            let source = format!(
                "{} {} ({})",
                match c.manifest.kind {
                    crate::checkpoint::metadata::SnapshotKind::Savepoint => "savepoint",
                    crate::checkpoint::metadata::SnapshotKind::Checkpoint => "checkpoint",
                },
                c.manifest.checkpoint_id,
                c.path.display()
            );
            let v = compat::check(uid, &source, rec, factory.info(), allow_dropped).map_err(|e| e.to_string())?;
            if let Some(from) = v.migrates_from {
                tracing::info!(
                    operator = %uid,
                    "operator `{uid}`: migrating state from schema {from} ({} {}) to schema {} ({} {})",
                    rec.name,
                    rec.version,
                    factory.info().schema_version,
                    factory.info().name,
                    factory.info().version
                );
            }
            for d in &v.dropped {
                tracing::warn!(
                    operator = %uid,
                    "operator `{uid}`: dropping state `{d}`, which {} no longer declares",
                    factory.info().name
                );
            }
            dropped.insert(i, v.dropped);
        }
        live.lock().unwrap().insert(i, (factory, entry));
    }
    Ok(dropped)
}

/// Runs `job` until its sources are exhausted and every subtask finished, restarting after
/// failures as its restart strategy allows.
pub fn run(job: &BoundJob, opts: &RunOptions) -> Result<RunSummary, RunError> {
    run_deployed(job, opts, &everything, &mut run_attempt)
}

/// Runs one attempt wherever its subtasks are deployed: in this process
/// ([`run_attempt`]) or on a cluster's workers.
pub(crate) type Deploy<'d> = dyn FnMut(&Attempt<'_>) -> Result<AttemptEnd, RunError> + 'd;

/// [`run`] with each attempt deployed by `deploy`: the restart loop, restore and checkpoint
/// storage stay here whatever runs the subtasks. Restores load the states `scope` names
/// (everything in one process; a cluster's coordinator only its sinks', its workers load
/// their own).
pub(crate) fn run_deployed(
    job: &BoundJob,
    opts: &RunOptions,
    scope: Scope<'_>,
    deploy: &mut Deploy<'_>,
) -> Result<RunSummary, RunError> {
    let g = &job.graph;
    let started = Instant::now();
    let fail = |e: RunError| {
        if let Some(ep) = &opts.endpoint {
            ep.status.lock().unwrap().state = JobState::Failed { cause: e.to_string() };
        }
        e
    };
    let store =
        CheckpointStore::of(g).map_err(|e| fail(RunError::Setup { job: g.name.clone(), message: e.to_string() }))?;
    let restore = load_restore(job, opts, store.as_ref(), scope).map_err(fail)?;
    let restored_from = restore.as_ref().map(|c| c.manifest.checkpoint_id);
    let live: Live = Arc::default();
    let set_state = |state: JobState| {
        if let Some(e) = &opts.endpoint {
            e.status.lock().unwrap().state = state;
        }
    };
    let result = run_attempts(job, opts, (store.as_ref(), scope), restore, &live, started, restored_from, deploy);
    match &result {
        Ok(s) => match &s.stopped_with {
            Some(sp) => set_state(JobState::Stopped { savepoint: sp.path.clone() }),
            None => set_state(JobState::Finished),
        },
        Err(RunError::Cancelled { .. }) => set_state(JobState::Cancelled),
        Err(e) => set_state(JobState::Failed { cause: e.to_string() }),
    }
    result
}

/// Everything `run` refuses before any task starts — the restore source cannot be loaded, a
/// component cannot take over its state, the state cannot be mapped onto the job — checked
/// without running anything (the server answers a submission with it).
pub fn preflight(job: &BoundJob, opts: &RunOptions) -> Result<(), RunError> {
    let g = &job.graph;
    let store = CheckpointStore::of(g).map_err(|e| RunError::Setup { job: g.name.clone(), message: e.to_string() })?;
    let Some(chk) = load_restore(job, opts, store.as_ref(), &everything)? else { return Ok(()) };
    let live: Live = Arc::default();
    let dropped = resolve_components(job, Some(&chk), opts.allow_non_restored_state, &live)
        .map_err(|e| RunError::Incompatible { job: g.name.clone(), message: e })?;
    let components = live.lock().unwrap().clone();
    let redistribution = |node: usize, state: &str| {
        components
            .get(&node)
            .and_then(|(f, _)| f.info().states.iter().find(|s| s.name == state).map(|s| s.redistribution))
            .unwrap_or(Redistribution::None)
    };
    recovery::plan(&chk, g, &redistribution, &dropped, opts.allow_non_restored_state).map_err(|e| RunError::Setup {
        job: g.name.clone(),
        message: format!("cannot restore {}: {e}", chk.path.display()),
    })?;
    Ok(())
}

/// Why a job cannot restore its newest checkpoint, and what the user can do.
fn cannot_restore(e: &storage::CheckpointError) -> String {
    if e.is_incomplete() || matches!(e, storage::CheckpointError::Remote(_)) {
        format!("cannot restore: {e}")
    } else {
        format!("cannot restore: {e}; {}", storage::UNLOADABLE_ADVICE)
    }
}

/// The newest checkpoint of `ids` to restart from. An object store that does not answer is
/// waited for (retrying every few seconds, warning each time): an older checkpoint is no
/// answer, it would repeat what the newer one committed. Any other error ends the job.
fn newest_completed(
    (s, scope): (&CheckpointStore, Scope<'_>),
    ids: &[u64],
    job: &str,
    cancel: Option<&AtomicBool>,
) -> Result<Option<LoadedCheckpoint>, RunError> {
    const RETRY: Duration = Duration::from_secs(2);
    loop {
        match s.latest_of_part(ids, scope) {
            Ok(newest) => return Ok(newest),
            Err(e @ storage::CheckpointError::Remote(_)) => {
                tracing::warn!(job, "job `{job}` waits to restart: {e}; retrying in {} s", RETRY.as_secs());
                let until = Instant::now() + RETRY;
                while Instant::now() < until {
                    if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                        return Err(RunError::Cancelled { job: job.to_string() });
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Err(e) => return Err(RunError::Setup { job: job.to_string(), message: cannot_restore(&e) }),
        }
    }
}

/// The checkpoint or savepoint `opts` says to restore, loaded and verified (the states
/// `scope` names).
fn load_restore(
    job: &BoundJob,
    opts: &RunOptions,
    store: Option<&CheckpointStore>,
    scope: Scope<'_>,
) -> Result<Option<LoadedCheckpoint>, RunError> {
    let g = &job.graph;
    let setup = |message: String| RunError::Setup { job: g.name.clone(), message };
    let warn = |e: &storage::CheckpointError| tracing::warn!("skipping {e}");
    Ok(match &opts.restore {
        None => None,
        Some(RestoreFrom::Latest) => {
            let s = store.as_ref().ok_or_else(|| {
                setup(
                    "--restore latest needs checkpointing: add [checkpoint] interval_ms and dir to the job file".into(),
                )
            })?;
            let found = s.find_latest_part(scope, warn).map_err(|e| setup(cannot_restore(&e)))?;
            Some(found.ok_or_else(|| {
                let place = s.remote().map_or(s.root().display().to_string(), |r| r.url().to_string());
                setup(format!("no complete checkpoint in {place} to restore; run without --restore to start fresh"))
            })?)
        }
        Some(RestoreFrom::Path(p)) if p.to_str().is_some_and(|u| u.starts_with("s3://")) => {
            // Downloaded next to the job's own checkpoints (or into a private temporary
            // directory when the job has none).
            let local = match store {
                Some(s) => s.root().join("restored"),
                None => std::env::temp_dir().join(format!("weir-restore-{}", std::process::id())),
            };
            let url = p.to_str().unwrap_or_default();
            Some(mirror::fetch_url(url, &local, scope).map_err(|e| setup(format!("cannot restore {url}: {e}")))?)
        }
        Some(RestoreFrom::Path(p)) => {
            Some(storage::load_part(p, scope).map_err(|e| setup(format!("cannot restore: {e}")))?)
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn run_attempts(
    job: &BoundJob,
    opts: &RunOptions,
    (store, scope): (Option<&CheckpointStore>, Scope<'_>),
    mut restore: Option<LoadedCheckpoint>,
    live: &Live,
    started: Instant,
    restored_from: Option<u64>,
    deploy: &mut Deploy<'_>,
) -> Result<RunSummary, RunError> {
    let g = &job.graph;
    let completed = Arc::new(Completed::default());
    let mut failures = 0u32;
    let user_cancel = opts.endpoint.as_ref().map(|e| e.cancel.clone());
    let original_path = restore.as_ref().map(|c| c.path.clone());
    let mut original_dropped = BTreeMap::new();
    let mut demoted = false;
    let mut repeated = crate::runtime::repeated_failure::RepeatedFailure::default();
    loop {
        if let Some(c) = &restore {
            let what = match c.manifest.kind {
                crate::checkpoint::metadata::SnapshotKind::Savepoint => "savepoint",
                crate::checkpoint::metadata::SnapshotKind::Checkpoint => "checkpoint",
            };
            tracing::info!(
                job = %g.name,
                checkpoint = c.manifest.checkpoint_id,
                "restoring job `{}` from {what} {} ({}; {} loaded here)",
                g.name,
                c.manifest.checkpoint_id,
                c.path.display(),
                c.share()
            );
        }
        // Refused before any task starts: components that cannot take over their state.
        if failures == 0 {
            original_dropped = resolve_components(job, restore.as_ref(), opts.allow_non_restored_state, live)
                .map_err(|e| RunError::Incompatible { job: g.name.clone(), message: e })?;
        }
        // Restarts keep the components running (a live upgrade stays in force). States the
        // user allowed to drop are dropped again when restarting from the original snapshot;
        // this run's own checkpoints never held them.
        let dropped = if restore.as_ref().map(|c| &c.path) == original_path.as_ref() {
            original_dropped.clone()
        } else {
            BTreeMap::new()
        };
        if let Some(e) = &opts.endpoint {
            let mut st = e.status.lock().unwrap();
            st.attempts = failures + 1;
            st.state = JobState::Running;
            st.nodes = node_statuses(g, live);
        }
        let summary = |nodes, stopped_with| RunSummary {
            elapsed: started.elapsed(),
            nodes,
            attempts: failures + 1,
            checkpoints: completed.count.load(Ordering::Relaxed),
            restored_from,
            stopped_with,
        };
        let nice = if demoted { priority::DEMOTED_NICE } else { 0 };
        let attempt = Attempt {
            job,
            opts,
            attempt: failures,
            writer: u64::from(failures),
            restore: restore.as_ref(),
            store,
            completed: &completed,
            live,
            dropped: &dropped,
            nice,
        };
        match deploy(&attempt)? {
            AttemptEnd::Done(nodes) => return Ok(summary(nodes, None)),
            AttemptEnd::Stopped(nodes, sp) => return Ok(summary(nodes, Some(sp))),
            AttemptEnd::Failed(cause) => {
                demoted |= cause.is_cpu_limit();
                if user_cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                    return Err(RunError::Cancelled { job: g.name.clone() });
                }
                failures += 1;
                if let Some(e) = &opts.endpoint {
                    let mut st = e.status.lock().unwrap();
                    st.state = JobState::Restarting { cause: cause.to_string() };
                    if let Some(limit) = cause.limit() {
                        *st.traps_by_limit.entry(limit.to_string()).or_default() += 1;
                    }
                }
                let Some(delay) = g.restart.delay(failures) else {
                    return Err(RunError::Failed { job: g.name.clone(), attempts: failures, cause });
                };
                let started_from = restore.as_ref().map(|c| c.manifest.checkpoint_id);
                if !cause.is_transient() && repeated.observe(started_from, &cause.to_string()) {
                    let from = started_from.map_or("the beginning".to_string(), |c| format!("checkpoint {c}"));
                    return Err(RunError::Repeated {
                        job: g.name.clone(),
                        attempts: failures,
                        from,
                        cause: Box::new(cause),
                    });
                }
                restore = match store {
                    // The newest checkpoint this run completed, else where this run started
                    // (never a newer checkpoint another run or a deposed leader left behind).
                    Some(s) => {
                        newest_completed((s, scope), &completed.ids(), &g.name, user_cancel.as_deref())?.or(restore)
                    }
                    None => None,
                };
                let from = restore
                    .as_ref()
                    .map_or("the beginning".to_string(), |c| format!("checkpoint {}", c.manifest.checkpoint_id));
                tracing::warn!(
                    job = %g.name,
                    attempt = failures,
                    "job `{}` failed ({cause}); restart {failures} in {} ms from {from}",
                    g.name,
                    delay.as_millis()
                );
                // A cancel during the delay ends the job now, before another attempt runs.
                let until = Instant::now() + delay;
                while Instant::now() < until {
                    if user_cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                        return Err(RunError::Cancelled { job: g.name.clone() });
                    }
                    std::thread::sleep((until - Instant::now()).min(Duration::from_millis(20)));
                }
            }
        }
    }
}

/// The status of every node as an attempt starts (counters at zero).
fn node_statuses(g: &crate::graph::logical::JobGraph, live: &Live) -> Vec<NodeStatus> {
    let l = live.lock().unwrap();
    g.nodes
        .iter()
        .enumerate()
        .map(|(i, n)| NodeStatus {
            uid: n.id.to_string(),
            parallelism: n.parallelism,
            component: l.get(&i).map(|(f, _)| upgrade::describe(f)),
            records_in: 0,
            records_out: 0,
            backpressured_ms: 0,
            dead_letters: 0,
            busy_ms: 0,
            kind: match n.kind {
                NodeKind::Source(_) => "source",
                NodeKind::Operator(_) => "operator",
                NodeKind::Sink(_) => "sink",
            }
            .into(),
            inputs: g
                .edges
                .iter()
                .filter(|e| e.to == i)
                .map(|e| NodeInput { from: g.nodes[e.from].id.to_string(), feedback: e.feedback })
                .collect(),
            idle_ms: 0,
            bytes_in: 0,
            bytes_out: 0,
            guest_calls: 0,
            watermark: None,
            guest_memory_bytes: 0,
            subtasks: Vec::new(),
        })
        .collect()
}

pub(crate) fn summaries(g: &crate::graph::logical::JobGraph, metrics: &[Arc<NodeMetrics>]) -> Vec<NodeSummary> {
    g.nodes
        .iter()
        .zip(metrics)
        .map(|(n, m)| {
            let (records_in, records_out) = m.read();
            let feedback_peak_batches = m.feedback_peak_batches.load(Ordering::Relaxed);
            let latency = m.latency.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|h| h.summary());
            let snapshots_abandoned = m.snapshots_abandoned.load(Ordering::Relaxed);
            let snapshot_chunks_max = m.snapshot_chunks_max.load(Ordering::Relaxed);
            NodeSummary {
                id: n.id.clone(),
                records_in,
                records_out,
                feedback_peak_batches,
                latency,
                snapshots_abandoned,
                snapshot_chunks_max,
                inflight_logged: m.inflight_logged.load(Ordering::Relaxed),
                backedge_logged: m.backedge_logged.load(Ordering::Relaxed),
                keys_paged_in: m.paging.keys_paged_in.load(Ordering::Relaxed),
                keys_evicted: m.paging.keys_evicted.load(Ordering::Relaxed),
            }
        })
        .collect()
}

pub(crate) fn report_progress(ids: &[NodeId], metrics: &[Arc<NodeMetrics>], done: &AtomicBool, every: Duration) {
    let start = Instant::now();
    let mut last: Vec<(u64, u64)> = metrics.iter().map(|m| m.read()).collect();
    let mut last_t = Instant::now();
    while !done.load(Ordering::Relaxed) {
        let deadline = Instant::now() + every;
        while Instant::now() < deadline {
            if done.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let dt = last_t.elapsed().as_secs_f64();
        last_t = Instant::now();
        let mut parts = Vec::new();
        for ((id, m), l) in ids.iter().zip(metrics).zip(last.iter_mut()) {
            let (i, o) = m.read();
            parts.push(format!("{id}: in {}/s out {}/s", human((i - l.0) as f64 / dt), human((o - l.1) as f64 / dt)));
            *l = (i, o);
        }
        tracing::info!("[{:>6.1}s] {}", start.elapsed().as_secs_f64(), parts.join(" | "));
    }
}

/// `12.3k`, `4.56M`.
pub fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
