//! The network data plane between workers: channels as HTTP/2 streams with per-channel
//! credit (`link.rs`), carrying the same messages as in-process channels (`frame.rs`), over
//! plain TCP or mutual TLS (`tls.rs`); each channel's sending thread (`forward.rs`) and
//! receiving task (`deliver.rs`), and with unaligned checkpoints the barriers that overtake
//! what both ends hold queued (`splice.rs`).

pub mod deliver;
pub mod forward;
pub mod frame;
pub mod link;
pub mod splice;
pub mod tls;
