/* The wordcount counter in C: counts records per key and emits `<key> <count>` for every
 * record, exactly like the Rust counter (examples/wordcount/counter), with the same state
 * (`count`, a keyed u64 in bincode, schema 1), so savepoints move between the two.
 *
 * Build: bash guest-sdk/c/build.sh examples/wordcount/counter-c/counter.c target/c/counter_c.wasm */
#include <string.h>

#include "weir.h"

static const char *const STATES[] = { "count" };
const weir_operator_def WEIR_OPERATOR = { "wordcount-counter", "1.0.0-c", 1, NULL, 0, STATES, 1 };

int weir_on_record(weir_ctx *ctx, const weir_record *rec) {
    if (rec->value.len == 5 && memcmp(rec->value.ptr, "panic", 5) == 0) {
        weir_fail(ctx, "counter: failing on request (`panic`)");
        return 1;
    }
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
