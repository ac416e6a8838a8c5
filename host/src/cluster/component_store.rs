//! The components a worker keeps on disk, by digest (`<dir>/<sha256>.wasm`), within a size
//! cap: tenants upload new components and live upgrades without end, and each one shipped to
//! a worker would otherwise stay on its disk for good.
//!
//! Invariants: a file is kept only if its bytes match its digest; eviction happens when an
//! attempt is deployed and never removes a component that attempt uses; the least recently
//! used components go first (a use touches the file), until the others fit under the cap.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::checkpoint::storage;
use crate::sandbox::instance::sha256_hex;

/// A worker's kept components.
pub struct ComponentStore {
    dir: PathBuf,
    cap_bytes: u64,
}

/// A kept component, as eviction weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its digest.
    pub digest: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was last used.
    pub used: SystemTime,
}

/// Which of `kept` to remove so the rest fit in `cap_bytes`: least recently used first, never
/// one in `in_use` (which may alone exceed the cap).
pub fn to_evict(kept: &[Kept], in_use: &BTreeSet<&str>, cap_bytes: u64) -> Vec<String> {
    let mut total: u64 = kept.iter().map(|k| k.bytes).sum();
    let mut candidates: Vec<&Kept> = kept.iter().filter(|k| !in_use.contains(k.digest.as_str())).collect();
    candidates.sort_by_key(|k| (k.used, k.digest.clone()));
    let mut out = Vec::new();
    for k in candidates {
        if total <= cap_bytes {
            break;
        }
        total -= k.bytes;
        out.push(k.digest.clone());
    }
    out
}

impl ComponentStore {
    /// The components kept in `dir`, at most `cap_bytes` of them beyond those in use.
    pub fn open(dir: PathBuf, cap_bytes: u64) -> std::io::Result<ComponentStore> {
        std::fs::create_dir_all(&dir)?;
        Ok(ComponentStore { dir, cap_bytes })
    }

    /// Where component `digest` is kept (a digest that is not hex names no file in it).
    pub fn path(&self, digest: &str) -> PathBuf {
        let digest = if digest.bytes().all(|b| b.is_ascii_hexdigit()) { digest } else { "-" };
        self.dir.join(format!("{digest}.wasm"))
    }

    /// Keeps a shipped component under its digest if its bytes match it.
    pub fn keep(&self, digest: &str, bytes: &[u8]) -> Result<(), String> {
        if !digest.bytes().all(|b| b.is_ascii_hexdigit()) || sha256_hex(bytes) != digest {
            return Err(format!("a component shipped as {digest} does not match its digest; dropped"));
        }
        let path = self.path(digest);
        if !path.is_file() {
            storage::write_atomic(&path, bytes)
                .map_err(|e| format!("cannot keep component {digest} at {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// Component `digest`'s path, touched as used now; an error if it was never kept.
    pub fn used(&self, digest: &str) -> Result<PathBuf, String> {
        let path = self.path(digest);
        let touched = std::fs::File::options().append(true).open(&path).and_then(|f| f.set_modified(SystemTime::now()));
        match touched {
            Ok(()) => Ok(path),
            Err(_) if !path.is_file() => Err(format!("component {digest} was not shipped to this worker")),
            // Kept, but not touched (a read-only disk): used all the same.
            Err(_) => Ok(path),
        }
    }

    /// Removes the least recently used components beyond the cap, none of `in_use`; returns
    /// how many it removed.
    pub fn evict(&self, in_use: &BTreeSet<&str>) -> usize {
        let kept = self.list();
        let gone = to_evict(&kept, in_use, self.cap_bytes);
        for digest in &gone {
            let _ = std::fs::remove_file(self.path(digest));
        }
        gone.len()
    }

    fn list(&self) -> Vec<Kept> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        entries
            .filter_map(|e| {
                let e = e.ok()?;
                let p = e.path();
                let digest = wasm_digest(&p)?;
                let meta = e.metadata().ok()?;
                Some(Kept { digest, bytes: meta.len(), used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH) })
            })
            .collect()
    }
}

fn wasm_digest(p: &Path) -> Option<String> {
    let name = p.file_name()?.to_str()?;
    let digest = name.strip_suffix(".wasm")?;
    digest.bytes().all(|b| b.is_ascii_hexdigit()).then(|| digest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn kept(d: &str, bytes: u64, secs: u64) -> Kept {
        Kept { digest: d.into(), bytes, used: SystemTime::UNIX_EPOCH + Duration::from_secs(secs) }
    }

    #[test]
    fn the_least_recently_used_go_first_until_the_rest_fit_and_those_in_use_stay() {
        let all = [kept("a", 40, 1), kept("b", 40, 3), kept("c", 40, 2), kept("d", 40, 4)];
        assert_eq!(to_evict(&all, &BTreeSet::new(), 160), Vec::<String>::new());
        assert_eq!(to_evict(&all, &BTreeSet::new(), 100), vec!["a", "c"]);
        assert_eq!(to_evict(&all, &["a"].into(), 100), vec!["c", "b"]);
        // In use alone beyond the cap: everything else goes, nothing in use.
        assert_eq!(to_evict(&all, &["a", "b", "c"].into(), 10), vec!["d"]);
    }

    #[test]
    fn a_store_keeps_only_matching_bytes_and_evicts_beyond_its_cap() {
        let d = tempfile::tempdir().unwrap();
        let store = ComponentStore::open(d.path().join("c"), 10).unwrap();
        let (x, y) = (b"component x".as_slice(), b"component y".as_slice());
        let (dx, dy) = (sha256_hex(x), sha256_hex(y));
        assert!(store.keep(&dx, y).unwrap_err().contains("does not match its digest"));
        assert!(store.keep("../evil", x).is_err());
        store.keep(&dx, x).unwrap();
        store.keep(&dy, y).unwrap();
        assert!(store.used(&"0".repeat(64)).unwrap_err().contains("was not shipped"));
        assert!(store.used("../c/x").is_err(), "a digest names no file outside the store");
        assert_eq!(store.evict(&[dy.as_str()].into()), 1);
        assert!(!store.path(&dx).exists() && store.path(&dy).exists());
    }
}
