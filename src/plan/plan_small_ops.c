/* plan_small_ops.c — the memory-bound small ops (embedding, norms, RoPE, the cache write) and the few-token decode kernels (plan_internal.h; the cost model: planner.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "plan/plan_internal.h"

/* ---- the small ops: one or a few variants each, all memory-bound ---- */

int pl_row_threads(int width)
{
    int t = (width / 8 + 31) / 32 * 32;
    return imax(32, imin(MAX_THREADS_PER_BLOCK, t));
}

struct cand *pl_simple(struct plan_ctx *x, const char *kernel, int tm, int tn, int tk, int threads,
                           size_t smem, double flops, double bytes, double blocks)
{
    struct cand *c = pl_cand_add(x, kernel, PLAN_MATH_FP32_FMA, 0);
    c->portable = false; /* not a fallback: these ops have no tensor-core form */
    c->tm = tm, c->tn = tn, c->tk = tk, c->threads = threads, c->regs = 48, c->smem = smem;
    c->stages = 0;
    c->streaming = true;
    pl_cand_part(c, flops, bytes, 0, blocks);
    return c;
}

enum status pl_front(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    double T = s->prefill_tokens, d = s->d_model;
    enum status st;
    pl_simple(x, "embedding_gather_bf16", 1, s->d_model, 1, pl_row_threads(s->d_model), 0, 0, T * d * 4, T);
    if ((st = pl_choose(x, "embedding", WEIGHT_BF16, "one token row per block", err)))
        return st;

    /* warp per row while the row (x and residual) fits in registers; else block per row */
    struct cand *c =
        pl_simple(x, "rmsnorm_residual_warp", 8, s->d_model, 1, 256, 0, T * d * 4, T * d * 8, T / 8);
    c->regs = 2 * s->d_model / 32 + 24;
    int bt = pl_row_threads(s->d_model);
    pl_simple(x, "rmsnorm_residual_block", 1, s->d_model, 1, bt, (size_t)(bt / 32) * 4, T * d * 4, T * d * 8, T);
    return pl_choose(x, "rmsnorm", WEIGHT_BF16, "residual add fused", err);
}

enum status pl_rope_kv(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    double T = s->prefill_tokens;
    enum status st;
    int heads = s->mla ? s->n_heads + 1 : s->n_heads + s->n_kv_heads;
    int hd = s->mla ? s->qk_head_dim : s->head_dim;
    const char *k = s->mla ? "rope_mla_bf16" : x->qk_norm ? "rope_qk_norm_bf16" : "rope_bf16";
    pl_simple(x, k, 1, heads, hd, imin(MAX_THREADS_PER_BLOCK, 32 * heads), (size_t)hd / 2 * 4,
           T * heads * hd * 8, T * heads * hd * 4, T);
    const char *note = s->mla       ? "rope on the q/k rope dims"
                       : x->qk_norm ? "per-head q/k RMSNorm fused"
                                    : "no q/k norm";
    if ((st = pl_choose(x, "rope_qk_norm", WEIGHT_BF16, note, err)))
        return st;

    int kv_w = s->mla ? s->decode_k_dim : s->n_kv_heads * 2 * s->head_dim;
    pl_simple(x, "kv_cache_write_bf16", 1, kv_w, 1, pl_row_threads(kv_w), 0, 0, T * kv_w * 4, T);
    return pl_choose(x, "kv_cache_write", WEIGHT_BF16, s->mla ? "latent + rope key" : "paged, bf16", err);
}

/* ---- decode at batch 1 (cuda_decode.cu): what runs when a step has one or a few tokens ---- */

/* The GEMV every linear takes at one token (q/k/v in one launch, o, router, lm_head): x (K
 * floats) staged once per block in shared memory, R weight rows per warp with every load issued
 * first. R = 2 below 16384 rows, 4 above (H200, docs/lab/journal.md); tile_m = R,
 * tile_k = the widest K. Without room for x the tiled fp32 GEMM serves one row. */
enum status pl_decode(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    int H = s->n_heads, kq = s->mla ? s->d_model : H * s->head_dim;
    int K = s->d_model > kq ? s->d_model : kq;
    double qkv = s->mla ? 0 : (double)(H + 2 * s->n_kv_heads) * s->head_dim * s->d_model;
    double params = qkv + (double)s->d_model * kq + (double)s->vocab * s->d_model;
    double bytes = (qkv + (double)s->d_model * kq) * pl_wf_bytes(x->w.attn) + (double)s->vocab * s->d_model * pl_wf_bytes(x->w.lm_head);
    int rows_qkv = s->mla ? s->d_model : (H + 2 * s->n_kv_heads) * s->head_dim;
    struct cand *c = pl_simple(x, "gemv_x_smem", rows_qkv >= 16384 ? 4 : 2, 1, K, 256, (size_t)K * 4 + 1024,
                            2 * params, bytes, ceil_div(rows_qkv, 16));
    c->regs = 128;
    if (x->w.attn == WEIGHT_NVFP4 && s->d_model % 128 == 0 && kq % 128 == 0) {
        /* gemv_mma: a warp's 8 weight rows as the mma B operand, x hi/lo as A, K split over the
         * block's warps until every SM has a block, the first weight groups loaded before the PDL
         * wait. After the wait the CUDA-core GEMV is bound by instruction issue (~5 a weight),
         * this one needs ~2.5. 2-8 rows share each mma (the plan's dispatch table). */
        c = pl_cand_add(x, "gemv_decode_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
        c->portable = false;
        c->tm = 1, c->tn = 8, c->tk = 32, c->threads = 256, c->regs = 128, c->stages = 0;
        c->smem = (size_t)K * 4;
        c->streaming = true;
        pl_cand_part(c, 16.0 / 2 * params, bytes, 0, ceil_div(rows_qkv, 8));
    }
    c = pl_simple(x, "gemm_fp32_tiled", 16, 64, 32, 256, 0, 2 * params, bytes, ceil_div(rows_qkv, 64));
    c->portable = true;
    /* programmatic dependent launch (caps "pdl"): the next kernel's blocks start once this one's
     * arithmetic is done and load their weights while it drains (measured +6% at batch 1) */
    const char *pdl = x->p->caps.pdl ? "; PDL: next kernel starts early" : "; no PDL on this device";
    char note[256];
    snprintf(note, sizeof note,
             "one token: every weight read once; x (K = %d floats) staged in smem, all loads issued "
             "first%s", K, pdl);
    enum status st = pl_choose(x, "linear_decode", x->w.attn, note, err);
    if (st || s->n_experts <= 0)
        return st;
    /* MoE at few tokens: each (token, slot) pair streams its expert, no sort; gate/up stage x (D
     * floats), down stages the 8 warps' activations (8 x I floats). tile_m = gate/up rows per warp,
     * tile_n = down rows per warp (2 and 4: more spill at two blocks per SM). */
    size_t smem = (size_t)(s->d_model > 8 * s->d_expert ? s->d_model : 8 * s->d_expert) * 4 + 2048;
    double k = s->n_experts_used, eb = pl_wf_bytes(x->w.experts) * 3.0 * s->d_model * s->d_expert;
    c = pl_simple(x, "moe_pair_decode", 2, 4, s->d_model, 256, smem, 6.0 * k * s->d_model * s->d_expert, k * eb,
               k * ceil_div(s->d_expert, 16));
    c->regs = 124;
    if (x->w.experts == WEIGHT_NVFP4 && s->d_model % 128 == 0 && s->d_expert % 128 == 0) {
        /* a warp's 8 weight rows as the mma B operand, x hi/lo as A: the lanes only build bf16
         * pairs (~2.4 instead of ~4.6 instructions a weight). Tile: 8 rows a warp (tile_n),
         * gate/up 4 + 4 (tile_m), k 32 a lane step, 8 groups of 128 k in flight a warp, hence
         * up to 127 registers (down). */
        c = pl_cand_add(x, "moe_pair_decode_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
        c->portable = false;
        c->tm = 4, c->tn = 8, c->tk = 32, c->threads = 256, c->regs = 127, c->stages = 0;
        c->smem = (size_t)(s->d_model > 8 * s->d_expert ? s->d_model : 8 * s->d_expert) * 4;
        /* From 2 tokens the backend runs the form whose weights go through shared memory by
         * cp.async where it fits the budget: that form's bytes, as the kernel table states them
         * (kernel_desc.shape_smem), are what the op needs then. */
        const struct kernel_desc *kd =
            x->req->kernels ? kernel_table_find(x->req->kernels, "moe_pair_decode_mma_bf16") : NULL;
        const struct kernel_shape ks = {.format = WEIGHT_NVFP4, .tokens = 2, .n_weights = 1, .d_model = s->d_model,
                                        .d_expert = s->d_expert, .n_used = s->n_experts_used,
                                        .n_experts = s->n_experts};
        const size_t sm = kd && kd->shape_smem ? kd->shape_smem(&ks, x->p->smem_budget, x->caps->sm_count) : 0;
        if (sm) {
            c->smem = sm > c->smem ? sm : c->smem;
            c->regs = 75;
        }
        c->streaming = true;
        /* 16 flops a weight on the tensor core (n = 8 columns, 2 of them used); the lanes' work
         * counted as fp32 flops would overstate it: the bytes decide */
        pl_cand_part(c, 16.0 / 2 * k * 3.0 * s->d_model * s->d_expert, k * eb, 0, k * ceil_div(s->d_expert, 4));
    }
    c = pl_simple(x, "moe_experts_gemm_sorted", 16, 64, 32, 256, 0, 6.0 * k * s->d_model * s->d_expert, k * eb,
               k * ceil_div(s->d_expert, 64));
    c->portable = true;
    /* from 2 tokens the NVFP4 pair kernels copy their weights into shared memory (cp.async)
     * instead of registers: more blocks resident (faster from 2 tokens, slower at 1: H200,
     * docs/lab/journal.md) */
    snprintf(note, sizeof note,
             "<= %d tokens (<= 2 pairs an expert, <= 1 GB re-read): each (token, expert) pair streams its rows, no sort; "
             "routing one warp per token; %.1f MB of experts per token and layer; from 2 tokens NVFP4 "
             "weights via shared memory (cp.async)%s",
             plan_moe_pair_max_tokens(s->n_experts, s->n_experts_used, eb), k * eb / 1e6, pdl);
    return pl_choose(x, "moe_experts_decode", x->w.experts, note, err);
}
