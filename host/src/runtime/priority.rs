//! Scheduling fairness between jobs: a job whose guest ran into its CPU time limit restarts
//! with its subtask threads at a lower OS priority (nice), so a tenant that spins until its
//! deadline, restart after restart, yields the cores to well-behaved jobs first.
//!
//! Invariant: only ever lowers priority. (Raising, where the server may, is
//! [`super::cpu_priorities`]'s alone; a demoted thread's nice is a floor it respects.)

/// Nice value of the threads of a job that breached its CPU limit.
pub const DEMOTED_NICE: i32 = 15;

/// Lowers the calling thread's priority to `nice` (Linux: nice is per thread).
pub fn demote_current_thread(nice: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread's own id; no memory is shared with them.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}
