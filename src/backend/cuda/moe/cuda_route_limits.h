/* cuda_route_limits.h — what the routing kernels take: the router + routing kernels of
 * cuda_router_route.cu (the counting form, the cluster form, the cluster form with the norm) and
 * the warp routing they share with cuda_moe_route.cu.
 *
 * Plain C, included by those kernels and by the CUDA backend's kernel table (cuda_registry.c),
 * so that the planner (every build, also without CUDA) and the launchers judge a call by the
 * same rules. The router's rows, its data's alignment and the activations' alignment are the
 * launchers' own checks on top of these.
 *
 * defines: the CUDA_ROUTE_* / CUDA_RR_* constants, cuda_route_warp_fits(), cuda_router_route_fits(),
 *          cuda_router_route_cluster_fits(), cuda_norm_router_route_fits()
 */
#ifndef MOESERVE_BACKEND_CUDA_MOE_CUDA_ROUTE_LIMITS_H
#define MOESERVE_BACKEND_CUDA_MOE_CUDA_ROUTE_LIMITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/weight.h"

/* route_warp: one warp ranks a token's logits (at most 16 a lane) */
enum { CUDA_ROUTE_WARP_MAX_E = 512, CUDA_ROUTE_MAX_K = 64 };
/* the router + routing kernels: at most RR_MAX_LOGITS logits a launch (the counting form's last
 * block holds them all in shared memory); the cluster form: a cluster per token of RC_THREADS
 * blocks, block 0 ranking at most RC_MAX_E experts; with the norm each thread holds RC_NORM_IT
 * float4 of the token's row */
enum { CUDA_RR_MAX_LOGITS = 4096, CUDA_RC_THREADS = 512, CUDA_RC_MAX_E = 128, CUDA_RC_NORM_IT = 4 };

/* Whether route_warp takes this routing: no expert groups, 1..512 experts, 1..64 of them used. */
static inline bool cuda_route_warp_fits(int n_experts, int n_used, int n_group)
{
    return n_group <= 1 && n_experts >= 1 && n_experts <= CUDA_ROUTE_WARP_MAX_E && n_used >= 1 &&
           n_used <= CUDA_ROUTE_MAX_K && n_used <= n_experts;
}

/* The counting form (and the base of the others): a BF16 router of K % 8 == 0 columns, a warp a
 * logit, tokens x experts logits within RR_MAX_LOGITS and as floats within the budget. */
static inline bool cuda_router_route_fits(enum weight_format router, int64_t K, int n_tokens, int n_experts,
                                          int n_used, int n_group, size_t smem_budget)
{
    return router == WEIGHT_BF16 && K > 0 && K % 8 == 0 && n_tokens >= 1 && cuda_route_warp_fits(n_experts, n_used, n_group) &&
           (int64_t)n_tokens * n_experts <= CUDA_RR_MAX_LOGITS &&
           (size_t)n_tokens * (size_t)n_experts * sizeof(float) <= smem_budget;
}

/* The cluster form: as the counting form, at most RC_MAX_E experts (block 0 ranks them), a grid
 * row a token. */
static inline bool cuda_router_route_cluster_fits(enum weight_format router, int64_t K, int n_tokens, int n_experts,
                                                  int n_used, int n_group, size_t smem_budget)
{
    return cuda_router_route_fits(router, K, n_tokens, n_experts, n_used, n_group, smem_budget) &&
           n_experts <= CUDA_RC_MAX_E && n_tokens <= 65535;
}

/* The cluster form with the add + RMSNorm in its prologue: the token's row of K floats in
 * shared memory beside 8 KB of the kernel's own, K % 4 == 0 and within the threads' float4s. */
static inline bool cuda_norm_router_route_fits(enum weight_format router, int64_t K, int n_tokens, int n_experts,
                                               int n_used, int n_group, size_t smem_budget)
{
    return cuda_router_route_cluster_fits(router, K, n_tokens, n_experts, n_used, n_group, smem_budget) &&
           K % 4 == 0 && K / 4 <= (int64_t)CUDA_RC_NORM_IT * CUDA_RC_THREADS &&
           (size_t)K * 4 + 8192 <= smem_budget;
}

#endif
