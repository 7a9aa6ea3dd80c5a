/* cuda_backend_internal.h — inside the CUDA backend: its state and the pieces its files share.
 *
 * The backend is split by job: backend_cuda.c (the ops table, creation from the plan, teardown,
 * test hooks), cuda_memory.c (device memory, scratch, weight upload, the experts' tables),
 * cuda_graphs.c (decode steps captured and replayed), cuda_dispatch.c (the plan's dispatch
 * table -> the launchers of the linears and the experts), cuda_mla_expand.c (the expanded MLA
 * form), cuda_ops.c (every other op). Nothing
 * here is API: backend_cuda.h is.
 *
 * defines: struct cuda_backend, struct cuda_graph, struct moe_table, cuda_ctx(), CHECK(),
 *          aligned16(), and the functions below
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_BACKEND_INTERNAL_H
#define MOESERVE_BACKEND_CUDA_CUDA_BACKEND_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/common/common.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode/decode.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/mla/mla.h"
#include "backend/cuda/moe/moe.h"
#include "plan/plan.h"

/* One captured op sequence (a decode step of some batch size), replayed by key. */
struct cuda_graph {
    uint64_t key;
    cudaGraphExec_t exec;
    uint64_t last_use;  /* the replay tick it last ran at (the least recent goes when the cache is full) */
    size_t n_nodes;     /* kernels and copies in it */
    long long dev_bytes; /* device memory its instantiation took (cudaMemGetInfo before / after) */
    long long host_bytes; /* the process's resident memory it added (/proc/self/statm before / after) */
};

/* The graph cache's bound: the forward's keys are graph sizes (plan_decode_graph_sizes) x 4
 * sampling modes, far fewer; past it the least recently replayed graph is dropped. */
enum { CUDA_MAX_GRAPHS = 128 };

/* The per-expert weight tables of one MoE layer in device memory: gate, up, down. */
struct moe_table {
    const struct weight *key; /* the layer's gate array (host), identifies the layer */
    int n_experts;          /* entries a projection: the routed experts (+ 1 with the shared one) */
    struct cuda_wdev *host; /* (3 * n_experts) what dev holds, to detect a changed array */
    struct cuda_wdev *dev;  /* (3 * n_experts) device */
};

/* A dense NVFP4 weight's resident bf16 copy (cuda_dense_copy.c), keyed by its data pointer. */
struct cuda_dense_copy {
    const void *data;
    const uint16_t *bf16;
};

struct cuda_backend {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    struct plan plan;
    size_t smem_budget; /* bytes of shared memory a block may use */
    int sm_count;
    struct cuda_attn_cfg attn_prefill; /* as planned, fitted per head_dim at each call */
    struct cuda_attn_cfg attn_decode;  /* rows == 0: one KV group of one token */
    struct cuda_attn_mma_cfg attn_mma; /* the plan's attn_prefill_mma_bf16 tile; rows 0: not chosen */
    enum cuda_gemm_tile tile_linear;
    enum cuda_gemm_tile tile_moe;
    int force_splits; /* tests: > 0 split count, -1 never split, 0 auto */
    struct cuda_mla_cfg mla_attn; /* MLA latent attention as planned ("mla_attention"), fitted per call */
    struct cuda_mla_cfg mla_mma;  /* the plan's tensor-core tile (rows, keys, stages) when it chose
                                     mla_latent_attn_mma_bf16; rows 0 otherwise */
    bool mla_wgmma;               /* the plan chose mla_latent_attn_wgmma_bf16 */
    struct cuda_dsa_cfg dsa;      /* DSA score tile as planned ("dsa_index"), fitted per call */
    void *scratch;    /* device: bf16 activations, attention partials */
    size_t scratch_bytes;
    void *expand_buf; /* device: the expanded MLA form's K/V (cuda_mla_expand.c), never captured */
    size_t expand_bytes;
    int *sem;         /* device: arrival counters of the split decode attention, zero between launches */
    size_t sem_count;
    bool legacy_decode; /* tests: the older split attention + merge kernel pair */
    bool pdl;           /* decode kernels use programmatic dependent launch (device_caps.pdl) */
    bool attn_cluster;   /* decode attention: splits merged in a cluster's shared memory (caps "clusters") */
    bool attn_push;      /* ... the splits pushing their partials to the leader where that fits (else pulled) */
    int moe_smem_min;    /* MoE mma: the weights through shared memory from this many tokens on (0: never) */
    int attn_prec;         /* prefill tensor-core attention operands: 0 hi + lo, 1 P and V bf16, 2 all bf16 */
    struct cuda_dense_copy *dense_copies; /* (cap_dense_copies) open-addressed, n_dense_copies in use */
    size_t n_dense_copies, cap_dense_copies;
    size_t dense_copy_budget, dense_copy_bytes; /* bytes the copies may take / take */
    bool dense_copy_full;                       /* a weight went without one (said once) */
    void **owned; /* (n_owned) device allocations holding weights */
    size_t n_owned, cap_owned;
    struct moe_table *tables; /* (n_tables) */
    int n_tables, cap_tables;
    struct cuda_wdev *tmp; /* (tmp_cap) host scratch for building a table */
    size_t tmp_cap;
    struct cuda_wgmma_tile wg_moe, wg_linear; /* the planned wgmma tiles, fitted per call */
    bool wgmma_loads;                         /* the wgmma GEMMs' sm_90a image loaded on this device */
    struct cuda_graph *graphs; /* (CUDA_MAX_GRAPHS) captured decode steps, n_graphs of them in use */
    int n_graphs;
    uint64_t graph_tick;       /* replays and captures so far: the graphs' clock */
    long long graph_dev_bytes, graph_host_bytes; /* what the graphs held now take (their counts summed) */
    long long graph_captures;  /* graphs made since start (evicted and dropped ones too) */
    bool capturing;
    bool capture_broken; /* an op could not be recorded: the capture must be thrown away */
    struct cuda_error_sink sink;
};

static inline struct cuda_backend *cuda_ctx(struct backend *be)
{
    return (struct cuda_backend *)be->impl;
}

#define CHECK(c, call) CUDA_CHECK(&(c)->sink, call)

static inline bool aligned16(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

/* ---- cuda_memory.c: the memory ops, scratch, weights ---- */
void *cu_alloc(struct backend *be, size_t bytes);
void cu_free(struct backend *be, void *p);
void cu_upload(struct backend *be, void *dst, const void *src, size_t bytes);
void cu_download(struct backend *be, void *dst, const void *src, size_t bytes);
void cu_synchronize(struct backend *be);
/* cuda_mla_gemm.c: absorb / expand as head-batched cuBLAS GEMMs (plan_mla_proj_gemm()); false
 * when the call is not theirs (nothing launched). */
bool cuda_mla_absorb_gemm(struct cuda_backend *c, const struct weight *kv_b, const struct mla_dims *m, const float *q,
                          int n_tokens, float *q_abs);
bool cuda_mla_expand_gemm(struct cuda_backend *c, const struct weight *kv_b, const struct mla_dims *m,
                          const float *o_lat, int n_tokens, float *out);
void *cuda_scratch_get(struct cuda_backend *c, size_t bytes);
/* The expand buffer, at least `bytes` (grown outside captures only; NULL on failure). */
void *cuda_expand_buf_get(struct cuda_backend *c, size_t bytes);
int *cuda_sem_get(struct cuda_backend *c, size_t n);
enum status cu_weight_load(struct backend *be, const struct weight *host, struct weight *out, unsigned flags, struct err *err);
/* p, a device allocation, freed with the backend (false: out of host memory, p not taken). */
bool cuda_own(struct cuda_backend *c, void *p);
/* ---- cuda_dense_copy.c ---- */
/* w (loaded, flags its role) given a resident bf16 copy if it is a dense NVFP4 weight and the copies
 * stay within dense_copy_budget; nothing otherwise (it then runs through per-call copies). */
void cuda_dense_copy_make(struct cuda_backend *c, const struct weight *w, unsigned flags);
/* The resident bf16 copy (row-major, without scale2) of the weight whose data is `data`, or NULL. */
const uint16_t *cuda_dense_copy_find(const struct cuda_backend *c, const void *data);
enum status cu_weight_make(struct backend *be, const struct weight *shape, const struct weight_synth *s,
                           struct weight *out, unsigned flags, struct err *err);
/* shared: NULL, or a shared expert's gate, up and down (the routed experts' shapes and format), table
 * index n_experts */
const struct cuda_wdev *cuda_moe_table_get(struct cuda_backend *c, const struct moe_args *a,
                                           const struct weight *const *shared);

/* ---- cuda_graphs.c ---- */
void cuda_graphs_drop(struct cuda_backend *c);
bool cu_graph_replay(struct backend *be, uint64_t key);
bool cu_graph_capture_begin(struct backend *be);
bool cu_graph_capture_end(struct backend *be, uint64_t key);

/* ---- cuda_dispatch.c: the plan's choice for the linears and the routed experts ---- */
struct cuda_wdev cuda_wdev_of(const struct weight *w);
void cu_linear(struct backend *be, const struct weight *w, const float *x, int m, float *y);
void cu_linear_multi(struct backend *be, int n_w, const struct weight *const *ws, const float *x, int m, float *const *ys);
void cu_moe_experts(struct backend *be, const float *x, int n_tokens, const int32_t *ids, const float *weights, const struct moe_args *a, float *work, float *out);
bool cu_moe_experts_shared(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                           const float *weights, const struct moe_args *a, const struct weight *const shared[3],
                           float *work, float *out);

/* ---- cuda_ops.c ---- */
void cu_embed(struct backend *be, const struct weight *table, const int32_t *tokens, int n, float *out);
void cu_attn_prep(struct backend *be, float *q, float *k, const float *v, int n_tokens, int n_heads, const float *q_norm, const float *k_norm, float eps, const struct rope_args *rope, const int32_t *pos, const struct paged_kv *kv, const int32_t *slots);
void cu_argmax(struct backend *be, const float *logits, int rows, int vocab, int32_t *ids);
void cu_sample(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
               const uint32_t *masks, int32_t *ids);
void cu_logprobs(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
                 const uint32_t *masks, const int32_t *ids, int k, float *lp, int32_t *top_ids, float *top_lp);
void cu_logits_edit(struct backend *be, float *logits, int rows, int vocab, const int32_t *start,
                    const struct logit_edit *edits);
void cu_rmsnorm(struct backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y);
void cu_add_rmsnorm(struct backend *be, float *h, const float *delta, const float *w, int rows, int dim, float eps, float *y);
void cu_rope(struct backend *be, float *x, int n_tokens, int n_heads, int head_stride, const struct rope_args *args, const int32_t *pos);
void cu_rope_multi(struct backend *be, int n_jobs, const struct rope_job *jobs, int n_tokens,
                   const struct rope_args *args, const int32_t *pos);
void cu_kv_store(struct backend *be, const struct paged_kv *kv, const float *k, const float *v, int n_tokens, const int32_t *slots);
void cu_attention(struct backend *be, const float *q, const struct paged_kv *kv, const struct attn_batch *b, int n_heads, float scale, float *out);
void cu_silu_mul(struct backend *be, const float *gate, const float *up, int rows, int dim, float *out);
bool cu_router_route(struct backend *be, const struct weight *router, const float *x, int n_tokens, const struct route_args *args, float *logits, int32_t *ids, float *weights);
bool cu_norm_router_route(struct backend *be, float *h, const float *delta, const float *norm_w, float eps, const struct weight *router, int n_tokens, const struct route_args *args, float *x, float *logits, int32_t *ids, float *weights);
void cu_moe_route(struct backend *be, const float *logits, int n_tokens, const struct route_args *args, int32_t *ids, float *weights);
void cu_add(struct backend *be, float *y, const float *x, size_t n);
void cu_moe_mask_ids(struct backend *be, int32_t *ids, size_t n, int lo, int hi);
void cu_layernorm(struct backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps, float *y);
void cu_mla_store(struct backend *be, const struct paged_latent *kv, const float *ckv, const float *w, float eps, const float *idx_k, int n_tokens, const int32_t *slots);
void cu_mla_absorb_q(struct backend *be, const struct weight *kv_b, const struct mla_dims *m, const float *q, int n_tokens, float *q_abs);
void cu_mla_expand_o(struct backend *be, const struct weight *kv_b, const struct mla_dims *m, const float *o_lat, int n_tokens, float *out);
void cu_mla_attention(struct backend *be, const float *q_abs, const struct paged_latent *kv, const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k, float scale, float *o_lat);
void cu_dsa_select(struct backend *be, const float *q_idx, const float *w_idx, const struct paged_latent *kv, const struct attn_batch *b, const struct dsa_args *a, float *work, int32_t *sel);

/* ---- cuda_mla_expand.c ---- */
void cu_mla_attention_expanded(struct backend *be, const float *q, const struct weight *kv_b, const struct mla_dims *m, const struct paged_latent *kv, const struct attn_batch *b, int n_seqs, const int32_t *seq_keys, float scale, float *out);
bool cu_mla_prefers_expanded(struct backend *be, int n_tokens, int64_t n_keys);

#endif
