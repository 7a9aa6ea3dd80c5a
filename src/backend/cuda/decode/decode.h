/* decode.h — the few-token launchers: the one-row GEMV (CUDA cores), the 1-8 row tensor-core
 * GEMV, the pair-by-pair MoE kernels (CUDA cores and tensor cores).
 *
 * Plain C: every launcher enqueues on `stream`, checks its arguments only as far as a launch
 * needs and returns the launch's cudaError_t (callers check it with CUDA_CHECK); pointers are
 * device memory unless a comment says otherwise. Templates and kernels stay in the .cu files.
 */
#ifndef MOESERVE_BACKEND_CUDA_DECODE_DECODE_H
#define MOESERVE_BACKEND_CUDA_DECODE_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- cuda_decode.cu (one activation row: decode) ---- */
/* Whether cuda_gemv1 takes this format, K and x (K splits into 16-byte chunks; x 16-byte aligned;
 * x's K floats fit the block's shared memory). */
int cuda_gemv1_supported(enum weight_format fmt, int64_t K, const float *x, size_t smem_budget);
/* y[j][:N[j]] = x[:K] W_j^T (+ bias) for j < n_w <= 3, every W_j in format fmt: one launch.
 * pdl: launched with programmatic dependent launch (device_caps.pdl), see cuda_common.cuh. */
cudaError_t cuda_gemv1(cudaStream_t stream, enum weight_format fmt, int n_w, const struct cuda_wdev *w,
                       const int64_t *N, int64_t K, const float *x, float *const *y, int pdl);
int cuda_moe_decode_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                              size_t smem_budget);
/* The MoE block for few tokens, pair by pair without a sort: act (n_tokens * n_used, d_expert)
 * = silu(x G_e^T) * (x U_e^T), then out[t] = sum over the token's slots in ascending expert id of
 * weights * (act D_e^T). table as for cuda_gemm_grouped: gate[n_experts], up[...], down[...].
 * pdl as for cuda_gemv1. */
cudaError_t cuda_moe_decode(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                            int n_experts, int64_t d_model, int64_t d_expert, const float *x, int n_tokens,
                            const int32_t *ids, const float *weights, int n_used, float *act, float *out, int pdl);

/* ---- cuda_decode_mma.cu (few-token kernels on bf16 tensor cores, sm_80+) ---- */
/* Whether cuda_moe_decode_mma takes this shape (NVFP4, both widths multiples of 128). */
int cuda_moe_decode_mma_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                  size_t smem_budget);
/* As cuda_moe_decode (ids and weights read, not routed), NVFP4 only: 8 weight groups (128 k
 * each) in flight a warp. smem_tpw 1 or 2: instead, the form whose weights go through shared
 * memory by cp.async (few registers, every group in flight, each kernel triggering its dependent
 * after its wait), the down kernel's warps taking smem_tpw 8-row tiles each; its weights' data
 * must be 16-byte and their scales 8-byte aligned. 0: the register form. shared_e >= 0 (register
 * form only): the table's expert shared_e is every token's shared expert, one more slot of weight 1
 * added after the routed ones (act then holds n_tokens * (n_used + 1) rows); -1: none. */
cudaError_t cuda_moe_decode_mma(cudaStream_t stream, const struct cuda_wdev *table, int n_experts, int64_t d_model,
                                int64_t d_expert, const float *x, int n_tokens, const int32_t *ids,
                                const float *weights, int n_used, float *act, float *out, int pdl, int smem_tpw,
                                int shared_e);
/* Whether cuda_gemv_mma takes these weights and rows within smem_budget. */
int cuda_gemv_mma_supported(int n_w, const struct cuda_wdev *w, int64_t K, int n_tokens, size_t smem_budget);
/* y[j][t, :N[j]] = x[t, :K] W_j^T for j < n_w <= 3 NVFP4 weights and t < n_tokens <= 8, on bf16
 * tensor cores: the tokens share each mma (rows of its A operand), so 8 tokens cost about what one
 * does. The backend's default for NVFP4 linears of 1-8 rows where the device has mma.sync. */
cudaError_t cuda_gemv_mma(cudaStream_t stream, int n_w, const struct cuda_wdev *w, const int64_t *N,
                          int64_t K, const float *x, int n_tokens, float *const *y, int sm_count, int pdl);

/* ---- cuda_moe_grouped_mma.cu (sorted experts, a few tokens an expert, bf16 tensor cores) ---- */
/* y[j][r, :N] = x_r W_{e,j}^T (+ bias) for each row tile (e, first row, rows <= GG_TILE_ROWS) of
 * cuda_moe_sort (tiles, *n_tiles of at most max_tiles), j < n_w <= 2 NVFP4 weight tables sharing
 * x (tables[j][e]: expert e's weight j): x_r = x[sorted_pair[r] / n_used] (sorted_pair NULL: x[r]).
 * Each expert's weights stream once a tile, its tokens share every mma. K % 128 == 0; every
 * weight's data 16-byte and scales 2-byte aligned (the caller checks). */
cudaError_t cuda_moe_grouped_mma(cudaStream_t stream, int n_w, const struct cuda_wdev *const *tables, int64_t N,
                                 int64_t K, const float *x, const int32_t *sorted_pair, int n_used,
                                 const int32_t *tiles, const int32_t *n_tiles, int max_tiles, float *const *y,
                                 int pdl);

#ifdef __cplusplus
}
#endif

#endif
