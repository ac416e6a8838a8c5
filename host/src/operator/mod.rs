//! What the subtask loop runs: an operator behind [`OperatorLogic`] — a WebAssembly component
//! instance (the product), or a native operator compiled into the host (only to measure
//! the engine's physical limit against the same logic in WASM).

pub mod bulk_load;
pub mod changes;
mod logic;
pub mod native;
pub mod paged;
#[cfg(test)]
pub(crate) mod recording;
pub mod residency;
pub mod store;

pub use logic::{OperatorFactory, OperatorLogic};
