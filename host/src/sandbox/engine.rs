//! The process-wide wasmtime `Engine`: one per process, shared by every job, so compiled
//! code and the configuration are uniform.

use wasmtime::{Config, Engine, OptLevel};

/// Builds the engine Weir runs operators on.
///
/// wasmtime is compiled without `component-model-async`, which takes the per-call cost of
/// an export from ~550 ns to ~200 ns (measured, see `../shared/TOOLCHAIN.md`).
///
/// Epoch interruption is on: a ticker thread advances the epoch every
/// [`TICK`](crate::sandbox::limits::TICK) while the engine lives, and each guest call gets a
/// deadline in ticks (`[limits] call_timeout_ms`), so a guest that spins is interrupted.
pub fn new_engine() -> Result<Engine, wasmtime::Error> {
    let mut c = Config::new();
    c.wasm_component_model(true);
    c.cranelift_opt_level(OptLevel::Speed);
    c.epoch_interruption(true);
    let engine = Engine::new(&c)?;
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("weir-epoch".into())
        .spawn(move || {
            while let Some(e) = weak.upgrade() {
                e.increment_epoch();
                drop(e);
                std::thread::sleep(crate::sandbox::limits::TICK);
            }
        })
        .map_err(|e| wasmtime::format_err!("cannot start the epoch ticker: {e}"))?;
    Ok(engine)
}
