/* cuda_gemm_limits.h — what the tiled GEMMs take (cuda_gemm_mma.cu, cuda_gemm_wgmma.cu): the
 * weight formats and the K steps of their tiles. Plain C, included by those kernels and by the
 * backend's kernel table (cuda_registry.c), so that the planner and the launchers judge a shape
 * by the same rules. x's 16-byte alignment is the launchers' own check on top.
 *
 * defines: CUDA_GEMM_MMA_BK, cuda_gemm_mma_fits(), cuda_gemm_wgmma_fits(), CUDA_WGMMA_TILES,
 *          cuda_wgmma_tile_smem()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_GEMM_LIMITS_H
#define MOESERVE_BACKEND_CUDA_CUDA_GEMM_LIMITS_H

#include <stdbool.h>
#include <stdint.h>

#include "format/weight.h"
#include "plan/kernel_desc.h"

/* the mma.sync GEMM's K step */
enum { CUDA_GEMM_MMA_BK = 32 };

/* mma.sync: bf16 or NVFP4 weights, whole 32-wide K steps */
static inline bool cuda_gemm_mma_fits(enum weight_format fmt, int64_t K)
{
    return (fmt == WEIGHT_BF16 || fmt == WEIGHT_NVFP4) && K > 0 && K % CUDA_GEMM_MMA_BK == 0;
}

/* wgmma: bf16 or NVFP4 weights, whole 16-wide k chunks */
static inline bool cuda_gemm_wgmma_fits(enum weight_format fmt, int64_t K)
{
    return (fmt == WEIGHT_BF16 || fmt == WEIGHT_NVFP4) && K >= 16 && K % 16 == 0;
}

/* The tiles cuda_gemm_wgmma.cu compiles (m tokens x n weight rows, 64 a warpgroup, x k, stages):
 * its launcher has one template instantiation for each, and the planner plans among these only.
 * A 4-stage ring reads x's pre-split image (two k-steps in flight); 3 stages: one. */
static const struct kernel_tile CUDA_WGMMA_TILES[] = {
    {WEIGHT_BF16, 64, 128, 64, 3},   {WEIGHT_BF16, 64, 256, 64, 3},   {WEIGHT_BF16, 128, 128, 64, 3},
    {WEIGHT_NVFP4, 64, 128, 64, 3},  {WEIGHT_NVFP4, 64, 256, 64, 3},  {WEIGHT_NVFP4, 128, 128, 64, 3},
    {WEIGHT_NVFP4, 64, 128, 128, 3}, {WEIGHT_NVFP4, 64, 256, 128, 3}, {WEIGHT_NVFP4, 64, 128, 64, 4},
    {WEIGHT_NVFP4, 64, 256, 64, 4},  {WEIGHT_NVFP4, 128, 128, 64, 4},
};
enum { CUDA_WGMMA_N_TILES = (int)(sizeof CUDA_WGMMA_TILES / sizeof CUDA_WGMMA_TILES[0]) };

/* A wgmma block's shared memory: x's bf16 hi + lo for each stage (dynamic), then the block's
 * source-row table (static): the weights go to the tensor cores from registers. */
static inline size_t cuda_wgmma_dyn_smem(int tm, int bk, int stages)
{
    return (size_t)stages * 2 * (size_t)tm * (size_t)bk * 2;
}
static inline size_t cuda_wgmma_static_smem(int tm)
{
    return (size_t)tm * 4 + 16;
}
static inline size_t cuda_wgmma_tile_smem(const struct kernel_tile *t)
{
    return cuda_wgmma_dyn_smem(t->m, t->k, t->stages) + cuda_wgmma_static_smem(t->m);
}

#endif
