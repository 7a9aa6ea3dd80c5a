/* golden_parity.h — the parity checks shared by the CPU and CUDA golden tests.
 *
 * For each fixture directory of tests/golden/<group> (tools/make_fixtures.py,
 * tools/make_quant_fixtures.py): one batched pass over the fixture tokens must
 * match ref_logits.bin within cfg->tol_ref * max|ref| with the same argmax at
 * every position; incremental decode (prefill a third, then one token at a
 * time) and a batch mixing two sequences at different positions must match
 * the one-pass logits within cfg->tol_self. Included by exactly one test
 * program each (static functions), after cmocka.h.
 */
#ifndef MOESERVE_TESTS_GOLDEN_PARITY_H
#define MOESERVE_TESTS_GOLDEN_PARITY_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/mapped_file.h"
#include "engine/model_session.h"

struct golden_cfg {
    const char *backend;                  /* "cpu" or "cuda" */
    double tol_ref;                       /* vs transformers */
    double tol_self;                      /* incremental and mixed batch vs our one pass */
    void (*check)(struct model_session *s); /* after every forward (device errors), or NULL */
    const char *kv_cache_dtype;           /* session_opts.kv_cache_dtype (NULL: the default, bf16 latent) */
    bool ref_below_topk;                  /* vs transformers only on rows that keep every key (position <
                                             index_topk: no top-k boundary to move) */
    bool dsa_flips;                       /* a quantised cache may move a key across the DSA top-k
                                             boundary: from the first row that misses tol_ref on, rows
                                             may differ (a changed row's hidden state feeds the later
                                             rows' keys), at most half of them; rows before must hold */
};

struct fixture {
    char dir[1024];
    int32_t tokens[256];
    int n_tokens;
    int vocab;
    float *ref; /* (n_tokens, vocab) */
};

static void fixture_load(struct fixture *fx, const char *dir)
{
    snprintf(fx->dir, sizeof fx->dir, "%s", dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/ref.json", dir);
    struct json *j = NULL;
    struct err err = {0};
    assert_int_equal(json_parse_file(path, &j, &err), STATUS_OK);
    const struct json *toks = json_get(j, "tokens");
    fx->n_tokens = (int)json_array_size(toks);
    assert_true(fx->n_tokens > 0 && fx->n_tokens <= 256);
    for (int i = 0; i < fx->n_tokens; i++)
        fx->tokens[i] = (int32_t)json_number(json_array_at(toks, (size_t)i));
    fx->vocab = (int)json_number(json_get(j, "vocab_size"));
    json_free(j);
    snprintf(path, sizeof path, "%s/ref_logits.bin", dir);
    struct mapped_file mf;
    assert_int_equal(mapped_file_open(&mf, path, &err), STATUS_OK);
    assert_int_equal(mf.size, (size_t)fx->n_tokens * (size_t)fx->vocab * sizeof(float));
    fx->ref = malloc(mf.size);
    memcpy(fx->ref, mf.data, mf.size);
    mapped_file_close(&mf);
}

static float max_abs(const float *a, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
    return m;
}

static int argmax(const float *a, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (a[i] > a[b])
            b = i;
    return b;
}

/* The reference row's top-1 minus top-2 logit. */
static double top2_gap(const float *a, int n)
{
    int b = argmax(a, n);
    double second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && a[i] > second)
            second = a[i];
    return (double)a[b] - second;
}

/* max|got - want| / max|want| over rows [0, n_rows); fails on NaN. */
static double rel_err(const float *got, const float *want, int n_rows, int vocab)
{
    size_t n = (size_t)n_rows * (size_t)vocab;
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        assert_false(isnan(got[i]));
        double e = fabs((double)got[i] - (double)want[i]);
        d = e > d ? e : d;
    }
    return d / (double)max_abs(want, n);
}

static void session_open(const struct golden_cfg *cfg, struct model_session *s, const char *dir, int max_tokens,
                         int max_seqs)
{
    struct session_opts o = {.backend = cfg->backend, .max_tokens = max_tokens, .max_seqs = max_seqs,
                             .max_context = 256, .block_size = 4 /* small: many blocks per sequence */,
                             .kv_cache_dtype = cfg->kv_cache_dtype};
    struct err err = {0};
    enum status st = model_session_open(s, dir, &o, &err);
    if (st)
        fail_msg("%s: %s", dir, err.msg);
}

/* Runs tokens[0..n) of one sequence starting at position p0 and returns all logits. */
static void run_rows(const struct golden_cfg *cfg, struct model_session *s, struct kv_seq *ks, const int32_t *tokens, int n, int p0,
                     float *out)
{
    int32_t pos[256], seq[256], rows[256];
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        seq[i] = 0;
        rows[i] = i;
    }
    struct kv_seq *seqs[1] = {ks};
    struct err err = {0};
    assert_int_equal(kv_seq_reserve(ks, &s->kv, p0 + n, &err), STATUS_OK);
    struct forward_batch b = {.n_tokens = n, .tokens = tokens, .pos = pos, .seq = seq, .n_seqs = 1,
                              .seqs = seqs, .n_logits = n, .logit_rows = rows};
    enum status st = forward_run(&s->fwd, &b, out, &err);
    if (st)
        fail_msg("forward: %s", err.msg);
    if (cfg->check)
        cfg->check(s);
    ks->n_tokens = p0 + n;
}

static void check_fixture(const struct golden_cfg *cfg, const char *dir)
{
    struct fixture fx;
    fixture_load(&fx, dir);
    size_t V = (size_t)fx.vocab;
    float *one = malloc((size_t)fx.n_tokens * V * sizeof(float));
    float *inc = malloc((size_t)fx.n_tokens * V * sizeof(float));
    struct model_session s;
    session_open(cfg, &s, dir, fx.n_tokens, 2);
    assert_int_equal(s.desc.vocab_size, fx.vocab);

    /* 1. one batched pass vs transformers */
    struct kv_seq ks;
    kv_seq_init(&ks);
    run_rows(cfg, &s, &ks, fx.tokens, fx.n_tokens, 0, one);
    kv_seq_release(&ks, &s.kv);
    /* row by row: a row that misses tol_ref is a "flip" (only allowed with flip_rows_per_48: a
     * selection change moves the whole row, so its argmax may differ too); the rest must hold */
    double e = 0, scale = max_abs(fx.ref, (size_t)fx.n_tokens * V);
    int mism = 0, flips = 0, first_flip = -1;
    int n_ref = fx.n_tokens;
    if (cfg->ref_below_topk && s.desc.index_topk > 0 && s.desc.index_topk < n_ref)
        n_ref = s.desc.index_topk;
    for (int t = 0; t < n_ref; t++) {
        double er = rel_err(one + (size_t)t * V, fx.ref + (size_t)t * V, 1, fx.vocab) *
                    max_abs(fx.ref + (size_t)t * V, V) / scale;
        /* an argmax may differ only where the reference's top two are closer than twice the error */
        bool am = argmax(one + (size_t)t * V, fx.vocab) != argmax(fx.ref + (size_t)t * V, fx.vocab) &&
                  top2_gap(fx.ref + (size_t)t * V, fx.vocab) > 2 * er * scale;
        if (er > cfg->tol_ref || (am && first_flip >= 0)) {
            if (first_flip < 0)
                first_flip = t;
            flips++;
            print_message("  %-32s row %d: rel err %.2e%s (a DSA selection change)\n", "", t, er,
                          am ? ", argmax differs" : "");
        } else {
            e = er > e ? er : e;
            mism += am;
        }
    }
    print_message("  %-32s %s one-pass rel err %.2e, argmax mismatches %d/%d, rows past %.0e: %d\n",
                  strrchr(dir, '/') + 1, cfg->backend, e, mism, n_ref, cfg->tol_ref, flips);
    assert_true(e <= cfg->tol_ref);
    assert_int_equal(mism, 0);
    assert_true(flips == 0 || (cfg->dsa_flips && flips <= n_ref / 2));

    /* 2. prefill k tokens, then decode one at a time */
    int k = fx.n_tokens / 3;
    kv_seq_init(&ks);
    run_rows(cfg, &s, &ks, fx.tokens, k, 0, inc);
    for (int t = k; t < fx.n_tokens; t++)
        run_rows(cfg, &s, &ks, fx.tokens + t, 1, t, inc + (size_t)t * V);
    kv_seq_release(&ks, &s.kv);
    double ei = rel_err(inc, one, fx.n_tokens, fx.vocab);
    print_message("  %-32s incremental vs one-pass rel err %.2e\n", "", ei);
    assert_true(ei <= cfg->tol_self);

    /* 3. one batch holding two sequences: seq A decodes its token t while
     *    seq B (the same tokens) prefills a chunk at other positions. */
    struct kv_seq a, b2;
    kv_seq_init(&a);
    kv_seq_init(&b2);
    int half = fx.n_tokens / 2;
    run_rows(cfg, &s, &a, fx.tokens, half, 0, inc); /* A has the first half cached */
    struct err err = {0};
    assert_int_equal(kv_seq_reserve(&a, &s.kv, half + 1, &err), STATUS_OK);
    assert_int_equal(kv_seq_reserve(&b2, &s.kv, half, &err), STATUS_OK);
    int32_t tok[256], pos[256], seq[256], rows[256];
    int n = 0;
    tok[n] = fx.tokens[half]; pos[n] = half; seq[n] = 0; n++;          /* A: decode at position half */
    for (int i = 0; i < half; i++) {                                    /* B: prefill [0, half) */
        tok[n] = fx.tokens[i]; pos[n] = i; seq[n] = 1; n++;
    }
    for (int i = 0; i < n; i++)
        rows[i] = i;
    struct kv_seq *seqs[2] = {&a, &b2};
    struct forward_batch fb = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 2, .seqs = seqs,
                               .n_logits = n, .logit_rows = rows};
    assert_true(n <= s.fwd.max_tokens);
    assert_int_equal(forward_run(&s.fwd, &fb, inc, &err), STATUS_OK);
    if (cfg->check)
        cfg->check(&s);
    double ea = rel_err(inc, one + (size_t)half * V, 1, fx.vocab);
    double eb = rel_err(inc + V, one, half, fx.vocab);
    print_message("  %-32s mixed batch: decode row %.2e, prefill rows %.2e\n", "", ea, eb);
    assert_true(ea <= cfg->tol_self && eb <= cfg->tol_self);
    kv_seq_release(&a, &s.kv);
    kv_seq_release(&b2, &s.kv);
    assert_int_equal(s.kv.n_free, s.kv.n_blocks); /* every block came back */

    model_session_close(&s);
    free(one);
    free(inc);
    free(fx.ref);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Checks every fixture directory under tests/golden/<group>; returns how many. */
static int check_group(const struct golden_cfg *cfg, const char *group)
{
    const char *src = getenv("MOESERVE_SRC");
    char root[1024];
    snprintf(root, sizeof root, "%s/tests/golden/%s", src ? src : ".", group);
    DIR *dp = opendir(root);
    assert_non_null(dp);
    char *names[64];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dp)) && n < 64)
        if (de->d_name[0] != '.')
            names[n++] = strdup(de->d_name);
    closedir(dp);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
        check_fixture(cfg, dir);
        free(names[i]);
    }
    return n;
}

#endif
