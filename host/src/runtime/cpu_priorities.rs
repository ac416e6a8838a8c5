//! CPU shares between tenants where no CPU cgroup can be used (a cgroup-v2-only host, an
//! unprivileged container, `cpu_cgroup = ""`): the scheduler's per-thread priorities instead.
//!
//! The kernel's fair scheduler gives each runnable thread CPU in proportion to the weight of
//! its nice value (1024 at nice 0, ~1.25× less per step). A tenant's part of the server's
//! weight is spread over the threads its jobs run: each of its `n` threads gets the nice whose
//! weight is closest to `part / n`, so a tenant's threads weigh about its `cpu_weight`
//! together however many there are. Whenever a tenant's thread count changes, its threads are
//! re-niced. Two scales ([`Scale`]):
//! - **privileged** (`CAP_SYS_NICE`, found by trying): the tenants together weigh as much as
//!   [`super::cpu_shares::SERVER_SHARES`] (16 busy threads at nice 0, as the server's cgroup
//!   does), split by `cpu_weight`; priorities go up and down as counts change.
//! - **unprivileged**: priorities only go down from the process's own, so the heaviest
//!   tenant's single thread runs at the process's nice, the rest below it; a priority the
//!   kernel will not raise back stays low until the tenant's next thread starts.
//!
//! Limits, against a cgroup: a tenant whose threads reach nice 19 (about 70 threads per share
//! unprivileged) weighs more with each further one, and nothing caps a tenant
//! (`max_cpu_cores` needs the cgroup).
//!
//! Invariant: a thread is re-niced only while it is a member (it leaves before it ends, so a
//! recycled thread id is never touched).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The kernel's weight of each nice value, -20..=19 (`sched_prio_to_weight`).
const WEIGHTS: [u32; 40] = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904, 3906, 3121, 2501,
    1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
];

/// How tenants' weights map to nice values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    /// Kernel weight per unit of `cpu_weight`.
    per_weight: f64,
    /// The highest priority (lowest nice) a thread may get.
    lowest: i32,
}

impl Scale {
    /// With `CAP_SYS_NICE`: the tenants (weights summing to `total_weight`) weigh `shares`
    /// together.
    pub fn privileged(shares: u64, total_weight: u64) -> Self {
        Scale { per_weight: shares as f64 / total_weight.max(1) as f64, lowest: -20 }
    }

    /// Without it: the heaviest tenant (`max_weight`) weighs one thread at the process's nice,
    /// `base`; no thread goes above it.
    pub fn unprivileged(max_weight: u32, base: i32) -> Self {
        Scale { per_weight: 1024.0 / f64::from(max_weight.max(1)), lowest: base.clamp(-20, 19) }
    }

    /// The nice that gives one of `threads` threads of a tenant weighted `weight` its part
    /// (pure).
    pub fn nice_for(&self, weight: u32, threads: usize) -> i32 {
        let target = self.per_weight * f64::from(weight.max(1)) / threads.max(1) as f64;
        let step = |nice: i32| (f64::from(WEIGHTS[(nice + 20) as usize]) / target).ln().abs();
        (self.lowest..=19).min_by(|a, b| step(*a).total_cmp(&step(*b))).unwrap_or(19)
    }
}

/// A thread id (Linux `gettid`).
type Tid = i32;

#[derive(Debug, Default)]
struct Tenant {
    weight: u32,
    /// Member threads: the nice each must not go below (a demoted job's), and the nice it has.
    threads: HashMap<Tid, (i32, i32)>,
}

/// The tenants' threads of one server process and their priorities.
#[derive(Debug)]
pub struct Priorities {
    scale: Scale,
    tenants: Mutex<HashMap<String, Tenant>>,
}

/// A thread's membership of its tenant; dropping it (on the thread, before it ends) leaves.
#[must_use = "the thread leaves its tenant when this is dropped"]
#[derive(Debug)]
pub struct Membership {
    of: Option<(Arc<Priorities>, String, Tid)>,
}

impl Membership {
    /// A membership of nothing (CPU cgroups, where the kernel keeps track).
    pub fn none() -> Self {
        Membership { of: None }
    }
}

impl Priorities {
    /// Priorities for tenants whose weights are `weights`, together weighing `shares` where
    /// the process may raise priorities, else below the calling thread's own.
    pub fn new(weights: &[u32], shares: u64) -> Arc<Self> {
        let base = current_nice();
        let scale = if may_raise(base) {
            Scale::privileged(shares, weights.iter().map(|&w| u64::from(w)).sum())
        } else {
            Scale::unprivileged(weights.iter().copied().max().unwrap_or(1), base)
        };
        Self::scaled(scale)
    }

    /// Priorities on `scale`.
    pub fn scaled(scale: Scale) -> Arc<Self> {
        Arc::new(Priorities { scale, tenants: Mutex::default() })
    }

    /// Whether priorities are on the privileged scale (for the server's log).
    pub fn privileged(&self) -> bool {
        self.scale.lowest == -20
    }

    /// Records `tenant` and its weight.
    pub fn tenant(&self, tenant: &str, weight: u32) {
        self.lock().entry(tenant.to_string()).or_default().weight = weight;
    }

    /// The calling thread joins `tenant` (at a nice of at least `floor` when positive); every
    /// thread of the tenant is re-niced for the new count.
    pub fn join_current_thread(self: &Arc<Self>, tenant: &str, floor: i32) -> std::io::Result<Membership> {
        let tid = gettid();
        // 0 and below: no floor (a thread of a job that was not demoted).
        let floor = if floor > 0 { floor } else { -20 };
        let mut tenants = self.lock();
        let t = tenants.get_mut(tenant).ok_or_else(|| std::io::Error::other(format!("no tenant `{tenant}`")))?;
        t.threads.insert(tid, (floor, current_nice()));
        self.renice(t);
        let applied = t.threads.get(&tid).map(|&(_, nice)| nice);
        drop(tenants);
        match applied {
            Some(nice) if nice >= self.nice(tenant, floor) => {
                Ok(Membership { of: Some((self.clone(), tenant.into(), tid)) })
            }
            _ => Err(std::io::Error::other("the thread's priority could not be lowered")),
        }
    }

    /// Lowers the priority of process `pid` (a compiler child of `tenant`) to what one more
    /// thread of the tenant would get.
    pub fn charge_process(&self, tenant: &str, pid: u32) {
        let tenants = self.lock();
        if let Some(t) = tenants.get(tenant) {
            let nice = self.scale.nice_for(t.weight, t.threads.len() + 1);
            set_nice(pid as Tid, nice);
        }
    }

    /// The nice a member of `tenant` has now (tests and logs).
    fn nice(&self, tenant: &str, floor: i32) -> i32 {
        self.lock().get(tenant).map_or(floor, |t| self.scale.nice_for(t.weight, t.threads.len()).max(floor))
    }

    fn leave(&self, tenant: &str, tid: Tid) {
        let mut tenants = self.lock();
        if let Some(t) = tenants.get_mut(tenant) {
            t.threads.remove(&tid);
            self.renice(t);
        }
    }

    /// Gives every member of `t` the nice of its count (a raise the kernel refuses is kept
    /// as it was: it is tried again at the next change).
    fn renice(&self, t: &mut Tenant) {
        let nice = self.scale.nice_for(t.weight, t.threads.len());
        for (tid, (floor, applied)) in t.threads.iter_mut() {
            let want = nice.max(*floor);
            if want != *applied && set_nice(*tid, want) {
                *applied = want;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tenant>> {
        self.tenants.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if let Some((p, tenant, tid)) = self.of.take() {
            p.leave(&tenant, tid);
        }
    }
}

fn gettid() -> Tid {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no arguments and touches no memory.
    return unsafe { libc::syscall(libc::SYS_gettid) as Tid };
    #[cfg(not(target_os = "linux"))]
    0
}

/// Whether the calling thread may go above `base` (tried, then put back).
fn may_raise(base: i32) -> bool {
    if base <= -20 || !set_nice(0, base - 1) {
        return false;
    }
    set_nice(0, base);
    true
}

/// The calling thread's nice.
pub fn current_nice() -> i32 {
    thread_nice(0)
}

/// The nice of thread (or process) `tid`; 0 = the calling thread.
fn thread_nice(tid: Tid) -> i32 {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain syscall; -1 is a valid nice, so errno is cleared first and read after.
    unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        if n == -1 && *libc::__errno_location() != 0 { 0 } else { n }
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// Sets the nice of thread (or process) `tid` (Linux: per thread); whether the kernel took it.
fn set_nice(tid: Tid, nice: i32) -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain syscall on an id; no memory is shared with it.
    return unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0 };
    #[cfg(not(target_os = "linux"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_for(weight: u32, max_weight: u32, threads: usize, base: i32) -> i32 {
        Scale::unprivileged(max_weight, base).nice_for(weight, threads)
    }

    #[test]
    fn a_tenants_weight_is_spread_over_its_threads() {
        assert_eq!(nice_for(100, 100, 1, 0), 0);
        assert_eq!(nice_for(100, 100, 3, 0), 5, "1024 / 3 = 341 ~ nice 5 (335)");
        assert_eq!(nice_for(100, 100, 8, 0), 9, "128 ~ nice 9 (137)");
        assert_eq!(nice_for(50, 100, 1, 0), 3, "half the weight: 512 ~ nice 3 (526)");
        assert_eq!(nice_for(10_000, 10_000, 2, 0), 3);
        assert_eq!(nice_for(100, 10_000, 1, 0), 19, "a hundredth of the heaviest: as low as it goes");
        assert_eq!(nice_for(100, 100, 10_000, 0), 19);
        assert_eq!(nice_for(100, 100, 0, 0), 0, "no threads counts as one");
    }

    #[test]
    fn unprivileged_priorities_never_go_above_the_process_own() {
        assert_eq!(nice_for(100, 100, 1, 5), 5);
        assert_eq!(nice_for(100, 100, 3, 5), 5);
        assert_eq!(nice_for(100, 100, 8, 5), 9);
        assert_eq!(nice_for(100, 100, 1, 19), 19);
        assert_eq!(nice_for(100, 100, 1, -20), 0);
    }

    /// Privileged, two tenants of equal weight weigh 8 busy threads each, whatever their count.
    #[test]
    fn privileged_tenants_together_weigh_the_servers_shares() {
        let s = Scale::privileged(16 * 1024, 200);
        assert_eq!(s.nice_for(100, 1), -9, "8192 ~ nice -9 (7620)");
        assert_eq!(s.nice_for(100, 4), -3, "2048 ~ nice -3 (1991)");
        assert_eq!(s.nice_for(100, 10), 1, "819 ~ nice 1 (820)");
        assert_eq!(s.nice_for(100, 100_000), 19);
    }

    /// Whatever the count, a tenant's threads together weigh close to its share.
    #[test]
    fn threads_together_weigh_about_the_tenants_share() {
        for (scale, part) in [(Scale::unprivileged(100, 0), 1024.0), (Scale::privileged(16 * 1024, 200), 8192.0)] {
            for threads in 1..=60 {
                let nice = scale.nice_for(100, threads);
                let total = f64::from(WEIGHTS[(nice + 20) as usize]) * threads as f64;
                assert!(
                    (0.85..=1.18).contains(&(total / part)),
                    "{scale:?}: {threads} threads at nice {nice}: {total}"
                );
            }
        }
    }

    /// Real threads of this process: joining and leaving re-nices the other members.
    #[test]
    fn members_are_reniced_when_their_tenant_gains_or_loses_a_thread() {
        let p = Priorities::scaled(Scale::unprivileged(100, current_nice()));
        p.tenant("acme", 100);
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let p = p.clone();
            std::thread::spawn(move || {
                let m = p.join_current_thread("acme", 0).unwrap();
                tx.send(gettid()).unwrap();
                go_rx.recv().unwrap();
                let after = current_nice();
                drop(m);
                after
            })
        };
        let first_tid = rx.recv().unwrap();
        let base = p.scale.lowest;
        assert_eq!(thread_nice(first_tid), nice_for(100, 100, 1, base));
        let others: Vec<_> = (0..7).map(|_| p.join_current_thread_on_new_thread("acme")).collect();
        assert_eq!(thread_nice(first_tid), nice_for(100, 100, 8, base), "eight members: nice 9 each");
        let demoted = p.join_current_thread_on_new_thread_with_floor("acme", 15);
        assert_eq!(thread_nice(demoted.1), 15, "a demoted thread stays at its floor");
        go_tx.send(()).unwrap();
        assert_eq!(first.join().unwrap(), nice_for(100, 100, 9, base));
        assert!(p.join_current_thread("nobody", 0).is_err(), "an unknown tenant is refused");
        drop(others);
        drop(demoted);
        assert!(p.lock()["acme"].threads.is_empty(), "every member left");
    }

    /// Privileged, a thread of a job that was not demoted goes above nice 0 (where the kernel
    /// lets this process raise priorities; elsewhere the join says it could not).
    #[test]
    fn privileged_members_go_above_nice_zero_unless_demoted() {
        let p = Priorities::scaled(Scale::privileged(16 * 1024, 100));
        p.tenant("acme", 100);
        let raised = std::thread::spawn(move || {
            let privileged = may_raise(current_nice());
            let m = p.join_current_thread("acme", 0);
            assert_eq!(m.is_ok(), privileged, "{m:?}");
            let (nice, alone) = (current_nice(), p.scale.nice_for(100, 1));
            drop(m);
            let demoted = p.join_current_thread("acme", 15).map(|_| current_nice());
            (privileged, nice, alone, demoted.ok())
        })
        .join()
        .unwrap();
        match raised {
            (true, nice, alone, demoted) => {
                assert_eq!((nice, alone), (-12, -12), "16384 ~ nice -12 (14949)");
                assert_eq!(demoted, Some(15));
            }
            (false, nice, ..) => assert_eq!(nice, current_nice()),
        }
    }

    /// A thread that joins and parks until its handle is dropped.
    struct Parked(std::sync::mpsc::Sender<()>, Tid, Option<std::thread::JoinHandle<()>>);

    impl Drop for Parked {
        fn drop(&mut self) {
            let _ = self.0.send(());
            if let Some(h) = self.2.take() {
                h.join().unwrap();
            }
        }
    }

    impl Priorities {
        fn join_current_thread_on_new_thread(self: &Arc<Self>, tenant: &str) -> Parked {
            self.join_current_thread_on_new_thread_with_floor(tenant, 0)
        }

        fn join_current_thread_on_new_thread_with_floor(self: &Arc<Self>, tenant: &str, floor: i32) -> Parked {
            let (tx, rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
            let (p, tenant) = (self.clone(), tenant.to_string());
            let h = std::thread::spawn(move || {
                let _m = p.join_current_thread(&tenant, floor).unwrap();
                tx.send(gettid()).unwrap();
                let _ = stop_rx.recv();
            });
            Parked(stop_tx, rx.recv().unwrap(), Some(h))
        }
    }
}
