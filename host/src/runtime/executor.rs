//! Turns a bound job into running subtasks — one thread per subtask, one bounded channel
//! per (upstream subtask, downstream subtask) pair of every edge — and keeps it running:
//! on a failure every subtask is cancelled and the job restarts from the latest complete
//! checkpoint, as the restart strategy allows.
//!
//! Invariants: a failing subtask drops its channels, so its neighbours see a disconnect and
//! stop too, and the cancel flag stops the rest; the job's error is the first root cause
//! (not the disconnects it caused); an attempt starts only after every thread of the
//! previous one has exited.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded};

use crate::checkpoint::control::{Control, Event, WriteJob};
use crate::checkpoint::driver::{self, Completed, DriverConfig, DriverEnd, NodeTemplate, TaskTemplate};
use crate::checkpoint::metadata::ComponentEntry;
use crate::checkpoint::recovery;
use crate::checkpoint::storage::{self, CheckpointStore, LoadedCheckpoint};
use crate::checkpoint::writer;
use crate::connectors::file_sink::{FileSink, clear_parts};
use crate::connectors::file_source::FileSource;
use crate::connectors::generator::Generator;
use crate::graph::logical::{NodeKind, SinkKind, SourceKind};
use crate::graph::partition::Partition;
use crate::ids::{NodeId, SubtaskIndex, TaskId};
use crate::job::bind::BoundJob;
use crate::keygroup::key_group_range;
use crate::runtime::error::{RunError, TaskFailure};
use crate::runtime::faults::FaultPlan;
use crate::runtime::input::{InputChannel, Inputs};
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::output::{EdgeOutput, Output};
use crate::runtime::participant::Participant;
use crate::runtime::sink::{SinkTask, SinkWriter};
use crate::runtime::source::{SourceReader, SourceTask};
use crate::runtime::task::{Faults, OperatorTask, Restore};
use crate::runtime::termination::LoopTermination;
use crate::sandbox::bindings::types::TaskInfo;
use crate::sandbox::host::HostState;

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
}

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
}

enum Task {
    Source(SourceTask),
    Operator(Box<dyn FnOnce() -> Result<OperatorTask, TaskFailure> + Send>),
    Sink(SinkTask),
}

/// How one attempt ended.
enum AttemptEnd {
    Done(Vec<NodeSummary>),
    Failed(TaskFailure),
}

/// Runs `job` until its sources are exhausted and every subtask finished, restarting after
/// failures as its restart strategy allows.
pub fn run(job: &BoundJob, opts: &RunOptions) -> Result<RunSummary, RunError> {
    let g = &job.graph;
    let started = Instant::now();
    let setup = |message: String| RunError::Setup { job: g.name.clone(), message };
    let store = g.checkpoint.as_ref().map(|c| CheckpointStore::new(&c.dir, &g.name));
    let warn = |e: &storage::CheckpointError| eprintln!("warning: skipping {e}");
    let mut restore = match &opts.restore {
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
    };
    let restored_from = restore.as_ref().map(|c| c.manifest.checkpoint_id);
    let completed = Arc::new(Completed::default());
    let mut failures = 0u32;
    loop {
        if let Some(c) = &restore {
            eprintln!("restoring job `{}` from checkpoint {} ({})", g.name, c.manifest.checkpoint_id, c.path.display());
        }
        match run_attempt(job, opts, failures, restore.as_ref(), store.as_ref(), &completed)? {
            AttemptEnd::Done(nodes) => {
                return Ok(RunSummary {
                    elapsed: started.elapsed(),
                    nodes,
                    attempts: failures + 1,
                    checkpoints: completed.count.load(Ordering::Relaxed),
                    restored_from,
                });
            }
            AttemptEnd::Failed(cause) => {
                failures += 1;
                let Some(delay) = g.restart.delay(failures) else {
                    return Err(RunError::Failed { job: g.name.clone(), attempts: failures, cause });
                };
                restore = match &store {
                    Some(s) => s.latest(warn).or(restore),
                    None => None,
                };
                let from = restore
                    .as_ref()
                    .map_or("the beginning".to_string(), |c| format!("checkpoint {}", c.manifest.checkpoint_id));
                eprintln!(
                    "job `{}` failed ({cause}); restart {failures} in {} ms from {from}",
                    g.name,
                    delay.as_millis()
                );
                std::thread::sleep(delay);
            }
        }
    }
}

fn run_attempt(
    job: &BoundJob,
    opts: &RunOptions,
    attempt: u32,
    restore: Option<&LoadedCheckpoint>,
    store: Option<&CheckpointStore>,
    completed: &Arc<Completed>,
) -> Result<AttemptEnd, RunError> {
    let g = &job.graph;
    let setup = |message: String| RunError::Setup { job: g.name.clone(), message };
    let cancel = Arc::new(AtomicBool::new(false));
    let metrics: Vec<Arc<NodeMetrics>> = g.nodes.iter().map(|_| Arc::default()).collect();

    // What each subtask restores.
    let plan = match restore {
        Some(c) => Some(
            recovery::plan(c, g, opts.allow_non_restored_state)
                .map_err(|e| setup(format!("cannot restore {}: {e}", c.path.display())))?,
        ),
        None => None,
    };
    let restored_state = |node: usize, subtask: u32| plan.as_ref().and_then(|p| p[node][subtask as usize].clone());
    if let Some(c) = restore
        && c.manifest.finished
    {
        // The job had finished; only its last commits may be missing.
        for (i, n) in g.nodes.iter().enumerate() {
            if let NodeKind::Sink(SinkKind::File { path, format }) = &n.kind {
                for s in 0..n.parallelism {
                    let st = restored_state(i, s).and_then(|st| st.sink);
                    FileSink::open(path, s, *format, st.as_ref()).map_err(|e| {
                        setup(format!("sink `{}`: finishing the commit of {}: {e}", n.id, path.display()))
                    })?;
                }
            }
        }
        eprintln!(
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
    for (ei, e) in g.edges.iter().enumerate() {
        let (up, down) = (g.nodes[e.from].parallelism, g.nodes[e.to].parallelism);
        let in_loop = g.edge_in_loop(ei);
        for u in 0..up {
            let targets: Vec<u32> = if e.partition == Partition::Forward { vec![u] } else { (0..down).collect() };
            let mut txs = Vec::with_capacity(targets.len());
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
                inputs[e.to][d as usize].push(InputChannel::new(rx, e.side).feedback(back));
                txs.push(tx);
            }
            let out = EdgeOutput::new(e.port, e.partition, txs, g.max_parallelism, u as usize).in_loop(in_loop);
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
    let (writer_tx, writer_rx) = unbounded::<WriteJob>();
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
            component: job.components.get(&i).map(|c| ComponentEntry {
                name: c.info().name.clone(),
                version: c.info().version.clone(),
                schema_version: c.info().schema_version,
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
            let out = Output::new(outputs[i].pop().unwrap_or_default(), g.batch_size, 256 * 1024);
            let (m, c) = (metrics[i].clone(), cancel.clone());
            let range = key_group_range(g.max_parallelism, n.parallelism, s);
            let restored = restored_state(i, s);
            let participant = if store.is_some() {
                let (tx, rx) = unbounded::<Control>();
                controls.push(tx);
                let index = task_templates.len();
                task_templates.push(TaskTemplate { node: i, subtask: s, key_groups: (range.start, range.end) });
                Some(Participant::new(index, format!("{}-{s}.state", n.id), rx, events_tx.clone(), writer_tx.clone()))
            } else {
                None
            };
            let task = match &n.kind {
                NodeKind::Source(kind) => {
                    let mut reader = match kind {
                        SourceKind::Generator(cfg) => SourceReader::Generator(Generator::new(*cfg, s, n.parallelism)),
                        SourceKind::Stdin => SourceReader::File(FileSource::stdin(s, n.parallelism)),
                        SourceKind::File { path, key_column, rate } => {
                            SourceReader::File(FileSource::open(path, s, n.parallelism, *key_column, *rate).map_err(
                                |e| setup(format!("source `{}`: cannot open {}: {e}", n.id, path.display())),
                            )?)
                        }
                    };
                    if let Some(pos) = restored.as_ref().and_then(|st| st.source) {
                        reader.seek(pos).map_err(|e| setup(format!("source `{id}`: {e}")))?;
                    }
                    Task::Source(SourceTask {
                        id: id.clone(),
                        reader,
                        output: out,
                        batch_size: g.batch_size,
                        metrics: m,
                        cancel: c,
                        checkpoints: participant,
                        termination: termination.clone(),
                    })
                }
                NodeKind::Operator(op) => {
                    let component = job.components[&i].clone();
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
                    let quiet = opts.quiet_guests;
                    let faults = opts.faults.clone().map(|plan| Faults { plan, attempt });
                    let termination = termination.clone();
                    let id2 = id.clone();
                    Task::Operator(Box::new(move || {
                        let mut host = HostState::new(info, component.info().side_outputs.len() as u32);
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
                            cancel: c,
                            checkpoints: participant,
                            restore,
                            faults,
                            termination,
                        })
                    }))
                }
                NodeKind::Sink(kind) => {
                    let writer =
                        match kind {
                            SinkKind::File { path, format } => {
                                let st = restored.as_ref().and_then(|st| st.sink.clone());
                                SinkWriter::File(FileSink::open(path, s, *format, st.as_ref()).map_err(|e| {
                                    setup(format!("sink `{id}`: cannot write to {}: {e}", path.display()))
                                })?)
                            }
                            SinkKind::Stdout { format } => SinkWriter::Stdout(*format),
                            SinkKind::Blackhole => SinkWriter::Blackhole,
                        };
                    Task::Sink(SinkTask {
                        id: id.clone(),
                        writer,
                        inputs: ins,
                        metrics: m,
                        cancel: c,
                        checkpoints: participant,
                        termination: termination.clone(),
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
                first_id: store.max_id() + 1,
                verbose: opts.progress.is_some(),
            };
            let (st, st2, stop2, done) = (store.clone(), store.clone(), stop.clone(), completed.clone());
            let ev = events_tx.clone();
            let w = std::thread::Builder::new()
                .name("checkpoint-writer".into())
                .spawn(move || writer::run(st2, writer_rx, ev))
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
    let progress = opts.progress.map(|every| {
        let (metrics, done) = (metrics.clone(), done.clone());
        let ids: Vec<NodeId> = g.nodes.iter().map(|n| n.id.clone()).collect();
        std::thread::spawn(move || report_progress(&ids, &metrics, &done, every))
    });
    let mut handles = Vec::new();
    for (id, task) in tasks {
        let (failures, cancel, stop) = (failures.clone(), cancel.clone(), stop.clone());
        let h = std::thread::Builder::new()
            .name(id.to_string())
            .spawn(move || {
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
    if !failures.is_empty() {
        let root = failures.iter().position(|f| !f.is_secondary()).unwrap_or(0);
        return Ok(AttemptEnd::Failed(failures.swap_remove(root)));
    }
    if let Some(Ok(DriverEnd::Stopped)) = coordinator_end {
        return Err(setup("the checkpoint coordinator stopped before the job's final checkpoint".into()));
    }
    Ok(AttemptEnd::Done(summaries(g, &metrics)))
}

fn summaries(g: &crate::graph::logical::JobGraph, metrics: &[Arc<NodeMetrics>]) -> Vec<NodeSummary> {
    g.nodes
        .iter()
        .zip(metrics)
        .map(|(n, m)| {
            let (records_in, records_out) = m.read();
            let feedback_peak_batches = m.feedback_peak_batches.load(Ordering::Relaxed);
            NodeSummary { id: n.id.clone(), records_in, records_out, feedback_peak_batches }
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
        eprintln!("[{:>6.1}s] {}", start.elapsed().as_secs_f64(), parts.join(" | "));
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
