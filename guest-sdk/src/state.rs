//! Typed state handles, kept in guest memory and partitioned by key group.
//!
//! Invariants:
//! - keyed state lives in one table per owned key group (`[start, end)` of the subtask), so
//!   the host can snapshot, redistribute and restore it per key group;
//! - every write stamps its entry with the current epoch and marks its key group dirty (a
//!   compare and two stores, no extra lookup); from the first snapshot on (so only with
//!   checkpointing), removals are remembered until the next snapshot as well. An incremental
//!   snapshot lists every key group that had state at the barrier: a delta blob of the
//!   entries changed and removed since the previous snapshot (empty for a clean group);
//! - a snapshot is copy-on-write: at the barrier the state is frozen in O(groups) (the epoch
//!   advances), and key groups are handed out in chunks between batches; the first write to
//!   an entry of a group not yet handed out keeps its barrier-time value (encoded), so every
//!   chunk shows the state exactly as it was at the barrier;
//! - values are encoded with bincode 1.x defaults only at snapshot time (and for the
//!   barrier-time copies above), never otherwise per record.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::context::Context;
use crate::hash::FxBuildHasher;
use crate::key::{Key, KeyRef};
use crate::{Error, Result};

type Table<V> = HashMap<Key, Entry<V>, FxBuildHasher>;
type Shared<T> = Rc<RefCell<T>>;

/// A value and the write epoch that last wrote it.
pub(crate) struct Entry<V> {
    value: V,
    stamp: u32,
}

/// Delta blobs (`wit/operator.wit`): bit 31 of the state count; a removed key's value length.
pub(crate) const DELTA_FLAG: u32 = 0x8000_0000;
const TOMBSTONE: u32 = u32::MAX;

/// A key and its barrier-time value, encoded.
type Preserved = (Box<[u8]>, Vec<u8>);

/// Keys removed from one key group since the previous snapshot, packed (`u32 length, key`
/// each) in one buffer: the removed key's own allocation is freed at once, where keeping it
/// until the snapshot meant freeing every key of a second's removals in the snapshot call
/// (the stream's pause), scattered, at a cost of most of that pause.
#[derive(Default)]
struct Removed(Vec<u8>);

impl Removed {
    fn push(&mut self, key: &[u8]) {
        self.0.extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.0.extend_from_slice(key);
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = &self.0[..];
        std::iter::from_fn(move || {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let (key, tail) = tail.split_at(u32::from_le_bytes(*len) as usize);
            rest = tail;
            Some(key)
        })
    }
}

/// A snapshot taken at a barrier and handed out in chunks (copy-on-write): what the state
/// was at the barrier, while records keep changing it.
struct Frozen {
    /// Entries stamped `<= epoch` existed at the barrier; `== epoch`: changed since the
    /// previous snapshot.
    epoch: u32,
    full: bool,
    /// Groups already handed out.
    emitted: Vec<bool>,
    /// Per group: barrier-time values (encoded) of entries changed after the barrier before
    /// their group was handed out.
    pre: Vec<Vec<Preserved>>,
    /// Per group: keys removed between the previous snapshot and the barrier.
    removed: Vec<Removed>,
    /// Per group: changed between the previous snapshot and the barrier.
    dirty: Vec<bool>,
}

/// The per-key-group tables of one keyed state.
pub(crate) struct KeyedTable<V> {
    groups: Vec<Table<V>>,
    dirty: Vec<bool>,
    /// Keys removed since the previous snapshot, per group (only while `tracking`).
    removed: Vec<Removed>,
    /// Checkpointing is on: remember removals.
    tracking: bool,
    /// Current write epoch: advanced by every snapshot.
    epoch: u32,
    frozen: Option<Frozen>,
    encode: fn(&V, &mut Vec<u8>) -> Result<()>,
}

impl<V> KeyedTable<V> {
    fn new(group_count: usize, encode: fn(&V, &mut Vec<u8>) -> Result<()>) -> Self {
        KeyedTable {
            groups: (0..group_count).map(|_| Table::default()).collect(),
            dirty: vec![false; group_count],
            removed: (0..group_count).map(|_| Removed::default()).collect(),
            tracking: false,
            epoch: 1,
            frozen: None,
            encode,
        }
    }

    #[inline]
    pub(crate) fn get(&self, slot: usize, key: &[u8]) -> Option<&V> {
        self.groups[slot].get(KeyRef::new(key)).map(|e| &e.value)
    }

    /// Before a write to an entry stamped `stamp` in group `slot`: keep its barrier-time
    /// value if a snapshot in progress still needs it.
    #[inline]
    fn preserve(
        frozen: &mut Option<Frozen>,
        encode: fn(&V, &mut Vec<u8>) -> Result<()>,
        slot: usize,
        key: &[u8],
        e: &Entry<V>,
    ) {
        if let Some(f) = frozen.as_mut()
            && !f.emitted[slot]
            && e.stamp <= f.epoch
            && (f.full || e.stamp == f.epoch)
        {
            let mut bytes = Vec::new();
            // Encoding an in-memory value cannot fail for the types state allows; should it,
            // the entry is written as empty and the restore reports it.
            let _ = encode(&e.value, &mut bytes);
            f.pre[slot].push((key.into(), bytes));
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, slot: usize, key: &[u8]) -> Option<&mut V> {
        let e = self.groups[slot].get_mut(KeyRef::new(key))?;
        if e.stamp != self.epoch {
            Self::preserve(&mut self.frozen, self.encode, slot, key, e);
            e.stamp = self.epoch;
        }
        self.dirty[slot] = true;
        Some(&mut e.value)
    }

    #[inline]
    pub(crate) fn insert(&mut self, slot: usize, key: &[u8], value: V) {
        self.dirty[slot] = true;
        let epoch = self.epoch;
        if let Some(old) = self.groups[slot].insert(key.into(), Entry { value, stamp: epoch })
            && old.stamp != epoch
        {
            Self::preserve(&mut self.frozen, self.encode, slot, key, &old);
        }
    }

    #[inline]
    pub(crate) fn remove(&mut self, slot: usize, key: &[u8]) -> Option<V> {
        let e = self.groups[slot].remove(KeyRef::new(key))?;
        if e.stamp != self.epoch {
            Self::preserve(&mut self.frozen, self.encode, slot, key, &e);
        }
        self.dirty[slot] = true;
        if self.tracking {
            self.removed[slot].push(key);
        }
        Some(e.value)
    }
}

/// Type-erased access the SDK needs for snapshot and restore.
pub(crate) trait ErasedTable {
    /// Entries in group `slot` (what handing it out walks).
    fn len(&self, slot: usize) -> usize;
    /// Freezes the state for a snapshot (full, or a delta since the previous one); groups
    /// are then handed out by [`ErasedTable::write_group`], while writes go on.
    fn freeze(&mut self, full: bool);
    /// Whether group `slot` had state at the barrier of the frozen snapshot.
    fn had_state(&self, slot: usize) -> bool;
    /// Appends group `slot`'s entries of the frozen snapshot (`u32 klen, key, u32 vlen,
    /// value` each; removed keys with value length `0xFFFF_FFFF` in a delta). Returns the
    /// number of entries written.
    fn write_group(&mut self, slot: usize, out: &mut Vec<u8>) -> Result<u32>;
    /// Every group was handed out: the snapshot is over.
    fn thaw(&mut self);
    /// Inserts one entry decoded from `value` into group `slot`: unchanged, or (`changed`)
    /// as if written now (the next delta lists it).
    fn insert_encoded(&mut self, slot: usize, key: &[u8], value: &[u8], changed: bool) -> Result<()>;
    /// Remembers removals from now on (the disk backend's pages: every change goes back).
    fn track(&mut self);
    /// Drops `key` from group `slot` without it counting as a removal (the host has it).
    fn forget(&mut self, slot: usize, key: &[u8]);
    /// Drops every entry without it counting as removals.
    fn forget_all(&mut self);
    /// `key`'s current value in group `slot` as JSON text, if it has one (a live query).
    fn query_json(&self, slot: usize, key: &[u8]) -> Result<Option<String>>;
}

impl<V: Serialize + DeserializeOwned> ErasedTable for KeyedTable<V> {
    fn len(&self, slot: usize) -> usize {
        self.groups[slot].len()
    }

    fn freeze(&mut self, full: bool) {
        // From the first snapshot on (checkpointing is on), removals are remembered until the
        // next one, which may be incremental. Without checkpoints nothing accumulates.
        self.tracking = true;
        let n = self.groups.len();
        self.frozen = Some(Frozen {
            epoch: self.epoch,
            full,
            emitted: vec![false; n],
            pre: (0..n).map(|_| Vec::new()).collect(),
            removed: std::mem::replace(&mut self.removed, (0..n).map(|_| Removed::default()).collect()),
            dirty: std::mem::replace(&mut self.dirty, vec![false; n]),
        });
        self.epoch += 1;
    }

    fn had_state(&self, slot: usize) -> bool {
        let Some(f) = self.frozen.as_ref() else { return !self.groups[slot].is_empty() };
        !f.pre[slot].is_empty() || self.groups[slot].values().any(|e| e.stamp <= f.epoch)
    }

    fn write_group(&mut self, slot: usize, out: &mut Vec<u8>) -> Result<u32> {
        let Some(f) = self.frozen.as_mut() else { return Ok(0) };
        f.emitted[slot] = true;
        let pre = std::mem::take(&mut f.pre[slot]);
        let removed = std::mem::take(&mut f.removed[slot]);
        let (epoch, full) = (f.epoch, f.full);
        if !full && !f.dirty[slot] {
            return Ok(0);
        }
        let mut n = 0;
        let mut put = |out: &mut Vec<u8>, k: &[u8]| {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            n += 1;
        };
        for (k, e) in &self.groups[slot] {
            let wanted = if full { e.stamp <= epoch } else { e.stamp == epoch };
            if !wanted {
                continue;
            }
            put(out, k);
            let len_at = out.len();
            out.extend_from_slice(&0u32.to_le_bytes());
            (self.encode)(&e.value, out)?;
            let vlen = (out.len() - len_at - 4) as u32;
            out[len_at..len_at + 4].copy_from_slice(&vlen.to_le_bytes());
        }
        for (k, v) in &pre {
            put(out, k);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
        if !full {
            for k in removed.iter() {
                // Still gone at the barrier: not back (before it) and not preserved (it
                // existed at the barrier).
                let back = self.groups[slot].get(KeyRef::new(k)).is_some_and(|e| e.stamp == epoch);
                if !back && !pre.iter().any(|(p, _)| **p == *k) {
                    put(out, k);
                    out.extend_from_slice(&TOMBSTONE.to_le_bytes());
                }
            }
        }
        Ok(n)
    }

    fn thaw(&mut self) {
        self.frozen = None;
    }

    fn insert_encoded(&mut self, slot: usize, key: &[u8], value: &[u8], changed: bool) -> Result<()> {
        let v: V = bincode::deserialize(value)?;
        let stamp = if changed { self.epoch } else { 0 };
        self.groups[slot].insert(key.into(), Entry { value: v, stamp });
        self.dirty[slot] |= changed;
        Ok(())
    }

    fn track(&mut self) {
        self.tracking = true;
    }

    fn forget(&mut self, slot: usize, key: &[u8]) {
        self.groups[slot].remove(KeyRef::new(key));
    }

    fn forget_all(&mut self) {
        for g in &mut self.groups {
            *g = Table::default();
        }
    }

    fn query_json(&self, slot: usize, key: &[u8]) -> Result<Option<String>> {
        let Some(e) = self.groups[slot].get(KeyRef::new(key)) else { return Ok(None) };
        serde_json::to_string(&e.value).map(Some).map_err(|e| {
            Error::msg(format!("the value cannot be shown as JSON: {e} (a map whose keys are not strings?)"))
        })
    }
}

/// A declared keyed state registered with the runtime.
pub(crate) struct Registered {
    pub name: &'static str,
    pub table: Rc<RefCell<dyn ErasedTable>>,
}

/// A declared non-keyed state registered with the runtime.
pub(crate) struct RegisteredOperatorState {
    pub name: &'static str,
    pub cell: Rc<RefCell<dyn ErasedCell>>,
}

/// Type-erased access to a per-subtask state: its entries in the non-keyed state layout
/// (one per value or list element).
pub(crate) trait ErasedCell {
    fn encode(&self) -> Result<Vec<Vec<u8>>>;
    /// Restores one entry (called once per entry, in order, into an empty state).
    fn decode_entry(&mut self, bytes: &[u8]) -> Result<()>;
}

impl<T: Serialize + DeserializeOwned> ErasedCell for Option<T> {
    fn encode(&self) -> Result<Vec<Vec<u8>>> {
        Ok(match self {
            Some(v) => vec![bincode::serialize(v)?],
            None => Vec::new(),
        })
    }
    fn decode_entry(&mut self, bytes: &[u8]) -> Result<()> {
        // The host hands a value state at most one entry (its redistribution is `none`).
        *self = Some(bincode::deserialize(bytes)?);
        Ok(())
    }
}

impl<T: Serialize + DeserializeOwned> ErasedCell for Vec<T> {
    fn encode(&self) -> Result<Vec<Vec<u8>>> {
        self.iter().map(|v| Ok(bincode::serialize(v)?)).collect()
    }
    fn decode_entry(&mut self, bytes: &[u8]) -> Result<()> {
        self.push(bincode::deserialize(bytes)?);
        Ok(())
    }
}

pub(crate) fn new_table<V: Serialize + DeserializeOwned + 'static>(
    groups: usize,
) -> (Shared<KeyedTable<V>>, Shared<dyn ErasedTable>) {
    fn encode<V: Serialize>(v: &V, out: &mut Vec<u8>) -> Result<()> {
        Ok(bincode::serialize_into(out, v)?)
    }
    let t = Rc::new(RefCell::new(KeyedTable::<V>::new(groups, encode::<V>)));
    let erased: Rc<RefCell<dyn ErasedTable>> = t.clone();
    (t, erased)
}

/// One value of type `T` per key.
///
/// ```text
/// let n = self.count.update_or_default(ctx, |c| { *c += 1; *c });
/// ```
pub struct ValueState<T> {
    pub(crate) table: Rc<RefCell<KeyedTable<T>>>,
}

impl<T> ValueState<T> {
    /// The current key's value, cloned.
    #[inline]
    pub fn get(&self, ctx: &Context<'_>) -> Option<T>
    where
        T: Clone,
    {
        self.table.borrow().get(ctx.slot(), ctx.key()).cloned()
    }

    /// Runs `f` on the current key's value, if any.
    #[inline]
    pub fn with<R>(&self, ctx: &Context<'_>, f: impl FnOnce(Option<&T>) -> R) -> R {
        f(self.table.borrow().get(ctx.slot(), ctx.key()))
    }

    /// Sets the current key's value.
    #[inline]
    pub fn set(&self, ctx: &Context<'_>, value: T) {
        let mut t = self.table.borrow_mut();
        match t.get_mut(ctx.slot(), ctx.key()) {
            Some(v) => *v = value,
            None => t.insert(ctx.slot(), ctx.key(), value),
        }
    }

    /// Updates the current key's value in place, starting from `T::default()`; returns what
    /// `f` returns. One hash lookup when the key exists.
    #[inline]
    pub fn update_or_default<R>(&self, ctx: &Context<'_>, f: impl FnOnce(&mut T) -> R) -> R
    where
        T: Default,
    {
        let mut t = self.table.borrow_mut();
        if let Some(v) = t.get_mut(ctx.slot(), ctx.key()) {
            return f(v);
        }
        let mut v = T::default();
        let r = f(&mut v);
        t.insert(ctx.slot(), ctx.key(), v);
        r
    }

    /// Removes the current key's value.
    #[inline]
    pub fn clear(&self, ctx: &Context<'_>) {
        self.table.borrow_mut().remove(ctx.slot(), ctx.key());
    }

    /// Removes the current key's value and returns it.
    #[inline]
    pub fn take(&self, ctx: &Context<'_>) -> Option<T> {
        self.table.borrow_mut().remove(ctx.slot(), ctx.key())
    }
}

/// A list of `T` per key.
pub struct ListState<T> {
    pub(crate) table: Rc<RefCell<KeyedTable<Vec<T>>>>,
}

impl<T> ListState<T> {
    /// Appends to the current key's list.
    #[inline]
    pub fn push(&self, ctx: &Context<'_>, value: T) {
        let mut t = self.table.borrow_mut();
        match t.get_mut(ctx.slot(), ctx.key()) {
            Some(l) => l.push(value),
            None => t.insert(ctx.slot(), ctx.key(), vec![value]),
        }
    }

    /// Runs `f` on the current key's list (empty if none).
    #[inline]
    pub fn with<R>(&self, ctx: &Context<'_>, f: impl FnOnce(&[T]) -> R) -> R {
        let t = self.table.borrow();
        f(t.get(ctx.slot(), ctx.key()).map(|l| l.as_slice()).unwrap_or(&[]))
    }

    /// Removes the current key's list.
    #[inline]
    pub fn clear(&self, ctx: &Context<'_>) {
        self.table.borrow_mut().remove(ctx.slot(), ctx.key());
    }
}

/// A map from `K` to `V` per key (ordered, so iteration and snapshots are deterministic).
pub struct MapState<K, V> {
    pub(crate) table: Rc<RefCell<KeyedTable<BTreeMap<K, V>>>>,
}

impl<K: Ord, V> MapState<K, V> {
    /// Inserts into the current key's map; returns the previous value.
    #[inline]
    pub fn insert(&self, ctx: &Context<'_>, k: K, v: V) -> Option<V> {
        let mut t = self.table.borrow_mut();
        match t.get_mut(ctx.slot(), ctx.key()) {
            Some(m) => m.insert(k, v),
            None => {
                t.insert(ctx.slot(), ctx.key(), BTreeMap::from([(k, v)]));
                None
            }
        }
    }

    /// The value under `k` in the current key's map, cloned.
    #[inline]
    pub fn get(&self, ctx: &Context<'_>, k: &K) -> Option<V>
    where
        V: Clone,
    {
        self.table.borrow().get(ctx.slot(), ctx.key()).and_then(|m| m.get(k).cloned())
    }

    /// Removes `k` from the current key's map.
    #[inline]
    pub fn remove(&self, ctx: &Context<'_>, k: &K) -> Option<V> {
        let mut t = self.table.borrow_mut();
        let m = t.get_mut(ctx.slot(), ctx.key())?;
        let v = m.remove(k);
        if m.is_empty() {
            t.remove(ctx.slot(), ctx.key());
        }
        v
    }

    /// Runs `f` on the current key's map (None when empty).
    #[inline]
    pub fn with<R>(&self, ctx: &Context<'_>, f: impl FnOnce(Option<&BTreeMap<K, V>>) -> R) -> R {
        f(self.table.borrow().get(ctx.slot(), ctx.key()))
    }
}

/// One value per subtask (non-keyed state).
pub struct OperatorValue<T> {
    pub(crate) cell: Rc<RefCell<Option<T>>>,
}

impl<T: Clone> OperatorValue<T> {
    /// The value, cloned.
    pub fn get(&self) -> Option<T> {
        self.cell.borrow().clone()
    }
    /// Sets the value.
    pub fn set(&self, v: T) {
        *self.cell.borrow_mut() = Some(v);
    }
}

/// A per-subtask list (declared with `StateDescriptor::operator_list`): on rescale its
/// elements are split across or unioned into the new subtasks, as declared.
pub struct OperatorList<T> {
    pub(crate) cell: Rc<RefCell<Vec<T>>>,
}

impl<T: Clone> OperatorList<T> {
    /// The elements, cloned.
    pub fn get(&self) -> Vec<T> {
        self.cell.borrow().clone()
    }
    /// Appends an element.
    pub fn push(&self, v: T) {
        self.cell.borrow_mut().push(v);
    }
    /// Replaces every element.
    pub fn set(&self, v: Vec<T>) {
        *self.cell.borrow_mut() = v;
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.cell.borrow().len()
    }
    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.cell.borrow().is_empty()
    }
}

/// Encodes one key group's blob of the frozen snapshot (see `wit/operator.wit`, "Keyed
/// state layout"): every entry, or (`delta`) a delta blob of what changed between the
/// previous snapshot and the barrier (states without changes left out).
pub(crate) fn encode_group(states: &[Registered], slot: usize, out: &mut Vec<u8>, delta: bool) -> Result<()> {
    let start = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0u32;
    for s in states {
        let mut t = s.table.borrow_mut();
        let at = out.len();
        out.extend_from_slice(&(s.name.len() as u32).to_le_bytes());
        out.extend_from_slice(s.name.as_bytes());
        let n_at = out.len();
        out.extend_from_slice(&0u32.to_le_bytes());
        let n = t.write_group(slot, out)?;
        if delta && n == 0 {
            out.truncate(at);
            continue;
        }
        out[n_at..n_at + 4].copy_from_slice(&n.to_le_bytes());
        count += 1;
    }
    let flag = if delta { DELTA_FLAG } else { 0 };
    out[start..start + 4].copy_from_slice(&(count | flag).to_le_bytes());
    Ok(())
}

/// A cursor over a state blob; every read is bounds-checked.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }
    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes(b.try_into().unwrap()))
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| Error::msg("corrupt state blob: truncated"))?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }
    pub fn chunk(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_keys_come_back_in_order_with_empty_and_long_ones() {
        let keys: [&[u8]; 4] = [b"a", b"", &[7u8; 300], b"key-4"];
        let mut r = Removed::default();
        assert_eq!(r.iter().count(), 0);
        for k in keys {
            r.push(k);
        }
        assert_eq!(r.iter().collect::<Vec<_>>(), keys);
    }
}
