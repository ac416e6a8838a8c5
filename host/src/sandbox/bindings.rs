//! The one place the WIT contract becomes Rust: `bindgen!` for the `operator` world, and
//! for the `co-operator` world reusing the first one's interfaces (one `Host` impl serves
//! both).

#![allow(missing_docs)]

/// Bindings of the one-input world.
pub mod one {
    wasmtime::component::bindgen!({
        world: "operator",
        path: "../wit",
        imports: { default: trappable },
    });
}

/// Bindings of the two-input world.
pub mod two {
    wasmtime::component::bindgen!({
        world: "co-operator",
        path: "../wit",
        imports: { default: trappable },
        with: {
            "weir:operator/types": super::one::weir::operator::types,
            "weir:operator/context": super::one::weir::operator::context,
            "weir:operator/collector": super::one::weir::operator::collector,
            "weir:operator/timers": super::one::weir::operator::timers,
            "weir:operator/logging": super::one::weir::operator::logging,
        },
    });
}

pub use one::weir::operator::{collector, context, logging, timers, types};
