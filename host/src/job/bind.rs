//! Checks a [`JobGraph`] against its components (loaded once per job): worlds against
//! input sides, keyed state against partitioning, side output names against declarations, and
//! the job against the operators themselves ([`dry_run`](crate::job::dry_run)), so a job the
//! operators would refuse is refused before it starts.

use std::collections::BTreeMap;
use std::sync::Arc;

use thiserror::Error;
use wasmtime::Engine;

use crate::graph::logical::{DEAD_LETTER, JobGraph, NodeKind, OnError, Side};
use crate::graph::partition::Partition;
use crate::job::JobError;
use crate::operator::OperatorFactory;
use crate::sandbox::instance::{LoadError, LoadedComponent};

/// Why a job cannot be bound to its components.
#[derive(Debug, Error)]
pub enum BindError {
    /// The job file does not fit its components (names the file and line).
    #[error(transparent)]
    Job(#[from] JobError),
    /// A component cannot be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// A job whose components are compiled and match its graph.
pub struct BoundJob {
    /// The graph, with output ports resolved.
    pub graph: JobGraph,
    /// Component of each operator node, by node index.
    pub components: BTreeMap<usize, OperatorFactory>,
    /// Things the user should know before running (e.g. a sink weaker than exactly-once).
    pub warnings: Vec<String>,
}

/// Loads every component of `graph` and checks the graph against them.
pub fn bind(engine: &Engine, mut graph: JobGraph) -> Result<BoundJob, BindError> {
    let mut components = BTreeMap::new();
    for (i, n) in graph.nodes.iter().enumerate() {
        if let NodeKind::Operator(op) = &n.kind {
            let f = if op.component.as_os_str() == "native:keyed-count" {
                OperatorFactory::NativeKeyedCount(Arc::new(crate::operator::native::info()))
            } else {
                OperatorFactory::Wasm(Arc::new(LoadedComponent::load(engine, n.id.as_str(), &op.component)?))
            };
            components.insert(i, f);
        }
    }
    let err = |line: usize, message: String| JobError { file: graph.file.clone(), line: Some(line), message };
    for (&i, c) in &components {
        let node = &graph.nodes[i];
        let info = c.info();
        let inputs: Vec<_> = graph.inputs_of(i).collect();
        if info.two_input {
            for e in &inputs {
                if !e.side_given {
                    return Err(err(e.line, format!(
                        "`{}` is a two-input operator ({} {}); give each input `side = \"left\"` or `side = \"right\"`",
                        node.id, info.name, info.version
                    )).into());
                }
            }
            for (side, name) in [(Side::Left, "left"), (Side::Right, "right")] {
                if !inputs.iter().any(|e| e.side == side) {
                    return Err(err(
                        node.line,
                        format!(
                            "two-input operator `{}` has no {name} input; add one with `side = \"{name}\"`",
                            node.id
                        ),
                    )
                    .into());
                }
            }
        } else if let Some(e) = inputs.iter().find(|e| e.side_given) {
            return Err(err(
                e.line,
                format!(
                    "`{}` is a one-input operator ({} {}); remove `side` from its inputs (several inputs are a union)",
                    node.id, info.name, info.version
                ),
            )
            .into());
        }
        let disk = node.state_on_disk();
        if disk && !info.pageable {
            return Err(err(
                node.line,
                format!(
                    "operator `{}` ({} {}) cannot run on state_backend = \"disk\": its component does not page its \
                     keyed state (the `paged-operator` worlds; the Rust SDK builds them); rebuild it with the current \
                     Rust SDK (weir-guest) or use state_backend = \"memory\"",
                    node.id, info.name, info.version
                ),
            )
            .into());
        }
        if info.has_keyed_state() {
            let states: Vec<&str> = info.states.iter().filter(|s| s.keyed).map(|s| s.name.as_str()).collect();
            for e in &inputs {
                if e.partition != Partition::Hash {
                    return Err(err(e.line, format!(
                        "operator `{}` keeps keyed state ({}) but its input from `{}` uses partition `{}`; use `partition = \"hash\"`",
                        node.id, states.join(", "), graph.nodes[e.from].id, e.partition.name()
                    )).into());
                }
            }
        }
    }
    for e in &mut graph.edges {
        let Some(name) = &e.output else { continue };
        let c = &components[&e.from];
        let dead_letters =
            matches!(&graph.nodes[e.from].kind, NodeKind::Operator(o) if o.on_error == OnError::DeadLetter);
        match c.info().side_outputs.iter().position(|s| s == name) {
            Some(_) if dead_letters && name == DEAD_LETTER => {
                return Err(JobError {
                    file: graph.file.clone(),
                    line: Some(e.line),
                    message: format!(
                        "`{}` declares a side output named `{DEAD_LETTER}`, which `on_error = \"dead-letter\"` uses for \
                         its dead letters; rename the side output or drop on_error",
                        graph.nodes[e.from].id
                    ),
                }
                .into());
            }
            Some(p) => e.port = p as u32 + 1,
            None if dead_letters && name == DEAD_LETTER => e.port = c.info().side_outputs.len() as u32 + 1,
            None => {
                return Err(JobError {
                    file: graph.file.clone(),
                    line: Some(e.line),
                    message: format!(
                        "`{}` has no side output `{name}`; it declares: [{}]{}",
                        graph.nodes[e.from].id,
                        c.info().side_outputs.join(", "),
                        if name == DEAD_LETTER {
                            " (dead letters need `on_error = \"dead-letter\"` on the operator)"
                        } else {
                            ""
                        }
                    ),
                }
                .into());
            }
        }
    }
    crate::job::dry_run::check(&graph, &components)?;
    let mut warnings = Vec::new();
    if graph.checkpoint.is_some() {
        for n in &graph.nodes {
            if let NodeKind::Source(k) = &n.kind
                && !k.replayable()
            {
                warnings.push(format!(
                    "source `{}` cannot rewind: the job runs at-least-once as [job] guarantee says, and records it \
                     delivered after the last checkpoint are not read again after a failure",
                    n.id
                ));
            }
        }
        for n in &graph.nodes {
            if let NodeKind::Sink(crate::graph::logical::SinkKind::Stdout { .. }) = &n.kind {
                warnings.push(format!(
                    "sink `{}` writes to stdout, which cannot be rolled back: its output is at-least-once \
                     (records may repeat after a failure); use a file sink for exactly-once output",
                    n.id
                ));
            }
        }
    }
    Ok(BoundJob { graph, components, warnings })
}
