//! The process-wide wasmtime `Engine`: one per process, shared by every job, so compiled
//! code and the configuration are uniform.

use wasmtime::{Config, Engine, OptLevel};

/// Builds the engine Weir runs operators on.
///
/// wasmtime is compiled without `component-model-async`, which takes the per-call cost of
/// an export from ~550 ns to ~200 ns (measured, see `../shared/TOOLCHAIN.md`).
pub fn new_engine() -> Result<Engine, wasmtime::Error> {
    let mut c = Config::new();
    c.wasm_component_model(true);
    c.cranelift_opt_level(OptLevel::Speed);
    Engine::new(&c)
}
