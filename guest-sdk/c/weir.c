/* The Weir C SDK: the component's exports on top of the wit-bindgen C bindings (gen/).
 * See weir.h. Arguments of exports are owned here and freed; returned data is malloc'd and
 * freed by the bindings after the call. Tumbling windows are at the end: the per-key rules of
 * the Rust SDK's `window::book` applied to one keyed value in place. */
#include <stdlib.h>
#include <string.h>

#include "gen/operator.h"
#include "table.h"
#include "weir.h"

struct weir_ctx {
    const weir_record *rec;
    const char *error;
};

static weir_operator_types_task_info_t g_task;
static weir_table *g_tables; /* [state * groups + group] */
static size_t g_groups;
static uint8_t *g_out;
static size_t g_out_len, g_out_cap;
/* The watermark of the last on-watermark call: what windows decide lateness by (the host
 * fires the timers a watermark makes due before it calls on-watermark). */
static int64_t g_watermark = INT64_MIN;
typedef struct { char *key, *value; } config_entry;
static config_entry *g_config;
static size_t g_config_len;

__attribute__((weak)) int weir_migrate(const char *state, uint32_t from, weir_bytes in, uint8_t **out,
                                       size_t *out_len) {
    (void)state; (void)from; (void)in; (void)out; (void)out_len;
    return 1;
}

__attribute__((weak)) int weir_on_open(weir_ctx *ctx) {
    (void)ctx;
    return 0;
}

__attribute__((weak)) int weir_on_timer(weir_ctx *ctx, weir_time_domain domain, const weir_record *timer) {
    (void)ctx; (void)domain; (void)timer;
    return 0;
}

static void out_reserve(size_t n) {
    if (g_out_len + n <= g_out_cap) return;
    size_t cap = g_out_cap ? g_out_cap * 2 : 65536;
    while (cap < g_out_len + n) cap *= 2;
    g_out = realloc(g_out, cap);
    g_out_cap = cap;
}
static void out_u32(uint32_t v) { out_reserve(4); memcpy(g_out + g_out_len, &v, 4); g_out_len += 4; }
static void out_bytes(const uint8_t *p, size_t n) { out_reserve(n); memcpy(g_out + g_out_len, p, n); g_out_len += n; }

static void set_err(operator_string_t *err, const char *msg) { operator_string_dup(err, msg); }

/* `record <index>: <msg>`: names the failing record's position in the batch, which the host
 * turns into its key, timestamp and origin (see wit/operator.wit). No stdio. */
static void set_record_err(operator_string_t *err, uint32_t index, const char *msg) {
    size_t mlen = strlen(msg);
    uint8_t *s = malloc(7 + 20 + 2 + mlen);
    memcpy(s, "record ", 7);
    size_t len = 7 + weir_fmt_u64(index, s + 7);
    s[len++] = ':';
    s[len++] = ' ';
    memcpy(s + len, msg, mlen);
    operator_string_dup_n(err, (const char *)s, len + mlen);
    free(s);
}

/* Error messages without stdio (which would import WASI): appends strings and numbers. */
static char g_msg[512];
static size_t g_msg_len;
static void msg_reset(void) { g_msg_len = 0; g_msg[0] = 0; }
static void msg_str(const char *s, size_t n) {
    if (n > sizeof g_msg - 1 - g_msg_len) n = sizeof g_msg - 1 - g_msg_len;
    memcpy(g_msg + g_msg_len, s, n);
    g_msg_len += n;
    g_msg[g_msg_len] = 0;
}
static void msg_cstr(const char *s) { msg_str(s, strlen(s)); }
static void msg_u32(uint32_t v) {
    char d[10];
    int i = 10;
    do { d[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    msg_str(d + i, (size_t)(10 - i));
}
static void msg_i64(int64_t v) {
    uint8_t d[20];
    msg_str((const char *)d, weir_fmt_i64(v, d));
}

/* A bug in the operator: logs `message` (the host shows the last error line with the trap) and
 * traps, as a Rust operator's panic does; never touches memory it should not. */
static _Noreturn void weir_fatal(const char *message) {
    operator_string_t m;
    operator_string_set(&m, message);
    weir_operator_logging_log(WEIR_OPERATOR_LOGGING_LEVEL_ERROR, &m);
    __builtin_trap();
}

/* The table of keyed state `state` for `key_group`: both checked, so a record without a key
 * group (not hash-partitioned) or an undeclared state traps instead of reaching another key
 * group's (or no) table. */
static weir_table *table(size_t state, uint32_t key_group) {
    if (state >= WEIR_OPERATOR.states_len)
        weir_fatal("keyed state index out of range: declare it in WEIR_OPERATOR.states");
    if (key_group < g_task.key_group_start || key_group >= g_task.key_group_end)
        weir_fatal("keyed state used for a record without a key group of this subtask: give the operator's "
                   "inputs partition = \"hash\"");
    return &g_tables[state * g_groups + (key_group - g_task.key_group_start)];
}

/* The current record's table of `state` (keyed state needs a current record: not in open). */
static weir_table *keyed(const weir_ctx *ctx, size_t state) {
    if (!ctx->rec) weir_fatal("keyed state used outside a record or timer (e.g. in weir_on_open): there is no current key");
    return table(state, ctx->rec->key_group);
}

static char *dup_n(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

const char *weir_config(weir_ctx *ctx, const char *key) {
    (void)ctx;
    for (size_t i = 0; i < g_config_len; i++)
        if (strcmp(g_config[i].key, key) == 0) return g_config[i].value;
    return NULL;
}

int weir_config_i64(weir_ctx *ctx, const char *key, int64_t fallback, int64_t *out) {
    const char *v = weir_config(ctx, key);
    if (!v) {
        *out = fallback;
        return 0;
    }
    const char *p = v;
    int neg = *p == '-';
    if (*p == '-' || *p == '+') p++;
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, n = 0;
    if (!*p) goto bad;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') goto bad;
        uint64_t d = (uint64_t)(*p - '0');
        if (n > (limit - d) / 10) goto bad;
        n = n * 10 + d;
    }
    *out = neg ? (int64_t)(0 - n) : (int64_t)n;
    return 0;
bad:
    msg_reset();
    msg_cstr("config `"); msg_cstr(key); msg_cstr("` = `"); msg_cstr(v);
    msg_cstr("` is invalid: not a 64-bit integer");
    weir_fail(ctx, g_msg);
    return 1;
}

weir_bytes weir_key(const weir_ctx *ctx) {
    weir_bytes none = { NULL, 0 };
    return ctx->rec ? ctx->rec->key : none;
}

weir_bytes weir_get(weir_ctx *ctx, size_t state) {
    weir_entry *e = weir_table_find(keyed(ctx, state), ctx->rec->key.ptr, ctx->rec->key.len);
    weir_bytes b = { e ? e->val : NULL, e ? e->vlen : 0 };
    return b;
}

void weir_put(weir_ctx *ctx, size_t state, const uint8_t *value, size_t len) {
    weir_table_put(keyed(ctx, state), ctx->rec->key.ptr, ctx->rec->key.len, value, len);
}

void weir_remove(weir_ctx *ctx, size_t state) {
    weir_table_remove(keyed(ctx, state), ctx->rec->key.ptr, ctx->rec->key.len);
}

static void emit_port(uint32_t port, int64_t ts, const uint8_t *key, size_t klen, const uint8_t *value,
                      size_t vlen) {
    out_u32(port);
    out_reserve(8); memcpy(g_out + g_out_len, &ts, 8); g_out_len += 8;
    out_u32((uint32_t)klen);
    out_u32((uint32_t)vlen);
    out_bytes(key, klen);
    out_bytes(value, vlen);
}

void weir_emit(weir_ctx *ctx, const uint8_t *key, size_t klen, const uint8_t *value, size_t vlen) {
    emit_port(0, ctx->rec ? ctx->rec->timestamp : 0, key, klen, value, vlen);
}

void weir_emit_at(weir_ctx *ctx, const uint8_t *key, size_t klen, const uint8_t *value, size_t vlen,
                  int64_t timestamp) {
    (void)ctx;
    emit_port(0, timestamp, key, klen, value, vlen);
}

/* The port of side output `name` (1-based), or 0 when it is not declared. */
static uint32_t side_port(const char *name) {
    for (size_t i = 0; i < WEIR_OPERATOR.side_outputs_len; i++)
        if (strcmp(WEIR_OPERATOR.side_outputs[i], name) == 0) return (uint32_t)i + 1;
    return 0;
}

int weir_emit_side(weir_ctx *ctx, const char *name, const uint8_t *key, size_t klen, const uint8_t *value,
                   size_t vlen) {
    uint32_t port = side_port(name);
    if (!port) {
        msg_reset();
        msg_cstr("side output `"); msg_cstr(name); msg_cstr("` is not declared in WEIR_OPERATOR.side_outputs");
        weir_fail(ctx, g_msg);
        return 1;
    }
    emit_port(port, ctx->rec ? ctx->rec->timestamp : 0, key, klen, value, vlen);
    return 0;
}

void weir_register_event_timer(weir_ctx *ctx, int64_t time) {
    operator_list_u8_t key = { (uint8_t *)ctx->rec->key.ptr, ctx->rec->key.len };
    weir_operator_timers_register(WEIR_OPERATOR_TYPES_TIME_DOMAIN_EVENT_TIME, ctx->rec->key_group, &key, time);
}

void weir_delete_event_timer(weir_ctx *ctx, int64_t time) {
    operator_list_u8_t key = { (uint8_t *)ctx->rec->key.ptr, ctx->rec->key.len };
    weir_operator_timers_delete(WEIR_OPERATOR_TYPES_TIME_DOMAIN_EVENT_TIME, ctx->rec->key_group, &key, time);
}

int64_t weir_watermark(const weir_ctx *ctx) {
    (void)ctx;
    return g_watermark;
}

void weir_fail(weir_ctx *ctx, const char *message) { ctx->error = message; }

static void flush(void) {
    if (g_out_len == 0) return;
    operator_list_u8_t b = { g_out, g_out_len };
    weir_operator_collector_emit_batch(&b);
    g_out_len = 0;
}

void exports_operator_describe(operator_operator_info_t *ret) {
    const weir_operator_def *d = &WEIR_OPERATOR;
    operator_string_dup(&ret->name, d->name);
    operator_string_dup(&ret->version, d->version);
    ret->state_schema_version = d->schema_version;
    ret->migrates_from.len = d->migrates_from_len;
    ret->migrates_from.ptr = malloc(sizeof(uint32_t) * (d->migrates_from_len ? d->migrates_from_len : 1));
    memcpy(ret->migrates_from.ptr, d->migrates_from, sizeof(uint32_t) * d->migrates_from_len);
    ret->states.len = d->states_len;
    ret->states.ptr = calloc(d->states_len ? d->states_len : 1, sizeof(weir_operator_types_state_descriptor_t));
    for (size_t i = 0; i < d->states_len; i++) {
        operator_string_dup(&ret->states.ptr[i].name, d->states[i]);
        ret->states.ptr[i].kind = WEIR_OPERATOR_TYPES_STATE_KIND_VALUE;
        ret->states.ptr[i].keyed = true;
        ret->states.ptr[i].redistribution = WEIR_OPERATOR_TYPES_REDISTRIBUTION_NONE;
    }
    size_t sides = d->side_outputs ? d->side_outputs_len : 0;
    ret->side_outputs.len = sides;
    ret->side_outputs.ptr = calloc(sides ? sides : 1, sizeof(operator_string_t));
    for (size_t i = 0; i < sides; i++) operator_string_dup(&ret->side_outputs.ptr[i], d->side_outputs[i]);
}

bool exports_operator_setup(operator_list_tuple2_string_string_t *config, operator_string_t *err) {
    g_config_len = config->len;
    g_config = calloc(config->len ? config->len : 1, sizeof(config_entry));
    for (size_t i = 0; i < config->len; i++) {
        g_config[i].key = dup_n(config->ptr[i].f0.ptr, config->ptr[i].f0.len);
        g_config[i].value = dup_n(config->ptr[i].f1.ptr, config->ptr[i].f1.len);
    }
    operator_list_tuple2_string_string_free(config);
    weir_operator_context_task(&g_task);
    /* A live upgrade's new instance opens mid-stream: the running watermark. */
    g_watermark = weir_operator_context_current_watermark();
    g_groups = g_task.key_group_end - g_task.key_group_start;
    g_tables = calloc(WEIR_OPERATOR.states_len * g_groups + 1, sizeof(weir_table));
    weir_ctx ctx = { NULL, NULL };
    int r = weir_on_open(&ctx);
    flush();
    if (r != 0) {
        set_err(err, ctx.error ? ctx.error : "the operator failed to open");
        return false;
    }
    return true;
}

/* Reads the record at *pos of a batch (see "Record framing" in wit/operator.wit); 0 at the end. */
static int next_record(const uint8_t *p, size_t n, size_t *pos, weir_record *r) {
    uint32_t klen, vlen;
    if (*pos + 20 > n) return 0;
    memcpy(&r->key_group, p + *pos, 4);
    memcpy(&r->timestamp, p + *pos + 4, 8);
    memcpy(&klen, p + *pos + 12, 4);
    memcpy(&vlen, p + *pos + 16, 4);
    r->key.ptr = p + *pos + 20;
    r->key.len = klen;
    r->value.ptr = p + *pos + 20 + klen;
    r->value.len = vlen;
    *pos += 20 + (size_t)klen + vlen;
    return 1;
}

bool exports_operator_process(operator_list_u8_t *batch, operator_string_t *err) {
    size_t pos = 0;
    weir_ctx ctx = { NULL, NULL };
    bool ok = true;
    uint32_t index = 0;
    weir_record r;
    while (next_record(batch->ptr, batch->len, &pos, &r)) {
        ctx.rec = &r;
        if (weir_on_record(&ctx, &r) != 0) {
            set_record_err(err, index, ctx.error ? ctx.error : "the operator failed");
            ok = false;
            break;
        }
        index++;
    }
    operator_list_u8_free(batch);
    flush();
    return ok;
}

bool exports_operator_on_timer(operator_time_domain_t domain, operator_list_u8_t *timers, operator_string_t *err) {
    size_t pos = 0;
    weir_ctx ctx = { NULL, NULL };
    bool ok = true;
    weir_record r;
    while (next_record(timers->ptr, timers->len, &pos, &r)) {
        ctx.rec = &r;
        if (weir_on_timer(&ctx, (weir_time_domain)domain, &r) != 0) {
            set_err(err, ctx.error ? ctx.error : "the operator failed on a timer");
            ok = false;
            break;
        }
    }
    operator_list_u8_free(timers);
    flush();
    return ok;
}

bool exports_operator_on_watermark(int64_t watermark, operator_string_t *err) {
    (void)err;
    g_watermark = watermark;
    return true;
}

/* Appends u32 + bytes to a growable buffer. */
typedef struct { uint8_t *p; size_t len, cap; } buf_t;
static void buf_put(buf_t *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n) cap *= 2;
        b->p = realloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void buf_u32(buf_t *b, uint32_t v) { buf_put(b, &v, 4); }

bool exports_operator_snapshot(uint64_t checkpoint_id, operator_snapshot_mode_t mode, operator_operator_snapshot_t *ret,
                               operator_string_t *err) {
    (void)checkpoint_id; (void)mode; (void)err;
    const weir_operator_def *d = &WEIR_OPERATOR;
    ret->keyed.ptr = calloc(g_groups ? g_groups : 1, sizeof(weir_operator_types_key_group_state_t));
    ret->keyed.len = 0;
    for (size_t g = 0; g < g_groups; g++) {
        size_t total = 0;
        for (size_t s = 0; s < d->states_len; s++) total += g_tables[s * g_groups + g].len;
        if (total == 0) continue;
        buf_t b = { NULL, 0, 0 };
        buf_u32(&b, (uint32_t)d->states_len);
        for (size_t s = 0; s < d->states_len; s++) {
            weir_table *t = &g_tables[s * g_groups + g];
            uint32_t nl = (uint32_t)strlen(d->states[s]);
            buf_u32(&b, nl);
            buf_put(&b, d->states[s], nl);
            buf_u32(&b, (uint32_t)t->len);
            for (size_t i = 0; i < t->cap; i++) {
                weir_entry *e = &t->slots[i];
                if (!e->used) continue;
                buf_u32(&b, (uint32_t)e->klen);
                buf_put(&b, e->key, e->klen);
                buf_u32(&b, (uint32_t)e->vlen);
                buf_put(&b, e->val, e->vlen);
            }
        }
        weir_operator_types_key_group_state_t *k = &ret->keyed.ptr[ret->keyed.len++];
        k->key_group = g_task.key_group_start + (uint32_t)g;
        k->data.ptr = b.p;
        k->data.len = b.len;
    }
    ret->operator_state.ptr = NULL;
    ret->operator_state.len = 0;
    return true;
}

static int rd_u32(const uint8_t *p, size_t n, size_t *pos, uint32_t *v) {
    if (*pos + 4 > n) return 1;
    memcpy(v, p + *pos, 4);
    *pos += 4;
    return 0;
}

bool exports_operator_restore(uint32_t schema_version, operator_operator_snapshot_t *state, operator_string_t *err) {
    const weir_operator_def *d = &WEIR_OPERATOR;
    int migrate = 0;
    bool ok = true;
    if (schema_version != d->schema_version) {
        for (size_t i = 0; i < d->migrates_from_len; i++) migrate |= d->migrates_from[i] == schema_version;
        if (!migrate) {
            msg_reset();
            msg_cstr("`"); msg_cstr(d->name); msg_cstr("` "); msg_cstr(d->version);
            msg_cstr(" writes state schema "); msg_u32(d->schema_version);
            msg_cstr("; it cannot restore state of schema "); msg_u32(schema_version);
            set_err(err, g_msg);
            ok = false;
        }
    }
    for (size_t i = 0; ok && i < state->keyed.len; i++) {
        weir_operator_types_key_group_state_t *k = &state->keyed.ptr[i];
        const uint8_t *p = k->data.ptr;
        size_t n = k->data.len, pos = 0;
        uint32_t states, nl, entries, kl, vl;
        if (n == 0) continue;
        if (k->key_group < g_task.key_group_start || k->key_group >= g_task.key_group_end) {
            set_err(err, "restore handed a key group this subtask does not own");
            ok = false;
            break;
        }
        if (rd_u32(p, n, &pos, &states)) goto corrupt;
        for (uint32_t s = 0; s < states; s++) {
            if (rd_u32(p, n, &pos, &nl) || pos + nl > n) goto corrupt;
            size_t idx = d->states_len;
            for (size_t j = 0; j < d->states_len; j++)
                if (strlen(d->states[j]) == nl && memcmp(d->states[j], p + pos, nl) == 0) idx = j;
            if (idx == d->states_len) {
                msg_reset();
                msg_cstr("the snapshot holds keyed state `"); msg_str((const char *)(p + pos), nl);
                msg_cstr("`, which `"); msg_cstr(d->name); msg_cstr("` does not declare");
                set_err(err, g_msg);
                ok = false;
                break;
            }
            pos += nl;
            if (rd_u32(p, n, &pos, &entries)) goto corrupt;
            for (uint32_t e = 0; e < entries; e++) {
                if (rd_u32(p, n, &pos, &kl) || pos + kl > n) goto corrupt;
                const uint8_t *key = p + pos;
                pos += kl;
                if (rd_u32(p, n, &pos, &vl) || pos + vl > n) goto corrupt;
                const uint8_t *val = p + pos;
                pos += vl;
                weir_table *t = &g_tables[idx * g_groups + (k->key_group - g_task.key_group_start)];
                if (migrate) {
                    uint8_t *nv = NULL;
                    size_t nvl = 0;
                    weir_bytes in = { val, vl };
                    if (weir_migrate(d->states[idx], schema_version, in, &nv, &nvl) != 0) {
                        msg_reset();
                        msg_cstr("`"); msg_cstr(d->name); msg_cstr("` cannot migrate state `");
                        msg_cstr(d->states[idx]); msg_cstr("` from schema "); msg_u32(schema_version);
                        set_err(err, g_msg);
                        ok = false;
                        break;
                    }
                    weir_table_put(t, key, kl, nv, nvl);
                    free(nv);
                } else {
                    weir_table_put(t, key, kl, val, vl);
                }
            }
            if (!ok) break;
        }
        continue;
    corrupt:
        set_err(err, "corrupt state blob: truncated");
        ok = false;
        break;
    }
    operator_operator_snapshot_free(state);
    return ok;
}

bool exports_operator_finish(operator_string_t *err) {
    (void)err;
    flush();
    return true;
}

/* ---- Tumbling windows ------------------------------------------------------------------
 * A key's windows are one value of state `t->state`: u64 n, then n x { i64 start, i64 end,
 * acc_size bytes }, sorted by (start, end) (bincode of the Rust SDK's `Vec<(Window, A)>`).
 * Rules as `guest-sdk/src/window/book.rs`: a window takes records until the watermark reaches
 * its cleanup time end - 1 + lateness; it has a timer at end - 1 (unless the watermark is
 * already there: then each record fires it at once) and one at its cleanup time. */

enum { WINDOW_HEAD = 16 }; /* i64 start, i64 end */

static uint8_t *g_acc; /* an aligned copy of the accumulator the callbacks see */
static size_t g_acc_cap;

static int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

static int64_t get_i64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }
static void put_i64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }

/* The window holding `ts`: start = ts - ((ts - offset) mod size), Euclidean (negative
 * timestamps too), end = start + size (saturating), without overflowing on the way. */
static weir_window tumbling_assign(const weir_tumbling *t, int64_t ts) {
    int64_t size = t->size_ms, a = ts % size, b = t->offset_ms % size;
    if (a < 0) a += size;
    if (b < 0) b += size;
    int64_t r = a - b;
    if (r < 0) r += size;
    weir_window w;
    if (__builtin_sub_overflow(ts, r, &w.start)) w.start = INT64_MIN;
    w.end = sat_add(w.start, size);
    return w;
}

static int64_t cleanup_time(const weir_tumbling *t, int64_t end) { return sat_add(end - 1, t->lateness_ms); }

int weir_tumbling_open(weir_ctx *ctx, weir_tumbling *t) {
    const weir_operator_def *d = &WEIR_OPERATOR;
    msg_reset();
    if (t->size_ms <= 0) {
        msg_cstr("a tumbling window's size must be positive, not "); msg_i64(t->size_ms); msg_cstr(" ms");
    } else if (t->offset_ms <= -t->size_ms || t->offset_ms >= t->size_ms) {
        msg_cstr("a tumbling window's offset ("); msg_i64(t->offset_ms);
        msg_cstr(" ms) must be smaller than its size ("); msg_i64(t->size_ms); msg_cstr(" ms)");
    } else if (t->lateness_ms < 0) {
        msg_cstr("allowed lateness must be 0 or more, not "); msg_i64(t->lateness_ms); msg_cstr(" ms");
    } else if (t->state >= d->states_len) {
        msg_cstr("windows: state number "); msg_u32((uint32_t)t->state); msg_cstr(" is not declared in `");
        msg_cstr(d->name); msg_cstr("`'s WEIR_OPERATOR.states");
    } else if (!t->add || !t->fire) {
        msg_cstr("windows `"); msg_cstr(d->states[t->state]); msg_cstr("`: `add` and `fire` are required");
    } else if (t->late_output && !(t->late_port = side_port(t->late_output))) {
        msg_cstr("late records go to side output `"); msg_cstr(t->late_output); msg_cstr("`, which `");
        msg_cstr(d->name); msg_cstr("` does not declare in WEIR_OPERATOR.side_outputs");
    }
    if (g_msg_len) {
        weir_fail(ctx, g_msg);
        return 1;
    }
    if (!g_acc || t->acc_size > g_acc_cap) {
        free(g_acc);
        g_acc_cap = t->acc_size ? t->acc_size : 1;
        g_acc = malloc(g_acc_cap);
    }
    return 0;
}

/* The number of windows in `e`, checked against its length; 0, or fails the call. */
static int windows_in(weir_ctx *ctx, const weir_tumbling *t, const weir_entry *e, size_t *n) {
    size_t item = WINDOW_HEAD + t->acc_size;
    uint64_t count = e->vlen >= 8 ? (uint64_t)get_i64(e->val) : 0;
    if (e->vlen < 8 || count > (e->vlen - 8) / item || e->vlen != 8 + count * item) {
        msg_reset();
        msg_cstr("state `"); msg_cstr(WEIR_OPERATOR.states[t->state]);
        msg_cstr("` of this key does not hold windows with accumulators of "); msg_u32((uint32_t)t->acc_size);
        msg_cstr(" bytes");
        weir_fail(ctx, g_msg);
        return 1;
    }
    *n = (size_t)count;
    return 0;
}

int weir_tumbling_add(weir_ctx *ctx, const weir_tumbling *t, const weir_record *rec, void *arg) {
    weir_window w = tumbling_assign(t, rec->timestamp);
    int64_t fire_at = w.end - 1, cleanup = cleanup_time(t, w.end), wm = g_watermark;
    if (cleanup <= wm) {
        if (t->late_output) emit_port(t->late_port, rec->timestamp, rec->key.ptr, rec->key.len, rec->value.ptr,
                                      rec->value.len);
        return 0;
    }
    weir_table *tb = keyed(ctx, t->state);
    weir_bytes key = weir_key(ctx);
    size_t item = WINDOW_HEAD + t->acc_size, n = 0, lo = 0, hi;
    weir_entry *e = weir_table_find(tb, key.ptr, key.len);
    if (e && windows_in(ctx, t, e, &n)) return -1;
    /* Binary search by (start, end): lo = the window's place. */
    for (hi = n; lo < hi;) {
        size_t mid = lo + (hi - lo) / 2;
        const uint8_t *m = e->val + 8 + mid * item;
        int64_t s = get_i64(m), en = get_i64(m + 8);
        if (s < w.start || (s == w.start && en < w.end)) lo = mid + 1;
        else hi = mid;
    }
    int found = lo < n && get_i64(e->val + 8 + lo * item) == w.start && get_i64(e->val + 8 + lo * item + 8) == w.end;
    if (found) memcpy(g_acc, e->val + 8 + lo * item + WINDOW_HEAD, t->acc_size);
    else if (t->init) t->init(g_acc);
    else memset(g_acc, 0, t->acc_size);
    t->add(g_acc, rec, arg);
    if (!found) {
        e = weir_table_reserve(tb, key.ptr, key.len, 8 + (n + 1) * item);
        uint8_t *at = e->val + 8 + lo * item;
        memmove(at + item, at, (n - lo) * item);
        put_i64(at, w.start);
        put_i64(at + 8, w.end);
        put_i64(e->val, (int64_t)(n + 1));
        if (fire_at > wm) weir_register_event_timer(ctx, fire_at);
        if (cleanup != fire_at) weir_register_event_timer(ctx, cleanup);
    }
    memcpy(e->val + 8 + lo * item + WINDOW_HEAD, g_acc, t->acc_size);
    /* Past its end, within lateness: the record changed a fired window; fire it again. */
    if (fire_at <= wm) t->fire(ctx, w, g_acc);
    return 1;
}

int weir_tumbling_on_timer(weir_ctx *ctx, const weir_tumbling *t, weir_time_domain domain) {
    if (domain != WEIR_EVENT_TIME) return 0;
    int64_t time = ctx->rec->timestamp;
    weir_table *tb = keyed(ctx, t->state);
    weir_bytes key = weir_key(ctx);
    weir_entry *e = weir_table_find(tb, key.ptr, key.len);
    size_t item = WINDOW_HEAD + t->acc_size, n, kept = 0;
    if (!e) return 0;
    if (windows_in(ctx, t, e, &n)) return -1;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *at = e->val + 8 + i * item;
        weir_window w = { get_i64(at), get_i64(at + 8) };
        if (w.end - 1 == time) {
            memcpy(g_acc, at + WINDOW_HEAD, t->acc_size);
            t->fire(ctx, w, g_acc);
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t *at = e->val + 8 + i * item;
        if (cleanup_time(t, get_i64(at + 8)) <= time) continue;
        if (kept != i) memmove(e->val + 8 + kept * item, at, item);
        kept++;
    }
    if (kept == 0) {
        weir_table_remove(tb, key.ptr, key.len);
    } else if (kept != n) {
        put_i64(e->val, (int64_t)kept);
        weir_table_reserve(tb, key.ptr, key.len, 8 + kept * item);
    }
    return 0;
}
