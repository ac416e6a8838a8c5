//! Jobs over many processes: `weir coordinator` places and checkpoints each job's attempts
//! (`coordinator.rs`, one per job) on the workers its hub keeps (`hub.rs`: registration,
//! heartbeats, and which job holds which worker, `leases.rs`), `weir worker` runs the subtasks
//! placed in its slots (`worker.rs`, one attempt at a time); they
//! talk over a control connection (`pipe.rs`, `protocol.rs`), and subtasks on different
//! workers over the data plane (`runtime/net/`). The protocol's decisions are pure state
//! machines (`roster.rs`, `round.rs` on the coordinator, `follower.rs` on a worker, `lease.rs`
//! for the leader, the table of state queries in flight in `queries.rs`; a worker finds its
//! coordinator by `discovery.rs`), run by these shells and by the `cluster_sim_` simulation alike.
//! A leader keeps its cluster's jobs in etcd (`ha.rs`; tenants' submitted jobs: `served.rs`).

pub mod component_store;
pub mod coordinator;
pub mod discovery;
pub mod follower;
pub mod ha;
pub mod hub;
pub mod lease;
pub mod leases;
pub mod pipe;
pub mod protocol;
pub mod queries;
pub mod roster;
pub mod round;
pub mod served;
pub mod worker;
