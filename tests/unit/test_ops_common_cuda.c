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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_silu_mul_add),
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_attn_prep),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_sample),
    };
    return ops_cuda_main("test_ops_common_cuda", tests, sizeof tests / sizeof tests[0]);
}
