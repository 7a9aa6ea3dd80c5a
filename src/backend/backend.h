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
 *          struct rope_args, struct route_args, struct moe_args, backend_moe_workspace_floats(),
 *          backend_cpu_create(), backend_destroy()
 */
#ifndef MOESERVE_BACKEND_BACKEND_H
#define MOESERVE_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/weight.h"
#include "base/status.h"

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
};

struct rope_args {
    int dim;                /* rotated dims per head */
    int offset;             /* first rotated dim inside the head */
    bool interleaved;       /* pairs (2i, 2i+1) written de-interleaved; else (i, i + dim/2) */
    float attention_factor; /* scales cos and sin (YaRN) */
    const float *inv_freq;  /* (dim/2) */
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

struct backend_ops {
    const char *name;
    void (*destroy)(struct backend *be);

    /* memory */
    void *(*alloc)(struct backend *be, size_t bytes); /* NULL on failure */
    void (*free)(struct backend *be, void *p);
    void (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*synchronize)(struct backend *be);
    /* Makes a checkpoint weight usable by this backend (CPU: borrow as is). */
    enum status (*weight_load)(struct backend *be, const struct weight *host, struct weight *out,
                               struct err *err);

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
    /* out[t, :] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t, :]) (overwrites out).
     * work: backend_moe_workspace_floats() floats. */
    void (*moe_experts)(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                        const float *weights, const struct moe_args *args, float *work, float *out);
    /* y[i] += x[i] */
    void (*add)(struct backend *be, float *y, const float *x, size_t n);
};

struct backend {
    const struct backend_ops *ops;
    void *impl; /* backend-private state */
};

/* Scratch the moe_experts op needs, in floats. */
size_t backend_moe_workspace_floats(int n_tokens, int n_used, int d_model, int d_expert);

enum status backend_cpu_create(struct backend *be, struct err *err);
/* Safe on a zeroed struct. */
void backend_destroy(struct backend *be);

#endif
