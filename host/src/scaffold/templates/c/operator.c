/* {{name}}: a keyed counter. For every record, adds one to the count of the record's key and
 * emits `<key> <count>`. The count is keyed state (a bincode u64): checkpointed, restored after
 * a failure, moved by key group when the parallelism changes. */
#include <string.h>

#include "weir.h"

static const char *const STATES[] = { "count" };
/* name, version, state schema version, migrates from (schema versions, count), states (names,
 * count); side outputs (names, count) may follow */
const weir_operator_def WEIR_OPERATOR = { "{{name}}", "0.1.0", 1, NULL, 0, STATES, 1 };

int weir_on_record(weir_ctx *ctx, const weir_record *rec) {
    weir_bytes old = weir_get(ctx, 0);
    uint64_t n = (old.ptr ? weir_u64_decode(old) : 0) + 1;
    uint8_t enc[8];
    weir_u64_encode(n, enc);
    weir_put(ctx, 0, enc, 8);
    /* `<key> <count>`, formatted without stdio (which would import WASI). */
    uint8_t value[512];
    size_t klen = rec->key.len < 480 ? rec->key.len : 480;
    memcpy(value, rec->key.ptr, klen);
    value[klen] = ' ';
    weir_emit(ctx, rec->key.ptr, rec->key.len, value, klen + 1 + weir_fmt_u64(n, value + klen + 1));
    return 0;
}
