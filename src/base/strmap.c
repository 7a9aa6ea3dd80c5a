/* strmap.c — see strmap.h. FNV-1a hash, linear probing, load factor <= 1/2. */
#include "base/strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t strmap_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

bool strmap_init(struct strmap *m, size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2)
        cap *= 2;
    m->slots = calloc(cap, sizeof *m->slots);
    m->cap = m->slots ? cap : 0;
    m->len = 0;
    return m->slots != NULL;
}

void strmap_free(struct strmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        free(m->slots[i].key);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static struct strmap_slot *strmap_find(const struct strmap *m, const char *key)
{
    size_t mask = m->cap - 1;
    for (size_t i = strmap_hash(key) & mask;; i = (i + 1) & mask) {
        struct strmap_slot *s = &m->slots[i];
        if (!s->key || strcmp(s->key, key) == 0)
            return s;
    }
}

static bool strmap_grow(struct strmap *m)
{
    struct strmap bigger;
    bigger.cap = m->cap * 2;
    bigger.len = m->len;
    bigger.slots = calloc(bigger.cap, sizeof *bigger.slots);
    if (!bigger.slots)
        return false;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key)
            *strmap_find(&bigger, m->slots[i].key) = m->slots[i];
    free(m->slots);
    *m = bigger;
    return true;
}

bool strmap_put(struct strmap *m, const char *key, void *val, void **old)
{
    if ((m->len + 1) * 2 > m->cap && !strmap_grow(m))
        return false;
    struct strmap_slot *s = strmap_find(m, key);
    if (old)
        *old = s->key ? s->val : NULL;
    if (!s->key) {
        s->key = strdup(key);
        if (!s->key)
            return false;
        m->len++;
    }
    s->val = val;
    return true;
}

void *strmap_get(const struct strmap *m, const char *key)
{
    if (!m->cap)
        return NULL;
    struct strmap_slot *s = strmap_find(m, key);
    return s->key ? s->val : NULL;
}
