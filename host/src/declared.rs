//! What a component declares about itself (`describe`), as host domain types: its name and
//! versions, its state and side outputs. The sandbox converts the WIT records into these at
//! its edge (`sandbox/instance.rs`); checkpoint compatibility, recovery and job binding read
//! only these, never the WIT binding types.

/// What the component declares (`describe`), in host types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorInfo {
    /// Name.
    pub name: String,
    /// Semantic version.
    pub version: String,
    /// State schema version.
    pub schema_version: u32,
    /// Migratable older schema versions.
    pub migrates_from: Vec<u32>,
    /// Declared state.
    pub states: Vec<DeclaredState>,
    /// Side output names.
    pub side_outputs: Vec<String>,
    /// Implements `co-operator`.
    pub two_input: bool,
    /// Exports `page-in` and `page-out` (worlds `paged-*`): can run on the disk backend.
    pub pageable: bool,
}

impl OperatorInfo {
    /// Declares any keyed state.
    pub fn has_keyed_state(&self) -> bool {
        self.states.iter().any(|s| s.keyed)
    }
}

/// The shape of a declared state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// One value per key (or per subtask).
    Value,
    /// A list per key.
    List,
    /// A map per key.
    Map,
}

/// How non-keyed state moves when the operator's parallelism changes (keyed state always
/// moves by key-group ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redistribution {
    /// Restores only at the parallelism that wrote it (a rescale of non-empty state is
    /// refused before the job starts, naming the state).
    None,
    /// The entries of every old subtask are dealt round-robin to the new subtasks.
    Split,
    /// Every new subtask gets the entries of every old subtask.
    Union,
}

/// One piece of state an operator declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredState {
    /// Name.
    pub name: String,
    /// Shape.
    pub kind: StateKind,
    /// Partitioned by key group.
    pub keyed: bool,
    /// Non-keyed state: how it moves on rescale.
    pub redistribution: Redistribution,
}

impl DeclaredState {
    /// `value`, `list`, `map`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            StateKind::Value => "value",
            StateKind::List => "list",
            StateKind::Map => "map",
        }
    }

    /// `none`, `split`, `union`.
    pub fn redistribution_name(&self) -> &'static str {
        match self.redistribution {
            Redistribution::None => "none",
            Redistribution::Split => "split",
            Redistribution::Union => "union",
        }
    }
}
