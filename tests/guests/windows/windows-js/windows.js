// The windows under test (tests/guests/windows) in JavaScript, tumbling only: the input is file
// lines `key,timestamp,value`; config `size_ms`, `offset_ms`, `lateness_ms` and `aggregate`
// (`count`, or `sum` of the values). Each firing emits `<key> <start> <end> <result>` at the
// window's last millisecond; late records go to the `late` side output as they came.
// tests/all/lang_windows.rs checks it against the same reference as the Rust operator.
//
// Build: bash guest-sdk/js/build.sh tests/guests/windows/windows-js/windows.js target/js/windows_js.wasm

import { operator, tumbling, windows, struct, u64, i64, concat, digits, fromUtf8 } from '../../../../guest-sdk/js/weir.js';

let counts = null; // the windows, made in open
let sum = false; // aggregate = sum (else count)

// The third column of `key,timestamp,value`, as an integer.
function value(rec) {
  const text = (fromUtf8(rec.value).split(',')[2] ?? '').trim();
  if (!/^-?\d+$/.test(text)) throw new Error(`value \`${text}\` is not an integer`);
  return Number(text);
}

function fire(ctx, w, [count, total]) {
  const line = concat(ctx.key(), 32, digits(w.start), 32, digits(w.end), 32, digits(sum ? total : count));
  ctx.emitAt(ctx.key(), line, w.maxTimestamp);
}

export const { describe, setup, process, onTimer, onWatermark, snapshot, restore, finish, queryState } = operator({
  name: 'test-windows',
  version: '1.0.0-js',
  schemaVersion: 1,
  // Per window (count, sum): the Rust SDK's `Vec<(Window, (u64, i64))>`.
  states: [{ name: 'windows', codec: windows(struct([u64, i64])) }],
  sideOutputs: ['late'],
  open(ctx, config) {
    if ((config.kind ?? 'tumbling') !== 'tumbling') throw new Error('the JavaScript windows under test are tumbling only: use kind = `tumbling`');
    const aggregate = config.aggregate ?? 'count';
    if (aggregate !== 'count' && aggregate !== 'sum') throw new Error(`aggregate = \`${aggregate}\`: use count or sum`);
    sum = aggregate === 'sum';
    counts = tumbling(ctx, 'windows', {
      sizeMs: config.size_ms ?? 10,
      offsetMs: config.offset_ms ?? 0,
      latenessMs: config.lateness_ms ?? 0,
      lateOutput: 'late',
      initial: [0, 0],
      add: ([count, total], rec) => [count + 1, total + (sum ? value(rec) : 0)],
      fire,
    });
  },
  process(ctx, rec) {
    counts.add(ctx, rec);
  },
  onTimer(ctx, domain) {
    counts.onTimer(ctx, domain);
  },
});
