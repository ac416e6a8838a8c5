//! Newtype ids used across modules, so a subtask index is never confused with a key group.

use std::fmt;
use std::sync::Arc;

/// The uid of a job node (source, operator or sink): its `id` in the job file.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Arc<str>);

impl NodeId {
    /// Wraps a uid.
    pub fn new(s: &str) -> Self {
        NodeId(Arc::from(s))
    }
    /// The uid as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// Index of a parallel instance of a node, `0..parallelism`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubtaskIndex(pub u32);

impl fmt::Display for SubtaskIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A key group, `0..max_parallelism`: the unit keyed state is partitioned and moved by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyGroup(pub u32);

/// Index of one input channel of a task (one per upstream subtask and edge).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InputIndex(pub usize);

/// A checkpoint id: monotonic within a job, across restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct CheckpointId(pub u64);

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A subtask by node and index, as errors and logs name it: `count#1`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TaskId {
    /// The node.
    pub node: NodeId,
    /// Which parallel instance.
    pub subtask: SubtaskIndex,
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.node, self.subtask)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}
