/* forward.h — ONE forward pass for every family, over a batch of sequences.
 *
 * A batch is any mix of tokens from different sequences at different
 * positions (a whole prompt's prefill, one decode token each for many
 * sequences, or both): each token carries its sequence and absolute
 * position; K/V go to the sequence's paged-cache slots and attention reads
 * keys 0..pos of that sequence. Callers reserve cache room first
 * (kv_seq_reserve) and advance kv_seq.n_tokens after the pass.
 *
 * All buffers are taken at init for `max_tokens` tokens; forward_run allocates
 * nothing.
 *
 * Decode-shaped passes (one row a sequence, every row's logits) run from backend graphs where
 * the backend has them, one graph per batch size of plan_decode_graph_sizes(): a batch of n rows
 * runs padded up to the next size. Padding rows are token 0 at position 0 of sequences whose
 * one block is the cache's pad block (kv_cache.pad_block, which no sequence owns), so their K/V
 * writes land there; their logits and draws are never returned.
 *
 * defines: struct forward_batch, struct forward, forward_init(), forward_free(),
 *          forward_run()
 */
#ifndef MOESERVE_ENGINE_FORWARD_H
#define MOESERVE_ENGINE_FORWARD_H

#include "backend/backend.h"
#include "backend/comm/comm.h"
#include "engine/kv_cache.h"
#include "model/model_desc.h"
#include "model/model_weights.h"

struct forward_mla;
struct forward_dp;

struct forward_batch {
    int n_tokens;
    const int32_t *tokens;      /* (n_tokens) token ids */
    const int32_t *pos;         /* (n_tokens) absolute positions */
    const int32_t *seq;         /* (n_tokens) index into seqs */
    int n_seqs;
    struct kv_seq *const *seqs; /* (n_seqs) */
    int n_logits;
    const int32_t *logit_rows;  /* (n_logits) batch rows whose logits are returned */
    int32_t *tokens_out;        /* (n_logits) host, or NULL: the next token of each such row, chosen
                                   where the logits are (a NaN logit is an error); forward_run's
                                   logits_out may then be NULL */
    const struct sample_row *sample; /* (n_logits) host: how tokens_out is drawn; NULL = greedy.
                                        Needs a backend with a sample op (forward_can_sample) */
    const uint32_t *const *masks; /* (n_logits) host, or NULL: with sample, row i draws only among the
                                     ids set in masks[i] ((vocab + 31) / 32 words, a bit an id; NULL:
                                     any id). Read by forward_finish, so the caller may fill it between
                                     launch and finish: a grammar's masks, made while the device runs */
    const int32_t *edit_start;    /* (n_logits + 1) host, or NULL: with sample, row i's logits get
                                     edits[edit_start[i] .. edit_start[i + 1]) before its draw (the
                                     logit processors, engine/sampler.h); at most forward_edit_capacity */
    const struct logit_edit *edits;
    float *lp_out;                /* (n_logits) host, or NULL: with sample, forward_finish writes each row's drawn
                                     token's log-probability (base/logprobs.h) here, computed beside the logits */
    int32_t *top_ids_out;         /* (n_logits, logprob_k) host: each row's logprob_k likeliest, best first */
    float *top_lp_out;            /* (n_logits, logprob_k) host: their log-probabilities */
    int logprob_k;                /* 0 .. FORWARD_MAX_TOP_LOGPROBS */
};

/* FORWARD_MAX_GRAPH_ROWS: a backend with graphs computes this many logits rows at once where
 * max_seqs asks (a decode step of up to that many sequences is one graph). */
enum { FORWARD_MAX_GRAPH_KEYS = 256, FORWARD_MAX_GRAPH_ROWS = 256 };
/* Logit edits a pass may carry, on average a sampled row (a row's penalties touch the distinct
 * ids of its prompt and output; a longer list is processed on the host). */
enum { FORWARD_EDITS_PER_ROW = 1024 };
/* The most likeliest tokens a row's log-probabilities may list (OpenAI's top_logprobs limit). */
enum { FORWARD_MAX_TOP_LOGPROBS = 20 };

struct forward {
    const struct model_desc *d;     /* borrowed */
    const struct model_weights *w;  /* borrowed */
    struct backend *be;             /* borrowed */
    struct kv_cache *kv;            /* borrowed */
    int max_tokens;
    int max_seqs;
    int max_blocks;                 /* per sequence */
    int logit_chunk;                /* rows of logits computed per lm_head call */
    int sample_rows;                /* rows of sampling parameters a pass may carry: max(logit_chunk, max_seqs) */
    int graph_rows;                 /* the largest decode pass run from a graph: min(max_seqs, logit_chunk) */
    bool pad_decode;                /* decode passes padded to the graph sizes (a backend with graphs,
                                       graphs on); tests turn it on for the CPU to check the padding */

    /* backend memory, owned; T = max_tokens */
    float *h;       /* (T, d_model) residual stream */
    float *x;       /* (T, d_model) normed input of a block */
    float *delta;   /* (T, d_model) block output, added into h */
    float *tmp;     /* (T, d_model) shared-expert output */
    float *q;       /* (T, n_heads * head_dim) */
    float *k;       /* (T, n_kv_heads * head_dim) */
    float *v;       /* (T, n_kv_heads * head_dim) */
    float *attn;    /* (T, n_heads * head_dim) */
    float *gate;    /* (T, ffn_width) */
    float *up;      /* (T, ffn_width) */
    float *router;  /* (T, n_experts) */
    float *route_w; /* (T, n_used) */
    int32_t *route_ids; /* (T, n_used) */
    float *moe_work;    /* backend_moe_workspace_floats(T, ...) */
    float *logits;  /* (logit_chunk, vocab) */
    float *logits_part; /* (logit_chunk, lm_head.rows) this rank's share of a vocabulary-parallel lm_head, or NULL */
    float *x_sel;   /* (logit_chunk, d_model) */
    float *inv_freq;    /* (rope.dim / 2) */
    int32_t *d_meta;    /* batch metadata, one buffer: the five arrays below point into it */
    int32_t *d_tokens, *d_pos, *d_seq, *d_slots, *d_table;
    int32_t *d_argmax;  /* (logit_chunk) chosen tokens */
    struct sample_row *d_sample; /* (sample_rows) */
    int32_t *d_edit_start; /* (sample_rows + 1) forward_batch.edit_start, padding rows empty */
    struct logit_edit *d_edits; /* (edit_cap) */
    int edit_cap;       /* sample_rows x FORWARD_EDITS_PER_ROW where the backend edits logits; else 0 */
    float *d_lp;        /* (logit_chunk) drawn tokens' log-probabilities, where the backend has logprobs */
    int32_t *d_top_ids; /* (logit_chunk, FORWARD_MAX_TOP_LOGPROBS) */
    float *d_top_lp;    /* (logit_chunk, FORWARD_MAX_TOP_LOGPROBS) */
    uint32_t *d_masks;  /* (logit_chunk, (vocab + 31) / 32) a chunk's masked rows' allowed ids, compacted;
                           taken at the first masked pass */

    /* host scratch, owned */
    int32_t *h_meta;    /* staging of d_meta */
    float *h_logits;    /* (logit_chunk, vocab) when argmax is wanted without logits and the backend
                           has no argmax op; taken at first need */
    int32_t *h_rows;    /* (logit_chunk) 0, 1, ..: a padded pass's logit rows */
    struct sample_row *h_sample; /* (logit_chunk) a padded pass's sampling rows (the padding greedy) */
    uint32_t *h_masks;  /* staging of d_masks, taken with it */
    int32_t *h_edit_start; /* (sample_rows + 1) staging of d_edit_start */
    uint64_t *graph_seen; /* (FORWARD_MAX_GRAPH_KEYS) graph keys run once, captured when seen again */
    int n_graph_seen;
    bool use_graphs;    /* backend graphs for decode-shaped passes (MOESERVE_NO_GRAPHS=1: off) */
    const struct forward_batch *launched; /* the pass between forward_launch and forward_finish (borrowed) */

    struct forward_mla *mla; /* MLA/DSA buffers (engine/forward_mla.h), owned; NULL without MLA layers */

    /* Tensor / expert parallelism (model/model_shard.h): the weights, d and kv are this rank's
     * share; each half-layer's output is a partial sum that comm completes. */
    struct comm *comm;       /* borrowed; NULL: one rank */
    int32_t *rank_buf;       /* rank 0's message of a pass to the others (engine/ranks.c), owned */
    int expert_lo, expert_hi; /* this rank's routed experts under expert parallelism; hi 0: all */
    bool fuse_norm;          /* each all-reduce with the residual add and the next norm in one comm op
                                (comm_all_reduce_add_rmsnorm; the plan's choice, model_session.c) */
    struct forward_dp *dp;   /* data-parallel attention (engine/forward_dp.h), owned; NULL: attention by heads */
};

enum status forward_init(struct forward *f, const struct model_desc *d, const struct model_weights *w,
                         struct backend *be, struct kv_cache *kv, int max_tokens, int max_seqs,
                         struct err *err);
/* Safe on a zeroed struct. */
void forward_free(struct forward *f);
/* Whether forward_batch.sample can be used (the backend draws tokens itself). */
bool forward_can_sample(const struct forward *f);
/* How many logit edits a pass may carry (forward_batch.edits); 0: none (the backend cannot). */
int forward_edit_capacity(const struct forward *f);
/* Whether forward_batch.lp_out can be used (the backend computes drawn rows' log-probabilities). */
bool forward_can_logprobs(const struct forward *f);
/* Runs the batch; writes logits for the requested rows to logits_out
 * (n_logits, vocab) host memory (NULL: not wanted), and the chosen tokens
 * to b->tokens_out when set. Bad token ids or positions are an error.
 * forward_run = forward_launch + forward_finish: launch puts the pass on the device (a backend
 * with a stream returns before it has run), finish waits for it and brings the logits and ids
 * back. Between the two the caller may do host work, but must keep b and what it points to as
 * they are and call no other forward function. */
enum status forward_run(struct forward *f, const struct forward_batch *b, float *logits_out,
                        struct err *err);
enum status forward_launch(struct forward *f, const struct forward_batch *b, struct err *err);
enum status forward_finish(struct forward *f, float *logits_out, struct err *err);
/* Whether forward_launch returns before the pass has run (a backend with a stream and graphs),
 * so that host work between launch and finish overlaps the device's. */
bool forward_overlaps(const struct forward *f);

#endif
