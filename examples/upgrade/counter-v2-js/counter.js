// Word counter v2 in JavaScript: the same state schema 2 as the Rust v2
// (examples/upgrade/counter-v2): `count` = (u64 n, i64 first_seen), migrated from schema 1
// (a bare u64) with first_seen = i64::MIN.
import { operator, u64, i64, struct, encode, decode, concat, digits } from '../../../guest-sdk/js/weir.js';

const COUNT = struct([u64, i64]);
const UNKNOWN = -9223372036854775808n;

export const { describe, setup, process, onTimer, onWatermark, snapshot, restore, finish, queryState } = operator({
  name: 'wordcount-counter',
  version: '2.0.0-js',
  schemaVersion: 2,
  migratesFrom: [1],
  states: [{ name: 'count', codec: COUNT }],
  migrate(state, from, bytes) {
    return encode(COUNT, [decode(u64, bytes), UNKNOWN]);
  },
  process(ctx, rec) {
    const c = ctx.update('count', (c) => (c ? [c[0] + 1, c[1]] : [1, rec.timestamp]));
    ctx.emit(rec.key, concat(rec.key, 32, digits(c[0])));
  },
});
