/* jinja_parser.c — recursive-descent parser for jinja2's grammar, following
 * jinja2/parser.py production by production (precedence, tuples, test
 * arguments without parentheses, adjacent string literals), plus the arena
 * that owns the tree.
 *
 * Supported statements: if/elif/else, for (unpacking, `if` filter, else),
 * set (plain, tuple, namespace attribute, block), macro, filter, with, print,
 * break/continue (jinja2.ext.loopcontrols) and transformers' generation.
 * Refused with a clear message: block/extends/include/import/call/recursive
 * loops and star-args in calls.
 * One file over 800 lines: the productions call each other recursively, one per jinja2 rule, and
 * share the token cursor and the arena; the arena could move out.
 * Invariants: parser recursion is bounded (PARSE_MAX_DEPTH) and so is every
 * node's height (JINJA_MAX_HEIGHT), so no input can exhaust the C stack here
 * or in the evaluator's tree walks.
 */
#include "template/jinja_parser.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_builtins.h"
#include "template/jinja_lexer.h"

#define PARSE_MAX_DEPTH 200

/* ---- arena ----------------------------------------------------------------------------------- */

struct jarena_block {
    struct jarena_block *next;
    size_t size;
    _Alignas(16) unsigned char data[];
};

void *jarena_alloc(struct jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->used + n > a->size) {
        size_t size = n > 65536 ? n : 65536;
        struct jarena_block *b = malloc(sizeof *b + size);
        if (!b)
            return NULL;
        b->next = a->head;
        b->size = size;
        a->head = b;
        a->used = 0;
        a->size = size;
    }
    void *p = a->head->data + a->used;
    a->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

char *jarena_strdup(struct jarena *a, const char *s, size_t n)
{
    char *p = jarena_alloc(a, n + 1);
    if (p) {
        if (n)
            memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

bool jarena_str(struct jarena *a, const char *s, size_t n, struct jv *out)
{
    struct jv_str *o = jarena_alloc(a, sizeof *o + n + 1);
    if (!o)
        return false;
    o->refs = JV_IMMORTAL;
    o->len = n;
    if (n)
        memcpy(o->data, s, n);
    o->data[n] = '\0';
    out->kind = JV_STR;
    out->u.s = o;
    return true;
}

void jarena_free(struct jarena *a)
{
    struct jarena_block *b = a->head;
    while (b) {
        struct jarena_block *next = b->next;
        free(b);
        b = next;
    }
    memset(a, 0, sizeof *a);
}

void jtemplate_line_col(const struct jtemplate *t, uint32_t pos, unsigned *line, unsigned *col)
{
    jinja_line_col(t->src, t->src_len, pos, line, col);
}

/* ---- parser state ---------------------------------------------------------------------------- */

struct parser {
    struct jtemplate *t;
    struct jarena *a;
    const struct jtok *tok; /* (n) ends with JT_EOF */
    size_t n;
    size_t i;
    int depth;
    struct err *err;
    bool failed;
};

/* Growable arrays in the arena (outgrown copies stay there until the end). */
struct pvec {
    void **p;
    size_t n;
    size_t cap;
};

static const struct jtok *cur(const struct parser *P)
{
    return &P->tok[P->i];
}

static const struct jtok *peek(const struct parser *P)
{
    return P->i + 1 < P->n ? &P->tok[P->i + 1] : &P->tok[P->n - 1];
}

static void advance(struct parser *P)
{
    if (P->i + 1 < P->n)
        P->i++;
}

static void *parse_fail_at(struct parser *P, uint32_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void *parse_fail_at(struct parser *P, uint32_t pos, const char *fmt, ...)
{
    if (P->failed)
        return NULL;
    P->failed = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line, col;
    jinja_line_col(P->t->src, P->t->src_len, pos, &line, &col);
    err_set(P->err, STATUS_FORMAT, "chat template: line %u, column %u: %s", line, col, msg);
    return NULL;
}

static void *parse_nomem(struct parser *P)
{
    if (!P->failed) {
        P->failed = true;
        err_set(P->err, STATUS_NOMEM, "chat template: out of memory while parsing");
    }
    return NULL;
}

static const char *op_text(int op)
{
    static const char *const t[] = {
        [JOP_ADD] = "+",      [JOP_SUB] = "-",       [JOP_DIV] = "/",    [JOP_FLOORDIV] = "//",
        [JOP_MUL] = "*",      [JOP_MOD] = "%",       [JOP_POW] = "**",   [JOP_TILDE] = "~",
        [JOP_LBRACKET] = "[", [JOP_RBRACKET] = "]",  [JOP_LPAREN] = "(", [JOP_RPAREN] = ")",
        [JOP_LBRACE] = "{",   [JOP_RBRACE] = "}",    [JOP_EQ] = "==",    [JOP_NE] = "!=",
        [JOP_GT] = ">",       [JOP_GTEQ] = ">=",     [JOP_LT] = "<",     [JOP_LTEQ] = "<=",
        [JOP_ASSIGN] = "=",   [JOP_DOT] = ".",       [JOP_COLON] = ":",  [JOP_PIPE] = "|",
        [JOP_COMMA] = ",",    [JOP_SEMICOLON] = ";", [JOP_IN] = "in",    [JOP_NOTIN] = "not in",
    };
    return op >= 0 && (size_t)op < sizeof t / sizeof t[0] && t[op] ? t[op] : "?";
}

/* jinja2's describe_token, into buf. */
static const char *describe(const struct jtok *t, char *buf, size_t size)
{
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data / text";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_NAME: snprintf(buf, size, "%.*s", (int)(t->n > 64 ? 64 : t->n), t->s); return buf;
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    case JT_OP: return op_text(t->op);
    default: return "?";
    }
}

static void *parse_expected(struct parser *P, const char *what)
{
    char buf[80];
    const struct jtok *t = cur(P);
    if (t->kind == JT_EOF)
        return parse_fail_at(P, t->pos, "unexpected end of template, expected '%s'", what);
    return parse_fail_at(P, t->pos, "expected '%s', got '%s'", what, describe(t, buf, sizeof buf));
}

static bool is_op(const struct parser *P, enum jop op)
{
    return cur(P)->kind == JT_OP && cur(P)->op == op;
}

static bool tok_is_name(const struct jtok *t, const char *name)
{
    return t->kind == JT_NAME && t->n == strlen(name) && memcmp(t->s, name, t->n) == 0;
}

static bool is_name(const struct parser *P, const char *name)
{
    return tok_is_name(cur(P), name);
}

static bool expect_op(struct parser *P, enum jop op)
{
    if (is_op(P, op)) {
        advance(P);
        return true;
    }
    parse_expected(P, op_text(op));
    return false;
}

static bool expect_kind(struct parser *P, enum jtok_kind kind, const char *what)
{
    if (cur(P)->kind == kind) {
        advance(P);
        return true;
    }
    parse_expected(P, what);
    return false;
}

static const char *take_name(struct parser *P)
{
    const struct jtok *t = cur(P);
    if (t->kind != JT_NAME)
        return parse_expected(P, "name");
    char *s = jarena_strdup(P->a, t->s, t->n);
    if (!s)
        return parse_nomem(P);
    advance(P);
    return s;
}

static bool pvec_push(struct parser *P, struct pvec *v, void *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        void **p = jarena_alloc(P->a, cap * sizeof *p);
        if (!p) {
            parse_nomem(P);
            return false;
        }
        if (v->n)
            memcpy(p, v->p, v->n * sizeof *p);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return true;
}

static struct jnode *new_node(struct parser *P, enum jnode_kind kind, uint32_t pos)
{
    struct jnode *n = jarena_alloc(P->a, sizeof *n);
    if (!n)
        return parse_nomem(P);
    n->kind = (uint8_t)kind;
    n->pos = pos;
    n->op = -1;
    return n;
}

static size_t height_of(const struct jnode *n)
{
    return n ? n->height : 0;
}

static size_t height_max(struct jnode *const *v, size_t n, size_t h)
{
    for (size_t i = 0; i < n; i++)
        if (height_of(v[i]) > h)
            h = height_of(v[i]);
    return h;
}

static bool all_constant(struct jnode *const *v, size_t n, bool *slice)
{
    for (size_t i = 0; i < n; i++) {
        if (!v[i])
            continue;
        if (!v[i]->constant)
            return false;
        *slice |= v[i]->kind == JN_SLICE || v[i]->fold;
    }
    return true;
}

/* jinja2's optimizer evaluates constant subexpressions at compile time, with
 * getitem semantics for subscripts; that only changes a result where a slice
 * of a non-sequence is involved, so `fold` marks those subtrees. */
static void mark_constant(struct jnode *n)
{
    bool slice = n->kind == JN_SLICE;
    switch (n->kind) {
    case JN_CONST: n->constant = true; return;
    case JN_FILTER:
    case JN_TEST:
        if (!n->a || n->op < 0)
            return;
        /* fall through */
    case JN_GETATTR:
    case JN_GETITEM:
    case JN_SLICE:
    case JN_NOT:
    case JN_NEG:
    case JN_POS:
    case JN_BINOP:
    case JN_AND:
    case JN_OR:
    case JN_CONCAT:
    case JN_COMPARE:
    case JN_COND:
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT: {
        struct jnode *abc[3] = {n->a, n->b, n->c};
        n->constant = all_constant(abc, 3, &slice) && all_constant(n->args, n->n_args, &slice) &&
                      (!n->vals || all_constant(n->vals, n->n_args, &slice)) &&
                      all_constant(n->kw_vals, n->n_kw, &slice);
        n->fold = n->constant && slice;
        return;
    }
    default: return;
    }
}

/* Computes n's height from its (finished) children; fails past the cap. */
static struct jnode *finish(struct parser *P, struct jnode *n)
{
    if (!n)
        return NULL;
    size_t h = height_of(n->a);
    if (height_of(n->b) > h)
        h = height_of(n->b);
    if (height_of(n->c) > h)
        h = height_of(n->c);
    h = height_max(n->args, n->n_args, h);
    if (n->vals)
        h = height_max(n->vals, n->n_args, h);
    h = height_max(n->kw_vals, n->n_kw, h);
    h = height_max(n->body, n->n_body, h);
    h = height_max(n->else_body, n->n_else, h);
    if (h + 1 > JINJA_MAX_HEIGHT)
        return parse_fail_at(P, n->pos, "template nested too deeply");
    n->height = (uint16_t)(h + 1);
    mark_constant(n);
    return n;
}

static bool enter(struct parser *P)
{
    if (++P->depth > PARSE_MAX_DEPTH) {
        parse_fail_at(P, cur(P)->pos, "template nested too deeply");
        return false;
    }
    return true;
}

static void leave(struct parser *P)
{
    P->depth--;
}

/* ---- expressions ----------------------------------------------------------------------------- */

static struct jnode *parse_expression(struct parser *P, bool with_condexpr);
static struct jnode *parse_tuple(struct parser *P, bool with_condexpr, const char *extra_end,
                                 bool explicit_parens);
static struct jnode *parse_unary(struct parser *P, bool with_filter);
static struct jnode *parse_primary(struct parser *P);
static struct jnode *parse_postfix(struct parser *P, struct jnode *node);

static bool parse_call_args(struct parser *P, struct jnode *n)
{
    uint32_t pos = cur(P)->pos;
    if (!expect_op(P, JOP_LPAREN))
        return false;
    struct pvec args = {0}, kwn = {0}, kwv = {0};
    bool require_comma = false;
    while (!is_op(P, JOP_RPAREN)) {
        if (require_comma) {
            if (!expect_op(P, JOP_COMMA))
                return false;
            if (is_op(P, JOP_RPAREN))
                break;
        }
        if (is_op(P, JOP_MUL) || is_op(P, JOP_POW)) {
            parse_fail_at(P, cur(P)->pos, "*args and **kwargs in calls are not supported");
            return false;
        }
        if (cur(P)->kind == JT_NAME && peek(P)->kind == JT_OP && peek(P)->op == JOP_ASSIGN) {
            const char *key = take_name(P);
            if (!key)
                return false;
            advance(P); /* = */
            struct jnode *v = parse_expression(P, true);
            if (!v || !pvec_push(P, &kwn, (void *)key) || !pvec_push(P, &kwv, v))
                return false;
        } else {
            if (kwn.n) {
                parse_fail_at(P, pos, "invalid syntax for function call expression");
                return false;
            }
            struct jnode *v = parse_expression(P, true);
            if (!v || !pvec_push(P, &args, v))
                return false;
        }
        require_comma = true;
    }
    if (!expect_op(P, JOP_RPAREN))
        return false;
    n->args = (struct jnode **)args.p;
    n->n_args = args.n;
    n->kw_names = (const char **)kwn.p;
    n->kw_vals = (struct jnode **)kwv.p;
    n->n_kw = kwn.n;
    return true;
}

/* name(.name)* for filters and tests */
static const char *parse_dotted_name(struct parser *P)
{
    const struct jtok *t = cur(P);
    if (t->kind != JT_NAME)
        return parse_expected(P, "name");
    struct jbuf b = {0};
    bool ok = jbuf_put(&b, t->s, t->n);
    advance(P);
    while (ok && is_op(P, JOP_DOT)) {
        advance(P);
        t = cur(P);
        if (t->kind != JT_NAME) {
            jbuf_free(&b);
            return parse_expected(P, "name");
        }
        ok = jbuf_putc(&b, '.') && jbuf_put(&b, t->s, t->n);
        advance(P);
    }
    char *s = ok ? jarena_strdup(P->a, b.p, b.len) : NULL;
    jbuf_free(&b);
    return s ? s : parse_nomem(P);
}

/* A filter chain applied to `node` (NULL = the input of a filter block). */
static struct jnode *parse_filter(struct parser *P, struct jnode *node, bool start_inline)
{
    while (is_op(P, JOP_PIPE) || start_inline) {
        if (!start_inline)
            advance(P);
        start_inline = false;
        uint32_t pos = cur(P)->pos;
        const char *name = parse_dotted_name(P);
        if (!name)
            return NULL;
        struct jnode *f = new_node(P, JN_FILTER, pos);
        if (!f)
            return NULL;
        f->a = node;
        f->name = name;
        f->op = jinja_filter_find(name);
        if (is_op(P, JOP_LPAREN) && !parse_call_args(P, f))
            return NULL;
        node = finish(P, f);
        if (!node)
            return NULL;
    }
    return node;
}

static struct jnode *parse_test(struct parser *P, struct jnode *node)
{
    uint32_t pos = cur(P)->pos;
    advance(P); /* is */
    bool negated = false;
    if (is_name(P, "not")) {
        advance(P);
        negated = true;
    }
    const char *name = parse_dotted_name(P);
    if (!name)
        return NULL;
    struct jnode *t = new_node(P, JN_TEST, pos);
    if (!t)
        return NULL;
    t->a = node;
    t->name = name;
    t->op = jinja_test_find(name);
    const struct jtok *c = cur(P);
    if (is_op(P, JOP_LPAREN)) {
        if (!parse_call_args(P, t))
            return NULL;
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                (c->kind == JT_OP && (c->op == JOP_LBRACKET || c->op == JOP_LBRACE))) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is"))
            return parse_fail_at(P, c->pos, "you cannot chain multiple tests with is");
        struct jnode *arg = parse_primary(P);
        if (arg)
            arg = parse_postfix(P, arg);
        if (!arg)
            return NULL;
        struct jnode **args = jarena_alloc(P->a, sizeof *args);
        if (!args)
            return parse_nomem(P);
        args[0] = arg;
        t->args = args;
        t->n_args = 1;
    }
    if (!finish(P, t))
        return NULL;
    if (!negated)
        return t;
    struct jnode *n = new_node(P, JN_NOT, pos);
    if (!n)
        return NULL;
    n->a = t;
    return finish(P, n);
}

/* One subscript: an expression or a slice (a JN_SLICE with a == NULL). */
static struct jnode *parse_subscribed(struct parser *P)
{
    uint32_t pos = cur(P)->pos;
    struct jnode *parts[3] = {NULL, NULL, NULL};
    if (is_op(P, JOP_COLON)) {
        advance(P);
    } else {
        struct jnode *e = parse_expression(P, true);
        if (!e)
            return NULL;
        if (!is_op(P, JOP_COLON))
            return e;
        advance(P);
        parts[0] = e;
    }
    if (!is_op(P, JOP_COLON) && !is_op(P, JOP_RBRACKET) && !is_op(P, JOP_COMMA)) {
        parts[1] = parse_expression(P, true);
        if (!parts[1])
            return NULL;
    }
    if (is_op(P, JOP_COLON)) {
        advance(P);
        if (!is_op(P, JOP_RBRACKET) && !is_op(P, JOP_COMMA)) {
            parts[2] = parse_expression(P, true);
            if (!parts[2])
                return NULL;
        }
    }
    struct jnode *s = new_node(P, JN_SLICE, pos);
    struct jnode **args = jarena_alloc(P->a, 3 * sizeof *args);
    if (!s || !args)
        return parse_nomem(P);
    memcpy(args, parts, sizeof parts);
    s->args = args;
    s->n_args = 3;
    return s; /* finished by the caller once `a` is set */
}

static struct jnode *parse_subscript(struct parser *P, struct jnode *node)
{
    const struct jtok *t = cur(P);
    uint32_t pos = t->pos;
    if (t->op == JOP_DOT) {
        advance(P);
        const struct jtok *at = cur(P);
        if (at->kind == JT_NAME) {
            struct jnode *g = new_node(P, JN_GETATTR, pos);
            if (!g)
                return NULL;
            g->a = node;
            g->name = take_name(P);
            return g->name ? finish(P, g) : NULL;
        }
        if (at->kind != JT_INT)
            return parse_fail_at(P, at->pos, "expected name or number");
        struct jnode *k = new_node(P, JN_CONST, at->pos);
        struct jnode *g = new_node(P, JN_GETITEM, pos);
        if (!k || !g)
            return NULL;
        k->value = jv_int(at->i);
        advance(P);
        g->a = node;
        g->b = finish(P, k);
        return finish(P, g);
    }
    advance(P); /* [ */
    struct pvec args = {0};
    while (!is_op(P, JOP_RBRACKET)) {
        if (args.n && !expect_op(P, JOP_COMMA))
            return NULL;
        struct jnode *s = parse_subscribed(P);
        if (!s || !pvec_push(P, &args, s))
            return NULL;
    }
    if (!expect_op(P, JOP_RBRACKET))
        return NULL;
    if (args.n == 1 && ((struct jnode *)args.p[0])->kind == JN_SLICE && !((struct jnode *)args.p[0])->a) {
        struct jnode *s = args.p[0];
        s->a = node;
        return finish(P, s);
    }
    for (size_t i = 0; i < args.n; i++) {
        struct jnode *s = args.p[i];
        if (s->kind == JN_SLICE && !s->a)
            return parse_fail_at(P, s->pos, "slices inside a tuple subscript are not supported");
    }
    struct jnode *key;
    if (args.n == 1) {
        key = args.p[0];
    } else {
        key = new_node(P, JN_TUPLE, pos);
        if (!key)
            return NULL;
        key->args = (struct jnode **)args.p;
        key->n_args = args.n;
        if (!finish(P, key))
            return NULL;
    }
    struct jnode *g = new_node(P, JN_GETITEM, pos);
    if (!g)
        return NULL;
    g->a = node;
    g->b = key;
    return finish(P, g);
}

static struct jnode *parse_call(struct parser *P, struct jnode *node)
{
    struct jnode *c = new_node(P, JN_CALL, cur(P)->pos);
    if (!c)
        return NULL;
    c->a = node;
    if (!parse_call_args(P, c))
        return NULL;
    return finish(P, c);
}

static struct jnode *parse_postfix(struct parser *P, struct jnode *node)
{
    while (node) {
        if (is_op(P, JOP_DOT) || is_op(P, JOP_LBRACKET))
            node = parse_subscript(P, node);
        else if (is_op(P, JOP_LPAREN))
            node = parse_call(P, node);
        else
            break;
    }
    return node;
}

static struct jnode *parse_filter_expr(struct parser *P, struct jnode *node)
{
    while (node) {
        if (is_op(P, JOP_PIPE))
            node = parse_filter(P, node, false);
        else if (is_name(P, "is"))
            node = parse_test(P, node);
        else if (is_op(P, JOP_LPAREN))
            node = parse_call(P, node);
        else
            break;
    }
    return node;
}

static struct jnode *parse_list_items(struct parser *P, enum jnode_kind kind, enum jop close)
{
    struct jnode *n = new_node(P, kind, cur(P)->pos);
    if (!n)
        return NULL;
    advance(P); /* [ or { */
    struct pvec keys = {0}, vals = {0};
    while (!is_op(P, close)) {
        if (keys.n && !expect_op(P, JOP_COMMA))
            return NULL;
        if (is_op(P, close))
            break;
        struct jnode *k = parse_expression(P, true);
        if (!k || !pvec_push(P, &keys, k))
            return NULL;
        if (kind == JN_DICT) {
            if (!expect_op(P, JOP_COLON))
                return NULL;
            struct jnode *v = parse_expression(P, true);
            if (!v || !pvec_push(P, &vals, v))
                return NULL;
        }
    }
    if (!expect_op(P, close))
        return NULL;
    n->args = (struct jnode **)keys.p;
    n->n_args = keys.n;
    if (kind == JN_DICT)
        n->vals = (struct jnode **)vals.p;
    return finish(P, n);
}

static struct jnode *parse_primary(struct parser *P)
{
    const struct jtok *t = cur(P);
    struct jnode *n;
    switch (t->kind) {
    case JT_NAME:
        if (tok_is_name(t, "true") || tok_is_name(t, "True") || tok_is_name(t, "false") ||
            tok_is_name(t, "False")) {
            n = new_node(P, JN_CONST, t->pos);
            if (n)
                n->value = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
            advance(P);
        } else if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            n = new_node(P, JN_CONST, t->pos);
            if (n)
                n->value = jv_none();
            advance(P);
        } else {
            n = new_node(P, JN_NAME, t->pos);
            if (n && !(n->name = take_name(P)))
                return NULL;
        }
        return finish(P, n);
    case JT_STRING: {
        uint32_t pos = t->pos;
        struct jbuf b = {0};
        bool ok = true;
        while (ok && cur(P)->kind == JT_STRING) {
            ok = jbuf_put(&b, cur(P)->s, cur(P)->n);
            advance(P);
        }
        n = ok ? new_node(P, JN_CONST, pos) : NULL;
        if (n && !jarena_str(P->a, b.p ? b.p : "", b.len, &n->value))
            n = NULL;
        jbuf_free(&b);
        return n ? finish(P, n) : parse_nomem(P);
    }
    case JT_INT:
    case JT_FLOAT:
        n = new_node(P, JN_CONST, t->pos);
        if (n)
            n->value = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
        advance(P);
        return finish(P, n);
    case JT_OP:
        if (t->op == JOP_LPAREN) {
            advance(P);
            n = parse_tuple(P, true, NULL, true);
            if (!n || !expect_op(P, JOP_RPAREN))
                return NULL;
            return n;
        }
        if (t->op == JOP_LBRACKET)
            return parse_list_items(P, JN_LIST, JOP_RBRACKET);
        if (t->op == JOP_LBRACE)
            return parse_list_items(P, JN_DICT, JOP_RBRACE);
        break;
    default: break;
    }
    char buf[80];
    if (t->kind == JT_EOF)
        return parse_fail_at(P, t->pos, "unexpected end of template, expected an expression");
    return parse_fail_at(P, t->pos, "unexpected '%s'", describe(t, buf, sizeof buf));
}

static struct jnode *parse_unary(struct parser *P, bool with_filter)
{
    if (!enter(P))
        return NULL;
    struct jnode *node;
    if (is_op(P, JOP_SUB) || is_op(P, JOP_ADD)) {
        node = new_node(P, is_op(P, JOP_SUB) ? JN_NEG : JN_POS, cur(P)->pos);
        advance(P);
        if (node) {
            node->a = parse_unary(P, false);
            node = node->a ? finish(P, node) : NULL;
        }
    } else {
        node = parse_primary(P);
    }
    node = parse_postfix(P, node);
    if (with_filter)
        node = parse_filter_expr(P, node);
    leave(P);
    return node;
}

static struct jnode *make_binop(struct parser *P, enum jnode_kind kind, int op, uint32_t pos, struct jnode *a,
                                struct jnode *b)
{
    if (!a || !b)
        return NULL;
    struct jnode *n = new_node(P, kind, pos);
    if (!n)
        return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return finish(P, n);
}

static struct jnode *parse_pow(struct parser *P)
{
    struct jnode *left = parse_unary(P, true);
    while (left && is_op(P, JOP_POW)) {
        uint32_t pos = cur(P)->pos;
        advance(P);
        left = make_binop(P, JN_BINOP, JOP_POW, pos, left, parse_unary(P, true));
    }
    return left;
}

static struct jnode *parse_math2(struct parser *P)
{
    struct jnode *left = parse_pow(P);
    while (left && (is_op(P, JOP_MUL) || is_op(P, JOP_DIV) || is_op(P, JOP_FLOORDIV) || is_op(P, JOP_MOD))) {
        int op = cur(P)->op;
        uint32_t pos = cur(P)->pos;
        advance(P);
        left = make_binop(P, JN_BINOP, op, pos, left, parse_pow(P));
    }
    return left;
}

static struct jnode *parse_concat(struct parser *P)
{
    uint32_t pos = cur(P)->pos;
    struct jnode *first = parse_math2(P);
    if (!first || !is_op(P, JOP_TILDE))
        return first;
    struct pvec args = {0};
    if (!pvec_push(P, &args, first))
        return NULL;
    while (is_op(P, JOP_TILDE)) {
        advance(P);
        struct jnode *x = parse_math2(P);
        if (!x || !pvec_push(P, &args, x))
            return NULL;
    }
    struct jnode *n = new_node(P, JN_CONCAT, pos);
    if (!n)
        return NULL;
    n->args = (struct jnode **)args.p;
    n->n_args = args.n;
    return finish(P, n);
}

static struct jnode *parse_math1(struct parser *P)
{
    struct jnode *left = parse_concat(P);
    while (left && (is_op(P, JOP_ADD) || is_op(P, JOP_SUB))) {
        int op = cur(P)->op;
        uint32_t pos = cur(P)->pos;
        advance(P);
        left = make_binop(P, JN_BINOP, op, pos, left, parse_concat(P));
    }
    return left;
}

static struct jnode *parse_compare(struct parser *P)
{
    uint32_t pos = cur(P)->pos;
    struct jnode *expr = parse_math1(P);
    if (!expr)
        return NULL;
    struct pvec operands = {0};
    int ops[64];
    size_t n_ops = 0;
    for (;;) {
        const struct jtok *t = cur(P);
        int op;
        if (t->kind == JT_OP && (t->op == JOP_EQ || t->op == JOP_NE || t->op == JOP_LT || t->op == JOP_LTEQ ||
                                 t->op == JOP_GT || t->op == JOP_GTEQ)) {
            op = t->op;
            advance(P);
        } else if (is_name(P, "in")) {
            op = JOP_IN;
            advance(P);
        } else if (is_name(P, "not") && tok_is_name(peek(P), "in")) {
            op = JOP_NOTIN;
            advance(P);
            advance(P);
        } else {
            break;
        }
        if (n_ops == sizeof ops / sizeof ops[0])
            return parse_fail_at(P, t->pos, "too many chained comparisons");
        struct jnode *x = parse_math1(P);
        if (!x || !pvec_push(P, &operands, x))
            return NULL;
        ops[n_ops++] = op;
    }
    if (!n_ops)
        return expr;
    struct jnode *n = new_node(P, JN_COMPARE, pos);
    int *o = jarena_alloc(P->a, n_ops * sizeof *o);
    if (!n || !o)
        return parse_nomem(P);
    memcpy(o, ops, n_ops * sizeof *o);
    n->a = expr;
    n->args = (struct jnode **)operands.p;
    n->n_args = operands.n;
    n->ops = o;
    return finish(P, n);
}

static struct jnode *parse_not(struct parser *P)
{
    if (!is_name(P, "not"))
        return parse_compare(P);
    if (!enter(P))
        return NULL;
    struct jnode *n = new_node(P, JN_NOT, cur(P)->pos);
    advance(P);
    if (n) {
        n->a = parse_not(P);
        n = n->a ? finish(P, n) : NULL;
    }
    leave(P);
    return n;
}

static struct jnode *parse_and(struct parser *P)
{
    struct jnode *left = parse_not(P);
    while (left && is_name(P, "and")) {
        uint32_t pos = cur(P)->pos;
        advance(P);
        left = make_binop(P, JN_AND, -1, pos, left, parse_not(P));
    }
    return left;
}

static struct jnode *parse_or(struct parser *P)
{
    struct jnode *left = parse_and(P);
    while (left && is_name(P, "or")) {
        uint32_t pos = cur(P)->pos;
        advance(P);
        left = make_binop(P, JN_OR, -1, pos, left, parse_and(P));
    }
    return left;
}

static struct jnode *parse_condexpr(struct parser *P)
{
    struct jnode *expr1 = parse_or(P);
    while (expr1 && is_name(P, "if")) {
        if (!enter(P))
            return NULL;
        struct jnode *n = new_node(P, JN_COND, cur(P)->pos);
        advance(P);
        if (!n)
            return NULL;
        n->b = expr1;
        n->a = parse_or(P);
        if (!n->a)
            return NULL;
        if (is_name(P, "else")) {
            advance(P);
            n->c = parse_condexpr(P);
            if (!n->c)
                return NULL;
        }
        leave(P);
        expr1 = finish(P, n);
    }
    return expr1;
}

static struct jnode *parse_expression(struct parser *P, bool with_condexpr)
{
    return with_condexpr ? parse_condexpr(P) : parse_or(P);
}

static bool is_tuple_end(const struct parser *P, const char *extra_end)
{
    const struct jtok *t = cur(P);
    if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || t->kind == JT_EOF)
        return true;
    if (t->kind == JT_OP && t->op == JOP_RPAREN)
        return true;
    return extra_end && tok_is_name(t, extra_end);
}

static struct jnode *parse_tuple(struct parser *P, bool with_condexpr, const char *extra_end,
                                 bool explicit_parens)
{
    uint32_t pos = cur(P)->pos;
    struct pvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && !expect_op(P, JOP_COMMA))
            return NULL;
        if (is_tuple_end(P, extra_end))
            break;
        struct jnode *e = parse_expression(P, with_condexpr);
        if (!e || !pvec_push(P, &args, e))
            return NULL;
        if (is_op(P, JOP_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n)
            return args.p[0];
        if (!explicit_parens) {
            char buf[80];
            return parse_fail_at(P, cur(P)->pos, "expected an expression, got '%s'",
                                 describe(cur(P), buf, sizeof buf));
        }
    }
    struct jnode *n = new_node(P, JN_TUPLE, pos);
    if (!n)
        return NULL;
    n->args = (struct jnode **)args.p;
    n->n_args = args.n;
    return finish(P, n);
}

/* ---- statements ------------------------------------------------------------------------------ */

static bool reserved_name(const char *s)
{
    return !strcmp(s, "true") || !strcmp(s, "false") || !strcmp(s, "none") || !strcmp(s, "True") ||
           !strcmp(s, "False") || !strcmp(s, "None");
}

/* Assignment targets: `a`, `a, b`, `(a, b)`. */
static bool parse_targets(struct parser *P, struct jnode *n, const char *extra_end)
{
    struct pvec names = {0};
    bool paren = false;
    if (is_op(P, JOP_LPAREN)) {
        advance(P);
        paren = true;
    }
    bool tuple = paren;
    for (;;) {
        if (names.n && !expect_op(P, JOP_COMMA))
            return false;
        if ((paren && is_op(P, JOP_RPAREN)) || (!paren && names.n && is_tuple_end(P, extra_end)) ||
            (!paren && names.n && is_op(P, JOP_ASSIGN)))
            break;
        uint32_t pos = cur(P)->pos;
        if (is_op(P, JOP_LPAREN)) {
            parse_fail_at(P, pos, "nested tuple unpacking is not supported");
            return false;
        }
        const char *name = take_name(P);
        if (!name)
            return false;
        if (reserved_name(name)) {
            parse_fail_at(P, pos, "can't assign to '%s'", name);
            return false;
        }
        if (!pvec_push(P, &names, (void *)name))
            return false;
        if (is_op(P, JOP_COMMA))
            tuple = true;
        else
            break;
    }
    if (paren && !expect_op(P, JOP_RPAREN))
        return false;
    if (!names.n) {
        parse_expected(P, "name");
        return false;
    }
    n->names = (const char **)names.p;
    n->n_names = names.n;
    n->unpack = tuple;
    return true;
}

struct body {
    struct jnode **p;
    size_t n;
};

static bool parse_body(struct parser *P, const char *const *ends, const char *opener, uint32_t opener_pos,
                       struct body *out);

/* After a statement's head: `%}` then the body up to one of `ends`; the end
 * tag's name is left current. */
static bool parse_statements(struct parser *P, const char *const *ends, const char *opener,
                             uint32_t opener_pos, struct body *out)
{
    if (!expect_kind(P, JT_BLOCK_END, "end of statement block"))
        return false;
    return parse_body(P, ends, opener, opener_pos, out);
}

static bool expect_end_tag(struct parser *P, const char *name)
{
    if (!is_name(P, name)) {
        parse_expected(P, name);
        return false;
    }
    advance(P);
    return true;
}

static struct jnode *parse_if(struct parser *P)
{
    uint32_t pos = cur(P)->pos;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const end_only[] = {"endif", NULL};
    struct jnode *result = new_node(P, JN_IF, pos);
    struct jnode *node = result;
    struct jnode *chain[PARSE_MAX_DEPTH];
    size_t n_chain = 0;
    if (!node)
        return NULL;
    advance(P); /* if */
    for (;;) {
        node->a = parse_tuple(P, false, NULL, false);
        if (!node->a)
            return NULL;
        struct body b;
        if (!parse_statements(P, ends, "if", pos, &b))
            return NULL;
        node->body = b.p;
        node->n_body = b.n;
        if (n_chain == PARSE_MAX_DEPTH)
            return parse_fail_at(P, cur(P)->pos, "too many elif branches");
        chain[n_chain++] = node;
        if (is_name(P, "elif")) {
            struct jnode *e = new_node(P, JN_IF, cur(P)->pos);
            struct jnode **eb = jarena_alloc(P->a, sizeof *eb);
            if (!e || !eb)
                return parse_nomem(P);
            advance(P);
            eb[0] = e;
            node->else_body = eb;
            node->n_else = 1;
            node = e;
            continue;
        }
        if (is_name(P, "else")) {
            advance(P);
            if (!parse_statements(P, end_only, "if", pos, &b))
                return NULL;
            node->else_body = b.p;
            node->n_else = b.n;
        }
        if (!expect_end_tag(P, "endif"))
            return NULL;
        break;
    }
    /* heights bottom-up along the elif chain */
    for (size_t k = n_chain; k-- > 0;)
        if (!finish(P, chain[k]))
            return NULL;
    return result;
}

static struct jnode *parse_for(struct parser *P)
{
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    uint32_t pos = cur(P)->pos;
    struct jnode *n = new_node(P, JN_FOR, pos);
    if (!n)
        return NULL;
    advance(P); /* for */
    if (!parse_targets(P, n, "in"))
        return NULL;
    if (!expect_end_tag(P, "in"))
        return NULL;
    n->a = parse_tuple(P, false, "recursive", false);
    if (!n->a)
        return NULL;
    if (is_name(P, "if")) {
        advance(P);
        n->b = parse_expression(P, true);
        if (!n->b)
            return NULL;
    }
    if (is_name(P, "recursive"))
        return parse_fail_at(P, cur(P)->pos, "recursive for loops are not supported");
    struct body b;
    if (!parse_statements(P, ends, "for", pos, &b))
        return NULL;
    n->body = b.p;
    n->n_body = b.n;
    if (is_name(P, "else")) {
        advance(P);
        if (!parse_statements(P, end_only, "for", pos, &b))
            return NULL;
        n->else_body = b.p;
        n->n_else = b.n;
    }
    if (!expect_end_tag(P, "endfor"))
        return NULL;
    return finish(P, n);
}

static struct jnode *parse_set(struct parser *P)
{
    static const char *const ends[] = {"endset", NULL};
    uint32_t pos = cur(P)->pos;
    struct jnode *n = new_node(P, JN_SET, pos);
    if (!n)
        return NULL;
    advance(P); /* set */
    if (cur(P)->kind == JT_NAME && peek(P)->kind == JT_OP && peek(P)->op == JOP_DOT) {
        n->name = take_name(P);
        advance(P); /* . */
        n->attr = n->name ? take_name(P) : NULL;
        if (!n->attr)
            return NULL;
    } else if (!parse_targets(P, n, NULL)) {
        return NULL;
    }
    if (is_op(P, JOP_ASSIGN)) {
        advance(P);
        n->a = parse_tuple(P, true, NULL, false);
        return n->a ? finish(P, n) : NULL;
    }
    if (n->unpack)
        return parse_fail_at(P, pos, "a block set needs a single target");
    n->kind = JN_SET_BLOCK;
    if (is_op(P, JOP_PIPE)) {
        n->b = parse_filter(P, NULL, false);
        if (!n->b)
            return NULL;
    }
    struct body b;
    if (!parse_statements(P, ends, "set", pos, &b))
        return NULL;
    n->body = b.p;
    n->n_body = b.n;
    if (!expect_end_tag(P, "endset"))
        return NULL;
    return finish(P, n);
}

static struct jnode *parse_macro(struct parser *P)
{
    static const char *const ends[] = {"endmacro", NULL};
    uint32_t pos = cur(P)->pos;
    struct jnode *n = new_node(P, JN_MACRO, pos);
    if (!n)
        return NULL;
    advance(P); /* macro */
    uint32_t npos = cur(P)->pos;
    n->name = take_name(P);
    if (!n->name)
        return NULL;
    if (reserved_name(n->name))
        return parse_fail_at(P, npos, "can't assign to '%s'", n->name);
    if (!expect_op(P, JOP_LPAREN))
        return NULL;
    struct pvec names = {0}, defaults = {0};
    bool any_default = false;
    while (!is_op(P, JOP_RPAREN)) {
        if (names.n && !expect_op(P, JOP_COMMA))
            return NULL;
        uint32_t apos = cur(P)->pos;
        const char *arg = take_name(P);
        if (!arg)
            return NULL;
        if (reserved_name(arg))
            return parse_fail_at(P, apos, "can't assign to '%s'", arg);
        struct jnode *def = NULL;
        if (is_op(P, JOP_ASSIGN)) {
            advance(P);
            def = parse_expression(P, true);
            if (!def)
                return NULL;
            any_default = true;
        } else if (any_default) {
            return parse_fail_at(P, apos, "non-default argument follows default argument");
        }
        if (!pvec_push(P, &names, (void *)arg) || !pvec_push(P, &defaults, def))
            return NULL;
    }
    advance(P); /* ) */
    n->names = (const char **)names.p;
    n->n_names = names.n;
    n->args = (struct jnode **)defaults.p; /* defaults, aligned with names */
    n->n_args = defaults.n;
    struct body b;
    if (!parse_statements(P, ends, "macro", pos, &b))
        return NULL;
    n->body = b.p;
    n->n_body = b.n;
    if (!expect_end_tag(P, "endmacro"))
        return NULL;
    return finish(P, n);
}

static struct jnode *parse_filter_block(struct parser *P)
{
    static const char *const ends[] = {"endfilter", NULL};
    uint32_t pos = cur(P)->pos;
    struct jnode *n = new_node(P, JN_FILTER_BLOCK, pos);
    if (!n)
        return NULL;
    advance(P); /* filter */
    n->b = parse_filter(P, NULL, true);
    if (!n->b)
        return NULL;
    struct body b;
    if (!parse_statements(P, ends, "filter", pos, &b))
        return NULL;
    n->body = b.p;
    n->n_body = b.n;
    if (!expect_end_tag(P, "endfilter"))
        return NULL;
    return finish(P, n);
}

static struct jnode *parse_with(struct parser *P)
{
    static const char *const ends[] = {"endwith", NULL};
    uint32_t pos = cur(P)->pos;
    struct jnode *n = new_node(P, JN_WITH, pos);
    if (!n)
        return NULL;
    advance(P); /* with */
    struct pvec names = {0}, vals = {0};
    while (cur(P)->kind != JT_BLOCK_END) {
        if (names.n && !expect_op(P, JOP_COMMA))
            return NULL;
        uint32_t apos = cur(P)->pos;
        const char *name = take_name(P);
        if (!name)
            return NULL;
        if (reserved_name(name))
            return parse_fail_at(P, apos, "can't assign to '%s'", name);
        if (!expect_op(P, JOP_ASSIGN))
            return NULL;
        struct jnode *v = parse_expression(P, true);
        if (!v || !pvec_push(P, &names, (void *)name) || !pvec_push(P, &vals, v))
            return NULL;
    }
    n->names = (const char **)names.p;
    n->n_names = names.n;
    n->args = (struct jnode **)vals.p;
    n->n_args = vals.n;
    struct body b;
    if (!parse_statements(P, ends, "with", pos, &b))
        return NULL;
    n->body = b.p;
    n->n_body = b.n;
    if (!expect_end_tag(P, "endwith"))
        return NULL;
    return finish(P, n);
}

static struct jnode *parse_statement(struct parser *P)
{
    const struct jtok *t = cur(P);
    char buf[80];
    if (t->kind != JT_NAME) {
        if (t->kind == JT_EOF)
            return parse_fail_at(P, t->pos, "unexpected end of template, expected a tag name");
        return parse_fail_at(P, t->pos, "expected a tag name, got '%s'", describe(t, buf, sizeof buf));
    }
    if (!enter(P))
        return NULL;
    struct jnode *n = NULL;
    uint32_t pos = t->pos;
    if (is_name(P, "if")) {
        n = parse_if(P);
    } else if (is_name(P, "for")) {
        n = parse_for(P);
    } else if (is_name(P, "set")) {
        n = parse_set(P);
    } else if (is_name(P, "macro")) {
        n = parse_macro(P);
    } else if (is_name(P, "filter")) {
        n = parse_filter_block(P);
    } else if (is_name(P, "with")) {
        n = parse_with(P);
    } else if (is_name(P, "break") || is_name(P, "continue")) {
        n = new_node(P, is_name(P, "break") ? JN_BREAK : JN_CONTINUE, pos);
        advance(P);
        n = finish(P, n);
    } else if (is_name(P, "print")) {
        advance(P);
        struct jnode *cat = new_node(P, JN_CONCAT, pos);
        struct pvec args = {0};
        while (cat && cur(P)->kind != JT_BLOCK_END) {
            if (args.n && !expect_op(P, JOP_COMMA))
                return NULL;
            struct jnode *e = parse_expression(P, true);
            if (!e || !pvec_push(P, &args, e))
                return NULL;
        }
        if (cat) {
            cat->args = (struct jnode **)args.p;
            cat->n_args = args.n;
            n = new_node(P, JN_OUTPUT, pos);
            if (n)
                n->a = finish(P, cat);
            n = n && n->a ? finish(P, n) : NULL;
        }
    } else if (is_name(P, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        n = new_node(P, JN_SCOPE, pos);
        advance(P);
        struct body b;
        if (n && parse_statements(P, ends, "generation", pos, &b) && expect_end_tag(P, "endgeneration")) {
            n->body = b.p;
            n->n_body = b.n;
            n = finish(P, n);
        } else {
            n = NULL;
        }
    } else {
        static const char *const unsupported[] = {"block", "extends",    "include", "import", "from",
                                                  "call",  "autoescape", "raw",     "do",     "trans"};
        for (size_t k = 0; k < sizeof unsupported / sizeof unsupported[0]; k++)
            if (is_name(P, unsupported[k]))
                return parse_fail_at(P, pos, "'%s' tags are not supported in chat templates", unsupported[k]);
        return parse_fail_at(P, pos, "encountered unknown tag '%s'", describe(t, buf, sizeof buf));
    }
    leave(P);
    return n;
}

static bool parse_body(struct parser *P, const char *const *ends, const char *opener, uint32_t opener_pos,
                       struct body *out)
{
    struct pvec body = {0};
    for (;;) {
        const struct jtok *t = cur(P);
        if (t->kind == JT_DATA) {
            struct jnode *n = new_node(P, JN_TEXT, t->pos);
            if (!n || !jarena_str(P->a, t->s, t->n, &n->value) || !pvec_push(P, &body, finish(P, n)))
                return parse_nomem(P), false;
            advance(P);
        } else if (t->kind == JT_VAR_BEGIN) {
            advance(P);
            struct jnode *n = new_node(P, JN_OUTPUT, t->pos);
            if (!n)
                return false;
            n->a = parse_tuple(P, true, NULL, false);
            if (!n->a || !expect_kind(P, JT_VAR_END, "end of print statement"))
                return false;
            if (!pvec_push(P, &body, finish(P, n)))
                return false;
        } else if (t->kind == JT_BLOCK_BEGIN) {
            advance(P);
            if (ends) {
                for (size_t k = 0; ends[k]; k++) {
                    if (is_name(P, ends[k])) {
                        out->p = (struct jnode **)body.p;
                        out->n = body.n;
                        return true;
                    }
                }
            }
            struct jnode *n = parse_statement(P);
            if (!n || !pvec_push(P, &body, n))
                return false;
            if (!expect_kind(P, JT_BLOCK_END, "end of statement block"))
                return false;
        } else if (t->kind == JT_EOF) {
            if (ends) {
                unsigned line, col;
                jinja_line_col(P->t->src, P->t->src_len, opener_pos, &line, &col);
                char want[160] = "";
                for (size_t k = 0; ends[k]; k++) {
                    size_t l = strlen(want);
                    snprintf(want + l, sizeof want - l, "%s'%s'", k ? (ends[k + 1] ? ", " : " or ") : "",
                             ends[k]);
                }
                parse_fail_at(P, t->pos,
                              "unexpected end of template, expected %s to close the '%s' at line %u", want,
                              opener, line);
                return false;
            }
            out->p = (struct jnode **)body.p;
            out->n = body.n;
            return true;
        } else {
            char buf[80];
            parse_fail_at(P, t->pos, "unexpected '%s'", describe(t, buf, sizeof buf));
            return false;
        }
    }
}

/* ---- checks jinja2 makes when it compiles ------------------------------------------------------ */

/* Unknown filters/tests fail at compile time outside if-statements and
 * conditional expressions ("soft" frames); break/continue need a loop. */
static bool check_node(struct parser *P, const struct jnode *n, bool soft, bool in_loop);

static bool check_list(struct parser *P, struct jnode *const *v, size_t n, bool soft, bool in_loop)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] && !check_node(P, v[i], soft, in_loop))
            return false;
    return true;
}

/* A `set loop` or `for loop` anywhere in n: the node that does it, or NULL. */
static const struct jnode *find_loop_store(const struct jnode *n)
{
    if ((n->kind == JN_FOR || ((n->kind == JN_SET || n->kind == JN_SET_BLOCK) && !n->attr)))
        for (size_t i = 0; i < n->n_names; i++)
            if (!strcmp(n->names[i], "loop"))
                return n;
    for (size_t i = 0; i < n->n_body; i++) {
        const struct jnode *hit = find_loop_store(n->body[i]);
        if (hit)
            return hit;
    }
    for (size_t i = 0; i < n->n_else; i++) {
        const struct jnode *hit = find_loop_store(n->else_body[i]);
        if (hit)
            return hit;
    }
    return NULL;
}

static bool check_node(struct parser *P, const struct jnode *n, bool soft, bool in_loop)
{
    const struct jnode *hit;
    switch (n->kind) {
    case JN_FILTER:
    case JN_TEST:
        if (n->op < 0 && !soft) {
            parse_fail_at(P, n->pos, "no %s named '%s'", n->kind == JN_FILTER ? "filter" : "test", n->name);
            return false;
        }
        break;
    case JN_BREAK:
    case JN_CONTINUE:
        if (!in_loop) {
            parse_fail_at(P, n->pos, "'%s' outside loop", n->kind == JN_BREAK ? "break" : "continue");
            return false;
        }
        return true;
    case JN_IF:
    case JN_COND: soft = true; break;
    case JN_FOR: /* body and else run in inner frames */
        if ((hit = find_loop_store(n)) != NULL) {
            parse_fail_at(P, hit->pos, "can't assign to special loop variable in for-loop target");
            return false;
        }
        return (!n->a || check_node(P, n->a, soft, in_loop)) && (!n->b || check_node(P, n->b, false, true)) &&
               check_list(P, n->body, n->n_body, false, true) &&
               check_list(P, n->else_body, n->n_else, false, in_loop);
    case JN_MACRO:
        return check_list(P, n->args, n->n_args, false, false) &&
               check_list(P, n->body, n->n_body, false, false);
    case JN_SCOPE: return check_list(P, n->body, n->n_body, false, false);
    case JN_SET_BLOCK:
    case JN_FILTER_BLOCK:
        return (!n->b || check_node(P, n->b, false, in_loop)) &&
               check_list(P, n->body, n->n_body, false, in_loop);
    case JN_WITH:
        return check_list(P, n->args, n->n_args, soft, in_loop) &&
               check_list(P, n->body, n->n_body, false, in_loop);
    default: break;
    }
    return (!n->a || check_node(P, n->a, soft, in_loop)) && (!n->b || check_node(P, n->b, soft, in_loop)) &&
           (!n->c || check_node(P, n->c, soft, in_loop)) &&
           check_list(P, n->args, n->n_args, soft, in_loop) &&
           (!n->vals || check_list(P, n->vals, n->n_args, soft, in_loop)) &&
           check_list(P, n->kw_vals, n->n_kw, soft, in_loop) &&
           check_list(P, n->body, n->n_body, soft, in_loop) &&
           check_list(P, n->else_body, n->n_else, soft, in_loop);
}

/* ---- entry ----------------------------------------------------------------------------------- */

enum status jinja_parse(struct jtemplate *t, const char *src, size_t len, struct err *err)
{
    struct jtok *toks = NULL;
    size_t n_toks = 0;
    t->src = jinja_normalize_source(&t->arena, src, len, &t->src_len);
    if (!t->src) {
        jarena_free(&t->arena);
        return err_set(err, STATUS_NOMEM, "chat template: out of memory");
    }
    enum status st = jinja_lex(&t->arena, t->src, t->src_len, &toks, &n_toks, err);
    if (st) {
        jarena_free(&t->arena);
        return st;
    }
    struct parser P = {.t = t, .a = &t->arena, .tok = toks, .n = n_toks, .err = err};
    struct body b = {0};
    bool ok = parse_body(&P, NULL, NULL, 0, &b);
    if (ok) {
        t->body = b.p;
        t->n_body = b.n;
        ok = check_list(&P, t->body, t->n_body, false, false);
    }
    free(toks);
    if (!ok) {
        if (!P.failed)
            err_set(err, STATUS_FORMAT, "chat template: parse error");
        st = err && err->code ? err->code : STATUS_FORMAT;
        jarena_free(&t->arena);
        memset(t, 0, sizeof *t);
        return st;
    }
    return STATUS_OK;
}

void jinja_template_free(struct jtemplate *t)
{
    if (!t)
        return;
    jarena_free(&t->arena);
    memset(t, 0, sizeof *t);
}
