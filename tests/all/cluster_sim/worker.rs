//! The simulated worker: a thin shell, like `weir::cluster::worker`, around the same pure
//! state machines: the follower (`cluster/follower.rs`) decides whom to follow and which
//! attempt's commands count, the aligner (`checkpoint/alignment.rs`) aligns each sink's
//! barriers. Its part of an attempt is a keyed job of `P` sources and `P` sinks with
//! two-phase-commit sinks (pre-commit at the barrier, commit on `Complete` or at restore).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

use weir::checkpoint::alignment::{AlignOutcome, Aligner};
use weir::cluster::follower::{DeployStep, Follower};
use weir::cluster::protocol::AttemptNo;
use weir::ids::CheckpointId;

use super::msg::{Deploy, Handle, Msg, Rec, Txn};
use super::world::{Ms, Node, Timer, World};
use super::{HEARTBEAT_MS, KEYS, P, PER_SOURCE, RATE};

const TICK_MS: Ms = 20;
const RETRY_MS: Ms = 300;
const CONNECT_TIMEOUT_MS: Ms = 5_000;

struct Source {
    i: u32,
    offset: u32,
    done: bool,
}

struct Sink {
    i: u32,
    aligner: Aligner,
    queues: Vec<VecDeque<Msg>>,
    open: Vec<Rec>,
    pending: Vec<Txn>,
    ended: usize,
    /// Triggers heard before the input ended, as `runtime/participant.rs` remembers them.
    triggered: BTreeSet<u64>,
    answered: u64,
}

struct Part {
    attempt: AttemptNo,
    conn: u64,
    d: Rc<Deploy>,
    started: bool,
    sources: Vec<Source>,
    sinks: BTreeMap<u32, Sink>,
}

struct Conn {
    id: u64,
    coord: usize,
}

/// One worker process.
pub struct Worker {
    pub id: usize,
    follower: Follower,
    conn: Option<Conn>,
    next_coord: usize,
    connect_at: Ms,
    part: Option<Part>,
    last_beat: Ms,
}

/// Sends a data-plane message from worker `me` to the worker running sink `to`.
fn to_sink(w: &mut World, me: usize, d: &Deploy, to: u32, m: Msg) {
    let member = d.worker_of[P + to as usize] as usize;
    w.send(Node::Worker(me), Node::Worker(d.peers[member]), m);
}

impl Worker {
    pub fn new(id: usize) -> Worker {
        Worker {
            id,
            follower: Follower::new(),
            conn: None,
            next_coord: id % 2,
            connect_at: 0,
            part: None,
            last_beat: 0,
        }
    }

    fn me(&self) -> Node {
        Node::Worker(self.id)
    }

    pub fn start(&mut self, w: &mut World) {
        *self = Worker::new(self.id);
        self.connect_at = w.now;
        w.timer(self.me(), TICK_MS, Timer::Tick);
    }

    pub fn crash(&mut self, w: &mut World, down_for: Ms) {
        if let Some(c) = &self.conn {
            w.send(self.me(), Node::Coord(c.coord), Msg::Closed { conn: c.id });
        }
        self.part = None;
        w.crash(self.me(), down_for);
    }

    /// Leaves the session (closing it if `close`): its attempt is cancelled first.
    fn leave(&mut self, w: &mut World, close: bool) {
        if let Some(c) = self.conn.take()
            && close
        {
            w.send(self.me(), Node::Coord(c.coord), Msg::Closed { conn: c.id });
        }
        self.follower.disconnected();
        self.part = None;
        self.next_coord = (self.next_coord + 1) % 2;
        self.connect_at = w.now + RETRY_MS;
    }

    fn reply(&self, w: &mut World, m: Msg) {
        if let Some(c) = &self.conn {
            w.send(self.me(), Node::Coord(c.coord), m);
        }
    }

    pub fn on_timer(&mut self, w: &mut World, t: Timer) {
        match t {
            Timer::Tick => {
                w.timer(self.me(), TICK_MS, Timer::Tick);
                self.tick(w);
            }
            Timer::ConnectTimeout(conn)
                if self.conn.as_ref().is_some_and(|c| c.id == conn) && !self.follower.following() =>
            {
                self.leave(w, true);
            }
            _ => {}
        }
    }

    fn tick(&mut self, w: &mut World) {
        let now = w.now;
        if self.conn.is_none() {
            if now >= self.connect_at {
                w.next_conn += 1;
                let id = w.next_conn;
                self.conn = Some(Conn { id, coord: self.next_coord });
                self.follower.connected(now);
                w.send(self.me(), Node::Coord(self.next_coord), Msg::Hello { conn: id, slots: 1 });
                w.timer(self.me(), CONNECT_TIMEOUT_MS, Timer::ConnectTimeout(id));
            }
            return;
        }
        if self.follower.silent(now).is_some() {
            return self.leave(w, true);
        }
        let conn = self.conn.as_ref().expect("connected").id;
        if self.follower.following() && now >= self.last_beat + HEARTBEAT_MS {
            self.last_beat = now;
            self.reply(w, Msg::Heartbeat { conn });
        }
        self.emit(w);
    }

    /// The started part's sources emit their next records.
    fn emit(&mut self, w: &mut World) {
        let me = self.id;
        let Some(p) = self.part.as_mut().filter(|p| p.started) else { return };
        let (attempt, conn) = (p.attempt, p.conn);
        let mut finished = Vec::new();
        for s in p.sources.iter_mut().filter(|s| !s.done) {
            let mut by_sink: BTreeMap<u32, Vec<Rec>> = BTreeMap::new();
            for _ in 0..RATE {
                if s.offset == PER_SOURCE {
                    break;
                }
                let key = s.i * KEYS + s.offset % KEYS;
                by_sink.entry(key % P as u32).or_default().push((key, s.offset / KEYS));
                s.offset += 1;
            }
            for (to, recs) in by_sink {
                to_sink(w, me, &p.d, to, Msg::Data { attempt, from: s.i, to, recs });
            }
            if s.offset == PER_SOURCE {
                s.done = true;
                for to in 0..P as u32 {
                    to_sink(w, me, &p.d, to, Msg::End { attempt, from: s.i, to });
                }
                finished.push(s.i as usize);
            }
        }
        for task in finished {
            self.reply(w, Msg::Finished { conn, attempt, task });
        }
    }

    pub fn on(&mut self, w: &mut World, msg: Msg) {
        match msg {
            Msg::Data { attempt, from, to, .. }
            | Msg::Barrier { attempt, from, to, .. }
            | Msg::End { attempt, from, to } => self.on_data(w, attempt, from, to, msg),
            m => self.on_control(w, m),
        }
    }

    fn on_control(&mut self, w: &mut World, msg: Msg) {
        let conn = match &msg {
            Msg::NoListener { conn }
            | Msg::Welcome { conn, .. }
            | Msg::Beat { conn }
            | Msg::Deploy { conn, .. }
            | Msg::Start { conn, .. }
            | Msg::Cancel { conn, .. }
            | Msg::Trigger { conn, .. }
            | Msg::Complete { conn, .. }
            | Msg::Abort { conn, .. }
            | Msg::Shutdown { conn, .. }
            | Msg::Closed { conn } => *conn,
            _ => return,
        };
        if self.conn.as_ref().is_none_or(|c| c.id != conn) {
            w.stats.stale_dropped += 1;
            return;
        }
        self.follower.heard(w.now);
        match msg {
            Msg::NoListener { .. } => self.leave(w, false),
            Msg::Closed { .. } => self.leave(w, false),
            Msg::Welcome { epoch, heartbeat_ms, .. }
                if self.follower.on_welcome(epoch, heartbeat_ms, w.now).is_err() =>
            {
                w.stats.older_epoch_refused += 1;
                self.leave(w, true);
            }
            Msg::Deploy { d, .. } => self.deploy(w, conn, d),
            Msg::Start { attempt, .. } => {
                if self.follower.on_start(attempt)
                    && let Some(p) = &mut self.part
                {
                    p.started = true;
                    self.drain(w);
                }
            }
            Msg::Cancel { attempt, .. } if self.follower.on_cancel(attempt) => {
                let started = self.part.take().is_some_and(|p| p.started);
                if started {
                    self.reply(w, Msg::PartEnded { conn, attempt, failed: true });
                }
            }
            Msg::Trigger { attempt, id, tasks, .. } if self.follower.obeys(attempt) => self.trigger(w, id, &tasks),
            Msg::Complete { attempt, id, .. } if self.follower.obeys(attempt) => {
                if !w.sabotage.complete_before_record && !w.durable.recorded.contains(&id) {
                    let v = format!(
                        "worker {} obeyed Complete({id}) of attempt {attempt}, a checkpoint never recorded in etcd",
                        self.id
                    );
                    w.durable.violations.push(v);
                }
                if let Some(p) = &mut self.part {
                    for s in p.sinks.values_mut() {
                        s.pending.retain(|t| {
                            if t.checkpoint <= id {
                                if t.sink == traced_sink() {
                                    w.trace(|| {
                                        format!(
                                            "sink {} commits {t:?} on Complete({id}): {:?}",
                                            t.sink,
                                            traced_key(&w.durable.staged[t])
                                        )
                                    });
                                }
                                w.durable.committed.insert(*t);
                            }
                            t.checkpoint > id
                        });
                    }
                }
            }
            Msg::Abort { attempt, id, .. } if self.follower.obeys(attempt) => {
                if let Some(p) = &mut self.part {
                    for s in p.sinks.values_mut() {
                        s.aligner.on_cancel(CheckpointId(id));
                        s.triggered.remove(&id);
                    }
                }
                self.drain(w);
            }
            Msg::Shutdown { attempt, .. } if self.follower.obeys(attempt) => {
                self.part = None;
                self.reply(w, Msg::PartEnded { conn, attempt, failed: false });
            }
            Msg::Trigger { .. } | Msg::Complete { .. } | Msg::Abort { .. } | Msg::Shutdown { .. } => {
                w.stats.not_obeyed += 1;
            }
            _ => {}
        }
    }

    fn deploy(&mut self, w: &mut World, conn: u64, d: Rc<Deploy>) {
        let attempt = d.attempt;
        if self.follower.on_deploy(attempt) == DeployStep::Stale {
            w.stats.not_obeyed += 1;
            return;
        }
        self.part = None;
        if w.rng.chance(2) {
            // Building the part failed (a transient error, e.g. storage unreachable).
            self.follower.deploy_failed(attempt);
            return self.reply(w, Msg::DeployFailed { conn, attempt });
        }
        let mine = |task: usize| d.worker_of[task] == d.you;
        let handle = |task: usize| d.restore.as_ref().and_then(|m| m.get(&task)).cloned();
        let sources = (0..P)
            .filter(|&t| mine(t))
            .map(|t| {
                let offset = match handle(t) {
                    Some(Handle::Source(o)) => o,
                    _ => 0,
                };
                Source { i: t as u32, offset, done: false }
            })
            .collect();
        let mut sinks = BTreeMap::new();
        for t in (P..2 * P).filter(|&t| mine(t)) {
            // Restoring finishes what the checkpoint pre-committed (idempotent).
            if let Some(Handle::Sink(txns)) = handle(t) {
                if t == P + traced_sink() as usize {
                    w.trace(|| format!("sink {} restores, committing {txns:?}", t - P));
                }
                w.durable.committed.extend(txns);
            }
            let i = (t - P) as u32;
            let sink = Sink {
                i,
                aligner: Aligner::new(P),
                queues: (0..P).map(|_| VecDeque::new()).collect(),
                open: Vec::new(),
                pending: Vec::new(),
                ended: 0,
                triggered: BTreeSet::new(),
                answered: 0,
            };
            sinks.insert(i, sink);
        }
        self.part = Some(Part { attempt, conn, d, started: false, sources, sinks });
        self.reply(w, Msg::Ready { conn, attempt });
    }

    /// Checkpoint `id` reached this worker's `tasks`: sources ack their offset and send the
    /// barrier downstream; (final checkpoint) ended sinks pre-commit what they hold.
    fn trigger(&mut self, w: &mut World, id: u64, tasks: &[usize]) {
        let me = self.id;
        let Some(p) = &mut self.part else { return };
        let (attempt, conn) = (p.attempt, p.conn);
        let mut acks = Vec::new();
        for s in p.sources.iter().filter(|s| tasks.contains(&(s.i as usize))) {
            acks.push((s.i as usize, Handle::Source(s.offset)));
            if !s.done {
                for to in 0..P as u32 {
                    to_sink(w, me, &p.d, to, Msg::Barrier { attempt, from: s.i, to, id });
                }
            }
        }
        // A trigger may arrive after the barrier it names (the barrier took a faster path):
        // a checkpoint already answered is never answered again (`Participant::is_new`).
        for s in p.sinks.values_mut().filter(|s| tasks.contains(&(P + s.i as usize)) && id > s.answered) {
            if s.ended == P {
                acks.push((P + s.i as usize, snapshot(w, s, attempt, id)));
            } else {
                s.triggered.insert(id);
            }
        }
        for (task, handle) in acks {
            self.reply(w, Msg::Ack { conn, attempt, task, id, handle });
        }
    }

    fn on_data(&mut self, w: &mut World, attempt: AttemptNo, from: u32, to: u32, msg: Msg) {
        let Some(s) = self.part.as_mut().filter(|p| p.attempt == attempt).and_then(|p| p.sinks.get_mut(&to)) else {
            // A fenced attempt's channel: nothing of it is delivered.
            w.stats.fenced_data += 1;
            return;
        };
        s.queues[from as usize].push_back(msg);
        self.drain(w);
    }

    /// Every started sink takes what its unparked inputs hold.
    fn drain(&mut self, w: &mut World) {
        let Some(p) = self.part.as_mut().filter(|p| p.started) else { return };
        let (attempt, conn) = (p.attempt, p.conn);
        let mut out = Vec::new();
        for s in p.sinks.values_mut() {
            loop {
                let mut progressed = false;
                for i in 0..P {
                    if s.aligner.is_parked(i) {
                        continue;
                    }
                    let Some(m) = s.queues[i].pop_front() else { continue };
                    progressed = true;
                    out.extend(take(w, s, attempt, conn, i, m));
                }
                if !progressed {
                    break;
                }
            }
        }
        for m in out {
            self.reply(w, m);
        }
    }
}

/// A sink takes message `m` from input `i`; returns what to tell the coordinator.
fn take(w: &mut World, s: &mut Sink, attempt: AttemptNo, conn: u64, i: usize, m: Msg) -> Vec<Msg> {
    let task = P + s.i as usize;
    let outcome = match m {
        Msg::Data { recs, .. } => {
            s.open.extend(recs);
            return Vec::new();
        }
        Msg::Barrier { id, .. } => s.aligner.on_barrier(i, CheckpointId(id)),
        Msg::End { .. } => {
            s.ended += 1;
            let o = s.aligner.on_end_of_stream(i);
            if s.ended == P {
                let mut out = after_alignment(w, s, attempt, conn, o);
                // Finished: answer what was triggered and not yet answered with the final state.
                let unanswered: Vec<u64> = s.triggered.iter().copied().filter(|&id| id > s.answered).collect();
                for id in unanswered {
                    let handle = snapshot(w, s, attempt, id);
                    out.push(Msg::Ack { conn, attempt, task, id, handle });
                }
                out.push(Msg::Finished { conn, attempt, task });
                return out;
            }
            o
        }
        _ => return Vec::new(),
    };
    after_alignment(w, s, attempt, conn, outcome)
}

fn after_alignment(w: &mut World, s: &mut Sink, attempt: AttemptNo, conn: u64, o: AlignOutcome) -> Vec<Msg> {
    let task = P + s.i as usize;
    match o {
        AlignOutcome::Aligned(id) => {
            let handle = snapshot(w, s, attempt, id.0);
            vec![Msg::Ack { conn, attempt, task, id: id.0, handle }]
        }
        AlignOutcome::Superseded { aborted, started, aligned } => {
            let mut out = vec![Msg::Decline { conn, attempt, id: aborted.0 }];
            if aligned {
                let handle = snapshot(w, s, attempt, started.0);
                out.push(Msg::Ack { conn, attempt, task, id: started.0, handle });
            }
            out
        }
        AlignOutcome::Park | AlignOutcome::Obsolete | AlignOutcome::Continue => Vec::new(),
    }
}

/// Pre-commits what the sink took since its last barrier as checkpoint `id`'s transaction.
fn snapshot(w: &mut World, s: &mut Sink, attempt: AttemptNo, id: u64) -> Handle {
    let txn = Txn { attempt, sink: s.i, checkpoint: id };
    s.answered = s.answered.max(id);
    if s.i == traced_sink() {
        w.trace(|| format!("sink {} pre-commits {txn:?}: {:?}", s.i, traced_key(&s.open)));
    }
    if w.durable.staged.insert(txn, std::mem::take(&mut s.open)).is_some() {
        w.durable.violations.push(format!("sink {} pre-committed {txn:?} twice", s.i));
    }
    if w.sabotage.commit_at_barrier {
        w.durable.committed.insert(txn);
    }
    s.pending.push(txn);
    Handle::Sink(s.pending.clone())
}

/// The sink the trace follows (`WEIR_SIM_TRACE_SINK`, default 0).
fn traced_sink() -> u32 {
    std::env::var("WEIR_SIM_TRACE_SINK").ok().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The traced sink's first key's sequence numbers in `recs`.
fn traced_key(recs: &[Rec]) -> Vec<u32> {
    recs.iter().filter(|r| r.0 == traced_sink()).map(|r| r.1).collect()
}
