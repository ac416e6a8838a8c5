//! # Weir host
//!
//! Runs dataflow jobs whose operators are sandboxed WebAssembly components.
//!
//! Layers, dependencies pointing down:
//! - [`job`]: the job file, validated into a [`graph::logical::JobGraph`], then bound to
//!   its components;
//! - [`graph`], [`keygroup`], [`record`]: the pure model (nodes, edges, partitioning,
//!   key groups, record framing);
//! - [`runtime`]: subtasks on threads, bounded channels, input selection, output routing;
//! - [`sandbox`]: wasmtime, the WIT bindings, host imports, operator instances;
//! - [`connectors`]: host-native sources and sinks;
//! - [`api`]: the control API (HTTP, JSON) over running jobs;
//! - [`scaffold`]: operator projects outside the repository (`weir new`, `weir build`).
//!
//! See `ARCHITECTURE.md` at the repository root for the map.

#![deny(missing_docs)]

pub mod api;
pub mod bench;
pub mod checkpoint;
pub mod connectors;
pub mod disk_budget;
pub mod graph;
pub mod ids;
pub mod job;
pub mod keygroup;
pub mod logging;
pub mod operator;
pub mod pem;
pub mod record;
pub mod runtime;
pub mod sandbox;
pub mod scaffold;
