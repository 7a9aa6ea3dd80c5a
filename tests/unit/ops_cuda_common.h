/* ops_cuda_common.h — what the CUDA op tests (tests/unit/test_ops_*_cuda.c, one program a kernel
 * family) share: a CPU and a CUDA backend side by side (struct pair), random inputs, device
 * buffers poisoned with NaN, the error measure, test weights in every format, the plan's forcing
 * hook, and the main that runs a family's tests at the device's shared-memory budget and at
 * 101376 bytes (the tiles an sm_120 gets).
 *
 * Each op runs on random inputs (never all zeros) on both backends; the CUDA output buffer is
 * poisoned with NaN first, so an element the kernel does not write fails the test. Error =
 * max|gpu - cpu| / max|cpu|: <= 1e-5 for fp32 ops (and for every linear/expert path that
 * computes in fp32: F32, F16, FP8 block, NVFP4), <= 1e-4 where cuBLAS takes bf16 operands (BF16
 * linear: activations split into bf16 hi + lo; a single bf16 rounding would need 2e-2). Routing
 * must pick identical expert ids. Without a CUDA device a program prints a skip message and
 * exits 0. MOESERVE_OPS_QUICK=1 leaves out the largest cases (compute-sanitizer runs),
 * MOESERVE_OPS_FILTER=PATTERN runs the matching tests only, MOESERVE_OPS_NO_CUBLAS=1 keeps NVFP4
 * linears off cuBLAS (racecheck).
 */
#ifndef MOESERVE_TESTS_OPS_CUDA_COMMON_H
#define MOESERVE_TESTS_OPS_CUDA_COMMON_H

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
    int mask_lo, mask_hi; /* run_moe: the slots outside experts [lo, hi) masked (moe_mask_ids) on both
                             backends first, as an expert-parallel rank does; hi 0: none */
};

/* ---------------------------------------------------------------- helpers */

static inline void *dev_copy(struct backend *g, const void *h, size_t bytes)
{
    void *d = g->ops->alloc(g, bytes);
    assert_non_null(d);
    g->ops->upload(g, d, h, bytes);
    return d;
}

/* n floats of NaN on the device: what a kernel does not write stays NaN. */
static inline float *dev_nan(struct backend *g, size_t n)
{
    float *h = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = dev_copy(g, h, n * sizeof(float));
    free(h);
    return d;
}

static inline float *fetch(struct backend *g, const void *d, size_t n)
{
    float *h = malloc(n * sizeof(float) + 4);
    g->ops->download(g, h, d, n * sizeof(float));
    return h;
}

static inline void gpu_ok(struct backend *g)
{
    struct err err = {0};
    g->ops->synchronize(g);
    if (backend_cuda_status(g, &err))
        fail_msg("CUDA error: %s", err.msg);
}

/* max|got - want| / max|want|; every got must be written (not NaN). */
static inline double check_close(const char *what, const float *got, const float *want, size_t n, double tol)
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
    struct rand_weight src; /* host memory: what the CPU backend reads (src.w) */
    struct weight dev;      /* after weight_load on the GPU */
    float *dev_bias;
};

/* weight_make with the weight_load flags of a role (WEIGHT_LOAD_*) */
static inline void weight_make_as(struct test_weight *t, struct pair *p, enum weight_format fmt, int64_t n,
                                  int64_t k, bool bias, unsigned flags, uint64_t *rng);

static inline void weight_make(struct test_weight *t, struct pair *p, enum weight_format fmt, int64_t n, int64_t k,
                               bool bias, uint64_t *rng)
{
    weight_make_as(t, p, fmt, n, k, bias, WEIGHT_LOAD_DENSE | WEIGHT_LOAD_EXPERT, rng);
}

static inline void weight_make_as(struct test_weight *t, struct pair *p, enum weight_format fmt, int64_t n,
                                  int64_t k, bool bias, unsigned flags, uint64_t *rng)
{
    memset(t, 0, sizeof *t);
    rand_weight_init(&t->src, fmt, n, k, bias, rng);
    struct weight h = t->src.w;
    if (bias) {
        t->dev_bias = dev_copy(&p->gpu, t->src.bias, (size_t)n * sizeof(float));
        h.bias = t->dev_bias; /* as model_weights does: the bias is backend memory before weight_load */
    }
    struct err err = {0};
    if (p->gpu.ops->weight_load(&p->gpu, &h, &t->dev, flags, &err))
        fail_msg("weight_load: %s", err.msg);
}

static inline void weight_free(struct test_weight *t, struct pair *p)
{
    if (t->dev_bias)
        p->gpu.ops->free(&p->gpu, t->dev_bias);
    rand_weight_free(&t->src);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- setup */

/* The plan's dispatch with `spec` first (MOESERVE_CUDA_FORCE's form; NULL: the plan's own). */
static inline void force(struct pair *p, const char *spec)
{
    struct err err = {0};
    if (backend_cuda_force(&p->gpu, spec, &err))
        fail_msg("backend_cuda_force(\"%s\"): %s", spec ? spec : "", err.msg);
}

/* NVFP4 linears through our GEMMs instead of a bf16 copy and cuBLAS: past 8 rows the tensor-core
 * GEMMs where the shape and device allow, the portable one else; the GEMV first at 2-8 rows. */
static inline void force_own_gemms(struct pair *p)
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

static inline int setup_budget(void **state, size_t budget)
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

static inline int setup_default(void **state)
{
    return setup_budget(state, 0);
}

static inline int setup_small(void **state)
{
    return setup_budget(state, 101376);
}

static inline int teardown(void **state)
{
    struct pair *p = *state;
    backend_destroy(&p->gpu);
    backend_destroy(&p->cpu);
    free(p);
    return 0;
}

static inline void run_linear(struct pair *p, enum weight_format fmt, int64_t N, int64_t K, int m, bool bias,
                       uint64_t *rng)
{
    struct test_weight t;
    weight_make(&t, p, fmt, N, K, bias, rng);
    size_t xn = (size_t)m * (size_t)K, yn = (size_t)m * (size_t)N;
    float *x = rand_floats(xn, 1.0f, rng), *want = malloc(yn * 4);
    p->cpu.ops->linear(&p->cpu, &t.src.w, x, m, want);
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

/* tol: TOL_F32, or TOL_BF16 where real widths (K in the thousands) go through a GEMM on bf16
 * hi + lo activations, whose error grows past 1e-5 with K (measured 1.2e-5 at K = 2048).
 * shared: a shared expert of the routed experts' shape too, through the GPU's moe_experts_shared
 * (which must take it), against the CPU's moe_experts then the forward's MLP and add. */
static inline void run_moe_full(struct pair *p, enum weight_format fmt, int T, int E, int k, int D, int I,
                                bool skewed, double tol, bool shared, uint64_t *rng)
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
        hg[e] = g[e].src.w, hu[e] = u[e].src.w, hd[e] = dn[e].src.w;
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
    int32_t *dids = dev_copy(&p->gpu, ids, (size_t)T * k * 4);
    if (p->mask_hi) {
        p->cpu.ops->moe_mask_ids(&p->cpu, ids, (size_t)T * k, p->mask_lo, p->mask_hi);
        p->gpu.ops->moe_mask_ids(&p->gpu, dids, (size_t)T * k, p->mask_lo, p->mask_hi);
        int32_t *back = (int32_t *)fetch(&p->gpu, dids, (size_t)T * k);
        assert_memory_equal(back, ids, (size_t)T * k * 4);
        free(back);
    }
    p->cpu.ops->moe_experts(&p->cpu, x, T, ids, w, &ha, work, want);
    struct test_weight sw[3];
    const struct weight *hsh[3] = {NULL, NULL, NULL}, *dsh[3] = {NULL, NULL, NULL};
    if (shared) { /* the forward's MLP: gate, up, silu_mul, down, then added after the routed sum */
        weight_make(&sw[0], p, fmt, I, D, false, rng);
        weight_make(&sw[1], p, fmt, I, D, false, rng);
        weight_make(&sw[2], p, fmt, D, I, false, rng);
        for (int j = 0; j < 3; j++)
            hsh[j] = &sw[j].src.w, dsh[j] = &sw[j].dev;
        float *sg = malloc((size_t)T * I * 4), *su = malloc((size_t)T * I * 4), *sd = malloc((size_t)T * D * 4);
        p->cpu.ops->linear(&p->cpu, hsh[0], x, T, sg);
        p->cpu.ops->linear(&p->cpu, hsh[1], x, T, su);
        p->cpu.ops->silu_mul(&p->cpu, sg, su, T, I, sg);
        p->cpu.ops->linear(&p->cpu, hsh[2], sg, T, sd);
        p->cpu.ops->add(&p->cpu, want, sd, (size_t)T * D);
        free(sg), free(su), free(sd);
    }
    struct moe_args da = ha;
    da.gate = dg, da.up = du, da.down = dd;
    float *dx = dev_copy(&p->gpu, x, (size_t)T * D * 4), *dw = dev_copy(&p->gpu, w, (size_t)T * k * 4);
    float *dwork = dev_nan(&p->gpu, wf), *dout = dev_nan(&p->gpu, (size_t)T * D);
    if (shared)
        assert_true(p->gpu.ops->moe_experts_shared(&p->gpu, dx, T, dids, dw, &da, dsh, dwork, dout));
    else
        p->gpu.ops->moe_experts(&p->gpu, dx, T, dids, dw, &da, dwork, dout);
    gpu_ok(&p->gpu);
    float *got = fetch(&p->gpu, dout, (size_t)T * D);
    char what[128];
    snprintf(what, sizeof what, "moe_experts%s %s T=%d E=%d k=%d D=%d I=%d%s%s", shared ? "_shared" : "",
             weight_format_name(fmt), T, E, k, D, I, skewed ? " skewed" : "", p->mask_hi ? " masked" : "");
    double e = check_close(what, got, want, (size_t)T * D, tol);
    print_message("    %-56s rel err %.2e\n", what, e);
    /* a second call through the cached expert table must give the same numbers bit for bit */
    if (shared)
        assert_true(p->gpu.ops->moe_experts_shared(&p->gpu, dx, T, dids, dw, &da, dsh, dwork, dout));
    else
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
    if (shared)
        for (int j = 0; j < 3; j++)
            weight_free(&sw[j], p);
    free(g), free(u), free(dn), free(hg), free(hu), free(hd), free(dg), free(du), free(dd);
    free(ids), free(w), free(x), free(work), free(want);
}

static inline void run_moe_tol(struct pair *p, enum weight_format fmt, int T, int E, int k, int D, int I, bool skewed,
                               double tol, uint64_t *rng)
{
    run_moe_full(p, fmt, T, E, k, D, I, skewed, tol, false, rng);
}

static inline void run_moe(struct pair *p, enum weight_format fmt, int T, int E, int k, int D, int I, bool skewed,
                    uint64_t *rng)
{
    run_moe_tol(p, fmt, T, E, k, D, I, skewed, TOL_F32, rng);
}

/* A scattered block table over a pool of blocks for n_seqs sequences of len[] keys. */
struct mla_batch {
    int bs, max_blocks, n_blocks, T, n_seqs;
    int32_t *table, *pos, *seq; /* host */
    struct attn_batch hb, db;   /* host / device pointers */
};

static inline void mla_batch_make(struct mla_batch *m, struct pair *p, int n_seqs, const int *len, const int *fresh,
                           bool shuffle, uint64_t *rng)
{
    memset(m, 0, sizeof *m);
    m->bs = 16;
    m->n_seqs = n_seqs;
    for (int s = 0; s < n_seqs; s++) {
        int b = (len[s] + m->bs - 1) / m->bs;
        m->max_blocks = b > m->max_blocks ? b : m->max_blocks;
        m->n_blocks += b;
        m->T += fresh[s];
    }
    m->n_blocks += 3;
    int32_t *perm = malloc((size_t)m->n_blocks * 4);
    for (int i = 0; i < m->n_blocks; i++)
        perm[i] = i;
    for (int i = m->n_blocks - 1; i > 0; i--) {
        int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    m->table = calloc((size_t)n_seqs * (size_t)m->max_blocks, 4);
    int used = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int b = 0; b < (len[s] + m->bs - 1) / m->bs; b++)
            m->table[s * m->max_blocks + b] = perm[used++];
    free(perm);
    m->pos = malloc((size_t)m->T * 4);
    m->seq = malloc((size_t)m->T * 4);
    int t = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int i = len[s] - fresh[s]; i < len[s]; i++, t++)
            m->pos[t] = i, m->seq[t] = s;
    if (shuffle)
        for (int i = m->T - 1; i > 0; i--) {
            int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
            int32_t a = m->pos[i], b = m->seq[i];
            m->pos[i] = m->pos[j], m->seq[i] = m->seq[j];
            m->pos[j] = a, m->seq[j] = b;
        }
    m->hb = (struct attn_batch){.n_tokens = m->T, .pos = m->pos, .seq = m->seq, .block_table = m->table,
                                .max_blocks = m->max_blocks};
    m->db = m->hb;
    m->db.pos = dev_copy(&p->gpu, m->pos, (size_t)m->T * 4);
    m->db.seq = dev_copy(&p->gpu, m->seq, (size_t)m->T * 4);
    m->db.block_table = dev_copy(&p->gpu, m->table, (size_t)n_seqs * (size_t)m->max_blocks * 4);
}

static inline void mla_batch_free(struct mla_batch *m, struct pair *p)
{
    p->gpu.ops->free(&p->gpu, (void *)m->db.pos);
    p->gpu.ops->free(&p->gpu, (void *)m->db.seq);
    p->gpu.ops->free(&p->gpu, (void *)m->db.block_table);
    free(m->table), free(m->pos), free(m->seq);
}

/* A family's tests at both budgets; 0 when all pass (or there is no device). */
static inline int ops_cuda_main(const char *name, const struct CMUnitTest *tests, size_t n)
{
    log_set_level(LOG_LEVEL_WARN);
    if (backend_cuda_device_count() == 0) {
        printf("%s: no CUDA device found, skipping (needs a GPU; run tools/gpu_check.sh there)\n", name);
        return 0;
    }
    const char *only = getenv("MOESERVE_OPS_FILTER");
    if (only && *only)
        cmocka_set_test_filter(only);
    char g[160];
    snprintf(g, sizeof g, "%s, device smem budget", name);
    int failed = _cmocka_run_group_tests(g, tests, n, setup_default, teardown);
    snprintf(g, sizeof g, "%s, smem budget 101376 (sm_120 tiles)", name);
    failed += _cmocka_run_group_tests(g, tests, n, setup_small, teardown);
    return failed;
}

#endif
