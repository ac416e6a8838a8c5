//! Savepoints in S3-compatible object storage: `weir savepoint JOB --dir s3://bucket/prefix/x`
//! (and a bucket job's default, `<its checkpoint URL>/savepoints/sp-<id>`) writes the savepoint
//! locally as any other (`storage::export_savepoint`), uploads its files, and creates its
//! manifest last; `--restore`/`--from-savepoint s3://…` downloads it into a local directory and
//! loads it, on the coordinator and on each worker alike.
//!
//! Invariants: the manifest is created last and only if none is there (a conditional put), so
//! a savepoint URL either holds a whole savepoint or none, and never two; a downloaded
//! manifest's file names are checked before anything is written locally, and each download is
//! bounded by the size it declares; the local copy is removed once uploaded.

use std::path::{Path, PathBuf};

use crate::checkpoint::metadata::{Manifest, SnapshotKind};
use crate::checkpoint::remote::{Remote, RemoteError};
use crate::checkpoint::storage::{
    CheckpointError, LoadedCheckpoint, MANIFEST, check_names, export_savepoint, load_part, write_atomic,
};
use crate::checkpoint::subset::Scope;

/// Largest manifest accepted from the object store.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// Largest component accepted.
const MAX_COMPONENT_BYTES: u64 = crate::graph::limits::CEILING.max_snapshot_mb << 20;

/// Whether `dir` names a place in object storage rather than a local directory.
pub fn is_url(dir: &Path) -> bool {
    dir.to_str().is_some_and(|d| d.starts_with("s3://"))
}

/// Writes the savepoint of the complete checkpoint in `chk_dir` to `url`, staging it in
/// `scratch` (emptied first, removed after); returns the bytes written.
pub fn export(chk_dir: &Path, manifest: &Manifest, url: &str, scratch: &Path) -> std::io::Result<u64> {
    let remote = Remote::open(url).map_err(RemoteError::into_io)?;
    if remote.size(MANIFEST).map_err(RemoteError::into_io)?.is_some() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{url} already holds a savepoint; choose another place"),
        ));
    }
    let _ = std::fs::remove_dir_all(scratch);
    let written = export_savepoint(chk_dir, manifest, scratch).and_then(|bytes| {
        upload_dir(&remote, scratch, "")?;
        let m = std::fs::read(scratch.join(MANIFEST))?;
        remote.create(MANIFEST, &m).map_err(RemoteError::into_io)?;
        Ok(bytes)
    });
    let _ = std::fs::remove_dir_all(scratch);
    written
}

/// Uploads every file under `dir` but the manifest, as `prefix` + its relative path.
fn upload_dir(remote: &Remote, dir: &Path, prefix: &str) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if e.file_type()?.is_dir() {
            upload_dir(remote, &e.path(), &format!("{prefix}{name}/"))?;
        } else if !(prefix.is_empty() && name == MANIFEST) {
            remote.upload(&format!("{prefix}{name}"), &e.path()).map_err(RemoteError::into_io)?;
        }
    }
    Ok(())
}

/// Downloads the part `scope` names of the savepoint at `url` into `local` (emptied first)
/// and loads it.
pub fn fetch(url: &str, local: &Path, scope: Scope<'_>) -> Result<LoadedCheckpoint, CheckpointError> {
    let remote = Remote::open(url)?;
    let at = PathBuf::from(url);
    let bytes = remote.read(MANIFEST, MAX_MANIFEST_BYTES)?.ok_or_else(|| {
        CheckpointError::from(RemoteError::Url {
            url: url.to_string(),
            why: format!(
                "it holds no savepoint (no {MANIFEST} there); name a savepoint's directory, or a checkpoint as \
                     s3://bucket/prefix/<job>/chk-<id>"
            ),
        })
    })?;
    let manifest = Manifest::decode(&bytes).map_err(|source| CheckpointError::Manifest { path: at.clone(), source })?;
    check_names(&manifest, &at)?;
    let refuse = |why: &str| CheckpointError::Manifest {
        path: at.clone(),
        source: crate::checkpoint::metadata::ManifestError::Decode(why.to_string()),
    };
    if manifest.kind != SnapshotKind::Savepoint {
        return Err(refuse("it is a checkpoint, not a savepoint; name a checkpoint as …/<job>/chk-<id>"));
    }
    if manifest.operators.iter().flat_map(|o| &o.subtasks).any(|s| !s.chain.is_empty()) {
        return Err(refuse("a savepoint never builds on other checkpoints, and this one says it does"));
    }
    let _ = std::fs::remove_dir_all(local);
    let io = |path: PathBuf| move |source| CheckpointError::Io { path, source };
    std::fs::create_dir_all(local.join("components")).map_err(io(local.to_path_buf()))?;
    let subset = scope(&manifest);
    for op in &manifest.operators {
        for s in op.subtasks.iter().filter(|s| subset.contains(&op.uid, s.index)) {
            remote.download(&s.file, &local.join(&s.file), s.bytes)?;
        }
        if let Some(stored) = op.component.as_ref().and_then(|c| c.stored.as_ref()) {
            let name = stored.rsplit('/').next().unwrap_or_default();
            let to = local.join("components").join(name);
            if !to.is_file() {
                remote.download(&format!("components/{name}"), &to, MAX_COMPONENT_BYTES)?;
            }
        }
    }
    let path = local.join(MANIFEST);
    write_atomic(&path, &bytes).map_err(io(path.clone()))?;
    let mut loaded = load_part(local, scope)?;
    loaded.url = Some(url.to_string());
    Ok(loaded)
}
