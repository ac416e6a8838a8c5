//! Compiled components on disk, so a job starts in milliseconds the second time: wasmtime's
//! serialized artifacts, keyed by the component's SHA-256 and the engine's compatibility hash.
//!
//! Invariants:
//! - Loading an artifact runs native code wasmtime wrote, so only artifacts this user's own
//!   Weir wrote are loaded: the directory is created `0700`, and it and every file must be
//!   owned by the effective user and writable by nobody else, or the cache is not used (a
//!   warning says why). Tenants of `weir serve` never name a path in it (it lives outside
//!   every tenant directory) and only ever upload components, never artifacts.
//! - A file is written to a temporary name and renamed, and ends with a CRC-32 of the rest:
//!   a torn or damaged file is a miss (and removed), never a crash. wasmtime checks its own
//!   version and configuration again when deserializing; a mismatch is a miss.
//! - The directory holds at most `max_bytes`; after each write the least recently used
//!   artifacts (by modification time, refreshed on every hit) are removed until it fits.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use wasmtime::Engine;
use wasmtime::component::Component;

/// Default bound of the directory.
pub const DEFAULT_MAX_BYTES: u64 = 2 << 30;

/// A cache directory.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
}

static GLOBAL: OnceLock<DiskCache> = OnceLock::new();

/// Makes `cache` the process's disk cache (first call wins); the compile path
/// ([`super::compile_cache::compile`]) uses it from then on.
pub fn install(cache: DiskCache) {
    let _ = GLOBAL.set(cache);
}

/// The process's disk cache, if one was installed.
pub fn installed() -> Option<&'static DiskCache> {
    GLOBAL.get()
}

/// The default place: `$WEIR_COMPILE_CACHE` (`off` disables it), else
/// `<weir_home>/cache/components`; size from `$WEIR_COMPILE_CACHE_MB`.
pub fn from_env(weir_home: &Path) -> Option<DiskCache> {
    let dir = match std::env::var_os("WEIR_COMPILE_CACHE") {
        Some(v) if v == "off" => return None,
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => weir_home.join("cache").join("components"),
    };
    let max_bytes = std::env::var("WEIR_COMPILE_CACHE_MB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(DEFAULT_MAX_BYTES, |mb| mb << 20);
    DiskCache::open(dir, max_bytes)
}

impl DiskCache {
    /// Opens (creating it `0700`) the cache at `dir`; `None` with a warning if it is not
    /// private to this user.
    pub fn open(dir: PathBuf, max_bytes: u64) -> Option<DiskCache> {
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
            tracing::warn!("compile cache {} unusable ({e}); compiling every time", dir.display());
            return None;
        }
        match private(&dir) {
            Ok(()) => Some(DiskCache { dir, max_bytes }),
            Err(why) => {
                tracing::warn!("compile cache {} not used: {why}", dir.display());
                None
            }
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, engine: &Engine, sha256: &str) -> PathBuf {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        self.dir.join(format!("{sha256}-{:016x}.cwasm", h.finish()))
    }

    /// The artifact of component `sha256` for `engine`, if a valid one is cached.
    pub fn load(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let path = self.path(engine, sha256);
        let meta = std::fs::metadata(&path).ok()?;
        if private_file(&meta).is_err() {
            return None;
        }
        let bytes = std::fs::read(&path).ok()?;
        let Some(artifact) = checked(&bytes) else {
            let _ = std::fs::remove_file(&path);
            return None;
        };
        // SAFETY: the artifact was written by `store` of this user's Weir (the directory and
        // the file are private to the effective user, checked above) and is intact (CRC);
        // wasmtime checks that it was produced by a compatible engine.
        let component = unsafe { Component::deserialize(engine, artifact) }.ok();
        if component.is_none() {
            let _ = std::fs::remove_file(&path);
        } else if let Ok(f) = std::fs::File::options().append(true).open(&path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        component
    }

    /// Stores `component`'s artifact (best effort: a full disk only costs a later compile).
    pub fn store(&self, engine: &Engine, sha256: &str, component: &Component) {
        let Ok(mut bytes) = component.serialize() else { return };
        if bytes.len() as u64 > self.max_bytes {
            return;
        }
        bytes.extend_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
        let path = self.path(engine, sha256);
        let tmp = self.dir.join(format!(".{}.{}.tmp", sha256, std::process::id()));
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            f.write_all(&bytes)?;
            f.sync_data()
        });
        if written.and_then(|()| std::fs::rename(&tmp, &path)).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        self.evict();
    }

    /// Removes the least recently used artifacts until the directory fits `max_bytes`.
    fn evict(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// The artifact without its CRC trailer, if the trailer matches.
fn checked(bytes: &[u8]) -> Option<&[u8]> {
    let (artifact, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    (crc32fast::hash(artifact).to_le_bytes() == crc).then_some(artifact)
}

fn private(dir: &Path) -> Result<(), String> {
    let m = std::fs::metadata(dir).map_err(|e| e.to_string())?;
    if !m.is_dir() {
        return Err("not a directory".into());
    }
    private_file(&m)
}

fn private_file(m: &std::fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(format!("owned by uid {}, not by this user (uid {me})", m.uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!("writable by group or others (mode {:o}); chmod go-w it", m.mode() & 0o777));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The empty component, in binary (wasmtime is built without the text format).
    const EMPTY: &[u8] = b"\0asm\x0d\0\x01\0";

    #[test]
    fn the_crc_trailer_catches_damage_and_truncation() {
        let mut b = b"artifact".to_vec();
        b.extend_from_slice(&crc32fast::hash(b"artifact").to_le_bytes());
        assert_eq!(checked(&b), Some(&b"artifact"[..]));
        let mut bad = b.clone();
        bad[2] ^= 1;
        assert_eq!(checked(&bad), None);
        assert_eq!(checked(&b[..b.len() - 1]), None);
        assert_eq!(checked(&b[..2]), None);
        assert_eq!(checked(&[]), None);
    }

    #[test]
    fn a_directory_others_can_write_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("c");
        assert!(DiskCache::open(d.clone(), 1 << 20).is_some());
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(DiskCache::open(d, 1 << 20).is_none());
    }

    #[test]
    fn an_artifact_round_trips_and_damage_is_a_miss_that_removes_the_file() {
        let engine = crate::sandbox::engine::new_engine().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path().join("c"), 1 << 30).unwrap();
        let component = Component::new(&engine, EMPTY).unwrap();
        assert!(cache.load(&engine, "abc").is_none());
        cache.store(&engine, "abc", &component);
        assert!(cache.load(&engine, "abc").is_some());
        let path = cache.path(&engine, "abc");
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        assert!(cache.load(&engine, "abc").is_none());
        assert!(!path.exists(), "a damaged artifact is removed");
    }

    #[test]
    fn the_directory_is_bounded_least_recently_used_first() {
        let engine = crate::sandbox::engine::new_engine().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let component = Component::new(&engine, EMPTY).unwrap();
        let one = component.serialize().unwrap().len() as u64 + 4;
        let cache = DiskCache::open(dir.path().join("c"), one * 2).unwrap();
        for id in ["a", "b", "c"] {
            cache.store(&engine, id, &component);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(cache.load(&engine, "a").is_none(), "the oldest went");
        assert!(cache.load(&engine, "b").is_some() && cache.load(&engine, "c").is_some());
    }
}
