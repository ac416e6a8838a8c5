//! Executing a job: subtasks on threads connected by bounded channels carrying batches.

pub mod control;
pub mod cpu_shares;
pub mod driver;
pub mod error;
pub mod executor;
pub mod failed_record;
pub mod faults;
pub mod feedback_budget;
pub mod handle;
pub mod input;
pub mod latency;
pub mod message;
pub mod metrics;
pub mod offline_query;
pub mod output;
pub mod participant;
pub mod priority;
pub mod query;
pub mod repeated_failure;
pub mod sink;
pub mod source;
pub mod task;
pub mod termination;
pub mod upgrade;
pub mod writer;
