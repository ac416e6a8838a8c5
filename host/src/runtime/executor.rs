//! Turns a bound job into running subtasks — one thread per subtask, one bounded channel
//! per (upstream subtask, downstream subtask) pair of every edge — and keeps it running:
//! on a failure every subtask is cancelled and the job restarts from the latest complete
//! checkpoint, as the restart strategy allows.
//!
//! Invariants: a failing subtask drops its channels, so its neighbours see a disconnect and
//! stop too, and the cancel flag stops the rest; the job's error is the first root cause
//! (not the disconnects it caused); an attempt starts only after every thread of the
//! previous one has exited.

use crate::runtime::latency::{LatencyRecorder, LatencySummary};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded};

use crate::runtime::control::{Control, Event, WriteMsg};
use crate::runtime::driver::{self, Completed, DriverConfig, DriverEnd, NodeTemplate, TaskTemplate};
use std::collections::BTreeMap;

use crate::checkpoint::compat;
use crate::checkpoint::metadata::ComponentEntry;
use crate::checkpoint::recovery;
use crate::checkpoint::snapshot::SourcePosition;
use crate::checkpoint::storage::{self, CheckpointStore, LoadedCheckpoint, store_component};
use crate::connectors::file_sink::{FileSink, clear_parts};
use crate::connectors::file_source::FileSource;
use crate::connectors::generator::Generator;
use crate::connectors::kafka::sink::{KafkaSink, Opening as KafkaOpening};
use crate::connectors::kafka::source::KafkaReader;
use crate::connectors::nexmark::NexmarkSource;
use crate::declared::Redistribution;
use crate::graph::logical::{NodeKind, SinkKind, SourceKind};
use crate::graph::partition::Partition;
use crate::ids::{NodeId, SubtaskIndex, TaskId};
use crate::job::bind::BoundJob;
use crate::keygroup::key_group_range;
use crate::operator::OperatorFactory;
use crate::runtime::error::{RunError, TaskFailure};
use crate::runtime::failed_record::Origin;
use crate::runtime::faults::FaultPlan;
use crate::runtime::handle::{Endpoint, JobState, NodeInput, NodeStatus, Request, SavepointInfo};
use crate::runtime::input::{InputChannel, Inputs};
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::output::{EdgeOutput, Output};
use crate::runtime::participant::Participant;
use crate::runtime::priority;
use crate::runtime::sink::{SinkTask, SinkWriter};
use crate::runtime::source::{SourceReader, SourceTask, kafka_failure};
use crate::runtime::task::{Faults, OperatorTask, Restore};
use crate::runtime::termination::LoopTermination;
use crate::runtime::upgrade::{self, component_entry};
use crate::runtime::writer;
use crate::sandbox::bindings::types::TaskInfo;
use crate::sandbox::host::HostState;
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

enum Task {
    Source(SourceTask),
    Operator(Box<dyn FnOnce() -> Result<OperatorTask, TaskFailure> + Send>),
    Sink(SinkTask),
}

/// How one attempt ended.
enum AttemptEnd {
    Done(Vec<NodeSummary>),
    Stopped(Vec<NodeSummary>, SavepointInfo),
    Failed(TaskFailure),
}

/// The running component of every operator node and how manifests record it.
type Live = Arc<Mutex<BTreeMap<usize, (OperatorFactory, ComponentEntry)>>>;

/// Chooses each operator's component for a run that restores `chk`: the job file's, unless
/// the checkpoint records a live upgrade away from exactly that component, in which case the
/// upgraded component stored with the checkpoints runs (the upgrade outlives the process).
/// Then checks every operator's state against its component (`checkpoint::compat`) and
/// returns the states to drop per node.
fn resolve_components(
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
    let g = &job.graph;
    let started = Instant::now();
    let store = g.checkpoint.as_ref().map(|c| CheckpointStore::new(&c.dir, &g.name));
    let restore = match load_restore(job, opts, store.as_ref()) {
        Ok(r) => r,
        Err(e) => {
            if let Some(ep) = &opts.endpoint {
                ep.status.lock().unwrap().state = JobState::Failed { cause: e.to_string() };
            }
            return Err(e);
        }
    };
    let restored_from = restore.as_ref().map(|c| c.manifest.checkpoint_id);
    let live: Live = Arc::default();
    let set_state = |state: JobState| {
        if let Some(e) = &opts.endpoint {
            e.status.lock().unwrap().state = state;
        }
    };
    let result = run_attempts(job, opts, store.as_ref(), restore, &live, started, restored_from);
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
    let store = g.checkpoint.as_ref().map(|c| CheckpointStore::new(&c.dir, &g.name));
    let Some(chk) = load_restore(job, opts, store.as_ref())? else { return Ok(()) };
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

/// The checkpoint or savepoint `opts` says to restore, loaded and verified.
fn load_restore(
    job: &BoundJob,
    opts: &RunOptions,
    store: Option<&CheckpointStore>,
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
            Some(s.latest(warn).ok_or_else(|| {
                setup(format!(
                    "no complete checkpoint in {} to restore; run without --restore to start fresh",
                    s.root().display()
                ))
            })?)
        }
        Some(RestoreFrom::Path(p)) => Some(storage::load(p).map_err(|e| setup(format!("cannot restore: {e}")))?),
    })
}

fn run_attempts(
    job: &BoundJob,
    opts: &RunOptions,
    store: Option<&CheckpointStore>,
    mut restore: Option<LoadedCheckpoint>,
    live: &Live,
    started: Instant,
    restored_from: Option<u64>,
) -> Result<RunSummary, RunError> {
    let g = &job.graph;
    let warn = |e: &storage::CheckpointError| tracing::warn!("skipping {e}");
    let completed = Arc::new(Completed::default());
    let mut failures = 0u32;
    let user_cancel = opts.endpoint.as_ref().map(|e| e.cancel.clone());
    let original_path = restore.as_ref().map(|c| c.path.clone());
    let mut original_dropped = BTreeMap::new();
    let mut demoted = false;
    let mut repeated = crate::runtime::repeated_failure::RepeatedFailure::default();
    // Checkpoints of this run have ids from here on; older ones on disk are another run's.
    let first_id = store.map_or(0, |s| s.max_id().saturating_add(1));
    loop {
        if let Some(c) = &restore {
            let what = match c.manifest.kind {
                crate::checkpoint::metadata::SnapshotKind::Savepoint => "savepoint",
                crate::checkpoint::metadata::SnapshotKind::Checkpoint => "checkpoint",
            };
            tracing::info!(
                job = %g.name,
                checkpoint = c.manifest.checkpoint_id,
                "restoring job `{}` from {what} {} ({})",
                g.name,
                c.manifest.checkpoint_id,
                c.path.display()
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
            let l = live.lock().unwrap();
            st.nodes = g
                .nodes
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
                .collect();
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
        match run_attempt(job, opts, failures, restore.as_ref(), store, &completed, live, &dropped, nice)? {
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
                    // The newest checkpoint of this run, else where this run started (never a
                    // newer checkpoint another run left behind).
                    Some(s) => s.latest_since(first_id, warn).or(restore),
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
                std::thread::sleep(delay);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_attempt(
    job: &BoundJob,
    opts: &RunOptions,
    attempt: u32,
    restore: Option<&LoadedCheckpoint>,
    store: Option<&CheckpointStore>,
    completed: &Arc<Completed>,
    live: &Live,
    dropped: &BTreeMap<usize, Vec<String>>,
    nice: i32,
) -> Result<AttemptEnd, RunError> {
    let g = &job.graph;
    let setup = |message: String| RunError::Setup { job: g.name.clone(), message };
    let cancel = Arc::new(AtomicBool::new(false));
    let metrics: Vec<Arc<NodeMetrics>> = g.nodes.iter().map(|n| Arc::new(NodeMetrics::new(n.parallelism))).collect();

    // What each subtask restores.
    let plan = match restore {
        Some(c) => Some({
            let components = live.lock().unwrap().clone();
            let redistribution = |node: usize, state: &str| {
                components
                    .get(&node)
                    .and_then(|(f, _)| f.info().states.iter().find(|s| s.name == state).map(|s| s.redistribution))
                    .unwrap_or(Redistribution::None)
            };
            recovery::plan(c, g, &redistribution, dropped, opts.allow_non_restored_state)
                .map_err(|e| setup(format!("cannot restore {}: {e}", c.path.display())))?
        }),
        None => None,
    };
    let restored_state = |node: usize, subtask: u32| plan.as_ref().and_then(|p| p[node][subtask as usize].clone());
    let retired = restore.map(|c| recovery::retired_sinks(c, g)).unwrap_or_default();
    if let Some(c) = restore
        && c.manifest.finished
    {
        // The job had finished; only its last commits may be missing: opening a sink on the
        // restored state finishes them.
        for (i, n) in g.nodes.iter().enumerate() {
            for s in 0..n.parallelism {
                let st = restored_state(i, s);
                let id = TaskId { node: n.id.clone(), subtask: SubtaskIndex(s) };
                let finishing =
                    |e: String| setup(format!("sink `{}` subtask {s}: finishing its last commit: {e}", n.id));
                match &n.kind {
                    NodeKind::Sink(SinkKind::File { path, format }) => {
                        let sink = st.and_then(|st| st.sink);
                        FileSink::open(path, s, *format, sink.as_ref())
                            .map_err(|e| finishing(format!("{}: {e}", path.display())))?;
                    }
                    NodeKind::Sink(SinkKind::Kafka(target)) => {
                        let blob = st.as_ref().map(|st| &st.operator_state[..]);
                        let adopted = st.as_ref().map(|st| st.adopted_blobs.clone()).unwrap_or_default();
                        match KafkaSink::open(target, KafkaOpening { subtask: s, restored: blob, adopted: &adopted }) {
                            Ok(_) => {}
                            Err(e) if attempt == 0 => return Err(finishing(e.to_string())),
                            Err(e) => return Ok(AttemptEnd::Failed(kafka_failure(&id, e))),
                        }
                    }
                    NodeKind::Sink(SinkKind::Postgres(target)) => {
                        let sink = st.as_ref().and_then(|st| st.sink.clone());
                        let adopted = st.as_ref().map(|st| st.adopted_sinks.clone()).unwrap_or_default();
                        let opening = crate::connectors::postgres_sink::Opening {
                            subtask: s,
                            parallelism: n.parallelism,
                            restored: sink.as_ref(),
                            adopted: &adopted,
                            checkpoint_interval: None,
                        };
                        match crate::connectors::postgres_sink::PostgresSink::open(target, opening) {
                            Ok(_) => {}
                            Err(e) if attempt == 0 => return Err(finishing(e.to_string())),
                            Err(e) => return Ok(AttemptEnd::Failed(crate::runtime::sink::pg_failure(&id, e))),
                        }
                    }
                    _ => {}
                }
            }
        }
        tracing::info!(
            job = %g.name,
            "job `{}` had already finished at checkpoint {}; its output is committed",
            g.name, c.manifest.checkpoint_id
        );
        return Ok(AttemptEnd::Done(summaries(g, &metrics)));
    }

    // Channels.
    let mut inputs: Vec<Vec<Vec<InputChannel>>> =
        g.nodes.iter().map(|n| (0..n.parallelism).map(|_| Vec::new()).collect()).collect();
    let mut outputs: Vec<Vec<Vec<EdgeOutput>>> =
        g.nodes.iter().map(|n| (0..n.parallelism).map(|_| Vec::new()).collect()).collect();
    // One in-flight budget for all back-edges of this attempt (`[limits] max_feedback_mb`).
    let feedback_budget =
        Arc::new(crate::runtime::feedback_budget::FeedbackBudget::new(g.limits.max_feedback_mb << 20));
    for (ei, e) in g.edges.iter().enumerate() {
        let (up, down) = (g.nodes[e.from].parallelism, g.nodes[e.to].parallelism);
        let in_loop = g.edge_in_loop(ei);
        for u in 0..up {
            let targets: Vec<u32> = if e.partition == Partition::Forward { vec![u] } else { (0..down).collect() };
            let mut txs = Vec::with_capacity(targets.len());
            let mut backs = Vec::with_capacity(targets.len());
            for d in targets {
                // Back-edges are chosen per channel, as a DFS of the physical graph would
                // (ABS §3.3): every channel of a feedback edge between two operators, but of
                // a self-loop only the channels from subtask u to subtask d <= u. A self-loop
                // channel to a higher subtask is a regular input of its target, aligned and
                // parked like any other; otherwise a subtask could take a barrier on a
                // back-edge before its own snapshot and fold post-barrier records into it.
                let back = e.feedback && (e.from != e.to || d <= u);
                // A back-edge never blocks its sender, so a loop cannot deadlock under
                // backpressure; its backlog is bounded by the loop's work and reported.
                let (tx, rx) = if back { unbounded() } else { bounded(g.channel_capacity) };
                let file = match &g.nodes[e.from].kind {
                    NodeKind::Source(SourceKind::File { path, .. }) => Some(path.clone()),
                    _ => None,
                };
                let origin = Origin { node: g.nodes[e.from].id.to_string(), subtask: u, file };
                let budget = back.then(|| feedback_budget.clone());
                inputs[e.to][d as usize].push(InputChannel::new(rx, e.side).feedback(back).from(origin).budget(budget));
                backs.push(back);
                txs.push(tx);
            }
            let out = EdgeOutput::new(e.port, e.partition, txs, g.max_parallelism, u as usize)
                .in_loop(in_loop)
                .back_edges(backs, feedback_budget.clone());
            outputs[e.from][u as usize].push(out);
        }
    }
    let termination = g.is_cyclic().then(|| {
        let sources =
            g.nodes.iter().filter(|n| matches!(n.kind, NodeKind::Source(_))).map(|n| n.parallelism as usize).sum();
        Arc::new(LoopTermination::new(sources))
    });

    // Checkpointing plumbing.
    let (events_tx, events_rx) = unbounded::<Event>();
    let (writer_tx, writer_rx) = unbounded::<WriteMsg>();
    let mut controls = Vec::new();
    let mut task_templates = Vec::new();
    let node_templates: Vec<NodeTemplate> = g
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| NodeTemplate {
            uid: n.id.to_string(),
            kind: match n.kind {
                NodeKind::Source(_) => "source",
                NodeKind::Operator(_) => "operator",
                NodeKind::Sink(_) => "sink",
            },
            parallelism: n.parallelism,
            retired: retired.get(&i).cloned().unwrap_or_default(),
            component: live.lock().unwrap().get(&i).map(|(f, entry)| {
                let mut entry = entry.clone();
                // An upgraded component is stored with this job's checkpoints, so recovery
                // after a process restart finds it.
                if !entry.replaces.is_empty()
                    && let (Some(st), OperatorFactory::Wasm(c), Some(sha)) = (store, f, f.sha256())
                {
                    entry.stored = store_component(st.root(), sha, &c.bytes).ok();
                }
                entry
            }),
        })
        .collect();

    // Tasks.
    let mut tasks: Vec<(TaskId, Task)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if restore.is_none()
            && let NodeKind::Sink(SinkKind::File { path, .. }) = &n.kind
        {
            clear_parts(path).map_err(|e| setup(format!("sink `{}`: cannot clear {}: {e}", n.id, path.display())))?;
        }
        for s in (0..n.parallelism).rev() {
            let id = TaskId { node: n.id.clone(), subtask: SubtaskIndex(s) };
            let ins = Inputs::new(inputs[i].pop().unwrap_or_default());
            let out = Output::new(outputs[i].pop().unwrap_or_default(), g.batch_size, 256 * 1024)
                .with_backpressure(metrics[i].subtask(s));
            let (m, c) = (metrics[i].clone(), cancel.clone());
            let counters = m.subtask(s);
            let range = key_group_range(g.max_parallelism, n.parallelism, s);
            let restored = restored_state(i, s);
            let participant = if store.is_some() {
                let (tx, rx) = unbounded::<Control>();
                controls.push(tx);
                let index = task_templates.len();
                task_templates.push(TaskTemplate { node: i, subtask: s, key_groups: (range.start, range.end) });
                let incremental = g.checkpoint.as_ref().is_some_and(|c| c.incremental);
                Some(
                    Participant::new(index, format!("{}-{s}.state", n.id), rx, events_tx.clone(), writer_tx.clone())
                        .with_incremental(incremental),
                )
            } else {
                None
            };
            let task = match &n.kind {
                NodeKind::Source(kind) => {
                    let mut reader = match kind {
                        SourceKind::Generator(cfg) => SourceReader::Generator(Generator::new(*cfg, s, n.parallelism)),
                        SourceKind::Stdin => SourceReader::File(FileSource::stdin(s, n.parallelism)),
                        SourceKind::Nexmark(cfg) => SourceReader::Nexmark(NexmarkSource::new(*cfg, s, n.parallelism)),
                        SourceKind::File { path, key_column, rate, event_time } => SourceReader::File(
                            FileSource::open(path, s, n.parallelism, *key_column, *rate)
                                .map_err(|e| setup(format!("source `{}`: cannot open {}: {e}", n.id, path.display())))?
                                .with_event_time(*event_time),
                        ),
                        SourceKind::Kafka(cfg) => {
                            let offsets = match restored.as_ref().and_then(|st| st.source.as_ref()) {
                                Some(SourcePosition::Kafka { partitions }) => Some(&partitions[..]),
                                _ => None,
                            };
                            match KafkaReader::open(cfg, s, n.parallelism, offsets) {
                                Ok(r) => SourceReader::Kafka(Box::new(r)),
                                // Before the job starts: refused at once. At a restart: a
                                // failed attempt, retried by the restart strategy.
                                Err(e) if attempt == 0 => {
                                    return Err(setup(format!("source `{}` subtask {s}: {e}", n.id)));
                                }
                                Err(e) => return Ok(AttemptEnd::Failed(kafka_failure(&id, e))),
                            }
                        }
                    };
                    if let Some(pos) = restored.as_ref().and_then(|st| st.source.clone())
                        && !matches!(reader, SourceReader::Kafka(_))
                    {
                        reader.seek(pos).map_err(|e| setup(format!("source `{id}`: {e}")))?;
                    }
                    Task::Source(SourceTask {
                        id: id.clone(),
                        reader,
                        output: out,
                        batch_size: g.batch_size,
                        metrics: m,
                        counters,
                        cancel: c,
                        checkpoints: participant,
                        termination: termination.clone(),
                        suspend_after: None,
                        suspended: false,
                        faults: opts.faults.clone().map(|plan| Faults { plan, attempt }),
                        hold_input: opts.hold_input.clone(),
                    })
                }
                NodeKind::Operator(op) => {
                    let component = live.lock().unwrap()[&i].0.clone();
                    let info = TaskInfo {
                        job_name: g.name.clone(),
                        operator_uid: n.id.to_string(),
                        subtask_index: s,
                        parallelism: n.parallelism,
                        max_parallelism: g.max_parallelism,
                        key_group_start: range.start,
                        key_group_end: range.end,
                    };
                    let schema_version = restore
                        .and_then(|c| c.manifest.operator(n.id.as_str()))
                        .and_then(|o| o.component.as_ref())
                        .map_or(component.info().schema_version, |c| c.schema_version);
                    let restore = restored.map(|state| Restore { schema_version, state });
                    let config = op.config.clone();
                    let dead_letter = (op.on_error == crate::graph::logical::OnError::DeadLetter)
                        .then(|| component.info().side_outputs.len() as u32 + 1);
                    let limits = g.limits;
                    let quiet = opts.quiet_guests;
                    let faults = opts.faults.clone().map(|plan| Faults { plan, attempt });
                    let termination = termination.clone();
                    let id2 = id.clone();
                    Task::Operator(Box::new(move || {
                        let mut host =
                            HostState::new(info, component.info().side_outputs.len() as u32).with_limits(limits);
                        host.echo_logs = !quiet;
                        let instance = component
                            .instantiate(host)
                            .map_err(|e| TaskFailure::Guest { task: id2.clone(), source: e })?;
                        Ok(OperatorTask {
                            id: id2,
                            instance,
                            config,
                            inputs: ins,
                            output: out,
                            metrics: m,
                            counters,
                            cancel: c,
                            checkpoints: participant,
                            restore,
                            schema_version: component.info().schema_version,
                            faults,
                            termination,
                            deferred: Default::default(),
                            draining: None,
                            ledger: crate::checkpoint::evidence::GroupLedger::new(range.start, range.end),
                            upgrade: None,
                            dead_letter,
                        })
                    }))
                }
                NodeKind::Sink(kind) => {
                    let writer = match kind {
                        SinkKind::File { path, format } => {
                            let st = restored.as_ref().and_then(|st| st.sink.clone());
                            let adopted = restored.as_ref().map(|st| st.adopted_sinks.clone()).unwrap_or_default();
                            SinkWriter::File(
                                FileSink::open_adopting(path, s, *format, st.as_ref(), &adopted)
                                    .map_err(|e| {
                                        setup(format!("sink `{id}`: cannot write to {}: {e}", path.display()))
                                    })?
                                    .with_budget(opts.disk_budget.clone()),
                            )
                        }
                        SinkKind::Stdout { format } => SinkWriter::Stdout(*format),
                        SinkKind::Postgres(target) => {
                            let st = restored.as_ref().and_then(|st| st.sink.clone());
                            let adopted = restored.as_ref().map(|st| st.adopted_sinks.clone()).unwrap_or_default();
                            let opening = crate::connectors::postgres_sink::Opening {
                                subtask: s,
                                parallelism: n.parallelism,
                                restored: st.as_ref(),
                                adopted: &adopted,
                                checkpoint_interval: g
                                    .checkpoint
                                    .as_ref()
                                    .map(|c| Duration::from_millis(c.settings.interval_ms)),
                            };
                            match crate::connectors::postgres_sink::PostgresSink::open(target, opening) {
                                Ok(sink) => SinkWriter::Postgres(Box::new(sink)),
                                // Before the job starts: refused at once. At a restart: a
                                // failed attempt, retried by the restart strategy.
                                Err(e) if attempt == 0 => {
                                    return Err(setup(format!("sink `{}` subtask {s}: {e}", n.id)));
                                }
                                Err(e) => return Ok(AttemptEnd::Failed(crate::runtime::sink::pg_failure(&id, e))),
                            }
                        }
                        SinkKind::Kafka(target) => {
                            let blob = restored.as_ref().map(|st| &st.operator_state[..]);
                            let adopted = restored.as_ref().map(|st| st.adopted_blobs.clone()).unwrap_or_default();
                            let opening = KafkaOpening { subtask: s, restored: blob, adopted: &adopted };
                            match KafkaSink::open(target, opening) {
                                Ok(sink) => SinkWriter::Kafka(Box::new(sink)),
                                Err(e) if attempt == 0 => {
                                    return Err(setup(format!("sink `{}` subtask {s}: {e}", n.id)));
                                }
                                Err(e) => return Ok(AttemptEnd::Failed(kafka_failure(&id, e))),
                            }
                        }
                        SinkKind::Blackhole { latency } => {
                            SinkWriter::Blackhole(latency.then(|| LatencyRecorder::new(LATENCY_WARMUP_MS)))
                        }
                    };
                    Task::Sink(SinkTask {
                        id: id.clone(),
                        writer,
                        inputs: ins,
                        metrics: m,
                        counters,
                        cancel: c,
                        checkpoints: participant,
                        termination: termination.clone(),
                        aborted_early: Vec::new(),
                    })
                }
            };
            tasks.push((id, task));
        }
    }
    drop(writer_tx);

    // Coordinator and writer threads.
    let stop = Arc::new(AtomicBool::new(false));
    let (coordinator, writer) = match store {
        Some(store) => {
            let cfg = g.checkpoint.as_ref().unwrap();
            let dcfg = DriverConfig {
                job: g.name.clone(),
                max_parallelism: g.max_parallelism,
                settings: cfg.settings,
                nodes: node_templates,
                tasks: task_templates,
                // Ids grow past the restored checkpoint's too (a savepoint restored into another
                // directory): a Kafka sink's commit markers rely on ids only increasing.
                first_id: store.max_id().max(restore.map_or(0, |c| c.manifest.checkpoint_id)).saturating_add(1),
                verbose: opts.progress.is_some(),
                requests: opts.endpoint.as_ref().map(|e| e.requests.clone()),
                graph: Arc::new(g.clone()),
                live: live.clone(),
                status: opts.endpoint.as_ref().map(|e| e.status.clone()),
            };
            let (st, st2, stop2, done) = (store.clone(), store.clone(), stop.clone(), completed.clone());
            let ev = events_tx.clone();
            let budget = opts.disk_budget.clone();
            let w = std::thread::Builder::new()
                .name("checkpoint-writer".into())
                .spawn(move || writer::run(st2, writer_rx, ev, budget))
                .map_err(|e| setup(format!("cannot start a thread: {e}")))?;
            let c = std::thread::Builder::new()
                .name("checkpoint-coordinator".into())
                .spawn(move || driver::run(dcfg, st, controls, events_rx, stop2, done))
                .map_err(|e| setup(format!("cannot start a thread: {e}")))?;
            (Some(c), Some(w))
        }
        None => (None, None),
    };
    drop(events_tx);

    // Run.
    let failures: Arc<Mutex<Vec<TaskFailure>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let tasks_done = Arc::new(AtomicBool::new(false));
    let watcher = opts.endpoint.clone().map(|e| {
        *e.metrics.lock().unwrap() = metrics.clone();
        let (cancel, stop, tasks_done) = (cancel.clone(), stop.clone(), tasks_done.clone());
        let serves_requests = store.is_some();
        let job_name = g.name.clone();
        std::thread::spawn(move || watch(e, cancel, stop, tasks_done, serves_requests, job_name))
    });
    let progress = opts.progress.map(|every| {
        let (metrics, done) = (metrics.clone(), done.clone());
        let ids: Vec<NodeId> = g.nodes.iter().map(|n| n.id.clone()).collect();
        std::thread::spawn(move || report_progress(&ids, &metrics, &done, every))
    });
    let mut handles = Vec::new();
    for (id, task) in tasks {
        let (failures, cancel, stop) = (failures.clone(), cancel.clone(), stop.clone());
        let cpu_group = opts.cpu_group.clone();
        let h = std::thread::Builder::new()
            .name(id.to_string())
            .spawn(move || {
                if let Some(g) = cpu_group
                    && let Err(e) = g.join_current_thread()
                {
                    tracing::warn!(subtask = %id, "subtask {id} runs outside its tenant's CPU share: {e}");
                }
                if nice > 0 {
                    priority::demote_current_thread(nice);
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match task {
                    Task::Source(t) => t.run(),
                    Task::Operator(make) => make().and_then(|t| t.run()),
                    Task::Sink(t) => t.run(),
                }));
                let r = r.unwrap_or_else(|p| {
                    let message = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    Err(TaskFailure::Panicked { task: id.clone(), message })
                });
                if let Err(f) = r {
                    cancel.store(true, Ordering::Relaxed);
                    stop.store(true, Ordering::Relaxed);
                    failures.lock().unwrap().push(f);
                }
            })
            .map_err(|e| setup(format!("cannot start a thread: {e}")))?;
        handles.push(h);
    }
    for h in handles {
        let _ = h.join();
    }
    tasks_done.store(true, Ordering::Relaxed);
    if let Some(w) = watcher {
        let _ = w.join();
    }
    stop.store(true, Ordering::Relaxed);
    let coordinator_end = coordinator.map(|c| c.join());
    if let Some(w) = writer {
        let _ = w.join();
    }
    done.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        let _ = p.join();
    }
    let mut failures = std::mem::take(&mut *failures.lock().unwrap());
    let coordinator_end = match coordinator_end {
        Some(Ok(DriverEnd::StoppedWithSavepoint { info, reply })) => Some((info, reply)),
        other => {
            if let Some(Ok(DriverEnd::Stopped)) = other
                && failures.is_empty()
            {
                return Err(setup("the checkpoint coordinator stopped before the job's final checkpoint".into()));
            }
            None
        }
    };
    if let Some((info, reply)) = coordinator_end {
        // The savepoint is complete and its output committed before `Stop` went out; what
        // subtasks ran into while exiting (a neighbour gone first) does not undo that.
        for f in failures.iter().filter(|f| !f.is_secondary()) {
            tracing::warn!(job = %g.name, "while stopping: {f}");
        }
        tracing::info!(job = %g.name, "job `{}` stopped with savepoint {}", g.name, info.path.display());
        let _ = reply.send(Ok(info.clone()));
        return Ok(AttemptEnd::Stopped(summaries(g, &metrics), info));
    }
    if !failures.is_empty() {
        let root = failures.iter().position(|f| !f.is_secondary()).unwrap_or(0);
        return Ok(AttemptEnd::Failed(failures.swap_remove(root)));
    }
    Ok(AttemptEnd::Done(summaries(g, &metrics)))
}

/// Per attempt: turns a user's cancel into the attempt's cancel, and answers requests that
/// need checkpointing when the job has none.
fn watch(
    e: Endpoint,
    cancel: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    tasks_done: Arc<AtomicBool>,
    serves_requests: bool,
    job: String,
) {
    while !tasks_done.load(Ordering::Relaxed) {
        if e.cancel.load(Ordering::Relaxed) {
            cancel.store(true, Ordering::Relaxed);
            stop.store(true, Ordering::Relaxed);
        }
        if !serves_requests {
            while let Ok(r) = e.requests.try_recv() {
                let why = format!(
                    "job `{job}` has no [checkpoint] section; savepoints, live upgrades and state queries go \
                     through the checkpoint coordinator, so add [checkpoint] dir (and interval_ms) to the job file"
                );
                match r {
                    Request::Savepoint { reply, .. } => drop(reply.send(Err(why))),
                    Request::Upgrade { reply, .. } => drop(reply.send(Err(why))),
                    Request::Query { reply, .. } => drop(reply.send(Err(why))),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn summaries(g: &crate::graph::logical::JobGraph, metrics: &[Arc<NodeMetrics>]) -> Vec<NodeSummary> {
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
            }
        })
        .collect()
}

fn report_progress(ids: &[NodeId], metrics: &[Arc<NodeMetrics>], done: &AtomicBool, every: Duration) {
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
