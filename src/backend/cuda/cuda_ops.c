/* cuda_ops.c — every op of the CUDA backend besides the linears and the routed experts: norms,
 * RoPE, the KV cache, attention (the plan's tiles, split over keys when the blocks would not fill
 * the SMs), routing, MLA and DSA, argmax and sampling (see cuda_backend_internal.h). */
#include "backend/cuda/cuda_backend_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "plan/plan.h"

/* ---------------------------------------------------------------- ops */

void cu_embed(struct backend *be, const struct weight *table, const int32_t *tokens, int n, float *out)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (table->format != WEIGHT_F32 && table->format != WEIGHT_BF16 && table->format != WEIGHT_F16)
        PANIC("embedding in format %s", weight_format_name(table->format)); /* model_weights refuses these */
    CHECK(c, cuda_embed(c->stream, table->format, table->data, table->cols, tokens, n, out));
}

void cu_attn_prep(struct backend *be, float *q, float *k, const float *v, int n_tokens, int n_heads,
                         const float *q_norm, const float *k_norm, float eps, const struct rope_args *rope,
                         const int32_t *pos, const struct paged_kv *kv, const int32_t *slots)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_attn_prep(c->stream, q, k, v, n_tokens, n_heads, kv->n_kv_heads, kv->head_dim, q_norm, k_norm,
                            eps, rope, pos, kv, slots, c->pdl));
}

void cu_argmax(struct backend *be, const float *logits, int rows, int vocab, int32_t *ids)
{
    struct cuda_backend *c = cuda_ctx(be);
    /* rows split over blocks (scratch for the partials, a counter a row); NULL (no memory, or a
     * capture that would have to grow them and is spoilt instead): one block a row */
    void *work = cuda_scratch_get(c, cuda_argmax_workspace_bytes(rows, vocab));
    int *sem = work ? cuda_sem_get(c, (size_t)rows) : NULL;
    CHECK(c, cuda_argmax(c->stream, logits, rows, vocab, ids, work, sem));
}

void cu_sample(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
               const uint32_t *masks, int32_t *ids)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_sample(c->stream, logits, rows, vocab, params, masks, ids));
}

void cu_logprobs(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
                 const uint32_t *masks, const int32_t *ids, int k, float *lp, int32_t *top_ids, float *top_lp)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_logprobs(c->stream, logits, rows, vocab, params, masks, ids, k, lp, top_ids, top_lp));
}

void cu_logits_edit(struct backend *be, float *logits, int rows, int vocab, const int32_t *start,
                    const struct logit_edit *edits)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_logits_edit(c->stream, logits, rows, vocab, start, edits));
}

void cu_rmsnorm(struct backend *be, const float *x, const float *w, int rows, int dim, float eps,
                       float *y)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_rmsnorm(c->stream, x, w, rows, dim, eps, y, c->pdl));
}

void cu_add_rmsnorm(struct backend *be, float *h, const float *delta, const float *w, int rows,
                           int dim, float eps, float *y)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_add_rmsnorm(c->stream, h, delta, w, rows, dim, eps, y, c->pdl));
}

void cu_rope(struct backend *be, float *x, int n_tokens, int n_heads, int head_stride,
                    const struct rope_args *args, const int32_t *pos)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_rope(c->stream, x, n_tokens, n_heads, head_stride, args, pos, c->pdl));
}

void cu_rope_multi(struct backend *be, int n_jobs, const struct rope_job *jobs, int n_tokens,
                   const struct rope_args *args, const int32_t *pos)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_rope_multi(c->stream, n_jobs, jobs, n_tokens, args, pos, c->pdl));
}

void cu_kv_store(struct backend *be, const struct paged_kv *kv, const float *k, const float *v,
                        int n_tokens, const int32_t *slots)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_kv_store(c->stream, kv, k, v, n_tokens, slots));
}

static int ceil_div(int64_t a, int64_t b)
{
    int64_t r = (a + b - 1) / b;
    return r > INT_MAX ? INT_MAX : (int)r;
}

void cu_attention(struct backend *be, const float *q, const struct paged_kv *kv,
                         const struct attn_batch *b, int n_heads, float scale, float *out)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (b->n_tokens <= 0)
        return;
    ASSERT(kv->n_kv_heads > 0 && n_heads % kv->n_kv_heads == 0);
    int hd = kv->head_dim, group = n_heads / kv->n_kv_heads;
    int64_t q_rows = (int64_t)b->n_tokens * group;

    struct cuda_attn_cfg cfg = c->attn_prefill;
    if (!cuda_attention_fit(&cfg, hd, c->smem_budget))
        PANIC("cuda: no attention tile fits head_dim %d in %zu bytes of shared memory", hd, c->smem_budget);
    int blocks = ceil_div(q_rows, cfg.rows) * kv->n_kv_heads;
    int splits = 1;
    if (c->force_splits > 0 || (c->force_splits == 0 && blocks < c->sm_count)) {
        /* few query rows: split the keys so that every SM has work (decode) */
        cfg = c->attn_decode;
        if (cfg.rows <= 0 || cfg.rows > group)
            cfg.rows = group; /* a block never mixes tokens: decode rows are one token's heads */
        if (!cuda_attention_fit(&cfg, hd, c->smem_budget))
            PANIC("cuda: no decode attention tile fits head_dim %d in %zu bytes", hd, c->smem_budget);
        int dblocks = ceil_div(q_rows, cfg.rows) * kv->n_kv_heads;
        splits = plan_attention_splits(c->sm_count, dblocks, PLAN_ATTN_MAX_SPLITS);
        if (c->force_splits > 0)
            splits = c->force_splits < PLAN_ATTN_MAX_SPLITS ? c->force_splits : PLAN_ATTN_MAX_SPLITS;
    }
    struct cuda_attn_mma_cfg mcfg = c->attn_mma;
    if (splits == 1 && mcfg.rows > 0 && cuda_attention_mma_supported(q, kv, out) &&
        cuda_attention_mma_fit(&mcfg, hd, c->smem_budget)) {
        CHECK(c, cuda_attention_mma(c->stream, q, kv, b, n_heads, scale, out, &mcfg));
        return;
    }
    float *work = NULL;
    size_t wf = cuda_attention_workspace_floats(b->n_tokens, n_heads, hd, splits);
    if (wf && !(work = cuda_scratch_get(c, wf * sizeof(float))))
        return;
    if (splits > 1 && !c->legacy_decode && cuda_attn_decode_supported(group, hd, splits, c->smem_budget)) {
        int *sem = cuda_sem_get(c, (size_t)b->n_tokens * (size_t)kv->n_kv_heads);
        /* clusters of CUDA_ATTN_CLUSTER splits merge in shared memory (caps "clusters"); the
         * automatic split count is rounded up to a multiple of it (at most PLAN_ATTN_MAX_SPLITS). Only while one
         * cluster per (token, KV head) fits the SMs: with more cluster blocks than SMs the merge
         * through global memory measured faster (docs/lab/journal.md, the decode attention). */
        int cluster = 1;
        if (c->attn_cluster && (c->force_splits == 0 || splits % CUDA_ATTN_CLUSTER == 0) &&
            (int64_t)b->n_tokens * kv->n_kv_heads * CUDA_ATTN_CLUSTER <= c->sm_count) {
            int sc = ceil_div(splits, CUDA_ATTN_CLUSTER) * CUDA_ATTN_CLUSTER;
            if (sc <= PLAN_ATTN_MAX_SPLITS && cuda_attn_decode_supported(group, hd, sc, c->smem_budget))
                splits = sc, cluster = CUDA_ATTN_CLUSTER;
        }
        /* push: the splits store their partials into the leader's shared memory (one barrier
         * phase), where the budget holds them; pull: the leader loads them (two) */
        bool push = cluster > 1 && c->attn_push && cuda_attn_decode_push_smem(group, hd) <= c->smem_budget;
        if (sem)
            CHECK(c, cuda_attn_decode(c->stream, q, kv, b, n_heads, scale, out, splits, work, sem, c->pdl, cluster,
                                      push));
        return;
    }
    CHECK(c, cuda_attention(c->stream, q, kv, b, n_heads, scale, out, &cfg, splits, work));
}

void cu_silu_mul(struct backend *be, const float *gate, const float *up, int rows, int dim, float *out)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)rows * (size_t)dim, out));
}


void cu_moe_route(struct backend *be, const float *logits, int n_tokens, const struct route_args *args,
                         int32_t *ids, float *weights)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_moe_route(c->stream, logits, n_tokens, args, ids, weights, c->pdl));
}


void cu_moe_mask_ids(struct backend *be, int32_t *ids, size_t n, int lo, int hi)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_moe_mask_ids(c->stream, ids, n, lo, hi));
}

void cu_add(struct backend *be, float *y, const float *x, size_t n)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_add(c->stream, y, x, n));
}

/* ---------------------------------------------------------------- MLA + DSA (cuda_mla.cu, cuda_dsa.cu) */

/* Scores of the DSA selection are kept for a chunk of query rows at a time, each row as long
 * as the longest context a block table can hold: at most this many floats (256 MiB). */
#define DSA_SCRATCH_FLOATS ((size_t)64 << 20)

void cu_layernorm(struct backend *be, const float *x, const float *w, const float *b, int rows, int dim,
                         float eps, float *y)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_layernorm(c->stream, x, w, b, rows, dim, eps, y, c->pdl));
}

void cu_mla_store(struct backend *be, const struct paged_latent *kv, const float *ckv, const float *w,
                         float eps, const float *idx_k, int n_tokens, const int32_t *slots)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cuda_mla_store(c->stream, kv, ckv, w, eps, idx_k, n_tokens, slots, c->pdl));
}

void cu_mla_absorb_q(struct backend *be, const struct weight *kv_b, const struct mla_dims *m, const float *q,
                            int n_tokens, float *q_abs)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (plan_mla_proj_gemm(n_tokens, kv_b->format) && cuda_mla_absorb_gemm(c, kv_b, m, q, n_tokens, q_abs))
        return;
    struct cuda_wdev wd = {.data = kv_b->data, .scale = kv_b->scale, .bias = NULL, .scale2 = kv_b->scale2};
    CHECK(c, cuda_mla_absorb_q(c->stream, kv_b->format, &wd, m, q, n_tokens, q_abs, plan_mla_proj_mma(&c->plan),
                               c->pdl));
}

void cu_mla_expand_o(struct backend *be, const struct weight *kv_b, const struct mla_dims *m,
                            const float *o_lat, int n_tokens, float *out)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (plan_mla_proj_gemm(n_tokens, kv_b->format) && cuda_mla_expand_gemm(c, kv_b, m, o_lat, n_tokens, out))
        return;
    struct cuda_wdev wd = {.data = kv_b->data, .scale = kv_b->scale, .bias = NULL, .scale2 = kv_b->scale2};
    CHECK(c, cuda_mla_expand_o(c->stream, kv_b->format, &wd, m, o_lat, n_tokens, out, plan_mla_proj_mma(&c->plan),
                               c->pdl));
}

/* Key splits of one MLA launch of `rows` heads a block and `keys` keys a tile: the test switch,
 * else the plan's rule where the blocks would not fill the SMs (the key list is at most sel_k
 * long with a selection, unknown without: positions are device-side). */
static int mla_splits(const struct cuda_backend *c, const struct attn_batch *b, int n_heads, int rows, int keys,
                      const int32_t *sel, int sel_k)
{
    int64_t blocks = (int64_t)b->n_tokens * ceil_div(n_heads, rows);
    if (c->force_splits > 0)
        return c->force_splits < PLAN_ATTN_MAX_SPLITS ? c->force_splits : PLAN_ATTN_MAX_SPLITS;
    if (c->force_splits == 0 && blocks < c->sm_count)
        return plan_attention_splits(c->sm_count, (double)blocks, sel ? ceil_div(sel_k, keys) : PLAN_ATTN_MAX_SPLITS);
    return 1;
}

void cu_mla_attention(struct backend *be, const float *q_abs, const struct paged_latent *kv,
                             const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k, float scale,
                             float *o_lat)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (b->n_tokens <= 0)
        return;
    int dk = kv->kv_rank + kv->rope_dim;
    /* the plan's tensor-core kernel over a bf16 or fp8 cache; the fp32 kernel otherwise */
    const struct cuda_mla_cfg *mc = &c->mla_mma;
    bool wg = c->mla_wgmma && cuda_mla_wgmma_takes_cache(kv) &&
              cuda_mla_wgmma_fits(n_heads, dk, kv->kv_rank, c->smem_budget);
    bool mma = mc->rows > 0 && cuda_mla_mma_takes_cache(kv) &&
               cuda_mla_mma_fits(n_heads, dk, kv->kv_rank, mc->rows, mc->keys, mc->stages, c->smem_budget);
    struct cuda_mla_cfg cfg = c->mla_attn;
    if (!wg && !mma && !cuda_mla_attention_fit(&cfg, n_heads, dk, kv->kv_rank, c->smem_budget))
        PANIC("cuda: no MLA attention tile fits %d latent dims in %zu bytes of shared memory", dk, c->smem_budget);
    int rows = wg ? PLAN_MLA_WGMMA_ROWS : mma ? mc->rows : cfg.rows;
    int keys = wg ? PLAN_MLA_WGMMA_KEYS : mma ? mc->keys : cfg.keys;
    int splits = mla_splits(c, b, n_heads, rows, keys, sel, sel_k);
    float *work = NULL;
    size_t wf = cuda_mla_attention_workspace_floats(b->n_tokens, n_heads, kv->kv_rank, splits);
    if (wf && !(work = cuda_scratch_get(c, wf * sizeof(float))))
        return;
    if (wg)
        CHECK(c, cuda_mla_attention_wgmma(c->stream, q_abs, kv, b, n_heads, sel, sel_k, scale, o_lat, splits, work,
                                          c->pdl));
    else if (mma)
        CHECK(c, cuda_mla_attention_mma(c->stream, q_abs, kv, b, n_heads, sel, sel_k, scale, o_lat, mc->rows,
                                        mc->keys, mc->stages, splits, work, c->pdl));
    else
        CHECK(c, cuda_mla_attention(c->stream, q_abs, kv, b, n_heads, sel, sel_k, scale, o_lat, &cfg, splits,
                                    work));
}

void cu_dsa_select(struct backend *be, const float *q_idx, const float *w_idx, const struct paged_latent *kv,
                          const struct attn_batch *b, const struct dsa_args *a, float *work, int32_t *sel)
{
    struct cuda_backend *c = cuda_ctx(be);
    (void)work; /* the CPU's candidate heaps; here the scores live in the backend's scratch */
    if (b->n_tokens <= 0)
        return;
    struct cuda_dsa_cfg cfg = c->dsa;
    if (!cuda_dsa_fit(&cfg, a->n_heads, a->head_dim, c->smem_budget))
        PANIC("cuda: no DSA score tile fits %d x %d indexer dims in %zu bytes", a->n_heads, a->head_dim,
              c->smem_budget);
    /* positions are device-side: a row is as long as the pass's longest sequence (the forward
     * knows it on the host; MLA passes are never graphs), else the longest context the block table
     * holds (a server's pool: millions of keys, which would leave the top-k no form but re-reading
     * its row and split the scratch into chunks of a few rows) */
    int64_t ctx64 = (int64_t)b->max_blocks * kv->block_size;
    if (b->max_len > 0 && (int64_t)b->max_len < ctx64)
        ctx64 = ((int64_t)b->max_len + 31) / 32 * 32; /* rows of whole 128-byte lines */
    ASSERT(ctx64 > 0 && ctx64 <= INT_MAX);
    int ctx_len = (int)ctx64;
    const size_t hist_floats =
        cuda_dsa_topk_hist_floats(ctx_len); /* a row's top-k histogram, after the scores */
    size_t rows = DSA_SCRATCH_FLOATS / ((size_t)ctx_len + hist_floats);
    int chunk = rows < 1 ? 1 : rows > (size_t)b->n_tokens ? b->n_tokens : (int)rows;
    if (chunk > 65535)
        chunk = 65535;
    float *scores = cuda_scratch_get(c, (size_t)chunk * ((size_t)ctx_len + hist_floats) * sizeof(float));
    if (!scores)
        return;
    unsigned *hist = hist_floats ? (unsigned *)(scores + (size_t)chunk * (size_t)ctx_len) : NULL;
    const bool mma = cfg.mma && cuda_dsa_mma_fits(a->n_heads, a->head_dim, kv->index_dtype);
    const int block_keys = mma ? CUDA_DSA_MMA_KEYS : cfg.keys;
    /* one wave: the mma kernel's warps each keep 4 tiles of keys in flight, so more resident
     * blocks, not more waves, is what feeds the memory system */
    int key_blocks = mma ? (int)(CUDA_DSA_MMA_BLOCKS_SM * (int64_t)c->sm_count / chunk)
                         : ceil_div(2 * (int64_t)c->sm_count, chunk);
    if (key_blocks < 1)
        key_blocks = 1;
    if (key_blocks > ceil_div(ctx_len, block_keys))
        key_blocks = ceil_div(ctx_len, block_keys);
    for (int r0 = 0; r0 < b->n_tokens; r0 += chunk) {
        int nr = b->n_tokens - r0 < chunk ? b->n_tokens - r0 : chunk;
        cudaError_t e = mma ? cuda_dsa_scores_mma(c->stream, q_idx, w_idx, kv, b, a, r0, nr, ctx_len,
                                                  key_blocks, scores, c->pdl)
                            : cuda_dsa_scores(c->stream, q_idx, w_idx, kv, b, a, r0, nr, ctx_len, &cfg,
                                              key_blocks, scores);
        if (!CHECK(c, e) || !CHECK(c, cuda_dsa_topk(c->stream, scores, ctx_len, b->pos, r0, nr, a->topk, sel,
                                                    hist, c->sm_count, c->smem_budget, c->pdl)))
            return;
    }
}
