/* plan_attention.c — attention prefill and decode tiles, the decode split count, MLA and the DSA indexer (plan_internal.h; the cost model: planner.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "plan/plan_internal.h"

/* ---- attention ---- */

enum status pl_attention_prefill(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    static const int TM[] = {128, 64}, TN[] = {128, 64, 32}, TP[] = {32, 16, 8};
    int T = s->prefill_tokens, H = s->n_heads, D = s->qk_head_dim, Dv = s->v_head_dim;
    int kvh = s->mla ? H : s->n_kv_heads; /* MLA prefill materialises per-head K and V */
    double bytes = (double)T * H * D * 2 + (double)T * kvh * (D + Dv) * 2 + (double)T * H * Dv * 2;
    for (int fam = 0; fam < 3; fam++) {
        const int *tms = fam == 2 ? TP : TM, *tns = fam == 2 ? TP : TN;
        int ntm = fam == 2 ? 3 : 2, ntn = fam == 0 ? 2 : 3;
        for (int a = 0; a < ntm; a++)
            for (int b = 0; b < ntn; b++)
                for (int st = 3; st >= 0; st--) {
                    int tm = tms[a], tn = tns[b];
                    struct cand *c;
                    if (fam == 0) {
                        if (st < 2)
                            continue;
                        c = pl_cand_add(x, "attn_prefill_wgmma_bf16", PLAN_MATH_BF16_WGMMA,
                                     FEAT_WGMMA | FEAT_TMA);
                        c->threads = 128 * (tm / 64 + 1);
                        c->regs = Dv / 2 + tn / 2 + 32;
                        c->feed = SMEM_BYTES_PER_CLK * 64; /* 64 query rows share each K/V byte read */
                    } else if (fam == 1) {
                        if (st < 1 || st > 2)
                            continue;
                        c = pl_cand_add(x, "attn_prefill_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
                        c->threads = tm / 16 * 32;
                        c->regs = Dv / 2 + tn / 2 + D / 4 + 32;
                        c->feed = SMEM_BYTES_PER_CLK * 16; /* each warp's 16 rows */
                    } else {
                        if (st > 2)
                            continue;
                        c = pl_cand_add(x, "attn_prefill_fp32", PLAN_MATH_FP32_FMA, 0);
                        c->threads = 128;
                        c->regs = 64;
                        c->feed = SMEM_BYTES_PER_CLK * 4 * (st ? 1.0 : 0.5);
                    }
                    c->tm = tm, c->tn = tn, c->tk = D, c->stages = st;
                    c->smem = 2 * ((size_t)tm * D + (size_t)st * tn * (D + Dv));
                    if (fam == 2)
                        c->smem = st ? c->smem + (size_t)tm * tn * 4 : 0;
                    if (fam == 1) /* cuda_attention_mma_smem(): see the formula above */
                        c->smem = 4 * ((size_t)tm * D + (size_t)st * tn * (D + Dv)) + 16 * (size_t)tm;
                    /* causal: query tile i sees keys up to its last row, whole key tiles */
                    double keys = 0;
                    for (int q0 = 0; q0 < T; q0 += tm)
                        keys += tm * ceil_div(imin(q0 + tm, T), tn) * tn;
                    double flops = 2.0 * H * (D + Dv) * keys;
                    pl_cand_part(c, flops, bytes, flops / tm, ceil_div(T, tm) * H); /* K/V bf16 per q tile */
                }
    }
    char note[128];
    snprintf(note, sizeof note, "qk dim %d, v dim %d", D, Dv);
    return pl_choose(x, "attention_prefill", WEIGHT_BF16, note, err);
}

int plan_attention_splits(int sm_count, double blocks, double max_splits)
{
    double want = ceil_div(2.0 * sm_count, blocks > 0 ? blocks : 1);
    double most = fmin(max_splits, PLAN_ATTN_MAX_SPLITS);
    return (int)fmax(1, fmin(want, most));
}

/* the planner's form: at most one split per tile_n keys of the context */
static int decode_splits(int sms, double base_blocks, int ctx, int tn)
{
    return plan_attention_splits(sms, base_blocks, ceil_div(ctx, tn > 0 ? tn : 1));
}

enum status pl_attention_decode(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    int B = s->decode_batch, ctx = s->decode_ctx, Dk = s->decode_k_dim, Dv = s->decode_v_dim;
    int kvh = s->mla ? 1 : s->n_kv_heads, g = s->n_heads / kvh;
    int dkv = s->mla ? Dk : Dk + Dv;
    static const int TM_MMA[] = {64, 32, 16}, TM_FP32[] = {16, 8, 4, 1}, TN_MMA[] = {128, 64, 32},
                     TN_FP32[] = {64, 32, 16};
    /* GQA with head_dim <= 128 and <= 16 query heads per KV head: the CUDA backend's split kernel
     * (cuda_attn_decode.cu) has one shape: the group padded to NH = 4, 8 or 16 heads, rounds of 32
     * keys (16 at NH = 16), 128 threads, static smem for scores, the warps' partial outputs and the
     * in-kernel merge; tile_m = NH, tile_n = keys per round. */
    bool split_kernel = !s->mla && g <= 16 && Dk <= 128 && Dk % 4 == 0;
    bool split_fits = false; /* then the backend runs it at every split decode: no other family */
    if (split_kernel) {
        int nh = g <= 4 ? 4 : g <= 8 ? 8 : 16, round = nh >= 16 ? 16 : 32;
        struct cand *c = pl_cand_add(x, "attn_decode_split_fp32", PLAN_MATH_FP32_FMA, 0);
        c->threads = 128;
        c->regs = 246;
        c->tm = nh, c->tn = round, c->tk = Dk, c->stages = 1;
        c->smem = (size_t)nh * round * 4 + (size_t)nh * 5 * 4 + (size_t)4 * nh * 32 * 16 + (size_t)64 * nh * 4 + 4;
        /* with clusters the 7 other splits of a cluster push their partial outputs and (max, sum)
         * into the leader's dynamic shared memory where the budget holds them (else the leader
         * pulls them: static only); cuda_attn_decode.cu adec_push_smem */
        size_t push = x->caps->clusters ? (size_t)7 * (size_t)g * ((size_t)Dk * 4 + 8) : 0;
        if (push && c->smem + push <= x->p->smem_budget)
            c->smem += push;
        split_fits = c->smem <= x->p->smem_budget;
        c->streaming = true; /* every lane's K/V loads of a round are issued at once */
        double base = (double)B * kvh;
        c->split_k = decode_splits(x->caps->sm_count, base, ctx, round);
        double cache = (double)B * ctx * kvh * dkv * 2;
        pl_cand_part(c, 2.0 * B * kvh * nh * (double)ctx * (Dk + Dv), cache + (double)B * s->n_heads * (Dk + Dv) * 4,
                  cache, base * c->split_k);
    }
    /* fam 0 (bf16 mma tiles) only where the split kernel does not take the shape: the backend
     * has no tensor-core split decode kernel for GQA, and at splits == 1 (many sequences) it runs
     * attention_prefill's kernel; listing it beside the split kernel made the plan name a kernel
     * that never ran at decode (sessions 3-8) */
    for (int fam = split_fits ? 1 : 0; fam < 2; fam++) {
        const int *tms = fam ? TM_FP32 : TM_MMA, *tns = fam ? TN_FP32 : TN_MMA;
        int ntm = fam ? 4 : 3;
        for (int a = 0; a < ntm; a++) {
            /* no taller tile than the head group needs: mma rows come in 16s, fp32 rows are clipped */
            int tm = fam ? imin(tms[a], g) : tms[a];
            if (!fam && tm > 16 && tm >= 2 * g)
                continue;
            if (fam && a > 0 && tm == imin(tms[a - 1], g))
                continue;
            for (int b = 0; b < 3; b++)
                for (int st = 4; st >= 0; st--) {
                    int tn = tns[b];
                    struct cand *c;
                    if (!fam) {
                        if (st < 2)
                            continue;
                        c = pl_cand_add(x, "attn_decode_split_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
                        c->threads = 128;
                        c->regs = tm * Dv / c->threads + tm * tn / c->threads + 40;
                    } else {
                        /* with the split kernel above, only the unstaged form stays: what a budget
                         * too small for the kernel's shared memory still runs */
                        if (st > 2 || (split_kernel && st > 0))
                            continue;
                        c = pl_cand_add(x, "attn_decode_split_fp32", PLAN_MATH_FP32_FMA, 0);
                        c->threads = 128;
                        c->regs = 64;
                    }
                    c->tm = tm, c->tn = tn, c->tk = Dk, c->stages = st;
                    c->smem = 2 * ((size_t)tm * Dk + (size_t)st * tn * dkv);
                    if (fam && !st)
                        c->smem = 0;
                    double intensity = (double)tm * (Dk + Dv) / dkv; /* FLOP per cached byte x 2 */
                    c->feed = SMEM_BYTES_PER_CLK * intensity * (st ? 1.0 : 0.5);
                    double head_blocks = ceil_div(g, tm), base = (double)B * kvh * head_blocks;
                    c->split_k = decode_splits(x->caps->sm_count, base, ctx, tn);
                    double flops = 2.0 * B * kvh * head_blocks * tm * (double)ctx * (Dk + Dv);
                    double cache = (double)B * ctx * kvh * dkv * 2;
                    double bytes = cache + (double)B * s->n_heads * (Dk + Dv) * 2 * 2;
                    pl_cand_part(c, flops, bytes, cache * head_blocks, base * c->split_k);
                }
        }
    }
    char note[256];
    snprintf(note, sizeof note, "%d query heads per kv head, k dim %d, v dim %d; split-K over %d keys%s", g,
             Dk, Dv, ctx,
             split_kernel && x->caps->clusters
                 ? "; splits merged 8 at a time in a cluster's shared memory (pushed "
                   "to the cluster's first block where the budget holds them)"
                 : "");
    return pl_choose(x, "attention_decode", WEIGHT_BF16, note, err);
}

int plan_decode_splits(const struct plan *p, int n_seqs, int max_ctx)
{
    const struct op_plan *o = plan_find(p, "attention_decode");
    if (!o || o->tile_m <= 0 || n_seqs <= 0)
        return 1;
    const struct plan_shapes *s = &p->shapes;
    int kvh = s->mla ? 1 : s->n_kv_heads, g = s->n_heads / (kvh > 0 ? kvh : 1);
    double base = (double)n_seqs * kvh * ceil_div(g, o->tile_m);
    return decode_splits(p->caps.sm_count, base, max_ctx, o->tile_n);
}

/* Pair by pair re-reads an expert for each of its pairs, the sorted GEMM reads it once but pads
 * each expert's rows to a tile and sorts first: at 2 pairs an expert the two cost about the same
 * (H200, Qwen3-30B-A3B NVFP4: batch 32 1225.3 vs 1201.1 tok/s, batch 9 864.7 vs 529.9;
 * docs/lab/journal.md). Rounded down to a bucket's end so that one plan entry holds. */
double plan_moe_rows_per_expert(int n_experts, int n_used, int n_tokens)
{
    if (n_experts <= 0 || n_used <= 0 || n_tokens <= 0)
        return 0.0;
    const double pairs = (double)n_tokens * n_used;
    const double distinct = n_experts * (1.0 - pow(1.0 - (double)n_used / n_experts, n_tokens));
    return distinct > 0.0 ? pairs / distinct : pairs;
}

int plan_moe_pair_max_tokens(int n_experts, int n_used, double expert_bytes)
{
    int t = n_used > 0 ? 2 * n_experts / n_used : 8;
    t = t >= 64 ? 64 : t >= 32 ? 32 : 8;
    /* while the pairs re-read fewer expert bytes than the sorted GEMM's overhead is worth */
    while (t > 8) {
        double pairs = (double)t * n_used;
        double distinct = n_experts * (1.0 - pow(1.0 - (double)n_used / n_experts, t)); /* uniform routing */
        if ((pairs - distinct) * expert_bytes <= PLAN_MOE_PAIR_REREAD_BYTES)
            break;
        t = t > 32 ? 32 : 8;
    }
    return t;
}

/* ---- MLA + DSA (glm_moe_dsa) ---- */

/* GLM-5's dims stand in when the plan has no MLA model (a backend plans before it knows
 * the model; its kernels fit the tile to the real dims at launch). */
struct mla_ref {
    int heads, kv_rank, rope, idx_heads, idx_dim, topk;
};

static void mla_ref_dims(const struct plan_ctx *x, struct mla_ref *r)
{
    const struct plan_shapes *s = &x->p->shapes;
    *r = (struct mla_ref){.heads = 64, .kv_rank = 512, .rope = 64, .idx_heads = 32, .idx_dim = 128, .topk = 2048};
    if (x->req->shapes && s->mla) {
        r->heads = s->n_heads, r->kv_rank = s->kv_lora_rank, r->rope = s->qk_rope_dim;
        r->idx_heads = s->index_n_heads, r->idx_dim = s->index_head_dim, r->topk = s->index_topk;
    }
}

size_t plan_mla_attention_smem(int rows, int keys, int threads, int k_dim, int v_dim, int stages)
{
    size_t warps = (size_t)(threads / 32), r = (size_t)rows, k = (size_t)keys;
    if (stages <= 0) /* queries, keys and the accumulators stay in global memory: scores and key slots */
        return 4 * (warps * k + 2 * r + k);
    return 4 * (r * (size_t)(k_dim + v_dim) + k * (size_t)(k_dim + 1) + warps * k + 2 * r);
}

size_t plan_dsa_warp_smem(int warps, int idx_heads, int idx_dim)
{
    return 4 * ((size_t)idx_heads * (size_t)(idx_dim + 1) + (size_t)idx_heads +
                (size_t)warps * (size_t)(idx_dim + idx_heads));
}

bool plan_mla_proj_gemm(int n_tokens, enum weight_format kv_b)
{
    return n_tokens >= PLAN_MLA_PROJ_GEMM_MIN_TOKENS && (kv_b == WEIGHT_NVFP4 || kv_b == WEIGHT_BF16);
}

bool plan_mla_proj_mma(const struct plan *p)
{
    const struct op_plan *o = plan_find(p, "mla_proj");
    return o && !strcmp(o->kernel, "mla_proj_mma_bf16");
}

int plan_mla_mma_ld(int k_dim)
{
    return (k_dim + 15) / 16 * 16 + 8;
}

size_t plan_mla_mma_smem(int rows, int keys, int k_dim, int stages)
{
    const size_t tiles = (size_t)(stages > 1 ? 2 : 1) * (size_t)keys;
    return 2 * (size_t)plan_mla_mma_ld(k_dim) * (2 * (size_t)rows + tiles) +
           4 * tiles * (size_t)PLAN_MLA_MMA_SCALE_BLOCKS(k_dim) +
           4 * (size_t)rows * (size_t)keys * (PLAN_MLA_MMA_PARTS - 1);
}

size_t plan_mla_wgmma_smem(int k_dim)
{
    return 2 * 2 * (size_t)PLAN_MLA_WGMMA_ROWS * (size_t)k_dim + 2 * 2 * (size_t)PLAN_MLA_WGMMA_KEYS * (size_t)k_dim +
           4 * 16 * 128 + 4 * 2 * (size_t)PLAN_MLA_WGMMA_KEYS * (size_t)PLAN_MLA_MMA_SCALE_BLOCKS(k_dim);
}

size_t plan_dsa_index_smem(int keys, int idx_heads, int idx_dim, int stages)
{
    if (stages <= 0)
        return 0;
    return 4 * ((size_t)idx_heads * (size_t)idx_dim + (size_t)idx_heads + (size_t)keys * (size_t)(idx_dim + 1));
}

/* ---- the dense MLA pass: absorbed or expanded ---- */

struct mla_pass_dims {
    double H, R, rope, nope, v, hd; /* hd: the expanded K/V head dim (cuda_mla_expand.c) */
};

static struct mla_pass_dims mla_pass_dims_of(const struct plan_shapes *s, const struct mla_ref *r)
{
    struct mla_pass_dims m = {.H = r->heads, .R = r->kv_rank, .rope = r->rope, .nope = 192, .v = 256};
    if (s->mla && s->qk_nope_dim > 0)
        m.nope = s->qk_nope_dim, m.v = s->v_head_dim;
    double d = fmax(m.nope + m.rope, m.v);
    m.hd = d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : ceil(d / 32) * 32;
    return m;
}

/* Flops and bytes of one dense MLA pass of T query rows of one prompt over its K >= T keys (a
 * cached prefix of K - T), each product of hi + lo bf16 operands counted as the kernels run it.
 * Absorbed: q through W_uk and the output through W_uv per row (kv_b, 2 x hi + lo), every head
 * on the latent row (S and P V: 2 products each, mla_latent_attn_mma_bf16), the latent rows read
 * once and each row's q_abs and o_lat written and read back in f32. Expanded: kv_b per KEY instead of per row, then attention of
 * head dim hd (S: 3 products, P V: 4, attn_prefill_mma_bf16) over K/V written once in f32. */
static void mla_pass_work(const struct mla_pass_dims *m, double T, double K, bool expanded, double *flops,
                          double *bytes)
{
    const double pairs = T * (K - T) + T * (T + 1) / 2, kv_b = 2.0 * 2.0 * m->R * m->H * (m->nope + m->v);
    if (expanded) {
        *flops = 2.0 * pairs * m->H * m->hd * 7.0 + K * kv_b;
        *bytes = K * (m->R + m->rope) * 2 + K * m->H * (m->nope + m->v) * 4 * 2 + K * m->H * m->hd * 4 * 2 * 2;
    } else {
        *flops = 2.0 * pairs * m->H * (2 * m->R + m->rope) * 2.0 + T * kv_b;
        *bytes = K * (m->R + m->rope) * 2 + T * m->H * (2 * m->R + m->rope) * 4 * 2;
    }
}

static double mla_pass_us(const struct device_caps *caps, const struct mla_pass_dims *m, double T, double K,
                          bool expanded)
{
    double flops, bytes;
    mla_pass_work(m, T, K, expanded, &flops, &bytes);
    double rate = pl_caps_rate_clk(caps, PLAN_MATH_BF16_MMA) * caps->sm_count * pl_caps_clock_hz(caps);
    return (flops / rate + bytes / pl_caps_bw(caps)) * 1e6;
}

bool plan_mla_prefill_expanded(const struct plan *p, int n_tokens, int64_t n_keys)
{
    const struct op_plan *o = plan_find(p, "mla_prefill");
    if (!o || strcmp(o->kernel, "mla_prefill_expanded") != 0)
        return false;
    if (o->forced)
        return true;
    if (n_tokens < o->tile_m)
        return false;
    const struct plan_shapes *s = &p->shapes;
    struct mla_ref r = {.heads = s->n_heads, .kv_rank = s->kv_lora_rank, .rope = s->qk_rope_dim};
    struct mla_pass_dims m = mla_pass_dims_of(s, &r);
    double K = (double)n_keys > n_tokens ? (double)n_keys : n_tokens;
    return mla_pass_us(&p->caps, &m, n_tokens, K, true) < mla_pass_us(&p->caps, &m, n_tokens, K, false);
}

/* mla_prefill: the form of dense MLA passes (every row attends to all its causal keys: prompts
 * up to index_topk tokens under DSA, every pass without it), by mla_pass_work() at the pass's
 * own sizes (plan_mla_prefill_expanded()); the entry is rated at the reference prefill, and
 * tile_m is the shortest fresh prompt the expanded form takes. */
static enum status pl_mla_prefill(struct plan_ctx *x, const struct mla_ref *r, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    struct mla_pass_dims m = mla_pass_dims_of(s, r);
    double T = s->prefill_tokens > 0 ? s->prefill_tokens : 2048;
    static const char *const NAMES[2] = {"mla_prefill_absorbed", "mla_prefill_expanded"};
    for (int e = 0; e < 2; e++) {
        /* the absorbed form is the mla_attention entry's kernel between two kv_b products: it runs
         * everywhere, on tensor cores where there are some */
        enum plan_math math = e || x->caps->bf16_mma ? PLAN_MATH_BF16_MMA : PLAN_MATH_FP32_FMA;
        struct cand *c = pl_cand_add(x, NAMES[e], math, e ? FEAT_BF16_MMA : 0);
        c->threads = 128;
        c->tm = 1, c->tn = 1, c->tk = e ? (int)m.hd : (int)(m.R + m.rope), c->stages = 1;
        double flops, bytes;
        mla_pass_work(&m, T, T, e == 1, &flops, &bytes);
        pl_cand_part(c, flops, bytes, 0, T * m.H);
    }
    int from = 0; /* the shortest fresh prompt (powers of two) the expanded form wins */
    for (int t = 1; t <= 65536 && !from; t *= 2)
        if (mla_pass_us(x->caps, &m, t, t, true) < mla_pass_us(x->caps, &m, t, t, false))
            from = t;
    int with_prefix = 0; /* ... after a cached prefix as long as the prompt */
    for (int t = 1; t <= 65536 && !with_prefix; t *= 2)
        if (mla_pass_us(x->caps, &m, t, 2.0 * t, true) < mla_pass_us(x->caps, &m, t, 2.0 * t, false))
            with_prefix = t;
    char note[192];
    snprintf(note, sizeof note,
             "dense passes: expanded (kv_b per key, attention at head dim %d) from %d fresh tokens, from %d "
             "after an equal cached prefix; absorbed below",
             (int)m.hd, from, with_prefix);
    enum status st = pl_choose(x, "mla_prefill", WEIGHT_BF16, note, err);
    if (st)
        return st;
    /* chosen at the reference prefill; its tile_m: the shortest pass it takes */
    struct op_plan *o = &x->p->ops[x->p->n_ops - 1];
    o->tile_m = !strcmp(o->kernel, "mla_prefill_expanded") ? (from > 0 ? from : (int)T) : 0;
    return STATUS_OK;
}

/* mla_proj: kv_b_proj per head at one decode token, both halves (q_nope through W_uk, the latent
 * output through W_uv). The fp32 kernels decode every weight on CUDA cores (~6 instructions a
 * weight, rated as 12 flops); the tensor-core pair (mla_absorb_mma_kernel, mla_expand_mma_kernel)
 * takes an NVFP4 kv_b as bf16 products, hi + lo activations: two m16n8k16 a 128 weights (64 flops
 * a weight at the mma rate). From PLAN_MLA_PROJ_GEMM_MIN_TOKENS tokens cuBLAS takes the products
 * (plan_mla_proj_gemm()); between, the fp32 kernels read kv_b once per 8 tokens. */
static enum status pl_mla_proj(struct plan_ctx *x, const struct mla_ref *r, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    struct mla_pass_dims m = mla_pass_dims_of(s, r);
    enum weight_format wf = x->p->weights.attn;
    double W = m.H * (m.nope + m.v) * m.R, blocks = m.H * 8;
    struct cand *c;
    if (wf == WEIGHT_NVFP4) { /* the tensor-core pair reads NVFP4 only: other formats have no fast form */
        c = pl_cand_add(x, "mla_proj_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
        c->threads = 256, c->tm = 1, c->tn = 8, c->tk = 128, c->stages = 1;
        c->smem = (size_t)m.nope * (64 + 8) * 2 + (size_t)m.nope * 4; /* the absorb half's slab and query */
        if ((int)m.R % 128 != 0 || (int)m.nope % 16 != 0 || m.nope > 256)
            c->refused = "the tensor-core kv_b kernels need a latent rank of 128s and <= 256 nope dims of 16s";
        pl_cand_part(c, 64.0 * W, W * pl_wf_bytes(wf), 0, blocks);
    }
    c = pl_cand_add(x, "mla_proj_fp32", PLAN_MATH_FP32_FMA, 0);
    c->threads = 256, c->tm = 1, c->tn = 4, c->tk = (int)m.R, c->stages = 1;
    c->smem = (size_t)m.R * 4;
    pl_cand_part(c, 12.0 * W, W * pl_wf_bytes(wf), 0, blocks);
    char note[160];
    snprintf(note, sizeof note, "kv_b at one token (%d heads x %d rows x %d); 2-%d tokens: fp32, from %d: cuBLAS",
             (int)m.H, (int)(m.nope + m.v), (int)m.R, PLAN_MLA_PROJ_GEMM_MIN_TOKENS - 1,
             PLAN_MLA_PROJ_GEMM_MIN_TOKENS);
    return pl_choose(x, "mla_proj", wf, note, err);
}

/* mla_attention: attention in latent space over the cached [c_kv | k_r] rows (the query
 * absorbed through W_uk, values = the c_kv part of the same rows): one token's tile_m heads
 * per block share every staged key; split-K over the selected keys. dsa_index: the indexer's
 * scores, one key per thread (tile_n keys per block), then a radix top-k per query. */
enum status pl_mla_dsa(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    if (x->req->shapes && !s->mla)
        return STATUS_OK;
    struct mla_ref r;
    mla_ref_dims(x, &r);
    int Dk = r.kv_rank + r.rope, R = r.kv_rank, B = s->decode_batch;
    int keys_q = imin(s->decode_ctx, r.topk); /* keys each decode query attends to */
    static const int TM[] = {64, 32, 16, 8, 4, 2, 1}, TN[] = {64, 32, 16, 8};
    for (int a = 0; a < 7; a++) {
        int tm = imin(TM[a], r.heads);
        if (a > 0 && tm == imin(TM[a - 1], r.heads))
            continue;
        for (int b = 0; b < 4; b++)
            for (int st = 1; st >= 0; st--) {
                int tn = TN[b];
                struct cand *c = pl_cand_add(x, "mla_latent_attn_fp32", PLAN_MATH_FP32_FMA, 0);
                c->threads = 128;
                c->regs = 64;
                c->tm = tm, c->tn = tn, c->tk = Dk, c->stages = st;
                c->smem = plan_mla_attention_smem(tm, tn, c->threads, Dk, R, st);
                /* each staged key serves tm heads; unstaged, every operand comes through L1 */
                c->feed = SMEM_BYTES_PER_CLK * 4 * tm / (double)(tm + 1) * (st ? 1.0 : 0.5);
                double head_blocks = ceil_div(r.heads, tm), base = (double)B * head_blocks;
                c->split_k = decode_splits(x->caps->sm_count, base, keys_q, tn);
                double flops = 2.0 * B * r.heads * (double)keys_q * (Dk + R);
                double cache = (double)B * keys_q * Dk * 4;
                pl_cand_part(c, flops, cache + (double)B * r.heads * (Dk + R) * 4, cache * head_blocks,
                          base * c->split_k);
            }
    }
    /* the tensor-core form needs a bf16 (the default) or fp8 cache and mma-shaped dims: 16 heads a
     * row group of PARTS warps, 8-value loads, value quarters of whole 8-column tiles; 32 rows at
     * most (256 threads: the S and O registers of 64 rows' 512 would not fit 128 a thread)
     * (cuda_mla_mma_fits()) */
    bool mma_cache = !x->req->shapes || s->latent_mma;
    if (mma_cache && Dk % 8 == 0 && R % (8 * PLAN_MLA_MMA_PARTS) == 0 && R <= 512 && Dk > R) {
        static const int MM_TM[] = {32, 16}, MM_TN[] = {64, 32, 16};
        int heads16 = (r.heads + 15) / 16 * 16;
        for (int a = 0; a < 2; a++) {
            int tm = MM_TM[a];
            if (tm > heads16 && tm > 16)
                continue; /* no taller tile than the heads need */
            for (int b = 0; b < 3; b++)
                for (int st = 2; st >= 1; st--) {
                    int tn = MM_TN[b];
                    struct cand *c = pl_cand_add(x, "mla_latent_attn_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
                    c->threads = tm / 16 * 32 * PLAN_MLA_MMA_PARTS;
                    c->regs = R / 8 + tn + 40; /* a warp's O quarter, S, addresses */
                    c->tm = tm, c->tn = tn, c->tk = Dk, c->stages = st;
                    c->smem = plan_mla_mma_smem(tm, tn, Dk, st);
                    /* each staged key serves tm heads, hi + lo query and weights: 2 MMAs a product;
                     * a warp waits on its own ldmatrix -> mma chain, so fewer than 8 warps resident
                     * an SM leave the tensor cores idle (H200, 32x64 x2 stages = 4 warps an SM: a
                     * 64-key tile of 32 heads took ~21 us at batch 64) */
                    double resident = (double)(c->threads / 32) *
                                      floor((double)x->caps->smem_per_sm / (double)(c->smem + 1024));
                    c->feed = SMEM_BYTES_PER_CLK * tm / 2.0 * (st > 1 ? 1.0 : 0.7) * fmin(1.0, resident / 8.0);
                    double head_blocks = ceil_div(r.heads, tm), base = (double)B * head_blocks;
                    c->split_k = decode_splits(x->caps->sm_count, base, keys_q, tn);
                    double flops = 2.0 * 2.0 * B * head_blocks * tm * (double)keys_q * (Dk + R);
                    double cache = (double)B * keys_q * Dk * 2;
                    pl_cand_part(c, flops, cache + (double)B * r.heads * (Dk + R) * 4, cache * head_blocks,
                                 base * c->split_k);
                }
        }
    }
    /* the wgmma form (cuda_mla_wgmma.cu): 64 head rows a block, so each staged key serves all of a
     * token's heads (GLM-5's 64) once; two warpgroups, 225 KB of shared memory (sm_90's budget);
     * one latent shape (PLAN_MLA_WGMMA_DK, _R) */
    if (mma_cache && Dk == PLAN_MLA_WGMMA_DK && R == PLAN_MLA_WGMMA_R) {
        struct cand *c = pl_cand_add(x, "mla_latent_attn_wgmma_bf16", PLAN_MATH_BF16_WGMMA, FEAT_WGMMA);
        c->threads = 256;
        c->regs = 200; /* O: 128 a thread, S, P's fragments */
        c->tm = PLAN_MLA_WGMMA_ROWS, c->tn = PLAN_MLA_WGMMA_KEYS, c->tk = Dk, c->stages = 2;
        c->smem = plan_mla_wgmma_smem(Dk);
        /* each staged key serves 64 heads, hi + lo: 2 products a multiply-add; one block an SM,
         * its S and P V each waited for (no other block's work under them) */
        c->feed = SMEM_BYTES_PER_CLK * PLAN_MLA_WGMMA_ROWS / 2.0 * 0.7;
        double head_blocks = ceil_div(r.heads, PLAN_MLA_WGMMA_ROWS), base = (double)B * head_blocks;
        c->split_k = decode_splits(x->caps->sm_count, base, keys_q, PLAN_MLA_WGMMA_KEYS);
        double flops = 2.0 * 2.0 * B * head_blocks * PLAN_MLA_WGMMA_ROWS * (double)keys_q * (Dk + R);
        double cache = (double)B * keys_q * Dk * 2;
        pl_cand_part(c, flops, cache + (double)B * r.heads * (Dk + R) * 4, cache * head_blocks, base * c->split_k);
    }
    char note[192];
    snprintf(note, sizeof note, "%d heads on one latent row of %d (values: its first %d); %d keys per query; %s cache",
             r.heads, Dk, R, keys_q, mma_cache ? "bf16 or fp8" : "f32");
    enum status st = pl_choose(x, "mla_attention", WEIGHT_BF16, note, err);
    if (st)
        return st;

    st = pl_mla_prefill(x, &r, err);
    if (st)
        return st;
    st = pl_mla_proj(x, &r, err);
    if (st)
        return st;

    static const int KN[] = {512, 256, 128, 64, 32};
    double T = s->prefill_tokens, ctx = s->decode_ctx;
    if (r.idx_heads <= 32 && r.idx_dim % 16 == 0 && r.idx_dim >= 16 && r.idx_dim <= 128) {
        /* the query's heads as A (one or two 16-row tiles), 8 keys as B, streamed from global memory
         * into fragments (cuda_dsa_mma.cu): hi + lo query = 2 MMAs a product (3 on f32 keys) */
        struct cand *c = pl_cand_add(x, "dsa_index_score_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
        c->threads = 128;
        c->regs = 128; /* 4 tiles of keys in flight a warp; the query's fragments in shared memory */
        const int heads16 = r.idx_heads <= 16 ? 16 : 32;
        c->tm = heads16, c->tn = 32, c->tk = r.idx_dim, c->stages = 1;
        c->smem = PLAN_DSA_MMA_SMEM(heads16);
        c->streaming = true; /* each warp's loads overlap the other warps' MMAs */
        double pairs = T * ctx / 2;
        /* the keys take the cache's type (kv_cache_index_dtype()): rated as f32, the largest */
        double flops = 2.0 * 3.0 * pairs * heads16 * r.idx_dim;
        pl_cand_part(c, flops, ctx * r.idx_dim * 4 + T * ctx * 4, pairs * r.idx_dim * 4,
                     T * ceil_div(ctx / 2, 32));
    }
    {
        /* a warp per key, a lane per head: 32 dot products at once where the key-per-thread kernel
         * runs one per thread after another, and ctx / 8 blocks at decode where that one has
         * ctx / tile_n. Its tile: a lane per head (tile_m) x 8 keys a block. Listed first: the
         * model (prefill, smem-feed bound) rates the two alike, and a tie keeps the first. */
        struct cand *c = pl_cand_add(x, "dsa_index_score_warp_fp32", PLAN_MATH_FP32_FMA, 0);
        c->threads = 256;
        c->regs = 40;
        c->tm = imin(r.idx_heads, 32), c->tn = 8, c->tk = r.idx_dim, c->stages = 1; /* lanes = heads */
        c->smem = plan_dsa_warp_smem(8, r.idx_heads, r.idx_dim);
        c->feed = SMEM_BYTES_PER_CLK * 2.0;
        double pairs = T * ctx / 2;
        double flops = 2.0 * pairs * r.idx_heads * r.idx_dim;
        /* the key row a warp loads serves its 32 heads (the other kernel: its block's tile_n queries) */
        pl_cand_part(c, flops, ctx * r.idx_dim * 4 + T * ctx * 4, pairs * r.idx_dim * 4 / 256, T * ceil_div(ctx / 2, 8));
    }
    for (int b = 0; b < 10; b++) {
        int st = b < 5 ? 1 : 0;
        struct cand *c = pl_cand_add(x, "dsa_index_score_fp32", PLAN_MATH_FP32_FMA, 0);
        c->threads = KN[b % 5];
        c->regs = 48;
        c->tm = 1, c->tn = KN[b % 5], c->tk = r.idx_dim, c->stages = st;
        c->smem = plan_dsa_index_smem(c->tn, r.idx_heads, r.idx_dim, st);
        /* q broadcast + the thread's own key: ~2 FLOP per smem byte; unstaged through L1 */
        c->feed = SMEM_BYTES_PER_CLK * (st ? 2.0 : 1.0);
        /* prefill: every query scores its causal keys (half the square on average) */
        double pairs = T * ctx / 2;
        double flops = 2.0 * pairs * r.idx_heads * r.idx_dim;
        pl_cand_part(c, flops, ctx * r.idx_dim * 4 + T * ctx * 4, pairs * r.idx_dim * 4 / c->tn,
                  T * ceil_div(ctx / 2, c->tn));
    }
    snprintf(note, sizeof note, "%d indexer heads x %d dims; radix top-%d per query (1024 threads, 1 KiB smem)",
             r.idx_heads, r.idx_dim, r.topk);
    return pl_choose(x, "dsa_index", WEIGHT_BF16, note, err);
}

int plan_prefill_chunk_tokens(int n_experts, int n_used)
{
    long t = n_experts > 0 && n_used > 0 ? (long)PLAN_PREFILL_ROWS_PER_EXPERT * n_experts / n_used
                                         : PLAN_PREFILL_DENSE_TOKENS;
    t = (t + 255) / 256 * 256;
    return (int)(t < PLAN_PREFILL_MIN_TOKENS ? PLAN_PREFILL_MIN_TOKENS : t > PLAN_PREFILL_MAX_TOKENS ? PLAN_PREFILL_MAX_TOKENS : t);
}
