/* token_mask.c — vocabulary trie and per-step token masks (see token_mask.h).
 *
 * The trie is built from the ids sorted by their bytes: consecutive ids share their common
 * prefix's path, so one pass lays the nodes out in preorder with each subtree contiguous
 * ([i, node_end[i])). A walk visits a child only when its byte can follow and sets the ids that
 * end at nodes the grammar survives.
 *
 * During a walk the matcher's states are interned by content into a small automaton built lazily
 * (state x byte -> state, 256 entries a state): inside a JSON string the walk goes round the same
 * few states for hundreds of thousands of trie nodes, and each visit is then one table lookup
 * instead of a matcher step. The automaton lives for one walk (its states' frames are released
 * at its end).
 */
#include "engine/token_mask.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "format/tokenizer.h"

/* One interned matcher state of a walk. */
struct tm_dstate {
    struct gm_state st;
    uint32_t key_off, key_len; /* its key in the automaton's key pool */
    int32_t next[256];         /* the state after each byte: -1 dead, -2 not yet computed */
};

struct token_mask_dfa {
    struct tm_dstate *s; /* (cap) owned */
    int32_t n, cap;
    int32_t *keys;       /* (cap_keys) the states' keys, concatenated */
    size_t n_keys, cap_keys;
    int32_t *hash;       /* (hcap) state ids by key hash, -1 empty */
    int32_t hcap;
    bool failed;         /* out of memory */
};

struct token_mask_entry {
    int32_t *key;   /* (key_len) the matcher state's key, owned; NULL: empty entry */
    size_t key_len;
    uint32_t *bits; /* (words) owned */
    int n_allowed;
    int32_t *exposed; /* (n_exposed) tcache: the trie nodes where the cut was met, in preorder, owned */
    int n_exposed;
    bool deepen;      /* tcache: too much is left to the whole state below this cut: cut one frame lower */
};

/* 256 shared parts; a grammar past TM_SHARED_MAX_ELEMS elements is not shared, so that the entries'
 * references cannot pin more than ~256 x 200 KB of client-chosen grammars. */
enum { TM_SHARED_N = 256, TM_SHARED_MAX_ELEMS = 32768 };

/* One shared part: the grammar it belongs to (a reference), the truncated state's key. */
struct tm_shared_entry {
    struct grammar *g;
    int32_t *key; /* (key_len) owned */
    size_t key_len;
    uint32_t *bits; /* (words) owned */
    int32_t *exposed; /* (n_exposed) owned */
    int n_exposed;
    bool deepen;
};

struct token_mask_shared {
    pthread_mutex_t mu; /* guards everything below */
    struct tm_shared_entry e[TM_SHARED_N];
    int next; /* replaced next (round robin) */
};

static void shared_entry_clear(struct tm_shared_entry *e)
{
    grammar_put(e->g);
    free(e->key);
    free(e->bits);
    free(e->exposed);
    memset(e, 0, sizeof *e);
}

/* Words of a mask: the model's rows where it pads its vocabulary (those bits stay 0), so a row's
 * mask covers every logit a sampler looks at (sampler_sample_masked). */
static size_t mask_words(const struct token_vocab *tv)
{
    const int rows = tv->n_logits > tv->vocab ? tv->n_logits : tv->vocab;
    return ((size_t)rows + 31) / 32;
}

void token_vocab_free(struct token_vocab *tv)
{
    free(tv->off);
    free(tv->bytes);
    free(tv->kind);
    free(tv->node_byte);
    free(tv->node_end);
    free(tv->node_tok);
    free(tv->node_parent);
    free(tv->tok_next);
    free(tv->eos);
    if (tv->shared) {
        for (int i = 0; i < TM_SHARED_N; i++)
            shared_entry_clear(&tv->shared->e[i]);
        pthread_mutex_destroy(&tv->shared->mu);
        free(tv->shared);
    }
    memset(tv, 0, sizeof *tv);
}

static int cmp_ids(const void *a, const void *b, void *ctx)
{
    const struct token_vocab *tv = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t nx = tv->off[x + 1] - tv->off[x], ny = tv->off[y + 1] - tv->off[y];
    int c = memcmp(tv->bytes + tv->off[x], tv->bytes + tv->off[y], nx < ny ? nx : ny);
    if (c)
        return c;
    if (nx != ny)
        return nx < ny ? -1 : 1;
    return x < y ? -1 : x > y;
}

static enum status build_trie(struct token_vocab *tv, struct err *err)
{
    int32_t n = 0;
    for (int id = 0; id < tv->vocab; id++)
        n += tv->kind[id] == 0;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    size_t cap = (size_t)tv->off[tv->vocab] + 1; /* at most a node a byte, plus the root */
    tv->node_byte = malloc(cap);
    tv->node_end = malloc(cap * sizeof *tv->node_end);
    tv->node_tok = malloc(cap * sizeof *tv->node_tok);
    tv->node_parent = malloc(cap * sizeof *tv->node_parent);
    int32_t *path = malloc(((size_t)tv->max_len + 1) * sizeof *path);
    if (!ids || !tv->node_byte || !tv->node_end || !tv->node_tok || !tv->node_parent || !path) {
        free(ids), free(path);
        return err_set(err, STATUS_NOMEM, "token masks: out of memory for the vocabulary trie");
    }
    n = 0;
    for (int id = 0; id < tv->vocab; id++)
        if (tv->kind[id] == 0)
            ids[n++] = id;
    qsort_r(ids, (size_t)n, sizeof *ids, cmp_ids, tv);
    /* path[d]: the node at depth d on the current token's path; path[0] the root */
    int32_t nn = 1, depth = 0;
    tv->node_byte[0] = 0;
    tv->node_tok[0] = -1;
    tv->node_parent[0] = -1;
    path[0] = 0;
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        const uint8_t *s = tv->bytes + tv->off[id];
        size_t len = tv->off[id + 1] - tv->off[id];
        size_t l = 0;
        while (prev && l < len && l < prev_len && s[l] == prev[l])
            l++;
        while (depth > (int32_t)l) /* close the nodes below the common prefix */
            tv->node_end[path[depth--]] = nn;
        for (size_t k = l; k < len; k++) {
            tv->node_byte[nn] = s[k];
            tv->node_tok[nn] = -1;
            tv->node_parent[nn] = path[depth];
            path[++depth] = nn++;
        }
        int32_t at = path[depth];
        if (tv->node_tok[at] < 0) {
            tv->node_tok[at] = id;
        } else { /* same bytes as an earlier id: chain it after the last */
            int32_t x = tv->node_tok[at];
            while (tv->tok_next[x] >= 0)
                x = tv->tok_next[x];
            tv->tok_next[x] = id;
        }
        prev = s, prev_len = len;
    }
    while (depth >= 0)
        tv->node_end[path[depth--]] = nn;
    tv->n_nodes = nn;
    free(ids);
    free(path);
    return STATUS_OK;
}

enum status token_vocab_init(struct token_vocab *tv, const struct tokenizer *t, const int32_t *eos_ids, int n_eos,
                             struct err *err)
{
    memset(tv, 0, sizeof *tv);
    int v = tokenizer_vocab_size(t);
    tv->vocab = v;
    tv->off = malloc(((size_t)v + 1) * sizeof *tv->off);
    tv->kind = calloc((size_t)v, 1);
    tv->tok_next = malloc((size_t)(v ? v : 1) * sizeof *tv->tok_next);
    tv->eos = malloc((size_t)(n_eos > 0 ? n_eos : 1) * sizeof *tv->eos);
    if (!tv->off || !tv->kind || !tv->tok_next || !tv->eos) {
        token_vocab_free(tv);
        return err_set(err, STATUS_NOMEM, "token masks: out of memory for %d ids", v);
    }
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < v)
            tv->eos[tv->n_eos++] = eos_ids[i];
    char *bytes = NULL;
    size_t len = 0, cap = 0;
    enum status st = STATUS_OK;
    for (int id = 0; id < v && !st; id++) {
        tv->off[id] = (uint32_t)len;
        tv->tok_next[id] = -1;
        bool eos = false;
        for (int i = 0; i < tv->n_eos; i++)
            eos |= tv->eos[i] == id;
        if (eos) {
            tv->kind[id] = 1;
        } else if (!tokenizer_id_known(t, id) || tokenizer_is_special(t, id)) {
            tv->kind[id] = 2;
        } else {
            st = tokenizer_token_bytes(t, id, &bytes, &len, &cap, err);
            size_t n = len - tv->off[id];
            if (n == 0)
                tv->kind[id] = 2; /* adds nothing: allowing it could loop forever */
            if ((int)n > tv->max_len)
                tv->max_len = (int)n;
        }
        if (len > UINT32_MAX / 2) {
            st = err_set(err, STATUS_INVALID, "token masks: the vocabulary's bytes exceed 2 GB");
        }
    }
    tv->off[v] = (uint32_t)len;
    tv->bytes = (uint8_t *)bytes;
    if (!st && !tv->bytes && !(tv->bytes = malloc(1)))
        st = err_set(err, STATUS_NOMEM, "token masks: out of memory");
    if (!st)
        st = build_trie(tv, err);
    if (!st && !(tv->shared = calloc(1, sizeof *tv->shared)))
        st = err_set(err, STATUS_NOMEM, "token masks: out of memory");
    if (!st)
        pthread_mutex_init(&tv->shared->mu, NULL);
    if (st)
        token_vocab_free(tv);
    return st;
}

/* ---- masks ---- */

enum status token_mask_init(struct token_mask *tm, const struct token_vocab *tv, struct grammar *g, struct err *err)
{
    memset(tm, 0, sizeof *tm);
    tm->tv = tv;
    enum status st = grammar_matcher_init(&tm->m, g, err);
    if (st)
        return st;
    size_t w = mask_words(tv);
    tm->bits = calloc(w, sizeof *tm->bits);
    tm->cache = calloc(TOKEN_MASK_CACHE, sizeof *tm->cache);
    tm->tcache = calloc(TOKEN_MASK_CACHE, sizeof *tm->tcache);
    tm->dfa = calloc(1, sizeof *tm->dfa);
    if (!tm->bits || !tm->cache || !tm->tcache || !tm->dfa) {
        token_mask_free(tm);
        return err_set(err, STATUS_NOMEM, "token masks: out of memory");
    }
    return STATUS_OK;
}

void token_mask_free(struct token_mask *tm)
{
    grammar_matcher_free(&tm->m);
    free(tm->bits);
    for (int i = 0; tm->cache && i < TOKEN_MASK_CACHE; i++)
        free(tm->cache[i].key), free(tm->cache[i].bits);
    for (int i = 0; tm->tcache && i < TOKEN_MASK_CACHE; i++)
        free(tm->tcache[i].key), free(tm->tcache[i].bits), free(tm->tcache[i].exposed);
    free(tm->cache);
    free(tm->tcache);
    free(tm->exposed);
    if (tm->dfa)
        free(tm->dfa->s), free(tm->dfa->keys), free(tm->dfa->hash);
    free(tm->dfa);
    free(tm->key);
    memset(tm, 0, sizeof *tm);
}

static uint32_t key_hash(const int32_t *k, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)k[i]) * 16777619u;
    return h;
}

static bool tm_key(struct token_mask *tm, const struct gm_state *st, size_t *kn)
{
    *kn = grammar_matcher_key(&tm->m, st, tm->key, tm->key_cap);
    if (*kn <= tm->key_cap)
        return true;
    int32_t *k = realloc(tm->key, *kn * 2 * sizeof *k);
    if (!k)
        return false;
    tm->key = k, tm->key_cap = *kn * 2;
    grammar_matcher_key(&tm->m, st, tm->key, tm->key_cap);
    return true;
}

static bool dfa_rehash(struct token_mask_dfa *d, int32_t hcap)
{
    int32_t *h = malloc((size_t)hcap * sizeof *h);
    if (!h)
        return false;
    for (int32_t i = 0; i < hcap; i++)
        h[i] = -1;
    for (int32_t id = 0; id < d->n; id++) {
        uint32_t x = key_hash(d->keys + d->s[id].key_off, d->s[id].key_len) & (uint32_t)(hcap - 1);
        while (h[x] >= 0)
            x = (x + 1) & (uint32_t)(hcap - 1);
        h[x] = id;
    }
    free(d->hash);
    d->hash = h, d->hcap = hcap;
    return true;
}

/* The id of state st (its key in tm->key[0..kn)): an existing one, or a new one (*fresh). -1: out of memory. */
static int32_t dfa_intern(struct token_mask *tm, const struct gm_state *st, size_t kn, bool *fresh)
{
    struct token_mask_dfa *d = tm->dfa;
    *fresh = false;
    if (2 * (d->n + 1) > d->hcap && !dfa_rehash(d, d->hcap ? 2 * d->hcap : 64))
        return -1;
    uint32_t x = key_hash(tm->key, kn) & (uint32_t)(d->hcap - 1);
    for (; d->hash[x] >= 0; x = (x + 1) & (uint32_t)(d->hcap - 1)) {
        const struct tm_dstate *e = &d->s[d->hash[x]];
        if (e->key_len == kn && memcmp(d->keys + e->key_off, tm->key, kn * sizeof *tm->key) == 0)
            return d->hash[x];
    }
    if (d->n == d->cap) {
        int32_t nc = d->cap ? 2 * d->cap : 16;
        struct tm_dstate *ns = realloc(d->s, (size_t)nc * sizeof *ns);
        if (!ns)
            return -1;
        d->s = ns, d->cap = nc;
    }
    if (d->n_keys + kn > d->cap_keys) {
        size_t nc = d->cap_keys ? 2 * d->cap_keys : 1024;
        while (nc < d->n_keys + kn)
            nc *= 2;
        int32_t *nk = realloc(d->keys, nc * sizeof *nk);
        if (!nk)
            return -1;
        d->keys = nk, d->cap_keys = nc;
    }
    struct tm_dstate *e = &d->s[d->n];
    e->st = *st;
    e->key_off = (uint32_t)d->n_keys, e->key_len = (uint32_t)kn;
    memcpy(d->keys + d->n_keys, tm->key, kn * sizeof *tm->key);
    d->n_keys += kn;
    memset(e->next, 0xff, sizeof e->next); /* -1: dead */
    for (int k = 0; k < 4; k++)
        for (uint64_t w = st->next.w[k]; w; w &= w - 1)
            e->next[k * 64 + __builtin_ctzll(w)] = -2;
    d->hash[x] = d->n;
    *fresh = true;
    return d->n++;
}

/* The state after byte b from state sid, computed on first use. */
static int32_t dfa_step(struct token_mask *tm, int32_t sid, uint8_t b)
{
    struct token_mask_dfa *d = tm->dfa;
    struct gm_mark mk = grammar_matcher_mark(&tm->m);
    struct gm_state from = d->s[sid].st, to;
    int32_t nx = -1;
    if (grammar_matcher_step(&tm->m, &from, b, &to)) {
        size_t kn = 0;
        bool fresh = false;
        nx = tm_key(tm, &to, &kn) ? dfa_intern(tm, &to, kn, &fresh) : -1;
        if (nx < 0)
            d->failed = true;
        if (!fresh) /* known (or failed): the frames just made are not needed */
            grammar_matcher_rewind(&tm->m, mk);
    } else if (tm->m.failed) {
        /* a continuation past the matcher's bounds (too deep, too ambiguous): that path is cut, the
         * state itself is fine (compute starts only from a matcher that has not failed) */
        tm->m.failed = false;
        grammar_matcher_rewind(&tm->m, mk);
    }
    d->s[sid].next[b] = nx;
    return nx;
}

/* Sets the ids of node's subtree that keep state sid alive (sid: the state after node's bytes). */
static void walk(struct token_mask *tm, int32_t node, int32_t sid)
{
    const struct token_vocab *tv = tm->tv;
    struct token_mask_dfa *d = tm->dfa;
    const int32_t end = tv->node_end[node];
    for (int32_t ch = node + 1; ch < end; ch = tv->node_end[ch]) {
        const uint8_t b = tv->node_byte[ch];
        int32_t nx = d->s[sid].next[b];
        if (nx == -2)
            nx = dfa_step(tm, sid, b);
        if (nx < 0)
            continue; /* the whole subtree is cut */
        for (int32_t id = tv->node_tok[ch]; id >= 0; id = tv->tok_next[id])
            tm->bits[id >> 5] |= 1u << (id & 31);
        if (tv->node_end[ch] > ch + 1 && d->s[nx].st.end > d->s[nx].st.begin)
            walk(tm, ch, nx);
    }
}

/* Set bits (SWAR: the build targets no particular CPU, and libgcc's popcount is a call a word). */
static int count_bits(const uint32_t *bits, size_t w)
{
    int n = 0;
    for (size_t i = 0; i < w; i++) {
        uint32_t x = bits[i];
        x = x - ((x >> 1) & 0x55555555u);
        x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
        x = (x + (x >> 4)) & 0x0f0f0f0fu;
        n += (int)((x * 0x01010101u) >> 24);
    }
    return n;
}

static void dfa_reset(struct token_mask_dfa *d)
{
    d->n = 0, d->n_keys = 0, d->failed = false;
    for (int32_t i = 0; i < d->hcap; i++)
        d->hash[i] = -1;
}

static bool exposed_push(struct token_mask *tm, int32_t node)
{
    if (tm->n_exposed == tm->cap_exposed) {
        int nc = tm->cap_exposed ? 2 * tm->cap_exposed : 256;
        int32_t *q = realloc(tm->exposed, (size_t)nc * sizeof *q);
        if (!q)
            return false;
        tm->exposed = q, tm->cap_exposed = nc;
    }
    tm->exposed[tm->n_exposed++] = node;
    return true;
}

/* walk() for a truncated state: ids the stacks above the cut take alone go into bits; a node
 * where a stack pops through the cut is recorded (its subtree is the whole state's to decide). */
static void walk_truncated(struct token_mask *tm, int32_t node, int32_t sid)
{
    const struct token_vocab *tv = tm->tv;
    struct token_mask_dfa *d = tm->dfa;
    const int32_t end = tv->node_end[node];
    for (int32_t ch = node + 1; ch < end; ch = tv->node_end[ch]) {
        const uint8_t b = tv->node_byte[ch];
        int32_t nx = d->s[sid].next[b];
        if (nx == -2)
            nx = dfa_step(tm, sid, b);
        if (nx < 0)
            continue;
        if (d->s[nx].st.exposed) {
            if (!exposed_push(tm, ch))
                d->failed = true;
            continue;
        }
        for (int32_t id = tv->node_tok[ch]; id >= 0; id = tv->tok_next[id])
            tm->bits[id >> 5] |= 1u << (id & 31);
        if (tv->node_end[ch] > ch + 1 && d->s[nx].st.end > d->s[nx].st.begin)
            walk_truncated(tm, ch, nx);
    }
}

/* The shared part for this grammar (by content) and the truncated state's key tm->key[0..kn):
 * into tm->bits and tm->exposed. */
static bool shared_get(struct token_mask *tm, size_t kn, size_t w, bool *deepen)
{
    struct token_mask_shared *sh = tm->tv->shared;
    if (!sh)
        return false;
    const uint64_t fp = grammar_fingerprint(tm->m.g);
    bool hit = false;
    pthread_mutex_lock(&sh->mu);
    for (int i = 0; i < TM_SHARED_N && !hit; i++) {
        const struct tm_shared_entry *e = &sh->e[i];
        if (!e->g || e->key_len != kn || grammar_fingerprint(e->g) != fp ||
            memcmp(e->key, tm->key, kn * sizeof *tm->key) != 0 || !grammar_same(e->g, tm->m.g))
            continue;
        tm->n_exposed = 0;
        hit = true;
        *deepen = e->deepen;
        for (int k = 0; k < e->n_exposed && hit; k++)
            hit = exposed_push(tm, e->exposed[k]);
        if (hit)
            memcpy(tm->bits, e->bits, w * sizeof *tm->bits);
    }
    pthread_mutex_unlock(&sh->mu);
    return hit;
}

/* Offers the part just walked (tm->bits, tm->exposed) under key[0..kn) to every request. */
static void shared_put(struct token_mask *tm, const int32_t *key, size_t kn, size_t w, bool deepen)
{
    struct token_mask_shared *sh = tm->tv->shared;
    if (!sh || grammar_n_elems(tm->m.g) > TM_SHARED_MAX_ELEMS)
        return;
    struct tm_shared_entry n = {.key = malloc(kn * sizeof *key), .key_len = kn, .bits = malloc(w * sizeof *tm->bits),
                                .exposed = malloc((size_t)(tm->n_exposed ? tm->n_exposed : 1) * sizeof *tm->exposed),
                                .n_exposed = tm->n_exposed, .deepen = deepen};
    if (!n.key || !n.bits || !n.exposed) {
        shared_entry_clear(&n);
        return;
    }
    memcpy(n.key, key, kn * sizeof *key);
    memcpy(n.bits, tm->bits, w * sizeof *tm->bits);
    if (tm->n_exposed)
        memcpy(n.exposed, tm->exposed, (size_t)tm->n_exposed * sizeof *tm->exposed);
    n.g = grammar_ref(tm->m.g);
    struct tm_shared_entry old;
    pthread_mutex_lock(&sh->mu);
    old = sh->e[sh->next];
    sh->e[sh->next] = n;
    sh->next = (sh->next + 1) % TM_SHARED_N;
    pthread_mutex_unlock(&sh->mu);
    shared_entry_clear(&old); /* outside the lock: the last reference may free a grammar */
}

/* Finds (or walks and stores) the truncated part of the current state's mask: tm->bits gets the
 * ids decided above the cut, tm->exposed the nodes left to the whole state. */
/* Past this many trie nodes under the nodes where stacks leave through the cut, each request would
 * walk most of the vocabulary with its whole state anyway: the cut goes one frame lower (a format
 * or a bounded string whose repetition frame is the only one the stacks share). */
enum { TM_DEEPEN_NODES = 20000, TM_DEEPEN_MAX = 6 };

/* Cuts deeper than this many frames below GRAMMAR_MAX_DEPTH key their depth too: a token (<= 128 bytes,
 * a few frames a byte) could reach the bound from there, so the part above the cut is not the same
 * at every depth. */
enum { TM_DEPTH_MARGIN = 2048 };

static enum status truncated_part(struct token_mask *tm, int32_t cut, size_t w, bool *deepen)
{
    *deepen = false;
    struct token_mask_dfa *d = tm->dfa;
    struct gm_state tr;
    size_t kn = 0;
    if (!grammar_matcher_truncate(&tm->m, cut, &tr) || !tm_key(tm, &tr, &kn))
        return STATUS_NOMEM;
    if (kn + 1 > tm->key_cap) {
        int32_t *k = realloc(tm->key, (kn + 1) * 2 * sizeof *k);
        if (!k)
            return STATUS_NOMEM;
        tm->key = k, tm->key_cap = (kn + 1) * 2;
    }
    tm->key[kn++] = tm->m.cut_depth > GRAMMAR_MAX_DEPTH - TM_DEPTH_MARGIN ? tm->m.cut_depth : 0;
    tm->n_exposed = 0;
    for (int i = 0; i < TOKEN_MASK_CACHE; i++) {
        struct token_mask_entry *e = &tm->tcache[i];
        if (e->key && e->key_len == kn && memcmp(e->key, tm->key, kn * sizeof *tm->key) == 0) {
            *deepen = e->deepen;
            memcpy(tm->bits, e->bits, w * sizeof *tm->bits);
            for (int k = 0; k < e->n_exposed; k++)
                if (!exposed_push(tm, e->exposed[k]))
                    return STATUS_NOMEM;
            tm->n_trunc_cached++;
            return STATUS_OK;
        }
    }
    if (shared_get(tm, kn, w, deepen)) {
        tm->n_shared_cached++;
        tm->n_trunc_cached++;
        return STATUS_OK; /* not copied into tcache: the shared entry stays (256 of them) */
    }
    struct token_mask_entry *e = &tm->tcache[tm->tcache_next];
    tm->tcache_next = (tm->tcache_next + 1) % TOKEN_MASK_CACHE;
    free(e->key);
    free(e->exposed);
    e->exposed = NULL;
    e->key = malloc(kn * sizeof *e->key); /* the key scratch is reused by the walk: saved first */
    if (!e->key)
        return STATUS_NOMEM;
    memcpy(e->key, tm->key, kn * sizeof *e->key);
    e->key_len = kn;
    dfa_reset(d);
    memset(tm->bits, 0, w * sizeof *tm->bits);
    bool fresh = false;
    int32_t root = dfa_intern(tm, &tr, kn, &fresh);
    if (root < 0)
        return STATUS_NOMEM;
    if (tr.exposed) {
        if (!exposed_push(tm, 0))
            return STATUS_NOMEM;
    } else {
        walk_truncated(tm, 0, root);
    }
    long left = 0;
    for (int i = 0; i < tm->n_exposed; i++)
        left += tm->tv->node_end[tm->exposed[i]] - tm->exposed[i];
    *deepen = left > TM_DEEPEN_NODES;
    e->deepen = *deepen;
    if (!e->bits)
        e->bits = malloc(w * sizeof *e->bits);
    e->exposed = malloc((size_t)(tm->n_exposed ? tm->n_exposed : 1) * sizeof *e->exposed);
    if (d->failed || !e->bits || !e->exposed) {
        free(e->key);
        e->key = NULL;
        return d->failed ? STATUS_NOMEM : STATUS_OK;
    }
    memcpy(e->bits, tm->bits, w * sizeof *e->bits);
    if (tm->n_exposed) /* tm->exposed may still be NULL */
        memcpy(e->exposed, tm->exposed, (size_t)tm->n_exposed * sizeof *e->exposed);
    e->n_exposed = tm->n_exposed;
    shared_put(tm, e->key, e->key_len, w, *deepen);
    return STATUS_OK;
}

/* tm->bits for m->cur. Where the stacks share a frame near their tops, the part above it
 * (independent of what encloses it: the same string rule in another property) comes from the
 * truncated cache or one walk, and only the subtrees where a stack leaves through that frame are
 * walked with the whole state. */
static enum status mask_walk(struct token_mask *tm, size_t w)
{
    const struct token_vocab *tv = tm->tv;
    struct token_mask_dfa *d = tm->dfa;
    int32_t cut = grammar_matcher_common_frame(&tm->m);
    tm->n_exposed = 0;
    for (int level = 0; cut >= 0; level++) {
        bool deepen = false;
        enum status st = truncated_part(tm, cut, w, &deepen);
        if (st)
            return st;
        if (!deepen)
            break;
        cut = level + 1 < TM_DEEPEN_MAX ? tm->m.nodes[cut].parent : -1; /* an ancestor is common too */
    }
    if (cut < 0) { /* no cut: the whole trie with the whole state */
        memset(tm->bits, 0, w * sizeof *tm->bits);
        tm->n_exposed = 0;
        if (!exposed_push(tm, 0))
            return STATUS_NOMEM;
    }
    dfa_reset(d);
    size_t kn = 0;
    bool fresh = false;
    int32_t root = tm_key(tm, &tm->m.cur, &kn) ? dfa_intern(tm, &tm->m.cur, kn, &fresh) : -1;
    if (root < 0)
        return STATUS_NOMEM;
    int32_t done_end = -1;             /* nodes below done_end's subtree root are covered */
    uint8_t path[1024];
    for (int i = 0; i < tm->n_exposed; i++) {
        const int32_t u = tm->exposed[i];
        if (u < done_end)
            continue;
        int n = 0;
        for (int32_t x = u; x > 0 && n < (int)sizeof path; x = tv->node_parent[x])
            path[n++] = tv->node_byte[x];
        int32_t sid = root;
        for (int k = n - 1; k >= 0 && sid >= 0; k--) {
            int32_t nx = d->s[sid].next[path[k]];
            sid = nx == -2 ? dfa_step(tm, sid, path[k]) : nx;
        }
        if (sid < 0)
            continue; /* the whole state refuses the path too */
        for (int32_t id = u > 0 ? tv->node_tok[u] : -1; id >= 0; id = tv->tok_next[id])
            tm->bits[id >> 5] |= 1u << (id & 31);
        if (tv->node_end[u] > u + 1 && d->s[sid].st.end > d->s[sid].st.begin)
            walk(tm, u, sid);
        done_end = tv->node_end[u];
    }
    return d->failed ? STATUS_NOMEM : STATUS_OK;
}

enum status token_mask_compute(struct token_mask *tm, struct err *err)
{
    const size_t w = mask_words(tm->tv);
    if (tm->m.failed)
        return err_set(err, STATUS_INVALID, "grammar: the output is past the matcher's bounds (more than %d ways to "
                       "read it, or nested deeper than %d frames)", GRAMMAR_MAX_STACKS, GRAMMAR_MAX_DEPTH);
    size_t kn = 0;
    if (!tm_key(tm, &tm->m.cur, &kn))
        return err_set(err, STATUS_NOMEM, "token masks: out of memory");
    for (int i = 0; i < TOKEN_MASK_CACHE; i++) {
        struct token_mask_entry *e = &tm->cache[i];
        if (e->key && e->key_len == kn && memcmp(e->key, tm->key, kn * sizeof *tm->key) == 0) {
            memcpy(tm->bits, e->bits, w * sizeof *tm->bits);
            tm->n_allowed = e->n_allowed;
            tm->n_cached++;
            return STATUS_OK;
        }
    }
    memset(tm->bits, 0, w * sizeof *tm->bits);
    struct gm_mark mk = grammar_matcher_mark(&tm->m);
    enum status st = mask_walk(tm, w);
    grammar_matcher_rewind(&tm->m, mk);
    if (st)
        return err_set(err, STATUS_NOMEM, "token masks: out of memory");
    if (tm->m.failed)
        return err_set(err, STATUS_INVALID, "grammar: the output is past the matcher's bounds (more than %d ways to "
                       "read it, or nested deeper than %d frames)", GRAMMAR_MAX_STACKS, GRAMMAR_MAX_DEPTH);
    if (grammar_matcher_can_end(&tm->m))
        for (int i = 0; i < tm->tv->n_eos; i++)
            tm->bits[tm->tv->eos[i] >> 5] |= 1u << (tm->tv->eos[i] & 31);
    tm->n_allowed = count_bits(tm->bits, w);
    tm->n_computed++;
    if (tm->n_allowed == 0)
        return err_set(err, STATUS_INVALID, "grammar: no token of the vocabulary can continue the output");
    /* into the cache, round robin (a failed allocation only loses the entry); the walk used the key scratch */
    if (!tm_key(tm, &tm->m.cur, &kn))
        return STATUS_OK;
    struct token_mask_entry *e = &tm->cache[tm->cache_next];
    tm->cache_next = (tm->cache_next + 1) % TOKEN_MASK_CACHE;
    free(e->key);
    e->key = malloc(kn * sizeof *e->key);
    if (!e->bits)
        e->bits = malloc(w * sizeof *e->bits);
    if (!e->key || !e->bits) {
        free(e->key);
        e->key = NULL;
        return STATUS_OK;
    }
    memcpy(e->key, tm->key, kn * sizeof *e->key);
    e->key_len = kn;
    memcpy(e->bits, tm->bits, w * sizeof *e->bits);
    e->n_allowed = tm->n_allowed;
    return STATUS_OK;
}

void token_mask_apply(const struct token_mask *tm, float *logits)
{
    const int v = tm->tv->vocab;
    for (int i = 0; i < v; i += 32) {
        uint32_t word = tm->bits[i >> 5];
        if (word == 0xffffffffu)
            continue;
        int n = v - i < 32 ? v - i : 32;
        for (int k = 0; k < n; k++)
            if (!((word >> k) & 1u))
                logits[i + k] = -INFINITY;
    }
    for (int i = v; i < tm->tv->n_logits; i++) /* the model's padding ids: no bytes, never allowed */
        logits[i] = -INFINITY;
}

enum status token_mask_accept(struct token_mask *tm, int32_t id, struct err *err)
{
    const struct token_vocab *tv = tm->tv;
    if (id < 0 || id >= tv->vocab)
        return err_set(err, STATUS_INVALID, "grammar: token %d is not in the vocabulary", (int)id);
    if (tv->kind[id] == 1) {
        if (!grammar_matcher_can_end(&tm->m))
            return err_set(err, STATUS_INVALID, "grammar: the output ended (token %d) before the grammar was complete",
                           (int)id);
        return STATUS_OK;
    }
    if (tv->kind[id] == 2)
        return err_set(err, STATUS_INVALID, "grammar: token %d (special) cannot be part of the output", (int)id);
    if (!grammar_matcher_accept_bytes(&tm->m, tv->bytes + tv->off[id], tv->off[id + 1] - tv->off[id]))
        return err_set(err, STATUS_INVALID, "grammar: token %d does not continue the output as the grammar allows",
                       (int)id);
    return STATUS_OK;
}

bool token_mask_done(const struct token_mask *tm)
{
    return grammar_matcher_done(&tm->m);
}
