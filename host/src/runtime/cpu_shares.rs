//! CPU shares between tenants: each tenant's job threads run in a CPU control group of its
//! own, weighted by its `cpu_weight` quota, so the kernel gives tenants CPU in proportion to
//! their weights when the cores are contended, however many threads their jobs run and
//! whatever their guests do (a busy loop that stays under `call_timeout_ms` included). Idle
//! CPU is still used by whoever wants it (shares, not caps), unless a tenant has a hard cap,
//! `max_cpu_cores` (CFS bandwidth: that many cores' worth of time per 100 ms window, across
//! every call of every guest, timers, watermarks and snapshot chunks included).
//!
//! Mechanism: the cgroup v1 `cpu` controller, which places single threads
//! (`/sys/fs/cgroup/cpu/weir-<pid>/<tenant>/tasks`); one directory per server process, removed
//! when it is dropped. Where the host does not offer it (no such hierarchy, or no permission),
//! [`CpuShares::new`] says why and jobs run without shares: scheduling is then per thread, and
//! `weir serve` prints that at start.
//!
//! Invariant: a job thread joins its tenant's group before it runs any guest code.

use std::path::{Path, PathBuf};

/// The default weight of a tenant (`cpu_weight`), as in cgroup v2 (1..=10000).
pub const DEFAULT_WEIGHT: u32 = 100;

/// `cpu.shares` of the server's own group against the rest of the machine: as much as 16 busy
/// threads, so moving the jobs' threads into groups does not starve the server next to other
/// processes (in one group, all tenants' threads would otherwise weigh as one thread).
pub const SERVER_SHARES: u64 = 16 * 1024;

/// The CPU groups of one server process.
#[derive(Debug)]
pub struct CpuShares {
    root: Result<PathBuf, String>,
}

/// One tenant's group.
#[derive(Debug)]
pub struct CpuGroup {
    tasks: PathBuf,
}

impl CpuShares {
    /// Creates this process's groups under the cgroup v1 `cpu` hierarchy at `mount`
    /// (normally `/sys/fs/cgroup/cpu`), or records why it cannot.
    pub fn new(mount: &Path) -> Self {
        let root = mount.join(format!("weir-{}", std::process::id()));
        let made = if !mount.join("cpu.shares").exists() {
            Err(format!("{} is not a cgroup v1 `cpu` hierarchy", mount.display()))
        } else {
            std::fs::create_dir_all(&root)
                .and_then(|_| std::fs::write(root.join("cpu.shares"), SERVER_SHARES.to_string()))
                .map(|_| root)
                .map_err(|e| format!("cannot create a CPU cgroup: {e}"))
        };
        CpuShares { root: made }
    }

    /// Shares that are off (single-job mode, or for tests).
    pub fn off(why: &str) -> Self {
        CpuShares { root: Err(why.to_string()) }
    }

    /// Why tenants do not get CPU shares, if they do not.
    pub fn unavailable(&self) -> Option<&str> {
        self.root.as_ref().err().map(String::as_str)
    }

    /// The group of `tenant`, weighted `weight` (1..=10000; [`DEFAULT_WEIGHT`] = one share),
    /// capped at `max_cores` cores per [`PERIOD_US`] window when given (CFS bandwidth).
    pub fn group(&self, tenant: &str, weight: u32, max_cores: Option<f64>) -> Result<CpuGroup, String> {
        let root = self.root.as_ref().map_err(Clone::clone)?;
        let dir = root.join(tenant);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create the CPU group of `{tenant}`: {e}"))?;
        std::fs::write(dir.join("cpu.shares"), shares(weight).to_string())
            .map_err(|e| format!("cannot set the CPU weight of `{tenant}`: {e}"))?;
        let quota = max_cores.map_or(-1, quota_us);
        std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())
            .and_then(|_| std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()))
            .map_err(|e| format!("cannot cap the CPU of `{tenant}`: {e}"))?;
        Ok(CpuGroup { tasks: dir.join("tasks") })
    }
}

/// The window of a CPU cap, µs.
pub const PERIOD_US: u64 = 100_000;

/// `cpu.cfs_quota_us` for a cap of `cores` per [`PERIOD_US`] (at least the kernel's 1 ms).
pub fn quota_us(cores: f64) -> i64 {
    ((cores * PERIOD_US as f64) as i64).max(1000)
}

/// cgroup v1 `cpu.shares` for a weight (1024 per [`DEFAULT_WEIGHT`], at least 2).
pub fn shares(weight: u32) -> u64 {
    (weight.clamp(1, 10_000) as u64 * 1024 / DEFAULT_WEIGHT as u64).max(2)
}

impl Drop for CpuShares {
    /// Removes the groups (the kernel refuses while a thread is still in one; threads leave
    /// when they end, and a later server removes what is left of a dead one).
    fn drop(&mut self) {
        if let Ok(root) = &self.root {
            if let Ok(dirs) = std::fs::read_dir(root) {
                for d in dirs.flatten().filter(|d| d.path().is_dir()) {
                    let _ = std::fs::remove_dir(d.path());
                }
            }
            let _ = std::fs::remove_dir(root);
        }
    }
}

impl CpuGroup {
    /// The group's `cgroup.procs` (a pid written there moves the whole process).
    pub fn procs(&self) -> PathBuf {
        self.tasks.with_file_name("cgroup.procs")
    }

    /// Moves the calling thread into the group.
    pub fn join_current_thread(&self) -> std::io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: gettid has no arguments and touches no memory.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            std::fs::write(&self.tasks, tid.to_string())
        }
        #[cfg(not(target_os = "linux"))]
        Ok(())
    }
}

/// Removes the groups of server processes that no longer run (`weir-<pid>` whose pid is
/// gone), left behind by a `kill -9`.
pub fn remove_stale(mount: &Path) {
    let Ok(dirs) = std::fs::read_dir(mount) else { return };
    for d in dirs.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("weir-").and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            if let Ok(subs) = std::fs::read_dir(d.path()) {
                for s in subs.flatten().filter(|s| s.path().is_dir()) {
                    let _ = std::fs::remove_dir(s.path());
                }
            }
            let _ = std::fs::remove_dir(d.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_map_to_shares() {
        assert_eq!(shares(DEFAULT_WEIGHT), 1024);
        assert_eq!(shares(200), 2048);
        assert_eq!(shares(0), 10);
        assert_eq!(shares(1), 10);
        assert_eq!(shares(1_000_000), 102_400);
    }

    #[test]
    fn caps_map_to_cfs_quotas() {
        assert_eq!(quota_us(1.0), 100_000);
        assert_eq!(quota_us(0.25), 25_000);
        assert_eq!(quota_us(0.001), 1000, "the kernel's minimum");
    }

    #[test]
    fn a_host_without_the_hierarchy_says_why() {
        let d = tempfile::tempdir().unwrap();
        let s = CpuShares::new(d.path());
        assert!(s.unavailable().unwrap().contains("not a cgroup v1 `cpu` hierarchy"));
        assert!(s.group("acme", 100, None).is_err());
    }
}
