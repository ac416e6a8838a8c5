//! The dataflow model: the validated job graph and how edges partition records.

pub mod limits;
pub mod logical;
pub mod partition;
pub mod physical;
pub mod placement;
pub mod restart;
