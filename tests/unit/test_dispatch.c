/* test_dispatch.c — the plan decides what the CUDA backend runs, checked without a GPU.
 *
 * For several models (the shipped model, golden fixtures of each family, the synthetic
 * Qwen3-30B-A3B and GLM-5-slice shapes that tools/make_synth_checkpoint writes) on every
 * device profile, at the device's shared-memory budget and at 101376 B (sm_120):
 *  - every kernel of the dispatch table is in the CUDA backend's table, serves its op, reads
 *    the weights' format and needs only features the device has;
 *  - for every linear and every MoE block of the model, at token counts across every bucket,
 *    the backend's choice (plan_dispatch_pick: the first kernel of the plan's list whose limits
 *    take the call, the rule backend_cuda.c's linear_run and cu_moe_experts follow) exists, and
 *    on the H200 for the model's main paths (q/k/v, routed experts) it is the list's first: the
 *    kernel `moeserve plan` names first is the one that runs;
 *  - MOESERVE_CUDA_FORCE's form puts the named kernel first and refuses unknown kernels, wrong
 *    ops, bad buckets and kernels the device cannot run, with a message naming the item.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/cuda_registry.h"
#include "base/log.h"
#include "format/quant_config.h"
#include "model/model_desc.h"
#include "model/model_plan.h"
#include "plan/plan.h"

static const char *PROFILES[] = {"a100", "rtx-a6000", "l40s", "h100", "h200",
                                 "b200", "rtx-pro-6000", "rtx-5090", "dgx-spark"};
#define N_PROFILES (sizeof PROFILES / sizeof PROFILES[0])
static const int TOKENS[] = {1, 2, 5, 8, 9, 17, 32, 33, 48, 64, 65, 512, 2048};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

struct model {
    char dir[512];
    struct model_desc d;
    struct plan_weights w;
    struct plan_shapes s;
};

static bool model_load(struct model *m, const char *dir)
{
    struct err err = {0};
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    if (model_desc_load(&m->d, dir, &err))
        fail_msg("%s: %s", dir, err.msg);
    struct quant_config q;
    if (quant_config_load(&q, dir, &err))
        fail_msg("%s: %s", dir, err.msg);
    model_plan_weights(&m->d, &q, &m->w);
    if (model_plan_shapes(&m->d, dir, &m->s, &err))
        fail_msg("%s: %s", dir, err.msg);
    quant_config_free(&q);
    return true;
}

/* The synthetic presets' configs, as the benchmark tool writes them (no weights). */
static void synth_dir(const char *preset, char *dir, size_t n)
{
    const char *bin = getenv("MOESERVE_BIN"), *tmp = getenv("TMPDIR");
    char tool[600], cmd[1600];
    snprintf(tool, sizeof tool, "%s", bin ? bin : "moeserve");
    char *slash = strrchr(tool, '/');
    snprintf(slash ? slash + 1 : tool, sizeof tool - (size_t)(slash ? slash + 1 - tool : 0), "make_synth_checkpoint");
    snprintf(dir, n, "%s/dispatch-%s", tmp ? tmp : "/tmp", preset);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' --preset %s --format nvfp4 --config-only >/dev/null", tool, dir,
             preset);
    if (system(cmd) != 0)
        fail_msg("%s failed", cmd);
}

static void plan_for(struct plan *p, const char *profile, const struct model *m, size_t budget, const char *force,
                     enum status want)
{
    struct device_caps caps;
    struct err err = {0};
    assert_int_equal(plan_caps_from_profile(&caps, profile, &err), STATUS_OK);
    struct plan_request req = {.shapes = &m->s, .weights = &m->w, .model_name = m->dir, .smem_budget = budget,
                               .kernels = &CUDA_KERNELS, .force = force};
    enum status st = plan_build_request(p, &caps, &req, &err);
    if (st != want)
        fail_msg("%s on %s (force %s): status %d, want %d: %s", m->dir, profile, force ? force : "-", (int)st,
                 (int)want, err.msg);
}

static bool caps_has(const struct device_caps *c, unsigned needs)
{
    return (!(needs & KERNEL_NEEDS_BF16_MMA) || c->bf16_mma) && (!(needs & KERNEL_NEEDS_WGMMA) || c->wgmma) &&
           (!(needs & KERNEL_NEEDS_FP8_MMA) || c->fp8_mma) && (!(needs & KERNEL_NEEDS_TCGEN05) || c->tcgen05) &&
           (!(needs & KERNEL_NEEDS_FP4_MMA) || c->fp4_mma_block_scaled) &&
           (!(needs & KERNEL_NEEDS_CLUSTERS) || c->clusters);
}

static void check_table(const struct plan *p)
{
    for (int op = 0; op < PLAN_OP_COUNT; op++)
        for (int b = 0; b < PLAN_BUCKET_COUNT; b++)
            for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++) {
                const struct plan_dispatch *d = &p->dispatch[op][b][f];
                assert_true(d->n >= 1 && d->n <= PLAN_DISPATCH_MAX);
                assert_true(d->reason[0] != 0);
                for (int i = 0; i < d->n; i++) {
                    const struct kernel_desc *k = d->kernels[i];
                    assert_ptr_equal(kernel_table_find(&CUDA_KERNELS, k->name), k);
                    if (!plan_op_takes((enum plan_op)op, k))
                        fail_msg("%s: %s serves %s, listed for %s", p->caps.name, k->name, k->op,
                                 plan_op_name((enum plan_op)op));
                    assert_true(k->formats & (1u << f));
                    if (!caps_has(&p->caps, k->needs))
                        fail_msg("%s: %s needs features the device lacks", p->caps.name, k->name);
                }
            }
}

/* The model's linears: (n_weights sharing x, widest output, K, format). */
struct lin {
    int n_w;
    int64_t n, k;
    enum weight_format f;
    const char *what;
};

static int model_linears(const struct model *m, struct lin *out)
{
    const struct model_desc *d = &m->d;
    int n = 0;
    bool mla = d->layers[0].attn == ATTN_MLA;
    if (mla) {
        int64_t qk = d->qk_nope_head_dim + d->qk_rope_head_dim;
        if (d->q_lora_rank > 0) {
            out[n++] = (struct lin){1, d->q_lora_rank, d->d_model, m->w.attn, "q_a"};
            out[n++] = (struct lin){1, (int64_t)d->n_heads * qk, d->q_lora_rank, m->w.attn, "q_b"};
        }
        out[n++] = (struct lin){1, d->kv_lora_rank + d->qk_rope_head_dim, d->d_model, m->w.attn, "kv_a"};
        out[n++] = (struct lin){1, d->d_model, (int64_t)d->n_heads * d->v_head_dim, m->w.attn, "o"};
    } else {
        out[n++] = (struct lin){3, (int64_t)d->n_heads * d->head_dim, d->d_model, m->w.attn, "q/k/v"};
        out[n++] = (struct lin){1, d->d_model, (int64_t)d->n_heads * d->head_dim, m->w.attn, "o"};
    }
    if (d->n_experts > 0)
        out[n++] = (struct lin){1, d->n_experts, d->d_model, WEIGHT_BF16, "router"};
    int ff = d->d_ff > d->d_expert * d->n_shared_experts ? d->d_ff : d->d_expert * d->n_shared_experts;
    if (ff > 0) {
        out[n++] = (struct lin){1, ff, d->d_model, m->w.ffn, "gate/up"};
        out[n++] = (struct lin){1, d->d_model, ff, m->w.ffn, "down"};
    }
    out[n++] = (struct lin){1, d->vocab_size, d->d_model, m->w.lm_head, "lm_head"};
    return n;
}

/* real: a model of real widths (the synthetic presets), whose main paths must take the plan's
 * first kernel on the H200; the fixtures' tiny widths may fall to the next */
static void check_model(struct plan *p, const struct model *m, bool real, int *calls, int *heads)
{
    struct lin ls[8];
    const int nl = model_linears(m, ls);
    const bool h200 = real && strstr(p->caps.name, "H200") != NULL && p->smem_budget == p->caps.smem_per_block_optin;
    for (size_t t = 0; t < N_TOKENS; t++) {
        for (int i = 0; i < nl; i++) {
            const struct kernel_shape s = {.format = ls[i].f, .tokens = TOKENS[t], .n_weights = ls[i].n_w,
                                           .n = ls[i].n, .k = ls[i].k};
            const struct kernel_desc *k = plan_dispatch_pick(p, PLAN_OP_LINEAR, &s);
            if (!k)
                fail_msg("%s on %s: no kernel for %s (%s, K %lld) at %d tokens", m->dir, p->caps.name, ls[i].what,
                         weight_format_name(s.format), (long long)s.k, s.tokens);
            const struct plan_dispatch *d = plan_dispatch_for(p, PLAN_OP_LINEAR, s.tokens, s.format);
            (*calls)++;
            *heads += k == d->kernels[0];
            if (h200 && i == 0 && k != d->kernels[0])
                fail_msg("%s on the H200: %s at %d tokens runs %s, the plan names %s first", m->dir, ls[i].what,
                         s.tokens, k->name, d->kernels[0]->name);
        }
        if (m->d.n_experts > 0) {
            const struct kernel_shape s = {.format = m->w.experts, .tokens = TOKENS[t], .n_weights = 1,
                                           .d_model = m->d.d_model, .d_expert = m->d.d_expert,
                                           .n_used = m->d.n_experts_used, .n_experts = m->d.n_experts};
            const struct kernel_desc *k = plan_dispatch_pick(p, PLAN_OP_MOE_EXPERTS, &s);
            if (!k)
                fail_msg("%s on %s: no kernel for the experts at %d tokens", m->dir, p->caps.name, s.tokens);
            const struct plan_dispatch *d = plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, s.tokens, s.format);
            (*calls)++;
            *heads += k == d->kernels[0];
            if (h200 && k != d->kernels[0])
                fail_msg("%s on the H200: experts at %d tokens run %s, the plan names %s first", m->dir, s.tokens,
                         k->name, d->kernels[0]->name);
        }
    }
}

static void test_dispatch_is_the_plan(void **state)
{
    (void)state;
    const char *src = getenv("MOESERVE_SRC");
    assert_non_null(src);
    const char *dirs[] = {"models/moeserve-tiny", "tests/golden/models/qwen3_basic", "tests/golden/models/glm4_basic",
                          "tests/golden/dsa/dsa_basic", "tests/golden/quant/qwen3_basic_nvfp4",
                          "tests/golden/quant/glm4_basic_w4a16"};
    enum { N_DIRS = sizeof dirs / sizeof dirs[0] };
    struct model *ms = calloc(N_DIRS + 2, sizeof *ms);
    int n = 0;
    for (int i = 0; i < N_DIRS; i++, n++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", src, dirs[i]);
        model_load(&ms[n], dir);
    }
    char synth[2][512];
    synth_dir("qwen3-30b-a3b", synth[0], sizeof synth[0]);
    synth_dir("glm5-slice", synth[1], sizeof synth[1]);
    model_load(&ms[n++], synth[0]);
    model_load(&ms[n++], synth[1]);
    struct plan *p = malloc(sizeof *p);
    int calls = 0, heads = 0;
    for (int i = 0; i < n; i++)
        for (size_t pr = 0; pr < N_PROFILES; pr++)
            for (int small = 0; small < 2; small++) {
                plan_for(p, PROFILES[pr], &ms[i], small ? 101376 : 0, NULL, STATUS_OK);
                check_table(p);
                check_model(p, &ms[i], i >= N_DIRS, &calls, &heads);
            }
    print_message("    %d calls of %d models on %zu profiles x 2 budgets: %d ran the plan's first kernel\n", calls,
                  n, N_PROFILES, heads);
    assert_true(heads > calls / 2);
    /* what the H200 runs for the synthetic Qwen3-30B-A3B in NVFP4 (NOTES.md's default-kernel table) */
    plan_for(p, "h200", &ms[N_DIRS], 0, NULL, STATUS_OK);
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_LINEAR, 1, WEIGHT_NVFP4)->kernels[0]->name,
                        "gemv_decode_mma_bf16");
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_LINEAR, 64, WEIGHT_NVFP4)->kernels[0]->name,
                        "cublas_dequant_bf16");
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 8, WEIGHT_NVFP4)->kernels[0]->name,
                        "moe_pair_decode_mma_bf16");
    /* 9-64 tokens: 2-4 rows an expert, sorted in tiles of 8 on the few-token kernel, the pairs after it */
    const struct plan_dispatch *d32 = plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 32, WEIGHT_NVFP4);
    assert_true(d32->n >= 2);
    assert_string_equal(d32->kernels[0]->name, "moe_grouped_mma_bf16");
    assert_string_equal(d32->kernels[1]->name, "moe_pair_decode_mma_bf16");
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 33, WEIGHT_NVFP4)->kernels[0]->name,
                        "moe_grouped_mma_bf16");
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 65, WEIGHT_NVFP4)->kernels[0]->name,
                        "moe_gemm_nvfp4_wo_wgmma");
    /* routing: the norm, router and routing in one cluster kernel at 2-32 tokens, apart at one */
    const struct kernel_shape rs = {.format = WEIGHT_BF16, .tokens = 8, .n_weights = 1, .n = 128, .k = 2048,
                                    .n_used = 8, .n_experts = 128, .n_group = 1, .norm_first = true};
    assert_string_equal(plan_dispatch_pick(p, PLAN_OP_MOE_ROUTE, &rs)->name, "norm_router_route_cluster");
    struct kernel_shape r1 = rs;
    r1.tokens = 1;
    assert_string_equal(plan_dispatch_pick(p, PLAN_OP_MOE_ROUTE, &r1)->name, "moe_route_softmax_topk");
    /* GLM-5's 256 experts top-8 of 21.2 MB: pair by pair up to 8 tokens (the re-read bound), sorted
     * above (64 tokens pair by pair: 10.7 ms a layer on the H200), in tiles of 8 tokens while an
     * expert averages <= 8 rows */
    plan_for(p, "h200", &ms[N_DIRS + 1], 0, NULL, STATUS_OK);
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 8, WEIGHT_NVFP4)->kernels[0]->name,
                        "moe_pair_decode_mma_bf16");
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 64, WEIGHT_NVFP4)->kernels[0]->name,
                        "moe_grouped_mma_bf16");
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 9, WEIGHT_NVFP4)->kernels[0]->name,
                        "moe_grouped_mma_bf16");
    /* no wgmma on the RTX PRO 6000: mma.sync for the sorted experts */
    plan_for(p, "rtx-pro-6000", &ms[N_DIRS], 0, NULL, STATUS_OK);
    assert_string_equal(plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 2048, WEIGHT_NVFP4)->kernels[0]->name,
                        "moe_gemm_nvfp4_wo_mma");
    for (int i = 0; i < n; i++)
        model_desc_free(&ms[i].d);
    free(ms);
    free(p);
}

/* Every dispatched kernel of the table has its launcher in a CUDA build, none without CUDA (the
 * table is the same file in both). */
static void test_launchers(void **state)
{
    (void)state;
    int dispatched = 0;
    for (int i = 0; i < CUDA_KERNELS.n; i++) {
        const struct kernel_desc *k = &CUDA_KERNELS.kernels[i];
        if (k->id == CK_FIXED) {
            assert_null(k->launch);
            continue;
        }
        dispatched++;
#if MOESERVE_HAVE_CUDA
        if (!k->launch)
            fail_msg("%s: dispatched by the plan but without a launcher", k->name);
#else
        assert_null(k->launch);
#endif
    }
    assert_true(dispatched >= 13);
}

static void test_force(void **state)
{
    (void)state;
    const char *src = getenv("MOESERVE_SRC");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/moeserve-tiny", src);
    struct model m;
    model_load(&m, dir);
    struct plan *p = malloc(sizeof *p);
    plan_for(p, "h200", &m, 0, "moe_experts@9-32:moe_pair_decode,linear:gemm_nvfp4_wo_mma", STATUS_OK);
    const struct plan_dispatch *d = plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 20, WEIGHT_NVFP4);
    assert_string_equal(d->kernels[0]->name, "moe_pair_decode");
    assert_non_null(strstr(d->reason, "MOESERVE_CUDA_FORCE"));
    assert_string_not_equal(plan_dispatch_for(p, PLAN_OP_MOE_EXPERTS, 2, WEIGHT_NVFP4)->kernels[0]->name,
                            "moe_pair_decode"); /* other buckets keep the plan's */
    for (int t = 1; t <= 2048; t *= 4) /* no bucket: every one */
        assert_string_equal(plan_dispatch_for(p, PLAN_OP_LINEAR, t, WEIGHT_NVFP4)->kernels[0]->name,
                            "gemm_nvfp4_wo_mma");
    const struct {
        const char *force, *says;
    } bad[] = {{"linear:no_such_kernel", "no kernel \"no_such_kernel\""},
               {"attention:gemv_x_smem", "op \"attention\""},
               {"linear@3-7:gemv_x_smem", "bucket \"3-7\""},
               {"linear:moe_pair_decode", "no kernel \"moe_pair_decode\" for linear"},
               {"gemv_x_smem", "expected op[@bucket]:kernel"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct device_caps caps;
        struct err err = {0};
        assert_int_equal(plan_caps_from_profile(&caps, "h200", &err), STATUS_OK);
        struct plan_request req = {.shapes = &m.s, .weights = &m.w, .kernels = &CUDA_KERNELS, .force = bad[i].force};
        assert_int_equal(plan_build_request(p, &caps, &req, &err), STATUS_INVALID);
        if (!strstr(err.msg, bad[i].says) || !strstr(err.msg, "MOESERVE_CUDA_FORCE"))
            fail_msg("force \"%s\": message \"%s\" lacks \"%s\"", bad[i].force, err.msg, bad[i].says);
    }
    /* a kernel the device cannot run: wgmma on an A100 */
    plan_for(p, "a100", &m, 0, "moe_experts:moe_gemm_nvfp4_wo_wgmma", STATUS_INVALID);
    model_desc_free(&m.d);
    free(p);
}

int main(void)
{
    log_set_level(LOG_LEVEL_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch_is_the_plan),
        cmocka_unit_test(test_launchers),
        cmocka_unit_test(test_force),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
