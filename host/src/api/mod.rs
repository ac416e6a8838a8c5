//! The control API: JSON over HTTP/1.1 on loopback, with a bearer token. `weir run` serves
//! it for its one job (and registers it so `weir list`/`savepoint`/`stop`/`upgrade` find
//! it); the same routes will serve many jobs in server mode.
//!
//! Why a small built-in HTTP layer instead of hyper/axum: the data path is threads and
//! channels, the control traffic is a handful of requests, and the layer below is ~200
//! lines with no async runtime to host.

pub mod client;
pub mod http;
pub mod registry;
pub mod server;
