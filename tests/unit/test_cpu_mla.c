/* test_cpu_mla.c — the CPU reference of the MLA/DSA ops against independent brute force.
 *
 * 1. Absorbed MLA (mla_absorb_q -> mla_attention -> mla_expand_o over a paged latent
 *    cache) equals transformers' expanded form computed here in double: per key
 *    k_nope = W_uk_h c_kv, v = W_uv_h c_kv, scores over [q_nope | q_rope] . [k_nope | k_r],
 *    softmax, sum of v (spec/models.md C.3) — for kv_b_proj in every weight format
 *    (FP8 and NVFP4 have no transformers fixture yet), dense and over a selection.
 * 2. dsa_select equals a full sort of the scores by (score descending, position
 *    ascending), including exact ties at the boundary (all-zero keys score exactly 0).
 * 3. layernorm and mla_store against double-precision formulas.
 * Tolerance: max|diff| / max|ref| <= 1e-5 (fp32 accumulation order only).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "test_rand.h"

static double rel_err(const float *got, const double *want, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        assert_false(isnan(got[i]));
        d = fmax(d, fabs((double)got[i] - want[i]));
        m = fmax(m, fabs(want[i]));
    }
    return m > 0 ? d / m : d;
}

/* A random weight [n, k] in format fmt; *data and *scale are owned by the caller. */
static struct weight weight_rand(enum weight_format fmt, int64_t n, int64_t k, void **data, void **scale,
                                 uint64_t *rng)
{
    size_t nk = (size_t)(n * k);
    struct weight w = {.format = fmt, .rows = n, .cols = k, .scale2 = 1.0f};
    *data = *scale = NULL;
    switch (fmt) {
    case WEIGHT_F32: *data = rand_floats(nk, 0.3f, rng); break;
    case WEIGHT_BF16: {
        uint16_t *d = malloc(nk * 2 + 2);
        for (size_t i = 0; i < nk; i++)
            d[i] = f32_to_bf16(0.3f * rng_unit(rng));
        *data = d;
        break;
    }
    case WEIGHT_FP8_BLOCK: {
        uint8_t *d = malloc(nk + 1);
        for (size_t i = 0; i < nk; i++) {
            uint8_t b;
            do
                b = (uint8_t)rng_next(rng);
            while ((b & 0x7f) == 0x7f || (b & 0x78) > 0x40); /* no NaN, |x| <= 2^2 */
            d[i] = b;
        }
        size_t ns = (size_t)((n + 127) / 128 * ((k + 127) / 128));
        float *s = malloc(ns * 4 + 4);
        for (size_t i = 0; i < ns; i++)
            s[i] = 0.05f * (1.0f + 0.5f * rng_unit(rng));
        *data = d, *scale = s;
        break;
    }
    case WEIGHT_NVFP4: {
        uint8_t *d = malloc(nk / 2 + 1);
        for (size_t i = 0; i < nk / 2; i++)
            d[i] = (uint8_t)rng_next(rng);
        uint8_t *s = malloc(nk / 16 + 1);
        for (size_t i = 0; i < nk / 16; i++)
            s[i] = (uint8_t)(0x20 + rng_next(rng) % 0x20); /* e4m3 around 2^-3 .. 2^0 */
        *data = d, *scale = s;
        w.scale2 = 0.37f;
        break;
    }
    default: fail();
    }
    w.data = *data;
    w.scale = *scale;
    return w;
}

struct mla_case {
    int H, nope, rope, v, R;
    int len;   /* keys of the one sequence */
    int fresh; /* its last `fresh` positions are the queries */
    int topk;  /* 0: dense */
};

static void check_mla_case(struct backend *be, const struct mla_case *c, enum weight_format fmt, uint64_t *rng)
{
    const int bs = 4, nblk = (c->len + bs - 1) / bs + 2, Dk = c->R + c->rope, T = c->fresh;
    /* block table: blocks in reverse order, so slots are not positions */
    int32_t table[64];
    assert_true(nblk <= 64);
    for (int i = 0; i < nblk; i++)
        table[i] = nblk - 1 - i;
    int32_t pos[64], seq[64];
    assert_true(T <= 64);
    for (int t = 0; t < T; t++)
        pos[t] = c->len - T + t, seq[t] = 0;
    struct attn_batch b = {.n_tokens = T, .pos = pos, .seq = seq, .block_table = table, .max_blocks = nblk};
    float *lat = rand_floats((size_t)nblk * bs * Dk, 1.0f, rng);
    float *q = rand_floats((size_t)T * c->H * (c->nope + c->rope), 1.0f, rng);
    void *wd, *ws;
    struct weight kvb = weight_rand(fmt, (int64_t)c->H * (c->nope + c->v), c->R, &wd, &ws, rng);
    struct mla_dims md = {.n_heads = c->H, .nope = c->nope, .rope = c->rope, .v = c->v, .kv_rank = c->R};
    struct paged_latent kv = {.latent = lat, .block_size = bs, .kv_rank = c->R, .rope_dim = c->rope};
    int32_t *sel = NULL;
    if (c->topk) {
        /* every other key, newest first, up to topk: then ascending, -1 padded */
        sel = malloc((size_t)T * c->topk * 4);
        for (int t = 0; t < T; t++) {
            int32_t *o = sel + (size_t)t * c->topk;
            int n = 0;
            if (pos[t] + 1 <= c->topk)
                for (int j = 0; j <= pos[t]; j++)
                    o[n++] = j;
            else
                for (int j = pos[t] % 2; j <= pos[t] && n < c->topk; j += 2)
                    o[n++] = j;
            for (int i = n; i < c->topk; i++)
                o[i] = -1;
        }
    }
    float scale = 1.0f / sqrtf((float)(c->nope + c->rope));
    float *q_abs = malloc((size_t)T * c->H * Dk * 4), *o_lat = malloc((size_t)T * c->H * c->R * 4);
    float *out = malloc((size_t)T * c->H * c->v * 4);
    be->ops->mla_absorb_q(be, &kvb, &md, q, T, q_abs);
    be->ops->mla_attention(be, q_abs, &kv, &b, c->H, sel, c->topk, scale, o_lat);
    be->ops->mla_expand_o(be, &kvb, &md, o_lat, T, out);

    /* the expanded form, in double */
    double *want = calloc((size_t)T * c->H * c->v, sizeof(double));
    float *row = malloc((size_t)c->R * 4);
    double *wuk = malloc((size_t)c->nope * c->R * 8), *wuv = malloc((size_t)c->v * c->R * 8);
    double *sc = malloc((size_t)c->len * 8);
    for (int h = 0; h < c->H; h++) {
        for (int i = 0; i < c->nope + c->v; i++) {
            weight_dequant_row(&kvb, (int64_t)h * (c->nope + c->v) + i, row);
            for (int r = 0; r < c->R; r++)
                (i < c->nope ? wuk + (size_t)i * c->R : wuv + (size_t)(i - c->nope) * c->R)[r] = row[r];
        }
        for (int t = 0; t < T; t++) {
            const float *qh = q + ((size_t)t * c->H + h) * (c->nope + c->rope);
            double mx = -INFINITY;
            for (int j = 0; j <= pos[t]; j++) {
                sc[j] = -INFINITY;
                bool on = !sel;
                for (int i = 0; sel && i < c->topk; i++)
                    on |= sel[(size_t)t * c->topk + i] == j;
                if (!on)
                    continue;
                const float *lj = lat + ((size_t)table[j / bs] * bs + j % bs) * Dk;
                double dot = 0;
                for (int i = 0; i < c->nope; i++) {
                    double k = 0;
                    for (int r = 0; r < c->R; r++)
                        k += wuk[(size_t)i * c->R + r] * lj[r];
                    dot += qh[i] * k;
                }
                for (int i = 0; i < c->rope; i++)
                    dot += (double)qh[c->nope + i] * lj[c->R + i];
                sc[j] = dot * scale;
                mx = fmax(mx, sc[j]);
            }
            double sum = 0;
            for (int j = 0; j <= pos[t]; j++)
                sum += sc[j] == -INFINITY ? 0 : exp(sc[j] - mx);
            double *o = want + ((size_t)t * c->H + h) * c->v;
            for (int j = 0; j <= pos[t]; j++) {
                if (sc[j] == -INFINITY)
                    continue;
                double p = exp(sc[j] - mx) / sum;
                const float *lj = lat + ((size_t)table[j / bs] * bs + j % bs) * Dk;
                for (int i = 0; i < c->v; i++) {
                    double v = 0;
                    for (int r = 0; r < c->R; r++)
                        v += wuv[(size_t)i * c->R + r] * lj[r];
                    o[i] += p * v;
                }
            }
        }
    }
    double e = rel_err(out, want, (size_t)T * c->H * c->v);
    print_message("  mla %-6s h%d nope%d rope%d v%d r%d len%d T%d topk%d: rel err %.2e\n", weight_format_name(fmt),
                  c->H, c->nope, c->rope, c->v, c->R, c->len, T, c->topk, e);
    assert_true(e <= 1e-5);
    if (!c->topk) {
        /* dense: backend_ops.mla_attention_expanded, the same sum by the other route */
        int32_t keys = c->len;
        float *ex = malloc((size_t)T * c->H * c->v * 4);
        be->ops->mla_attention_expanded(be, q, &kvb, &md, &kv, &b, 1, &keys, scale, ex);
        double ee = rel_err(ex, want, (size_t)T * c->H * c->v);
        print_message("  mla_attention_expanded %-6s: rel err %.2e\n", weight_format_name(fmt), ee);
        assert_true(ee <= 1e-5);
        free(ex);
    }
    free(want), free(row), free(wuk), free(wuv), free(sc), free(q_abs), free(o_lat), free(out);
    free(lat), free(q), free(sel), free(wd), free(ws);
}

static void test_mla_absorbed_equals_expanded(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cpu_create(&be, &err), STATUS_OK);
    uint64_t rng = 91;
    static const struct mla_case cases[] = {
        {4, 16, 8, 16, 32, 24, 24, 0},  /* prefill, dense */
        {3, 24, 8, 20, 48, 37, 11, 0},  /* chunk after a cached prefix, dense, v != nope */
        {4, 16, 8, 24, 32, 30, 1, 6},   /* decode over a selection */
        {3, 24, 16, 20, 64, 40, 9, 16}, /* chunk, rows both under and over topk */
        {5, 16, 8, 16, 160, 12, 12, 8}, /* kv_b rows crossing FP8's 128-row blocks */
    };
    enum weight_format fmts[] = {WEIGHT_F32, WEIGHT_BF16, WEIGHT_FP8_BLOCK, WEIGHT_NVFP4};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t f = 0; f < 4; f++)
            check_mla_case(&be, &cases[c], fmts[f], &rng);
    backend_destroy(&be);
}

struct cand {
    double s;
    int32_t pos;
};

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->s != y->s)
        return x->s > y->s ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int i32_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void test_dsa_select_brute_force(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cpu_create(&be, &err), STATUS_OK);
    uint64_t rng = 92;
    /* {heads, dim, topk, len, fresh, zero every n-th key (0: none)} */
    static const int cases[][6] = {{8, 16, 8, 40, 40, 0}, {8, 16, 8, 40, 40, 3}, {4, 32, 20, 30, 3, 2},
                                   {32, 128, 64, 300, 2, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int HI = cases[c][0], DI = cases[c][1], K = cases[c][2], len = cases[c][3], T = cases[c][4];
        int zero = cases[c][5], bs = 16, nblk = (len + bs - 1) / bs;
        int32_t table[32], pos[64], seq[64];
        for (int i = 0; i < nblk; i++)
            table[i] = (i * 7 + 3) % nblk; /* a permutation (nblk is never a multiple of 7) */
        for (int t = 0; t < T; t++)
            pos[t] = len - T + t, seq[t] = 0;
        struct attn_batch b = {.n_tokens = T, .pos = pos, .seq = seq, .block_table = table, .max_blocks = nblk};
        float *keys = rand_floats((size_t)nblk * bs * DI, 1.0f, &rng), *q = rand_floats((size_t)T * HI * DI, 1.0f, &rng);
        float *w = rand_floats((size_t)T * HI, 1.0f, &rng);
        if (zero) {
            for (int s = 0; s < nblk * bs; s += zero)
                memset(keys + (size_t)s * DI, 0, (size_t)DI * 4);
            for (int i = 0; i < T * HI; i++)
                w[i] = fabsf(w[i]) + 0.01f;
        }
        struct dsa_args a = {.n_heads = HI, .head_dim = DI, .topk = K, .head_scale = 1.0f / sqrtf((float)HI),
                             .score_scale = 1.0f / sqrtf((float)DI)};
        struct paged_latent kv = {.index_k = keys, .block_size = bs, .index_dim = DI};
        int32_t *got = malloc((size_t)T * K * 4);
        float *work = malloc(backend_dsa_workspace_floats(T, K) * 4);
        be.ops->dsa_select(&be, q, w, &kv, &b, &a, work, got);
        int ties = 0;
        for (int t = 0; t < T; t++) {
            int n = pos[t] + 1;
            int32_t want[512];
            assert_true(K <= 512);
            if (n <= K) {
                for (int i = 0; i < K; i++)
                    want[i] = i < n ? i : -1;
            } else {
                struct cand *cs = malloc((size_t)n * sizeof *cs);
                for (int j = 0; j < n; j++) {
                    const float *k = keys + ((size_t)table[j / bs] * bs + j % bs) * DI;
                    float s = 0.0f; /* the spec's order and rounding (spec C.4) */
                    for (int h = 0; h < HI; h++) {
                        float dot = 0.0f;
                        for (int d = 0; d < DI; d++)
                            dot = fmaf(q[((size_t)t * HI + h) * DI + d], k[d], dot);
                        float r = dot * a.score_scale;
                        s = fmaf(w[(size_t)t * HI + h] * a.head_scale, r > 0 ? r : 0.0f, s);
                    }
                    cs[j] = (struct cand){s, j};
                }
                qsort(cs, (size_t)n, sizeof *cs, cand_cmp);
                ties += cs[K - 1].s == cs[K].s;
                for (int i = 0; i < K; i++)
                    want[i] = cs[i].pos;
                qsort(want, (size_t)K, 4, i32_cmp);
                free(cs);
            }
            for (int i = 0; i < K; i++)
                if (got[(size_t)t * K + i] != want[i])
                    fail_msg("case %zu row %d entry %d: got %d, want %d", c, t, i, got[(size_t)t * K + i], want[i]);
        }
        print_message("  dsa_select h%d d%d top%d len%d T%d: identical (%d rows tied at the boundary)\n", HI, DI, K,
                      len, T, ties);
        if (zero)
            assert_true(ties > 0); /* the tie rule was exercised */
        free(keys), free(q), free(w), free(got), free(work);
    }
    backend_destroy(&be);
}

static void test_layernorm_and_store(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cpu_create(&be, &err), STATUS_OK);
    uint64_t rng = 93;
    int rows = 5, dim = 48;
    float *x = rand_floats((size_t)rows * dim, 2.0f, &rng), *w = rand_floats((size_t)dim, 1.0f, &rng),
          *bb = rand_floats((size_t)dim, 1.0f, &rng), *y = malloc((size_t)rows * dim * 4);
    be.ops->layernorm(&be, x, w, bb, rows, dim, 1e-6f, y);
    double *want = malloc((size_t)rows * dim * 8);
    for (int r = 0; r < rows; r++) {
        double mean = 0, var = 0;
        for (int j = 0; j < dim; j++)
            mean += x[r * dim + j];
        mean /= dim;
        for (int j = 0; j < dim; j++)
            var += (x[r * dim + j] - mean) * (x[r * dim + j] - mean);
        var /= dim;
        for (int j = 0; j < dim; j++)
            want[r * dim + j] = w[j] * (x[r * dim + j] - mean) / sqrt(var + 1e-6) + bb[j];
    }
    assert_true(rel_err(y, want, (size_t)rows * dim) <= 1e-6);

    /* mla_store: slot 5 and 2 of an 8-slot cache; the rest untouched */
    int R = 32, rope = 8, di = 16;
    float *lat = rand_floats(8 * (size_t)(R + rope), 1.0f, &rng), *idx = rand_floats(8 * (size_t)di, 1.0f, &rng);
    float *lat0 = malloc(8 * (size_t)(R + rope) * 4), *idx0 = malloc(8 * (size_t)di * 4);
    memcpy(lat0, lat, 8 * (size_t)(R + rope) * 4);
    memcpy(idx0, idx, 8 * (size_t)di * 4);
    float *ckv = rand_floats(2 * (size_t)(R + rope), 3.0f, &rng), *nw = rand_floats((size_t)R, 1.0f, &rng);
    float *ik = rand_floats(2 * (size_t)di, 1.0f, &rng);
    int32_t slots[2] = {5, 2};
    struct paged_latent kv = {.latent = lat, .index_k = idx, .block_size = 4, .kv_rank = R, .rope_dim = rope,
                              .index_dim = di};
    be.ops->mla_store(&be, &kv, ckv, nw, 1e-6f, ik, 2, slots);
    for (int s = 0; s < 8; s++) {
        int t = s == 5 ? 0 : s == 2 ? 1 : -1;
        const float *lr = lat + (size_t)s * (R + rope);
        if (t < 0) {
            assert_memory_equal(lr, lat0 + (size_t)s * (R + rope), (size_t)(R + rope) * 4);
            assert_memory_equal(idx + (size_t)s * di, idx0 + (size_t)s * di, (size_t)di * 4);
            continue;
        }
        const float *src = ckv + (size_t)t * (R + rope);
        double ss = 0;
        for (int c = 0; c < R; c++)
            ss += (double)src[c] * src[c];
        double inv = 1.0 / sqrt(ss / R + 1e-6);
        for (int c = 0; c < R; c++)
            assert_true(fabs(lr[c] - nw[c] * src[c] * inv) <= 1e-5 * (1 + fabs(nw[c] * src[c] * inv)));
        assert_memory_equal(lr + R, src + R, (size_t)rope * 4);
        assert_memory_equal(idx + (size_t)s * di, ik + (size_t)t * di, (size_t)di * 4);
    }
    free(x), free(w), free(bb), free(y), free(want), free(lat), free(idx), free(lat0), free(idx0), free(ckv),
        free(nw), free(ik);
    backend_destroy(&be);
}

/* The fp8 latent row (backend.h): GLM-5's 656 bytes and the indexer key's 132; stored through
 * mla_store and read back through mla_attention over one key (softmax weight 1: o_lat is the
 * key's decoded c_kv), each value within half an e4m3 step (1/16 relative, or the subnormal
 * step of its block's scale), the scale amax / 448, an all-zero block decoded to zeros. */
static void test_fp8_latent_rows(void **state)
{
    (void)state;
    assert_int_equal(kv_latent_row_bytes(KV_DTYPE_FP8, 512, 64), 656);
    assert_int_equal(kv_index_row_bytes(KV_DTYPE_FP8, 128), 132);
    assert_int_equal(kv_latent_row_bytes(KV_DTYPE_BF16, 512, 64), 1152);
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cpu_create(&be, &err), STATUS_OK);
    uint64_t rng = 94;
    const int R = 256, rope = 64, H = 2;
    size_t rb = kv_latent_row_bytes(KV_DTYPE_FP8, R, rope);
    uint8_t *lat = calloc(4, rb);
    float *ckv = rand_floats((size_t)(R + rope), 2.0f, &rng), *nw = malloc((size_t)R * 4);
    for (int c = 0; c < R; c++)
        nw[c] = 1.0f;
    for (int c = 128; c < 256; c++)
        ckv[c] = 0.0f; /* the second block all zeros */
    int32_t slot = 3;
    struct paged_latent kv = {.latent = lat, .dtype = KV_DTYPE_FP8, .block_size = 4, .kv_rank = R, .rope_dim = rope};
    be.ops->mla_store(&be, &kv, ckv, nw, 1e-6f, NULL, 1, &slot);
    /* what the store normalised: rmsnorm with weight 1 */
    double ss = 0;
    for (int c = 0; c < R; c++)
        ss += (double)ckv[c] * ckv[c];
    float inv = 1.0f / sqrtf((float)(ss / R) + 1e-6f), amax = 0.0f;
    for (int c = 0; c < 128; c++)
        amax = fmaxf(amax, fabsf(ckv[c] * inv));
    float scale;
    memcpy(&scale, lat + 3 * rb + R, 4);
    assert_true(scale == amax / 448.0f);
    int32_t pos = 0, seq = 0, table = 0;
    struct attn_batch b = {.n_tokens = 1, .pos = &pos, .seq = &seq, .block_table = &table, .max_blocks = 1};
    slot = 0; /* attention reads slot 0 of sequence 0: store the row there too */
    be.ops->mla_store(&be, &kv, ckv, nw, 1e-6f, NULL, 1, &slot);
    float *q = rand_floats((size_t)H * (R + rope), 1.0f, &rng), *o = malloc((size_t)H * R * 4);
    be.ops->mla_attention(&be, q, &kv, &b, H, NULL, 0, 0.1f, o);
    for (int c = 0; c < R; c++) {
        float x = ckv[c] * inv, got = o[c];
        if (c >= 128)
            assert_true(got == 0.0f);
        else
            assert_true(fabsf(got - x) <= fmaxf(fabsf(x) / 16.0f, scale / 512.0f) + 1e-6f);
        assert_true(o[R + c] == got); /* the other head reads the same row */
    }
    free(lat), free(ckv), free(nw), free(q), free(o);
    backend_destroy(&be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mla_absorbed_equals_expanded),
                                       cmocka_unit_test(test_dsa_select_brute_force),
                                       cmocka_unit_test(test_layernorm_and_store),
                                       cmocka_unit_test(test_fp8_latent_rows)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
