//! Operator components: compiled and checked once per job ([`LoadedComponent`]),
//! instantiated per subtask from an `InstancePre` ([`OperatorInstance`]).
//!
//! Invariants: a component is accepted only if it imports nothing but Weir's interfaces and
//! implements the `operator` or `co-operator` world; after a trap an instance is never
//! called again (wasmtime poisons it; the subtask fails and is restarted from state).

use std::path::{Path, PathBuf};

use thiserror::Error;
use wasmtime::component::Linker;
use wasmtime::{Engine, Store};

use crate::declared::{DeclaredState, OperatorInfo, Redistribution, StateKind};
use crate::graph::logical::Side;
use crate::record::Batch;
use crate::sandbox::bindings::{one, two, types};
use crate::sandbox::guest_text::tame;
use crate::sandbox::host::HostState;
use crate::sandbox::limits::Limits;

/// A component that cannot be used.
#[derive(Debug, Error)]
pub enum LoadError {
    /// Unreadable file.
    #[error("operator `{uid}`: cannot read component {}: {source}", path.display())]
    Read {
        /// Operator uid.
        uid: String,
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Not a component at all.
    #[error("operator `{uid}`: {} is not a WebAssembly component: {reason}", path.display())]
    NotAComponent {
        /// Operator uid.
        uid: String,
        /// File.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// Imports Weir does not grant.
    #[error(
        "operator `{uid}`: component {} imports {imports}, which Weir does not provide; operators may import only \
         weir:operator/{{context,collector,timers,logging}}@0.3.x (build Rust guests for wasm32-unknown-unknown, \
         not wasip2, so that std adds no WASI imports)",
        path.display()
    )]
    UngrantedImports {
        /// Operator uid.
        uid: String,
        /// File.
        path: PathBuf,
        /// The offending imports.
        imports: String,
    },
    /// Built against another version of Weir's WIT contract.
    #[error(
        "operator `{uid}`: component {} was built against {found}, but this Weir speaks weir:operator@{CONTRACT} (and loads {}); \
         rebuild it with the current SDK (Rust: weir-guest) or against wit/operator.wit",
        path.display(),
        CONTRACTS[..CONTRACTS.len() - 1].join(" and ")
    )]
    OtherContract {
        /// Operator uid.
        uid: String,
        /// File.
        path: PathBuf,
        /// The contract version it imports.
        found: String,
    },
    /// Exports do not match a world.
    #[error(
        "operator `{uid}`: component {} implements neither world `operator` nor `co-operator` of \
         weir:operator@{CONTRACT} (as `operator`: {one}; as `co-operator`: {two}); rebuild it against wit/operator.wit",
        path.display()
    )]
    WrongWorld {
        /// Operator uid.
        uid: String,
        /// File.
        path: PathBuf,
        /// Mismatch as a one-input operator.
        one: String,
        /// Mismatch as a two-input operator.
        two: String,
    },
    /// `describe` failed.
    #[error("operator `{uid}`: component {} failed in `describe`: {reason}", path.display())]
    Describe {
        /// Operator uid.
        uid: String,
        /// File.
        path: PathBuf,
        /// Cause.
        reason: String,
    },
}

/// The version of the WIT package (`wit/operator.wit`) this host implements.
pub const CONTRACT: &str = "0.3.2";

/// The contract versions whose components this host loads: its own, 0.3.1 (no
/// `current-processing-time` import) and 0.3.0 (also no optional `query-state` export: its
/// components answer queries with an error). The linker resolves older imports against the
/// 0.3.2 definitions (semver-compatible: 0.3.2 only adds).
pub const CONTRACTS: [&str; 3] = ["0.3.0", "0.3.1", "0.3.2"];

/// A failure inside a guest call.
#[derive(Debug, Error)]
pub enum GuestError {
    /// The guest trapped (bug, panic, limit); the instance is dead.
    #[error("guest trapped in `{call}`: {message}{}", detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Trap {
        /// Export being called.
        call: &'static str,
        /// The trap.
        message: String,
        /// The guest's last error log line (e.g. its panic message).
        detail: Option<String>,
    },
    /// The guest returned an error.
    #[error("operator returned an error from `{call}`: {message}")]
    Failed {
        /// Export being called.
        call: &'static str,
        /// Its message.
        message: String,
    },
}

/// The WIT state kind as the host's.
fn state_kind(k: types::StateKind) -> StateKind {
    match k {
        types::StateKind::Value => StateKind::Value,
        types::StateKind::List => StateKind::List,
        types::StateKind::Map => StateKind::Map,
    }
}

/// The WIT redistribution as the host's.
fn redistribution(r: types::Redistribution) -> Redistribution {
    match r {
        types::Redistribution::None => Redistribution::None,
        types::Redistribution::Split => Redistribution::Split,
        types::Redistribution::Union => Redistribution::Union,
    }
}

enum Pre {
    One(one::OperatorPre<HostState>),
    Two(two::CoOperatorPre<HostState>),
}

/// A compiled, checked component, ready to instantiate per subtask.
pub struct LoadedComponent {
    pre: Pre,
    engine: Engine,
    /// What it declares.
    pub info: OperatorInfo,
    /// Where it came from.
    pub path: PathBuf,
    /// Its bytes (kept so a live upgrade can store them with the checkpoints).
    pub bytes: std::sync::Arc<Vec<u8>>,
    /// SHA-256 of its bytes, hex.
    pub sha256: String,
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn classify(bytes: &[u8]) -> Result<(), String> {
    match bytes {
        [0, b'a', b's', b'm', 0x0d, 0x00, 0x01, 0x00, ..] => Ok(()),
        [0, b'a', b's', b'm', 0x01, 0x00, 0x00, 0x00, ..] => {
            Err("it is a core WebAssembly module; turn it into a component (Rust: build for wasm32-unknown-unknown \
             with wasm-component-ld as the linker; C: `wasm-tools component new`)"
                .into())
        }
        [0, b'a', b's', b'm', ..] => Err("unsupported WebAssembly binary version".into()),
        _ => Err("the file does not start with the WebAssembly magic bytes".into()),
    }
}

fn linker(engine: &Engine) -> Linker<HostState> {
    let mut l = Linker::new(engine);
    // `two`'s world reuses `one`'s interfaces, so one registration serves both worlds.
    one::Operator::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(&mut l, |s| s)
        .expect("registering Weir's host interfaces cannot fail");
    l
}

impl LoadedComponent {
    /// Compiles and checks the component at `path` for operator `uid`.
    pub fn load(engine: &Engine, uid: &str, path: &Path) -> Result<Self, LoadError> {
        let bytes =
            std::fs::read(path).map_err(|source| LoadError::Read { uid: uid.into(), path: path.into(), source })?;
        Self::from_bytes(engine, uid, path, &bytes)
    }

    /// Compiles and checks component `bytes` (reported as `path`).
    pub fn from_bytes(engine: &Engine, uid: &str, path: &Path, bytes: &[u8]) -> Result<Self, LoadError> {
        let not = |reason: String| LoadError::NotAComponent { uid: uid.into(), path: path.into(), reason };
        classify(bytes).map_err(not)?;
        let sha256 = sha256_hex(bytes);
        let component =
            crate::sandbox::compile_cache::compile(engine, &sha256, bytes).map_err(|e| not(format!("{e:#}")))?;
        let granted = |n: &str| {
            let Some((iface, version)) = n.strip_prefix("weir:operator/").and_then(|r| r.split_once('@')) else {
                return false;
            };
            ["types", "context", "collector", "timers", "logging"].contains(&iface) && CONTRACTS.contains(&version)
        };
        let ungranted: Vec<String> = component
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_string())
            .filter(|n| !granted(n))
            .collect();
        if let Some(other) = ungranted.iter().find_map(|n| {
            n.strip_prefix("weir:operator/").and_then(|rest| rest.split_once('@')).map(|(_, v)| v.to_string())
        }) {
            return Err(LoadError::OtherContract {
                uid: uid.into(),
                path: path.into(),
                found: format!("weir:operator@{other}"),
            });
        }
        if !ungranted.is_empty() {
            return Err(LoadError::UngrantedImports {
                uid: uid.into(),
                path: path.into(),
                imports: ungranted.join(", "),
            });
        }
        let linker = linker(engine);
        let ipre = linker.instantiate_pre(&component).map_err(|e| LoadError::WrongWorld {
            uid: uid.into(),
            path: path.into(),
            one: format!("{e:#}"),
            two: format!("{e:#}"),
        })?;
        let pre = match one::OperatorPre::new(ipre.clone()) {
            Ok(p) => Pre::One(p),
            Err(e1) => match two::CoOperatorPre::new(ipre) {
                Ok(p) => Pre::Two(p),
                Err(e2) => {
                    return Err(LoadError::WrongWorld {
                        uid: uid.into(),
                        path: path.into(),
                        one: format!("{e1:#}"),
                        two: format!("{e2:#}"),
                    });
                }
            },
        };
        let mut lc = LoadedComponent {
            pre,
            engine: engine.clone(),
            info: OperatorInfo {
                name: String::new(),
                version: String::new(),
                schema_version: 0,
                migrates_from: vec![],
                states: vec![],
                side_outputs: vec![],
                two_input: false,
                pageable: false,
            },
            path: path.into(),
            bytes: std::sync::Arc::new(bytes.to_vec()),
            sha256,
        };
        let task = types::TaskInfo {
            job_name: String::new(),
            operator_uid: uid.into(),
            subtask_index: 0,
            parallelism: 1,
            max_parallelism: 1,
            key_group_start: 0,
            key_group_end: 1,
        };
        let describe_err = |reason: String| LoadError::Describe { uid: uid.into(), path: path.into(), reason };
        // `describe` runs untrusted code at load (or upload): tight limits, no log echo.
        let describe_limits = Limits { memory_mb: 64, call_timeout_ms: 1000, ..Limits::default() };
        let mut host = HostState::new(task, 0).with_limits(describe_limits);
        host.echo_logs = false;
        let mut inst = lc.instantiate(host).map_err(|e| describe_err(e.to_string()))?;
        let d = inst.describe().map_err(|e| describe_err(e.to_string()))?;
        lc.info = OperatorInfo {
            name: d.name,
            version: d.version,
            schema_version: d.state_schema_version,
            migrates_from: d.migrates_from,
            states: d
                .states
                .into_iter()
                .map(|s| DeclaredState {
                    name: s.name,
                    kind: state_kind(s.kind),
                    keyed: s.keyed,
                    redistribution: redistribution(s.redistribution),
                })
                .collect(),
            side_outputs: d.side_outputs,
            two_input: matches!(lc.pre, Pre::Two(_)),
            pageable: inst.page.is_some(),
        };
        Ok(lc)
    }

    /// The engine it was compiled with (to compile its successors with).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A fresh instance with `host` as its store data.
    pub fn instantiate(&self, host: HostState) -> Result<OperatorInstance, GuestError> {
        let limits = host.limits;
        let mut store = Store::new(&self.engine, host);
        store.limiter(|h| &mut h.store_limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(limits.deadline_ticks());
        let ipre = match &self.pre {
            Pre::One(p) => p.instance_pre(),
            Pre::Two(p) => p.instance_pre(),
        };
        let instance = ipre.instantiate(&mut store).map_err(|e| trap("instantiate", e, None, &limits))?;
        let inst = match &self.pre {
            Pre::One(_) => one::Operator::new(&mut store, &instance).map(Inst::One),
            Pre::Two(_) => two::CoOperator::new(&mut store, &instance).map(Inst::Two),
        }
        .map_err(|e| trap("instantiate", e, None, &limits))?;
        // Contract 0.3.1's optional export: components of 0.3.0 (or SDKs without live
        // queries) lack it and still load.
        let query = instance.get_typed_func::<QueryParams, QueryResult>(&mut store, "query-state").ok();
        // The paged worlds' exports (the disk state backend): both, or the component runs
        // on the memory backend only.
        let page_in = instance.get_typed_func::<PageInParams, PageInResult>(&mut store, "page-in").ok();
        let page_out = instance.get_typed_func::<PageOutParams, PageOutResult>(&mut store, "page-out").ok();
        let page = page_in.zip(page_out);
        let names =
            |keyed: bool| self.info.states.iter().filter(|s| s.keyed == keyed).map(|s| s.name.clone()).collect();
        let declared = std::sync::Arc::new(Declared { keyed: names(true), other: names(false) });
        Ok(OperatorInstance { store, inst, declared, query, page })
    }
}

type QueryParams = (String, u32, Vec<u8>);
type QueryResult = (Result<Option<String>, String>,);
type PageInParams = (Vec<types::KeyGroupState>,);
type PageInResult = (Result<(), String>,);
type PageOutParams = (Vec<u8>, bool);
type PageOutResult = (Result<Vec<types::KeyGroupState>, String>,);
type PageFuncs = (
    wasmtime::component::TypedFunc<PageInParams, PageInResult>,
    wasmtime::component::TypedFunc<PageOutParams, PageOutResult>,
);

enum Inst {
    One(one::Operator),
    Two(two::CoOperator),
}

/// A live operator instance of one subtask.
pub struct OperatorInstance {
    store: Store<HostState>,
    inst: Inst,
    declared: std::sync::Arc<Declared>,
    /// `query-state`, when the component exports it (contract 0.3.1 worlds `queryable-*`).
    query: Option<wasmtime::component::TypedFunc<QueryParams, QueryResult>>,
    /// `page-in` and `page-out`, when the component exports them (worlds `paged-*`).
    page: Option<PageFuncs>,
}

/// The state names an operator declared, keyed and not: what its snapshots may name.
#[derive(Debug, Default)]
struct Declared {
    keyed: Vec<String>,
    other: Vec<String>,
}

impl Declared {
    /// Checks a blob's state names: each declared (of the blob's kind), none twice.
    fn admit(&self, keyed: bool, names: &[&[u8]]) -> Result<(), String> {
        let (allowed, kind) = if keyed { (&self.keyed, "keyed") } else { (&self.other, "non-keyed") };
        for (i, n) in names.iter().enumerate() {
            let name = String::from_utf8_lossy(n);
            if !allowed.iter().any(|a| a.as_bytes() == *n) {
                return Err(format!(
                    "the snapshot holds {kind} state `{}`, which the operator does not declare as {kind} (it declares: [{}])",
                    tame(&name),
                    allowed.join(", ")
                ));
            }
            if names[..i].contains(n) {
                return Err(format!("the snapshot holds {kind} state `{}` twice in one blob", tame(&name)));
            }
        }
        Ok(())
    }
}

/// Turns a failed call into a [`GuestError`], naming the limit when one was breached.
fn trap(call: &'static str, e: wasmtime::Error, detail: Option<String>, limits: &Limits) -> GuestError {
    let full = format!("{e:#}");
    let message = match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => format!(
            "exceeded its CPU time limit: the call ran longer than call_timeout_ms = {} ms ([limits] in the job file)",
            limits.call_timeout_ms
        ),
        Some(wasmtime::Trap::StackOverflow) => {
            "exhausted its call stack (unbounded recursion?); the instance is discarded".to_string()
        }
        _ if full.contains("forcing trap when growing memory") => format!(
            "exceeded its memory limit: linear memory may not grow past memory_mb = {} MiB ([limits] in the job file)",
            limits.memory_mb
        ),
        _ if full.contains("forcing trap when growing table") => {
            "exceeded its table limit (64 tables of at most 1048576 elements)".to_string()
        }
        Some(wasmtime::Trap::MemoryOutOfBounds) => {
            "wasm trap: out of bounds memory access (a Rust or C guest also gets this when its shadow stack in \
             linear memory overflows: deep recursion with large frames)"
                .to_string()
        }
        Some(t) => {
            let t = t.to_string();
            if t.starts_with("wasm trap") { t } else { format!("wasm trap: {t}") }
        }
        // A host import refused the call: its message, not the wasm backtrace around it.
        None => e.root_cause().to_string(),
    };
    GuestError::Trap {
        call,
        message: message.lines().next().unwrap_or("").to_string(),
        detail: detail.as_deref().map(tame),
    }
}

macro_rules! call {
    ($self:ident, $name:literal, $method:ident $(, $arg:expr)*) => {{
        $self.arm();
        let r = match &$self.inst {
            Inst::One(b) => b.$method(&mut $self.store $(, $arg)*),
            Inst::Two(b) => b.$method(&mut $self.store $(, $arg)*),
        };
        $self.finish($name, r)
    }};
}

impl OperatorInstance {
    fn finish<T>(&mut self, call: &'static str, r: wasmtime::Result<T>) -> Result<T, GuestError> {
        let limits = self.store.data().limits;
        r.map_err(|e| trap(call, e, self.store.data_mut().last_error.take(), &limits))
    }

    /// Gives the next call its CPU deadline.
    fn arm(&mut self) {
        let ticks = self.store.data().limits.deadline_ticks();
        self.store.set_epoch_deadline(ticks);
    }

    fn result(call: &'static str, r: Result<(), String>) -> Result<(), GuestError> {
        r.map_err(|message| GuestError::Failed { call, message: tame(&message) })
    }

    /// The host state (watermark, timers, emitted records).
    pub fn host(&mut self) -> &mut HostState {
        self.store.data_mut()
    }

    /// `describe`.
    pub fn describe(&mut self) -> Result<types::OperatorInfo, GuestError> {
        call!(self, "describe", call_describe)
    }

    /// `setup` (the WIT export behind `OperatorLogic::open`).
    pub fn open(&mut self, config: &[(String, String)]) -> Result<(), GuestError> {
        let r = call!(self, "setup", call_setup, config)?;
        Self::result("setup", r)
    }

    /// `process` (one-input) or `process-left`/`process-right` (two-input).
    pub fn process(&mut self, side: Side, batch: &Batch) -> Result<(), GuestError> {
        let bytes = batch.as_bytes();
        self.arm();
        let r = match (&self.inst, side) {
            (Inst::One(b), Side::Left) => b.call_process(&mut self.store, bytes),
            (Inst::Two(b), Side::Left) => b.call_process_left(&mut self.store, bytes),
            (Inst::Two(b), Side::Right) => b.call_process_right(&mut self.store, bytes),
            (Inst::One(_), Side::Right) => Ok(Err("a one-input operator has no right input".into())),
        };
        let r = self.finish("process", r)?;
        Self::result("process", r)
    }

    /// `on-timer`.
    pub fn on_timer(&mut self, domain: types::TimeDomain, timers: &Batch) -> Result<(), GuestError> {
        let r = call!(self, "on-timer", call_on_timer, domain, timers.as_bytes())?;
        Self::result("on-timer", r)
    }

    /// `on-watermark`.
    pub fn on_watermark(&mut self, watermark: i64) -> Result<(), GuestError> {
        self.store.data_mut().watermark = watermark;
        let r = call!(self, "on-watermark", call_on_watermark, watermark)?;
        Self::result("on-watermark", r)
    }

    /// `snapshot`.
    pub fn snapshot(
        &mut self,
        checkpoint: u64,
        mode: types::SnapshotMode,
    ) -> Result<types::OperatorSnapshot, GuestError> {
        let r = call!(self, "snapshot", call_snapshot, checkpoint, mode)?;
        let snap = r.map_err(|message| GuestError::Failed { call: "snapshot", message: tame(&message) })?;
        let bytes = snap.keyed.iter().map(|k| k.data.len() as u64).sum::<u64>() + snap.operator_state.len() as u64;
        let limits = self.store.data().limits;
        let max_value = (limits.max_state_value_mb << 20) as usize;
        let blobs = snap.keyed.iter().map(|k| (true, &k.data[..])).chain([(false, &snap.operator_state[..])]);
        for (keyed, blob) in blobs {
            let failed = |message: String| GuestError::Failed { call: "snapshot", message };
            let shape = crate::checkpoint::layout::walk(blob)
                .map_err(|e| failed(format!("the snapshot does not follow the state layout: {e}")))?;
            self.declared.admit(keyed, &shape.states).map_err(failed)?;
            let longest = shape.max_value;
            if longest > max_value {
                return Err(GuestError::Trap {
                    call: "snapshot",
                    message: format!(
                        "exceeded its state value limit: a value of {longest} bytes > max_state_value_mb = {} MiB \
                         ([limits] in the job file)",
                        limits.max_state_value_mb
                    ),
                    detail: None,
                });
            }
        }
        let max = limits.max_snapshot_bytes();
        if bytes > max {
            return Err(GuestError::Trap {
                call: "snapshot",
                message: format!(
                    "exceeded its snapshot size limit: {bytes} bytes > max_snapshot_mb = {} MiB ([limits] in the job file)",
                    max >> 20
                ),
                detail: None,
            });
        }
        Ok(snap)
    }

    /// `restore`.
    pub fn restore(&mut self, schema_version: u32, state: &types::OperatorSnapshot) -> Result<(), GuestError> {
        let r = call!(self, "restore", call_restore, schema_version, state)?;
        Self::result("restore", r)
    }

    /// `finish` (the WIT export behind `OperatorLogic::close`).
    pub fn close(&mut self) -> Result<(), GuestError> {
        let r = call!(self, "finish", call_finish)?;
        Self::result("finish", r)
    }

    /// `query-state`: `key`'s current value in keyed state `state` as JSON text, if it has
    /// one. A component without the export (contract 0.3.0) answers an error saying so; an
    /// answer longer than `max_state_value_mb` is refused.
    pub fn query_state(&mut self, state: &str, key_group: u32, key: &[u8]) -> Result<Option<String>, GuestError> {
        const CALL: &str = "query-state";
        let Some(f) = self.query else {
            return Err(GuestError::Failed {
                call: CALL,
                message: "the operator's component does not answer state queries (built for contract 0.3.0, or \
                          with an SDK without them): rebuild it with the current Weir SDK"
                    .into(),
            });
        };
        self.arm();
        let r = f.call(&mut self.store, (state.to_string(), key_group, key.to_vec()));
        let (answer,) = self.finish(CALL, r)?;
        let value = answer.map_err(|message| GuestError::Failed { call: CALL, message: tame(&message) })?;
        let max = (self.store.data().limits.max_state_value_mb << 20) as usize;
        match value {
            Some(v) if v.len() > max => Err(GuestError::Failed {
                call: CALL,
                message: format!(
                    "the answer of {} bytes exceeds max_state_value_mb ([limits] in the job file)",
                    v.len()
                ),
            }),
            v => Ok(v),
        }
    }

    /// `page-in` (the disk backend): puts these keys' state into the guest's cache.
    pub fn page_in(&mut self, state: Vec<types::KeyGroupState>) -> Result<(), GuestError> {
        const CALL: &str = "page-in";
        let (f, _) = self.page.ok_or_else(unpageable(CALL))?;
        self.arm();
        let r = f.call(&mut self.store, (state,));
        let (answer,) = self.finish(CALL, r)?;
        Self::result(CALL, answer)
    }

    /// `page-out` (the disk backend): the changes since the previous one, as delta blobs
    /// (checked against the layout and the declared keyed states), then the guest forgets
    /// `evict` (record framing) or everything.
    pub fn page_out(&mut self, evict: Vec<u8>, all: bool) -> Result<Vec<types::KeyGroupState>, GuestError> {
        const CALL: &str = "page-out";
        let (_, f) = self.page.ok_or_else(unpageable(CALL))?;
        self.arm();
        let r = f.call(&mut self.store, (evict, all));
        let (answer,) = self.finish(CALL, r)?;
        let pages = answer.map_err(|message| GuestError::Failed { call: CALL, message: tame(&message) })?;
        let max_value = (self.store.data().limits.max_state_value_mb << 20) as usize;
        for p in &pages {
            let failed = |message: String| GuestError::Failed { call: CALL, message };
            if p.key_group == u32::MAX && p.data.is_empty() {
                continue; // "more follows"
            }
            if !crate::checkpoint::layout::is_delta(&p.data) {
                return Err(failed(format!("key group {}: a page-out blob must be a delta", p.key_group)));
            }
            let shape = crate::checkpoint::layout::walk(&p.data)
                .map_err(|e| failed(format!("the page does not follow the state layout: {e}")))?;
            self.declared.admit(true, &shape.states).map_err(failed)?;
            if shape.max_value > max_value {
                return Err(failed(format!(
                    "a value of {} bytes > max_state_value_mb = {} MiB ([limits] in the job file)",
                    shape.max_value,
                    max_value >> 20
                )));
            }
        }
        Ok(pages)
    }

    /// Takes the records emitted since the last call.
    pub fn take_emitted(&mut self) -> Batch {
        let h = self.store.data_mut();
        let n = std::mem::take(&mut h.emitted_records);
        Batch::from_validated(std::mem::take(&mut h.emitted), n)
    }
}

fn unpageable(call: &'static str) -> impl FnOnce() -> GuestError {
    move || GuestError::Failed {
        call,
        message: "the operator's component cannot page its keyed state (it does not build the `paged-operator` \
                  world): rebuild it with the current Rust SDK (weir-guest), or use state_backend = \"memory\""
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::Declared;

    #[test]
    fn a_snapshot_names_only_declared_states_of_its_kind_once() {
        let d = Declared { keyed: vec!["count".into(), "seen".into()], other: vec!["pending".into()] };
        assert_eq!(d.admit(true, &[b"count", b"seen"]), Ok(()));
        assert_eq!(d.admit(false, &[b"pending"]), Ok(()));
        assert_eq!(d.admit(true, &[]), Ok(()));
        let e = d.admit(true, &[b"pending"]).unwrap_err();
        assert!(e.contains("keyed state `pending`") && e.contains("[count, seen]"), "{e}");
        let e = d.admit(false, &[b"count"]).unwrap_err();
        assert!(e.contains("non-keyed state `count`"), "{e}");
        let e = d.admit(true, &[b"count", b"count"]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = d.admit(true, &[b"x\nforged"]).unwrap_err();
        assert!(!e.contains('\n'), "{e}");
    }
}
