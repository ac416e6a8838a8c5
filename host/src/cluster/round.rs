//! One attempt of a job on the cluster, from the coordinator's side, as a pure state machine:
//! deployed to its members, started once every member built its part, cancelled at the first
//! fault, over when every member's part has ended (or a member that does not end its part
//! within the timeout of being cancelled is dropped). A member that has not built its part
//! within the deploy timeout is dropped like a lost one (a worker hung on storage must not
//! hold the job forever). Time is milliseconds on any monotonic
//! clock; `coordinator.rs` and the `cluster_sim_` tests are the shells that carry out its
//! actions.
//!
//! Invariants: `Start` is sent only after every member reported ready, and never after a
//! fault; `Cancel` at most once; nothing from a non-member or of another attempt counts; the
//! round is over exactly once, and only when every member has ended (or was dropped), so the
//! next attempt is never deployed next to a still-running part of this one (except a dropped
//! member's, which the next attempt's number fences).

use std::collections::BTreeSet;

use crate::cluster::protocol::AttemptNo;

/// What went wrong on a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault<F> {
    /// The member was lost (connection closed, heartbeats stopped, or it did not end its part
    /// when cancelled).
    Lost(u64),
    /// The member reported a failure.
    Reported(u64, F),
}

/// What the shell does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<F> {
    /// Tell every member to start its part.
    Start,
    /// Tell every member to cancel its part.
    Cancel,
    /// Close the connection of this member (it did not end its part when cancelled).
    Drop(u64),
    /// The attempt is over.
    Over(Outcome<F>),
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<F> {
    /// Every part ended; the faults, if any, decide whether the job restarts.
    Ended(Vec<Fault<F>>),
    /// A member could not build its part for a reason a restart does not cure.
    Setup(u64, F),
}

/// The round's state.
#[derive(Debug)]
pub struct Round<F> {
    attempt: AttemptNo,
    members: Vec<u64>,
    cancel_timeout_ms: u64,
    deploy_deadline: Option<u64>,
    ready: BTreeSet<u64>,
    started: bool,
    ended: BTreeSet<u64>,
    faults: Vec<Fault<F>>,
    cancelled_at: Option<u64>,
    over: bool,
}

impl<F> Round<F> {
    /// Attempt `attempt`, deployed to `members`; a cancelled member that has not ended its part
    /// `cancel_timeout_ms` later is dropped.
    pub fn new(attempt: AttemptNo, members: Vec<u64>, cancel_timeout_ms: u64) -> Round<F> {
        Round {
            attempt,
            members,
            cancel_timeout_ms,
            deploy_deadline: None,
            ready: BTreeSet::new(),
            started: false,
            ended: BTreeSet::new(),
            faults: Vec::new(),
            cancelled_at: None,
            over: false,
        }
    }

    /// Members that have not built their part by `deadline` are dropped at the next tick.
    pub fn with_deploy_deadline(mut self, deadline: u64) -> Round<F> {
        self.deploy_deadline = Some(deadline);
        self
    }

    /// The attempt number.
    pub fn attempt(&self) -> AttemptNo {
        self.attempt
    }

    /// The members.
    pub fn members(&self) -> &[u64] {
        &self.members
    }

    /// Whether the round is over.
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// Whether the parts have been started.
    pub fn is_started(&self) -> bool {
        self.started
    }

    fn live(&self, id: u64, attempt: AttemptNo) -> bool {
        !self.over && attempt == self.attempt && self.members.contains(&id) && !self.ended.contains(&id)
    }

    /// Whether a checkpoint event of `attempt` from `id` counts: the round runs and `id` is a
    /// member whose part has not ended.
    pub fn counts_event(&self, id: u64, attempt: AttemptNo) -> bool {
        self.started && self.live(id, attempt)
    }

    /// Member `id` built its part of `attempt`.
    pub fn on_ready(&mut self, id: u64, attempt: AttemptNo) -> Vec<Action<F>> {
        if self.started || !self.live(id, attempt) {
            return Vec::new();
        }
        self.ready.insert(id);
        if self.ready.len() == self.members.len() {
            self.started = true;
            return vec![Action::Start];
        }
        Vec::new()
    }

    /// Member `id` could not build its part; `setup` if a restart would not cure it.
    pub fn on_deploy_failed(&mut self, id: u64, attempt: AttemptNo, fault: F, setup: bool, now: u64) -> Vec<Action<F>> {
        if self.started || !self.live(id, attempt) {
            return Vec::new();
        }
        if setup {
            self.over = true;
            return vec![Action::Cancel, Action::Over(Outcome::Setup(id, fault))];
        }
        self.ended.insert(id);
        self.fault(Fault::Reported(id, fault), now)
    }

    /// Member `id` was lost.
    pub fn on_lost(&mut self, id: u64, now: u64) -> Vec<Action<F>> {
        if self.over || !self.members.contains(&id) || self.ended.contains(&id) {
            return Vec::new();
        }
        self.ended.insert(id);
        self.fault(Fault::Lost(id), now)
    }

    /// Member `id`'s part of `attempt` ended with `faults`.
    pub fn on_part_ended(&mut self, id: u64, attempt: AttemptNo, faults: Vec<F>, now: u64) -> Vec<Action<F>> {
        if !self.started || !self.live(id, attempt) {
            return Vec::new();
        }
        self.ended.insert(id);
        let mut out = Vec::new();
        let had = faults.len();
        self.faults.extend(faults.into_iter().map(|f| Fault::Reported(id, f)));
        if had > 0 {
            out.extend(self.cancel(now));
        }
        out.extend(self.finish_if_all_ended());
        out
    }

    /// The job's user cancelled it: every member is told to cancel its part (once); the
    /// round is over when all have ended, as after a fault.
    pub fn on_cancel_requested(&mut self, now: u64) -> Vec<Action<F>> {
        if self.over {
            return Vec::new();
        }
        self.end_all(now)
    }

    /// Time passed: drops members that did not build their part by the deploy deadline, or
    /// did not end it in time after a cancel.
    pub fn on_tick(&mut self, now: u64) -> Vec<Action<F>> {
        if !self.started && !self.over && self.deploy_deadline.is_some_and(|d| now > d) {
            // Every late member at once: the next attempt must not meet them again one by one.
            let late: Vec<u64> = self.members.iter().copied().filter(|id| !self.ready.contains(id)).collect();
            self.ended.extend(late.iter().copied());
            self.faults.extend(late.iter().map(|&id| Fault::Lost(id)));
            let mut out: Vec<Action<F>> = late.into_iter().map(Action::Drop).collect();
            self.over = true;
            out.push(Action::Cancel);
            out.push(Action::Over(Outcome::Ended(std::mem::take(&mut self.faults))));
            return out;
        }
        let Some(at) = self.cancelled_at else { return Vec::new() };
        if self.over || now.saturating_sub(at) <= self.cancel_timeout_ms {
            return Vec::new();
        }
        let stuck: Vec<u64> = self.members.iter().copied().filter(|id| !self.ended.contains(id)).collect();
        let mut out = Vec::new();
        for id in stuck {
            self.ended.insert(id);
            self.faults.push(Fault::Lost(id));
            out.push(Action::Drop(id));
        }
        out.extend(self.finish_if_all_ended());
        out
    }

    fn fault(&mut self, f: Fault<F>, now: u64) -> Vec<Action<F>> {
        self.faults.push(f);
        self.end_all(now)
    }

    /// Every member cancels its part; over at once if none started.
    fn end_all(&mut self, now: u64) -> Vec<Action<F>> {
        if !self.started {
            // Nothing ran yet: the others' parts are only built; cancelling them is enough.
            self.over = true;
            let faults = std::mem::take(&mut self.faults);
            return vec![Action::Cancel, Action::Over(Outcome::Ended(faults))];
        }
        let mut out = self.cancel(now);
        out.extend(self.finish_if_all_ended());
        out
    }

    fn cancel(&mut self, now: u64) -> Vec<Action<F>> {
        if self.cancelled_at.is_some() {
            return Vec::new();
        }
        self.cancelled_at = Some(now);
        vec![Action::Cancel]
    }

    fn finish_if_all_ended(&mut self) -> Vec<Action<F>> {
        if self.over || self.ended.len() < self.members.len() {
            return Vec::new();
        }
        self.over = true;
        vec![Action::Over(Outcome::Ended(std::mem::take(&mut self.faults)))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type R = Round<&'static str>;

    #[test]
    fn cluster_round_a_users_cancel_is_sent_once_and_over_when_every_part_ended() {
        let mut r = R::new(7, vec![1, 2], 100);
        r.on_ready(1, 7);
        r.on_ready(2, 7);
        assert_eq!(r.on_cancel_requested(10), vec![Action::Cancel]);
        assert!(r.on_cancel_requested(11).is_empty(), "cancel is sent once");
        assert!(r.on_part_ended(1, 7, vec![], 12).is_empty());
        assert_eq!(r.on_part_ended(2, 7, vec![], 13), vec![Action::Over(Outcome::Ended(vec![]))]);
        assert!(r.on_cancel_requested(14).is_empty() && r.is_over());
        // Before the start: over at once.
        let mut r = R::new(8, vec![1], 100);
        assert_eq!(r.on_cancel_requested(1), vec![Action::Cancel, Action::Over(Outcome::Ended(vec![]))]);
    }

    #[test]
    fn cluster_round_starts_only_when_every_member_is_ready_and_ignores_strangers() {
        let mut r = R::new(7, vec![1, 2], 100);
        assert!(r.on_ready(1, 7).is_empty());
        assert!(r.on_ready(3, 7).is_empty(), "not a member");
        assert!(r.on_ready(2, 6).is_empty(), "another attempt");
        assert!(!r.counts_event(1, 7), "not started yet");
        assert_eq!(r.on_ready(2, 7), vec![Action::Start]);
        assert!(r.on_ready(2, 7).is_empty(), "started once");
        assert!(r.counts_event(1, 7) && !r.counts_event(1, 6) && !r.counts_event(3, 7));
        assert!(r.on_part_ended(1, 7, vec![], 5).is_empty());
        assert!(!r.counts_event(1, 7), "its part ended");
        assert_eq!(r.on_part_ended(2, 7, vec![], 6), vec![Action::Over(Outcome::Ended(vec![]))]);
        assert!(r.on_lost(2, 7).is_empty(), "over once");
    }

    #[test]
    fn cluster_round_a_fault_before_start_cancels_at_once_and_never_starts() {
        let mut r = R::new(1, vec![1, 2, 3], 100);
        r.on_ready(1, 1);
        let out = r.on_lost(2, 0);
        assert_eq!(out, vec![Action::Cancel, Action::Over(Outcome::Ended(vec![Fault::Lost(2)]))]);
        assert!(r.on_ready(3, 1).is_empty());
        let mut r = R::new(1, vec![1, 2], 100);
        let out = r.on_deploy_failed(2, 1, "bad component", true, 0);
        assert_eq!(out, vec![Action::Cancel, Action::Over(Outcome::Setup(2, "bad component"))]);
    }

    #[test]
    fn cluster_round_a_fault_while_running_cancels_once_and_waits_for_every_end() {
        let mut r = R::new(1, vec![1, 2, 3], 100);
        for id in 1..=3 {
            r.on_ready(id, 1);
        }
        assert_eq!(r.on_part_ended(1, 1, vec!["boom"], 10), vec![Action::Cancel]);
        assert!(r.on_lost(2, 20).is_empty(), "cancelled once");
        assert!(r.on_tick(110).is_empty(), "3 still within the timeout");
        let out = r.on_part_ended(3, 1, vec![], 50);
        assert_eq!(out, vec![Action::Over(Outcome::Ended(vec![Fault::Reported(1, "boom"), Fault::Lost(2)]))]);
    }

    #[test]
    fn cluster_round_members_that_never_build_their_part_are_all_dropped_at_the_deploy_deadline() {
        let mut r = R::new(1, vec![1, 2, 3], 100).with_deploy_deadline(50);
        r.on_ready(1, 1);
        assert!(r.on_tick(50).is_empty(), "the deadline itself is still in time");
        let out = r.on_tick(51);
        let over = Action::Over(Outcome::Ended(vec![Fault::Lost(2), Fault::Lost(3)]));
        assert_eq!(out, vec![Action::Drop(2), Action::Drop(3), Action::Cancel, over]);
        assert!(r.on_tick(52).is_empty() && r.on_ready(2, 1).is_empty(), "over once");
        let mut r = R::new(1, vec![1], 100).with_deploy_deadline(50);
        r.on_ready(1, 1);
        assert!(r.on_tick(500).is_empty(), "started: the deploy deadline no longer applies");
    }

    #[test]
    fn cluster_round_ignores_ends_and_losses_of_strangers_and_other_attempts() {
        let mut r = R::new(4, vec![1, 2], 100);
        r.on_ready(1, 4);
        r.on_ready(2, 4);
        assert!(r.on_lost(9, 0).is_empty(), "not a member");
        assert!(r.on_part_ended(1, 3, vec!["old"], 0).is_empty(), "another attempt");
        assert!(r.on_part_ended(9, 4, vec!["x"], 0).is_empty());
        assert!(r.on_deploy_failed(1, 4, "late", true, 0).is_empty(), "a setup failure after the start counts not");
        assert_eq!(r.on_part_ended(1, 4, vec![], 1), vec![]);
        assert!(!r.is_over());
    }

    #[test]
    fn cluster_round_a_member_that_ignores_the_cancel_is_dropped_after_the_timeout() {
        let mut r = R::new(1, vec![1, 2], 100);
        r.on_ready(1, 1);
        r.on_ready(2, 1);
        assert_eq!(r.on_lost(1, 10), vec![Action::Cancel]);
        assert!(r.on_tick(110).is_empty());
        let out = r.on_tick(111);
        assert_eq!(out, vec![Action::Drop(2), Action::Over(Outcome::Ended(vec![Fault::Lost(1), Fault::Lost(2)]))]);
        assert!(r.is_over());
        assert!(r.on_part_ended(2, 1, vec![], 200).is_empty(), "too late: already dropped");
    }
}
