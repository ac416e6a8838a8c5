// {{name}}: a keyed counter. For every record, adds one to the count of the record's key and
// emits `<key> <count>`. The count is keyed state: checkpointed, restored after a failure,
// moved by key group when the parallelism changes.
//
// `./weir.js` is the Weir JavaScript SDK: `weir build` puts it beside this file when it builds.

import { operator, u64, concat, digits } from './weir.js';

export const { describe, setup, process, onTimer, onWatermark, snapshot, restore, finish, queryState } = operator({
  name: '{{name}}',
  version: '0.1.0',
  schemaVersion: 1,
  states: [{ name: 'count', codec: u64 }],
  process(ctx, rec) {
    const n = ctx.update('count', (c) => (c ?? 0) + 1);
    ctx.emit(rec.key, concat(rec.key, 32, digits(n)));
  },
});
