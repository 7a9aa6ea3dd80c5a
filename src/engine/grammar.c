/* grammar.c — the grammar builder, its checks, and the stack-set matcher (see grammar.h).
 *
 * Elements are int32: a byte class's index (>= 0), GE_END (-1) closing an alternative, or a
 * reference -(rule + 2). The finished grammar stores every alternative as a run of elements ended
 * by GE_END, and starts with the run [ref root, end] at position 0, so the start state is
 * "expand position 0 on an empty stack".
 *
 * Finishing prunes the alternatives that can derive no finite string (their rules are
 * unproductive: e.g. a required property whose schema refers to itself), so the matcher never
 * follows a path that cannot end; a root left without alternatives is refused. Left recursion is
 * refused (the expansion of a state would not terminate).
 */
#include "engine/grammar.h"

#include <stdlib.h>
#include <string.h>

enum { GE_END = -1 };

static inline int32_t ge_ref(int rule)
{
    return -(rule + 2);
}
static inline bool ge_is_ref(int32_t e)
{
    return e <= -2;
}
static inline int ge_rule(int32_t e)
{
    return -e - 2;
}

struct gram_alt_buf {
    int32_t *el; /* (cap) elements, without the closing end */
    int n, cap;
    int rule;
    int32_t prev; /* the rule's previous alternative, -1: none */
};

struct grammar {
    atomic_int refs;
    int n_rules;
    int32_t *elems;        /* (n_elems) runs closed by GE_END; [0, 2) = [ref root, end] */
    size_t n_elems;
    int32_t *rule_alt_off; /* (n_rules + 1) rule r's alternatives are alt_pos[off[r] .. off[r + 1]) */
    int32_t *alt_pos;      /* the start of each alternative in elems */
    struct gram_class *classes; /* (n_classes) */
    int n_classes;
    int n_alts;
    uint64_t fingerprint;  /* of the arrays above */
};

void gram_class_range(struct gram_class *c, unsigned lo, unsigned hi)
{
    for (unsigned b = lo; b <= hi && b < 256; b++)
        c->w[b >> 6] |= 1ull << (b & 63);
}

/* ---- builder ---- */

static bool b_ok(const struct gram_builder *b)
{
    return b->err.code == STATUS_OK;
}

static void b_fail(struct gram_builder *b, enum status st, const char *what)
{
    if (b_ok(b))
        err_set(&b->err, st, "%s", what);
}

void gram_builder_init(struct gram_builder *b)
{
    memset(b, 0, sizeof *b);
}

void gram_builder_free(struct gram_builder *b)
{
    for (int i = 0; i < b->n_alts; i++)
        free(b->alts[i].el);
    free(b->alts);
    free(b->rule_first_alt);
    free(b->classes);
    memset(b, 0, sizeof *b);
}

static bool grow(void **p, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return true;
    int nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, (size_t)nc * size);
    if (!q)
        return false;
    *p = q;
    *cap = nc;
    return true;
}

int gram_rule(struct gram_builder *b)
{
    if (!b_ok(b))
        return -1;
    if (b->n_rules >= GRAMMAR_MAX_RULES) {
        b_fail(b, STATUS_INVALID, "the grammar needs more than 65536 rules");
        return -1;
    }
    if (!grow((void **)&b->rule_first_alt, &b->cap_rules, b->n_rules + 1, sizeof(int32_t))) {
        b_fail(b, STATUS_NOMEM, "out of memory building a grammar");
        return -1;
    }
    b->rule_first_alt[b->n_rules] = -1;
    return b->n_rules++;
}

int gram_alt(struct gram_builder *b, int rule)
{
    if (!b_ok(b) || rule < 0 || rule >= b->n_rules) {
        b_fail(b, STATUS_INVALID, "gram_alt: no such rule");
        return -1;
    }
    if (b->n_elems + 1 > GRAMMAR_MAX_ELEMS) {
        b_fail(b, STATUS_INVALID, "the grammar needs more than 262144 elements");
        return -1;
    }
    if (!grow((void **)&b->alts, &b->cap_alts, b->n_alts + 1, sizeof *b->alts)) {
        b_fail(b, STATUS_NOMEM, "out of memory building a grammar");
        return -1;
    }
    b->alts[b->n_alts] = (struct gram_alt_buf){.rule = rule, .prev = b->rule_first_alt[rule]};
    b->rule_first_alt[rule] = b->n_alts;
    b->n_elems++; /* its end */
    return b->n_alts++;
}

static void push_elem(struct gram_builder *b, int alt, int32_t e)
{
    if (!b_ok(b))
        return;
    if (alt < 0 || alt >= b->n_alts) {
        b_fail(b, STATUS_INVALID, "gram_push: no such alternative");
        return;
    }
    if (b->n_elems + 1 > GRAMMAR_MAX_ELEMS) {
        b_fail(b, STATUS_INVALID, "the grammar needs more than 262144 elements");
        return;
    }
    struct gram_alt_buf *a = &b->alts[alt];
    if (!grow((void **)&a->el, &a->cap, a->n + 1, sizeof(int32_t))) {
        b_fail(b, STATUS_NOMEM, "out of memory building a grammar");
        return;
    }
    a->el[a->n++] = e;
    b->n_elems++;
}

static int class_index(struct gram_builder *b, const struct gram_class *c)
{
    for (int i = 0; i < b->n_classes; i++)
        if (memcmp(&b->classes[i], c, sizeof *c) == 0)
            return i;
    if (!grow((void **)&b->classes, &b->cap_classes, b->n_classes + 1, sizeof *c)) {
        b_fail(b, STATUS_NOMEM, "out of memory building a grammar");
        return -1;
    }
    b->classes[b->n_classes] = *c;
    return b->n_classes++;
}

void gram_push_class(struct gram_builder *b, int alt, const struct gram_class *c)
{
    if (!b_ok(b))
        return;
    int i = class_index(b, c);
    if (i >= 0)
        push_elem(b, alt, i);
}

void gram_push_bytes(struct gram_builder *b, int alt, const char *s, size_t n)
{
    for (size_t i = 0; i < n && b_ok(b); i++) {
        struct gram_class c = {{0}};
        gram_class_range(&c, (unsigned char)s[i], (unsigned char)s[i]);
        gram_push_class(b, alt, &c);
    }
}

void gram_push_ref(struct gram_builder *b, int alt, int rule)
{
    if (!b_ok(b))
        return;
    if (rule < 0 || rule >= b->n_rules) {
        b_fail(b, STATUS_INVALID, "gram_push_ref: no such rule");
        return;
    }
    push_elem(b, alt, ge_ref(rule));
}

int gram_rule_bytes(struct gram_builder *b, const char *s, size_t n)
{
    int r = gram_rule(b);
    int a = gram_alt(b, r);
    gram_push_bytes(b, a, s, n);
    return r;
}

/* (sep item){0,left} (left -1: unbounded), as a rule. */
static int repeat_tail(struct gram_builder *b, int item, int sep, int left)
{
    if (left < 0) { /* T ::= sep item T | empty */
        int t = gram_rule(b);
        int a = gram_alt(b, t);
        if (sep >= 0)
            gram_push_ref(b, a, sep);
        gram_push_ref(b, a, item);
        gram_push_ref(b, a, t);
        gram_alt(b, t);
        return t;
    }
    /* T_k ::= sep item T_{k-1} | empty, T_0 ::= empty: built from the innermost out */
    int t = gram_rule(b);
    gram_alt(b, t);
    for (int k = 1; k <= left && b_ok(b); k++) {
        int u = gram_rule(b);
        int a = gram_alt(b, u);
        if (sep >= 0)
            gram_push_ref(b, a, sep);
        gram_push_ref(b, a, item);
        gram_push_ref(b, a, t);
        gram_alt(b, u);
        t = u;
    }
    return t;
}

int gram_repeat(struct gram_builder *b, int item, int sep, int min, int max)
{
    if (!b_ok(b))
        return -1;
    if (min < 0 || (max >= 0 && max < min)) {
        b_fail(b, STATUS_INVALID, "gram_repeat: bad bounds");
        return -1;
    }
    if (max == 0) {
        int r = gram_rule(b);
        gram_alt(b, r);
        return r;
    }
    /* item (sep item){min-1 ..}: the first item, then the required ones, then the optional tail */
    int tail = repeat_tail(b, item, sep, max < 0 ? -1 : max - (min > 0 ? min : 1));
    int r = gram_rule(b);
    int a = gram_alt(b, r);
    gram_push_ref(b, a, item);
    for (int i = 1; i < min && b_ok(b); i++) {
        if (sep >= 0)
            gram_push_ref(b, a, sep);
        gram_push_ref(b, a, item);
    }
    gram_push_ref(b, a, tail);
    if (min == 0)
        gram_alt(b, r);
    return r;
}

/* ---- finishing: productive rules, pruning, left recursion ---- */

static bool class_empty(const struct gram_class *c)
{
    return !(c->w[0] | c->w[1] | c->w[2] | c->w[3]);
}

/* Rules that derive some finite string (fixed point). */
static void find_productive(const struct gram_builder *b, uint8_t *prod)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < b->n_alts; i++) {
            const struct gram_alt_buf *a = &b->alts[i];
            if (prod[a->rule])
                continue;
            bool ok = true;
            for (int k = 0; k < a->n && ok; k++)
                ok = ge_is_ref(a->el[k]) ? prod[ge_rule(a->el[k])] != 0 : !class_empty(&b->classes[a->el[k]]);
            if (ok)
                prod[a->rule] = 1, changed = true;
        }
    }
}

static bool alt_productive(const struct gram_builder *b, const struct gram_alt_buf *a, const uint8_t *prod)
{
    for (int k = 0; k < a->n; k++)
        if (ge_is_ref(a->el[k]) ? !prod[ge_rule(a->el[k])] : class_empty(&b->classes[a->el[k]]))
            return false;
    return true;
}

static void find_nullable(const struct gram_builder *b, const uint8_t *prod, uint8_t *null)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < b->n_alts; i++) {
            const struct gram_alt_buf *a = &b->alts[i];
            if (null[a->rule] || !alt_productive(b, a, prod))
                continue;
            bool ok = true;
            for (int k = 0; k < a->n && ok; k++)
                ok = ge_is_ref(a->el[k]) && null[ge_rule(a->el[k])];
            if (ok)
                null[a->rule] = 1, changed = true;
        }
    }
}

/* Left recursion: a cycle in "r may begin with s" (s referenced after only nullable elements).
 * Iterative DFS with colours (0 new, 1 on the path, 2 done). */
static bool has_left_recursion(const struct gram_builder *b, const uint8_t *prod, const uint8_t *null, int *at)
{
    int n = b->n_rules;
    uint8_t *col = calloc((size_t)n, 1);
    int32_t *st_rule = malloc((size_t)n * sizeof *st_rule);
    int32_t *st_alt = malloc((size_t)n * sizeof *st_alt); /* the alternative being scanned */
    int32_t *st_k = malloc((size_t)n * sizeof *st_k);     /* the element within it */
    bool found = false;
    if (!col || !st_rule || !st_alt || !st_k) {
        found = true;
        *at = -1;
        goto out;
    }
    for (int r0 = 0; r0 < n && !found; r0++) {
        if (col[r0])
            continue;
        int sp = 0;
        st_rule[0] = r0, st_alt[0] = b->rule_first_alt[r0], st_k[0] = 0;
        col[r0] = 1;
        while (sp >= 0 && !found) {
            int32_t ai = st_alt[sp];
            if (ai < 0) { /* every alternative scanned */
                col[st_rule[sp]] = 2;
                sp--;
                continue;
            }
            const struct gram_alt_buf *a = &b->alts[ai];
            int k = st_k[sp];
            if (k >= a->n || !alt_productive(b, a, prod) ||
                (k > 0 && !(ge_is_ref(a->el[k - 1]) && null[ge_rule(a->el[k - 1])]))) {
                st_alt[sp] = a->prev, st_k[sp] = 0;
                continue;
            }
            st_k[sp] = k + 1;
            if (!ge_is_ref(a->el[k]))
                continue; /* a byte: the rest of this alternative is not at its beginning */
            int s = ge_rule(a->el[k]);
            if (col[s] == 1) {
                found = true;
                *at = s;
            } else if (col[s] == 0) {
                col[s] = 1;
                sp++;
                st_rule[sp] = s, st_alt[sp] = b->rule_first_alt[s], st_k[sp] = 0;
            }
        }
    }
out:
    free(col), free(st_rule), free(st_alt), free(st_k);
    return found;
}

static uint64_t fingerprint_of(const struct grammar *g);

enum status gram_builder_finish(struct gram_builder *b, int root, struct grammar **out, struct err *err)
{
    *out = NULL;
    enum status st = STATUS_OK;
    uint8_t *prod = NULL, *null = NULL;
    struct grammar *g = NULL;
    if (!b_ok(b)) {
        st = err_set(err, b->err.code, "%s", b->err.msg);
        goto out;
    }
    if (root < 0 || root >= b->n_rules) {
        st = err_set(err, STATUS_INVALID, "grammar: no root rule");
        goto out;
    }
    prod = calloc((size_t)b->n_rules, 1);
    null = calloc((size_t)b->n_rules, 1);
    g = calloc(1, sizeof *g);
    if (!prod || !null || !g) {
        st = err_set(err, STATUS_NOMEM, "out of memory finishing a grammar");
        goto out;
    }
    atomic_init(&g->refs, 1); /* so that grammar_put frees it on the error paths below */
    find_productive(b, prod);
    if (!prod[root]) {
        st = err_set(err, STATUS_INVALID, "the grammar matches no finite text (a required part refers to itself)");
        goto out;
    }
    find_nullable(b, prod, null);
    int at = 0;
    if (has_left_recursion(b, prod, null, &at)) {
        st = at < 0 ? err_set(err, STATUS_NOMEM, "out of memory finishing a grammar")
                    : err_set(err, STATUS_INVALID, "grammar: rule %d is left-recursive", at);
        goto out;
    }
    /* lay out: [ref root, end], then each rule's productive alternatives */
    g->n_rules = b->n_rules;
    g->elems = malloc((b->n_elems + 2) * sizeof *g->elems);
    g->rule_alt_off = malloc(((size_t)b->n_rules + 1) * sizeof *g->rule_alt_off);
    g->alt_pos = malloc(((size_t)b->n_alts + 1) * sizeof *g->alt_pos);
    g->classes = malloc(((size_t)b->n_classes + 1) * sizeof *g->classes);
    if (!g->elems || !g->rule_alt_off || !g->alt_pos || !g->classes) {
        st = err_set(err, STATUS_NOMEM, "out of memory finishing a grammar");
        goto out;
    }
    memcpy(g->classes, b->classes, (size_t)b->n_classes * sizeof *g->classes);
    g->n_classes = b->n_classes;
    size_t ne = 0;
    g->elems[ne++] = ge_ref(root);
    g->elems[ne++] = GE_END;
    int32_t na = 0;
    int32_t *order = malloc(((size_t)b->n_alts + 1) * sizeof *order);
    if (!order) {
        st = err_set(err, STATUS_NOMEM, "out of memory finishing a grammar");
        goto out;
    }
    for (int r = 0; r < b->n_rules; r++) {
        g->rule_alt_off[r] = na;
        int n = 0; /* the chain runs newest first: lay the alternatives out in the order they were added */
        for (int32_t ai = b->rule_first_alt[r]; ai >= 0; ai = b->alts[ai].prev)
            order[n++] = ai;
        for (int i = n - 1; i >= 0; i--) {
            const struct gram_alt_buf *a = &b->alts[order[i]];
            if (!alt_productive(b, a, prod))
                continue;
            g->alt_pos[na++] = (int32_t)ne;
            if (a->n) /* an empty alternative has no element buffer (memcpy from NULL is undefined) */
                memcpy(g->elems + ne, a->el, (size_t)a->n * sizeof *a->el);
            ne += (size_t)a->n;
            g->elems[ne++] = GE_END;
        }
    }
    free(order);
    g->rule_alt_off[b->n_rules] = na;
    g->n_elems = ne;
    g->n_alts = na;
    g->fingerprint = fingerprint_of(g);
    *out = g;
    g = NULL;
out:
    free(prod);
    free(null);
    grammar_put(g);
    gram_builder_free(b);
    return st;
}

struct grammar *grammar_ref(struct grammar *g)
{
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void grammar_put(struct grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    free(g->elems);
    free(g->rule_alt_off);
    free(g->alt_pos);
    free(g->classes);
    free(g);
}

int grammar_n_rules(const struct grammar *g)
{
    return g->n_rules;
}

size_t grammar_n_elems(const struct grammar *g)
{
    return g->n_elems;
}

static uint64_t fingerprint_of(const struct grammar *g)
{
    uint64_t h = 1469598103934665603ull;
    const struct {
        const void *p;
        size_t n;
    } parts[] = {{g->elems, g->n_elems * sizeof *g->elems},
                 {g->rule_alt_off, ((size_t)g->n_rules + 1) * sizeof *g->rule_alt_off},
                 {g->alt_pos, (size_t)g->n_alts * sizeof *g->alt_pos},
                 {g->classes, (size_t)g->n_classes * sizeof *g->classes}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        for (size_t i = 0; i < parts[k].n; i++)
            h = (h ^ ((const uint8_t *)parts[k].p)[i]) * 1099511628211ull;
    return h;
}

enum status grammar_prefix(const struct grammar *prefix, const struct grammar *g, bool optional, struct grammar **out,
                           struct err *err)
{
    /* layout: [ref root, end], g's elements, prefix's elements (both without their own first two),
     * then root's alternatives: [ref prefix_root, ref g_root, end] and maybe [ref g_root, end];
     * rules: g's, prefix's (shifted by g's count), root. Classes: g's, then prefix's. */
    *out = NULL;
    const size_t ge = g->n_elems - 2, pe = prefix->n_elems - 2;
    const int nr = g->n_rules + prefix->n_rules + 1, root = nr - 1;
    const int na = g->n_alts + prefix->n_alts + (optional ? 2 : 1);
    const size_t ne = 2 + ge + pe + 3 + (optional ? 2 : 0);
    if (ne > GRAMMAR_MAX_ELEMS || nr > GRAMMAR_MAX_RULES)
        return err_set(err, STATUS_INVALID, "grammar: the prefixed grammar is past the bounds");
    struct grammar *n = calloc(1, sizeof *n);
    if (!n)
        return err_set(err, STATUS_NOMEM, "grammar: out of memory");
    atomic_init(&n->refs, 1);
    n->n_rules = nr;
    n->n_alts = na;
    n->n_elems = ne;
    n->n_classes = g->n_classes + prefix->n_classes;
    n->elems = malloc(ne * sizeof *n->elems);
    n->rule_alt_off = malloc(((size_t)nr + 1) * sizeof *n->rule_alt_off);
    n->alt_pos = malloc((size_t)na * sizeof *n->alt_pos);
    n->classes = malloc(((size_t)n->n_classes + 1) * sizeof *n->classes);
    if (!n->elems || !n->rule_alt_off || !n->alt_pos || !n->classes) {
        grammar_put(n);
        return err_set(err, STATUS_NOMEM, "grammar: out of memory");
    }
    memcpy(n->classes, g->classes, (size_t)g->n_classes * sizeof *n->classes);
    memcpy(n->classes + g->n_classes, prefix->classes, (size_t)prefix->n_classes * sizeof *n->classes);
    const int32_t g_root = ge_rule(g->elems[0]), p_root = ge_rule(prefix->elems[0]) + g->n_rules;
    size_t at = 0;
    n->elems[at++] = ge_ref(root);
    n->elems[at++] = GE_END;
    for (size_t i = 2; i < g->n_elems; i++) /* positions move by 0: both start after the header */
        n->elems[at++] = g->elems[i];
    const int32_t p_shift = (int32_t)ge; /* prefix positions: old - 2 + 2 + ge */
    for (size_t i = 2; i < prefix->n_elems; i++) {
        int32_t e = prefix->elems[i];
        n->elems[at++] = e >= 0 ? e + g->n_classes : ge_is_ref(e) ? ge_ref(ge_rule(e) + g->n_rules) : e;
    }
    int32_t a = 0;
    for (int r = 0; r < g->n_rules; r++) {
        n->rule_alt_off[r] = a;
        for (int32_t k = g->rule_alt_off[r]; k < g->rule_alt_off[r + 1]; k++)
            n->alt_pos[a++] = g->alt_pos[k];
    }
    for (int r = 0; r < prefix->n_rules; r++) {
        n->rule_alt_off[g->n_rules + r] = a;
        for (int32_t k = prefix->rule_alt_off[r]; k < prefix->rule_alt_off[r + 1]; k++)
            n->alt_pos[a++] = prefix->alt_pos[k] + p_shift;
    }
    n->rule_alt_off[root] = a;
    n->alt_pos[a++] = (int32_t)at;
    n->elems[at++] = ge_ref(p_root);
    n->elems[at++] = ge_ref(g_root);
    n->elems[at++] = GE_END;
    if (optional) {
        n->alt_pos[a++] = (int32_t)at;
        n->elems[at++] = ge_ref(g_root);
        n->elems[at++] = GE_END;
    }
    n->rule_alt_off[nr] = a;
    ASSERT(at == ne && a == na);
    n->fingerprint = fingerprint_of(n);
    *out = n;
    return STATUS_OK;
}

uint64_t grammar_fingerprint(const struct grammar *g)
{
    return g->fingerprint;
}

bool grammar_same(const struct grammar *a, const struct grammar *b)
{
    if (a == b)
        return true;
    return a->fingerprint == b->fingerprint && a->n_elems == b->n_elems && a->n_rules == b->n_rules &&
           a->n_alts == b->n_alts && a->n_classes == b->n_classes &&
           memcmp(a->elems, b->elems, a->n_elems * sizeof *a->elems) == 0 &&
           memcmp(a->rule_alt_off, b->rule_alt_off, ((size_t)a->n_rules + 1) * sizeof *a->rule_alt_off) == 0 &&
           memcmp(a->alt_pos, b->alt_pos, (size_t)a->n_alts * sizeof *a->alt_pos) == 0 &&
           memcmp(a->classes, b->classes, (size_t)a->n_classes * sizeof *a->classes) == 0;
}

/* ---- matcher ---- */

static bool grow32(struct grammar_matcher *m, void **p, int32_t *cap, int32_t need, size_t size)
{
    if (need <= *cap)
        return true;
    int32_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, (size_t)nc * size);
    if (!q) {
        m->failed = true;
        return false;
    }
    *p = q;
    *cap = nc;
    return true;
}

static int32_t node_new(struct grammar_matcher *m, int32_t pos, int32_t parent)
{
    const int32_t depth = parent >= 0 ? m->nodes[parent].depth + 1 : parent == GM_BOUNDARY ? m->cut_depth + 1 : 1;
    if (depth > GRAMMAR_MAX_DEPTH) {
        m->failed = true;
        return -1;
    }
    if (!grow32(m, (void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes))
        return -1;
    m->nodes[m->n_nodes] = (struct gm_node){pos, parent, depth};
    return m->n_nodes++;
}

/* A return frame (pos, parent), shared with an equal one made in this step (from step_nodes on). */
static int32_t frame_get(struct grammar_matcher *m, int32_t step_nodes, int32_t pos, int32_t parent)
{
    for (int32_t i = step_nodes; i < m->n_nodes; i++)
        if (m->nodes[i].pos == pos && m->nodes[i].parent == parent)
            return i;
    return node_new(m, pos, parent);
}

static void top_add(struct grammar_matcher *m, struct gm_state *to, int32_t step_nodes, int32_t pos, int32_t parent)
{
    for (int32_t i = to->begin; i < m->n_tops; i++) {
        const struct gm_node *t = &m->nodes[m->tops[i]];
        if (t->pos == pos && t->parent == parent)
            return;
    }
    if (m->n_tops - to->begin >= GRAMMAR_MAX_STACKS) {
        m->failed = true;
        return;
    }
    int32_t id = frame_get(m, step_nodes, pos, parent);
    if (id < 0 || !grow32(m, (void **)&m->tops, &m->cap_tops, m->n_tops + 1, sizeof *m->tops))
        return;
    m->tops[m->n_tops++] = id;
    const struct gram_class *c = &m->g->classes[m->g->elems[pos]];
    for (int k = 0; k < 4; k++)
        to->next.w[k] |= c->w[k];
}

/* Every top frame reachable from (pos, parent) without reading a byte joins to. */
static void expand(struct grammar_matcher *m, struct gm_state *to, int32_t step_nodes, int32_t pos, int32_t parent)
{
    const struct grammar *g = m->g;
    for (;;) {
        if (m->failed)
            return;
        int32_t e = g->elems[pos];
        if (e >= 0) {
            top_add(m, to, step_nodes, pos, parent);
            return;
        }
        if (e == GE_END) {
            if (parent == GM_BOUNDARY) {
                to->exposed = true;
                return;
            }
            if (parent < 0) {
                to->accept = true;
                return;
            }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue;
        }
        int r = ge_rule(e);
        int32_t ret = parent;
        if (g->elems[pos + 1] != GE_END && (ret = frame_get(m, step_nodes, pos + 1, parent)) < 0)
            return;
        for (int32_t a = g->rule_alt_off[r]; a < g->rule_alt_off[r + 1]; a++)
            expand(m, to, step_nodes, g->alt_pos[a], ret);
        return;
    }
}

bool grammar_matcher_step(struct grammar_matcher *m, const struct gm_state *from, uint8_t b, struct gm_state *to)
{
    *to = (struct gm_state){.begin = m->n_tops, .end = m->n_tops};
    if (m->failed || !gram_class_has(&from->next, b))
        return false;
    const int32_t step_nodes = m->n_nodes;
    for (int32_t i = from->begin; i < from->end; i++) {
        struct gm_node t = m->nodes[m->tops[i]];
        if (gram_class_has(&m->g->classes[m->g->elems[t.pos]], b))
            expand(m, to, step_nodes, t.pos + 1, t.parent);
    }
    to->end = m->n_tops;
    if (m->failed) {
        to->end = to->begin;
        to->accept = to->exposed = false;
        return false;
    }
    return to->end > to->begin || to->accept || to->exposed;
}

struct gm_mark grammar_matcher_mark(const struct grammar_matcher *m)
{
    return (struct gm_mark){m->n_nodes, m->n_tops};
}

void grammar_matcher_rewind(struct grammar_matcher *m, struct gm_mark mk)
{
    m->n_nodes = mk.n_nodes;
    m->n_tops = mk.n_tops;
}

/* Copies the frames m->cur's stacks use into fresh storage, equal frames made one (so equal
 * stacks have equal ids and repeat less), and its tops to the front. */
static void compact(struct grammar_matcher *m)
{
    const int32_t n_old = m->n_nodes;
    struct gm_node *old = m->nodes;
    struct gm_node *nw = malloc((size_t)(n_old > 0 ? n_old : 1) * sizeof *nw);
    int32_t hcap = 64;
    while (hcap < 2 * n_old)
        hcap *= 2;
    if (!nw || !grow32(m, (void **)&m->remap, &m->cap_remap, n_old + hcap, sizeof *m->remap)) {
        free(nw);
        m->failed = true;
        return;
    }
    int32_t *remap = m->remap, *hash = m->remap + n_old;
    for (int32_t i = 0; i < n_old; i++)
        remap[i] = -1;
    for (int32_t i = 0; i < hcap; i++)
        hash[i] = -1;
    int32_t n_new = 0, n_tops = 0;
    for (int32_t i = m->cur.begin; i < m->cur.end; i++) {
        /* the stack's frames down to one already copied (or the bottom), then copied bottom-up */
        int32_t id = m->tops[i], n_chain = 0;
        for (int32_t x = id; x >= 0 && remap[x] < 0; x = old[x].parent) {
            if (!grow32(m, (void **)&m->chain, &m->cap_chain, n_chain + 1, sizeof *m->chain)) {
                free(nw);
                return;
            }
            m->chain[n_chain++] = x;
        }
        while (n_chain > 0) {
            const int32_t below = m->chain[--n_chain];
            int32_t np = old[below].parent < 0 ? -1 : remap[old[below].parent];
            uint32_t h = ((uint32_t)old[below].pos * 2654435761u) ^ ((uint32_t)np * 40503u);
            int32_t slot = (int32_t)(h & (uint32_t)(hcap - 1));
            while (hash[slot] >= 0 && !(nw[hash[slot]].pos == old[below].pos && nw[hash[slot]].parent == np))
                slot = (slot + 1) & (hcap - 1);
            if (hash[slot] < 0) {
                nw[n_new] = (struct gm_node){old[below].pos, np, old[below].depth};
                hash[slot] = n_new++;
            }
            remap[below] = hash[slot];
        }
        int32_t t = remap[id];
        bool dup = false;
        for (int32_t k = 0; k < n_tops && !dup; k++)
            dup = m->tops[k] == t;
        if (!dup)
            m->tops[n_tops++] = t; /* n_tops <= i: never overwrites a top not yet read */
    }
    memcpy(old, nw, (size_t)n_new * sizeof *nw);
    free(nw);
    m->n_nodes = n_new;
    m->n_tops = n_tops;
    m->cur.begin = 0;
    m->cur.end = n_tops;
}

enum status grammar_matcher_init(struct grammar_matcher *m, struct grammar *g, struct err *err)
{
    memset(m, 0, sizeof *m);
    m->g = grammar_ref(g);
    m->cur = (struct gm_state){0};
    expand(m, &m->cur, 0, 0, -1);
    m->cur.end = m->n_tops;
    if (m->failed) {
        grammar_matcher_free(m);
        return err_set(err, STATUS_NOMEM, "grammar matcher: out of memory or too ambiguous a start");
    }
    return STATUS_OK;
}

void grammar_matcher_free(struct grammar_matcher *m)
{
    grammar_put(m->g);
    free(m->nodes);
    free(m->tops);
    free(m->remap);
    free(m->chain);
    memset(m, 0, sizeof *m);
}

bool grammar_matcher_accept_bytes(struct grammar_matcher *m, const uint8_t *s, size_t n)
{
    if (m->failed)
        return false;
    if (n == 0)
        return true;
    struct gm_mark mk = grammar_matcher_mark(m);
    struct gm_state st = m->cur, nx;
    for (size_t i = 0; i < n; i++) {
        if (!grammar_matcher_step(m, &st, s[i], &nx)) {
            bool failed = m->failed;
            grammar_matcher_rewind(m, mk);
            m->failed = failed;
            return false;
        }
        st = nx;
    }
    m->cur = st;
    compact(m);
    return !m->failed;
}

bool grammar_matcher_can_end(const struct grammar_matcher *m)
{
    return !m->failed && m->cur.accept;
}

bool grammar_matcher_done(const struct grammar_matcher *m)
{
    return grammar_matcher_can_end(m) && m->cur.end == m->cur.begin;
}

size_t grammar_matcher_key(const struct grammar_matcher *m, const struct gm_state *st, int32_t *key, size_t cap)
{
    size_t n = 0;
#define KEY_PUT(v)                                                                                                     \
    do {                                                                                                               \
        if (n < cap)                                                                                                   \
            key[n] = (v);                                                                                              \
        n++;                                                                                                           \
    } while (0)
    KEY_PUT((st->accept ? 1 : 0) | (st->exposed ? 2 : 0));
    for (int32_t i = st->begin; i < st->end; i++) {
        KEY_PUT(-1); /* stacks are separated by -1 (positions are >= 0), a cut marked by -2 */
        int32_t x = m->tops[i];
        for (; x >= 0; x = m->nodes[x].parent)
            KEY_PUT(m->nodes[x].pos);
        if (x == GM_BOUNDARY)
            KEY_PUT(-2);
    }
#undef KEY_PUT
    return n;
}

int32_t grammar_matcher_common_frame(const struct grammar_matcher *m)
{
    const struct gm_state *c = &m->cur;
    if (c->end <= c->begin)
        return -1;
    /* the first stack's frames below its top; every other stack must meet them: the deepest
     * meeting point is the frame all share nearest the tops */
    enum { MAX_CHAIN = 4096 };
    int32_t chain[MAX_CHAIN];
    int n = 0;
    for (int32_t x = m->nodes[m->tops[c->begin]].parent; x >= 0 && n < MAX_CHAIN; x = m->nodes[x].parent)
        chain[n++] = x;
    if (n == 0 || n == MAX_CHAIN)
        return -1;
    int deepest = 0;
    for (int32_t i = c->begin + 1; i < c->end; i++) {
        int at = -1;
        for (int32_t x = m->nodes[m->tops[i]].parent; x >= 0 && at < 0; x = m->nodes[x].parent)
            for (int k = 0; k < n; k++)
                if (chain[k] == x) {
                    at = k;
                    break;
                }
        if (at < 0)
            return -1;
        if (at > deepest)
            deepest = at;
    }
    return chain[deepest];
}

/* A copy of frame x with `cut` replaced by the boundary; copies are memoised in map (old ids,
 * new ids, *n of them) so stacks stay shared. */
static int32_t copy_above(struct grammar_matcher *m, int32_t x, int32_t cut, int32_t *map_old, int32_t *map_new, int *n,
                          int cap)
{
    if (x == cut)
        return GM_BOUNDARY;
    if (x < 0)
        return x; /* cannot happen for cut = the common frame; kept for safety */
    for (int i = 0; i < *n; i++)
        if (map_old[i] == x)
            return map_new[i];
    int32_t parent = copy_above(m, m->nodes[x].parent, cut, map_old, map_new, n, cap);
    if (parent < GM_BOUNDARY || m->failed)
        return -3;
    int32_t id = node_new(m, m->nodes[x].pos, parent);
    if (id >= 0 && *n < cap) {
        map_old[*n] = x;
        map_new[*n] = id;
        (*n)++;
    }
    return id < 0 ? -3 : id;
}

bool grammar_matcher_truncate(struct grammar_matcher *m, int32_t cut, struct gm_state *to)
{
    const struct gm_state c = m->cur;
    *to = (struct gm_state){.begin = m->n_tops, .end = m->n_tops, .next = c.next};
    m->cut_depth = m->nodes[cut].depth;
    /* the frames between the tops and the cut: few (the common frame is near the tops) */
    enum { MAP = 1024 };
    int32_t map_old[MAP], map_new[MAP];
    int n = 0;
    for (int32_t i = c.begin; i < c.end; i++) {
        int32_t id = copy_above(m, m->tops[i], cut, map_old, map_new, &n, MAP);
        if (id < 0 || !grow32(m, (void **)&m->tops, &m->cap_tops, m->n_tops + 1, sizeof *m->tops))
            return false;
        m->tops[m->n_tops++] = id;
    }
    to->end = m->n_tops;
    to->exposed = c.accept; /* an empty path to the bottom passes the cut */
    return true;
}
