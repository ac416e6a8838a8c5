//! Checks a live upgrade before it reaches the running job: the new component must fit the
//! operator's place in the graph (same number of inputs, the side outputs its edges use at
//! the same ports, keyed state only behind hash inputs) and must be able to take over the
//! running component's state (`checkpoint::compat`). Nothing is sent to the subtasks unless
//! this passes, so a refused upgrade leaves the job untouched.

use crate::checkpoint::compat::{self, Verdict, state_entry};
use crate::checkpoint::metadata::ComponentEntry;
use crate::graph::logical::{JobGraph, NodeKind};
use crate::graph::partition::Partition;
use crate::operator::OperatorFactory;

/// The recorded form of a component (for manifests and compatibility checks).
pub fn component_entry(f: &OperatorFactory) -> ComponentEntry {
    let info = f.info();
    ComponentEntry {
        name: info.name.clone(),
        version: info.version.clone(),
        schema_version: info.schema_version,
        states: info.states.iter().map(state_entry).collect(),
        sha256: f.sha256().map(str::to_string),
        stored: None,
        replaces: Vec::new(),
    }
}

/// `name version (schema n)`.
pub fn describe(f: &OperatorFactory) -> String {
    format!("{} {} (schema {})", f.info().name, f.info().version, f.info().schema_version)
}

/// Checks replacing node `uid`'s running component `old` with `new`. Returns the node index
/// and what restoring will do.
pub fn validate(
    graph: &JobGraph,
    uid: &str,
    old: &OperatorFactory,
    new: &OperatorFactory,
) -> Result<(usize, Verdict), String> {
    let ni = graph.node_index(uid).ok_or_else(|| {
        let ops: Vec<&str> =
            graph.nodes.iter().filter(|n| matches!(n.kind, NodeKind::Operator(_))).map(|n| n.id.as_str()).collect();
        format!("job `{}` has no operator `{uid}`; its operators are: {}", graph.name, ops.join(", "))
    })?;
    if !matches!(graph.nodes[ni].kind, NodeKind::Operator(_)) {
        return Err(format!("`{uid}` is a source or sink; only WASM operators can be upgraded"));
    }
    let (oi, ni_) = (old.info(), new.info());
    if oi.two_input != ni_.two_input {
        return Err(format!(
            "operator `{uid}` has {} input(s) but `{} {}` is a {}-input operator",
            if oi.two_input { 2 } else { 1 },
            ni_.name,
            ni_.version,
            if ni_.two_input { "two" } else { "one" }
        ));
    }
    for e in graph.outputs_of(ni) {
        if let Some(name) = &e.output {
            let port = ni_.side_outputs.iter().position(|s| s == name).map(|p| p as u32 + 1);
            if port != Some(e.port) {
                return Err(format!(
                    "operator `{uid}`'s side output `{name}` is used by the job at port {}, but `{} {}` declares \
                     side outputs [{}]; a live upgrade must keep the side outputs the job uses, in order",
                    e.port,
                    ni_.name,
                    ni_.version,
                    ni_.side_outputs.join(", ")
                ));
            }
        }
    }
    if ni_.has_keyed_state() && graph.inputs_of(ni).any(|e| e.partition != Partition::Hash) {
        return Err(format!(
            "`{} {}` keeps keyed state but operator `{uid}`'s inputs are not all hash partitioned",
            ni_.name, ni_.version
        ));
    }
    if graph.edges.iter().any(|e| e.to == ni && e.feedback) {
        return Err(format!(
            "operator `{uid}` is a loop head (it has a feedback input); live upgrades of loop heads are not \
             supported: stop the job with a savepoint and restore it with the new component"
        ));
    }
    let verdict =
        compat::check(uid, "the running job", &component_entry(old), ni_, false).map_err(|e| e.to_string())?;
    Ok((ni, verdict))
}
