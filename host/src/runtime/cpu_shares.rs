//! CPU shares between tenants: each tenant's job threads get CPU in proportion to its
//! `cpu_weight` quota when the cores are contended, however many threads its jobs run and
//! whatever their guests do (a busy loop that stays under `call_timeout_ms` included). Idle
//! CPU is still used by whoever wants it (shares, not caps), unless a tenant has a hard cap,
//! `max_cpu_cores` (CFS bandwidth: that many cores' worth of time per 100 ms window, across
//! every call of every guest, timers, watermarks and snapshot chunks included).
//!
//! Two mechanisms (`cpu_fairness` in `server.toml`; `auto` takes the first the host offers):
//! - **cgroup**: the cgroup v1 `cpu` controller, which places single threads
//!   (`/sys/fs/cgroup/cpu/weir-<pid>/<tenant>/tasks`); one directory per server process,
//!   removed when it is dropped. Weights and caps.
//! - **priorities** ([`super::cpu_priorities`]): each tenant's weight spread over its threads'
//!   nice values; works on any Linux host, unprivileged, with weights only.
//!
//! Invariant: a job thread joins its tenant's share before it runs any guest code.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cpu_priorities::{Membership, Priorities};

/// How tenants' CPU shares are kept (`cpu_fairness` in `server.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fairness {
    /// The cgroup where the host offers it, else thread priorities.
    #[default]
    Auto,
    /// The cgroup v1 `cpu` controller, or the server does not start.
    Cgroup,
    /// Thread priorities (nice), even where a cgroup could be used.
    Priorities,
    /// None: the OS schedules every thread alike.
    Off,
}

/// The default weight of a tenant (`cpu_weight`), as in cgroup v2 (1..=10000).
pub const DEFAULT_WEIGHT: u32 = 100;

/// `cpu.shares` of the server's own group against the rest of the machine: as much as 16 busy
/// threads, so moving the jobs' threads into groups does not starve the server next to other
/// processes (in one group, all tenants' threads would otherwise weigh as one thread).
pub const SERVER_SHARES: u64 = 16 * 1024;

/// The CPU shares of one server process.
#[derive(Debug)]
pub struct CpuShares {
    how: How,
}

#[derive(Debug)]
enum How {
    /// This process's directory in the cgroup v1 `cpu` hierarchy.
    Cgroup(PathBuf),
    /// Thread priorities, and why no cgroup is used.
    Priorities(Arc<Priorities>, String),
    /// No shares, and why.
    Off(String),
}

/// One tenant's share.
#[derive(Debug)]
pub enum CpuGroup {
    /// Its cgroup's `tasks` file.
    Cgroup(PathBuf),
    /// Its name among the priorities.
    Priorities(Arc<Priorities>, String),
}

impl CpuShares {
    /// The shares `fairness` asks for, with the cgroup v1 `cpu` hierarchy at `mount`
    /// (normally `/sys/fs/cgroup/cpu`; empty: none) for tenants weighted `weights`; an error
    /// says why a required cgroup cannot be used.
    pub fn choose(fairness: Fairness, mount: &Path, weights: &[u32]) -> Result<Self, String> {
        let cgroup = || {
            if mount.as_os_str().is_empty() {
                return Err("cpu_cgroup = \"\" in the server configuration".to_string());
            }
            remove_stale(mount);
            Self::cgroup(mount)
        };
        let priorities = |why: String| CpuShares { how: How::Priorities(Priorities::new(weights, SERVER_SHARES), why) };
        match fairness {
            Fairness::Off => Ok(Self::off("cpu_fairness = \"off\" in the server configuration")),
            Fairness::Priorities => Ok(priorities("cpu_fairness = \"priorities\"".into())),
            Fairness::Cgroup => cgroup().map_err(|why| {
                format!("cpu_fairness = \"cgroup\", but {why}; set cpu_cgroup to a writable cgroup v1 `cpu` hierarchy or cpu_fairness = \"auto\"")
            }),
            Fairness::Auto => Ok(cgroup().unwrap_or_else(priorities)),
        }
    }

    /// This process's groups under the cgroup v1 `cpu` hierarchy at `mount`, or why not.
    pub fn cgroup(mount: &Path) -> Result<Self, String> {
        let root = mount.join(format!("weir-{}", std::process::id()));
        if !mount.join("cpu.shares").exists() {
            return Err(format!("{} is not a cgroup v1 `cpu` hierarchy", mount.display()));
        }
        std::fs::create_dir_all(&root)
            .and_then(|_| std::fs::write(root.join("cpu.shares"), SERVER_SHARES.to_string()))
            .map_err(|e| format!("cannot create a CPU cgroup under {}: {e}", mount.display()))?;
        Ok(CpuShares { how: How::Cgroup(root) })
    }

    /// Shares that are off (single-job mode, or for tests).
    pub fn off(why: &str) -> Self {
        CpuShares { how: How::Off(why.to_string()) }
    }

    /// Why tenants do not get CPU shares, if they do not.
    pub fn unavailable(&self) -> Option<&str> {
        match &self.how {
            How::Off(why) => Some(why),
            _ => None,
        }
    }

    /// How tenants get their shares, for the server's log.
    pub fn describe(&self) -> String {
        match &self.how {
            How::Cgroup(root) => format!("cgroup v1 `cpu` controller at {}", root.display()),
            How::Priorities(p, why) => format!(
                "thread priorities{}, no caps (no CPU cgroup: {why})",
                if p.privileged() {
                    ""
                } else {
                    " below the server's own (the kernel refused nice -20: no CAP_SYS_NICE)"
                }
            ),
            How::Off(why) => format!("none ({why})"),
        }
    }

    /// With priorities: how many times its share `threads` busy threads of a tenant weighted
    /// `weight` can weigh at most (nice values stop at 19); `None` with a cgroup or no shares.
    pub fn excess(&self, weight: u32, threads: u32) -> Option<f64> {
        match &self.how {
            How::Priorities(p, _) => Some(p.excess(weight, threads)),
            _ => None,
        }
    }

    /// The share of `tenant`, weighted `weight` (1..=10000; [`DEFAULT_WEIGHT`] = one share),
    /// capped at `max_cores` cores per [`PERIOD_US`] window when given (CFS bandwidth; only
    /// with a cgroup).
    pub fn group(&self, tenant: &str, weight: u32, max_cores: Option<f64>) -> Result<CpuGroup, String> {
        match &self.how {
            How::Off(why) => Err(why.clone()),
            How::Priorities(p, why) => match max_cores {
                Some(_) => Err(format!("max_cpu_cores needs the cgroup v1 `cpu` controller ({why})")),
                None => {
                    p.tenant(tenant, weight);
                    Ok(CpuGroup::Priorities(p.clone(), tenant.to_string()))
                }
            },
            How::Cgroup(root) => cgroup_of(root, tenant, weight, max_cores),
        }
    }
}

/// The cgroup of `tenant` under `root`, with its weight and cap written.
fn cgroup_of(root: &Path, tenant: &str, weight: u32, max_cores: Option<f64>) -> Result<CpuGroup, String> {
    let dir = root.join(tenant);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create the CPU group of `{tenant}`: {e}"))?;
    std::fs::write(dir.join("cpu.shares"), shares(weight).to_string())
        .map_err(|e| format!("cannot set the CPU weight of `{tenant}`: {e}"))?;
    let quota = max_cores.map_or(-1, quota_us);
    std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())
        .and_then(|_| std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()))
        .map_err(|e| format!("cannot cap the CPU of `{tenant}`: {e}"))?;
    Ok(CpuGroup::Cgroup(dir.join("tasks")))
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
        if let How::Cgroup(root) = &self.how {
            if let Ok(dirs) = std::fs::read_dir(root) {
                for d in dirs.flatten().filter(|d| d.path().is_dir()) {
                    let _ = std::fs::remove_dir(d.path());
                }
            }
            let _ = std::fs::remove_dir(root);
        }
    }
}

/// A compiler child is charged to the share: moved into the cgroup once started, or started
/// at the priority of as many more of the tenant's threads as it compiles on.
impl crate::sandbox::isolated_compile::ChargeProcess for CpuGroup {
    fn nice(&self) -> Option<i32> {
        match self {
            CpuGroup::Cgroup(_) => None,
            CpuGroup::Priorities(p, tenant) => p.child_nice(tenant),
        }
    }

    fn started(&self, pid: u32) {
        if let CpuGroup::Cgroup(tasks) = self {
            let _ = std::fs::write(tasks.with_file_name("cgroup.procs"), pid.to_string());
        }
    }
}

impl CpuGroup {
    /// Moves the calling thread into the share, at a nice of at least `floor` (a demoted
    /// job's, [`super::priority::DEMOTED_NICE`]; 0 for none); keep the membership until the
    /// thread ends.
    pub fn join_current_thread(&self, floor: i32) -> std::io::Result<Membership> {
        match self {
            CpuGroup::Cgroup(tasks) => {
                // Demoted first: a thread the kernel will not move keeps its penalty.
                if floor > 0 {
                    super::priority::demote_current_thread(floor);
                }
                #[cfg(target_os = "linux")]
                {
                    // SAFETY: gettid has no arguments and touches no memory.
                    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
                    std::fs::write(tasks, tid.to_string())?;
                }
                #[cfg(not(target_os = "linux"))]
                let _ = tasks;
                Ok(Membership::none())
            }
            CpuGroup::Priorities(p, tenant) => p.join_current_thread(tenant, floor),
        }
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
    fn a_host_without_the_hierarchy_says_why_and_auto_takes_priorities() {
        let d = tempfile::tempdir().unwrap();
        let e = CpuShares::cgroup(d.path()).unwrap_err();
        assert!(e.contains("not a cgroup v1 `cpu` hierarchy"), "{e}");
        let e = CpuShares::choose(Fairness::Cgroup, d.path(), &[100]).unwrap_err();
        assert!(e.contains("cpu_fairness = \"cgroup\"") && e.contains("not a cgroup v1"), "{e}");
        let auto = CpuShares::choose(Fairness::Auto, d.path(), &[100]).unwrap();
        assert!(auto.unavailable().is_none());
        assert!(auto.describe().contains("thread priorities"), "{}", auto.describe());
        assert!(auto.group("acme", 100, None).is_ok());
        let e = auto.group("capped", 100, Some(1.0)).unwrap_err();
        assert!(e.contains("max_cpu_cores needs the cgroup"), "{e}");
        let off = CpuShares::choose(Fairness::Off, d.path(), &[100]).unwrap();
        assert!(off.unavailable().unwrap().contains("cpu_fairness = \"off\""));
        assert!(off.group("acme", 100, None).is_err());
    }
}
