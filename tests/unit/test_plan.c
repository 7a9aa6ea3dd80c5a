/* test_plan.c — the capability planner: profiles, table, choices, budgets.
 *
 * Every profile must plan every op within its shared-memory budget (and
 * within an sm_120-sized budget on the H200), the MoE expert GEMM must land
 * on the instruction family the device has for NVFP4 weights, an unknown
 * compute capability must give a portable plan with a warning, and a budget
 * too small for every tensor-core tile must fall back to the portable path
 * loudly. The smem formulas of planner.c are checked on the chosen tiles.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/json.h"
#include "base/log.h"
#include "backend/cuda/cuda_registry.h"
#include "model/model_desc.h"
#include "model/model_plan.h"
#include "plan/plan.h"

static const char *PROFILES[] = {"a100", "rtx-a6000",    "l40s",     "h100",     "h200",
                                 "b200", "rtx-pro-6000", "rtx-5090", "dgx-spark"};
#define N_PROFILES (sizeof PROFILES / sizeof PROFILES[0])

static const char *REQUIRED_OPS[] = {
    "embedding",        "rmsnorm",   "rope_qk_norm", "kv_cache_write",   "attention_prefill",
    "attention_decode", "moe_route", "moe_align",    "moe_experts_gemm", "moe_silu_mul",
    "linear",           "lm_head",   "sample",       "argmax"};

static void caps_for(const char *name, struct device_caps *caps)
{
    struct err err = {0};
    assert_int_equal(plan_caps_from_profile(caps, name, &err), STATUS_OK);
}

static void build(struct plan *p, const char *profile, enum weight_format wf, bool fp4_act, size_t budget,
                  const struct model_desc *desc)
{
    struct device_caps caps;
    caps_for(profile, &caps);
    struct plan_weights w;
    plan_weights_default(&w, wf, fp4_act);
    struct plan_shapes shapes;
    struct err err = {0};
    if (desc && model_plan_shapes(desc, "test model", &shapes, &err))
        fail_msg("%s", err.msg);
    struct plan_request req = {.shapes = desc ? &shapes : NULL, .weights = &w, .smem_budget = budget,
                               .kernels = &CUDA_KERNELS};
    enum status st = plan_build_request(p, &caps, &req, &err);
    if (st)
        fail_msg("%s: %s", profile, err.msg);
}

/* Every op present, every footprint within the budget, every field sane. */
static void check_plan(const struct plan *p, size_t budget)
{
    assert_true(p->smem_budget <= budget);
    for (size_t i = 0; i < sizeof REQUIRED_OPS / sizeof REQUIRED_OPS[0]; i++)
        if (!plan_find(p, REQUIRED_OPS[i]))
            fail_msg("%s: op %s missing", p->caps.source, REQUIRED_OPS[i]);
    for (int i = 0; i < p->n_ops; i++) {
        const struct op_plan *o = &p->ops[i];
        if (o->smem_bytes > budget)
            fail_msg("%s: %s (%s) needs %zu B > budget %zu B", p->caps.source, o->op, o->kernel,
                     o->smem_bytes, budget);
        assert_true(o->kernel[0] && o->math[0] && o->reason[0]);
        assert_string_equal(o->math, plan_math_name(o->math_id));
        assert_true(o->threads >= 0 && o->threads <= 1024);
        assert_true(o->est_us > 0);
        if (strstr(o->op, "moe") == NULL)
            assert_null(strstr(o->kernel, "moe_"));
    }
}

static void test_every_profile_fits(void **state)
{
    (void)state;
    static const struct {
        enum weight_format wf;
        bool a4;
    } W[] = {{WEIGHT_BF16, false}, {WEIGHT_FP8_BLOCK, false}, {WEIGHT_NVFP4, false}, {WEIGHT_NVFP4, true}};
    struct plan *p = malloc(sizeof *p);
    for (size_t i = 0; i < N_PROFILES; i++) {
        struct device_caps caps;
        caps_for(PROFILES[i], &caps);
        assert_true(caps.known_cc);
        assert_true(caps.sm_count > 0 && caps.smem_per_block_optin > 0 && caps.mem_bw_gbs > 0);
        for (size_t w = 0; w < sizeof W / sizeof W[0]; w++) {
            build(p, PROFILES[i], W[w].wf, W[w].a4, 0, NULL);
            assert_int_equal(p->smem_budget, caps.smem_per_block_optin);
            check_plan(p, caps.smem_per_block_optin);
            /* no fp8 tensor-core GEMM exists (cuda_registry.c): FP8 linears and experts run the
             * portable kernels, and the plan says so */
            if (W[w].wf == WEIGHT_FP8_BLOCK)
                assert_non_null(strstr(p->warnings, "portable fallback"));
            else
                assert_string_equal(p->warnings, "");
            /* the sm_120 budget on every device */
            build(p, PROFILES[i], W[w].wf, W[w].a4, 101376, NULL);
            check_plan(p, 101376);
        }
    }
    free(p);
}

static void test_profile_caps(void **state)
{
    (void)state;
    struct device_caps c;
    caps_for("a100", &c);
    assert_int_equal(c.smem_per_block_optin, 166912);
    assert_true(c.bf16_mma && !c.fp8_mma && !c.wgmma && !c.tcgen05 && !c.fp4_mma_block_scaled);
    caps_for("l40s", &c);
    assert_int_equal(c.smem_per_block_optin, 101376);
    assert_true(c.fp8_mma && !c.wgmma);
    caps_for("h200", &c);
    assert_int_equal(c.smem_per_block_optin, 232448);
    assert_true(c.wgmma && c.tma && !c.tcgen05 && !c.fp4_mma_block_scaled);
    assert_string_equal(c.source, "profile:h200");
    caps_for("b200", &c);
    assert_true(c.tcgen05 && !c.wgmma && !c.fp4_mma_block_scaled);
    caps_for("rtx-pro-6000", &c);
    assert_int_equal(c.smem_per_block_optin, 101376);
    assert_true(c.fp4_mma_block_scaled && !c.wgmma && !c.tcgen05);
    assert_int_equal(c.sm_count, 188);
    caps_for("dgx-spark", &c);
    assert_int_equal(c.cc_minor, 1);
    assert_true(c.fp4_mma_block_scaled);
}

static void test_unknown_profile(void **state)
{
    (void)state;
    struct device_caps c;
    struct err err = {0};
    assert_int_equal(plan_caps_from_profile(&c, "rtx-9090", &err), STATUS_NOT_FOUND);
    assert_non_null(strstr(err.msg, "rtx-9090"));
    assert_non_null(strstr(err.msg, "rtx-pro-6000"));
    assert_non_null(strstr(err.msg, "dgx-spark"));
}

static const struct op_plan *experts(const struct plan *p)
{
    const struct op_plan *o = plan_find(p, "moe_experts_gemm");
    assert_non_null(o);
    return o;
}

static void test_nvfp4_expert_gemm_choice(void **state)
{
    (void)state;
    struct plan *p = malloc(sizeof *p);
    /* sm_120 has block-scaled fp4 mma, but the backend has no kernel dispatching it yet: the
     * weight-only bf16 mma GEMM, and the reason says why */
    const char *sm120[] = {"rtx-pro-6000", "rtx-5090", "dgx-spark"};
    for (int i = 0; i < 3; i++) {
        build(p, sm120[i], WEIGHT_NVFP4, true, 0, NULL);
        assert_string_equal(experts(p)->math, "bf16_mma");
        assert_string_equal(experts(p)->kernel, "moe_gemm_nvfp4_wo_mma");
        assert_non_null(strstr(experts(p)->reason, "moe_gemm_nvfp4_fp4_mma: the cuda backend has no such kernel"));
        assert_int_equal(experts(p)->weight_format, WEIGHT_NVFP4);
        /* moe_align pads to the GEMM's row tile */
        assert_int_equal(plan_find(p, "moe_align")->tile_m, experts(p)->tile_m);
    }
    const char *hopper[] = {"h200", "h100"};
    for (int i = 0; i < 2; i++) {
        build(p, hopper[i], WEIGHT_NVFP4, true, 0, NULL);
        assert_string_not_equal(experts(p)->math, "fp4_block_scaled_mma");
        assert_non_null(strstr(experts(p)->kernel, "nvfp4_wo_"));
        assert_true(experts(p)->math_id == PLAN_MATH_BF16_WGMMA || experts(p)->math_id == PLAN_MATH_BF16_MMA);
        assert_non_null(strstr(experts(p)->reason, "fp4 block-scaled mma needs sm_120a features: absent"));
    }
    build(p, "a100", WEIGHT_NVFP4, true, 0, NULL);
    assert_string_equal(experts(p)->kernel, "moe_gemm_nvfp4_wo_mma");
    assert_string_equal(experts(p)->math, "bf16_mma");
    assert_non_null(strstr(experts(p)->reason, "wgmma needs sm_90a features: absent"));

    build(p, "b200", WEIGHT_NVFP4, true, 0, NULL); /* no tcgen05 kernel yet, no wgmma on sm_100: mma */
    assert_string_equal(experts(p)->kernel, "moe_gemm_nvfp4_wo_mma");
    build(p, "b200", WEIGHT_NVFP4, false, 0, NULL);
    assert_string_equal(experts(p)->kernel, "moe_gemm_nvfp4_wo_mma");

    /* a W4A16 checkpoint never gets fp4 activations, even where the instruction exists */
    build(p, "rtx-pro-6000", WEIGHT_NVFP4, false, 0, NULL);
    assert_string_equal(experts(p)->kernel, "moe_gemm_nvfp4_wo_mma");
    assert_non_null(strstr(experts(p)->reason, "W4A4"));

    /* bf16 and fp8 experts */
    build(p, "h200", WEIGHT_BF16, false, 0, NULL);
    assert_string_equal(experts(p)->kernel, "moe_gemm_bf16_wgmma");
    build(p, "l40s", WEIGHT_FP8_BLOCK, false, 0, NULL); /* no fp8 tensor-core GEMM yet */
    assert_string_equal(experts(p)->kernel, "moe_gemm_fp8_wo_fp32");
    assert_true(experts(p)->portable_fallback);
    free(p);
}

/* Weight-only NVFP4 linears: a bf16 copy through cuBLAS on every profile (the backend's path from
 * 9 rows); with fp4 activations (W4A4) too while the backend has no fp4-activation GEMM; the
 * experts stay on our grouped GEMMs either way. */
static void test_nvfp4_linear_choice(void **state)
{
    (void)state;
    struct plan *p = malloc(sizeof *p);
    const char *all[] = {"a100", "h200", "b200", "rtx-pro-6000"};
    for (int i = 0; i < 4; i++) {
        build(p, all[i], WEIGHT_NVFP4, false, 0, NULL);
        const struct op_plan *l = plan_find(p, "linear");
        assert_string_equal(l->kernel, "cublas_dequant_bf16");
        assert_non_null(strstr(l->reason, "expanded to bf16"));
        assert_null(strstr(experts(p)->kernel, "cublas"));
    }
    /* W4A4 too, while no fp4-activation GEMM is dispatched */
    build(p, "rtx-pro-6000", WEIGHT_NVFP4, true, 0, NULL);
    assert_string_equal(plan_find(p, "linear")->kernel, "cublas_dequant_bf16");
    assert_non_null(strstr(plan_find(p, "linear")->reason, "W4A4"));
    free(p);
}

/* The H200 with the sm_120 budget keeps its own instructions but sm_120-sized tiles. */
static void test_h200_sm120_budget(void **state)
{
    (void)state;
    struct plan *p = malloc(sizeof *p);
    build(p, "h200", WEIGHT_NVFP4, false, 101376, NULL);
    assert_int_equal(p->smem_budget, 101376);
    check_plan(p, 101376);
    assert_non_null(strstr(experts(p)->kernel, "nvfp4_wo_wgmma"));
    /* the wgmma GEMM keeps only x in shared memory: a 3-stage tile fits as it is */
    assert_true(experts(p)->stages == 3 && experts(p)->smem_bytes <= 101376);
    const struct op_plan *a = plan_find(p, "attention_prefill");
    assert_non_null(strstr(a->reason, "> budget 101376 B"));
    /* a budget above the device's is clipped, with a warning */
    build(p, "rtx-pro-6000", WEIGHT_BF16, false, 1 << 20, NULL);
    assert_int_equal(p->smem_budget, 101376);
    assert_non_null(strstr(p->warnings, "above the device"));
    free(p);
}

/* smem of the chosen tiles follows the formulas in planner.c's header. */
static void test_smem_formulas(void **state)
{
    (void)state;
    struct plan *p = malloc(sizeof *p);
    for (size_t i = 0; i < N_PROFILES; i++) {
        build(p, PROFILES[i], WEIGHT_NVFP4, true, 0, NULL);
        const struct op_plan *a = plan_find(p, "attention_prefill");
        if (!strcmp(a->kernel, "attn_prefill_mma_bf16")) /* bf16 hi + lo operands, row data */
            assert_int_equal(a->smem_bytes,
                             4 * ((size_t)a->tile_m * 128 + (size_t)a->stages * a->tile_n * 256) +
                                 16 * (size_t)a->tile_m);
        else if (a->math_id != PLAN_MATH_FP32_FMA)
            assert_int_equal(a->smem_bytes,
                             2 * ((size_t)a->tile_m * 128 + (size_t)a->stages * a->tile_n * 256));
        const struct op_plan *d = plan_find(p, "attention_decode");
        if (d->math_id != PLAN_MATH_FP32_FMA)
            assert_int_equal(d->smem_bytes,
                             2 * ((size_t)d->tile_m * 128 + (size_t)d->stages * d->tile_n * 256));
        const struct op_plan *e = experts(p);
        size_t tk = (size_t)e->tile_k, fp4 = tk / 2 + tk / 16;
        if (strstr(e->kernel, "_wo_wgmma") || strstr(e->kernel, "bf16_wgmma")) /* x hi + lo stages only */
            assert_int_equal(e->smem_bytes,
                             (size_t)e->stages * 2 * (size_t)e->tile_m * tk * 2 + (size_t)e->tile_m * 4 + 16);
        else if (e->math_id == PLAN_MATH_FP4_BLOCK_SCALED_MMA || e->math_id == PLAN_MATH_FP4_TCGEN05)
            assert_int_equal(e->smem_bytes,
                             (size_t)e->stages * ((size_t)e->tile_m * fp4 + (size_t)e->tile_n * fp4));
        else
            assert_int_equal(e->smem_bytes,
                             (size_t)e->stages * ((size_t)e->tile_m * tk * 2 + (size_t)e->tile_n * fp4));
    }
    free(p);
}

static void test_unknown_cc_is_portable(void **state)
{
    (void)state;
    struct device_caps caps;
    caps_for("h200", &caps); /* a made-up successor: cc 13.0 */
    caps.cc_major = 13;
    caps.cc_minor = 0;
    snprintf(caps.name, sizeof caps.name, "test GPU cc 13.0");
    assert_false(plan_caps_apply_table(&caps));
    assert_false(caps.known_cc);
    assert_false(caps.bf16_mma || caps.fp8_mma || caps.wgmma || caps.tcgen05 || caps.fp4_mma_block_scaled ||
                 caps.tma);
    assert_int_equal(caps.smem_per_block_optin, 232448); /* what the probe found stays */
    struct plan_weights w;
    plan_weights_default(&w, WEIGHT_NVFP4, true);
    struct plan_request req = {.weights = &w};
    struct plan *p = malloc(sizeof *p);
    struct err err = {0};
    assert_int_equal(plan_build_request(p, &caps, &req, &err), STATUS_OK);
    check_plan(p, 232448);
    for (int i = 0; i < p->n_ops; i++)
        assert_int_equal(p->ops[i].math_id, PLAN_MATH_FP32_FMA);
    assert_true(experts(p)->portable_fallback);
    assert_non_null(strstr(experts(p)->reason, "PORTABLE FALLBACK"));
    assert_non_null(strstr(p->warnings, "13.0"));
    assert_non_null(strstr(p->warnings, "newer than"));
    assert_non_null(strstr(p->warnings, "portable"));

    caps.cc_major = 7;
    caps.cc_minor = 5;
    assert_false(plan_caps_apply_table(&caps));
    assert_int_equal(plan_build_request(p, &caps, &req, &err), STATUS_OK);
    assert_non_null(strstr(p->warnings, "older than"));
    free(p);
}

static void test_tiny_budget_falls_back_loudly(void **state)
{
    (void)state;
    struct plan *p = malloc(sizeof *p);
    build(p, "rtx-pro-6000", WEIGHT_NVFP4, true, 4096, NULL);
    check_plan(p, 4096);
    const char *fast[] = {"moe_experts_gemm", "attention_prefill", "attention_decode"};
    for (int i = 0; i < 3; i++) {
        const struct op_plan *o = plan_find(p, fast[i]);
        assert_string_equal(o->math, "fp32_fma");
        assert_true(o->portable_fallback);
        assert_non_null(strstr(o->reason, "PORTABLE FALLBACK"));
        assert_non_null(strstr(p->warnings, fast[i]));
    }
    assert_non_null(strstr(p->warnings, "portable fallback"));
    assert_non_null(strstr(plan_find(p, "attention_prefill")->reason, "> budget 4096 B"));
    /* the stage-0 portable variants need no smem, but the small ops need a little: an absurd
     * budget is refused with the op and the size named */
    struct device_caps caps;
    caps_for("h200", &caps);
    struct plan_request req = {.smem_budget = 64};
    struct err err = {0};
    assert_int_equal(plan_build_request(p, &caps, &req, &err), STATUS_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "smem budget of 64 B"));
    assert_non_null(strstr(err.msg, "op "));
    free(p);
}

static enum status parse_desc(const char *text, struct model_desc *d)
{
    struct json *j = NULL;
    struct err err = {0};
    enum status st = json_parse(text, strlen(text), "config.json", &j, &err);
    if (!st)
        st = model_desc_parse(d, j, "config.json", &err);
    if (st)
        print_error("%s\n", err.msg);
    json_free(j);
    return st;
}

static void test_model_shapes(void **state)
{
    (void)state;
    struct model_desc q, g, q30;
    /* Qwen3-30B-A3B's attention: 32 query heads over 4 KV heads of 128 */
    assert_int_equal(
        parse_desc("{\"model_type\":\"qwen3_moe\",\"vocab_size\":151936,\"hidden_size\":2048,"
                   "\"num_hidden_layers\":48,\"num_attention_heads\":32,\"num_key_value_heads\":4,"
                   "\"head_dim\":128,\"intermediate_size\":6144,\"moe_intermediate_size\":768,"
                   "\"num_experts\":128,\"num_experts_per_tok\":8}",
                   &q30),
        STATUS_OK);
    assert_int_equal(parse_desc("{\"model_type\":\"qwen3_moe\",\"vocab_size\":1000,\"hidden_size\":512,"
                                "\"num_hidden_layers\":4,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
                                "\"head_dim\":64,\"intermediate_size\":1024,\"moe_intermediate_size\":256,"
                                "\"num_experts\":32,\"num_experts_per_tok\":4,\"mlp_only_layers\":[0]}",
                                &q),
                     STATUS_OK);
    /* GLM-5-like: MLA with q/kv LoRA, 3 dense layers, 256 experts */
    assert_int_equal(
        parse_desc("{\"model_type\":\"glm_moe_dsa\",\"vocab_size\":154880,\"hidden_size\":6144,"
                   "\"num_hidden_layers\":8,\"num_attention_heads\":64,\"q_lora_rank\":2048,"
                   "\"kv_lora_rank\":512,\"qk_nope_head_dim\":192,\"qk_rope_head_dim\":64,"
                   "\"v_head_dim\":256,\"index_n_heads\":32,\"index_head_dim\":128,\"index_topk\":2048,"
                   "\"intermediate_size\":12288,\"moe_intermediate_size\":2048,\"n_routed_experts\":256,"
                   "\"num_experts_per_tok\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":3}",
                   &g),
        STATUS_OK);
    struct plan *p = malloc(sizeof *p);
    for (size_t i = 0; i < N_PROFILES; i++) {
        struct device_caps caps;
        caps_for(PROFILES[i], &caps);
        build(p, PROFILES[i], WEIGHT_NVFP4, true, 0, &q);
        check_plan(p, caps.smem_per_block_optin);
        assert_int_equal(plan_find(p, "attention_prefill")->tile_k, 64);
        assert_int_equal(p->shapes.n_experts, 32);
        assert_non_null(plan_find(p, "linear_ffn")); /* the dense layer 0 */
        assert_string_equal(plan_find(p, "rope_qk_norm")->kernel, "rope_qk_norm_bf16");

        build(p, PROFILES[i], WEIGHT_NVFP4, true, 0, &g);
        check_plan(p, caps.smem_per_block_optin);
        assert_true(p->shapes.mla);
        assert_int_equal(plan_find(p, "attention_prefill")->tile_k, 256);
        assert_int_equal(plan_find(p, "attention_decode")->tile_k, 576);
        assert_non_null(plan_find(p, "linear_ffn"));
        assert_string_equal(plan_find(p, "moe_route")->kernel, "moe_route_sigmoid_grouped_topk");

        /* the split decode kernel the backend runs (cuda_attn_decode.cu), its static shared
         * memory and, where the device has clusters, a cluster's push slots (adec_push_smem) */
        build(p, PROFILES[i], WEIGHT_NVFP4, true, 0, &q30);
        check_plan(p, caps.smem_per_block_optin);
        const struct op_plan *d = plan_find(p, "attention_decode");
        assert_string_equal(d->kernel, "attn_decode_split_fp32");
        assert_int_equal(d->tile_m, 8);  /* the group of 8 query heads */
        assert_int_equal(d->tile_n, 32); /* keys a round */
        const size_t st = 8 * 32 * 4 + 8 * 5 * 4 + 4 * 8 * 32 * 16 + 64 * 8 * 4 + 4,
                     push = 7 * 8 * (128 * 4 + 8);
        assert_int_equal(d->smem_bytes, caps.clusters && st + push <= p->smem_budget ? st + push : st);
        /* the tensor-core MoE pair at <= 8 tokens, with the shared-memory form's bytes (from 2
         * tokens) as the kernel table states them, where they fit, as on every profile here */
        const struct op_plan *m = plan_find(p, "moe_experts_decode");
        assert_string_equal(m->kernel, "moe_pair_decode_mma_bf16");
        const struct kernel_desc *kd = kernel_table_find(&CUDA_KERNELS, "moe_pair_decode_mma_bf16");
        const struct kernel_shape ks = {.format = WEIGHT_NVFP4, .tokens = 2, .n_weights = 1, .d_model = 2048,
                                        .d_expert = 768, .n_used = 8, .n_experts = 128};
        assert_int_equal(m->smem_bytes, kd->shape_smem(&ks, p->smem_budget, caps.sm_count));
        assert_true(m->smem_bytes > 8 * 768 * 4); /* the down kernel's act and its weight tiles */
        assert_true(m->smem_bytes <= p->smem_budget);
    }
    model_desc_free(&q);
    model_desc_free(&g);
    model_desc_free(&q30);
    free(p);
}

static bool no_fp4_mma(void *ctx, const char *kernel)
{
    (*(int *)ctx)++;
    return strcmp(kernel, "moe_gemm_nvfp4_fp4_mma") != 0;
}

static void test_variant_loads(void **state)
{
    (void)state;
    struct device_caps caps;
    caps_for("rtx-pro-6000", &caps);
    struct plan_weights w;
    plan_weights_default(&w, WEIGHT_NVFP4, true);
    int asked = 0;
    struct plan_request req = {.weights = &w, .variant_loads = no_fp4_mma, .variant_ctx = &asked};
    struct plan *p = malloc(sizeof *p);
    struct err err = {0};
    assert_int_equal(plan_build_request(p, &caps, &req, &err), STATUS_OK);
    assert_true(asked > 0);
    assert_string_equal(experts(p)->kernel, "moe_gemm_nvfp4_wo_mma");
    assert_non_null(strstr(experts(p)->reason, "moe_gemm_nvfp4_fp4_mma is not loadable"));
    free(p);
}

static void test_json_shape(void **state)
{
    (void)state;
    struct plan *p = malloc(sizeof *p);
    build(p, "h200", WEIGHT_NVFP4, false, 101376, NULL);
    struct json *j = plan_to_json(p);
    assert_non_null(j);
    int keys = 0;
    for (const struct json *m = json_child(j); m; m = json_next(m))
        keys++;
    assert_int_equal(keys, 4);
    assert_int_equal(json_number(json_get(j, "prefill_chunk_tokens")), plan_prefill_chunk_tokens(128, 8));
    /* a GPU server's pass: ~256 rows an expert a chunk, within [512, 8192] */
    assert_int_equal(plan_prefill_chunk_tokens(128, 8), 4096); /* Qwen3-30B-A3B */
    assert_int_equal(plan_prefill_chunk_tokens(256, 8), 8192); /* GLM-5 */
    assert_int_equal(plan_prefill_chunk_tokens(16, 2), 2048);
    assert_int_equal(plan_prefill_chunk_tokens(0, 0), PLAN_PREFILL_DENSE_TOKENS);
    assert_int_equal(plan_prefill_chunk_tokens(4, 8), PLAN_PREFILL_MIN_TOKENS);
    assert_int_equal(plan_prefill_chunk_tokens(1024, 4), PLAN_PREFILL_MAX_TOKENS);
    const struct json *dev = json_get(j, "device"), *ops = json_get(j, "ops");
    assert_true(json_is_object(dev) && json_is_array(ops));
    assert_true(json_number(json_get(dev, "smem_budget")) == 101376);
    assert_string_equal(json_string(json_get(dev, "source")), "profile:h200");
    assert_int_equal(json_array_size(ops), (size_t)p->n_ops);
    static const char *KEYS[] = {"op", "kernel", "math", "tile", "stages", "smem_bytes", "bound", "reason"};
    for (size_t i = 0; i < json_array_size(ops); i++) {
        const struct json *o = json_array_at(ops, i);
        int k = 0;
        for (const struct json *m = json_child(o); m; m = json_next(m), k++)
            assert_string_equal(json_key(m), KEYS[k]);
        assert_int_equal(k, 8);
        int tm, tn, tk;
        char tail;
        assert_int_equal(sscanf(json_string(json_get(o, "tile")), "%dx%dx%d%c", &tm, &tn, &tk, &tail), 3);
        const char *b = json_string(json_get(o, "bound"));
        assert_true(!strcmp(b, "memory") || !strcmp(b, "compute"));
    }
    json_free(j);
    free(p);
}

static void test_decode_splits(void **state)
{
    (void)state;
    struct plan *p = malloc(sizeof *p);
    build(p, "h200", WEIGHT_BF16, false, 0, NULL);
    const struct op_plan *d = plan_find(p, "attention_decode");
    assert_true(d->split_k >= 1);
    int one = plan_decode_splits(p, 1, 32768);
    assert_true(one > 1); /* one sequence needs splits to fill 132 SMs */
    assert_true(one <= (32768 + d->tile_n - 1) / d->tile_n);
    assert_int_equal(plan_decode_splits(p, 1024, 32768), 1); /* a big batch fills the GPU alone */
    assert_int_equal(plan_decode_splits(p, 1, 1), 1);
    /* the launch rule: two blocks per SM, bounded by the key chunks and the merge workspace */
    assert_int_equal(plan_attention_splits(132, 32, PLAN_ATTN_MAX_SPLITS), 9);
    assert_int_equal(plan_attention_splits(132, 1, PLAN_ATTN_MAX_SPLITS), PLAN_ATTN_MAX_SPLITS);
    assert_int_equal(plan_attention_splits(132, 1, 3), 3);
    assert_int_equal(plan_attention_splits(132, 512, PLAN_ATTN_MAX_SPLITS), 1);
    assert_null(plan_find(p, "no_such_op"));
    free(p);
}

/* The pair-by-pair MoE range: tokens while the (token, slot) pairs average at most 2 an expert,
 * within 8..64 tokens. */
static void test_moe_pair_max_tokens(void **state)
{
    (void)state;
    for (int e = 1; e <= 1024; e *= 2)
        for (int k = 1; k <= 16 && k <= e; k *= 2) {
            const int t = plan_moe_pair_max_tokens(e, k, 0.0);
            assert_in_range(t, 8, 64);
            if (t > 8 && t < 64) {
                assert_true((int64_t)t * k <= 2 * (int64_t)e);
                assert_true((int64_t)(t + 1) * k > 2 * (int64_t)e);
            }
        }
    assert_int_equal(plan_moe_pair_max_tokens(128, 0, 0.0), 8); /* no routing: the floor */
    /* the re-read bound: Qwen3-30B-A3B's NVFP4 experts keep 32 tokens, GLM-5's (21.2 MB) stop at 8 */
    const double fp4 = 0.5 + 1.0 / 16;
    assert_int_equal(plan_moe_pair_max_tokens(128, 8, fp4 * 3 * 2048 * 768), 32);
    assert_int_equal(plan_moe_pair_max_tokens(256, 8, fp4 * 3 * 6144 * 2048), 8);
}

static void test_probe(void **state)
{
    (void)state;
    struct device_caps caps;
    struct err err = {0};
    enum status st = plan_caps_probe(&caps, 0, &err);
#ifdef MOESERVE_HAVE_CUDA
    /* a CUDA build on a machine without a GPU fails cleanly; with one, the table applies */
    if (st == STATUS_OK)
        assert_true(caps.sm_count > 0 && caps.smem_per_block_optin > 0);
    else
        assert_true(err.msg[0] != 0);
#else
    assert_int_equal(st, STATUS_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "this build has no CUDA"));
    assert_non_null(strstr(err.msg, "--profile"));
#endif
}

/* The op a registered kernel serves covers the plan op it was chosen for ("linear" serves the
 * linear ops: linear, linear_ffn, lm_head). */
static bool serves(const struct kernel_desc *k, const char *op)
{
    if (kernel_desc_serves(k, op))
        return true;
    return kernel_desc_serves(k, "linear") && (!strcmp(op, "linear_ffn") || !strcmp(op, "lm_head"));
}

/* Planned with the CUDA backend's table, every chosen kernel is one the backend has, for the op
 * it was chosen for, with the math the table declares: on every profile, every weight format,
 * the sm_120 budget, generic shapes and the shipped model's (GQA + MoE) and an MLA + DSA model's. */
static void test_plan_uses_registered_kernels(void **state)
{
    (void)state;
    const char *src = getenv("MOESERVE_SRC");
    char dir[1024];
    struct model_desc models[2];
    int n_models = 0;
    const char *names[] = {"models/moeserve-tiny", "tests/golden/dsa/dsa_basic"};
    for (int i = 0; i < 2 && src; i++) {
        struct err err = {0};
        snprintf(dir, sizeof dir, "%s/%s", src, names[i]);
        if (model_desc_load(&models[n_models], dir, &err) == STATUS_OK)
            n_models++;
        else
            fail_msg("%s: %s", dir, err.msg);
    }
    const enum weight_format fmts[] = {WEIGHT_BF16, WEIGHT_FP8_BLOCK, WEIGHT_NVFP4};
    struct plan *p = malloc(sizeof *p);
    int checked = 0;
    for (size_t pi = 0; pi < N_PROFILES; pi++)
        for (size_t f = 0; f < 3; f++)
            for (int fp4 = 0; fp4 < 2; fp4++)
                for (int m = -1; m < n_models; m++)
                    for (int small = 0; small < 2; small++) {
                        struct device_caps caps;
                        caps_for(PROFILES[pi], &caps);
                        struct plan_weights w;
                        plan_weights_default(&w, fmts[f], fp4 && fmts[f] == WEIGHT_NVFP4);
                        struct plan_shapes ms;
                        if (m >= 0)
                            assert_int_equal(model_plan_shapes(&models[m], names[m], &ms, NULL), STATUS_OK);
                        struct plan_request req = {.shapes = m < 0 ? NULL : &ms,
                                                   .weights = &w,
                                                   .smem_budget = small ? 101376 : 0,
                                                   .variant_loads = cuda_kernel_registered};
                        struct err err = {0};
                        if (plan_build_request(p, &caps, &req, &err))
                            fail_msg("%s: %s", PROFILES[pi], err.msg);
                        for (int i = 0; i < p->n_ops; i++) {
                            const struct op_plan *o = &p->ops[i];
                            const struct kernel_desc *k = kernel_table_find(&CUDA_KERNELS, o->kernel);
                            if (!k)
                                fail_msg("%s: op %s planned %s, which the CUDA backend does not have",
                                         PROFILES[pi], o->op, o->kernel);
                            if (!serves(k, o->op))
                                fail_msg("%s: op %s planned %s, a kernel for %s", PROFILES[pi], o->op, o->kernel,
                                         k->op);
                            if (k->math && strcmp(k->math, o->math) != 0)
                                fail_msg("%s: %s is %s in the plan, %s in the table", PROFILES[pi], o->kernel,
                                         o->math, k->math);
                            if (k->formats && o->weight_format < WEIGHT_FORMAT_COUNT &&
                                !(k->formats & (1u << o->weight_format)))
                                fail_msg("%s: op %s planned %s for %s weights, which it does not read",
                                         PROFILES[pi], o->op, o->kernel, weight_format_name(o->weight_format));
                            checked++;
                        }
                    }
    print_message("    %d planned kernels checked against the CUDA table (%d entries)\n", checked, CUDA_KERNELS.n);
    assert_true(checked > 1000);
    for (int i = 0; i < n_models; i++)
        model_desc_free(&models[i]);
    free(p);
}

static void test_bad_caps(void **state)
{
    (void)state;
    struct device_caps caps;
    memset(&caps, 0, sizeof caps);
    struct plan *p = malloc(sizeof *p);
    struct err err = {0};
    assert_int_equal(plan_build(p, &caps, NULL, 0, &err), STATUS_INVALID);
    assert_non_null(strstr(err.msg, "SM count"));
    free(p);
}

int main(void)
{
    log_set_level(LOG_LEVEL_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_profile_fits),
        cmocka_unit_test(test_profile_caps),
        cmocka_unit_test(test_unknown_profile),
        cmocka_unit_test(test_nvfp4_expert_gemm_choice),
        cmocka_unit_test(test_nvfp4_linear_choice),
        cmocka_unit_test(test_h200_sm120_budget),
        cmocka_unit_test(test_smem_formulas),
        cmocka_unit_test(test_unknown_cc_is_portable),
        cmocka_unit_test(test_tiny_budget_falls_back_loudly),
        cmocka_unit_test(test_model_shapes),
        cmocka_unit_test(test_variant_loads),
        cmocka_unit_test(test_json_shape),
        cmocka_unit_test(test_decode_splits),
        cmocka_unit_test(test_moe_pair_max_tokens),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_bad_caps),
        cmocka_unit_test(test_plan_uses_registered_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
