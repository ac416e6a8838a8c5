//! One job over many processes: `weir coordinator` places and checkpoints attempts
//! (`coordinator.rs`), `weir worker` runs the subtasks placed in its slots (`worker.rs`); they
//! talk over a control connection (`pipe.rs`, `protocol.rs`), and subtasks on different
//! workers over the data plane (`runtime/net/`).

pub mod coordinator;
pub mod ha;
pub mod pipe;
pub mod protocol;
pub mod worker;
