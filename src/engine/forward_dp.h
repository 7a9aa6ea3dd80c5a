/* forward_dp.h — data-parallel attention over the ranks (DESIGN.md decision 6, for large batches).
 *
 * Every rank holds the whole attention (model_shard.data_parallel_attention) and attends for its
 * own sequences only; the FFN stays split over the ranks. A pass is the whole step on every rank
 * (engine/ranks.c broadcasts it with each sequence's rank); each rank takes its part: its
 * sequences' rows, in batch order (forward_dp_split). Around each FFN the forward gathers every
 * rank's normed rows, padded to the largest rank's count (t_max), runs the FFN share over all of
 * them (max_tokens rows at a time: its buffers stay a rank's size) and reduce-scatters the partial
 * sums back, so that each rank's rows come home whole; after
 * the last layer the residual rows are gathered once more for the lm_head, whose logit rows are
 * the gathered rows' places (rank r's k-th row is row r * t_max + k).
 *
 * A sequence's rank (kv_seq.attn_rank) is the KV cache pool its blocks come from (kv_cache_init_pools,
 * one pool a rank: what the session makes), given when it first reserves (rank 0's scheduler admits
 * it into the roomiest pool, or into its cached prefix's), and each rank's memory holds its pool
 * only: forward_dp_split turns block ids into places in the pool. For a cache without pools, rank 0
 * assigns each new sequence of a pass the rank with the fewest of the pass's sequences (then
 * tokens) (forward_dp_assign).
 *
 * defines: struct forward_dp, forward_dp_init(), forward_dp_free(), forward_dp_assign(), forward_dp_split()
 */
#ifndef MOESERVE_ENGINE_FORWARD_DP_H
#define MOESERVE_ENGINE_FORWARD_DP_H

#include "engine/forward.h"

struct forward_dp {
    /* backend memory, owned; R = ranks x max_tokens */
    float *xg;          /* (R, d_model) every rank's FFN input rows; after the layers, every rank's residual rows */
    float *dg;          /* (R, d_model) this rank's FFN share of every row, before the reduce-scatter */
    int t_max;          /* this pass: the most rows any rank attends for (the gathers' block) */
    /* host, owned */
    int32_t *tokens, *pos, *seq; /* (max_tokens) this rank's rows of the pass */
    int32_t *logit_rows;         /* (max_tokens) the pass's logit rows as places in xg */
    int32_t *place;              /* (max_tokens) each batch row's place in xg */
    int32_t *local_seq;          /* (max_seqs) a pass sequence's index among this rank's, or -1 */
    struct kv_seq **seqs;        /* (max_seqs) this rank's sequences of the pass: views of lseqs */
    struct kv_seq *lseqs;        /* (max_seqs) its sequences with their blocks as places in its pool */
    int32_t *places;             /* (max_seqs, kv pool_blocks) lseqs' block tables */
    struct forward_batch local;  /* this rank's part of the pass; its logit rows (all of the pass's)
                                    as places in xg, its tokens_out and sample the pass's */
};

/* Takes data-parallel attention's buffers (every rank's rows: 2 x ranks x max_tokens x d_model
 * floats): after forward_init and f->comm set. */
enum status forward_dp_init(struct forward *f, struct err *err);
/* Safe when f->dp is NULL. */
void forward_dp_free(struct forward *f);
/* Rank 0: a rank for each sequence of b that has none (kv_seq.attn_rank; a cache without pools),
 * before the pass is sent; nothing on other ranks or without data-parallel attention. */
void forward_dp_assign(struct forward *f, const struct forward_batch *b);
/* This rank's part of *b into f->dp->local, which *b then points to (what the forward runs from
 * there: its rows, and the pass's logit rows placed in xg), and t_max; an error where a sequence
 * has no rank or one outside the ranks. Nothing without data-parallel attention. */
enum status forward_dp_split(struct forward *f, const struct forward_batch **b, struct err *err);

#endif
