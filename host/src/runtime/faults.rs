//! Seeded failure injection, for proving exactly-once: a plan says, per attempt of a run,
//! which subtask fails how and when (after how many records and completed checkpoints).
//! Every failure replays from its seed.
//!
//! Invariant: a planned fault fires on events the test controls, never on how fast the machine
//! is. The sources of an attempt hold back their end of input while a fault planned for that
//! attempt has not fired ([`FaultPlan::holds_input`]); once one holds, the record condition counts
//! as met (the input is exhausted) and checkpoints keep completing, so every fault that fires on a
//! record, at idle or at a barrier comes due before the job can end. A `WhileLogging` fault
//! fires on a record logged while a loop head's (or an unaligned checkpoint's) log is open, and
//! once the input is held — records may stop circulating then — also when such a log opens.

use std::sync::Mutex;

use crate::connectors::generator::splitmix64;

/// How a subtask fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The guest is sent a record it panics on (test guests trap on the value `panic`): a
    /// real wasm trap, which poisons the instance.
    GuestTrap,
    /// The host thread panics (a host bug).
    HostPanic,
    /// Fails at the next aligned barrier, after the snapshot is handed to the writer and
    /// before the barrier is forwarded: a checkpoint is in flight and can never complete.
    DuringCheckpoint,
    /// A loop head fails while its back-edge log for a checkpoint is open (after its state
    /// copy, before the barrier has come back round the loop).
    WhileLogging,
    /// Not a failure: while its snapshot is handed out in chunks, the subtask declines the
    /// checkpoint and waits until the abort that follows has arrived (so the abort lands in
    /// the middle of the drain, whatever the machine's speed).
    DeclineWhileDraining,
}

/// One planned failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Which attempt of the run (0 = first).
    pub attempt: u32,
    /// Node uid.
    pub node: String,
    /// Subtask.
    pub subtask: u32,
    /// Records the subtask must have processed first.
    pub after_records: u64,
    /// Checkpoints that must have completed first.
    pub after_checkpoints: u64,
    /// How.
    pub kind: FaultKind,
}

/// A failure plan.
#[derive(Debug, Default)]
pub struct FaultPlan {
    faults: Vec<Fault>,
    fired: Mutex<Vec<bool>>,
    /// Attempts in which a source holds back its end of input.
    held: Mutex<Vec<u32>>,
}

impl FaultPlan {
    /// A plan of explicit faults.
    pub fn new(faults: Vec<Fault>) -> Self {
        let fired = Mutex::new(vec![false; faults.len()]);
        FaultPlan { faults, fired, held: Mutex::new(Vec::new()) }
    }

    /// Whether a source of `attempt` must hold back its end of input: a fault planned for that
    /// attempt, of a kind that can fire without more input, has not fired yet. Asking marks the
    /// attempt's input as exhausted, which meets every record condition of its faults.
    pub fn holds_input(&self, attempt: u32) -> bool {
        let fired = self.fired.lock().unwrap();
        let pending = self.faults.iter().zip(fired.iter()).any(|(f, d)| !*d && f.attempt == attempt);
        if pending {
            let mut held = self.held.lock().unwrap();
            if !held.contains(&attempt) {
                held.push(attempt);
            }
        }
        pending
    }

    /// Whether the sources of `attempt` hold back their end of input for a fault.
    pub fn is_held(&self, attempt: u32) -> bool {
        self.held.lock().unwrap().contains(&attempt)
    }

    fn records_met(&self, f: &Fault, records: u64) -> bool {
        records >= f.after_records || self.held.lock().unwrap().contains(&f.attempt)
    }

    /// `failures` faults (one per attempt 0..failures), each in a subtask drawn from
    /// `targets` (node uid, parallelism), after up to `max_records` records and up to
    /// `max_checkpoints` completed checkpoints, of a kind drawn from `kinds`.
    pub fn seeded(
        seed: u64,
        failures: u32,
        targets: &[(&str, u32)],
        max_records: u64,
        max_checkpoints: u64,
        kinds: &[FaultKind],
    ) -> Self {
        let mut s = splitmix64(seed);
        let mut next = |n: u64| {
            s = splitmix64(s);
            if n == 0 { 0 } else { s % n }
        };
        let faults = (0..failures)
            .map(|attempt| {
                let (node, p) = targets[next(targets.len() as u64) as usize];
                Fault {
                    attempt,
                    node: node.to_string(),
                    subtask: next(p as u64) as u32,
                    after_records: next(max_records + 1),
                    after_checkpoints: next(max_checkpoints + 1),
                    kind: kinds[next(kinds.len() as u64) as usize],
                }
            })
            .collect();
        Self::new(faults)
    }

    /// The planned faults.
    pub fn faults(&self) -> &[Fault] {
        &self.faults
    }

    /// The fault (other than `DuringCheckpoint`) due now for this subtask, fired once.
    pub fn due(&self, attempt: u32, node: &str, subtask: u32, records: u64, checkpoints: u64) -> Option<FaultKind> {
        self.take(attempt, node, subtask, |f| {
            matches!(f.kind, FaultKind::GuestTrap | FaultKind::HostPanic)
                && self.records_met(f, records)
                && checkpoints >= f.after_checkpoints
        })
    }

    /// Whether to fail at this aligned barrier.
    pub fn due_at_barrier(&self, attempt: u32, node: &str, subtask: u32, records: u64, checkpoints: u64) -> bool {
        self.take(attempt, node, subtask, |f| {
            f.kind == FaultKind::DuringCheckpoint && self.records_met(f, records) && checkpoints >= f.after_checkpoints
        })
        .is_some()
    }

    /// Whether to fail now, while logging back-edge records.
    pub fn due_while_logging(&self, attempt: u32, node: &str, subtask: u32, records: u64, checkpoints: u64) -> bool {
        self.take(attempt, node, subtask, |f| {
            f.kind == FaultKind::WhileLogging && self.records_met(f, records) && checkpoints >= f.after_checkpoints
        })
        .is_some()
    }

    /// Whether to decline the checkpoint being drained now.
    pub fn due_while_draining(&self, attempt: u32, node: &str, subtask: u32, records: u64, checkpoints: u64) -> bool {
        self.take(attempt, node, subtask, |f| {
            f.kind == FaultKind::DeclineWhileDraining
                && self.records_met(f, records)
                && checkpoints >= f.after_checkpoints
        })
        .is_some()
    }

    fn take(&self, attempt: u32, node: &str, subtask: u32, ready: impl Fn(&Fault) -> bool) -> Option<FaultKind> {
        let mut fired = self.fired.lock().unwrap();
        for (i, f) in self.faults.iter().enumerate() {
            if !fired[i] && f.attempt == attempt && f.node == node && f.subtask == subtask && ready(f) {
                fired[i] = true;
                return Some(f.kind);
            }
        }
        None
    }

    /// Faults planned for `attempt` that never fired (the run ended first).
    pub fn unfired(&self, attempt: u32) -> Vec<Fault> {
        let fired = self.fired.lock().unwrap();
        self.faults
            .iter()
            .zip(fired.iter())
            .filter(|(f, d)| f.attempt == attempt && !**d)
            .map(|(f, _)| f.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_plans_replay_and_fire_once() {
        let kinds = [FaultKind::GuestTrap, FaultKind::HostPanic, FaultKind::DuringCheckpoint];
        let a = FaultPlan::seeded(7, 3, &[("op", 2)], 1000, 3, &kinds);
        let b = FaultPlan::seeded(7, 3, &[("op", 2)], 1000, 3, &kinds);
        assert_eq!(a.faults(), b.faults());
        let f = a.faults()[0].clone();
        let fire = |p: &FaultPlan| match f.kind {
            FaultKind::DuringCheckpoint => p.due_at_barrier(0, "op", f.subtask, u64::MAX, u64::MAX),
            _ => p.due(0, "op", f.subtask, u64::MAX, u64::MAX).is_some(),
        };
        assert!(fire(&a));
        assert!(!fire(&a), "fires once");
        assert!(a.due(1, "op", f.subtask, 0, 0).is_none() || a.faults()[1].after_records == 0);
    }

    #[test]
    fn a_held_input_meets_the_record_condition_but_not_the_checkpoint_one() {
        let fault = |kind, after_checkpoints| Fault {
            attempt: 0,
            node: "op".into(),
            subtask: 0,
            after_records: 1_000,
            after_checkpoints,
            kind,
        };
        let p = FaultPlan::new(vec![fault(FaultKind::GuestTrap, 3), fault(FaultKind::WhileLogging, 0)]);
        assert!(p.due(0, "op", 0, 10, 5).is_none(), "too few records, input not held");
        assert!(!p.holds_input(1), "nothing planned for attempt 1");
        assert!(p.holds_input(0), "the trap is pending");
        assert!(p.due(0, "op", 0, 10, 2).is_none(), "held, but too few checkpoints");
        assert_eq!(p.due(0, "op", 0, 10, 3), Some(FaultKind::GuestTrap));
        assert!(p.holds_input(0), "the WhileLogging fault is pending too");
        assert!(p.due_while_logging(0, "op", 0, 10, 0), "held: its record condition is met");
        assert!(!p.holds_input(0), "every fault fired");
    }
}
