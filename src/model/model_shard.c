/* model_shard.c — see model_shard.h. */
#include "model/model_shard.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool desc_has_mla(const struct model_desc *d)
{
    for (int l = 0; l < d->n_layers; l++)
        if (d->layers[l].attn == ATTN_MLA)
            return true;
    return false;
}

static bool desc_has(const struct model_desc *d, enum ffn_kind k)
{
    for (int l = 0; l < d->n_layers; l++)
        if (d->layers[l].ffn == k)
            return true;
    return false;
}

enum status model_shard_check(const struct model_desc *d, const struct model_shard *s, struct err *err)
{
    const int n = s->size;
    if (n < 1 || s->rank < 0 || s->rank >= n)
        return err_set(err, STATUS_INVALID, "rank %d of %d ranks", s->rank, n);
    if (n == 1)
        return STATUS_OK;
    if (s->data_parallel_attention)
        goto ffn; /* whole heads on every rank */
    if (d->n_heads % n)
        return err_set(err, STATUS_UNSUPPORTED, "%s: %d attention heads do not divide over %d ranks (--data-parallel-attention on keeps them "
                       "whole)",
                       model_family_name(d->family), d->n_heads, n);
    if (!desc_has_mla(d) && d->n_kv_heads % n && n % d->n_kv_heads)
        return err_set(err, STATUS_UNSUPPORTED,
                       "%s: %d kv heads over %d ranks: neither divides the other (each rank needs whole kv "
                       "heads, or one kv head for all its q heads; or --data-parallel-attention on)",
                       model_family_name(d->family), d->n_kv_heads, n);
ffn:
    if (desc_has(d, FFN_DENSE) && d->d_ff % n)
        return err_set(err, STATUS_UNSUPPORTED, "%s: intermediate_size %d does not divide over %d ranks",
                       model_family_name(d->family), d->d_ff, n);
    if (desc_has(d, FFN_MOE)) {
        if (s->expert_parallel && d->n_experts % n)
            return err_set(err, STATUS_UNSUPPORTED, "%s: %d routed experts do not divide over %d ranks (expert "
                           "parallel)", model_family_name(d->family), d->n_experts, n);
        if (!s->expert_parallel && d->d_expert % n)
            return err_set(err, STATUS_UNSUPPORTED,
                           "%s: moe_intermediate_size %d does not divide over %d ranks (try --expert-parallel)",
                           model_family_name(d->family), d->d_expert, n);
        if (d->n_shared_experts && ((int64_t)d->d_expert * d->n_shared_experts) % n)
            return err_set(err, STATUS_UNSUPPORTED, "%s: the shared experts' width %d does not divide over %d ranks",
                           model_family_name(d->family), d->d_expert * d->n_shared_experts, n);
    }
    return STATUS_OK;
}

static struct shard_range range_share(int64_t of, int rank, int size)
{
    const int64_t n = of / size;
    return (struct shard_range){.off = (int64_t)rank * n, .n = n, .of = of};
}

struct shard_range model_shard_heads(const struct model_desc *d, const struct model_shard *s)
{
    if (s->data_parallel_attention)
        return (struct shard_range){.off = 0, .n = d->n_heads, .of = d->n_heads};
    return range_share(d->n_heads, s->rank, s->size);
}

struct shard_range model_shard_kv_heads(const struct model_desc *d, const struct model_shard *s)
{
    if (s->data_parallel_attention)
        return (struct shard_range){.off = 0, .n = d->n_kv_heads, .of = d->n_kv_heads};
    if (d->n_kv_heads >= s->size)
        return range_share(d->n_kv_heads, s->rank, s->size);
    /* q head h reads kv head h / (n_heads / n_kv_heads); the rank's q heads all read one */
    const int64_t q0 = (int64_t)s->rank * (d->n_heads / s->size);
    return (struct shard_range){.off = q0 / (d->n_heads / d->n_kv_heads), .n = 1, .of = d->n_kv_heads};
}

struct shard_range model_shard_width(int64_t width, const struct model_shard *s)
{
    return range_share(width, s->rank, s->size);
}

struct shard_range model_shard_vocab(const struct model_desc *d, const struct model_shard *s)
{
    if (d->vocab_size % s->size)
        return (struct shard_range){.off = 0, .n = d->vocab_size, .of = d->vocab_size};
    return range_share(d->vocab_size, s->rank, s->size);
}

struct shard_range model_shard_experts(const struct model_desc *d, const struct model_shard *s)
{
    if (!s->expert_parallel)
        return (struct shard_range){.off = 0, .n = d->n_experts, .of = d->n_experts};
    return range_share(d->n_experts, s->rank, s->size);
}

enum status model_shard_desc(const struct model_desc *d, const struct model_shard *s, struct model_desc *local,
                             struct err *err)
{
    enum status st = model_shard_check(d, s, err);
    if (st)
        return st;
    *local = *d;
    local->layers = malloc((size_t)d->n_layers * sizeof *d->layers);
    if (!local->layers)
        return err_set(err, STATUS_NOMEM, "out of memory for %d layer descriptions", d->n_layers);
    memcpy(local->layers, d->layers, (size_t)d->n_layers * sizeof *d->layers);
    if (s->size == 1)
        return STATUS_OK;
    local->n_heads = (int)model_shard_heads(d, s).n;
    if (!desc_has_mla(d)) /* MLA's cache is the latent, not per-head keys */
        local->n_kv_heads = (int)model_shard_kv_heads(d, s).n;
    local->d_ff = d->d_ff / s->size;
    if (!s->expert_parallel)
        local->d_expert = d->d_expert / s->size;
    return STATUS_OK;
}

bool model_shard_choose_experts(const struct model_desc *d, int size, enum weight_format experts, const char **why)
{
    if (size <= 1 || !desc_has(d, FFN_MOE)) {
        *why = "one rank (or no routed experts): nothing to split";
        return false;
    }
    const int blk = weight_format_in_block(experts);
    if (d->d_expert % size == 0 && (d->d_expert / size) % blk == 0) {
        *why = "each expert's width splits into whole scale blocks: every rank reads its share of every touched "
               "expert (no load imbalance, no dispatch), one all-reduce a layer";
        return false;
    }
    if (d->n_experts % size == 0) {
        *why = "an expert's width would split off its format's scale blocks: experts partitioned instead, "
               "other ranks' slots masked, one all-reduce a layer";
        return true;
    }
    *why = "neither the experts' width nor their number divides over the ranks";
    return false;
}

/* One layer's attention weight elements (the widest layer kind of the model); *replicated: those
 * every rank keeps whole when the attention goes by heads (MLA: q_a, kv_a and the DSA indexer). */
static double attn_params(const struct model_desc *d, double *replicated)
{
    const double D = d->d_model, H = d->n_heads;
    if (desc_has_mla(d)) {
        const double qk = d->qk_nope_head_dim + d->qk_rope_head_dim;
        const double q_a = d->q_lora_rank > 0 ? D * d->q_lora_rank : 0;
        const double q_b = d->q_lora_rank > 0 ? (double)d->q_lora_rank * H * qk : D * H * qk;
        double idx = 0;
        if (d->index_n_heads > 0)
            idx = (double)d->q_lora_rank * d->index_n_heads * d->index_head_dim + D * d->index_head_dim +
                  D * d->index_n_heads;
        const double kv_a = D * (d->kv_lora_rank + d->qk_rope_head_dim);
        *replicated = q_a + kv_a + idx;
        return *replicated + q_b + (double)d->kv_lora_rank * H * (d->qk_nope_head_dim + d->v_head_dim) +
               H * d->v_head_dim * D;
    }
    const double qd = H * d->head_dim, kvd = (double)d->n_kv_heads * d->head_dim;
    *replicated = 0;
    return D * (qd + 2 * kvd) + qd * D;
}

double model_shard_elem_bytes(enum weight_format f)
{
    switch (f) {
    case WEIGHT_F32:
        return 4.0;
    case WEIGHT_FP8_BLOCK:
        return 1.0;
    case WEIGHT_NVFP4:
        return 0.5625; /* a nibble and a byte of scale per 16 */
    default:
        return 2.0;
    }
}

double model_shard_cache_elem_bytes(const struct model_desc *d, double latent_elem_bytes)
{
    return desc_has_mla(d) ? latent_elem_bytes : 4.0; /* GQA K and V are f32 */
}

struct shard_attn_cost model_shard_attn_cost(const struct model_desc *d, int size, int batch, int context,
                                             double attn_weight_bytes, double cache_elem_bytes)
{
    const double N = size > 0 ? size : 1, B = batch;
    double rep = 0;
    const double all = attn_params(d, &rep);
    struct shard_attn_cost c = {.weights_tp = (rep + (all - rep) / N) * attn_weight_bytes,
                                .weights_dp = all * attn_weight_bytes};
    if (desc_has_mla(d)) {
        /* a token reads its sequence's latent rows, only the top-k of them under DSA, and then every
         * indexer key; by heads every rank reads all of it (the latent is every head's) */
        const double latent = (double)(d->kv_lora_rank + d->qk_rope_head_dim);
        const bool dsa = d->index_n_heads > 0 && d->index_topk > 0;
        const double rows = dsa && d->index_topk < context ? d->index_topk : context;
        const double per_seq = (rows * latent + (dsa ? (double)context * d->index_head_dim : 0)) * cache_elem_bytes;
        c.cache_tp = B * per_seq;
        c.cache_dp = B / N * per_seq;
    } else {
        const double kv_row = 2.0 * d->head_dim * cache_elem_bytes * context;
        const double kv_tp = d->n_kv_heads >= size ? (double)d->n_kv_heads / N : 1.0; /* kv heads a rank reads */
        c.cache_tp = B * kv_tp * kv_row;
        c.cache_dp = B / N * d->n_kv_heads * kv_row;
    }
    return c;
}

bool model_shard_choose_attention(const struct model_desc *d, int size, int batch, int context,
                                  double attn_weight_bytes, double cache_elem_bytes, char *why, size_t n)
{
    if (size <= 1) {
        snprintf(why, n, "one rank: nothing to split");
        return false;
    }
    if (batch < size) {
        snprintf(why, n, "%d sequences a step over %d ranks: some rank would attend for none (data-parallel "
                 "attention pays from a sequence a rank up)", batch, size);
        return false;
    }
    const struct shard_attn_cost c = model_shard_attn_cost(d, size, batch, context, attn_weight_bytes, cache_elem_bytes);
    const double tp = c.weights_tp + c.cache_tp, dp = c.weights_dp + c.cache_dp;
    const bool on = dp < tp;
    snprintf(why, n, "%d sequences of %d tokens a step: a rank reads %.2f MiB a layer by heads (weights %.2f + "
             "KV %.2f) vs %.2f MiB data-parallel (weights %.2f replicated + KV %.2f of its sequences): %s",
             batch, context, tp / 1048576.0, c.weights_tp / 1048576.0, c.cache_tp / 1048576.0, dp / 1048576.0,
             c.weights_dp / 1048576.0, c.cache_dp / 1048576.0, on ? "data-parallel" : "by heads");
    return on;
}

static int add_part(struct shard_part *parts, int n, int max, const char *part, const char *split, const char *why,
                    const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static int add_part(struct shard_part *parts, int n, int max, const char *part, const char *split, const char *why,
                    const char *fmt, ...)
{
    if (n >= max)
        return n;
    struct shard_part *p = &parts[n];
    snprintf(p->part, sizeof p->part, "%s", part);
    snprintf(p->split, sizeof p->split, "%s", split);
    snprintf(p->why, sizeof p->why, "%s", why);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->per_rank, sizeof p->per_rank, fmt, ap);
    va_end(ap);
    return n + 1;
}

int model_shard_layout(const struct model_desc *d, const struct model_shard *s, struct shard_part *parts, int max)
{
    int n = 0;
    double rep = 0;
    const struct shard_range h = model_shard_heads(d, s);
    if (s->data_parallel_attention) {
        n = add_part(parts, n, max, desc_has_mla(d) ? "attention (MLA)" : "attention (GQA)", "data-parallel",
                     "each rank attends for its own sequences (rank 0 assigns them): their KV rows on one rank "
                     "only; no all-reduce after o_proj: the FFN gathers the ranks' rows, reduce-scatters back",
                     "all %d heads, weights replicated (%.2f MiB a layer in bf16 on every rank); KV cache: its "
                     "sequences", d->n_heads, attn_params(d, &rep) * 2.0 / 1048576.0);
        if (desc_has_mla(d) && d->index_n_heads > 0)
            n = add_part(parts, n, max, "DSA indexer", "data-parallel", "with its attention: its sequences' keys",
                         "%d heads x %d, top %d", d->index_n_heads, d->index_head_dim, d->index_topk);
    } else if (desc_has_mla(d)) {
        n = add_part(parts, n, max, "attention (MLA)", "by heads",
                     "q_b / kv_b rows and o_proj in-features by head; the latent is per token, not per head, so "
                     "each rank keeps q_a, kv_a and its latent cache whole; all-reduce after o_proj",
                     "%lld of %d heads; latent %d + rope %d replicated", (long long)h.n, d->n_heads, d->kv_lora_rank,
                     d->qk_rope_head_dim);
        if (d->index_n_heads > 0)
            n = add_part(parts, n, max, "DSA indexer", "replicated",
                         "the top-k selection is one per token for all heads: computed whole on every rank",
                         "%d heads x %d, top %d", d->index_n_heads, d->index_head_dim, d->index_topk);
    } else {
        const struct shard_range kh = model_shard_kv_heads(d, s);
        n = add_part(parts, n, max, "attention (GQA)", "by heads",
                     d->n_kv_heads < s->size
                         ? "q heads split; fewer kv heads than ranks: each rank keeps the one its q heads read; "
                           "all-reduce after o_proj"
                         : "q and kv heads split alike (each rank's q heads read its kv heads); all-reduce after o_proj",
                     "%lld of %d q heads, %lld of %d kv heads (KV cache per rank: its kv heads)", (long long)h.n,
                     d->n_heads, (long long)kh.n, d->n_kv_heads);
    }
    if (desc_has(d, FFN_DENSE))
        n = add_part(parts, n, max, "dense MLP", "columns / rows",
                     "gate and up by output rows, down by in-features: one all-reduce after down",
                     "width %lld of %d", (long long)model_shard_width(d->d_ff, s).n, d->d_ff);
    if (desc_has(d, FFN_MOE)) {
        const struct shard_range ex = model_shard_experts(d, s);
        if (s->expert_parallel)
            n = add_part(parts, n, max, "routed experts", "by expert",
                         "each expert on one rank: other ranks' slots masked after the (replicated) routing, the "
                         "ranks' sums added by the layer's all-reduce",
                         "experts %lld..%lld of %d (rank %d), width %d", (long long)ex.off,
                         (long long)(ex.off + ex.n - 1), d->n_experts, s->rank, d->d_expert);
        else
            n = add_part(parts, n, max, "routed experts", "by width (TP-MoE)",
                         "every expert's gate/up rows and down in-features split: each rank reads 1/N of each "
                         "touched expert",
                         "%d experts, width %lld of %d", d->n_experts, (long long)model_shard_width(d->d_expert, s).n,
                         d->d_expert);
        if (d->n_shared_experts > 0) {
            const int64_t w = (int64_t)d->d_expert * d->n_shared_experts;
            n = add_part(parts, n, max, "shared experts", "columns / rows", "as a dense MLP, in the same all-reduce",
                         "width %lld of %lld", (long long)model_shard_width(w, s).n, (long long)w);
        }
        n = add_part(parts, n, max, "router", "replicated",
                     "every rank routes every token (the same bits: its input is the all-reduced stream)",
                     "%d experts x %d", d->n_experts, d->d_model);
    }
    const struct shard_range v = model_shard_vocab(d, s);
    if (v.n < v.of)
        n = add_part(parts, n, max, "lm_head", "by vocabulary",
                     "each rank's logits for its share of the vocabulary, all-gathered; rank 0 samples once",
                     "%lld of %d rows (tokens %lld..%lld)", (long long)v.n, d->vocab_size, (long long)v.off,
                     (long long)(v.off + v.n - 1));
    else
        n = add_part(parts, n, max, "lm_head", "replicated", "the vocabulary does not divide over the ranks",
                     "%d rows", d->vocab_size);
    n = add_part(parts, n, max, "embedding, norms", "replicated",
                 "a token's embedding row and the norms are needed whole on every rank", "vocab %d x %d",
                 d->vocab_size, d->d_model);
    return n;
}
