/* cpu_fp4_ref.h — the W4A4 NVFP4 product on the CPU: the reference of the native FP4 GEMM
 * (src/backend/cuda/gemm/cuda_gemm_fp4.cu, the plan's "gemm_nvfp4_fp4_mma" / "moe_gemm_nvfp4_fp4_mma").
 *
 * Both operands are FP4: NVFP4 weights as the checkpoint stores them, and activations quantised
 * here exactly as the GPU quantiser does (same operations in the same order, each rounded once, so
 * the bytes are identical): per row a decode global scale `dec`, per 16 elements an E4M3 block
 * scale sf = e4m3(amax_b / 6 / dec), per element the E2M1 code e2m1(x / (sf * dec)), both casts
 * round-to-nearest-even and saturating (format/quant_codec.c). The product then sums
 * e2m1 * e4m3 terms (exact in fp32) in double and applies dec * scale2 and the bias in fp32, as
 * the GPU epilogue does; only the order of the tensor core's fp32 accumulation differs, so a GPU
 * result can be held to a tight tolerance against this one.
 *
 * Non-finite input: a 16-block holding a NaN or an Inf gets scale 0 and codes 0 and its row's
 * decode scale becomes NaN, so the whole output row is NaN (never a silently finite number), while
 * the other rows, and the per-tensor amax, ignore it.
 *
 * Deliberately not here: speed (a test reference; OpenMP over output rows only), the weight-only
 * (W4A16) product, which is cpu_gemm().
 *
 * defines: enum fp4_act_scale, struct fp4_act, fp4_global_scale(), fp4_quantize_block(),
 *          fp4_quantize(), fp4_ref_gemm()
 */
#ifndef MOESERVE_BACKEND_CPU_CPU_FP4_REF_H
#define MOESERVE_BACKEND_CPU_CPU_FP4_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/weight.h"

/* How the decode global scale of the activations is chosen (the GPU's enum cuda_fp4_scale has
 * the same values in the same order). */
enum fp4_act_scale {
    FP4_ACT_TENSOR, /* amax(|x|) over the whole tensor / (6 * 448): NVIDIA's NVFP4 recipe */
    FP4_ACT_ROW,    /* the same per row: no row depends on its neighbours in the batch */
    FP4_ACT_STATIC, /* a given scale, e.g. a W4A4 checkpoint's input_scale (finite, > 0) */
};

/* Activations (rows, K) in NVFP4; the buffers are borrowed. */
struct fp4_act {
    int rows;
    int64_t K;        /* a multiple of 16 */
    uint8_t *codes;   /* (rows, K/2) e2m1, element 2i in the low nibble */
    uint8_t *scales;  /* (rows, K/16) e4m3 block scales */
    float *row_scale; /* (rows) the decode global scale of each row; NaN: the row had a NaN or Inf */
};

/* amax / (6 * 448), at least FLT_MIN (an underflow to 0 would zero the row); 1 when amax is 0. */
float fp4_global_scale(float amax);

/* One block of 16: codes[i/2] holds elements i (low nibble) and i + 1; returns the e4m3 scale
 * byte. *finite is false (scale and codes 0) when the block holds a NaN or an Inf. */
uint8_t fp4_quantize_block(const float x[16], float dec, uint8_t codes[8], bool *finite);

/* x (out->rows, out->K) f32 -> out. input_scale is used by FP4_ACT_STATIC only. */
void fp4_quantize(const float *x, enum fp4_act_scale mode, float input_scale, const struct fp4_act *out);

/* y[i, n] = (sum_k xq[i, k] wq[n, k]) * (row_scale[i] * w->scale2) + bias[n] for i < x->rows,
 * n < w->rows, with xq = e2m1 * e4m3 of x and wq = e2m1 * e4m3 of W (scale2 left out of both);
 * W NVFP4 with w->cols == x->K. y: (x->rows, w->rows) f32. */
void fp4_ref_gemm(const struct weight *w, const struct fp4_act *x, float *y);

#endif
