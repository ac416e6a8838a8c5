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
//
// Event time: `onTimer(ctx, domain, timer)` gets the key's timers (`ctx.registerEventTimer`),
// `ctx.watermark()` is the last watermark, and `tumbling(ctx, state, {...})` keeps tumbling
// windows with an accumulator per window in one keyed state (codec `windows(acc)`), laid out
// as the Rust SDK's `Windows<A>`.

import { emitBatch } from 'weir:operator/collector@0.3.2';
import { currentWatermark, task } from 'weir:operator/context@0.3.2';
import * as timers from 'weir:operator/timers@0.3.2';

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
/** A Rust `Vec` of `codec` values (u64 length + elements). Values are arrays. */
export const list = (codec) => ({
  write: (w, v) => { w.u64(v.length); for (const x of v) codec.write(w, x); },
  read: (r) => { const out = []; for (let n = Number(r.u64()); n > 0; n--) out.push(codec.read(r)); return out; },
});
/**
 * The codec of a windows state (see `tumbling`): a key's open windows, each `[start, end,
 * acc]` with its accumulator in `acc`, sorted; the Rust SDK's `Vec<(Window, A)>`.
 */
export const windows = (acc) => ({ ...list(struct([i64, i64, acc])), acc });

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

// What `tumbling` needs of an operator beyond the public context: its declarations.
const declared = Symbol('weir declarations');

// i64::MIN: the watermark before the first one.
const NO_WATERMARK = -9223372036854775808;

/**
 * Builds the exports of an operator from `spec`: `name`, `version`, `schemaVersion`,
 * `migratesFrom` (older schemas), `states` (`{ name, codec }`, keyed value states),
 * `sideOutputs` (names: ports 1..=n), `open(ctx, config)`, `process(ctx, rec)`,
 * `onTimer(ctx, domain, timer)`, `close(ctx)`, `migrate(state, fromSchema, bytes)`.
 */
export function operator(spec) {
  const states = spec.states || [];
  const migratesFrom = spec.migratesFrom || [];
  const sideOutputs = spec.sideOutputs || [];
  let info = null; // task info, after open
  let tables = null; // tables[state][groupIndex] = Map
  let out = new Writer();
  let current = null; // the record (or timer) being processed: its key and timestamp
  let watermark = NO_WATERMARK; // the last on-watermark's (the host fires due timers first)

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
  const write = (port, timestamp, key, value) => {
    out.u32(port); out.i64(timestamp); out.u32(key.length); out.u32(value.length);
    out.bytes(key); out.bytes(value);
  };
  const keyed = () => {
    if (!current) throw new Error('keyed state and timers need a key: use them in process or onTimer');
    return current;
  };
  const ctx = {
    task: () => info,
    /** The current record's (or timer's) key, as bytes. */
    key() { return keyed().key; },
    /** The current record's (or timer's) timestamp, ms. */
    timestamp() { return keyed().timestamp; },
    /** The value of `state` for the current record's key (undefined if none). */
    get(state) { return tableOf(state)[group(keyed().keyGroup)].get(current.k); },
    /** Sets the value of `state` for the current record's key. */
    set(state, v) { tableOf(state)[group(keyed().keyGroup)].set(current.k, v); },
    /** Replaces the value with `f(old)` and returns it. */
    update(state, f) { const t = tableOf(state)[group(keyed().keyGroup)]; const v = f(t.get(current.k)); t.set(current.k, v); return v; },
    /** Removes the value of `state` for the current record's key. */
    remove(state) { tableOf(state)[group(keyed().keyGroup)].delete(current.k); },
    /** Emits `(key, value)` (bytes) on the main output (port 0) or side output `port`. */
    emit(key, value, port = 0) { write(port, current ? current.timestamp : 0, key, value); },
    /** Emits `(key, value)` with event time `timestamp` (ms). */
    emitAt(key, value, timestamp, port = 0) { write(port, timestamp, key, value); },
    /** Asks for `onTimer` for the current key when the watermark reaches `time` (once per time). */
    registerEventTimer(time) { const c = keyed(); timers.register('event-time', c.keyGroup, c.key, time); },
    /** Cancels it (unknown timers are ignored). */
    deleteEventTimer(time) { const c = keyed(); timers.delete('event-time', c.keyGroup, c.key, time); },
    /** The last on-watermark's watermark (i64::MIN before the first; a live upgrade's new instance starts from the running one). */
    watermark() { return watermark; },
    [declared]: {
      codec(name) {
        const s = states.find((d) => d.name === name);
        if (!s) throw new Error(`state \`${name}\` is not declared in \`${spec.name}\`'s states`);
        return s.codec;
      },
      port(name) {
        const i = sideOutputs.indexOf(name);
        if (i < 0) throw new Error(`late records go to side output \`${name}\`, which \`${spec.name}\` does not declare in sideOutputs`);
        return i + 1;
      },
    },
  };
  const flush = () => {
    if (out.len > 0) emitBatch(out.take());
    out = new Writer();
  };
  // Calls `f(record)` for every record of a framed batch (see wit/operator.wit).
  const eachRecord = (batch, f) => {
    const dv = new DataView(batch.buffer, batch.byteOffset, batch.byteLength);
    let pos = 0;
    while (pos < batch.length) {
      const keyGroup = dv.getUint32(pos, true);
      const lo = dv.getUint32(pos + 4, true), hi = dv.getInt32(pos + 8, true);
      const timestamp = hi * 4294967296 + lo;
      const klen = dv.getUint32(pos + 12, true);
      const vlen = dv.getUint32(pos + 16, true);
      const key = batch.subarray(pos + 20, pos + 20 + klen);
      const value = batch.subarray(pos + 20 + klen, pos + 20 + klen + vlen);
      pos += 20 + klen + vlen;
      f({ keyGroup, timestamp, key, value, k: keyString(key) });
    }
  };

  return {
    describe() {
      return {
        name: spec.name, version: spec.version, stateSchemaVersion: spec.schemaVersion || 1, migratesFrom,
        states: states.map((s) => ({ name: s.name, kind: 'value', keyed: true, redistribution: 'none' })),
        sideOutputs,
      };
    },
    setup(config) {
      info = task();
      // A live upgrade's new instance opens mid-stream: the running watermark.
      watermark = currentWatermark();
      const n = info.keyGroupEnd - info.keyGroupStart;
      tables = states.map(() => Array.from({ length: n }, () => new Map()));
      if (spec.open) spec.open(ctx, Object.fromEntries(config));
    },
    process(batch) {
      let index = 0;
      eachRecord(batch, (rec) => {
        current = rec;
        try {
          spec.process(ctx, current);
        } catch (e) {
          // Names the record (the host shows its key and origin); what came before stands.
          current = null;
          flush();
          throw new Error(`record ${index}: ${e && e.message !== undefined ? e.message : e}`);
        }
        index++;
      });
      current = null;
      flush();
    },
    onTimer(domain, due) {
      try {
        if (spec.onTimer) eachRecord(due, (timer) => { current = timer; spec.onTimer(ctx, domain, timer); });
      } finally {
        current = null;
        flush();
      }
    },
    onWatermark(wm) { watermark = wm; },
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

// ---- tumbling windows -------------------------------------------------------------------
//
// The per-key rules of the Rust SDK's `window::book`, on a key's list of `[start, end, acc]`:
// a window takes records until the watermark reaches its cleanup time, `end - 1 + lateness`;
// it has a timer at `end - 1` (unless the watermark is already there: then each record fires
// it at once) and one at its cleanup time, when it is removed.

/** One window, `[start, end)` in ms; complete when the watermark reaches `maxTimestamp` (end - 1). */
const window = (start, end) => ({ start, end, maxTimestamp: end - 1 });

/**
 * Tumbling event-time windows (call in `open`): `sizeMs` long, starting at multiples of the
 * size plus `offsetMs` (negative timestamps too), kept with an accumulator each in the keyed
 * state `state` (declared with codec `windows(accCodec)`). Options: `sizeMs`, `offsetMs` (0),
 * `latenessMs` (0: how long after its end a window still takes records, each firing it
 * again), `lateOutput` (a declared side output for late records; else they are dropped),
 * `initial` (a new window's accumulator), `add(acc, rec) -> acc`, `fire(ctx, window, acc)`
 * (`window`: `start`, `end`, `maxTimestamp`; `ctx.key()` is its key). Returns `{ add(ctx, rec)
 * -> taken?, onTimer(ctx, domain) }`: call them from `process` and `onTimer`. A key's state is
 * removed once the watermark has passed all its windows plus lateness.
 */
export function tumbling(ctx, state, { sizeMs, offsetMs = 0, latenessMs = 0, lateOutput, initial, add, fire }) {
  const size = Number(sizeMs), offset = Number(offsetMs), lateness = Number(latenessMs);
  if (!Number.isSafeInteger(size) || size <= 0) throw new Error(`a tumbling window's size must be positive, not ${sizeMs} ms`);
  if (!Number.isSafeInteger(offset) || Math.abs(offset) >= size) {
    throw new Error(`a tumbling window's offset (${offsetMs} ms) must be smaller than its size (${size} ms)`);
  }
  if (!Number.isSafeInteger(lateness) || lateness < 0) throw new Error(`allowed lateness must be 0 or more, not ${latenessMs} ms`);
  if (typeof add !== 'function' || typeof fire !== 'function') throw new Error(`windows \`${state}\`: add and fire must be functions`);
  const accCodec = ctx[declared].codec(state).acc;
  if (!accCodec) throw new Error(`windows \`${state}\`: declare the state with codec \`windows(accumulatorCodec)\``);
  // Every new window starts from its own copy of `initial` (an `add` may change it in place).
  const initialBytes = encode(accCodec, initial);
  const latePort = lateOutput === undefined || lateOutput === null ? 0 : ctx[declared].port(lateOutput);
  const cleanup = (end) => end - 1 + lateness;
  // The place of the window starting at `start` in the sorted `open` (tumbling: starts are distinct).
  const place = (open, start) => {
    let lo = 0, hi = open.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (open[mid][0] < start) lo = mid + 1; else hi = mid; }
    return lo;
  };
  return {
    /** Adds `rec` (of the current key) to its window; false when it was late. */
    add(ctx, rec) {
      const ts = rec.timestamp;
      const start = ts - ((((ts - offset) % size) + size) % size);
      const end = start + size;
      const wm = ctx.watermark();
      if (cleanup(end) <= wm) {
        if (latePort) ctx.emit(rec.key, rec.value, latePort);
        return false;
      }
      const had = ctx.get(state);
      const open = had || [];
      const i = place(open, start);
      const found = i < open.length && open[i][0] === start;
      const acc = add(found ? open[i][2] : decode(accCodec, initialBytes), rec);
      if (found) {
        open[i][2] = acc;
      } else {
        open.splice(i, 0, [start, end, acc]);
        if (!had) ctx.set(state, open);
        if (end - 1 > wm) ctx.registerEventTimer(end - 1);
        if (lateness !== 0) ctx.registerEventTimer(cleanup(end));
      }
      // Past its end, within lateness: the record changed a fired window; fire it again.
      if (end - 1 <= wm) fire(ctx, window(start, end), acc);
      return true;
    },
    /** Fires the current key's windows ending at the timer, removes those past their lateness. */
    onTimer(ctx, domain) {
      if (domain !== 'event-time') return;
      const open = ctx.get(state);
      if (open === undefined) return;
      const time = ctx.timestamp();
      for (const [start, end, acc] of open) if (end - 1 === time) fire(ctx, window(start, end), acc);
      const kept = open.filter(([, end]) => cleanup(end) > time);
      if (kept.length === 0) ctx.remove(state);
      else if (kept.length !== open.length) ctx.set(state, kept);
    },
  };
}
