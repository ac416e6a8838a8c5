//! Recovery mapping, as a pure function: which state each subtask of a (possibly rescaled)
//! job gets from a checkpoint.
//!
//! Invariants: nodes are matched by uid; keyed state moves by key group, so every key group
//! in the checkpoint lands on exactly the subtask that owns it at the new parallelism;
//! sources and sinks keep their parallelism (their positions and transactions are per
//! subtask); a refusal names the node and what to do.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::checkpoint::snapshot::SubtaskState;
use crate::checkpoint::storage::LoadedCheckpoint;
use crate::graph::logical::{JobGraph, NodeKind};
use crate::keygroup::key_group_range;

/// Why a checkpoint cannot be restored into a job.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RecoveryError {
    /// Different number of key groups.
    #[error(
        "checkpoint {chk} was taken with max_parallelism {old}, the job has {new}; key groups cannot be re-hashed, so set [job] max_parallelism = {old}"
    )]
    MaxParallelism {
        /// Checkpoint id.
        chk: u64,
        /// In the checkpoint.
        old: u32,
        /// In the job.
        new: u32,
    },
    /// A source or sink changed parallelism.
    #[error(
        "`{uid}` ran with parallelism {old} in checkpoint {chk} and has {new} now; sources and sinks restore at their checkpointed parallelism"
    )]
    Parallelism {
        /// Node uid.
        uid: String,
        /// Checkpoint id.
        chk: u64,
        /// In the checkpoint.
        old: u32,
        /// In the job.
        new: u32,
    },
    /// Non-keyed operator state cannot be redistributed yet.
    #[error(
        "operator `{uid}` holds non-keyed state in checkpoint {chk} at parallelism {old}; it cannot be redistributed to parallelism {new}"
    )]
    OperatorState {
        /// Node uid.
        uid: String,
        /// Checkpoint id.
        chk: u64,
        /// In the checkpoint.
        old: u32,
        /// In the job.
        new: u32,
    },
    /// The checkpoint has state for a node the job no longer has.
    #[error("checkpoint {chk} holds state of `{uid}`, which the job no longer has")]
    Unmatched {
        /// Node uid.
        uid: String,
        /// Checkpoint id.
        chk: u64,
    },
}

/// What each subtask restores: `plan[node][subtask]`, `None` = starts empty.
pub type RestorePlan = Vec<Vec<Option<SubtaskState>>>;

/// Maps `chk` onto `graph`. `allow_unmatched` lets state of removed nodes be dropped.
pub fn plan(chk: &LoadedCheckpoint, graph: &JobGraph, allow_unmatched: bool) -> Result<RestorePlan, RecoveryError> {
    let m = &chk.manifest;
    let id = m.checkpoint_id;
    if m.max_parallelism != graph.max_parallelism {
        return Err(RecoveryError::MaxParallelism { chk: id, old: m.max_parallelism, new: graph.max_parallelism });
    }
    if !allow_unmatched && let Some(op) = m.operators.iter().find(|o| graph.node_index(&o.uid).is_none()) {
        return Err(RecoveryError::Unmatched { uid: op.uid.clone(), chk: id });
    }
    let mut plan: RestorePlan = graph.nodes.iter().map(|n| vec![None; n.parallelism as usize]).collect();
    for (ni, node) in graph.nodes.iter().enumerate() {
        let Some(entry) = m.operator(node.id.as_str()) else { continue };
        let old_p = entry.parallelism;
        let new_p = node.parallelism;
        let state_of = |i: u32| chk.states.get(&(entry.uid.clone(), i));
        match &node.kind {
            NodeKind::Source(_) | NodeKind::Sink(_) => {
                if old_p != new_p {
                    return Err(RecoveryError::Parallelism { uid: entry.uid.clone(), chk: id, old: old_p, new: new_p });
                }
                for s in 0..new_p {
                    plan[ni][s as usize] = state_of(s).cloned();
                }
            }
            NodeKind::Operator(_) => {
                if old_p != new_p && (0..old_p).any(|i| state_of(i).is_some_and(|s| !s.operator_state.is_empty())) {
                    return Err(RecoveryError::OperatorState {
                        uid: entry.uid.clone(),
                        chk: id,
                        old: old_p,
                        new: new_p,
                    });
                }
                let mut by_group = BTreeMap::new();
                for i in 0..old_p {
                    if let Some(s) = state_of(i) {
                        for kg in &s.keyed {
                            by_group.insert(kg.key_group, kg);
                        }
                    }
                }
                for s in 0..new_p {
                    let range = key_group_range(graph.max_parallelism, new_p, s);
                    let keyed = by_group.range(range).map(|(_, kg)| (*kg).clone()).collect();
                    let operator_state = if old_p == new_p {
                        state_of(s).map(|st| st.operator_state.clone()).unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    let backedge_log = if old_p == new_p {
                        state_of(s).map(|st| st.backedge_log.clone()).unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    plan[ni][s as usize] =
                        Some(SubtaskState { keyed, operator_state, backedge_log, ..Default::default() });
                }
                if old_p != new_p {
                    redistribute_log(&mut plan[ni], (0..old_p).filter_map(state_of), graph.max_parallelism, new_p)
                        .map_err(|()| RecoveryError::OperatorState {
                            uid: entry.uid.clone(),
                            chk: id,
                            old: old_p,
                            new: new_p,
                        })?;
                }
            }
        }
    }
    Ok(plan)
}

/// Moves back-edge records in transit to the subtask that owns each record's key group at
/// the new parallelism. Err if a record has no key group (a non-hash feedback edge).
fn redistribute_log<'a>(
    plan: &mut [Option<SubtaskState>],
    old: impl Iterator<Item = &'a SubtaskState>,
    max_parallelism: u32,
    new_p: u32,
) -> Result<(), ()> {
    use crate::checkpoint::snapshot::LoggedBatch;
    use crate::keygroup::operator_index;
    use crate::record::{Batch, NO_KEY_GROUP};
    for st in old {
        for lb in &st.backedge_log {
            let batch = Batch::from_validated(lb.bytes.clone(), lb.records);
            let mut parts: Vec<Batch> = (0..new_p).map(|_| Batch::default()).collect();
            for r in batch.iter() {
                if r.tag == NO_KEY_GROUP {
                    return Err(());
                }
                parts[operator_index(r.tag, max_parallelism, new_p) as usize].push(r.tag, r.timestamp, r.key, r.value);
            }
            for (s, b) in parts.into_iter().enumerate() {
                if !b.is_empty()
                    && let Some(target) = plan[s].as_mut()
                {
                    target.backedge_log.push(LoggedBatch {
                        side: lb.side,
                        records: b.len(),
                        bytes: b.as_bytes().to_vec(),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::metadata::{CheckpointMetrics, FORMAT_VERSION, Manifest, OperatorEntry, SubtaskEntry};
    use crate::checkpoint::snapshot::KeyGroupSnapshot;
    use proptest::prelude::*;

    fn graph(p: u32, max_p: u32) -> JobGraph {
        let src = format!(
            "[job]\nname = \"j\"\nmax_parallelism = {max_p}\n[[source]]\nid = \"s\"\ntype = \"generator\"\ncount = 1\n\
             [[sink]]\nid = \"k\"\ntype = \"blackhole\"\ninputs = [{{ from = \"s\" , partition = \"rebalance\"}}]\nparallelism = {p}\n"
        );
        let mut g = crate::job::parse(std::path::Path::new("/x/job.toml"), &src).unwrap();
        // Turn the sink into an operator node for mapping purposes.
        g.nodes[1].kind =
            NodeKind::Operator(crate::graph::logical::OperatorNode { component: "/x".into(), config: vec![] });
        g.nodes[1].id = crate::ids::NodeId::new("op");
        g
    }

    fn checkpoint(old_p: u32, max_p: u32, groups: &[u32]) -> LoadedCheckpoint {
        let mut states = BTreeMap::new();
        let mut subtasks = Vec::new();
        for i in 0..old_p {
            let r = key_group_range(max_p, old_p, i);
            let keyed = groups
                .iter()
                .filter(|g| r.contains(g))
                .map(|&g| KeyGroupSnapshot {
                    key_group: g,
                    data: vec![g as u8],
                    event_timers: vec![],
                    processing_timers: vec![],
                })
                .collect();
            states.insert(("op".to_string(), i), SubtaskState { keyed, ..Default::default() });
            subtasks.push(SubtaskEntry {
                index: i,
                file: String::new(),
                bytes: 0,
                crc32: 0,
                key_groups: (r.start, r.end),
            });
        }
        LoadedCheckpoint {
            path: "/chk".into(),
            manifest: Manifest {
                format_version: FORMAT_VERSION,
                job: "j".into(),
                checkpoint_id: 7,
                created_unix_ms: 0,
                finished: false,
                max_parallelism: max_p,
                operators: vec![OperatorEntry {
                    uid: "op".into(),
                    kind: "operator".into(),
                    parallelism: old_p,
                    component: None,
                    subtasks,
                }],
                metrics: CheckpointMetrics::default(),
            },
            states,
        }
    }

    proptest! {
        #[test]
        fn every_key_group_lands_on_its_new_owner_exactly_once(
            old_p in 1u32..8, new_p in 1u32..8, groups in proptest::collection::btree_set(0u32..32, 0..32)) {
            let groups: Vec<u32> = groups.into_iter().collect();
            let plan = plan(&checkpoint(old_p, 32, &groups), &graph(new_p, 32), false).unwrap();
            let mut seen = Vec::new();
            for (s, st) in plan[1].iter().enumerate() {
                let r = key_group_range(32, new_p, s as u32);
                for kg in &st.as_ref().unwrap().keyed {
                    prop_assert!(r.contains(&kg.key_group));
                    prop_assert_eq!(kg.data.clone(), vec![kg.key_group as u8]);
                    seen.push(kg.key_group);
                }
            }
            seen.sort();
            prop_assert_eq!(seen, groups);
        }
    }

    #[test]
    fn refusals_name_what_to_do() {
        let e = plan(&checkpoint(2, 32, &[1]), &graph(2, 64), false).unwrap_err();
        assert!(e.to_string().contains("set [job] max_parallelism = 32"), "{e}");
        let mut g = graph(2, 32);
        g.nodes[1].id = crate::ids::NodeId::new("renamed");
        let e = plan(&checkpoint(2, 32, &[1]), &g, false).unwrap_err();
        assert_eq!(e, RecoveryError::Unmatched { uid: "op".into(), chk: 7 });
        assert!(plan(&checkpoint(2, 32, &[1]), &g, true).is_ok());
    }
}
