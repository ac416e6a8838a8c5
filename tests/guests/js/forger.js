// A buggy SDK, on purpose: a keyed counter whose `snapshot` hands back forged blobs, chosen
// by `config.forge`: `undeclared` (a state name the operator does not declare), `foreign`
// (a key group the subtask does not own), `twice` (the same key group twice), `framing`
// (a blob that breaks the state layout). The host must refuse each, naming it.

import { operator, u64, utf8, concat } from '../../../guest-sdk/js/weir.js';

let forge = '';
let info = null;

const base = operator({
  name: 'forger',
  version: '1.0.0',
  states: [{ name: 'count', codec: u64 }],
  open(ctx, config) {
    forge = config.forge || '';
    info = ctx.task();
  },
  process(ctx, rec) {
    const n = ctx.update('count', (c) => (c ?? 0) + 1);
    ctx.emit(rec.key, rec.value);
  },
});

const le32 = (n) => [n & 0xff, (n >> 8) & 0xff, (n >> 16) & 0xff, (n >>> 24) & 0xff];

/** A blob holding state `name` with one entry. */
function blob(name) {
  const nb = utf8(name);
  return concat(le32(1), le32(nb.length), nb, le32(1), le32(1), 0x6b, le32(8), 1, 0, 0, 0, 0, 0, 0, 0);
}

export const { describe, setup, process, onTimer, onWatermark, restore, finish, queryState } = base;

export function snapshot(checkpointId, mode) {
  const s = base.snapshot(checkpointId, mode);
  const kg = info.keyGroupStart;
  if (forge === 'undeclared') s.keyed = [{ keyGroup: kg, data: blob('not-declared') }];
  if (forge === 'foreign') s.keyed = [{ keyGroup: info.keyGroupEnd, data: blob('count') }];
  if (forge === 'twice') s.keyed = [{ keyGroup: kg, data: blob('count') }, { keyGroup: kg, data: blob('count') }];
  if (forge === 'framing') s.keyed = [{ keyGroup: kg, data: concat(le32(1), le32(1000), 1, 2, 3) }];
  return s;
}
