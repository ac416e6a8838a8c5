/* The windows under test (tests/guests/windows) in C, tumbling only: the input is file lines
 * `key,timestamp,value`; config `size_ms`, `offset_ms`, `lateness_ms` and `aggregate` (`count`,
 * or `sum` of the values). Each firing emits `<key> <start> <end> <result>` at the window's
 * last millisecond; late records go to the `late` side output as they came. tests/all/
 * lang_windows.rs checks it against the same reference as the Rust operator.
 *
 * Build: bash guest-sdk/c/build.sh tests/guests/windows/windows-c/windows.c target/c/windows_c.wasm */
#include <string.h>

#include "weir.h"

/* bincode (u64, i64): the accumulator of every window. */
typedef struct {
    uint64_t count;
    int64_t sum;
} acc_t;

static const char *const STATES[] = { "windows" };
static const char *const SIDE_OUTPUTS[] = { "late" };
const weir_operator_def WEIR_OPERATOR = { "test-windows", "1.0.0-c", 1, NULL, 0, STATES, 1, SIDE_OUTPUTS, 1 };

static weir_tumbling windows;
static int sum; /* aggregate = sum (else count) */

static void add(void *acc, const weir_record *rec, void *arg) {
    (void)rec;
    acc_t *a = acc;
    a->count++;
    a->sum += *(const int64_t *)arg;
}

static void fire(weir_ctx *ctx, weir_window w, const void *acc) {
    const acc_t *a = acc;
    weir_bytes key = weir_key(ctx);
    uint8_t line[512];
    size_t klen = key.len < 400 ? key.len : 400, n = klen;
    memcpy(line, key.ptr, klen);
    line[n++] = ' ';
    n += weir_fmt_i64(w.start, line + n);
    line[n++] = ' ';
    n += weir_fmt_i64(w.end, line + n);
    line[n++] = ' ';
    n += sum ? weir_fmt_i64(a->sum, line + n) : weir_fmt_u64(a->count, line + n);
    weir_emit_at(ctx, key.ptr, key.len, line, n, w.end - 1);
}

int weir_on_open(weir_ctx *ctx) {
    /* Tests of the SDK's own checks: keyed state without a current key must trap, clearly. */
    const char *misuse = weir_config(ctx, "misuse");
    if (misuse && strcmp(misuse, "state_in_open") == 0) (void)weir_get(ctx, 0);
    const char *kind = weir_config(ctx, "kind");
    const char *aggregate = weir_config(ctx, "aggregate");
    if (kind && strcmp(kind, "tumbling") != 0) {
        weir_fail(ctx, "the C windows under test are tumbling only: use kind = `tumbling`");
        return 1;
    }
    if (aggregate && strcmp(aggregate, "count") != 0 && strcmp(aggregate, "sum") != 0) {
        weir_fail(ctx, "aggregate: use count or sum");
        return 1;
    }
    sum = aggregate && strcmp(aggregate, "sum") == 0;
    int64_t size, offset, lateness;
    if (weir_config_i64(ctx, "size_ms", 10, &size) || weir_config_i64(ctx, "offset_ms", 0, &offset) ||
        weir_config_i64(ctx, "lateness_ms", 0, &lateness))
        return 1;
    windows = (weir_tumbling){
        .state = 0,
        .size_ms = size,
        .offset_ms = offset,
        .lateness_ms = lateness,
        .late_output = "late",
        .acc_size = sizeof(acc_t),
        .add = add,
        .fire = fire,
    };
    return weir_tumbling_open(ctx, &windows);
}

/* The third column of `key,timestamp,value`, as an integer: 0 and *n set, or nonzero. */
static int value_of(weir_bytes line, int64_t *n) {
    size_t i = 0, commas = 0;
    while (i < line.len && commas < 2) commas += line.ptr[i++] == ',';
    while (i < line.len && line.ptr[i] == ' ') i++;
    int neg = i < line.len && line.ptr[i] == '-';
    i += neg;
    size_t digits = 0;
    int64_t v = 0;
    for (; i < line.len && line.ptr[i] >= '0' && line.ptr[i] <= '9' && digits < 18; i++, digits++)
        v = v * 10 + (line.ptr[i] - '0');
    while (i < line.len && line.ptr[i] == ' ') i++;
    if (digits == 0 || (i < line.len && line.ptr[i] != ',')) return 1;
    *n = neg ? -v : v;
    return 0;
}

int weir_on_record(weir_ctx *ctx, const weir_record *rec) {
    int64_t n = 0;
    if (sum && value_of(rec->value, &n)) {
        weir_fail(ctx, "the value column is not an integer");
        return 1;
    }
    return weir_tumbling_add(ctx, &windows, rec, &n) < 0;
}

int weir_on_timer(weir_ctx *ctx, weir_time_domain domain, const weir_record *timer) {
    (void)timer;
    return weir_tumbling_on_timer(ctx, &windows, domain) < 0;
}
