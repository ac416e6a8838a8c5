//! The checkpoint manifest (`_metadata`): which operators, at which parallelism and component
//! version, and where each subtask's state file is, with its size and checksum.
//!
//! Format: a first line `weir-checkpoint <format-version> crc32=<hex>` followed by JSON (so a
//! person can read it). Invariant: a checkpoint is complete exactly when its manifest exists
//! and verifies; the manifest is written last and published by an atomic rename. Every path
//! in it is relative to its own directory, so a checkpoint or savepoint directory can be
//! moved or copied anywhere (a savepoint holds every file it names).
//!
//! Format history: 1 = the first release; 2 adds `kind` (checkpoint or savepoint), the
//! declared state of each operator's component, the component's digest and live-upgrade
//! history. Version 1 manifests still load (the new fields default to empty). 3 adds the
//! `chain` of incremental snapshots; a manifest without chains is still written as 2, so
//! older Weir versions read it, and one with chains as 3, which they refuse rather than
//! restore only the newest deltas.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Current manifest format version.
pub const FORMAT_VERSION: u32 = 3;

/// The version a manifest is written with: 3 only when it needs chains.
pub fn format_version_for(operators: &[OperatorEntry]) -> u32 {
    if operators.iter().flat_map(|o| &o.subtasks).any(|s| !s.chain.is_empty()) { 3 } else { 2 }
}

/// One piece of state an operator declared, as recorded at the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateEntry {
    /// Declared name.
    pub name: String,
    /// `value`, `list` or `map`.
    pub kind: String,
    /// Partitioned by key group.
    pub keyed: bool,
    /// Non-keyed state: how it is redistributed on rescale (`split`, `union`, `none`).
    #[serde(default)]
    pub redistribution: String,
}

/// The component behind an operator, as recorded at the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentEntry {
    /// `operator-info.name`.
    pub name: String,
    /// Semantic version.
    pub version: String,
    /// State schema version of the state in this checkpoint (after a live upgrade at this
    /// checkpoint: the schema of the old component, which wrote the state).
    pub schema_version: u32,
    /// The state the component declared.
    #[serde(default)]
    pub states: Vec<StateEntry>,
    /// SHA-256 of the component's bytes (hex).
    #[serde(default)]
    pub sha256: Option<String>,
    /// A live-upgraded component: its bytes, relative to the job's checkpoint directory
    /// (`components/<sha256>.wasm`), so recovery runs the upgraded version.
    #[serde(default)]
    pub stored: Option<String>,
    /// Digests of the components this one replaced by live upgrades, oldest first: recovery
    /// with a job file that still names one of them runs `stored` instead.
    #[serde(default)]
    pub replaces: Vec<String>,
}

/// One subtask's state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubtaskEntry {
    /// Subtask index.
    pub index: u32,
    /// File name, relative to the checkpoint directory.
    pub file: String,
    /// File size.
    pub bytes: u64,
    /// CRC-32 of the file body.
    pub crc32: u32,
    /// Key groups owned: `[start, end)`.
    pub key_groups: (u32, u32),
    /// Incremental snapshots: the earlier state files this one builds on, oldest (a full
    /// snapshot) first (`checkpoint/incremental.rs`). Empty: the file is self-contained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chain: Vec<crate::checkpoint::incremental::ChainLink>,
    /// How long the subtask's part took (for operators' eyes; absent in older manifests and
    /// in files written by a rescale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<SubtaskTiming>,
}

/// One subtask's part of a checkpoint, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SubtaskTiming {
    /// First barrier to last (multi-input subtasks).
    pub align_ms: f64,
    /// Synchronous part: the guest's snapshot export and capture.
    pub sync_ms: f64,
    /// Asynchronous part: serialize, write, fsync.
    pub async_ms: f64,
}

/// One node of the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorEntry {
    /// The uid.
    pub uid: String,
    /// `source`, `operator` or `sink`.
    pub kind: String,
    /// Parallelism when the checkpoint was taken.
    pub parallelism: u32,
    /// The component (operators only).
    pub component: Option<ComponentEntry>,
    /// Every subtask's state.
    pub subtasks: Vec<SubtaskEntry>,
    /// File sinks: subtask indices that existed in an earlier run at a higher parallelism,
    /// with the next part number each stopped at (its committed parts below it are output;
    /// anything at or above it that appears later is from a rolled-back future).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<(u32, u64)>,
}

/// Per-checkpoint measurements.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetrics {
    /// Checkpoint id.
    pub id: u64,
    /// Trigger time, ms since the Unix epoch.
    pub trigger_unix_ms: u64,
    /// Trigger to manifest published.
    pub duration_ms: f64,
    /// Longest synchronous part of any subtask (guest snapshot export, capture).
    pub sync_ms_max: f64,
    /// Longest asynchronous part (serialize, write, fsync).
    pub async_ms_max: f64,
    /// Longest alignment (first barrier to last).
    pub alignment_ms_max: f64,
    /// Bytes written (state files + manifest).
    pub bytes: u64,
    /// Records in transit on loop back-edges, logged by loop heads (cyclic jobs).
    #[serde(default)]
    pub backedge_log_records: u64,
    /// Their size in bytes.
    #[serde(default)]
    pub backedge_log_bytes: u64,
    /// A live upgrade that switched versions at this checkpoint's barrier:
    /// `<uid>: <old> -> <new>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<String>,
}

/// Periodic checkpoint or user-triggered savepoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// Taken by the coordinator, owned and deleted by Weir.
    #[default]
    Checkpoint,
    /// Taken on request, owned by the user, self-contained.
    Savepoint,
}

/// The manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version.
    pub format_version: u32,
    /// Checkpoint or savepoint.
    #[serde(default)]
    pub kind: SnapshotKind,
    /// Job name.
    pub job: String,
    /// Checkpoint id.
    pub checkpoint_id: u64,
    /// When it was published, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// Taken after every task finished: restoring it only commits what it pre-committed.
    pub finished: bool,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Every node.
    pub operators: Vec<OperatorEntry>,
    /// How the checkpoint went.
    pub metrics: CheckpointMetrics,
}

/// A manifest that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ManifestError {
    /// Missing or malformed header line.
    #[error("missing or malformed header line")]
    Header,
    /// Written by a newer Weir.
    #[error("format version {0} is newer than this Weir understands ({FORMAT_VERSION})")]
    Version(u32),
    /// Checksum mismatch.
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum {
        /// Stored CRC.
        stored: u32,
        /// Computed CRC.
        computed: u32,
    },
    /// JSON does not decode.
    #[error("cannot decode: {0}")]
    Decode(String),
}

impl Manifest {
    /// The node entry with this uid.
    pub fn operator(&self, uid: &str) -> Option<&OperatorEntry> {
        self.operators.iter().find(|o| o.uid == uid)
    }

    /// Encodes to the `_metadata` format.
    pub fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_vec_pretty(self).expect("manifest always serializes");
        let crc = crc32fast::hash(&body);
        let mut out = format!("weir-checkpoint {} crc32={crc:08x}\n", self.format_version).into_bytes();
        out.extend_from_slice(&body);
        out
    }

    /// Decodes and verifies `_metadata` bytes.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let nl = bytes.iter().position(|&b| b == b'\n').ok_or(ManifestError::Header)?;
        let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| ManifestError::Header)?;
        let mut parts = header.split(' ');
        if parts.next() != Some("weir-checkpoint") {
            return Err(ManifestError::Header);
        }
        let version: u32 = parts.next().and_then(|v| v.parse().ok()).ok_or(ManifestError::Header)?;
        if version > FORMAT_VERSION {
            return Err(ManifestError::Version(version));
        }
        let stored = parts
            .next()
            .and_then(|c| c.strip_prefix("crc32="))
            .and_then(|c| u32::from_str_radix(c, 16).ok())
            .ok_or(ManifestError::Header)?;
        let body = &bytes[nl + 1..];
        let computed = crc32fast::hash(body);
        if computed != stored {
            return Err(ManifestError::Checksum { stored, computed });
        }
        serde_json::from_slice(body).map_err(|e| ManifestError::Decode(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Fuzz: a manifest with a valid header and checksum around arbitrary bytes, or around
        /// a valid manifest's JSON with bytes flipped, decodes or fails, never panics.
        #[test]
        fn sandbox_fuzz_manifests_never_panic(
            garbage in any::<Vec<u8>>(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ) {
            let frame = |body: &[u8]| {
                let mut out = format!("weir-checkpoint {FORMAT_VERSION} crc32={:08x}\n", crc32fast::hash(body)).into_bytes();
                out.extend_from_slice(body);
                out
            };
            let _ = Manifest::decode(&frame(&garbage));
            let _ = Manifest::decode(&garbage);
            let valid = sample();
            let mut body = serde_json::to_vec_pretty(&valid).unwrap();
            for (at, x) in &flips {
                let i = at % body.len();
                body[i] ^= x;
            }
            let _ = Manifest::decode(&frame(&body));
        }
    }

    fn sample() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            kind: SnapshotKind::Savepoint,
            job: "j".into(),
            checkpoint_id: 4,
            created_unix_ms: 1,
            finished: false,
            max_parallelism: 128,
            operators: vec![OperatorEntry {
                uid: "count".into(),
                kind: "operator".into(),
                parallelism: 1,
                component: Some(ComponentEntry {
                    name: "c".into(),
                    version: "1.0.0".into(),
                    schema_version: 1,
                    states: vec![StateEntry {
                        name: "counts".into(),
                        kind: "value".into(),
                        keyed: true,
                        redistribution: String::new(),
                    }],
                    sha256: Some("ab".into()),
                    stored: None,
                    replaces: vec![],
                }),
                subtasks: vec![SubtaskEntry {
                    index: 0,
                    file: "count-0.state".into(),
                    bytes: 9,
                    crc32: 1,
                    key_groups: (0, 128),
                    chain: vec![],
                    timing: None,
                }],
                retired: vec![],
            }],
            metrics: CheckpointMetrics::default(),
        }
    }

    #[test]
    fn round_trips_and_detects_tampering() {
        let m = sample();
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        let mut bad = bytes.clone();
        let last = bad.len() - 3;
        bad[last] ^= 1;
        assert!(matches!(Manifest::decode(&bad), Err(ManifestError::Checksum { .. })));
        assert_eq!(Manifest::decode(b"garbage"), Err(ManifestError::Header));
    }

    #[test]
    fn version_1_manifests_still_load() {
        let body = br#"{"format_version":1,"job":"j","checkpoint_id":3,"created_unix_ms":1,"finished":false,
            "max_parallelism":8,"operators":[{"uid":"c","kind":"operator","parallelism":1,
            "component":{"name":"c","version":"1.0.0","schema_version":1},"subtasks":[]}],
            "metrics":{"id":3,"trigger_unix_ms":0,"duration_ms":1.0,"sync_ms_max":0.0,"async_ms_max":0.0,
            "alignment_ms_max":0.0,"bytes":0}}"#;
        let mut bytes = format!("weir-checkpoint 1 crc32={:08x}\n", crc32fast::hash(body)).into_bytes();
        bytes.extend_from_slice(body);
        let m = Manifest::decode(&bytes).unwrap();
        assert_eq!(m.kind, SnapshotKind::Checkpoint);
        assert!(m.operators[0].component.as_ref().unwrap().states.is_empty());
    }
}
