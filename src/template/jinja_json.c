/* jinja_json.c — struct json -> values, and Python's json.dumps over values
 * (see jinja_json.h).
 *
 * Output matches CPython's json encoder: separators, indentation (a newline
 * and the indent per level; empty containers stay "[]"/"{}"), string escapes
 * (\" \\ \n \r \t \b \f, \u00XX for other controls, everything else raw
 * unless ensure_ascii), float repr, NaN/Infinity, non-string keys converted
 * as Python does. Recursion is bounded by the values' depth cap.
 */
#include "template/jinja_json.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_eval.h"

static enum status json_conv(const struct json *j, struct jv *out, size_t depth, struct err *err)
{
    if (depth >= JV_MAX_DEPTH - 1)
        return err_set(err, STATUS_INVALID, "chat template context: JSON nested too deeply");
    if (json_is_null(j)) {
        *out = jv_none();
        return STATUS_OK;
    }
    if (json_is_bool(j)) {
        *out = jv_bool(json_bool(j));
        return STATUS_OK;
    }
    if (json_is_number(j)) {
        double d = json_number(j);
        if (d == floor(d) && fabs(d) <= 9007199254740992.0)
            *out = jv_int((int64_t)d);
        else
            *out = jv_float(d);
        return STATUS_OK;
    }
    if (json_is_string(j)) {
        const char *s = json_string(j);
        if (!jv_str_new(out, s, strlen(s)))
            return err_set(err, STATUS_NOMEM, "chat template context: out of memory");
        return STATUS_OK;
    }
    bool obj = json_is_object(j);
    if (!obj && !json_is_array(j))
        return err_set(err, STATUS_INVALID, "chat template context: unsupported JSON value");
    if (obj ? !jv_dict_new(out, JV_DICT) : !jv_list_new(out, json_array_size(j), JV_SEQ_LIST))
        return err_set(err, STATUS_NOMEM, "chat template context: out of memory");
    for (const struct json *c = json_child(j); c; c = json_next(c)) {
        struct jv v;
        enum status st = json_conv(c, &v, depth + 1, err);
        if (st) {
            jv_decref(*out);
            return st;
        }
        bool ok;
        if (obj) {
            struct jv k;
            const char *key = json_key(c);
            ok = jv_str_new(&k, key ? key : "", key ? strlen(key) : 0);
            if (ok)
                ok = jv_dict_set(out, k, v, NULL);
            else
                jv_decref(v);
        } else {
            ok = jv_list_push(out, v, NULL);
        }
        if (!ok) {
            jv_decref(*out);
            return err_set(err, STATUS_NOMEM, "chat template context: out of memory");
        }
    }
    return STATUS_OK;
}

enum status jinja_json_to_value(const struct json *j, struct jv *out, struct err *err)
{
    return json_conv(j, out, 0, err);
}

static bool json_put_string(struct jbuf *b, const char *s, size_t n, bool ascii)
{
    if (!jbuf_putc(b, '"'))
        return false;
    size_t start = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        const char *rep = NULL;
        char tmp[16];
        size_t l = 1;
        if (c == '"')
            rep = "\\\"";
        else if (c == '\\')
            rep = "\\\\";
        else if (c == '\n')
            rep = "\\n";
        else if (c == '\r')
            rep = "\\r";
        else if (c == '\t')
            rep = "\\t";
        else if (c == '\b')
            rep = "\\b";
        else if (c == '\f')
            rep = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            rep = tmp;
        } else if (c >= 0x80 && ascii) {
            uint32_t cp;
            l = jtext_decode(s + i, n - i, &cp);
            if (l == 1 && cp >= 0x80) /* an invalid byte: Python's surrogateescape */
                cp = 0xDC00 + c;
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            }
            rep = tmp;
        }
        if (rep) {
            if (!jbuf_put(b, s + start, i - start) || !jbuf_puts(b, rep))
                return false;
            i += l;
            start = i;
        } else {
            i++;
        }
    }
    return jbuf_put(b, s + start, n - start) && jbuf_putc(b, '"');
}

static bool json_put_float(struct jbuf *b, double f)
{
    if (isnan(f))
        return jbuf_puts(b, "NaN");
    if (isinf(f))
        return jbuf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    return jtext_float_repr(b, f);
}

static bool json_newline(struct jbuf *b, const struct jinja_json_opts *o, size_t level)
{
    if (!jbuf_putc(b, '\n'))
        return false;
    for (size_t i = 0; i < level; i++)
        if (!jbuf_put(b, o->indent, o->indent_len))
            return false;
    return true;
}

/* A dict key as json.dumps converts it; false with *bad set for other types. */
static bool json_key_text(struct jbuf *b, const struct jv *k, bool *bad)
{
    switch (k->kind) {
    case JV_STR: return jbuf_put(b, k->u.s->data, k->u.s->len);
    case JV_BOOL: return jbuf_puts(b, k->u.b ? "true" : "false");
    case JV_NONE: return jbuf_puts(b, "null");
    case JV_INT: return jbuf_printf(b, "%" PRId64, k->u.i);
    case JV_FLOAT: return json_put_float(b, k->u.f);
    default: *bad = true; return false;
    }
}

struct json_ctx {
    struct jrender *r;
    const struct jinja_json_opts *o;
    struct jbuf *b;
};

static bool json_fail_buf(struct json_ctx *c)
{
    return jr_buf_fail(c->r, c->b);
}

static bool json_encode(struct json_ctx *c, const struct jv *v, size_t level);

static bool json_sep_item(struct json_ctx *c, size_t i, size_t level)
{
    const struct jinja_json_opts *o = c->o;
    if (i && !jbuf_put(c->b, o->item_sep, o->item_sep_len))
        return json_fail_buf(c);
    if (o->indent && !json_newline(c->b, o, level + 1))
        return json_fail_buf(c);
    return true;
}

static bool json_encode_dict(struct json_ctx *c, const struct jv_dict *d, size_t level)
{
    if (d->len == 0)
        return jbuf_puts(c->b, "{}") || json_fail_buf(c);
    size_t *order = malloc(d->len * sizeof *order);
    if (!order)
        return jr_nomem(c->r);
    for (size_t i = 0; i < d->len; i++)
        order[i] = i;
    bool ok = true;
    if (c->o->sort_keys) { /* insertion sort: stable, and dicts here are small */
        for (size_t i = 1; ok && i < d->len; i++) {
            size_t x = order[i], j = i;
            while (j > 0) {
                int cmp;
                ok = jr_compare(c->r, &d->e[order[j - 1]].key, &d->e[x].key, false, &cmp);
                if (!ok || cmp <= 0)
                    break;
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
    }
    if (ok && !jbuf_putc(c->b, '{'))
        ok = json_fail_buf(c);
    for (size_t i = 0; ok && i < d->len; i++) {
        const struct jv_entry *e = &d->e[order[i]];
        ok = json_sep_item(c, i, level);
        if (!ok)
            break;
        bool bad = false;
        if (e->key.kind == JV_STR) {
            ok = json_put_string(c->b, e->key.u.s->data, e->key.u.s->len, c->o->ensure_ascii);
        } else {
            struct jbuf kb = jr_buf();
            ok = json_key_text(&kb, &e->key, &bad) && json_put_string(c->b, kb.p, kb.len, c->o->ensure_ascii);
            jbuf_free(&kb);
        }
        if (!ok) {
            if (bad)
                jr_fail(c->r, STATUS_INVALID, "keys must be str, int, float, bool or None, not %s",
                        jv_type_name(&e->key));
            else
                json_fail_buf(c);
            break;
        }
        if (!jbuf_put(c->b, c->o->key_sep, c->o->key_sep_len)) {
            ok = json_fail_buf(c);
            break;
        }
        ok = json_encode(c, &e->val, level + 1);
    }
    free(order);
    if (ok && c->o->indent && !json_newline(c->b, c->o, level))
        ok = json_fail_buf(c);
    if (ok && !jbuf_putc(c->b, '}'))
        ok = json_fail_buf(c);
    return ok;
}

static bool json_encode(struct json_ctx *c, const struct jv *v, size_t level)
{
    struct jbuf *b = c->b;
    bool ok;
    switch (v->kind) {
    case JV_NONE: ok = jbuf_puts(b, "null"); break;
    case JV_BOOL: ok = jbuf_puts(b, v->u.b ? "true" : "false"); break;
    case JV_INT: ok = jbuf_printf(b, "%" PRId64, v->u.i); break;
    case JV_FLOAT: ok = json_put_float(b, v->u.f); break;
    case JV_STR: ok = json_put_string(b, v->u.s->data, v->u.s->len, c->o->ensure_ascii); break;
    case JV_LIST: {
        const struct jv_list *l = v->u.l;
        if (l->seq > JV_SEQ_TUPLE)
            return jr_fail(c->r, STATUS_INVALID, "Object of type %s is not JSON serializable",
                           jv_type_name(v));
        if (l->len == 0) {
            ok = jbuf_puts(b, "[]");
            break;
        }
        if (!jbuf_putc(b, '['))
            return json_fail_buf(c);
        for (size_t i = 0; i < l->len; i++)
            if (!json_sep_item(c, i, level) || !json_encode(c, &l->items[i], level + 1))
                return false;
        ok = (!c->o->indent || json_newline(b, c->o, level)) && jbuf_putc(b, ']');
        break;
    }
    case JV_DICT: return jr_step(c->r, v->u.d->len / 8) && json_encode_dict(c, v->u.d, level);
    case JV_UNDEFINED:
    default:
        return jr_fail(c->r, STATUS_INVALID, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
    return ok || json_fail_buf(c);
}

bool jinja_tojson(struct jrender *r, const struct jv *v, const struct jinja_json_opts *o, struct jbuf *out)
{
    struct json_ctx c = {.r = r, .o = o, .b = out};
    return json_encode(&c, v, 0);
}
