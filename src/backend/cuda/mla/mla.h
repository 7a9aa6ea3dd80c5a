/* mla.h — the glm_moe_dsa launchers: MLA over the latent cache, the DSA indexer.
 *
 * Plain C: every launcher enqueues on `stream`, checks its arguments only as far as a launch
 * needs and returns the launch's cudaError_t (callers check it with CUDA_CHECK); pointers are
 * device memory unless a comment says otherwise. Templates and kernels stay in the .cu files.
 */
#ifndef MOESERVE_BACKEND_CUDA_MLA_MLA_H
#define MOESERVE_BACKEND_CUDA_MLA_MLA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- cuda_mla.cu (glm_moe_dsa MLA over the latent cache; backend_ops.mla_*) ---- */
/* backend_ops.mla_store; kv is a host struct of device pointers. */
cudaError_t cuda_mla_store(cudaStream_t stream, const struct paged_latent *kv, const float *ckv, const float *w,
                           float eps, const float *idx_k, int n_tokens, const int32_t *slots, int pdl);
/* backend_ops.mla_absorb_q / mla_expand_o with kv_b_proj (format fmt) as w. mma: the plan's mla_proj
 * entry chose the tensor-core kernels (mla_proj_mma_bf16), which take the calls their limits allow
 * (one token, NVFP4: *_mma_fits()); the fp32 kernels take the rest.
 * pdl: launched as a dependent of the kernel before it (it reads kv_b before its wait). */
cudaError_t cuda_mla_absorb_q(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                              const struct mla_dims *m, const float *q, int n_tokens, float *q_abs, int mma, int pdl);
cudaError_t cuda_mla_expand_o(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                              const struct mla_dims *m, const float *o_lat, int n_tokens, float *out, int mma,
                              int pdl);
/* cuda_mla_absorb_mma.cu: the absorption at one token from an NVFP4 kv_b on bf16 tensor cores */
int cuda_mla_absorb_mma_fits(enum weight_format fmt, const struct cuda_wdev *w, const struct mla_dims *m,
                             int n_tokens);
cudaError_t cuda_mla_absorb_mma(cudaStream_t stream, const struct cuda_wdev *w, const struct mla_dims *m,
                                const float *q, float *q_abs, int pdl);
/* cuda_mla_expand_mma.cu: the value expansion at one token from an NVFP4 kv_b on bf16 tensor cores */
int cuda_mla_expand_mma_fits(enum weight_format fmt, const struct cuda_wdev *w, const struct mla_dims *m,
                             int n_tokens);
cudaError_t cuda_mla_expand_mma(cudaStream_t stream, const struct cuda_wdev *w, const struct mla_dims *m,
                                const float *o_lat, float *out, int pdl);
/* Latent attention tile: rows = heads of one token per block, keys per step; stages 1:
 * queries, accumulators and keys in shared memory, 0: read from global memory. */
struct cuda_mla_cfg {
    int rows;
    int keys;
    int threads;       /* multiple of 32 */
    int stages;        /* 1 staged, 0 unstaged */
    size_t smem_bytes; /* filled by cuda_mla_attention_fit() */
};
/* Shrinks cfg (keys, then rows, then unstaged) until plan_mla_attention_smem() fits budget. */
int cuda_mla_attention_fit(struct cuda_mla_cfg *cfg, int n_heads, int k_dim, int v_dim, size_t budget);
size_t cuda_mla_attention_workspace_floats(int n_tokens, int n_heads, int kv_rank, int n_splits);
/* backend_ops.mla_attention; n_splits > 1: split-K partials in work, then a merge. cfg must
 * have passed cuda_mla_attention_fit() for these dims. */
cudaError_t cuda_mla_attention(cudaStream_t stream, const float *q_abs, const struct paged_latent *kv,
                               const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k, float scale,
                               float *o_lat, const struct cuda_mla_cfg *cfg, int n_splits, float *work);

/* The split partials' merge of both latent attention kernels: part (n_splits, n_th, R + 2) of
 * (m, l, unnormalised O) rows -> out (n_th, R). */
cudaError_t cuda_mla_merge(cudaStream_t stream, const float *part, int n_splits, int n_th, int R, float *out, int pdl);

/* ---- cuda_mla_mma.cu (latent attention on bf16 tensor cores over a bf16 latent cache) ---- */
/* Whether the kernel takes these dims and tile (rows: heads per block, 16/32/64; keys per tile:
 * 16/32/64; stages 1 or 2) within budget bytes of shared memory. */
int cuda_mla_mma_fits(int n_heads, int k_dim, int v_dim, int rows, int keys, int stages, size_t budget);
/* Whether the kernel reads kv's latent rows: bf16, or fp8 with the aligned dims it needs. */
int cuda_mla_mma_takes_cache(const struct paged_latent *kv);
/* backend_ops.mla_attention with that tile (kv as cuda_mla_mma_takes_cache() takes); n_splits > 1:
 * partials in work (cuda_mla_attention_workspace_floats()), then cuda_mla_merge(). */
cudaError_t cuda_mla_attention_mma(cudaStream_t stream, const float *q_abs, const struct paged_latent *kv,
                                   const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k,
                                   float scale, float *o_lat, int rows, int keys, int stages, int n_splits,
                                   float *work, int pdl);

/* ---- cuda_mla_wgmma.cu (latent attention on wgmma, sm_90a: 64 head rows a block) ---- */
/* Whether the kernel takes these dims (PLAN_MLA_WGMMA_DK, PLAN_MLA_WGMMA_R) within budget bytes. */
int cuda_mla_wgmma_fits(int n_heads, int k_dim, int v_dim, size_t budget);
/* bf16, or fp8 with the aligned dims it needs (as cuda_mla_mma_takes_cache()). */
int cuda_mla_wgmma_takes_cache(const struct paged_latent *kv);
/* backend_ops.mla_attention; n_splits > 1: partials in work, then cuda_mla_merge(). */
cudaError_t cuda_mla_attention_wgmma(cudaStream_t stream, const float *q_abs, const struct paged_latent *kv,
                                     const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k,
                                     float scale, float *o_lat, int n_splits, float *work, int pdl);

/* ---- cuda_mla_expand.cu (the expanded form's gather and assembly; cuda_mla_expand.c runs it) ---- */
/* Compact rows [0, rows) (rows a multiple of the block size): block b of them holds keys
 * blk_idx[b] * bs .. of block-table row blk_seq[b] (zeros past seq_keys[that row]); the latent
 * part into lat_out (rows, kv_rank) and the rope key into rope_out (rows, rope), decoded to f32. */
cudaError_t cuda_mla_expand_gather(cudaStream_t stream, const struct paged_latent *kv, const struct attn_batch *b,
                                   const int32_t *blk_seq, const int32_t *blk_idx, const int32_t *seq_keys, int rows,
                                   float *lat_out, float *rope_out);
/* e: (rows, n_heads, nope + v) = kv_b's output; k, v: (rows, n_heads, hd), hd >= nope + rope, v:
 * K = [k_nope | rope key | 0], V = [v | 0]. */
cudaError_t cuda_mla_expand_assemble(cudaStream_t stream, const float *e, const float *rope_in, int rows,
                                     const struct mla_dims *m, int hd, float *k, float *v);
/* y (rows, hd_out) = x (rows, hd_in) cut or padded with zeros. */
cudaError_t cuda_mla_expand_repad(cudaStream_t stream, const float *x, int rows, int hd_in, int hd_out, float *y);

/* ---- cuda_dsa.cu (the DSA indexer; backend_ops.layernorm, dsa_select) ---- */
cudaError_t cuda_layernorm(cudaStream_t stream, const float *x, const float *w, const float *b, int rows, int dim,
                           float eps, float *y, int pdl);
/* The score kernel's tile: keys per block (= threads); stages 1: query and keys staged in
 * shared memory, 0: read from global memory. */
struct cuda_dsa_cfg {
    int mma;      /* 1: dsa_index_score_mma_bf16 where cuda_dsa_mma_fits() the shapes (else per_warp's) */
    int per_warp; /* 1: a warp per key (dsa_index_score_warp_fp32; keys = its 8 warps), where it fits */
    int keys;
    int stages;
    size_t smem_bytes; /* filled by cuda_dsa_fit() */
};
/* per_warp: keeps it where its shared memory fits, else the key-per-thread tiles; those:
 * shrinks keys (multiples of 32), then goes unstaged, until the tile fits budget. */
int cuda_dsa_fit(struct cuda_dsa_cfg *cfg, int idx_heads, int idx_dim, size_t budget);
/* Scores of rows [row0, row0 + n_rows) into scores (n_rows, ctx); rows with pos < topk are
 * skipped. key_blocks blocks per row stride over the keys. */
cudaError_t cuda_dsa_scores(cudaStream_t stream, const float *q_idx, const float *w_idx,
                            const struct paged_latent *kv, const struct attn_batch *b, const struct dsa_args *a,
                            int row0, int n_rows, int ctx, const struct cuda_dsa_cfg *cfg, int key_blocks,
                            float *scores);
/* cuda_dsa_mma.cu: the same scores on bf16 tensor cores (not bit-identical with the CPU's:
 * ~1e-6 of their size), for H_I <= 32 heads and D_I a multiple of 16 up to 128, any key dtype. */
int cuda_dsa_mma_fits(int idx_heads, int idx_dim, enum kv_dtype keys);
#define CUDA_DSA_MMA_WARPS 4     /* warps a block */
#define CUDA_DSA_MMA_KEYS 128    /* keys a block scores a step: 4 warps x 4 tiles of 8 (f32 keys: 2) */
#define CUDA_DSA_MMA_BLOCKS_SM 4 /* blocks an SM (launch bounds: <= 128 registers) */
cudaError_t cuda_dsa_scores_mma(cudaStream_t stream, const float *q_idx, const float *w_idx,
                                const struct paged_latent *kv, const struct attn_batch *b, const struct dsa_args *a,
                                int row0, int n_rows, int ctx, int key_blocks, float *scores, int pdl);
/* sel rows [row0, row0 + n_rows) from those scores (backend_ops.dsa_select's contract). Rows of
 * up to DSA_TOPK_REG_KEYS keys: one kernel, the row in registers; longer: a histogram of the
 * rows' top bits over many blocks first, in hist (cuda_dsa_topk_hist_floats(ctx) 4-byte counters a
 * row, scratch the call zeroes), then the select, the row staged in shared memory where it fits
 * smem_budget. */
#define DSA_TOPK_REG_KEYS 16384
size_t cuda_dsa_topk_hist_floats(int ctx);
cudaError_t cuda_dsa_topk(cudaStream_t stream, const float *scores, int ctx, const int32_t *pos, int row0,
                          int n_rows, int topk, int32_t *sel, unsigned *hist, int sm_count,
                          size_t smem_budget, int pdl);

#ifdef __cplusplus
}
#endif

#endif
