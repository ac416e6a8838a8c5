//! The control API: JSON over HTTP/1.1, with a bearer token. `weir run` serves it on
//! loopback for its one job (and registers it so `weir list`/`savepoint`/`stop`/`upgrade`
//! find it); `weir serve` serves the same routes for many tenants' jobs (`tenants.rs`).
//!
//! HTTP is hyper's (`listener.rs`, on a tokio runtime of its own): a shared server faces
//! trickling, smuggling and malformed clients, which a well-kept HTTP library handles and a
//! hand-written parser keeps getting wrong. The routes stay blocking (`server.rs`): they wait
//! on job threads and channels, and run on the runtime's blocking pool. The web dashboard
//! (`dashboard.rs`) is a page over these routes, served by the same front door, over TLS when
//! `server.toml` has a `[tls]` (`tls.rs`).

pub mod client;
pub mod dashboard;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod on_cluster;
pub mod registry;
pub mod server;
pub mod standby;
pub mod submit;
pub mod tenants;
pub mod tls;
