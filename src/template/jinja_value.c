/* jinja_value.c — values and scopes of the chat-template interpreter
 * (see jinja_value.h for the ownership rules).
 *
 * Not here: anything that needs the render state (errors with line numbers,
 * budgets) — that is jinja_eval.c; filters and methods — jinja_builtins.c.
 */
#include "template/jinja_value.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_ast.h"

/* ---- reference counting ---------------------------------------------------------------------- */

static void value_free_obj(struct jv v);

static uint32_t *value_refs(struct jv v)
{
    switch (v.kind) {
    case JV_STR: return &v.u.s->refs;
    case JV_LIST: return &v.u.l->refs;
    case JV_DICT:
    case JV_NS: return &v.u.d->refs;
    case JV_FUNC: return &v.u.fn->refs;
    case JV_LOOP: return &v.u.loop->refs;
    default: return NULL;
    }
}

void jv_incref(struct jv v)
{
    uint32_t *r = value_refs(v);
    if (r && *r != JV_IMMORTAL)
        (*r)++;
}

void jv_decref(struct jv v)
{
    uint32_t *r = value_refs(v);
    if (!r || *r == JV_IMMORTAL)
        return;
    if (--*r == 0)
        value_free_obj(v);
}

static void value_free_obj(struct jv v)
{
    switch (v.kind) {
    case JV_STR: free(v.u.s); break;
    case JV_LIST:
        for (size_t i = 0; i < v.u.l->len; i++)
            jv_decref(v.u.l->items[i]);
        free(v.u.l->items);
        jv_lazy_free(v.u.l->lazy);
        free(v.u.l);
        break;
    case JV_DICT:
    case JV_NS:
        for (size_t i = 0; i < v.u.d->len; i++) {
            jv_decref(v.u.d->e[i].key);
            jv_decref(v.u.d->e[i].val);
        }
        free(v.u.d->e);
        free(v.u.d->index);
        free(v.u.d);
        break;
    case JV_FUNC:
        jv_decref(v.u.fn->self);
        if (v.u.fn->closure)
            jscope_decref(v.u.fn->closure);
        free(v.u.fn);
        break;
    case JV_LOOP: {
        struct jv items = {.kind = JV_LIST};
        items.u.l = v.u.loop->items;
        if (items.u.l)
            jv_decref(items);
        if (v.u.loop->has_last)
            jv_decref(v.u.loop->last);
        free(v.u.loop);
        break;
    }
    default: break;
    }
}

void jv_lazy_free(struct jv_lazy *z)
{
    if (!z)
        return;
    jv_decref(z->input);
    for (size_t i = 0; i < z->n_pos; i++)
        jv_decref(z->pos[i]);
    for (size_t i = 0; i < z->n_kw; i++)
        jv_decref(z->kw_vals[i]);
    free(z->pos);
    free(z->kw_vals);
    free(z);
}

/* ---- strings --------------------------------------------------------------------------------- */

bool jv_str_new(struct jv *out, const char *s, size_t n)
{
    if (n > SIZE_MAX - sizeof(struct jv_str) - 1)
        return false;
    struct jv_str *o = malloc(sizeof *o + n + 1);
    if (!o)
        return false;
    o->refs = 1;
    o->markup = 0;
    o->len = n;
    if (n)
        memcpy(o->data, s, n);
    o->data[n] = '\0';
    out->kind = JV_STR;
    out->u.s = o;
    return true;
}

/* ---- lists ----------------------------------------------------------------------------------- */

bool jv_list_new(struct jv *out, size_t cap, enum jv_seq seq)
{
    struct jv_list *l = calloc(1, sizeof *l);
    if (!l)
        return false;
    if (cap) {
        l->items = malloc(cap * sizeof *l->items);
        if (!l->items) {
            free(l);
            return false;
        }
        l->cap = cap;
    }
    l->refs = 1;
    l->seq = (uint8_t)seq;
    l->depth = 1;
    out->kind = JV_LIST;
    out->u.l = l;
    return true;
}

size_t jv_depth(const struct jv *v)
{
    switch (v->kind) {
    case JV_LIST: return v->u.l->depth;
    case JV_DICT:
    case JV_NS: return v->u.d->depth;
    default: return 0;
    }
}

bool jv_list_push(struct jv *list, struct jv item, bool *too_deep)
{
    struct jv_list *l = list->u.l;
    size_t d = jv_depth(&item) + 1;
    if (d > JV_MAX_DEPTH) {
        if (too_deep)
            *too_deep = true;
        jv_decref(item);
        return false;
    }
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jv *p = realloc(l->items, cap * sizeof *p);
        if (!p) {
            jv_decref(item);
            return false;
        }
        l->items = p;
        l->cap = cap;
    }
    l->items[l->len++] = item;
    if (d > l->depth)
        l->depth = (uint16_t)d;
    return true;
}

/* ---- dicts ----------------------------------------------------------------------------------- */

bool jv_dict_new(struct jv *out, enum jv_kind kind)
{
    struct jv_dict *d = calloc(1, sizeof *d);
    if (!d)
        return false;
    d->refs = 1;
    d->depth = 1;
    out->kind = (uint8_t)kind;
    out->u.d = d;
    return true;
}

static uint64_t value_hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t value_hash(const struct jv *k)
{
    switch (k->kind) {
    case JV_STR: return value_hash_bytes(k->u.s->data, k->u.s->len);
    case JV_BOOL: return (uint64_t)k->u.b * 0x9E3779B97F4A7C15ull;
    case JV_INT: return (uint64_t)k->u.i * 0x9E3779B97F4A7C15ull;
    case JV_FLOAT: {
        double f = k->u.f;
        if (f == floor(f) && fabs(f) < 9.2e18)
            return (uint64_t)(int64_t)f * 0x9E3779B97F4A7C15ull;
        uint64_t bits;
        memcpy(&bits, &f, sizeof bits);
        return bits * 0x9E3779B97F4A7C15ull;
    }
    case JV_LIST: {
        uint64_t h = 7 + k->u.l->seq;
        for (size_t i = 0; i < k->u.l->len; i++)
            h = h * 31 + value_hash(&k->u.l->items[i]);
        return h;
    }
    default: return (uint64_t)k->kind;
    }
}

static bool dict_reindex(struct jv_dict *d)
{
    size_t cap = 16;
    while (cap < d->len * 2 + 2)
        cap *= 2;
    uint32_t *idx = calloc(cap, sizeof *idx);
    if (!idx)
        return false;
    for (size_t i = 0; i < d->len; i++) {
        size_t h = (size_t)value_hash(&d->e[i].key) & (cap - 1);
        while (idx[h])
            h = (h + 1) & (cap - 1);
        idx[h] = (uint32_t)(i + 1);
    }
    free(d->index);
    d->index = idx;
    d->index_cap = cap;
    return true;
}

static struct jv_entry *dict_find(const struct jv_dict *d, const struct jv *key)
{
    if (!d->index) {
        for (size_t i = 0; i < d->len; i++)
            if (jv_equal(&d->e[i].key, key))
                return &d->e[i];
        return NULL;
    }
    size_t h = (size_t)value_hash(key) & (d->index_cap - 1);
    while (d->index[h]) {
        struct jv_entry *e = &d->e[d->index[h] - 1];
        if (jv_equal(&e->key, key))
            return e;
        h = (h + 1) & (d->index_cap - 1);
    }
    return NULL;
}

const struct jv *jv_dict_get(const struct jv_dict *d, const struct jv *key)
{
    struct jv_entry *e = dict_find(d, key);
    return e ? &e->val : NULL;
}

const struct jv *jv_dict_get_str(const struct jv_dict *d, const char *key, size_t n)
{
    if (!d->index) {
        for (size_t i = 0; i < d->len; i++) {
            const struct jv *k = &d->e[i].key;
            if (k->kind == JV_STR && k->u.s->len == n && memcmp(k->u.s->data, key, n) == 0)
                return &d->e[i].val;
        }
        return NULL;
    }
    size_t h = (size_t)value_hash_bytes(key, n) & (d->index_cap - 1);
    while (d->index[h]) {
        struct jv_entry *e = &d->e[d->index[h] - 1];
        if (e->key.kind == JV_STR && e->key.u.s->len == n && memcmp(e->key.u.s->data, key, n) == 0)
            return &e->val;
        h = (h + 1) & (d->index_cap - 1);
    }
    return NULL;
}

bool jv_dict_set(struct jv *dict, struct jv key, struct jv val, bool *too_deep)
{
    struct jv_dict *d = dict->u.d;
    size_t dep = jv_depth(&val) + 1;
    if (dep > JV_MAX_DEPTH) {
        if (too_deep)
            *too_deep = true;
        jv_decref(key);
        jv_decref(val);
        return false;
    }
    struct jv_entry *e = dict_find(d, &key);
    if (e) {
        jv_decref(key);
        jv_decref(e->val);
        e->val = val;
    } else {
        if (d->len == d->cap) {
            size_t cap = d->cap ? d->cap * 2 : 4;
            struct jv_entry *p = realloc(d->e, cap * sizeof *p);
            if (!p) {
                jv_decref(key);
                jv_decref(val);
                return false;
            }
            d->e = p;
            d->cap = cap;
        }
        d->e[d->len].key = key;
        d->e[d->len].val = val;
        d->len++;
        if (d->len > 8 && (!d->index || d->len * 2 > d->index_cap)) {
            if (!dict_reindex(d)) {
                d->len--;
                jv_decref(d->e[d->len].key);
                jv_decref(d->e[d->len].val);
                return false;
            }
        } else if (d->index) {
            size_t h = (size_t)value_hash(&d->e[d->len - 1].key) & (d->index_cap - 1);
            while (d->index[h])
                h = (h + 1) & (d->index_cap - 1);
            d->index[h] = (uint32_t)d->len;
        }
    }
    if (dep > d->depth)
        d->depth = (uint16_t)dep;
    return true;
}

/* ---- functions ------------------------------------------------------------------------------- */

bool jv_func_new(struct jv *out, enum jv_func_kind kind, int id, struct jv self, const struct jnode *macro,
                 struct jscope *closure)
{
    struct jv_func *f = calloc(1, sizeof *f);
    if (!f) {
        jv_decref(self);
        return false;
    }
    f->refs = 1;
    f->kind = (uint8_t)kind;
    f->id = (uint16_t)id;
    f->self = self;
    f->macro = macro;
    f->closure = closure;
    if (closure)
        closure->refs++;
    out->kind = JV_FUNC;
    out->u.fn = f;
    return true;
}

bool jv_contains_ns(const struct jv *v)
{
    switch (v->kind) {
    case JV_NS: return true;
    case JV_LIST: {
        const struct jv_lazy *z = v->u.l->lazy;
        for (size_t i = 0; i < v->u.l->len; i++)
            if (jv_contains_ns(&v->u.l->items[i]))
                return true;
        if (z) {
            if (jv_contains_ns(&z->input))
                return true;
            for (size_t i = 0; i < z->n_pos; i++)
                if (jv_contains_ns(&z->pos[i]))
                    return true;
            for (size_t i = 0; i < z->n_kw; i++)
                if (jv_contains_ns(&z->kw_vals[i]))
                    return true;
        }
        return false;
    }
    case JV_DICT:
        for (size_t i = 0; i < v->u.d->len; i++)
            if (jv_contains_ns(&v->u.d->e[i].val))
                return true;
        return false;
    case JV_FUNC: return jv_contains_ns(&v->u.fn->self);
    default: return false;
    }
}

/* ---- Python semantics ------------------------------------------------------------------------ */

bool jv_truthy(const struct jv *v)
{
    switch (v->kind) {
    case JV_UNDEFINED:
    case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.s->len != 0;
    case JV_LIST: return v->u.l->seq == JV_SEQ_GEN || v->u.l->len != 0;
    case JV_DICT: return v->u.d->len != 0;
    default: return true;
    }
}

bool jv_is_number(const struct jv *v)
{
    return v->kind == JV_BOOL || v->kind == JV_INT || v->kind == JV_FLOAT;
}

double jv_as_double(const struct jv *v)
{
    switch (v->kind) {
    case JV_BOOL: return v->u.b;
    case JV_INT: return (double)v->u.i;
    case JV_FLOAT: return v->u.f;
    default: return 0;
    }
}

static bool value_int_like(const struct jv *v, int64_t *out)
{
    if (v->kind == JV_INT) {
        *out = v->u.i;
        return true;
    }
    if (v->kind == JV_BOOL) {
        *out = v->u.b;
        return true;
    }
    return false;
}

bool jv_equal(const struct jv *a, const struct jv *b)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        int64_t x, y;
        if (value_int_like(a, &x) && value_int_like(b, &y))
            return x == y;
        return jv_as_double(a) == jv_as_double(b);
    }
    if (a->kind != b->kind)
        return false;
    switch (a->kind) {
    case JV_UNDEFINED:
    case JV_NONE: return true;
    case JV_STR: return a->u.s->len == b->u.s->len && memcmp(a->u.s->data, b->u.s->data, a->u.s->len) == 0;
    case JV_LIST:
        if (a->u.l->seq == JV_SEQ_GEN || b->u.l->seq == JV_SEQ_GEN)
            return a->u.l == b->u.l;
        if (a->u.l->seq != b->u.l->seq || a->u.l->len != b->u.l->len)
            return false;
        for (size_t i = 0; i < a->u.l->len; i++)
            if (!jv_equal(&a->u.l->items[i], &b->u.l->items[i]))
                return false;
        return true;
    case JV_DICT:
        if (a->u.d->len != b->u.d->len)
            return false;
        for (size_t i = 0; i < a->u.d->len; i++) {
            const struct jv *o = jv_dict_get(b->u.d, &a->u.d->e[i].key);
            if (!o || !jv_equal(&a->u.d->e[i].val, o))
                return false;
        }
        return true;
    case JV_NS: return a->u.d == b->u.d;
    case JV_FUNC: return a->u.fn == b->u.fn;
    case JV_LOOP: return a->u.loop == b->u.loop;
    default: return false;
    }
}

static int value_cmp_str(locale_t loc, const struct jv_str *a, const struct jv_str *b, bool fold)
{
    if (!fold) {
        size_t n = a->len < b->len ? a->len : b->len;
        int c = memcmp(a->data, b->data, n);
        if (c)
            return c < 0 ? -1 : 1;
        return a->len < b->len ? -1 : a->len > b->len;
    }
    size_t i = 0, j = 0;
    while (i < a->len && j < b->len) {
        uint32_t x, y;
        i += jtext_decode(a->data + i, a->len - i, &x);
        j += jtext_decode(b->data + j, b->len - j, &y);
        x = jtext_lower(loc, x);
        y = jtext_lower(loc, y);
        if (x != y)
            return x < y ? -1 : 1;
    }
    if (i < a->len)
        return 1;
    if (j < b->len)
        return -1;
    return 0;
}

bool jv_compare(locale_t loc, const struct jv *a, const struct jv *b, bool fold, int *cmp)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        int64_t x, y;
        if (value_int_like(a, &x) && value_int_like(b, &y)) {
            *cmp = x < y ? -1 : x > y;
            return true;
        }
        double p = jv_as_double(a), q = jv_as_double(b);
        *cmp = p < q ? -1 : p > q ? 1 : 0;
        return true;
    }
    if (a->kind != b->kind)
        return false;
    if (a->kind == JV_STR) {
        *cmp = value_cmp_str(loc, a->u.s, b->u.s, fold);
        return true;
    }
    if (a->kind == JV_LIST && a->u.l->seq == b->u.l->seq && a->u.l->seq <= JV_SEQ_TUPLE) {
        size_t n = a->u.l->len < b->u.l->len ? a->u.l->len : b->u.l->len;
        for (size_t i = 0; i < n; i++) {
            const struct jv *x = &a->u.l->items[i], *y = &b->u.l->items[i];
            if (jv_equal(x, y))
                continue;
            return jv_compare(loc, x, y, fold, cmp);
        }
        *cmp = a->u.l->len < b->u.l->len ? -1 : a->u.l->len > b->u.l->len;
        return true;
    }
    return false;
}

const char *jv_kind_name(int kind)
{
    switch (kind) {
    case JV_UNDEFINED: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return "function";
    case JV_LOOP: return "LoopContext";
    default: return "object";
    }
}

const char *jv_type_name(const struct jv *v)
{
    if (v->kind == JV_LIST) {
        static const char *const names[] = {"list",       "tuple",     "generator",
                                            "dict_items", "dict_keys", "dict_values"};
        if (v->u.l->seq == JV_SEQ_GEN && v->u.l->origin == JV_GEN_REVERSE)
            return "list_reverseiterator";
        return names[v->u.l->seq];
    }
    if (v->kind == JV_STR && v->u.s->markup)
        return "Markup";
    return jv_kind_name(v->kind);
}

static bool value_print(struct jbuf *b, const struct jv *v, bool repr)
{
    switch (v->kind) {
    case JV_UNDEFINED: return repr ? jbuf_puts(b, "Undefined") : true;
    case JV_NONE: return jbuf_puts(b, "None");
    case JV_BOOL: return jbuf_puts(b, v->u.b ? "True" : "False");
    case JV_INT: return jbuf_printf(b, "%" PRId64, v->u.i);
    case JV_FLOAT: return jtext_float_repr(b, v->u.f);
    case JV_STR:
        if (!repr)
            return jbuf_put(b, v->u.s->data, v->u.s->len);
        if (v->u.s->markup)
            return jbuf_puts(b, "Markup(") && jtext_str_repr(b, v->u.s->data, v->u.s->len) &&
                   jbuf_putc(b, ')');
        return jtext_str_repr(b, v->u.s->data, v->u.s->len);
    case JV_LIST: {
        const struct jv_list *l = v->u.l;
        bool tuple = l->seq == JV_SEQ_TUPLE;
        if (l->seq == JV_SEQ_GEN) { /* Python shows an address: ours is a fixed, typical one */
            static const char *const fn[] = {"sync_do_map", "select_or_reject", "sync_do_unique", "do_batch",
                                             "do_items"};
            if (l->origin == JV_GEN_REVERSE)
                return jbuf_puts(b, "<list_reverseiterator object at 0x7f0000000000>");
            return jbuf_printf(b, "<generator object %s at 0x7f0000000000>", fn[l->origin]);
        }
        if (l->seq >= JV_SEQ_ITEMS && !(jbuf_puts(b, jv_type_name(v)) && jbuf_putc(b, '(')))
            return false;
        if (!jbuf_putc(b, tuple ? '(' : '['))
            return false;
        for (size_t i = 0; i < l->len; i++) {
            if (i && !jbuf_puts(b, ", "))
                return false;
            if (!value_print(b, &l->items[i], true))
                return false;
        }
        if (tuple && l->len == 1 && !jbuf_putc(b, ','))
            return false;
        if (!jbuf_putc(b, tuple ? ')' : ']'))
            return false;
        return l->seq >= JV_SEQ_ITEMS ? jbuf_putc(b, ')') : true;
    }
    case JV_DICT:
    case JV_NS: {
        const struct jv_dict *d = v->u.d;
        if (v->kind == JV_NS && !jbuf_puts(b, "<Namespace "))
            return false;
        if (!jbuf_putc(b, '{'))
            return false;
        for (size_t i = 0; i < d->len; i++) {
            if (i && !jbuf_puts(b, ", "))
                return false;
            if (!value_print(b, &d->e[i].key, true) || !jbuf_puts(b, ": ") ||
                !value_print(b, &d->e[i].val, true))
                return false;
        }
        if (!jbuf_putc(b, '}'))
            return false;
        return v->kind == JV_NS ? jbuf_putc(b, '>') : true;
    }
    case JV_FUNC:
        if (v->u.fn->kind == JV_FUNC_MACRO && v->u.fn->macro)
            return jbuf_printf(b, "<Macro '%s'>", v->u.fn->macro->name);
        return jbuf_puts(b, "<built-in function>");
    case JV_LOOP:
        return jbuf_printf(b, "<LoopContext %zu/%zu>", v->u.loop->index0 + 1,
                           v->u.loop->items ? v->u.loop->items->len : 0);
    default: return true;
    }
}

bool jv_to_str(struct jbuf *b, const struct jv *v)
{
    return value_print(b, v, false);
}

bool jv_repr(struct jbuf *b, const struct jv *v)
{
    return value_print(b, v, true);
}

/* ---- scopes ---------------------------------------------------------------------------------- */

struct jscope *jscope_new(struct jscope *parent)
{
    struct jscope *sc = malloc(sizeof *sc);
    if (!sc)
        return NULL;
    sc->refs = 1;
    sc->parent = parent;
    sc->len = 0;
    sc->cap = JSCOPE_INLINE;
    sc->names = sc->names_buf;
    sc->vals = sc->vals_buf;
    if (parent)
        parent->refs++;
    return sc;
}

bool jscope_set(struct jscope *sc, const char *name, struct jv val)
{
    for (size_t i = 0; i < sc->len; i++) {
        if (strcmp(sc->names[i], name) == 0) {
            jv_decref(sc->vals[i]);
            sc->vals[i] = val;
            return true;
        }
    }
    if (sc->len == sc->cap) {
        size_t cap = sc->cap * 2;
        const char **n = malloc(cap * sizeof *n);
        struct jv *v = malloc(cap * sizeof *v);
        if (!n || !v) {
            free(n);
            free(v);
            jv_decref(val);
            return false;
        }
        memcpy(n, sc->names, sc->len * sizeof *n);
        memcpy(v, sc->vals, sc->len * sizeof *v);
        if (sc->names != sc->names_buf) {
            free(sc->names);
            free(sc->vals);
        }
        sc->names = n;
        sc->vals = v;
        sc->cap = cap;
    }
    sc->names[sc->len] = name;
    sc->vals[sc->len] = val;
    sc->len++;
    return true;
}

const struct jv *jscope_lookup(const struct jscope *sc, const char *name)
{
    for (; sc; sc = sc->parent)
        for (size_t i = sc->len; i-- > 0;)
            if (strcmp(sc->names[i], name) == 0)
                return &sc->vals[i];
    return NULL;
}

static void scope_clear(struct jscope *sc)
{
    /* Values may hold references back to this scope (macros): detach them
     * first, so that a re-entrant lookup finds an empty scope. */
    size_t n = sc->len;
    struct jv inline_vals[JSCOPE_INLINE];
    struct jv *vals = sc->vals;
    if (vals == sc->vals_buf) {
        memcpy(inline_vals, vals, n * sizeof *vals);
        vals = inline_vals;
    } else {
        free(sc->names);
    }
    sc->len = 0;
    sc->cap = JSCOPE_INLINE;
    sc->names = sc->names_buf;
    sc->vals = sc->vals_buf;
    for (size_t i = 0; i < n; i++)
        jv_decref(vals[i]);
    if (vals != inline_vals)
        free(vals);
}

void jscope_decref(struct jscope *sc)
{
    while (sc && --sc->refs == 0) {
        struct jscope *parent = sc->parent;
        scope_clear(sc);
        free(sc);
        sc = parent;
    }
}

void jscope_release(struct jscope *sc)
{
    if (!sc)
        return;
    sc->refs++; /* keep sc alive while its values go */
    scope_clear(sc);
    jscope_decref(sc);
    jscope_decref(sc);
}
