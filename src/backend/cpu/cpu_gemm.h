/* cpu_gemm.h — the CPU linear layer: y = x · Wᵀ (+ bias), W in its stored format.
 *
 * W is read in the checkpoint's format (f32, bf16, f16, fp8 block-128, nvfp4)
 * and converted to fp32 on the fly; there is never a dequantised copy of W.
 * Accumulation is fp32. Threads: OpenMP over output features, with the
 * runtime's default team size; each thread uses up to ~70 KB of stack
 * scratch and nothing is allocated.
 *
 * defines: cpu_gemm(), cpu_gemm_mode(), cpu_gemm_force_scalar()
 */
#ifndef MOESERVE_BACKEND_CPU_CPU_GEMM_H
#define MOESERVE_BACKEND_CPU_CPU_GEMM_H

#include <stdbool.h>
#include <stddef.h>

#include "format/weight.h"

/* y[i*ldy + n] = sum_k x[i*ldx + k] * W[n, k] (+ w->bias[n])
 * for 0 <= i < m, 0 <= n < w->rows, 0 <= k < w->cols.
 * x: (m, ldx) f32, ldx >= cols; y: (m, ldy) f32, ldy >= rows; x and y must not
 * overlap. Only the first rows columns of each y row are written; m == 0 does
 * nothing. NVFP4 needs cols % 16 == 0. Broken preconditions abort (ASSERT). */
void cpu_gemm(const struct weight *w, const float *x, int m, size_t ldx, float *y, size_t ldy);

/* cpu_gemm, and with rowwise every output row is summed in the same order whatever m is (the
 * decode kernel for every batch): a row's result never depends on the rows beside it, at the
 * cost of streaming W once per 4 rows at large m. cpu_gemm picks by m (faster prefill). */
void cpu_gemm_mode(const struct weight *w, const float *x, int m, size_t ldx, float *y, size_t ldy, bool rowwise);

/* Exists for tests and benchmarks only: true makes cpu_gemm use the portable
 * C kernels even where the AVX2 ones would run. Process-wide, not thread-safe:
 * set it while no cpu_gemm call is in flight. */
void cpu_gemm_force_scalar(bool on);

#endif
