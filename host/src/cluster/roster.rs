//! The coordinator's roster of workers, as a pure state machine: who may register, who is a
//! member, who has gone silent. Time comes in as milliseconds on any monotonic clock; the
//! shells (`coordinator.rs` with real connections, the `cluster_sim_` tests with simulated
//! ones) carry out what it decides.
//!
//! Invariants: a worker speaking another protocol or offering no slots is never a member; a
//! member is dropped exactly once, either when its connection closes or when nothing came from
//! it for longer than the heartbeat timeout (everything already received counts first: the
//! shell feeds every queued message before asking who is silent).

use std::collections::BTreeMap;

use crate::cluster::protocol::PROTOCOL_VERSION;

/// Why a registration is refused, in words for the worker's log.
pub fn refusal(protocol: u32, slots: u32) -> Option<String> {
    if protocol != PROTOCOL_VERSION {
        return Some(format!(
            "it speaks protocol {protocol}, this coordinator {PROTOCOL_VERSION}; run the same weir version"
        ));
    }
    if slots == 0 {
        return Some("it offers no slots; start it with --slots 1 or more".into());
    }
    None
}

#[derive(Debug, Clone, Copy)]
struct Member {
    slots: u32,
    last_seen: u64,
}

/// The registered workers, by connection id.
#[derive(Debug, Clone)]
pub struct Roster {
    timeout_ms: u64,
    members: BTreeMap<u64, Member>,
}

impl Roster {
    /// An empty roster; a member silent longer than `timeout_ms` is dropped.
    pub fn new(timeout_ms: u64) -> Roster {
        Roster { timeout_ms, members: BTreeMap::new() }
    }

    /// Admits connection `id` offering `slots`, unless [`refusal`] says no (then its words).
    pub fn register(&mut self, id: u64, protocol: u32, slots: u32, now: u64) -> Result<(), String> {
        if let Some(why) = refusal(protocol, slots) {
            return Err(why);
        }
        self.members.insert(id, Member { slots, last_seen: now });
        Ok(())
    }

    /// Something arrived from `id`; `true` if it is a member.
    pub fn heard(&mut self, id: u64, now: u64) -> bool {
        match self.members.get_mut(&id) {
            Some(m) => {
                m.last_seen = m.last_seen.max(now);
                true
            }
            None => false,
        }
    }

    /// Drops `id` (its connection closed); `true` if it was a member.
    pub fn remove(&mut self, id: u64) -> bool {
        self.members.remove(&id).is_some()
    }

    /// Drops and returns every member silent for longer than the timeout at `now`.
    pub fn silent(&mut self, now: u64) -> Vec<u64> {
        let gone: Vec<u64> = self
            .members
            .iter()
            .filter(|(_, m)| now.saturating_sub(m.last_seen) > self.timeout_ms)
            .map(|(&id, _)| id)
            .collect();
        for id in &gone {
            self.members.remove(id);
        }
        gone
    }

    /// Whether `id` is a member.
    pub fn contains(&self, id: u64) -> bool {
        self.members.contains_key(&id)
    }

    /// The members, in registration-id order.
    pub fn ids(&self) -> Vec<u64> {
        self.members.keys().copied().collect()
    }

    /// Slots offered by member `id`.
    pub fn slots_of(&self, id: u64) -> u32 {
        self.members.get(&id).map_or(0, |m| m.slots)
    }

    /// Slots offered by all members.
    pub fn slots(&self) -> u32 {
        self.members.values().map(|m| m.slots).sum()
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_roster_refuses_another_protocol_or_no_slots() {
        let mut r = Roster::new(100);
        assert!(r.register(1, PROTOCOL_VERSION + 1, 2, 0).unwrap_err().contains("protocol"));
        assert!(r.register(2, PROTOCOL_VERSION, 0, 0).unwrap_err().contains("--slots"));
        assert!(r.is_empty());
        r.register(3, PROTOCOL_VERSION, 2, 0).unwrap();
        assert_eq!((r.len(), r.slots()), (1, 2));
    }

    #[test]
    fn cluster_roster_drops_a_silent_member_once_and_a_heard_one_never() {
        let mut r = Roster::new(100);
        r.register(1, PROTOCOL_VERSION, 1, 0).unwrap();
        r.register(2, PROTOCOL_VERSION, 1, 0).unwrap();
        assert!(r.heard(2, 90));
        assert!(r.silent(100).is_empty(), "exactly the timeout is not yet silent");
        assert_eq!(r.silent(101), vec![1]);
        assert!(r.silent(150).is_empty());
        assert!(!r.heard(1, 150), "a dropped member stays dropped");
        assert_eq!(r.silent(191), vec![2]);
        // Time going backwards (a message stamped earlier) never makes a member older.
        r.register(3, PROTOCOL_VERSION, 1, 200).unwrap();
        r.heard(3, 150);
        assert!(r.silent(300).is_empty());
    }
}
