//! Which subtasks' states a process loads from a checkpoint. One process loads all of them.
//! On a cluster, a worker loads (and downloads from the object store) only what its own
//! subtasks restore from, and the coordinator only its sinks' states (it commits what a
//! finished job left pending and names the sink subtasks a rescale retired): a recovery
//! moves each byte of keyed state to one machine, not to every one.
//!
//! Invariant: for every subtask `here` names, [`recovery::plan`](super::recovery::plan) over
//! the states of [`Subset::of`] gives that subtask exactly what it gets over the whole
//! checkpoint. At unchanged parallelism a subtask restores only its own old state, except a
//! Kafka source's (offsets follow their partitions: every old subtask's). A node whose
//! parallelism changed moves state between all its subtasks (split and union lists, records
//! in flight, the sinks of retired subtasks), so every subtask of it is loaded.

use std::collections::BTreeSet;

use crate::checkpoint::metadata::Manifest;
use crate::graph::logical::{JobGraph, NodeKind, SourceKind};

/// What a process loads, decided once it has read the checkpoint's manifest.
pub type Scope<'a> = &'a dyn Fn(&Manifest) -> Subset;

/// One process's scope: everything.
pub fn everything(_: &Manifest) -> Subset {
    Subset::All
}

/// The subtasks (uid, index in the checkpoint) whose states are loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Subset {
    /// Every subtask's.
    #[default]
    All,
    /// Only these.
    Only(BTreeSet<(String, u32)>),
}

impl Subset {
    /// Whether subtask `subtask` of node `uid` (as the checkpoint numbers it) is loaded.
    pub fn contains(&self, uid: &str, subtask: u32) -> bool {
        match self {
            Subset::All => true,
            Subset::Only(s) => s.contains(&(uid.to_string(), subtask)),
        }
    }

    /// What the subtasks `here(node index, subtask)` of `graph` restore from a checkpoint
    /// with `manifest`. Nodes the graph no longer has restore nothing (their state is
    /// dropped, if the user allowed it).
    pub fn of(manifest: &Manifest, graph: &JobGraph, here: &dyn Fn(usize, u32) -> bool) -> Subset {
        let mut only = BTreeSet::new();
        for entry in &manifest.operators {
            let Some(ni) = graph.node_index(&entry.uid) else { continue };
            let node = &graph.nodes[ni];
            let any_here = (0..node.parallelism).any(|s| here(ni, s));
            let whole =
                entry.parallelism != node.parallelism || matches!(node.kind, NodeKind::Source(SourceKind::Kafka(_)));
            for s in &entry.subtasks {
                if (whole && any_here) || (s.index < node.parallelism && here(ni, s.index)) {
                    only.insert((entry.uid.clone(), s.index));
                }
            }
        }
        Subset::Only(only)
    }

    /// The coordinator's part of a cluster's checkpoint: every sink subtask's state.
    pub fn sinks(manifest: &Manifest, graph: &JobGraph) -> Subset {
        Subset::of(manifest, graph, &|ni, _| matches!(graph.nodes[ni].kind, NodeKind::Sink(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::metadata::{CheckpointMetrics, FORMAT_VERSION, OperatorEntry, SubtaskEntry};

    fn manifest(nodes: &[(&str, u32)]) -> Manifest {
        let entry = |&(uid, p): &(&str, u32)| OperatorEntry {
            uid: uid.into(),
            kind: "operator".into(),
            parallelism: p,
            component: None,
            subtasks: (0..p)
                .map(|i| SubtaskEntry {
                    index: i,
                    file: format!("{uid}-{i}.state"),
                    bytes: 1,
                    crc32: 0,
                    key_groups: (0, 0),
                    chain: vec![],
                    timing: None,
                })
                .collect(),
            retired: vec![],
        };
        Manifest {
            format_version: FORMAT_VERSION,
            kind: Default::default(),
            job: "j".into(),
            checkpoint_id: 3,
            created_unix_ms: 0,
            finished: false,
            max_parallelism: 8,
            operators: nodes.iter().map(entry).collect(),
            metrics: CheckpointMetrics::default(),
        }
    }

    /// A generator at parallelism 2, a Kafka source, and sinks after each at `sink_p`.
    fn graph(sink_p: u32) -> JobGraph {
        let src = format!(
            "[job]\nname = \"j\"\nmax_parallelism = 8\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1\nparallelism = 2\n\
             [[source]]\nid = \"kaf\"\ntype = \"kafka\"\nbootstrap_servers = \"127.0.0.1:1\"\ntopics = [\"t\"]\nparallelism = 2\n\
             [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"gen\", partition = \"rebalance\" }}]\nparallelism = {sink_p}\n\
             [[sink]]\nid = \"kout\"\ntype = \"blackhole\"\ninputs = [{{ from = \"kaf\", partition = \"rebalance\" }}]\nparallelism = 2\n"
        );
        crate::job::parse(std::path::Path::new("/x/job.toml"), &src).unwrap()
    }

    fn only(items: &[(&str, u32)]) -> Subset {
        Subset::Only(items.iter().map(|&(u, s)| (u.to_string(), s)).collect())
    }

    #[test]
    fn a_worker_loads_its_own_subtasks_all_of_a_kafka_source_and_all_of_a_rescaled_node() {
        let m = manifest(&[("gen", 2), ("kaf", 2), ("out", 3), ("kout", 2), ("gone", 2)]);
        let g = graph(2);
        let (generator, kaf, out) =
            (g.node_index("gen").unwrap(), g.node_index("kaf").unwrap(), g.node_index("out").unwrap());
        // Subtask 1 of each node runs here.
        let s = Subset::of(&m, &g, &|_, s| s == 1);
        assert_eq!(
            s,
            only(&[("gen", 1), ("kaf", 0), ("kaf", 1), ("kout", 1), ("out", 0), ("out", 1), ("out", 2)]),
            "own subtasks; every Kafka source's offsets; every state of the sink rescaled from 3 to 2; none of `gone`"
        );
        // Nothing of a node none of whose subtasks run here.
        let s = Subset::of(&m, &g, &|ni, _| ni == generator);
        assert_eq!(s, only(&[("gen", 0), ("gen", 1)]));
        assert!(!s.contains("kaf", 0) && !s.contains("out", 2));
        let s = Subset::of(&m, &g, &|ni, s| (ni == kaf || ni == out) && s == 0);
        assert!(s.contains("kaf", 1) && s.contains("out", 2) && !s.contains("kout", 0));
        assert!(Subset::All.contains("anything", 9));
    }

    #[test]
    fn the_coordinator_loads_every_sink_subtask_and_nothing_else() {
        let m = manifest(&[("gen", 2), ("kaf", 2), ("out", 2), ("kout", 2)]);
        let s = Subset::sinks(&m, &graph(2));
        assert_eq!(s, only(&[("kout", 0), ("kout", 1), ("out", 0), ("out", 1)]));
    }
}
