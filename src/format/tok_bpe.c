/* tok_bpe.c — the BPE model of HF tokenizers (models/bpe), byte for byte.
 *
 * Loading: vocab -> string table; merges (["a","b"] pairs or "a b" strings)
 * -> an open-addressing map (id_a, id_b) -> (rank, id of a+b); as in HF a
 * pair listed twice keeps its last rank.
 * Tokenizing one piece (BPE::merge_word + Word::merge_all): one symbol per
 * char (continuing_subword_prefix on all but the first, end_of_word_suffix on
 * the last), unknown chars via byte_fallback "<0xXX>" tokens, else unk_token
 * (fused when fuse_unk), else dropped; then a min-heap of (rank, position)
 * merges where a popped entry is applied only if the pair at its position
 * still produces the same new id. ignore_merges emits a piece found whole in
 * the vocab as one id. Pieces flagged as raw bytes (ByteLevel) are mapped to
 * their chars' ids through a 256-entry table.
 * Not done: dropout (ignored), the result cache (results are identical without).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/unicode.h"
#include "format/tok_internal.h"

struct bpe_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool gone;          /* merged into its left neighbour */
};

struct bpe_merge {
    uint32_t rank, pos;
    int32_t new_id;
    int32_t left, right; /* the pair when queued: still there = still valid, no lookup */
};

#define MERGE_EMPTY UINT64_MAX

static size_t bpe_hash(uint64_t k, size_t mask)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k & mask;
}

static bool bpe_merge_get(const struct tok_bpe *m, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id)
{
    if (!m->merges || a < 0 || b < 0)
        return false;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = bpe_hash(k, m->merge_mask);; i = (i + 1) & m->merge_mask) {
        const struct tok_merge_slot *sl = &m->merges[i];
        if (sl->key == k) {
            *rank = sl->rank;
            *new_id = sl->new_id;
            return true;
        }
        if (sl->key == MERGE_EMPTY)
            return false;
    }
}

static void bpe_merge_put(struct tok_bpe *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = bpe_hash(k, m->merge_mask);
    while (m->merges[i].key != MERGE_EMPTY && m->merges[i].key != k)
        i = (i + 1) & m->merge_mask;
    m->merges[i] = (struct tok_merge_slot){k, rank, new_id};
}

/* Looks up a merge's part; the message names the merge. */
static enum status bpe_part_id(const struct tok_bpe *m, const char *s, size_t n, const char *path, size_t i,
                               int32_t *id, struct err *err)
{
    *id = tok_strtab_get(&m->vocab, s, n);
    if (*id < 0)
        return err_set(err, STATUS_FORMAT, "%s.merges[%zu]: token \"%.*s\" is not in the vocab", path, i,
                       (int)(n > 200 ? 200 : n), s);
    return STATUS_OK;
}

static enum status bpe_parse_merges(struct tok_bpe *m, const struct json *merges, const char *path,
                                    struct err *err)
{
    if (json_is_null(merges))
        return STATUS_OK;
    if (!json_is_array(merges))
        return err_set(err, STATUS_FORMAT, "%s.merges: expected an array", path);
    size_t n = json_array_size(merges);
    if (n > UINT32_MAX / 4)
        return err_set(err, STATUS_FORMAT, "%s.merges: too many merges", path);
    size_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    m->merges = malloc(cap * sizeof *m->merges);
    if (!m->merges)
        return err_set(err, STATUS_NOMEM, "%s.merges: out of memory", path);
    for (size_t i = 0; i < cap; i++)
        m->merges[i].key = MERGE_EMPTY;
    m->merge_mask = cap - 1;
    m->n_merges = n;

    struct tok_buf joined = {0};
    enum status st = STATUS_OK;
    size_t i = 0;
    for (const struct json *e = json_child(merges); e && !st; e = json_next(e), i++) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(e)) { /* "a b": split at the first space */
            a = json_string(e);
            const char *sp = strchr(a, ' ');
            if (!sp) {
                st = err_set(err, STATUS_FORMAT, "%s.merges[%zu]: \"%.200s\" is not two tokens", path, i, a);
                break;
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_at(e, 0)) &&
                   json_is_string(json_array_at(e, 1))) {
            a = json_string(json_array_at(e, 0));
            b = json_string(json_array_at(e, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            st = err_set(err, STATUS_FORMAT, "%s.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", path, i);
            break;
        }
        int32_t ia, ib, inew;
        if ((st = bpe_part_id(m, a, la, path, i, &ia, err)) ||
            (st = bpe_part_id(m, b, lb, path, i, &ib, err)))
            break;
        /* new token = a + b without b's continuing_subword_prefix */
        size_t skip = m->prefix_len <= lb ? m->prefix_len : lb;
        joined.n = 0;
        if (!tok_buf_put(&joined, a, la) || !tok_buf_put(&joined, b + skip, lb - skip)) {
            st = err_set(err, STATUS_NOMEM, "%s.merges: out of memory", path);
            break;
        }
        if ((st = bpe_part_id(m, joined.p, joined.n, path, i, &inew, err)))
            break;
        bpe_merge_put(m, ia, ib, (uint32_t)i, inew);
    }
    tok_buf_free(&joined);
    return st;
}

enum status tok_bpe_parse(struct tok_bpe *m, const struct json *j, const char *path, struct err *err)
{
    m->unk_id = -1;
    if (!json_is_object(j))
        return err_set(err, STATUS_FORMAT, "%s: expected an object", path);
    const char *type, *unk, *prefix, *suffix;
    enum status st;
    if ((st = tok_json_str(j, "type", path, false, &type, err)))
        return st;
    if (type && strcmp(type, "BPE"))
        return err_set(err, STATUS_UNSUPPORTED, "%s.type: model \"%s\" is not supported (only BPE)", path,
                       type);
    if (!type && !json_get(j, "merges"))
        return err_set(err, STATUS_UNSUPPORTED,
                       "%s: model without type or merges is not supported (only BPE)", path);
    if ((st = tok_json_str(j, "unk_token", path, false, &unk, err)) ||
        (st = tok_json_str(j, "continuing_subword_prefix", path, false, &prefix, err)) ||
        (st = tok_json_str(j, "end_of_word_suffix", path, false, &suffix, err)) ||
        (st = tok_json_bool(j, "fuse_unk", path, false, &m->fuse_unk, err)) ||
        (st = tok_json_bool(j, "byte_fallback", path, false, &m->byte_fallback, err)) ||
        (st = tok_json_bool(j, "ignore_merges", path, false, &m->ignore_merges, err)))
        return st;
    const struct json *dropout = json_get(j, "dropout");
    if (json_is_number(dropout) && json_number(dropout) > 0)
        LOG_WARN("%s.dropout: %g ignored (encoding stays deterministic)", path, json_number(dropout));
    if (prefix && *prefix) {
        m->prefix_len = strlen(prefix);
        if (!(m->prefix = tok_strdup_n(prefix, m->prefix_len)))
            return err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    }
    if (suffix && *suffix) {
        m->suffix_len = strlen(suffix);
        if (!(m->suffix = tok_strdup_n(suffix, m->suffix_len)))
            return err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    }

    const struct json *vocab = json_get(j, "vocab");
    if (!json_is_object(vocab))
        return err_set(err, STATUS_FORMAT, "%s.vocab: expected an object", path);
    for (const struct json *e = json_child(vocab); e; e = json_next(e)) {
        const char *key = json_key(e);
        double d = json_number(e);
        if (!json_is_number(e) || !(d >= 0 && d < (double)INT32_MAX - 1) || d != (double)(int32_t)d)
            return err_set(err, STATUS_FORMAT, "%s.vocab[\"%.200s\"]: expected an id in [0, 2^31-2]", path,
                           key);
        char p[512];
        snprintf(p, sizeof p, "%s.vocab key", path);
        if ((st = tok_json_check_utf8(key, p, err)) ||
            (st = tok_strtab_put(&m->vocab, key, strlen(key), (int32_t)d, err)))
            return st;
    }
    if ((size_t)m->vocab.n_ids > TOK_MAX_ID(m->vocab.n_ent))
        return err_set(err, STATUS_FORMAT, "%s.vocab: ids up to %d for %zu tokens (too sparse)", path,
                       (int)m->vocab.n_ids - 1, m->vocab.n_ent);
    if ((st = tok_strtab_index(&m->vocab, err)))
        return st;
    if (unk) {
        m->unk_id = tok_strtab_get(&m->vocab, unk, strlen(unk));
        if (m->unk_id < 0)
            return err_set(err, STATUS_FORMAT, "%s.unk_token: \"%.200s\" is not in the vocab", path, unk);
    }
    if ((st = bpe_parse_merges(m, json_get(j, "merges"), path, err)))
        return st;

    m->char_ids = malloc(TOK_CHAR_TABLE * sizeof *m->char_ids);
    if (!m->char_ids)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    for (uint32_t cp = 0; cp < TOK_CHAR_TABLE; cp++) {
        char u[4];
        size_t n = unicode_utf8_encode(cp, u);
        m->char_ids[cp] = (cp >= 0xD800 && cp <= 0xDFFF) ? -1 : tok_strtab_get(&m->vocab, u, n);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->fallback_ids[b] = tok_strtab_get(&m->vocab, name, 6);
        m->bytelevel_ids[b] = m->char_ids[tok_bytelevel_char((unsigned char)b)];
    }
    return STATUS_OK;
}

void tok_bpe_free(struct tok_bpe *m)
{
    tok_strtab_free(&m->vocab);
    free(m->merges);
    free(m->prefix);
    free(m->suffix);
    free(m->char_ids);
    memset(m, 0, sizeof *m);
}

/* ---- tokenizing ---- */

static bool bpe_reserve(struct tok_scratch *sc, size_t n)
{
    if (n <= sc->cap_sym)
        return true;
    size_t cap = sc->cap_sym ? sc->cap_sym : 64;
    while (cap < n)
        cap *= 2;
    struct bpe_sym *s = realloc(sc->sym, cap * sizeof *s);
    struct bpe_merge *h = s ? realloc(sc->heap, cap * 2 * sizeof *h) : NULL;
    if (s)
        sc->sym = s;
    if (h)
        sc->heap = h;
    if (!s || !h)
        return false;
    sc->cap_sym = cap;
    sc->cap_heap = cap * 2;
    return true;
}

static inline bool merge_less(const struct bpe_merge *a, const struct bpe_merge *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static bool heap_push(struct tok_scratch *sc, size_t *n, struct bpe_merge m)
{
    if (*n == sc->cap_heap) {
        size_t cap = sc->cap_heap * 2;
        struct bpe_merge *h = realloc(sc->heap, cap * sizeof *h);
        if (!h)
            return false;
        sc->heap = h;
        sc->cap_heap = cap;
    }
    struct bpe_merge *h = sc->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!merge_less(&m, &h[parent]))
            break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = m;
    return true;
}

static struct bpe_merge heap_pop(struct bpe_merge *h, size_t *n)
{
    struct bpe_merge top = h[0];
    struct bpe_merge last = h[--*n];
    size_t i = 0, len = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len)
            break;
        if (c + 1 < len && merge_less(&h[c + 1], &h[c]))
            c++;
        if (!merge_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (len)
        h[i] = last;
    return top;
}

/* Word::merge_all. */
static enum status bpe_merge_all(const struct tok_bpe *m, struct tok_scratch *sc, size_t n_sym,
                                 struct err *err)
{
    struct bpe_sym *sym = sc->sym;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n_sym; i++) {
        uint32_t rank;
        int32_t nid;
        if (bpe_merge_get(m, sym[i].id, sym[i + 1].id, &rank, &nid) &&
            !heap_push(sc, &nh, (struct bpe_merge){rank, (uint32_t)i, nid, sym[i].id, sym[i + 1].id}))
            return err_set(err, STATUS_NOMEM, "BPE: out of memory");
    }
    while (nh) {
        struct bpe_merge top = heap_pop(sc->heap, &nh);
        struct bpe_sym *cur = &sym[top.pos];
        if (cur->gone || cur->next < 0)
            continue;
        struct bpe_sym *right = &sym[cur->next];
        uint32_t rank;
        int32_t nid;
        /* HF re-looks the pair up and only compares the new id: a different
         * pair merging into the same token is applied too */
        if ((cur->id != top.left || right->id != top.right) &&
            (!bpe_merge_get(m, cur->id, right->id, &rank, &nid) || nid != top.new_id))
            continue; /* stale entry */
        cur->id = top.new_id;
        right->gone = true;
        cur->next = right->next;
        if (right->next >= 0)
            sym[right->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && bpe_merge_get(m, sym[cur->prev].id, cur->id, &rank, &nid) &&
            !heap_push(sc, &nh,
                       (struct bpe_merge){rank, (uint32_t)cur->prev, nid, sym[cur->prev].id, cur->id}))
            return err_set(err, STATUS_NOMEM, "BPE: out of memory");
        if (cur->next >= 0 && bpe_merge_get(m, cur->id, sym[cur->next].id, &rank, &nid) &&
            !heap_push(sc, &nh, (struct bpe_merge){rank, top.pos, nid, cur->id, sym[cur->next].id}))
            return err_set(err, STATUS_NOMEM, "BPE: out of memory");
        sym = sc->sym; /* heap_push never moves sym, but keep the alias honest */
    }
    return STATUS_OK;
}

static void bpe_add(struct tok_scratch *sc, size_t *n, int32_t id)
{
    struct bpe_sym *s = &sc->sym[*n];
    s->id = id;
    s->prev = *n ? (int32_t)*n - 1 : -1;
    s->next = -1;
    s->gone = false;
    if (*n)
        sc->sym[*n - 1].next = (int32_t)*n;
    (*n)++;
}

/* Looks up one initial symbol (a char with prefix/suffix applied). */
static int32_t bpe_symbol_id(const struct tok_bpe *m, struct tok_buf *tmp, const char *c, size_t clen,
                             bool first, bool last, const char **text, size_t *text_len)
{
    bool plain = (first || !m->prefix) && (!last || !m->suffix);
    if (plain) {
        *text = c;
        *text_len = clen;
        uint32_t cp;
        unicode_utf8_decode(c, clen, &cp);
        if (cp < TOK_CHAR_TABLE)
            return m->char_ids[cp];
        return tok_strtab_get(&m->vocab, c, clen);
    }
    tmp->n = 0;
    if ((!first && m->prefix && !tok_buf_put(tmp, m->prefix, m->prefix_len)) || !tok_buf_put(tmp, c, clen) ||
        (last && m->suffix && !tok_buf_put(tmp, m->suffix, m->suffix_len)))
        return -2;
    *text = tmp->p;
    *text_len = tmp->n;
    return tok_strtab_get(&m->vocab, tmp->p, tmp->n);
}

enum status tok_bpe_tokenize(const struct tok_bpe *m, struct tok_scratch *sc, const char *s, size_t len,
                             bool bytes, struct tok_ids *out, struct err *err)
{
    if (len == 0)
        return STATUS_OK;
    const char *w = s; /* the piece as text (ByteLevel chars mapped when `bytes`) */
    size_t wlen = len;
    bool need_text = m->ignore_merges || m->prefix || m->suffix;
    if (bytes) {
        /* fast path needs no text unless whole-piece lookups or affixes */
        bool all_known = true;
        for (size_t i = 0; i < len && all_known; i++)
            all_known = m->bytelevel_ids[(unsigned char)s[i]] >= 0;
        if (need_text || !all_known) {
            sc->word.n = 0;
            if (!tok_buf_reserve(&sc->word, len * 2))
                return err_set(err, STATUS_NOMEM, "BPE: out of memory");
            for (size_t i = 0; i < len; i++) {
                char u[4];
                size_t k = unicode_utf8_encode(tok_bytelevel_char((unsigned char)s[i]), u);
                memcpy(sc->word.p + sc->word.n, u, k);
                sc->word.n += k;
            }
            w = sc->word.p;
            wlen = sc->word.n;
            bytes = false; /* take the general path on the mapped text */
        }
    }
    if (m->ignore_merges) {
        int32_t id = tok_strtab_get(&m->vocab, w, wlen);
        if (id >= 0)
            return tok_ids_push(out, id) ? STATUS_OK : err_set(err, STATUS_NOMEM, "BPE: out of memory");
    }
    if (!bpe_reserve(sc, (bytes ? len : wlen) + 1))
        return err_set(err, STATUS_NOMEM, "BPE: out of memory");

    size_t n = 0;
    if (bytes) {
        for (size_t i = 0; i < len; i++)
            bpe_add(sc, &n, m->bytelevel_ids[(unsigned char)s[i]]);
    } else {
        struct tok_buf tmp = {0};
        int32_t unk = -1; /* pending unk symbol (HF keeps one to fuse) */
        for (size_t i = 0; i < wlen;) {
            size_t clen = unicode_utf8_char_len((unsigned char)w[i]);
            if (clen > wlen - i)
                clen = wlen - i;
            const char *text;
            size_t text_len;
            int32_t id = bpe_symbol_id(m, &tmp, w + i, clen, i == 0, i + clen == wlen, &text, &text_len);
            i += clen;
            if (id == -2) {
                tok_buf_free(&tmp);
                return err_set(err, STATUS_NOMEM, "BPE: out of memory");
            }
            if (id >= 0) {
                if (unk >= 0) {
                    bpe_add(sc, &n, unk);
                    unk = -1;
                }
                bpe_add(sc, &n, id);
                continue;
            }
            if (m->byte_fallback) {
                bool ok = true;
                for (size_t k = 0; k < text_len && ok; k++)
                    ok = m->fallback_ids[(unsigned char)text[k]] >= 0;
                if (ok) {
                    if (!bpe_reserve(sc, n + text_len + (wlen - i) + 2)) {
                        tok_buf_free(&tmp);
                        return err_set(err, STATUS_NOMEM, "BPE: out of memory");
                    }
                    for (size_t k = 0; k < text_len; k++)
                        bpe_add(sc, &n, m->fallback_ids[(unsigned char)text[k]]);
                    continue; /* as in HF, a pending unk stays pending */
                }
            }
            if (m->unk_id >= 0) {
                if (unk >= 0 && !m->fuse_unk)
                    bpe_add(sc, &n, unk);
                unk = m->unk_id;
            }
        }
        if (unk >= 0)
            bpe_add(sc, &n, unk);
        tok_buf_free(&tmp);
    }
    if (n > 1) {
        enum status st = bpe_merge_all(m, sc, n, err);
        if (st)
            return st;
    }
    for (size_t i = 0; i < n; i++)
        if (!sc->sym[i].gone && !tok_ids_push(out, sc->sym[i].id))
            return err_set(err, STATUS_NOMEM, "BPE: out of memory");
    return STATUS_OK;
}
