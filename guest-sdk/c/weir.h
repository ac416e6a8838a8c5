/* Weir operators in C: the same WIT contract, record framing and keyed state layout as the
 * Rust SDK (see wit/operator.wit), so state written by an operator in one language restores
 * into the same schema in another.
 *
 * An operator defines WEIR_OPERATOR (name, version, schema, states) and weir_on_record();
 * the SDK (weir.c) implements the component's exports on top of the wit-bindgen C bindings
 * (gen/, generated from wit/ and committed). Keyed state values are byte strings in the
 * operator's own encoding (bincode 1 by contract: weir_u64_* for a u64), kept per key group
 * in open-addressing hash tables. Build with guest-sdk/c/build.sh. */
#ifndef WEIR_H
#define WEIR_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const uint8_t *ptr;
    size_t len;
} weir_bytes;

typedef struct {
    uint32_t key_group;
    int64_t timestamp;
    weir_bytes key;
    weir_bytes value;
} weir_record;

typedef struct weir_ctx weir_ctx;

typedef struct {
    const char *name;
    const char *version;
    uint32_t schema_version;
    const uint32_t *migrates_from; /* older schemas it migrates from */
    size_t migrates_from_len;
    const char *const *states; /* keyed value states */
    size_t states_len;
} weir_operator_def;

/* Provided by the operator. */
extern const weir_operator_def WEIR_OPERATOR;
/* One record; return 0, or call weir_fail() and return nonzero. */
int weir_on_record(weir_ctx *ctx, const weir_record *rec);
/* Converts a value of `state` written by schema `from` into this schema's encoding; write
 * it to *out (malloc'd) and return 0. Weak default: fails. */
int weir_migrate(const char *state, uint32_t from, weir_bytes in, uint8_t **out, size_t *out_len);

/* The value of state number `state` for the current record's key; .ptr == NULL if none. */
weir_bytes weir_get(weir_ctx *ctx, size_t state);
/* Sets it (the bytes are copied). */
void weir_put(weir_ctx *ctx, size_t state, const uint8_t *value, size_t len);
/* Emits (key, value) on the main output. */
void weir_emit(weir_ctx *ctx, const uint8_t *key, size_t klen, const uint8_t *value, size_t vlen);
/* Fails the current call with `message` (the host restarts the job from its checkpoint). */
void weir_fail(weir_ctx *ctx, const char *message);

/* bincode 1: u64 little-endian. */
static inline uint64_t weir_u64_decode(weir_bytes b) {
    uint64_t v = 0;
    for (size_t i = 0; i < 8 && i < b.len; i++) v |= (uint64_t)b.ptr[i] << (8 * i);
    return v;
}
static inline void weir_u64_encode(uint64_t v, uint8_t out[8]) {
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(v >> (8 * i));
}

/* Writes `v` in decimal to `out` (at least 20 bytes); returns the length. No stdio needed. */
static inline size_t weir_fmt_u64(uint64_t v, uint8_t *out) {
    char d[20];
    int i = 20;
    do { d[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    for (int j = i; j < 20; j++) out[j - i] = (uint8_t)d[j];
    return (size_t)(20 - i);
}

#endif
