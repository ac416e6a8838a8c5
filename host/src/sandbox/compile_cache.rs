//! Compiled components, cached by content digest, and the slots compilation runs in.
//!
//! Invariants: a component's bytes are compiled at most once per engine while its entry is
//! cached (uploading, submitting and restarting a job with the same component reuse it); at
//! most [`COMPILE_SLOTS`] compilations run at once in the process, so compiling never takes
//! every core from running jobs; the cache holds at most [`MAX_ENTRIES`] components and
//! [`MAX_BYTES`] of their source bytes, the oldest evicted first, all for one engine (a
//! process runs one; a compiled component keeps its engine alive, so entries of an engine
//! that is no longer used are dropped as soon as another engine compiles). Callers that serve several
//! tenants also serialize each tenant's own compilations (`api::server`), so one tenant's huge
//! component holds one slot, never all of them. Below this cache, the process's
//! [`super::disk_cache`] (when installed) keeps artifacts across processes, and with
//! [`super::isolated_compile`] installed (`weir serve`) compiling happens in a child process
//! bounded in memory and time.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};

use wasmtime::Engine;
use wasmtime::component::Component;

/// Compilations at once in one process.
pub const COMPILE_SLOTS: usize = 2;
/// Components cached.
pub const MAX_ENTRIES: usize = 32;
/// Source bytes of the cached components, summed.
pub const MAX_BYTES: usize = 256 << 20;

struct Entry {
    engine: Engine,
    sha256: String,
    bytes: usize,
    component: Component,
}

#[derive(Default)]
struct Cache {
    entries: Mutex<VecDeque<Entry>>,
    running: Mutex<usize>,
    freed: Condvar,
}

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Cache::default)
}

/// Whether the cache holds `sha256` compiled for `engine`.
pub fn is_cached(engine: &Engine, sha256: &str) -> bool {
    let entries = cache().entries.lock().unwrap_or_else(|p| p.into_inner());
    entries.iter().any(|e| e.sha256 == sha256 && Engine::same(&e.engine, engine))
}

/// The component of `bytes` (digest `sha256`) for `engine`: from the cache, or compiled in
/// one of the process's compile slots and cached.
pub fn compile(engine: &Engine, sha256: &str, bytes: &[u8]) -> wasmtime::Result<Component> {
    let c = cache();
    {
        let entries = c.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.iter().find(|e| e.sha256 == sha256 && Engine::same(&e.engine, engine)) {
            return Ok(e.component.clone());
        }
    }
    let disk = crate::sandbox::disk_cache::installed();
    let component = match disk.and_then(|d| d.load(engine, sha256)) {
        Some(component) => component,
        None => {
            let component = {
                let _slot = Slot::take(c);
                match crate::sandbox::isolated_compile::installed() {
                    Some(iso) => iso.compile(engine, bytes).map_err(|e| wasmtime::format_err!("{e}"))?,
                    None => Component::new(engine, bytes)?,
                }
            };
            if let Some(d) = disk {
                d.store(engine, sha256, &component);
            }
            component
        }
    };
    let mut entries = c.entries.lock().unwrap_or_else(|p| p.into_inner());
    entries.retain(|e| Engine::same(&e.engine, engine));
    if !entries.iter().any(|e| e.sha256 == sha256) && bytes.len() <= MAX_BYTES {
        entries.push_back(Entry {
            engine: engine.clone(),
            sha256: sha256.to_string(),
            bytes: bytes.len(),
            component: component.clone(),
        });
        while entries.len() > MAX_ENTRIES || entries.iter().map(|e| e.bytes).sum::<usize>() > MAX_BYTES {
            entries.pop_front();
        }
    }
    Ok(component)
}

struct Slot(&'static Cache);

impl Slot {
    fn take(c: &'static Cache) -> Slot {
        let mut running = c.running.lock().unwrap_or_else(|p| p.into_inner());
        while *running >= COMPILE_SLOTS {
            running = c.freed.wait(running).unwrap_or_else(|p| p.into_inner());
        }
        *running += 1;
        Slot(c)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}
