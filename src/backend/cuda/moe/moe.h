/* moe.h — the routing launchers (router scores + top-k, the fused router + routing) and the
 * sort / combine around the grouped expert GEMMs.
 *
 * Plain C: every launcher enqueues on `stream`, checks its arguments only as far as a launch
 * needs and returns the launch's cudaError_t (callers check it with CUDA_CHECK); pointers are
 * device memory unless a comment says otherwise. Templates and kernels stay in the .cu files.
 */
#ifndef MOESERVE_BACKEND_CUDA_MOE_MOE_H
#define MOESERVE_BACKEND_CUDA_MOE_MOE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- cuda_router_route.cu (decode: router GEMV + routing in one kernel) ---- */
/* Whether cuda_router_route takes this router and routing (cuda_router_route_fits: BF16 rows,
 * K % 8 == 0, no groups, tokens x experts <= 4096, their floats within smem_budget; the router
 * of a->n_experts rows, its data 16-byte aligned). */
int cuda_router_route_supported(const struct weight *router, int n_tokens, const struct route_args *a,
                                size_t smem_budget);
/* Whether its cluster form takes them as well (cuda_router_route_cluster_fits: <= 128 experts). */
int cuda_router_route_cluster_supported(const struct weight *router, int n_tokens, const struct route_args *a,
                                        size_t smem_budget);
/* Whether cuda_norm_router_route takes these (cuda_norm_router_route_fits: the cluster form's,
 * K % 4 == 0, K <= 8192, x of K floats in shared memory within smem_budget). */
int cuda_norm_router_route_supported(const struct weight *router, int n_tokens, const struct route_args *a,
                                     size_t smem_budget);
/* h += delta (delta may be NULL), x = rmsnorm(h) * norm_w, then cuda_router_route on x in its
 * cluster form: one kernel, no counter. */
cudaError_t cuda_norm_router_route(cudaStream_t stream, float *h, const float *delta, const float *norm_w, float eps,
                                   const struct weight *router, int n_tokens, const struct route_args *a, float *x,
                                   float *logits, int32_t *ids, float *weights, int pdl);
/* logits = x router^T (+ bias), then ids / weights as cuda_moe_route; count: one device counter,
 * zero before and after the launch (the cluster form takes NULL). cluster: a thread block
 * cluster per token (caps "clusters", cuda_router_route_cluster_supported). */
cudaError_t cuda_router_route(cudaStream_t stream, const struct weight *router, const float *x, int n_tokens,
                              const struct route_args *a, float *logits, int32_t *ids, float *weights,
                              unsigned *count, int pdl, int cluster);

/* ---- cuda_moe_route.cu ---- */
/* args is a host struct; args->correction_bias is a device pointer (or NULL). */
cudaError_t cuda_moe_route(cudaStream_t stream, const float *logits, int n_tokens,
                           const struct route_args *args, int32_t *ids, float *weights, int pdl);

/* ---- cuda_moe.cu ---- */
/* Upper bound on row tiles for pairs (token, slot) pairs over n_experts. */
int cuda_moe_max_tiles(int pairs, int n_experts, int tile_rows);
/* Counting sort of the pairs by expert: sorted_pair[r] = pair of compact row
 * r (rows grouped by ascending expert), row_of_pair[p] = its row; tiles and
 * *n_tiles as cuda_gemm_grouped wants them. */
cudaError_t cuda_moe_sort(cudaStream_t stream, const int32_t *ids, int pairs, int n_experts, int tile_rows,
                          int32_t *sorted_pair, int32_t *row_of_pair, int32_t *tiles, int32_t *n_tiles,
                          int max_tiles);
/* out[t, :] = sum over the token's slots in ascending expert id of
 * weights[t, j] * y[row_of_pair[t * n_used + j], :] */
cudaError_t cuda_moe_combine(cudaStream_t stream, const int32_t *ids, const float *weights, int n_tokens,
                             int n_used, int dim, const int32_t *row_of_pair, const float *y, float *out);
/* ids[i] = -1 outside [lo, hi): another rank's experts under expert parallelism (the sort, the
 * pair kernels and the combine skip such slots) */
cudaError_t cuda_moe_mask_ids(cudaStream_t stream, int32_t *ids, size_t n, int lo, int hi);

#ifdef __cplusplus
}
#endif

#endif
