//! The simulated messages: the control protocol of `weir::cluster::protocol` reduced to what
//! the protocol decides on, the etcd calls the leader makes, and the data plane's batches,
//! barriers and ends of stream. Every control and data message carries its attempt.

use std::collections::BTreeMap;
use std::rc::Rc;

use weir::cluster::lease::RecordResult;
use weir::cluster::protocol::AttemptNo;

/// A record: (key, sequence number of the key).
pub type Rec = (u32, u32);

/// A sink's pre-committed transaction: the records it took between two barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Txn {
    pub attempt: AttemptNo,
    pub sink: u32,
    pub checkpoint: u64,
}

/// What a task acks a checkpoint with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handle {
    /// A source's offset.
    Source(u32),
    /// A sink's pre-committed transactions not yet known committed.
    Sink(Vec<Txn>),
}

/// A deployment: which member runs which task.
#[derive(Debug, Clone)]
pub struct Deploy {
    pub attempt: AttemptNo,
    /// Per task: the index of its member.
    pub worker_of: Vec<u32>,
    /// Per member: the worker process.
    pub peers: Vec<usize>,
    pub you: u32,
    pub restore: Option<Rc<BTreeMap<usize, Handle>>>,
}

/// What an etcd key write stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Checkpoint(u64),
    Finished,
}

#[derive(Debug, Clone)]
pub enum Msg {
    // Coordinator ↔ etcd.
    Grant,
    Granted {
        lease: u64,
    },
    KeepAlive {
        lease: u64,
        sent: u64,
    },
    KeptAlive {
        sent: u64,
        ttl_s: i64,
    },
    Campaign {
        lease: u64,
    },
    Elected {
        lease: u64,
        epoch: u64,
        pointer: Option<u64>,
        finished: bool,
    },
    Put {
        key: Key,
        epoch: u64,
        token: u64,
    },
    PutDone {
        token: u64,
        result: RecordResult,
    },
    // Worker → coordinator, on connection `conn`.
    Hello {
        conn: u64,
        slots: u32,
    },
    Heartbeat {
        conn: u64,
    },
    Ready {
        conn: u64,
        attempt: AttemptNo,
    },
    Ack {
        conn: u64,
        attempt: AttemptNo,
        task: usize,
        id: u64,
        handle: Handle,
    },
    Decline {
        conn: u64,
        attempt: AttemptNo,
        id: u64,
    },
    DeployFailed {
        conn: u64,
        attempt: AttemptNo,
    },
    Finished {
        conn: u64,
        attempt: AttemptNo,
        task: usize,
    },
    PartEnded {
        conn: u64,
        attempt: AttemptNo,
        failed: bool,
    },
    // Coordinator → worker (the listener refuses a connection where no leader listens).
    NoListener {
        conn: u64,
    },
    Welcome {
        conn: u64,
        epoch: u64,
        heartbeat_ms: u64,
    },
    Beat {
        conn: u64,
    },
    Deploy {
        conn: u64,
        d: Rc<Deploy>,
    },
    Start {
        conn: u64,
        attempt: AttemptNo,
    },
    Cancel {
        conn: u64,
        attempt: AttemptNo,
    },
    Trigger {
        conn: u64,
        attempt: AttemptNo,
        id: u64,
        tasks: Rc<Vec<usize>>,
    },
    Complete {
        conn: u64,
        attempt: AttemptNo,
        id: u64,
    },
    Abort {
        conn: u64,
        attempt: AttemptNo,
        id: u64,
    },
    Shutdown {
        conn: u64,
        attempt: AttemptNo,
    },
    /// Either side closed connection `conn` (or its process died).
    Closed {
        conn: u64,
    },
    // Worker → worker: one channel per (source, sink) pair of an attempt.
    Data {
        attempt: AttemptNo,
        from: u32,
        to: u32,
        recs: Vec<Rec>,
    },
    Barrier {
        attempt: AttemptNo,
        from: u32,
        to: u32,
        id: u64,
    },
    End {
        attempt: AttemptNo,
        from: u32,
        to: u32,
    },
}
