//! The network data plane between workers: channels as HTTP/2 streams with per-channel
//! credit (`link.rs`), carrying the same messages as in-process channels (`frame.rs`), over
//! plain TCP or mutual TLS (`tls.rs`).

pub mod frame;
pub mod link;
pub mod tls;
