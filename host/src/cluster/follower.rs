//! A worker's side of the control protocol, as a pure state machine: which coordinator it
//! follows, when it leaves one, and which attempt's commands it obeys. Time is milliseconds on
//! any monotonic clock; `worker.rs` and the `cluster_sim_` tests are the shells that build,
//! start and cancel the parts it decides on.
//!
//! Invariants: a worker never follows a leader of an older epoch than one it followed (a
//! deposed leader that comes back is left at once); it leaves a coordinator it has not heard
//! from for five of its heartbeats (30 s before the first welcome); at most one attempt is
//! current, and only its commands are obeyed (start once, controls while started, cancel);
//! when a session ends, the current attempt is cancelled before anything else happens (a
//! worker cut off from its coordinator never commits on its own: commits follow `Complete`
//! messages only).

use crate::cluster::protocol::AttemptNo;

/// Silence tolerated before the first welcome.
pub const FIRST_SILENCE_MS: u64 = 30_000;

/// Heartbeats missed before a coordinator is left.
pub const MISSED_HEARTBEATS: u64 = 5;

#[derive(Debug, Clone, Copy)]
struct Session {
    welcomed: bool,
    last_heard: u64,
    silence_ms: u64,
}

/// What to do with a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeployStep {
    /// Cancel this attempt first (if any), then build the new one.
    Build {
        /// The attempt to cancel first.
        cancel: Option<AttemptNo>,
    },
    /// An attempt not newer than the current one: ignore it.
    Stale,
}

/// The worker's protocol state.
#[derive(Debug, Clone, Default)]
pub struct Follower {
    epoch: u64,
    session: Option<Session>,
    current: Option<(AttemptNo, bool)>,
}

impl Follower {
    /// A worker that has followed nobody.
    pub fn new() -> Follower {
        Follower::default()
    }

    /// The newest epoch followed.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The current attempt, if any.
    pub fn current(&self) -> Option<AttemptNo> {
        self.current.map(|(a, _)| a)
    }

    /// Whether the current session was welcomed (its coordinator is followed).
    pub fn following(&self) -> bool {
        self.session.is_some_and(|s| s.welcomed)
    }

    /// A connection to a coordinator opened and the registration was sent.
    pub fn connected(&mut self, now: u64) {
        self.session = Some(Session { welcomed: false, last_heard: now, silence_ms: FIRST_SILENCE_MS });
    }

    /// Anything arrived on the session.
    pub fn heard(&mut self, now: u64) {
        if let Some(s) = &mut self.session {
            s.last_heard = s.last_heard.max(now);
        }
    }

    /// The coordinator welcomed this worker as leader of `epoch`, heartbeating every
    /// `heartbeat_ms`. `Err` (the reason to leave it) if it leads an older epoch than one
    /// followed before.
    pub fn on_welcome(&mut self, epoch: u64, heartbeat_ms: u64, now: u64) -> Result<(), String> {
        if epoch < self.epoch {
            return Err(format!(
                "it leads epoch {epoch}, older than epoch {} this worker followed: it was deposed (or etcd lost \
                 its data, and then this worker must be restarted to follow the new leader)",
                self.epoch
            ));
        }
        self.epoch = epoch;
        self.session =
            Some(Session { welcomed: true, last_heard: now, silence_ms: heartbeat_ms.max(10) * MISSED_HEARTBEATS });
        Ok(())
    }

    /// Whether the session's coordinator has been silent too long at `now` (then leave it).
    pub fn silent(&self, now: u64) -> Option<u64> {
        let s = self.session?;
        (now.saturating_sub(s.last_heard) > s.silence_ms).then_some(s.silence_ms)
    }

    /// The session ended (closed, left or refused); returns the attempt to cancel.
    pub fn disconnected(&mut self) -> Option<AttemptNo> {
        self.session = None;
        self.current.take().map(|(a, _)| a)
    }

    /// A deployment of `attempt` arrived.
    pub fn on_deploy(&mut self, attempt: AttemptNo) -> DeployStep {
        if self.current.is_some_and(|(a, _)| a >= attempt) {
            return DeployStep::Stale;
        }
        let cancel = self.current.map(|(a, _)| a);
        self.current = Some((attempt, false));
        DeployStep::Build { cancel }
    }

    /// Building the deployed part failed: nothing is current.
    pub fn deploy_failed(&mut self, attempt: AttemptNo) {
        if self.current() == Some(attempt) {
            self.current = None;
        }
    }

    /// `Start(attempt)` arrived: `true` if the prepared part is to be started now.
    pub fn on_start(&mut self, attempt: AttemptNo) -> bool {
        match &mut self.current {
            Some((a, started)) if *a == attempt && !*started => {
                *started = true;
                true
            }
            _ => false,
        }
    }

    /// Whether a control message (trigger, complete, abort, …) of `attempt` is obeyed.
    pub fn obeys(&self, attempt: AttemptNo) -> bool {
        self.current == Some((attempt, true))
    }

    /// `Cancel(attempt)` arrived: `true` if the current attempt is to be cancelled.
    pub fn on_cancel(&mut self, attempt: AttemptNo) -> bool {
        if self.current() == Some(attempt) {
            self.current = None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_follower_leaves_a_deposed_leader_and_a_silent_one() {
        let mut f = Follower::new();
        f.connected(0);
        assert_eq!(f.silent(FIRST_SILENCE_MS), None);
        assert!(f.silent(FIRST_SILENCE_MS + 1).is_some(), "never welcomed");
        f.on_welcome(5, 100, 10).unwrap();
        assert!(f.following());
        f.heard(400);
        assert_eq!(f.silent(900), None);
        assert_eq!(f.silent(901), Some(500));
        f.disconnected();
        f.connected(1000);
        let why = f.on_welcome(4, 100, 1000).unwrap_err();
        assert!(why.contains("epoch 4") && why.contains("deposed"), "{why}");
        assert_eq!(f.epoch(), 5);
        f.on_welcome(5, 100, 1000).unwrap();
    }

    #[test]
    fn cluster_follower_obeys_only_the_current_started_attempt() {
        let mut f = Follower::new();
        f.connected(0);
        f.on_welcome(1, 100, 0).unwrap();
        assert_eq!(f.on_deploy(3), DeployStep::Build { cancel: None });
        assert!(!f.obeys(3), "not started");
        assert!(!f.on_start(2));
        assert!(f.on_start(3));
        assert!(!f.on_start(3), "started once");
        assert!(f.obeys(3) && !f.obeys(2));
        assert_eq!(f.on_deploy(3), DeployStep::Stale);
        assert_eq!(f.on_deploy(4), DeployStep::Build { cancel: Some(3) });
        assert!(!f.obeys(3), "replaced");
        assert!(!f.on_cancel(3));
        assert!(f.on_cancel(4));
        assert_eq!(f.current(), None);
    }

    #[test]
    fn cluster_follower_cut_off_cancels_the_current_attempt() {
        let mut f = Follower::new();
        f.connected(0);
        f.on_welcome(1, 100, 0).unwrap();
        f.on_deploy(7);
        f.on_start(7);
        assert_eq!(f.disconnected(), Some(7));
        assert!(!f.obeys(7));
        assert_eq!(f.disconnected(), None);
    }
}
