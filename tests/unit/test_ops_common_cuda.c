/* test_ops_common_cuda.c — the small ops (embedding, norms, RoPE, SiLU, the KV cache write, attn_prep, argmax, sampling), on the CUDA backend against the CPU reference (ops_cuda_common.h). */
#include "ops_cuda_common.h"

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
        p->cpu.ops->embed(&p->cpu, &t.src.w, tok, n, want);
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
    /* the plain kernel (64, 130), the register-row kernel with 2 and 8 float4s a thread (2048 and 6144:
     * GLM-5's q_a norm and its width; 4096) */
    int dims[] = {64, 130, 2048, 4096, 6144};
    for (int c = 0; c < 5; c++) {
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

/* rope_multi against the CPU's rope on each tensor: GLM-5's four at one and at 7 tokens (64
 * query heads of 256 with the rope dims last, the latent row's 64 after 512, the indexer's
 * key and 32 query heads of 128 with the rope dims first), and a pair with YaRN's factor. */
static void test_rope_multi(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 19;
    int32_t pos[7];
    float inv[32];
    for (int i = 0; i < 32; i++)
        inv[i] = powf(10000.0f, -2.0f * (float)i / 64.0f);
    float *dinv = dev_copy(&p->gpu, inv, sizeof inv);
    struct {
        int heads, stride, offset;
    } glm[] = {{64, 256, 192}, {1, 576, 512}, {1, 128, 0}, {32, 128, 0}}, two[] = {{3, 96, 32}, {2, 64, 0}};
    for (int c = 0; c < 3; c++) {
        const int T = c == 0 ? 1 : 7, nj = c < 2 ? 4 : 2, inter = c == 2;
        const float af = c == 2 ? 1.25f : 1.0f;
        for (int t = 0; t < T; t++)
            pos[t] = (int32_t)(rng_next(&rng) % 40000);
        int32_t *dpos = dev_copy(&p->gpu, pos, (size_t)T * sizeof pos[0]);
        struct rope_job jobs[ROPE_MAX_JOBS];
        float *x[ROPE_MAX_JOBS];
        size_t n[ROPE_MAX_JOBS];
        for (int j = 0; j < nj; j++) {
            const int h = c < 2 ? glm[j].heads : two[j].heads, hs = c < 2 ? glm[j].stride : two[j].stride;
            n[j] = (size_t)T * (size_t)h * (size_t)hs;
            x[j] = rand_floats(n[j], 1.0f, &rng);
            jobs[j] = (struct rope_job){dev_copy(&p->gpu, x[j], n[j] * 4), h, hs, c < 2 ? glm[j].offset : two[j].offset};
        }
        struct rope_args a = {.dim = 64, .offset = 0, .interleaved = inter != 0, .attention_factor = af,
                              .inv_freq = dinv};
        p->gpu.ops->rope_multi(&p->gpu, nj, jobs, T, &a, dpos);
        gpu_ok(&p->gpu);
        a.inv_freq = inv;
        for (int j = 0; j < nj; j++) {
            a.offset = jobs[j].offset;
            p->cpu.ops->rope(&p->cpu, x[j], T, jobs[j].n_heads, jobs[j].head_stride, &a, pos);
            float *got = fetch(&p->gpu, jobs[j].x, n[j]);
            char what[64];
            snprintf(what, sizeof what, "rope_multi case %d job %d", c, j);
            check_close(what, got, x[j], n[j], TOL_F32);
            free(got), free(x[j]);
            p->gpu.ops->free(&p->gpu, jobs[j].x);
        }
        p->gpu.ops->free(&p->gpu, dpos);
    }
    p->gpu.ops->free(&p->gpu, dinv);
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

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* The probabilities the sampler keeps for one row's case: pr[i] (exp((l_i - max) / T), 0 where
 * allowed leaves i out) and the smallest kept one (the top-k, then top-p cut over the allowed). */
struct sample_ref {
    double *pr, cut, kept;
    int keep, best;
};

static void sample_ref_make(struct sample_ref *q, const float *l, int V, const bool *allowed, float t, float top_p,
                            int top_k, float min_p, double *sorted)
{
    double mx = -1e30;
    q->best = -1;
    for (int i = 0; i < V; i++)
        if (!allowed || allowed[i]) {
            mx = l[i] > mx ? l[i] : mx;
            q->best = q->best < 0 || l[i] > l[q->best] ? i : q->best;
        }
    int n = 0;
    for (int i = 0; i < V; i++) {
        const bool ok = !allowed || allowed[i];
        q->pr[i] = ok && t > 0 ? exp(((double)l[i] - mx) / t) : 0;
        if (ok)
            sorted[n++] = q->pr[i];
    }
    qsort(sorted, (size_t)n, sizeof(double), cmp_desc);
    int keep = n;
    if (top_k > 0 && top_k < n) /* ties with the k-th stay, as in the CPU sampler */
        for (keep = top_k; keep < n && sorted[keep] == sorted[keep - 1]; keep++)
            ;
    for (int i = 1; min_p > 0 && i < keep; i++) /* sorted[0] is the likeliest: 1 */
        if (sorted[i] < min_p * sorted[0]) {
            keep = i;
            break;
        }
    if (top_p < 1.0f) {
        double kt = 0, m = 0;
        for (int i = 0; i < keep; i++)
            kt += sorted[i];
        for (int i = 0; i < keep; i++)
            if ((m += sorted[i]) >= top_p * kt) {
                keep = i + 1;
                break;
            }
    }
    q->keep = keep;
    q->cut = sorted[keep - 1];
    q->kept = 0;
    for (int i = 0; i < V; i++)
        q->kept += q->pr[i] >= q->cut && q->pr[i] > 0 ? q->pr[i] : 0;
}

/* Checks one drawn id against the reference: inside the kept set, and exactly the id whose
 * cumulative kept mass (id order) first passes u * kept unless u * kept is within rounding of a
 * boundary. Returns whether it was checked exactly. */
static bool sample_ref_check(const struct sample_ref *q, int V, float t, float u, int id, const char *what, int r)
{
    if (t == 0) {
        if (id != q->best)
            fail_msg("%s row %d: greedy id %d, want %d", what, r, id, q->best);
        return true;
    }
    if (id < 0 || id >= V || q->pr[id] <= 0 || q->pr[id] < q->cut)
        fail_msg("%s row %d: id %d (p %.3g) outside the kept set (cut %.3g)", what, r, id,
                 id >= 0 && id < V ? q->pr[id] : -1.0, q->cut);
    double target = u * q->kept, acc = 0, margin = 1e-4 * q->kept;
    int want = -1;
    bool near = false;
    for (int i = 0; i < V && want < 0; i++) {
        if (q->pr[i] <= 0 || q->pr[i] < q->cut)
            continue;
        acc += q->pr[i];
        near |= fabs(acc - target) < margin;
        if (target < acc)
            want = i;
    }
    if (near)
        return false;
    if (id != want)
        fail_msg("%s row %d: id %d, want %d", what, r, id, want);
    return true;
}

/* The device sampler: the draw follows u in id order over the kept set; top-k / top-p keep
 * exactly the CPU sampler's set (engine/sampler.c: sorted by probability, cut). Masked rows
 * (a grammar's allowed ids) draw the same way among their allowed ids only; the two masks
 * leave out the row's argmax, so a draw that ignored them would show. */
static void test_sample(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 24;
    const int V = 5000, R = 64, W = (V + 31) / 32;
    float *one = rand_floats((size_t)V, 3.0f, &rng);
    float *l = malloc((size_t)R * V * 4);
    for (int r = 0; r < R; r++)
        memcpy(l + (size_t)r * V, one, (size_t)V * 4);
    float *dl = dev_copy(&p->gpu, l, (size_t)R * V * 4);
    double *sorted = malloc((size_t)V * sizeof(double));
    struct sample_ref q[3];
    for (int k = 0; k < 3; k++)
        q[k].pr = malloc((size_t)V * sizeof(double));
    /* mask 1: ids = 1 mod 3; mask 2: ids < 700 that are not multiples of 5; neither keeps the argmax */
    bool *allowed = calloc(2 * (size_t)V, sizeof(bool));
    uint32_t *bits = calloc(2 * (size_t)W, 4);
    int amax = 0;
    for (int i = 1; i < V; i++)
        amax = one[i] > one[amax] ? i : amax;
    for (int i = 0; i < V; i++) {
        allowed[i] = i % 3 == 1 && i != amax;
        allowed[V + i] = i < 700 && i % 5 != 0 && i != amax;
        for (int m = 0; m < 2; m++)
            if (allowed[(size_t)m * V + i])
                bits[(size_t)m * W + i / 32] |= 1u << (i % 32);
    }
    uint32_t *dbits = dev_copy(&p->gpu, bits, 2 * (size_t)W * 4);
    struct {
        float t, top_p;
        int top_k;
        float min_p;
    } cases[] = {{0.8f, 1.0f, 0, 0}, {1.0f, 1.0f, 10, 0}, {1.0f, 0.6f, 0, 0}, {0.0f, 1.0f, 0, 0}, {1.5f, 0.9f, 50, 0},
                 {1.0f, 1.0f, 0, 0.05f}, {2.0f, 0.8f, 40, 0.2f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int k = 0; k < 3; k++)
            sample_ref_make(&q[k], one, V, k ? allowed + (size_t)(k - 1) * V : NULL, cases[c].t, cases[c].top_p,
                            cases[c].top_k, cases[c].min_p, sorted);
        for (int masked = 0; masked < 2; masked++) {
            /* masked rounds: rows cycle through no mask, mask 1, mask 2 */
            struct sample_row sr[64];
            for (int r = 0; r < R; r++)
                sr[r] = (struct sample_row){.temperature = cases[c].t, .top_p = cases[c].top_p,
                                            .top_k = cases[c].top_k, .min_p = cases[c].min_p,
                                            .u = ((float)r + 0.5f) / (float)R, .mask = masked ? r % 3 : 0};
            struct sample_row *dsr = dev_copy(&p->gpu, sr, sizeof sr);
            int32_t ids[64], *dids = dev_copy(&p->gpu, ids, sizeof ids);
            p->gpu.ops->sample(&p->gpu, dl, R, V, dsr, masked ? dbits : NULL, dids);
            gpu_ok(&p->gpu);
            p->gpu.ops->download(&p->gpu, ids, dids, sizeof ids);
            int checked = 0;
            for (int r = 0; r < R; r++)
                checked += sample_ref_check(&q[sr[r].mask], V, cases[c].t, sr[r].u, ids[r],
                                            masked ? "masked sample" : "sample", r);
            print_message("    sample T=%.1f top_p=%.1f top_k=%d min_p=%.2f%s: %d kept, %d/%d draws checked exactly\n",
                          (double)cases[c].t, (double)cases[c].top_p, cases[c].top_k, (double)cases[c].min_p,
                          masked ? " (masks)" : "", q[0].keep, checked, R);
            p->gpu.ops->free(&p->gpu, dsr), p->gpu.ops->free(&p->gpu, dids);
        }
    }
    /* a NaN row is refused, whatever the parameters; under a mask only when the mask allows the NaN */
    const int nan_at = 7; /* 7 % 3 == 1: mask 1 allows it, mask 2 (7 < 700, not a multiple of 5) too */
    const int nan_out = 10; /* 10 % 3 == 1 but a multiple of 5: mask 1 allows it, mask 2 does not */
    struct {
        int at, mask, want_fail;
    } nan_cases[] = {{nan_at, 0, 1}, {nan_at, 1, 1}, {nan_out, 2, 0}, {3, 1, 0}};
    for (size_t c = 0; c < sizeof nan_cases / sizeof nan_cases[0]; c++) {
        memcpy(l, one, (size_t)V * 4);
        l[nan_cases[c].at] = NAN;
        p->gpu.ops->upload(&p->gpu, dl, l, (size_t)V * 4);
        struct sample_row sr = {.temperature = 1.0f, .top_p = 0.9f, .u = 0.3f, .mask = nan_cases[c].mask};
        struct sample_row *dsr = dev_copy(&p->gpu, &sr, sizeof sr);
        int32_t id = 5, *did = dev_copy(&p->gpu, &id, 4);
        p->gpu.ops->sample(&p->gpu, dl, 1, V, dsr, dbits, did);
        gpu_ok(&p->gpu);
        p->gpu.ops->download(&p->gpu, &id, did, 4);
        if (nan_cases[c].want_fail)
            assert_int_equal(id, -1);
        else if (id < 0 || (nan_cases[c].mask && !allowed[(size_t)(nan_cases[c].mask - 1) * V + id]))
            fail_msg("NaN at %d outside mask %d: id %d", nan_cases[c].at, nan_cases[c].mask, id);
        p->gpu.ops->free(&p->gpu, dsr), p->gpu.ops->free(&p->gpu, did);
    }
    /* a mask that allows nothing: -1, not id 0 */
    memset(bits, 0, (size_t)W * 4);
    p->gpu.ops->upload(&p->gpu, dbits, bits, (size_t)W * 4);
    p->gpu.ops->upload(&p->gpu, dl, one, (size_t)V * 4);
    for (int t = 0; t < 2; t++) {
        struct sample_row sr = {.temperature = (float)t, .top_p = 1.0f, .u = 0.5f, .mask = 1};
        struct sample_row *dsr = dev_copy(&p->gpu, &sr, sizeof sr);
        int32_t id = 5, *did = dev_copy(&p->gpu, &id, 4);
        p->gpu.ops->sample(&p->gpu, dl, 1, V, dsr, dbits, did);
        gpu_ok(&p->gpu);
        p->gpu.ops->download(&p->gpu, &id, did, 4);
        assert_int_equal(id, -1);
        p->gpu.ops->free(&p->gpu, dsr), p->gpu.ops->free(&p->gpu, did);
    }
    p->gpu.ops->free(&p->gpu, dl), p->gpu.ops->free(&p->gpu, dbits);
    for (int k = 0; k < 3; k++)
        free(q[k].pr);
    free(one), free(l), free(sorted), free(allowed), free(bits);
}

/* The cuts on hard rows: every logit within 1e-4 of 5 (z values a few ulps apart, many exact ties),
 * every logit equal, and a width that is not a multiple of 4 (rows not 16-byte aligned: the scalar
 * loads). The same reference as test_sample: ties at a cut stay (top-k 100 with top-p keeps the
 * tokens tied with the 100th, and takes top-p of them all). */
static void test_sample_narrow(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 77;
    const int V = 4999, R = 8;
    float *one = rand_floats((size_t)V, 1e-4f, &rng), *l = malloc((size_t)R * V * 4);
    double *sorted = malloc((size_t)V * sizeof(double));
    struct sample_ref q = {.pr = malloc((size_t)V * sizeof(double))};
    struct {
        float t, top_p;
        int top_k;
        int flat; /* every logit 5 */
    } cases[] = {{1.0f, 0.6f, 0, 0}, {1.0f, 1.0f, 10, 0}, {0.7f, 0.9f, 0, 0}, {1.0f, 1.0f, 100, 0},
                 {0.7f, 0.9f, 100, 0}, {1.0f, 0.5f, 0, 1}, {1.0f, 1.0f, 7, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *row = malloc((size_t)V * 4);
        for (int i = 0; i < V; i++)
            row[i] = cases[c].flat ? 5.0f : 5.0f + one[i];
        for (int r = 0; r < R; r++)
            memcpy(l + (size_t)r * V, row, (size_t)V * 4);
        float *dl = dev_copy(&p->gpu, l, (size_t)R * V * 4);
        sample_ref_make(&q, row, V, NULL, cases[c].t, cases[c].top_p, cases[c].top_k, 0.0f, sorted);
        struct sample_row sr[8];
        for (int r = 0; r < R; r++)
            sr[r] = (struct sample_row){.temperature = cases[c].t, .top_p = cases[c].top_p, .top_k = cases[c].top_k,
                                        .u = ((float)r + 0.5f) / (float)R};
        struct sample_row *dsr = dev_copy(&p->gpu, sr, sizeof sr);
        int32_t ids[8], *dids = dev_copy(&p->gpu, ids, sizeof ids);
        p->gpu.ops->sample(&p->gpu, dl, R, V, dsr, NULL, dids);
        gpu_ok(&p->gpu);
        p->gpu.ops->download(&p->gpu, ids, dids, sizeof ids);
        int checked = 0;
        for (int r = 0; r < R; r++)
            checked += sample_ref_check(&q, V, cases[c].t, sr[r].u, ids[r], cases[c].flat ? "flat row" : "narrow row", r);
        print_message("    %s T=%.1f top_p=%.1f top_k=%d: %d kept, %d/%d draws checked exactly\n",
                      cases[c].flat ? "equal logits" : "logits within 1e-4", (double)cases[c].t,
                      (double)cases[c].top_p, cases[c].top_k, q.keep, checked, R);
        p->gpu.ops->free(&p->gpu, dsr), p->gpu.ops->free(&p->gpu, dids), p->gpu.ops->free(&p->gpu, dl);
        free(row);
    }
    free(q.pr), free(one), free(l), free(sorted);
}

/* Log-probabilities beside the logits (base/logprobs.h the reference, through the CPU op): the
 * drawn token's and the k likeliest, rows masked or not, a row with -inf logits; ids exact,
 * values within 2e-5 (float sums on the device, double on the host). */
static void test_logprobs(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 31;
    const int V = 7001, R = 5, K = 6, W = (V + 31) / 32;
    float *l = rand_floats((size_t)R * V, 5.0f, &rng);
    for (int i = 0; i < V; i += 3)
        l[(size_t)3 * V + i] = -INFINITY; /* row 3: a third of its ids at -inf (processed away) */
    uint32_t *bits = calloc((size_t)W, 4);
    for (int i = 0; i < V; i++)
        if (i % 7 == 2 || i < 40)
            bits[i / 32] |= 1u << (i % 32);
    struct sample_row sr[5] = {{.top_p = 1}, {.top_p = 1, .mask = 1}, {.top_p = 1}, {.top_p = 1}, {.top_p = 1, .mask = 1}};
    int32_t ids[5] = {0, 2, 7000, 4, 9}; /* row 1 / 4: allowed ids (2 % 7 == 2, 9 < 40) */
    float *dl = dev_copy(&p->gpu, l, (size_t)R * V * 4);
    uint32_t *dbits = dev_copy(&p->gpu, bits, (size_t)W * 4);
    struct sample_row *dsr = dev_copy(&p->gpu, sr, sizeof sr);
    int32_t *dids = dev_copy(&p->gpu, ids, sizeof ids);
    float lp[5], want_lp[5], top_lp[5 * 6], want_top_lp[5 * 6];
    int32_t top[5 * 6], want_top[5 * 6];
    float *dlp = dev_copy(&p->gpu, lp, sizeof lp), *dtop_lp = dev_copy(&p->gpu, top_lp, sizeof top_lp);
    int32_t *dtop = dev_copy(&p->gpu, top, sizeof top);
    p->gpu.ops->logprobs(&p->gpu, dl, R, V, dsr, dbits, dids, K, dlp, dtop, dtop_lp);
    gpu_ok(&p->gpu);
    p->gpu.ops->download(&p->gpu, lp, dlp, sizeof lp);
    p->gpu.ops->download(&p->gpu, top, dtop, sizeof top);
    p->gpu.ops->download(&p->gpu, top_lp, dtop_lp, sizeof top_lp);
    p->cpu.ops->logprobs(&p->cpu, l, R, V, sr, bits, ids, K, want_lp, want_top, want_top_lp);
    for (int r = 0; r < R; r++) {
        if (fabsf(lp[r] - want_lp[r]) > 2e-5f)
            fail_msg("logprobs row %d: gpu %.7g, cpu %.7g", r, (double)lp[r], (double)want_lp[r]);
        for (int j = 0; j < K; j++) {
            if (top[r * K + j] != want_top[r * K + j])
                fail_msg("logprobs row %d top %d: gpu id %d, cpu %d", r, j, top[r * K + j], want_top[r * K + j]);
            if (fabsf(top_lp[r * K + j] - want_top_lp[r * K + j]) > 2e-5f)
                fail_msg("logprobs row %d top %d: gpu %.7g, cpu %.7g", r, j, (double)top_lp[r * K + j],
                         (double)want_top_lp[r * K + j]);
        }
        if (sr[r].mask)
            for (int j = 0; j < K; j++)
                assert_true(bits[top[r * K + j] / 32] >> (top[r * K + j] % 32) & 1u);
    }
    print_message("    logprobs: %d rows (2 masked) x top %d: ids exact, values within 2e-5\n", R, K);
    p->gpu.ops->free(&p->gpu, dl), p->gpu.ops->free(&p->gpu, dbits), p->gpu.ops->free(&p->gpu, dsr);
    p->gpu.ops->free(&p->gpu, dids), p->gpu.ops->free(&p->gpu, dlp), p->gpu.ops->free(&p->gpu, dtop);
    p->gpu.ops->free(&p->gpu, dtop_lp);
    free(l), free(bits);
}

/* The logit processors' edits (engine/sampler.h: sampler_edits): each row's own list, ids
 * distinct within a row, every kind (bias, repetition both signs, penalties, -inf), rows without
 * edits untouched: the CPU op's rows bit for bit. */
static void test_logits_edit(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 77;
    const int V = 3000, R = 6;
    float *l = rand_floats((size_t)R * V, 4.0f, &rng);
    struct logit_edit e[R * 400];
    int32_t start[R + 1];
    int n = 0;
    for (int r = 0; r < R; r++) {
        start[r] = n;
        const int count = r == 2 ? 0 : 50 + 70 * r; /* row 2: no edits */
        for (int k = 0; k < count; k++) {
            const int32_t id = (int32_t)((k * 7 + r) % V); /* distinct: k * 7 < V */
            e[n++] = (struct logit_edit){.id = id, .pre = k % 3 == 0 ? 1.5f * (float)(k % 5) - 3.0f : 0.0f,
                                         .rep = k % 4 == 0 ? 1.0f : 1.0f + 0.1f * (float)(k % 7),
                                         .post = k % 11 == 5 ? -INFINITY : -0.37f * (float)(k % 6)};
        }
    }
    start[R] = n;
    float *dl = dev_copy(&p->gpu, l, (size_t)R * V * 4);
    int32_t *ds = dev_copy(&p->gpu, start, sizeof start);
    struct logit_edit *de = dev_copy(&p->gpu, e, (size_t)n * sizeof *e);
    p->gpu.ops->logits_edit(&p->gpu, dl, R, V, ds, de);
    gpu_ok(&p->gpu);
    float *got = malloc((size_t)R * V * 4);
    p->gpu.ops->download(&p->gpu, got, dl, (size_t)R * V * 4);
    p->cpu.ops->logits_edit(&p->cpu, l, R, V, start, e);
    for (int i = 0; i < R * V; i++)
        if (memcmp(&got[i], &l[i], 4) != 0)
            fail_msg("logits_edit row %d id %d: gpu %a, cpu %a", i / V, i % V, (double)got[i], (double)l[i]);
    print_message("    logits_edit: %d edits over %d rows, bit for bit\n", n, R);
    p->gpu.ops->free(&p->gpu, dl), p->gpu.ops->free(&p->gpu, ds), p->gpu.ops->free(&p->gpu, de);
    free(l), free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_multi),
        cmocka_unit_test(test_silu_mul_add),
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_attn_prep),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_sample_narrow),
        cmocka_unit_test(test_logits_edit),
        cmocka_unit_test(test_logprobs),
    };
    return ops_cuda_main("test_ops_common_cuda", tests, sizeof tests / sizeof tests[0]);
}
