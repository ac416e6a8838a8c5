//! The physical plan of a job: its subtasks and the channels between them, derived from the
//! logical graph alone. Where the plan runs is a separate decision: `runtime/local.rs` deploys
//! it as threads of one process, and `graph/placement.rs` assigns its subtasks to workers'
//! slots.
//!
//! Invariants: one subtask per (node, index), in node order then index, each with its
//! key-group range; one channel per (edge, upstream subtask, downstream subtask) the edge's
//! partitioning connects (forward: `u → u`; otherwise `u →` every `d`), in (edge, upstream,
//! downstream) order. A subtask's inputs are its channels in that order, so input positions
//! (what alignment and sides refer to) follow the job file's edge order. Back-edges are
//! chosen per channel as a DFS of the physical graph would (ABS §3.3): every channel of a
//! feedback edge between two operators, but of a self-loop only `u → d` with `d <= u` (a
//! channel to a higher subtask is a regular input, aligned like any other; otherwise a
//! subtask could take a barrier on a back-edge before its own snapshot and fold post-barrier
//! records into it).

use std::ops::Range;

use crate::graph::logical::JobGraph;
use crate::graph::partition::Partition;
use crate::keygroup::key_group_range;

/// One subtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtaskPlan {
    /// Node index.
    pub node: usize,
    /// Subtask index within the node.
    pub subtask: u32,
    /// The key groups it owns.
    pub key_groups: Range<u32>,
}

/// One channel: the records of one edge from one upstream subtask to one downstream subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelPlan {
    /// Edge index.
    pub edge: usize,
    /// Upstream subtask index.
    pub from: u32,
    /// Downstream subtask index.
    pub to: u32,
    /// A back-edge of a loop: never blocks its sender, not aligned by its receiver.
    pub back: bool,
}

/// Subtasks and channels of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysicalPlan {
    /// Every subtask, node order then index.
    pub subtasks: Vec<SubtaskPlan>,
    /// Every channel, (edge, from, to) order.
    pub channels: Vec<ChannelPlan>,
}

impl PhysicalPlan {
    /// The plan of `g`.
    pub fn of(g: &JobGraph) -> Self {
        let subtasks = g
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(node, n)| {
                (0..n.parallelism).map(move |s| SubtaskPlan {
                    node,
                    subtask: s,
                    key_groups: key_group_range(g.max_parallelism, n.parallelism, s),
                })
            })
            .collect();
        let mut channels = Vec::new();
        for (edge, e) in g.edges.iter().enumerate() {
            let (up, down) = (g.nodes[e.from].parallelism, g.nodes[e.to].parallelism);
            for from in 0..up {
                let targets = if e.partition == Partition::Forward { from..from + 1 } else { 0..down };
                for to in targets {
                    let back = e.feedback && (e.from != e.to || to <= from);
                    channels.push(ChannelPlan { edge, from, to, back });
                }
            }
        }
        PhysicalPlan { subtasks, channels }
    }

    /// The index into `subtasks` of subtask `subtask` of `node` (subtasks are in node order,
    /// then subtask order).
    pub fn index_of(&self, node: usize, subtask: u32) -> usize {
        self.subtasks.partition_point(|s| (s.node, s.subtask) < (node, subtask))
    }

    /// Indices into `channels` of the inputs of subtask `subtask` of `node`, in input order.
    pub fn inputs_of<'a>(&'a self, g: &'a JobGraph, node: usize, subtask: u32) -> impl Iterator<Item = usize> + 'a {
        self.channels
            .iter()
            .enumerate()
            .filter(move |(_, c)| g.edges[c.edge].to == node && c.to == subtask)
            .map(|(i, _)| i)
    }

    /// The outputs of subtask `subtask` of `node`: per outgoing edge (in edge order), the
    /// indices into `channels` of its targets, in downstream index order.
    pub fn outputs_of(&self, g: &JobGraph, node: usize, subtask: u32) -> Vec<(usize, Vec<usize>)> {
        let mut out: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, c) in self.channels.iter().enumerate() {
            if g.edges[c.edge].from != node || c.from != subtask {
                continue;
            }
            match out.last_mut() {
                Some((edge, targets)) if *edge == c.edge => targets.push(i),
                _ => out.push((c.edge, vec![i])),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(toml: &str) -> JobGraph {
        let dir = tempfile::tempdir().unwrap();
        let wasm = dir.path().join("op.wasm");
        std::fs::write(&wasm, b"").unwrap();
        let path = dir.path().join("job.toml");
        crate::job::parse(&path, &toml.replace("OP", wasm.to_str().unwrap())).unwrap()
    }

    const CHAIN: &str = r#"
        [job]
        name = "j"
        max_parallelism = 8
        [[source]]
        id = "src"
        type = "generator"
        count = 10
        parallelism = 2
        [[operator]]
        id = "a"
        component = "OP"
        parallelism = 2
        inputs = [{ from = "src", partition = "forward" }]
        [[operator]]
        id = "b"
        component = "OP"
        parallelism = 3
        inputs = [{ from = "a", partition = "hash" }]
        [[sink]]
        id = "out"
        type = "stdout"
        inputs = [{ from = "b", partition = "rebalance" }]
    "#;

    #[test]
    fn one_subtask_per_node_index_with_its_key_groups_and_one_channel_per_connected_pair() {
        let g = graph(CHAIN);
        let p = PhysicalPlan::of(&g);
        let b = g.node_index("b").unwrap();
        assert_eq!(p.subtasks.len(), 2 + 2 + 3 + 1);
        let ranges: Vec<_> = p.subtasks.iter().filter(|s| s.node == b).map(|s| s.key_groups.clone()).collect();
        assert_eq!(ranges, [0..3, 3..6, 6..8]);
        // forward 2 + hash 2×3 + rebalance into the sink 3×1.
        assert_eq!(p.channels.len(), 2 + 6 + 3);
        let a = g.node_index("a").unwrap();
        assert_eq!(p.inputs_of(&g, a, 1).map(|c| p.channels[c].from).collect::<Vec<_>>(), [1]);
        let outs = p.outputs_of(&g, a, 1);
        assert_eq!(outs.len(), 1);
        assert_eq!(outs[0].1.iter().map(|&c| p.channels[c].to).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(p.channels.iter().all(|c| !c.back));
    }

    #[test]
    fn a_self_loop_is_a_back_edge_only_towards_lower_or_equal_subtasks() {
        let g = graph(
            r#"
            [job]
            name = "j"
            [[source]]
            id = "src"
            type = "generator"
            count = 10
            parallelism = 2
            [[operator]]
            id = "step"
            component = "OP"
            parallelism = 2
            inputs = [{ from = "src", partition = "forward" }, { from = "step", partition = "hash", feedback = true }]
            [[sink]]
            id = "out"
            type = "stdout"
            inputs = [{ from = "step", partition = "rebalance" }]
            "#,
        );
        let p = PhysicalPlan::of(&g);
        let step = g.node_index("step").unwrap();
        let back: Vec<_> = p
            .channels
            .iter()
            .filter(|c| g.edges[c.edge].from == step && g.edges[c.edge].to == step)
            .map(|c| (c.from, c.to, c.back))
            .collect();
        assert_eq!(back, [(0, 0, true), (0, 1, false), (1, 0, true), (1, 1, true)]);
        // Inputs in edge order: the forward input first, then the loop's channels by sender.
        let ins: Vec<_> = p.inputs_of(&g, step, 1).map(|c| (p.channels[c].edge, p.channels[c].from)).collect();
        assert_eq!(ins, [(0, 1), (1, 0), (1, 1)]);
    }
}
