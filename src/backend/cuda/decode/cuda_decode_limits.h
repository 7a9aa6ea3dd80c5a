/* cuda_decode_limits.h — what the few-token kernels take: their block shapes and the shape and
 * shared-memory limits of cuda_decode.cu (gemv1, the CUDA-core MoE pair kernels) and
 * cuda_decode_mma.cu (gemv_mma, the tensor-core MoE pair kernels).
 *
 * Plain C, included by those kernels and by the CUDA backend's kernel table (cuda_registry.c),
 * so that the planner (every build, also without CUDA) and the launchers judge a shape by the
 * same rules. Pointer alignment is the launchers' own check on top of these.
 *
 * defines: the DEC_* and MD_* block constants, cuda_dec_k_ok(), cuda_gemv1_fits(),
 *          cuda_moe_decode_fits(), cuda_gemv_mma_fits(), cuda_moe_decode_mma_fits(),
 *          cuda_moe_decode_mma_smem_bytes(), cuda_moe_decode_mma_smem_fits(),
 *          cuda_moe_decode_mma_smem_tpw(), cuda_moe_grouped_mma_fits()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_DECODE_LIMITS_H
#define MOESERVE_BACKEND_CUDA_CUDA_DECODE_LIMITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/weight.h"

/* cuda_decode.cu: 8 warps a block; up to 3 weights a launch; up to 64 experts a token */
enum { DEC_THREADS = 256, DEC_WARPS = DEC_THREADS / 32, MAX_JOBS = 3, MAX_K_USED = 64 };
/* cuda_decode_mma.cu: 8 warps a block (gemv_mma, down), 4 (gate/up); 8 tokens a gemv_mma launch */
enum { MD_THREADS = 256, MD_WARPS = MD_THREADS / 32, MD_MAX_USED = 64, MD_MAX_JOBS = 3, GM_MAX_TOKENS = 8 };
enum { MG_THREADS = 128, MG_WARPS = MG_THREADS / 32 };
/* one 128-k group of 8 NVFP4 rows staged in shared memory: 32 lanes x 16 bytes + 8 x 8 scale bytes */
enum { RS8_GROUP_BYTES = 32 * 16 + 8 * 8 };

/* Elements of one lane's 16-byte chunk of weights in cuda_decode.cu: K must split into them. */
static inline int cuda_dec_chunk(enum weight_format fmt)
{
    return fmt == WEIGHT_NVFP4 ? 32 : fmt == WEIGHT_FP8_BLOCK ? 16 : fmt == WEIGHT_F32 ? 4 : 8;
}

static inline bool cuda_dec_k_ok(enum weight_format fmt, int64_t K)
{
    return K > 0 && K % cuda_dec_chunk(fmt) == 0;
}

/* gemv1: x's K floats staged in shared memory beside 1 KB of partials. */
static inline bool cuda_gemv1_fits(enum weight_format fmt, int64_t K, size_t smem_budget)
{
    return cuda_dec_k_ok(fmt, K) && (size_t)K * sizeof(float) + 1024 <= smem_budget;
}

/* The CUDA-core MoE pair kernels: gate/up stage x (D floats), down the 8 warps' activations. */
static inline bool cuda_moe_decode_fits(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                        size_t smem_budget)
{
    size_t smem = (size_t)(d_model > DEC_WARPS * d_expert ? d_model : DEC_WARPS * d_expert) * sizeof(float);
    return cuda_dec_k_ok(fmt, d_model) && cuda_dec_k_ok(fmt, d_expert) && n_used >= 1 && n_used <= MAX_K_USED &&
           smem + 2048 <= smem_budget;
}

/* gemv_mma: NVFP4, K in 128-k groups, each token's K floats staged in shared memory. */
static inline bool cuda_gemv_mma_fits(int n_w, int64_t K, int n_tokens, size_t smem_budget)
{
    return n_w >= 1 && n_w <= MD_MAX_JOBS && K > 0 && K % 128 == 0 && n_tokens >= 1 && n_tokens <= GM_MAX_TOKENS &&
           (size_t)n_tokens * (size_t)K * 4 + 1024 <= smem_budget;
}

/* The tensor-core MoE pair kernels (register form): NVFP4, both widths in 128-k groups. */
static inline bool cuda_moe_decode_mma_fits(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                            size_t smem_budget)
{
    const size_t smem = (size_t)(d_model > MD_WARPS * d_expert ? d_model : MD_WARPS * d_expert) * 4;
    return fmt == WEIGHT_NVFP4 && d_model % 128 == 0 && d_expert % 128 == 0 && n_used >= 1 &&
           n_used <= MD_MAX_USED && smem + 1024 <= smem_budget;
}

/* The shared-memory form's dynamic shared memory (which 0: gate/up, 1: down; tpw: the down
 * kernel's 8-row tiles a warp). */
static inline size_t cuda_moe_decode_mma_smem_bytes(int64_t d_model, int64_t d_expert, int tpw, int which)
{
    const size_t gu = (size_t)d_model * 4 + (size_t)MG_WARPS * (size_t)(d_model / 128) * RS8_GROUP_BYTES;
    const size_t dn = (size_t)MD_WARPS * (size_t)d_expert * 4 +
                      (size_t)MD_WARPS * (size_t)tpw * (size_t)(d_expert / 128) * RS8_GROUP_BYTES;
    return which == 0 ? gu : dn;
}

/* The down kernel's static shared memory (its order, ids, weights and two tiles' partials), with
 * the slack the launch keeps. */
static inline size_t cuda_moe_decode_mma_down_static_smem(void)
{
    return 1024 + (size_t)MD_MAX_USED * (4 + 4 + 4 + 2 * 8 * 4) + 512;
}

static inline bool cuda_moe_decode_mma_smem_fits(int64_t d_model, int64_t d_expert, int n_used, int tpw,
                                                 size_t smem_budget)
{
    const size_t stat = cuda_moe_decode_mma_down_static_smem();
    return d_model % 128 == 0 && d_expert % 128 == 0 && n_used >= 1 && n_used <= MD_MAX_USED &&
           (tpw == 1 || tpw == 2) && cuda_moe_decode_mma_smem_bytes(d_model, d_expert, tpw, 0) + 1024 <= smem_budget &&
           cuda_moe_decode_mma_smem_bytes(d_model, d_expert, tpw, 1) + stat <= smem_budget;
}

/* The down kernel's 8-row tiles a warp of the shared-memory form: two where one tile a warp would
 * give more blocks than SMs (the down kernel's whole grid then fits beside gate/up's), one where
 * two do not fit the budget; 0: the form does not fit. */
static inline int cuda_moe_decode_mma_smem_tpw(int64_t d_model, int64_t d_expert, int n_used, int sm_count,
                                               size_t smem_budget)
{
    for (int tpw = (d_model + 7) / 8 > sm_count ? 2 : 1; tpw >= 1; tpw--)
        if (cuda_moe_decode_mma_smem_fits(d_model, d_expert, n_used, tpw, smem_budget))
            return tpw;
    return 0;
}

/* cuda_moe_grouped_mma.cu: cuda_moe_sort's row tiles of up to GG_TILE_ROWS tokens of one expert;
 * x staged GG_SEG_GROUPS 128-k groups at a time, two buffers of the tile's tokens, in static
 * shared memory (GG_STATIC_SMEM with its partials and the zero fragments). */
enum { GG_TILE_ROWS = GM_MAX_TOKENS, GG_SEG_GROUPS = 4 };
enum { GG_STATIC_SMEM = 2 * GG_TILE_ROWS * GG_SEG_GROUPS * 512 + 32 * 16 + GG_TILE_ROWS * 4 };

/* NVFP4, both widths in 128-k groups. */
static inline bool cuda_moe_grouped_mma_fits(enum weight_format fmt, int64_t d_model, int64_t d_expert,
                                             size_t smem_budget)
{
    return fmt == WEIGHT_NVFP4 && d_model > 0 && d_expert > 0 && d_model % 128 == 0 && d_expert % 128 == 0 &&
           (size_t)GG_STATIC_SMEM + 1024 <= smem_budget;
}

#endif
