//! Termination of jobs with loops. End of stream cannot simply flow around a loop (the head
//! would wait for its own end), so the job counts records: every subtask adds the record
//! copies it pushes towards channels and then the records it consumed.
//!
//! Invariant: a subtask counts its output before the input that caused it, so produced ==
//! consumed only when no record is queued, buffered or being processed anywhere. Once every
//! source has finished and the counts are equal, nothing can create a record any more: loop
//! heads may end the loop's edges.
//!
//! On a cluster each worker counts its own part ([`LoopTermination::distributed`]) and reports
//! its counts; the coordinator decides with [`Waves`] (Mattern's counting in two waves: the
//! totals of two consecutive rounds of reports, each newer than the previous round, are equal,
//! balanced and no source runs — a record in flight between two reports cannot hide in both)
//! and tells every worker, whose loop heads then end their loops.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

/// Shared by every subtask of a job with loops (in one process, or of one worker's part).
#[derive(Debug)]
pub struct LoopTermination {
    produced: AtomicU64,
    consumed: AtomicU64,
    sources_running: AtomicUsize,
    /// On a cluster: set when the coordinator found the whole job quiescent.
    global: Option<AtomicBool>,
}

/// One worker's counts, as it reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopCounts {
    /// Record copies pushed towards channels.
    pub produced: u64,
    /// Records consumed.
    pub consumed: u64,
    /// Source subtasks still running.
    pub sources_running: u64,
}

impl LoopTermination {
    /// A job with `sources` source subtasks, all in this process.
    pub fn new(sources: usize) -> Self {
        LoopTermination {
            produced: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            sources_running: AtomicUsize::new(sources),
            global: None,
        }
    }

    /// One worker's part of a job on a cluster, running `sources` of its source subtasks:
    /// quiescent only once the coordinator says so ([`LoopTermination::declare_quiescent`]).
    pub fn distributed(sources: usize) -> Self {
        LoopTermination { global: Some(AtomicBool::new(false)), ..LoopTermination::new(sources) }
    }

    /// A subtask pushed `produced` record copies, then finished with `consumed` records.
    #[inline]
    pub fn account(&self, produced: u64, consumed: u64) {
        if produced > 0 {
            self.produced.fetch_add(produced, Ordering::SeqCst);
        }
        if consumed > 0 {
            self.consumed.fetch_add(consumed, Ordering::SeqCst);
        }
    }

    /// A source subtask finished.
    pub fn source_finished(&self) {
        self.sources_running.fetch_sub(1, Ordering::SeqCst);
    }

    /// This process's counts (consumed read first: whatever it counts, the output that input
    /// caused is counted in the produced read after it).
    pub fn counts(&self) -> LoopCounts {
        let consumed = self.consumed.load(Ordering::SeqCst);
        let produced = self.produced.load(Ordering::SeqCst);
        let sources_running = self.sources_running.load(Ordering::SeqCst) as u64;
        LoopCounts { produced, consumed, sources_running }
    }

    /// The coordinator found the whole job quiescent.
    pub fn declare_quiescent(&self) {
        if let Some(g) = &self.global {
            g.store(true, Ordering::SeqCst);
        }
    }

    /// No source runs and no record is in flight (on a cluster: anywhere in the job).
    pub fn quiescent(&self) -> bool {
        match &self.global {
            Some(g) => g.load(Ordering::SeqCst),
            None => {
                let c = self.counts();
                c.sources_running == 0 && c.produced == c.consumed
            }
        }
    }
}

/// The coordinator's side on a cluster: probes all members in waves and compares what they
/// report. A pure state machine.
///
/// Each wave's probe goes out only after every report of the previous wave arrived, so every
/// count of a wave is taken after every count of the one before. Two consecutive waves with
/// equal totals mean no member's counts moved between its two reports (they only grow), so
/// at any moment between the waves every count was as reported: if they balance and no
/// source runs, nothing is in flight anywhere and nothing can start again.
#[derive(Debug)]
pub struct Waves {
    members: Vec<u64>,
    wave: u64,
    current: BTreeMap<u64, LoopCounts>,
    previous: Option<LoopCounts>,
    done: bool,
}

/// What a report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaveStep {
    /// The wave waits for other members (or the report was stale).
    Pending,
    /// The wave closed without a verdict; probe again (soon if no source runs).
    Closed {
        /// Sources still running in the job.
        sources_running: u64,
    },
    /// The job is quiescent: tell every member (reported once).
    Quiescent,
}

impl Waves {
    /// For an attempt over `members` (worker ids).
    pub fn new(members: Vec<u64>) -> Self {
        Waves { members, wave: 0, current: BTreeMap::new(), previous: None, done: false }
    }

    /// Starts the next wave; its number, to send in the probe.
    pub fn probe(&mut self) -> u64 {
        self.wave += 1;
        self.current.clear();
        self.wave
    }

    /// Member `member` answered probe `wave` with `counts`.
    pub fn on_report(&mut self, member: u64, wave: u64, counts: LoopCounts) -> WaveStep {
        if self.done || wave != self.wave || !self.members.contains(&member) {
            return WaveStep::Pending;
        }
        self.current.insert(member, counts);
        if self.current.len() < self.members.len() {
            return WaveStep::Pending;
        }
        let mut t = LoopCounts::default();
        for c in std::mem::take(&mut self.current).into_values() {
            t.produced += c.produced;
            t.consumed += c.consumed;
            t.sources_running += c.sources_running;
        }
        let quiet = t.sources_running == 0 && t.produced == t.consumed && self.previous == Some(t);
        self.previous = Some(t);
        if quiet {
            self.done = true;
            return WaveStep::Quiescent;
        }
        WaveStep::Closed { sources_running: t.sources_running }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiescent_only_when_sources_are_done_and_nothing_is_in_flight() {
        let t = LoopTermination::new(1);
        t.account(10, 0);
        t.source_finished();
        assert!(!t.quiescent());
        // A subtask consumes 10 and, in doing so, sends 3 around the loop.
        t.account(3, 10);
        assert!(!t.quiescent());
        t.account(0, 3);
        assert!(t.quiescent());
    }

    #[test]
    fn a_distributed_part_waits_for_the_coordinators_word() {
        let t = LoopTermination::distributed(0);
        assert!(!t.quiescent(), "balanced here, but other workers may hold records");
        t.declare_quiescent();
        assert!(t.quiescent());
        assert_eq!(t.counts(), LoopCounts::default());
    }

    fn c(produced: u64, consumed: u64, sources_running: u64) -> LoopCounts {
        LoopCounts { produced, consumed, sources_running }
    }

    /// One wave: every member's counts for the current probe; the last step.
    fn wave(w: &mut Waves, counts: &[(u64, LoopCounts)]) -> WaveStep {
        let n = w.probe();
        counts.iter().map(|&(m, c)| w.on_report(m, n, c)).last().unwrap()
    }

    #[test]
    fn cluster_loop_waves_need_two_equal_balanced_waves_without_sources() {
        let mut w = Waves::new(vec![1, 2]);
        // A source still runs: never.
        assert_eq!(wave(&mut w, &[(1, c(5, 5, 1)), (2, c(0, 0, 0))]), WaveStep::Closed { sources_running: 1 });
        assert_eq!(wave(&mut w, &[(1, c(5, 5, 1)), (2, c(0, 0, 0))]), WaveStep::Closed { sources_running: 1 });
        // Balanced once: not yet (a record may have crossed between the two reports).
        assert_eq!(wave(&mut w, &[(1, c(9, 9, 0)), (2, c(3, 3, 0))]), WaveStep::Closed { sources_running: 0 });
        // Balanced, and the same totals again: quiescent, once.
        assert_eq!(wave(&mut w, &[(2, c(3, 3, 0)), (1, c(9, 9, 0))]), WaveStep::Quiescent);
        assert_eq!(wave(&mut w, &[(1, c(9, 9, 0)), (2, c(3, 3, 0))]), WaveStep::Pending);
    }

    #[test]
    fn cluster_loop_waves_drop_stale_and_strangers_reports_and_see_records_move() {
        let mut w = Waves::new(vec![1, 2]);
        let n = w.probe();
        assert_eq!(w.on_report(1, n, c(10, 10, 0)), WaveStep::Pending);
        // A report for an older probe, or from a worker not in the attempt, counts for nothing.
        assert_eq!(w.on_report(2, n - 1, c(2, 2, 0)), WaveStep::Pending);
        assert_eq!(w.on_report(3, n, c(2, 2, 0)), WaveStep::Pending);
        // After its report worker 1 sent a record, which worker 2 consumed before its own
        // report, and worker 2 sent one worker 1 has not consumed yet: the totals balance by
        // accident (13 = 13) ...
        assert_eq!(w.on_report(2, n, c(3, 3, 0)), WaveStep::Closed { sources_running: 0 });
        // ... but worker 1's counts moved, so the next wave's totals differ: no verdict.
        assert_eq!(wave(&mut w, &[(1, c(11, 11, 0)), (2, c(3, 3, 0))]), WaveStep::Closed { sources_running: 0 });
        assert_eq!(wave(&mut w, &[(1, c(11, 11, 0)), (2, c(3, 3, 0))]), WaveStep::Quiescent);
    }
}
