//! The simulated coordinator: a thin shell, like `weir::cluster::coordinator` and
//! `runtime/driver.rs`, around the same pure state machines: the lease rules
//! (`cluster/lease.rs`), the roster (`cluster/roster.rs`), the attempt round
//! (`cluster/round.rs`), placement (`graph/placement.rs`) and the checkpoint coordinator
//! (`checkpoint/coordinator.rs`). Time, network and etcd are the simulation's.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use weir::checkpoint::coordinator::{AckOutcome, Coordinator, TriggerDecision};
use weir::cluster::lease::{self, RecordResult, RecordStep};
use weir::cluster::protocol::{AttemptNo, PROTOCOL_VERSION, attempt_base};
use weir::cluster::roster::Roster;
use weir::cluster::round::{Action, Outcome, Round};
use weir::graph::logical::CheckpointSettings;
use weir::graph::physical::{PhysicalPlan, SubtaskPlan};
use weir::graph::placement::Placement;
use weir::ids::CheckpointId;

use super::etcd::TTL_S;
use super::msg::{Deploy, Handle, Key, Msg};
use super::world::{Ms, Node, Timer, World};
use super::{HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS, P};

const TICK_MS: Ms = 25;
const RESTART_DELAY_MS: Ms = 200;
const PUT_TIMEOUT_MS: Ms = 1000;
const DEPLOY_TIMEOUT_MS: Ms = 3_000;

fn settings() -> CheckpointSettings {
    CheckpointSettings { interval_ms: 300, timeout_ms: 5_000, min_pause_ms: 0, max_concurrent: 1, retained: 3 }
}

/// The plan of the simulated job: `P` sources, then `P` sinks, keyed between them.
fn plan() -> PhysicalPlan {
    let subtasks = (0..2)
        .flat_map(|node| (0..P).map(move |i| SubtaskPlan { node, subtask: i as u32, key_groups: 0..0 }))
        .collect();
    PhysicalPlan { subtasks, channels: Vec::new() }
}

struct Run {
    round: Round<()>,
    worker_of: Vec<u32>,
    ckpt: Coordinator<Handle>,
    finished: BTreeSet<usize>,
    final_id: Option<u64>,
}

struct Recording {
    id: u64,
    token: u64,
    key: Key,
    is_final: bool,
}

struct Lead {
    epoch: u64,
    roster: Roster,
    conns: BTreeMap<u64, usize>,
    next_attempt: AttemptNo,
    restore: Option<u64>,
    finished: bool,
    run: Option<Run>,
    restart_at: Ms,
    next_token: u64,
    recording: Option<Recording>,
    last_beat: Ms,
    /// Checkpoints this leader completed (published and recorded), oldest first.
    completed: Vec<u64>,
}

/// One coordinator process.
pub struct Coord {
    pub id: usize,
    lease: Option<u64>,
    asked: Ms,
    valid_until: Ms,
    last_renewal: Ms,
    lead: Option<Lead>,
}

impl Coord {
    pub fn new(id: usize) -> Coord {
        Coord { id, lease: None, asked: 0, valid_until: 0, last_renewal: 0, lead: None }
    }

    fn me(&self) -> Node {
        Node::Coord(self.id)
    }

    /// Whether it believes it leads and may act at `now`.
    pub fn acting_leader(&self, now: Ms) -> bool {
        self.lead.is_some() && lease::leads(now, self.valid_until)
    }

    /// A new incarnation starts: a lease, then a campaign.
    pub fn start(&mut self, w: &mut World) {
        *self = Coord::new(self.id);
        self.asked = w.now;
        w.send(self.me(), Node::Etcd, Msg::Grant);
        w.timer(self.me(), TICK_MS, Timer::Tick);
    }

    /// The process ends (crash or exit): its connections reset.
    pub fn crash(&mut self, w: &mut World, down_for: Ms) {
        if let Some(l) = &self.lead {
            for (&conn, &worker) in &l.conns {
                w.send(self.me(), Node::Worker(worker), Msg::Closed { conn });
            }
        }
        self.lead = None;
        w.crash(self.me(), down_for);
    }

    fn exit(&mut self, w: &mut World) {
        w.trace(|| format!("coordinator {} exits (deposed or lease lapsed)", self.id));
        w.stats.deposed_exits += 1;
        self.crash(w, RESTART_DELAY_MS * 3);
    }

    pub fn on_timer(&mut self, w: &mut World, t: Timer) {
        match t {
            Timer::Watchdog => {
                if !lease::leads(w.now, self.valid_until) {
                    return self.exit(w);
                }
                w.timer(self.me(), self.valid_until - w.now, Timer::Watchdog);
            }
            Timer::Tick => {
                w.timer(self.me(), TICK_MS, Timer::Tick);
                if let Some(lease) = self.lease
                    && w.now >= self.last_renewal + TTL_S as u64 * 1000 / 3
                {
                    self.last_renewal = w.now;
                    w.send(self.me(), Node::Etcd, Msg::KeepAlive { lease, sent: w.now });
                }
                if self.lead.is_some() {
                    self.leader_tick(w);
                }
            }
            Timer::PutTimeout(token)
                if self.lead.as_ref().and_then(|l| l.recording.as_ref()).is_some_and(|r| r.token == token) =>
            {
                self.recorded(w, token, RecordResult::Failed("no answer".into()));
            }
            _ => {}
        }
    }

    pub fn on(&mut self, w: &mut World, from: Node, msg: Msg) {
        match msg {
            Msg::Granted { lease } => {
                self.lease = Some(lease);
                self.valid_until = self.asked + TTL_S as u64 * 1000;
                self.last_renewal = w.now;
                w.timer(self.me(), self.valid_until.saturating_sub(w.now), Timer::Watchdog);
                w.send(self.me(), Node::Etcd, Msg::Campaign { lease });
            }
            Msg::KeptAlive { sent, ttl_s } => match lease::renewed_until(sent, ttl_s) {
                Some(until) => self.valid_until = self.valid_until.max(until),
                None => self.exit(w),
            },
            Msg::Elected { lease, epoch, pointer, finished } if Some(lease) == self.lease => {
                w.trace(|| format!("coordinator {} leads epoch {epoch}, checkpoint pointer {pointer:?}", self.id));
                self.lead = Some(Lead {
                    epoch,
                    roster: Roster::new(HEARTBEAT_TIMEOUT_MS),
                    conns: BTreeMap::new(),
                    next_attempt: attempt_base(epoch),
                    restore: pointer,
                    finished,
                    run: None,
                    restart_at: 0,
                    next_token: 0,
                    recording: None,
                    last_beat: 0,
                    completed: Vec::new(),
                });
            }
            Msg::PutDone { token, result } => self.recorded(w, token, result),
            Msg::Hello { conn, slots } => {
                let Node::Worker(worker) = from else { return };
                let Some(l) = &mut self.lead else {
                    return w.send(self.me(), from, Msg::NoListener { conn });
                };
                match l.roster.register(conn, PROTOCOL_VERSION, slots, w.now) {
                    Ok(()) => {
                        l.conns.insert(conn, worker);
                        let m = Msg::Welcome { conn, epoch: l.epoch, heartbeat_ms: HEARTBEAT_MS };
                        w.send(self.me(), from, m);
                    }
                    Err(_) => w.send(self.me(), from, Msg::Closed { conn }),
                }
            }
            other => self.on_member(w, other),
        }
    }

    /// A message on a member's connection.
    fn on_member(&mut self, w: &mut World, msg: Msg) {
        let now = w.now;
        let Some(l) = &mut self.lead else { return };
        let conn = match &msg {
            Msg::Heartbeat { conn }
            | Msg::Ready { conn, .. }
            | Msg::DeployFailed { conn, .. }
            | Msg::Ack { conn, .. }
            | Msg::Decline { conn, .. }
            | Msg::Finished { conn, .. }
            | Msg::PartEnded { conn, .. }
            | Msg::Closed { conn } => *conn,
            _ => return,
        };
        if let Msg::Closed { .. } = msg {
            if l.roster.remove(conn) {
                l.conns.remove(&conn);
                self.lost(w, conn);
            }
            return;
        }
        if !l.roster.heard(conn, now) {
            return;
        }
        let Some(run) = &mut l.run else { return };
        let actions = match msg {
            Msg::Ready { attempt, .. } => run.round.on_ready(conn, attempt),
            Msg::DeployFailed { attempt, .. } => run.round.on_deploy_failed(conn, attempt, (), false, now),
            Msg::PartEnded { attempt, failed, .. } => {
                run.round.on_part_ended(conn, attempt, if failed { vec![()] } else { vec![] }, now)
            }
            Msg::Ack { .. } if w.sabotage.ignore_acks.is_some_and(|(a, b)| (a..b).contains(&now)) => return,
            Msg::Ack { attempt, task, id, handle, .. } if run.round.counts_event(conn, attempt) => {
                if runs(run, conn, task)
                    && let AckOutcome::Complete { id, acks, .. } = run.ckpt.on_ack(task, CheckpointId(id), handle, now)
                {
                    self.publish(w, id.0, acks);
                }
                return;
            }
            Msg::Decline { attempt, id, .. } if run.round.counts_event(conn, attempt) => {
                if run.ckpt.on_decline(CheckpointId(id), now) {
                    self.abort(w, id);
                }
                return;
            }
            Msg::Finished { attempt, task, .. } if run.round.counts_event(conn, attempt) => {
                if runs(run, conn, task) {
                    run.finished.insert(task);
                }
                return;
            }
            _ => return,
        };
        self.act(w, actions);
    }

    fn lost(&mut self, w: &mut World, conn: u64) {
        let now = w.now;
        let Some(run) = self.lead.as_mut().and_then(|l| l.run.as_mut()) else { return };
        let actions = run.round.on_lost(conn, now);
        self.act(w, actions);
    }

    fn tell(&self, w: &mut World, msg: impl Fn(u64) -> Msg) {
        let Some(l) = &self.lead else { return };
        let Some(run) = &l.run else { return };
        for conn in run.round.members() {
            if let Some(&worker) = l.conns.get(conn) {
                w.send(self.me(), Node::Worker(worker), msg(*conn));
            }
        }
    }

    fn act(&mut self, w: &mut World, actions: Vec<Action<()>>) {
        for a in actions {
            let attempt = match self.lead.as_ref().and_then(|l| l.run.as_ref()) {
                Some(r) => r.round.attempt(),
                None => return,
            };
            match a {
                Action::Start => self.tell(w, |conn| Msg::Start { conn, attempt }),
                Action::Cancel => self.tell(w, |conn| Msg::Cancel { conn, attempt }),
                Action::Drop(conn) => {
                    let l = self.lead.as_mut().expect("leads");
                    l.roster.remove(conn);
                    if let Some(worker) = l.conns.remove(&conn) {
                        w.send(self.me(), Node::Worker(worker), Msg::Closed { conn });
                    }
                }
                Action::Over(outcome) => self.over(w, outcome),
            }
        }
    }

    fn over(&mut self, w: &mut World, outcome: Outcome<()>) {
        let l = self.lead.as_mut().expect("leads");
        let Some(mut run) = l.run.take() else { return };
        run.ckpt.abort_all();
        w.trace(|| format!("attempt {} over: {outcome:?}", run.round.attempt()));
        match outcome {
            Outcome::Ended(faults) if faults.is_empty() => {
                l.next_token += 1;
                let token = l.next_token;
                l.recording = Some(Recording { id: 0, token, key: Key::Finished, is_final: false });
                w.send(Node::Coord(self.id), Node::Etcd, Msg::Put { key: Key::Finished, epoch: l.epoch, token });
                w.timer(self.me(), PUT_TIMEOUT_MS, Timer::PutTimeout(token));
            }
            _ => {
                // Restarts go from the newest checkpoint this leader completed, else where it
                // started, as the executor's restart loop picks (`CheckpointStore::latest_of`).
                l.restore = l.completed.last().copied().or(l.restore);
                if w.sabotage.restart_from_any_manifest {
                    l.restore = w.durable.manifests.keys().next_back().copied().or(l.restore);
                }
                l.restart_at = w.now + RESTART_DELAY_MS;
            }
        }
    }

    fn publish(&mut self, w: &mut World, id: u64, acks: BTreeMap<usize, Handle>) {
        let l = self.lead.as_mut().expect("leads");
        let run = l.run.as_mut().expect("runs");
        let is_final = run.final_id == Some(id);
        if w.durable.manifests.contains_key(&id) {
            // Create-only publish: another leader's manifest holds this id.
            if is_final {
                run.final_id = None;
            }
            return self.abort(w, id);
        }
        w.trace(|| format!("coordinator {} publishes checkpoint {id} of attempt {}", self.id, run.round.attempt()));
        w.durable.manifests.insert(id, Rc::new(acks));
        if w.sabotage.complete_before_record {
            let attempt = run.round.attempt();
            self.tell(w, |conn| Msg::Complete { conn, attempt, id });
        }
        let l = self.lead.as_mut().expect("leads");
        l.next_token += 1;
        let token = l.next_token;
        l.recording = Some(Recording { id, token, key: Key::Checkpoint(id), is_final });
        w.send(Node::Coord(self.id), Node::Etcd, Msg::Put { key: Key::Checkpoint(id), epoch: l.epoch, token });
        w.timer(self.me(), PUT_TIMEOUT_MS, Timer::PutTimeout(token));
    }

    fn recorded(&mut self, w: &mut World, token: u64, result: RecordResult) {
        let now = w.now;
        let valid_until = self.valid_until;
        let Some(l) = &mut self.lead else { return };
        let Some(r) = l.recording.as_ref().filter(|r| r.token == token) else { return };
        let (id, key, is_final) = (r.id, r.key, r.is_final);
        match lease::after_record(result, now, valid_until) {
            RecordStep::Stop(_) => self.exit(w),
            RecordStep::Retry => {
                l.next_token += 1;
                let token = l.next_token;
                l.recording = Some(Recording { id, token, key, is_final });
                w.send(Node::Coord(self.id), Node::Etcd, Msg::Put { key, epoch: l.epoch, token });
                w.timer(self.me(), PUT_TIMEOUT_MS, Timer::PutTimeout(token));
            }
            RecordStep::Done => {
                w.trace(|| format!("coordinator {} recorded {key:?}", self.id));
                l.recording = None;
                if key == Key::Finished {
                    l.finished = true;
                    return;
                }
                l.completed.push(id);
                let Some(run) = &l.run else { return };
                let attempt = run.round.attempt();
                self.tell(w, |conn| Msg::Complete { conn, attempt, id });
                if is_final {
                    self.tell(w, |conn| Msg::Shutdown { conn, attempt });
                }
            }
        }
    }

    fn abort(&self, w: &mut World, id: u64) {
        let Some(run) = self.lead.as_ref().and_then(|l| l.run.as_ref()) else { return };
        let attempt = run.round.attempt();
        self.tell(w, |conn| Msg::Abort { conn, attempt, id });
    }

    fn leader_tick(&mut self, w: &mut World) {
        let now = w.now;
        let l = self.lead.as_mut().expect("leads");
        let silent = l.roster.silent(now);
        for conn in silent {
            let l = self.lead.as_mut().expect("leads");
            if let Some(worker) = l.conns.remove(&conn) {
                w.send(Node::Coord(self.id), Node::Worker(worker), Msg::Closed { conn });
            }
            self.lost(w, conn);
        }
        let l = self.lead.as_mut().expect("leads");
        if now >= l.last_beat + HEARTBEAT_MS {
            l.last_beat = now;
            for (&conn, &worker) in &l.conns {
                w.send(Node::Coord(self.id), Node::Worker(worker), Msg::Beat { conn });
            }
        }
        if let Some(run) = &mut l.run {
            let actions = run.round.on_tick(now);
            self.act(w, actions);
            self.checkpoints(w);
        } else if !l.finished && l.recording.is_none() && now >= l.restart_at {
            self.deploy(w);
        }
    }

    fn checkpoints(&mut self, w: &mut World) {
        let now = w.now;
        let l = self.lead.as_mut().expect("leads");
        let Some(run) = &mut l.run else { return };
        let expired = run.ckpt.on_tick(now);
        for id in &expired {
            if run.final_id == Some(id.0) {
                run.final_id = None;
            }
        }
        for id in expired.iter() {
            self.abort(w, id.0);
        }
        let l = self.lead.as_mut().expect("leads");
        let Some(run) = &mut l.run else { return };
        if !run.round.is_started() || l.recording.is_some() || run.final_id.is_some() {
            return;
        }
        let all_finished = run.finished.len() == 2 * P;
        let TriggerDecision::Trigger(id) = run.ckpt.poll_trigger(now, all_finished) else { return };
        if all_finished {
            run.final_id = Some(id.0);
        }
        // Every subtask hears of it (`runtime/driver.rs` broadcasts): sources inject the
        // barrier, finished subtasks answer with their final state, the rest remember it.
        let tasks: Vec<usize> = (0..2 * P).collect();
        let (attempt, tasks) = (run.round.attempt(), Rc::new(tasks));
        self.tell(w, |conn| Msg::Trigger { conn, attempt, id: id.0, tasks: tasks.clone() });
    }

    fn deploy(&mut self, w: &mut World) {
        let l = self.lead.as_mut().expect("leads");
        let first = l.next_attempt == attempt_base(l.epoch);
        if l.roster.slots() < P as u32 || (first && l.roster.len() < P) {
            return;
        }
        let ids = l.roster.ids();
        let slots: Vec<u32> = ids.iter().map(|&id| l.roster.slots_of(id)).collect();
        let placement = Placement::spread(&plan(), &slots).expect("enough slots");
        let used: Vec<usize> = (0..ids.len()).filter(|i| placement.worker_of.contains(i)).collect();
        let worker_of: Vec<u32> =
            placement.worker_of.iter().map(|i| used.iter().position(|u| u == i).expect("used") as u32).collect();
        let members: Vec<u64> = used.iter().map(|&i| ids[i]).collect();
        let attempt = l.next_attempt;
        l.next_attempt += 1;
        w.stats.attempts += 1;
        let restore = l.restore.map(|id| w.durable.manifests[&id].clone());
        w.trace(|| format!("coordinator {} deploys attempt {attempt} from checkpoint {:?}", self.id, l.restore));
        let peers: Vec<usize> = members.iter().map(|c| l.conns[c]).collect();
        // Ids go past every published one (the driver seeds them from storage).
        let first_id = w.durable.manifests.keys().next_back().map_or(1, |id| id + 1);
        for (you, conn) in members.iter().enumerate() {
            let d = Rc::new(Deploy {
                attempt,
                worker_of: worker_of.clone(),
                peers: peers.clone(),
                you: you as u32,
                restore: restore.clone(),
            });
            w.send(Node::Coord(self.id), Node::Worker(l.conns[conn]), Msg::Deploy { conn: *conn, d });
        }
        l.run = Some(Run {
            round: Round::new(attempt, members, HEARTBEAT_TIMEOUT_MS).with_deploy_deadline(w.now + DEPLOY_TIMEOUT_MS),
            worker_of,
            ckpt: Coordinator::new(settings(), 2 * P, first_id),
            finished: BTreeSet::new(),
            final_id: None,
        });
    }
}

/// Whether member `conn` runs `task` in `run`.
fn runs(run: &Run, conn: u64, task: usize) -> bool {
    run.worker_of.get(task).is_some_and(|&m| run.round.members().get(m as usize) == Some(&conn))
}
