/* Open-addressing hash table of byte keys -> byte values (one per state per key group). */
#ifndef WEIR_TABLE_H
#define WEIR_TABLE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *key;
    size_t klen;
    uint8_t *val;
    size_t vlen;
    int used;
} weir_entry;

typedef struct {
    weir_entry *slots;
    size_t cap; /* power of two or 0 */
    size_t len;
} weir_table;

static uint64_t weir_hash(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static weir_entry *weir_table_find(weir_table *t, const uint8_t *key, size_t klen) {
    if (t->cap == 0) return NULL;
    size_t i = weir_hash(key, klen) & (t->cap - 1);
    while (t->slots[i].used) {
        weir_entry *e = &t->slots[i];
        if (e->klen == klen && memcmp(e->key, key, klen) == 0) return e;
        i = (i + 1) & (t->cap - 1);
    }
    return NULL;
}

static void weir_table_grow(weir_table *t);

/* Inserts or replaces; copies key and value. */
static void weir_table_put(weir_table *t, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen) {
    weir_entry *e = weir_table_find(t, key, klen);
    if (e) {
        if (e->vlen != vlen) e->val = realloc(e->val, vlen ? vlen : 1);
        memcpy(e->val, val, vlen);
        e->vlen = vlen;
        return;
    }
    if ((t->len + 1) * 4 > t->cap * 3) weir_table_grow(t);
    size_t i = weir_hash(key, klen) & (t->cap - 1);
    while (t->slots[i].used) i = (i + 1) & (t->cap - 1);
    e = &t->slots[i];
    e->used = 1;
    e->key = malloc(klen ? klen : 1);
    memcpy(e->key, key, klen);
    e->klen = klen;
    e->val = malloc(vlen ? vlen : 1);
    memcpy(e->val, val, vlen);
    e->vlen = vlen;
    t->len++;
}

/* The entry of `key` with a value of `vlen` bytes: an existing value keeps its first
 * min(old, vlen) bytes, a new one is uninitialized. Pointers into the table stay valid until
 * the next put, reserve or remove. */
static weir_entry *weir_table_reserve(weir_table *t, const uint8_t *key, size_t klen, size_t vlen) {
    weir_entry *e = weir_table_find(t, key, klen);
    if (!e) {
        if ((t->len + 1) * 4 > t->cap * 3) weir_table_grow(t);
        size_t i = weir_hash(key, klen) & (t->cap - 1);
        while (t->slots[i].used) i = (i + 1) & (t->cap - 1);
        e = &t->slots[i];
        e->used = 1;
        e->key = malloc(klen ? klen : 1);
        memcpy(e->key, key, klen);
        e->klen = klen;
        e->val = malloc(vlen ? vlen : 1);
        e->vlen = vlen;
        t->len++;
        return e;
    }
    if (e->vlen != vlen) e->val = realloc(e->val, vlen ? vlen : 1);
    e->vlen = vlen;
    return e;
}

/* Removes `key` if present. Linear probing: the entries after the hole that would no longer
 * be found past it move back into it (backward-shift deletion, no tombstones). */
static void weir_table_remove(weir_table *t, const uint8_t *key, size_t klen) {
    weir_entry *e = weir_table_find(t, key, klen);
    if (!e) return;
    free(e->key);
    free(e->val);
    size_t mask = t->cap - 1, hole = (size_t)(e - t->slots);
    t->slots[hole].used = 0;
    t->len--;
    for (size_t i = (hole + 1) & mask; t->slots[i].used; i = (i + 1) & mask) {
        size_t home = weir_hash(t->slots[i].key, t->slots[i].klen) & mask;
        /* Stays if its home lies cyclically in (hole, i]. */
        if (hole <= i ? (hole < home && home <= i) : (hole < home || home <= i)) continue;
        t->slots[hole] = t->slots[i];
        t->slots[i].used = 0;
        hole = i;
    }
}

static void weir_table_grow(weir_table *t) {
    weir_table old = *t;
    t->cap = old.cap ? old.cap * 2 : 16;
    t->slots = calloc(t->cap, sizeof(weir_entry));
    t->len = 0;
    for (size_t i = 0; i < old.cap; i++) {
        weir_entry *e = &old.slots[i];
        if (!e->used) continue;
        size_t j = weir_hash(e->key, e->klen) & (t->cap - 1);
        while (t->slots[j].used) j = (j + 1) & (t->cap - 1);
        t->slots[j] = *e;
        t->len++;
    }
    free(old.slots);
}

#endif
