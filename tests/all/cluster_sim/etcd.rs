//! A simulated etcd: leases with a time to live, the election service (the first live
//! campaigner gets the leader key when it is free; the epoch is the key's create revision),
//! and writes conditional on the writer's leader key still existing at its revision. etcd
//! itself does not fail here (it is a replicated service of its own); the network between it
//! and each coordinator does.

use std::collections::{BTreeMap, VecDeque};

use weir::cluster::lease::RecordResult;

use super::msg::{Key, Msg};
use super::world::{Ms, Node, World};

pub const TTL_S: i64 = 2;

#[derive(Debug, Default)]
pub struct Etcd {
    rev: u64,
    next_lease: u64,
    leases: BTreeMap<u64, (Node, Ms)>,
    leader: Option<(u64, u64, Node)>,
    waiting: VecDeque<(u64, Node)>,
    pointer: Option<u64>,
    finished: bool,
}

impl Etcd {
    pub fn finished(&self) -> bool {
        self.finished
    }

    pub fn on(&mut self, w: &mut World, from: Node, msg: Msg) {
        match msg {
            Msg::Grant => {
                self.next_lease += 1;
                let lease = self.next_lease;
                self.leases.insert(lease, (from, w.now + TTL_S as u64 * 1000));
                w.send(Node::Etcd, from, Msg::Granted { lease });
            }
            Msg::KeepAlive { lease, sent } => {
                let now = w.now;
                let ttl_s = match self.leases.get_mut(&lease) {
                    Some((_, expires)) if *expires > now => {
                        *expires = now + TTL_S as u64 * 1000;
                        TTL_S
                    }
                    _ => 0,
                };
                w.send(Node::Etcd, from, Msg::KeptAlive { sent, ttl_s });
            }
            Msg::Campaign { lease } => {
                self.waiting.push_back((lease, from));
                self.tick(w);
            }
            Msg::Put { key, epoch, token } => {
                let result = match self.leader {
                    Some((_, rev, _)) if rev == epoch => {
                        self.rev += 1;
                        match key {
                            Key::Checkpoint(id) => {
                                self.pointer = Some(id);
                                w.durable.recorded.insert(id);
                                w.durable.recorded_at.push(w.now);
                                w.stats.checkpoints_recorded += 1;
                            }
                            Key::Finished => self.finished = true,
                        }
                        RecordResult::Stored
                    }
                    _ => RecordResult::Refused,
                };
                w.send(Node::Etcd, from, Msg::PutDone { token, result });
            }
            _ => {}
        }
    }

    /// Expires leases (and the leader key with its lease), then elects the first live
    /// campaigner if nobody leads.
    pub fn tick(&mut self, w: &mut World) {
        let now = w.now;
        self.leases.retain(|_, (_, expires)| *expires > now);
        if let Some((lease, _, _)) = self.leader
            && !self.leases.contains_key(&lease)
        {
            self.leader = None;
        }
        if self.leader.is_some() {
            return;
        }
        while let Some((lease, node)) = self.waiting.pop_front() {
            if self.leases.contains_key(&lease) {
                self.rev += 1;
                self.leader = Some((lease, self.rev, node));
                let m = Msg::Elected { lease, epoch: self.rev, pointer: self.pointer, finished: self.finished };
                w.send(Node::Etcd, node, m);
                w.stats.leaders += 1;
                return;
            }
        }
    }
}
