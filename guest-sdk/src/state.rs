//! Typed state handles, kept in guest memory and partitioned by key group.
//!
//! Invariants:
//! - keyed state lives in one table per owned key group (`[start, end)` of the subtask), so
//!   the host can snapshot, redistribute and restore it per key group;
//! - every write marks its key group dirty; an incremental snapshot returns exactly the
//!   dirty groups and clears the marks;
//! - values are encoded with bincode 1.x defaults only at snapshot time, never per record.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::context::Context;
use crate::hash::FxBuildHasher;
use crate::{Error, Result};

type Table<V> = HashMap<Box<[u8]>, V, FxBuildHasher>;
type Shared<T> = Rc<RefCell<T>>;

/// The per-key-group tables of one keyed state.
pub(crate) struct KeyedTable<V> {
    groups: Vec<Table<V>>,
    dirty: Vec<bool>,
}

impl<V> KeyedTable<V> {
    fn new(group_count: usize) -> Self {
        KeyedTable { groups: (0..group_count).map(|_| Table::default()).collect(), dirty: vec![false; group_count] }
    }

    #[inline]
    fn group(&self, slot: usize) -> &Table<V> {
        &self.groups[slot]
    }

    #[inline]
    fn group_mut(&mut self, slot: usize) -> &mut Table<V> {
        self.dirty[slot] = true;
        &mut self.groups[slot]
    }
}

/// Type-erased access the SDK needs for snapshot and restore.
pub(crate) trait ErasedTable {
    /// Number of entries in group `slot`.
    fn len(&self, slot: usize) -> usize;
    /// Appends group `slot`'s entries (`u32 klen, key, u32 vlen, value` each).
    fn write_group(&self, slot: usize, out: &mut Vec<u8>) -> Result<()>;
    /// Inserts one entry decoded from `value` into group `slot`.
    fn insert_encoded(&mut self, slot: usize, key: &[u8], value: &[u8]) -> Result<()>;
    fn is_dirty(&self, slot: usize) -> bool;
    fn clear_dirty(&mut self);
}

impl<V: Serialize + DeserializeOwned> ErasedTable for KeyedTable<V> {
    fn len(&self, slot: usize) -> usize {
        self.groups[slot].len()
    }

    fn write_group(&self, slot: usize, out: &mut Vec<u8>) -> Result<()> {
        for (k, v) in &self.groups[slot] {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            let len_at = out.len();
            out.extend_from_slice(&0u32.to_le_bytes());
            bincode::serialize_into(&mut *out, v)?;
            let vlen = (out.len() - len_at - 4) as u32;
            out[len_at..len_at + 4].copy_from_slice(&vlen.to_le_bytes());
        }
        Ok(())
    }

    fn insert_encoded(&mut self, slot: usize, key: &[u8], value: &[u8]) -> Result<()> {
        let v: V = bincode::deserialize(value)?;
        self.groups[slot].insert(key.into(), v);
        Ok(())
    }

    fn is_dirty(&self, slot: usize) -> bool {
        self.dirty[slot]
    }

    fn clear_dirty(&mut self) {
        self.dirty.iter_mut().for_each(|d| *d = false);
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
    let t = Rc::new(RefCell::new(KeyedTable::<V>::new(groups)));
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
        self.table.borrow().group(ctx.slot()).get(ctx.key()).cloned()
    }

    /// Runs `f` on the current key's value, if any.
    #[inline]
    pub fn with<R>(&self, ctx: &Context<'_>, f: impl FnOnce(Option<&T>) -> R) -> R {
        f(self.table.borrow().group(ctx.slot()).get(ctx.key()))
    }

    /// Sets the current key's value.
    #[inline]
    pub fn set(&self, ctx: &Context<'_>, value: T) {
        let mut t = self.table.borrow_mut();
        let g = t.group_mut(ctx.slot());
        match g.get_mut(ctx.key()) {
            Some(v) => *v = value,
            None => {
                g.insert(ctx.key().into(), value);
            }
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
        let g = t.group_mut(ctx.slot());
        if let Some(v) = g.get_mut(ctx.key()) {
            return f(v);
        }
        let mut v = T::default();
        let r = f(&mut v);
        g.insert(ctx.key().into(), v);
        r
    }

    /// Removes the current key's value.
    #[inline]
    pub fn clear(&self, ctx: &Context<'_>) {
        self.table.borrow_mut().group_mut(ctx.slot()).remove(ctx.key());
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
        let g = t.group_mut(ctx.slot());
        match g.get_mut(ctx.key()) {
            Some(l) => l.push(value),
            None => {
                g.insert(ctx.key().into(), vec![value]);
            }
        }
    }

    /// Runs `f` on the current key's list (empty if none).
    #[inline]
    pub fn with<R>(&self, ctx: &Context<'_>, f: impl FnOnce(&[T]) -> R) -> R {
        let t = self.table.borrow();
        f(t.group(ctx.slot()).get(ctx.key()).map(|l| l.as_slice()).unwrap_or(&[]))
    }

    /// Removes the current key's list.
    #[inline]
    pub fn clear(&self, ctx: &Context<'_>) {
        self.table.borrow_mut().group_mut(ctx.slot()).remove(ctx.key());
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
        let g = t.group_mut(ctx.slot());
        match g.get_mut(ctx.key()) {
            Some(m) => m.insert(k, v),
            None => {
                g.insert(ctx.key().into(), BTreeMap::from([(k, v)]));
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
        self.table.borrow().group(ctx.slot()).get(ctx.key()).and_then(|m| m.get(k).cloned())
    }

    /// Removes `k` from the current key's map.
    #[inline]
    pub fn remove(&self, ctx: &Context<'_>, k: &K) -> Option<V> {
        let mut t = self.table.borrow_mut();
        let g = t.group_mut(ctx.slot());
        let m = g.get_mut(ctx.key())?;
        let v = m.remove(k);
        if m.is_empty() {
            g.remove(ctx.key());
        }
        v
    }

    /// Runs `f` on the current key's map (None when empty).
    #[inline]
    pub fn with<R>(&self, ctx: &Context<'_>, f: impl FnOnce(Option<&BTreeMap<K, V>>) -> R) -> R {
        f(self.table.borrow().group(ctx.slot()).get(ctx.key()))
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

/// Encodes one key group's blob (see `wit/operator.wit`, "Keyed state layout").
pub(crate) fn encode_group(states: &[Registered], slot: usize, out: &mut Vec<u8>) -> Result<()> {
    out.extend_from_slice(&(states.len() as u32).to_le_bytes());
    for s in states {
        let t = s.table.borrow();
        out.extend_from_slice(&(s.name.len() as u32).to_le_bytes());
        out.extend_from_slice(s.name.as_bytes());
        out.extend_from_slice(&(t.len(slot) as u32).to_le_bytes());
        t.write_group(slot, out)?;
    }
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
