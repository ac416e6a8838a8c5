//! The WebAssembly sandbox: engine, WIT bindings, host imports, operator instances.

pub mod bindings;
pub mod compile_cache;
pub mod disk_cache;
pub mod engine;
pub mod guest_text;
pub mod host;
pub mod instance;
pub mod isolated_compile;
pub mod limits;
pub mod timers;
