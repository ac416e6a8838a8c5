//! Version safety, as a pure function: can the state an operator's old component wrote (as
//! a checkpoint or savepoint recorded it, or as a running instance holds it) be restored
//! into a new component?
//!
//! Rules: the new component reads its own schema and every schema in its `migrates-from`;
//! state from any other schema (newer, or older and dropped) is refused. A state keeps its
//! kind and its keying across versions (a value cannot become a map, keyed cannot become
//! per-subtask): a change is refused. A state the new component no longer declares is
//! refused unless the user allows dropping it. Every refusal names the operator, both
//! components and versions, and what to do. It runs before any task starts.

use thiserror::Error;

use crate::checkpoint::metadata::{ComponentEntry, StateEntry};
use crate::declared::{DeclaredState, OperatorInfo};

/// Why a new component cannot take over an operator's state.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CompatError {
    /// The state was written by a newer schema.
    #[error(
        "operator `{uid}`: {source_name} holds state schema {old_schema} written by `{old}`, but `{new}` writes \
         schema {new_schema} (migrates from {migrates}): it cannot read state of a newer schema. Run a version \
         that writes or migrates from schema {old_schema}, or restore a savepoint taken before the upgrade to \
         schema {old_schema}"
    )]
    NewerSchema {
        /// Operator uid.
        uid: String,
        /// Where the state comes from (`savepoint <dir> (checkpoint 12)`, `the running job`).
        source_name: String,
        /// Old component `name version`.
        old: String,
        /// Its schema.
        old_schema: u32,
        /// New component `name version`.
        new: String,
        /// Its schema.
        new_schema: u32,
        /// Its `migrates-from`, formatted.
        migrates: String,
    },
    /// An older schema the new component does not migrate from.
    #[error(
        "operator `{uid}`: {source_name} holds state schema {old_schema} written by `{old}`; `{new}` writes schema \
         {new_schema} and migrates only from {migrates}. Upgrade through a version that migrates from schema \
         {old_schema} (restore into it and take a new savepoint), or add {old_schema} to its migrates-from"
    )]
    NotMigratable {
        /// Operator uid.
        uid: String,
        /// Where the state comes from.
        source_name: String,
        /// Old component.
        old: String,
        /// Its schema.
        old_schema: u32,
        /// New component.
        new: String,
        /// Its schema.
        new_schema: u32,
        /// Its `migrates-from`.
        migrates: String,
    },
    /// A state changed kind or keying.
    #[error(
        "operator `{uid}`: state `{state}` is {old_shape} in {source_name} (`{old}`) but `{new}` declares it as \
         {new_shape}; a state's kind and keying cannot be migrated. Keep the declaration, or give the new state \
         another name (and drop the old one with --allow-non-restored-state)"
    )]
    StateChanged {
        /// Operator uid.
        uid: String,
        /// State name.
        state: String,
        /// Where the state comes from.
        source_name: String,
        /// Old component.
        old: String,
        /// `a keyed value` etc.
        old_shape: String,
        /// New component.
        new: String,
        /// Its shape.
        new_shape: String,
    },
    /// A state the new component does not declare.
    #[error(
        "operator `{uid}`: {source_name} holds state `{state}` (written by `{old}`), which `{new}` no longer \
         declares; restore with --allow-non-restored-state to drop it"
    )]
    StateDropped {
        /// Operator uid.
        uid: String,
        /// State name.
        state: String,
        /// Where the state comes from.
        source_name: String,
        /// Old component.
        old: String,
        /// New component.
        new: String,
    },
}

/// What restoring into the new component will do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The state is migrated from this older schema (None: same schema).
    pub migrates_from: Option<u32>,
    /// States to drop (allowed by the user).
    pub dropped: Vec<String>,
}

fn shape(keyed: bool, kind: &str) -> String {
    format!("a {} {kind}", if keyed { "keyed" } else { "per-subtask" })
}

/// The recorded form of a declared state.
pub fn state_entry(s: &DeclaredState) -> StateEntry {
    StateEntry {
        name: s.name.clone(),
        kind: s.kind_name().to_string(),
        keyed: s.keyed,
        redistribution: s.redistribution_name().to_string(),
    }
}

/// Checks that `new` can take over the state `old` wrote, for operator `uid`; `source_name`
/// says where the state comes from. `allow_dropped` lets states `new` no longer declares
/// be dropped.
pub fn check(
    uid: &str,
    source_name: &str,
    old: &ComponentEntry,
    new: &OperatorInfo,
    allow_dropped: bool,
) -> Result<Verdict, Box<CompatError>> {
    let old_name = format!("{} {}", old.name, old.version);
    let new_name = format!("{} {}", new.name, new.version);
    let migrates =
        if new.migrates_from.is_empty() { "no older schema".to_string() } else { format!("{:?}", new.migrates_from) };
    let mut verdict = Verdict::default();
    if old.schema_version != new.schema_version {
        if new.migrates_from.contains(&old.schema_version) {
            verdict.migrates_from = Some(old.schema_version);
        } else if old.schema_version > new.schema_version {
            return Err(Box::new(CompatError::NewerSchema {
                uid: uid.into(),
                source_name: source_name.into(),
                old: old_name,
                old_schema: old.schema_version,
                new: new_name,
                new_schema: new.schema_version,
                migrates,
            }));
        } else {
            return Err(Box::new(CompatError::NotMigratable {
                uid: uid.into(),
                source_name: source_name.into(),
                old: old_name,
                old_schema: old.schema_version,
                new: new_name,
                new_schema: new.schema_version,
                migrates,
            }));
        }
    }
    for o in &old.states {
        match new.states.iter().find(|n| n.name == o.name) {
            Some(n) if n.keyed != o.keyed || n.kind_name() != o.kind => {
                return Err(Box::new(CompatError::StateChanged {
                    uid: uid.into(),
                    state: o.name.clone(),
                    source_name: source_name.into(),
                    old: old_name,
                    old_shape: shape(o.keyed, &o.kind),
                    new: new_name,
                    new_shape: shape(n.keyed, n.kind_name()),
                }));
            }
            Some(_) => {}
            None if allow_dropped => verdict.dropped.push(o.name.clone()),
            None => {
                return Err(Box::new(CompatError::StateDropped {
                    uid: uid.into(),
                    state: o.name.clone(),
                    source_name: source_name.into(),
                    old: old_name,
                    new: new_name,
                }));
            }
        }
    }
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declared::{Redistribution, StateKind};

    fn declared(name: &str, kind: StateKind, keyed: bool) -> DeclaredState {
        DeclaredState { name: name.into(), kind, keyed, redistribution: Redistribution::None }
    }

    fn info(version: &str, schema: u32, migrates: &[u32], states: Vec<DeclaredState>) -> OperatorInfo {
        OperatorInfo {
            name: "counter".into(),
            version: version.into(),
            schema_version: schema,
            migrates_from: migrates.to_vec(),
            states,
            side_outputs: vec![],
            two_input: false,
            pageable: false,
        }
    }

    fn recorded(i: &OperatorInfo) -> ComponentEntry {
        ComponentEntry {
            name: i.name.clone(),
            version: i.version.clone(),
            schema_version: i.schema_version,
            states: i.states.iter().map(state_entry).collect(),
            sha256: None,
            stored: None,
            replaces: vec![],
        }
    }

    #[test]
    fn same_schema_and_declared_migrations_pass() {
        let v1 = info("1.0.0", 1, &[], vec![declared("count", StateKind::Value, true)]);
        let v2 = info("2.0.0", 2, &[1], vec![declared("count", StateKind::Value, true)]);
        assert_eq!(check("c", "s", &recorded(&v1), &v1, false).unwrap(), Verdict::default());
        assert_eq!(check("c", "s", &recorded(&v1), &v2, false).unwrap().migrates_from, Some(1));
    }

    #[test]
    fn refusals_name_operator_versions_and_what_to_do() {
        let v1 = info("1.0.0", 1, &[], vec![declared("count", StateKind::Value, true)]);
        let v3 = info("3.0.0", 3, &[2], vec![declared("count", StateKind::Value, true)]);
        let e = check("count", "savepoint /sp (checkpoint 4)", &recorded(&v1), &v3, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "operator `count`: savepoint /sp (checkpoint 4) holds state schema 1 written by `counter 1.0.0`; \
             `counter 3.0.0` writes schema 3 and migrates only from [2]. Upgrade through a version that migrates \
             from schema 1 (restore into it and take a new savepoint), or add 1 to its migrates-from"
        );
        let e = check("count", "s", &recorded(&v3), &v1, false).unwrap_err();
        assert!(matches!(*e, CompatError::NewerSchema { old_schema: 3, new_schema: 1, .. }), "{e}");
        assert!(e.to_string().contains("cannot read state of a newer schema"), "{e}");
    }

    #[test]
    fn kind_and_keying_changes_are_refused_and_dropped_state_needs_permission() {
        let v1 = info("1.0.0", 1, &[], vec![declared("count", StateKind::Value, true)]);
        let map = info("1.1.0", 1, &[], vec![declared("count", StateKind::Map, true)]);
        let e = check("c", "s", &recorded(&v1), &map, false).unwrap_err();
        assert!(e.to_string().contains("is a keyed value in s") && e.to_string().contains("as a keyed map"), "{e}");
        let unkeyed = info("1.1.0", 1, &[], vec![declared("count", StateKind::Value, false)]);
        assert!(matches!(
            check("c", "s", &recorded(&v1), &unkeyed, false).map_err(|e| *e),
            Err(CompatError::StateChanged { .. })
        ));
        let none = info("1.1.0", 1, &[], vec![]);
        let e = check("c", "s", &recorded(&v1), &none, false).unwrap_err();
        assert!(e.to_string().contains("--allow-non-restored-state"), "{e}");
        assert_eq!(check("c", "s", &recorded(&v1), &none, true).unwrap().dropped, vec!["count".to_string()]);
    }
}
