//! `native:keyed-count`: the wordcount/J1 counter compiled into the host, used only to
//! measure what the engine does without the WASM boundary (the benchmark's "native" row).
//!
//! It reproduces `examples/wordcount/counter` exactly: per record, count per key and emit
//! `(key, "<key> <count>")`; keyed state `count` as bincode u64 in the WIT keyed-state
//! layout, so its snapshots are interchangeable with the component's.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::declared::{DeclaredState, OperatorInfo, Redistribution, StateKind};
use crate::graph::logical::Side;
use crate::record::Batch;
use crate::record::write_decimal;
use crate::sandbox::bindings::types::{KeyGroupState, OperatorSnapshot, SnapshotMode, TimeDomain};
use crate::sandbox::host::HostState;
use crate::sandbox::instance::GuestError;

use super::OperatorLogic;

/// The `describe` of the native counter (the same as the component's, but the name).
pub fn info() -> OperatorInfo {
    OperatorInfo {
        name: "native-keyed-count".into(),
        version: "1.0.0".into(),
        schema_version: 1,
        migrates_from: vec![],
        states: vec![DeclaredState {
            name: "count".into(),
            kind: StateKind::Value,
            keyed: true,
            redistribution: Redistribution::None,
        }],
        side_outputs: vec![],
        two_input: false,
        pageable: false,
    }
}

/// FxHash, as the guest SDK uses.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, mut bytes: &[u8]) {
        let mut add = |w: u64| self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
        while bytes.len() >= 8 {
            add(u64::from_le_bytes(bytes[..8].try_into().unwrap()));
            bytes = &bytes[8..];
        }
        if bytes.len() >= 4 {
            add(u32::from_le_bytes(bytes[..4].try_into().unwrap()) as u64);
            bytes = &bytes[4..];
        }
        for &b in bytes {
            add(b as u64);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, i: usize) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Table = HashMap<Box<[u8]>, u64, BuildHasherDefault<Fx>>;

/// The native counter instance.
pub struct NativeKeyedCount {
    host: HostState,
    groups: Vec<Table>,
    dirty: Vec<bool>,
    out: Batch,
}

impl NativeKeyedCount {
    /// An instance for the subtask described by `host`.
    pub fn new(host: HostState) -> Self {
        let n = (host.task.key_group_end - host.task.key_group_start) as usize;
        NativeKeyedCount {
            host,
            groups: (0..n).map(|_| Table::default()).collect(),
            dirty: vec![false; n],
            out: Batch::default(),
        }
    }

    fn slot(&self, kg: u32) -> Result<usize, GuestError> {
        let t = &self.host.task;
        if kg < t.key_group_start || kg >= t.key_group_end {
            return Err(GuestError::Failed { call: "process", message: format!("key group {kg} is not owned here") });
        }
        Ok((kg - t.key_group_start) as usize)
    }
}

impl OperatorLogic for NativeKeyedCount {
    fn host(&mut self) -> &mut HostState {
        &mut self.host
    }

    fn open(&mut self, _config: &[(String, String)]) -> Result<(), GuestError> {
        Ok(())
    }

    fn process(&mut self, _side: Side, batch: &Batch) -> Result<(), GuestError> {
        for r in batch.iter() {
            let slot = self.slot(r.tag)?;
            self.dirty[slot] = true;
            let g = &mut self.groups[slot];
            let n = match g.get_mut(r.key) {
                Some(c) => {
                    *c += 1;
                    *c
                }
                None => {
                    g.insert(r.key.into(), 1);
                    1
                }
            };
            // As the component does: the value written in place, no allocation per record.
            self.out.push_with(0, r.timestamp, r.key, |out| {
                out.extend_from_slice(r.key);
                out.push(b' ');
                write_decimal(out, n);
            });
        }
        Ok(())
    }

    fn on_timer(&mut self, _domain: TimeDomain, _timers: &Batch) -> Result<(), GuestError> {
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64) -> Result<(), GuestError> {
        self.host.watermark = watermark;
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint: u64, mode: SnapshotMode) -> Result<OperatorSnapshot, GuestError> {
        let full = matches!(mode, SnapshotMode::Full);
        let mut keyed = Vec::new();
        for (slot, g) in self.groups.iter().enumerate() {
            // Every group with state: a changed one whole, an unchanged one (incremental
            // mode) as an empty delta.
            if !g.is_empty() {
                let mut data = Vec::new();
                if !full && !self.dirty[slot] {
                    data.extend_from_slice(&crate::checkpoint::layout::DELTA_FLAG.to_le_bytes());
                } else {
                    data.extend_from_slice(&1u32.to_le_bytes());
                    data.extend_from_slice(&5u32.to_le_bytes());
                    data.extend_from_slice(b"count");
                    data.extend_from_slice(&(g.len() as u32).to_le_bytes());
                    for (k, v) in g {
                        data.extend_from_slice(&(k.len() as u32).to_le_bytes());
                        data.extend_from_slice(k);
                        data.extend_from_slice(&8u32.to_le_bytes());
                        data.extend_from_slice(&v.to_le_bytes());
                    }
                }
                keyed.push(KeyGroupState { key_group: self.host.task.key_group_start + slot as u32, data });
            }
        }
        self.dirty.iter_mut().for_each(|d| *d = false);
        Ok(OperatorSnapshot { keyed, operator_state: vec![] })
    }

    fn restore(&mut self, schema_version: u32, state: &OperatorSnapshot) -> Result<(), GuestError> {
        let bad = |m: &str| GuestError::Failed { call: "restore", message: m.to_string() };
        if schema_version != 1 {
            return Err(bad("native-keyed-count restores schema 1 only"));
        }
        for kg in &state.keyed {
            let slot = self.slot(kg.key_group)?;
            let d = &kg.data;
            let mut pos = 0usize;
            let u32_at = |pos: &mut usize| -> Result<usize, GuestError> {
                let b = d.get(*pos..*pos + 4).ok_or_else(|| bad("truncated state"))?;
                *pos += 4;
                Ok(u32::from_le_bytes(b.try_into().unwrap()) as usize)
            };
            if d.is_empty() {
                continue;
            }
            for _ in 0..u32_at(&mut pos)? {
                let n = u32_at(&mut pos)?;
                pos += n;
                for _ in 0..u32_at(&mut pos)? {
                    let k = u32_at(&mut pos)?;
                    let key = d.get(pos..pos + k).ok_or_else(|| bad("truncated state"))?.to_vec();
                    pos += k;
                    let v = u32_at(&mut pos)?;
                    let val = d.get(pos..pos + v).filter(|b| b.len() == 8).ok_or_else(|| bad("value is not a u64"))?;
                    pos += v;
                    self.groups[slot].insert(key.into(), u64::from_le_bytes(val.try_into().unwrap()));
                }
            }
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), GuestError> {
        Ok(())
    }

    fn take_emitted(&mut self) -> Batch {
        self.out.take()
    }
}
