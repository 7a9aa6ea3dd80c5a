/* tok_vocab.c — string <-> id tables, buffers, JSON field helpers and the
 * ByteLevel byte <-> char map shared by the tokenizer's parts.
 *
 * The table is open addressing over entry indices (load <= 1/2) with a
 * word-at-a-time hash, so lookups of unterminated slices need no copy.
 * Invariant: token texts are NUL-terminated in `text`, so tok_strtab_text()
 * can hand out C strings.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "format/tok_internal.h"

bool tok_buf_reserve(struct tok_buf *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool tok_buf_put(struct tok_buf *b, const void *s, size_t n)
{
    if (!tok_buf_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

void tok_buf_free(struct tok_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

bool tok_ids_push(struct tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *p = realloc(ids->ids, cap * sizeof *p);
        if (!p)
            return false;
        ids->ids = p;
        ids->cap = cap;
    }
    ids->ids[ids->n++] = id;
    return true;
}

void tok_ids_free(struct tok_ids *ids)
{
    if (!ids)
        return;
    free(ids->ids);
    memset(ids, 0, sizeof *ids);
}

bool tok_pieces_push(struct tok_pieces *p, size_t off, size_t len, unsigned flags)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        struct tok_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return false;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (struct tok_piece){off, len, flags};
    return true;
}

char *tok_strdup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* ---- string table ---- */

static uint64_t tok_hash(const char *s, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static bool tok_strtab_grow(struct tok_strtab *t)
{
    size_t cap = t->mask ? (t->mask + 1) * 2 : 1024;
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot)
        return false;
    for (size_t e = 0; e < t->n_ent; e++) {
        const struct tok_entry *en = &t->ent[e];
        size_t i = tok_hash(t->text + en->off, en->len) & (cap - 1);
        while (slot[i])
            i = (i + 1) & (cap - 1);
        slot[i] = (uint32_t)e + 1;
    }
    free(t->slot);
    t->slot = slot;
    t->mask = cap - 1;
    return true;
}

int32_t tok_strtab_get(const struct tok_strtab *t, const char *s, size_t len)
{
    if (!t->slot)
        return -1;
    for (size_t i = tok_hash(s, len) & t->mask;; i = (i + 1) & t->mask) {
        uint32_t e = t->slot[i];
        if (!e)
            return -1;
        const struct tok_entry *en = &t->ent[e - 1];
        if (en->len == len && memcmp(t->text + en->off, s, len) == 0)
            return en->id;
    }
}

enum status tok_strtab_put(struct tok_strtab *t, const char *s, size_t len, int32_t id, struct err *err)
{
    if (len > UINT32_MAX / 2 || t->text_n + len + 1 > UINT32_MAX)
        return err_set(err, STATUS_FORMAT, "token table larger than 4 GiB");
    if ((t->n_ent + 1) * 2 > (t->mask ? t->mask + 1 : 0) && !tok_strtab_grow(t))
        return err_set(err, STATUS_NOMEM, "out of memory building the token table");
    size_t i = tok_hash(s, len) & t->mask;
    for (;; i = (i + 1) & t->mask) {
        uint32_t e = t->slot[i];
        if (!e)
            break;
        struct tok_entry *en = &t->ent[e - 1];
        if (en->len == len && memcmp(t->text + en->off, s, len) == 0) {
            en->id = id;
            return STATUS_OK;
        }
    }
    if (t->n_ent == t->cap_ent) {
        size_t cap = t->cap_ent ? t->cap_ent * 2 : 1024;
        struct tok_entry *ent = realloc(t->ent, cap * sizeof *ent);
        if (!ent)
            return err_set(err, STATUS_NOMEM, "out of memory building the token table");
        t->ent = ent;
        t->cap_ent = cap;
    }
    if (t->text_n + len + 1 > t->text_cap) {
        size_t cap = t->text_cap ? t->text_cap : 1 << 16;
        while (cap < t->text_n + len + 1)
            cap *= 2;
        char *text = realloc(t->text, cap);
        if (!text)
            return err_set(err, STATUS_NOMEM, "out of memory building the token table");
        t->text = text;
        t->text_cap = cap;
    }
    memcpy(t->text + t->text_n, s, len);
    t->text[t->text_n + len] = 0;
    t->ent[t->n_ent] = (struct tok_entry){(uint32_t)t->text_n, (uint32_t)len, id};
    t->text_n += len + 1;
    t->slot[i] = (uint32_t)++t->n_ent;
    if (id >= t->n_ids)
        t->n_ids = id + 1;
    return STATUS_OK;
}

enum status tok_strtab_index(struct tok_strtab *t, struct err *err)
{
    free(t->by_id);
    t->by_id = NULL;
    int32_t n = 0;
    for (size_t e = 0; e < t->n_ent; e++)
        if (t->ent[e].id >= n)
            n = t->ent[e].id + 1;
    t->n_ids = n;
    if (!n)
        return STATUS_OK;
    t->by_id = malloc((size_t)n * sizeof *t->by_id);
    if (!t->by_id)
        return err_set(err, STATUS_NOMEM, "out of memory indexing the token table");
    for (int32_t i = 0; i < n; i++)
        t->by_id[i] = -1;
    for (size_t e = 0; e < t->n_ent; e++)
        if (t->by_id[t->ent[e].id] < 0)
            t->by_id[t->ent[e].id] = (int32_t)e;
    return STATUS_OK;
}

const char *tok_strtab_text(const struct tok_strtab *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->by_id || t->by_id[id] < 0)
        return NULL;
    const struct tok_entry *en = &t->ent[t->by_id[id]];
    if (len)
        *len = en->len;
    return t->text + en->off;
}

void tok_strtab_free(struct tok_strtab *t)
{
    free(t->text);
    free(t->ent);
    free(t->slot);
    free(t->by_id);
    memset(t, 0, sizeof *t);
}

/* ---- JSON helpers ---- */

enum status tok_json_check_utf8(const char *s, const char *path, struct err *err)
{
    size_t bad;
    if (!unicode_utf8_validate(s, strlen(s), &bad))
        return err_set(err, STATUS_FORMAT, "%s: invalid UTF-8 at byte %zu", path, bad);
    return STATUS_OK;
}

enum status tok_json_str(const struct json *obj, const char *key, const char *path, bool required,
                         const char **out, struct err *err)
{
    *out = NULL;
    const struct json *v = json_get(obj, key);
    if (json_is_null(v)) {
        if (required)
            return err_set(err, STATUS_FORMAT, "%s.%s: missing", path, key);
        return STATUS_OK;
    }
    if (!json_is_string(v))
        return err_set(err, STATUS_FORMAT, "%s.%s: expected a string", path, key);
    char p[512];
    snprintf(p, sizeof p, "%s.%s", path, key);
    enum status st = tok_json_check_utf8(json_string(v), p, err);
    if (st)
        return st;
    *out = json_string(v);
    return STATUS_OK;
}

enum status tok_json_bool(const struct json *obj, const char *key, const char *path, bool dflt, bool *out,
                          struct err *err)
{
    const struct json *v = json_get(obj, key);
    *out = dflt;
    if (json_is_null(v))
        return STATUS_OK;
    if (!json_is_bool(v))
        return err_set(err, STATUS_FORMAT, "%s.%s: expected true or false", path, key);
    *out = json_bool(v);
    return STATUS_OK;
}

enum status tok_json_uint(const struct json *obj, const char *key, const char *path, double max, size_t dflt,
                          size_t *out, struct err *err)
{
    const struct json *v = json_get(obj, key);
    *out = dflt;
    if (json_is_null(v))
        return STATUS_OK;
    double d = json_number(v);
    if (!json_is_number(v) || !(d >= 0 && d <= max) || d != (double)(size_t)d)
        return err_set(err, STATUS_FORMAT, "%s.%s: expected an integer in [0, %.0f]", path, key, max);
    *out = (size_t)d;
    return STATUS_OK;
}

/* ---- ByteLevel: GPT-2's bytes_to_unicode ---- */

uint32_t tok_bytelevel_char(unsigned char b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256u + b;
    if (b <= 160)
        return 256u + 33 + (b - 127u);
    return 256u + 67; /* 173 */
}

int tok_bytelevel_byte(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68)
        return -1;
    uint32_t n = cp - 256;
    if (n < 33)
        return (int)n;
    if (n < 67)
        return (int)(127 + n - 33);
    return 173;
}

bool tok_spans_push(struct tok_spans *sp, size_t start, size_t end, int32_t id)
{
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? sp->cap * 2 : 64;
        struct tok_match *v = realloc(sp->v, cap * sizeof *v);
        if (!v)
            return false;
        sp->v = v;
        sp->cap = cap;
    }
    sp->v[sp->n++] = (struct tok_match){start, end, id};
    return true;
}
