/* cuda_registry.h — the kernels the CUDA backend has, as the planner sees them.
 *
 * Plain C, compiled into every build, so that `moeserve plan` on a machine without CUDA
 * plans what the CUDA backend would run (DESIGN.md decision 4). A kernel that is not in
 * this table does not exist for the planner: adding a kernel means adding its launcher, its
 * limits (the family's *_limits.h) and its line here. The backend's dispatch switches on
 * enum cuda_kernel_id, which the plan's choice carries.
 *
 * defines: enum cuda_kernel_id, CUDA_KERNELS, cuda_kernel_registered()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_REGISTRY_H
#define MOESERVE_BACKEND_CUDA_CUDA_REGISTRY_H

#include <stdbool.h>

#include "plan/kernel_desc.h"

/* The kernels the backend dispatches by the plan's choice (struct kernel_desc.id); CK_FIXED:
 * an op with one kernel, launched as the op asks. */
enum cuda_kernel_id {
    CK_FIXED,
    /* linears */
    CK_GEMV_MMA,       /* cuda_gemv_mma: NVFP4, 1-8 rows on bf16 tensor cores */
    CK_GEMV1,          /* cuda_gemv1: one row on CUDA cores, any format */
    CK_CUBLAS_BF16,    /* cuBLAS on x as bf16 hi + lo */
    CK_CUBLAS_DEQUANT, /* NVFP4 expanded to bf16 in scratch, then as CK_CUBLAS_BF16 */
    CK_CUBLAS_SGEMM,   /* F32 weights: SGEMM */
    CK_GEMM_WGMMA,     /* cuda_gemm_wgmma */
    CK_GEMM_MMA,       /* cuda_gemm_mma */
    CK_GEMM_FP32,      /* cuda_gemm: the portable tiled GEMM */
    /* routed experts */
    CK_MOE_PAIR_MMA, /* cuda_moe_decode_mma: pair by pair, NVFP4 on bf16 tensor cores */
    CK_MOE_PAIR,     /* cuda_moe_decode: pair by pair on CUDA cores */
    CK_MOE_WGMMA,    /* sorted by expert, cuda_gemm_wgmma_grouped */
    CK_MOE_MMA,      /* sorted, cuda_gemm_mma_grouped */
    CK_MOE_FP32,     /* sorted, cuda_gemm_grouped */
    CK_MOE_GROUPED_MMA, /* sorted in tiles of 8 tokens, cuda_moe_grouped_mma */
    /* routing (the routing kernel alone after the router linear is the op's own: CK_FIXED) */
    CK_NORM_ROUTER_ROUTE,    /* cuda_norm_router_route: add + RMSNorm + router + routing, a cluster a token */
    CK_ROUTER_ROUTE_CLUSTER, /* cuda_router_route, its cluster form */
    CK_ROUTER_ROUTE_COUNT,   /* cuda_router_route, its counting form (the last block routes) */
};

extern const struct kernel_table CUDA_KERNELS;

/* plan_request.variant_loads for plans of this backend: kernel is in CUDA_KERNELS (ctx unused). */
bool cuda_kernel_registered(void *ctx, const char *kernel);

#endif
