//! What an operator declares about itself: identity, versions, state, side outputs.
//!
//! The declaration is static (`Operator::INFO`) so the host can read it with `describe`
//! before any configuration and check an upgrade before a job starts.

use crate::bindings::types;

/// Shape of a declared state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateKind {
    /// One value per key.
    Value,
    /// A list per key.
    List,
    /// A map per key.
    Map,
}

/// How non-keyed state moves when the operator's parallelism changes (see the WIT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redistribution {
    /// Restores only at the parallelism that wrote it (keyed state, operator values).
    None,
    /// List elements of all old subtasks are dealt round-robin to the new subtasks.
    Split,
    /// Every new subtask gets the elements of every old subtask.
    Union,
}

/// One declared piece of state.
#[derive(Clone, Copy, Debug)]
pub struct StateDescriptor {
    /// Name, unique within the operator; state is matched by it on restore.
    pub name: &'static str,
    /// Shape.
    pub kind: StateKind,
    /// Keyed (partitioned by key group) or per subtask.
    pub keyed: bool,
    /// Non-keyed state: how it is redistributed on rescale.
    pub redistribution: Redistribution,
}

impl StateDescriptor {
    /// A keyed [`ValueState`](crate::ValueState).
    pub const fn keyed_value(name: &'static str) -> Self {
        StateDescriptor { name, kind: StateKind::Value, keyed: true, redistribution: Redistribution::None }
    }
    /// A keyed [`ListState`](crate::ListState).
    pub const fn keyed_list(name: &'static str) -> Self {
        StateDescriptor { name, kind: StateKind::List, keyed: true, redistribution: Redistribution::None }
    }
    /// A keyed [`MapState`](crate::MapState).
    pub const fn keyed_map(name: &'static str) -> Self {
        StateDescriptor { name, kind: StateKind::Map, keyed: true, redistribution: Redistribution::None }
    }
    /// A per-subtask [`OperatorValue`](crate::OperatorValue): restores only at the same
    /// parallelism (a value cannot be split or merged without knowing what it means).
    pub const fn operator_value(name: &'static str) -> Self {
        StateDescriptor { name, kind: StateKind::Value, keyed: false, redistribution: Redistribution::None }
    }
    /// A per-subtask [`OperatorList`](crate::OperatorList), redistributed on rescale as
    /// `redistribution` says (`Split` or `Union`).
    pub const fn operator_list(name: &'static str, redistribution: Redistribution) -> Self {
        StateDescriptor { name, kind: StateKind::List, keyed: false, redistribution }
    }
}

/// An operator's declaration.
#[derive(Clone, Copy, Debug)]
pub struct OperatorInfo {
    /// Operator name.
    pub name: &'static str,
    /// Semantic version of this component.
    pub version: &'static str,
    /// Version of the state layout this component writes.
    pub schema_version: u32,
    /// Older schema versions it can migrate from (see `Operator::migrate_value`).
    pub migrates_from: &'static [u32],
    /// Declared state.
    pub states: &'static [StateDescriptor],
    /// Side output names; `Context::emit_side` addresses them by name.
    pub side_outputs: &'static [&'static str],
}

impl OperatorInfo {
    /// A stateless operator named `name` at `version`, schema 1.
    pub const fn new(name: &'static str, version: &'static str) -> Self {
        OperatorInfo { name, version, schema_version: 1, migrates_from: &[], states: &[], side_outputs: &[] }
    }

    pub(crate) fn state(&self, name: &str) -> Option<&StateDescriptor> {
        self.states.iter().find(|s| s.name == name)
    }

    pub(crate) fn to_wit(self) -> types::OperatorInfo {
        types::OperatorInfo {
            name: self.name.into(),
            version: self.version.into(),
            state_schema_version: self.schema_version,
            migrates_from: self.migrates_from.to_vec(),
            states: self
                .states
                .iter()
                .map(|s| types::StateDescriptor {
                    name: s.name.into(),
                    kind: match s.kind {
                        StateKind::Value => types::StateKind::Value,
                        StateKind::List => types::StateKind::List,
                        StateKind::Map => types::StateKind::Map,
                    },
                    keyed: s.keyed,
                    redistribution: match s.redistribution {
                        Redistribution::None => types::Redistribution::None,
                        Redistribution::Split => types::Redistribution::Split,
                        Redistribution::Union => types::Redistribution::Union,
                    },
                })
                .collect(),
            side_outputs: self.side_outputs.iter().map(|s| s.to_string()).collect(),
        }
    }
}
