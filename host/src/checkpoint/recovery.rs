//! Recovery mapping, as a pure function: which state each subtask of a (possibly rescaled)
//! job gets from a checkpoint.
//!
//! Invariants: nodes are matched by uid; keyed state moves by key group, so every key group
//! in the checkpoint lands on exactly the subtask that owns it at the new parallelism;
//! non-keyed operator state moves as the restoring component declares it (`split`: every
//! element to exactly one new subtask; `union`: every element to every new subtask; `none`:
//! only at the same parallelism); a sink's pending transactions of a subtask that no
//! longer exists are adopted by subtask 0, which commits them; a Kafka source's offsets
//! follow their partitions (every new subtask sees all of them and keeps its own); other
//! sources keep their parallelism (their positions are per subtask); a refusal names the
//! node and what to do.

use std::collections::BTreeMap;
use std::sync::Arc;

use thiserror::Error;

use crate::checkpoint::incremental::ChainLink;
use crate::checkpoint::keyed_files::{ChainIndex, StreamedKeyed};
use crate::checkpoint::layout::{self, NamedState};
use crate::checkpoint::metadata::OperatorEntry;
use crate::checkpoint::snapshot::{KeyGroupSnapshot, SinkState, SourcePosition, SubtaskState};
use crate::checkpoint::storage::LoadedCheckpoint;
use crate::declared::Redistribution;
use crate::graph::logical::{JobGraph, NodeKind, SinkKind, SourceKind};
use crate::graph::partition::Partition;
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
    /// A source changed parallelism.
    #[error(
        "source `{uid}` ran with parallelism {old} in checkpoint {chk} and has {new} now; sources restore at their \
         checkpointed parallelism (their read positions are per subtask): set its parallelism back to {old}"
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
    /// Non-keyed operator state that cannot be redistributed.
    #[error(
        "operator `{uid}` holds non-keyed state `{state}` in checkpoint {chk} at parallelism {old}, declared with \
         redistribution `none`: it cannot move to parallelism {new}; keep parallelism {old}, or declare the state \
         as a list with `split` or `union` redistribution"
    )]
    OperatorState {
        /// Node uid.
        uid: String,
        /// State name.
        state: String,
        /// Checkpoint id.
        chk: u64,
        /// In the checkpoint.
        old: u32,
        /// In the job.
        new: u32,
    },
    /// Records in flight (an unaligned checkpoint's, a loop's back-edges') that came over a
    /// broadcast edge cannot be re-routed: every new subtask would need its own copy.
    #[error(
        "`{uid}` has records in flight in checkpoint {chk} that came over a broadcast edge; they cannot be \
         re-routed from parallelism {old} to {new}: keep parallelism {old}"
    )]
    BackEdgeLog {
        /// Node uid.
        uid: String,
        /// Checkpoint id.
        chk: u64,
        /// In the checkpoint.
        old: u32,
        /// In the job.
        new: u32,
    },
    /// A state blob does not follow the layout.
    #[error("operator `{uid}` subtask {subtask} in checkpoint {chk}: {source}")]
    Layout {
        /// Node uid.
        uid: String,
        /// Subtask.
        subtask: u32,
        /// Checkpoint id.
        chk: u64,
        /// Why.
        source: layout::LayoutError,
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

/// What the restoring component says about one of its states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateRule {
    /// Keep it; non-keyed state moves like this on rescale.
    Keep(Redistribution),
    /// Drop it (the component no longer declares it; the user allowed dropping).
    Drop,
}

/// Maps `chk` onto `graph` with the restoring components' declarations: how each non-keyed
/// state moves (`redistribution(node, state)`; undeclared counts as `none`) and which states
/// are dropped per node (`dropped`, allowed by the user). `allow_unmatched` lets state of
/// removed nodes be dropped.
pub fn plan(
    chk: &LoadedCheckpoint,
    graph: &JobGraph,
    redistribution: &dyn Fn(usize, &str) -> Redistribution,
    dropped: &BTreeMap<usize, Vec<String>>,
    allow_unmatched: bool,
) -> Result<RestorePlan, RecoveryError> {
    let rule = |node: usize, state: &str| {
        if dropped.get(&node).is_some_and(|d| d.iter().any(|n| n == state)) {
            StateRule::Drop
        } else {
            StateRule::Keep(redistribution(node, state))
        }
    };
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
            NodeKind::Source(SourceKind::Kafka(_)) => {
                // Offsets follow their partitions: every subtask gets every partition's
                // offset and keeps those `assign::owner` gives it at the new parallelism.
                let mut partitions = Vec::new();
                for s in 0..old_p {
                    if let Some(SourcePosition::Kafka { partitions: p }) = state_of(s).and_then(|st| st.source.as_ref())
                    {
                        partitions.extend(p.iter().cloned());
                    }
                }
                for s in 0..new_p {
                    let source = Some(SourcePosition::Kafka { partitions: partitions.clone() });
                    plan[ni][s as usize] = Some(SubtaskState { source, ..Default::default() });
                }
            }
            NodeKind::Source(_) => {
                if old_p != new_p {
                    return Err(RecoveryError::Parallelism { uid: entry.uid.clone(), chk: id, old: old_p, new: new_p });
                }
                for s in 0..new_p {
                    plan[ni][s as usize] = state_of(s).cloned();
                }
            }
            NodeKind::Sink(_) => {
                for s in 0..new_p {
                    let mut st = state_of(s).cloned().unwrap_or_default();
                    if old_p != new_p {
                        // Records in flight move by key group below.
                        st.backedge_log.clear();
                    }
                    if s >= old_p {
                        // A subtask the checkpoint did not have. If its index ran in an
                        // earlier run, its parts below where it stopped are output; anything
                        // else of its index is from a rolled-back future and is removed.
                        let next_part = entry.retired.iter().find(|r| r.0 == s).map_or(0, |r| r.1);
                        st.sink = Some(SinkState { next_part, pending: Vec::new() });
                    }
                    plan[ni][s as usize] = Some(st);
                }
                for old in new_p..old_p {
                    // Kafka sinks: subtask 0 also initializes the transactional ids of removed
                    // subtasks without state, aborting what they left open.
                    if let (NodeKind::Sink(SinkKind::Kafka(_)), Some(Some(first))) = (&node.kind, plan[ni].get_mut(0)) {
                        let blob = state_of(old).map(|st| st.operator_state.clone()).unwrap_or_default();
                        first.adopted_blobs.push((old, blob));
                    }
                    if let (Some(sink), Some(Some(first))) =
                        (state_of(old).and_then(|s| s.sink.clone()), plan[ni].get_mut(0))
                    {
                        first.adopted_sinks.push((old, sink));
                    }
                }
                move_logs(&mut plan[ni], graph, ni, &entry.uid, (id, old_p), (0..old_p).filter_map(state_of))?;
            }
            NodeKind::Operator(_) => {
                let layout_err = |subtask: u32| {
                    let uid = entry.uid.clone();
                    move |source| RecoveryError::Layout { uid, subtask, chk: id, source }
                };
                // Keyed blobs are only parsed when a state is being dropped.
                let dropping = dropped.get(&ni).is_some_and(|d| !d.is_empty());
                let drop_undeclared = |blob: &[u8], subtask: u32| -> Result<Vec<u8>, RecoveryError> {
                    if dropping {
                        layout::retain(blob, |n| rule(ni, n) != StateRule::Drop).map_err(layout_err(subtask))
                    } else {
                        Ok(blob.to_vec())
                    }
                };
                // Each key group from wherever its old subtask holds it: decoded (older state
                // files) or still in the checkpoint's files, read as the new owner restores.
                let mut by_group = BTreeMap::new();
                for i in 0..old_p {
                    if let Some(s) = state_of(i) {
                        for kg in &s.keyed {
                            let mut kg = kg.clone();
                            kg.data = drop_undeclared(&kg.data, i)?;
                            by_group.insert(kg.key_group, Group::Loaded(kg));
                        }
                        for (chain, groups) in s.streamed.iter().flat_map(|st| &st.parts) {
                            for &g in groups {
                                by_group.insert(g, Group::Stored(chain.clone()));
                            }
                        }
                    }
                }
                let dropped_here: Vec<String> = dropped.get(&ni).cloned().unwrap_or_default();
                let operator_states = redistribute_operator_state(
                    &entry.uid,
                    id,
                    (0..old_p).map(|i| (i, state_of(i).map_or(&[][..], |s| &s.operator_state[..]))),
                    old_p,
                    new_p,
                    &|name| rule(ni, name),
                )?;
                for s in 0..new_p {
                    let range = key_group_range(graph.max_parallelism, new_p, s);
                    let (keyed, streamed) = take_groups(&by_group, range, &dropped_here);
                    let resume = resumable(entry, id, s, state_of(s), &keyed, streamed.as_ref());
                    let backedge_log = if old_p == new_p {
                        state_of(s).map(|st| st.backedge_log.clone()).unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    plan[ni][s as usize] = Some(SubtaskState {
                        keyed,
                        operator_state: operator_states[s as usize].clone(),
                        backedge_log,
                        streamed,
                        resume,
                        ..Default::default()
                    });
                }
                move_logs(&mut plan[ni], graph, ni, &entry.uid, (id, old_p), (0..old_p).filter_map(state_of))?;
            }
        }
    }
    Ok(plan)
}

/// The chain subtask `s` restores whole (every key group of its own old chain, nothing
/// dropped, nothing decoded eagerly): its files with their keyed bytes, oldest first, ending
/// with the checkpoint's own file, which a disk operator's next snapshot may build on.
fn resumable(
    entry: &OperatorEntry,
    chk: u64,
    s: u32,
    old: Option<&SubtaskState>,
    keyed: &[KeyGroupSnapshot],
    streamed: Option<&StreamedKeyed>,
) -> Option<Vec<(ChainLink, u64)>> {
    let (old, streamed) = (old?.streamed.as_ref()?, streamed?);
    let [(chain, groups)] = &streamed.parts[..] else { return None };
    let [(own, all)] = &old.parts[..] else { return None };
    if !keyed.is_empty() || !streamed.dropped.is_empty() || !Arc::ptr_eq(chain, own) || groups != all {
        return None;
    }
    let sub = entry.subtasks.iter().find(|e| e.index == s)?;
    let links = sub.chain.iter().cloned().chain([ChainLink { checkpoint: chk, file: sub.file.clone() }]);
    let bytes = chain.keyed_bytes();
    (bytes.len() == sub.chain.len() + 1).then(|| links.zip(bytes).collect())
}

/// Where a key group of the checkpoint is.
enum Group {
    /// Decoded.
    Loaded(KeyGroupSnapshot),
    /// In this chain's files.
    Stored(Arc<ChainIndex>),
}

/// The key groups `range` of `by_group`: those decoded, and those to read from their files
/// (per chain, without the states `dropped`).
fn take_groups(
    by_group: &BTreeMap<u32, Group>,
    range: std::ops::Range<u32>,
    dropped: &[String],
) -> (Vec<KeyGroupSnapshot>, Option<StreamedKeyed>) {
    let mut keyed = Vec::new();
    let mut parts: Vec<(Arc<ChainIndex>, Vec<u32>)> = Vec::new();
    for (&g, group) in by_group.range(range) {
        match group {
            Group::Loaded(kg) => keyed.push(kg.clone()),
            Group::Stored(chain) => match parts.iter_mut().find(|p| Arc::ptr_eq(&p.0, chain)) {
                Some(p) => p.1.push(g),
                None => parts.push((chain.clone(), vec![g])),
            },
        }
    }
    let streamed = (!parts.is_empty()).then(|| StreamedKeyed { parts, dropped: dropped.to_vec() });
    (keyed, streamed)
}

/// File sinks of `graph` restored from `chk`: the subtask indices that no longer run, with
/// the next part number each stopped at (carried in every later manifest, see
/// `OperatorEntry::retired`).
pub fn retired_sinks(chk: &LoadedCheckpoint, graph: &JobGraph) -> BTreeMap<usize, Vec<(u32, u64)>> {
    let mut out = BTreeMap::new();
    for (ni, node) in graph.nodes.iter().enumerate() {
        let (NodeKind::Sink(_), Some(entry)) = (&node.kind, chk.manifest.operator(node.id.as_str())) else {
            continue;
        };
        let mut retired: BTreeMap<u32, u64> = entry.retired.iter().copied().collect();
        for s in 0..entry.parallelism {
            let next =
                chk.states.get(&(entry.uid.clone(), s)).and_then(|st| st.sink.as_ref()).map_or(0, |k| k.next_part);
            retired.insert(s, next);
        }
        retired.retain(|s, _| *s >= node.parallelism);
        out.insert(ni, retired.into_iter().collect());
    }
    out
}

/// Non-keyed state of old subtasks `(index, blob)` onto `new_p` subtasks, state by state, as
/// `rule` says. At unchanged parallelism every subtask keeps its own (minus dropped states).
fn redistribute_operator_state<'a>(
    uid: &str,
    chk: u64,
    old: impl Iterator<Item = (u32, &'a [u8])>,
    old_p: u32,
    new_p: u32,
    rule: &dyn Fn(&str) -> StateRule,
) -> Result<Vec<Vec<u8>>, RecoveryError> {
    let mut out: Vec<Vec<NamedState>> = vec![Vec::new(); new_p as usize];
    let mut dealt = 0usize;
    for (i, blob) in old {
        let states = layout::decode(blob).map_err(|source| RecoveryError::Layout {
            uid: uid.into(),
            subtask: i,
            chk,
            source,
        })?;
        for st in states {
            let r = rule(&st.name);
            if r == StateRule::Drop {
                continue;
            }
            let target = |out: &mut Vec<Vec<NamedState>>, s: usize| -> usize {
                match out[s].iter().position(|n| n.name == st.name) {
                    Some(p) => p,
                    None => {
                        out[s].push(NamedState { name: st.name.clone(), entries: Vec::new() });
                        out[s].len() - 1
                    }
                }
            };
            if old_p == new_p {
                let t = target(&mut out, i as usize);
                out[i as usize][t].entries.extend(st.entries);
                continue;
            }
            match r {
                StateRule::Keep(Redistribution::Split) => {
                    for e in st.entries {
                        let s = dealt % new_p as usize;
                        dealt += 1;
                        let t = target(&mut out, s);
                        out[s][t].entries.push(e);
                    }
                }
                StateRule::Keep(Redistribution::Union) => {
                    for s in 0..new_p as usize {
                        let t = target(&mut out, s);
                        out[s][t].entries.extend(st.entries.iter().cloned());
                    }
                }
                StateRule::Keep(Redistribution::None) | StateRule::Drop => {
                    if !st.entries.is_empty() {
                        return Err(RecoveryError::OperatorState {
                            uid: uid.into(),
                            state: st.name,
                            chk,
                            old: old_p,
                            new: new_p,
                        });
                    }
                }
            }
        }
    }
    Ok(out.iter().map(|s| layout::encode(s)).collect())
}

/// After a rescale (`old_p` subtasks' `old` states of checkpoint `chk` into a `plan` row of
/// another length): the records in flight
/// of node `ni` move to their new subtasks ([`redistribute_log`]).
fn move_logs<'a>(
    plan: &mut [Option<SubtaskState>],
    graph: &JobGraph,
    ni: usize,
    uid: &str,
    (chk, old_p): (u64, u32),
    old: impl Iterator<Item = &'a SubtaskState>,
) -> Result<(), RecoveryError> {
    let new_p = plan.len() as u32;
    if old_p == new_p {
        return Ok(());
    }
    let broadcast = graph.edges.iter().any(|e| e.to == ni && e.partition == Partition::Broadcast);
    redistribute_log(plan, old, graph.max_parallelism, broadcast).map_err(|()| RecoveryError::BackEdgeLog {
        uid: uid.into(),
        chk,
        old: old_p,
        new: new_p,
    })
}

/// Moves records in flight (a loop's back-edges', an unaligned checkpoint's) to the subtask
/// that owns each record's key group at the new parallelism; records without one (forward
/// and rebalance edges) go round-robin. Err if the node reads a broadcast edge and such a
/// record is there (it would need a copy per new subtask).
fn redistribute_log<'a>(
    plan: &mut [Option<SubtaskState>],
    old: impl Iterator<Item = &'a SubtaskState>,
    max_parallelism: u32,
    broadcast: bool,
) -> Result<(), ()> {
    use crate::checkpoint::snapshot::LoggedBatch;
    use crate::keygroup::operator_index;
    use crate::record::{Batch, NO_KEY_GROUP};
    let new_p = plan.len() as u32;
    let mut next = 0u32;
    for st in old {
        for lb in &st.backedge_log {
            let batch = Batch::from_validated(lb.bytes.clone(), lb.records);
            let mut parts: Vec<Batch> = (0..new_p).map(|_| Batch::default()).collect();
            let spread = next % new_p;
            next += 1;
            for r in batch.iter() {
                let to = match r.tag {
                    NO_KEY_GROUP if broadcast => return Err(()),
                    NO_KEY_GROUP => spread,
                    kg => operator_index(kg, max_parallelism, new_p),
                };
                parts[to as usize].push(r.tag, r.timestamp, r.key, r.value);
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

    fn keep(_: usize, _: &str) -> Redistribution {
        Redistribution::None
    }

    fn none() -> BTreeMap<usize, Vec<String>> {
        BTreeMap::new()
    }

    fn graph(p: u32, max_p: u32) -> JobGraph {
        let src = format!(
            "[job]\nname = \"j\"\nmax_parallelism = {max_p}\n[[source]]\nid = \"s\"\ntype = \"generator\"\ncount = 1\n\
             [[sink]]\nid = \"k\"\ntype = \"blackhole\"\ninputs = [{{ from = \"s\" , partition = \"rebalance\"}}]\nparallelism = {p}\n"
        );
        let mut g = crate::job::parse(std::path::Path::new("/x/job.toml"), &src).unwrap();
        // Turn the sink into an operator node for mapping purposes.
        g.nodes[1].kind = NodeKind::Operator(crate::graph::logical::OperatorNode {
            component: "/x".into(),
            config: vec![],
            on_error: Default::default(),
            state_backend: Default::default(),
            state_cache_mb: None,
        });
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
                    event_timers: Default::default(),
                    processing_timers: Default::default(),
                })
                .collect();
            states.insert(("op".to_string(), i), SubtaskState { keyed, ..Default::default() });
            subtasks.push(SubtaskEntry {
                index: i,
                file: String::new(),
                bytes: 0,
                crc32: 0,
                key_groups: (r.start, r.end),
                chain: vec![],
                timing: None,
            });
        }
        LoadedCheckpoint {
            path: "/chk".into(),
            url: None,
            manifest: Manifest {
                format_version: FORMAT_VERSION,
                kind: Default::default(),
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
                    retired: vec![],
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
            let plan = plan(&checkpoint(old_p, 32, &groups), &graph(new_p, 32), &keep, &none(), false).unwrap();
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

    fn with_lists(old_p: u32, per_subtask: &[&[u8]]) -> LoadedCheckpoint {
        let mut c = checkpoint(old_p, 32, &[]);
        for (i, elems) in per_subtask.iter().enumerate() {
            let st = NamedState { name: "l".into(), entries: elems.iter().map(|e| (vec![], vec![*e])).collect() };
            c.states.get_mut(&("op".to_string(), i as u32)).unwrap().operator_state = layout::encode(&[st]);
        }
        c
    }

    fn elements(p: &RestorePlan, s: usize) -> Vec<u8> {
        let blob = &p[1][s].as_ref().unwrap().operator_state;
        layout::decode(blob).unwrap().into_iter().flat_map(|n| n.entries.into_iter().map(|e| e.1[0])).collect()
    }

    proptest! {
        #[test]
        #[allow(clippy::needless_range_loop)]
        fn split_lists_land_exactly_once_and_unions_everywhere(old_p in 1u32..5, new_p in 1u32..5, n in 0u8..20) {
            let lists: Vec<Vec<u8>> = (0..old_p).map(|i| (0..n).filter(|e| *e as u32 % old_p == i).collect()).collect();
            let refs: Vec<&[u8]> = lists.iter().map(|l| &l[..]).collect();
            let c = with_lists(old_p, &refs);
            let split = |_: usize, _: &str| Redistribution::Split;
            let p = plan(&c, &graph(new_p, 32), &split, &none(), false).unwrap();
            let mut all: Vec<u8> = (0..new_p as usize).flat_map(|s| elements(&p, s)).collect();
            all.sort();
            prop_assert_eq!(all, (0..n).collect::<Vec<u8>>());
            let union = |_: usize, _: &str| Redistribution::Union;
            let p = plan(&c, &graph(new_p, 32), &union, &none(), false).unwrap();
            for s in 0..new_p as usize {
                let mut e = elements(&p, s);
                e.sort();
                if old_p == new_p {
                    prop_assert_eq!(e, lists[s].clone());
                } else {
                    prop_assert_eq!(e, (0..n).collect::<Vec<u8>>());
                }
            }
        }
    }

    #[test]
    fn non_keyed_state_without_redistribution_refuses_a_rescale_naming_the_state() {
        let c = with_lists(2, &[&[1], &[2]]);
        let e = plan(&c, &graph(3, 32), &keep, &none(), false).unwrap_err();
        assert!(matches!(&e, RecoveryError::OperatorState { state, .. } if state == "l"), "{e}");
        assert!(e.to_string().contains("keep parallelism 2"), "{e}");
        assert_eq!(elements(&plan(&c, &graph(2, 32), &keep, &none(), false).unwrap(), 1), vec![2]);
        let drop = BTreeMap::from([(1, vec!["l".to_string()])]);
        let p = plan(&c, &graph(3, 32), &keep, &drop, false).unwrap();
        assert!(p[1].iter().all(|s| s.as_ref().unwrap().operator_state.is_empty()));
    }

    /// A subtask restoring exactly its old chain (same parallelism, nothing dropped) may build
    /// its next snapshot on it; after a rescale or with a state dropped, a new chain starts.
    #[test]
    fn a_subtask_restoring_its_whole_chain_may_resume_it() {
        use crate::checkpoint::storage::CheckpointStore;
        use crate::checkpoint::storage::tests::{chained, keyed};
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), "j");
        // Key groups 1 and 6: at parallelism 2 they belong to different subtasks.
        let two = |st: SubtaskState| {
            let mut other = st.keyed[0].clone();
            other.key_group = 6;
            SubtaskState { keyed: vec![st.keyed[0].clone(), other], ..st }
        };
        chained(&store, 1, &two(keyed(&[(b"a", Some(b"1"))], false)), &[]);
        chained(&store, 2, &two(keyed(&[(b"a", Some(b"2"))], true)), &[1]);
        let c = store.latest(|e| panic!("{e}")).unwrap();
        let p = plan(&c, &graph(1, 8), &keep, &none(), false).unwrap();
        let resume = p[1][0].as_ref().unwrap().resume.clone().expect("the whole chain restored");
        let links: Vec<(u64, &str)> = resume.iter().map(|(l, _)| (l.checkpoint, l.file.as_str())).collect();
        assert_eq!(links, vec![(1, "op-0.state"), (2, "op-0.state")]);
        assert!(resume.iter().all(|(_, bytes)| *bytes > 0), "{resume:?}");
        let p = plan(&c, &graph(2, 8), &keep, &none(), false).unwrap();
        assert!(p[1].iter().all(|s| s.as_ref().unwrap().resume.is_none()), "rescaled: each takes part of it");
        let dropped = BTreeMap::from([(1usize, vec!["s".to_string()])]);
        let p = plan(&c, &graph(1, 8), &keep, &dropped, true).unwrap();
        assert!(p[1][0].as_ref().unwrap().resume.is_none(), "a state dropped");
    }

    proptest! {
        /// What a cluster's worker loads of a checkpoint (`checkpoint/subset.rs`) gives each
        /// of its subtasks the same restore as the whole checkpoint, and at unchanged
        /// parallelism it is only its own subtasks' states.
        #[test]
        fn a_subtask_restores_the_same_from_its_workers_subset_as_from_the_whole_checkpoint(
            old_p in 1u32..5, new_p in 1u32..5, mask in 0u32..16, n in 0u8..12,
            groups in proptest::collection::btree_set(0u32..32, 0..32)) {
            let groups: Vec<u32> = groups.into_iter().collect();
            let lists: Vec<Vec<u8>> = (0..old_p).map(|i| (0..n).filter(|e| *e as u32 % old_p == i).collect()).collect();
            let with_state = || {
                let mut c = checkpoint(old_p, 32, &groups);
                for (i, l) in lists.iter().enumerate() {
                    let st = NamedState { name: "l".into(), entries: l.iter().map(|e| (vec![], vec![*e])).collect() };
                    c.states.get_mut(&("op".to_string(), i as u32)).unwrap().operator_state = layout::encode(&[st]);
                }
                c
            };
            let g = graph(new_p, 32);
            let split = |_: usize, _: &str| Redistribution::Split;
            let whole = plan(&with_state(), &g, &split, &none(), false).unwrap();
            let here = |ni: usize, s: u32| ni == 1 && mask & (1 << s) != 0;
            let subset = crate::checkpoint::subset::Subset::of(&with_state().manifest, &g, &here);
            let mut part = with_state();
            part.states.retain(|(uid, s), _| subset.contains(uid, *s));
            let partial = plan(&part, &g, &split, &none(), false).unwrap();
            for s in (0..new_p).filter(|&s| here(1, s)) {
                prop_assert_eq!(&partial[1][s as usize], &whole[1][s as usize]);
            }
            if old_p == new_p {
                for i in 0..old_p {
                    prop_assert_eq!(subset.contains("op", i), here(1, i));
                }
            }
        }
    }

    #[test]
    fn refusals_name_what_to_do() {
        let e = plan(&checkpoint(2, 32, &[1]), &graph(2, 64), &keep, &none(), false).unwrap_err();
        assert!(e.to_string().contains("set [job] max_parallelism = 32"), "{e}");
        let mut g = graph(2, 32);
        g.nodes[1].id = crate::ids::NodeId::new("renamed");
        let e = plan(&checkpoint(2, 32, &[1]), &g, &keep, &none(), false).unwrap_err();
        assert_eq!(e, RecoveryError::Unmatched { uid: "op".into(), chk: 7 });
        assert!(plan(&checkpoint(2, 32, &[1]), &g, &keep, &none(), true).is_ok());
    }
}
