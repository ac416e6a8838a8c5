//! A subtask of the physical plan made runnable: its source opened and rewound, its sink opened
//! on its restored transaction, or its operator's instance prepared (instantiated on the
//! subtask's own thread, so a slow instantiation never holds up the others).
//!
//! Invariants: a connector that cannot be reached when the job first starts refuses the job
//! (a setup error naming the node and subtask); at a restart the same failure is a failed
//! attempt, which the restart strategy retries. Nothing here knows about threads or channels
//! beyond the `Inputs` and `Output` it is handed.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::checkpoint::snapshot::{SourcePosition, SubtaskState};
use crate::checkpoint::storage::LoadedCheckpoint;
use crate::connectors::file_sink::FileSink;
use crate::connectors::file_source::FileSource;
use crate::connectors::generator::Generator;
use crate::connectors::kafka::sink::{KafkaSink, Opening as KafkaOpening};
use crate::connectors::kafka::source::KafkaReader;
use crate::connectors::nexmark::NexmarkSource;
use crate::connectors::postgres_sink::{Opening as PostgresOpening, PostgresSink};
use crate::connectors::throttle::Throttle;
use crate::graph::logical::{JobGraph, Node, NodeKind, OnError, OperatorNode, SinkKind, SourceKind, StateBackend};
use crate::graph::physical::SubtaskPlan;
use crate::ids::TaskId;
use crate::operator::{OperatorFactory, OperatorLogic};
use crate::runtime::error::{RunError, TaskFailure};
use crate::runtime::executor::{LATENCY_WARMUP_MS, RunOptions};
use crate::runtime::input::Inputs;
use crate::runtime::latency::LatencyRecorder;
use crate::runtime::metrics::{NodeMetrics, SubtaskMetrics};
use crate::runtime::output::Output;
use crate::runtime::participant::Participant;
use crate::runtime::sink::{SinkTask, SinkWriter, pg_failure};
use crate::runtime::source::{SourceReader, SourceTask, kafka_failure};
use crate::runtime::task::{Faults, OperatorTask, Restore};
use crate::runtime::termination::LoopTermination;
use crate::sandbox::bindings::types::TaskInfo;
use crate::sandbox::host::HostState;

/// A subtask ready to run on a thread.
pub enum Task {
    /// A source.
    Source(SourceTask),
    /// An operator: instantiates its component, then runs.
    Operator(Box<dyn FnOnce() -> Result<OperatorTask, TaskFailure> + Send>),
    /// A sink.
    Sink(SinkTask),
}

impl Task {
    /// Runs the subtask to its end.
    pub fn run(self) -> Result<(), TaskFailure> {
        match self {
            Task::Source(t) => t.run(),
            Task::Operator(make) => make().and_then(|t| t.run()),
            Task::Sink(t) => t.run(),
        }
    }
}

/// Why a subtask could not be made runnable.
pub enum StartError {
    /// The job cannot start (refused before any task runs).
    Setup(RunError),
    /// This attempt fails (an external system unreachable at a restart).
    Attempt(TaskFailure),
}

/// What the attempt hands every subtask it deploys.
pub struct Parts {
    /// Identity.
    pub id: TaskId,
    /// Its input channels.
    pub inputs: Inputs,
    /// Its output edges.
    pub output: Output,
    /// Its node's metrics.
    pub metrics: Arc<NodeMetrics>,
    /// Its own counters.
    pub counters: Arc<SubtaskMetrics>,
    /// The attempt's cancel flag.
    pub cancel: Arc<AtomicBool>,
    /// Its side of checkpointing (`None`: checkpointing off).
    pub checkpoints: Option<Participant>,
    /// Loop termination (cyclic jobs).
    pub termination: Option<Arc<LoopTermination>>,
    /// The state it restores.
    pub restored: Option<SubtaskState>,
}

/// The attempt-wide facts a subtask is built from.
pub struct Context<'a> {
    /// The job.
    pub graph: &'a JobGraph,
    /// How it runs.
    pub opts: &'a RunOptions,
    /// 0 for the first attempt.
    pub attempt: u32,
    /// The checkpoint the attempt restores.
    pub restore: Option<&'a LoadedCheckpoint>,
}

impl Context<'_> {
    fn setup(&self, message: String) -> StartError {
        StartError::Setup(RunError::Setup { job: self.graph.name.clone(), message })
    }

    /// An external system refused: the job is refused at its first start, the attempt fails
    /// at a restart.
    fn unreachable(&self, message: String, failure: TaskFailure) -> StartError {
        if self.attempt == 0 { self.setup(message) } else { StartError::Attempt(failure) }
    }

    fn faults(&self) -> Option<Faults> {
        self.opts.faults.clone().map(|plan| Faults { plan, attempt: self.attempt })
    }
}

/// Subtask `s` of the plan, made runnable with `parts`; `component` for operators.
pub fn build(
    cx: &Context<'_>,
    s: &SubtaskPlan,
    parts: Parts,
    component: Option<OperatorFactory>,
) -> Result<Task, StartError> {
    let n = &cx.graph.nodes[s.node];
    match &n.kind {
        NodeKind::Source(kind) => source(cx, n, kind, s.subtask, parts),
        NodeKind::Operator(op) => {
            let component = component.expect("every operator node has a component");
            Ok(operator(cx, n, op, s, component, parts))
        }
        NodeKind::Sink(kind) => sink(cx, n, kind, s.subtask, parts),
    }
}

fn source(cx: &Context<'_>, n: &Node, kind: &SourceKind, s: u32, parts: Parts) -> Result<Task, StartError> {
    let id = parts.id;
    let mut reader = match kind {
        SourceKind::Generator(cfg) => SourceReader::Generator(Generator::new(*cfg, s, n.parallelism)),
        SourceKind::Stdin => SourceReader::File(FileSource::stdin(s, n.parallelism)),
        SourceKind::Nexmark(cfg) => SourceReader::Nexmark(NexmarkSource::new(*cfg, s, n.parallelism)),
        SourceKind::File { path, key_column, rate, event_time } => SourceReader::File(
            FileSource::open(path, s, n.parallelism, *key_column, *rate)
                .map_err(|e| cx.setup(format!("source `{}`: cannot open {}: {e}", n.id, path.display())))?
                .with_event_time(*event_time),
        ),
        SourceKind::Kafka(cfg) => {
            let offsets = match parts.restored.as_ref().and_then(|st| st.source.as_ref()) {
                Some(SourcePosition::Kafka { partitions }) => Some(&partitions[..]),
                _ => None,
            };
            match KafkaReader::open(cfg, s, n.parallelism, offsets) {
                Ok(r) => SourceReader::Kafka(Box::new(r)),
                Err(e) => {
                    return Err(cx.unreachable(format!("source `{}` subtask {s}: {e}", n.id), kafka_failure(&id, e)));
                }
            }
        }
    };
    if let Some(pos) = parts.restored.as_ref().and_then(|st| st.source.clone())
        && !matches!(reader, SourceReader::Kafka(_))
    {
        reader.seek(pos).map_err(|e| cx.setup(format!("source `{id}`: {e}")))?;
    }
    Ok(Task::Source(SourceTask {
        id,
        reader,
        output: parts.output,
        batch_size: cx.graph.batch_size,
        metrics: parts.metrics,
        counters: parts.counters,
        cancel: parts.cancel,
        checkpoints: parts.checkpoints,
        termination: parts.termination,
        suspend_after: None,
        suspended: false,
        faults: cx.faults(),
        hold_input: cx.opts.hold_input.clone(),
    }))
}

fn operator(
    cx: &Context<'_>,
    n: &Node,
    op: &OperatorNode,
    s: &SubtaskPlan,
    component: OperatorFactory,
    parts: Parts,
) -> Task {
    let g = cx.graph;
    let info = TaskInfo {
        job_name: g.name.clone(),
        operator_uid: n.id.to_string(),
        subtask_index: s.subtask,
        parallelism: n.parallelism,
        max_parallelism: g.max_parallelism,
        key_group_start: s.key_groups.start,
        key_group_end: s.key_groups.end,
    };
    // The restored state was written by the schema its manifest records.
    let schema_version = cx
        .restore
        .and_then(|c| c.manifest.operator(n.id.as_str()))
        .and_then(|o| o.component.as_ref())
        .map_or(component.info().schema_version, |c| c.schema_version);
    let restore = parts.restored.map(|state| Restore { schema_version, state });
    let config = op.config.clone();
    let dead_letter = (op.on_error == OnError::DeadLetter).then(|| component.info().side_outputs.len() as u32 + 1);
    let (limits, quiet, faults) = (g.limits, cx.opts.quiet_guests, cx.faults());
    let (backend, key_groups) = (op.state_backend, s.key_groups.start..s.key_groups.end);
    // The guest's cache: as set, else a quarter of its memory (the rest holds batches, the
    // pages in flight and the allocator's slack).
    let cache = op.state_cache_mb.map_or(limits.memory_mb << 18, |(mb, _)| mb << 20) as usize;
    let paging = parts.metrics.paging.clone();
    let root = cx.opts.state_dir.as_ref().map_or_else(crate::operator::paged::state_root, |d| d.join("weir-state"));
    let track = g.checkpoint.as_ref().is_some_and(|c| c.incremental);
    let budget = cx.opts.disk_budget.clone();
    let ledger = crate::checkpoint::evidence::GroupLedger::new(s.key_groups.start, s.key_groups.end);
    let Parts { id, inputs, output, metrics, counters, cancel, checkpoints, termination, .. } = parts;
    Task::Operator(Box::new(move || {
        let mut host = HostState::new(info, component.info().side_outputs.len() as u32).with_limits(limits);
        host.echo_logs = !quiet;
        let instance = component.instantiate(host).map_err(|e| TaskFailure::Guest { task: id.clone(), source: e })?;
        let instance = match backend {
            StateBackend::Memory => instance,
            StateBackend::Disk => {
                paged(instance, &component, Paging { key_groups, cache, paging, root, track, budget })
                    .map_err(|message| TaskFailure::Limit { task: id.clone(), message })?
            }
        };
        Ok(OperatorTask {
            id,
            instance,
            config,
            inputs,
            output,
            metrics,
            counters,
            cancel,
            checkpoints,
            restore,
            schema_version: component.info().schema_version,
            faults,
            termination,
            deferred: Default::default(),
            draining: None,
            ledger,
            upgrade: None,
            upgrade_ready: None,
            dead_letter,
        })
    }))
}

/// How a disk-backed operator subtask pages its state.
struct Paging {
    key_groups: std::ops::Range<u32>,
    /// Bytes of the guest's cache.
    cache: usize,
    paging: std::sync::Arc<crate::operator::paged::PagingCounters>,
    /// Where the stores live.
    root: std::path::PathBuf,
    /// Incremental checkpoints: the store tracks what changed.
    track: bool,
    /// The tenant's disk budget (`weir serve`).
    budget: Option<std::sync::Arc<crate::disk_budget::DiskBudget>>,
}

/// `instance` on the disk backend: a new store under `p.root`.
fn paged(
    instance: Box<dyn OperatorLogic>,
    component: &OperatorFactory,
    p: Paging,
) -> Result<Box<dyn OperatorLogic>, String> {
    let states = component.info().states.iter().filter(|s| s.keyed).map(|s| s.name.clone()).collect();
    let dir = crate::operator::paged::fresh_store_dir(&p.root);
    let setup = crate::operator::paged::Setup {
        states,
        groups: p.key_groups,
        cache_bytes: p.cache,
        track: p.track,
        budget: p.budget,
        schema_version: component.info().schema_version,
    };
    let paged = crate::operator::paged::Paged::new(instance, &dir, setup, p.paging)
        .map_err(|e| format!("{e} (give the disk backend a writable directory with space: WEIR_STATE_DIR)"))?;
    Ok(Box::new(paged))
}

fn sink(cx: &Context<'_>, n: &Node, kind: &SinkKind, s: u32, parts: Parts) -> Result<Task, StartError> {
    let id = parts.id;
    let restored = parts.restored;
    let writer = match kind {
        SinkKind::File { path, format, .. } => {
            let st = restored.as_ref().and_then(|st| st.sink.clone());
            let adopted = restored.as_ref().map(|st| st.adopted_sinks.clone()).unwrap_or_default();
            SinkWriter::File(
                FileSink::open_adopting(path, s, *format, st.as_ref(), &adopted)
                    .map_err(|e| cx.setup(format!("sink `{id}`: cannot write to {}: {e}", path.display())))?
                    .with_budget(cx.opts.disk_budget.clone()),
            )
        }
        SinkKind::Stdout { format } => SinkWriter::Stdout(*format),
        SinkKind::Postgres(target) => {
            let st = restored.as_ref().and_then(|st| st.sink.clone());
            let adopted = restored.as_ref().map(|st| st.adopted_sinks.clone()).unwrap_or_default();
            let opening = PostgresOpening {
                subtask: s,
                parallelism: n.parallelism,
                restored: st.as_ref(),
                adopted: &adopted,
                checkpoint_interval: cx
                    .graph
                    .checkpoint
                    .as_ref()
                    .map(|c| Duration::from_millis(c.settings.interval_ms)),
            };
            match PostgresSink::open(target, opening) {
                Ok(sink) => SinkWriter::Postgres(Box::new(sink)),
                Err(e) => return Err(cx.unreachable(format!("sink `{}` subtask {s}: {e}", n.id), pg_failure(&id, e))),
            }
        }
        SinkKind::Kafka(target) => {
            let blob = restored.as_ref().map(|st| &st.operator_state[..]);
            let adopted = restored.as_ref().map(|st| st.adopted_blobs.clone()).unwrap_or_default();
            match KafkaSink::open(target, KafkaOpening { subtask: s, restored: blob, adopted: &adopted }) {
                Ok(sink) => SinkWriter::Kafka(Box::new(sink)),
                Err(e) => {
                    return Err(cx.unreachable(format!("sink `{}` subtask {s}: {e}", n.id), kafka_failure(&id, e)));
                }
            }
        }
        SinkKind::Blackhole { latency, .. } => {
            SinkWriter::Blackhole(latency.then(|| LatencyRecorder::new(LATENCY_WARMUP_MS)))
        }
    };
    Ok(Task::Sink(SinkTask {
        id,
        writer,
        inputs: parts.inputs,
        metrics: parts.metrics,
        counters: parts.counters,
        cancel: parts.cancel,
        checkpoints: parts.checkpoints,
        termination: parts.termination,
        aborted_early: Vec::new(),
        throttle: match kind {
            SinkKind::File { rate, .. } | SinkKind::Blackhole { rate, .. } => rate.map(Throttle::new),
            _ => None,
        },
        replay: restored.map(|st| st.backedge_log).unwrap_or_default(),
        aborted: Vec::new(),
    }))
}

/// A finished job restored: only its last commits may be missing, and opening each sink on
/// its restored state finishes them.
pub fn finish_commits(
    cx: &Context<'_>,
    restored_state: &dyn Fn(usize, u32) -> Option<SubtaskState>,
) -> Result<(), StartError> {
    for (i, n) in cx.graph.nodes.iter().enumerate() {
        for s in 0..n.parallelism {
            let st = restored_state(i, s);
            let id = TaskId { node: n.id.clone(), subtask: crate::ids::SubtaskIndex(s) };
            let finishing = |e: String| format!("sink `{}` subtask {s}: finishing its last commit: {e}", n.id);
            match &n.kind {
                NodeKind::Sink(SinkKind::File { path, format, .. }) => {
                    let sink = st.and_then(|st| st.sink);
                    FileSink::open(path, s, *format, sink.as_ref())
                        .map_err(|e| cx.setup(finishing(format!("{}: {e}", path.display()))))?;
                }
                NodeKind::Sink(SinkKind::Kafka(target)) => {
                    let blob = st.as_ref().map(|st| &st.operator_state[..]);
                    let adopted = st.as_ref().map(|st| st.adopted_blobs.clone()).unwrap_or_default();
                    if let Err(e) =
                        KafkaSink::open(target, KafkaOpening { subtask: s, restored: blob, adopted: &adopted })
                    {
                        return Err(cx.unreachable(finishing(e.to_string()), kafka_failure(&id, e)));
                    }
                }
                NodeKind::Sink(SinkKind::Postgres(target)) => {
                    let sink = st.as_ref().and_then(|st| st.sink.clone());
                    let adopted = st.as_ref().map(|st| st.adopted_sinks.clone()).unwrap_or_default();
                    let opening = PostgresOpening {
                        subtask: s,
                        parallelism: n.parallelism,
                        restored: sink.as_ref(),
                        adopted: &adopted,
                        checkpoint_interval: None,
                    };
                    if let Err(e) = PostgresSink::open(target, opening) {
                        return Err(cx.unreachable(finishing(e.to_string()), pg_failure(&id, e)));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}
