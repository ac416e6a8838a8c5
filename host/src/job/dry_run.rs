//! The checks a job's operators make on themselves before it starts: a probe instance of each
//! operator (one subtask owning every key group, the job's limits, logs not echoed) runs its
//! `setup` on its `config`, then takes the first records its inputs would carry — the first
//! events of every `nexmark` source, through the probes upstream of it, in the order of the
//! graph. An operator that refuses its configuration (a window of size 0) or the stream it is
//! wired to (a stage fed raw events instead of its upstream stage's output) is an error naming
//! it and its line in the job file, before any task starts, instead of a failed job after it did.
//!
//! Invariant: the probes are dropped after the check; nothing they emit leaves this module, and
//! they run inside the caller's accounting (`weir serve` charges the tenant's bind).

use std::collections::BTreeMap;

use crate::graph::logical::{JobGraph, NodeKind, OnError, SourceKind};
use crate::graph::partition::Partition;
use crate::job::JobError;
use crate::operator::{OperatorFactory, OperatorLogic};
use crate::record::Batch;
use crate::sandbox::host::HostState;

/// Events of each deterministic source the probes take.
pub const SAMPLE_EVENTS: u64 = 500;

/// Runs the probes of `graph` (see the module docs).
pub fn check(graph: &JobGraph, components: &BTreeMap<usize, OperatorFactory>) -> Result<(), JobError> {
    let refused = |i: usize, what: &str, why: String| -> JobError {
        let node = &graph.nodes[i];
        JobError {
            file: graph.file.clone(),
            line: Some(node.line),
            message: format!("operator `{}` {what}: {why}", node.id),
        }
    };
    let mut probes: BTreeMap<usize, Box<dyn OperatorLogic>> = BTreeMap::new();
    for (&i, c) in components {
        let NodeKind::Operator(op) = &graph.nodes[i].kind else { continue };
        let mut probe =
            c.instantiate(probe_host(graph, i, c)).map_err(|e| refused(i, "cannot start", e.to_string()))?;
        probe
            .open(&op.config)
            .map_err(|e| refused(i, "refuses its configuration", format!("{e}; fix its `config`")))?;
        probes.insert(i, probe);
    }
    // Records flow only along a graph without loops: a loop's probe would wait for itself.
    if graph.edges.iter().any(|e| e.feedback) {
        return Ok(());
    }
    let mut pending: BTreeMap<usize, Batch> = BTreeMap::new();
    for (i, n) in graph.nodes.iter().enumerate() {
        if let NodeKind::Source(SourceKind::Nexmark(cfg)) = &n.kind {
            let mut out = Batch::default();
            let mut value = Vec::new();
            for pos in 0..SAMPLE_EVENTS.min(cfg.count) {
                value.clear();
                let (key, ts) = cfg.params.encode(pos, &mut value);
                out.push(0, ts, &key.to_le_bytes(), &value);
            }
            pending.insert(i, out);
        }
    }
    for i in topological(graph) {
        let Some(out) = pending.remove(&i) else { continue };
        for e in graph.edges.iter().filter(|e| e.from == i) {
            let Some(probe) = probes.get_mut(&e.to) else { continue };
            let mut batch = Batch::default();
            for r in out.iter().filter(|r| r.tag == e.port) {
                let tag = match e.partition {
                    Partition::Hash => crate::keygroup::key_group(r.key, graph.max_parallelism),
                    _ => crate::record::NO_KEY_GROUP,
                };
                batch.push(tag, r.timestamp, r.key, r.value);
            }
            if batch.is_empty() {
                continue;
            }
            let dead_letters =
                matches!(&graph.nodes[e.to].kind, NodeKind::Operator(o) if o.on_error == OnError::DeadLetter);
            match probe.process(e.side, &batch) {
                Ok(()) => {
                    let emitted = probe.take_emitted();
                    let next = pending.entry(e.to).or_default();
                    for r in emitted.iter() {
                        next.push(r.tag, r.timestamp, r.key, r.value);
                    }
                }
                // Its failing records go to the dead-letter output, as they would in the job.
                Err(crate::sandbox::instance::GuestError::Failed { .. }) if dead_letters => {
                    let _ = probe.take_emitted();
                }
                Err(err) => {
                    return Err(refused(
                        e.to,
                        "fails on the first records of the stream",
                        format!(
                            "{err} (on its input from `{}`, with the first {SAMPLE_EVENTS} events of the job's \
                             sources, before the job started)",
                            graph.nodes[e.from].id
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Host state of a probe: one subtask owning every key group.
fn probe_host(graph: &JobGraph, i: usize, c: &OperatorFactory) -> HostState {
    let task = crate::sandbox::bindings::types::TaskInfo {
        job_name: graph.name.clone(),
        operator_uid: graph.nodes[i].id.to_string(),
        subtask_index: 0,
        parallelism: 1,
        max_parallelism: graph.max_parallelism,
        key_group_start: 0,
        key_group_end: graph.max_parallelism,
    };
    let mut host = HostState::new(task, c.info().side_outputs.len() as u32).with_limits(graph.limits);
    host.echo_logs = false;
    host
}

/// Node indices with every node after all nodes with an edge into it (the graph has no loop).
fn topological(graph: &JobGraph) -> Vec<usize> {
    let mut indegree = vec![0usize; graph.nodes.len()];
    for e in &graph.edges {
        indegree[e.to] += 1;
    }
    let mut ready: Vec<usize> = (0..graph.nodes.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(graph.nodes.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        for e in graph.edges.iter().filter(|e| e.from == i) {
            indegree[e.to] -= 1;
            if indegree[e.to] == 0 {
                ready.push(e.to);
            }
        }
    }
    order
}
