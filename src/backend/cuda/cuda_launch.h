/* cuda_launch.h — the launchers the CUDA backend's kernel table points at (kernel_desc.launch).
 *
 * Plain C with opaque arguments, so that the table (cuda_registry.c, built into every build)
 * can name them: in a build without CUDA the table holds NULL instead (they exist only there).
 * `backend` is the backend's state, `call` the op's call record (cuda_dispatch.c: struct
 * linear_call for the linears, struct moe_call for the routed experts; cuda_ops.c: struct
 * route_call for the routing). Each launches its kernel
 * and returns true, or returns false having launched nothing where its launcher does not take
 * the call's pointers (alignment) or no compiled tile fits: the backend then tries the plan's
 * next kernel.
 *
 * defines: cuda_launch_*()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_LAUNCH_H
#define MOESERVE_BACKEND_CUDA_CUDA_LAUNCH_H

#include <stdbool.h>

bool cuda_launch_gemv_mma(void *backend, const void *call);
bool cuda_launch_gemv1(void *backend, const void *call);
bool cuda_launch_gemm_wgmma(void *backend, const void *call);
bool cuda_launch_gemm_mma(void *backend, const void *call);
bool cuda_launch_gemm_fp32(void *backend, const void *call);
bool cuda_launch_cublas_sgemm(void *backend, const void *call);
bool cuda_launch_cublas_bf16(void *backend, const void *call);
bool cuda_launch_cublas_dequant(void *backend, const void *call);
bool cuda_launch_moe_pair_mma(void *backend, const void *call);
bool cuda_launch_moe_pair(void *backend, const void *call);
bool cuda_launch_moe_wgmma(void *backend, const void *call);
bool cuda_launch_moe_mma(void *backend, const void *call);
bool cuda_launch_moe_grouped_mma(void *backend, const void *call);
bool cuda_launch_moe_fp32(void *backend, const void *call);
bool cuda_launch_norm_router_route(void *backend, const void *call);
bool cuda_launch_router_route_cluster(void *backend, const void *call);
bool cuda_launch_router_route_count(void *backend, const void *call);

#endif
