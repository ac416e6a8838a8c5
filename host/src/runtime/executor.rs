//! Turns a bound job into running subtasks: one thread per subtask, one bounded channel
//! per (upstream subtask, downstream subtask) pair of every edge, and waits for the end.
//!
//! Invariants: a failing subtask drops its channels, so its neighbours see a disconnect and
//! stop too, and the cancel flag stops the rest; the job's error is the first root cause
//! (not the disconnects it caused).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

use crate::connectors::file_sink::{FileSink, clear_parts};
use crate::connectors::file_source::FileSource;
use crate::connectors::generator::Generator;
use crate::graph::logical::{NodeKind, SinkKind, SourceKind};
use crate::graph::partition::Partition;
use crate::ids::{NodeId, SubtaskIndex, TaskId};
use crate::job::bind::BoundJob;
use crate::keygroup::key_group_range;
use crate::runtime::error::{RunError, TaskFailure};
use crate::runtime::input::{InputChannel, Inputs};
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::output::{EdgeOutput, Output};
use crate::runtime::sink::{SinkTask, SinkWriter};
use crate::runtime::source::{SourceReader, SourceTask};
use crate::runtime::task::OperatorTask;
use crate::sandbox::bindings::types::TaskInfo;
use crate::sandbox::host::HostState;

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Print a progress line to stderr this often.
    pub progress: Option<Duration>,
    /// Echo guest log lines to stderr.
    pub quiet_guests: bool,
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
}

/// What a finished run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Wall time.
    pub elapsed: Duration,
    /// Per node, in job file order.
    pub nodes: Vec<NodeSummary>,
}

enum Task {
    Source(SourceTask),
    Operator(Box<dyn FnOnce() -> Result<OperatorTask, TaskFailure> + Send>),
    Sink(SinkTask),
}

/// Runs `job` until its sources are exhausted and every subtask finished.
pub fn run(job: &BoundJob, opts: &RunOptions) -> Result<RunSummary, RunError> {
    let g = &job.graph;
    let started = Instant::now();
    let cancel = Arc::new(AtomicBool::new(false));
    let metrics: Vec<Arc<NodeMetrics>> = g.nodes.iter().map(|_| Arc::default()).collect();
    let setup = |message: String| RunError::Setup {
        job: g.name.clone(),
        message,
    };

    // Channels.
    let mut inputs: Vec<Vec<Vec<InputChannel>>> = g
        .nodes
        .iter()
        .map(|n| (0..n.parallelism).map(|_| Vec::new()).collect())
        .collect();
    let mut outputs: Vec<Vec<Vec<EdgeOutput>>> = g
        .nodes
        .iter()
        .map(|n| (0..n.parallelism).map(|_| Vec::new()).collect())
        .collect();
    for e in &g.edges {
        let (up, down) = (g.nodes[e.from].parallelism, g.nodes[e.to].parallelism);
        for u in 0..up {
            let targets: Vec<u32> = if e.partition == Partition::Forward {
                vec![u]
            } else {
                (0..down).collect()
            };
            let mut txs = Vec::with_capacity(targets.len());
            for d in targets {
                let (tx, rx) = bounded(g.channel_capacity);
                inputs[e.to][d as usize].push(InputChannel::new(rx, e.side));
                txs.push(tx);
            }
            outputs[e.from][u as usize].push(EdgeOutput::new(
                e.port,
                e.partition,
                txs,
                g.max_parallelism,
                u as usize,
            ));
        }
    }

    // Tasks.
    let mut tasks: Vec<(TaskId, Task)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if let NodeKind::Sink(SinkKind::File { path, .. }) = &n.kind {
            clear_parts(path).map_err(|e| {
                setup(format!(
                    "sink `{}`: cannot clear {}: {e}",
                    n.id,
                    path.display()
                ))
            })?;
        }
        for s in (0..n.parallelism).rev() {
            let id = TaskId {
                node: n.id.clone(),
                subtask: SubtaskIndex(s),
            };
            let ins = Inputs::new(inputs[i].pop().unwrap_or_default());
            let out = Output::new(
                outputs[i].pop().unwrap_or_default(),
                g.batch_size,
                256 * 1024,
            );
            let (m, c) = (metrics[i].clone(), cancel.clone());
            let task = match &n.kind {
                NodeKind::Source(SourceKind::Generator(cfg)) => Task::Source(SourceTask {
                    id: id.clone(),
                    reader: SourceReader::Generator(Generator::new(*cfg, s, n.parallelism)),
                    output: out,
                    batch_size: g.batch_size,
                    metrics: m,
                    cancel: c,
                }),
                NodeKind::Source(SourceKind::File { path, key_column }) => {
                    let f = FileSource::open(path, s, n.parallelism, *key_column).map_err(|e| {
                        setup(format!(
                            "source `{}`: cannot open {}: {e}",
                            n.id,
                            path.display()
                        ))
                    })?;
                    Task::Source(SourceTask {
                        id: id.clone(),
                        reader: SourceReader::File(f),
                        output: out,
                        batch_size: g.batch_size,
                        metrics: m,
                        cancel: c,
                    })
                }
                NodeKind::Operator(op) => {
                    let component = job.components[&i].clone();
                    let range = key_group_range(g.max_parallelism, n.parallelism, s);
                    let info = TaskInfo {
                        job_name: g.name.clone(),
                        operator_uid: n.id.to_string(),
                        subtask_index: s,
                        parallelism: n.parallelism,
                        max_parallelism: g.max_parallelism,
                        key_group_start: range.start,
                        key_group_end: range.end,
                    };
                    let config = op.config.clone();
                    let quiet = opts.quiet_guests;
                    let id2 = id.clone();
                    Task::Operator(Box::new(move || {
                        let mut host =
                            HostState::new(info, component.info.side_outputs.len() as u32);
                        host.echo_logs = !quiet;
                        let instance =
                            component
                                .instantiate(host)
                                .map_err(|e| TaskFailure::Guest {
                                    task: id2.clone(),
                                    source: e,
                                })?;
                        Ok(OperatorTask {
                            id: id2,
                            instance,
                            config,
                            inputs: ins,
                            output: out,
                            metrics: m,
                            cancel: c,
                        })
                    }))
                }
                NodeKind::Sink(kind) => {
                    let writer = match kind {
                        SinkKind::File { path, format } => {
                            SinkWriter::File(FileSink::open(path, s, 0, *format).map_err(|e| {
                                setup(format!(
                                    "sink `{}`: cannot write to {}: {e}",
                                    n.id,
                                    path.display()
                                ))
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
                    })
                }
            };
            tasks.push((id, task));
        }
    }

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
        let (failures, cancel) = (failures.clone(), cancel.clone());
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
                    Err(TaskFailure::Panicked {
                        task: id.clone(),
                        message,
                    })
                });
                if let Err(f) = r {
                    cancel.store(true, Ordering::Relaxed);
                    failures.lock().unwrap().push(f);
                }
            })
            .map_err(|e| setup(format!("cannot start a thread: {e}")))?;
        handles.push(h);
    }
    for h in handles {
        let _ = h.join();
    }
    done.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        let _ = p.join();
    }
    let mut failures = std::mem::take(&mut *failures.lock().unwrap());
    if !failures.is_empty() {
        let root = failures.iter().position(|f| !f.is_secondary()).unwrap_or(0);
        return Err(RunError::Failed {
            job: g.name.clone(),
            cause: failures.swap_remove(root),
        });
    }
    Ok(RunSummary {
        elapsed: started.elapsed(),
        nodes: g
            .nodes
            .iter()
            .zip(&metrics)
            .map(|(n, m)| {
                let (records_in, records_out) = m.read();
                NodeSummary {
                    id: n.id.clone(),
                    records_in,
                    records_out,
                }
            })
            .collect(),
    })
}

fn report_progress(
    ids: &[NodeId],
    metrics: &[Arc<NodeMetrics>],
    done: &AtomicBool,
    every: Duration,
) {
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
            parts.push(format!(
                "{id}: in {}/s out {}/s",
                human((i - l.0) as f64 / dt),
                human((o - l.1) as f64 / dt)
            ));
            *l = (i, o);
        }
        eprintln!(
            "[{:>6.1}s] {}",
            start.elapsed().as_secs_f64(),
            parts.join(" | ")
        );
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
