//! The simulated world: one virtual clock, one seeded random source, one event queue, a
//! network with per-pair FIFO delivery, delays, partitions and paused or crashed processes,
//! and the durable stores that outlive every process (object storage and the sinks' staged and
//! committed transactions). Nothing here knows the protocol: the shells in `coordinator.rs`,
//! `worker.rs` and `etcd.rs` do.
//!
//! Network model (TCP-like): messages between two processes arrive in the order sent; a
//! partition delays them until it heals (retransmission), it does not drop them; a message to
//! a process that crashed (an older incarnation) is lost; a paused process receives nothing
//! and fires no timer until it resumes, then everything deferred in the order it was due.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::rc::Rc;

use super::msg::{Handle, Msg, Rec, Txn};

/// Virtual milliseconds.
pub type Ms = u64;

/// A process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Node {
    Etcd,
    Coord(usize),
    Worker(usize),
}

/// SplitMix64: small, seedable, good enough to pick faults and delays.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// What can happen.
#[derive(Debug, Clone)]
pub enum Event {
    /// A message arrives at `to` (if it is still incarnation `inc`).
    Deliver { from: Node, to: Node, inc: u64, msg: Msg },
    /// A process's timer (if it is still incarnation `inc`).
    Timer { node: Node, inc: u64, timer: Timer },
    /// A scheduled fault or its end.
    Fault(Fault),
}

/// Timers of the shells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The shell's periodic tick.
    Tick,
    /// The lease watchdog of a coordinator.
    Watchdog,
    /// A crashed process starts again.
    Restart,
    /// A worker gives up a connection attempt that was not welcomed.
    ConnectTimeout(u64),
    /// A coordinator's etcd write was not answered.
    PutTimeout(u64),
}

/// Faults the schedule injects.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    Crash {
        node: Node,
        down_for: Ms,
    },
    Pause {
        node: Node,
        for_ms: Ms,
    },
    Partition {
        a: Node,
        b: Node,
        for_ms: Ms,
    },
    SlowNetwork {
        for_ms: Ms,
    },
    /// A fault of whichever coordinator leads when it fires.
    Leader(LeaderFault),
}

/// What happens to the leader.
#[derive(Debug, Clone, Copy)]
pub enum LeaderFault {
    Crash { down_for: Ms },
    Pause { for_ms: Ms },
    CutFromEtcd { for_ms: Ms },
    CutFromWorker { worker: usize, for_ms: Ms },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Up,
    Down,
}

/// Counts for the report.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub events: u64,
    pub faults: u64,
    pub attempts: u64,
    pub leaders: u64,
    pub deposed_exits: u64,
    pub checkpoints_recorded: u64,
    /// Messages on a connection the worker no longer has.
    pub stale_dropped: u64,
    /// Welcomes from a leader of an older epoch, refused by the follower.
    pub older_epoch_refused: u64,
    /// Controls of an attempt the follower does not obey (stale, replaced, cancelled).
    pub not_obeyed: u64,
    /// Channel messages of an attempt that is not the worker's current one.
    pub fenced_data: u64,
    pub last_fault_at: Ms,
}

/// How long after a fault ends the cluster may take to complete checkpoints again: a lease's
/// time to live, the heartbeat timeouts, a restart delay and a redeployment.
pub const RECOVERY_MS: Ms = 6_000;

/// Deliberate protocol bugs, to show the checks catch them.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sabotage {
    /// Sinks commit at the barrier instead of on `Complete` (no two-phase commit).
    pub commit_at_barrier: bool,
    /// The leader announces `Complete` before etcd recorded the checkpoint.
    pub complete_before_record: bool,
    /// The leader ignores every ack within this window (checkpoints stall without a fault).
    pub ignore_acks: Option<(Ms, Ms)>,
    /// A restart goes from the newest published manifest, whoever published it (the bug
    /// these simulations found: a deposed leader's unrecorded manifest got restored).
    pub restart_from_any_manifest: bool,
}

/// Durable state outside every process.
#[derive(Debug, Default)]
pub struct Durable {
    /// Published checkpoint manifests (create-only).
    pub manifests: BTreeMap<u64, Rc<BTreeMap<usize, Handle>>>,
    /// Pre-committed sink transactions and their records.
    pub staged: HashMap<Txn, Vec<Rec>>,
    /// Committed transactions (a commit is idempotent, like renaming a part file).
    pub committed: BTreeSet<Txn>,
    /// Every checkpoint id ever recorded in etcd.
    pub recorded: BTreeSet<u64>,
    /// When each record happened.
    pub recorded_at: Vec<Ms>,
    /// Per fault: from its start to its end plus [`RECOVERY_MS`].
    pub disturbed: Vec<(Ms, Ms)>,
    /// Safety violations seen while running (the run fails with the first).
    pub violations: Vec<String>,
}

/// The world.
pub struct World {
    pub now: Ms,
    pub rng: Rng,
    queue: BinaryHeap<Reverse<(Ms, u64)>>,
    events: HashMap<u64, Event>,
    seq: u64,
    inc: HashMap<Node, u64>,
    status: HashMap<Node, Status>,
    paused_until: HashMap<Node, Ms>,
    fifo: HashMap<(Node, Node), Ms>,
    cut_until: HashMap<(Node, Node), Ms>,
    slow_until: Ms,
    pub durable: Durable,
    pub stats: Stats,
    pub next_conn: u64,
    pub sabotage: Sabotage,
    tracing: bool,
}

impl World {
    pub fn new(seed: u64) -> World {
        World {
            now: 0,
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            seq: 0,
            inc: HashMap::new(),
            status: HashMap::new(),
            paused_until: HashMap::new(),
            fifo: HashMap::new(),
            cut_until: HashMap::new(),
            slow_until: 0,
            durable: Durable::default(),
            stats: Stats::default(),
            next_conn: 0,
            sabotage: Sabotage::default(),
            tracing: std::env::var_os("WEIR_SIM_TRACE").is_some(),
        }
    }

    pub fn at(&mut self, at: Ms, e: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq)));
        self.events.insert(self.seq, e);
    }

    /// The next event due, with paused processes' events deferred to their resumption.
    pub fn pop(&mut self) -> Option<Event> {
        loop {
            let Reverse((at, seq)) = self.queue.pop()?;
            let e = self.events.remove(&seq).expect("queued");
            self.now = self.now.max(at);
            let target = match &e {
                Event::Deliver { to, .. } => Some(*to),
                Event::Timer { node, timer, .. } if *timer != Timer::Restart => Some(*node),
                _ => None,
            };
            if let Some(n) = target
                && let Some(&until) = self.paused_until.get(&n)
                && until > self.now
            {
                self.at(until, e);
                continue;
            }
            self.stats.events += 1;
            return Some(e);
        }
    }

    pub fn inc(&self, n: Node) -> u64 {
        self.inc.get(&n).copied().unwrap_or(0)
    }

    pub fn is_up(&self, n: Node) -> bool {
        self.status.get(&n).is_none_or(|s| *s == Status::Up)
    }

    /// Prints a line of the run's story when `WEIR_SIM_TRACE` is set (to debug one seed).
    pub fn trace(&self, what: impl FnOnce() -> String) {
        if self.tracing {
            eprintln!("{:>7} ms  {}", self.now, what());
        }
    }

    /// Sends `msg` from `from` to `to`'s current incarnation.
    pub fn send(&mut self, from: Node, to: Node, msg: Msg) {
        if !self.is_up(from) {
            return;
        }
        let mut delay = self.rng.range(1, 8);
        if self.slow_until > self.now {
            delay += self.rng.range(0, 200);
        }
        let key = (from.min(to), from.max(to));
        let cut = self.cut_until.get(&key).copied().unwrap_or(0);
        let due = (self.now + delay).max(cut + delay);
        let last = self.fifo.entry((from, to)).or_insert(0);
        let at = due.max(*last);
        *last = at;
        let inc = self.inc(to);
        self.at(at, Event::Deliver { from, to, inc, msg });
    }

    /// What the kernel of a process that does not listen answers (a reset), even while the
    /// process is down.
    pub fn kernel_reply(&mut self, from: Node, to: Node, msg: Msg) {
        let delay = self.rng.range(1, 8);
        let inc = self.inc(to);
        self.at(self.now + delay, Event::Deliver { from, to, inc, msg });
    }

    /// Sets `node`'s timer `after` ms from now.
    pub fn timer(&mut self, node: Node, after: Ms, timer: Timer) {
        let inc = self.inc(node);
        self.at(self.now + after, Event::Timer { node, inc, timer });
    }

    /// Ends `node`'s incarnation (crash or exit); it starts again `down_for` ms later.
    pub fn crash(&mut self, node: Node, down_for: Ms) {
        *self.inc.entry(node).or_insert(0) += 1;
        self.status.insert(node, Status::Down);
        self.paused_until.remove(&node);
        // Its kernel resets its connections: every peer hears of it (after what was in flight).
        let inc = self.inc(node);
        self.at(self.now + down_for, Event::Timer { node, inc, timer: Timer::Restart });
    }

    pub fn restarted(&mut self, node: Node) {
        self.status.insert(node, Status::Up);
    }

    pub fn pause(&mut self, node: Node, for_ms: Ms) {
        let until = self.paused_until.get(&node).copied().unwrap_or(0).max(self.now + for_ms);
        self.paused_until.insert(node, until);
    }

    pub fn partition(&mut self, a: Node, b: Node, for_ms: Ms) {
        let key = (a.min(b), a.max(b));
        let until = self.cut_until.get(&key).copied().unwrap_or(0).max(self.now + for_ms);
        self.cut_until.insert(key, until);
    }

    pub fn slow(&mut self, for_ms: Ms) {
        self.slow_until = self.slow_until.max(self.now + for_ms);
    }
}
