/* tok_added.c — added tokens (AddedVocabulary): matching them in text.
 *
 * Two byte tries like HF's two Aho-Corasick automata (MatchKind::
 * LeftmostLongest): [0] holds tokens with normalized == false, matched on the
 * raw text; [1] holds the others, their content passed through the
 * normalizer, matched on normalized text. A scan takes, at the leftmost
 * position where any token matches, the longest one; matches never overlap
 * and the scan resumes after a match even when single_word rejects it (as
 * find_iter does). lstrip/rstrip widen a match over White_Space; single_word
 * rejects a match touching a word char (Rust regex \w).
 * Pattern order is special tokens first, then the others, as in HF.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "format/tok_internal.h"

struct tok_trie_edge {
    unsigned char byte;
    int32_t child;
};

struct tok_trie_node {
    struct tok_trie_edge *edges; /* (n_edges) owned, unsorted (nodes have few children) */
    uint32_t n_edges, cap_edges;
    int32_t tok; /* index into tok_added.tok of the token ending here, -1 none */
};

static int32_t trie_child(const struct tok_trie *t, int32_t node, unsigned char b)
{
    if (node == 0)
        return t->root_next[b];
    const struct tok_trie_node *n = &t->nodes[node];
    for (uint32_t i = 0; i < n->n_edges; i++)
        if (n->edges[i].byte == b)
            return n->edges[i].child;
    return -1;
}

static int32_t trie_new_node(struct tok_trie *t)
{
    if (t->n_nodes == t->cap_nodes) {
        size_t cap = t->cap_nodes ? t->cap_nodes * 2 : 64;
        struct tok_trie_node *v = realloc(t->nodes, cap * sizeof *v);
        if (!v)
            return -1;
        t->nodes = v;
        t->cap_nodes = cap;
    }
    t->nodes[t->n_nodes] = (struct tok_trie_node){NULL, 0, 0, -1};
    return (int32_t)t->n_nodes++;
}

/* Adds pattern s -> token index; the first pattern with a given text wins. */
static bool trie_insert(struct tok_trie *t, const char *s, size_t len, int32_t tok)
{
    if (t->n_nodes == 0) {
        if (trie_new_node(t) < 0)
            return false;
        for (int b = 0; b < 256; b++)
            t->root_next[b] = -1;
    }
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t c = trie_child(t, node, b);
        if (c < 0) {
            if ((c = trie_new_node(t)) < 0)
                return false;
            if (node == 0) {
                t->root_next[b] = c;
            } else {
                struct tok_trie_node *n = &t->nodes[node];
                if (n->n_edges == n->cap_edges) {
                    uint32_t cap = n->cap_edges ? n->cap_edges * 2 : 2;
                    struct tok_trie_edge *e = realloc(n->edges, cap * sizeof *e);
                    if (!e)
                        return false;
                    n->edges = e;
                    n->cap_edges = cap;
                }
                n->edges[n->n_edges++] = (struct tok_trie_edge){b, c};
            }
        }
        node = c;
    }
    if (t->nodes[node].tok < 0)
        t->nodes[node].tok = tok;
    t->n_patterns++;
    return true;
}

static void trie_free(struct tok_trie *t)
{
    for (size_t i = 0; i < t->n_nodes; i++)
        free(t->nodes[i].edges);
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

enum status tok_added_build(struct tok_added *a, const struct tok_normalizer *nz, struct err *err)
{
    struct tok_scratch sc = {0};
    enum status st = STATUS_OK;
    /* HF order: special tokens, then the others */
    for (int pass = 0; pass < 2 && !st; pass++) {
        for (size_t i = 0; i < a->n && !st; i++) {
            struct tok_added_token *t = &a->tok[i];
            if (t->special != (pass == 0) || t->len == 0)
                continue;
            const char *pat = t->content;
            size_t plen = t->len;
            if (t->normalized && (st = tok_normalizer_apply(nz, &sc, t->content, t->len, &pat, &plen, err))) {
                err_prefix(err, "added token \"%.200s\"", t->content);
                break;
            }
            if (pat != t->content) { /* decoding shows this form (HF normalized_cache) */
                char *copy = tok_strdup_n(pat, plen);
                if (!copy) {
                    st = err_set(err, STATUS_NOMEM, "out of memory building the added-token trie");
                    break;
                }
                a->tok[i].text = copy;
                a->tok[i].text_len = plen;
            }
            if (plen == 0) /* an empty pattern would match everywhere */
                continue;
            if (!trie_insert(&a->trie[t->normalized], pat, plen, (int32_t)i))
                st = err_set(err, STATUS_NOMEM, "out of memory building the added-token trie");
        }
    }
    tok_scratch_free(&sc);
    return st;
}

void tok_added_free(struct tok_added *a)
{
    for (size_t i = 0; i < a->n; i++) {
        if (a->tok[i].text != a->tok[i].content)
            free(a->tok[i].text);
        free(a->tok[i].content);
    }
    free(a->tok);
    free(a->of_id);
    tok_strtab_free(&a->map);
    trie_free(&a->trie[0]);
    trie_free(&a->trie[1]);
    memset(a, 0, sizeof *a);
}

/* Last char of s[0..end) (valid UTF-8) and where it starts; -1 when end == 0. */
static int64_t char_before(const char *s, size_t end, size_t *at)
{
    if (end == 0)
        return -1;
    size_t p = end - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80)
        p--;
    uint32_t cp;
    unicode_utf8_decode(s + p, end - p, &cp);
    if (at)
        *at = p;
    return cp;
}

enum status tok_added_split(const struct tok_added *a, int which, struct tok_scratch *sc, const char *s,
                            size_t len, struct err *err)
{
    struct tok_spans *out = &sc->segs[which];
    const struct tok_trie *t = &a->trie[which];
    out->n = 0;
    size_t start_offset = 0;
    if (t->n_patterns) {
        size_t i = 0;
        while (i < len) {
            int32_t node = t->root_next[(unsigned char)s[i]];
            if (node < 0) {
                i++;
                continue;
            }
            int32_t best = -1;
            size_t best_end = 0;
            for (size_t j = i + 1;; j++) {
                if (t->nodes[node].tok >= 0) {
                    best = t->nodes[node].tok;
                    best_end = j;
                }
                if (j >= len || (node = trie_child(t, node, (unsigned char)s[j])) < 0)
                    break;
            }
            if (best < 0) {
                i++;
                continue;
            }
            const struct tok_added_token *tok = &a->tok[best];
            size_t start = i, stop = best_end;
            i = best_end; /* find_iter resumes after the match, used or not */
            if (tok->single_word) {
                int64_t before = char_before(s, start, NULL);
                uint32_t after = 0;
                if (stop < len)
                    unicode_utf8_decode(s + stop, len - stop, &after);
                if ((before >= 0 && unicode_is_word((uint32_t)before)) ||
                    (stop < len && unicode_is_word(after)))
                    continue;
            }
            if (tok->lstrip) {
                size_t ns = start;
                for (;;) {
                    size_t at;
                    int64_t c = char_before(s, ns, &at);
                    if (c < 0 || !unicode_is_whitespace((uint32_t)c))
                        break;
                    ns = at;
                }
                start = ns > start_offset ? ns : start_offset;
            }
            if (tok->rstrip) {
                while (stop < len) {
                    uint32_t c;
                    size_t k = unicode_utf8_decode(s + stop, len - stop, &c);
                    if (!unicode_is_whitespace(c))
                        break;
                    stop += k;
                }
                /* find_iter still resumes at the match end, as in HF */
            }
            if (start_offset < start && !tok_spans_push(out, start_offset, start, -1))
                return err_set(err, STATUS_NOMEM, "added tokens: out of memory");
            if (!tok_spans_push(out, start, stop, tok->id))
                return err_set(err, STATUS_NOMEM, "added tokens: out of memory");
            start_offset = stop;
        }
    }
    if (start_offset != len && !tok_spans_push(out, start_offset, len, -1))
        return err_set(err, STATUS_NOMEM, "added tokens: out of memory");
    return STATUS_OK;
}
