/* attention.h — the attention launchers: the portable prefill/split kernels, the split decode
 * attention, the tensor-core prefill attention.
 *
 * Plain C: every launcher enqueues on `stream`, checks its arguments only as far as a launch
 * needs and returns the launch's cudaError_t (callers check it with CUDA_CHECK); pointers are
 * device memory unless a comment says otherwise. Templates and kernels stay in the .cu files.
 */
#ifndef MOESERVE_BACKEND_CUDA_ATTENTION_ATTENTION_H
#define MOESERVE_BACKEND_CUDA_ATTENTION_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- cuda_attention.cu ---- */
/* A tile configuration of the attention kernel. rows: query rows (token x
 * head of one KV group) per block; keys: keys staged per step. */
struct cuda_attn_cfg {
    int rows;
    int keys;
    int threads;       /* multiple of 32 */
    size_t smem_bytes; /* filled by cuda_attention_fit() */
};
/* Shrinks cfg (keys first, then rows) until its dynamic shared memory for
 * head_dim fits in budget; false if nothing fits. */
int cuda_attention_fit(struct cuda_attn_cfg *cfg, int head_dim, size_t budget);
/* Floats of workspace cuda_attention needs for n_splits > 1 (0 otherwise). */
size_t cuda_attention_workspace_floats(int n_tokens, int n_heads, int head_dim, int n_splits);
/* Causal paged GQA attention (see backend_ops.attention). kv and b are host
 * structs of device pointers. n_splits == 1: the tiled (prefill) kernel
 * writes out directly; n_splits > 1: every block handles one of n_splits key
 * ranges and a second kernel merges the partial softmaxes kept in work. cfg
 * must have passed cuda_attention_fit(). */
cudaError_t cuda_attention(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                           const struct attn_batch *b, int n_heads, float scale, float *out,
                           const struct cuda_attn_cfg *cfg, int n_splits, float *work);

/* ---- cuda_attn_decode.cu (split decode attention, merged by the last split's block) ---- */
/* Whether cuda_attn_decode() takes this shape: group <= 16 query heads per KV head, head_dim a
 * multiple of 4 up to 128, 1..64 splits, its static shared memory within smem_budget. */
int cuda_attn_decode_supported(int group, int head_dim, int n_splits, size_t smem_budget);
/* Like cuda_attention() with n_splits > 1 (work as sized by cuda_attention_workspace_floats),
 * in one kernel: sem holds n_tokens * n_kv_heads zeroed counters and is left zeroed. With pdl,
 * each block reads the batch metadata and its first round of old keys and values
 * before it waits for the kernel before it (keys below pos + 1 - n_tokens: no kernel of the pass
 * writes them). cluster: 1, or CUDA_ATTN_CLUSTER (caps "clusters", n_splits a multiple of it):
 * that many consecutive splits form a thread block cluster and merge in shared memory: push
 * (the splits store their partials into the cluster leader's shared memory,
 * cuda_attn_decode_push_smem bytes a block in all) or pull (the leader loads them from the
 * others'). */
enum { CUDA_ATTN_CLUSTER = 8 };
cudaError_t cuda_attn_decode(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                             const struct attn_batch *b, int n_heads, float scale, float *out, int n_splits,
                             float *work, int *sem, int pdl, int cluster, int push);
/* The shared memory (static and dynamic) of a cuda_attn_decode block with clusters and push. */
size_t cuda_attn_decode_push_smem(int group, int head_dim);

/* ---- cuda_attention_mma.cu (prefill on bf16 tensor cores: "attn_prefill_mma_bf16") ---- */
/* rows: query rows per block (16 per warp, 16..128); keys: keys staged per step (multiple of
 * 16, up to 256); stages 2: the next step's K/V are copied (cp.async) during this one's MMAs,
 * 1: not. */
struct cuda_attn_mma_cfg {
    int rows;
    int keys;
    int stages;
    int prec;          /* 0: q, K, V, P as bf16 hi + lo (fp32-grade); 1: P and V single bf16;
                        * 2: all single bf16 (bf16-grade); 1 and 2 for head_dim 128 only */
    int threads;       /* rows / 16 * 32, set by cuda_attention_mma_fit() */
    size_t smem_bytes; /* set by cuda_attention_mma_fit() */
};
/* Dynamic shared memory of that tile for head_dim (the planner's formula for the variant). */
size_t cuda_attention_mma_smem(int rows, int keys, int head_dim, int stages);
/* Rounds cfg to the kernel's steps, then shrinks it (keys to 32, rows to 64, stages to 1, keys
 * and rows to 16) until it fits budget; false for a head_dim other than 64, 128, 256 or when
 * not even 16 x 16 fits. */
int cuda_attention_mma_fit(struct cuda_attn_mma_cfg *cfg, int head_dim, size_t budget);
/* Whether the kernel takes this head_dim and these pointers (16-byte aligned q and cache). */
int cuda_attention_mma_supported(const float *q, const struct paged_kv *kv, const float *out);
/* As cuda_attention with n_splits == 1, on mma.sync (q, K, V, P split into bf16 hi + lo, fp32
 * accumulation). cfg must have passed cuda_attention_mma_fit() for kv->head_dim. */
cudaError_t cuda_attention_mma(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                               const struct attn_batch *b, int n_heads, float scale, float *out,
                               const struct cuda_attn_mma_cfg *cfg);

#ifdef __cplusplus
}
#endif

#endif
