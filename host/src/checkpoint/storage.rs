//! Checkpoint storage on the local filesystem (the embedded default):
//! `<dir>/<job>/chk-<id>/` holds one state file per subtask and the `_metadata` manifest;
//! `<dir>/<job>/history.json` keeps the metrics of completed checkpoints. With an object
//! store (`checkpoint/mirror.rs`) the local directory is its write-through copy.
//!
//! Invariants: every file is written to a temporary name, fsynced, then renamed (and the
//! directory fsynced), so a reader never sees a partial file; the manifest is written last,
//! so a directory without a valid manifest is an incomplete checkpoint and is never restored;
//! a checkpoint is used only if the manifest and every state file verify, including the
//! earlier files an incremental snapshot builds on (`chk-<n>/<file>` of its chain); a
//! checkpoint directory is kept while a retained checkpoint's chain needs it.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::checkpoint::incremental::fold_keyed;
use crate::checkpoint::keyed_files::{ChainError, ChainIndex, StreamedKeyed};
use crate::checkpoint::metadata::{CheckpointMetrics, Manifest, ManifestError, SubtaskEntry};
use crate::checkpoint::remote::{Remote, RemoteError};
use crate::checkpoint::snapshot::{HeaderError, StateFileError, SubtaskState};
use crate::checkpoint::subset::{Scope, everything};
use crate::ids::CheckpointId;

/// Name of the manifest file.
pub const MANIFEST: &str = "_metadata";

/// A checkpoint that cannot be used.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// I/O.
    #[error("checkpoint {}: {source}", path.display())]
    Io {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// No manifest: the checkpoint never completed.
    #[error("checkpoint {} is incomplete: it has no {MANIFEST} (the job stopped before publishing it)", path.display())]
    Incomplete {
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// Bad manifest.
    #[error("checkpoint {}: {MANIFEST} is corrupt: {source}", path.display())]
    Manifest {
        /// The checkpoint directory.
        path: PathBuf,
        /// Why.
        source: ManifestError,
    },
    /// The object store holding the checkpoints could not be read.
    #[error("{0}; the checkpoints there are untouched: retry once it is reachable")]
    Remote(Box<crate::checkpoint::remote::RemoteError>),
    /// Bad state file.
    #[error("checkpoint {}: state file {file} of `{uid}` subtask {subtask} is corrupt: {source}", path.display())]
    State {
        /// The checkpoint directory.
        path: PathBuf,
        /// The file.
        file: String,
        /// Operator uid.
        uid: String,
        /// Subtask.
        subtask: u32,
        /// Why.
        source: StateFileError,
    },
}

impl CheckpointError {
    /// Whether the checkpoint was never published (no manifest): it never completed, so no
    /// sink committed anything for it and an older checkpoint may stand in for it. Any other
    /// error is about a checkpoint that completed — its transactions may be committed — and
    /// restoring an older one instead would repeat their output.
    pub fn is_incomplete(&self) -> bool {
        matches!(self, CheckpointError::Incomplete { .. })
    }
}

/// What a user can do about a completed checkpoint that no longer loads.
pub const UNLOADABLE_ADVICE: &str = "a completed checkpoint may have committed output, so Weir does not fall back \
     to an older one on its own (that would repeat the output): restore the damaged files, or pass \
     `--restore <older chk-N directory>` to accept that the newer checkpoint's output may be repeated";

impl From<RemoteError> for CheckpointError {
    fn from(e: RemoteError) -> Self {
        CheckpointError::Remote(Box::new(e))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_path_buf(), source }
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename, fsync directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// Like [`write_atomic`], with `write` producing the content into the temporary file.
pub fn write_atomic_with<T>(path: &Path, write: impl FnOnce(&mut File) -> std::io::Result<T>) -> std::io::Result<T> {
    let mut f = AtomicFile::create(path)?;
    let out = write(&mut f.file)?;
    f.commit()?;
    Ok(out)
}

/// A file written under a temporary name (`.<name>.tmp`) and renamed into place on
/// [`AtomicFile::commit`] (after fsync; the directory is fsynced too). Dropped without a
/// commit, it never appears under its name and its temporary file is removed (an aborted
/// checkpoint's partial state file must not stay behind: a job whose checkpoints all abort
/// would fill the disk with them, as no completed one ever triggers retention).
pub struct AtomicFile {
    /// The open temporary file.
    pub file: File,
    tmp: PathBuf,
    path: PathBuf,
    committed: bool,
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

impl AtomicFile {
    /// Creates the temporary file for `path`.
    pub fn create(path: &Path) -> std::io::Result<AtomicFile> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".{}.tmp", path.file_name().unwrap().to_string_lossy()));
        let file = OpenOptions::new().create(true).write(true).truncate(true).read(true).open(&tmp)?;
        Ok(AtomicFile { file, tmp, path: path.to_path_buf(), committed: false })
    }

    /// Makes the file durable under its name, which must not exist yet (a link, not a
    /// rename: an existing file stays and the error is `AlreadyExists`).
    pub fn commit_new(mut self) -> std::io::Result<()> {
        self.file.sync_all()?;
        let linked = fs::hard_link(&self.tmp, &self.path);
        let _ = fs::remove_file(&self.tmp);
        self.committed = true;
        linked?;
        File::open(self.path.parent().unwrap_or(Path::new(".")))?.sync_all()
    }

    /// Makes the file durable under its name.
    pub fn commit(mut self) -> std::io::Result<()> {
        self.file.sync_all()?;
        fs::rename(&self.tmp, &self.path)?;
        self.committed = true;
        File::open(self.path.parent().unwrap_or(Path::new(".")))?.sync_all()
    }
}

/// A checkpoint whose manifest and state files all verified.
#[derive(Debug, Clone)]
pub struct LoadedCheckpoint {
    /// Its directory.
    pub path: PathBuf,
    /// The object-store URL it was downloaded from (`None`: read where it was written). Workers
    /// of a cluster share no disk with the coordinator: they restore from here.
    pub url: Option<String>,
    /// Its manifest.
    pub manifest: Manifest,
    /// State of every subtask: (uid, subtask) → state.
    pub states: std::collections::BTreeMap<(String, u32), SubtaskState>,
}

/// One entry of a listing.
#[derive(Debug)]
pub struct Listed {
    /// Id from the directory name.
    pub id: u64,
    /// Directory.
    pub path: PathBuf,
    /// The manifest, or why the checkpoint cannot be used.
    pub status: Result<Manifest, CheckpointError>,
}

/// The checkpoints of one job: `<dir>/<job>/`, mirrored to object storage when `remote` is
/// set (`checkpoint/mirror.rs`).
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    root: PathBuf,
    pub(crate) remote: Option<Remote>,
    /// Mirrored: keep a state file here once uploaded (false on a cluster's workers, whose
    /// files are only ever read back from the object store).
    pub(crate) keep_local: bool,
}

impl CheckpointStore {
    /// The store of job `job` under `dir`.
    pub fn new(dir: &Path, job: &str) -> Self {
        CheckpointStore { root: dir.join(job), remote: None, keep_local: true }
    }

    /// The store of the job in `graph` (none without `[checkpoint]`), mirrored to its object
    /// store when the job names one.
    pub fn of(graph: &crate::graph::logical::JobGraph) -> Result<Option<Self>, CheckpointError> {
        let Some(c) = &graph.checkpoint else { return Ok(None) };
        let remote = match &c.remote {
            Some(url) => Some(Remote::open(url)?.child(&graph.name)),
            None => None,
        };
        Ok(Some(CheckpointStore { root: c.dir.join(&graph.name), remote, keep_local: true }))
    }

    /// A store rooted directly at `root` (`<dir>/<job>`).
    pub fn at(root: &Path) -> Self {
        CheckpointStore { root: root.to_path_buf(), remote: None, keep_local: true }
    }

    /// Mirrored stores delete each state file here once it is uploaded (a cluster's worker:
    /// restores read the object store, so local copies would only pile up); what an earlier
    /// process left here (a worker killed mid-checkpoint) is removed now.
    pub fn without_local_copies(mut self) -> Self {
        self.keep_local = self.remote.is_none();
        if !self.keep_local {
            let _ = fs::remove_dir_all(&self.root);
        }
        self
    }

    /// `<dir>/<job>`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory of checkpoint `id`.
    pub fn chk_dir(&self, id: CheckpointId) -> PathBuf {
        self.root.join(format!("chk-{}", id.0))
    }

    /// Where checkpoint `id` lives for good: its `s3://` URL when mirrored to object storage,
    /// else its local directory (both restore with `--restore`).
    pub fn durable_path(&self, id: CheckpointId) -> PathBuf {
        match &self.remote {
            Some(r) => self.remote_path(r, id.0),
            None => self.chk_dir(id),
        }
    }

    /// Starts the state file `file` of checkpoint `id` (key groups are appended as they come,
    /// see [`crate::checkpoint::snapshot::StateFileWriter`]).
    pub fn begin_state(&self, id: CheckpointId, file: &str) -> std::io::Result<AtomicFile> {
        let dir = self.chk_dir(id);
        fs::create_dir_all(&dir)?;
        AtomicFile::create(&dir.join(file))
    }

    /// Writes one subtask's state into checkpoint `id`; returns (file name, bytes, crc).
    pub fn write_state(&self, id: CheckpointId, file: &str, state: &SubtaskState) -> std::io::Result<(u64, u32)> {
        let dir = self.chk_dir(id);
        fs::create_dir_all(&dir)?;
        write_atomic_with(&dir.join(file), |f| state.encode_to(f))
    }

    /// Publishes the manifest: from now on checkpoint `manifest.checkpoint_id` is complete.
    /// Mirrored: created in the object store first (conditionally, never overwriting), so a
    /// local manifest always has its remote one.
    pub fn publish(&self, manifest: &Manifest) -> std::io::Result<u64> {
        let dir = self.chk_dir(CheckpointId(manifest.checkpoint_id));
        fs::create_dir_all(&dir)?;
        let bytes = manifest.encode();
        if let Some(r) = &self.remote {
            r.create(&format!("chk-{}/{MANIFEST}", manifest.checkpoint_id), &bytes).map_err(RemoteError::into_io)?;
        }
        // Never over another manifest of the same id (a deposed coordinator's, say), as the
        // object store's conditional create refuses it there.
        let mut f = AtomicFile::create(&dir.join(MANIFEST))?;
        f.file.write_all(&bytes)?;
        f.commit_new()?;
        Ok(bytes.len() as u64)
    }

    /// Checks, before `manifest` is published, that every state file it names (and every
    /// file of their chains) is on disk as the writer reported it: the length in the
    /// manifest, a state file header, and the header's checksum equal to the manifest's. Reads
    /// only the headers; the bodies' checksums are checked at restore. Mirrored stores check
    /// a file that is not here (a cluster's workers wrote it on their own disks and uploaded
    /// it before they acknowledged) in the object store: there at the reported length.
    pub fn verify_files(&self, manifest: &Manifest) -> Result<(), CheckpointError> {
        let dir = self.chk_dir(CheckpointId(manifest.checkpoint_id));
        // Listed once, if any file is not here.
        let mut stored = None;
        for op in &manifest.operators {
            for s in &op.subtasks {
                if let Some(r) = self.remote.as_ref().filter(|_| !dir.join(&s.file).exists()) {
                    if stored.is_none() {
                        stored = Some(r.files(&format!("chk-{}", manifest.checkpoint_id))?);
                    }
                    let stored = stored.as_ref().expect("listed above");
                    self.verify_remote(r, manifest.checkpoint_id, &op.uid, s, stored)?;
                    continue;
                }
                let bad = |source: StateFileError| CheckpointError::State {
                    path: dir.clone(),
                    file: s.file.clone(),
                    uid: op.uid.clone(),
                    subtask: s.index,
                    source,
                };
                let path = dir.join(&s.file);
                let (len, crc) = SubtaskState::read_header(&path).map_err(|e| match e {
                    HeaderError::Io(e) => CheckpointError::Io { path: path.clone(), source: e },
                    HeaderError::File(e) => bad(e),
                })?;
                if len != s.bytes {
                    return Err(bad(StateFileError::Truncated { expected: s.bytes, found: len }));
                }
                if crc != s.crc32 {
                    return Err(bad(StateFileError::Checksum { stored: s.crc32, computed: crc }));
                }
                for l in &s.chain {
                    let p = self.chk_dir(CheckpointId(l.checkpoint)).join(&l.file);
                    fs::metadata(&p).map_err(io(&p))?;
                }
            }
        }
        Ok(())
    }

    /// Every `chk-<id>` directory, ascending by id, with its manifest or why it is unusable.
    pub fn list(&self) -> Vec<Listed> {
        let mut out = Vec::new();
        let Ok(entries) = fs::read_dir(&self.root) else { return out };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(id) = name.strip_prefix("chk-").and_then(|s| s.parse::<u64>().ok()) else { continue };
            let path = e.path();
            out.push(Listed { id, status: read_manifest(&path), path });
        }
        out.sort_by_key(|l| l.id);
        out
    }

    /// Highest checkpoint id present on disk or in the object store (complete or not), 0 if
    /// none. An unreachable object store counts as empty here: ids it holds cannot be reused
    /// anyway, since manifests are created there only if absent.
    pub fn max_id(&self) -> u64 {
        let local = self.list().last().map_or(0, |l| l.id);
        let remote = self.remote_ids().ok().and_then(|ids| ids.last().copied()).unwrap_or(0);
        local.max(remote)
    }

    /// The newest complete checkpoint that verifies; each newer incomplete one (and any error
    /// [`CheckpointStore::find_latest`] would return) is reported to `skipped`. For tools and
    /// tests; a restore uses `find_latest`.
    pub fn latest(&self, mut skipped: impl FnMut(&CheckpointError)) -> Option<LoadedCheckpoint> {
        self.find_latest(&mut skipped).unwrap_or_else(|e| {
            skipped(&e);
            None
        })
    }

    /// The newest complete checkpoint, loaded. Newer incomplete ones (no manifest) are reported
    /// to `skipped`; a completed one that does not load, and an object store that cannot be
    /// read, are errors, never "an older checkpoint" or "no checkpoint" (see
    /// [`CheckpointError::is_incomplete`]). Mirrored stores look in the object store (a new
    /// process's local directory may be empty or stale) and download what the checkpoint needs.
    pub fn find_latest(
        &self,
        skipped: impl FnMut(&CheckpointError),
    ) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        self.find_latest_part(&everything, skipped)
    }

    /// [`find_latest`](Self::find_latest) loading (and downloading) only the states `scope`
    /// names.
    pub fn find_latest_part(
        &self,
        scope: Scope<'_>,
        mut skipped: impl FnMut(&CheckpointError),
    ) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        if self.remote.is_some() {
            return self.fetch_latest(scope, skipped);
        }
        for l in self.list().into_iter().rev() {
            match load_part(&l.path, scope) {
                Ok(c) => return Ok(Some(c)),
                Err(e) if e.is_incomplete() => skipped(&e),
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The newest of the checkpoints `ids`, loaded: a run restarts only from a checkpoint it
    /// completed itself, never from one another process left (with coordinators on etcd, a
    /// deposed leader may publish a manifest it could not record; restoring it would commit
    /// its transactions behind the next leader's back). One of them that no longer loads is
    /// an error, as in [`CheckpointStore::find_latest`]. Mirrored stores take it from the
    /// object store (downloading what is not here: on a cluster, workers wrote the files).
    pub fn latest_of(&self, ids: &[u64]) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        self.latest_of_part(ids, &everything)
    }

    /// [`latest_of`](Self::latest_of) loading (and downloading) only the states `scope` names.
    pub fn latest_of_part(&self, ids: &[u64], scope: Scope<'_>) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        if ids.is_empty() {
            return Ok(None);
        }
        let here = self.list().into_iter().rev().find(|l| ids.contains(&l.id));
        let Some(r) = &self.remote else { return here.map(|l| load_part(&l.path, scope)).transpose() };
        let id = match here {
            Some(l) => l.id,
            None => match self.remote_ids()?.into_iter().rev().find(|id| ids.contains(id)) {
                Some(id) => id,
                None => return Ok(None),
            },
        };
        // All here (one process; an object store that stopped answering does not matter
        // then), else downloaded (a cluster's workers wrote the files). Either way its URL
        // goes along: a local manifest always has its remote one.
        let mut c = match load_part(&self.chk_dir(CheckpointId(id)), scope) {
            Ok(c) => c,
            Err(_) => self.fetch(r, id, scope)?,
        };
        c.url = Some(self.remote_path(r, id).display().to_string());
        Ok(Some(c))
    }

    /// Deletes completed checkpoints beyond the newest `retained`, and incomplete ones older
    /// than the newest complete one, except directories the chains of the kept ones need;
    /// in the object store first when mirrored.
    pub fn retain(&self, retained: usize) -> std::io::Result<()> {
        if self.remote.is_some() {
            self.retain_remote(retained)?;
        }
        let listed = self.list();
        let drop = to_drop(listed.iter().map(|l| (l.id, l.status.as_ref().ok())), retained);
        for l in listed.iter().filter(|l| drop.contains(&l.id)) {
            fs::remove_dir_all(&l.path)?;
        }
        Ok(())
    }

    /// Appends completed checkpoints' metrics to `history.json` (a JSON array).
    pub fn append_history(&self, m: &CheckpointMetrics) -> std::io::Result<()> {
        let path = self.root.join("history.json");
        let mut all: Vec<CheckpointMetrics> =
            fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        all.push(m.clone());
        let keep = all.len().saturating_sub(1000);
        write_atomic(&path, &serde_json::to_vec_pretty(&all[keep..]).unwrap())
    }
}

/// What retention removes from checkpoints `(id, manifest if complete)`: complete ones beyond
/// the newest `retained`, and incomplete ones older than the newest complete one, except what
/// the chains of the kept ones need.
pub(crate) fn to_drop<'a>(listed: impl Iterator<Item = (u64, Option<&'a Manifest>)>, retained: usize) -> Vec<u64> {
    let listed: Vec<_> = listed.collect();
    let complete: Vec<u64> = listed.iter().filter(|(_, m)| m.is_some()).map(|(id, _)| *id).collect();
    let Some(&newest) = complete.iter().max() else { return Vec::new() };
    let mut sorted = complete.clone();
    sorted.sort_unstable();
    let mut keep: Vec<u64> = sorted[sorted.len().saturating_sub(retained.max(1))..].to_vec();
    let needed: Vec<u64> = listed
        .iter()
        .filter(|(id, _)| keep.contains(id))
        .filter_map(|(_, m)| *m)
        .flat_map(|m| m.operators.iter().flat_map(|o| o.subtasks.iter().flat_map(|s| s.chain.iter())))
        .map(|c| c.checkpoint)
        .collect();
    keep.extend(needed);
    listed.iter().filter(|(id, m)| !keep.contains(id) && (m.is_some() || *id < newest)).map(|(id, _)| *id).collect()
}

/// Stores a live-upgraded component's bytes under the job's directory
/// (`components/<sha256>.wasm`); returns the path relative to a checkpoint directory.
pub fn store_component(root: &Path, sha256: &str, bytes: &[u8]) -> std::io::Result<String> {
    let dir = root.join("components");
    fs::create_dir_all(&dir)?;
    let file = dir.join(format!("{sha256}.wasm"));
    if !file.exists() {
        write_atomic(&file, bytes)?;
    }
    Ok(format!("../components/{sha256}.wasm"))
}

/// Copies the complete checkpoint in `chk_dir` into the savepoint directory `target`:
/// every state file (hard-linked when on the same filesystem, else copied) and stored
/// component, then the manifest marked `savepoint` with paths relative to `target`, written
/// last. `target` must not exist or be empty. Returns the bytes written.
pub fn export_savepoint(chk_dir: &Path, manifest: &Manifest, target: &Path) -> std::io::Result<u64> {
    if target.exists() && fs::read_dir(target)?.next().is_some() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("savepoint directory {} exists and is not empty; choose another one", target.display()),
        ));
    }
    fs::create_dir_all(target)?;
    let mut bytes = 0;
    let mut m = manifest.clone();
    m.kind = crate::checkpoint::metadata::SnapshotKind::Savepoint;
    // Savepoints are full snapshots; should one build on a chain, it is folded here so the
    // savepoint never depends on the checkpoint directory.
    let folded = match m.operators.iter().flat_map(|o| &o.subtasks).any(|s| !s.chain.is_empty()) {
        true => Some(load(chk_dir).map_err(|e| std::io::Error::other(e.to_string()))?),
        false => None,
    };
    for op in &mut m.operators {
        for s in &mut op.subtasks {
            let (from, to) = (chk_dir.join(&s.file), target.join(&s.file));
            if let Some(state) =
                folded.as_ref().filter(|_| !s.chain.is_empty()).map(|f| &f.states[&(op.uid.clone(), s.index)])
            {
                // Key group by key group: the state need not fit in memory.
                let (len, crc) = write_atomic_with(&to, |f| state.encode_to(f))?;
                (s.bytes, s.crc32, s.chain) = (len, crc, Vec::new());
            } else if fs::hard_link(&from, &to).is_err() {
                fs::copy(&from, &to)?;
                File::open(&to)?.sync_all()?;
            }
            bytes += s.bytes;
        }
        if let Some(c) = op.component.as_mut()
            && let Some(stored) = c.stored.clone()
        {
            let name = Path::new(&stored).file_name().unwrap_or_default().to_string_lossy().to_string();
            fs::create_dir_all(target.join("components"))?;
            let to = target.join("components").join(&name);
            if !to.exists() {
                fs::copy(chk_dir.join(&stored), &to)?;
                File::open(&to)?.sync_all()?;
            }
            c.stored = Some(format!("components/{name}"));
        }
    }
    m.format_version = crate::checkpoint::metadata::format_version_for(&m.operators);
    let encoded = m.encode();
    write_atomic(&target.join(MANIFEST), &encoded)?;
    Ok(bytes + encoded.len() as u64)
}

/// One path component, no separators, not `.`/`..`, not hidden.
fn plain_file_name(f: &str) -> bool {
    !f.is_empty() && !f.starts_with('.') && !f.contains(['/', '\\', '\0'])
}

/// `components/<64 hex>.wasm` (savepoints) or `../components/<64 hex>.wasm` (checkpoints).
fn stored_component_path(p: &str) -> bool {
    let name = p.strip_prefix("../components/").or_else(|| p.strip_prefix("components/"));
    name.and_then(|n| n.strip_suffix(".wasm"))
        .is_some_and(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

pub(crate) fn read_manifest(dir: &Path) -> Result<Manifest, CheckpointError> {
    let path = dir.join(MANIFEST);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::Incomplete { path: dir.to_path_buf() });
        }
        Err(e) => return Err(io(dir)(e)),
    };
    Manifest::decode(&bytes).map_err(|source| CheckpointError::Manifest { path: dir.to_path_buf(), source })
}

/// A manifest names files only inside its own directory (a forged one must not reach out):
/// plain state file names, stored components as `components/<sha256>.wasm`.
pub(crate) fn check_names(manifest: &Manifest, dir: &Path) -> Result<(), CheckpointError> {
    let bad = |what: String| CheckpointError::Manifest { path: dir.to_path_buf(), source: ManifestError::Decode(what) };
    for op in &manifest.operators {
        for s in &op.subtasks {
            if !plain_file_name(&s.file) {
                return Err(bad(format!("state file `{}` of `{}` is not a plain file name", s.file, op.uid)));
            }
            if let Some(l) = s.chain.iter().find(|l| !plain_file_name(&l.file)) {
                return Err(bad(format!("chained state file `{}` of `{}` is not a plain file name", l.file, op.uid)));
            }
        }
        if let Some(stored) = op.component.as_ref().and_then(|c| c.stored.as_ref())
            && !stored_component_path(stored)
        {
            return Err(bad(format!("stored component `{stored}` of `{}` is not components/<sha256>.wasm", op.uid)));
        }
    }
    Ok(())
}

/// Loads and verifies the checkpoint (or savepoint) in `dir`. Every state file (and every
/// file of its chain) is checked whole against its CRC, but keyed state stays where it is:
/// each subtask's [`SubtaskState::streamed`] reads it key group by key group when the subtask
/// restores (`checkpoint/keyed_files.rs`), so a state larger than memory loads within memory.
/// Files of an older format (`WEIRST01`) are decoded whole, as before.
pub fn load(dir: &Path) -> Result<LoadedCheckpoint, CheckpointError> {
    load_part(dir, &everything)
}

/// [`load`] of the subtasks' states `scope` names (`checkpoint/subset.rs`); the files of
/// the others are neither read nor required to be there.
pub fn load_part(dir: &Path, scope: Scope<'_>) -> Result<LoadedCheckpoint, CheckpointError> {
    let manifest = read_manifest(dir)?;
    check_names(&manifest, dir)?;
    let subset = scope(&manifest);
    let mut states = std::collections::BTreeMap::new();
    let root = dir.parent().unwrap_or(Path::new("."));
    for op in &manifest.operators {
        for s in op.subtasks.iter().filter(|s| subset.contains(&op.uid, s.index)) {
            let mut files: Vec<PathBuf> =
                s.chain.iter().map(|l| root.join(format!("chk-{}", l.checkpoint)).join(&l.file)).collect();
            files.push(dir.join(&s.file));
            let state = match ChainIndex::open(&files) {
                Ok((chain, mut rest)) => {
                    let (lo, hi) = s.key_groups;
                    if let Some(g) = chain.groups().find(|g| !(lo..hi).contains(g)) {
                        return Err(chain_error(
                            ChainError::State {
                                path: chain.newest().to_path_buf(),
                                source: StateFileError::Decode(format!(
                                    "it holds key group {g}, outside the subtask's key groups {lo}..{hi}"
                                )),
                            },
                            &op.uid,
                            s.index,
                        ));
                    }
                    if chain.groups().next().is_some() {
                        rest.streamed = Some(StreamedKeyed::whole(chain));
                    }
                    rest
                }
                Err(e) if e.is_old_format() => load_whole(dir, root, &op.uid, s)?,
                Err(e) => return Err(chain_error(e, &op.uid, s.index)),
            };
            states.insert((op.uid.clone(), s.index), state);
        }
    }
    Ok(LoadedCheckpoint { path: dir.to_path_buf(), url: None, manifest, states })
}

/// A chain's error as a checkpoint's: the file, the operator, the subtask.
fn chain_error(e: ChainError, uid: &str, subtask: u32) -> CheckpointError {
    let (path, source) = match e {
        ChainError::Io { path, source } => return CheckpointError::Io { path, source },
        ChainError::State { path, source } => (path, source),
        ChainError::Fold { path, key_group, source } => {
            (path, StateFileError::Decode(format!("key group {key_group} does not fold onto its chain: {source}")))
        }
    };
    CheckpointError::State {
        path: path.parent().map(Path::to_path_buf).unwrap_or_default(),
        file: path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        uid: uid.to_string(),
        subtask,
        source,
    }
}

/// A subtask's state decoded whole, its chain folded in memory (state files of format 1).
fn load_whole(dir: &Path, root: &Path, uid: &str, s: &SubtaskEntry) -> Result<SubtaskState, CheckpointError> {
    let read = |dir: &Path, file: &str| -> Result<SubtaskState, CheckpointError> {
        let path = dir.join(file);
        let bytes = fs::read(&path).map_err(io(&path))?;
        SubtaskState::decode(&bytes).map_err(|source| CheckpointError::State {
            path: dir.to_path_buf(),
            file: file.to_string(),
            uid: uid.to_string(),
            subtask: s.index,
            source,
        })
    };
    let mut state = read(dir, &s.file)?;
    if !s.chain.is_empty() {
        let mut files = Vec::with_capacity(s.chain.len() + 1);
        for l in &s.chain {
            files.push(read(&root.join(format!("chk-{}", l.checkpoint)), &l.file)?.keyed);
        }
        files.push(std::mem::take(&mut state.keyed));
        state.keyed = fold_keyed(files).map_err(|(kg, e)| CheckpointError::State {
            path: dir.to_path_buf(),
            file: s.file.clone(),
            uid: uid.to_string(),
            subtask: s.index,
            source: StateFileError::Decode(format!("key group {kg} does not fold onto its chain: {e}")),
        })?;
    }
    Ok(state)
}

impl LoadedCheckpoint {
    /// How much of the checkpoint was loaded here (`checkpoint/subset.rs`): subtask states
    /// loaded of all, and the bytes of their files in this checkpoint (their chains' earlier
    /// files aside) of all, as `"2 of 6 subtask states (1.2 of 3.5 MB)"`.
    pub fn share(&self) -> String {
        let (mut n, mut total, mut bytes, mut all) = (0usize, 0usize, 0u64, 0u64);
        for op in &self.manifest.operators {
            for s in &op.subtasks {
                let here = self.states.contains_key(&(op.uid.clone(), s.index));
                (total, all) = (total + 1, all + s.bytes);
                if here {
                    (n, bytes) = (n + 1, bytes + s.bytes);
                }
            }
        }
        let mb = |b: u64| b as f64 / 1e6;
        format!("{n} of {total} subtask states ({:.1} of {:.1} MB)", mb(bytes), mb(all))
    }

    /// Reads every subtask's streamed keyed state into memory (tools that look at all of it,
    /// and tests). A restore does not: it reads group by group.
    pub fn materialize(mut self) -> Result<LoadedCheckpoint, CheckpointError> {
        for ((uid, subtask), st) in self.states.iter_mut() {
            st.materialize().map_err(|e| chain_error(e, uid, *subtask))?;
        }
        Ok(self)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::checkpoint::metadata::{FORMAT_VERSION, OperatorEntry, SubtaskEntry};

    /// An abandoned file leaves nothing behind; a committed one is there under its name
    /// only, whichever way it was committed.
    #[test]
    fn an_atomic_file_dropped_uncommitted_leaves_no_temporary_file() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let names = |d: &Path| {
            let mut n: Vec<String> =
                fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            n.sort();
            n
        };
        let mut f = AtomicFile::create(&dir.path().join("a.state")).unwrap();
        f.file.write_all(b"partial").unwrap();
        assert_eq!(names(dir.path()), vec![".a.state.tmp"]);
        drop(f);
        assert!(names(dir.path()).is_empty(), "the abandoned file's temporary is gone");
        let mut f = AtomicFile::create(&dir.path().join("b.state")).unwrap();
        f.file.write_all(b"whole").unwrap();
        f.commit().unwrap();
        let mut f = AtomicFile::create(&dir.path().join("c.state")).unwrap();
        f.file.write_all(b"whole").unwrap();
        f.commit_new().unwrap();
        assert_eq!(names(dir.path()), vec!["b.state", "c.state"]);
        assert_eq!(fs::read(dir.path().join("b.state")).unwrap(), b"whole");
    }

    fn manifest(id: u64, file: &str, bytes: u64, crc: u32) -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            kind: Default::default(),
            job: "j".into(),
            checkpoint_id: id,
            created_unix_ms: 0,
            finished: false,
            max_parallelism: 8,
            operators: vec![OperatorEntry {
                uid: "op".into(),
                kind: "operator".into(),
                parallelism: 1,
                component: None,
                subtasks: vec![SubtaskEntry {
                    index: 0,
                    file: file.into(),
                    bytes,
                    crc32: crc,
                    key_groups: (0, 8),
                    chain: vec![],
                    timing: None,
                }],
                retired: vec![],
            }],
            metrics: CheckpointMetrics { id, ..Default::default() },
        }
    }

    #[test]
    fn retention_keeps_the_newest_complete_their_chains_and_newer_incomplete_ones() {
        let mut chained = manifest(9, "op-0.state", 1, 0);
        chained.operators[0].subtasks[0].chain =
            vec![crate::checkpoint::incremental::ChainLink { checkpoint: 4, file: "op-0.state".into() }];
        let (m4, m6, m7) = (manifest(4, "a", 1, 0), manifest(6, "a", 1, 0), manifest(7, "a", 1, 0));
        // 4 complete (chained from 9), 5 incomplete (older than the newest complete: dropped),
        // 6 and 7 complete, 9 complete, 10 incomplete (in progress: kept).
        let listed = [(4, Some(&m4)), (5, None), (6, Some(&m6)), (7, Some(&m7)), (9, Some(&chained)), (10, None)];
        let mut dropped = to_drop(listed.into_iter(), 2);
        dropped.sort();
        assert_eq!(dropped, [5, 6]);
        assert!(to_drop([(3, None), (4, None)].into_iter(), 1).is_empty(), "nothing complete: nothing dropped");
    }

    #[test]
    fn a_checkpoint_is_published_only_if_its_files_are_as_the_writer_reported() {
        let d = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(d.path(), "j");
        let state = SubtaskState { operator_state: vec![7; 100], ..Default::default() };
        let (bytes, crc) = store.write_state(CheckpointId(1), "op-0.state", &state).unwrap();
        let m = manifest(1, "op-0.state", bytes, crc);
        store.verify_files(&m).unwrap();
        let e = store.verify_files(&manifest(1, "op-0.state", bytes, crc ^ 1)).unwrap_err().to_string();
        assert!(e.contains("op-0.state") && e.contains("checksum"), "{e}");
        let e = store.verify_files(&manifest(1, "op-1.state", bytes, crc)).unwrap_err().to_string();
        assert!(e.contains("op-1.state"), "a missing file is named: {e}");
        let path = d.path().join("j/chk-1/op-0.state");
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(bytes - 5).unwrap();
        let e = store.verify_files(&m).unwrap_err().to_string();
        assert!(e.contains("op-0.state"), "a torn file is named: {e}");
        let mut chained = manifest(1, "op-0.state", bytes, crc);
        chained.operators[0].subtasks[0].chain =
            vec![crate::checkpoint::incremental::ChainLink { checkpoint: 0, file: "op-0.state".into() }];
        std::fs::write(&path, {
            let (b, _) = state.encode();
            b
        })
        .unwrap();
        let e = store.verify_files(&chained).unwrap_err().to_string();
        assert!(e.contains("chk-0"), "a missing link of the chain is named: {e}");
    }

    fn complete(store: &CheckpointStore, id: u64) {
        let state = SubtaskState { operator_state: vec![id as u8], ..Default::default() };
        let (bytes, crc) = store.write_state(CheckpointId(id), "op-0.state", &state).unwrap();
        store.publish(&manifest(id, "op-0.state", bytes, crc)).unwrap();
    }

    #[test]
    fn latest_skips_incomplete_checkpoints_but_a_corrupt_complete_one_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), "j");
        complete(&store, 1);
        complete(&store, 2);
        complete(&store, 3);
        // 4: torn (no manifest). 3: a state file corrupted after publishing.
        store.write_state(CheckpointId(4), "op-0.state", &SubtaskState::default()).unwrap();
        let f = store.chk_dir(CheckpointId(3)).join("op-0.state");
        let mut b = fs::read(&f).unwrap();
        let n = b.len() - 1;
        b[n] ^= 0xff;
        fs::write(&f, b).unwrap();
        let mut skipped = Vec::new();
        // 3 completed (its output may be committed): restoring 2 instead would repeat it.
        let e = store.find_latest(|e| skipped.push(e.to_string())).map(|_| ()).unwrap_err();
        assert!(!e.is_incomplete());
        let e = e.to_string();
        assert!(e.contains("chk-3") && e.contains("op-0.state") && e.contains("checksum"), "{e}");
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].contains("chk-4") && skipped[0].contains("incomplete"), "{skipped:?}");
        // Once the user removes the damaged one, the older loads.
        fs::remove_dir_all(store.chk_dir(CheckpointId(3))).unwrap();
        let c = store.find_latest(|_| {}).unwrap().unwrap();
        assert_eq!(c.manifest.checkpoint_id, 2);
        assert_eq!(c.states[&("op".to_string(), 0)].operator_state, vec![2]);
        assert_eq!(store.max_id(), 4);
    }

    /// A restart restores only checkpoints its run completed: a newer manifest someone else
    /// left (a deposed leader's, unrecorded) is passed over; a corrupt own one is an error, never
    /// a reason to go back to an older one.
    #[test]
    fn a_restart_restores_the_newest_checkpoint_its_own_run_completed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), "j");
        for id in 1..=4 {
            complete(&store, id);
        }
        let c = store.latest_of(&[1, 2, 3]).unwrap().unwrap();
        assert_eq!(c.manifest.checkpoint_id, 3, "4 is not this run's");
        let f = store.chk_dir(CheckpointId(3)).join("op-0.state");
        let mut b = fs::read(&f).unwrap();
        b[0] ^= 0xff;
        fs::write(&f, b).unwrap();
        let e = store.latest_of(&[1, 2, 3]).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("chk-3") && e.contains("op-0.state"), "{e}");
        assert_eq!(store.latest_of(&[1, 2]).unwrap().unwrap().manifest.checkpoint_id, 2);
        assert!(store.latest_of(&[]).unwrap().is_none());
    }

    /// A manifest is never replaced: a second publish of the same id (a deposed coordinator
    /// still running) fails and leaves the first.
    #[test]
    fn a_published_manifest_is_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), "j");
        let (bytes, crc) = store.write_state(CheckpointId(1), "op-0.state", &SubtaskState::default()).unwrap();
        store.publish(&manifest(1, "op-0.state", bytes, crc)).unwrap();
        let mut other = manifest(1, "op-0.state", bytes, crc);
        other.created_unix_ms += 1;
        let e = store.publish(&other).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        let kept = load(&store.chk_dir(CheckpointId(1))).unwrap();
        assert_eq!(kept.manifest.created_unix_ms, manifest(1, "op-0.state", bytes, crc).created_unix_ms);
        let leftovers: Vec<_> = fs::read_dir(store.chk_dir(CheckpointId(1)))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_manifest_naming_files_outside_its_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), "j");
        let (bytes, crc) = store.write_state(CheckpointId(1), "op-0.state", &SubtaskState::default()).unwrap();
        let unpublish = || {
            let _ = fs::remove_file(store.chk_dir(CheckpointId(1)).join(MANIFEST));
        };
        for file in ["../../other/op-0.state", "/etc/passwd", ".hidden", ""] {
            unpublish();
            store.publish(&manifest(1, file, bytes, crc)).unwrap();
            let e = load(&store.chk_dir(CheckpointId(1))).unwrap_err().to_string();
            assert!(e.contains("is not a plain file name"), "{file}: {e}");
        }
        let mut m = manifest(1, "op-0.state", bytes, crc);
        m.operators[0].component = Some(crate::checkpoint::metadata::ComponentEntry {
            name: "c".into(),
            version: "1".into(),
            schema_version: 1,
            states: vec![],
            sha256: None,
            stored: Some("../../../victim/files/x.wasm".into()),
            replaces: vec![],
        });
        unpublish();
        store.publish(&m).unwrap();
        assert!(load(&store.chk_dir(CheckpointId(1))).unwrap_err().to_string().contains("is not components/"));
        assert!(stored_component_path(&format!("../components/{}.wasm", "a".repeat(64))));
    }

    pub(crate) fn keyed(entries: &[(&[u8], Option<&[u8]>)], delta: bool) -> SubtaskState {
        use crate::checkpoint::layout::{NamedState, encode, encode_delta};
        let data = if delta {
            encode_delta(&[("s".into(), entries.iter().map(|(k, v)| (k.to_vec(), v.map(|v| v.to_vec()))).collect())])
        } else {
            encode(&[NamedState {
                name: "s".into(),
                entries: entries.iter().map(|(k, v)| (k.to_vec(), v.unwrap().to_vec())).collect(),
            }])
        };
        let kg = crate::checkpoint::snapshot::KeyGroupSnapshot {
            key_group: 1,
            data,
            event_timers: Default::default(),
            processing_timers: Default::default(),
        };
        SubtaskState { keyed: vec![kg], ..Default::default() }
    }

    /// Checkpoint `id` whose subtask file builds on `chain` (ids of earlier checkpoints).
    pub(crate) fn chained(store: &CheckpointStore, id: u64, state: &SubtaskState, chain: &[u64]) {
        let (bytes, crc) = store.write_state(CheckpointId(id), "op-0.state", state).unwrap();
        let mut m = manifest(id, "op-0.state", bytes, crc);
        m.operators[0].subtasks[0].chain = chain
            .iter()
            .map(|&c| crate::checkpoint::incremental::ChainLink { checkpoint: c, file: "op-0.state".into() })
            .collect();
        m.format_version = crate::checkpoint::metadata::format_version_for(&m.operators);
        store.publish(&m).unwrap();
    }

    /// A cluster's member loads its part of a checkpoint: the files of other subtasks are
    /// neither read nor needed, and a missing file of its own part is still an error naming it.
    #[test]
    fn a_partial_load_reads_only_the_subtasks_named_and_needs_only_their_files() {
        use crate::checkpoint::subset::Subset;
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), "j");
        let mut m = manifest(1, "op-0.state", 0, 0);
        let entry = m.operators[0].subtasks[0].clone();
        m.operators[0].parallelism = 2;
        m.operators[0].subtasks = (0..2)
            .map(|i| {
                let file = format!("op-{i}.state");
                let mut st = keyed(&[(b"k", Some(b"v"))], false);
                st.keyed[0].key_group = i * 4 + 1;
                let (bytes, crc32) = store.write_state(CheckpointId(1), &file, &st).unwrap();
                SubtaskEntry { index: i, file, bytes, crc32, key_groups: (i * 4, i * 4 + 4), ..entry.clone() }
            })
            .collect();
        store.publish(&m).unwrap();
        let dir = store.chk_dir(CheckpointId(1));
        fs::remove_file(dir.join("op-0.state")).unwrap();
        let e = load(&dir).unwrap_err().to_string();
        assert!(e.contains("op-0.state"), "{e}");
        let second = |_: &Manifest| Subset::Only([("op".to_string(), 1)].into());
        let c = load_part(&dir, &second).unwrap();
        assert_eq!(c.states.keys().cloned().collect::<Vec<_>>(), vec![("op".to_string(), 1)]);
        assert_eq!(c.share(), format!("1 of 2 subtask states (0.0 of 0.0 MB)"));
        let c = c.materialize().unwrap();
        assert_eq!(c.states[&("op".to_string(), 1)].keyed[0].key_group, 5);
        let first = |_: &Manifest| Subset::Only([("op".to_string(), 0)].into());
        let e = load_part(&dir, &first).unwrap_err().to_string();
        assert!(e.contains("op-0.state"), "{e}");
        let none = |_: &Manifest| Subset::Only(Default::default());
        let c = store.find_latest_part(&none, |e| panic!("{e}")).unwrap().unwrap();
        assert!(c.states.is_empty() && c.manifest.checkpoint_id == 1);
    }

    #[test]
    fn incremental_chains_fold_on_load_are_kept_by_retention_and_folded_into_savepoints() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), "j");
        chained(&store, 1, &keyed(&[(b"a", Some(b"1")), (b"b", Some(b"2"))], false), &[]);
        chained(&store, 2, &keyed(&[(b"a", Some(b"3"))], true), &[1]);
        chained(&store, 3, &keyed(&[(b"b", None), (b"c", Some(b"4"))], true), &[1, 2]);
        let want = keyed(&[(b"a", Some(b"3")), (b"c", Some(b"4"))], false);
        let c = store.latest(|e| panic!("{e}")).unwrap();
        // Loading decodes no keyed state: it is read group by group as a subtask restores.
        let st = &c.states[&("op".to_string(), 0)];
        assert!(st.keyed.is_empty());
        assert_eq!(st.streamed.as_ref().map(|s| s.len()), Some(1));
        let c = c.materialize().unwrap();
        assert_eq!(c.states[&("op".to_string(), 0)].keyed, want.keyed);
        assert!(
            fs::read_to_string(store.chk_dir(CheckpointId(3)).join(MANIFEST))
                .unwrap()
                .starts_with("weir-checkpoint 3 ")
        );
        // Retaining one checkpoint keeps the directories its chain needs.
        store.retain(1).unwrap();
        assert_eq!(store.list().iter().map(|l| l.id).collect::<Vec<_>>(), vec![1, 2, 3]);
        // A savepoint of a chained checkpoint is self-contained.
        let sp = tmp.path().join("sp");
        export_savepoint(&store.chk_dir(CheckpointId(3)), &c.manifest, &sp).unwrap();
        let loaded = load(&sp).unwrap();
        assert!(loaded.manifest.operators[0].subtasks[0].chain.is_empty());
        assert_eq!(loaded.materialize().unwrap().states[&("op".to_string(), 0)].keyed, want.keyed);
        // Once a full checkpoint follows, the old chain goes.
        chained(&store, 4, &want, &[]);
        store.retain(1).unwrap();
        assert_eq!(store.list().iter().map(|l| l.id).collect::<Vec<_>>(), vec![4]);
        // A missing link makes the checkpoint unusable, naming the file.
        chained(&store, 5, &keyed(&[(b"a", None)], true), &[4]);
        chained(&store, 6, &keyed(&[(b"c", None)], true), &[4, 5]);
        fs::remove_file(store.chk_dir(CheckpointId(5)).join("op-0.state")).unwrap();
        let e = store.find_latest(|_| {}).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("chk-5") && e.contains("op-0.state"), "{e}");
    }

    #[test]
    fn retention_keeps_the_newest_complete_checkpoints() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), "j");
        for id in 1..=5 {
            complete(&store, id);
        }
        store.write_state(CheckpointId(3), "x.state", &SubtaskState::default()).unwrap();
        store.write_state(CheckpointId(6), "op-0.state", &SubtaskState::default()).unwrap();
        store.retain(2).unwrap();
        let ids: Vec<u64> = store.list().iter().map(|l| l.id).collect();
        assert_eq!(ids, vec![4, 5, 6], "in-progress checkpoint 6 is newer than the newest complete one and stays");
    }
}
