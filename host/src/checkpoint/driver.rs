//! The coordinator's thin shell: a thread that feeds the pure [`Coordinator`] with time and
//! subtask events and carries out its decisions (send triggers, publish manifests, notify
//! completion and aborts, apply retention, record metrics).
//!
//! Invariants: `Complete(id)` is sent only after the manifest of `id` is durable; the job's
//! end is a checkpoint too: once every subtask has finished, a final checkpoint is forced,
//! and only when it is complete are subtasks told to commit and shut down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::checkpoint::control::{Ack, Control, Event};
use crate::checkpoint::coordinator::{AckOutcome, CheckpointSettings, Coordinator, TriggerDecision};
use crate::checkpoint::metadata::{
    CheckpointMetrics, ComponentEntry, FORMAT_VERSION, Manifest, OperatorEntry, SubtaskEntry,
};
use crate::checkpoint::storage::CheckpointStore;
use crate::ids::CheckpointId;

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
}

/// How the coordinator thread ended.
#[derive(Debug)]
pub enum DriverEnd {
    /// The job finished and its final checkpoint `0` is complete.
    Finished(CheckpointId),
    /// Stopped from outside (a failure or cancellation).
    Stopped,
}

/// Completed checkpoints of this run, shared with the executor (restart needs the latest).
#[derive(Debug, Default)]
pub struct Completed {
    /// Number completed.
    pub count: std::sync::atomic::AtomicU64,
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Runs the coordinator until the job's final checkpoint completes or `stop` is set.
pub fn run(
    cfg: DriverConfig,
    store: CheckpointStore,
    controls: Vec<Sender<Control>>,
    events: Receiver<Event>,
    stop: Arc<AtomicBool>,
    completed: Arc<Completed>,
) -> DriverEnd {
    let start = Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let mut coord: Coordinator<Ack> = Coordinator::new(cfg.settings, cfg.tasks.len(), cfg.first_id);
    let mut finished = vec![false; cfg.tasks.len()];
    let mut final_id: Option<CheckpointId> = None;
    let mut trigger_unix = std::collections::BTreeMap::new();
    let broadcast = |c: Control| {
        for tx in &controls {
            let _ = tx.send(c);
        }
    };
    let mut next_poll = 0u64;
    loop {
        if stop.load(Ordering::Relaxed) {
            coord.abort_all();
            return DriverEnd::Stopped;
        }
        let all_finished = finished.iter().all(|f| *f);
        if now() >= next_poll || (all_finished && final_id.is_none()) {
            match coord.poll_trigger(now(), all_finished) {
                TriggerDecision::Trigger(id) => {
                    if all_finished {
                        final_id = Some(id);
                    }
                    trigger_unix.insert(id, unix_ms());
                    broadcast(Control::Trigger(id));
                    next_poll = now() + cfg.settings.interval_ms;
                }
                TriggerDecision::Wait { at } => next_poll = at,
                TriggerDecision::Busy => next_poll = now() + 10,
            }
        }
        for id in coord.on_tick(now()) {
            if cfg.verbose {
                eprintln!("checkpoint {id} aborted: not complete within {} ms", cfg.settings.timeout_ms);
            }
            if final_id == Some(id) {
                final_id = None;
            }
            broadcast(Control::Abort(id));
        }
        let wait = next_poll.saturating_sub(now()).clamp(1, 50);
        let event = match events.recv_timeout(Duration::from_millis(wait)) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return DriverEnd::Stopped,
        };
        match event {
            Event::Finished { task } => finished[task] = true,
            Event::Decline { task, id, reason } => {
                if coord.on_decline(id, now()) {
                    let t = &cfg.tasks[task];
                    if cfg.verbose {
                        eprintln!("checkpoint {id} declined by {}#{}: {reason}", cfg.nodes[t.node].uid, t.subtask);
                    }
                    if final_id == Some(id) {
                        final_id = None;
                    }
                    broadcast(Control::Abort(id));
                }
            }
            Event::Ack { task, id, ack } => {
                if let AckOutcome::Complete { id, triggered_at, acks, subsumed } = coord.on_ack(task, id, ack, now()) {
                    for s in subsumed {
                        broadcast(Control::Abort(s));
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
                    };
                    let mut operators: Vec<OperatorEntry> = cfg
                        .nodes
                        .iter()
                        .map(|n| OperatorEntry {
                            uid: n.uid.clone(),
                            kind: n.kind.to_string(),
                            parallelism: n.parallelism,
                            component: n.component.clone(),
                            subtasks: Vec::new(),
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
                        });
                    }
                    for op in &mut operators {
                        op.subtasks.sort_by_key(|s| s.index);
                    }
                    let mut manifest = Manifest {
                        format_version: FORMAT_VERSION,
                        job: cfg.job.clone(),
                        checkpoint_id: id.0,
                        created_unix_ms: unix_ms(),
                        finished: is_final,
                        max_parallelism: cfg.max_parallelism,
                        operators,
                        metrics,
                    };
                    match store.publish(&manifest) {
                        Ok(bytes) => manifest.metrics.bytes += bytes,
                        Err(e) => {
                            eprintln!(
                                "checkpoint {id}: publishing the manifest failed: {e}; the checkpoint is not complete"
                            );
                            if is_final {
                                final_id = None;
                            }
                            broadcast(Control::Abort(id));
                            continue;
                        }
                    }
                    manifest.metrics.duration_ms = (now() - triggered_at) as f64;
                    completed.count.fetch_add(1, Ordering::Relaxed);
                    let _ = store.append_history(&manifest.metrics);
                    if let Err(e) = store.retain(cfg.settings.retained) {
                        eprintln!("checkpoint {id}: removing old checkpoints failed: {e}");
                    }
                    if cfg.verbose {
                        let m = &manifest.metrics;
                        eprintln!(
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
                    if is_final {
                        broadcast(Control::Shutdown);
                        return DriverEnd::Finished(id);
                    }
                }
            }
        }
    }
}
