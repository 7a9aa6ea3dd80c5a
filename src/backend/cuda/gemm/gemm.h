/* gemm.h — the tiled GEMM launchers: portable fp32, bf16 mma.sync, Hopper wgmma, and the native
 * FP4 GEMM of sm_120a (not dispatched).
 *
 * Plain C: every launcher enqueues on `stream`, checks its arguments only as far as a launch
 * needs and returns the launch's cudaError_t (callers check it with CUDA_CHECK); pointers are
 * device memory unless a comment says otherwise. Templates and kernels stay in the .cu files.
 */
#ifndef MOESERVE_BACKEND_CUDA_GEMM_GEMM_H
#define MOESERVE_BACKEND_CUDA_GEMM_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/common/common.h"
#include "backend/cuda/gemm/cuda_gemm_limits.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- cuda_gemm.cu ---- */
/* Tile shapes of the fp32-FMA GEMM (rows x output features, 256 threads): the
 * planner's fp32 family has tile_m 16, 32 or 64. */
enum cuda_gemm_tile { CUDA_GEMM_16x64, CUDA_GEMM_32x64, CUDA_GEMM_64x64, CUDA_GEMM_TILE_COUNT };
int cuda_gemm_tile_rows(enum cuda_gemm_tile t);
/* y[i, :N] = x[i, :K] W^T (+ bias) for i < m; W in format fmt, read as stored
 * (dequantised in registers, fp32 accumulation). m <= 8 runs a GEMV kernel
 * (one warp per output feature), larger m the tiled kernel. x, y dense. */
cudaError_t cuda_gemm(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w, int64_t N,
                      int64_t K, const float *x, int m, float *y, enum cuda_gemm_tile tile);
/* Grouped GEMM over row tiles: tile i (i < *n_tiles, at most max_tiles) is
 * tiles[3i..3i+2] = {expert, first row, rows}; its rows r read x row
 * (x_rows ? x_rows[r] / x_row_div : r) and write y row r, with the weight
 * table[expert] (device array). */
cudaError_t cuda_gemm_grouped(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                              int64_t N, int64_t K, const float *x, const int32_t *x_rows, int x_row_div,
                              const int32_t *tiles, const int32_t *n_tiles, int max_tiles, float *y,
                              enum cuda_gemm_tile tile);

/* ---- cuda_gemm_mma.cu (bf16 tensor cores; NVFP4 and BF16 weights) ---- */
int cuda_gemm_mma_supported(enum weight_format fmt, int64_t K, const float *x);
/* As cuda_gemm / cuda_gemm_grouped, on mma.sync with activations split into bf16 hi + lo;
 * tile_m 32 or 64 rows (grouped: every tile's rows must fit it). */
cudaError_t cuda_gemm_mma(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w, int64_t N,
                          int64_t K, const float *x, int m, float *y, int tile_m);
cudaError_t cuda_gemm_mma_grouped(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                                  int64_t N, int64_t K, const float *x, const int32_t *x_rows, int x_row_div,
                                  const int32_t *tiles, const int32_t *n_tiles, int max_tiles, float *y,
                                  int tile_m);

/* ---- cuda_gemm_wgmma.cu (Hopper warpgroup MMA, in the sm_90a image only; NVFP4 and BF16 weights) ---- */
/* A tile of the wgmma GEMM: tokens per block (64 or 128), weight rows per block (64 per warpgroup:
 * 128 or 256), k per step (64, or 128 for NVFP4 with K % 128 == 0), and the shared memory it takes
 * (filled by cuda_gemm_wgmma_fit()). */
struct cuda_wgmma_tile {
    int tokens;
    int rows;
    int k;
    int stages; /* x stages in shared memory: 4 keeps two k-steps of x and weights in flight (NVFP4,
                 * 64-wide k, with x's image only; where it fits the budget); else 3, one k-step */
    size_t smem_bytes;
};
/* Whether device runs the wgmma kernels (makes it current): every one has an image for it
 * (cudaFuncGetAttributes) and that image is the sm_90a body (other images hold empty bodies). */
int cuda_gemm_wgmma_loadable(int device);
int cuda_gemm_wgmma_supported(enum weight_format fmt, int64_t K, const float *x);
/* Turns the planned tile t into a compiled one for fmt and K whose shared memory fits budget
 * (smaller k, then fewer tokens; 64-token tiles when rows_hint, the rows of one GEMM or expert,
 * is at most 64); 0 if none fits. */
int cuda_gemm_wgmma_fit(struct cuda_wgmma_tile *t, enum weight_format fmt, int64_t K, double rows_hint,
                        size_t budget);
/* The bytes of x's pre-split image (rows x K, for tile t's k-step) and the image itself: x in the
 * bf16 hi + lo halves and the order the wgmma kernels stage (img 16-byte aligned). The GEMMs
 * below then copy it into shared memory as it is, every block sharing one split. */
size_t cuda_gemm_wgmma_image_bytes(int64_t rows, int64_t K, const struct cuda_wgmma_tile *t);
cudaError_t cuda_gemm_wgmma_image(cudaStream_t stream, const float *x, int64_t rows, int64_t K,
                                  const struct cuda_wgmma_tile *t, void *img);
/* As cuda_gemm_mma / cuda_gemm_mma_grouped (activations split into bf16 hi + lo), on wgmma with a
 * tile fitted by cuda_gemm_wgmma_fit() (grouped: every tile's rows must fit t->tokens). img: x's
 * image for the same tile (cuda_gemm_wgmma_image; the GEMM reads it instead of x), or NULL: every
 * block splits the x rows it reads itself. */
cudaError_t cuda_gemm_wgmma(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w, int64_t N,
                            int64_t K, const float *x, int m, float *y, const struct cuda_wgmma_tile *t,
                            const void *img);
cudaError_t cuda_gemm_wgmma_grouped(cudaStream_t stream, enum weight_format fmt,
                                    const struct cuda_wdev *table, int64_t N, int64_t K, const float *x,
                                    const int32_t *x_rows, int x_row_div, const int32_t *tiles,
                                    const int32_t *n_tiles, int max_tiles, float *y,
                                    const struct cuda_wgmma_tile *t, const void *img);

/* ---- cuda_gemm_fp4.cu (W4A4 NVFP4 on block-scaled FP4 mma.sync: "gemm_nvfp4_fp4_mma",
 *      "moe_gemm_nvfp4_fp4_mma"; the GEMM in sm_120a/121a/120f images only, the quantiser anywhere).
 *      NEVER RUN on hardware and not wired into the backend: see the file comment. ----
 * defines: enum cuda_fp4_scale, struct cuda_fp4_act, struct cuda_fp4_tile, cuda_fp4_act_bytes(),
 *          cuda_fp4_act_carve(), cuda_fp4_quantize_supported(), cuda_fp4_quantize(),
 *          cuda_fp4_quantize_host(), cuda_gemm_fp4_loadable(), cuda_gemm_fp4_supported(),
 *          cuda_gemm_fp4_smem(), cuda_gemm_fp4_fit(), cuda_gemm_fp4(), cuda_gemm_fp4_grouped(),
 *          cuda_gemm_fp4_emulate() */
/* The activations' decode global scale: the values and meaning of enum fp4_act_scale
 * (backend/cpu/cpu_fp4_ref.h, the reference that defines the quantisation bit for bit). */
enum cuda_fp4_scale {
    CUDA_FP4_SCALE_TENSOR, /* amax(|x|) of the whole input / (6 * 448) */
    CUDA_FP4_SCALE_ROW,    /* the same per row (batch-invariant) */
    CUDA_FP4_SCALE_STATIC, /* input_scale (a W4A4 checkpoint's), finite and > 0 */
};
/* Activations (rows, K) in NVFP4, carved from one buffer of cuda_fp4_act_bytes(rows, K). */
struct cuda_fp4_act {
    uint8_t *codes;   /* (rows, K/2) e2m1, element 2i in the low nibble */
    uint8_t *scales;  /* (rows, K/16) e4m3 block scales */
    float *row_scale; /* (rows) each row's decode global scale; NaN: the row held a NaN or an Inf */
    uint32_t *amax;   /* (1) scratch of CUDA_FP4_SCALE_TENSOR */
};
size_t cuda_fp4_act_bytes(int rows, int64_t K);
void cuda_fp4_act_carve(void *base, int rows, int64_t K, struct cuda_fp4_act *a);
/* Whether cuda_fp4_quantize takes K (a multiple of 16) and x (16-byte aligned). */
int cuda_fp4_quantize_supported(int64_t K, const float *x);
/* x (rows, K) f32 -> a, bit-exact with fp4_quantize(); input_scale is read by the static mode only. */
cudaError_t cuda_fp4_quantize(cudaStream_t stream, const float *x, int rows, int64_t K,
                              enum cuda_fp4_scale mode, float input_scale, const struct cuda_fp4_act *a);
/* Tests: the quantiser's own arithmetic (the kernel's __host__ __device__ code) run on the host,
 * x and a in host memory (a->amax unused); 0 for arguments cuda_fp4_quantize would refuse. */
int cuda_fp4_quantize_host(const float *x, int rows, int64_t K, enum cuda_fp4_scale mode, float input_scale,
                           const struct cuda_fp4_act *a);
/* A tile of the FP4 GEMM: tokens (64 or 128) x weight rows (64 or 128) x k per stage (64 or 128,
 * dividing K), stages 2..4 in flight; smem_bytes filled by cuda_gemm_fp4_fit(). */
struct cuda_fp4_tile {
    int tokens;
    int rows;
    int k;
    int stages;
    size_t smem_bytes;
};
/* Whether device runs the FP4 GEMM kernels (makes it current): every one has an image for it and
 * that image holds the real body (other images hold empty bodies). */
int cuda_gemm_fp4_loadable(int device);
/* Whether the GEMM takes K (a multiple of 64). Weights: NVFP4 with 16-byte aligned codes and
 * 8-byte aligned scales (cudaMalloc'ed tensors are); x as cuda_fp4_quantize wrote it. */
int cuda_gemm_fp4_supported(int64_t K);
/* Shared memory of a tile (static included): stages x (tokens + rows) x k x 9/16 + 8 x tokens. */
size_t cuda_gemm_fp4_smem(int tokens, int rows, int k, int stages);
/* Turns the planned tile t into a compiled one for K within budget (fewer stages, then k 64, then
 * 64 rows, then 64 tokens; 64 tokens when rows_hint, the rows of one GEMM or expert, is <= 64);
 * 0 if none fits. */
int cuda_gemm_fp4_fit(struct cuda_fp4_tile *t, int64_t K, double rows_hint, size_t budget);
/* y[i, :N] = dequant(x row i) W^T * (x->row_scale[i] * w->scale2) + bias for i < m, W NVFP4,
 * with a tile fitted by cuda_gemm_fp4_fit(). The grouped form walks cuda_gemm_grouped's tile
 * list; compact row r reads x row x_rows[r] / x_row_div (every tile's rows must fit t->tokens). */
cudaError_t cuda_gemm_fp4(cudaStream_t stream, const struct cuda_wdev *w, int64_t N, int64_t K,
                          const struct cuda_fp4_act *x, int m, float *y, const struct cuda_fp4_tile *t);
cudaError_t cuda_gemm_fp4_grouped(cudaStream_t stream, const struct cuda_wdev *table, int64_t N, int64_t K,
                                  const struct cuda_fp4_act *x, const int32_t *x_rows, int x_row_div,
                                  const int32_t *tiles, const int32_t *n_tiles, int max_tiles, float *y,
                                  const struct cuda_fp4_tile *t);
/* Tests: cuda_gemm_fp4 with every pointer in host memory, the kernel's address arithmetic run on
 * the host against a model of ldmatrix and the block-scaled MMA written from the PTX ISA text
 * (not the hardware); 0 for arguments cuda_gemm_fp4 would refuse. */
int cuda_gemm_fp4_emulate(const struct cuda_wdev *w, int64_t N, int64_t K, const struct cuda_fp4_act *x,
                          int m, float *y, const struct cuda_fp4_tile *t);

#ifdef __cplusplus
}
#endif

#endif
