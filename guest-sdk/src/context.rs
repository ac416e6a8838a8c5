//! What an operator sees while it runs: the current record's key, emit, timers, logging
//! ([`Context`]), and what it sees once at start: configuration and state registration
//! ([`OpenContext`]).
//!
//! Invariant: emitted records are buffered in guest memory and handed to the host with one
//! `collector.emit-batch` call at the end of each export call (or when the buffer passes
//! [`FLUSH_BYTES`]), never one host call per record.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::{collector, context, logging, timers, types};
use crate::info::{OperatorInfo, StateKind};
use crate::record::{NO_KEY_GROUP, write_record};
use crate::state::{
    ListState, MapState, OperatorList, OperatorValue, Registered, RegisteredOperatorState, ValueState, new_table,
};
use crate::{Error, Result};

/// Emits are handed to the host when the buffer grows past this many bytes.
pub const FLUSH_BYTES: usize = 1 << 20;

/// Per-instance runtime of the SDK: task identity, emit buffer, registered state.
pub(crate) struct Runtime {
    pub info: OperatorInfo,
    pub task: types::TaskInfo,
    pub emit: Vec<u8>,
    pub keyed: Vec<Registered>,
    pub operator_states: Vec<RegisteredOperatorState>,
    /// Per key group, the size to reserve for its next (full, delta) snapshot blob.
    pub blob_hint: (Vec<usize>, Vec<usize>),
    /// A snapshot being handed out in chunks.
    pub snapshot: Option<crate::driver::InProgress>,
    /// The watermark of the last `on-watermark` call (what windows decide lateness by; the
    /// host fires due timers before that call, so it never runs ahead of them). It starts
    /// from the host's at `open`: a live upgrade's new instance opens mid-stream.
    pub watermark: i64,
    /// The host's clock as read once in the current export call (`None` until asked).
    pub clock: Option<i64>,
    /// The disk backend pages keyed state (`page-in` was called): `snapshot` hands out no
    /// keyed state, restored entries count as changed.
    pub paged: bool,
    /// A page-out being handed out in chunks.
    pub paging_out: Option<crate::driver::PageOut>,
}

impl Runtime {
    pub fn new(info: OperatorInfo, task: types::TaskInfo) -> Self {
        Runtime {
            info,
            task,
            emit: Vec::with_capacity(64 * 1024),
            keyed: Vec::new(),
            operator_states: Vec::new(),
            blob_hint: (Vec::new(), Vec::new()),
            snapshot: None,
            watermark: i64::MIN,
            clock: None,
            paged: false,
            paging_out: None,
        }
    }

    pub fn group_count(&self) -> usize {
        (self.task.key_group_end - self.task.key_group_start) as usize
    }

    /// Slot of `key_group` in this subtask's tables, if owned.
    #[inline]
    pub fn slot_of(&self, key_group: u32) -> Option<usize> {
        let slot = key_group.wrapping_sub(self.task.key_group_start);
        (key_group != NO_KEY_GROUP && key_group < self.task.key_group_end).then_some(slot as usize)
    }

    pub fn flush(&mut self) {
        if !self.emit.is_empty() {
            collector::emit_batch(&self.emit);
            self.emit.clear();
        }
    }
}

/// The context of one record (or timer): its key, emit, timers, logging.
pub struct Context<'a> {
    pub(crate) rt: &'a mut Runtime,
    pub(crate) slot: Option<usize>,
    pub(crate) key_group: u32,
    pub(crate) key: &'a [u8],
    pub(crate) timestamp: i64,
}

impl<'a> Context<'a> {
    /// The slot of the current key group; keyed state needs one.
    #[inline]
    pub(crate) fn slot(&self) -> usize {
        match self.slot {
            Some(s) => s,
            None => keyed_access_without_key(self.rt, self.key_group),
        }
    }

    /// The current key.
    #[inline]
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The current record's (or timer's) timestamp.
    #[inline]
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// The current key group.
    #[inline]
    pub fn key_group(&self) -> u32 {
        self.key_group
    }

    /// Emits `(key, value)` on the main output with the current timestamp.
    #[inline]
    pub fn emit(&mut self, key: &[u8], value: &[u8]) {
        self.emit_at(key, value, self.timestamp)
    }

    /// Emits `(key, value)` on the main output with timestamp `ts`.
    #[inline]
    pub fn emit_at(&mut self, key: &[u8], value: &[u8], ts: i64) {
        write_record(&mut self.rt.emit, 0, ts, key, value);
        if self.rt.emit.len() >= FLUSH_BYTES {
            self.rt.flush();
        }
    }

    /// Emits `(key, value)` on the main output, writing the value in place: `value` appends
    /// the value's bytes to the buffer it is given. No allocation per record:
    ///
    /// ```text
    /// ctx.emit_with(rec.key, |v| { push_bytes(v, rec.key); v.push(b' '); push_u64(v, n) });
    /// ```
    #[inline]
    pub fn emit_with(&mut self, key: &[u8], value: impl FnOnce(&mut Vec<u8>)) {
        let out = &mut self.rt.emit;
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.timestamp.to_le_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        let vlen_at = out.len();
        out.extend_from_slice(&0u32.to_le_bytes());
        push_bytes(out, key);
        let start = out.len();
        value(out);
        let vlen = (out.len() - start) as u32;
        out[vlen_at..vlen_at + 4].copy_from_slice(&vlen.to_le_bytes());
        if out.len() >= FLUSH_BYTES {
            self.rt.flush();
        }
    }

    /// Emits on the side output called `name` (declared in `OperatorInfo::side_outputs`).
    pub fn emit_side(&mut self, name: &str, key: &[u8], value: &[u8]) -> Result<()> {
        let port = self
            .rt
            .info
            .side_outputs
            .iter()
            .position(|s| *s == name)
            .ok_or_else(|| Error::msg(format!("side output `{name}` is not declared")))?;
        write_record(&mut self.rt.emit, port as u32 + 1, self.timestamp, key, value);
        if self.rt.emit.len() >= FLUSH_BYTES {
            self.rt.flush();
        }
        Ok(())
    }

    /// Registers an event-time timer for the current key at `time`.
    pub fn register_event_timer(&mut self, time: i64) {
        timers::register(types::TimeDomain::EventTime, self.slot_key_group(), self.key, time);
    }

    /// Registers a processing-time timer for the current key at `time` (ms since epoch).
    pub fn register_processing_timer(&mut self, time: i64) {
        timers::register(types::TimeDomain::ProcessingTime, self.slot_key_group(), self.key, time);
    }

    /// Deletes an event-time timer of the current key.
    pub fn delete_event_timer(&mut self, time: i64) {
        timers::delete(types::TimeDomain::EventTime, self.slot_key_group(), self.key, time);
    }

    /// Deletes a processing-time timer of the current key.
    pub fn delete_processing_timer(&mut self, time: i64) {
        timers::delete(types::TimeDomain::ProcessingTime, self.slot_key_group(), self.key, time);
    }

    /// The host's clock (ms since the Unix epoch), what processing-time timers fire by. Read
    /// from the host once per batch (every record of a batch sees the same time), so it costs
    /// no host call per record.
    #[inline]
    pub fn processing_time(&mut self) -> i64 {
        *self.rt.clock.get_or_insert_with(context::current_processing_time)
    }

    fn slot_key_group(&self) -> u32 {
        self.slot();
        self.key_group
    }

    /// The subtask's current watermark.
    pub fn current_watermark(&self) -> i64 {
        crate::bindings::context::current_watermark()
    }

    /// Which subtask this is.
    pub fn subtask_index(&self) -> u32 {
        self.rt.task.subtask_index
    }

    /// Logs a line through the host (tagged with job, operator and subtask).
    pub fn log(&self, message: &str) {
        logging::log(logging::Level::Info, message);
    }
}

#[cold]
#[inline(never)]
fn keyed_access_without_key(rt: &Runtime, key_group: u32) -> ! {
    if key_group == NO_KEY_GROUP {
        panic!(
            "operator `{}` used keyed state on a record that was not partitioned by key; \
             give its input `partition = \"hash\"` in the job file",
            rt.info.name
        )
    }
    panic!(
        "operator `{}` got key group {key_group}, outside this subtask's range [{}, {})",
        rt.info.name, rt.task.key_group_start, rt.task.key_group_end
    )
}

/// What `Operator::open` gets: configuration and state registration.
pub struct OpenContext<'a> {
    pub(crate) rt: &'a mut Runtime,
    pub(crate) config: &'a BTreeMap<String, String>,
}

impl<'a> OpenContext<'a> {
    /// The operator's `config` table from the job file.
    pub fn config(&self) -> &BTreeMap<String, String> {
        self.config
    }

    /// A config value parsed as `T`, or `default` when absent.
    pub fn config_or<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.config.get(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e| Error::msg(format!("config `{key}` = `{v}` is invalid: {e}"))),
        }
    }

    /// The subtask this instance runs as.
    pub fn task(&self) -> &types::TaskInfo {
        &self.rt.task
    }

    fn declared(&self, name: &'static str, kind: StateKind, keyed: bool) -> Result<()> {
        let d = self.rt.info.state(name).ok_or_else(|| {
            Error::msg(format!("state `{name}` is not declared in `{}`'s OperatorInfo::states", self.rt.info.name))
        })?;
        if d.kind != kind || d.keyed != keyed {
            return Err(Error::msg(format!(
                "state `{name}` is declared as {:?} (keyed: {}), but used as {kind:?} (keyed: {keyed})",
                d.kind, d.keyed
            )));
        }
        if self.rt.keyed.iter().any(|r| r.name == name) || self.rt.operator_states.iter().any(|r| r.name == name) {
            return Err(Error::msg(format!("state `{name}` is registered twice")));
        }
        Ok(())
    }

    /// The keyed value state `name` (declared with `StateDescriptor::keyed_value`).
    pub fn value_state<T: Serialize + DeserializeOwned + 'static>(
        &mut self,
        name: &'static str,
    ) -> Result<ValueState<T>> {
        self.declared(name, StateKind::Value, true)?;
        let (table, erased) = new_table::<T>(self.rt.group_count());
        self.rt.keyed.push(Registered { name, table: erased });
        Ok(ValueState { table })
    }

    /// The keyed list state `name`.
    pub fn list_state<T: Serialize + DeserializeOwned + 'static>(
        &mut self,
        name: &'static str,
    ) -> Result<ListState<T>> {
        self.declared(name, StateKind::List, true)?;
        let (table, erased) = new_table::<Vec<T>>(self.rt.group_count());
        self.rt.keyed.push(Registered { name, table: erased });
        Ok(ListState { table })
    }

    /// The keyed map state `name`.
    pub fn map_state<K, V>(&mut self, name: &'static str) -> Result<MapState<K, V>>
    where
        K: Ord + Serialize + DeserializeOwned + 'static,
        V: Serialize + DeserializeOwned + 'static,
    {
        self.declared(name, StateKind::Map, true)?;
        let (table, erased) = new_table::<BTreeMap<K, V>>(self.rt.group_count());
        self.rt.keyed.push(Registered { name, table: erased });
        Ok(MapState { table })
    }

    /// The per-subtask value `name` (declared with `StateDescriptor::operator_value`).
    pub fn operator_value<T: Serialize + DeserializeOwned + 'static>(
        &mut self,
        name: &'static str,
    ) -> Result<OperatorValue<T>> {
        self.declared(name, StateKind::Value, false)?;
        let cell = Rc::new(RefCell::new(None::<T>));
        self.rt.operator_states.push(RegisteredOperatorState { name, cell: cell.clone() });
        Ok(OperatorValue { cell })
    }

    /// The per-subtask list `name` (declared with `StateDescriptor::operator_list`).
    pub fn operator_list<T: Serialize + DeserializeOwned + 'static>(
        &mut self,
        name: &'static str,
    ) -> Result<OperatorList<T>> {
        self.declared(name, StateKind::List, false)?;
        let cell = Rc::new(RefCell::new(Vec::<T>::new()));
        self.rt.operator_states.push(RegisteredOperatorState { name, cell: cell.clone() });
        Ok(OperatorList { cell })
    }
}

/// "00".."99", for two digits per division.
const DIGIT_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Appends `v` in decimal to `out`, with a `-` when negative: [`push_u64`] of its magnitude.
#[inline]
pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// Appends `v` in decimal to `out` (no allocation, no formatting machinery). Two digits per
/// division, and 32-bit divisions below 2^32: WebAssembly has no 64-bit multiply-high, so a
/// 64-bit division by a constant stays a division, where a 32-bit one becomes a multiply.
#[inline]
pub fn push_u64(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut pair = |i: &mut usize, p: usize| {
        *i -= 2;
        buf[*i..*i + 2].copy_from_slice(&DIGIT_PAIRS[p * 2..p * 2 + 2]);
    };
    let mut v32 = if v > u32::MAX as u64 {
        let mut w = v;
        while w > u32::MAX as u64 {
            pair(&mut i, (w % 100) as usize);
            w /= 100;
        }
        w as u32
    } else {
        v as u32
    };
    while v32 >= 100 {
        pair(&mut i, (v32 % 100) as usize);
        v32 /= 100;
    }
    if v32 >= 10 {
        pair(&mut i, v32 as usize);
    } else {
        i -= 1;
        buf[i] = b'0' + v32 as u8;
    }
    push_bytes(out, &buf[i..]);
}

/// Appends `src` to `out`; for short slices (keys, numbers) without a `memory.copy`.
///
/// A variable-length `extend_from_slice` compiles to WebAssembly's `memory.copy`, which the
/// runtime executes as a call out of the guest: tens of nanoseconds for a 5-byte key. Up to
/// 16 bytes are copied here with at most two (overlapping) word moves and no loop (a loop
/// would be turned back into `memory.copy`).
#[inline(always)]
pub fn push_bytes(out: &mut Vec<u8>, src: &[u8]) {
    let n = src.len();
    if n > 16 {
        out.extend_from_slice(src);
        return;
    }
    out.reserve(n);
    let len = out.len();
    // SAFETY: `reserve` made room for `n` more bytes after `len`; every read stays inside
    // `src` (offsets `0..n`, the overlapping moves start at `n - 8` / `n - 4` / `n - 2` only
    // when `n` is at least that word size) and every write inside `out`'s spare capacity;
    // `set_len` then covers exactly the bytes written.
    unsafe {
        let s = src.as_ptr();
        let d = out.as_mut_ptr().add(len);
        if n >= 8 {
            d.cast::<u64>().write_unaligned(s.cast::<u64>().read_unaligned());
            d.add(n - 8).cast::<u64>().write_unaligned(s.add(n - 8).cast::<u64>().read_unaligned());
        } else if n >= 4 {
            d.cast::<u32>().write_unaligned(s.cast::<u32>().read_unaligned());
            d.add(n - 4).cast::<u32>().write_unaligned(s.add(n - 4).cast::<u32>().read_unaligned());
        } else if n >= 2 {
            d.cast::<u16>().write_unaligned(s.cast::<u16>().read_unaligned());
            d.add(n - 2).cast::<u16>().write_unaligned(s.add(n - 2).cast::<u16>().read_unaligned());
        } else if n == 1 {
            *d = *s;
        }
        out.set_len(len + n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_u64_writes_what_std_writes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut values = vec![0, 9, 10, 99, 100, 101, 999, 1000, u32::MAX as u64, u32::MAX as u64 + 1, u64::MAX];
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.extend([x, x >> 17, x >> 40, x % 100_000]);
        }
        for v in values {
            let mut out = vec![b'x'];
            push_u64(&mut out, v);
            assert_eq!(&out[1..], format!("{v}").as_bytes(), "{v}");
        }
    }

    #[test]
    fn push_i64_writes_what_std_writes() {
        for v in [0, 1, -1, 9, -10, 1_700_000_000_000, -1_700_000_000_123, i64::MAX, i64::MIN, i64::MIN + 1] {
            let mut out = Vec::new();
            push_i64(&mut out, v);
            assert_eq!(out, format!("{v}").as_bytes(), "{v}");
        }
    }

    #[test]
    fn push_bytes_appends_every_length_exactly() {
        let src: Vec<u8> = (1..=40).collect();
        for n in 0..=40 {
            let mut out = vec![0xAA; 3];
            push_bytes(&mut out, &src[..n]);
            assert_eq!(&out[..3], &[0xAA; 3]);
            assert_eq!(&out[3..], &src[..n], "length {n}");
        }
    }
}
