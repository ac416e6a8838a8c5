#![allow(missing_docs)]
//! The host calls, generated once from the `imports` world of `wit/operator.wit`.
//!
//! Operator crates never call these directly: the SDK batches emits, tracks state and
//! forwards log lines. The export side of the world is generated in the operator crate by
//! [`export_operator!`](crate::export_operator) (a component implements exactly one world,
//! so its export bindings must live in its own crate), which reuses these modules through
//! wit-bindgen's `with` option.

wit_bindgen::generate!({
    world: "imports",
    path: "../wit",
    generate_unused_types: true,
});

pub use weir::operator::{collector, context, logging, timers, types};
