/* Word counter v2 in C: the same state schema 2 as the Rust v2 (examples/upgrade/counter-v2):
 * `count` = (u64 n, i64 first_seen) in bincode (16 bytes), migrated from schema 1 (a bare
 * u64) with first_seen = INT64_MIN. */
#include <stdlib.h>
#include <string.h>

#include "weir.h"

static const char *const STATES[] = { "count" };
static const uint32_t MIGRATES_FROM[] = { 1 };
const weir_operator_def WEIR_OPERATOR = { "wordcount-counter", "2.0.0-c", 2, MIGRATES_FROM, 1, STATES, 1 };

int weir_migrate(const char *state, uint32_t from, weir_bytes in, uint8_t **out, size_t *out_len) {
    if (strcmp(state, "count") != 0 || from != 1 || in.len != 8) return 1;
    *out = malloc(16);
    memcpy(*out, in.ptr, 8);
    weir_u64_encode((uint64_t)INT64_MIN, *out + 8);
    *out_len = 16;
    return 0;
}

int weir_on_record(weir_ctx *ctx, const weir_record *rec) {
    weir_bytes old = weir_get(ctx, 0);
    uint8_t v[16];
    uint64_t n;
    if (old.ptr && old.len == 16) {
        memcpy(v, old.ptr, 16);
        n = weir_u64_decode(old) + 1;
    } else {
        n = 1;
        weir_u64_encode((uint64_t)rec->timestamp, v + 8);
    }
    weir_u64_encode(n, v);
    weir_put(ctx, 0, v, 16);
    uint8_t value[512];
    size_t klen = rec->key.len < 480 ? rec->key.len : 480;
    memcpy(value, rec->key.ptr, klen);
    value[klen] = ' ';
    weir_emit(ctx, rec->key.ptr, rec->key.len, value, klen + 1 + weir_fmt_u64(n, value + klen + 1));
    return 0;
}
