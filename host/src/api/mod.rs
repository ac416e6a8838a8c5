//! The control API: JSON over HTTP/1.1, with a bearer token. `weir run` serves it on
//! loopback for its one job (and registers it so `weir list`/`savepoint`/`stop`/`upgrade`
//! find it); `weir serve` serves the same routes for many tenants' jobs (`tenants.rs`).
//!
//! Why a small built-in HTTP layer instead of hyper/axum: the data path is threads and
//! channels, the control traffic is a handful of requests, and the layer below is ~200
//! lines with no async runtime to host.

pub mod client;
pub mod http;
pub mod registry;
pub mod server;
pub mod tenants;
