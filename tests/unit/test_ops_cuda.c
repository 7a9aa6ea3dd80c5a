/* test_ops_cuda.c — every op of the CUDA backend against the CPU reference backend.
 *
 * Each op runs on random inputs (never all zeros) on both backends; the
 * CUDA output buffer is poisoned with NaN first, so an element the kernel
 * does not write fails the test. Error = max|gpu - cpu| / max|cpu|:
 * <= 1e-5 for fp32 ops (and for every linear/expert path that computes in
 * fp32: F32, F16, FP8 block, NVFP4), <= 1e-4 where cuBLAS takes bf16
 * operands (BF16 linear: activations split into bf16 hi + lo; a single
 * bf16 rounding would need 2e-2). Routing must pick identical expert ids.
 * Attention runs over a paged cache (block size 16, scattered block
 * tables) with several sequences at different lengths, GQA ratios 1..8 and
 * head_dim 24/64/128, through the unsplit (prefill) kernel, the split-K
 * (decode) kernel and the automatic choice.
 *
 * The whole suite runs twice: with the device's own shared-memory budget
 * (or MOESERVE_SMEM_BUDGET) and with the budget forced to 101376 bytes (the
 * tiles an sm_120 gets). Without a CUDA device it prints a skip message and
 * exits 0. MOESERVE_OPS_QUICK=1 leaves out the largest attention case (for
 * compute-sanitizer runs).
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
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_registry.h"
#include "base/dtype.h"
#include "base/log.h"
#include "test_rand.h"

#define TOL_F32 1e-5
#define TOL_BF16 1e-4 /* BF16 linear: cuBLAS on bf16 hi + lo activations (one bf16 rounding alone: 2e-2) */
#define TOL_BF16_ROUNDED 2e-2 /* operands rounded once to bf16: the bound for bf16 paths */

struct pair {
    struct backend cpu;
    struct backend gpu;
    size_t budget;
};

/* ---------------------------------------------------------------- helpers */

static void *dev_copy(struct backend *g, const void *h, size_t bytes)
{
    void *d = g->ops->alloc(g, bytes);
    assert_non_null(d);
    g->ops->upload(g, d, h, bytes);
    return d;
}

/* n floats of NaN on the device: what a kernel does not write stays NaN. */
static float *dev_nan(struct backend *g, size_t n)
{
    float *h = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = dev_copy(g, h, n * sizeof(float));
    free(h);
    return d;
}

static float *fetch(struct backend *g, const void *d, size_t n)
{
    float *h = malloc(n * sizeof(float) + 4);
    g->ops->download(g, h, d, n * sizeof(float));
    return h;
}

static void gpu_ok(struct backend *g)
{
    struct err err = {0};
    g->ops->synchronize(g);
    if (backend_cuda_status(g, &err))
        fail_msg("CUDA error: %s", err.msg);
}

/* max|got - want| / max|want|; every got must be written (not NaN). */
static double check_close(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double d = 0, m = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]))
            fail_msg("%s: element %zu not written (NaN; reference %g)", what, i, (double)want[i]);
        double e = fabs((double)got[i] - (double)want[i]);
        if (e > d) {
            d = e;
            worst = i;
        }
        m = fabs((double)want[i]) > m ? fabs((double)want[i]) : m;
    }
    double rel = m > 0 ? d / m : d;
    if (rel > tol)
        fail_msg("%s: rel err %.3e > %.1e (element %zu: gpu %.9g cpu %.9g)", what, rel, tol, worst,
                 (double)got[worst], (double)want[worst]);
    return rel;
}

/* ---------------------------------------------------------------- weights */

struct test_weight {
    struct weight host; /* host pointers: what the CPU backend reads */
    struct weight dev;  /* after weight_load on the GPU */
    void *data, *scale;
    float *bias, *dev_bias;
};

static void weight_make(struct test_weight *t, struct pair *p, enum weight_format fmt, int64_t n, int64_t k,
                        bool bias, uint64_t *rng)
{
    memset(t, 0, sizeof *t);
    size_t nk = (size_t)(n * k);
    t->host = (struct weight){.format = fmt, .rows = n, .cols = k, .scale2 = 1.0f};
    switch (fmt) {
    case WEIGHT_F32: t->data = rand_floats(nk, 1.0f, rng); break;
    case WEIGHT_BF16: {
        uint16_t *d = malloc(nk * 2 + 2);
        for (size_t i = 0; i < nk; i++)
            d[i] = f32_to_bf16(rng_unit(rng));
        t->data = d;
        break;
    }
    case WEIGHT_F16: {
        uint16_t *d = malloc(nk * 2 + 2);
        for (size_t i = 0; i < nk; i++) {
            uint64_t r = rng_next(rng);
            uint16_t exp = (uint16_t)(r % 8 == 0 ? 0 : 10 + (r >> 3) % 6); /* some subnormals */
            d[i] = (uint16_t)(((r >> 8) & 0x8000u) | (exp << 10) | ((r >> 20) & 0x3ffu));
        }
        t->data = d;
        break;
    }
    case WEIGHT_FP8_BLOCK: {
        uint8_t *d = malloc(nk + 1);
        for (size_t i = 0; i < nk; i++) {
            uint8_t b;
            do
                b = (uint8_t)rng_next(rng);
            while ((b & 0x7f) == 0x7f);
            d[i] = b;
        }
        size_t ns = (size_t)((n + 127) / 128 * ((k + 127) / 128));
        float *s = malloc(ns * 4 + 4);
        for (size_t i = 0; i < ns; i++)
            s[i] = ldexpf(1.0f + 0.5f * rng_unit(rng), -(int)(rng_next(rng) % 12));
        t->data = d;
        t->scale = s;
        break;
    }
    case WEIGHT_NVFP4: {
        uint8_t *d = malloc(nk / 2 + 1);
        for (size_t i = 0; i < nk / 2; i++)
            d[i] = (uint8_t)rng_next(rng);
        uint8_t *s = malloc(nk / 16 + 1);
        for (size_t i = 0; i < nk / 16; i++)
            s[i] = (uint8_t)(1 + rng_next(rng) % 0x7e);
        t->data = d;
        t->scale = s;
        t->host.scale2 = 0.37f;
        break;
    }
    case WEIGHT_FORMAT_COUNT: fail();
    }
    t->host.data = t->data;
    t->host.scale = t->scale;
    struct weight h = t->host;
    if (bias) {
        t->bias = rand_floats((size_t)n, 1.0f, rng);
        t->host.bias = t->bias;
        t->dev_bias = dev_copy(&p->gpu, t->bias, (size_t)n * sizeof(float));
        h.bias = t->dev_bias; /* as model_weights does: the bias is backend memory before weight_load */
    }
    struct err err = {0};
    if (p->gpu.ops->weight_load(&p->gpu, &h, &t->dev, WEIGHT_LOAD_DENSE | WEIGHT_LOAD_EXPERT, &err))
        fail_msg("weight_load: %s", err.msg);
}

static void weight_free(struct test_weight *t, struct pair *p)
{
    if (t->dev_bias)
        p->gpu.ops->free(&p->gpu, t->dev_bias);
    free(t->data);
    free(t->scale);
    free(t->bias);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- setup */

/* The plan's dispatch with `spec` first (MOESERVE_CUDA_FORCE's form; NULL: the plan's own). */
static void force(struct pair *p, const char *spec)
{
    struct err err = {0};
    if (backend_cuda_force(&p->gpu, spec, &err))
        fail_msg("backend_cuda_force(\"%s\"): %s", spec ? spec : "", err.msg);
}

/* NVFP4 linears through our GEMMs instead of a bf16 copy and cuBLAS: past 8 rows the tensor-core
 * GEMMs where the shape and device allow, the portable one else; the GEMV first at 2-8 rows. */
static void force_own_gemms(struct pair *p)
{
    const struct device_caps *caps = &backend_cuda_plan(&p->gpu)->caps;
    char spec[512];
    size_t o = (size_t)snprintf(spec, sizeof spec, "linear@2-8:gemm_nvfp4_wo_fp32%s",
                                caps->bf16_mma ? ",linear@2-8:gemv_decode_mma_bf16" : "");
    const char *big[] = {"9-32", "33-64", "65+"};
    for (int b = 0; b < 3; b++) {
        o += (size_t)snprintf(spec + o, sizeof spec - o, ",linear@%s:gemm_nvfp4_wo_fp32", big[b]);
        if (caps->bf16_mma)
            o += (size_t)snprintf(spec + o, sizeof spec - o, ",linear@%s:gemm_nvfp4_wo_mma", big[b]);
        if (caps->wgmma)
            o += (size_t)snprintf(spec + o, sizeof spec - o, ",linear@%s:gemm_nvfp4_wo_wgmma", big[b]);
    }
    force(p, spec);
}

static int setup_budget(void **state, size_t budget)
{
    struct pair *p = calloc(1, sizeof *p);
    struct err err = {0};
    p->budget = budget;
    if (backend_cpu_create(&p->cpu, &err) || backend_cuda_create(&p->gpu, 0, budget, &err)) {
        print_error("backend: %s\n", err.msg);
        free(p);
        return -1;
    }
    /* MOESERVE_OPS_NO_CUBLAS=1 (racecheck): NVFP4 linears on our GEMMs, not the bf16 copy + cuBLAS */
    if (getenv("MOESERVE_OPS_NO_CUBLAS"))
        force_own_gemms(p);
    const struct plan *pl = backend_cuda_plan(&p->gpu);
    print_message("  device %s, plan budget %zu bytes/block (requested %zu)\n", pl->caps.name,
                  pl->smem_budget, budget);
    *state = p;
    return 0;
}

static int setup_default(void **state)
{
    return setup_budget(state, 0);
}

static int setup_small(void **state)
{
    return setup_budget(state, 101376);
}

static int teardown(void **state)
{
    struct pair *p = *state;
    backend_destroy(&p->gpu);
    backend_destroy(&p->cpu);
    free(p);
    return 0;
}

/* ---------------------------------------------------------------- element-wise ops */

static void test_embed(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 11;
    enum weight_format fmts[] = {WEIGHT_F32, WEIGHT_BF16, WEIGHT_F16};
    for (size_t f = 0; f < 3; f++) {
        struct test_weight t;
        weight_make(&t, p, fmts[f], 97, 130, false, &rng);
        int n = 37;
        int32_t tok[37];
        for (int i = 0; i < n; i++)
            tok[i] = (int32_t)(rng_next(&rng) % 97);
        float *want = malloc((size_t)n * 130 * 4);
        p->cpu.ops->embed(&p->cpu, &t.host, tok, n, want);
        int32_t *dtok = dev_copy(&p->gpu, tok, sizeof tok);
        float *dout = dev_nan(&p->gpu, (size_t)n * 130);
        p->gpu.ops->embed(&p->gpu, &t.dev, dtok, n, dout);
        gpu_ok(&p->gpu);
        float *got = fetch(&p->gpu, dout, (size_t)n * 130);
        check_close(weight_format_name(fmts[f]), got, want, (size_t)n * 130, 0.0);
        free(got);
        free(want);
        p->gpu.ops->free(&p->gpu, dtok);
        p->gpu.ops->free(&p->gpu, dout);
        weight_free(&t, p);
    }
}

static void test_rmsnorm(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 12;
    int dims[] = {64, 130, 4096};
    for (int c = 0; c < 3; c++) {
        int rows = 7, dim = dims[c];
        size_t n = (size_t)rows * (size_t)dim;
        float *x = rand_floats(n, 3.0f, &rng), *w = rand_floats((size_t)dim, 1.0f, &rng);
        float *want = malloc(n * 4);
        p->cpu.ops->rmsnorm(&p->cpu, x, w, rows, dim, 1e-6f, want);
        float *dx = dev_copy(&p->gpu, x, n * 4), *dw = dev_copy(&p->gpu, w, (size_t)dim * 4);
        float *dy = dev_nan(&p->gpu, n);
        p->gpu.ops->rmsnorm(&p->gpu, dx, dw, rows, dim, 1e-6f, dy);
        p->gpu.ops->rmsnorm(&p->gpu, dx, dw, rows, dim, 1e-6f, dx); /* in place */
        gpu_ok(&p->gpu);
        float *got = fetch(&p->gpu, dy, n), *got2 = fetch(&p->gpu, dx, n);
        check_close("rmsnorm", got, want, n, TOL_F32);
        check_close("rmsnorm in place", got2, want, n, TOL_F32);
        free(got), free(got2), free(want), free(x), free(w);
        p->gpu.ops->free(&p->gpu, dx), p->gpu.ops->free(&p->gpu, dw), p->gpu.ops->free(&p->gpu, dy);
    }
}

static void test_add_rmsnorm(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 13;
    int rows = 5, dim = 257;
    size_t n = (size_t)rows * (size_t)dim;
    float *h = rand_floats(n, 2.0f, &rng), *d = rand_floats(n, 2.0f, &rng),
          *w = rand_floats((size_t)dim, 1.0f, &rng);
    float *dh = dev_copy(&p->gpu, h, n * 4), *dd = dev_copy(&p->gpu, d, n * 4),
          *dw = dev_copy(&p->gpu, w, (size_t)dim * 4);
    float *dy = dev_nan(&p->gpu, n);
    float *want = malloc(n * 4);
    p->cpu.ops->add_rmsnorm(&p->cpu, h, d, w, rows, dim, 1e-5f, want);
    p->gpu.ops->add_rmsnorm(&p->gpu, dh, dd, dw, rows, dim, 1e-5f, dy);
    gpu_ok(&p->gpu);
    float *gy = fetch(&p->gpu, dy, n), *gh = fetch(&p->gpu, dh, n);
    check_close("add_rmsnorm y", gy, want, n, TOL_F32);
    check_close("add_rmsnorm h", gh, h, n, 0.0);
    free(gy), free(gh), free(want), free(h), free(d), free(w);
    p->gpu.ops->free(&p->gpu, dh), p->gpu.ops->free(&p->gpu, dd), p->gpu.ops->free(&p->gpu, dw);
    p->gpu.ops->free(&p->gpu, dy);
}

static void test_rope(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 14;
    /* {heads, head_stride, dim, offset, interleaved, attention factor} */
    struct {
        int heads, stride, dim, offset, inter;
        float af;
    } cs[] = {
        {6, 64, 64, 0, 0, 1.0f}, {4, 48, 16, 8, 0, 1.3f}, {5, 128, 64, 64, 1, 1.0f}, {3, 32, 32, 0, 1, 0.8f}};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int T = 23, H = cs[c].heads, hs = cs[c].stride, dim = cs[c].dim;
        size_t n = (size_t)T * (size_t)H * (size_t)hs;
        float *x = rand_floats(n, 1.0f, &rng);
        float inv[64];
        for (int i = 0; i < dim / 2; i++)
            inv[i] = powf(10000.0f, -2.0f * (float)i / (float)dim);
        int32_t pos[23];
        for (int t = 0; t < T; t++)
            pos[t] = (int32_t)(rng_next(&rng) % 9000);
        struct rope_args a = {.dim = dim,
                              .offset = cs[c].offset,
                              .interleaved = cs[c].inter != 0,
                              .attention_factor = cs[c].af,
                              .inv_freq = inv};
        float *dx = dev_copy(&p->gpu, x, n * 4);
        float *dinv = dev_copy(&p->gpu, inv, (size_t)dim / 2 * 4);
        int32_t *dpos = dev_copy(&p->gpu, pos, sizeof pos);
        p->cpu.ops->rope(&p->cpu, x, T, H, hs, &a, pos);
        a.inv_freq = dinv;
        p->gpu.ops->rope(&p->gpu, dx, T, H, hs, &a, dpos);
        gpu_ok(&p->gpu);
        float *got = fetch(&p->gpu, dx, n);
        char what[64];
        snprintf(what, sizeof what, "rope case %zu", c);
        check_close(what, got, x, n, TOL_F32);
        free(got), free(x);
        p->gpu.ops->free(&p->gpu, dx), p->gpu.ops->free(&p->gpu, dinv), p->gpu.ops->free(&p->gpu, dpos);
    }
}

static void test_silu_mul_add(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 15;
    int rows = 9, dim = 333;
    size_t n = (size_t)rows * (size_t)dim;
    float *g = rand_floats(n, 6.0f, &rng), *u = rand_floats(n, 2.0f, &rng);
    float *want = malloc(n * 4);
    p->cpu.ops->silu_mul(&p->cpu, g, u, rows, dim, want);
    float *dg = dev_copy(&p->gpu, g, n * 4), *du = dev_copy(&p->gpu, u, n * 4), *dy = dev_nan(&p->gpu, n);
    p->gpu.ops->silu_mul(&p->gpu, dg, du, rows, dim, dy);
    p->gpu.ops->silu_mul(&p->gpu, dg, du, rows, dim, dg); /* out == gate, as the forward calls it */
    gpu_ok(&p->gpu);
    float *got = fetch(&p->gpu, dy, n), *got2 = fetch(&p->gpu, dg, n);
    check_close("silu_mul", got, want, n, TOL_F32);
    check_close("silu_mul in place", got2, want, n, TOL_F32);
    /* add, on identical inputs */
    p->gpu.ops->upload(&p->gpu, dy, want, n * 4);
    p->cpu.ops->add(&p->cpu, want, u, n);
    p->gpu.ops->add(&p->gpu, dy, du, n);
    gpu_ok(&p->gpu);
    free(got);
    got = fetch(&p->gpu, dy, n);
    check_close("add", got, want, n, 0.0);
    free(got), free(got2), free(want), free(g), free(u);
    p->gpu.ops->free(&p->gpu, dg), p->gpu.ops->free(&p->gpu, du), p->gpu.ops->free(&p->gpu, dy);
}

static void test_kv_store(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 16;
    int n_blocks = 9, bs = 16, nkv = 3, hd = 40, T = 20;
    size_t row = (size_t)nkv * (size_t)hd, slots_all = (size_t)n_blocks * (size_t)bs;
    float *kc = rand_floats(slots_all * row, 1.0f, &rng), *vc = rand_floats(slots_all * row, 1.0f, &rng);
    float *k = rand_floats((size_t)T * row, 1.0f, &rng), *v = rand_floats((size_t)T * row, 1.0f, &rng);
    int32_t slots[20];
    for (int t = 0; t < T; t++) /* distinct slots, scattered */
        slots[t] = (int32_t)((t * 37 + 5) % (int)slots_all);
    struct paged_kv hk = {.k = kc, .v = vc, .block_size = bs, .n_kv_heads = nkv, .head_dim = hd};
    struct paged_kv dk = hk;
    dk.k = dev_copy(&p->gpu, kc, slots_all * row * 4);
    dk.v = dev_copy(&p->gpu, vc, slots_all * row * 4);
    float *dkk = dev_copy(&p->gpu, k, (size_t)T * row * 4), *dvv = dev_copy(&p->gpu, v, (size_t)T * row * 4);
    int32_t *ds = dev_copy(&p->gpu, slots, sizeof slots);
    p->cpu.ops->kv_store(&p->cpu, &hk, k, v, T, slots);
    p->gpu.ops->kv_store(&p->gpu, &dk, dkk, dvv, T, ds);
    gpu_ok(&p->gpu);
    float *gk = fetch(&p->gpu, dk.k, slots_all * row), *gv = fetch(&p->gpu, dk.v, slots_all * row);
    check_close("kv_store k", gk, kc, slots_all * row, 0.0);
    check_close("kv_store v", gv, vc, slots_all * row, 0.0);
    free(gk), free(gv), free(kc), free(vc), free(k), free(v);
    p->gpu.ops->free(&p->gpu, dk.k), p->gpu.ops->free(&p->gpu, dk.v), p->gpu.ops->free(&p->gpu, dkk);
    p->gpu.ops->free(&p->gpu, dvv), p->gpu.ops->free(&p->gpu, ds);
}

/* ---------------------------------------------------------------- attention */

struct attn_case {
    const char *name;
    int n_heads, n_kv, hd;
    int n_seqs;
    int len[6];   /* keys each sequence has after this step */
    int fresh[6]; /* its last `fresh` positions are the batch's query tokens */
    bool shuffle; /* batch rows in random order (sequences interleaved) */
};

static void run_attention_case(struct pair *p, const struct attn_case *ac, uint64_t *rng)
{
    const int bs = 16;
    int max_blocks = 0, n_blocks = 0, T = 0;
    for (int s = 0; s < ac->n_seqs; s++) {
        int b = (ac->len[s] + bs - 1) / bs;
        max_blocks = b > max_blocks ? b : max_blocks;
        n_blocks += b;
        T += ac->fresh[s];
    }
    n_blocks += 3; /* unused blocks in the pool */
    /* a scattered block table: a random permutation of the pool */
    int32_t *perm = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *table = calloc((size_t)ac->n_seqs * (size_t)max_blocks, 4);
    int used = 0;
    for (int s = 0; s < ac->n_seqs; s++)
        for (int b = 0; b < (ac->len[s] + bs - 1) / bs; b++)
            table[s * max_blocks + b] = perm[used++];
    int32_t *pos = malloc((size_t)T * 4), *seq = malloc((size_t)T * 4);
    int t = 0;
    for (int s = 0; s < ac->n_seqs; s++)
        for (int i = ac->len[s] - ac->fresh[s]; i < ac->len[s]; i++, t++) {
            pos[t] = i;
            seq[t] = s;
        }
    if (ac->shuffle)
        for (int i = T - 1; i > 0; i--) {
            int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
            int32_t a = pos[i], b = seq[i];
            pos[i] = pos[j], seq[i] = seq[j];
            pos[j] = a, seq[j] = b;
        }
    size_t row = (size_t)ac->n_kv * (size_t)ac->hd, cache = (size_t)n_blocks * bs * row;
    size_t qn = (size_t)T * (size_t)ac->n_heads * (size_t)ac->hd;
    float *kc = rand_floats(cache, 1.0f, rng), *vc = rand_floats(cache, 1.0f, rng),
          *q = rand_floats(qn, 1.0f, rng);
    float scale = 1.0f / sqrtf((float)ac->hd);
    struct paged_kv hkv = {.k = kc, .v = vc, .block_size = bs, .n_kv_heads = ac->n_kv, .head_dim = ac->hd};
    struct attn_batch hb = {
        .n_tokens = T, .pos = pos, .seq = seq, .block_table = table, .max_blocks = max_blocks};
    float *want = malloc(qn * 4);
    p->cpu.ops->attention(&p->cpu, q, &hkv, &hb, ac->n_heads, scale, want);

    struct paged_kv dkv = hkv;
    dkv.k = dev_copy(&p->gpu, kc, cache * 4);
    dkv.v = dev_copy(&p->gpu, vc, cache * 4);
    struct attn_batch db = hb;
    db.pos = dev_copy(&p->gpu, pos, (size_t)T * 4);
    db.seq = dev_copy(&p->gpu, seq, (size_t)T * 4);
    db.block_table = dev_copy(&p->gpu, table, (size_t)ac->n_seqs * (size_t)max_blocks * 4);
    float *dq = dev_copy(&p->gpu, q, qn * 4);
    /* mode 5: 7 splits through the older split kernel + merge kernel pair; 6: 64 splits merged
     * through global memory where the default (auto, 64) merges in clusters of 8 (caps
     * "clusters"; 700 keys in 22 splits: three clusters, then their leaders), pushing their
     * partials into the leader; 7 and 8: the leader pulls them */
    int modes[] = {0, -1, 2, 7, 64, 7, 64, 0, 64};
    const char *mode_names[] = {"auto",
                                "unsplit",
                                "2 splits",
                                "7 splits",
                                "64 splits",
                                "7 splits, older kernels",
                                "64 splits, no clusters",
                                "auto, clusters pulled",
                                "64 splits, clusters pulled"};
    for (int m = 0; m < 9; m++) {
        backend_cuda_set_attention_splits(&p->gpu, modes[m]);
        backend_cuda_set_legacy_decode(&p->gpu, m == 5);
        backend_cuda_set_attn_cluster(&p->gpu, m != 6);
        backend_cuda_set_attn_push(&p->gpu, m < 7);
        float *dout = dev_nan(&p->gpu, qn);
        p->gpu.ops->attention(&p->gpu, dq, &dkv, &db, ac->n_heads, scale, dout);
        gpu_ok(&p->gpu);
        float *got = fetch(&p->gpu, dout, qn);
        char what[128];
        snprintf(what, sizeof what, "attention %s (%s)", ac->name, mode_names[m]);
        double e = check_close(what, got, want, qn, TOL_F32);
        print_message("    %-48s rel err %.2e\n", what, e);
        free(got);
        p->gpu.ops->free(&p->gpu, dout);
    }
    backend_cuda_set_attention_splits(&p->gpu, 0);
    backend_cuda_set_legacy_decode(&p->gpu, false);
    backend_cuda_set_attn_cluster(&p->gpu, true);
    backend_cuda_set_attn_push(&p->gpu, true);
    p->gpu.ops->free(&p->gpu, dkv.k), p->gpu.ops->free(&p->gpu, dkv.v);
    p->gpu.ops->free(&p->gpu, (void *)db.pos), p->gpu.ops->free(&p->gpu, (void *)db.seq);
    p->gpu.ops->free(&p->gpu, (void *)db.block_table), p->gpu.ops->free(&p->gpu, dq);
    free(kc), free(vc), free(q), free(want), free(pos), free(seq), free(table), free(perm);
}

static void test_attention(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 17;
    static const struct attn_case cases[] = {
        {"hd64 gqa4 chunked prefill", 8, 2, 64, 4, {1, 17, 40, 100}, {1, 17, 9, 100}, false},
        {"hd128 gqa8 prefill+decode", 16, 2, 128, 3, {300, 33, 16}, {300, 1, 16}, false},
        {"hd128 mha decode", 4, 4, 128, 2, {50, 129}, {1, 1}, false},
        {"hd64 gqa8 decode 5 seqs", 8, 1, 64, 5, {1, 15, 16, 17, 700}, {1, 1, 1, 1, 1}, false},
        {"hd24 gqa6 interleaved rows", 6, 1, 24, 2, {37, 10}, {37, 10}, true},
        {"hd128 gqa2 mixed, shuffled", 8, 4, 128, 3, {64, 200, 5}, {1, 64, 5}, true},
        {"hd128 gqa8 large prefill", 32, 4, 128, 2, {512, 384}, {512, 384}, false},
    };
    size_t n = sizeof cases / sizeof cases[0];
    if (getenv("MOESERVE_OPS_QUICK"))
        n--; /* under compute-sanitizer: the large prefill would take minutes */
    for (size_t c = 0; c < n; c++)
        run_attention_case(p, &cases[c], &rng);
}

/* ---------------------------------------------------------------- routing */

/* router_route (decode: the router GEMV and the routing in one kernel; off unless asked for)
 * against the CPU's linear then moe_route: the same expert ids, weights and logits within
 * TOL_F32; and the declines. */
static void test_router_route(void **state)
{
    struct pair *p = *state;
    if (!p->gpu.ops->router_route)
        fail_msg("the CUDA backend has no router_route");
    struct test_weight t0;
    uint64_t rng0 = 3;
    weight_make(&t0, p, WEIGHT_BF16, 64, 64, false, &rng0);
    struct route_args a0 = {.n_experts = 64, .n_used = 4, .score = ROUTE_SOFTMAX, .n_group = 1, .topk_group = 1,
                            .scaling = 1.0f};
    float *b0 = dev_nan(&p->gpu, 64 * 4);
    assert_false(p->gpu.ops->router_route(&p->gpu, &t0.dev, b0, 1, &a0, b0, (int32_t *)b0, b0)); /* off */
    p->gpu.ops->free(&p->gpu, b0);
    weight_free(&t0, p);
    backend_cuda_set_router_route(&p->gpu, true);
    uint64_t rng = 29;
    struct {
        int E, k, K, T;
        enum route_score score;
        bool corr, lin_bias, normalize;
        float scaling;
    } cs[] = {
        {128, 8, 2048, 1, ROUTE_SOFTMAX, false, false, true, 1.0f}, /* Qwen3-30B-A3B at batch 1 */
        {128, 8, 2048, 8, ROUTE_SOFTMAX, false, false, false, 1.0f},
        {64, 4, 136, 3, ROUTE_SIGMOID, true, true, true, 2.5f},     /* K not a multiple of 256 */
        {256, 8, 4096, 2, ROUTE_SIGMOID, true, false, true, 2.5f},  /* more than one round of loads */
        {512, 6, 64, 1, ROUTE_SOFTMAX, false, true, true, 1.0f},
        {40, 8, 2048, 2, ROUTE_SOFTMAX, false, false, true, 1.0f}, /* a part-filled cluster block */
    };
    /* each case twice: the counting kernel, then the cluster form (<= 128 experts, where caps
     * has clusters; the others stay on the counting kernel) */
    const size_t nc = sizeof cs / sizeof cs[0];
    for (size_t cc = 0; cc < 2 * nc; cc++) {
        const size_t c = cc % nc;
        backend_cuda_set_router_route_cluster(&p->gpu, cc >= nc);
        const int E = cs[c].E, k = cs[c].k, K = cs[c].K, T = cs[c].T;
        struct test_weight tw;
        weight_make(&tw, p, WEIGHT_BF16, E, K, cs[c].lin_bias, &rng);
        float *x = rand_floats((size_t)T * K, 1.0f, &rng);
        float *corr = cs[c].corr ? rand_floats((size_t)E, 0.5f, &rng) : NULL;
        struct route_args a = {.n_experts = E, .n_used = k, .score = cs[c].score, .correction_bias = corr,
                               .n_group = 1, .topk_group = 1, .normalize = cs[c].normalize,
                               .normalize_eps = 1e-20f, .scaling = cs[c].scaling};
        float *lg = malloc((size_t)T * E * 4);
        int32_t *ids = malloc((size_t)T * k * 4);
        float *w = malloc((size_t)T * k * 4);
        p->cpu.ops->linear(&p->cpu, &tw.host, x, T, lg);
        p->cpu.ops->moe_route(&p->cpu, lg, T, &a, ids, w);
        float *dx = dev_copy(&p->gpu, x, (size_t)T * K * 4);
        float *dcorr = corr ? dev_copy(&p->gpu, corr, (size_t)E * 4) : NULL;
        float *dlg = dev_nan(&p->gpu, (size_t)T * E);
        int32_t *dids = (int32_t *)dev_nan(&p->gpu, (size_t)T * k);
        float *dw = dev_nan(&p->gpu, (size_t)T * k);
        a.correction_bias = dcorr;
        if (!p->gpu.ops->router_route(&p->gpu, &tw.dev, dx, T, &a, dlg, dids, dw))
            fail_msg("router_route case %zu (E %d, K %d, T %d): declined", c, E, K, T);
        /* twice: the block counter must be back at zero for the next launch */
        assert_true(p->gpu.ops->router_route(&p->gpu, &tw.dev, dx, T, &a, dlg, dids, dw));
        gpu_ok(&p->gpu);
        int32_t *gids = malloc((size_t)T * k * 4);
        p->gpu.ops->download(&p->gpu, gids, dids, (size_t)T * k * 4);
        float *gw = fetch(&p->gpu, dw, (size_t)T * k), *glg = fetch(&p->gpu, dlg, (size_t)T * E);
        char what[96];
        snprintf(what, sizeof what, "router_route case %zu logits", c);
        double el = check_close(what, glg, lg, (size_t)T * E, TOL_F32);
        for (int i = 0; i < T * k; i++)
            if (gids[i] != ids[i])
                fail_msg("router_route case %zu: token %d slot %d: gpu expert %d, cpu %d", c, i / k, i % k, gids[i],
                         ids[i]);
        snprintf(what, sizeof what, "router_route case %zu weights", c);
        double ew = check_close(what, gw, w, (size_t)T * k, TOL_F32);
        print_message("    router_route%s E=%d k=%d K=%d T=%d: logits rel err %.2e, weights %.2e, ids identical\n",
                      cc >= nc ? " (cluster)" : "", E, k, K, T, el, ew);
        free(gids), free(gw), free(glg), free(lg), free(ids), free(w), free(x), free(corr);
        p->gpu.ops->free(&p->gpu, dx), p->gpu.ops->free(&p->gpu, dlg), p->gpu.ops->free(&p->gpu, dids);
        p->gpu.ops->free(&p->gpu, dw);
        if (dcorr)
            p->gpu.ops->free(&p->gpu, dcorr);
        weight_free(&tw, p);
    }
    /* what it must leave to linear + moe_route: a non-BF16 router, expert groups, many tokens */
    struct test_weight tf;
    weight_make(&tf, p, WEIGHT_F32, 64, 64, false, &rng);
    struct route_args a = {.n_experts = 64, .n_used = 4, .score = ROUTE_SOFTMAX, .n_group = 1, .topk_group = 1,
                           .scaling = 1.0f};
    float *buf = dev_nan(&p->gpu, 64 * 64 * 4);
    assert_false(p->gpu.ops->router_route(&p->gpu, &tf.dev, buf, 1, &a, buf, (int32_t *)buf, buf));
    weight_free(&tf, p);
    struct test_weight tb;
    weight_make(&tb, p, WEIGHT_BF16, 64, 64, false, &rng);
    struct route_args g = a;
    g.n_group = 8, g.topk_group = 2;
    assert_false(p->gpu.ops->router_route(&p->gpu, &tb.dev, buf, 1, &g, buf, (int32_t *)buf, buf));
    assert_false(p->gpu.ops->router_route(&p->gpu, &tb.dev, buf, 64, &a, buf, (int32_t *)buf, buf));
    weight_free(&tb, p);
    p->gpu.ops->free(&p->gpu, buf);
    gpu_ok(&p->gpu);
    backend_cuda_set_router_route_cluster(&p->gpu, false);
    backend_cuda_set_router_route(&p->gpu, false);
}

/* norm_router_route (add + RMSNorm + router GEMV + routing in one cluster kernel; only with
 * the cluster form of router_route, where the device has clusters) against the CPU's
 * add_rmsnorm (or rmsnorm), linear and moe_route: h, x, logits and weights within TOL_F32, the
 * same ids. */
static void test_norm_router_route(void **state)
{
    struct pair *p = *state;
    if (!p->gpu.ops->norm_router_route)
        fail_msg("the CUDA backend has no norm_router_route");
    uint64_t rng = 31;
    struct test_weight t0;
    weight_make(&t0, p, WEIGHT_BF16, 128, 256, false, &rng);
    struct route_args a0 = {.n_experts = 128, .n_used = 8, .score = ROUTE_SOFTMAX, .n_group = 1, .topk_group = 1,
                            .scaling = 1.0f};
    float *b0 = dev_nan(&p->gpu, 128 * 8);
    assert_false(p->gpu.ops->norm_router_route(&p->gpu, b0, b0, b0, 1e-6f, &t0.dev, 1, &a0, b0, b0, (int32_t *)b0,
                                               b0)); /* off unless the cluster form is asked for */
    backend_cuda_set_router_route(&p->gpu, true);
    backend_cuda_set_router_route_cluster(&p->gpu, true);
    const bool clusters = backend_cuda_plan(&p->gpu)->caps.clusters;
    p->gpu.ops->free(&p->gpu, b0);
    weight_free(&t0, p);
    struct {
        int E, k, K, T;
        bool delta, lin_bias;
    } cs[] = {
        {128, 8, 2048, 1, true, false}, /* Qwen3-30B-A3B at batch 1 */
        {128, 8, 2048, 8, true, false},
        {64, 4, 256, 3, false, true}, /* no pending add; a router bias */
        {40, 6, 8192, 2, true, false}, /* the largest K, a part-filled cluster block */
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int E = cs[c].E, k = cs[c].k, K = cs[c].K, T = cs[c].T;
        struct test_weight tw;
        weight_make(&tw, p, WEIGHT_BF16, E, K, cs[c].lin_bias, &rng);
        float *h = rand_floats((size_t)T * K, 2.0f, &rng), *delta = rand_floats((size_t)T * K, 1.0f, &rng);
        float *nw = rand_floats((size_t)K, 1.0f, &rng);
        struct route_args a = {.n_experts = E, .n_used = k, .score = ROUTE_SOFTMAX, .n_group = 1, .topk_group = 1,
                               .normalize = true, .normalize_eps = 1e-20f, .scaling = 1.0f};
        float *dh = dev_copy(&p->gpu, h, (size_t)T * K * 4), *dd = dev_copy(&p->gpu, delta, (size_t)T * K * 4);
        float *dnw = dev_copy(&p->gpu, nw, (size_t)K * 4);
        float *x = malloc((size_t)T * K * 4), *lg = malloc((size_t)T * E * 4), *w = malloc((size_t)T * k * 4);
        int32_t *ids = malloc((size_t)T * k * 4);
        if (cs[c].delta)
            p->cpu.ops->add_rmsnorm(&p->cpu, h, delta, nw, T, K, 1e-6f, x);
        else
            p->cpu.ops->rmsnorm(&p->cpu, h, nw, T, K, 1e-6f, x);
        p->cpu.ops->linear(&p->cpu, &tw.host, x, T, lg);
        p->cpu.ops->moe_route(&p->cpu, lg, T, &a, ids, w);
        float *dx = dev_nan(&p->gpu, (size_t)T * K), *dlg = dev_nan(&p->gpu, (size_t)T * E);
        int32_t *dids = (int32_t *)dev_nan(&p->gpu, (size_t)T * k);
        float *dw = dev_nan(&p->gpu, (size_t)T * k);
        bool took = p->gpu.ops->norm_router_route(&p->gpu, dh, cs[c].delta ? dd : NULL, dnw, 1e-6f, &tw.dev, T, &a, dx,
                                                  dlg, dids, dw);
        if (took != clusters)
            fail_msg("norm_router_route case %zu: %s where the device %s clusters", c, took ? "taken" : "declined",
                     clusters ? "has" : "has no");
        gpu_ok(&p->gpu);
        if (took) {
            float *gh = fetch(&p->gpu, dh, (size_t)T * K), *gx = fetch(&p->gpu, dx, (size_t)T * K);
            float *glg = fetch(&p->gpu, dlg, (size_t)T * E), *gw = fetch(&p->gpu, dw, (size_t)T * k);
            int32_t *gids = malloc((size_t)T * k * 4);
            p->gpu.ops->download(&p->gpu, gids, dids, (size_t)T * k * 4);
            char what[96];
            snprintf(what, sizeof what, "norm_router_route case %zu h", c);
            check_close(what, gh, h, (size_t)T * K, TOL_F32); /* the CPU's add_rmsnorm updated h too */
            snprintf(what, sizeof what, "norm_router_route case %zu x", c);
            double ex = check_close(what, gx, x, (size_t)T * K, TOL_F32);
            snprintf(what, sizeof what, "norm_router_route case %zu logits", c);
            double el = check_close(what, glg, lg, (size_t)T * E, TOL_F32);
            for (int i = 0; i < T * k; i++)
                if (gids[i] != ids[i])
                    fail_msg("norm_router_route case %zu: token %d slot %d: gpu expert %d, cpu %d", c, i / k, i % k,
                             gids[i], ids[i]);
            snprintf(what, sizeof what, "norm_router_route case %zu weights", c);
            double ew = check_close(what, gw, w, (size_t)T * k, TOL_F32);
            print_message("    norm_router_route E=%d k=%d K=%d T=%d%s: x rel err %.2e, logits %.2e, weights %.2e\n",
                          E, k, K, T, cs[c].delta ? " +delta" : "", ex, el, ew);
            free(gh), free(gx), free(glg), free(gw), free(gids);
        }
        free(h), free(delta), free(nw), free(x), free(lg), free(w), free(ids);
        p->gpu.ops->free(&p->gpu, dh), p->gpu.ops->free(&p->gpu, dd), p->gpu.ops->free(&p->gpu, dnw);
        p->gpu.ops->free(&p->gpu, dx), p->gpu.ops->free(&p->gpu, dlg), p->gpu.ops->free(&p->gpu, dids);
        p->gpu.ops->free(&p->gpu, dw);
        weight_free(&tw, p);
    }
    backend_cuda_set_router_route_cluster(&p->gpu, false);
    backend_cuda_set_router_route(&p->gpu, false);
}

static void test_moe_route(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 18;
    struct {
        int E, k;
        enum route_score score;
        bool bias;
        int n_group, topk_group;
        bool normalize;
        float eps, scaling;
        bool ties;
    } cs[] = {
        {64, 8, ROUTE_SOFTMAX, false, 1, 1, true, 0.0f, 1.0f, false},
        {64, 8, ROUTE_SOFTMAX, false, 1, 1, false, 0.0f, 1.0f, true},
        {16, 4, ROUTE_SIGMOID, true, 4, 2, true, 1e-20f, 2.5f, false},
        {256, 8, ROUTE_SIGMOID, true, 8, 4, true, 1e-20f, 2.5f, false},
        {160, 6, ROUTE_SIGMOID, true, 1, 1, false, 0.0f, 16.0f, true},
        {128, 8, ROUTE_SOFTMAX, false, 1, 1, true, 1e-6f, 1.0f, false},
        {128, 8, ROUTE_SOFTMAX, false, 1, 1, true, 1e-6f, 1.0f, true},
        {512, 8, ROUTE_SOFTMAX, false, 1, 1, true, 0.0f, 1.0f, false},
        {256, 40, ROUTE_SOFTMAX, true, 1, 1, true, 0.0f, 1.0f, true},
    };
    /* every case at 1 and 45 tokens (the rank-counting kernel where it takes them: no groups, <= 256
     * experts, <= 256 tokens) and at 300 (the one-warp-a-token kernel) */
    for (size_t ct = 0; ct < 3 * (sizeof cs / sizeof cs[0]); ct++) {
        const size_t c = ct / 3;
        int T = ct % 3 == 0 ? 1 : ct % 3 == 1 ? 45 : 300, E = cs[c].E, k = cs[c].k;
        float *lg = rand_floats((size_t)T * E, 4.0f, &rng);
        if (cs[c].ties) /* many exact ties: the lower expert id must win on both */
            for (int i = 0; i < T * E; i++)
                lg[i] = (float)(int)(lg[i] * 2.0f) * 0.5f;
        float *bias = cs[c].bias ? rand_floats((size_t)E, 0.5f, &rng) : NULL;
        struct route_args a = {.n_experts = E,
                               .n_used = k,
                               .score = cs[c].score,
                               .correction_bias = bias,
                               .n_group = cs[c].n_group,
                               .topk_group = cs[c].topk_group,
                               .normalize = cs[c].normalize,
                               .normalize_eps = cs[c].eps,
                               .scaling = cs[c].scaling};
        int32_t *ids = malloc((size_t)T * k * 4);
        float *w = malloc((size_t)T * k * 4);
        p->cpu.ops->moe_route(&p->cpu, lg, T, &a, ids, w);
        float *dlg = dev_copy(&p->gpu, lg, (size_t)T * E * 4);
        float *dbias = bias ? dev_copy(&p->gpu, bias, (size_t)E * 4) : NULL;
        int32_t *dids = (int32_t *)dev_nan(&p->gpu, (size_t)T * k);
        float *dw = dev_nan(&p->gpu, (size_t)T * k);
        a.correction_bias = dbias;
        p->gpu.ops->moe_route(&p->gpu, dlg, T, &a, dids, dw);
        gpu_ok(&p->gpu);
        int32_t *gids = malloc((size_t)T * k * 4);
        p->gpu.ops->download(&p->gpu, gids, dids, (size_t)T * k * 4);
        float *gw = fetch(&p->gpu, dw, (size_t)T * k);
        for (int i = 0; i < T * k; i++)
            if (gids[i] != ids[i])
                fail_msg("moe_route case %zu: token %d slot %d: gpu expert %d, cpu %d", c, i / k, i % k,
                         gids[i], ids[i]);
        char what[64];
        snprintf(what, sizeof what, "moe_route case %zu weights", c);
        check_close(what, gw, w, (size_t)T * k, TOL_F32);
        free(gids), free(gw), free(ids), free(w), free(lg), free(bias);
        p->gpu.ops->free(&p->gpu, dlg), p->gpu.ops->free(&p->gpu, dids), p->gpu.ops->free(&p->gpu, dw);
        if (dbias)
            p->gpu.ops->free(&p->gpu, dbias);
    }
}

/* ---------------------------------------------------------------- linear */

static void run_linear(struct pair *p, enum weight_format fmt, int64_t N, int64_t K, int m, bool bias,
                       uint64_t *rng)
{
    struct test_weight t;
    weight_make(&t, p, fmt, N, K, bias, rng);
    size_t xn = (size_t)m * (size_t)K, yn = (size_t)m * (size_t)N;
    float *x = rand_floats(xn, 1.0f, rng), *want = malloc(yn * 4);
    p->cpu.ops->linear(&p->cpu, &t.host, x, m, want);
    float *dx = dev_copy(&p->gpu, x, xn * 4), *dy = dev_nan(&p->gpu, yn);
    p->gpu.ops->linear(&p->gpu, &t.dev, dx, m, dy);
    gpu_ok(&p->gpu);
    float *got = fetch(&p->gpu, dy, yn);
    char what[128];
    snprintf(what, sizeof what, "linear %s N=%lld K=%lld m=%d%s", weight_format_name(fmt), (long long)N,
             (long long)K, m, bias ? " +bias" : "");
    /* cuBLAS on bf16 hi + lo activations (BF16 weights, NVFP4 ones expanded to bf16): the kernel
     * the plan runs for this call */
    const struct kernel_shape sh = {.format = fmt, .tokens = m, .n_weights = 1, .n = N, .k = K};
    const struct kernel_desc *k = plan_dispatch_pick(backend_cuda_plan(&p->gpu), PLAN_OP_LINEAR, &sh);
    assert_non_null(k);
    const bool split = k->id == CK_CUBLAS_BF16 || k->id == CK_CUBLAS_DEQUANT;
    check_close(what, got, want, yn, split ? TOL_BF16 : TOL_F32);
    free(got), free(x), free(want);
    p->gpu.ops->free(&p->gpu, dx), p->gpu.ops->free(&p->gpu, dy);
    weight_free(&t, p);
}

static void test_linear(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 19;
    enum weight_format fmts[] = {WEIGHT_F32, WEIGHT_BF16, WEIGHT_F16, WEIGHT_FP8_BLOCK, WEIGHT_NVFP4};
    /* shapes: aligned; fp8 blocks cut at 128 (N = 200, K = 48 + 256); K % 8 != 0 (scalar loads) */
    struct {
        int64_t N, K;
    } shapes[] = {{96, 64}, {200, 304}, {77, 40}, {130, 37}, {130, 1056}};
    int ms[] = {1, 3, 8, 9, 40, 130};
    for (size_t f = 0; f < 5; f++)
        for (size_t s = 0; s < 5; s++) {
            if (fmts[f] == WEIGHT_NVFP4 && shapes[s].K % 16)
                continue;
            for (size_t i = 0; i < 6; i++)
                run_linear(p, fmts[f], shapes[s].N, shapes[s].K, ms[i], (i + s) % 2 == 0, &rng);
        }
    /* NVFP4 above 8 rows: by default the weight expanded to bf16 for cuBLAS (cublas_dequant_bf16);
     * then, forced (MOESERVE_CUDA_FORCE's way), our GEMMs dequantising in registers; with and
     * without a bias, and at Qwen3-30B-A3B's q width */
    for (int off = 0; off < 2; off++) {
        if (off)
            force_own_gemms(p);
        for (size_t s = 0; s < 5; s++)
            if (shapes[s].K % 16 == 0)
                for (size_t i = 3; i < 6; i++)
                    run_linear(p, WEIGHT_NVFP4, shapes[s].N, shapes[s].K, ms[i], (i + s) % 2 == 0, &rng);
        if (!getenv("MOESERVE_OPS_QUICK")) /* not under compute-sanitizer: minutes there */
            run_linear(p, WEIGHT_NVFP4, 4096, 2048, 64, false, &rng);
    }
    force(p, NULL);
    if (getenv("MOESERVE_OPS_NO_CUBLAS"))
        force_own_gemms(p);
}

/* ---------------------------------------------------------------- experts */

/* tol: TOL_F32, or TOL_BF16 where real widths (K in the thousands) go through a GEMM on bf16
 * hi + lo activations, whose error grows past 1e-5 with K (measured 1.2e-5 at K = 2048). */
static void run_moe_tol(struct pair *p, enum weight_format fmt, int T, int E, int k, int D, int I, bool skewed,
                        double tol, uint64_t *rng)
{
    struct test_weight *g = calloc((size_t)E, sizeof *g), *u = calloc((size_t)E, sizeof *u),
                       *dn = calloc((size_t)E, sizeof *dn);
    struct weight *hg = calloc((size_t)E, sizeof *hg), *hu = calloc((size_t)E, sizeof *hu),
                  *hd = calloc((size_t)E, sizeof *hd);
    struct weight *dg = calloc((size_t)E, sizeof *dg), *du = calloc((size_t)E, sizeof *du),
                  *dd = calloc((size_t)E, sizeof *dd);
    for (int e = 0; e < E; e++) {
        weight_make(&g[e], p, fmt, I, D, false, rng);
        weight_make(&u[e], p, fmt, I, D, false, rng);
        weight_make(&dn[e], p, fmt, D, I, false, rng);
        hg[e] = g[e].host, hu[e] = u[e].host, hd[e] = dn[e].host;
        dg[e] = g[e].dev, du[e] = u[e].dev, dd[e] = dn[e].dev;
    }
    int32_t *ids = malloc((size_t)T * k * 4);
    float *w = malloc((size_t)T * k * 4);
    for (int t = 0; t < T; t++) {
        /* k distinct experts per token; skewed: all tokens in the first k + 1 experts */
        int span = skewed ? k + 1 : E;
        for (int j = 0; j < k; j++) {
            int e;
            bool dup;
            do {
                e = (int)(rng_next(rng) % (uint64_t)span);
                dup = false;
                for (int i = 0; i < j; i++)
                    dup |= ids[t * k + i] == e;
            } while (dup);
            ids[t * k + j] = e;
            w[t * k + j] = 0.1f + 0.9f * fabsf(rng_unit(rng));
        }
    }
    float *x = rand_floats((size_t)T * D, 1.0f, rng);
    size_t wf = backend_moe_workspace_floats(T, k, D, I);
    float *work = malloc(wf * 4), *want = malloc((size_t)T * D * 4);
    struct moe_args ha = {
        .n_experts = E, .n_used = k, .d_model = D, .d_expert = I, .gate = hg, .up = hu, .down = hd};
    p->cpu.ops->moe_experts(&p->cpu, x, T, ids, w, &ha, work, want);
    struct moe_args da = ha;
    da.gate = dg, da.up = du, da.down = dd;
    float *dx = dev_copy(&p->gpu, x, (size_t)T * D * 4), *dw = dev_copy(&p->gpu, w, (size_t)T * k * 4);
    int32_t *dids = dev_copy(&p->gpu, ids, (size_t)T * k * 4);
    float *dwork = dev_nan(&p->gpu, wf), *dout = dev_nan(&p->gpu, (size_t)T * D);
    p->gpu.ops->moe_experts(&p->gpu, dx, T, dids, dw, &da, dwork, dout);
    gpu_ok(&p->gpu);
    float *got = fetch(&p->gpu, dout, (size_t)T * D);
    char what[128];
    snprintf(what, sizeof what, "moe_experts %s T=%d E=%d k=%d D=%d I=%d%s", weight_format_name(fmt), T, E, k,
             D, I, skewed ? " skewed" : "");
    double e = check_close(what, got, want, (size_t)T * D, tol);
    print_message("    %-56s rel err %.2e\n", what, e);
    /* a second call through the cached expert table must give the same numbers bit for bit */
    p->gpu.ops->moe_experts(&p->gpu, dx, T, dids, dw, &da, dwork, dout);
    gpu_ok(&p->gpu);
    float *got2 = fetch(&p->gpu, dout, (size_t)T * D);
    assert_memory_equal(got2, got, (size_t)T * D * 4);
    free(got), free(got2);
    p->gpu.ops->free(&p->gpu, dx), p->gpu.ops->free(&p->gpu, dw), p->gpu.ops->free(&p->gpu, dids);
    p->gpu.ops->free(&p->gpu, dwork), p->gpu.ops->free(&p->gpu, dout);
    for (int i = 0; i < E; i++) {
        weight_free(&g[i], p);
        weight_free(&u[i], p);
        weight_free(&dn[i], p);
    }
    free(g), free(u), free(dn), free(hg), free(hu), free(hd), free(dg), free(du), free(dd);
    free(ids), free(w), free(x), free(work), free(want);
}

static void run_moe(struct pair *p, enum weight_format fmt, int T, int E, int k, int D, int I, bool skewed,
                    uint64_t *rng)
{
    run_moe_tol(p, fmt, T, E, k, D, I, skewed, TOL_F32, rng);
}

static void test_moe_experts(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 20;
    enum weight_format fmts[] = {WEIGHT_BF16, WEIGHT_NVFP4, WEIGHT_FP8_BLOCK, WEIGHT_F32};
    for (size_t f = 0; f < 4; f++) {
        run_moe(p, fmts[f], 1, 16, 4, 64, 48, false, &rng);
        run_moe(p, fmts[f], 5, 16, 4, 64, 48, false, &rng);
        run_moe(p, fmts[f], 70, 16, 4, 64, 48, false, &rng);
        run_moe(p, fmts[f], 150, 8, 2, 128, 96, true, &rng); /* > 64 rows per expert: several tiles each */
    }
    run_moe(p, WEIGHT_BF16, 33, 12, 3, 40, 24, false, &rng); /* widths not a multiple of 8 */
    /* the decode path (few tokens, pair by pair) at widths every format's chunks divide */
    for (size_t f = 0; f < 4; f++) {
        run_moe(p, fmts[f], 1, 32, 8, 256, 96, false, &rng);
        run_moe(p, fmts[f], 3, 32, 8, 256, 96, false, &rng);
        run_moe(p, fmts[f], 8, 16, 4, 1056, 160, true, &rng);
    }
    /* NVFP4 at widths that are multiples of 128: the tensor-core pair kernels (cuda_decode_mma.cu),
     * Qwen3-30B-A3B's among them */
    backend_cuda_set_moe_smem(&p->gpu, 0); /* weights through registers */
    run_moe(p, WEIGHT_NVFP4, 1, 32, 8, 256, 128, false, &rng);
    run_moe(p, WEIGHT_NVFP4, 3, 32, 8, 512, 256, false, &rng);
    run_moe(p, WEIGHT_NVFP4, 8, 16, 4, 1024, 384, true, &rng);
    run_moe(p, WEIGHT_NVFP4, 1, 64, 8, 2048, 768, false, &rng);
    /* the same kernels with their weights through shared memory (the default from 2 tokens), and
     * more slots than the down kernel has warps (a warp stages a second and a third expert) */
    backend_cuda_set_moe_smem(&p->gpu, 1);
    run_moe(p, WEIGHT_NVFP4, 1, 32, 8, 256, 128, false, &rng);
    run_moe(p, WEIGHT_NVFP4, 3, 32, 8, 512, 256, false, &rng);
    run_moe(p, WEIGHT_NVFP4, 8, 16, 4, 1024, 384, true, &rng);
    run_moe(p, WEIGHT_NVFP4, 2, 32, 10, 384, 256, false, &rng);
    run_moe(p, WEIGHT_NVFP4, 2, 32, 20, 1536, 256, false, &rng); /* three slots a down warp */
    run_moe(p, WEIGHT_NVFP4, 1, 64, 8, 2048, 768, false, &rng);
    backend_cuda_set_moe_smem(&p->gpu, 2);
    /* the pair kernels past 8 tokens (batch 9..32 decode), forced where these models' expert
     * counts would sort */
    if (backend_cuda_plan(&p->gpu)->caps.bf16_mma) {
        force(p, "moe_experts@9-32:moe_pair_decode_mma_bf16");
        run_moe(p, WEIGHT_NVFP4, 12, 32, 8, 512, 256, false, &rng);
        run_moe(p, WEIGHT_NVFP4, 32, 16, 4, 1024, 384, true, &rng);
        run_moe(p, WEIGHT_NVFP4, 20, 64, 8, 2048, 768, false, &rng);
        force(p, NULL);
        if (getenv("MOESERVE_OPS_NO_CUBLAS"))
            force_own_gemms(p);
    }
}

/* ---------------------------------------------------------------- fused decode ops */

static void test_linear_multi(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 21;
    enum weight_format fmts[] = {WEIGHT_F32, WEIGHT_BF16, WEIGHT_F16, WEIGHT_FP8_BLOCK, WEIGHT_NVFP4};
    int64_t K = 512, N[3] = {256, 64, 72};
    /* NVFP4 up to 8 rows: the tokens share cuda_gemv_mma's mma; 13 and 24: the GEMMs, as for the
     * other formats */
    int ms[] = {1, 2, 5, 8, 13, 24};
    {
        for (size_t f = 0; f < 5; f++)
            for (size_t mi = 0; mi < 6u; mi++) {
                int m = ms[mi];
                struct test_weight t[3];
                const struct weight *hw[3], *dw[3];
                float *want[3], *dy[3];
                float *x = rand_floats((size_t)m * K, 1.0f, &rng),
                      *dx = dev_copy(&p->gpu, x, (size_t)m * K * 4);
                for (int j = 0; j < 3; j++) {
                    weight_make(&t[j], p, fmts[f], N[j], K, j == 1, &rng);
                    hw[j] = &t[j].host, dw[j] = &t[j].dev;
                    want[j] = malloc((size_t)m * N[j] * 4);
                    p->cpu.ops->linear(&p->cpu, hw[j], x, m, want[j]);
                    dy[j] = dev_nan(&p->gpu, (size_t)m * N[j]);
                }
                p->gpu.ops->linear_multi(&p->gpu, 3, dw, dx, m, dy);
                gpu_ok(&p->gpu);
                for (int j = 0; j < 3; j++) {
                    float *got = fetch(&p->gpu, dy[j], (size_t)m * N[j]);
                    char what[128];
                    snprintf(what, sizeof what, "linear_multi %s m=%d weight %d", weight_format_name(fmts[f]),
                             m, j);
                    check_close(what, got, want[j], (size_t)m * N[j],
                                fmts[f] == WEIGHT_BF16 ? TOL_BF16 : TOL_F32);
                    free(got), free(want[j]);
                    p->gpu.ops->free(&p->gpu, dy[j]);
                    weight_free(&t[j], p);
                }
                free(x);
                p->gpu.ops->free(&p->gpu, dx);
            }
    }
}

/* attn_prep against the ops it fuses: rmsnorm q, rmsnorm k, rope q, rope k, kv_store; at 5 tokens
 * (a block a head) and 20 (a warp a head, from 9 tokens on). */
static void test_attn_prep(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 22;
    struct {
        int nh, nkv, hd, dim, offset;
        bool interleaved, norm;
    } cases[] = {{8, 2, 128, 128, 0, false, true}, {6, 6, 64, 32, 0, true, false}, {4, 1, 96, 48, 16, false, true}};
    for (size_t ct = 0; ct < 6; ct++) {
        const size_t c = ct % 3;
        int nh = cases[c].nh, nkv = cases[c].nkv, hd = cases[c].hd, T = ct < 3 ? 5 : 20, bs = 16,
            n_blocks = 4;
        size_t qn = (size_t)T * nh * hd, kn = (size_t)T * nkv * hd, row = (size_t)nkv * hd;
        size_t cache = (size_t)n_blocks * bs * row;
        float *q = rand_floats(qn, 2.0f, &rng), *k = rand_floats(kn, 2.0f, &rng), *v = rand_floats(kn, 1.0f, &rng);
        float *qw = rand_floats((size_t)hd, 1.0f, &rng), *kw = rand_floats((size_t)hd, 1.0f, &rng);
        float *kc = rand_floats(cache, 1.0f, &rng), *vc = rand_floats(cache, 1.0f, &rng);
        float inv_freq[128];
        for (int i = 0; i < cases[c].dim / 2; i++)
            inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)cases[c].dim);
        int32_t pos[20] = {0, 7, 300, 4095, 12}, slots[20] = {3, 17, 40, 63, 9};
        for (int i = 5; i < T; i++) /* distinct slots of the 64 */
            pos[i] = (i * 613) % 4096, slots[i] = 20 + i;
        /* the CPU reference: the five unfused ops */
        float *dq = dev_copy(&p->gpu, q, qn * 4), *dk = dev_copy(&p->gpu, k, kn * 4), *dv = dev_copy(&p->gpu, v, kn * 4);
        float *dqw = dev_copy(&p->gpu, qw, (size_t)hd * 4), *dkw = dev_copy(&p->gpu, kw, (size_t)hd * 4);
        float *dinv = dev_copy(&p->gpu, inv_freq, sizeof inv_freq);
        int32_t *dpos = dev_copy(&p->gpu, pos, sizeof pos), *dslots = dev_copy(&p->gpu, slots, sizeof slots);
        struct paged_kv hkv = {.k = kc, .v = vc, .block_size = bs, .n_kv_heads = nkv, .head_dim = hd};
        struct paged_kv dkv = hkv;
        dkv.k = dev_copy(&p->gpu, kc, cache * 4);
        dkv.v = dev_copy(&p->gpu, vc, cache * 4);
        struct rope_args ra = {.dim = cases[c].dim, .offset = cases[c].offset, .interleaved = cases[c].interleaved,
                               .attention_factor = 1.0f, .inv_freq = inv_freq};
        if (cases[c].norm) {
            p->cpu.ops->rmsnorm(&p->cpu, q, qw, T * nh, hd, 1e-6f, q);
            p->cpu.ops->rmsnorm(&p->cpu, k, kw, T * nkv, hd, 1e-6f, k);
        }
        p->cpu.ops->rope(&p->cpu, q, T, nh, hd, &ra, pos);
        p->cpu.ops->rope(&p->cpu, k, T, nkv, hd, &ra, pos);
        p->cpu.ops->kv_store(&p->cpu, &hkv, k, v, T, slots);
        struct rope_args da = ra;
        da.inv_freq = dinv;
        p->gpu.ops->attn_prep(&p->gpu, dq, dk, dv, T, nh, cases[c].norm ? dqw : NULL, cases[c].norm ? dkw : NULL,
                              1e-6f, &da, dpos, &dkv, dslots);
        gpu_ok(&p->gpu);
        float *gq = fetch(&p->gpu, dq, qn), *gk = fetch(&p->gpu, dkv.k, cache), *gv = fetch(&p->gpu, dkv.v, cache);
        char what[96];
        snprintf(what, sizeof what, "attn_prep case %zu T=%d q", c, T);
        check_close(what, gq, q, qn, TOL_F32);
        snprintf(what, sizeof what, "attn_prep case %zu T=%d k cache", c, T);
        check_close(what, gk, kc, cache, TOL_F32);
        snprintf(what, sizeof what, "attn_prep case %zu T=%d v cache", c, T);
        check_close(what, gv, vc, cache, 0.0);
        free(gq), free(gk), free(gv), free(q), free(k), free(v), free(qw), free(kw), free(kc), free(vc);
        void *ptrs[] = {dq, dk, dv, dqw, dkw, dinv, dpos, dslots, dkv.k, dkv.v};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
            p->gpu.ops->free(&p->gpu, ptrs[i]);
    }
}

static void test_argmax(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 23;
    int rows = 4, V = 151936;
    float *l = rand_floats((size_t)rows * V, 10.0f, &rng);
    l[0 * (size_t)V + 77777] = 50.0f;                                  /* row 0: a clear winner */
    l[1 * (size_t)V + 5] = 60.0f, l[1 * (size_t)V + 90000] = 60.0f;    /* row 1: a tie -> lowest id */
    l[2 * (size_t)V + 3] = NAN, l[2 * (size_t)V + 10] = 99.0f;         /* row 2: NaN -> -1 */
    for (int i = 0; i < V; i++)                                        /* row 3: all -inf -> 0 */
        l[3 * (size_t)V + i] = -INFINITY;
    float *dl = dev_copy(&p->gpu, l, (size_t)rows * V * 4);
    int32_t *dids = dev_copy(&p->gpu, (int32_t[4]){-7, -7, -7, -7}, 16), ids[4];
    p->gpu.ops->argmax(&p->gpu, dl, rows, V, dids);
    gpu_ok(&p->gpu);
    p->gpu.ops->download(&p->gpu, ids, dids, sizeof ids);
    assert_int_equal(ids[0], 77777);
    assert_int_equal(ids[1], 5);
    assert_int_equal(ids[2], -1);
    assert_int_equal(ids[3], 0);
    free(l);
    p->gpu.ops->free(&p->gpu, dl), p->gpu.ops->free(&p->gpu, dids);
    /* rows split over blocks (cuda_fused.cu argmax_split_kernel: 8192 entries a block) with a
     * ragged last slice, a tie across a slice boundary, and a width not a multiple of 4 (one
     * block a row); random rows against the host's first maximum */
    const int widths[2] = {3 * 8192 + 100, 1001};
    for (int wi = 0; wi < 2; wi++) {
        const int W = widths[wi];
        l = rand_floats((size_t)3 * W, 10.0f, &rng);
        l[(size_t)W - 1] = 70.0f;                      /* row 0: the winner in the ragged tail */
        l[(size_t)2 * W + 8191 % W] = 80.0f;           /* row 2: a tie across a slice boundary */
        l[(size_t)2 * W + 8192 % W] = 80.0f;
        int want[3];
        for (int r = 0; r < 3; r++) {
            want[r] = 0;
            for (int i = 1; i < W; i++)
                if (l[(size_t)r * W + i] > l[(size_t)r * W + want[r]])
                    want[r] = i;
        }
        dl = dev_copy(&p->gpu, l, (size_t)3 * W * 4);
        dids = dev_copy(&p->gpu, (int32_t[3]){-7, -7, -7}, 12);
        p->gpu.ops->argmax(&p->gpu, dl, 3, W, dids);
        gpu_ok(&p->gpu);
        p->gpu.ops->download(&p->gpu, ids, dids, 12);
        for (int r = 0; r < 3; r++)
            if (ids[r] != want[r])
                fail_msg("argmax width %d row %d: gpu %d, host %d", W, r, ids[r], want[r]);
        free(l);
        p->gpu.ops->free(&p->gpu, dl), p->gpu.ops->free(&p->gpu, dids);
    }
}

/* The device sampler: the draw follows u in id order over the kept set; top-k / top-p keep
 * exactly the CPU sampler's set (engine/sampler.c: sorted by probability, cut). */
static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

static void test_sample(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 24;
    const int V = 5000, R = 64;
    float *one = rand_floats((size_t)V, 3.0f, &rng);
    float *l = malloc((size_t)R * V * 4);
    for (int r = 0; r < R; r++)
        memcpy(l + (size_t)r * V, one, (size_t)V * 4);
    float *dl = dev_copy(&p->gpu, l, (size_t)R * V * 4);
    double *pr = malloc((size_t)V * sizeof(double)), *sorted = malloc((size_t)V * sizeof(double));
    double mx = -1e30;
    for (int i = 0; i < V; i++)
        mx = one[i] > mx ? one[i] : mx;
    struct {
        float t, top_p;
        int top_k;
    } cases[] = {{0.8f, 1.0f, 0}, {1.0f, 1.0f, 10}, {1.0f, 0.6f, 0}, {0.0f, 1.0f, 0}};
    for (size_t c = 0; c < 4; c++) {
        double total = 0;
        for (int i = 0; i < V; i++)
            total += pr[i] = cases[c].t > 0 ? exp(((double)one[i] - mx) / cases[c].t) : 0;
        /* the kept set's cut: the smallest probability kept */
        memcpy(sorted, pr, (size_t)V * sizeof(double));
        qsort(sorted, (size_t)V, sizeof(double), cmp_desc);
        int keep = V;
        if (cases[c].top_k > 0)
            keep = cases[c].top_k;
        if (cases[c].top_p < 1.0f) {
            double kt = 0, m = 0;
            for (int i = 0; i < keep; i++)
                kt += sorted[i];
            for (int i = 0; i < keep; i++)
                if ((m += sorted[i]) >= cases[c].top_p * kt) {
                    keep = i + 1;
                    break;
                }
        }
        double cut = sorted[keep - 1], kept = 0;
        for (int i = 0; i < V; i++)
            kept += pr[i] >= cut ? pr[i] : 0;
        struct sample_row sr[64];
        for (int r = 0; r < R; r++)
            sr[r] = (struct sample_row){.temperature = cases[c].t, .top_p = cases[c].top_p, .top_k = cases[c].top_k,
                                        .u = ((float)r + 0.5f) / (float)R};
        struct sample_row *dsr = dev_copy(&p->gpu, sr, sizeof sr);
        int32_t ids[64], *dids = dev_copy(&p->gpu, ids, sizeof ids);
        p->gpu.ops->sample(&p->gpu, dl, R, V, dsr, dids);
        gpu_ok(&p->gpu);
        p->gpu.ops->download(&p->gpu, ids, dids, sizeof ids);
        int checked = 0;
        for (int r = 0; r < R; r++) {
            if (cases[c].t == 0) {
                int best = 0;
                for (int i = 1; i < V; i++)
                    best = one[i] > one[best] ? i : best;
                assert_int_equal(ids[r], best);
                continue;
            }
            assert_true(ids[r] >= 0 && ids[r] < V);
            if (pr[ids[r]] < cut)
                fail_msg("sample case %zu row %d: id %d (p %.3g) outside the kept set (cut %.3g)", c, r, ids[r],
                         pr[ids[r]], cut);
            /* the id whose cumulative kept mass (id order) first passes u * kept */
            double target = sr[r].u * kept, acc = 0, margin = 1e-4 * kept;
            int want = -1;
            bool near = false;
            for (int i = 0; i < V && want < 0; i++) {
                if (pr[i] < cut)
                    continue;
                acc += pr[i];
                near |= fabs(acc - target) < margin;
                if (target < acc)
                    want = i;
            }
            if (!near) {
                assert_int_equal(ids[r], want);
                checked++;
            }
        }
        print_message("    sample T=%.1f top_p=%.1f top_k=%d: %d kept, %d/%d draws checked exactly\n",
                      (double)cases[c].t, (double)cases[c].top_p, cases[c].top_k, keep, checked, R);
        p->gpu.ops->free(&p->gpu, dsr), p->gpu.ops->free(&p->gpu, dids);
    }
    /* a NaN row is refused, whatever the parameters */
    l[7] = NAN;
    p->gpu.ops->upload(&p->gpu, dl, l, (size_t)V * 4);
    struct sample_row sr = {.temperature = 1.0f, .top_p = 0.9f, .u = 0.3f};
    struct sample_row *dsr = dev_copy(&p->gpu, &sr, sizeof sr);
    int32_t id = 5, *did = dev_copy(&p->gpu, &id, 4);
    p->gpu.ops->sample(&p->gpu, dl, 1, V, dsr, did);
    gpu_ok(&p->gpu);
    p->gpu.ops->download(&p->gpu, &id, did, 4);
    assert_int_equal(id, -1);
    p->gpu.ops->free(&p->gpu, dsr), p->gpu.ops->free(&p->gpu, did), p->gpu.ops->free(&p->gpu, dl);
    free(one), free(l), free(pr), free(sorted);
}

#include "ops_cuda_mla.inc" /* layernorm, mla_*, dsa_select (glm_moe_dsa) */
#include "ops_cuda_wgmma.inc" /* the Hopper wgmma GEMM, direct and through linear / moe_experts */
#include "ops_cuda_attn_mma.inc" /* the tensor-core prefill attention, its tile fit */
/* NVFP4 linears of 1..8 rows through cuda_gemv_mma (the rows share each mma): linear_multi
 * against the CPU's linear at Qwen3-30B-A3B's q/k/v and o widths and at widths that leave partial
 * row tiles; then with the portable GEMM forced at 2-8 rows. */
static void test_gemv_mma_tokens(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 47;
    const int64_t qkv[3] = {4096, 512, 512}, o[1] = {2048}, odd[3] = {1000, 3, 77};
    struct {
        int n_w;
        const int64_t *N;
        int64_t K;
        int m;
    } cs[] = {{3, qkv, 2048, 1}, {1, o, 4096, 1}, {3, odd, 768, 1}, {3, qkv, 2048, 2}, {3, qkv, 2048, 8}, {1, o, 4096, 3}, {1, o, 4096, 8}, {3, odd, 768, 5}, {3, odd, 256, 7}};
    for (int tokens = 8; tokens >= 1; tokens -= 7) {
        if (tokens == 1)
            force(p, "linear@2-8:gemm_nvfp4_wo_fp32");
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            const int n_w = cs[c].n_w, m = cs[c].m;
            const int64_t K = cs[c].K;
            struct test_weight t[3];
            const struct weight *dw[3];
            float *want[3], *dy[3];
            float *x = rand_floats((size_t)m * K, 1.0f, &rng), *dx = dev_copy(&p->gpu, x, (size_t)m * K * 4);
            for (int j = 0; j < n_w; j++) {
                weight_make(&t[j], p, WEIGHT_NVFP4, cs[c].N[j], K, j == 1, &rng);
                dw[j] = &t[j].dev;
                want[j] = malloc((size_t)m * cs[c].N[j] * 4);
                p->cpu.ops->linear(&p->cpu, &t[j].host, x, m, want[j]);
                dy[j] = dev_nan(&p->gpu, (size_t)m * cs[c].N[j]);
            }
            p->gpu.ops->linear_multi(&p->gpu, n_w, dw, dx, m, dy);
            gpu_ok(&p->gpu);
            double worst = 0;
            char what[128];
            for (int j = 0; j < n_w; j++) {
                float *got = fetch(&p->gpu, dy[j], (size_t)m * cs[c].N[j]);
                snprintf(what, sizeof what, "nvfp4 linear_multi m=%d N=%lld K=%lld (tokens %d) weight %d", m,
                         (long long)cs[c].N[j], (long long)K, tokens, j);
                double e = check_close(what, got, want[j], (size_t)m * cs[c].N[j], TOL_F32);
                worst = e > worst ? e : worst;
                free(got), free(want[j]);
                p->gpu.ops->free(&p->gpu, dy[j]);
                weight_free(&t[j], p);
            }
            print_message("    %-64s rel err %.2e\n", what, worst);
            free(x);
            p->gpu.ops->free(&p->gpu, dx);
        }
    }
    force(p, NULL);
    if (getenv("MOESERVE_OPS_NO_CUBLAS"))
        force_own_gemms(p);
}


int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    if (backend_cuda_device_count() == 0) {
        printf("test_ops_cuda: no CUDA device found, skipping (needs a GPU; run tools/gpu_check.sh there)\n");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_silu_mul_add),
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_router_route),
        cmocka_unit_test(test_norm_router_route),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_moe_experts),
        cmocka_unit_test(test_linear_multi),
        cmocka_unit_test(test_attn_prep),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_mla_store),
        cmocka_unit_test(test_mla_absorb_expand),
        cmocka_unit_test(test_mla_attention),
        cmocka_unit_test(test_dsa_select),
        cmocka_unit_test(test_mla_unstaged),
        cmocka_unit_test(test_wgmma_gemm),
        cmocka_unit_test(test_attention_mma),
        cmocka_unit_test(test_gemv_mma_tokens),
    };
    /* MOESERVE_OPS_FILTER=PATTERN: only the tests whose names match (cmocka's * and ?), e.g. one
     * test under compute-sanitizer's racecheck, which takes minutes for the whole file */
    const char *only = getenv("MOESERVE_OPS_FILTER");
    if (only && *only)
        cmocka_set_test_filter(only);
    int failed = cmocka_run_group_tests_name("cuda ops, device smem budget", tests, setup_default, teardown);
    failed += cmocka_run_group_tests_name("cuda ops, smem budget 101376 (sm_120 tiles)", tests, setup_small,
                                          teardown);
    return failed;
}
