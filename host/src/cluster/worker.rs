//! `weir worker`: runs the subtasks the coordinator places in its slots. It connects to the
//! coordinator, registers its slots and data address, and then builds, starts and cancels its
//! part of each attempt as told; channels to subtasks on other workers go over the data plane
//! (`runtime/net/link.rs`), the rest stay in memory. Checkpoint state goes to the job's
//! checkpoint storage through this worker's writer; acks go to the coordinator.
//!
//! Invariants: one attempt at a time — a deployment first cancels the previous one and fences
//! its channels, so nothing of an older attempt is delivered here; when the coordinator's
//! connection ends, every running subtask is cancelled before the worker registers again (a
//! worker cut off from its coordinator never commits on its own: commits follow `Complete`
//! messages only); components are run only if their bytes match the digest they were
//! shipped under.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use wasmtime::Engine;

use crate::checkpoint::metadata::Manifest;
use crate::checkpoint::mirror;
use crate::checkpoint::storage::{self, CheckpointStore, LoadedCheckpoint};
use crate::checkpoint::subset::Subset;
use crate::cluster::component_store::ComponentStore;
use crate::cluster::discovery::{Coordinators, Discovery, Waiting};
use crate::cluster::follower::{DeployStep, Follower};
use crate::cluster::pipe::{self, PipeTx};
use crate::cluster::protocol::{
    AttemptNo, Deploy, NodeProgress, PROTOCOL_VERSION, ToCoordinator, ToWorker, WireControl, WireFailure,
};
use crate::disk_budget::DiskBudget;
use crate::graph::physical::PhysicalPlan;
use crate::ids::{NodeId, SubtaskIndex, TaskId};
use crate::job::bind::BoundJob;
use crate::operator::OperatorFactory;
use crate::runtime::control::Control;
use crate::runtime::driver::Completed;
use crate::runtime::error::TaskFailure;
use crate::runtime::executor::{Live, RunOptions, resolve_components};
use crate::runtime::local::{self, Attempt, Outgoing, Part, Threads};
use crate::runtime::net::forward::Forward;
use crate::runtime::net::link::{ChannelKey, Inbound, Outbound};
use crate::runtime::net::tls::ClusterTls;
use crate::runtime::query::StateQuery;
use crate::runtime::subtask::StartError;
use crate::runtime::termination::LoopTermination;
use crate::sandbox::instance::{LoadedComponent, sha256_hex};

/// How long a subtask may take to answer a state query (the API's own timeout).
const QUERY_TIMEOUT: Duration = Duration::from_secs(120);

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Name in logs and errors.
    pub name: String,
    /// Where the coordinators are: the worker registers with whichever leads (standbys do not
    /// listen), trying a list in turn or asking etcd for the leader.
    pub coordinators: Coordinators,
    /// The cluster secret.
    pub secret: String,
    /// Mutual TLS with the coordinator and the peers (else plain TCP).
    pub tls: Option<ClusterTls>,
    /// Slices of a job it runs.
    pub slots: u32,
    /// Where peers open channels to it.
    pub data_listen: SocketAddr,
    /// The address peers are told to use (default: the bound one; needed when listening on
    /// `0.0.0.0`, e.g. the pod's IP on Kubernetes).
    pub advertise: Option<SocketAddr>,
    /// Where shipped components are kept.
    pub dir: PathBuf,
    /// Components kept beyond those of the attempt it runs, at most (least recently used
    /// removed first; `component_store.rs`).
    pub components_max_bytes: u64,
}

/// Why a worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The coordinator refused it.
    #[error("the coordinator refused worker `{name}`: {why}")]
    Refused {
        /// This worker.
        name: String,
        /// Its words.
        why: String,
    },
    /// Setting up failed.
    #[error("worker `{name}`: {message}")]
    Setup {
        /// This worker.
        name: String,
        /// What.
        message: String,
    },
}

/// Everything an attempt's subtasks borrow, owned for the attempt's life.
struct Owned {
    job: Arc<BoundJob>,
    opts: RunOptions,
    restarts: u32,
    writer: AttemptNo,
    restore: Option<LoadedCheckpoint>,
    store: Option<CheckpointStore>,
    completed: Arc<Completed>,
    live: Live,
    dropped: BTreeMap<usize, Vec<String>>,
    /// Where a restore from the object store was downloaded: its subtasks read their keyed
    /// state from there as they restore (and again if the attempt restarts from it), so it
    /// goes with the attempt.
    _staging: Option<Staging>,
}

/// A directory removed when dropped.
struct Staging(std::path::PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Owned {
    fn attempt(&self) -> Attempt<'_> {
        Attempt {
            job: &self.job,
            opts: &self.opts,
            attempt: self.restarts,
            writer: self.writer,
            restore: self.restore.as_ref(),
            store: self.store.as_ref(),
            completed: &self.completed,
            live: &self.live,
            dropped: &self.dropped,
            nice: 0,
        }
    }
}

/// A deployed attempt, built but not started.
struct Prepared {
    owned: Arc<Owned>,
    part: Part,
    plan: PhysicalPlan,
    outgoing: Vec<Outgoing>,
    worker_of: Vec<u32>,
    peers: Vec<SocketAddr>,
    /// This worker's index in `peers`.
    you: u32,
}

/// The attempt this worker runs.
enum Current {
    Prepared(AttemptNo, Box<Prepared>),
    Running {
        controls: Vec<Option<Sender<Control>>>,
        termination: Option<Arc<LoopTermination>>,
        cancel: Arc<AtomicBool>,
        stop: Arc<AtomicBool>,
        runner: JoinHandle<()>,
    },
}

struct Worker {
    cfg: WorkerConfig,
    engine: Engine,
    inbound: Inbound,
    /// Where peers reach `inbound`.
    data_addr: SocketAddr,
    jobs: HashMap<String, Arc<BoundJob>>,
    current: Option<Current>,
    /// The protocol's decisions: whom to follow, which attempt to obey.
    follower: Follower,
    clock: Instant,
    /// Components of live upgrades, compiled, by digest (the subtasks of one operator on this
    /// worker share one compile).
    upgrades: HashMap<String, OperatorFactory>,
    /// Shipped components, by digest.
    components: ComponentStore,
}

/// Runs the worker until the coordinator refuses it; reconnects whenever the coordinator
/// goes away.
pub fn run(cfg: WorkerConfig, engine: Engine) -> Result<(), WorkerError> {
    let setup = |message: String| WorkerError::Setup { name: cfg.name.clone(), message };
    cfg.coordinators.check().map_err(setup)?;
    let components = ComponentStore::open(cfg.dir.join("components"), cfg.components_max_bytes)
        .map_err(|e| setup(format!("cannot create {}: {e}", cfg.dir.display())))?;
    let inbound = Inbound::bind(cfg.data_listen, &cfg.secret, cfg.tls.clone())
        .map_err(|e| setup(format!("cannot listen on {} for channels: {e}", cfg.data_listen)))?;
    let data_addr = match cfg.advertise {
        Some(a) => a,
        None if inbound.addr().ip().is_unspecified() => {
            return Err(setup(format!(
                "--listen {} is not an address peers can reach; add --advertise IP:{}",
                cfg.data_listen,
                inbound.addr().port()
            )));
        }
        None => inbound.addr(),
    };
    tracing::info!("worker `{}`: {} slot(s), channels on {data_addr}", cfg.name, cfg.slots);
    let mut w = Worker {
        cfg,
        engine,
        inbound,
        data_addr,
        jobs: HashMap::new(),
        current: None,
        follower: Follower::new(),
        clock: Instant::now(),
        upgrades: HashMap::new(),
        components,
    };
    let mut waiting = Waiting::default();
    let mut discovery = Discovery::new(w.cfg.coordinators.clone());
    let say = |waiting: &mut Waiting, name: &str, why: String| {
        if let Some(again) = waiting.says(&why, Instant::now()) {
            match again {
                false => tracing::info!("worker `{name}`: waiting for a coordinator ({why})"),
                true => tracing::warn!("worker `{name}`: still waiting for a coordinator ({why})"),
            }
        }
    };
    loop {
        let name = match discovery.next_address() {
            Ok(name) => name,
            Err(why) => {
                say(&mut waiting, &w.cfg.name, why);
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
        };
        // Resolved at every try: a coordinator's name may move (a Kubernetes pod restarted).
        let resolved = name.to_socket_addrs().map(|mut a| a.next());
        let Ok(Some(at)) = resolved else {
            say(&mut waiting, &w.cfg.name, format!("{name} does not resolve"));
            std::thread::sleep(Duration::from_millis(300));
            continue;
        };
        match pipe::connect::<ToWorker, ToCoordinator>(at, &w.cfg.secret, w.cfg.tls.as_ref()) {
            Ok((tx, rx)) => {
                waiting = Waiting::default();
                if w.session(at, &tx, &rx)? {
                    tracing::warn!("worker `{}`: lost the coordinator at {at}; reconnecting", w.cfg.name);
                }
            }
            Err(pipe::ConnectError::Refused(why)) => {
                if discovery.refused(&name, Instant::now()) {
                    return Err(WorkerError::Refused { name: w.cfg.name.clone(), why });
                }
                say(
                    &mut waiting,
                    &w.cfg.name,
                    format!("{at} refused it: {why}; etcd may still name a leader that is gone"),
                );
            }
            Err(e) => say(&mut waiting, &w.cfg.name, format!("{at}: {e}")),
        }
        // Cut off from the coordinator: nothing of its attempts may go on here.
        w.follower.disconnected();
        w.end_current();
        std::thread::sleep(Duration::from_millis(300));
    }
}

impl Worker {
    /// Serves one connection to the coordinator at `at` until it ends, or the coordinator is
    /// silent for five of its heartbeats, or it is of an older epoch than one followed before
    /// (a deposed leader). `true` if it was followed.
    fn session(
        &mut self,
        at: SocketAddr,
        tx: &PipeTx<ToCoordinator>,
        rx: &Receiver<ToWorker>,
    ) -> Result<bool, WorkerError> {
        let register = ToCoordinator::Register {
            name: self.cfg.name.clone(),
            data_addr: self.data_addr,
            slots: self.cfg.slots,
            protocol: PROTOCOL_VERSION,
        };
        if tx.send(&register).is_err() {
            return Ok(false);
        }
        let alive = Arc::new(AtomicBool::new(true));
        let _guard = Alive(alive.clone());
        self.follower.connected(self.now());
        loop {
            let m = match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(silence) = self.follower.silent(self.now()) {
                        tracing::warn!(
                            "worker `{}`: the coordinator at {at} sent nothing for {silence} ms; leaving it",
                            self.cfg.name,
                        );
                        tx.close();
                        return Ok(self.follower.following());
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(self.follower.following()),
            };
            self.follower.heard(self.now());
            match m {
                ToWorker::Heartbeat => {}
                ToWorker::Welcome { heartbeat_ms, epoch } => {
                    if let Err(why) = self.follower.on_welcome(epoch, heartbeat_ms, self.now()) {
                        tracing::warn!("worker `{}`: the coordinator at {at}: {why}; leaving it", self.cfg.name);
                        tx.close();
                        return Ok(false);
                    }
                    let (tx, alive) = (tx.clone(), alive.clone());
                    std::thread::spawn(move || {
                        while alive.load(Ordering::Relaxed) && tx.send(&ToCoordinator::Heartbeat).is_ok() {
                            std::thread::sleep(Duration::from_millis(heartbeat_ms.max(10)));
                        }
                    });
                    tracing::info!(
                        "worker `{}`: registered with the coordinator at {at} (epoch {epoch})",
                        self.cfg.name
                    );
                }
                ToWorker::Refused(why) => return Err(WorkerError::Refused { name: self.cfg.name.clone(), why }),
                ToWorker::Component { digest, bytes } => {
                    if let Err(e) = self.components.keep(&digest, &bytes) {
                        tracing::warn!("worker `{}`: {e}", self.cfg.name);
                    }
                }
                ToWorker::Deploy(d) => {
                    let attempt = d.attempt;
                    if self.follower.on_deploy(attempt) == DeployStep::Stale {
                        tracing::warn!("worker `{}`: ignored a deployment of old attempt {attempt}", self.cfg.name);
                        continue;
                    }
                    let reply = match self.deploy(*d) {
                        Ok(()) => ToCoordinator::Ready(attempt),
                        Err(failure) => {
                            self.follower.deploy_failed(attempt);
                            ToCoordinator::DeployFailed { attempt, failure }
                        }
                    };
                    let _ = tx.send(&reply);
                }
                ToWorker::Start(attempt) => {
                    if self.follower.on_start(attempt) {
                        self.start(attempt, tx);
                    }
                }
                ToWorker::Control { attempt, task, control } => {
                    if !self.follower.obeys(attempt) {
                        continue;
                    }
                    let control = match control.into_control() {
                        Ok(c) => c,
                        Err(w) => match self.complete(w, tx) {
                            Some(c) => c,
                            None => continue,
                        },
                    };
                    let upgrade = match &control {
                        Control::PrepareUpgrade { id, .. } => Some(*id),
                        _ => None,
                    };
                    // A query for a subtask not running here is dropped with its reply
                    // channel, which answers its caller.
                    if let Some(Current::Running { controls, .. }) = &self.current
                        && let Some(Some(c)) = controls.get(task as usize)
                    {
                        let _ = c.send(control);
                    }
                    if let Some(id) = upgrade {
                        // Queued before the checkpoint's barrier can arrive (the coordinator
                        // holds its trigger until then); a subtask that has exited is no
                        // reason to hold it longer: its ack without a report rolls back.
                        let _ = tx.send(&ToCoordinator::UpgradeArmed { attempt, task, id });
                    }
                }
                ToWorker::LoopProbe { attempt, wave } => {
                    if self.follower.obeys(attempt)
                        && let Some(Current::Running { termination: Some(t), .. }) = &self.current
                    {
                        let _ = tx.send(&ToCoordinator::LoopCounts { attempt, wave, counts: t.counts() });
                    }
                }
                ToWorker::LoopQuiescent(attempt) => {
                    if self.follower.obeys(attempt)
                        && let Some(Current::Running { termination: Some(t), .. }) = &self.current
                    {
                        t.declare_quiescent();
                    }
                }
                ToWorker::Cancel(attempt) => {
                    if self.follower.on_cancel(attempt) {
                        self.end_current();
                    }
                }
            }
        }
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// Cancels the current attempt and waits until its subtasks have exited.
    fn end_current(&mut self) {
        match self.current.take() {
            Some(Current::Running { cancel, stop, runner, .. }) => {
                cancel.store(true, Ordering::Relaxed);
                stop.store(true, Ordering::Relaxed);
                let _ = runner.join();
            }
            Some(Current::Prepared(_, p)) => drop(p),
            None => {}
        }
    }

    /// The subtask's message for a control this worker completes: a state query gets a reply
    /// channel whose answer goes to the coordinator under the query's number; a live upgrade
    /// gets its component, compiled from the copy shipped ahead of it. `None` (the attempt
    /// is cancelled, so it restarts without the upgrade) when that component cannot be had.
    fn complete(&mut self, w: WireControl, tx: &PipeTx<ToCoordinator>) -> Option<Control> {
        match w {
            WireControl::Query { query, operator, subtask, state, key_group, key } => {
                let (reply, answer) =
                    crossbeam_channel::bounded::<Result<crate::runtime::query::QueryAnswer, String>>(1);
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let answer = match answer.recv_timeout(QUERY_TIMEOUT) {
                        Ok(a) => a.and_then(|a| serde_json::to_string(&a).map_err(|e| e.to_string())),
                        Err(RecvTimeoutError::Timeout) => Err("the subtask did not answer in time".to_string()),
                        Err(RecvTimeoutError::Disconnected) => {
                            Err("the subtask is not running on this worker any more".to_string())
                        }
                    };
                    let _ = tx.send(&ToCoordinator::QueryAnswer { query, answer });
                });
                Some(Control::Query(StateQuery { operator, subtask, state, key_group, key, reply }))
            }
            WireControl::PrepareUpgrade { id, operator, digest } => match self.upgrade_factory(&operator, &digest) {
                Ok(factory) => Some(Control::PrepareUpgrade { id, factory }),
                Err(e) => {
                    tracing::error!(
                        "worker `{}`: cannot upgrade operator `{operator}` to component {digest}: {e}; cancelling \
                         this attempt (the job restarts from its last checkpoint without the upgrade)",
                        self.cfg.name
                    );
                    if let Some(Current::Running { cancel, .. }) = &self.current {
                        cancel.store(true, Ordering::Relaxed);
                    }
                    None
                }
            },
            other => other.into_control().ok(),
        }
    }

    /// The compiled component of a live upgrade, shipped before as `digest`.
    fn upgrade_factory(&mut self, uid: &str, digest: &str) -> Result<OperatorFactory, String> {
        if let Some(f) = self.upgrades.get(digest) {
            return Ok(f.clone());
        }
        let path = self.components.used(digest)?;
        let c = LoadedComponent::load(&self.engine, uid, &path).map_err(|e| e.to_string())?;
        if self.upgrades.len() >= 8 {
            self.upgrades.clear();
        }
        let f = OperatorFactory::Wasm(Arc::new(c));
        self.upgrades.insert(digest.to_string(), f.clone());
        Ok(f)
    }

    /// The job of `d`, bound to its shipped components (the newest one cached: a restart
    /// binds nothing anew).
    fn bind(&mut self, d: &Deploy) -> Result<Arc<BoundJob>, String> {
        let key = format!("{}\n{:?}\n{}", d.job_path.display(), d.components, d.job_source);
        let key = sha256_hex(key.as_bytes());
        if let Some(j) = self.jobs.get(&key) {
            return Ok(j.clone());
        }
        let mut paths = BTreeMap::new();
        for (uid, digest) in &d.components {
            let p = self.components.used(digest).map_err(|e| format!("operator `{uid}`: {e}"))?;
            paths.insert(uid.clone(), p);
        }
        let mut graph = crate::job::parse_shipped(&d.job_path, &d.job_source, &paths).map_err(|e| e.to_string())?;
        // Checkpoints in an object store: this worker's state files are written to its own
        // disk first and uploaded before it acknowledges, so members share no file system.
        if let Some(c) = graph.checkpoint.as_mut().filter(|c| c.remote.is_some()) {
            c.dir = self.cfg.dir.join("staging");
        }
        let job = Arc::new(crate::job::bind::bind(&self.engine, graph).map_err(|e| e.to_string())?);
        // Compiled: the other components beyond the cap can go (the coordinator counts only
        // this attempt's as this worker's from now on, and ships the others again if needed).
        let in_use: BTreeSet<&str> = d.components.values().map(String::as_str).collect();
        let evicted = self.components.evict(&in_use);
        if evicted > 0 {
            tracing::info!(
                "worker `{}`: removed {evicted} least recently used component(s) beyond its cap",
                self.cfg.name
            );
        }
        // Only the job it runs now is kept: a coordinator serving tenants sends a new job
        // file per submission, and every one kept would hold its compiled components.
        self.jobs.clear();
        self.jobs.insert(key, job.clone());
        Ok(job)
    }

    /// Builds this worker's part of attempt `d` and expects its incoming channels.
    fn deploy(&mut self, d: Deploy) -> Result<(), WireFailure> {
        self.end_current();
        self.inbound.fence(d.attempt);
        let refuse = |message: String, setup: bool| WireFailure {
            node: "-".into(),
            subtask: 0,
            message,
            secondary: false,
            transient: !setup,
            setup,
        };
        // The store not answering may pass (the job restarts); a file of this worker's part
        // that does not load will not: the job fails, as when the coordinator finds it.
        let unrestorable = |what: &str, e: storage::CheckpointError| {
            if e.is_incomplete() || matches!(e, storage::CheckpointError::Remote(_)) {
                refuse(format!("{what}: {e}"), false)
            } else {
                refuse(format!("{what}: {e}; {}", storage::UNLOADABLE_ADVICE), true)
            }
        };
        let job = self.bind(&d).map_err(|e| refuse(e, true))?;
        let store = CheckpointStore::of(&job.graph)
            .map_err(|e| refuse(e.to_string(), true))?
            .map(CheckpointStore::without_local_copies);
        // Only what this worker's own subtasks restore from is loaded (and downloaded).
        let plan = PhysicalPlan::of(&job.graph);
        let here: BTreeSet<(usize, u32)> = plan
            .subtasks
            .iter()
            .zip(&d.worker_of)
            .filter(|(_, w)| **w == d.you)
            .map(|(s, _)| (s.node, s.subtask))
            .collect();
        let scope = |m: &Manifest| Subset::of(m, &job.graph, &|ni, s| here.contains(&(ni, s)));
        let mut restored_dir = None;
        let restore = match d.restore.as_deref().map(|p| (p, p.to_str().filter(|u| u.starts_with("s3://")))) {
            // From the object store, into this worker's own staging directory.
            Some((_, Some(url))) => {
                tracing::info!("worker `{}`: attempt {} restores from {url}", self.cfg.name, d.attempt);
                // One directory per attempt: the previous attempt's goes with it.
                let name = format!("restored-{}", d.attempt);
                let local = store.as_ref().map_or_else(|| self.cfg.dir.join(&name), |s| s.root().join(&name));
                restored_dir = Some(Staging(local.clone()));
                let fetched = mirror::fetch_url(url, &local, &scope);
                Some(fetched.map_err(|e| unrestorable(&format!("cannot restore {url}"), e))?)
            }
            Some((p, None)) => Some(storage::load_part(p, &scope).map_err(|e| unrestorable("cannot restore", e))?),
            None => None,
        };
        if let Some(c) = &restore {
            let (name, id, share) = (&self.cfg.name, c.manifest.checkpoint_id, c.share());
            tracing::info!("worker `{name}`: attempt {} loaded {share} of checkpoint {id}", d.attempt);
        }
        let live: Live = Arc::default();
        let dropped = resolve_components(&job, restore.as_ref(), d.allow_non_restored_state, &live);
        let dropped = dropped.map_err(|e| refuse(e, true))?;
        let opts = RunOptions {
            allow_non_restored_state: d.allow_non_restored_state,
            // A tenant's part: its writes charged to its quota, its disk-backed state in its
            // directory, its guests quiet (as under `weir serve`).
            quiet_guests: d.tenant.is_some(),
            disk_budget: d
                .tenant
                .as_ref()
                .map(|t| Arc::new(DiskBudget::new(&t.name, &t.dir, t.max_disk_mb).shared_by(d.peers.len() as u64))),
            state_dir: d.tenant.as_ref().map(|t| t.dir.clone()),
            ..RunOptions::default()
        };
        let owned = Arc::new(Owned {
            job,
            opts,
            restarts: d.restarts,
            writer: d.attempt,
            restore,
            store,
            completed: Arc::default(),
            live,
            dropped,
            _staging: restored_dir,
        });
        let a = owned.attempt();
        let g = &a.job.graph;
        if d.worker_of.len() != plan.subtasks.len() {
            return Err(refuse(
                format!("the placement names {} subtasks, the job has {}", d.worker_of.len(), plan.subtasks.len()),
                true,
            ));
        }
        let mine: Vec<bool> = d.worker_of.iter().map(|&w| w == d.you).collect();
        let wiring = local::wire(g, &plan, &mine);
        for i in wiring.incoming {
            let key = ChannelKey { attempt: d.attempt, channel: i.channel as u64 };
            self.inbound.expect(key, i.tx, i.space, i.budget, i.barriers);
        }
        let part = match local::build_part(&a, &plan, &mine, wiring.inputs, wiring.outputs) {
            Ok(p) => p,
            Err(StartError::Setup(e)) => return Err(refuse(e.to_string(), true)),
            Err(StartError::Attempt(f)) => return Err(WireFailure::of(&f)),
        };
        let prepared = Prepared {
            owned,
            part,
            plan,
            outgoing: wiring.outgoing,
            worker_of: d.worker_of,
            peers: d.peers,
            you: d.you,
        };
        self.current = Some(Current::Prepared(d.attempt, Box::new(prepared)));
        Ok(())
    }

    /// Opens the outgoing channels and starts the subtasks of the prepared attempt.
    fn start(&mut self, attempt: AttemptNo, tx: &PipeTx<ToCoordinator>) {
        if !matches!(&self.current, Some(Current::Prepared(n, _)) if *n == attempt) {
            return;
        }
        let Some(Current::Prepared(_, p)) = self.current.take() else { return };
        let p = *p;
        let Part { tasks, controls, events_tx, events_rx, writer_rx, metrics, cancel, termination, .. } = p.part;
        let stop = Arc::new(AtomicBool::new(false));
        let (owned, secret, name) = (p.owned.clone(), self.cfg.secret.clone(), self.cfg.name.clone());
        let tls = self.cfg.tls.clone();
        let (plan, outgoing, worker_of, peers, you) = (p.plan, p.outgoing, p.worker_of, p.peers, p.you);
        let events = tx.clone();
        std::thread::spawn(move || {
            for event in events_rx {
                if events.send(&ToCoordinator::Event { attempt, event }).is_err() {
                    break;
                }
            }
        });
        let tx = tx.clone();
        let (cancel2, stop2) = (cancel.clone(), stop.clone());
        let mine: Vec<(u64, usize, u32)> = (0..plan.subtasks.len())
            .filter(|&t| worker_of.get(t) == Some(&you))
            .map(|t| (t as u64, plan.subtasks[t].node, plan.subtasks[t].subtask))
            .collect();
        let progress = Progress { attempt, mine, metrics: metrics.clone(), tx: tx.clone() };
        let ended = Arc::new(AtomicBool::new(false));
        let reporter = {
            let (progress, ended) = (progress.clone(), ended.clone());
            std::thread::spawn(move || progress.every_second(&ended))
        };
        let runner = std::thread::spawn(move || {
            let a = owned.attempt();
            let g = &a.job.graph;
            let mut failures = Vec::new();
            let forwarders =
                match open_outgoing(g, &plan, outgoing, &worker_of, &peers, attempt, (&secret, tls.as_ref()), &cancel2)
                {
                    Ok(f) => f,
                    Err(mut message) => {
                        // A tenant's job hears of peer workers without their addresses.
                        if a.opts.disk_budget.is_some() {
                            for (i, p) in peers.iter().enumerate() {
                                message = message.replace(&p.to_string(), &format!("#{i} of the attempt"));
                            }
                        }
                        let task = TaskId { node: NodeId::new("-"), subtask: SubtaskIndex(0) };
                        failures
                            .push(TaskFailure::Unavailable { task, message: format!("worker `{name}`: {message}") });
                        cancel2.store(true, Ordering::Relaxed);
                        Vec::new()
                    }
                };
            let writer = match a.store {
                Some(store) => local::start_writer(&a, store, &events_tx, writer_rx).ok(),
                None => None,
            };
            drop(events_tx);
            let threads = Threads { cancel: cancel2, stop: stop2, nice: 0, cpu_group: None };
            match threads.run(&a, tasks, &metrics) {
                Ok(f) => failures.extend(f),
                Err(e) => {
                    let task = TaskId { node: NodeId::new("-"), subtask: SubtaskIndex(0) };
                    failures.push(TaskFailure::Connector { task, message: e.to_string() });
                }
            }
            if let Some(w) = writer {
                let _ = w.join();
            }
            // Not joined: a forwarder blocked on a peer that stopped reading ends when that
            // connection does; the attempt is over for the coordinator either way.
            drop(forwarders);
            ended.store(true, Ordering::Relaxed);
            let _ = reporter.join();
            // The final counters go ahead of the end, on the same connection.
            progress.send();
            let latency = g
                .nodes
                .iter()
                .zip(&metrics)
                .filter_map(|(n, m)| {
                    let h = m.latency.lock().unwrap_or_else(|e| e.into_inner());
                    h.as_ref().map(|h| (n.id.to_string(), h.to_wire()))
                })
                .collect();
            let failures = failures.iter().map(WireFailure::of).collect();
            let _ = tx.send(&ToCoordinator::PartEnded { attempt, failures, latency });
        });
        self.current = Some(Current::Running { controls, termination, cancel, stop, runner });
    }
}

/// Reports a running part's counters to the coordinator.
#[derive(Clone)]
struct Progress {
    attempt: AttemptNo,
    /// Global task index, node and subtask of each subtask this worker runs.
    mine: Vec<(u64, usize, u32)>,
    metrics: Vec<Arc<crate::runtime::metrics::NodeMetrics>>,
    tx: PipeTx<ToCoordinator>,
}

impl Progress {
    fn send(&self) {
        let subtasks = self
            .mine
            .iter()
            .filter_map(|&(t, node, s)| self.metrics.get(node).map(|m| (t, m.subtask(s).read(), m.watermark_of(s))))
            .collect();
        let mut nodes: Vec<usize> = self.mine.iter().map(|&(_, node, _)| node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let nodes = nodes
            .into_iter()
            .filter_map(|n| self.metrics.get(n).map(|m| (n, m)))
            .map(|(n, m)| NodeProgress {
                node: n as u32,
                feedback_peak_batches: m.feedback_peak_batches.load(Ordering::Relaxed),
                snapshots_abandoned: m.snapshots_abandoned.load(Ordering::Relaxed),
                snapshot_chunks_max: m.snapshot_chunks_max.load(Ordering::Relaxed),
            })
            .collect();
        let _ = self.tx.send(&ToCoordinator::Progress { attempt: self.attempt, subtasks, nodes });
    }

    /// Every second until `ended`.
    fn every_second(&self, ended: &AtomicBool) {
        while !ended.load(Ordering::Relaxed) {
            for _ in 0..20 {
                if ended.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            self.send();
        }
    }
}

/// Opens every outgoing channel on the data plane (and with unaligned checkpoints its
/// priority stream) and forwards its local queue into it, one thread per channel
/// (`runtime/net/forward.rs`); a sending subtask blocked on a full queue of a channel whose
/// thread ended sees a disconnect and exits.
#[allow(clippy::too_many_arguments)]
fn open_outgoing(
    g: &crate::graph::logical::JobGraph,
    plan: &PhysicalPlan,
    outgoing: Vec<Outgoing>,
    worker_of: &[u32],
    peers: &[SocketAddr],
    attempt: AttemptNo,
    (secret, tls): (&str, Option<&ClusterTls>),
    cancel: &Arc<AtomicBool>,
) -> Result<Vec<JoinHandle<()>>, String> {
    let mut links: HashMap<u32, Outbound> = HashMap::new();
    let mut threads = Vec::new();
    for Outgoing { channel: ci, rx, budget, barriers } in outgoing {
        let c = plan.channels[ci];
        let peer = worker_of[plan.index_of(g.edges[c.edge].to, c.to)];
        let addr = *peers.get(peer as usize).ok_or_else(|| format!("no address for worker {peer}"))?;
        if let std::collections::hash_map::Entry::Vacant(v) = links.entry(peer) {
            v.insert(Outbound::connect(addr, secret, tls).map_err(|e| e.to_string())?);
        }
        let key = ChannelKey { attempt, channel: ci as u64 };
        let data = links[&peer].open(key, g.channel_capacity).map_err(|e| e.to_string())?;
        let barriers = match barriers {
            Some(b) => Some((b, links[&peer].open_barriers(key).map_err(|e| e.to_string())?)),
            None => None,
        };
        let forward = Forward { rx, data, barriers, budget, cancel: cancel.clone() };
        threads.push(std::thread::spawn(move || forward.run()));
    }
    Ok(threads)
}

/// Clears a flag when dropped (a session's heartbeat stops with it).
struct Alive(Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}
