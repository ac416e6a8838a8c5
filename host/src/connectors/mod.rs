//! Host-native sources and sinks.

pub mod file_sink;
pub mod file_source;
pub mod generator;
pub mod kafka;
pub mod nexmark;
pub mod postgres_sink;
pub mod throttle;
