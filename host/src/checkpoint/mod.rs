//! Asynchronous Barrier Snapshotting: the protocol's pure state machines (alignment,
//! coordinator, recovery mapping), their thin drivers, and checkpoint storage.

pub mod alignment;
pub mod backedge;
pub mod compat;
pub mod control;
pub mod coordinator;
pub mod driver;
pub mod evidence;
pub mod incremental;
pub mod layout;
pub mod metadata;
pub mod recovery;
pub mod snapshot;
pub mod storage;
pub mod upgrade;
pub mod writer;
