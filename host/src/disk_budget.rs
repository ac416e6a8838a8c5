//! Disk a tenant's running jobs write, charged to its quota while they write.
//!
//! `weir serve` refuses uploads and submissions past a tenant's `max_disk_mb`; without this,
//! a job admitted under the quota could still fill the disk with output. The tenant's jobs
//! share one budget: writers charge what they write (in chunks), the budget compares the
//! directory's size at its last scan plus what was charged since against the quota, and a
//! writer that would pass it fails naming the quota. The directory is scanned again once a
//! quarter of the quota was written or a few seconds passed, so deletions (retention,
//! committed-then-removed parts) give space back.
//!
//! Invariant: a tenant's directory grows past its quota by at most one chunk and one write
//! buffer (a rescan takes what a writer charged but still buffers as written) per writer.
//! When `n` processes each keep a budget of one shared directory (a cluster's workers), one
//! cannot see what the others wrote since its last scan: each scans again after writing
//! 1/(16 n) of the quota, so together they pass it by at most a sixteenth more.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a writer charges at once (it keeps count of smaller writes itself).
pub const CHUNK: u64 = 64 << 10;

/// How often the directory is scanned again at most, while writes come.
const RESCAN: Duration = Duration::from_secs(2);

/// One tenant's disk budget.
#[derive(Debug)]
pub struct DiskBudget {
    tenant: String,
    dir: PathBuf,
    limit: u64,
    /// Bytes charged since the last scan that make the next charge scan again.
    rescan_after: u64,
    scanned: AtomicU64,
    since: AtomicU64,
    last_scan: Mutex<Instant>,
}

impl DiskBudget {
    /// The budget of `tenant`, whose directory is `dir`, for `limit_mb` MiB.
    pub fn new(tenant: &str, dir: &Path, limit_mb: u64) -> Self {
        DiskBudget {
            tenant: tenant.into(),
            dir: dir.into(),
            limit: limit_mb.saturating_mul(1 << 20),
            rescan_after: limit_mb.saturating_mul(1 << 20) / 4,
            scanned: AtomicU64::new(disk_usage(dir)),
            since: AtomicU64::new(0),
            last_scan: Mutex::new(Instant::now()),
        }
    }

    /// The budget one of `processes` keeps of a directory they all write (see the module).
    pub fn shared_by(mut self, processes: u64) -> Self {
        self.rescan_after = self.limit / processes.max(1).saturating_mul(16);
        self
    }

    /// The tenant, its directory and its quota in MiB (to make the same budget elsewhere).
    pub fn terms(&self) -> (&str, &Path, u64) {
        (&self.tenant, &self.dir, self.limit >> 20)
    }

    /// Charges `bytes` about to be written; an error names the quota when they do not fit.
    pub fn charge(&self, bytes: u64) -> Result<(), String> {
        let since = self.since.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let stale = since > self.rescan_after || self.last_scan.lock().is_ok_and(|t| t.elapsed() > RESCAN);
        if stale {
            self.rescan(bytes);
        }
        if self.used() > self.limit && !stale {
            // Near the quota: deletions since the last scan count before refusing.
            self.rescan(bytes);
        }
        let used = self.used();
        if used > self.limit {
            self.since.fetch_sub(bytes.min(self.since.load(Ordering::Relaxed)), Ordering::Relaxed);
            return Err(format!(
                "tenant `{}` is out of disk: its jobs' output would take its directory to {} MiB, past max_disk_mb = {} \
                 MiB; delete outputs, checkpoints or uploads, or ask for a larger quota",
                self.tenant,
                used >> 20,
                self.limit >> 20
            ));
        }
        Ok(())
    }

    fn used(&self) -> u64 {
        self.scanned.load(Ordering::Relaxed) + self.since.load(Ordering::Relaxed)
    }

    /// Measures the directory again: what was charged before now (but `pending`, the charge
    /// being made, not yet written) is in the measure.
    fn rescan(&self, pending: u64) {
        let Ok(mut t) = self.last_scan.try_lock() else { return };
        *t = Instant::now();
        let counted = self.since.load(Ordering::Relaxed).saturating_sub(pending);
        self.scanned.store(disk_usage(&self.dir), Ordering::Relaxed);
        self.since.fetch_sub(counted, Ordering::Relaxed);
    }
}

/// Bytes of the files under `dir` (not following symlinks).
pub fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_the_quota_are_refused_and_deletions_give_space_back() {
        let d = tempfile::tempdir().unwrap();
        let write = |name: &str, n: usize| std::fs::write(d.path().join(name), vec![0u8; n]).unwrap();
        write("old", 3 << 20);
        let b = DiskBudget::new("t", d.path(), 4);
        assert!(b.charge(512 << 10).is_ok());
        write("a", 512 << 10);
        let e = b.charge(1 << 20).unwrap_err();
        assert!(e.contains("`t`") && e.contains("max_disk_mb = 4 MiB"), "{e}");
        // What was deleted counts again before a charge is refused.
        std::fs::remove_file(d.path().join("old")).unwrap();
        assert!(b.charge(1 << 20).is_ok(), "the deleted 3 MiB were given back");
        write("b", 1 << 20);
        assert!(b.charge(2 << 20).is_ok());
        write("c", 2 << 20);
        assert!(b.charge(1 << 20).is_err(), "3.5 MiB on disk + 1 MiB > 4 MiB");
    }
}
