//! Asynchronous Barrier Snapshotting: the protocol's pure state machines (alignment,
//! coordinator, recovery mapping) and checkpoint storage; the threads that drive them live in
//! `runtime/` (`driver.rs`, `control.rs`).

pub mod alignment;
pub mod alignment_timeout;
pub mod backedge;
pub mod compaction;
pub mod compat;
pub mod coordinator;
pub mod evidence;
pub mod incremental;
pub mod keyed_files;
pub mod layout;
pub mod metadata;
pub mod mirror;
pub mod recovery;
pub mod remote;
pub mod remote_savepoint;
pub mod snapshot;
pub mod storage;
pub mod subset;
pub mod timer_list;
pub mod unaligned;
pub mod upgrade;
