//! The process-wide wasmtime `Engine`: one per process, shared by every job, so compiled
//! code and the configuration are uniform.

use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

use crate::sandbox::limits::{CEILING, TICK};

/// How to build the engine (the benchmark compares the choices; Weir runs the defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Epoch interruption, the CPU time limit per guest call (default on; off only to
    /// measure its cost).
    pub epoch_interruption: bool,
    /// Pooling instance allocator: instances take pre-reserved slots instead of fresh
    /// mappings. `weir serve` uses it (faster, bounded instance start; at most
    /// [`POOL_INSTANCES`] at once; reserves address space up front); `weir run` and tests
    /// allocate on demand (no cap).
    pub pooling: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { epoch_interruption: true, pooling: false }
    }
}

/// Slots of the pooling allocator: at most this many operator instances at once per process.
pub const POOL_INSTANCES: u32 = 1000;

/// Builds the engine Weir runs operators on.
///
/// wasmtime is compiled without `component-model-async`, which takes the per-call cost of
/// an export from ~550 ns to ~200 ns (measured, see `../shared/TOOLCHAIN.md`).
///
/// Epoch interruption is on: a ticker thread advances the epoch every [`TICK`] while the
/// engine lives, and each guest call gets a deadline in ticks (`[limits] call_timeout_ms`),
/// so a guest that spins is interrupted.
pub fn new_engine() -> Result<Engine, wasmtime::Error> {
    engine_with(EngineOptions::default())
}

/// Builds an engine with `opts`.
pub fn engine_with(opts: EngineOptions) -> Result<Engine, wasmtime::Error> {
    let mut c = Config::new();
    c.wasm_component_model(true);
    c.cranelift_opt_level(OptLevel::Speed);
    c.epoch_interruption(opts.epoch_interruption);
    // `WEIR_PERF_MAP=1`: write /tmp/perf-<pid>.map so `perf report` names guest functions.
    if std::env::var_os("WEIR_PERF_MAP").is_some_and(|v| v == "1") {
        c.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    if opts.pooling {
        let mut p = PoolingAllocationConfig::new();
        p.total_component_instances(POOL_INSTANCES);
        p.total_core_instances(POOL_INSTANCES * 4);
        p.total_memories(POOL_INSTANCES * 2);
        p.total_tables(POOL_INSTANCES * 4);
        p.max_memory_size((CEILING.memory_mb << 20) as usize);
        p.max_memories_per_component(4);
        p.max_tables_per_component(8);
        p.max_core_instances_per_component(16);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(p));
    }
    let engine = Engine::new(&c)?;
    if opts.epoch_interruption {
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("weir-epoch".into())
            .spawn(move || {
                while let Some(e) = weak.upgrade() {
                    e.increment_epoch();
                    drop(e);
                    std::thread::sleep(TICK);
                }
            })
            .map_err(|e| wasmtime::format_err!("cannot start the epoch ticker: {e}"))?;
    }
    Ok(engine)
}
