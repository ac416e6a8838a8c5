// The wordcount counter in JavaScript: counts records per key and emits `<key> <count>` for
// every record, exactly like the Rust counter (examples/wordcount/counter), with the same
// state (`count`, a keyed u64, schema 1), so savepoints move between the two.
//
// Build: bash guest-sdk/js/build.sh examples/wordcount/counter-js/counter.js target/js/wordcount_counter_js.wasm

import { operator, u64, concat, digits } from '../../../guest-sdk/js/weir.js';

export const { describe, setup, process, onTimer, onWatermark, snapshot, restore, finish, queryState } = operator({
  name: 'wordcount-counter',
  version: '1.0.0-js',
  schemaVersion: 1,
  states: [{ name: 'count', codec: u64 }],
  process(ctx, rec) {
    if (rec.value.length === 5 && String.fromCharCode(...rec.value) === 'panic') {
      throw new Error('counter: failing on request (`panic`)');
    }
    const n = ctx.update('count', (c) => (c ?? 0) + 1);
    ctx.emit(rec.key, concat(rec.key, 32, digits(n)));
  },
});
