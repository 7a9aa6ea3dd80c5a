/* test_ops_moe_cuda.c — routing (router + routing in one kernel, the routing alone) and the routed experts (pair by pair and sorted, every format), on the CUDA backend against the CPU reference (ops_cuda_common.h). */
#include "ops_cuda_common.h"

/* ---------------------------------------------------------------- routing */

/* router_route (decode: the router GEMV and the routing in one kernel, forced in each form)
 * against the CPU's linear then moe_route: the same expert ids, weights and logits within
 * TOL_F32; and where the plan leaves the routing to linear + moe_route. */
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
    /* the plan: at one token the router linear and the routing kernel */
    assert_false(p->gpu.ops->router_route(&p->gpu, &t0.dev, b0, 1, &a0, b0, (int32_t *)b0, b0));
    p->gpu.ops->free(&p->gpu, b0);
    weight_free(&t0, p);
    const bool clusters = backend_cuda_plan(&p->gpu)->caps.clusters;
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
     * has clusters; the others fall to the counting kernel, the next in the list) */
    const size_t nc = sizeof cs / sizeof cs[0];
    for (size_t cc = 0; cc < 2 * nc; cc++) {
        const size_t c = cc % nc;
        if (cc >= nc && !clusters)
            break;
        force(p, cc >= nc ? "moe_route:router_route_count,moe_route:router_route_cluster"
                          : "moe_route:router_route_count");
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
        p->cpu.ops->linear(&p->cpu, &tw.src.w, x, T, lg);
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
    /* what the plan leaves to linear + moe_route: a non-BF16 router, expert groups, more tokens
     * than the experts take pair by pair */
    force(p, NULL);
    struct test_weight tf;
    weight_make(&tf, p, WEIGHT_F32, 64, 64, false, &rng);
    struct route_args a = {.n_experts = 64, .n_used = 4, .score = ROUTE_SOFTMAX, .n_group = 1, .topk_group = 1,
                           .scaling = 1.0f};
    float *buf = dev_nan(&p->gpu, 64 * 64 * 4);
    assert_false(p->gpu.ops->router_route(&p->gpu, &tf.dev, buf, 2, &a, buf, (int32_t *)buf, buf));
    weight_free(&tf, p);
    struct test_weight tb;
    weight_make(&tb, p, WEIGHT_BF16, 64, 64, false, &rng);
    struct route_args g = a;
    g.n_group = 8, g.topk_group = 2;
    assert_false(p->gpu.ops->router_route(&p->gpu, &tb.dev, buf, 2, &g, buf, (int32_t *)buf, buf));
    assert_false(p->gpu.ops->router_route(&p->gpu, &tb.dev, buf, 64, &a, buf, (int32_t *)buf, buf));
    weight_free(&tb, p);
    p->gpu.ops->free(&p->gpu, buf);
    gpu_ok(&p->gpu);
}

/* norm_router_route (add + RMSNorm + router GEMV + routing in one cluster kernel, forced; only
 * where the device has clusters) against the CPU's
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
                                               b0)); /* the plan: at one token norm, router, routing apart */
    const bool clusters = backend_cuda_plan(&p->gpu)->caps.clusters;
    if (clusters)
        force(p, "moe_route:norm_router_route_cluster");
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
        p->cpu.ops->linear(&p->cpu, &tw.src.w, x, T, lg);
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
    force(p, NULL);
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

/* ---------------------------------------------------------------- experts */


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
    /* widths of more 8-row tiles than one resident wave of blocks: several tiles a down block
     * (on 132 SMs: 784 tiles, 3 a block, the last block partly past D; 400 tiles, 2 a block; 400 x 2 tokens) */
    run_moe(p, WEIGHT_NVFP4, 1, 16, 4, 6272, 256, false, &rng);
    run_moe(p, WEIGHT_NVFP4, 1, 16, 4, 3200, 128, true, &rng);
    run_moe(p, WEIGHT_NVFP4, 2, 16, 4, 3200, 128, true, &rng);
    /* the shared expert as one more slot (moe_experts_shared): K split over the down warps with
     * fewer groups than warps (I 128, 384), one a warp (1024), two a warp at GLM-5's shape */
    run_moe_full(p, WEIGHT_NVFP4, 1, 32, 8, 256, 128, false, TOL_F32, true, &rng);
    run_moe_full(p, WEIGHT_NVFP4, 3, 16, 4, 1024, 384, true, TOL_F32, true, &rng);
    run_moe_full(p, WEIGHT_NVFP4, 1, 64, 8, 2048, 1024, false, TOL_F32, true, &rng);
    run_moe_full(p, WEIGHT_NVFP4, 8, 16, 8, 1024, 256, false, TOL_F32, true, &rng);
    run_moe_full(p, WEIGHT_NVFP4, 1, 16, 8, 6144, 2048, false, TOL_BF16, true, &rng);
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
        /* the sorted few-token kernel (cuda_moe_grouped_mma.cu) at every bucket: tiles of 1-8
         * tokens, experts of several tiles (skewed: 16+ rows an expert), a last x segment of
         * fewer groups (K 640, 1152), GLM-5's ratio of widths */
        force(p, "moe_experts:moe_grouped_mma_bf16");
        run_moe(p, WEIGHT_NVFP4, 1, 32, 8, 512, 256, false, &rng);
        run_moe(p, WEIGHT_NVFP4, 2, 32, 8, 512, 256, false, &rng);
        run_moe(p, WEIGHT_NVFP4, 12, 32, 8, 640, 1152, false, &rng);
        run_moe(p, WEIGHT_NVFP4, 64, 8, 2, 1024, 384, true, &rng);
        run_moe(p, WEIGHT_NVFP4, 64, 64, 8, 1536, 512, false, &rng);
        run_moe(p, WEIGHT_NVFP4, 150, 16, 4, 512, 256, true, &rng);
        force(p, NULL);
        if (getenv("MOESERVE_OPS_NO_CUBLAS"))
            force_own_gemms(p);
    }
    /* expert parallelism: the slots of another rank's experts masked first (moe_mask_ids on both
     * backends), through the pairs, the grouped tiles and the sorted GEMMs */
    p->mask_lo = 4, p->mask_hi = 12;
    run_moe(p, WEIGHT_NVFP4, 1, 16, 4, 1024, 384, false, &rng);
    run_moe(p, WEIGHT_NVFP4, 8, 16, 4, 1024, 384, true, &rng);
    run_moe(p, WEIGHT_NVFP4, 24, 64, 8, 1024, 384, false, &rng);
    run_moe(p, WEIGHT_NVFP4, 150, 16, 4, 512, 256, true, &rng);
    run_moe(p, WEIGHT_BF16, 70, 16, 4, 64, 48, false, &rng);
    p->mask_lo = p->mask_hi = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_router_route),
        cmocka_unit_test(test_norm_router_route),
        cmocka_unit_test(test_moe_experts),
    };
    return ops_cuda_main("test_ops_moe_cuda", tests, sizeof tests / sizeof tests[0]);
}
