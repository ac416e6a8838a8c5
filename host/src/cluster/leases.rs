//! Which job holds which worker, on a coordinator that runs several jobs over one pool of
//! workers, and which job an attempt number belongs to (so a worker's message reaches the
//! job whose attempt it is about).
//!
//! Invariants: a worker is held by at most one job at a time (a worker runs one attempt at a
//! time, `worker.rs`); a job's placement takes only workers that are free or already its own,
//! and the attempt number it gets is drawn in the same step, after every earlier holder of
//! those workers drew theirs — so the attempt numbers a worker is sent only rise, across jobs
//! too, and its fence against older attempts holds; attempt numbers are unique across jobs;
//! only a job's newest attempt is routed (messages of its older ones are dropped, as a
//! round drops them); a lost worker is held by nobody. Pure: no I/O.

use std::collections::BTreeMap;

use crate::cluster::protocol::AttemptNo;

/// A job on the coordinator (numbered as it joins; not its name, which a later run of the
/// same job file reuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobKey(pub u64);

/// The coordinator's leases of workers to jobs.
#[derive(Debug)]
pub struct Leases {
    holder: BTreeMap<u64, JobKey>,
    /// The newest attempt of each job that was placed.
    current: BTreeMap<JobKey, AttemptNo>,
    next_attempt: AttemptNo,
}

impl Leases {
    /// No worker held; attempt numbers start at `first` ([`crate::cluster::protocol::attempt_base`]).
    pub fn new(first: AttemptNo) -> Leases {
        Leases { holder: BTreeMap::new(), current: BTreeMap::new(), next_attempt: first }
    }

    /// Of `workers`, those `job` may place into: free, or held by it.
    pub fn open_to(&self, job: JobKey, workers: &[u64]) -> Vec<u64> {
        workers.iter().copied().filter(|w| self.holder.get(w).is_none_or(|&h| h == job)).collect()
    }

    /// `job` places its next attempt on `used` (each free or its own): it holds exactly those
    /// from now on (the rest of what it held is free again). Returns the attempt's number.
    pub fn take(&mut self, job: JobKey, used: &[u64]) -> AttemptNo {
        debug_assert!(used.iter().all(|w| self.holder.get(w).is_none_or(|&h| h == job)));
        self.holder.retain(|_, h| *h != job);
        for &w in used {
            self.holder.insert(w, job);
        }
        let attempt = self.next_attempt;
        self.next_attempt += 1;
        self.current.insert(job, attempt);
        attempt
    }

    /// The job whose newest attempt is `attempt`, if any.
    pub fn job_of(&self, attempt: AttemptNo) -> Option<JobKey> {
        self.current.iter().find(|&(_, &a)| a == attempt).map(|(&j, _)| j)
    }

    /// Who holds worker `w`.
    pub fn holder(&self, w: u64) -> Option<JobKey> {
        self.holder.get(&w).copied()
    }

    /// Worker `w` is gone: nobody holds it.
    pub fn lost(&mut self, w: u64) {
        self.holder.remove(&w);
    }

    /// `job`'s attempt is over and it could not place the next one: its workers are free for
    /// other jobs meanwhile (its newest attempt stays routed; its round drops what comes).
    pub fn idle(&mut self, job: JobKey) {
        self.holder.retain(|_, h| *h != job);
    }

    /// The workers `job` holds, and its newest attempt.
    pub fn held_by(&self, job: JobKey) -> (Vec<u64>, Option<AttemptNo>) {
        let held = self.holder.iter().filter(|&(_, &h)| h == job).map(|(&w, _)| w).collect();
        (held, self.current.get(&job).copied())
    }

    /// `job` is over: its workers are free, its attempts no longer routed.
    pub fn release(&mut self, job: JobKey) {
        self.holder.retain(|_, h| *h != job);
        self.current.remove(&job);
    }

    /// Workers held by some job.
    pub fn held(&self) -> usize {
        self.holder.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const J1: JobKey = JobKey(1);
    const J2: JobKey = JobKey(2);
    const J7: JobKey = JobKey(7);
    const J8: JobKey = JobKey(8);

    #[test]
    fn cluster_leases_a_worker_serves_one_job_and_attempts_rise_across_jobs() {
        let mut l = Leases::new(10);
        let all = [1, 2, 3];
        assert_eq!(l.open_to(J7, &all), vec![1, 2, 3]);
        let a = l.take(J7, &[1, 2]);
        assert_eq!(a, 10);
        // Job 8 sees only the free worker; job 7 still sees its own.
        assert_eq!(l.open_to(J8, &all), vec![3]);
        assert_eq!(l.open_to(J7, &all), vec![1, 2, 3]);
        let b = l.take(J8, &[3]);
        assert!(b > a);
        assert_eq!((l.job_of(a), l.job_of(b)), (Some(J7), Some(J8)));
        // Job 7 restarts on worker 1 alone: worker 2 is free again, its older attempt unrouted.
        let a2 = l.take(J7, &[1]);
        assert!(a2 > b);
        assert_eq!((l.job_of(a), l.job_of(a2)), (None, Some(J7)));
        assert_eq!(l.open_to(J8, &all), vec![2, 3]);
        // Job 8 moves onto worker 2: the number it is sent there outranks job 7's there.
        let b2 = l.take(J8, &[2, 3]);
        assert!(b2 > a);
        assert_eq!((l.holder(2), l.holder(1)), (Some(J8), Some(J7)));
    }

    #[test]
    fn cluster_leases_a_lost_worker_or_an_ended_job_frees_what_it_held() {
        let mut l = Leases::new(1);
        let a = l.take(J1, &[1, 2]);
        l.lost(2);
        assert_eq!(l.holder(2), None);
        assert_eq!(l.open_to(J2, &[1, 2]), vec![2]);
        l.release(J1);
        assert_eq!((l.held(), l.job_of(a)), (0, None));
        assert_eq!(l.open_to(J2, &[1, 2]), vec![1, 2]);
    }

    #[test]
    fn cluster_leases_a_job_short_of_workers_lends_its_own_to_the_others() {
        // Two jobs each lost a worker and neither can place again on what it holds: the one that
        // gives up its workers while it waits lets the other place.
        let mut l = Leases::new(1);
        let a = l.take(J1, &[1, 2]);
        l.take(J2, &[3, 4]);
        l.lost(2);
        l.lost(4);
        assert_eq!(l.held_by(J1), (vec![1], Some(a)));
        l.idle(J1);
        assert_eq!(l.held_by(J1), (vec![], Some(a)));
        assert_eq!(l.job_of(a), Some(J1));
        assert_eq!(l.open_to(J2, &[1, 3]), vec![1, 3]);
        let b = l.take(J2, &[1, 3]);
        assert_eq!((l.holder(1), l.holder(3), l.open_to(J1, &[1, 3])), (Some(J2), Some(J2), vec![]));
        assert!(b > a);
    }
}
