//! State queries against a checkpoint or savepoint directory (`weir query --checkpoint DIR`):
//! the same `query-state` as a live query, asked of the state as of that checkpoint.
//!
//! The operator's component is the one stored with the checkpoint (or one given), instantiated
//! for the subtask that owned the key's group, opened, and restored from that subtask's
//! state (incremental chains folded) — exactly as a restore would — then asked. Nothing is
//! written: the directory is only read, and the instance is dropped after the answer.

use std::path::{Path, PathBuf};

use wasmtime::Engine;

use crate::checkpoint::metadata::ComponentEntry;
use crate::checkpoint::storage;
use crate::operator::OperatorLogic;
use crate::runtime::query::{QueryAnswer, resolve_state};
use crate::runtime::task::put_state;
use crate::sandbox::bindings::types::TaskInfo;
use crate::sandbox::host::HostState;
use crate::sandbox::instance::LoadedComponent;

/// What to ask of which checkpoint.
#[derive(Debug, Clone)]
pub struct OfflineQuery<'a> {
    /// A checkpoint (`chk-<n>`) or savepoint directory.
    pub dir: &'a Path,
    /// Operator uid.
    pub operator: &'a str,
    /// The key.
    pub key: &'a [u8],
    /// The keyed state (`None`: the operator's only one).
    pub state: Option<&'a str>,
    /// The component to ask (`None`: the one stored with the checkpoint).
    pub component: Option<PathBuf>,
    /// The operator's `config` table, for its `setup` (as in the job file).
    pub config: Vec<(String, String)>,
}

/// The component a checkpoint names: the file stored with it, or (`weir serve`, where the
/// tenant's uploads are kept once) `components/<sha256>.wasm` in a directory above it,
/// checked against the digest.
fn stored_component(dir: &Path, entry: &ComponentEntry) -> Option<PathBuf> {
    if let Some(s) = &entry.stored {
        return Some(dir.join(s));
    }
    let sha = entry.sha256.as_deref()?;
    dir.ancestors()
        .take(8)
        .map(|a| a.join("components").join(format!("{sha}.wasm")))
        .find(|p| std::fs::read(p).is_ok_and(|b| crate::sandbox::instance::sha256_hex(&b) == sha))
}

/// Answers `q` from its checkpoint directory.
pub fn query_checkpoint(engine: &Engine, q: &OfflineQuery<'_>) -> Result<QueryAnswer, String> {
    let c = storage::load(q.dir).map_err(|e| e.to_string())?;
    let m = &c.manifest;
    let uid = q.operator;
    let Some(op) = m.operator(uid) else {
        let uids: Vec<&str> = m.operators.iter().map(|o| o.uid.as_str()).collect();
        return Err(format!("{} has no operator `{uid}` (it has: {})", q.dir.display(), uids.join(", ")));
    };
    let Some(entry) = op.component.as_ref() else {
        return Err(format!("`{uid}` is a source or sink; only WASM operators keep state that can be queried"));
    };
    let declared: Vec<(String, bool)> = entry.states.iter().map(|s| (s.name.clone(), s.keyed)).collect();
    let state = resolve_state(uid, &declared, q.state)?;
    let path = match &q.component {
        Some(p) => p.clone(),
        None => stored_component(q.dir, entry).ok_or_else(|| {
            format!(
                "{} does not hold `{uid}`'s component ({} {}) and no components/<sha256>.wasm beside or above it \
                 matches its digest; name it with --component",
                q.dir.display(),
                entry.name,
                entry.version
            )
        })?,
    };
    let kg = crate::keygroup::key_group(q.key, m.max_parallelism);
    let Some(sub) = op.subtasks.iter().find(|s| (s.key_groups.0..s.key_groups.1).contains(&kg)) else {
        return Err(format!("no subtask of `{uid}` owned key group {kg} at checkpoint {}", m.checkpoint_id));
    };
    let mut snapshot = c.states.get(&(uid.to_string(), sub.index)).cloned().unwrap_or_default();
    // Only the key's group is read and restored, not the whole subtask's state.
    snapshot.keyed.retain(|g| g.key_group == kg);
    if let Some(s) = snapshot.streamed.as_mut() {
        s.parts.iter_mut().for_each(|p| p.1.retain(|&g| g == kg));
    }
    let component = LoadedComponent::load(engine, uid, &path).map_err(|e| e.to_string())?;
    let task = TaskInfo {
        job_name: m.job.clone(),
        operator_uid: uid.to_string(),
        subtask_index: sub.index,
        parallelism: op.parallelism,
        max_parallelism: m.max_parallelism,
        key_group_start: sub.key_groups.0,
        key_group_end: sub.key_groups.1,
    };
    let mut host = HostState::new(task, component.info.side_outputs.len() as u32);
    host.echo_logs = false;
    let mut instance = component.instantiate(host).map_err(|e| e.to_string())?;
    let at = |what: &str, e: crate::sandbox::instance::GuestError| format!("`{uid}` subtask {} {what}: {e}", sub.index);
    instance.open(&q.config).map_err(|e| at("failed to open (pass its config with --config KEY=VALUE)", e))?;
    put_state(&mut instance, entry.schema_version, &snapshot)
        .map_err(|e| format!("`{uid}` subtask {} failed to restore: {e}", sub.index))?;
    let value = OperatorLogic::query_state(&mut instance, &state, kg, q.key).map_err(|e| at("failed to answer", e))?;
    QueryAnswer::from_guest(uid, sub.index, &state, kg, q.key, value)
}
