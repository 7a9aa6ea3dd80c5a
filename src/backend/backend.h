/* backend.h — the table of operations every compute backend provides.
 *
 * The forward (engine/forward.c) calls only these. All pointers passed to an
 * op live in the backend's memory (host memory for the CPU backend, device
 * memory for CUDA); activations are fp32 row-major. A NULL member means
 * "unsupported": callers go through backend_supports() first. The CPU
 * backend implements everything and is the reference the others are tested
 * against, op by op (tests/unit/test_ops*.c).
 *
 * defines: struct backend, struct backend_ops, struct paged_kv, struct attn_batch,
 *          struct rope_args, struct route_args, struct moe_args,
 *          struct sample_row, struct logit_edit, BACKEND_GRAPH_KEY_MODE_BITS,
 *          backend_moe_workspace_floats(),
 *          enum kv_dtype, kv_dtype_name(), kv_dtype_parse(), kv_latent_row_bytes(), kv_index_row_bytes(),
 *          struct paged_latent, struct mla_dims, struct dsa_args, backend_dsa_workspace_floats(),
 *          backend_cpu_create(), struct backend_cpu_opts, backend_cpu_create_opts(), backend_destroy()
 */
#ifndef MOESERVE_BACKEND_BACKEND_H
#define MOESERVE_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/weight.h"
#include "format/weight_synth.h"
#include "base/status.h"

#ifdef __cplusplus
extern "C" { /* the CUDA kernels' host code calls the row-layout functions */
#endif

struct backend;

/* One layer's slice of a paged KV cache. Token slot s = block * block_size + offset. */
struct paged_kv {
    float *k;        /* (n_blocks * block_size, n_kv_heads, head_dim) */
    float *v;        /* same shape as k */
    int block_size;
    int n_kv_heads;
    int head_dim;
};

/* Which cached keys each query token may attend to: keys 0..pos[i] of the
 * sequence whose block table is row seq[i]. */
struct attn_batch {
    int n_tokens;
    const int32_t *pos;         /* (n_tokens) absolute positions */
    const int32_t *seq;         /* (n_tokens) row of block_table */
    const int32_t *block_table; /* (n_seqs, max_blocks) block ids */
    int max_blocks;
    int max_len; /* every pos < max_len (the pass's longest sequence, host-side); 0: none beyond the table */
};

struct rope_args {
    int dim;                /* rotated dims per head */
    int offset;             /* first rotated dim inside the head */
    bool interleaved;       /* pairs (2i, 2i+1) written de-interleaved; else (i, i + dim/2) */
    float attention_factor; /* scales cos and sin (YaRN) */
    const float *inv_freq;  /* (dim/2) */
};

/* One tensor of a rope_multi call: x[t, h * head_stride + offset ...] for h < n_heads. */
enum { ROPE_MAX_JOBS = 4 };
struct rope_job {
    float *x;
    int n_heads, head_stride, offset;
};

enum route_score { ROUTE_SOFTMAX, ROUTE_SIGMOID };

struct route_args {
    int n_experts;
    int n_used;                 /* k */
    enum route_score score;
    const float *correction_bias; /* (n_experts) selection-only bias, or NULL */
    int n_group, topk_group;    /* grouped selection; 1, 1 = off */
    bool normalize;             /* renormalise the k weights */
    float normalize_eps;        /* added to the denominator */
    float scaling;              /* multiplies the final weights */
};

struct moe_args {
    int n_experts;
    int n_used;
    int d_model;
    int d_expert;
    const struct weight *gate; /* (n_experts) each [d_expert, d_model] */
    const struct weight *up;   /* (n_experts) each [d_expert, d_model] */
    const struct weight *down; /* (n_experts) each [d_model, d_expert] */
};

/* The element type of a cache's rows (--kv-cache-dtype). f32: reference runs; bf16: the
 * default for the MLA latent (576 values, 1152 bytes a token for GLM-5); fp8: the latent in
 * e4m3 with one f32 scale per 128 values (amax / 448, round to nearest even, saturating) and
 * the rope values in bf16 (656 bytes), the DSA keys the same way without rope (132 bytes).
 * The DSA indexer keys take the latent's type (256 bytes a GLM-5 key in bf16). Rounding a key
 * can move a near-tie across the top-k boundary: on the golden fixtures bf16 keys change one row
 * of dsa_basic's 24 (0.51 of max|logit|: another key selected) where a bf16 latent with f32 keys
 * stays within 3e-3; the goldens allow such rows (golden_parity.h, dsa_flips), and f32 keeps the
 * reference selection. */
enum kv_dtype { KV_DTYPE_F32 = 0, KV_DTYPE_BF16, KV_DTYPE_FP8 };
#define KV_DTYPE_AUTO (-2) /* session option: bf16 for MLA latent caches, f32 for GQA caches */
const char *kv_dtype_name(enum kv_dtype t);
/* "f32", "bf16", "fp8" -> the dtype; -1 for anything else. */
int kv_dtype_parse(const char *s);
/* Bytes of one latent row (kv_rank values + rope values) and of one indexer key row of dim
 * values in type t (the fp8 layouts above: [e4m3 x kv_rank][f32 scale per 128][bf16 x rope]). */
size_t kv_latent_row_bytes(enum kv_dtype t, int kv_rank, int rope);
size_t kv_index_row_bytes(enum kv_dtype t, int dim);
#define KV_FP8_BLOCK 128 /* values per f32 scale in an fp8 row */

/* One MLA layer's slice of the paged cache (glm_moe_dsa, spec/models.md C.8). Per token
 * slot: the normalised KV latent c_kv followed by the roped shared key k_r (never the
 * per-head expanded K/V), and, on layers that own a DSA indexer, the indexer key. Token
 * slot s = block * block_size + offset, as in struct paged_kv. Rows are f32 or bf16 (rounded
 * to nearest even from the f32 the store op gets). */
struct paged_latent {
    void *latent;   /* (n_slots, kv_rank + rope_dim) */
    void *index_k;  /* (n_slots, index_dim), or NULL on layers without an indexer */
    enum kv_dtype dtype;       /* latent rows */
    enum kv_dtype index_dtype; /* index_k rows */
    int block_size;
    int kv_rank;    /* kv_lora_rank */
    int rope_dim;   /* qk_rope_head_dim */
    int index_dim;  /* index_head_dim (0 when index_k is NULL) */
};

/* MLA head geometry. kv_b_proj rows of head h: [h*(nope+v), h*(nope+v)+nope) are W_uk_h
 * (k_nope from the latent), the next v rows are W_uv_h (values from the latent). */
struct mla_dims {
    int n_heads;
    int nope;    /* qk_nope_head_dim */
    int rope;    /* qk_rope_head_dim */
    int v;       /* v_head_dim */
    int kv_rank; /* kv_lora_rank */
};

/* The DSA indexer's selection (spec C.4). */
struct dsa_args {
    int n_heads;        /* index_n_heads */
    int head_dim;       /* index_head_dim */
    int topk;           /* index_topk: keys kept per query */
    float head_scale;   /* index_n_heads^-0.5, multiplies the weights_proj output */
    float score_scale;  /* index_head_dim^-0.5, inside the ReLU */
};

/* A decode graph's key (backend_ops.graph_capture_end / graph_replay): its rows << this | the
 * pass's mode bits (tokens out, sampled, logit edits: engine/forward.c); backends log the rows. */
enum { BACKEND_GRAPH_KEY_MODE_BITS = 3 };

/* How to draw one row's token (backend_ops.sample). */
struct sample_row {
    float temperature; /* 0: greedy */
    float top_p;       /* (0, 1]; 1 = off */
    int32_t top_k;     /* 0 = off */
    float u;           /* the row's uniform draw in [0, 1) (engine/sampler.h: sampler_uniform) */
    float min_p;       /* [0, 1]; 0 = off: after top-k, ids below min_p x the likeliest's probability dropped */
    int32_t mask;      /* 0: every id may be drawn; k > 0: only the ids set in the sample op's masks row
                          k - 1 (a grammar's allowed tokens, a bit an id) */
};

/* One id's change by the logit processors (backend_ops.logits_edit; engine/sampler.h):
 * x += pre; then, where rep != 1, x = x > 0 ? x / rep : x * rep; then x += post (-inf: the id
 * cannot be drawn). */
struct logit_edit {
    int32_t id;
    float pre;  /* logit_bias */
    float rep;  /* repetition_penalty, 1: none */
    float post; /* -(frequency x count + presence); -inf for an id min_tokens holds back */
};

/* weight_load flags: the weight's role. DENSE: read in full for every token (attention, a dense
 * MLP, a shared expert); EXPERT: one of a layer's routed experts; with EXPERT_DOWN, the expert's
 * down projection. A backend may lay a weight out for its role at load. */
enum { WEIGHT_LOAD_DENSE = 1u, WEIGHT_LOAD_EXPERT = 2u, WEIGHT_LOAD_EXPERT_DOWN = 4u };

struct backend_ops {
    const char *name;
    void (*destroy)(struct backend *be);

    /* memory */
    void *(*alloc)(struct backend *be, size_t bytes); /* NULL on failure */
    void (*free)(struct backend *be, void *p);
    void (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*synchronize)(struct backend *be);
    /* Makes a checkpoint weight usable by this backend (CPU: borrow as is). flags: WEIGHT_LOAD_*. */
    enum status (*weight_load)(struct backend *be, const struct weight *host, struct weight *out,
                               unsigned flags, struct err *err);
    /* Optional: a weight of shape's format and shape (its data and scale unused) in memory this
     * backend owns, holding share s of a synthetic weight (format/weight_synth.h: the values
     * weight_synth_fill makes); the bias is shape's. NULL: the binder fills host memory and calls
     * weight_load. */
    enum status (*weight_make)(struct backend *be, const struct weight *shape, const struct weight_synth *s,
                               struct weight *out, unsigned flags, struct err *err);

    /* ops */
    /* out[i, :] = table[tokens[i], :] */
    void (*embed)(struct backend *be, const struct weight *table, const int32_t *tokens, int n,
                  float *out);
    /* y[m, w->rows] = x[m, w->cols] W^T (+ bias) */
    void (*linear)(struct backend *be, const struct weight *w, const float *x, int m, float *y);
    /* y[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps); x == y allowed */
    void (*rmsnorm)(struct backend *be, const float *x, const float *w, int rows, int dim, float eps,
                    float *y);
    /* h += delta; y = rmsnorm(h) (the residual add fused into the norm) */
    void (*add_rmsnorm)(struct backend *be, float *h, const float *delta, const float *w, int rows,
                        int dim, float eps, float *y);
    /* Rotates x[t, h*head_stride + offset ...] by position pos[t], every head. */
    void (*rope)(struct backend *be, float *x, int n_tokens, int n_heads, int head_stride,
                 const struct rope_args *args, const int32_t *pos);
    /* Writes k[t, n_kv*hd] and v[t, n_kv*hd] into cache slots slots[t]. */
    void (*kv_store)(struct backend *be, const struct paged_kv *kv, const float *k, const float *v,
                     int n_tokens, const int32_t *slots);
    /* Causal GQA attention over the paged cache: out[t, h*hd] for n_heads query heads. */
    void (*attention)(struct backend *be, const float *q, const struct paged_kv *kv,
                      const struct attn_batch *b, int n_heads, float scale, float *out);
    /* out[r, :] = silu(gate[r, :]) * up[r, :] */
    void (*silu_mul)(struct backend *be, const float *gate, const float *up, int rows, int dim,
                     float *out);
    /* logits[t, n_experts] -> ids[t, n_used], weights[t, n_used] */
    void (*moe_route)(struct backend *be, const float *logits, int n_tokens,
                      const struct route_args *args, int32_t *ids, float *weights);
    /* Optional: linear(router, x) into logits and moe_route on them in one step. Returns false,
     * having done nothing, when it does not take these arguments (the caller then does both). */
    bool (*router_route)(struct backend *be, const struct weight *router, const float *x, int n_tokens,
                         const struct route_args *args, float *logits, int32_t *ids, float *weights);
    /* Optional: add_rmsnorm(h, delta, norm_w) (h += delta, x = rmsnorm(h) * norm_w; delta may
     * be NULL: no add), then router_route(router, x) in one step. Same results as those ops;
     * false, having done nothing, when it does not take these arguments. */
    bool (*norm_router_route)(struct backend *be, float *h, const float *delta, const float *norm_w, float eps,
                              const struct weight *router, int n_tokens, const struct route_args *args, float *x,
                              float *logits, int32_t *ids, float *weights);
    /* out[t, :] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t, :]) (overwrites out); slots whose id
     * is outside [0, n_experts) add nothing.
     * work: backend_moe_workspace_floats() floats. */
    void (*moe_experts)(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                        const float *weights, const struct moe_args *args, float *work, float *out);
    /* Optional: moe_experts plus the layer's shared expert in one pass: out = moe_experts(...) +
     * down(silu(gate x) * up x) with shared = {gate, up, down}, the shared output added last (the
     * order of the forward's separate MLP and add). False, having done nothing, where the backend
     * does not fold it (shapes or format unlike the routed experts', or its plan's kernel at
     * n_tokens has no shared slot): the caller then runs the shared expert as a dense MLP. */
    bool (*moe_experts_shared)(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                               const float *weights, const struct moe_args *args,
                               const struct weight *const shared[3], float *work, float *out);
    /* ids[i] = -1 where ids[i] is outside [lo, hi): the routed slots of other ranks' experts under
     * expert parallelism, which moe_experts then skips (optional: NULL, no expert parallelism) */
    void (*moe_mask_ids)(struct backend *be, int32_t *ids, size_t n, int lo, int hi);
    /* y[i] += x[i] */
    void (*add)(struct backend *be, float *y, const float *x, size_t n);

    /* ---- MLA + DSA (glm_moe_dsa, spec/models.md part C) ---- */
    /* y[r, :] = w * (x[r, :] - mean) / sqrt(var + eps) + b, population variance; x == y allowed */
    void (*layernorm)(struct backend *be, const float *x, const float *w, const float *b, int rows, int dim,
                      float eps, float *y);
    /* Cache slot slots[t] of kv gets [w * rmsnorm(ckv[t, :kv_rank]) | ckv[t, kv_rank:]] (the
     * rope key already rotated); kv->index_k[slots[t]] gets idx_k[t, :] when idx_k is not NULL.
     * ckv: (n_tokens, kv_rank + rope_dim); idx_k: (n_tokens, index_dim). */
    void (*mla_store)(struct backend *be, const struct paged_latent *kv, const float *ckv, const float *w,
                      float eps, const float *idx_k, int n_tokens, const int32_t *slots);
    /* Absorbs W_uk into the query: q_abs[t, h, :] = [W_uk_h^T q[t, h, :nope] | q[t, h, nope:]].
     * q: (n_tokens, n_heads, nope + rope); q_abs: (n_tokens, n_heads, kv_rank + rope). */
    void (*mla_absorb_q)(struct backend *be, const struct weight *kv_b, const struct mla_dims *m,
                         const float *q, int n_tokens, float *q_abs);
    /* Attention in latent space, every head on the one latent row per key:
     * o_lat[t, h, :] = sum_j softmax_j(scale * q_abs[t, h, :] . latent_j) c_kv_j over the keys j of
     * sel[t, 0..sel_k) (positions, ascending, -1 padded) or, when sel is NULL, over 0..pos[t]. */
    void (*mla_attention)(struct backend *be, const float *q_abs, const struct paged_latent *kv,
                          const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k, float scale,
                          float *o_lat);
    /* out[t, h * v + j] = W_uv_h[j, :] . o_lat[t, h, :]; out: (n_tokens, n_heads * v). */
    void (*mla_expand_o)(struct backend *be, const struct weight *kv_b, const struct mla_dims *m,
                         const float *o_lat, int n_tokens, float *out);
    /* DSA indexer: for every token, sel[t, 0..topk) = the positions of the topk highest
     * I(t, j) = sum_h w_idx[t, h] * head_scale * relu(score_scale * q_idx[t, h, :] . index_k_j)
     * over keys j <= pos[t] (ties to the lower position), ascending; all of 0..pos[t] when
     * pos[t] < topk; -1 after the last. q_idx: (n_tokens, n_heads, head_dim); w_idx:
     * (n_tokens, n_heads); work: backend_dsa_workspace_floats() floats. */
    void (*dsa_select)(struct backend *be, const float *q_idx, const float *w_idx, const struct paged_latent *kv,
                       const struct attn_batch *b, const struct dsa_args *a, float *work, int32_t *sel);

    /* The expanded form of MLA attention (spec C.3) for rows that attend densely (every causal
     * key, no DSA selection): keys 0..seq_keys[s] - 1 of each block-table row s are expanded
     * through kv_b once, K_h = [W_uk_h c_kv | k_r] and V_h = W_uv_h c_kv, and every head attends
     * over them as ordinary causal attention of head dim nope + rope. q: (n_tokens, n_heads,
     * nope + rope), roped; out: (n_tokens, n_heads * v), what mla_absorb_q, mla_attention (sel
     * NULL) and mla_expand_o give together. seq_keys: host memory, (n_seqs), each row's max pos + 1
     * (0: a row no token uses). NULL on a backend that has only the absorbed form. */
    void (*mla_attention_expanded)(struct backend *be, const float *q, const struct weight *kv_b,
                                   const struct mla_dims *m, const struct paged_latent *kv,
                                   const struct attn_batch *b, int n_seqs, const int32_t *seq_keys, float scale,
                                   float *out);
    /* true when this backend's plan runs dense MLA rows in the expanded form for a pass of
     * n_tokens query rows over n_keys keys in all (the sum of seq_keys); NULL: never. */
    bool (*mla_prefers_expanded)(struct backend *be, int n_tokens, int64_t n_keys);

    /* ---- optional fast paths (NULL: the forward composes the ops above instead) ---- */
    /* ys[j][m, ws[j]->rows] = x ws[j]^T (+ bias) for j < n_w <= 3: weights sharing one input
     * (q/k/v) in one pass where the backend can. */
    void (*linear_multi)(struct backend *be, int n_w, const struct weight *const *ws, const float *x, int m,
                         float *const *ys);
    /* rope on each of n_jobs <= ROPE_MAX_JOBS tensors at the same positions (args->offset unused:
     * each job's own), as that many rope calls would give, in one pass. */
    void (*rope_multi)(struct backend *be, int n_jobs, const struct rope_job *jobs, int n_tokens,
                       const struct rope_args *args, const int32_t *pos);
    /* Per token: per-head RMSNorm of q and k (skipped when q_norm is NULL), RoPE on both, then
     * k and v into the cache slots: rmsnorm + rope + rope + kv_store in one op. */
    void (*attn_prep)(struct backend *be, float *q, float *k, const float *v, int n_tokens, int n_heads,
                      const float *q_norm, const float *k_norm, float eps, const struct rope_args *rope,
                      const int32_t *pos, const struct paged_kv *kv, const int32_t *slots);
    /* ids[r] = argmax of logits[r, :vocab] (lowest id on ties), -1 if the row holds a NaN. */
    void (*argmax)(struct backend *be, const float *logits, int rows, int vocab, int32_t *ids);
    /* ids[r] = a token drawn with params[r] (backend memory) from softmax(logits[r] / T) cut to
     * the top_k most likely and then to the smallest set holding top_p of the mass; the argmax
     * when T == 0; -1 if the row holds a NaN. A row with params[r].mask = k > 0 draws only among
     * the ids set in masks[(k - 1) * ((vocab + 31) / 32) ...] (backend memory; NULL when no row
     * has a mask), as if every other logit were -inf; its NaN guard looks at those ids alone.
     * min_p cuts after top-k and before top-p, as engine/sampler.c does. */
    void (*sample)(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
                   const uint32_t *masks, int32_t *ids);
    /* Log-probabilities of rows just drawn (base/logprobs.h: logprobs_row, the reference): lp[r] of
     * ids[r] and the k likeliest into top_ids / top_lp [r * k ...], each row read through its
     * params[r].mask as the sample op reads it (masks NULL: none). All backend memory. */
    void (*logprobs)(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
                     const uint32_t *masks, const int32_t *ids, int k, float *lp, int32_t *top_ids, float *top_lp);
    /* Row r of logits (rows x vocab, backend memory) gets edits[start[r] .. start[r + 1]) (both
     * backend memory; at most one edit an id in a row), in place. */
    void (*logits_edit)(struct backend *be, float *logits, int rows, int vocab, const int32_t *start,
                        const struct logit_edit *edits);
    /* Replays the op sequence captured under key; false when there is none. */
    bool (*graph_replay)(struct backend *be, uint64_t key);
    /* Starts recording the ops that follow instead of running them; false if not possible. */
    bool (*graph_capture_begin)(struct backend *be);
    /* Stops recording and keeps the graph under key; false (nothing kept) on failure. */
    bool (*graph_capture_end)(struct backend *be, uint64_t key);
};

struct backend {
    const struct backend_ops *ops;
    void *impl; /* backend-private state */
};

/* Scratch the moe_experts op needs, in floats. */
size_t backend_moe_workspace_floats(int n_tokens, int n_used, int d_model, int d_expert);
/* Scratch the dsa_select op needs, in floats. */
size_t backend_dsa_workspace_floats(int n_tokens, int topk);

enum status backend_cpu_create(struct backend *be, struct err *err);

struct backend_cpu_opts {
    /* every token's results independent of the other tokens of its batch, bit for bit (a
     * server's output then never depends on its neighbours); slower prefill */
    bool batch_invariant;
};
enum status backend_cpu_create_opts(struct backend *be, const struct backend_cpu_opts *o, struct err *err);
/* Safe on a zeroed struct. */
void backend_destroy(struct backend *be);

#ifdef __cplusplus
}
#endif

#endif
