/* The Weir C SDK: the component's exports on top of the wit-bindgen C bindings (gen/).
 * See weir.h. Arguments of exports are owned here and freed; returned data is malloc'd and
 * freed by the bindings after the call. */
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

__attribute__((weak)) int weir_migrate(const char *state, uint32_t from, weir_bytes in, uint8_t **out,
                                       size_t *out_len) {
    (void)state; (void)from; (void)in; (void)out; (void)out_len;
    return 1;
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

static weir_table *table(size_t state, uint32_t key_group) {
    return &g_tables[state * g_groups + (key_group - g_task.key_group_start)];
}

weir_bytes weir_get(weir_ctx *ctx, size_t state) {
    weir_entry *e = weir_table_find(table(state, ctx->rec->key_group), ctx->rec->key.ptr, ctx->rec->key.len);
    weir_bytes b = { e ? e->val : NULL, e ? e->vlen : 0 };
    return b;
}

void weir_put(weir_ctx *ctx, size_t state, const uint8_t *value, size_t len) {
    weir_table_put(table(state, ctx->rec->key_group), ctx->rec->key.ptr, ctx->rec->key.len, value, len);
}

void weir_emit(weir_ctx *ctx, const uint8_t *key, size_t klen, const uint8_t *value, size_t vlen) {
    int64_t ts = ctx->rec ? ctx->rec->timestamp : 0;
    out_u32(0);
    out_reserve(8); memcpy(g_out + g_out_len, &ts, 8); g_out_len += 8;
    out_u32((uint32_t)klen);
    out_u32((uint32_t)vlen);
    out_bytes(key, klen);
    out_bytes(value, vlen);
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
    ret->side_outputs.len = 0;
    ret->side_outputs.ptr = NULL;
}

bool exports_operator_setup(operator_list_tuple2_string_string_t *config, operator_string_t *err) {
    (void)err;
    operator_list_tuple2_string_string_free(config);
    weir_operator_context_task(&g_task);
    g_groups = g_task.key_group_end - g_task.key_group_start;
    g_tables = calloc(WEIR_OPERATOR.states_len * g_groups + 1, sizeof(weir_table));
    return true;
}

bool exports_operator_process(operator_list_u8_t *batch, operator_string_t *err) {
    const uint8_t *p = batch->ptr;
    size_t pos = 0, n = batch->len;
    weir_ctx ctx = { NULL, NULL };
    bool ok = true;
    uint32_t index = 0;
    while (pos + 20 <= n) {
        weir_record r;
        uint32_t klen, vlen;
        memcpy(&r.key_group, p + pos, 4);
        memcpy(&r.timestamp, p + pos + 4, 8);
        memcpy(&klen, p + pos + 12, 4);
        memcpy(&vlen, p + pos + 16, 4);
        r.key.ptr = p + pos + 20;
        r.key.len = klen;
        r.value.ptr = p + pos + 20 + klen;
        r.value.len = vlen;
        pos += 20 + (size_t)klen + vlen;
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
    (void)domain; (void)err;
    operator_list_u8_free(timers);
    return true;
}

bool exports_operator_on_watermark(int64_t watermark, operator_string_t *err) {
    (void)watermark; (void)err;
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
