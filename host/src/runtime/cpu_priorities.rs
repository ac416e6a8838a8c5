//! CPU shares between tenants where no CPU cgroup can be used (a cgroup-v2-only host, an
//! unprivileged container, `cpu_cgroup = ""`): the scheduler's per-thread priorities instead.
//!
//! The kernel's fair scheduler gives each runnable thread CPU in proportion to the weight of
//! its nice value (1024 at nice 0, ~1.25× less per step). A tenant's part of the server's
//! weight is spread over the threads its jobs run: each of its `n` threads gets the nice whose
//! weight is closest to `part / n`, so a tenant's threads weigh about its `cpu_weight`
//! together however many there are. Whenever a tenant's count changes, its threads are
//! re-niced. Both scales ([`Scale`]) are anchored at the server's own nice (`base`, what it
//! was started with), so a server run at nice 5 gives its tenants what a nice-5 process's
//! threads would get:
//! - **privileged** (`CAP_SYS_NICE`, or an `RLIMIT_NICE` that allows nice -20; found by
//!   trying): the tenants together weigh as much as [`super::cpu_shares::SERVER_SHARES`]
//!   (16 busy threads at `base`, as the server's cgroup does), split by `cpu_weight`;
//!   priorities go up (as far as nice -20, ahead of other processes on the host) and down as
//!   counts change. Here a tenant's count is not its threads but how many of them were
//!   runnable on average ([`RUNNABLE_WINDOW`], from each thread's `schedstat`: time running
//!   plus time waiting for a core), at least one: a pipeline whose threads wait on each other
//!   gets its whole part, as in a cgroup, and a thread that only sleeps weighs nothing. A
//!   thread that joins counts as runnable at once (until it has been watched for a whole
//!   window); threads that wake are seen at the next count; the count falls by at most one
//!   thread per window ([`smoothed`]). A tenant that idles its threads to be counted low and
//!   then wakes them all weighs more than its part only until the next count, after idling
//!   at least as many windows as the extra threads it woke: it cannot get more CPU that way
//!   than by keeping them busy.
//! - **unprivileged**: priorities only go down from `base`, so the heaviest tenant's single
//!   thread runs at `base`, the rest below it. The soft `RLIMIT_NICE` is raised to its hard
//!   limit at start; beyond what it allows (nothing, by default) a thread lowered while its
//!   tenant ran more threads stays low until it ends (its job's next attempt starts afresh),
//!   so a tenant can weigh less than its part, never more.
//!
//! Compiler child processes start (before they run anything, so every compile thread has it)
//! at the nice of as many more threads of their tenant as there are cores, never above
//! `base`. On Linux a thread's nice also sets its I/O priority under the BFQ and CFQ disk
//! schedulers (the "best effort" class follows nice), so tenants' disk reads are weighted
//! roughly as their CPU is.
//!
//! Limits, against a cgroup: a tenant whose threads reach nice 19 weighs more with each
//! further one ([`Scale::excess`]; the server warns at start when a tenant's `max_subtasks`
//! at its `cpu_weight` gets there); threads the server runs for a tenant outside its
//! subtasks (checkpoint writers, background folds of disk state) are not members and run at
//! `base`; nothing caps a tenant (`max_cpu_cores` needs the cgroup). The sampler reads one
//! `/proc` file per member thread every window.
//!
//! Invariants: the tenant's count never goes below one thread nor above its members, so no
//! tenant's threads weigh more than its part while all are busy; a thread is re-niced only
//! while it is a member (its [`Membership`] is not `Send`: it leaves on its own thread before
//! the thread ends, so a recycled thread id is never touched). A member thread must not start
//! threads of its own: they would inherit its nice, raised above `base` where privileged,
//! without being counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often, privileged, each tenant's runnable threads are counted again.
pub const RUNNABLE_WINDOW: Duration = Duration::from_millis(250);

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
    /// The server's own nice, which the scale is anchored at.
    base: i32,
    /// Whether priorities may go above `base`, and follow runnable threads.
    privileged: bool,
}

/// The kernel's weight of `nice` (clamped to -20..=19).
fn weight_of(nice: i32) -> f64 {
    f64::from(WEIGHTS[(nice.clamp(-20, 19) + 20) as usize])
}

impl Scale {
    /// With `CAP_SYS_NICE`: the tenants (weights summing to `total_weight`) weigh together as
    /// much as `shares` (in threads at nice 0) would at the process's nice, `base`.
    pub fn privileged(shares: u64, total_weight: u64, base: i32) -> Self {
        let base = base.clamp(-20, 19);
        let shares = shares as f64 * weight_of(base) / weight_of(0);
        Scale { per_weight: shares / total_weight.max(1) as f64, lowest: -20, base, privileged: true }
    }

    /// Without it: the heaviest tenant (`max_weight`) weighs one thread at the process's nice,
    /// `base`; no thread goes above it.
    pub fn unprivileged(max_weight: u32, base: i32) -> Self {
        let base = base.clamp(-20, 19);
        Scale { per_weight: weight_of(base) / f64::from(max_weight.max(1)), lowest: base, base, privileged: false }
    }

    /// The nice that gives one of `threads` threads of a tenant weighted `weight` its part
    /// (pure).
    pub fn nice_for(&self, weight: u32, threads: usize) -> i32 {
        self.nice_for_count(weight, threads as f64)
    }

    /// How many times its part `threads` busy threads of a tenant weighted `weight` weigh
    /// together (1.0 where nice values can express the part; more once they reach nice 19).
    pub fn excess(&self, weight: u32, threads: u32) -> f64 {
        let part = self.per_weight * f64::from(weight.max(1));
        let nice = self.nice_for(weight, threads.max(1) as usize);
        weight_of(nice) * f64::from(threads.max(1)) / part
    }

    /// [`Scale::nice_for`] for a count of threads that need not be whole (runnable on
    /// average); below one counts as one.
    pub fn nice_for_count(&self, weight: u32, threads: f64) -> i32 {
        let target = self.per_weight * f64::from(weight.max(1)) / threads.max(1.0);
        let step = |nice: i32| (weight_of(nice) / target).ln().abs();
        (self.lowest..=19).min_by(|a, b| step(*a).total_cmp(&step(*b))).unwrap_or(19)
    }
}

/// A tenant's count of runnable threads after a window in which `sample` were runnable on
/// average, when it was `prev`: up at once, down by at most one thread (pure).
pub fn smoothed(prev: f64, sample: f64) -> f64 {
    sample.max(prev - 1.0)
}

/// A thread id (Linux `gettid`).
type Tid = i32;

#[derive(Debug, Default)]
struct Tenant {
    weight: u32,
    threads: HashMap<Tid, Member>,
    /// Privileged: its threads runnable on average over the last window (a thread that
    /// joined since counts as one), [`smoothed`].
    runnable: f64,
}

#[derive(Debug)]
struct Member {
    /// The nice it must not go below (a demoted job's).
    floor: i32,
    /// The nice it has.
    applied: i32,
    /// Its `schedstat` time running plus waiting, ns, at the last count (none before its first:
    /// it counts as runnable until watched for a whole window).
    seen: Option<u64>,
}

impl Tenant {
    /// What its weight is spread over: its runnable threads (privileged), else its members.
    fn count(&self, dynamic: bool) -> f64 {
        let members = self.threads.len() as f64;
        if dynamic { self.runnable.clamp(1.0, members.max(1.0)) } else { members }
    }
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
    /// Not `Send`: dropped on its own thread, before the thread ends, so a recycled id is never
    /// re-niced.
    _here: std::marker::PhantomData<*const ()>,
}

impl Membership {
    /// A membership of nothing (CPU cgroups, where the kernel keeps track).
    pub fn none() -> Self {
        Membership { of: None, _here: std::marker::PhantomData }
    }
}

impl Priorities {
    /// Priorities for tenants whose weights are `weights`, together weighing `shares` where
    /// the process may raise priorities, else below the calling thread's own.
    pub fn new(weights: &[u32], shares: u64) -> Arc<Self> {
        raise_nice_limit();
        let base = current_nice();
        let scale = if may_raise(base) {
            Scale::privileged(shares, weights.iter().map(|&w| u64::from(w)).sum(), base)
        } else {
            Scale::unprivileged(weights.iter().copied().max().unwrap_or(1), base)
        };
        Self::scaled(scale)
    }

    /// Priorities on `scale` (privileged: tenants' runnable threads counted every
    /// [`RUNNABLE_WINDOW`] by a thread of its own while these priorities are in use).
    pub fn scaled(scale: Scale) -> Arc<Self> {
        let p = Self::counted_by_hand(scale);
        if p.privileged() {
            let weak = Arc::downgrade(&p);
            let spawned =
                std::thread::Builder::new().name("weir-cpu-shares".into()).spawn(move || count_runnable(weak));
            if let Err(e) = spawned {
                tracing::warn!("tenants' CPU priorities follow their thread counts only: {e}");
            }
        }
        p
    }

    /// Priorities on `scale` whose runnable threads are counted only by [`Self::recount`].
    fn counted_by_hand(scale: Scale) -> Arc<Self> {
        Arc::new(Priorities { scale, tenants: Mutex::default() })
    }

    /// Privileged: counts each tenant's runnable threads over the `elapsed` since the last
    /// count, and re-nices them.
    fn recount(&self, elapsed: Duration) {
        let window = elapsed.as_nanos().max(1) as f64;
        // The members' counters are read without the lock, so joins never wait on `/proc`; a
        // thread that joined since counts as one, one that left is skipped.
        let tids: Vec<Tid> = self.lock().values().flat_map(|t| t.threads.keys().copied()).collect();
        let now: HashMap<Tid, Option<u64>> = tids.into_iter().map(|tid| (tid, runnable_ns(tid))).collect();
        for t in self.lock().values_mut() {
            let mut runnable = 0.0;
            for (tid, m) in t.threads.iter_mut() {
                let now = now.get(tid).copied().flatten();
                runnable += match (m.seen, now) {
                    (Some(before), Some(now)) => now.saturating_sub(before) as f64 / window,
                    _ => 1.0,
                };
                m.seen = now;
            }
            t.runnable = smoothed(t.runnable, runnable);
            self.renice(t);
        }
    }

    /// How many times its part `threads` busy threads of a tenant weighted `weight` weigh.
    pub fn excess(&self, weight: u32, threads: u32) -> f64 {
        self.scale.excess(weight, threads)
    }

    /// Whether priorities are on the privileged scale (for the server's log).
    pub fn privileged(&self) -> bool {
        self.scale.privileged
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
        t.threads.insert(tid, Member { floor, applied: current_nice(), seen: None });
        t.runnable += 1.0;
        let nice = self.renice(t);
        let applied = t.threads.get(&tid).map_or(nice, |m| m.applied);
        drop(tenants);
        // A member from here on, whatever the kernel allowed: it leaves when the membership
        // is dropped, so its id is never re-niced after it ends.
        let member = Membership { of: Some((self.clone(), tenant.into(), tid)), _here: std::marker::PhantomData };
        if applied != nice.max(floor) {
            tracing::warn!(
                tenant,
                "a thread of tenant `{tenant}` keeps nice {applied}: the kernel refused {}",
                nice.max(floor)
            );
        }
        Ok(member)
    }

    /// The nice a compiler child of `tenant` starts at: that of one of its threads were its
    /// count higher by the cores the child compiles on (wasmtime compiles in parallel, one
    /// thread per core), never above the server's own (the child is not counted among the
    /// tenant's threads).
    pub fn child_nice(&self, tenant: &str) -> Option<i32> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let tenants = self.lock();
        let t = tenants.get(tenant)?;
        let nice = self.scale.nice_for_count(t.weight, t.count(self.privileged()) + cores);
        Some(nice.max(self.scale.base))
    }

    fn leave(&self, tenant: &str, tid: Tid) {
        let mut tenants = self.lock();
        if let Some(t) = tenants.get_mut(tenant) {
            t.threads.remove(&tid);
            t.runnable = t.runnable.min(t.threads.len() as f64);
            self.renice(t);
        }
    }

    /// Gives every member of `t` the nice of its count (a raise the kernel refuses is kept
    /// as it was: it is tried again at the next change); returns that nice.
    fn renice(&self, t: &mut Tenant) -> i32 {
        let nice = self.scale.nice_for_count(t.weight, t.count(self.privileged()));
        for (tid, m) in t.threads.iter_mut() {
            let want = nice.max(m.floor);
            if want != m.applied && set_nice(*tid, want) {
                m.applied = want;
            }
        }
        nice
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

/// The sampling thread: recounts every [`RUNNABLE_WINDOW`] until the priorities are dropped.
fn count_runnable(p: Weak<Priorities>) {
    let mut last = Instant::now();
    loop {
        std::thread::sleep(RUNNABLE_WINDOW);
        let Some(p) = p.upgrade() else { return };
        // Timed from where each count starts reading, so windows and counters line up.
        let now = Instant::now();
        p.recount(now - last);
        last = now;
    }
}

/// Time thread `tid` of this process spent running or waiting for a core, ns (its
/// `schedstat`), if the kernel tells.
fn runnable_ns(tid: Tid) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
    // A kernel without schedstats shows zeros: then nothing is known, and every member counts
    // (a zero would count none, and give each thread the tenant's whole part).
    Some(f.next()??.saturating_add(f.next()??)).filter(|&ns| ns > 0)
}

fn gettid() -> Tid {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no arguments and touches no memory.
    return unsafe { libc::syscall(libc::SYS_gettid) as Tid };
    #[cfg(not(target_os = "linux"))]
    0
}

/// Raises the soft `RLIMIT_NICE` to its hard limit, so that a thread lowered while its tenant
/// ran more threads may be raised back as far as the host allows without `CAP_SYS_NICE`.
fn raise_nice_limit() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NICE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NICE, &l);
        }
    }
}

/// Whether the calling thread may go as high as nice -20 (`CAP_SYS_NICE`, or an
/// `RLIMIT_NICE` of 40), tried and then put back to `base`; a process that may raise only
/// part of the way is unprivileged.
fn may_raise(base: i32) -> bool {
    if !set_nice(0, -20) {
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

    /// A server started at nice 5 weighs its tenants' threads as a nice-5 process's: the
    /// heaviest tenant's one thread at 5, three threads a third of that each.
    #[test]
    fn unprivileged_priorities_are_anchored_at_the_process_own_and_never_above_it() {
        assert_eq!(nice_for(100, 100, 1, 5), 5);
        assert_eq!(nice_for(100, 100, 3, 5), 10, "335 / 3 = 112 ~ nice 10 (110)");
        assert_eq!(nice_for(100, 100, 8, 5), 14, "335 / 8 = 42 ~ nice 14 (45)");
        assert_eq!(nice_for(50, 100, 1, 5), 8, "half the weight: 168 ~ nice 8 (172)");
        assert_eq!(nice_for(100, 100, 1, 19), 19);
        assert_eq!(nice_for(100, 100, 3, 19), 19, "never above the process's own");
        assert_eq!(nice_for(100, 100, 1, -20), -20);
        assert_eq!(nice_for(100, 100, 1, -40), -20, "a base out of range is clamped");
    }

    /// Privileged, two tenants of equal weight weigh 8 busy threads each, whatever their count.
    #[test]
    fn privileged_tenants_together_weigh_the_servers_shares() {
        let s = Scale::privileged(16 * 1024, 200, 0);
        assert_eq!(s.nice_for(100, 1), -9, "8192 ~ nice -9 (7620)");
        assert_eq!(s.nice_for(100, 4), -3, "2048 ~ nice -3 (1991)");
        assert_eq!(s.nice_for(100, 10), 1, "819 ~ nice 1 (820)");
        assert_eq!(s.nice_for(100, 100_000), 19);
        let at5 = Scale::privileged(16 * 1024, 200, 5);
        assert_eq!(at5.nice_for(100, 1), -4, "8 threads at nice 5: 2680 ~ nice -4 (2501)");
        assert_eq!(at5.nice_for(100, 8), 5, "one thread at nice 5 each");
    }

    /// Whatever the count, a tenant's threads together weigh close to its share.
    #[test]
    fn threads_together_weigh_about_the_tenants_share() {
        for base in [0, 5] {
            let one = weight_of(base);
            let scales = [(Scale::unprivileged(100, base), one), (Scale::privileged(16 * 1024, 200, base), 8.0 * one)];
            for (scale, part) in scales {
                // Until the threads reach nice 19 (the documented limit: each further one adds).
                for threads in 1..=60 {
                    let nice = scale.nice_for(100, threads);
                    if nice == 19 {
                        assert!(threads > 15, "{scale:?}: nice 19 already at {threads} threads");
                        break;
                    }
                    let total = weight_of(nice) * threads as f64;
                    assert!(
                        (0.85..=1.18).contains(&(total / part)),
                        "{scale:?}: {threads} threads at nice {nice}: {total}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_tenants_count_rises_at_once_and_falls_by_one_thread_per_window() {
        assert_eq!(smoothed(2.0, 7.5), 7.5);
        assert_eq!(smoothed(8.0, 0.0), 7.0);
        assert_eq!(smoothed(8.0, 7.6), 7.6);
        assert_eq!(smoothed(0.5, 0.0), 0.0);
    }

    /// A tenant whose `n` threads idle for `k` windows to be counted low, then all wake for
    /// one window, gets at most its part on average over those windows: the count fell to
    /// `n - k` at most, so the burst weighs `n / (n - k)` parts, for one window in `k + 1`.
    #[test]
    fn idling_to_be_counted_low_then_bursting_gains_nothing_on_average() {
        for n in 1..=64u32 {
            for k in 0..=200u32 {
                let mut runnable = f64::from(n);
                for _ in 0..k {
                    runnable = smoothed(runnable, 0.0);
                }
                let count = runnable.clamp(1.0, f64::from(n));
                let burst = f64::from(n) / count;
                let average = burst / f64::from(k + 1);
                assert!(average <= 1.0 + 1e-9, "{n} threads idle for {k} windows: {average} parts");
            }
        }
    }

    /// Real threads of this process: joining and leaving re-nices the other members.
    #[test]
    fn members_are_reniced_when_their_tenant_gains_or_loses_a_thread() {
        let p = Priorities::counted_by_hand(Scale::unprivileged(100, current_nice()));
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
    /// lets this process raise priorities; elsewhere it keeps its nice, still a member).
    #[test]
    fn privileged_members_go_above_nice_zero_unless_demoted() {
        let base = current_nice();
        let p = Priorities::counted_by_hand(Scale::privileged(16 * 1024, 100, base));
        p.tenant("acme", 100);
        let raised = std::thread::spawn(move || {
            let privileged = may_raise(current_nice());
            let m = p.join_current_thread("acme", 0);
            assert!(m.is_ok(), "a thread of a known tenant is a member whatever the kernel allows: {m:?}");
            let (nice, alone) = (current_nice(), p.scale.nice_for(100, 1));
            drop(m);
            let demoted = p.join_current_thread("acme", 15).map(|_| current_nice());
            (privileged, nice, alone, demoted.ok())
        })
        .join()
        .unwrap();
        match raised {
            (true, nice, alone, demoted) => {
                assert_eq!(nice, alone);
                if base == 0 {
                    assert_eq!(alone, -12, "16384 ~ nice -12 (14949)");
                }
                assert!(alone < base);
                assert_eq!(demoted, Some(15));
            }
            (false, nice, ..) => assert_eq!(nice, current_nice()),
        }
    }

    /// Privileged, a tenant's weight goes to the threads that run: four members that only
    /// sleep fall to a count below one (one window at a time), and once three of them wake
    /// and spin, one window's count sees three, and their priority follows.
    #[test]
    fn privileged_a_tenants_weight_follows_its_runnable_threads() {
        use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
        let p = Priorities::counted_by_hand(Scale::privileged(16 * 1024, 200, current_nice()));
        p.tenant("acme", 100);
        // 0: sleep, 1: spin, 2: leave.
        let modes: Vec<Arc<AtomicU8>> = (0..4).map(|_| Arc::new(AtomicU8::new(0))).collect();
        let (tids_tx, tids) = std::sync::mpsc::channel();
        let threads: Vec<_> = modes
            .iter()
            .map(|mode| {
                let (p, mode, tids_tx) = (p.clone(), mode.clone(), tids_tx.clone());
                std::thread::spawn(move || {
                    let m = p.join_current_thread("acme", 0);
                    tids_tx.send(gettid()).unwrap();
                    loop {
                        match mode.load(Relaxed) {
                            // Idle until woken (a thread waking every few ms waits for a core next to
                            // busy ones, and that wait counts as runnable).
                            0 => std::thread::park_timeout(Duration::from_millis(100)),
                            1 => std::hint::spin_loop(),
                            _ => break,
                        }
                    }
                    drop(m);
                })
            })
            .collect();
        let tids: Vec<Tid> = (0..4).map(|_| tids.recv().unwrap()).collect();
        let privileged = may_raise(current_nice());
        let count = || p.lock()["acme"].count(true);
        let window = |ms| {
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_millis(ms));
            p.recount(t0.elapsed());
        };
        assert_eq!(count(), 4.0, "joined threads count as runnable");
        p.recount(Duration::ZERO);
        assert_eq!(count(), 4.0, "not yet watched for a window");
        if runnable_ns(tids[0]).is_none() {
            // No schedstat on this kernel: every member counts, always.
            window(50);
            assert_eq!(count(), 4.0);
        } else {
            for _ in 0..5 {
                window(50);
            }
            let runnable = p.lock()["acme"].runnable;
            assert!(runnable < 0.5, "sleeping threads counted as {runnable} runnable");
            assert_eq!(count(), 1.0, "never below one");
            for (mode, t) in modes[..3].iter().zip(&threads) {
                mode.store(1, Relaxed);
                t.thread().unpark();
            }
            window(300);
            // Three spinning threads ran or waited for a core all the time, whatever the
            // machine (their counters move at ticks and switches: a few ms either way).
            let runnable = p.lock()["acme"].runnable;
            assert!((2.4..3.6).contains(&runnable), "three spinning threads counted as {runnable}");
            if privileged {
                assert_eq!(thread_nice(tids[3]), p.scale.nice_for_count(100, count()));
                assert!(thread_nice(tids[3]) > p.scale.nice_for(100, 1), "a third of the part each");
            }
        }
        for (mode, t) in modes.iter().zip(&threads) {
            mode.store(2, Relaxed);
            t.thread().unpark();
        }
        for t in threads {
            t.join().unwrap();
        }
        assert!(p.lock()["acme"].threads.is_empty());
    }

    /// A compiler child weighs as many more threads of its tenant as the cores it compiles
    /// on, and never more than one of the server's.
    #[test]
    fn a_compiler_child_weighs_its_compile_threads() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let p = Priorities::counted_by_hand(Scale::unprivileged(100, 0));
        p.tenant("acme", 100);
        assert_eq!(p.child_nice("acme"), Some(p.scale.nice_for_count(100, cores)));
        assert!(p.child_nice("acme").unwrap() > 0 || cores < 1.5);
        assert_eq!(p.child_nice("nobody"), None);
        let privileged = Priorities::counted_by_hand(Scale::privileged(16 * 1024, 100, 0));
        privileged.tenant("acme", 100);
        assert!(privileged.child_nice("acme").unwrap() >= 0, "never above the server's nice");
    }

    /// Nice values stop at 19: a light tenant's many threads weigh more than its part, which
    /// the server warns about at start.
    #[test]
    fn the_excess_of_threads_past_nice_19_is_known() {
        let s = Scale::unprivileged(10_000, 0);
        assert!((s.excess(10_000, 3) - 1.0).abs() < 0.2);
        assert!(s.excess(100, 64) > 50.0, "{}", s.excess(100, 64));
        assert!(Scale::unprivileged(100, 0).excess(100, 64) < 1.5);
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
