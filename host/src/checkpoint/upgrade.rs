//! A live upgrade's commit protocol, as a pure state machine: every subtask of the operator
//! restores its barrier state into the new component and reports; only if all succeeded do
//! they all switch, otherwise all keep the old instance (which the snapshot did not change).
//!
//! Invariants: the decision is taken once, after every subtask reported or the checkpoint
//! was aborted (an abort before the decision is a rollback); it is `commit` only if every
//! subtask prepared successfully; the round ends when every subtask resumed.

use std::collections::{BTreeMap, BTreeSet};

/// The decision, to send to every subtask of the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Switch to the new instance.
    pub commit: bool,
    /// Why not: (task, reason) of every subtask that failed.
    pub failures: Vec<(usize, String)>,
}

/// How the round ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The new version runs.
    pub committed: bool,
    /// Longest pause of a subtask (barrier to resumed), ms.
    pub pause_ms_max: f64,
    /// Every subtask that resumed did what the decision said (a violation is a bug).
    pub consistent: bool,
}

/// One upgrade round.
#[derive(Debug)]
pub struct UpgradeRound {
    tasks: BTreeSet<usize>,
    prepared: BTreeMap<usize, Result<(), String>>,
    decision: Option<Decision>,
    resumed: BTreeMap<usize, (bool, f64)>,
}

impl UpgradeRound {
    /// A round over the operator's subtasks (global task indices).
    pub fn new(tasks: impl IntoIterator<Item = usize>) -> Self {
        UpgradeRound {
            tasks: tasks.into_iter().collect(),
            prepared: BTreeMap::new(),
            decision: None,
            resumed: BTreeMap::new(),
        }
    }

    /// The decision, once taken.
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }

    /// Subtask `task` prepared (or failed to). Returns the decision when this report
    /// completes it.
    pub fn on_prepared(&mut self, task: usize, result: Result<(), String>) -> Option<Decision> {
        if self.decision.is_some() || !self.tasks.contains(&task) {
            return None;
        }
        self.prepared.insert(task, result);
        if self.prepared.len() < self.tasks.len() {
            return None;
        }
        let failures: Vec<(usize, String)> =
            self.prepared.iter().filter_map(|(t, r)| r.as_ref().err().map(|e| (*t, e.clone()))).collect();
        let d = Decision { commit: failures.is_empty(), failures };
        self.decision = Some(d.clone());
        Some(d)
    }

    /// The checkpoint carrying the upgrade was aborted (or completed without every report):
    /// roll back unless already decided. Returns the decision if this took it.
    pub fn on_abort(&mut self, reason: &str) -> Option<Decision> {
        if self.decision.is_some() {
            return None;
        }
        let mut failures: Vec<(usize, String)> =
            self.prepared.iter().filter_map(|(t, r)| r.as_ref().err().map(|e| (*t, e.clone()))).collect();
        failures.push((usize::MAX, reason.to_string()));
        let d = Decision { commit: false, failures };
        self.decision = Some(d.clone());
        Some(d)
    }

    /// Subtask `task` resumed (on the new instance if `committed`) after pausing
    /// `pause_ms`. Returns the outcome once the round is over.
    pub fn on_resumed(&mut self, task: usize, committed: bool, pause_ms: f64) -> Option<Outcome> {
        if self.decision.is_none() || !self.prepared.contains_key(&task) {
            return None;
        }
        self.resumed.insert(task, (committed, pause_ms));
        self.outcome()
    }

    /// The outcome, once decided and every subtask that prepared resumed (subtasks that never
    /// prepared — e.g. the checkpoint was aborted before they got there — never pause).
    pub fn outcome(&self) -> Option<Outcome> {
        let d = self.decision.as_ref()?;
        (self.resumed.len() == self.prepared.len()).then(|| Outcome {
            committed: d.commit,
            pause_ms_max: self.resumed.values().map(|r| r.1).fold(0.0, f64::max),
            consistent: self.resumed.values().all(|r| r.0 == d.commit),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_only_when_every_subtask_prepared() {
        let mut r = UpgradeRound::new([3, 4]);
        assert_eq!(r.on_prepared(3, Ok(())), None);
        assert_eq!(r.on_prepared(9, Ok(())), None, "not a subtask of the operator");
        assert_eq!(r.on_prepared(4, Ok(())), Some(Decision { commit: true, failures: vec![] }));
        assert_eq!(r.on_abort("late"), None, "decided already");
        assert_eq!(r.on_resumed(3, true, 2.0), None);
        assert_eq!(r.on_resumed(4, true, 5.0), Some(Outcome { committed: true, pause_ms_max: 5.0, consistent: true }));
    }

    #[test]
    fn one_failure_rolls_every_subtask_back() {
        let mut r = UpgradeRound::new([0, 1, 2]);
        r.on_prepared(0, Ok(()));
        r.on_prepared(1, Err("trap in restore".into()));
        let d = r.on_prepared(2, Ok(())).unwrap();
        assert!(!d.commit);
        assert_eq!(d.failures, vec![(1, "trap in restore".to_string())]);
    }

    #[test]
    fn an_abort_before_the_decision_rolls_back() {
        let mut r = UpgradeRound::new([0, 1]);
        r.on_prepared(0, Ok(()));
        let d = r.on_abort("checkpoint 7 timed out").unwrap();
        assert!(!d.commit);
        assert_eq!(r.on_prepared(1, Ok(())), None);
        assert_eq!(r.on_resumed(1, false, 1.0), None, "reported after the decision: not part of the round");
        assert_eq!(
            r.on_resumed(0, false, 1.0),
            Some(Outcome { committed: false, pause_ms_max: 1.0, consistent: true })
        );
    }

    #[test]
    fn an_abort_before_anyone_prepared_ends_the_round_at_once() {
        let mut r = UpgradeRound::new([0, 1]);
        assert!(r.outcome().is_none());
        r.on_abort("checkpoint 3 was declined");
        assert_eq!(r.outcome(), Some(Outcome { committed: false, pause_ms_max: 0.0, consistent: true }));
    }

    #[test]
    fn a_subtask_that_did_not_follow_the_decision_is_reported() {
        let mut r = UpgradeRound::new([0]);
        r.on_prepared(0, Ok(()));
        assert!(!r.on_resumed(0, false, 1.0).unwrap().consistent);
    }
}
