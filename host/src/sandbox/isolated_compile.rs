//! Compiling an untrusted component in a child process, bounded in memory and time.
//!
//! Cranelift's time and memory grow with the component, which a tenant chooses: compiled in
//! the server process, one huge or pathological component could take gigabytes or minutes of
//! it. With isolation installed (`weir serve`), [`super::compile_cache`] compiles each
//! component in a child process (`weir __compile-component`, the same code generation)
//! under `RLIMIT_DATA` (`memory_mb`) and a wall-clock deadline (`timeout_ms`, after which the
//! child is killed), its CPU charged to the tenant's cgroup when one is given; the child hands
//! back wasmtime's serialized artifact on stdout, which the server loads.
//!
//! Invariants: a compile that breaks a bound is an error naming the bound, never a crash or a
//! hang of the server; the artifact the server loads was written by its own executable (the
//! same binary, started by it, reading only the component bytes from a pipe).

use std::cell::RefCell;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::sandbox::engine::EngineOptions;

/// The bounds of one compilation.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// The `weir` executable (the child runs `weir __compile-component`).
    pub exe: PathBuf,
    /// The engine options the server's engine was built with (the child builds the same).
    pub engine: EngineOptions,
    /// `RLIMIT_DATA` of the child, MiB.
    pub memory_mb: u64,
    /// Wall-clock deadline of one compilation, ms.
    pub timeout_ms: u64,
}

/// The name of the hidden subcommand the child runs.
pub const SUBCOMMAND: &str = "__compile-component";

static GLOBAL: OnceLock<Isolation> = OnceLock::new();

thread_local! {
    static CHARGE_TO: RefCell<Option<Charge>> = const { RefCell::new(None) };
}

/// Compiles every component of this process in a child from now on (first call wins).
pub fn install(isolation: Isolation) {
    let _ = GLOBAL.set(isolation);
}

/// The installed isolation, if any.
pub fn installed() -> Option<&'static Isolation> {
    GLOBAL.get()
}

/// How a compiler child's CPU is charged to its tenant's share.
pub trait ChargeProcess: Send + Sync {
    /// The nice the child starts at, set before it runs anything, so every compile thread it
    /// starts has it (nice is per thread on Linux); `None`: the server's.
    fn nice(&self) -> Option<i32>;
    /// Called with the child's pid once it started (e.g. moves it into the tenant's cgroup).
    fn started(&self, pid: u32);
}

/// What charges a compiler child's CPU to its tenant.
pub type Charge = std::sync::Arc<dyn ChargeProcess>;

/// The charge in force before, put back when dropped (also when `f` panics).
struct Restore(Option<Charge>);

impl Drop for Restore {
    fn drop(&mut self) {
        let old = self.0.take();
        CHARGE_TO.with(|c| *c.borrow_mut() = old);
    }
}

/// Runs `f` with the compilations it starts on this thread charged to a tenant's CPU share:
/// `charge` is called with each child process's pid.
pub fn charged_to<R>(charge: Option<Charge>, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(CHARGE_TO.with(|c| c.replace(charge)));
    f()
}

impl Isolation {
    /// Compiles `bytes` for `engine` in a child process.
    pub fn compile(&self, engine: &Engine, bytes: &[u8]) -> Result<Component, String> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg(SUBCOMMAND);
        // The child compiles without the pooling allocator (whose pools would count against
        // its memory bound): the artifact is the same, and wasmtime checks on loading it that
        // it suits the server's engine (`a_pooling_engine_loads_what_an_on_demand_engine_compiled`).
        if !self.engine.epoch_interruption {
            cmd.arg("--no-epoch");
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let data = self.memory_mb.saturating_mul(1 << 20);
        let charge = CHARGE_TO.with(|c| c.borrow().clone());
        let nice = charge.as_ref().and_then(|c| c.nice());
        // SAFETY: only async-signal-safe calls (setrlimit, setpriority) between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                let lim = |r, v| {
                    let l = libc::rlimit { rlim_cur: v, rlim_max: v };
                    if libc::setrlimit(r, &l) != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
                };
                lim(libc::RLIMIT_DATA, data)?;
                lim(libc::RLIMIT_CORE, 0)?;
                if let Some(nice) = nice {
                    // Lowering is always allowed; a refused raise keeps the server's nice.
                    libc::setpriority(libc::PRIO_PROCESS, 0, nice);
                }
                Ok(())
            });
        }
        let mut child =
            cmd.spawn().map_err(|e| format!("cannot start the compiler process {}: {e}", self.exe.display()))?;
        if let Some(charge) = charge {
            charge.started(child.id());
        }
        let pid = child.id() as libc::pid_t;
        let mut stdin = child.stdin.take().expect("piped");
        let input = bytes.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let timed_out = std::sync::Arc::new(AtomicBool::new(false));
        let deadline = Instant::now() + Duration::from_millis(self.timeout_ms);
        let watchdog = {
            let (done, timed_out) = (done.clone(), timed_out.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Acquire) {
                    if Instant::now() >= deadline {
                        timed_out.store(true, Ordering::Release);
                        // SAFETY: kill has no memory-safety preconditions; `pid` is our
                        // child, not yet reaped (we reap only after `done` is set).
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        let mut artifact = Vec::new();
        let _ = child.stdout.take().expect("piped").read_to_end(&mut artifact);
        let mut err = Vec::new();
        let _ = child.stderr.take().expect("piped").take(4096).read_to_end(&mut err);
        let _ = writer.join();
        let status = child.wait().map_err(|e| format!("waiting for the compiler process: {e}"))?;
        done.store(true, Ordering::Release);
        let _ = watchdog.join();
        let err = String::from_utf8_lossy(&err);
        if timed_out.load(Ordering::Acquire) {
            return Err(format!(
                "compiling it took longer than the server's compile timeout (timeout_ms = {} under [compile] in server.toml); \
                 make the component smaller",
                self.timeout_ms
            ));
        }
        if !status.success() {
            if err.contains("memory allocation") || err.contains("out of memory") || err.contains("Cannot allocate") {
                return Err(format!(
                    "compiling it needed more memory than the server allows (memory_mb = {} under [compile] in \
                     server.toml); make the component smaller",
                    self.memory_mb
                ));
            }
            return Err(format!("the compiler process failed ({status}): {}", err.trim()));
        }
        // SAFETY: the artifact was just written by this executable's own compiler process,
        // started above with the same engine configuration, from nothing but these bytes.
        unsafe { Component::deserialize(engine, &artifact) }
            .map_err(|e| format!("loading the compiled artifact: {e:#}"))
    }
}

/// The child's side: reads a component from stdin, writes its compiled artifact to stdout.
pub fn child_main(engine: EngineOptions) -> Result<(), String> {
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes).map_err(|e| format!("reading the component: {e}"))?;
    let engine = crate::sandbox::engine::engine_with(engine).map_err(|e| format!("{e:#}"))?;
    let artifact = engine.precompile_component(&bytes).map_err(|e| format!("{e:#}"))?;
    std::io::stdout().write_all(&artifact).map_err(|e| format!("writing the artifact: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::sandbox::engine::{EngineOptions, engine_with};

    /// A compilation that panics under a tenant's charge does not leave the thread charging
    /// the next tenant's compilations to it.
    #[test]
    fn a_charge_is_put_back_when_its_compilation_panics() {
        struct Nothing;
        impl super::ChargeProcess for Nothing {
            fn nice(&self) -> Option<i32> {
                None
            }
            fn started(&self, _: u32) {}
        }
        let charge: super::Charge = std::sync::Arc::new(Nothing);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            super::charged_to(Some(charge), || panic!("bad component"))
        }));
        assert!(panicked.is_err());
        assert!(super::CHARGE_TO.with(|c| c.borrow().is_none()), "the charge outlived its compilation");
    }

    /// The child compiles on an engine without the pooling allocator; the server runs one
    /// with it. The artifact must load there (if a wasmtime upgrade changes that, this fails
    /// rather than every tenant upload).
    #[test]
    fn a_pooling_engine_loads_what_an_on_demand_engine_compiled() {
        let empty: &[u8] = b"\0asm\x0d\0\x01\0";
        let child = engine_with(EngineOptions { pooling: false, ..Default::default() }).unwrap();
        let server = engine_with(EngineOptions { pooling: true, ..Default::default() }).unwrap();
        let artifact = child.precompile_component(empty).unwrap();
        // SAFETY: the artifact was just produced by wasmtime in this process.
        assert!(unsafe { wasmtime::component::Component::deserialize(&server, &artifact) }.is_ok());
    }
}
