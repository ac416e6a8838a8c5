//! The coordinator's side of its workers' connections, shared by every job it runs: a thread
//! of its own registers workers, answers and watches their heartbeats, and hands each message
//! to the job it concerns; jobs (`coordinator.rs`, one [`JobLink`] each) place their attempts
//! into the workers through it.
//!
//! Invariants: a worker registers once per connection, and only at the protocol version of
//! this coordinator; a worker silent past the heartbeat timeout, or whose connection closed,
//! is lost for every job at once (each hears `Lost`) and its connection is closed, so a paused
//! worker that wakes up finds itself cut off; a message about an attempt reaches only the job
//! whose newest attempt it is (`leases.rs`), a query's answer only the job that asked it;
//! placements are atomic with their attempt numbers, so two jobs never place into one worker.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};

use crate::cluster::coordinator::CoordinatorConfig;
use crate::cluster::leases::{JobKey, Leases};
use crate::cluster::pipe::{self, Incoming, PipeTx};
use crate::cluster::protocol::{AttemptNo, ToCoordinator, ToWorker, attempt_base};
use crate::cluster::queries::PendingQueries;
use crate::cluster::roster::Roster;
use crate::graph::physical::PhysicalPlan;
use crate::graph::placement::Placement;
use crate::ids::CheckpointId;

/// What a job hears from the cluster.
pub enum Note {
    /// A message of a worker about the job's current attempt.
    Message(u64, ToCoordinator),
    /// A worker is gone (for every job).
    Lost(u64),
}

/// A worker's `UpgradeArmed`: `(member, attempt, task, checkpoint)`.
pub type Armed = (u64, AttemptNo, u64, CheckpointId);

/// Query numbers of job `k` start at `(k mod 2^24) << QUERY_SHIFT`, so jobs' numbers differ
/// (jobs 2^24 joins apart share a range); an answer goes to the job that waits for that number
/// from that worker.
const QUERY_SHIFT: u32 = 40;

/// A member's connection and what it has been sent.
struct WorkerConn {
    name: String,
    data_addr: SocketAddr,
    tx: PipeTx<ToWorker>,
    shipped: HashSet<String>,
}

impl WorkerConn {
    fn label(&self) -> String {
        format!("{} ({})", self.name, self.data_addr)
    }
}

/// Where a job's news goes.
struct Link {
    notes: Sender<Note>,
    armed: Option<Sender<Armed>>,
    queries: Arc<Mutex<PendingQueries>>,
}

struct State {
    pending: BTreeMap<u64, PipeTx<ToWorker>>,
    roster: Roster,
    conns: BTreeMap<u64, WorkerConn>,
    leases: Leases,
    links: BTreeMap<JobKey, Link>,
    next_job: JobKey,
}

/// The workers of a coordinator.
pub struct Hub {
    cfg: CoordinatorConfig,
    addr: SocketAddr,
    clock: Instant,
    state: Mutex<State>,
}

/// An attempt placed into workers.
pub struct Placed {
    /// Its number.
    pub attempt: AttemptNo,
    /// Its workers, in the order the deployment numbers them.
    pub members: Vec<u64>,
    /// Per subtask of the plan: its worker's index in `members`.
    pub worker_of: Vec<u32>,
    /// Per member: where peers open channels to it.
    pub peers: Vec<SocketAddr>,
}

/// Why an attempt cannot be placed yet.
pub struct Short {
    /// Slots open to the job.
    pub have: u32,
    /// Workers registered.
    pub workers: usize,
    /// Of those, the workers other jobs hold.
    pub others: usize,
}

impl Short {
    /// What the cluster offers the job, in words.
    pub fn offer(&self) -> String {
        let held = match self.others {
            0 => String::new(),
            n => format!("; {n} more held by the coordinator's other jobs"),
        };
        format!("{} slot(s) free for it on {} worker(s){held}", self.have, self.workers - self.others)
    }
}

impl Hub {
    /// Listens for workers and starts the thread that serves them.
    pub fn start(cfg: CoordinatorConfig) -> std::io::Result<Arc<Hub>> {
        let (tx, inbox) = unbounded();
        let addr = pipe::listen(cfg.listen, &cfg.secret, cfg.tls.clone(), tx)?;
        let state = State {
            pending: BTreeMap::new(),
            roster: Roster::new(cfg.heartbeat_timeout.as_millis() as u64),
            conns: BTreeMap::new(),
            leases: Leases::new(attempt_base(cfg.epoch)),
            links: BTreeMap::new(),
            next_job: JobKey(1),
        };
        let hub = Arc::new(Hub { cfg, addr, clock: Instant::now(), state: Mutex::new(state) });
        let serving = hub.clone();
        std::thread::Builder::new().name("weir-workers".into()).spawn(move || serving.serve(inbox))?;
        Ok(hub)
    }

    /// Where workers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.cfg
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A job joins: its news goes to the link returned (and stops when it is dropped).
    pub fn join(self: &Arc<Self>) -> JobLink {
        let (tx, notes) = unbounded();
        let mut s = self.lock();
        let key = s.next_job;
        s.next_job = JobKey(key.0 + 1);
        let base = (key.0 % (1 << (64 - QUERY_SHIFT))) << QUERY_SHIFT;
        let queries = Arc::new(Mutex::new(PendingQueries::numbered_from(base)));
        s.links.insert(key, Link { notes: tx, armed: None, queries: queries.clone() });
        JobLink { hub: self.clone(), key, notes, queries }
    }

    fn serve(&self, inbox: Receiver<(u64, Incoming<ToCoordinator, ToWorker>)>) {
        loop {
            let mut next = inbox.recv_timeout(Duration::from_millis(100)).map_err(|_| ());
            // Everything already queued counts before anyone is judged silent.
            while let Ok((id, incoming)) = next {
                let mut s = self.lock();
                match incoming {
                    Incoming::Opened(tx) => {
                        s.pending.insert(id, tx);
                    }
                    Incoming::Message(m) => self.message(&mut s, id, m),
                    Incoming::Closed => {
                        s.pending.remove(&id);
                        if s.roster.remove(id) {
                            tracing::warn!("worker {} is gone (its connection closed)", label(&s, id));
                            lose(&mut s, id);
                        }
                    }
                }
                drop(s);
                next = inbox.try_recv().map_err(|_| ());
            }
            let mut s = self.lock();
            for id in s.roster.silent(self.now()) {
                tracing::warn!(
                    "worker {} sent nothing for {} ms (heartbeat timeout); dropping it",
                    label(&s, id),
                    self.cfg.heartbeat_timeout.as_millis()
                );
                lose(&mut s, id);
            }
        }
    }

    fn message(&self, s: &mut State, id: u64, m: ToCoordinator) {
        if s.roster.heard(id, self.now()) {
            route(s, id, m);
            return;
        }
        let Some(tx) = s.pending.remove(&id) else { return };
        let ToCoordinator::Register { name, data_addr, slots, protocol } = m else {
            tx.close();
            return;
        };
        if let Err(why) = s.roster.register(id, protocol, slots, self.now()) {
            tracing::warn!("refused worker `{name}` ({data_addr}): {why}");
            let _ = tx.send(&ToWorker::Refused(why));
            tx.close();
            return;
        }
        let _ =
            tx.send(&ToWorker::Welcome { heartbeat_ms: self.cfg.heartbeat.as_millis() as u64, epoch: self.cfg.epoch });
        let (beat, every) = (tx.clone(), self.cfg.heartbeat);
        // Until the connection is gone: the worker leaves a coordinator it no longer hears.
        std::thread::spawn(move || {
            while beat.send(&ToWorker::Heartbeat).is_ok() {
                std::thread::sleep(every);
            }
        });
        tracing::info!("worker `{name}` registered: {slots} slot(s), channels on {data_addr}");
        s.conns.insert(id, WorkerConn { name, data_addr, tx, shipped: HashSet::new() });
    }
}

/// Hands a registered worker's message to the job it concerns.
fn route(s: &mut State, id: u64, m: ToCoordinator) {
    let attempt = match &m {
        ToCoordinator::Heartbeat | ToCoordinator::Register { .. } => return,
        ToCoordinator::QueryAnswer { query, .. } => {
            let waits = |l: &&Link| l.queries.lock().unwrap_or_else(|p| p.into_inner()).awaits(id, *query);
            if let Some(link) = s.links.values().find(waits) {
                let ToCoordinator::QueryAnswer { query, answer } = m else { unreachable!() };
                link.queries.lock().unwrap_or_else(|p| p.into_inner()).answer(id, query, answer);
            }
            return;
        }
        ToCoordinator::Ready(a) => *a,
        ToCoordinator::DeployFailed { attempt, .. }
        | ToCoordinator::Event { attempt, .. }
        | ToCoordinator::Progress { attempt, .. }
        | ToCoordinator::PartEnded { attempt, .. }
        | ToCoordinator::LoopCounts { attempt, .. }
        | ToCoordinator::UpgradeArmed { attempt, .. } => *attempt,
    };
    // Messages of attempts no job runs any more, or from a worker the attempt's job does not
    // hold, are dropped.
    let Some(job) = s.leases.job_of(attempt).filter(|&j| s.leases.holder(id) == Some(j)) else { return };
    let Some(link) = s.links.get(&job) else { return };
    if let ToCoordinator::UpgradeArmed { attempt, task, id: chk } = m {
        if let Some(tx) = &link.armed {
            let _ = tx.send((id, attempt, task, chk));
        }
    } else {
        let _ = link.notes.send(Note::Message(id, m));
    }
}

/// Worker `id` is lost: its connection is closed, and every job hears it.
fn lose(s: &mut State, id: u64) {
    cut(s, id);
    for link in s.links.values() {
        let _ = link.notes.send(Note::Lost(id));
    }
}

/// Worker `id` leaves the roster and its connection is closed.
fn cut(s: &mut State, id: u64) {
    s.roster.remove(id);
    if let Some(w) = s.conns.remove(&id) {
        w.tx.close();
    }
    s.leases.lost(id);
}

fn label(s: &State, id: u64) -> String {
    s.conns.get(&id).map_or_else(|| format!("#{id}"), WorkerConn::label)
}

/// One job's view of the hub: its news, and its placements into the workers.
pub struct JobLink {
    hub: Arc<Hub>,
    key: JobKey,
    notes: Receiver<Note>,
    /// State queries sent to workers of the job's current attempt.
    pub queries: Arc<Mutex<PendingQueries>>,
}

impl JobLink {
    /// The hub.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Waits up to `timeout` for news.
    pub fn poll(&self, timeout: Duration) -> Option<Note> {
        self.notes.recv_timeout(timeout).ok()
    }

    /// Places the next attempt of `plan` into the workers free or held by this job (at least
    /// `min_workers` must have registered), or says what the job waits for.
    pub fn place(&self, plan: &PhysicalPlan, min_workers: usize) -> Result<Placed, Short> {
        let mut s = self.hub.lock();
        let open = s.leases.open_to(self.key, &s.roster.ids());
        let slots: Vec<u32> = open.iter().map(|&id| s.roster.slots_of(id)).collect();
        let short = Short { have: slots.iter().sum(), workers: s.roster.len(), others: s.roster.len() - open.len() };
        // While it waits, what it held is free for the other jobs (its last attempt is over).
        if s.roster.len() < min_workers {
            s.leases.idle(self.key);
            return Err(short);
        }
        let Ok(placement) = Placement::spread(plan, &slots) else {
            s.leases.idle(self.key);
            return Err(short);
        };
        let used: Vec<usize> = (0..open.len()).filter(|w| placement.worker_of.contains(w)).collect();
        let worker_of: Vec<u32> =
            placement.worker_of.iter().map(|w| used.iter().position(|u| u == w).expect("used") as u32).collect();
        let members: Vec<u64> = used.iter().map(|&w| open[w]).collect();
        let attempt = s.leases.take(self.key, &members);
        let peers = members.iter().map(|id| s.conns[id].data_addr).collect();
        Ok(Placed { attempt, members, worker_of, peers })
    }

    /// Sends `m` to worker `id` (nothing if it is gone).
    pub fn send(&self, id: u64, m: &ToWorker) {
        if let Some(w) = self.hub.lock().conns.get(&id) {
            let _ = w.tx.send(m);
        }
    }

    /// Worker `id`'s connection, while it is registered.
    pub fn tx(&self, id: u64) -> Option<PipeTx<ToWorker>> {
        self.hub.lock().conns.get(&id).map(|w| w.tx.clone())
    }

    /// Ships an attempt's components (digest, bytes) to those of `members` that do not have
    /// them. A worker may remove the others once it deploys the attempt (it keeps components
    /// within a cap, `component_store.rs`), so from here on only these count as its.
    pub fn ship(&self, members: &[u64], components: &[(&str, &[u8])]) {
        let mut s = self.hub.lock();
        for id in members {
            let Some(w) = s.conns.get_mut(id) else { continue };
            let mut now = HashSet::new();
            for (digest, bytes) in components {
                if !w.shipped.contains(*digest) {
                    let _ = w.tx.send(&ToWorker::Component { digest: digest.to_string(), bytes: bytes.to_vec() });
                }
                now.insert(digest.to_string());
            }
            w.shipped = now;
        }
    }

    /// Notes that worker `member` was sent the component `digest` (by a live upgrade).
    pub fn shipped(&self, member: u64, digest: String) {
        if let Some(w) = self.hub.lock().conns.get_mut(&member) {
            w.shipped.insert(digest);
        }
    }

    /// Drops worker `id` from the cluster (it failed this job's protocol; only a worker this
    /// job holds), saying `what` it did. The round that dropped it knows; no job holds it.
    pub fn drop_worker(&self, id: u64, what: &str) {
        let mut s = self.hub.lock();
        if s.leases.holder(id) != Some(self.key) {
            return;
        }
        if s.conns.contains_key(&id) {
            tracing::warn!("worker {} {what}; dropping it", label(&s, id));
        }
        cut(&mut s, id);
    }

    /// Worker `id` as logs name it.
    pub fn label(&self, id: u64) -> String {
        label(&self.hub.lock(), id)
    }

    /// Worker `id`'s name alone (`#id` once it is gone).
    pub fn name(&self, id: u64) -> String {
        self.hub.lock().conns.get(&id).map_or_else(|| format!("#{id}"), |c| c.name.clone())
    }

    /// Where this job's `UpgradeArmed` messages go (none: dropped).
    pub fn set_armed(&self, tx: Option<Sender<Armed>>) {
        if let Some(l) = self.hub.lock().links.get_mut(&self.key) {
            l.armed = tx;
        }
    }
}

impl Drop for JobLink {
    fn drop(&mut self) {
        let mut s = self.hub.lock();
        s.links.remove(&self.key);
        // A job that ends mid-attempt (its thread failed) leaves nothing running on its
        // workers: they cancel it (a no-op for an attempt that has ended).
        if let (held, Some(attempt)) = s.leases.held_by(self.key) {
            for id in held {
                if let Some(w) = s.conns.get(&id) {
                    let _ = w.tx.send(&ToWorker::Cancel(attempt));
                }
            }
        }
        s.leases.release(self.key);
    }
}
