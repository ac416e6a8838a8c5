//! One attempt of a job deployed in this process: every channel of the physical plan becomes a
//! crossbeam channel (bounded; a back-edge unbounded, so a loop never deadlocks under
//! backpressure), every subtask a thread, and checkpointing a coordinator thread and a writer
//! thread. The attempt ends done, stopped with a savepoint, or failed with its root cause.
//!
//! Invariants: a failing subtask drops its channels, so its neighbours see a disconnect and
//! stop too, and the cancel flag stops the rest; the attempt's failure is the first root cause
//! (not the disconnects it caused); it returns only after every thread it started has exited.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};

use crate::checkpoint::metadata::SnapshotKind;
use crate::checkpoint::recovery::{self, RestorePlan};
use crate::checkpoint::storage::{CheckpointStore, LoadedCheckpoint};
use crate::connectors::file_sink::clear_parts;
use crate::declared::Redistribution;
use crate::graph::logical::{JobGraph, NodeKind, SinkKind, SourceKind};
use crate::graph::physical::PhysicalPlan;
use crate::ids::{NodeId, SubtaskIndex, TaskId};
use crate::job::bind::BoundJob;
use crate::operator::OperatorFactory;
use crate::runtime::control::{Control, Controls, Event, WriteMsg};
use crate::runtime::driver::{self, Completed, DriverConfig, DriverEnd, NodeTemplate, TaskTemplate};
use crate::runtime::error::{RunError, TaskFailure};
use crate::runtime::executor::{AttemptEnd, Live, RunOptions, report_progress, summaries};
use crate::runtime::failed_record::Origin;
use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::handle::{Endpoint, Request};
use crate::runtime::input::{InputChannel, Inputs};
use crate::runtime::message::{Message, Priority};
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::output::{EdgeOutput, Output};
use crate::runtime::participant::Participant;
use crate::runtime::priority;
use crate::runtime::subtask::{self, Context, Parts, StartError, Task};
use crate::runtime::termination::LoopTermination;
use crate::runtime::writer;

/// What one attempt runs with.
pub(crate) struct Attempt<'a> {
    /// The job.
    pub job: &'a BoundJob,
    /// How it runs.
    pub opts: &'a RunOptions,
    /// 0 for the first attempt.
    pub attempt: u32,
    /// Names this attempt's state files apart from any other writer's in the same checkpoint
    /// directory: the restart count in one process; on a cluster the attempt number, which
    /// carries the leader's epoch, so a deposed leader's still-running worker can never
    /// overwrite a file of the new leader's checkpoint that happens to take the same id.
    pub writer: u64,
    /// The checkpoint it restores.
    pub restore: Option<&'a LoadedCheckpoint>,
    /// Checkpoint storage (`None`: checkpointing off).
    pub store: Option<&'a CheckpointStore>,
    /// Checkpoints completed over all attempts.
    pub completed: &'a Arc<Completed>,
    /// The running component of every operator node.
    pub live: &'a Live,
    /// States to drop per node (allowed by the user).
    pub dropped: &'a BTreeMap<usize, Vec<String>>,
    /// Nice value of the subtask threads (a CPU-limit breach demotes the job).
    pub nice: i32,
}

/// Runs one attempt (see the module docs).
pub(crate) fn run_attempt(a: &Attempt<'_>) -> Result<AttemptEnd, RunError> {
    let g = &a.job.graph;
    if let Some(end) = prepare(a)? {
        return Ok(end);
    }
    let plan = PhysicalPlan::of(g);
    let mine = vec![true; plan.subtasks.len()];
    let wiring = wire(g, &plan, &mine);
    let part = match build_part(a, &plan, &mine, wiring.inputs, wiring.outputs) {
        Ok(p) => p,
        Err(e) => return started_or_failed(e),
    };
    let Part { tasks, controls, templates, events_tx, events_rx, writer_rx, metrics, cancel, .. } = part;
    let stop = Arc::new(AtomicBool::new(false));
    let checkpointing = match a.store {
        Some(store) => {
            let dcfg = driver_config(a, store, templates);
            let controls = controls.into_iter().map(|c| c.expect("every subtask runs here")).collect();
            let w = start_writer(a, store, &events_tx, writer_rx)?;
            Some((start_driver(a, store, dcfg, Controls::PerTask(controls), events_rx, &stop)?, w))
        }
        None => None,
    };
    drop(events_tx);
    let threads = Threads { cancel, stop, nice: a.nice, cpu_group: a.opts.cpu_group.clone() };
    let failures = threads.run(a, tasks, &metrics)?;
    let coordinator_end = match checkpointing {
        Some((c, w)) => {
            let end = c.join();
            let _ = w.join();
            Some(end)
        }
        None => None,
    };
    attempt_end(g, failures, coordinator_end, &metrics)
}

/// What happens once per attempt wherever its subtasks run: a job restored from a checkpoint
/// taken after it had finished only commits that checkpoint's output (`Some`: the attempt's
/// end); a fresh start clears what file sinks left of an earlier run.
pub(crate) fn prepare(a: &Attempt<'_>) -> Result<Option<AttemptEnd>, RunError> {
    let g = &a.job.graph;
    if let Some(c) = a.restore
        && c.manifest.finished
    {
        let restored = restore_plan(a)?;
        let restored_state =
            |node: usize, subtask: u32| restored.as_ref().and_then(|p| p[node][subtask as usize].clone());
        let cx = Context { graph: g, opts: a.opts, attempt: a.attempt, restore: a.restore };
        if let Err(e) = subtask::finish_commits(&cx, &restored_state) {
            return started_or_failed(e).map(Some);
        }
        tracing::info!(
            job = %g.name,
            "job `{}` had already finished at checkpoint {}; its output is committed",
            g.name, c.manifest.checkpoint_id
        );
        let metrics: Vec<Arc<NodeMetrics>> =
            g.nodes.iter().map(|n| Arc::new(NodeMetrics::new(n.parallelism))).collect();
        return Ok(Some(AttemptEnd::Done(summaries(g, &metrics))));
    }
    let setup = |message: String| RunError::Setup { job: g.name.clone(), message };
    if a.restore.is_none() {
        for n in &g.nodes {
            if let NodeKind::Sink(SinkKind::File { path, .. }) = &n.kind {
                clear_parts(path)
                    .map_err(|e| setup(format!("sink `{}`: cannot clear {}: {e}", n.id, path.display())))?;
            }
        }
    }
    Ok(None)
}

/// The subtasks of an attempt that run in this process, ready to start.
pub(crate) struct Part {
    /// The runnable subtasks.
    pub tasks: Vec<(TaskId, Task)>,
    /// Per global task index: the control channel of a subtask of this part (checkpointing on).
    pub controls: Vec<Option<Sender<Control>>>,
    /// Every subtask of the plan, as the checkpoint coordinator numbers them.
    pub templates: Vec<TaskTemplate>,
    /// Subtask and writer events (to the coordinator).
    pub events_tx: Sender<Event>,
    /// Their receiving end.
    pub events_rx: Receiver<Event>,
    /// Snapshots to the writer.
    pub writer_rx: Receiver<WriteMsg>,
    /// Counters per node (this process's subtasks).
    pub metrics: Vec<Arc<NodeMetrics>>,
    /// Set to cancel every subtask of the part.
    pub cancel: Arc<AtomicBool>,
    /// Loop termination (jobs with loops): of the whole job in one process, or of this part
    /// of it on a cluster, where the coordinator declares the job quiescent.
    pub termination: Option<Arc<LoopTermination>>,
}

/// Makes the subtasks `mine` (per subtask of `plan`) runnable on the channels `wire` made.
pub(crate) fn build_part(
    a: &Attempt<'_>,
    plan: &PhysicalPlan,
    mine: &[bool],
    mut inputs: Vec<Inputs>,
    mut outputs: Vec<Vec<EdgeOutput>>,
) -> Result<Part, StartError> {
    let g = &a.job.graph;
    let metrics: Vec<Arc<NodeMetrics>> = g.nodes.iter().map(|n| Arc::new(NodeMetrics::new(n.parallelism))).collect();
    let restored = restore_plan(a).map_err(StartError::Setup)?;
    let restored_state = |node: usize, subtask: u32| restored.as_ref().and_then(|p| p[node][subtask as usize].clone());
    let cx = Context { graph: g, opts: a.opts, attempt: a.attempt, restore: a.restore };
    let termination = g.is_cyclic().then(|| {
        let is_source = |s: &crate::graph::physical::SubtaskPlan| matches!(g.nodes[s.node].kind, NodeKind::Source(_));
        let sources = plan.subtasks.iter().zip(mine).filter(|(s, m)| **m && is_source(s)).count();
        // Part of the job runs elsewhere: only the counts of all parts together decide.
        Arc::new(match mine.iter().all(|m| *m) {
            true => LoopTermination::new(sources),
            false => LoopTermination::distributed(sources),
        })
    });
    let cancel = Arc::new(AtomicBool::new(false));
    let (events_tx, events_rx) = unbounded::<Event>();
    let (writer_tx, writer_rx) = unbounded::<WriteMsg>();
    let mut controls = Vec::new();
    let mut tasks: Vec<(TaskId, Task)> = Vec::new();
    let incremental = g.checkpoint.as_ref().is_some_and(|c| c.incremental);
    let max_links = g.checkpoint.as_ref().and_then(|c| c.max_chain_links);
    for (si, s) in plan.subtasks.iter().enumerate() {
        let n = &g.nodes[s.node];
        if !mine[si] {
            if a.store.is_some() {
                controls.push(None);
            }
            continue;
        }
        let id = TaskId { node: n.id.clone(), subtask: SubtaskIndex(s.subtask) };
        let restored = restored_state(s.node, s.subtask);
        if let (Some(t), Some(r)) = (&termination, &restored) {
            // A loop head's logged back-edge records are in flight again until it replays
            // them: no one may find the loop quiescent before.
            t.account(r.backedge_log.iter().map(|l| l.records as u64).sum(), 0);
        }
        let checkpoints = a.store.is_some().then(|| {
            let (tx, rx) = unbounded::<Control>();
            controls.push(Some(tx));
            let file = format!("{}-{}.a{}.state", n.id, s.subtask, a.writer);
            let disk = n.state_on_disk();
            Participant::new(si, file, rx, events_tx.clone(), writer_tx.clone()).with_incremental(
                incremental,
                disk,
                max_links,
            )
        });
        let parts = Parts {
            id: id.clone(),
            inputs: std::mem::replace(&mut inputs[si], Inputs::new(Vec::new())),
            output: Output::new(std::mem::take(&mut outputs[si]), g.batch_size, 256 * 1024)
                .with_backpressure(metrics[s.node].subtask(s.subtask)),
            metrics: metrics[s.node].clone(),
            counters: metrics[s.node].subtask(s.subtask),
            cancel: cancel.clone(),
            checkpoints,
            termination: termination.clone(),
            restored,
        };
        let component = a.live.lock().unwrap().get(&s.node).map(|(f, _)| f.clone());
        tasks.push((id, subtask::build(&cx, s, parts, component)?));
    }
    let templates = if a.store.is_some() { task_templates(plan) } else { Vec::new() };
    Ok(Part { tasks, controls, templates, events_tx, events_rx, writer_rx, metrics, cancel, termination })
}

/// Every subtask of the plan as the checkpoint coordinator numbers them (global task index =
/// index into `plan.subtasks`).
pub(crate) fn task_templates(plan: &PhysicalPlan) -> Vec<TaskTemplate> {
    plan.subtasks
        .iter()
        .map(|s| TaskTemplate { node: s.node, subtask: s.subtask, key_groups: (s.key_groups.start, s.key_groups.end) })
        .collect()
}

/// A subtask that could not be made runnable: the job refused, or the attempt failed.
pub(crate) fn started_or_failed(e: StartError) -> Result<AttemptEnd, RunError> {
    match e {
        StartError::Setup(e) => Err(e),
        StartError::Attempt(f) => Ok(AttemptEnd::Failed(f)),
    }
}

/// What each subtask restores, by the restoring components' declarations.
fn restore_plan(a: &Attempt<'_>) -> Result<Option<RestorePlan>, RunError> {
    let Some(c) = a.restore else { return Ok(None) };
    let g = &a.job.graph;
    let components = a.live.lock().unwrap().clone();
    let redistribution = |node: usize, state: &str| {
        components
            .get(&node)
            .and_then(|(f, _)| f.info().states.iter().find(|s| s.name == state).map(|s| s.redistribution))
            .unwrap_or(Redistribution::None)
    };
    let mut plan = recovery::plan(c, g, &redistribution, a.dropped, a.opts.allow_non_restored_state).map_err(|e| {
        RunError::Setup { job: g.name.clone(), message: format!("cannot restore {}: {e}", c.path.display()) }
    })?;
    // New checkpoints may build on the restored files only where the store keeps them: a
    // checkpoint of this job's own store, not a savepoint or a downloaded copy.
    let own = a.store.is_some_and(|s| {
        c.manifest.kind != SnapshotKind::Savepoint
            && c.path.parent().and_then(|p| p.canonicalize().ok()) == s.root().canonicalize().ok()
            && c.path.file_name() == Some(std::ffi::OsStr::new(&format!("chk-{}", c.manifest.checkpoint_id)))
    });
    if !own {
        plan.iter_mut().flatten().flatten().for_each(|st| st.resume = None);
    }
    Ok(Some(plan))
}

/// This process's channels of the plan (see [`wire`]).
pub(crate) struct Wiring {
    /// Per subtask of the plan: its input channels in input order (none if not `mine`),
    /// with its priority inbox for unaligned checkpoints' barriers.
    pub inputs: Vec<Inputs>,
    /// Per subtask of the plan: its outputs per edge (empty if not `mine`).
    pub outputs: Vec<Vec<EdgeOutput>>,
    /// Channels from a subtask here to one elsewhere.
    pub outgoing: Vec<Outgoing>,
    /// Channels from a subtask elsewhere to one here.
    pub incoming: Vec<Incoming>,
}

/// A channel from a subtask here to one on another worker.
pub(crate) struct Outgoing {
    /// Its index in the plan.
    pub channel: usize,
    /// The end the network forwards from.
    pub rx: Receiver<Message>,
    /// A back-edge: the in-flight budget its sender charged, given back as the network
    /// takes each batch (the receiving worker charges its own).
    pub budget: Option<Arc<FeedbackBudget>>,
    /// Unaligned checkpoints: the sending subtask's barriers for this channel.
    pub barriers: Option<Receiver<Priority>>,
}

/// A channel from a subtask on another worker to one here.
pub(crate) struct Incoming {
    /// Its index in the plan.
    pub channel: usize,
    /// Where the network delivers.
    pub tx: Sender<Message>,
    /// Told each time the receiving subtask takes a message off.
    pub space: Arc<tokio::sync::Notify>,
    /// A back-edge: this worker's in-flight budget, charged as batches arrive.
    pub budget: Option<Arc<FeedbackBudget>>,
    /// Unaligned checkpoints: the receiving subtask's priority inbox and the channel's input
    /// index there.
    pub barriers: Option<(Sender<Priority>, usize)>,
}

/// The plan's channels that touch the subtasks `mine`, handed out per subtask (same order as
/// `plan.subtasks`); a channel whose other end runs elsewhere is a local queue whose far end
/// is returned as outgoing or incoming, for the network to carry.
pub(crate) fn wire(g: &JobGraph, plan: &PhysicalPlan, mine: &[bool]) -> Wiring {
    // One in-flight budget for all back-edges of this attempt (`[limits] max_feedback_mb`).
    let budget = Arc::new(FeedbackBudget::new(g.limits.max_feedback_mb << 20));
    let mut senders: Vec<Option<Sender<Message>>> = Vec::with_capacity(plan.channels.len());
    let mut receivers: Vec<Option<Receiver<Message>>> = Vec::with_capacity(plan.channels.len());
    let (mut outgoing, mut incoming) = (Vec::new(), Vec::new());
    let mut space: Vec<Option<Arc<tokio::sync::Notify>>> = vec![None; plan.channels.len()];
    let (inboxes, at_input) = priority_inboxes(g, plan, mine);
    let unaligned = !at_input.is_empty();
    let here = |ci: usize| {
        let (c, e) = (plan.channels[ci], &g.edges[plan.channels[ci].edge]);
        (mine[plan.index_of(e.from, c.from)], mine[plan.index_of(e.to, c.to)])
    };
    // Unaligned: each bounded channel's tokens (`runtime/output.rs`); a channel to another
    // worker has none (its sender's local queue bounds what it puts in).
    let tokens: Vec<Option<(Sender<()>, Receiver<()>)>> = (0..plan.channels.len())
        .map(|ci| {
            (unaligned && !plan.channels[ci].back && here(ci) == (true, true)).then(|| bounded(g.channel_capacity))
        })
        .collect();
    // Unaligned: a channel to another worker sends its barriers to the network's thread.
    let mut remote_barriers: Vec<Option<Sender<Priority>>> = vec![None; plan.channels.len()];
    for (ci, c) in plan.channels.iter().enumerate() {
        let (from_here, to_here) = here(ci);
        if !from_here && !to_here {
            senders.push(None);
            receivers.push(None);
            continue;
        }
        // A back-edge never blocks its sender; its backlog is bounded by the loop's work
        // (and `max_feedback_mb`) and reported.
        let (tx, rx) = if c.back { unbounded() } else { bounded(g.channel_capacity) };
        let charged = c.back.then(|| budget.clone());
        match (from_here, to_here) {
            (true, false) => {
                let barriers = unaligned.then(|| {
                    let (to, from) = unbounded();
                    remote_barriers[ci] = Some(to);
                    from
                });
                outgoing.push(Outgoing { channel: ci, rx, budget: charged, barriers });
                senders.push(Some(tx));
                receivers.push(None);
            }
            (false, true) => {
                let notify = Arc::new(tokio::sync::Notify::new());
                space[ci] = Some(notify.clone());
                let barriers = unaligned.then(|| {
                    let (to, input) = at_input[ci];
                    (inboxes[to].as_ref().expect("a receiver here has an inbox").0.clone(), input)
                });
                incoming.push(Incoming { channel: ci, tx, space: notify, budget: charged, barriers });
                senders.push(None);
                receivers.push(Some(rx));
            }
            _ => {
                senders.push(Some(tx));
                receivers.push(Some(rx));
            }
        }
    }
    let mut inputs = Vec::with_capacity(plan.subtasks.len());
    let mut outputs = Vec::with_capacity(plan.subtasks.len());
    for (si, s) in plan.subtasks.iter().enumerate() {
        if !mine[si] {
            inputs.push(Inputs::new(Vec::new()));
            outputs.push(Vec::new());
            continue;
        }
        let ins: Vec<InputChannel> = plan
            .inputs_of(g, s.node, s.subtask)
            .map(|ci| {
                let c = plan.channels[ci];
                let e = &g.edges[c.edge];
                let file = match &g.nodes[e.from].kind {
                    NodeKind::Source(SourceKind::File { path, .. }) => Some(path.clone()),
                    _ => None,
                };
                let origin = Origin { node: g.nodes[e.from].id.to_string(), subtask: c.from, file };
                let rx = receivers[ci].take().expect("each channel has one receiver");
                InputChannel::new(rx, e.side)
                    .feedback(c.back)
                    .from(origin)
                    .budget(c.back.then(|| budget.clone()))
                    .space(space[ci].take())
                    .tokens(tokens[ci].as_ref().map(|(_, rx)| rx.clone()))
            })
            .collect();
        let aligned_for = g.checkpoint.as_ref().map_or(Duration::ZERO, |c| c.alignment.aligned_for());
        inputs.push(Inputs::new(ins).with_priority(inboxes[si].as_ref().map(|(_, rx)| rx.clone()), aligned_for));
        let outs = plan
            .outputs_of(g, s.node, s.subtask)
            .into_iter()
            .map(|(ei, channels)| {
                let e = &g.edges[ei];
                let backs = channels.iter().map(|&ci| plan.channels[ci].back).collect();
                let txs = channels.iter().map(|&ci| senders[ci].take().expect("each channel has one sender")).collect();
                let edge = EdgeOutput::new(e.port, e.partition, txs, g.max_parallelism, s.subtask as usize)
                    .in_loop(g.edge_in_loop(ei))
                    .back_edges(backs, budget.clone());
                match at_input.is_empty() {
                    true => edge,
                    false => edge.unaligned(
                        channels
                            .iter()
                            .map(|&ci| match remote_barriers[ci].take() {
                                // The receiving worker sets the input index.
                                Some(network) => (network, 0),
                                None => {
                                    let (to, input) = at_input[ci];
                                    (inboxes[to].as_ref().expect("a receiver here has an inbox").0.clone(), input)
                                }
                            })
                            .collect(),
                        channels.iter().map(|&ci| tokens[ci].as_ref().map(|(tx, _)| tx.clone())).collect(),
                    ),
                }
            })
            .collect();
        outputs.push(outs);
    }
    Wiring { inputs, outputs, outgoing, incoming }
}

/// Unaligned checkpoints: a priority inbox per subtask with inputs (`mine` only), and per
/// channel its receiver and input index there. Empty with aligned checkpoints.
#[allow(clippy::type_complexity)]
fn priority_inboxes(
    g: &JobGraph,
    plan: &PhysicalPlan,
    mine: &[bool],
) -> (Vec<Option<(Sender<Priority>, Receiver<Priority>)>>, Vec<(usize, usize)>) {
    let unaligned = g.checkpoint.as_ref().is_some_and(|c| c.alignment.overtakes());
    let mut inboxes: Vec<Option<(Sender<Priority>, Receiver<Priority>)>> = Vec::new();
    let mut at_input = Vec::new();
    if !unaligned {
        inboxes.resize_with(plan.subtasks.len(), || None);
        return (inboxes, at_input);
    }
    at_input = vec![(usize::MAX, 0); plan.channels.len()];
    for (si, s) in plan.subtasks.iter().enumerate() {
        let mut any = false;
        if mine[si] {
            for (k, ci) in plan.inputs_of(g, s.node, s.subtask).enumerate() {
                at_input[ci] = (si, k);
                any = true;
            }
        }
        inboxes.push(any.then(unbounded));
    }
    (inboxes, at_input)
}

/// The coordinator's view of the attempt: nodes as manifests record them, subtasks by global
/// task index.
pub(crate) fn driver_config(a: &Attempt<'_>, store: &CheckpointStore, tasks: Vec<TaskTemplate>) -> DriverConfig {
    let g = &a.job.graph;
    let retired = a.restore.map(|c| recovery::retired_sinks(c, g)).unwrap_or_default();
    let live = a.live.lock().unwrap();
    let nodes = g
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
            component: live.get(&i).map(|(f, entry)| {
                let mut entry = entry.clone();
                // An upgraded component is stored with this job's checkpoints, so recovery
                // after a process restart finds it.
                if !entry.replaces.is_empty()
                    && let (OperatorFactory::Wasm(c), Some(sha)) = (f, f.sha256())
                {
                    entry.stored = store.keep_component(sha, &c.bytes).ok();
                }
                entry
            }),
        })
        .collect();
    DriverConfig {
        job: g.name.clone(),
        max_parallelism: g.max_parallelism,
        settings: g.checkpoint.as_ref().expect("a store means checkpointing").settings,
        nodes,
        tasks,
        // Ids grow past the restored checkpoint's too (a savepoint restored into another
        // directory): a Kafka sink's commit markers rely on ids only increasing.
        first_id: store.max_id().max(a.restore.map_or(0, |c| c.manifest.checkpoint_id)).saturating_add(1),
        verbose: a.opts.progress.is_some(),
        requests: a.opts.endpoint.as_ref().map(|e| e.requests.clone()),
        graph: Arc::new(g.clone()),
        live: a.live.clone(),
        status: a.opts.endpoint.as_ref().map(|e| e.status.clone()),
        gate: a.opts.gate.clone(),
    }
}

type CoordinatorThread = JoinHandle<DriverEnd>;

/// Starts the checkpoint writer of this process's subtasks.
pub(crate) fn start_writer(
    a: &Attempt<'_>,
    store: &CheckpointStore,
    events_tx: &Sender<Event>,
    writer_rx: Receiver<WriteMsg>,
) -> Result<JoinHandle<()>, RunError> {
    let (st, ev, budget) = (store.clone(), events_tx.clone(), a.opts.disk_budget.clone());
    std::thread::Builder::new()
        .name("checkpoint-writer".into())
        .spawn(move || writer::run(st, writer_rx, ev, budget))
        .map_err(|e| thread_error(a, e))
}

/// Starts the checkpoint coordinator of the attempt.
pub(crate) fn start_driver(
    a: &Attempt<'_>,
    store: &CheckpointStore,
    dcfg: DriverConfig,
    controls: Controls,
    events_rx: Receiver<Event>,
    stop: &Arc<AtomicBool>,
) -> Result<CoordinatorThread, RunError> {
    let (st, stop, done) = (store.clone(), stop.clone(), a.completed.clone());
    std::thread::Builder::new()
        .name("checkpoint-coordinator".into())
        .spawn(move || driver::run(dcfg, st, controls, events_rx, stop, done))
        .map_err(|e| thread_error(a, e))
}

fn thread_error(a: &Attempt<'_>, e: std::io::Error) -> RunError {
    RunError::Setup { job: a.job.graph.name.clone(), message: format!("cannot start a thread: {e}") }
}

/// The subtask threads of an attempt and the flags they share.
pub(crate) struct Threads {
    pub cancel: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    pub nice: i32,
    pub cpu_group: Option<Arc<crate::runtime::cpu_shares::CpuGroup>>,
}

impl Threads {
    /// Runs every task on its own thread until all have exited (with the endpoint's
    /// watcher and the progress reporter beside them); returns their failures.
    pub(crate) fn run(
        &self,
        a: &Attempt<'_>,
        tasks: Vec<(TaskId, Task)>,
        metrics: &[Arc<NodeMetrics>],
    ) -> Result<Vec<TaskFailure>, RunError> {
        let g = &a.job.graph;
        let failures: Arc<Mutex<Vec<TaskFailure>>> = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let tasks_done = Arc::new(AtomicBool::new(false));
        let watcher = a.opts.endpoint.clone().map(|e| {
            *e.metrics.lock().unwrap() = metrics.to_vec();
            let (cancel, stop, tasks_done) = (self.cancel.clone(), self.stop.clone(), tasks_done.clone());
            let serves_requests = a.store.is_some();
            let job_name = g.name.clone();
            std::thread::spawn(move || watch(e, cancel, stop, tasks_done, serves_requests, job_name))
        });
        let progress = a.opts.progress.map(|every| {
            let (metrics, done) = (metrics.to_vec(), done.clone());
            let ids: Vec<NodeId> = g.nodes.iter().map(|n| n.id.clone()).collect();
            std::thread::spawn(move || report_progress(&ids, &metrics, &done, every))
        });
        let mut handles = Vec::new();
        let mut spawn_error = None;
        for (id, task) in tasks {
            match self.spawn(id, task, failures.clone()) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // Stop what already runs; the attempt cannot start.
                    self.cancel.store(true, Ordering::Relaxed);
                    self.stop.store(true, Ordering::Relaxed);
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        for h in handles {
            let _ = h.join();
        }
        tasks_done.store(true, Ordering::Relaxed);
        if let Some(w) = watcher {
            let _ = w.join();
        }
        self.stop.store(true, Ordering::Relaxed);
        done.store(true, Ordering::Relaxed);
        if let Some(p) = progress {
            let _ = p.join();
        }
        if let Some(e) = spawn_error {
            return Err(RunError::Setup { job: g.name.clone(), message: format!("cannot start a thread: {e}") });
        }
        Ok(std::mem::take(&mut *failures.lock().unwrap()))
    }

    /// One subtask's thread: joins the tenant's CPU group, runs the task, turns a panic into
    /// a failure, and on failure cancels the attempt.
    fn spawn(&self, id: TaskId, task: Task, failures: Arc<Mutex<Vec<TaskFailure>>>) -> std::io::Result<JoinHandle<()>> {
        let (cancel, stop, cpu_group, nice) =
            (self.cancel.clone(), self.stop.clone(), self.cpu_group.clone(), self.nice);
        std::thread::Builder::new().name(id.to_string()).spawn(move || {
            let _share = match cpu_group {
                Some(g) => g.join_current_thread(nice).inspect_err(|e| {
                    tracing::warn!(subtask = %id, "subtask {id} runs outside its tenant's CPU share: {e}");
                }),
                None => {
                    if nice > 0 {
                        priority::demote_current_thread(nice);
                    }
                    Ok(crate::runtime::cpu_priorities::Membership::none())
                }
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.run())).unwrap_or_else(|p| {
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
    }
}

/// How the attempt ended, from its subtasks' failures and the coordinator's end.
pub(crate) fn attempt_end(
    g: &JobGraph,
    mut failures: Vec<TaskFailure>,
    coordinator_end: Option<std::thread::Result<DriverEnd>>,
    metrics: &[Arc<NodeMetrics>],
) -> Result<AttemptEnd, RunError> {
    match coordinator_end {
        Some(Ok(DriverEnd::StoppedWithSavepoint { info, reply })) => {
            // The savepoint is complete and its output committed before `Stop` went out; what
            // subtasks ran into while exiting (a neighbour gone first) does not undo that.
            for f in failures.iter().filter(|f| !f.is_secondary()) {
                tracing::warn!(job = %g.name, "while stopping: {f}");
            }
            tracing::info!(job = %g.name, "job `{}` stopped with savepoint {}", g.name, info.path.display());
            let _ = reply.send(Ok(info.clone()));
            return Ok(AttemptEnd::Stopped(summaries(g, metrics), info));
        }
        Some(Ok(DriverEnd::Stopped)) if failures.is_empty() => {
            return Err(RunError::Setup {
                job: g.name.clone(),
                message: "the checkpoint coordinator stopped before the job's final checkpoint".into(),
            });
        }
        _ => {}
    }
    if !failures.is_empty() {
        let root = failures.iter().position(|f| !f.is_secondary()).unwrap_or(0);
        return Ok(AttemptEnd::Failed(failures.swap_remove(root)));
    }
    Ok(AttemptEnd::Done(summaries(g, metrics)))
}

/// Per attempt: turns a user's cancel into the attempt's cancel, and answers requests that
/// need checkpointing when the job has none.
pub(crate) fn watch(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::input::Received;

    /// A channel fed from another worker hands the network side the same notification its
    /// receiving subtask's input gives when it takes a message off (else a full channel would
    /// be refilled only by the hand-off's fallback timer: the ~100 ms standing queue).
    #[test]
    fn cluster_net_an_incoming_channel_shares_its_notification_with_the_receiving_input() {
        let dir = tempfile::tempdir().unwrap();
        let toml = "[job]\nname = \"j\"\n[[source]]\nid = \"src\"\ntype = \"generator\"\ncount = 10\n\
                    [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{ from = \"src\" }]\n";
        let g = crate::job::parse(&dir.path().join("job.toml"), toml).unwrap();
        let plan = PhysicalPlan::of(&g);
        let sink = plan.subtasks.iter().position(|s| g.nodes[s.node].id.to_string() == "out").unwrap();
        let mine: Vec<bool> = (0..plan.subtasks.len()).map(|i| i == sink).collect();
        let mut w = wire(&g, &plan, &mine);
        assert!(w.outgoing.is_empty());
        let Incoming { tx, space, .. } = w.incoming.pop().expect("the source's channel comes from elsewhere");
        let mut inputs = std::mem::replace(&mut w.inputs[sink], Inputs::new(Vec::new()));
        tx.send(Message::Watermark(7)).unwrap();
        assert!(matches!(inputs.recv(None, &|_| false, None), Received::Message(0, Message::Watermark(7))));
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let told = rt.block_on(async { tokio::time::timeout(Duration::from_secs(1), space.notified()).await.is_ok() });
        assert!(told, "the input did not notify the network side");
    }
}
