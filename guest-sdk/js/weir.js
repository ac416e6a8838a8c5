// Weir operators in JavaScript (QuickJS via componentize-qjs): the same WIT contract, record
// framing and keyed state layout as the Rust SDK (see wit/operator.wit), so state written by
// an operator in one language restores into the same schema in another.
//
//   import { operator, u64 } from './weir.js';
//   export const { describe, setup, process, onTimer, onWatermark, snapshot, restore, finish, queryState } = operator({
//     name: 'wordcount-counter', version: '1.0.0', schemaVersion: 1,
//     states: [{ name: 'count', codec: u64 }],                       // keyed value states
//     process(ctx, rec) { const n = ctx.update('count', c => (c ?? 0) + 1); ctx.emit(rec.key, ...) },
//   });
//
// Keyed state lives in the guest, one Map per key group per state; `snapshot` serializes the
// key groups, `restore` reads them back (running `migrate(state, fromSchema, bytes)` for
// older schemas). Values are encoded with bincode 1 defaults through a codec (`u64`, `i64`,
// `string`, `bytes`, or `struct([...])`). Output is buffered and handed to the host once per
// call. A thrown error fails the call (the host restarts the job from its last checkpoint).
// `queryState` answers live state queries (`weir query`): a key's value as JSON.

import { emitBatch } from 'weir:operator/collector@0.3.1';
import { task } from 'weir:operator/context@0.3.1';

// ---- bincode 1 codecs -------------------------------------------------------------------

class Writer {
  constructor() { this.buf = new Uint8Array(4096); this.dv = new DataView(this.buf.buffer); this.len = 0; }
  reserve(n) {
    if (this.len + n <= this.buf.length) return;
    let cap = this.buf.length * 2;
    while (cap < this.len + n) cap *= 2;
    const b = new Uint8Array(cap); b.set(this.buf.subarray(0, this.len)); this.buf = b; this.dv = new DataView(b.buffer);
  }
  u32(v) { this.reserve(4); this.dv.setUint32(this.len, v, true); this.len += 4; }
  u64(v) {
    this.reserve(8);
    if (typeof v === 'number') { this.dv.setUint32(this.len, v % 4294967296, true); this.dv.setUint32(this.len + 4, Math.floor(v / 4294967296), true); }
    else this.dv.setBigUint64(this.len, v, true);
    this.len += 8;
  }
  i64(v) {
    this.reserve(8);
    if (typeof v === 'number' && v >= 0) { this.u64(v); return; }
    this.dv.setBigInt64(this.len, BigInt(v), true); this.len += 8;
  }
  bytes(b) { this.reserve(b.length); this.buf.set(b, this.len); this.len += b.length; }
  byte(v) { this.reserve(1); this.buf[this.len++] = v; }
  take() { return this.buf.slice(0, this.len); }
}

class Reader {
  constructor(b) { this.b = b; this.dv = new DataView(b.buffer, b.byteOffset, b.byteLength); this.pos = 0; }
  need(n) { if (this.pos + n > this.b.length) throw new Error('corrupt state blob: truncated'); }
  u32() { this.need(4); const v = this.dv.getUint32(this.pos, true); this.pos += 4; return v; }
  u64() { this.need(8); const v = this.dv.getBigUint64(this.pos, true); this.pos += 8; return v; }
  i64() { this.need(8); const v = this.dv.getBigInt64(this.pos, true); this.pos += 8; return v; }
  bytes(n) { this.need(n); const v = this.b.subarray(this.pos, this.pos + n); this.pos += n; return v; }
  chunk() { return this.bytes(this.u32()); }
}

const toNumber = (big) => (big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big);

/** u64 (a Number while it is safe, else a BigInt). */
export const u64 = { write: (w, v) => w.u64(v), read: (r) => toNumber(r.u64()) };
/** i64. */
export const i64 = { write: (w, v) => w.i64(v), read: (r) => { const v = r.i64(); return v >= -BigInt(Number.MAX_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v; } };
/** bytes (u64 length + bytes). */
export const bytes = { write: (w, v) => { w.u64(v.length); w.bytes(v); }, read: (r) => r.bytes(Number(r.u64())).slice() };
/** UTF-8 string (u64 length + bytes). */
export const string = {
  write: (w, v) => bytes.write(w, utf8(v)),
  read: (r) => fromUtf8(bytes.read(r)),
};
/** A Rust struct or tuple: its fields in order. Values are arrays. */
export const struct = (fields) => ({
  write: (w, v) => fields.forEach((f, i) => f.write(w, v[i])),
  read: (r) => fields.map((f) => f.read(r)),
});

/** Encodes `v` with `codec`. */
export function encode(codec, v) { const w = new Writer(); codec.write(w, v); return w.take(); }
/** Decodes `bytes` with `codec`; every byte must be used. */
export function decode(codec, b) {
  const r = new Reader(b);
  const v = codec.read(r);
  if (r.pos !== b.length) throw new Error('corrupt state value: trailing bytes');
  return v;
}

/** UTF-8 bytes of a string (QuickJS has no TextEncoder). */
export function utf8(s) {
  const out = [];
  for (const ch of s) {
    let c = ch.codePointAt(0);
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return Uint8Array.from(out);
}

/** A string from UTF-8 bytes. */
export function fromUtf8(b) {
  let s = '';
  for (let i = 0; i < b.length;) {
    const c = b[i];
    let cp, n;
    if (c < 0x80) { cp = c; n = 1; } else if (c < 0xe0) { cp = c & 31; n = 2; } else if (c < 0xf0) { cp = c & 15; n = 3; } else { cp = c & 7; n = 4; }
    for (let j = 1; j < n; j++) cp = (cp << 6) | (b[i + j] & 63);
    s += String.fromCodePoint(cp);
    i += n;
  }
  return s;
}

/** The ASCII digits of a non-negative integer, as bytes. */
export function digits(n) {
  const s = String(n);
  const b = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i);
  return b;
}

/** Concatenates byte arrays (and single bytes given as numbers). */
export function concat(...parts) {
  let n = 0;
  for (const p of parts) n += typeof p === 'number' ? 1 : p.length;
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    if (typeof p === 'number') out[o++] = p; else { out.set(p, o); o += p.length; }
  }
  return out;
}

// Map keys: the key bytes as a latin1 string (exact, cheap).
const keyString = (b) => { let s = ''; for (let i = 0; i < b.length; i++) s += String.fromCharCode(b[i]); return s; };
const keyBytes = (s) => { const b = new Uint8Array(s.length); for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i); return b; };

// ---- the operator -----------------------------------------------------------------------

/**
 * Builds the exports of an operator from `spec`: `name`, `version`, `schemaVersion`,
 * `migratesFrom` (older schemas), `states` (`{ name, codec }`, keyed value states),
 * `open(ctx, config)`, `process(ctx, rec)`, `close(ctx)`, `migrate(state, fromSchema, bytes)`.
 */
export function operator(spec) {
  const states = spec.states || [];
  const migratesFrom = spec.migratesFrom || [];
  let info = null; // task info, after open
  let tables = null; // tables[state][groupIndex] = Map
  let out = new Writer();
  let current = null; // the record being processed (for timestamps)

  const group = (kg) => {
    const i = kg - info.keyGroupStart;
    if (i < 0 || kg >= info.keyGroupEnd) throw new Error(`key group ${kg} is not this subtask's`);
    return i;
  };
  const tableOf = (name) => {
    const i = states.findIndex((s) => s.name === name);
    if (i < 0) throw new Error(`state \`${name}\` is not declared`);
    return tables[i];
  };
  const ctx = {
    task: () => info,
    /** The value of `state` for the current record's key (undefined if none). */
    get(state) { return tableOf(state)[group(current.keyGroup)].get(current.k); },
    /** Sets the value of `state` for the current record's key. */
    set(state, v) { tableOf(state)[group(current.keyGroup)].set(current.k, v); },
    /** Replaces the value with `f(old)` and returns it. */
    update(state, f) { const t = tableOf(state)[group(current.keyGroup)]; const v = f(t.get(current.k)); t.set(current.k, v); return v; },
    /** Emits `(key, value)` (bytes) on the main output (port 0) or side output `port`. */
    emit(key, value, port = 0) {
      out.u32(port); out.i64(current ? current.timestamp : 0); out.u32(key.length); out.u32(value.length);
      out.bytes(key); out.bytes(value);
    },
  };
  const flush = () => {
    if (out.len > 0) emitBatch(out.take());
    out = new Writer();
  };

  return {
    describe() {
      return {
        name: spec.name, version: spec.version, stateSchemaVersion: spec.schemaVersion || 1, migratesFrom,
        states: states.map((s) => ({ name: s.name, kind: 'value', keyed: true, redistribution: 'none' })),
        sideOutputs: spec.sideOutputs || [],
      };
    },
    setup(config) {
      info = task();
      const n = info.keyGroupEnd - info.keyGroupStart;
      tables = states.map(() => Array.from({ length: n }, () => new Map()));
      if (spec.open) spec.open(ctx, Object.fromEntries(config));
    },
    process(batch) {
      const dv = new DataView(batch.buffer, batch.byteOffset, batch.byteLength);
      let pos = 0, index = 0;
      while (pos < batch.length) {
        const keyGroup = dv.getUint32(pos, true);
        const lo = dv.getUint32(pos + 4, true), hi = dv.getInt32(pos + 8, true);
        const timestamp = hi * 4294967296 + lo;
        const klen = dv.getUint32(pos + 12, true);
        const vlen = dv.getUint32(pos + 16, true);
        const key = batch.subarray(pos + 20, pos + 20 + klen);
        const value = batch.subarray(pos + 20 + klen, pos + 20 + klen + vlen);
        pos += 20 + klen + vlen;
        current = { keyGroup, timestamp, key, value, k: keyString(key) };
        try {
          spec.process(ctx, current);
        } catch (e) {
          // Names the record (the host shows its key and origin); what came before stands.
          current = null;
          flush();
          throw new Error(`record ${index}: ${e && e.message !== undefined ? e.message : e}`);
        }
        index++;
      }
      current = null;
      flush();
    },
    onTimer(domain, timers) { },
    onWatermark(watermark) { },
    snapshot(checkpointId, mode) {
      const keyed = [];
      const n = info.keyGroupEnd - info.keyGroupStart;
      for (let g = 0; g < n; g++) {
        if (tables.every((t) => t[g].size === 0)) continue;
        const w = new Writer();
        w.u32(states.length);
        states.forEach((s, i) => {
          const name = utf8(s.name);
          w.u32(name.length); w.bytes(name);
          w.u32(tables[i][g].size);
          for (const [k, v] of tables[i][g]) {
            const kb = keyBytes(k); w.u32(kb.length); w.bytes(kb);
            const vb = encode(s.codec, v); w.u32(vb.length); w.bytes(vb);
          }
        });
        keyed.push({ keyGroup: info.keyGroupStart + g, data: w.take() });
      }
      return { keyed, operatorState: new Uint8Array(0) };
    },
    restore(schemaVersion, state) {
      const own = spec.schemaVersion || 1;
      if (schemaVersion !== own && !migratesFrom.includes(schemaVersion)) {
        throw new Error(`\`${spec.name}\` ${spec.version} writes state schema ${own} and migrates from [${migratesFrom}]; it cannot restore state of schema ${schemaVersion}`);
      }
      for (const { keyGroup, data } of state.keyed) {
        if (data.length === 0) continue;
        const g = group(keyGroup);
        const r = new Reader(data);
        for (let s = r.u32(); s > 0; s--) {
          const name = fromUtf8(r.chunk());
          const i = states.findIndex((d) => d.name === name);
          if (i < 0) throw new Error(`the snapshot holds keyed state \`${name}\`, which \`${spec.name}\` ${spec.version} does not declare`);
          for (let e = r.u32(); e > 0; e--) {
            const k = keyString(r.chunk());
            let vb = r.chunk();
            if (schemaVersion !== own) vb = spec.migrate(name, schemaVersion, vb);
            tables[i][g].set(k, decode(states[i].codec, vb));
          }
        }
      }
      if (state.operatorState.length > 0) throw new Error('the JavaScript SDK keeps no per-subtask state');
    },
    finish() {
      if (spec.close) { spec.close(ctx); flush(); }
    },
    queryState(state, keyGroup, key) {
      const i = states.findIndex((s) => s.name === state);
      if (i < 0) throw new Error(`\`${spec.name}\` has no keyed state \`${state}\` (its keyed states: [${states.map((s) => s.name).join(', ')}])`);
      const v = tables[i][group(keyGroup)].get(keyString(key));
      return v === undefined ? undefined : toJson(v);
    },
  };
}

// A state value as JSON text: big integers as numbers when exact (else strings), bytes as arrays.
function toJson(v) {
  return JSON.stringify(v, (_, x) => {
    if (typeof x === 'bigint') return x >= -BigInt(Number.MAX_SAFE_INTEGER) && x <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(x) : x.toString();
    if (x instanceof Uint8Array) return Array.from(x);
    return x;
  });
}
