//! The object-store side of a mirrored checkpoint store: the local directory is written as
//! always, and the object store (`checkpoint/remote.rs`) receives every state file before its
//! subtask acks, the manifest before the local one (conditional create: the atomic publish),
//! upgraded components, and retention's deletions. A process that starts with an empty or
//! stale local directory restores by downloading the newest complete checkpoint (its files,
//! the earlier files its chains name, its stored components) and then loading it locally as
//! any other. On a cluster the local directories are private: a worker's store keeps no local
//! copies (each file is deleted once uploaded, old leftovers swept), the coordinator's holds
//! manifests and checks workers' files in the object store before publishing.
//!
//! Invariants: the object store is the truth about which checkpoints are complete (a
//! manifest there); file names a downloaded manifest gives are checked before anything is
//! written locally; downloads are bounded by the sizes the manifest declares; a store that
//! cannot be reached is an error naming it, never "no checkpoint" (which would restart a job
//! from the beginning), and neither is a completed checkpoint whose files could not all be
//! fetched or verified (restoring an older one would repeat what it committed); only
//! checkpoints without a manifest are passed over.

use std::path::PathBuf;

use crate::checkpoint::metadata::Manifest;
use crate::checkpoint::remote::{Remote, RemoteError};
use crate::checkpoint::storage::{
    CheckpointError, CheckpointStore, LoadedCheckpoint, MANIFEST, check_names, load_part, read_manifest,
    store_component, to_drop, write_atomic,
};
use crate::checkpoint::subset::{Scope, everything};
use crate::ids::CheckpointId;

/// How many checkpoint ids behind the one just uploaded a worker's empty local checkpoint
/// directories are removed.
const SWEEP_LAG: u64 = 8;
/// Largest manifest accepted from the object store.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// Largest file of a chain or component accepted (the host's snapshot ceiling).
const MAX_FILE_BYTES: u64 = crate::graph::limits::CEILING.max_snapshot_mb << 20;

impl CheckpointStore {
    /// The object store this store mirrors to, if any.
    pub fn remote(&self) -> Option<&Remote> {
        self.remote.as_ref()
    }

    /// Uploads state file `file` of checkpoint `id` (nothing to do without an object store).
    /// A store that keeps no local copies then drops the file, uploaded or not (a failed
    /// upload fails the checkpoint: the file is of no use), and sweeps older leftovers.
    pub fn upload_state(&self, id: CheckpointId, file: &str) -> std::io::Result<()> {
        let Some(r) = &self.remote else { return Ok(()) };
        let (dir, rel) = (self.chk_dir(id), format!("chk-{}/{file}", id.0));
        let uploaded = r.upload(&rel, &dir.join(file)).map_err(RemoteError::into_io);
        if !self.keep_local {
            let _ = std::fs::remove_file(dir.join(file));
            self.sweep_before(id.0.saturating_sub(SWEEP_LAG));
        }
        uploaded
    }

    /// Removes the `chk-<m>` directories here with `m < before`, whatever they hold (temporary
    /// files of abandoned snapshots, files whose upload failed): a store without local copies
    /// never reads them. Lagging behind the newest id, it never takes a directory from under a
    /// checkpoint still being written, short of one that many checkpoints late, which then only
    /// fails to complete.
    fn sweep_before(&self, before: u64) {
        let Ok(entries) = std::fs::read_dir(self.root()) else { return };
        for e in entries.flatten() {
            let name = e.file_name();
            let id = name.to_str().and_then(|n| n.strip_prefix("chk-")).and_then(|n| n.parse::<u64>().ok());
            if id.is_some_and(|m| m < before) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    /// Stores a live-upgraded component with the checkpoints (and in the object store);
    /// returns its path relative to a checkpoint directory.
    pub fn keep_component(&self, sha256: &str, bytes: &[u8]) -> std::io::Result<String> {
        let rel = store_component(self.root(), sha256, bytes)?;
        if let Some(r) = &self.remote {
            let key = format!("components/{sha256}.wasm");
            if r.size(&key).map_err(RemoteError::into_io)?.is_none() {
                r.upload(&key, &self.root().join(&key)).map_err(RemoteError::into_io)?;
            }
        }
        Ok(rel)
    }

    /// Checkpoint ids in the object store (complete or not), ascending; none without one.
    pub(crate) fn remote_ids(&self) -> Result<Vec<u64>, CheckpointError> {
        let Some(r) = &self.remote else { return Ok(Vec::new()) };
        let mut ids: Vec<u64> =
            r.dirs()?.iter().filter_map(|d| d.strip_prefix("chk-").and_then(|n| n.parse().ok())).collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// The manifest of checkpoint `id` in the object store (`None`: incomplete there).
    fn remote_manifest(&self, r: &Remote, id: u64) -> Result<Option<Manifest>, CheckpointError> {
        let dir = self.chk_dir(CheckpointId(id));
        if let Ok(m) = read_manifest(&dir) {
            return Ok(Some(m));
        }
        let Some(bytes) = r.read(&format!("chk-{id}/{MANIFEST}"), MAX_MANIFEST_BYTES)? else { return Ok(None) };
        Manifest::decode(&bytes)
            .map(Some)
            .map_err(|source| CheckpointError::Manifest { path: self.remote_path(r, id), source })
    }

    /// The newest complete checkpoint here or, when mirrored, in the object store: its id,
    /// where it is, and whether its job had run to its end. Only manifests are read.
    pub fn newest_complete(&self) -> Result<Option<(u64, String, bool)>, CheckpointError> {
        let Some(r) = &self.remote else {
            let newest = self.list().into_iter().rev().find_map(|l| Some((l.id, l.path, l.status.ok()?.finished)));
            return Ok(newest.map(|(id, path, finished)| (id, path.display().to_string(), finished)));
        };
        for id in self.remote_ids()?.into_iter().rev() {
            if let Some(m) = self.remote_manifest(r, id)? {
                return Ok(Some((id, self.remote_path(r, id).display().to_string(), m.finished)));
            }
        }
        Ok(None)
    }

    /// Where checkpoint `id` lives in the object store: `s3://bucket/prefix/<job>/chk-<id>`.
    pub(crate) fn remote_path(&self, r: &Remote, id: u64) -> PathBuf {
        PathBuf::from(format!("{}/chk-{id}", r.url()))
    }

    /// The newest checkpoint in the object store that downloads and verifies completely.
    pub(crate) fn fetch_latest(
        &self,
        scope: Scope<'_>,
        mut skipped: impl FnMut(&CheckpointError),
    ) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        let Some(r) = &self.remote else { return Ok(None) };
        for id in self.remote_ids()?.into_iter().rev() {
            match self.fetch(r, id, scope) {
                Ok(c) => return Ok(Some(c)),
                // The store stopped answering: an older checkpoint is no answer.
                Err(e) if e.is_incomplete() => skipped(&e),
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// [`download`](Self::download)s the part `scope` names of checkpoint `id` and loads it.
    pub(crate) fn fetch(&self, r: &Remote, id: u64, scope: Scope<'_>) -> Result<LoadedCheckpoint, CheckpointError> {
        let dir = self.download(r, id, scope)?;
        let mut loaded = load_part(&dir, scope)?;
        loaded.url = Some(self.remote_path(r, id).display().to_string());
        Ok(loaded)
    }

    /// Downloads what checkpoint `id` needs for the states `scope` names (their files and
    /// chains, every stored component) into the local directory (what is already there at
    /// the declared size is kept) and writes its manifest last; its directory.
    fn download(&self, r: &Remote, id: u64, scope: Scope<'_>) -> Result<PathBuf, CheckpointError> {
        let dir = self.chk_dir(CheckpointId(id));
        let manifest = self
            .remote_manifest(r, id)?
            .ok_or_else(|| CheckpointError::Incomplete { path: self.remote_path(r, id) })?;
        check_names(&manifest, &self.remote_path(r, id))?;
        let subset = scope(&manifest);
        // What is already here (at the declared size, when declared) is kept.
        let get = |rel: String, local: PathBuf, declared: Option<u64>| -> Result<(), CheckpointError> {
            match std::fs::metadata(&local) {
                Ok(m) if declared.is_none_or(|d| m.len() == d) => Ok(()),
                _ => r.download(&rel, &local, declared.unwrap_or(MAX_FILE_BYTES)).map(drop).map_err(Into::into),
            }
        };
        for op in &manifest.operators {
            for s in op.subtasks.iter().filter(|s| subset.contains(&op.uid, s.index)) {
                get(format!("chk-{id}/{}", s.file), dir.join(&s.file), Some(s.bytes))?;
                for l in &s.chain {
                    let local = self.chk_dir(CheckpointId(l.checkpoint)).join(&l.file);
                    get(format!("chk-{}/{}", l.checkpoint, l.file), local, None)?;
                }
            }
            if let Some(stored) = op.component.as_ref().and_then(|c| c.stored.as_ref()) {
                let name = stored.rsplit('/').next().unwrap_or_default();
                get(format!("components/{name}"), self.root().join("components").join(name), None)?;
            }
        }
        let path = dir.join(MANIFEST);
        write_atomic(&path, &manifest.encode()).map_err(|source| CheckpointError::Io { path, source })?;
        Ok(dir)
    }

    /// The local directory of complete checkpoint `id` with every file its manifest names,
    /// for a savepoint to be copied out of: with an object store, what is not here (on a
    /// cluster, what the workers uploaded) is downloaded first. Nothing is decoded (the
    /// export copies files).
    pub fn local_copy(&self, id: CheckpointId) -> Result<PathBuf, CheckpointError> {
        match &self.remote {
            Some(r) => self.download(r, id.0, &everything),
            None => Ok(self.chk_dir(id)),
        }
    }

    /// [`CheckpointStore::verify_files`] for one subtask's file that is only in the object
    /// store, whose checkpoint directory there holds `stored` (name → size): it is there at
    /// the length its writer reported. (Its chain's files were checked when their own
    /// checkpoints were published, and retention keeps what a chain needs.)
    pub(crate) fn verify_remote(
        &self,
        r: &Remote,
        id: u64,
        uid: &str,
        s: &crate::checkpoint::metadata::SubtaskEntry,
        stored: &std::collections::HashMap<String, u64>,
    ) -> Result<(), CheckpointError> {
        let missing = |file: &str, why: String| CheckpointError::State {
            path: self.remote_path(r, id),
            file: file.to_string(),
            uid: uid.to_string(),
            subtask: s.index,
            source: crate::checkpoint::snapshot::StateFileError::NotStored(why),
        };
        match stored.get(&s.file) {
            Some(&n) if n == s.bytes => Ok(()),
            Some(n) => Err(missing(&s.file, format!("{n} bytes in the object store, {} written", s.bytes))),
            None => Err(missing(&s.file, "it is not in the object store".into())),
        }
    }

    /// Retention in the object store (see [`to_drop`]): reads the manifests of its
    /// checkpoints (the local copies where present) and deletes what is no longer needed.
    pub(crate) fn retain_remote(&self, retained: usize) -> std::io::Result<()> {
        let Some(r) = &self.remote else { return Ok(()) };
        let io = |e: CheckpointError| std::io::Error::other(e.to_string());
        let mut listed = Vec::new();
        for id in self.remote_ids().map_err(io)? {
            listed.push((id, self.remote_manifest(r, id).map_err(io)?));
        }
        for id in to_drop(listed.iter().map(|(id, m)| (*id, m.as_ref())), retained) {
            r.delete_dir(&format!("chk-{id}")).map_err(RemoteError::into_io)?;
        }
        Ok(())
    }
}

/// Loads checkpoint `url` (`s3://bucket/prefix/<job>/chk-<id>`, or a savepoint's directory)
/// from object storage: downloads the part `scope` names, its chains and its components under
/// `local` (`<local>/chk-<id>/...`), then verifies it.
pub fn fetch_url(url: &str, local: &std::path::Path, scope: Scope<'_>) -> Result<LoadedCheckpoint, CheckpointError> {
    let bad = |why: &str| CheckpointError::from(RemoteError::Url { url: url.to_string(), why: why.to_string() });
    let trimmed = url.trim_end_matches('/');
    let (parent, last) = trimmed.rsplit_once('/').ok_or_else(|| bad("no checkpoint directory in it"))?;
    let Some(id) = last.strip_prefix("chk-").and_then(|n| n.parse::<u64>().ok()) else {
        // Anything but `chk-<id>` is a savepoint's place.
        return crate::checkpoint::remote_savepoint::fetch(trimmed, &local.join("savepoint"), scope);
    };
    let remote = Remote::open(parent)?;
    let store = CheckpointStore::at(local);
    store.fetch(&remote, id, scope)
}
