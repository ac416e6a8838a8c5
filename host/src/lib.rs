//! # Weir host
//!
//! Runs dataflow jobs whose operators are sandboxed WebAssembly components.
//!
//! Layers, dependencies pointing down (checked by `architecture.rs`):
//! - [`api`], [`bench`]: the control API (HTTP, JSON) over running jobs; `weir bench`;
//! - [`scaffold`]: operator projects outside the repository (`weir new`, `weir build`);
//! - [`runtime`]: the job deployed in one process: subtasks on threads, bounded channels,
//!   the coordinator and writer threads, restarts;
//! - [`job`]: the job file, validated into a [`graph::logical::JobGraph`], then bound to
//!   its components;
//! - [`operator`], [`connectors`]: what the subtask loop drives; host-native sources and sinks;
//! - [`sandbox`]: wasmtime, the WIT bindings, host imports, operator instances;
//! - [`checkpoint`]: the ABS protocol's pure state machines, the state layout and storage;
//! - [`graph`]: the job as data (nodes, edges, partitioning, settings, limits);
//! - [`ids`], [`record`], [`keygroup`], [`declared`]: newtypes, record framing, key groups,
//!   what a component declares.
//!
//! See `ARCHITECTURE.md` at the repository root for the map.

#![deny(missing_docs)]

pub mod api;
#[cfg(test)]
mod architecture;
pub mod bench;
pub mod checkpoint;
pub mod cluster;
pub mod connectors;
pub mod declared;
pub mod disk_budget;
pub mod graph;
pub mod ids;
pub mod io_runtime;
pub mod job;
pub mod keygroup;
pub mod logging;
pub mod operator;
pub mod pem;
pub mod record;
pub mod runtime;
pub mod sandbox;
pub mod scaffold;
