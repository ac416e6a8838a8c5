//! The glue between the generated export bindings and an [`Operator`]: decodes batches,
//! sets up each record's [`Context`], flushes emits, encodes and decodes snapshots.
//!
//! Invariant: every export call ends with the emit buffer handed to the host, so the host
//! sees a call's output before it makes the next call (barriers stay aligned with data).

use std::cell::UnsafeCell;
use std::collections::BTreeMap;

use crate::bindings::{context as host_context, logging, types};
use crate::context::{Context, OpenContext, Runtime};
use crate::operator::{CoOperator, Operator, TimeDomain};
use crate::record::{NO_KEY_GROUP, RecordReader};
use crate::state::{Cursor, encode_group};
use crate::{Error, Result};

struct Instance<Op> {
    op: Op,
    rt: Runtime,
}

/// Where the exported component keeps its one operator instance.
pub struct Slot<Op>(UnsafeCell<Option<Instance<Op>>>);

// SAFETY: a component instance is single-threaded; the host never re-enters an export.
unsafe impl<Op> Sync for Slot<Op> {}

impl<Op> Slot<Op> {
    /// An empty slot.
    pub const fn new() -> Self {
        Slot(UnsafeCell::new(None))
    }

    #[allow(clippy::mut_from_ref)]
    fn get(&self) -> &mut Option<Instance<Op>> {
        // SAFETY: see `Sync` above: exports run one at a time and do not re-enter.
        unsafe { &mut *self.0.get() }
    }

    fn instance(&self) -> Result<&mut Instance<Op>, String> {
        self.get().as_mut().ok_or_else(|| "operator used before `open`".to_string())
    }
}

impl<Op> Default for Slot<Op> {
    fn default() -> Self {
        Self::new()
    }
}

/// Which input a batch came from.
#[derive(Clone, Copy)]
pub enum Input {
    /// The only (or left) input.
    Left,
    /// The right input of a two-input operator.
    Right,
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            logging::log(logging::Level::Error, &format!("operator panicked: {info}"));
        }))
    });
}

/// `describe` export.
pub fn describe<Op: Operator>() -> types::OperatorInfo {
    install_panic_hook();
    Op::INFO.to_wit()
}

/// `open` export.
pub fn open<Op: Operator>(slot: &Slot<Op>, config: Vec<(String, String)>) -> Result<(), String> {
    install_panic_hook();
    let config: BTreeMap<String, String> = config.into_iter().collect();
    let mut rt = Runtime::new(Op::INFO, host_context::task());
    // A live upgrade's new instance opens mid-stream: it starts from the running watermark
    // (i64 minimum at a job's start), or its first records would all look on time.
    rt.watermark = host_context::current_watermark();
    let op = Op::open(&mut OpenContext { rt: &mut rt, config: &config }).map_err(|e| e.to_string())?;
    *slot.get() = Some(Instance { op, rt });
    Ok(())
}

/// Runs `f` for every record of `batch` with the record's [`Context`], then flushes emits
/// (also after an error: what the records before the failing one emitted stands). With
/// `name_record`, an error starts with `record <i>: ` (its position in the batch), which the
/// host turns into the record's key, timestamp and origin (see `wit/operator.wit`).
fn for_each_record<Op: Operator>(
    slot: &Slot<Op>,
    batch: &[u8],
    name_record: bool,
    mut f: impl FnMut(&mut Op, &mut Context<'_>, crate::Record<'_>) -> Result<()>,
) -> Result<(), String> {
    let inst = slot.instance()?;
    inst.rt.clock = None;
    let mut index = 0u32;
    let mut run = || {
        let mut reader = RecordReader::new(batch);
        while let Some(rec) = reader.next_record()? {
            let mut ctx = Context {
                slot: inst.rt.slot_of(rec.key_group),
                rt: &mut inst.rt,
                key_group: rec.key_group,
                key: rec.key,
                timestamp: rec.timestamp,
            };
            f(&mut inst.op, &mut ctx, rec)?;
            index += 1;
        }
        Ok::<(), Error>(())
    };
    let r = run();
    inst.rt.flush();
    r.map_err(|e| if name_record { format!("record {index}: {e}") } else { e.to_string() })
}

/// `process` export of a one-input operator, `process-left` of a two-input one.
pub fn process<Op: Operator>(slot: &Slot<Op>, batch: Vec<u8>) -> Result<(), String> {
    for_each_record(slot, &batch, true, |op, ctx, rec| op.process(ctx, rec))
}

/// `process-right` export of a two-input operator.
pub fn process_right<Op: CoOperator>(slot: &Slot<Op>, batch: Vec<u8>) -> Result<(), String> {
    for_each_record(slot, &batch, true, |op, ctx, rec| op.process_right(ctx, rec))
}

/// `on-timer` export: the batch holds the fired timers (tag = key group, ts = time).
pub fn on_timer<Op: Operator>(slot: &Slot<Op>, domain: TimeDomain, timers: Vec<u8>) -> Result<(), String> {
    for_each_record(slot, &timers, false, |op, ctx, _| op.on_timer(ctx, domain))
}

/// `on-watermark` export.
pub fn on_watermark<Op: Operator>(slot: &Slot<Op>, watermark: i64) -> Result<(), String> {
    let inst = slot.instance()?;
    inst.rt.watermark = watermark;
    inst.rt.clock = None;
    let mut ctx = Context { rt: &mut inst.rt, slot: None, key_group: NO_KEY_GROUP, key: &[], timestamp: watermark };
    let r = inst.op.on_watermark(&mut ctx, watermark);
    inst.rt.flush();
    r.map_err(|e| e.to_string())
}

/// `close` export.
pub fn close<Op: Operator>(slot: &Slot<Op>) -> Result<(), String> {
    let inst = slot.instance()?;
    inst.rt.clock = None;
    let mut ctx = Context { rt: &mut inst.rt, slot: None, key_group: NO_KEY_GROUP, key: &[], timestamp: i64::MAX };
    let r = inst.op.close(&mut ctx);
    inst.rt.flush();
    r.map_err(|e| e.to_string())
}

/// Bytes of key-group blobs one `snapshot` call hands out (about; whole groups): a chunk.
/// At ~0.2 µs per entry (cache misses on large state) each call pauses the stream for ~2 ms
/// (or one key group's worth, if larger: more key groups, finer chunks).
pub const SNAPSHOT_CHUNK_BYTES: usize = 256 << 10;

/// Entries one `snapshot` call walks at most (whole groups): a delta chunk is small in bytes
/// but finding the changed entries walks every entry of its groups.
pub const SNAPSHOT_CHUNK_ENTRIES: usize = 8192;

/// The key group of the entry that says "more follows: call `snapshot` again with the same
/// checkpoint id" (`wit/operator.wit`).
pub const MORE: u32 = u32::MAX;

/// A snapshot being handed out in chunks.
pub(crate) struct InProgress {
    checkpoint: u64,
    full: bool,
    next_slot: usize,
}

/// `snapshot` export.
pub fn snapshot<Op: Operator>(
    slot: &Slot<Op>,
    checkpoint: u64,
    mode: types::SnapshotMode,
) -> Result<types::OperatorSnapshot, String> {
    let inst = slot.instance()?;
    take_snapshot(&mut inst.rt, checkpoint, mode).map_err(|e| e.to_string())
}

fn take_snapshot(rt: &mut Runtime, checkpoint: u64, mode: types::SnapshotMode) -> Result<types::OperatorSnapshot> {
    let full = matches!(mode, types::SnapshotMode::Full);
    let groups = rt.group_count();
    let continuing = rt.snapshot.as_ref().is_some_and(|p| p.checkpoint == checkpoint && p.full == full);
    if !continuing {
        // The barrier: freeze (an unfinished earlier snapshot is abandoned; the host starts
        // over with a full one), then hand out the first chunk.
        if !rt.paged {
            for s in &rt.keyed {
                s.table.borrow_mut().freeze(full);
            }
        }
        rt.snapshot = Some(InProgress { checkpoint, full, next_slot: 0 });
    }
    let mut keyed = Vec::new();
    if rt.paged {
        // The host snapshots its store: nothing keyed to hand out.
        rt.snapshot.as_mut().expect("just set").next_slot = groups;
    }
    let (mut bytes, mut walked) = (0, 0);
    rt.blob_hint.0.resize(groups, 0);
    rt.blob_hint.1.resize(groups, 0);
    loop {
        let slot = match rt.snapshot.as_mut() {
            Some(p) if p.next_slot < groups && bytes < SNAPSHOT_CHUNK_BYTES && walked < SNAPSHOT_CHUNK_ENTRIES => {
                p.next_slot += 1;
                p.next_slot - 1
            }
            _ => break,
        };
        // Every group that had state at the barrier is listed (absent = no state): a full
        // blob, or a delta of the changes since the previous snapshot (4 bytes when clean).
        let had = rt.keyed.iter().any(|s| s.table.borrow().had_state(slot));
        walked += rt.keyed.iter().map(|s| s.table.borrow().len(slot)).sum::<usize>();
        // Sized like this group's previous blob of the same kind: no doubling copies.
        let hint = if full { &rt.blob_hint.0 } else { &rt.blob_hint.1 };
        let mut data = Vec::with_capacity(if had { hint[slot] } else { 0 });
        encode_group(&rt.keyed, slot, &mut data, !full)?;
        let hint = if full { &mut rt.blob_hint.0 } else { &mut rt.blob_hint.1 };
        hint[slot] = data.len() + data.len() / 8;
        if had {
            data.shrink_to_fit();
            bytes += data.len();
            keyed.push(types::KeyGroupState { key_group: rt.task.key_group_start + slot as u32, data });
        }
    }
    if rt.snapshot.as_ref().is_some_and(|p| p.next_slot < groups) {
        keyed.push(types::KeyGroupState { key_group: MORE, data: Vec::new() });
    } else {
        for s in &rt.keyed {
            s.table.borrow_mut().thaw();
        }
        rt.snapshot = None;
    }
    // Non-keyed state is small and taken whole at the barrier (the first call).
    let mut operator_state = Vec::new();
    if !continuing && !rt.operator_states.is_empty() {
        operator_state.extend_from_slice(&(rt.operator_states.len() as u32).to_le_bytes());
        for s in &rt.operator_states {
            operator_state.extend_from_slice(&(s.name.len() as u32).to_le_bytes());
            operator_state.extend_from_slice(s.name.as_bytes());
            let entries = s.cell.borrow().encode()?;
            operator_state.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            for v in entries {
                operator_state.extend_from_slice(&0u32.to_le_bytes());
                operator_state.extend_from_slice(&(v.len() as u32).to_le_bytes());
                operator_state.extend_from_slice(&v);
            }
        }
    }
    Ok(types::OperatorSnapshot { keyed, operator_state })
}

/// `query-state` export: `key`'s current value in keyed state `state`, as JSON text. Runs
/// between batches (the host calls it on the subtask that owns `key_group`).
pub fn query_state<Op: Operator>(
    slot: &Slot<Op>,
    state: &str,
    key_group: u32,
    key: &[u8],
) -> Result<Option<String>, String> {
    let inst = slot.instance()?;
    let rt = &inst.rt;
    let Some(s) = rt.keyed.iter().find(|s| s.name == state) else {
        let keyed: Vec<&str> = rt.keyed.iter().map(|s| s.name).collect();
        return Err(format!(
            "`{}` has no keyed state `{state}` (its keyed states: [{}])",
            rt.info.name,
            keyed.join(", ")
        ));
    };
    let (start, end) = (rt.task.key_group_start, rt.task.key_group_end);
    if !(start..end).contains(&key_group) {
        return Err(format!("key group {key_group} is not owned by this subtask (it owns [{start}, {end}))"));
    }
    s.table.borrow().query_json((key_group - start) as usize, key).map_err(|e| e.to_string())
}

/// `restore` export.
pub fn restore<Op: Operator>(
    slot: &Slot<Op>,
    schema_version: u32,
    state: types::OperatorSnapshot,
) -> Result<(), String> {
    let inst = slot.instance()?;
    restore_state::<Op>(&mut inst.rt, schema_version, &state).map_err(|e| e.to_string())
}

fn restore_state<Op: Operator>(rt: &mut Runtime, from: u32, state: &types::OperatorSnapshot) -> Result<()> {
    let info = Op::INFO;
    let migrate = if from == info.schema_version {
        false
    } else if info.migrates_from.contains(&from) {
        true
    } else {
        return Err(Error::msg(format!(
            "`{}` {} writes state schema {} and migrates from {:?}; it cannot restore state of schema {from}",
            info.name, info.version, info.schema_version, info.migrates_from
        )));
    };
    let convert = |name: &str, bytes: &[u8]| -> Result<Option<Vec<u8>>> {
        if migrate { Op::migrate_value(name, from, bytes).map(Some) } else { Ok(None) }
    };
    for kg in &state.keyed {
        let slot = rt.slot_of(kg.key_group).ok_or_else(|| {
            Error::msg(format!(
                "restore handed key group {} to a subtask owning [{}, {})",
                kg.key_group, rt.task.key_group_start, rt.task.key_group_end
            ))
        })?;
        if kg.data.is_empty() {
            continue;
        }
        let mut c = Cursor::new(&kg.data);
        for _ in 0..c.u32()? {
            let name = std::str::from_utf8(c.chunk()?).map_err(|_| Error::msg("corrupt state blob: state name"))?;
            let reg = rt.keyed.iter().find(|r| r.name == name).ok_or_else(|| {
                Error::msg(format!(
                    "the snapshot holds keyed state `{name}`, which `{}` {} does not register",
                    info.name, info.version
                ))
            })?;
            let mut table = reg.table.borrow_mut();
            for _ in 0..c.u32()? {
                let key = c.chunk()?;
                let value = c.chunk()?;
                match convert(name, value)? {
                    Some(v) => table.insert_encoded(slot, key, &v, rt.paged),
                    None => table.insert_encoded(slot, key, value, rt.paged),
                }
                .map_err(|e| e.context(format!("state `{name}`")))?;
            }
        }
    }
    if !state.operator_state.is_empty() {
        let mut c = Cursor::new(&state.operator_state);
        for _ in 0..c.u32()? {
            let name = std::str::from_utf8(c.chunk()?).map_err(|_| Error::msg("corrupt state blob: state name"))?;
            let reg = rt.operator_states.iter().find(|r| r.name == name).ok_or_else(|| {
                Error::msg(format!(
                    "the snapshot holds operator state `{name}`, which `{}` does not register",
                    info.name
                ))
            })?;
            for _ in 0..c.u32()? {
                let _key = c.chunk()?;
                let value = c.chunk()?;
                let value = convert(name, value)?.unwrap_or_else(|| value.to_vec());
                reg.cell.borrow_mut().decode_entry(&value)?;
            }
        }
        if !c.is_empty() {
            return Err(Error::msg("corrupt operator state: trailing bytes"));
        }
    }
    Ok(())
}

/// `page-in` export (the disk backend): the listed keys' entries, unchanged.
pub fn page_in<Op: Operator>(slot: &Slot<Op>, state: Vec<types::KeyGroupState>) -> Result<(), String> {
    let inst = slot.instance()?;
    page_in_state(&mut inst.rt, &state).map_err(|e| e.to_string())
}

fn page_in_state(rt: &mut Runtime, state: &[types::KeyGroupState]) -> Result<()> {
    if !rt.paged {
        rt.paged = true;
        for s in &rt.keyed {
            s.table.borrow_mut().track();
        }
    }
    for kg in state {
        let slot = rt.slot_of(kg.key_group).ok_or_else(|| {
            Error::msg(format!(
                "page-in handed key group {} to a subtask owning [{}, {})",
                kg.key_group, rt.task.key_group_start, rt.task.key_group_end
            ))
        })?;
        let mut c = Cursor::new(&kg.data);
        for _ in 0..c.u32()? {
            let name = std::str::from_utf8(c.chunk()?).map_err(|_| Error::msg("corrupt page: state name"))?;
            let reg =
                rt.keyed.iter().find(|r| r.name == name).ok_or_else(|| {
                    Error::msg(format!("page-in names keyed state `{name}`, which is not registered"))
                })?;
            let mut table = reg.table.borrow_mut();
            for _ in 0..c.u32()? {
                let key = c.chunk()?;
                let value = c.chunk()?;
                table.insert_encoded(slot, key, value, false).map_err(|e| e.context(format!("state `{name}`")))?;
            }
        }
    }
    Ok(())
}

/// `page-out` export (the disk backend): every change since the previous one as delta
/// blobs, in chunks; once the last is handed out, the evicted keys are forgotten.
pub fn page_out<Op: Operator>(
    slot: &Slot<Op>,
    evict: &[u8],
    evict_all: bool,
) -> Result<Vec<types::KeyGroupState>, String> {
    let inst = slot.instance()?;
    page_out_state(&mut inst.rt, evict, evict_all).map_err(|e| e.to_string())
}

/// A page-out being handed out in chunks: the keys to forget once it is done.
pub(crate) struct PageOut {
    next_slot: usize,
    evict: Vec<u8>,
    all: bool,
}

fn page_out_state(rt: &mut Runtime, evict: &[u8], evict_all: bool) -> Result<Vec<types::KeyGroupState>> {
    // A page-out is an incremental snapshot, handed out in chunks (the host calls again
    // while the reply ends with "more follows", processing nothing in between): freeze (the
    // epoch advances, so what changes next is the next page's), changed groups' deltas, thaw.
    if rt.paging_out.is_none() {
        rt.snapshot = None;
        for s in &rt.keyed {
            s.table.borrow_mut().freeze(false);
        }
        rt.paging_out = Some(PageOut { next_slot: 0, evict: evict.to_vec(), all: evict_all });
    }
    let groups = rt.group_count();
    let mut out = Vec::new();
    let (mut bytes, mut walked) = (0, 0);
    loop {
        let slot = match rt.paging_out.as_mut() {
            Some(p) if p.next_slot < groups && bytes < SNAPSHOT_CHUNK_BYTES && walked < SNAPSHOT_CHUNK_ENTRIES => {
                p.next_slot += 1;
                p.next_slot - 1
            }
            _ => break,
        };
        walked += rt.keyed.iter().map(|s| s.table.borrow().len(slot)).sum::<usize>();
        let mut data = Vec::new();
        encode_group(&rt.keyed, slot, &mut data, true)?;
        if data.len() > 4 {
            bytes += data.len();
            out.push(types::KeyGroupState { key_group: rt.task.key_group_start + slot as u32, data });
        }
    }
    if rt.paging_out.as_ref().is_some_and(|p| p.next_slot < groups) {
        out.push(types::KeyGroupState { key_group: MORE, data: Vec::new() });
        return Ok(out);
    }
    let done = rt.paging_out.take().expect("a page-out in progress");
    for s in &rt.keyed {
        s.table.borrow_mut().thaw();
    }
    if done.all {
        for s in &rt.keyed {
            s.table.borrow_mut().forget_all();
        }
    } else {
        let mut reader = RecordReader::new(&done.evict);
        while let Some(rec) = reader.next_record()? {
            if let Some(slot) = rt.slot_of(rec.key_group) {
                for s in &rt.keyed {
                    s.table.borrow_mut().forget(slot, rec.key);
                }
            }
        }
    }
    Ok(out)
}
