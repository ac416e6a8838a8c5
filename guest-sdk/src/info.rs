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

/// One declared piece of state.
#[derive(Clone, Copy, Debug)]
pub struct StateDescriptor {
    /// Name, unique within the operator; state is matched by it on restore.
    pub name: &'static str,
    /// Shape.
    pub kind: StateKind,
    /// Keyed (partitioned by key group) or per subtask.
    pub keyed: bool,
}

impl StateDescriptor {
    /// A keyed [`ValueState`](crate::ValueState).
    pub const fn keyed_value(name: &'static str) -> Self {
        StateDescriptor { name, kind: StateKind::Value, keyed: true }
    }
    /// A keyed [`ListState`](crate::ListState).
    pub const fn keyed_list(name: &'static str) -> Self {
        StateDescriptor { name, kind: StateKind::List, keyed: true }
    }
    /// A keyed [`MapState`](crate::MapState).
    pub const fn keyed_map(name: &'static str) -> Self {
        StateDescriptor { name, kind: StateKind::Map, keyed: true }
    }
    /// A per-subtask [`OperatorValue`](crate::OperatorValue).
    pub const fn operator_value(name: &'static str) -> Self {
        StateDescriptor { name, kind: StateKind::Value, keyed: false }
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
                })
                .collect(),
            side_outputs: self.side_outputs.iter().map(|s| s.to_string()).collect(),
        }
    }
}
