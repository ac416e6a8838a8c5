//! Weir's end-to-end tests: one binary, one module per area. Test names carry their area
//! as a prefix so `cargo test <prefix>` runs one area.
//!
//! Every test runs the real WebAssembly components (built on first use by `support`).

mod boundary;
mod cluster;
mod cluster_ha;
mod cluster_sim;
mod connectors;
mod cycles;
mod errors;
mod etcd;
mod exactly_once;
mod examples;
mod kafka;
mod kafka_jobs;
mod lang;
mod lang_windows;
mod newcomer;
mod nexmark;
mod object_storage;
mod ops;
mod pg;
mod process_recovery;
mod query;
mod record_errors;
mod s3;
mod sandbox;
mod savepoints;
mod state_disk;
mod support;
mod unaligned;
mod windows;
