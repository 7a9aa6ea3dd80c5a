/* model_shard.h — one rank's share of a model under tensor and expert parallelism.
 *
 * The layout (DESIGN.md decision 6): attention by heads (GQA: q heads split, kv heads split or,
 * with fewer kv heads than ranks, each rank keeping the one its q heads use; MLA: heads split,
 * the latent and the DSA indexer replicated), dense MLPs and shared experts column-parallel on
 * gate/up and row-parallel on down, routed experts either split by their intermediate width
 * (TP-MoE) or partitioned by expert (EP: rank r owns experts [r E / N, (r + 1) E / N)); the
 * router, norms and embedding replicated, the lm_head by vocabulary where it divides (the
 * logits all-gathered, rank 0 samples). Every rank's attention and FFN outputs are
 * partial sums that one all-reduce a half-layer completes; a row-parallel bias is added on rank 0
 * only. Splits respect the weight formats' scale blocks (NVFP4: 16 in-features; FP8: 128 x 128);
 * a model whose widths do not divide is refused with the width that does not.
 *
 * Data-parallel attention (for large batches): every rank keeps the whole attention (weights
 * replicated, heads not divided) and attends for its own sequences only, so the KV cache rows of a
 * sequence (MLA: its latent) live on and are read by one rank; the FFN stays split as above, its
 * input the ranks' tokens all-gathered and its partial sums reduce-scattered back to the ranks
 * whose tokens they are. model_shard_choose_attention() is the rule that picks it by batch size.
 *
 * This header holds the arithmetic only: which rows or columns of a tensor a rank keeps, and the
 * rank-local description (heads and widths divided) that the forward, the KV cache and the
 * buffers are sized from. model_weights binds with it.
 *
 * defines: struct model_shard, struct shard_range, struct shard_part, model_shard_check(),
 *          model_shard_desc(), model_shard_heads(), model_shard_kv_heads(), model_shard_width(),
 *          model_shard_vocab(), model_shard_experts(), model_shard_choose_experts(),
 *          struct shard_attn_cost, model_shard_elem_bytes(), model_shard_cache_elem_bytes(),
 *          model_shard_attn_cost(), model_shard_choose_attention(), model_shard_layout()
 */
#ifndef MOESERVE_MODEL_MODEL_SHARD_H
#define MOESERVE_MODEL_MODEL_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "format/weight.h"
#include "model/model_desc.h"

struct model_shard {
    int rank;             /* 0 .. size - 1 */
    int size;             /* ranks; 1: the whole model */
    bool expert_parallel; /* routed experts partitioned by expert instead of split by width */
    bool data_parallel_attention; /* attention whole on every rank, each for its own sequences */
};

/* A contiguous share [off, off + n) of a dimension of length `of`. */
struct shard_range {
    int64_t off, n, of;
};

/* Whether d's heads, widths and experts divide over s's ranks: an error naming the first that
 * does not. (Whether a split falls on a weight's scale blocks is checked as each tensor is bound,
 * naming the tensor.) */
enum status model_shard_check(const struct model_desc *d, const struct model_shard *s, struct err *err);
/* The rank-local description: heads and split widths divided (local takes its own copy of the
 * layers; model_desc_free frees it). */
enum status model_shard_desc(const struct model_desc *d, const struct model_shard *s, struct model_desc *local,
                             struct err *err);
/* The rank's q heads (GQA and MLA). */
struct shard_range model_shard_heads(const struct model_desc *d, const struct model_shard *s);
/* The rank's kv heads (GQA): a share when there are at least as many kv heads as ranks, else the
 * one kv head its q heads read. */
struct shard_range model_shard_kv_heads(const struct model_desc *d, const struct model_shard *s);
/* The rank's share of a width split by tensor parallelism (d_ff, a shared expert's width, a routed
 * expert's width under TP-MoE). */
struct shard_range model_shard_width(int64_t width, const struct model_shard *s);
/* The rank's rows of the lm_head: its share of the vocabulary where it divides over the ranks
 * (the logits are then gathered), else all of it (replicated). */
struct shard_range model_shard_vocab(const struct model_desc *d, const struct model_shard *s);
/* The rank's routed experts: all of them under TP-MoE, its partition under EP. */
struct shard_range model_shard_experts(const struct model_desc *d, const struct model_shard *s);

/* The routed experts' layout over `size` ranks when the user did not ask for one: split by width
 * (TP-MoE: every rank reads 1/size of each touched expert, no imbalance) while each rank's width
 * is whole scale blocks of the experts' format (weight_format_in_block), else by expert where the
 * experts divide. True for EP; *why says which and why. */
bool model_shard_choose_experts(const struct model_desc *d, int size, enum weight_format experts, const char **why);

/* What one rank reads for one layer's attention in one decode step, by layout: the weights and the
 * KV cache rows of `batch` sequences of `context` tokens (bytes). */
struct shard_attn_cost {
    double weights_tp, cache_tp; /* attention by heads: 1/N of the split weights, the replicated ones whole
                                    (MLA: q_a, kv_a, the indexer); the cache rows its heads read (MLA: every
                                    sequence's latent rows, the top-k under DSA, and its indexer keys) */
    double weights_dp, cache_dp; /* data-parallel: all the weights; its batch / N sequences' rows */
};
/* Bytes a weight element of format f takes, its scales included (bf16 2, fp8 1, nvfp4 0.5625). */
double model_shard_elem_bytes(enum weight_format f);
/* Bytes a KV cache element of d's attention takes: latent_elem_bytes for a model with MLA layers
 * (the latent's type: bf16 2, f32 4, fp8 656 / 576), GQA's f32 K and V otherwise. */
double model_shard_cache_elem_bytes(const struct model_desc *d, double latent_elem_bytes);
/* attn_weight_bytes: bytes a weight element of the attention's format takes (bf16 2, fp8 1, nvfp4
 * 0.5625); cache_elem_bytes: a KV cache element's (bf16 2, f32 4). */
struct shard_attn_cost model_shard_attn_cost(const struct model_desc *d, int size, int batch, int context,
                                             double attn_weight_bytes, double cache_elem_bytes);
/* The attention's layout over `size` ranks for steps of `batch` sequences of `context` tokens:
 * data-parallel (true) where each rank gets a sequence and reads fewer bytes a decode step that way
 * (model_shard_attn_cost), else by heads; *why says which and why (the figures, into buf). */
bool model_shard_choose_attention(const struct model_desc *d, int size, int batch, int context,
                                  double attn_weight_bytes, double cache_elem_bytes, char *why, size_t n);

/* One row of the layout `moeserve plan --tensor-parallel N` prints. */
struct shard_part {
    char part[40];      /* "attention (GQA)", "routed experts", ... */
    char split[40];     /* "by heads", "columns / rows", "by expert", "replicated" */
    char per_rank[128]; /* what one rank holds */
    char why[200];
};

/* The layout of d over s, part by part (at most max rows): the number of rows. */
int model_shard_layout(const struct model_desc *d, const struct model_shard *s, struct shard_part *parts, int max);

#endif
