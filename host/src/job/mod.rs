//! Job files: the TOML schema, validation into a graph, binding to components.

pub mod bind;
pub mod dry_run;
mod load;
pub mod spec;
pub mod submission;

pub use load::{JobError, MAX_KEY_GROUPS, load, parse, parse_shipped};
