/* plan_gemm.c — the GEMM families (tensor-core, weight-only, portable) and the ops planned on them: linears, routed experts, lm_head, sampling (plan_internal.h; the cost model: planner.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "plan/plan_internal.h"

/* ---- operands and GEMM families ---- */

enum opd { OPD_BF16, OPD_FP8_ACT, OPD_FP8_W, OPD_FP4 };

/* smem bytes of a rows x k tile of operand `o` (k a multiple of 16). */
static size_t opd_tile_bytes(enum opd o, int rows, int k)
{
    size_t r = (size_t)rows, kk = (size_t)k;
    switch (o) {
    case OPD_BF16: return r * kk * 2;
    case OPD_FP8_ACT: return r * kk + r * (size_t)ceil_div(k, 128) * 4;
    case OPD_FP8_W: return r * kk + (size_t)ceil_div(rows, 128) * (size_t)ceil_div(k, 128) * 4;
    case OPD_FP4: return r * kk / 2 + r * kk / 16;
    }
    return 0;
}

/* Bytes per weight element in memory. */
double pl_wf_bytes(enum weight_format f)
{
    switch (f) {
    case WEIGHT_F32: return 4;
    case WEIGHT_BF16:
    case WEIGHT_F16: return 2;
    case WEIGHT_FP8_BLOCK: return 1 + 4.0 / (128 * 128);
    case WEIGHT_NVFP4: return 0.5 + 1.0 / 16;
    case WEIGHT_FORMAT_COUNT: break;
    }
    return 2;
}

enum fam_kind { FAM_MMA, FAM_WGMMA, FAM_TCGEN05, FAM_FP32 };

struct gemm_family {
    const char *moe_kernel, *linear_kernel;
    enum plan_math math;
    unsigned needs;
    enum opd a, b;
    enum fam_kind kind;
    bool fp4_act; /* needs activations quantised to fp4 (W4A4 checkpoints) */
    bool dequant; /* weight-only: B dequantised in registers */
    bool reg_a;   /* cuda_gemm_wgmma.cu: weights as wgmma's A from registers, only x in smem */
    int tk[3];    /* tile_k options, 0-terminated */
};

static const struct gemm_family FAM_NVFP4[] = {
    {.moe_kernel = "moe_gemm_nvfp4_fp4_tcgen05",
     .linear_kernel = "gemm_nvfp4_fp4_tcgen05",
     .math = PLAN_MATH_FP4_TCGEN05,
     .needs = FEAT_TCGEN05 | FEAT_TMA,
     .a = OPD_FP4,
     .b = OPD_FP4,
     .kind = FAM_TCGEN05,
     .fp4_act = true,
     .tk = {256, 128}},
    {.moe_kernel = "moe_gemm_nvfp4_fp4_mma",
     .linear_kernel = "gemm_nvfp4_fp4_mma",
     .math = PLAN_MATH_FP4_BLOCK_SCALED_MMA,
     .needs = FEAT_FP4_BS,
     .a = OPD_FP4,
     .b = OPD_FP4,
     .kind = FAM_MMA,
     .fp4_act = true,
     .tk = {128, 64}},
    {.moe_kernel = "moe_gemm_nvfp4_wo_wgmma",
     .linear_kernel = "gemm_nvfp4_wo_wgmma",
     .math = PLAN_MATH_BF16_WGMMA,
     .needs = FEAT_WGMMA | FEAT_TMA,
     .a = OPD_BF16,
     .b = OPD_FP4,
     .kind = FAM_WGMMA,
     .dequant = true,
     .reg_a = true,
     .tk = {128, 64}},
    {.moe_kernel = "moe_gemm_nvfp4_wo_mma",
     .linear_kernel = "gemm_nvfp4_wo_mma",
     .math = PLAN_MATH_BF16_MMA,
     .needs = FEAT_BF16_MMA,
     .a = OPD_BF16,
     .b = OPD_FP4,
     .kind = FAM_MMA,
     .dequant = true,
     .tk = {64, 32}},
    {.moe_kernel = "moe_gemm_nvfp4_wo_fp32",
     .linear_kernel = "gemm_nvfp4_wo_fp32",
     .math = PLAN_MATH_FP32_FMA,
     .needs = 0,
     .a = OPD_BF16,
     .b = OPD_FP4,
     .kind = FAM_FP32,
     .dequant = true,
     .tk = {32, 16}},
};

static const struct gemm_family FAM_FP8[] = {
    {.moe_kernel = "moe_gemm_fp8_wgmma",
     .linear_kernel = "gemm_fp8_wgmma",
     .math = PLAN_MATH_FP8_WGMMA,
     .needs = FEAT_WGMMA | FEAT_TMA,
     .a = OPD_FP8_ACT,
     .b = OPD_FP8_W,
     .kind = FAM_WGMMA,
     .tk = {128}},
    {.moe_kernel = "moe_gemm_fp8_mma",
     .linear_kernel = "gemm_fp8_mma",
     .math = PLAN_MATH_FP8_MMA,
     .needs = FEAT_FP8_MMA,
     .a = OPD_FP8_ACT,
     .b = OPD_FP8_W,
     .kind = FAM_MMA,
     .tk = {128, 64}},
    {.moe_kernel = "moe_gemm_fp8_wo_mma",
     .linear_kernel = "gemm_fp8_wo_mma",
     .math = PLAN_MATH_BF16_MMA,
     .needs = FEAT_BF16_MMA,
     .a = OPD_BF16,
     .b = OPD_FP8_W,
     .kind = FAM_MMA,
     .dequant = true,
     .tk = {64, 32}},
    {.moe_kernel = "moe_gemm_fp8_wo_fp32",
     .linear_kernel = "gemm_fp8_wo_fp32",
     .math = PLAN_MATH_FP32_FMA,
     .needs = 0,
     .a = OPD_BF16,
     .b = OPD_FP8_W,
     .kind = FAM_FP32,
     .dequant = true,
     .tk = {32, 16}},
};

/* bf16 linears go to cuBLAS (plan_gemm_op); these serve the experts. */
static const struct gemm_family FAM_BF16[] = {
    {.moe_kernel = "moe_gemm_bf16_tcgen05",
     .linear_kernel = NULL,
     .math = PLAN_MATH_BF16_TCGEN05,
     .needs = FEAT_TCGEN05 | FEAT_TMA,
     .a = OPD_BF16,
     .b = OPD_BF16,
     .kind = FAM_TCGEN05,
     .tk = {64}},
    {.moe_kernel = "moe_gemm_bf16_wgmma",
     .linear_kernel = NULL,
     .math = PLAN_MATH_BF16_WGMMA,
     .needs = FEAT_WGMMA | FEAT_TMA,
     .a = OPD_BF16,
     .b = OPD_BF16,
     .kind = FAM_WGMMA,
     .reg_a = true,
     .tk = {64}},
    {.moe_kernel = "moe_gemm_bf16_mma",
     .linear_kernel = NULL,
     .math = PLAN_MATH_BF16_MMA,
     .needs = FEAT_BF16_MMA,
     .a = OPD_BF16,
     .b = OPD_BF16,
     .kind = FAM_MMA,
     .tk = {64, 32}},
    {.moe_kernel = "moe_gemm_bf16_fp32",
     .linear_kernel = NULL,
     .math = PLAN_MATH_FP32_FMA,
     .needs = 0,
     .a = OPD_BF16,
     .b = OPD_BF16,
     .kind = FAM_FP32,
     .tk = {32, 16}},
};

/* A (grouped) GEMM: `groups` independent row sets of `rows` rows each (balanced routing),
 * each multiplied by every part's [n x k] weight. */
struct gemm_problem {
    int groups;
    double rows;
    int n_parts;
    int n[MAX_PARTS], k[MAX_PARTS];
    enum weight_format wf;
};

static void gemm_work(struct cand *c, const struct gemm_problem *g)
{
    for (int i = 0; i < g->n_parts; i++) {
        double n = g->n[i], k = g->k[i], rows = g->groups * g->rows;
        double wbytes = g->groups * n * k * pl_wf_bytes(g->wf);
        double bytes = wbytes + rows * k * 2 + rows * n * 2;
        int tm = c->library ? 128 : c->tm, tn = c->library ? 128 : c->tn;
        double mt = ceil_div(g->rows, tm), nt = ceil_div(n, tn);
        double l2 = rows * k * 2 * nt + wbytes * mt;
        double flops = c->library ? 2 * rows * n * k : 2.0 * g->groups * mt * tm * nt * tn * k;
        pl_cand_part(c, flops, bytes, l2, g->groups * mt * nt);
    }
}

/* The reg_a family's candidates: the tiles its kernel compiles for this weight format, as the
 * backend's table declares them (kernel_desc.tiles; none without a table), with the table's
 * shared-memory formula. The kernel issues two wgmmas a k16 step (x's hi and lo) and keeps only x
 * in shared memory, so the feed is x's bytes. */
static void reg_a_cands(struct plan_ctx *x, const struct gemm_family *f, bool moe,
                        const struct gemm_problem *g)
{
    const char *kernel = moe ? f->moe_kernel : f->linear_kernel;
    const struct kernel_desc *kd = x->req->kernels && kernel ? kernel_table_find(x->req->kernels, kernel) : NULL;
    const enum weight_format wf = f->b == OPD_FP4 ? WEIGHT_NVFP4 : WEIGHT_BF16;
    for (int i = 0; kd && kd->tile_smem && i < kd->n_tiles; i++) {
        const struct kernel_tile *t = &kd->tiles[i];
        if (t->format != wf)
            continue;
        struct cand *c = pl_cand_add(x, kernel, f->math, f->needs);
        c->tm = t->m, c->tn = t->n, c->tk = t->k, c->stages = t->stages;
        c->note = f->dequant ? "weight-only: weights dequantised in registers (wgmma's A), x in smem as bf16 "
                               "hi + lo"
                             : "weights as wgmma's A from registers, x in smem as bf16 hi + lo";
        c->smem = kd->tile_smem(t);
        c->threads = 2 * t->n; /* a warpgroup of 128 threads per 64 weight rows */
        c->regs = t->m / 2 + 48 + (f->dequant ? 16 : 0);
        double kflops = 2.0 * t->m * t->n * t->k;
        c->feed = SMEM_BYTES_PER_CLK * kflops / (double)(2 * t->m * t->k * 2);
        gemm_work(c, g);
    }
}

static void gemm_family_cands(struct plan_ctx *x, const struct gemm_family *f, bool moe,
                              const struct gemm_problem *g)
{
    if (f->reg_a) {
        reg_a_cands(x, f, moe, g);
        return;
    }
    static const int TM_TC[] = {128, 64}, TN_MMA[] = {128, 64, 32}, TN_WG[] = {256, 128, 64},
                     TN_TC05[] = {256, 128}, T_FP32[] = {64, 32, 16};
    static const int ST_MMA[] = {4, 3, 2}, ST_WG[] = {5, 4, 3, 2}, ST_TC05[] = {6, 5, 4, 3, 2},
                     ST_FP32[] = {2, 1, 0};
    const int *tms, *tns, *sts;
    int ntm, ntn, nst;
    switch (f->kind) {
    case FAM_TCGEN05: tms = TM_TC, ntm = 1, tns = TN_TC05, ntn = 2, sts = ST_TC05, nst = 5; break;
    case FAM_WGMMA: tms = TM_TC, ntm = 2, tns = TN_WG, ntn = 3, sts = ST_WG, nst = 4; break;
    case FAM_MMA: tms = TM_TC, ntm = 2, tns = TN_MMA, ntn = 3, sts = ST_MMA, nst = 3; break;
    default: tms = T_FP32, ntm = 3, tns = T_FP32, ntn = 3, sts = ST_FP32, nst = 3; break;
    }
    const char *kernel = moe ? f->moe_kernel : f->linear_kernel;
    for (int a = 0; a < ntm; a++)
        for (int b = 0; b < ntn; b++)
            for (int kk = 0; kk < 3 && f->tk[kk]; kk++)
                for (int s = 0; s < nst; s++) {
                    int tm = tms[a], tn = tns[b], tk = f->tk[kk], st = sts[s];
                    struct cand *c = pl_cand_add(x, kernel, f->math, f->needs);
                    c->tm = tm, c->tn = tn, c->tk = tk, c->stages = st;
                    c->note = f->fp4_act            ? "fp4 activations (W4A4 input scales)"
                              : f->a == OPD_FP8_ACT ? "activations quantised to fp8 per 1x128"
                              : f->dequant          ? "weight-only: weights dequantised in registers"
                                                    : NULL;
                    if (f->fp4_act && !x->w.fp4_activations)
                        c->refused = "fp4 activations need a W4A4 NVFP4 checkpoint (this one is weight-only)";
                    size_t ta = opd_tile_bytes(f->a, tm, tk), tb = opd_tile_bytes(f->b, tn, tk);
                    c->smem = (size_t)st * (ta + tb);
                    double kflops = 2.0 * tm * tn * tk;
                    switch (f->kind) {
                    case FAM_TCGEN05: /* accumulators live in tensor memory */
                        c->threads = 192;
                        c->regs = 64;
                        c->feed = SMEM_BYTES_PER_CLK * kflops / (double)(ta + tb);
                        break;
                    case FAM_WGMMA: /* one producer warpgroup + tile_m/64 consumer warpgroups */
                        c->threads = 128 * (tm / 64 + 1);
                        c->regs = tn / 2 + 48 + (f->dequant ? 16 : 0);
                        c->feed = SMEM_BYTES_PER_CLK * kflops / (double)(ta + tb);
                        break;
                    case FAM_MMA:
                        c->threads = 32 * imin(8, imax(4, tm * tn / 2048));
                        c->regs = tm * tn / c->threads + 48 + (f->dequant ? 16 : 0);
                        c->feed = SMEM_BYTES_PER_CLK * kflops / (2.0 * (double)(ta + tb));
                        break;
                    case FAM_FP32: {
                        c->threads = 256;
                        double r = sqrt(fmax(1.0, (double)tm * tn / c->threads));
                        c->regs = (int)(r * r) + 40;
                        /* per thread and k: r A values and r B values for 2 r^2 FLOP */
                        double bpe = (double)(ta + tb) / ((tm + tn) * (double)tk);
                        c->feed = SMEM_BYTES_PER_CLK * (2 * r * r) / (2 * r * bpe) * (st ? 1.0 : 0.5);
                        if (!st)
                            c->smem = 0;
                        break;
                    }
                    }
                    gemm_work(c, g);
                }
}

static const struct gemm_family *families(enum weight_format wf, int *n)
{
    switch (wf) {
    case WEIGHT_NVFP4: *n = (int)(sizeof FAM_NVFP4 / sizeof FAM_NVFP4[0]); return FAM_NVFP4;
    case WEIGHT_FP8_BLOCK: *n = (int)(sizeof FAM_FP8 / sizeof FAM_FP8[0]); return FAM_FP8;
    default: *n = (int)(sizeof FAM_BF16 / sizeof FAM_BF16[0]); return FAM_BF16;
    }
}

/* The best bf16 family a library (cuBLAS) would use on this device. */
static enum plan_math library_math(const struct device_caps *caps)
{
    if (caps->tcgen05)
        return PLAN_MATH_BF16_TCGEN05;
    if (caps->wgmma)
        return PLAN_MATH_BF16_WGMMA;
    if (caps->bf16_mma)
        return PLAN_MATH_BF16_MMA;
    return PLAN_MATH_FP32_FMA;
}

/* A weight-only NVFP4 linear through a bf16 library GEMM: each call expands the weight to bf16
 * (read 0.5625 bytes a weight, write 2, the GEMM reads 2 again) and the GEMM runs over 2 x rows
 * columns (x as bf16 hi + lo). */
static void gemm_work_expanded(struct cand *c, const struct gemm_problem *g)
{
    for (int i = 0; i < g->n_parts; i++) {
        double n = g->n[i], k = g->k[i], rows = g->groups * g->rows;
        double bytes = g->groups * n * k * (pl_wf_bytes(g->wf) + 4) + 2 * rows * k * 2 + 2 * rows * n * 4;
        pl_cand_part(c, 2 * 2 * rows * n * k, bytes, bytes,
                  g->groups * ceil_div(n, 128) * ceil_div(2 * rows, 128));
    }
}

/* Whether some NVFP4 family that takes fp4 activations can run here: its features on the device
 * and, where the request has a filter, a kernel the backend has. */
static bool fp4_activations_usable(const struct plan_ctx *x, bool moe)
{
    for (size_t i = 0; i < sizeof FAM_NVFP4 / sizeof FAM_NVFP4[0]; i++) {
        const struct gemm_family *f = &FAM_NVFP4[i];
        const char *kernel = moe ? f->moe_kernel : f->linear_kernel;
        if (f->fp4_act && !(f->needs & ~pl_caps_features(x->caps)) &&
            (!x->req->kernels || kernel_table_find(x->req->kernels, kernel)) &&
            (!x->req->variant_loads || x->req->variant_loads(x->req->variant_ctx, kernel)))
            return true;
    }
    return false;
}

/* A linear op: cuBLAS for 16-bit weights, our kernels for quantised ones (weight-only NVFP4,
 * or W4A4 where no fp4-activation kernel can run: cuBLAS on a bf16 copy made per call). */
static enum status plan_gemm_op(struct plan_ctx *x, const char *op, const struct gemm_problem *g, bool moe,
                                const char *note, struct err *err)
{
    bool plain = g->wf == WEIGHT_BF16 || g->wf == WEIGHT_F16 || g->wf == WEIGHT_F32;
    if (!moe && g->wf == WEIGHT_NVFP4 && (!x->w.fp4_activations || !fp4_activations_usable(x, moe))) {
        /* The whole prefill is 1.12x (2048 tokens) to 1.68x (128) faster this way than through
         * gemm_nvfp4_wo_wgmma, whose in-register dequant runs at ~0.11 of the bf16 rate (H200,
         * Qwen3-30B-A3B NVFP4, tools/decode_iter.sh; docs/lab/journal.md). The experts stay on
         * our grouped GEMMs: a per-call copy of every expert would cost more than their GEMM. */
        struct cand *c = pl_cand_add(x, "cublas_dequant_bf16", library_math(x->caps), 0);
        c->library = true;
        c->portable = false;
        c->threads = 0;
        gemm_work_expanded(c, g);
        return pl_choose(x, op, g->wf,
                           x->w.fp4_activations
                               ? "W4A4 NVFP4 without an fp4-activation kernel here, so weight-only: from 9 "
                                 "rows weight expanded to bf16 per call (exact), cuBLAS on x hi + lo; H200: "
                                 "prefill 1.12-1.68x the in-register dequant GEMM"
                               : "weight-only NVFP4, from 9 rows: weight expanded to bf16 per call (exact), "
                                 "cuBLAS on x hi + lo; H200: prefill 1.12-1.68x the in-register dequant GEMM",
                           err);
    }
    if (plain && !moe) {
        const char *k = strcmp(op, "lm_head") == 0 ? "cublas_bf16" : "cublaslt_bf16";
        struct cand *c = pl_cand_add(x, k, library_math(x->caps), 0);
        c->library = true;
        c->portable = false;
        c->threads = 0;
        gemm_work(c, g);
        return pl_choose(x, op, g->wf,
                           note ? note : "cuBLAS picks its own tiles; the smem budget does not apply", err);
    }
    int nf;
    const struct gemm_family *f = families(g->wf, &nf);
    for (int i = 0; i < nf; i++)
        gemm_family_cands(x, &f[i], moe, g);
    return pl_choose(x, op, g->wf, note, err);
}

enum status pl_moe(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    double T = s->prefill_tokens, E = s->n_experts, k = s->n_experts_used;
    enum status st;
    const char *rk =
        x->shapes_router_sigmoid ? "moe_route_sigmoid_grouped_topk" : "moe_route_softmax_topk";
    static const int TOK[] = {8, 4, 1};
    for (int i = 0; i < 3; i++)
        pl_simple(x, rk, TOK[i], s->n_experts, s->n_experts_used, 32 * TOK[i], (size_t)TOK[i] * s->n_experts * 4,
               T * E * 8, T * E * 4 + T * k * 8, ceil_div(T, TOK[i]));
    /* cuda_moe_route.cu; which fused router + routing form runs at few tokens is the dispatch
     * table's moe_route lists (plan_dispatch.c) */
    const char *route_note = "a block per token counting ranks (<= 256 tokens and experts, else a warp per "
                             "token), logits from the router linear; at few tokens: the dispatch's moe_route";
    if ((st = pl_choose(x, "moe_route", WEIGHT_BF16, route_note, err)))
        return st;

    /* The GEMM decides the padding, so it is planned first and moe_align slotted before it. */
    struct gemm_problem g = {.groups = s->n_experts, .rows = T * k / E, .n_parts = 2, .wf = x->w.experts};
    g.n[0] = 2 * s->d_expert, g.k[0] = s->d_model; /* gate_up */
    g.n[1] = s->d_model, g.k[1] = s->d_expert;     /* down */
    int align_at = x->p->n_ops;
    x->p->n_ops++; /* reserved */
    if ((st = plan_gemm_op(x, "moe_experts_gemm", &g, true, NULL, err)))
        return st;
    struct op_plan gemm = x->p->ops[x->p->n_ops - 1];
    x->p->n_ops -= 2;
    pl_simple(x, "moe_align_count_sort", gemm.tile_m, s->n_experts, 1, 1024, ((size_t)s->n_experts + 1) * 4 * 2,
           0, T * k * 4 * 3, 1);
    char note[96];
    snprintf(note, sizeof note, "pads each expert's rows to moe_experts_gemm tile_m = %d", gemm.tile_m);
    if ((st = pl_choose(x, "moe_align", WEIGHT_BF16, note, err)))
        return st;
    ASSERT(x->p->n_ops == align_at + 1);
    x->p->ops[x->p->n_ops++] = gemm;

    double rows = T * k;
    pl_simple(x, "moe_silu_mul_bf16", 4, s->d_expert, 1, 256, 0, rows * s->d_expert * 4, rows * s->d_expert * 6,
           rows / 4);
    return pl_choose(x, "moe_silu_mul", WEIGHT_BF16, "separate pass over the gate_up output", err);
}

enum status pl_linear(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    struct gemm_problem g = {.groups = 1, .rows = s->prefill_tokens, .wf = x->w.attn};
    int H = s->n_heads;
    if (s->mla) {
        int q_lora = s->q_lora_rank, kv_lora = s->kv_lora_rank;
        int nope = s->qk_nope_dim, rope = s->qk_rope_dim;
        int i = 0;
        if (q_lora > 0) {
            g.n[i] = q_lora, g.k[i++] = s->d_model;
            g.n[i] = H * (nope + rope), g.k[i++] = q_lora;
        } else {
            g.n[i] = H * (nope + rope), g.k[i++] = s->d_model;
        }
        g.n[i] = kv_lora + rope, g.k[i++] = s->d_model;
        g.n[i] = H * (nope + s->v_head_dim), g.k[i++] = kv_lora;
        g.n[i] = s->d_model, g.k[i++] = H * s->v_head_dim;
        g.n_parts = i;
    } else {
        g.n[0] = (H + 2 * s->n_kv_heads) * s->head_dim, g.k[0] = s->d_model; /* qkv */
        g.n[1] = s->d_model, g.k[1] = H * s->head_dim;                       /* o */
        g.n_parts = 2;
    }
    return plan_gemm_op(x, "linear", &g, false, NULL, err);
}

enum status pl_linear_ffn(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    if (s->d_ff <= 0)
        return STATUS_OK;
    struct gemm_problem f = {.groups = 1, .rows = s->prefill_tokens, .n_parts = 2, .wf = x->w.ffn};
    f.n[0] = 2 * s->d_ff, f.k[0] = s->d_model;
    f.n[1] = s->d_model, f.k[1] = s->d_ff;
    return plan_gemm_op(x, "linear_ffn", &f, false, NULL, err);
}

enum status pl_tail(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    enum status st;
    struct gemm_problem g = {.groups = 1, .rows = s->decode_batch, .n_parts = 1, .wf = x->w.lm_head};
    g.n[0] = s->vocab, g.k[0] = s->d_model;
    if ((st = plan_gemm_op(x, "lm_head", &g, false, NULL, err)))
        return st;
    double B = s->decode_batch, V = s->vocab;
    static const int CANDS[] = {1024, 512, 256};
    for (int i = 0; i < 3; i++)
        pl_simple(x, "sample_topk_topp", 1, CANDS[i], 1, 1024, (size_t)CANDS[i] * 8 + 32 * 8, B * V * 4,
               B * V * 4 * 2, B);
    if ((st = pl_choose(x, "sample", WEIGHT_BF16, "one row per block; tile_n = top-k candidates kept in smem",
                          err)))
        return st;
    /* the logit processors of device-drawn rows (penalties, logit_bias, min_tokens) as sparse
     * edits before the draw: a block a row, a thread an edit (a few hundred ids a row) */
    pl_simple(x, "logits_edit", 1, 256, 1, 256, 0, B * 256 * 3, B * 256 * 24, B);
    if ((st = pl_choose(x, "logits_edit", WEIGHT_BF16, "logit processors as a row's sparse edits, a thread an edit",
                        err)))
        return st;
    /* requested log-probabilities of drawn rows: logsumexp and up to 20 likeliest, a block a row
     * (k passes over the row, which stays in L2) */
    pl_simple(x, "logprobs_topk", 1, 256, 1, 256, 0, B * V * 22, B * V * 4 * 22, B);
    if ((st = pl_choose(x, "logprobs", WEIGHT_BF16, "log-probabilities beside the logits: logsumexp, the k likeliest "
                        "by k passes", err)))
        return st;
    /* greedy decoding: a block per 8192 logits of a row (tile_n), each thread's 8 float4 loads
     * issued at once, the row's last block reducing the partials in order: one block a row is a
     * chain of ~150 loads a thread (64 us against 6.4 us for a 151936 vocab on the H200) */
    double slices = ceil_div(V, 8192);
    pl_simple(x, "argmax_split", 1, 8192, 1, 256, 0, B * V, B * V * 4, B * slices);
    return pl_choose(x, "argmax", WEIGHT_BF16, "greedy decoding: rows split over blocks, the last block of a "
                       "row reduces the partials", err);
}
