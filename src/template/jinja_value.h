/* jinja_value.h — the values a chat template computes with: Python's None,
 * bool, int, float, str, list, tuple, dict, plus jinja2's Undefined,
 * namespace, loop context and callables; and the variable scopes that hold
 * them.
 *
 * A struct jv is a small tagged value; strings and containers live on the
 * heap with a reference count (not atomic: one render owns its values).
 * Objects whose count is JV_IMMORTAL belong to a compiled template (string
 * constants) and are never counted or freed by a render, which is what lets
 * several threads render one template at once.
 * Lists, tuples and dicts are immutable once built (jinja2's immutable
 * sandbox); only namespaces change after creation, and a namespace never
 * holds another namespace, so values form no cycles. Every container records
 * its nesting depth, capped at JV_MAX_DEPTH at construction, so recursive
 * walks (print, compare, free) are bounded.
 *
 * Ownership: functions that return or store a struct jv say whether they
 * take ("steal") or copy a reference; getters return borrowed pointers.
 *
 * defines: enum jv_kind, struct jv and its heap objects, jv_*(), struct jscope, jscope_*()
 */
#ifndef MOESERVE_TEMPLATE_JINJA_VALUE_H
#define MOESERVE_TEMPLATE_JINJA_VALUE_H

#include <locale.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "template/jinja_text.h"

#define JV_IMMORTAL UINT32_MAX
#define JV_MAX_DEPTH 128

enum jv_kind {
    JV_UNDEFINED,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* lists, tuples, generators and dict views: see enum jv_seq */
    JV_DICT,
    JV_NS,   /* namespace(): a mutable dict of attributes */
    JV_FUNC, /* global function, bound method, macro */
    JV_LOOP, /* the `loop` variable of a for loop */
};

/* Why an Undefined is undefined, for the error raised when it is misused. */
enum jv_undef_why {
    JV_UNDEF_NAME,   /* hint = variable name */
    JV_UNDEF_ATTR,   /* hint = attribute/key name, hint_kind = owner's kind */
    JV_UNDEF_UNSAFE, /* hint = attribute the sandbox refuses, hint_kind = owner's kind */
    JV_UNDEF_OTHER,  /* hint may be NULL */
};

struct jv_str;
struct jv_list;
struct jv_dict;
struct jv_func;
struct jv_loop;

struct jv {
    uint8_t kind;      /* enum jv_kind */
    uint8_t why;       /* enum jv_undef_why, for JV_UNDEFINED */
    uint8_t hint_kind; /* enum jv_kind of the owner, for JV_UNDEF_ATTR */
    union {
        bool b;
        int64_t i;
        double f;
        struct jv_str *s;
        struct jv_list *l;
        struct jv_dict *d; /* JV_DICT and JV_NS */
        struct jv_func *fn;
        struct jv_loop *loop;
        const char *hint; /* JV_UNDEFINED: borrowed from the template, may be NULL */
    } u;
};

struct jv_str {
    uint32_t refs;
    uint32_t markup; /* a markupsafe.Markup (from |safe, |escape) */
    size_t len;
    char data[]; /* (len + 1) bytes, NUL-terminated */
};

/* What a JV_LIST is to Python. Generators (what jinja2's map, select,
 * unique, batch, items and reverse filters return) are always true, have no
 * len(), cannot be indexed and are used up by iterating; dict views
 * (.items(), .keys(), .values()) have a len() but no indexing. */
enum jv_seq {
    JV_SEQ_LIST,
    JV_SEQ_TUPLE,
    JV_SEQ_GEN,
    JV_SEQ_ITEMS,
    JV_SEQ_KEYS,
    JV_SEQ_VALUES,
};

/* A generator not run yet: jinja2's generator filters do nothing, not even
 * check their arguments, until something iterates them. */
struct jv_lazy {
    int filter_id;
    struct jv input; /* owned */
    struct jv *pos;  /* (n_pos) owned */
    size_t n_pos;
    const char *const *kw_names; /* (n_kw) borrowed from the template */
    struct jv *kw_vals;          /* (n_kw) owned */
    size_t n_kw;
};

/* Which jinja2 function made a generator: only for printing it. */
enum jv_gen_origin { JV_GEN_MAP, JV_GEN_SELECT, JV_GEN_UNIQUE, JV_GEN_BATCH, JV_GEN_ITEMS, JV_GEN_REVERSE };

struct jv_list {
    uint32_t refs;
    uint8_t seq;    /* enum jv_seq */
    uint8_t origin; /* enum jv_gen_origin, for JV_SEQ_GEN */
    uint16_t depth; /* 1 + deepest item (or input, while lazy) */
    size_t len;
    size_t cap;
    size_t pos;           /* JV_SEQ_GEN: items before pos are used up */
    struct jv *items;     /* (cap) owned references */
    struct jv_lazy *lazy; /* JV_SEQ_GEN before its first use, else NULL; owned */
};

struct jv_entry {
    struct jv key; /* owned */
    struct jv val; /* owned */
};

struct jv_dict {
    uint32_t refs;
    uint16_t depth;
    size_t len;
    size_t cap;
    struct jv_entry *e; /* (cap) in insertion order */
    uint32_t *index;    /* (index_cap) open addressing over e, 0 = empty, else i+1; NULL while small */
    size_t index_cap;
};

enum jv_func_kind {
    JV_FUNC_GLOBAL, /* id = builtin global function */
    JV_FUNC_METHOD, /* id = method; self = receiver */
    JV_FUNC_MACRO,  /* macro = its node; closure = defining scope */
};

struct jnode;
struct jscope;

struct jv_func {
    uint32_t refs;
    uint8_t kind; /* enum jv_func_kind */
    uint16_t id;
    struct jv self;            /* owned (JV_FUNC_METHOD) */
    const struct jnode *macro; /* borrowed from the template */
    struct jscope *closure;    /* owned reference */
};

struct jv_loop {
    uint32_t refs;
    size_t index0;
    size_t depth0;
    struct jv_list *items; /* owned: the (filtered) sequence being looped over */
    struct jv last;        /* owned: last value seen by loop.changed() */
    bool has_last;
};

/* Scalars. */
static inline struct jv jv_undef(enum jv_undef_why why, const char *hint, int hint_kind)
{
    struct jv v = {.kind = JV_UNDEFINED, .why = (uint8_t)why, .hint_kind = (uint8_t)hint_kind};
    v.u.hint = hint;
    return v;
}
static inline struct jv jv_none(void)
{
    return (struct jv){.kind = JV_NONE};
}
static inline struct jv jv_bool(bool b)
{
    struct jv v = {.kind = JV_BOOL};
    v.u.b = b;
    return v;
}
static inline struct jv jv_int(int64_t i)
{
    struct jv v = {.kind = JV_INT};
    v.u.i = i;
    return v;
}
static inline struct jv jv_float(double f)
{
    struct jv v = {.kind = JV_FLOAT};
    v.u.f = f;
    return v;
}

void jv_incref(struct jv v);
void jv_decref(struct jv v);
static inline struct jv jv_copy(struct jv v)
{
    jv_incref(v);
    return v;
}

/* Strings: return false on OOM. */
bool jv_str_new(struct jv *out, const char *s, size_t n);

/* Lists. jv_list_push steals `item`; it fails (false) on OOM or when the list
 * would nest deeper than JV_MAX_DEPTH (*too_deep set). */
bool jv_list_new(struct jv *out, size_t cap, enum jv_seq seq);
static inline bool jv_is_seq(const struct jv *v, enum jv_seq seq)
{
    return v->kind == JV_LIST && v->u.l->seq == seq;
}
/* A list or tuple: len(), indexing, slicing, + and *. */
static inline bool jv_is_indexable(const struct jv *v)
{
    return v->kind == JV_LIST && v->u.l->seq <= JV_SEQ_TUPLE;
}
bool jv_list_push(struct jv *list, struct jv item, bool *too_deep);

/* Dicts and namespaces. jv_dict_set steals key and val. */
bool jv_dict_new(struct jv *out, enum jv_kind kind /* JV_DICT or JV_NS */);
bool jv_dict_set(struct jv *dict, struct jv key, struct jv val, bool *too_deep);
const struct jv *jv_dict_get(const struct jv_dict *d, const struct jv *key);
const struct jv *jv_dict_get_str(const struct jv_dict *d, const char *key, size_t n);

/* Functions and loops. jv_func_new steals self; copies a closure reference. */
bool jv_func_new(struct jv *out, enum jv_func_kind kind, int id, struct jv self, const struct jnode *macro,
                 struct jscope *closure);

void jv_lazy_free(struct jv_lazy *z); /* NULL is fine */

size_t jv_depth(const struct jv *v);
bool jv_contains_ns(const struct jv *v); /* is a namespace anywhere inside v? */

/* Python semantics. */
bool jv_truthy(const struct jv *v);
bool jv_is_number(const struct jv *v);   /* bool, int or float */
double jv_as_double(const struct jv *v); /* for numbers */
bool jv_equal(const struct jv *a, const struct jv *b);
/* Python's a < b etc.: returns false when the types are not orderable;
 * *cmp receives -1/0/1. `fold` compares strings case-insensitively. */
bool jv_compare(locale_t loc, const struct jv *a, const struct jv *b, bool fold, int *cmp);
const char *jv_type_name(const struct jv *v);
const char *jv_kind_name(int kind);
/* str(v) and repr(v) into b; false on OOM. */
bool jv_to_str(struct jbuf *b, const struct jv *v);
bool jv_repr(struct jbuf *b, const struct jv *v);

/* Variable scopes: a chain of small name -> value maps. Names are borrowed
 * (they live in the template or the caller's context, which outlive a
 * render). */
#define JSCOPE_INLINE 4

struct jscope {
    uint32_t refs;
    struct jscope *parent; /* owned reference, may be NULL */
    size_t len;
    size_t cap;
    const char **names; /* (cap) borrowed; names_buf while cap <= JSCOPE_INLINE */
    struct jv *vals;    /* (cap) owned; vals_buf while cap <= JSCOPE_INLINE */
    const char *names_buf[JSCOPE_INLINE];
    struct jv vals_buf[JSCOPE_INLINE];
};

struct jscope *jscope_new(struct jscope *parent);                    /* NULL on OOM; refs = 1 */
bool jscope_set(struct jscope *sc, const char *name, struct jv val); /* steals val */
const struct jv *jscope_lookup(const struct jscope *sc, const char *name);
/* Drops every variable (breaking macro <-> scope reference cycles), then the
 * caller's reference. */
void jscope_release(struct jscope *sc);
void jscope_decref(struct jscope *sc);

#endif
