//! # weir-guest: write Weir operators in Rust
//!
//! A Weir operator is a WebAssembly component. This crate turns a Rust type into one: you
//! implement [`Operator`], declare your state in [`OperatorInfo`], and export the type with
//! [`export_operator!`]. The SDK handles batches, keyed state in guest memory (partitioned by
//! key group), emit buffering, snapshots and restore with schema migration.
//!
//! A keyed counter, complete:
//!
//! ```no_run
//! use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};
//!
//! struct Counter { count: ValueState<u64> }
//!
//! impl Operator for Counter {
//!     const INFO: OperatorInfo = OperatorInfo {
//!         states: &[StateDescriptor::keyed_value("count")],
//!         ..OperatorInfo::new("counter", "1.0.0")
//!     };
//!     fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
//!         Ok(Counter { count: ctx.value_state("count")? })
//!     }
//!     fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
//!         let n = self.count.update_or_default(ctx, |c| { *c += 1; *c });
//!         ctx.emit(rec.key, n.to_string().as_bytes());
//!         Ok(())
//!     }
//! }
//!
//! weir_guest::export_operator!(Counter);
//! # fn main() {}
//! ```
//!
//! Build it as a component (no WASI imports; `wasm-component-ld` is set as the linker for
//! this target in the workspace's `.cargo/config.toml`):
//!
//! ```text
//! cargo build --profile guest --target wasm32-unknown-unknown -p my-operator
//! ```
//!
//! The crate type must be `cdylib`. A two-input operator also implements [`CoOperator`]
//! (its `process` gets the left input, `process_right` the right) and is exported with
//! [`export_co_operator!`].

#![deny(missing_docs)]

#[doc(hidden)]
pub mod bindings;
mod bytes;
mod context;
#[doc(hidden)]
pub mod driver;
mod error;
pub mod format;
mod hash;
mod info;
mod key;
pub mod nexmark;
mod operator;
mod record;
mod state;
pub mod window;

/// The state value encoding (bincode 1.x defaults, see the WIT), for `migrate_value`.
pub use bincode;
pub use bytes::Bytes;
pub use context::{Context, FLUSH_BYTES, OpenContext, push_bytes, push_i64, push_u64};
pub use error::{Error, Result};
pub use info::{OperatorInfo, Redistribution, StateDescriptor, StateKind};
pub use operator::{CoOperator, Operator, TimeDomain};
pub use record::{NO_KEY_GROUP, Record, RecordReader, write_record};
pub use state::{ListState, MapState, OperatorList, OperatorValue, ValueState};
pub use weir_guest_macros::{export_co_operator, export_operator};

/// Used by the export macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings;
    pub use crate::driver;
    pub use crate::driver::Slot;
    pub use wit_bindgen;
}
