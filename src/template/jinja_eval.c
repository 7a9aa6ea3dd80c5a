/* jinja_eval.c — the tree-walking evaluator of chat templates (see
 * jinja_eval.h for the semantics and limits).
 *
 * Scoping follows what jinja2's compiler produces: the template body runs in
 * one scope; each loop iteration, macro call, block set, filter block and
 * with block runs in a fresh child scope, so a `set` there is invisible
 * outside it (namespaces are how templates carry state out); if blocks share
 * their parent's scope. Lookups walk the chain up to the context variables.
 *
 * Quirks of jinja2 reproduced on purpose: a loop's else block runs unless an
 * iteration reached the end of the body; slices bypass getitem (so slicing a
 * non-sequence raises) except where the optimizer folds constants; map,
 * select, unique, batch and items return generators that run when first
 * iterated (jinja_builtins.c).
 * Not here: the builtins (jinja_builtins.c) and JSON (jinja_json.c).
 * Invariant: every eval/exec call is counted in r->depth, and every value a
 * function returns through `out` is owned by the caller.
 * One file: expressions and statements are mutually recursive (a call runs a
 * macro's body, a statement evaluates expressions), through static functions.
 */
#include "template/jinja_eval.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_lexer.h"

enum flow { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE, FLOW_ERROR };

/* ---- errors and budget ----------------------------------------------------------------------- */

bool jr_fail(struct jrender *r, enum status st, const char *fmt, ...)
{
    if (r->st)
        return false;
    r->st = st;
    if (!r->err)
        return false;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line, col;
    jtemplate_line_col(r->t, r->pos, &line, &col);
    err_set(r->err, st, "chat template: line %u: %s", line, msg);
    return false;
}

bool jr_raise(struct jrender *r, const char *msg, size_t n)
{
    if (r->st)
        return false;
    r->st = STATUS_INVALID;
    if (r->err)
        err_set(r->err, STATUS_INVALID, "%.*s", (int)(n > ERR_MSG_MAX ? ERR_MSG_MAX : n), msg);
    return false;
}

bool jr_nomem(struct jrender *r)
{
    return jr_fail(r, STATUS_NOMEM, "out of memory");
}

bool jr_undefined_error(struct jrender *r, const struct jv *u)
{
    const char *h = u->u.hint;
    switch (u->why) {
    case JV_UNDEF_NAME: return jr_fail(r, STATUS_INVALID, "'%s' is undefined", h ? h : "?");
    case JV_UNDEF_ATTR:
        if (!h)
            return jr_fail(r, STATUS_INVALID, "undefined value (missing attribute or item of a '%s')",
                           jv_kind_name(u->hint_kind));
        if (u->hint_kind == JV_NONE)
            return jr_fail(r, STATUS_INVALID, "None has no attribute '%s'", h);
        return jr_fail(r, STATUS_INVALID, "'%s object' has no attribute '%s'", jv_kind_name(u->hint_kind), h);
    case JV_UNDEF_UNSAFE:
        return jr_fail(r, STATUS_INVALID, "access to attribute '%s' of '%s' object is unsafe.", h ? h : "?",
                       jv_kind_name(u->hint_kind));
    default: return jr_fail(r, STATUS_INVALID, "%s", h ? h : "undefined value");
    }
}

bool jr_step(struct jrender *r, uint64_t n)
{
    if (r->steps_left < n)
        return jr_fail(r, STATUS_INVALID, "template exceeded its work limit (runaway loop or recursion?)");
    r->steps_left -= n;
    return true;
}

/* ---- value helpers --------------------------------------------------------------------------- */

bool jr_str_new(struct jrender *r, const char *s, size_t n, struct jv *out)
{
    if (n > JINJA_MAX_OUTPUT)
        return jr_fail(r, STATUS_INVALID, "string longer than %zu bytes", JINJA_MAX_OUTPUT);
    if (!jr_step(r, 1 + n / 64))
        return false;
    if (!jv_str_new(out, s, n))
        return jr_nomem(r);
    return true;
}

bool jr_buf_fail(struct jrender *r, const struct jbuf *b)
{
    if (b->over)
        return jr_fail(r, STATUS_INVALID, "output longer than %zu bytes", JINJA_MAX_OUTPUT);
    return jr_nomem(r);
}

bool jr_str_from_buf(struct jrender *r, struct jbuf *b, struct jv *out)
{
    return jr_str_new(r, b->p ? b->p : "", b->len, out);
}

bool jr_to_str(struct jrender *r, const struct jv *v, struct jv *out)
{
    if (v->kind == JV_STR) {
        *out = jv_copy(*v);
        return true;
    }
    struct jbuf b = jr_buf();
    bool ok = jv_to_str(&b, v) ? jr_str_from_buf(r, &b, out) : jr_buf_fail(r, &b);
    jbuf_free(&b);
    return ok;
}

bool jr_list_push(struct jrender *r, struct jv *list, struct jv item)
{
    bool too_deep = false;
    if (jv_list_push(list, item, &too_deep))
        return true;
    if (too_deep)
        return jr_fail(r, STATUS_INVALID, "values nested deeper than %d levels", JV_MAX_DEPTH);
    return jr_nomem(r);
}

bool jr_hashable(struct jrender *r, const struct jv *key)
{
    switch (key->kind) {
    case JV_NONE:
    case JV_BOOL:
    case JV_INT:
    case JV_FLOAT:
    case JV_STR: return true;
    case JV_LIST:
        if (key->u.l->seq == JV_SEQ_TUPLE) {
            for (size_t i = 0; i < key->u.l->len; i++)
                if (!jr_hashable(r, &key->u.l->items[i]))
                    return false;
            return true;
        }
        break;
    case JV_UNDEFINED: return true;
    default: break;
    }
    return jr_fail(r, STATUS_INVALID, "unhashable type: '%s'", jv_type_name(key));
}

bool jr_dict_set(struct jrender *r, struct jv *dict, struct jv key, struct jv val)
{
    bool too_deep = false;
    if (!jr_hashable(r, &key)) {
        jv_decref(key);
        jv_decref(val);
        return false;
    }
    if (jv_dict_set(dict, key, val, &too_deep))
        return true;
    if (too_deep)
        return jr_fail(r, STATUS_INVALID, "values nested deeper than %d levels", JV_MAX_DEPTH);
    return jr_nomem(r);
}

bool jr_iterate(struct jrender *r, const struct jv *v, struct jv *out)
{
    switch (v->kind) {
    case JV_UNDEFINED: return jv_list_new(out, 0, JV_SEQ_LIST) || jr_nomem(r);
    case JV_LIST: {
        struct jv_list *l = v->u.l;
        if (l->lazy && !jinja_gen_force(r, l))
            return false;
        if (l->seq == JV_SEQ_LIST) {
            *out = jv_copy(*v);
            return true;
        }
        size_t from = l->seq == JV_SEQ_GEN ? l->pos : 0;
        if (!jv_list_new(out, l->len - from, JV_SEQ_LIST))
            return jr_nomem(r);
        for (size_t i = from; i < l->len; i++)
            if (!jr_list_push(r, out, jv_copy(l->items[i])))
                goto fail;
        if (l->seq == JV_SEQ_GEN) /* a generator is used up by iterating it */
            l->pos = l->len;
        return jr_step(r, l->len / 16) || (jv_decref(*out), false);
    }
    case JV_DICT:
        if (!jv_list_new(out, v->u.d->len, JV_SEQ_LIST))
            return jr_nomem(r);
        for (size_t i = 0; i < v->u.d->len; i++)
            if (!jr_list_push(r, out, jv_copy(v->u.d->e[i].key)))
                goto fail;
        return jr_step(r, v->u.d->len / 16) || (jv_decref(*out), false);
    case JV_STR: {
        const char *s = v->u.s->data;
        size_t n = v->u.s->len;
        if (!jr_step(r, n) || !jv_list_new(out, n, JV_SEQ_LIST))
            return r->st ? false : jr_nomem(r);
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = jtext_decode(s + i, n - i, &cp);
            struct jv c;
            if (!jv_str_new(&c, s + i, l)) {
                jr_nomem(r);
                goto fail;
            }
            if (!jr_list_push(r, out, c))
                goto fail;
            i += l;
        }
        return true;
    }
    default: return jr_fail(r, STATUS_INVALID, "'%s' object is not iterable", jv_type_name(v));
    }
fail:
    jv_decref(*out);
    return false;
}

bool jr_compare(struct jrender *r, const struct jv *a, const struct jv *b, bool fold, int *cmp)
{
    if (jv_compare(r->loc, a, b, fold, cmp))
        return true;
    if (a->kind == JV_UNDEFINED)
        return jr_undefined_error(r, a);
    if (b->kind == JV_UNDEFINED)
        return jr_undefined_error(r, b);
    return jr_fail(r, STATUS_INVALID, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
                   jv_type_name(b));
}

bool jr_contains(struct jrender *r, const struct jv *c, const struct jv *item, bool *out)
{
    *out = false;
    switch (c->kind) {
    case JV_UNDEFINED: return true;
    case JV_STR: {
        if (item->kind != JV_STR)
            return jr_fail(r, STATUS_INVALID, "'in <string>' requires string as left operand, not %s",
                           jv_type_name(item));
        size_t n = item->u.s->len, h = c->u.s->len;
        if (n == 0) {
            *out = true;
            return true;
        }
        *out = n <= h && memmem(c->u.s->data, h, item->u.s->data, n) != NULL;
        return jr_step(r, h / 64);
    }
    case JV_LIST: {
        struct jv_list *l = c->u.l;
        if (l->lazy && !jinja_gen_force(r, l))
            return false;
        size_t i = l->seq == JV_SEQ_GEN ? l->pos : 0;
        for (; i < l->len; i++) {
            if (jv_equal(&l->items[i], item)) {
                *out = true;
                break;
            }
        }
        if (l->seq == JV_SEQ_GEN) /* `in` consumes a generator up to the match */
            l->pos = i < l->len ? i + 1 : l->len;
        return jr_step(r, l->len / 16);
    }
    case JV_DICT:
        if (!jr_hashable(r, item))
            return false;
        *out = jv_dict_get(c->u.d, item) != NULL;
        return true;
    default: return jr_fail(r, STATUS_INVALID, "argument of type '%s' is not iterable", jv_type_name(c));
    }
}

/* ---- attribute and item access --------------------------------------------------------------- */

static bool loop_attr(struct jrender *r, const struct jv *obj, const char *name, size_t n, const char *hint,
                      struct jv *out)
{
    const struct jv_loop *lp = obj->u.loop;
    size_t len = lp->items ? lp->items->len : 0;
    size_t i0 = lp->index0;
#define IS(s) (n == sizeof(s) - 1 && memcmp(name, s, n) == 0)
    if (IS("index"))
        *out = jv_int((int64_t)i0 + 1);
    else if (IS("index0"))
        *out = jv_int((int64_t)i0);
    else if (IS("revindex"))
        *out = jv_int((int64_t)(len - i0));
    else if (IS("revindex0"))
        *out = jv_int((int64_t)(len - i0) - 1);
    else if (IS("first"))
        *out = jv_bool(i0 == 0);
    else if (IS("last"))
        *out = jv_bool(i0 + 1 == len);
    else if (IS("length"))
        *out = jv_int((int64_t)len);
    else if (IS("depth"))
        *out = jv_int((int64_t)lp->depth0 + 1);
    else if (IS("depth0"))
        *out = jv_int((int64_t)lp->depth0);
    else if (IS("previtem"))
        *out = i0 > 0 ? jv_copy(lp->items->items[i0 - 1])
                      : jv_undef(JV_UNDEF_OTHER, "there is no previous item", 0);
    else if (IS("nextitem"))
        *out = i0 + 1 < len ? jv_copy(lp->items->items[i0 + 1])
                            : jv_undef(JV_UNDEF_OTHER, "there is no next item", 0);
    else {
        bool unsafe = false;
        int id = jinja_method_find(obj, name, n, &unsafe);
        if (id >= 0) {
            if (!jv_func_new(out, JV_FUNC_METHOD, id, jv_copy(*obj), NULL, NULL))
                return jr_nomem(r);
            return true;
        }
        *out = jv_undef(JV_UNDEF_ATTR, hint, JV_LOOP);
    }
#undef IS
    return true;
}

/* The Python attribute `name` of obj (methods, loop fields), *found = false
 * when it has none. */
static bool attr_lookup(struct jrender *r, const struct jv *obj, const char *name, size_t n, const char *hint,
                        struct jv *out, bool *found)
{
    *found = false;
    if (n > 0 && name[0] == '_') {
        *found = true;
        *out = jv_undef(JV_UNDEF_UNSAFE, hint, obj->kind);
        return true;
    }
    if (obj->kind == JV_LOOP) {
        *found = true;
        return loop_attr(r, obj, name, n, hint, out);
    }
    if (obj->kind == JV_NS) {
        const struct jv *v = jv_dict_get_str(obj->u.d, name, n);
        if (v) {
            *found = true;
            *out = jv_copy(*v);
        }
        return true;
    }
    bool unsafe = false;
    int id = jinja_method_find(obj, name, n, &unsafe);
    if (id < 0)
        return true;
    *found = true;
    if (unsafe) {
        *out = jv_undef(JV_UNDEF_UNSAFE, hint, obj->kind);
        return true;
    }
    if (!jv_func_new(out, JV_FUNC_METHOD, id, jv_copy(*obj), NULL, NULL))
        return jr_nomem(r);
    return true;
}

bool jr_pyattr(struct jrender *r, const struct jv *obj, const char *name, size_t n, const char *hint,
               struct jv *out)
{
    if (obj->kind == JV_UNDEFINED)
        return jr_undefined_error(r, obj);
    bool found;
    if (!attr_lookup(r, obj, name, n, hint, out, &found))
        return false;
    if (!found)
        *out = jv_undef(JV_UNDEF_ATTR, hint, obj->kind);
    return true;
}

bool jr_getattr_hint(struct jrender *r, const struct jv *obj, const char *name, size_t n, const char *hint,
                     struct jv *out)
{
    if (obj->kind == JV_UNDEFINED)
        return jr_undefined_error(r, obj);
    bool found;
    if (!attr_lookup(r, obj, name, n, hint, out, &found))
        return false;
    if (found)
        return true;
    if (obj->kind == JV_DICT) {
        const struct jv *v = jv_dict_get_str(obj->u.d, name, n);
        if (v) {
            *out = jv_copy(*v);
            return true;
        }
    }
    *out = jv_undef(JV_UNDEF_ATTR, hint, obj->kind);
    return true;
}

/* Python's index normalisation for obj[i]. */
static bool index_of(int64_t i, size_t len, size_t *out)
{
    if (i < 0)
        i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len)
        return false;
    *out = (size_t)i;
    return true;
}

bool jr_getitem(struct jrender *r, const struct jv *obj, const struct jv *key, const char *hint,
                struct jv *out)
{
    if (obj->kind == JV_UNDEFINED)
        return jr_undefined_error(r, obj);
    int64_t ik = 0;
    bool int_key = false;
    if (key->kind == JV_INT || key->kind == JV_BOOL) {
        int_key = true;
        ik = key->kind == JV_INT ? key->u.i : key->u.b;
    }
    switch (obj->kind) {
    case JV_DICT: {
        if (key->kind == JV_LIST && key->u.l->seq != JV_SEQ_TUPLE)
            break;
        if (key->kind == JV_DICT || key->kind == JV_NS)
            break;
        const struct jv *v = jv_dict_get(obj->u.d, key);
        if (v) {
            *out = jv_copy(*v);
            return true;
        }
        break;
    }
    case JV_LIST: {
        size_t i;
        if (jv_is_indexable(obj) && int_key && index_of(ik, obj->u.l->len, &i)) {
            *out = jv_copy(obj->u.l->items[i]);
            return true;
        }
        break;
    }
    case JV_STR: {
        if (!int_key)
            break;
        size_t ncp = jtext_count_cp(obj->u.s->data, obj->u.s->len), i;
        if (!index_of(ik, ncp, &i))
            break;
        size_t off = jtext_cp_offset(obj->u.s->data, obj->u.s->len, i);
        uint32_t cp;
        size_t l = jtext_decode(obj->u.s->data + off, obj->u.s->len - off, &cp);
        return jr_str_new(r, obj->u.s->data + off, l, out);
    }
    default: break;
    }
    if (key->kind == JV_STR) {
        bool found;
        if (!attr_lookup(r, obj, key->u.s->data, key->u.s->len, hint, out, &found))
            return false;
        if (found)
            return true;
    }
    *out = jv_undef(JV_UNDEF_ATTR, key->kind == JV_STR ? hint : NULL, obj->kind);
    return true;
}

/* ---- slicing --------------------------------------------------------------------------------- */

static bool slice_index(struct jrender *r, const struct jv *v, bool *given, int64_t *out)
{
    *given = false;
    if (!v || v->kind == JV_NONE)
        return true;
    if (v->kind == JV_INT || v->kind == JV_BOOL) {
        *given = true;
        *out = v->kind == JV_INT ? v->u.i : v->u.b;
        return true;
    }
    if (v->kind == JV_UNDEFINED)
        return jr_undefined_error(r, v);
    return jr_fail(r, STATUS_INVALID, "slice indices must be integers or None or have an __index__ method");
}

/* Python's slice.indices(len): the positions selected, in order. */
struct slice_plan {
    int64_t start, step;
    size_t count;
};

static bool slice_plan(struct jrender *r, const struct jv *sv[3], size_t len, struct slice_plan *p)
{
    bool gs, ge, gt;
    int64_t s = 0, e = 0, st = 1;
    if (!slice_index(r, sv[0], &gs, &s) || !slice_index(r, sv[1], &ge, &e) ||
        !slice_index(r, sv[2], &gt, &st))
        return false;
    if (!gt)
        st = 1;
    if (st == 0)
        return jr_fail(r, STATUS_INVALID, "slice step cannot be zero");
    int64_t n = (int64_t)len;
    int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? n : n - 1;
    if (!gs) {
        s = st < 0 ? upper : lower;
    } else {
        if (s < 0)
            s = s < -n ? lower : s + n;
        if (s < lower)
            s = lower;
        if (s > upper)
            s = upper;
    }
    if (!ge) {
        e = st < 0 ? lower : upper;
    } else {
        if (e < 0)
            e = e < -n ? lower : e + n;
        if (e < lower)
            e = lower;
        if (e > upper)
            e = upper;
    }
    size_t count = 0;
    if (st > 0 && s < e)
        count = (size_t)((e - s - 1) / st + 1);
    else if (st < 0 && s > e)
        count = (size_t)((s - e - 1) / (-st) + 1);
    p->start = s;
    p->step = st;
    p->count = count;
    return true;
}

/* obj[a:b:c]. jinja2 subscripts slices directly (not through getitem), so a
 * value that is not a sequence raises; but a {{ }} of a constant expression
 * is folded at compile time through getitem, which turns the error into an
 * Undefined (`folded`). */
static bool eval_slice(struct jrender *r, const struct jv *obj, const struct jv *sv[3], bool folded,
                       struct jv *out)
{
    if (obj->kind == JV_UNDEFINED)
        return jr_undefined_error(r, obj);
    struct slice_plan p;
    if (jv_is_indexable(obj)) {
        const struct jv_list *l = obj->u.l;
        if (!slice_plan(r, sv, l->len, &p) || !jr_step(r, 1 + p.count / 16))
            return false;
        if (!jv_list_new(out, p.count, l->seq))
            return jr_nomem(r);
        for (size_t k = 0; k < p.count; k++) {
            int64_t i = p.start + (int64_t)k * p.step;
            if (!jr_list_push(r, out, jv_copy(l->items[i]))) {
                jv_decref(*out);
                return false;
            }
        }
        return true;
    }
    if (obj->kind == JV_STR) {
        const char *s = obj->u.s->data;
        size_t n = obj->u.s->len;
        size_t ncp = jtext_count_cp(s, n);
        if (!slice_plan(r, sv, ncp, &p) || !jr_step(r, 1 + n / 64))
            return false;
        if (p.step == 1) {
            size_t a = jtext_cp_offset(s, n, (size_t)p.start);
            size_t b = a + jtext_cp_offset(s + a, n - a, p.count);
            return jr_str_new(r, s + a, b - a, out);
        }
        size_t *offs = malloc((ncp + 1) * sizeof *offs);
        if (!offs)
            return jr_nomem(r);
        for (size_t i = 0, k = 0; k <= ncp; k++) {
            offs[k] = i;
            if (i < n) {
                uint32_t cp;
                i += jtext_decode(s + i, n - i, &cp);
            }
        }
        struct jbuf b = jr_buf();
        bool ok = true;
        for (size_t k = 0; ok && k < p.count; k++) {
            int64_t i = p.start + (int64_t)k * p.step;
            ok = jbuf_put(&b, s + offs[i], offs[i + 1] - offs[i]);
        }
        free(offs);
        ok = ok ? jr_str_from_buf(r, &b, out) : jr_buf_fail(r, &b);
        jbuf_free(&b);
        return ok;
    }
    if (folded) {
        *out = jv_undef(JV_UNDEF_OTHER, NULL, obj->kind);
        return true;
    }
    if (obj->kind == JV_DICT)
        return jr_fail(r, STATUS_INVALID, "unhashable type: 'slice'");
    return jr_fail(r, STATUS_INVALID, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* ---- arithmetic ------------------------------------------------------------------------------ */

static bool arith_int(const struct jv *v, int64_t *out)
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

static const char *op_symbol(int op)
{
    switch (op) {
    case JOP_ADD: return "+";
    case JOP_SUB: return "-";
    case JOP_MUL: return "*";
    case JOP_DIV: return "/";
    case JOP_FLOORDIV: return "//";
    case JOP_MOD: return "%";
    case JOP_POW: return "**";
    default: return "?";
    }
}

static bool arith_overflow(struct jrender *r)
{
    return jr_fail(r, STATUS_INVALID, "integer overflow");
}

static bool repeat_seq(struct jrender *r, const struct jv *seq, int64_t times, struct jv *out)
{
    if (times < 0)
        times = 0;
    if (seq->kind == JV_STR) {
        size_t n = seq->u.s->len;
        if (n && (uint64_t)times > JINJA_MAX_OUTPUT / n)
            return jr_fail(r, STATUS_INVALID, "string longer than %zu bytes", JINJA_MAX_OUTPUT);
        struct jbuf b = jr_buf();
        bool ok = true;
        for (int64_t k = 0; ok && k < times; k++)
            ok = jbuf_put(&b, seq->u.s->data, n);
        if (ok)
            ok = jr_str_from_buf(r, &b, out);
        else
            jr_buf_fail(r, &b);
        jbuf_free(&b);
        if (ok && seq->u.s->markup)
            out->u.s->markup = 1;
        return ok;
    }
    size_t n = seq->u.l->len;
    if (n && (uint64_t)times > 1000000 / n)
        return jr_fail(r, STATUS_INVALID, "sequence too long");
    if (!jr_step(r, 1 + (uint64_t)times * n / 16))
        return false;
    if (!jv_list_new(out, (size_t)times * n, seq->u.l->seq))
        return jr_nomem(r);
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < n; i++)
            if (!jr_list_push(r, out, jv_copy(seq->u.l->items[i]))) {
                jv_decref(*out);
                return false;
            }
    return true;
}

/* Python's float floor division and modulo (Objects/floatobject.c). */
static void float_divmod(double vx, double wx, double *floordiv, double *mod)
{
    double m = fmod(vx, wx);
    double div = (vx - m) / wx;
    if (m != 0) {
        if ((wx < 0) != (m < 0)) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = copysign(0.0, wx);
    }
    double fd;
    if (div != 0) {
        fd = floor(div);
        if (div - fd > 0.5)
            fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *mod = m;
}

static bool arith_concat_str(struct jrender *r, const struct jv *a, const struct jv *b, struct jv *out)
{
    bool markup = a->u.s->markup || b->u.s->markup;
    struct jbuf buf = jr_buf();
    bool ok;
    if (markup) /* Markup.__add__ escapes the plain side */
        ok = (a->u.s->markup ? jbuf_put(&buf, a->u.s->data, a->u.s->len)
                             : jtext_html_escape(&buf, a->u.s->data, a->u.s->len)) &&
             (b->u.s->markup ? jbuf_put(&buf, b->u.s->data, b->u.s->len)
                             : jtext_html_escape(&buf, b->u.s->data, b->u.s->len));
    else
        ok = jbuf_put(&buf, a->u.s->data, a->u.s->len) && jbuf_put(&buf, b->u.s->data, b->u.s->len);
    ok = ok ? jr_str_from_buf(r, &buf, out) : jr_buf_fail(r, &buf);
    jbuf_free(&buf);
    if (ok && markup)
        out->u.s->markup = 1;
    return ok;
}

static bool arith_concat_seq(struct jrender *r, const struct jv *a, const struct jv *b, struct jv *out)
{
    size_t n = a->u.l->len + b->u.l->len;
    if (!jr_step(r, 1 + n / 16))
        return false;
    if (!jv_list_new(out, n, a->u.l->seq))
        return jr_nomem(r);
    for (size_t i = 0; i < a->u.l->len; i++)
        if (!jr_list_push(r, out, jv_copy(a->u.l->items[i])))
            goto fail;
    for (size_t i = 0; i < b->u.l->len; i++)
        if (!jr_list_push(r, out, jv_copy(b->u.l->items[i])))
            goto fail;
    return true;
fail:
    jv_decref(*out);
    return false;
}

static bool arith_int_divmod(struct jrender *r, int op, int64_t x, int64_t y, struct jv *out)
{
    if (y == 0)
        return jr_fail(r, STATUS_INVALID, "integer division or modulo by zero");
    if (x == INT64_MIN && y == -1)
        return arith_overflow(r);
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
        q--;
        m += y;
    }
    *out = jv_int(op == JOP_FLOORDIV ? q : m);
    return true;
}

static bool arith_float_divmod(struct jrender *r, int op, const struct jv *a, const struct jv *b,
                               struct jv *out)
{
    double q = jv_as_double(b);
    if (q == 0)
        return jr_fail(r, STATUS_INVALID, "float floor division or modulo by zero");
    double fd, m;
    float_divmod(jv_as_double(a), q, &fd, &m);
    *out = jv_float(op == JOP_FLOORDIV ? fd : m);
    return true;
}

/* Exponentiation by squaring, so overflow is caught at the step that causes it. */
static bool arith_int_pow(struct jrender *r, int64_t x, int64_t y, struct jv *out)
{
    int64_t acc = 1, base = x;
    int64_t e = y;
    while (e > 0) {
        if (e & 1)
            if (__builtin_mul_overflow(acc, base, &acc))
                return arith_overflow(r);
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base))
            return arith_overflow(r);
    }
    *out = jv_int(acc);
    return true;
}

static bool arith_float_pow(struct jrender *r, const struct jv *a, const struct jv *b, struct jv *out)
{
    double p = jv_as_double(a), q = jv_as_double(b);
    if (p == 0 && q < 0)
        return jr_fail(r, STATUS_INVALID, "0.0 cannot be raised to a negative power");
    if (p < 0 && q != floor(q))
        return jr_fail(r, STATUS_INVALID, "negative number raised to a fractional power");
    double z = pow(p, q);
    if (isinf(z) && !isinf(p) && !isinf(q))
        return jr_fail(r, STATUS_INVALID, "numerical result out of range");
    *out = jv_float(z);
    return true;
}

bool jr_binop(struct jrender *r, int op, const struct jv *a, const struct jv *b, struct jv *out)
{
    if (a->kind == JV_UNDEFINED)
        return jr_undefined_error(r, a);
    if (op == JOP_MOD && a->kind == JV_STR) /* str.__mod__ accepts an Undefined argument */
        return jinja_percent_format(r, a, b, out);
    if (b->kind == JV_UNDEFINED)
        return jr_undefined_error(r, b);
    int64_t x = 0, y = 0;
    bool ints = arith_int(a, &x) && arith_int(b, &y);
    bool nums = jv_is_number(a) && jv_is_number(b);
    switch (op) {
    case JOP_ADD:
        if (ints) {
            int64_t z;
            if (__builtin_add_overflow(x, y, &z))
                return arith_overflow(r);
            *out = jv_int(z);
            return true;
        }
        if (nums) {
            *out = jv_float(jv_as_double(a) + jv_as_double(b));
            return true;
        }
        if (a->kind == JV_STR && b->kind == JV_STR)
            return arith_concat_str(r, a, b, out);
        if (jv_is_indexable(a) && jv_is_indexable(b) && a->u.l->seq == b->u.l->seq)
            return arith_concat_seq(r, a, b, out);
        if (a->kind == JV_STR)
            return jr_fail(r, STATUS_INVALID, "can only concatenate str (not \"%s\") to str",
                           jv_type_name(b));
        if (jv_is_seq(a, JV_SEQ_LIST))
            return jr_fail(r, STATUS_INVALID, "can only concatenate list (not \"%s\") to list",
                           jv_type_name(b));
        break;
    case JOP_SUB:
        if (ints) {
            int64_t z;
            if (__builtin_sub_overflow(x, y, &z))
                return arith_overflow(r);
            *out = jv_int(z);
            return true;
        }
        if (nums) {
            *out = jv_float(jv_as_double(a) - jv_as_double(b));
            return true;
        }
        break;
    case JOP_MUL:
        if (ints) {
            int64_t z;
            if (__builtin_mul_overflow(x, y, &z))
                return arith_overflow(r);
            *out = jv_int(z);
            return true;
        }
        if (nums) {
            *out = jv_float(jv_as_double(a) * jv_as_double(b));
            return true;
        }
        if ((a->kind == JV_STR || jv_is_indexable(a)) && arith_int(b, &y))
            return repeat_seq(r, a, y, out);
        if ((b->kind == JV_STR || jv_is_indexable(b)) && arith_int(a, &x))
            return repeat_seq(r, b, x, out);
        break;
    case JOP_DIV:
        if (nums) {
            double q = jv_as_double(b);
            if (q == 0)
                return jr_fail(r, STATUS_INVALID, "division by zero");
            *out = jv_float(jv_as_double(a) / q);
            return true;
        }
        break;
    case JOP_FLOORDIV:
    case JOP_MOD:
        if (ints)
            return arith_int_divmod(r, op, x, y, out);
        if (nums)
            return arith_float_divmod(r, op, a, b, out);
        if (op == JOP_MOD && a->kind == JV_STR)
            return jinja_percent_format(r, a, b, out);
        break;
    case JOP_POW:
        if (ints && y >= 0)
            return arith_int_pow(r, x, y, out);
        if (nums)
            return arith_float_pow(r, a, b, out);
        break;
    default: break;
    }
    return jr_fail(r, STATUS_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'", op_symbol(op),
                   jv_type_name(a), jv_type_name(b));
}

/* jinja2's has_safe_repr: what its optimizer may put back into the template. */
static bool value_is_safe(const struct jv *v)
{
    switch (v->kind) {
    case JV_NONE:
    case JV_BOOL:
    case JV_INT:
    case JV_FLOAT:
    case JV_STR: return true;
    case JV_LIST:
        if (v->u.l->seq > JV_SEQ_TUPLE)
            return false;
        for (size_t i = 0; i < v->u.l->len; i++)
            if (!value_is_safe(&v->u.l->items[i]))
                return false;
        return true;
    case JV_DICT:
        for (size_t i = 0; i < v->u.d->len; i++)
            if (!value_is_safe(&v->u.d->e[i].key) || !value_is_safe(&v->u.d->e[i].val))
                return false;
        return true;
    default: return false;
    }
}

/* ---- expressions ----------------------------------------------------------------------------- */

static bool eval(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out);
static enum flow exec_body(struct jrender *r, struct jnode *const *body, size_t n, struct jscope *sc);

static bool enter(struct jrender *r, const struct jnode *n)
{
    r->pos = n->pos;
    if (++r->depth > JINJA_MAX_EVAL_DEPTH) {
        r->depth--;
        return jr_fail(r, STATUS_INVALID, "template recursion too deep");
    }
    if (r->steps_left == 0)
        return jr_step(r, 1);
    r->steps_left--;
    return true;
}

#define ARGS_INLINE 8

struct evargs {
    struct jv pos_buf[ARGS_INLINE];
    struct jv kw_buf[ARGS_INLINE];
    struct jv *pos; /* (n_pos) owned */
    struct jv *kw;  /* (n_kw) owned */
    size_t n_pos;
    size_t n_kw;
    struct jargs a;
};

static void evargs_free(struct evargs *ea)
{
    for (size_t i = 0; i < ea->n_pos; i++)
        jv_decref(ea->pos[i]);
    for (size_t i = 0; i < ea->n_kw; i++)
        jv_decref(ea->kw[i]);
    if (ea->pos != ea->pos_buf)
        free(ea->pos);
    if (ea->kw != ea->kw_buf)
        free(ea->kw);
    ea->n_pos = ea->n_kw = 0;
}

/* Evaluates n's args/kw_vals; ea must be freed with evargs_free either way. */
static bool eval_args(struct jrender *r, const struct jnode *n, struct jscope *sc, struct evargs *ea)
{
    ea->n_pos = ea->n_kw = 0;
    ea->pos = n->n_args <= ARGS_INLINE ? ea->pos_buf : malloc(n->n_args * sizeof *ea->pos);
    ea->kw = n->n_kw <= ARGS_INLINE ? ea->kw_buf : malloc(n->n_kw * sizeof *ea->kw);
    if (!ea->pos || !ea->kw) {
        if (!ea->pos)
            ea->pos = ea->pos_buf;
        if (!ea->kw)
            ea->kw = ea->kw_buf;
        return jr_nomem(r);
    }
    for (size_t i = 0; i < n->n_args; i++) {
        if (!eval(r, n->args[i], sc, &ea->pos[i]))
            return false;
        ea->n_pos++;
    }
    for (size_t i = 0; i < n->n_kw; i++) {
        if (!eval(r, n->kw_vals[i], sc, &ea->kw[i]))
            return false;
        ea->n_kw++;
    }
    ea->a = (struct jargs){
        .pos = ea->pos, .n_pos = ea->n_pos, .kw_names = n->kw_names, .kw_vals = ea->kw, .n_kw = ea->n_kw};
    return true;
}

/* A filter node; `input` replaces n->a == NULL (the head of a filter block's chain). */
static bool eval_filter(struct jrender *r, const struct jnode *n, struct jscope *sc, const struct jv *input,
                        struct jv *out)
{
    struct jv value;
    if (n->a) {
        if (n->a->kind == JN_FILTER && !input) {
            if (!eval(r, n->a, sc, &value))
                return false;
        } else if (n->a->kind == JN_FILTER) {
            if (!eval_filter(r, n->a, sc, input, &value))
                return false;
        } else if (!eval(r, n->a, sc, &value)) {
            return false;
        }
    } else if (input) {
        value = jv_copy(*input);
    } else {
        value = jv_undef(JV_UNDEF_OTHER, NULL, 0);
    }
    r->pos = n->pos;
    if (n->op < 0) {
        jv_decref(value);
        return jr_fail(r, STATUS_INVALID, "no filter named '%s'", n->name);
    }
    struct evargs ea;
    bool ok = eval_args(r, n, sc, &ea);
    r->pos = n->pos;
    if (ok)
        ok = jinja_filter_call(r, n->op, &value, &ea.a, out);
    evargs_free(&ea);
    jv_decref(value);
    return ok;
}

static bool eval_test(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jv value;
    if (!eval(r, n->a, sc, &value))
        return false;
    r->pos = n->pos;
    if (n->op < 0) {
        jv_decref(value);
        return jr_fail(r, STATUS_INVALID, "no test named '%s'", n->name);
    }
    struct evargs ea;
    bool res = false;
    bool ok = eval_args(r, n, sc, &ea);
    r->pos = n->pos;
    if (ok)
        ok = jinja_test_call(r, n->op, &value, &ea.a, &res);
    evargs_free(&ea);
    jv_decref(value);
    if (ok)
        *out = jv_bool(res);
    return ok;
}

static bool eval_compare(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jv left;
    if (!eval(r, n->a, sc, &left))
        return false;
    bool result = true;
    for (size_t k = 0; k < n->n_args; k++) {
        struct jv right;
        if (!eval(r, n->args[k], sc, &right)) {
            jv_decref(left);
            return false;
        }
        r->pos = n->pos;
        bool ok = true, res = false;
        int op = n->ops[k], cmp;
        switch (op) {
        case JOP_EQ: res = jv_equal(&left, &right); break;
        case JOP_NE: res = !jv_equal(&left, &right); break;
        case JOP_IN:
        case JOP_NOTIN:
            ok = jr_contains(r, &right, &left, &res);
            if (op == JOP_NOTIN)
                res = !res;
            break;
        default:
            ok = jr_compare(r, &left, &right, false, &cmp);
            res = op == JOP_LT ? cmp < 0 : op == JOP_LTEQ ? cmp <= 0 : op == JOP_GT ? cmp > 0 : cmp >= 0;
            break;
        }
        jv_decref(left);
        left = right;
        if (!ok) {
            jv_decref(left);
            return false;
        }
        if (!res) {
            result = false;
            break;
        }
    }
    jv_decref(left);
    *out = jv_bool(result);
    return true;
}

static bool eval_name(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    const struct jv *v = jscope_lookup(sc, n->name);
    if (v) {
        *out = jv_copy(*v);
        return true;
    }
    int g = jinja_global_find(n->name);
    if (g >= 0)
        return jv_func_new(out, JV_FUNC_GLOBAL, g, jv_none(), NULL, NULL) || jr_nomem(r);
    *out = jv_undef(JV_UNDEF_NAME, n->name, 0);
    return true;
}

/* Both operands of a binary node, left first (jinja2's order); on failure nothing is left to free. */
static bool eval_operands(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *a, struct jv *b)
{
    if (!eval(r, n->a, sc, a))
        return false;
    if (!eval(r, n->b, sc, b)) {
        jv_decref(*a);
        return false;
    }
    r->pos = n->pos;
    return true;
}

static bool eval_getitem(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jv obj, key;
    if (!eval_operands(r, n, sc, &obj, &key))
        return false;
    const char *hint = n->b->kind == JN_CONST && key.kind == JV_STR ? key.u.s->data : NULL;
    bool ok = jr_getitem(r, &obj, &key, hint, out);
    jv_decref(obj);
    jv_decref(key);
    return ok;
}

static bool eval_slice_expr(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jv obj, parts[3];
    const struct jv *pp[3] = {NULL, NULL, NULL};
    if (!eval(r, n->a, sc, &obj))
        return false;
    bool ok = true;
    for (size_t k = 0; ok && k < 3; k++) {
        if (!n->args[k])
            continue;
        ok = eval(r, n->args[k], sc, &parts[k]);
        if (ok)
            pp[k] = &parts[k];
    }
    r->pos = n->pos;
    if (ok)
        ok = eval_slice(r, &obj, pp, r->folding, out);
    for (size_t k = 0; k < 3; k++)
        if (pp[k])
            jv_decref(parts[k]);
    jv_decref(obj);
    return ok;
}

static bool eval_call(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jv fn;
    if (!eval(r, n->a, sc, &fn))
        return false;
    struct evargs ea;
    bool ok = eval_args(r, n, sc, &ea);
    r->pos = n->pos;
    if (ok)
        ok = jr_call(r, &fn, &ea.a, out);
    evargs_free(&ea);
    jv_decref(fn);
    return ok;
}

static bool eval_unary(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jv v;
    if (!eval(r, n->a, sc, &v))
        return false;
    r->pos = n->pos;
    bool ok = true;
    if (v.kind == JV_INT || v.kind == JV_BOOL) {
        int64_t i = v.kind == JV_INT ? v.u.i : v.u.b;
        if (n->kind == JN_NEG && i == INT64_MIN)
            ok = arith_overflow(r);
        else
            *out = jv_int(n->kind == JN_NEG ? -i : i);
    } else if (v.kind == JV_FLOAT) {
        *out = jv_float(n->kind == JN_NEG ? -v.u.f : v.u.f);
    } else if (v.kind == JV_UNDEFINED) {
        ok = jr_undefined_error(r, &v);
    } else {
        ok = jr_fail(r, STATUS_INVALID, "bad operand type for unary %s: '%s'", n->kind == JN_NEG ? "-" : "+",
                     jv_type_name(&v));
    }
    jv_decref(v);
    return ok;
}

static bool eval_binop(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jv a, b;
    if (!eval_operands(r, n, sc, &a, &b))
        return false;
    bool ok = jr_binop(r, n->op, &a, &b, out);
    jv_decref(a);
    jv_decref(b);
    return ok;
}

static bool eval_concat(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jbuf b = jr_buf();
    for (size_t i = 0; i < n->n_args; i++) {
        struct jv v;
        if (!eval(r, n->args[i], sc, &v)) {
            jbuf_free(&b);
            return false;
        }
        bool ok = jv_to_str(&b, &v);
        jv_decref(v);
        if (!ok) {
            r->pos = n->pos;
            jr_buf_fail(r, &b);
            jbuf_free(&b);
            return false;
        }
    }
    bool ok = jr_str_from_buf(r, &b, out);
    jbuf_free(&b);
    return ok;
}

static bool eval_cond(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jv c;
    if (!eval(r, n->a, sc, &c))
        return false;
    bool t = jv_truthy(&c);
    jv_decref(c);
    if (t)
        return eval(r, n->b, sc, out);
    if (n->c)
        return eval(r, n->c, sc, out);
    *out = jv_undef(JV_UNDEF_OTHER,
                    "the inline if-expression evaluated to false and no else section was defined", 0);
    return true;
}

static bool eval_list(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    if (!jv_list_new(out, n->n_args, n->kind == JN_TUPLE ? JV_SEQ_TUPLE : JV_SEQ_LIST))
        return jr_nomem(r);
    for (size_t i = 0; i < n->n_args; i++) {
        struct jv v;
        if (!eval(r, n->args[i], sc, &v) || !jr_list_push(r, out, v)) {
            jv_decref(*out);
            return false;
        }
    }
    return true;
}

static bool eval_dict(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    if (!jv_dict_new(out, JV_DICT))
        return jr_nomem(r);
    for (size_t i = 0; i < n->n_args; i++) {
        struct jv k, v;
        if (!eval(r, n->args[i], sc, &k)) {
            jv_decref(*out);
            return false;
        }
        if (!eval(r, n->vals[i], sc, &v)) {
            jv_decref(k);
            jv_decref(*out);
            return false;
        }
        r->pos = n->pos;
        if (!jr_dict_set(r, out, k, v)) {
            jv_decref(*out);
            return false;
        }
    }
    return true;
}

static bool eval_inner(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    switch (n->kind) {
    case JN_CONST: *out = jv_copy(n->value); return true;
    case JN_NAME: return eval_name(r, n, sc, out);
    case JN_GETATTR: {
        struct jv obj;
        if (!eval(r, n->a, sc, &obj))
            return false;
        r->pos = n->pos;
        bool ok = jr_getattr_hint(r, &obj, n->name, strlen(n->name), n->name, out);
        jv_decref(obj);
        return ok;
    }
    case JN_GETITEM: return eval_getitem(r, n, sc, out);
    case JN_SLICE: return eval_slice_expr(r, n, sc, out);
    case JN_CALL: return eval_call(r, n, sc, out);
    case JN_FILTER: return eval_filter(r, n, sc, NULL, out);
    case JN_TEST: return eval_test(r, n, sc, out);
    case JN_NOT: {
        struct jv v;
        if (!eval(r, n->a, sc, &v))
            return false;
        *out = jv_bool(!jv_truthy(&v));
        jv_decref(v);
        return true;
    }
    case JN_NEG:
    case JN_POS: return eval_unary(r, n, sc, out);
    case JN_BINOP: return eval_binop(r, n, sc, out);
    case JN_AND:
    case JN_OR: {
        struct jv a;
        if (!eval(r, n->a, sc, &a))
            return false;
        bool t = jv_truthy(&a);
        if ((n->kind == JN_AND) != t) {
            *out = a;
            return true;
        }
        jv_decref(a);
        return eval(r, n->b, sc, out);
    }
    case JN_CONCAT: return eval_concat(r, n, sc, out);
    case JN_COMPARE: return eval_compare(r, n, sc, out);
    case JN_COND: return eval_cond(r, n, sc, out);
    case JN_LIST:
    case JN_TUPLE: return eval_list(r, n, sc, out);
    case JN_DICT: return eval_dict(r, n, sc, out);
    default: return jr_fail(r, STATUS_INVALID, "internal error: statement used as expression");
    }
}

/* A constant subtree with a slice, evaluated as jinja2's optimizer would:
 * folded (slices through getitem) when that gives a constant it can embed,
 * or always when printed by {{ }} (`printed`); else at run time. */
static bool eval_folded(struct jrender *r, const struct jnode *n, struct jscope *sc, bool printed,
                        struct jv *out)
{
    r->folding = true;
    bool ok = eval_inner(r, n, sc, out);
    r->folding = false;
    if (ok && (printed || value_is_safe(out)))
        return true;
    if (ok)
        jv_decref(*out);
    else if (r->st == STATUS_NOMEM)
        return false;
    r->st = STATUS_OK; /* folding failed: jinja2 leaves the node to run time */
    return eval_inner(r, n, sc, out);
}

static bool eval(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    if (!enter(r, n))
        return false;
    bool ok = n->fold && !r->folding ? eval_folded(r, n, sc, false, out) : eval_inner(r, n, sc, out);
    r->depth--;
    return ok;
}

/* ---- calls ----------------------------------------------------------------------------------- */

static bool call_macro(struct jrender *r, const struct jv_func *fn, const struct jargs *a, struct jv *out)
{
    const struct jnode *m = fn->macro;
    if (a->n_pos > m->n_names)
        return jr_fail(r, STATUS_INVALID, "macro '%s' takes not more than %zu argument(s)", m->name,
                       m->n_names);
    struct jscope *sc = jscope_new(fn->closure);
    if (!sc)
        return jr_nomem(r);
    bool ok = true;
    bool *bound = calloc(m->n_names + 1, sizeof *bound);
    if (!bound)
        ok = jr_nomem(r);
    for (size_t i = 0; ok && i < a->n_pos; i++) {
        ok = jscope_set(sc, m->names[i], jv_copy(a->pos[i])) || jr_nomem(r);
        bound[i] = true;
    }
    for (size_t k = 0; ok && k < a->n_kw; k++) {
        size_t i = 0;
        while (i < m->n_names && strcmp(m->names[i], a->kw_names[k]) != 0)
            i++;
        if (i == m->n_names)
            ok = jr_fail(r, STATUS_INVALID, "macro '%s' takes no keyword argument '%s'", m->name,
                         a->kw_names[k]);
        else if (bound[i])
            ok = jr_fail(r, STATUS_INVALID, "macro '%s' got multiple values for argument '%s'", m->name,
                         m->names[i]);
        else {
            ok = jscope_set(sc, m->names[i], jv_copy(a->kw_vals[k])) || jr_nomem(r);
            bound[i] = true;
        }
    }
    for (size_t i = 0; ok && i < m->n_names; i++) {
        if (bound[i])
            continue;
        struct jv v;
        if (m->args[i]) {
            ok = eval(r, m->args[i], sc, &v);
        } else {
            v = jv_undef(JV_UNDEF_NAME, m->names[i], 0);
        }
        if (ok)
            ok = jscope_set(sc, m->names[i], v) || jr_nomem(r);
    }
    free(bound);
    if (ok) {
        struct jbuf capture = jr_buf();
        struct jbuf *saved = r->out;
        r->out = &capture;
        enum flow f = exec_body(r, m->body, m->n_body, sc);
        r->out = saved;
        ok = f != FLOW_ERROR && jr_str_from_buf(r, &capture, out);
        jbuf_free(&capture);
    }
    jscope_release(sc);
    return ok;
}

bool jr_call(struct jrender *r, const struct jv *fn, const struct jargs *args, struct jv *out)
{
    if (fn->kind == JV_UNDEFINED)
        return jr_undefined_error(r, fn);
    if (fn->kind != JV_FUNC)
        return jr_fail(r, STATUS_INVALID, "'%s' object is not callable", jv_type_name(fn));
    const struct jv_func *f = fn->u.fn;
    switch (f->kind) {
    case JV_FUNC_GLOBAL: return jinja_global_call(r, f->id, args, out);
    case JV_FUNC_METHOD: return jinja_method_call(r, f->id, &f->self, args, out);
    case JV_FUNC_MACRO: {
        if (r->depth + 8 > JINJA_MAX_EVAL_DEPTH)
            return jr_fail(r, STATUS_INVALID, "template recursion too deep");
        r->depth += 8; /* a macro frame costs more C stack than one node */
        bool ok = call_macro(r, f, args, out);
        r->depth -= 8;
        return ok;
    }
    default: return jr_fail(r, STATUS_INVALID, "object is not callable");
    }
}

/* ---- statements ------------------------------------------------------------------------------ */

static bool output_value(struct jrender *r, const struct jv *v)
{
    if (jv_to_str(r->out, v))
        return true;
    return jr_buf_fail(r, r->out);
}

static bool bind_targets(struct jrender *r, struct jscope *sc, const struct jnode *n, const struct jv *value)
{
    if (!n->unpack)
        return jscope_set(sc, n->names[0], jv_copy(*value)) || jr_nomem(r);
    struct jv items;
    if (value->kind == JV_UNDEFINED)
        return jr_undefined_error(r, value);
    if (!jr_iterate(r, value, &items))
        return false;
    size_t got = items.u.l->len;
    bool ok = true;
    if (got > n->n_names)
        ok = jr_fail(r, STATUS_INVALID, "too many values to unpack (expected %zu)", n->n_names);
    else if (got < n->n_names)
        ok = jr_fail(r, STATUS_INVALID, "not enough values to unpack (expected %zu, got %zu)", n->n_names,
                     got);
    for (size_t i = 0; ok && i < n->n_names; i++)
        ok = jscope_set(sc, n->names[i], jv_copy(items.u.l->items[i])) || jr_nomem(r);
    jv_decref(items);
    return ok;
}

/* jinja2 runs a loop's else block unless some iteration reached the end of
 * the body (so a loop that breaks or continues in every iteration runs it
 * too), in a scope of its own. */
static enum flow exec_for_else(struct jrender *r, const struct jnode *n, struct jscope *sc)
{
    if (!n->n_else)
        return FLOW_NEXT;
    struct jscope *inner = jscope_new(sc);
    if (!inner)
        return jr_nomem(r), FLOW_ERROR;
    enum flow f = exec_body(r, n->else_body, n->n_else, inner);
    jscope_release(inner);
    return f;
}

static enum flow exec_for(struct jrender *r, const struct jnode *n, struct jscope *sc)
{
    struct jv iterable, items;
    if (!eval(r, n->a, sc, &iterable))
        return FLOW_ERROR;
    r->pos = n->pos;
    bool ok = jr_iterate(r, &iterable, &items);
    jv_decref(iterable);
    if (!ok)
        return FLOW_ERROR;
    if (n->b) { /* for x in xs if cond: filter first, so loop.length counts the kept items */
        struct jv kept;
        if (!jv_list_new(&kept, items.u.l->len, JV_SEQ_LIST)) {
            jv_decref(items);
            return jr_nomem(r), FLOW_ERROR;
        }
        for (size_t i = 0; ok && i < items.u.l->len; i++) {
            struct jscope *it = jscope_new(sc);
            struct jv c;
            ok = it && jr_step(r, JINJA_LOOP_STEP_COST) && bind_targets(r, it, n, &items.u.l->items[i]) &&
                 eval(r, n->b, it, &c);
            if (!it)
                jr_nomem(r);
            if (ok) {
                if (jv_truthy(&c))
                    ok = jr_list_push(r, &kept, jv_copy(items.u.l->items[i]));
                jv_decref(c);
            }
            jscope_release(it);
        }
        jv_decref(items);
        items = kept;
        if (!ok) {
            jv_decref(items);
            return FLOW_ERROR;
        }
    }
    size_t len = items.u.l->len;
    if (len == 0) {
        jv_decref(items);
        return exec_for_else(r, n, sc);
    }
    struct jv_loop *lp = calloc(1, sizeof *lp);
    if (!lp) {
        jv_decref(items);
        return jr_nomem(r), FLOW_ERROR;
    }
    lp->refs = 1;
    lp->items = items.u.l; /* the loop object takes our reference */
    struct jv loopv = {.kind = JV_LOOP};
    loopv.u.loop = lp;
    enum flow result = FLOW_NEXT;
    bool completed = false; /* some iteration ran to the end of the body */
    for (size_t i = 0; i < len; i++) {
        lp->index0 = i;
        if (!jr_step(r, JINJA_LOOP_STEP_COST)) {
            result = FLOW_ERROR;
            break;
        }
        struct jscope *it = jscope_new(sc);
        if (!it) {
            jr_nomem(r);
            result = FLOW_ERROR;
            break;
        }
        enum flow f = FLOW_ERROR;
        if (bind_targets(r, it, n, &lp->items->items[i]) &&
            (jscope_set(it, "loop", jv_copy(loopv)) || jr_nomem(r)))
            f = exec_body(r, n->body, n->n_body, it);
        jscope_release(it);
        if (f == FLOW_NEXT)
            completed = true;
        if (f == FLOW_ERROR || f == FLOW_BREAK) {
            result = f == FLOW_ERROR ? FLOW_ERROR : FLOW_NEXT;
            break;
        }
    }
    jv_decref(loopv);
    if (result == FLOW_NEXT && !completed)
        return exec_for_else(r, n, sc);
    return result;
}

/* {% set ns.attr = v %} */
static bool assign_attr(struct jrender *r, struct jscope *sc, const struct jnode *n, struct jv v)
{
    const struct jv *ns = jscope_lookup(sc, n->name);
    if (!ns || ns->kind != JV_NS) {
        jv_decref(v);
        return jr_fail(r, STATUS_INVALID, "cannot assign attribute on non-namespace object");
    }
    if (jv_contains_ns(&v)) {
        jv_decref(v);
        return jr_fail(r, STATUS_UNSUPPORTED, "a namespace holding another namespace is not supported");
    }
    struct jv key;
    if (!jv_str_new(&key, n->attr, strlen(n->attr))) {
        jv_decref(v);
        return jr_nomem(r);
    }
    struct jv target = *ns; /* borrowed: the scope keeps it alive */
    return jr_dict_set(r, &target, key, v);
}

static bool assign(struct jrender *r, struct jscope *sc, const struct jnode *n, struct jv v)
{
    if (n->attr)
        return assign_attr(r, sc, n, v);
    bool ok = bind_targets(r, sc, n, &v);
    jv_decref(v);
    return ok;
}

/* Renders body into a new string, in a child scope. */
static enum flow capture_body(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jv *out)
{
    struct jscope *inner = jscope_new(sc);
    if (!inner)
        return jr_nomem(r), FLOW_ERROR;
    struct jbuf capture = jr_buf();
    struct jbuf *saved = r->out;
    r->out = &capture;
    enum flow f = exec_body(r, n->body, n->n_body, inner);
    r->out = saved;
    jscope_release(inner);
    if (f == FLOW_NEXT && !jr_str_from_buf(r, &capture, out))
        f = FLOW_ERROR;
    jbuf_free(&capture);
    return f;
}

static enum flow exec_stmt(struct jrender *r, const struct jnode *n, struct jscope *sc)
{
    switch (n->kind) {
    case JN_TEXT:
        if (!jbuf_put(r->out, n->value.u.s->data, n->value.u.s->len))
            return jr_buf_fail(r, r->out), FLOW_ERROR;
        return FLOW_NEXT;
    case JN_OUTPUT: {
        struct jv v;
        bool evaluated;
        if (n->a->fold && enter(r, n->a)) {
            evaluated = eval_folded(r, n->a, sc, true, &v);
            r->depth--;
        } else {
            evaluated = !n->a->fold && eval(r, n->a, sc, &v);
        }
        if (!evaluated)
            return FLOW_ERROR;
        bool ok = output_value(r, &v);
        jv_decref(v);
        return ok ? FLOW_NEXT : FLOW_ERROR;
    }
    case JN_IF: {
        struct jv c;
        if (!eval(r, n->a, sc, &c))
            return FLOW_ERROR;
        bool t = jv_truthy(&c);
        jv_decref(c);
        return t ? exec_body(r, n->body, n->n_body, sc) : exec_body(r, n->else_body, n->n_else, sc);
    }
    case JN_FOR: return exec_for(r, n, sc);
    case JN_SET: {
        struct jv v;
        if (!eval(r, n->a, sc, &v))
            return FLOW_ERROR;
        r->pos = n->pos;
        return assign(r, sc, n, v) ? FLOW_NEXT : FLOW_ERROR;
    }
    case JN_SET_BLOCK: {
        struct jv v;
        enum flow f = capture_body(r, n, sc, &v);
        if (f != FLOW_NEXT)
            return f;
        if (n->b) {
            struct jv filtered;
            bool ok = eval_filter(r, n->b, sc, &v, &filtered);
            jv_decref(v);
            if (!ok)
                return FLOW_ERROR;
            v = filtered;
        }
        r->pos = n->pos;
        return assign(r, sc, n, v) ? FLOW_NEXT : FLOW_ERROR;
    }
    case JN_MACRO: {
        struct jv fn;
        if (!jv_func_new(&fn, JV_FUNC_MACRO, 0, jv_none(), n, sc))
            return jr_nomem(r), FLOW_ERROR;
        return jscope_set(sc, n->name, fn) ? FLOW_NEXT : (jr_nomem(r), FLOW_ERROR);
    }
    case JN_FILTER_BLOCK: {
        struct jv v, filtered;
        enum flow f = capture_body(r, n, sc, &v);
        if (f != FLOW_NEXT)
            return f;
        bool ok = eval_filter(r, n->b, sc, &v, &filtered);
        jv_decref(v);
        if (!ok)
            return FLOW_ERROR;
        ok = output_value(r, &filtered);
        jv_decref(filtered);
        return ok ? FLOW_NEXT : FLOW_ERROR;
    }
    case JN_WITH: {
        struct jscope *inner = jscope_new(sc);
        if (!inner)
            return jr_nomem(r), FLOW_ERROR;
        bool ok = true;
        for (size_t i = 0; ok && i < n->n_names; i++) {
            struct jv v;
            ok = eval(r, n->args[i], sc, &v) && (jscope_set(inner, n->names[i], v) || jr_nomem(r));
        }
        enum flow f = ok ? exec_body(r, n->body, n->n_body, inner) : FLOW_ERROR;
        jscope_release(inner);
        return f;
    }
    case JN_SCOPE: {
        struct jscope *inner = jscope_new(sc);
        if (!inner)
            return jr_nomem(r), FLOW_ERROR;
        enum flow f = exec_body(r, n->body, n->n_body, inner);
        jscope_release(inner);
        return f;
    }
    case JN_BREAK: return FLOW_BREAK;
    case JN_CONTINUE: return FLOW_CONTINUE;
    default: return jr_fail(r, STATUS_INVALID, "internal error: expression used as statement"), FLOW_ERROR;
    }
}

static enum flow exec_body(struct jrender *r, struct jnode *const *body, size_t n, struct jscope *sc)
{
    for (size_t i = 0; i < n; i++) {
        if (!enter(r, body[i]))
            return FLOW_ERROR;
        enum flow f = exec_stmt(r, body[i], sc);
        r->depth--;
        if (f != FLOW_NEXT)
            return f;
    }
    return FLOW_NEXT;
}

enum status jinja_render(const struct jtemplate *t, struct jscope *globals, locale_t loc, char **out,
                         size_t *out_len, struct err *err)
{
    *out = NULL;
    *out_len = 0;
    struct jbuf ob = jr_buf();
    struct jrender r = {.t = t, .err = err, .out = &ob, .steps_left = JINJA_MAX_STEPS, .loc = loc};
    struct jscope *root = jscope_new(globals);
    if (!root)
        return err_set(err, STATUS_NOMEM, "chat template: out of memory");
    enum flow f = exec_body(&r, t->body, t->n_body, root);
    jscope_release(root);
    if (f == FLOW_ERROR || r.st) {
        jbuf_free(&ob);
        if (!r.st)
            return err_set(err, STATUS_INVALID, "chat template: render failed");
        return r.st;
    }
    if (!ob.p && !jbuf_put(&ob, "", 0))
        return err_set(err, STATUS_NOMEM, "chat template: out of memory");
    *out = ob.p;
    *out_len = ob.len;
    return STATUS_OK;
}
