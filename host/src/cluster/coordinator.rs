//! `weir coordinator`: the job manager of a cluster. Workers connect and register their slots;
//! each attempt of a job is placed into those slots (`graph/placement.rs`), deployed in two
//! phases (every worker builds its part and expects its incoming channels, then all start),
//! and checkpointed by the same checkpoint coordinator and restart loop as in one process
//! (`runtime/driver.rs`, `runtime/executor.rs`): triggers and acks cross the network.
//!
//! The workers' connections are the coordinator's [`Hub`] (`hub.rs`), shared by the jobs it
//! runs: each job ([`Cluster`]) places its attempts into the workers free for it or its own.
//!
//! Invariants: an attempt fails as soon as one of its workers is lost (connection closed, or
//! no message within the heartbeat timeout: the connection is then closed, so a paused worker
//! that wakes up finds itself cut off and cancels its subtasks); the other workers are
//! cancelled before the next attempt is deployed, under a new attempt number that fences the
//! old one's channels, acks and part ends; a worker's registration is refused if its protocol
//! differs.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};

use crate::checkpoint::subset::Subset;
use crate::cluster::hub::{Armed, Hub, JobLink, Note, Placed};
use crate::cluster::pipe::PipeTx;
use crate::cluster::protocol::{
    AttemptNo, Deploy, NodeProgress, TenantBounds, ToCoordinator, ToWorker, WireControl, WireFailure,
};
use crate::cluster::queries::PendingQueries;
use crate::cluster::round::{Action, Fault, Outcome, Round};
use crate::graph::physical::PhysicalPlan;
use crate::ids::{CheckpointId, SubtaskIndex, TaskId};
use crate::job::bind::BoundJob;
use crate::operator::OperatorFactory;
use crate::runtime::control::{Control, Controls, Event};
use crate::runtime::error::{RunError, TaskFailure};
use crate::runtime::executor::{AttemptEnd, RunOptions, RunSummary, run_deployed};
use crate::runtime::latency::{LatencyHistogram, WireLatency};
use crate::runtime::local::{self, Attempt};
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::net::tls::ClusterTls;
use crate::runtime::termination::{LoopCounts, WaveStep, Waves};

/// How the coordinator runs.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Control address workers connect to.
    pub listen: SocketAddr,
    /// The cluster secret.
    pub secret: String,
    /// Mutual TLS with the workers (else plain TCP).
    pub tls: Option<ClusterTls>,
    /// Workers send a heartbeat this often.
    pub heartbeat: Duration,
    /// A worker silent this long is lost.
    pub heartbeat_timeout: Duration,
    /// How long an attempt waits for enough slots before the job fails.
    pub slot_wait: Duration,
    /// A worker that has not built its part of an attempt this long after the deployment is
    /// dropped (the attempt restarts without it).
    pub deploy_timeout: Duration,
    /// The first attempt waits for this many workers (so a job spreads over the cluster
    /// being started, not over its first worker); restarts need only enough slots.
    pub min_workers: usize,
    /// The leader epoch (`cluster/ha.rs`; 0 without high availability): attempt numbers
    /// start at [`attempt_base`] of it.
    pub epoch: u64,
}

/// The job file a job was loaded from (workers parse the same text).
#[derive(Debug, Clone)]
pub struct JobSource {
    /// Its path.
    pub path: std::path::PathBuf,
    /// Its text.
    pub text: String,
}

/// One job's attempts on the cluster's workers: the shell around [`Round`], over the
/// coordinator's [`Hub`] (shared with its other jobs).
pub struct Cluster {
    cfg: CoordinatorConfig,
    link: JobLink,
    clock: Instant,
    /// Whether an attempt was placed (the first waits for `min_workers`).
    placed: bool,
}

impl Cluster {
    /// Listens for workers, for one job.
    pub fn start(cfg: CoordinatorConfig) -> std::io::Result<Cluster> {
        Ok(Cluster::on(&Hub::start(cfg)?))
    }

    /// A job on the workers of `hub`.
    pub fn on(hub: &Arc<Hub>) -> Cluster {
        Cluster { cfg: hub.config().clone(), link: hub.join(), clock: Instant::now(), placed: false }
    }

    /// Where workers connect.
    pub fn addr(&self) -> SocketAddr {
        self.link.hub().addr()
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// Runs `job` on the cluster's workers until it finishes, restarting after failures as
    /// its restart strategy allows.
    /// The coordinator loads only the sinks' part of a checkpoint (`checkpoint/subset.rs`):
    /// each worker downloads what its own subtasks restore from.
    pub fn run(&mut self, job: &BoundJob, source: &JobSource, opts: &RunOptions) -> Result<RunSummary, RunError> {
        let sinks = |m: &crate::checkpoint::metadata::Manifest| Subset::sinks(m, &job.graph);
        run_deployed(job, opts, &sinks, &mut |a| self.run_attempt(a, source))
    }

    /// Waits for news from the workers about this job.
    fn poll(&mut self, timeout: Duration) -> Option<Note> {
        self.link.poll(timeout)
    }

    /// Places the next attempt once the workers free for this job offer the slots it needs
    /// (or the job's user cancels it).
    fn place(&mut self, job: &str, plan: &PhysicalPlan, cancel: Option<&AtomicBool>) -> Result<Placed, RunError> {
        let needed = plan.subtasks.iter().map(|s| s.subtask + 1).max().unwrap_or(0);
        let deadline = Instant::now() + self.cfg.slot_wait;
        let mut said = false;
        let workers = if self.placed { 0 } else { self.cfg.min_workers };
        loop {
            let short = match self.link.place(plan, workers) {
                Ok(p) => {
                    self.placed = true;
                    return Ok(p);
                }
                Err(short) => short,
            };
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Err(RunError::Cancelled { job: job.into() });
            }
            if Instant::now() > deadline {
                return Err(RunError::Setup {
                    job: job.into(),
                    message: format!(
                        "it needs {needed} slot(s) on at least {workers} worker(s) and the cluster offers {} after \
                         waiting {} s; start more workers (`weir worker --coordinator {} --slots N`)",
                        short.offer(),
                        self.cfg.slot_wait.as_secs(),
                        self.addr()
                    ),
                });
            }
            if !said {
                tracing::info!(
                    job = %job,
                    "job `{job}` waits for {needed} slot(s) on at least {workers} worker(s); the cluster offers {}",
                    short.offer()
                );
                said = true;
            }
            // Messages of earlier attempts are dropped here.
            let _ = self.poll(Duration::from_millis(100));
        }
    }

    /// Deploys, starts and follows one attempt to its end.
    fn run_attempt(&mut self, a: &Attempt<'_>, source: &JobSource) -> Result<AttemptEnd, RunError> {
        let g = &a.job.graph;
        if let Some(end) = local::prepare(a)? {
            return Ok(end);
        }
        let plan = PhysicalPlan::of(g);
        let cancel = a.opts.endpoint.as_ref().map(|e| e.cancel.clone());
        let Placed { attempt, members, worker_of, peers } = self.place(&g.name, &plan, cancel.as_deref())?;
        let components = self.ship_components(a, &members);
        let tenant = a.opts.disk_budget.as_ref().map(|b| {
            let (name, dir, max_disk_mb) = b.terms();
            TenantBounds { name: name.into(), dir: dir.into(), max_disk_mb }
        });
        for (i, &id) in members.iter().enumerate() {
            let d = Deploy {
                attempt,
                job_path: source.path.clone(),
                job_source: source.text.clone(),
                components: components.clone(),
                // Workers share no disk with the coordinator: a downloaded checkpoint is
                // restored from its object store by each of them too.
                restore: a.restore.map(|c| c.url.as_ref().map_or_else(|| c.path.clone(), std::path::PathBuf::from)),
                allow_non_restored_state: a.opts.allow_non_restored_state,
                restarts: a.attempt,
                worker_of: worker_of.clone(),
                peers: peers.clone(),
                you: i as u32,
                tenant: tenant.clone(),
            };
            self.link.send(id, &ToWorker::Deploy(Box::new(d)));
        }
        // A tenant's job names workers without their addresses (its failure causes reach it).
        let label = |id: u64| if tenant.is_some() { self.link.name(id) } else { self.link.label(id) };
        let labels: BTreeMap<u64, String> = members.iter().map(|id| (*id, label(*id))).collect();
        tracing::info!(
            job = %g.name,
            "job `{}` attempt {attempt}: {} subtasks on {}",
            g.name,
            plan.subtasks.len(),
            labels.values().cloned().collect::<Vec<_>>().join(", ")
        );
        let first_task = |id: u64| {
            let w = members.iter().position(|&m| m == id).expect("member");
            let si = worker_of.iter().position(|&x| x as usize == w).unwrap_or(0);
            let s = &plan.subtasks[si];
            TaskId { node: g.nodes[s.node].id.clone(), subtask: SubtaskIndex(s.subtask) }
        };
        let run = Running { members: &members, labels: &labels, worker_of: &worker_of, plan: &plan };
        let deadline = self.now() + self.cfg.deploy_timeout.as_millis() as u64;
        let mut round = Round::new(attempt, members.clone(), self.cfg.heartbeat_timeout.as_millis() as u64)
            .with_deploy_deadline(deadline);
        if let Some(end) = self.await_ready(a, &mut round, &run, &first_task)? {
            return Ok(end);
        }
        self.follow(a, &mut round, &run, &first_task)
    }

    /// Ships each operator's component to the workers that do not have it; returns the
    /// digest per operator uid.
    fn ship_components(&mut self, a: &Attempt<'_>, members: &[u64]) -> BTreeMap<String, String> {
        let g = &a.job.graph;
        let mut digests = BTreeMap::new();
        let live = a.live.lock().unwrap();
        let mut components = Vec::new();
        for (&node, (factory, _)) in live.iter() {
            let OperatorFactory::Wasm(c) = factory else { continue };
            components.push((c.sha256.as_str(), &c.bytes[..]));
            digests.insert(g.nodes[node].id.to_string(), c.sha256.clone());
        }
        self.link.ship(members, &components);
        digests
    }

    /// Carries out the round's actions; returns its outcome once it is over.
    fn act(&mut self, round: &Round<WireFailure>, actions: Vec<Action<WireFailure>>) -> Option<Outcome<WireFailure>> {
        let mut over = None;
        for action in actions {
            match action {
                Action::Start => self.tell(round, ToWorker::Start(round.attempt())),
                Action::Cancel => self.tell(round, ToWorker::Cancel(round.attempt())),
                Action::Drop(id) => {
                    let what = if round.is_started() {
                        "did not stop its subtasks when cancelled"
                    } else {
                        "did not build its part of the attempt within the deploy timeout"
                    };
                    self.link.drop_worker(id, what);
                }
                Action::Over(o) => over = Some(o),
            }
        }
        over
    }

    fn tell(&self, round: &Round<WireFailure>, m: ToWorker) {
        for &id in round.members() {
            self.link.send(id, &m);
        }
    }

    /// Waits until every member built its part and starts them (`None`), or the attempt
    /// cannot start.
    fn await_ready(
        &mut self,
        a: &Attempt<'_>,
        round: &mut Round<WireFailure>,
        run: &Running<'_>,
        first_task: &dyn Fn(u64) -> TaskId,
    ) -> Result<Option<AttemptEnd>, RunError> {
        let cancel = a.opts.endpoint.as_ref().map(|e| e.cancel.clone());
        while !round.is_started() {
            let note = self.poll(Duration::from_millis(100));
            let now = self.now();
            if cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                // Built parts are dropped before anything of them runs.
                let actions = round.on_cancel_requested(now);
                self.act(round, actions);
                return Err(RunError::Cancelled { job: a.job.graph.name.clone() });
            }
            let mut actions = match note {
                Some(Note::Message(id, ToCoordinator::Ready(n))) => round.on_ready(id, n),
                Some(Note::Message(id, ToCoordinator::DeployFailed { attempt: n, failure })) => {
                    let setup = failure.setup;
                    round.on_deploy_failed(id, n, failure, setup, now)
                }
                Some(Note::Lost(id)) => round.on_lost(id, now),
                _ => Vec::new(),
            };
            if actions.is_empty() {
                actions = round.on_tick(now);
            }
            match self.act(round, actions) {
                Some(Outcome::Setup(id, f)) => {
                    return Err(RunError::Setup {
                        job: a.job.graph.name.clone(),
                        message: format!("on worker {}: {}", run.labels[&id], f.message),
                    });
                }
                Some(Outcome::Ended(faults)) => {
                    let failure = faults.into_iter().map(|f| run.failure(f, first_task)).next();
                    let failure = failure.expect("a round over before its start has a fault");
                    return Ok(Some(AttemptEnd::Failed(failure)));
                }
                None => {}
            }
        }
        Ok(None)
    }

    /// Runs the checkpoint coordinator of a started attempt and collects its workers' ends.
    fn follow(
        &mut self,
        a: &Attempt<'_>,
        round: &mut Round<WireFailure>,
        run: &Running<'_>,
        first_task: &dyn Fn(u64) -> TaskId,
    ) -> Result<AttemptEnd, RunError> {
        let g = &a.job.graph;
        let stop = Arc::new(AtomicBool::new(false));
        let (events_tx, events_rx) = unbounded::<Event>();
        let mut forwarder = None;
        let driver = match a.store {
            Some(store) => {
                let mut routes = Vec::new();
                for (si, &w) in run.worker_of.iter().enumerate() {
                    let member = run.members[w as usize];
                    let uid = g.nodes[run.plan.subtasks[si].node].id.to_string();
                    routes.push(Route { member, uid, tx: self.link.tx(member) });
                }
                let (controls, ordered) = unbounded::<(usize, Control)>();
                let (armed_tx, armed) = unbounded();
                self.link.set_armed(Some(armed_tx));
                let forward = Forward {
                    attempt: round.attempt(),
                    routes,
                    queries: self.link.queries.clone(),
                    shipped: HashSet::new(),
                    arming: None,
                    held: Vec::new(),
                    armed,
                    stop: stop.clone(),
                };
                forwarder = Some(std::thread::spawn(move || forward.run(ordered)));
                let controls = Controls::Ordered(controls);
                let dcfg = local::driver_config(a, store, local::task_templates(run.plan));
                Some(local::start_driver(a, store, dcfg, controls, events_rx, &stop)?)
            }
            None => None,
        };
        // Without checkpoints nothing answers the job's requests: they are refused saying why.
        let ended = Arc::new(AtomicBool::new(false));
        let refuser = match (&a.opts.endpoint, a.store) {
            (Some(e), None) => {
                let (e, ended, job) = (e.clone(), ended.clone(), g.name.clone());
                let unused = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
                Some(std::thread::spawn(move || local::watch(e, unused.0, unused.1, ended, false, job)))
            }
            _ => None,
        };
        let metrics: Vec<Arc<NodeMetrics>> =
            g.nodes.iter().map(|n| Arc::new(NodeMetrics::new(n.parallelism))).collect();
        if let Some(e) = &a.opts.endpoint {
            *e.metrics.lock().unwrap() = metrics.clone();
        }
        let user_cancel = a.opts.endpoint.as_ref().map(|e| e.cancel.clone());
        let mut failures =
            self.collect_ends(g, round, run, &events_tx, &stop, &metrics, first_task, user_cancel.as_deref());
        stop.store(true, Ordering::Relaxed);
        drop(events_tx);
        let coordinator_end = driver.map(|d| d.join());
        // The forwarder ends with the driver's sender; no query is asked after this.
        if let Some(Ok(shipped)) = forwarder.map(|f| f.join()) {
            // An upgrade's component is not shipped again to a worker that has it.
            for (member, digest) in shipped {
                self.link.shipped(member, digest);
            }
        }
        ended.store(true, Ordering::Relaxed);
        if let Some(r) = refuser {
            let _ = r.join();
        }
        self.link
            .queries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fail_all("the job's attempt ended before answering");
        self.link.set_armed(None);
        let finished = matches!(coordinator_end, Some(Ok(crate::runtime::driver::DriverEnd::Finished(_))));
        if failures.is_empty() && !finished && user_cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            // Cancelled by its user: the parts stopped as told, and the job ends cancelled.
            failures.push(TaskFailure::Cancelled { task: first_task(run.members[0]) });
        }
        local::attempt_end(g, failures, coordinator_end, &metrics)
    }

    /// Feeds the attempt's events to its checkpoint coordinator until the round is over;
    /// returns the failures.
    #[allow(clippy::too_many_arguments)]
    fn collect_ends(
        &mut self,
        g: &crate::graph::logical::JobGraph,
        round: &mut Round<WireFailure>,
        run: &Running<'_>,
        events: &Sender<Event>,
        stop: &AtomicBool,
        metrics: &[Arc<NodeMetrics>],
        first_task: &dyn Fn(u64) -> TaskId,
        user_cancel: Option<&AtomicBool>,
    ) -> Vec<TaskFailure> {
        let mut loops = g.is_cyclic().then(|| LoopWatch::new(round.members().to_vec()));
        let mut abandoned = NodeTotals::default();
        loop {
            let wait = loops.as_ref().map_or(100, |l| l.due_in(self.now()).clamp(1, 100));
            let note = self.poll(Duration::from_millis(wait));
            let now = self.now();
            let mut actions = match note {
                Some(Note::Message(id, ToCoordinator::LoopCounts { attempt, wave, counts })) => {
                    // Also from a member whose part has ended (it keeps answering for it).
                    let current = round.is_started() && attempt == round.attempt() && round.members().contains(&id);
                    if current
                        && let Some(l) = loops.as_mut()
                        && l.on_counts(id, wave, counts, now)
                    {
                        self.tell(round, ToWorker::LoopQuiescent(attempt));
                    }
                    Vec::new()
                }
                Some(Note::Message(id, ToCoordinator::Event { attempt, event })) if round.counts_event(id, attempt) => {
                    // Only events of subtasks this worker runs reach the checkpoint coordinator.
                    if run.runs(id, event_task(&event)) {
                        let _ = events.send(event);
                    } else {
                        tracing::warn!(
                            "worker {} sent an event for a subtask it does not run; dropped",
                            run.labels[&id]
                        );
                    }
                    Vec::new()
                }
                Some(Note::Message(id, ToCoordinator::Progress { attempt, subtasks, nodes })) => {
                    if round.counts_event(id, attempt) {
                        set_progress(run, metrics, id, subtasks);
                        abandoned.set_nodes(metrics, id, nodes);
                    }
                    Vec::new()
                }
                Some(Note::Message(id, ToCoordinator::PartEnded { attempt, failures, latency })) => {
                    if round.counts_event(id, attempt) {
                        add_latency(g, metrics, latency);
                    }
                    round.on_part_ended(id, attempt, failures, now)
                }
                Some(Note::Lost(id)) => round.on_lost(id, now),
                _ => Vec::new(),
            };
            if let Some(wave) = loops.as_mut().and_then(|l| l.probe(now)).filter(|_| !round.is_over()) {
                self.tell(round, ToWorker::LoopProbe { attempt: round.attempt(), wave });
            }
            // A member that does not end its part within the heartbeat timeout of being
            // cancelled (stuck behind a peer that stopped reading) is dropped like a lost one.
            actions.extend(round.on_tick(now));
            if user_cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                actions.extend(round.on_cancel_requested(now));
            }
            if actions.contains(&Action::Cancel) {
                stop.store(true, Ordering::Relaxed);
            }
            if let Some(outcome) = self.act(round, actions) {
                let Outcome::Ended(faults) = outcome else { unreachable!("a started round has no setup outcome") };
                return faults.into_iter().map(|f| run.failure(f, first_task)).collect();
            }
        }
    }
}

/// A job with loops: probes the members' record counts in waves until the job is quiescent
/// (`runtime/termination.rs` decides), every 200 ms while a source runs, then every 20 ms.
struct LoopWatch {
    waves: Waves,
    /// When the next probe is due, unless one is out.
    next_at: u64,
    out: bool,
    done: bool,
}

impl LoopWatch {
    fn new(members: Vec<u64>) -> Self {
        LoopWatch { waves: Waves::new(members), next_at: 0, out: false, done: false }
    }

    /// Milliseconds until a probe is due (long when one is out or all is decided).
    fn due_in(&self, now: u64) -> u64 {
        if self.out || self.done { 100 } else { self.next_at.saturating_sub(now) }
    }

    /// The wave to probe now, if one is due.
    fn probe(&mut self, now: u64) -> Option<u64> {
        if self.out || self.done || now < self.next_at {
            return None;
        }
        self.out = true;
        Some(self.waves.probe())
    }

    /// A member's counts; `true` once the job is found quiescent.
    fn on_counts(&mut self, member: u64, wave: u64, counts: LoopCounts, now: u64) -> bool {
        match self.waves.on_report(member, wave, counts) {
            WaveStep::Pending => false,
            WaveStep::Closed { sources_running } => {
                self.out = false;
                self.next_at = now + if sources_running == 0 { 20 } else { 200 };
                false
            }
            WaveStep::Quiescent => {
                self.done = true;
                true
            }
        }
    }
}

/// A started attempt.
struct Running<'a> {
    members: &'a [u64],
    labels: &'a BTreeMap<u64, String>,
    /// Per global task: the index in `members` of its worker.
    worker_of: &'a [u32],
    plan: &'a PhysicalPlan,
}

impl Running<'_> {
    /// Whether member `id` runs global task `task`.
    fn runs(&self, id: u64, task: usize) -> bool {
        self.worker_of.get(task).is_some_and(|&w| self.members.get(w as usize) == Some(&id))
    }

    /// A round's fault as a task failure (a part-wide one is blamed on the member's first
    /// subtask).
    fn failure(&self, f: Fault<WireFailure>, first_task: &dyn Fn(u64) -> TaskId) -> TaskFailure {
        match f {
            Fault::Lost(id) => lost(first_task(id), &self.labels[&id]),
            Fault::Reported(id, w) => {
                let part_wide = w.node == "-";
                let mut f = w.into_failure(&self.labels[&id]);
                if part_wide && let TaskFailure::Remote { task, .. } = &mut f {
                    *task = first_task(id);
                }
                f
            }
        }
    }
}

/// A worker's reading of its subtasks' counters becomes theirs here (what it reports of a
/// subtask it does not run is dropped).
fn set_progress(
    run: &Running<'_>,
    metrics: &[Arc<NodeMetrics>],
    member: u64,
    subtasks: Vec<(u64, crate::runtime::metrics::Counters, Option<i64>)>,
) {
    for (task, counters, watermark) in subtasks {
        let Some(s) = run.plan.subtasks.get(task as usize).filter(|_| run.runs(member, task as usize)) else {
            continue;
        };
        if let Some(m) = metrics.get(s.node) {
            m.subtask(s.subtask).set(counters, watermark);
        }
    }
}

/// What workers report per node: peaks are the largest any reported, counts their sum.
#[derive(Default)]
struct NodeTotals {
    /// Snapshots abandoned, per (worker, node), as last reported.
    abandoned: BTreeMap<(u64, usize), u64>,
}

impl NodeTotals {
    fn set_nodes(&mut self, metrics: &[Arc<NodeMetrics>], member: u64, nodes: Vec<NodeProgress>) {
        for p in nodes {
            let node = p.node as usize;
            let Some(m) = metrics.get(node) else { continue };
            m.feedback_peak_batches.fetch_max(p.feedback_peak_batches, Ordering::Relaxed);
            m.snapshot_chunks_max.fetch_max(p.snapshot_chunks_max, Ordering::Relaxed);
            self.abandoned.insert((member, node), p.snapshots_abandoned);
            let sum = self.abandoned.iter().filter(|((_, n), _)| *n == node).map(|(_, v)| v).sum();
            m.snapshots_abandoned.store(sum, Ordering::Relaxed);
        }
    }
}

/// Adds a part's latency histograms to the attempt's metrics (a histogram that does not
/// decode is dropped with a warning).
fn add_latency(
    g: &crate::graph::logical::JobGraph,
    metrics: &[Arc<NodeMetrics>],
    latency: BTreeMap<String, WireLatency>,
) {
    let node = |uid: &str| g.nodes.iter().position(|n| n.id.as_str() == uid);
    for (uid, wire) in latency {
        let (Some(i), Some(h)) = (node(&uid), LatencyHistogram::from_wire(&wire)) else {
            tracing::warn!("a worker sent a latency histogram for `{uid}` that does not fit; dropped");
            continue;
        };
        let mut m = metrics[i].latency.lock().unwrap_or_else(|e| e.into_inner());
        m.get_or_insert_with(LatencyHistogram::default).merge(&h);
    }
}

/// The subtask (global task index) an event is about.
fn event_task(e: &Event) -> usize {
    match e {
        Event::Ack { task, .. }
        | Event::Decline { task, .. }
        | Event::Finished { task }
        | Event::UpgradePrepared { task, .. }
        | Event::UpgradeResumed { task, .. } => *task,
    }
}

/// A worker lost while it ran `task` (and maybe others).
fn lost(task: TaskId, worker: &str) -> TaskFailure {
    TaskFailure::Remote {
        task,
        worker: worker.to_string(),
        message: "the worker was lost (its connection closed or its heartbeats stopped)".into(),
        secondary: false,
        transient: true,
    }
}

/// Where one subtask's control messages go: the worker that runs it.
struct Route {
    member: u64,
    uid: String,
    tx: Option<PipeTx<ToWorker>>,
}

/// Carries the checkpoint coordinator's messages to the workers of their subtasks, in the
/// order it sent them per subtask, until it drops its sender (or the attempt is over). A live
/// upgrade's component goes ahead of its `PrepareUpgrade` (once per worker); that checkpoint's
/// trigger, and whatever follows it to the same subtask, is held until every subtask of the
/// operator has the upgrade in its queue (`UpgradeArmed`), since the barrier travels another
/// path (through the sources and the data plane) and must not overtake it; every other
/// subtask's messages go on meanwhile. A state query's reply waits in the table of queries in
/// flight.
struct Forward {
    attempt: AttemptNo,
    routes: Vec<Route>,
    queries: Arc<Mutex<PendingQueries>>,
    /// (member, digest) of the components shipped for upgrades.
    shipped: HashSet<(u64, String)>,
    /// The upgrade's checkpoint and the subtasks not armed yet.
    arming: Option<(CheckpointId, BTreeSet<u64>)>,
    /// Held behind the upgrade's trigger, in order.
    held: Vec<(usize, Control)>,
    /// `(member, attempt, task, checkpoint)` of each `UpgradeArmed`.
    armed: Receiver<Armed>,
    /// Set when the attempt is over.
    stop: Arc<AtomicBool>,
}

impl Forward {
    /// Runs until the driver is done or the attempt is over; the components it shipped, per
    /// worker.
    fn run(mut self, controls: Receiver<(usize, Control)>) -> HashSet<(u64, String)> {
        while !self.stop.load(Ordering::Relaxed) {
            crossbeam_channel::select! {
                recv(controls) -> m => match m {
                    Ok((task, c)) => self.take(task, c),
                    Err(_) => break,
                },
                recv(self.armed) -> a => {
                    if let Ok(a) = a {
                        self.on_armed(a);
                    }
                }
                default(Duration::from_millis(100)) => {}
            }
        }
        self.shipped
    }

    /// Forwards `c`, or holds it behind the upgrade's trigger.
    fn take(&mut self, task: usize, c: Control) {
        let behind_trigger = self.held.iter().any(|(t, _)| *t == task);
        let is_held_trigger = matches!(&c, Control::Trigger(id) if self.arming.as_ref().is_some_and(|(a, _)| a == id));
        if behind_trigger || is_held_trigger {
            self.held.push((task, c));
        } else {
            self.forward(task, c);
        }
    }

    /// A worker's `UpgradeArmed`: once every subtask is armed, what was held goes out.
    fn on_armed(&mut self, (member, attempt, task, id): Armed) {
        let from_its_worker = self.routes.get(task as usize).is_some_and(|r| r.member == member);
        let Some((arming, waiting)) = self.arming.as_mut() else { return };
        if attempt != self.attempt || *arming != id || !from_its_worker {
            return;
        }
        waiting.remove(&task);
        if waiting.is_empty() {
            self.arming = None;
            for (task, c) in std::mem::take(&mut self.held) {
                self.forward(task, c);
            }
        }
    }

    fn forward(&mut self, task: usize, c: Control) {
        let Some(r) = self.routes.get(task) else { return };
        let Some(tx) = &r.tx else { return };
        let control = match c {
            Control::Query(q) => {
                let Some(query) = self.queries.lock().unwrap_or_else(|p| p.into_inner()).ask(r.member, q.reply) else {
                    return;
                };
                let (operator, subtask, state, key_group, key) = (q.operator, q.subtask, q.state, q.key_group, q.key);
                WireControl::Query { query, operator, subtask, state, key_group, key }
            }
            Control::PrepareUpgrade { id, factory } => {
                let OperatorFactory::Wasm(c) = factory else {
                    tracing::warn!("only WebAssembly operators are upgraded on a cluster; {} was not", r.uid);
                    return;
                };
                if self.shipped.insert((r.member, c.sha256.clone())) {
                    let _ = tx.send(&ToWorker::Component { digest: c.sha256.clone(), bytes: c.bytes.to_vec() });
                }
                match &mut self.arming {
                    Some((a, waiting)) if *a == id => {
                        waiting.insert(task as u64);
                    }
                    _ => self.arming = Some((id, BTreeSet::from([task as u64]))),
                }
                WireControl::PrepareUpgrade { id, operator: r.uid.clone(), digest: c.sha256.clone() }
            }
            other => match WireControl::of(&other) {
                Some(w) => w,
                None => return tracing::warn!("{other:?} cannot reach a subtask on another worker; dropped"),
            },
        };
        let _ = tx.send(&ToWorker::Control { attempt: self.attempt, task: task as u64, control });
    }
}
