/* Weir operators in C: the same WIT contract, record framing and keyed state layout as the
 * Rust SDK (see wit/operator.wit), so state written by an operator in one language restores
 * into the same schema in another.
 *
 * An operator defines WEIR_OPERATOR (name, version, schema, states, side outputs) and
 * weir_on_record(), optionally weir_on_open() and weir_on_timer(); the SDK (weir.c)
 * implements the component's exports on top of the wit-bindgen C bindings (gen/, generated
 * from wit/ and committed). Keyed state values are byte strings in the operator's own
 * encoding (bincode 1 by contract: weir_u64_* for a u64), kept per key group in
 * open-addressing hash tables. Tumbling event-time windows (weir_tumbling) keep a key's open
 * windows in one such value, laid out as the Rust SDK's `Windows<A>`. Build with
 * guest-sdk/c/build.sh. */
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
    const char *const *side_outputs; /* side output names: ports 1..=n (may be left out) */
    size_t side_outputs_len;
} weir_operator_def;

typedef enum {
    WEIR_EVENT_TIME = 0,      /* fires when the watermark reaches the timer's time */
    WEIR_PROCESSING_TIME = 1, /* fires when the host's clock does */
} weir_time_domain;

/* Provided by the operator. */
extern const weir_operator_def WEIR_OPERATOR;
/* One record; return 0, or call weir_fail() and return nonzero. */
int weir_on_record(weir_ctx *ctx, const weir_record *rec);
/* Optional (weak default: nothing). Called once before any record: read the config
 * (weir_config*), set up windows. Return 0, or call weir_fail() and return nonzero: the job
 * does not start, and the error says why. No key here: keyed state and timers are out. */
int weir_on_open(weir_ctx *ctx);
/* Optional (weak default: nothing). A timer of `timer->key` came due: `timer->timestamp` is
 * its time, `timer->key_group` and `timer->key` its key's (keyed state, emit and timers act
 * on that key), the value is empty. Return 0, or call weir_fail() and return nonzero. */
int weir_on_timer(weir_ctx *ctx, weir_time_domain domain, const weir_record *timer);
/* Converts a value of `state` written by schema `from` into this schema's encoding; write
 * it to *out (malloc'd) and return 0. Weak default: fails. */
int weir_migrate(const char *state, uint32_t from, weir_bytes in, uint8_t **out, size_t *out_len);

/* The config value of `key` from the job file's `config` table (NUL-terminated, valid as
 * long as the instance), or NULL when absent. */
const char *weir_config(weir_ctx *ctx, const char *key);
/* The config value of `key` as a decimal integer, or `fallback` when absent, in *out:
 * returns 0, or fails the call naming the key and value and returns nonzero. */
int weir_config_i64(weir_ctx *ctx, const char *key, int64_t fallback, int64_t *out);

/* The current key (the record's or the timer's). */
weir_bytes weir_key(const weir_ctx *ctx);
/* The value of state number `state` for the current key; .ptr == NULL if none. */
weir_bytes weir_get(weir_ctx *ctx, size_t state);
/* Sets it (the bytes are copied). */
void weir_put(weir_ctx *ctx, size_t state, const uint8_t *value, size_t len);
/* Removes it (nothing happens when there is none). */
void weir_remove(weir_ctx *ctx, size_t state);
/* Emits (key, value) on the main output, with the current record's (or timer's) timestamp. */
void weir_emit(weir_ctx *ctx, const uint8_t *key, size_t klen, const uint8_t *value, size_t vlen);
/* Emits (key, value) on the main output with event time `timestamp`. */
void weir_emit_at(weir_ctx *ctx, const uint8_t *key, size_t klen, const uint8_t *value, size_t vlen,
                  int64_t timestamp);
/* Emits (key, value) on the side output called `name` (declared in side_outputs), with the
 * current timestamp; returns 0, or fails the call and returns nonzero if it is not declared. */
int weir_emit_side(weir_ctx *ctx, const char *name, const uint8_t *key, size_t klen, const uint8_t *value,
                   size_t vlen);
/* Asks for weir_on_timer() for the current key when the watermark reaches `time`; the same
 * (key, time) twice fires once. */
void weir_register_event_timer(weir_ctx *ctx, int64_t time);
/* Cancels it (unknown timers are ignored). */
void weir_delete_event_timer(weir_ctx *ctx, int64_t time);
/* The watermark of the last on-watermark call (INT64_MIN before the first; a live upgrade's
 * new instance starts from the running one); the host fires the timers it makes due first. */
int64_t weir_watermark(const weir_ctx *ctx);
/* Fails the current call with `message` (the host restarts the job from its checkpoint). */
void weir_fail(weir_ctx *ctx, const char *message);

/* ---- Tumbling event-time windows ---------------------------------------------------------
 *
 * Windows of `size_ms`, half-open [start, end), starting at multiples of the size shifted by
 * `offset_ms` (negative timestamps too). A key's open windows and their accumulators live in
 * ONE keyed value state the operator declares, encoded as the Rust SDK's `Windows<A>`
 * (bincode `Vec<(Window, A)>`: u64 count, then per window i64 start, i64 end and the
 * accumulator's `acc_size` bytes), so the accumulator must be a fixed-width bincode value
 * (e.g. a struct of uint64_t / int64_t fields: little-endian, no padding).
 *
 * A window fires (`fire`) when the watermark reaches its last millisecond, end - 1, and again
 * for every record added within `lateness_ms` after that; it is removed when the watermark
 * reaches end - 1 + lateness_ms, and a key without windows has no state. A record whose
 * window is already removed is late: dropped, or emitted as it came to `late_output`.
 *
 *   static weir_tumbling counts;                       // in weir_on_open:
 *   counts = (weir_tumbling){ .state = 0, .size_ms = 60000, .lateness_ms = 5000,
 *                             .late_output = "late", .acc_size = 8, .add = add, .fire = fire };
 *   return weir_tumbling_open(ctx, &counts);
 *   // weir_on_record:  return weir_tumbling_add(ctx, &counts, rec, NULL) < 0;
 *   // weir_on_timer:   return weir_tumbling_on_timer(ctx, &counts, domain) < 0;
 *
 * The callbacks must not touch the windows' state themselves. */

/* One window, [start, end) in event-time milliseconds; complete at end - 1. */
typedef struct {
    int64_t start;
    int64_t end;
} weir_window;

typedef struct {
    size_t state;        /* index in WEIR_OPERATOR.states of the keyed value state holding them */
    int64_t size_ms;     /* > 0 */
    int64_t offset_ms;   /* |offset_ms| < size_ms */
    int64_t lateness_ms; /* allowed lateness, >= 0 */
    const char *late_output; /* side output for late records (declared), or NULL: dropped */
    size_t acc_size;     /* bytes of one accumulator */
    /* A new window's accumulator (acc_size bytes, aligned); NULL: all zero bytes. */
    void (*init)(void *acc);
    /* Adds `rec` to a window's accumulator; `arg` is what weir_tumbling_add was given. */
    void (*add)(void *acc, const weir_record *rec, void *arg);
    /* A window is complete (or changed after it was): emit its result (weir_key() is its key). */
    void (*fire)(weir_ctx *ctx, weir_window w, const void *acc);
    uint32_t late_port; /* set by weir_tumbling_open */
} weir_tumbling;

/* Checks the definition (call from weir_on_open): returns 0, or fails the call with what is
 * wrong (a size that is not positive, a negative lateness, an undeclared state or late
 * output) and returns nonzero. */
int weir_tumbling_open(weir_ctx *ctx, weir_tumbling *t);
/* Adds `rec` to its window (with the current key). Returns 1 when a window took it, 0 when it
 * was late, -1 when the call failed (the key's state is not windows). */
int weir_tumbling_add(weir_ctx *ctx, const weir_tumbling *t, const weir_record *rec, void *arg);
/* Call from weir_on_timer(): fires the current key's windows ending at the timer and removes
 * those past their lateness. Processing-time timers are not the windows': ignored. Returns 0,
 * or -1 when the call failed. */
int weir_tumbling_on_timer(weir_ctx *ctx, const weir_tumbling *t, weir_time_domain domain);

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

/* Writes `v` in decimal (with a leading '-' when negative) to `out` (at least 20 bytes);
 * returns the length. */
static inline size_t weir_fmt_i64(int64_t v, uint8_t *out) {
    if (v >= 0) return weir_fmt_u64((uint64_t)v, out);
    out[0] = '-';
    return 1 + weir_fmt_u64(0 - (uint64_t)v, out + 1);
}

#endif
