//! The coordinator's thin shell: a thread that feeds the pure [`Coordinator`] with time and
//! subtask events and carries out its decisions (send triggers, publish manifests, notify
//! completion and aborts, apply retention, record metrics).
//!
//! It also serves the job handle's requests, which are checkpoints with a purpose: a
//! savepoint is a forced checkpoint copied out into a self-contained directory (and, for a
//! stop, sources suspend after its barrier and every subtask exits once it is committed); a
//! live upgrade is a forced checkpoint at whose barrier the operator's subtasks move their
//! state into the new component, switching only if all of them succeed
//! (`checkpoint/upgrade.rs`).
//!
//! Invariants: `Complete(id)` is sent only after the manifest of `id` is durable; the job's
//! end is a checkpoint too: once every subtask has finished, a final checkpoint is forced,
//! and only when it is complete are subtasks told to commit and shut down; every request is
//! answered exactly once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::checkpoint::coordinator::{AckOutcome, Coordinator, TriggerDecision};
use crate::checkpoint::metadata::{
    CheckpointMetrics, ComponentEntry, Manifest, OperatorEntry, SubtaskEntry, SubtaskTiming, format_version_for,
};
use crate::checkpoint::remote_savepoint;
use crate::checkpoint::storage::{CheckpointStore, export_savepoint};
use crate::checkpoint::upgrade::{Outcome, UpgradeRound};
use crate::graph::logical::CheckpointSettings;
use crate::graph::logical::JobGraph;
use crate::ids::CheckpointId;
use crate::operator::OperatorFactory;
use crate::runtime::control::{Ack, Control, Controls, Event};
use crate::runtime::handle::{CheckpointFailure, FAILURES_KEPT, JobStatus, Request, SavepointInfo, UpgradeInfo};
use crate::runtime::query::{QueryAnswer, StateQuery, resolve_state};
use crate::runtime::upgrade;

/// A node as the manifest records it.
#[derive(Debug, Clone)]
pub struct NodeTemplate {
    /// Uid.
    pub uid: String,
    /// `source`, `operator`, `sink`.
    pub kind: &'static str,
    /// Parallelism.
    pub parallelism: u32,
    /// Component (operators).
    pub component: Option<ComponentEntry>,
    /// File sinks: subtask indices retired by a rescale, with their next part.
    pub retired: Vec<(u32, u64)>,
}

/// A subtask as the coordinator knows it.
#[derive(Debug, Clone)]
pub struct TaskTemplate {
    /// Index into the node templates.
    pub node: usize,
    /// Subtask index.
    pub subtask: u32,
    /// Key groups `[start, end)`.
    pub key_groups: (u32, u32),
}

/// What a cluster's leader records in etcd as the job goes (see `cluster/ha.rs`).
#[derive(Clone)]
pub struct PublishGate {
    /// Called once a checkpoint's manifest is published and before any subtask hears that
    /// it is complete (so before sinks commit and retention removes older checkpoints), with
    /// the checkpoint's durable path. An error leaves the checkpoint incomplete: the leader
    /// records its newest checkpoint here, and a deposed one is stopped here.
    pub publish: Arc<GateFn>,
    /// Called once a stop's savepoint is written and committed, before the subtasks are told
    /// to stop and the stop is confirmed: the leader records that the job is over, so no
    /// later leader resumes it (a leader that cannot record it exits instead, and the stop
    /// is not confirmed).
    pub stopped: Arc<dyn Fn() + Send + Sync>,
}

/// What a [`PublishGate`] calls: the checkpoint and its durable path.
pub type GateFn = dyn Fn(CheckpointId, &std::path::Path) -> Result<(), String> + Send + Sync;

impl PublishGate {
    /// A gate that hands each published checkpoint's path to `record` (which returns only
    /// once it is recorded, or ends the process) and calls `stopped` at a stop.
    pub fn recording(
        record: impl Fn(&std::path::Path) + Send + Sync + 'static,
        stopped: impl Fn() + Send + Sync + 'static,
    ) -> PublishGate {
        PublishGate {
            publish: Arc::new(move |_, path: &std::path::Path| {
                record(path);
                Ok(())
            }),
            stopped: Arc::new(stopped),
        }
    }
}

impl std::fmt::Debug for PublishGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PublishGate")
    }
}

/// Everything the coordinator thread needs.
pub struct DriverConfig {
    /// Job name.
    pub job: String,
    /// Key groups.
    pub max_parallelism: u32,
    /// Settings.
    pub settings: CheckpointSettings,
    /// Nodes.
    pub nodes: Vec<NodeTemplate>,
    /// Subtasks, by global task index.
    pub tasks: Vec<TaskTemplate>,
    /// First checkpoint id to use.
    pub first_id: u64,
    /// Print a line per completed checkpoint.
    pub verbose: bool,
    /// Requests from the job's handle (savepoints, upgrades).
    pub requests: Option<Receiver<Request>>,
    /// The job (to check upgrades against).
    pub graph: Arc<JobGraph>,
    /// The running component of every operator node; a committed upgrade replaces it here,
    /// so later restarts run the new version.
    pub live: Arc<Mutex<BTreeMap<usize, (OperatorFactory, ComponentEntry)>>>,
    /// The status the handle reads.
    pub status: Option<Arc<Mutex<JobStatus>>>,
    /// Consulted between publishing a checkpoint and announcing it.
    pub gate: Option<PublishGate>,
}

/// How the coordinator thread ended.
pub enum DriverEnd {
    /// The job finished and its final checkpoint `0` is complete.
    Finished(CheckpointId),
    /// Stopped from outside (a failure or cancellation).
    Stopped,
    /// Stopped with a savepoint: the subtasks were told to stop; reply once they have.
    StoppedWithSavepoint {
        /// The savepoint.
        info: SavepointInfo,
        /// Where to reply.
        reply: Sender<Result<SavepointInfo, String>>,
    },
}

/// Completed checkpoints of this run, shared with the executor (restart needs the latest).
#[derive(Debug, Default)]
pub struct Completed {
    /// Number completed.
    pub count: std::sync::atomic::AtomicU64,
    /// The newest ids completed (at most [`Completed::KEPT`]), oldest first.
    ids: std::sync::Mutex<std::collections::VecDeque<u64>>,
}

impl Completed {
    /// How many of the newest completed ids are remembered.
    pub const KEPT: usize = 16;

    /// Checkpoint `id` completed: published, and recorded where a gate asks for it.
    pub fn record(&self, id: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.push_back(id);
        while ids.len() > Self::KEPT {
            ids.pop_front();
        }
    }

    /// The newest ids this run completed, oldest first.
    pub fn ids(&self) -> Vec<u64> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect()
    }
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

struct PendingSavepoint {
    dir: Option<PathBuf>,
    stop: bool,
    reply: Sender<Result<SavepointInfo, String>>,
    id: Option<CheckpointId>,
    started: Instant,
}

struct PendingUpgrade {
    node: usize,
    factory: OperatorFactory,
    old: OperatorFactory,
    migrated_from: Option<u32>,
    reply: Sender<Result<UpgradeInfo, String>>,
    id: Option<CheckpointId>,
    round: UpgradeRound,
    tasks: Vec<usize>,
    state_bytes: u64,
}

/// Counts a failed checkpoint in the job's status, with its reason.
fn record_failure(cfg: &DriverConfig, id: CheckpointId, reason: &str) {
    if let Some(st) = &cfg.status {
        let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
        st.checkpoints_failed += 1;
        st.last_checkpoint_failure = Some(format!("checkpoint {id}: {reason}"));
        if st.checkpoint_failures.len() >= FAILURES_KEPT {
            st.checkpoint_failures.remove(0);
        }
        st.checkpoint_failures.push(CheckpointFailure { id: id.0, reason: reason.to_string(), unix_ms: unix_ms() });
    }
}

/// Runs the coordinator until the job's final checkpoint completes or `stop` is set.
pub fn run(
    mut cfg: DriverConfig,
    store: CheckpointStore,
    controls: Controls,
    events: Receiver<Event>,
    stop: Arc<AtomicBool>,
    completed: Arc<Completed>,
) -> DriverEnd {
    let start = Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let mut coord: Coordinator<Ack> = Coordinator::new(cfg.settings, cfg.tasks.len(), cfg.first_id);
    let mut finished = vec![false; cfg.tasks.len()];
    let mut final_id: Option<CheckpointId> = None;
    // A failed final checkpoint is tried again after an interval, not at once (a store that
    // refuses in microseconds must not make the coordinator spin).
    let mut final_retry_at = 0u64;
    let mut inbox: Option<Request> = None;
    let mut trigger_unix = std::collections::BTreeMap::new();
    let tasks = cfg.tasks.len();
    let broadcast = |c: Control| {
        for t in 0..tasks {
            controls.send(t, c.clone());
        }
    };
    let send_to = |tasks: &[usize], c: Control| {
        for &t in tasks {
            controls.send(t, c.clone());
        }
    };
    let mut savepoint: Option<PendingSavepoint> = None;
    let mut upgrade: Option<PendingUpgrade> = None;
    // The last committed upgrade: manifests of its checkpoint record the old schema (the old
    // instance wrote the state), manifests of older checkpoints the old component.
    let mut committed: Option<CommittedUpgrade> = None;
    let mut next_poll = 0u64;
    loop {
        if stop.load(Ordering::Relaxed) {
            coord.abort_all();
            return DriverEnd::Stopped;
        }
        if let Some(outcome) = upgrade.as_ref().and_then(|u| u.round.outcome()) {
            let u = upgrade.take().unwrap();
            finish_upgrade(&cfg, u, outcome);
        }
        let all_finished = finished.iter().all(|f| *f);
        // Requests from the job's handle.
        while let Some(req) = inbox.take().or_else(|| cfg.requests.as_ref().and_then(|r| r.try_recv().ok())) {
            match req {
                Request::Query { uid, key, state, reply } => route_query(&cfg, &controls, uid, key, state, reply),
                Request::Savepoint { dir, stop, reply } => {
                    if savepoint.is_some() {
                        let _ = reply.send(Err("a savepoint is already in progress; retry when it completes".into()));
                    } else if all_finished || final_id.is_some() {
                        let _ = reply.send(Err("the job is finishing: its sources are exhausted".into()));
                    } else {
                        savepoint = Some(PendingSavepoint { dir, stop, reply, id: None, started: Instant::now() });
                    }
                }
                Request::Upgrade { uid, factory, reply } => {
                    if upgrade.is_some() {
                        let _ = reply.send(Err("an upgrade is already in progress; retry when it completes".into()));
                        continue;
                    }
                    let Some(ni) = cfg.graph.node_index(&uid) else {
                        let _ = reply.send(Err(format!("job `{}` has no operator `{uid}`", cfg.job)));
                        continue;
                    };
                    if cfg.graph.checkpoint.as_ref().is_some_and(|c| c.alignment.overtakes()) {
                        let _ = reply.send(Err(format!(
                            "job `{}` takes unaligned checkpoints (or switches to them after alignment_timeout_ms), \
                             and live upgrades need aligned ones: stop the job with a savepoint and start the new \
                             version from it (or set [checkpoint] alignment = \"aligned\" without a timeout)",
                            cfg.job
                        )));
                        continue;
                    }
                    let Some((old, _)) = cfg.live.lock().unwrap().get(&ni).cloned() else {
                        let _ = reply
                            .send(Err(format!("`{uid}` is a source or sink; only WASM operators can be upgraded")));
                        continue;
                    };
                    let verdict = match upgrade::validate(&cfg.graph, &uid, &old, &factory) {
                        Ok((_, v)) => v,
                        Err(e) => {
                            let _ = reply.send(Err(e));
                            continue;
                        }
                    };
                    let tasks: Vec<usize> =
                        cfg.tasks.iter().enumerate().filter(|(_, t)| t.node == ni).map(|(i, _)| i).collect();
                    if tasks.iter().any(|t| finished[*t]) {
                        let _ = reply.send(Err(format!("operator `{uid}` has finished its input; nothing to upgrade")));
                        continue;
                    }
                    upgrade = Some(PendingUpgrade {
                        node: ni,
                        old,
                        factory,
                        migrated_from: verdict.migrates_from,
                        reply,
                        id: None,
                        round: UpgradeRound::new(tasks.clone()),
                        tasks,
                        state_bytes: 0,
                    });
                }
            }
        }
        let wants_barrier =
            savepoint.as_ref().is_some_and(|s| s.id.is_none()) || upgrade.as_ref().is_some_and(|u| u.id.is_none());
        if now() >= next_poll || (all_finished && final_id.is_none() && now() >= final_retry_at) || wants_barrier {
            match coord.poll_trigger(now(), all_finished || wants_barrier) {
                TriggerDecision::Trigger(id) => {
                    if all_finished {
                        final_id = Some(id);
                    }
                    if let Some(sp) = savepoint.as_mut().filter(|s| s.id.is_none()) {
                        sp.id = Some(id);
                        broadcast(Control::FullSnapshot(id));
                        if sp.stop {
                            broadcast(Control::SuspendAfter(id));
                        }
                    }
                    if let Some(u) = upgrade.as_mut().filter(|u| u.id.is_none()) {
                        u.id = Some(id);
                        // No operator's snapshot is forced full here: the upgraded one's subtasks
                        // force theirs at the barrier when the new instances restore from it
                        // (`task/upgrade.rs`); every other operator's chain goes on.
                        send_to(&u.tasks, Control::PrepareUpgrade { id, factory: u.factory.clone() });
                    }
                    trigger_unix.insert(id, unix_ms());
                    broadcast(Control::Trigger(id));
                    next_poll = now() + cfg.settings.interval_ms;
                }
                TriggerDecision::Wait { at } => next_poll = at,
                TriggerDecision::Busy => next_poll = now() + 10,
            }
        }
        let mut aborted: Vec<(CheckpointId, String)> = Vec::new();
        for id in coord.on_tick(now()) {
            if cfg.verbose {
                tracing::warn!(job = %cfg.job, checkpoint = id.0, "checkpoint {id} aborted: not complete within {} ms", cfg.settings.timeout_ms);
            }
            if final_id == Some(id) {
                final_id = None;
                final_retry_at = now() + cfg.settings.interval_ms;
            }
            broadcast(Control::Abort(id));
            let reason = format!("not complete within {} ms", cfg.settings.timeout_ms);
            record_failure(&cfg, id, &reason);
            aborted.push((id, reason));
        }
        // Before any event: an upgrade must not commit on a checkpoint that just timed out.
        fail_requests(&mut savepoint, &mut upgrade, &aborted, &send_to);
        aborted.clear();
        let wait = next_poll.saturating_sub(now()).clamp(1, 50);
        // Wakes for a request too (a state query should not wait for the next tick).
        let event = match next_event(&events, cfg.requests.as_ref(), Duration::from_millis(wait), &mut inbox) {
            Ok(e) => e,
            Err(Disconnected) => return DriverEnd::Stopped,
        };
        match event {
            None => {}
            Some(Event::Finished { task }) => finished[task] = true,
            Some(Event::UpgradePrepared { task, id, result, state_bytes }) => {
                if let Some(u) = upgrade.as_mut().filter(|u| u.id == Some(id)) {
                    u.state_bytes += state_bytes;
                }
                let still_pending = coord.pending().contains(&id);
                if let Some(u) = upgrade.as_mut().filter(|u| u.id == Some(id)) {
                    let decision = if still_pending {
                        u.round.on_prepared(task, result)
                    } else {
                        u.round.on_abort(&format!("checkpoint {id} was aborted"))
                    };
                    if let Some(d) = decision {
                        if d.commit {
                            committed = Some(commit_upgrade(&mut cfg, &store, u, id));
                        }
                        send_to(&u.tasks, Control::UpgradeDecision { id, commit: d.commit });
                    }
                }
            }
            Some(Event::UpgradeResumed { task, id, committed: switched, pause_ms }) => {
                if let Some(u) = upgrade.as_mut().filter(|u| u.id == Some(id)) {
                    // The round's end is handled at the top of the loop.
                    let _ = u.round.on_resumed(task, switched, pause_ms);
                }
            }
            Some(Event::Decline { task, id, reason }) => {
                let aborted_now = coord.on_decline(id, now());
                if aborted_now {
                    let t = &cfg.tasks[task];
                    if cfg.verbose {
                        tracing::warn!(job = %cfg.job, checkpoint = id.0, "checkpoint {id} declined by {}#{}: {reason}", cfg.nodes[t.node].uid, t.subtask);
                    }
                    if final_id == Some(id) {
                        final_id = None;
                        final_retry_at = now() + cfg.settings.interval_ms;
                    }
                    broadcast(Control::Abort(id));
                    let reason = format!("declined by {}#{}: {reason}", cfg.nodes[t.node].uid, t.subtask);
                    record_failure(&cfg, id, &reason);
                    aborted.push((id, reason));
                }
            }
            Some(Event::Ack { task, id, ack }) => {
                if let AckOutcome::Complete { id, triggered_at, acks, subsumed } = coord.on_ack(task, id, ack, now()) {
                    for s in subsumed {
                        broadcast(Control::Abort(s));
                        aborted.push((s, format!("subsumed by checkpoint {id}")));
                    }
                    // Every prepared report precedes its ack, so an undecided upgrade here
                    // means a subtask finished instead of preparing: roll back.
                    if let Some(u) = upgrade.as_mut().filter(|u| u.id == Some(id))
                        && let Some(d) =
                            u.round.on_abort("a subtask of the operator finished its input during the upgrade")
                    {
                        send_to(&u.tasks, Control::UpgradeDecision { id, commit: d.commit });
                    }
                    let is_final = final_id == Some(id);
                    let metrics = CheckpointMetrics {
                        id: id.0,
                        trigger_unix_ms: trigger_unix.remove(&id).unwrap_or(0),
                        duration_ms: (now() - triggered_at) as f64,
                        sync_ms_max: acks.values().map(|a| a.timing.sync_ms).fold(0.0, f64::max),
                        async_ms_max: acks.values().map(|a| a.timing.async_ms).fold(0.0, f64::max),
                        alignment_ms_max: acks.values().map(|a| a.timing.align_ms).fold(0.0, f64::max),
                        bytes: acks.values().map(|a| a.bytes).sum(),
                        backedge_log_records: acks.values().map(|a| a.logged_records).sum(),
                        backedge_log_bytes: acks.values().map(|a| a.logged_bytes).sum(),
                        upgrade: committed.as_ref().filter(|c| c.at == id).map(|c| c.what.clone()),
                    };
                    let mut operators: Vec<OperatorEntry> = cfg
                        .nodes
                        .iter()
                        .enumerate()
                        .map(|(ni, n)| OperatorEntry {
                            uid: n.uid.clone(),
                            kind: n.kind.to_string(),
                            parallelism: n.parallelism,
                            component: match committed.as_ref().filter(|c| c.node == ni) {
                                Some(c) if id < c.at => c.old_entry.clone(),
                                Some(c) if id == c.at => n.component.clone().map(|mut e| {
                                    e.schema_version = c.old_schema;
                                    e
                                }),
                                _ => n.component.clone(),
                            },
                            subtasks: Vec::new(),
                            retired: n.retired.clone(),
                        })
                        .collect();
                    for (task, a) in &acks {
                        // acks are keyed by global task index, which follows node order
                        let t = &cfg.tasks[*task];
                        operators[t.node].subtasks.push(SubtaskEntry {
                            index: t.subtask,
                            file: a.file.clone(),
                            bytes: a.bytes,
                            crc32: a.crc32,
                            key_groups: t.key_groups,
                            chain: a.chain.clone(),
                            timing: Some(SubtaskTiming {
                                align_ms: a.timing.align_ms,
                                sync_ms: a.timing.sync_ms,
                                async_ms: a.timing.async_ms,
                            }),
                        });
                    }
                    for op in &mut operators {
                        op.subtasks.sort_by_key(|s| s.index);
                    }
                    let mut manifest = Manifest {
                        format_version: format_version_for(&operators),
                        kind: Default::default(),
                        job: cfg.job.clone(),
                        checkpoint_id: id.0,
                        created_unix_ms: unix_ms(),
                        finished: is_final,
                        max_parallelism: cfg.max_parallelism,
                        operators,
                        metrics,
                    };
                    // Published only once its files are on disk as the writer reported them, so
                    // retention can never leave the job with nothing that restores.
                    let published = store
                        .verify_files(&manifest)
                        .map_err(|e| format!("its files do not verify: {e}"))
                        .and_then(|()| {
                            store.publish(&manifest).map_err(|e| format!("publishing the manifest failed: {e}"))
                        })
                        .and_then(|bytes| match &cfg.gate {
                            Some(g) => (g.publish)(id, &store.durable_path(id))
                                .map(|()| bytes)
                                .map_err(|e| format!("recording it as the newest checkpoint failed: {e}")),
                            None => Ok(bytes),
                        });
                    match published {
                        Ok(bytes) => manifest.metrics.bytes += bytes,
                        Err(e) => {
                            tracing::warn!(job = %cfg.job, checkpoint = id.0, "checkpoint {id}: {e}; the checkpoint is not complete, older ones are kept");
                            if is_final {
                                final_id = None;
                                final_retry_at = now() + cfg.settings.interval_ms;
                            }
                            broadcast(Control::Abort(id));
                            aborted.push((id, e));
                            fail_requests(&mut savepoint, &mut upgrade, &aborted, &send_to);
                            continue;
                        }
                    }
                    manifest.metrics.duration_ms = (now() - triggered_at) as f64;
                    // History first: whoever sees the count rise (status, /metrics) finds the
                    // checkpoint's metrics there.
                    let _ = store.append_history(&manifest.metrics);
                    completed.record(id.0);
                    if let Some(st) = &cfg.status {
                        let mut st = st.lock().unwrap();
                        st.checkpoints += 1;
                        st.last_checkpoint = Some(id.0);
                    }
                    // The savepoint is copied out before retention can remove its checkpoint.
                    let mut stopping = None;
                    if let Some(sp) = savepoint.take_if(|s| s.id == Some(id)) {
                        let dir = sp.dir.clone().unwrap_or_else(|| match store.remote() {
                            Some(r) => PathBuf::from(format!("{}/savepoints/sp-{id}", r.url())),
                            None => store.root().join("savepoints").join(format!("sp-{id}")),
                        });
                        let exported =
                            store.local_copy(id).map_err(|e| std::io::Error::other(e.to_string())).and_then(|chk| {
                                match dir.to_str().filter(|_| remote_savepoint::is_url(&dir)) {
                                    Some(url) => {
                                        let scratch = store.root().join(format!(".savepoint-{id}"));
                                        remote_savepoint::export(&chk, &manifest, url, &scratch)
                                    }
                                    None => export_savepoint(&chk, &manifest, &dir),
                                }
                            });
                        match exported {
                            Ok(bytes) => {
                                let info = SavepointInfo {
                                    path: dir.clone(),
                                    checkpoint_id: id.0,
                                    bytes,
                                    duration_ms: sp.started.elapsed().as_secs_f64() * 1e3,
                                };
                                if cfg.verbose {
                                    tracing::info!(job = %cfg.job, checkpoint = id.0, "savepoint {} written ({} bytes)", dir.display(), bytes);
                                }
                                if sp.stop {
                                    stopping = Some((info, sp.reply));
                                } else {
                                    let _ = sp.reply.send(Ok(info));
                                }
                            }
                            Err(e) => {
                                let _ = sp.reply.send(Err(format!("writing savepoint {} failed: {e}", dir.display())));
                                if sp.stop {
                                    // Sources suspended after this barrier: let them go on.
                                    broadcast(Control::Abort(id));
                                }
                            }
                        }
                    }
                    if let Err(e) = store.retain(cfg.settings.retained) {
                        tracing::warn!(job = %cfg.job, checkpoint = id.0, "checkpoint {id}: removing old checkpoints failed: {e}");
                    }
                    if cfg.verbose {
                        let m = &manifest.metrics;
                        tracing::info!(
                            job = %cfg.job,
                            checkpoint = id.0,
                            "checkpoint {id} complete{} in {:.1} ms (sync max {:.2} ms, async max {:.2} ms, alignment max {:.2} ms, {} bytes{})",
                            if is_final { " (final)" } else { "" },
                            m.duration_ms,
                            m.sync_ms_max,
                            m.async_ms_max,
                            m.alignment_ms_max,
                            m.bytes,
                            if m.backedge_log_records > 0 {
                                format!(", {} back-edge records logged", m.backedge_log_records)
                            } else {
                                String::new()
                            }
                        );
                    }
                    broadcast(Control::Complete(id));
                    if let Some((info, reply)) = stopping {
                        if let Some(g) = &cfg.gate {
                            (g.stopped)();
                        }
                        broadcast(Control::Stop);
                        return DriverEnd::StoppedWithSavepoint { info, reply };
                    }
                    if is_final {
                        broadcast(Control::Shutdown);
                        return DriverEnd::Finished(id);
                    }
                }
            }
        }
        fail_requests(&mut savepoint, &mut upgrade, &aborted, &send_to);
    }
}

/// Answers the savepoint or upgrade whose checkpoint was aborted.
/// Waits up to `wait` for the next event or request; a request goes to `inbox` (answered at
/// the top of the loop) and yields no event. `Err` when the subtasks are all gone.
fn next_event(
    events: &Receiver<Event>,
    requests: Option<&Receiver<Request>>,
    wait: Duration,
    inbox: &mut Option<Request>,
) -> Result<Option<Event>, Disconnected> {
    let only_events = || match events.recv_timeout(wait) {
        Ok(e) => Ok(Some(e)),
        Err(RecvTimeoutError::Timeout) => Ok(None),
        Err(RecvTimeoutError::Disconnected) => Err(Disconnected),
    };
    let Some(requests) = requests.filter(|_| inbox.is_none()) else { return only_events() };
    crossbeam_channel::select! {
        recv(events) -> e => e.map(Some).map_err(|_| Disconnected),
        recv(requests) -> r => match r {
            Ok(r) => {
                *inbox = Some(r);
                Ok(None)
            }
            // The handle is gone: no more requests, wait for events alone.
            Err(_) => only_events(),
        },
        default(wait) => Ok(None),
    }
}

/// The channel of subtask events is closed.
#[derive(Debug)]
struct Disconnected;

/// Hands a live state query to the subtask that owns the key's group (which replies
/// itself), or answers at once why it cannot be asked.
fn route_query(
    cfg: &DriverConfig,
    controls: &Controls,
    uid: String,
    key: Vec<u8>,
    state: Option<String>,
    reply: Sender<Result<QueryAnswer, String>>,
) {
    let fail = |e: String| {
        let _ = reply.send(Err(e));
    };
    let Some(ni) = cfg.graph.node_index(&uid) else {
        return fail(format!("job `{}` has no operator `{uid}`", cfg.job));
    };
    let Some((_, entry)) = cfg.live.lock().unwrap_or_else(|p| p.into_inner()).get(&ni).cloned() else {
        return fail(format!("`{uid}` is a source or sink; only WASM operators keep state that can be queried"));
    };
    let declared: Vec<(String, bool)> = entry.states.iter().map(|s| (s.name.clone(), s.keyed)).collect();
    let state = match resolve_state(&uid, &declared, state.as_deref()) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let kg = crate::keygroup::key_group(&key, cfg.max_parallelism);
    let Some((task, t)) =
        cfg.tasks.iter().enumerate().find(|(_, t)| t.node == ni && (t.key_groups.0..t.key_groups.1).contains(&kg))
    else {
        return fail(format!("no subtask of `{uid}` owns key group {kg}"));
    };
    // A subtask whose input ended still answers, from its final state, until the job ends.
    let q = StateQuery { operator: uid, subtask: t.subtask, state, key_group: kg, key, reply };
    controls.send(task, Control::Query(q));
}

fn fail_requests(
    savepoint: &mut Option<PendingSavepoint>,
    upgrade: &mut Option<PendingUpgrade>,
    aborted: &[(CheckpointId, String)],
    send_to: &dyn Fn(&[usize], Control),
) {
    for (id, why) in aborted {
        if let Some(sp) = savepoint.take_if(|s| s.id == Some(*id)) {
            let _ = sp.reply.send(Err(format!("the savepoint (checkpoint {id}) was aborted: {why}")));
        }
        if let Some(u) = upgrade.as_mut().filter(|u| u.id == Some(*id))
            && let Some(d) = u.round.on_abort(&format!("checkpoint {id} was aborted: {why}"))
        {
            send_to(&u.tasks, Control::UpgradeDecision { id: *id, commit: d.commit });
        }
    }
}

/// A live upgrade that committed at checkpoint `at`.
struct CommittedUpgrade {
    at: CheckpointId,
    node: usize,
    /// What manifests of checkpoints before `at` record.
    old_entry: Option<ComponentEntry>,
    /// The schema of the state in checkpoint `at`.
    old_schema: u32,
    /// `<uid>: <old> -> <new>`, for the history.
    what: String,
}

/// Every subtask prepared: the new component becomes the operator's, for the manifests of
/// later checkpoints (with its bytes stored so recovery runs it) and for restarts.
fn commit_upgrade(
    cfg: &mut DriverConfig,
    store: &CheckpointStore,
    u: &PendingUpgrade,
    id: CheckpointId,
) -> CommittedUpgrade {
    let mut entry = upgrade::component_entry(&u.factory);
    let old_entry = cfg.nodes[u.node].component.clone();
    if let (OperatorFactory::Wasm(c), Some(sha)) = (&u.factory, entry.sha256.clone()) {
        match store.keep_component(&sha, &c.bytes) {
            Ok(rel) => entry.stored = Some(rel),
            Err(e) => tracing::warn!(
                "could not store the upgraded component of `{}` with the checkpoints ({e}); after a \
                 restart of the process the job file's component runs",
                cfg.nodes[u.node].uid
            ),
        }
    }
    if let Some(old) = &old_entry {
        entry.replaces = old.replaces.clone();
        entry.replaces.extend(old.sha256.clone());
    }
    let what = format!("{}: {} -> {}", cfg.nodes[u.node].uid, upgrade::describe(&u.old), upgrade::describe(&u.factory));
    let done = CommittedUpgrade {
        at: id,
        node: u.node,
        old_entry: old_entry.clone(),
        old_schema: u.old.info().schema_version,
        what,
    };
    cfg.nodes[u.node].component = Some(entry.clone());
    cfg.live.lock().unwrap().insert(u.node, (u.factory.clone(), entry));
    if let Some(st) = &cfg.status
        && let Some(n) = st.lock().unwrap().nodes.get_mut(u.node)
    {
        n.component = Some(upgrade::describe(&u.factory));
    }
    done
}

fn finish_upgrade(cfg: &DriverConfig, u: PendingUpgrade, outcome: Outcome) {
    let uid = &cfg.nodes[u.node].uid;
    let id = u.id.unwrap_or(CheckpointId(0));
    let pause_ms_max = outcome.pause_ms_max;
    if !outcome.consistent {
        // Cannot happen by construction (a subtask only switches on the decision); say so
        // loudly rather than report a clean upgrade.
        tracing::error!(operator = %uid, "operator `{uid}`: subtasks did not all follow the upgrade decision at checkpoint {id}");
        let _ = u.reply.send(Err(format!(
            "internal error: the subtasks of operator `{uid}` did not all follow the upgrade decision; restart the \
             job from its latest checkpoint"
        )));
        return;
    }
    if outcome.committed {
        let info = UpgradeInfo {
            operator: uid.clone(),
            from: upgrade::describe(&u.old),
            to: upgrade::describe(&u.factory),
            checkpoint_id: id.0,
            migrated_from: u.migrated_from,
            pause_ms_max,
            state_bytes: u.state_bytes,
        };
        tracing::info!(
            operator = %uid,
            "operator `{uid}` upgraded live from {} to {} at checkpoint {id} (pause {pause_ms_max:.2} ms)",
            info.from, info.to
        );
        if let Some(st) = &cfg.status {
            st.lock().unwrap().upgrades.push(info.clone());
        }
        let _ = u.reply.send(Ok(info));
    } else {
        let d = u
            .round
            .decision()
            .cloned()
            .unwrap_or(crate::checkpoint::upgrade::Decision { commit: false, failures: vec![] });
        let reasons: Vec<String> = d
            .failures
            .iter()
            .map(|(t, r)| match cfg.tasks.get(*t) {
                Some(t) => format!("subtask {}: {r}", t.subtask),
                None => r.clone(),
            })
            .collect();
        let _ = u.reply.send(Err(format!(
            "upgrade of operator `{uid}` to {} rolled back; every subtask runs {} again: {}",
            upgrade::describe(&u.factory),
            upgrade::describe(&u.old),
            reasons.join("; ")
        )));
    }
}
