/* cpu_fp4_ref.c — see cpu_fp4_ref.h. Every float operation below is written once, in the order
 * the GPU quantiser (cuda_gemm_fp4.cu, fp4_quant_block) performs it with __fdiv_rn/__fmul_rn;
 * the build's C flags (-std=c17, no -ffast-math) keep the compiler from contracting or reordering
 * them. */
#include "backend/cpu/cpu_fp4_ref.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "base/status.h"
#include "format/quant_codec.h"

float fp4_global_scale(float amax)
{
    return amax > 0 ? fmaxf(amax / (6.0f * 448.0f), FLT_MIN) : 1.0f;
}

uint8_t fp4_quantize_block(const float x[16], float dec, uint8_t codes[8], bool *finite)
{
    float amax = 0;
    bool ok = true;
    for (int i = 0; i < 16; i++) {
        float a = fabsf(x[i]);
        ok = ok && a <= FLT_MAX; /* false for NaN and Inf */
        amax = fmaxf(amax, a);
    }
    *finite = ok;
    if (!ok) {
        for (int i = 0; i < 8; i++)
            codes[i] = 0;
        return 0;
    }
    uint8_t sf = f32_to_e4m3(amax / 6.0f / dec);
    float denom = e4m3_to_f32(sf) * dec; /* 0 for an all-zero block, or one too small for e4m3 */
    for (int i = 0; i < 8; i++) {
        uint8_t lo = denom > 0 ? f32_to_e2m1(x[2 * i] / denom) : 0;
        uint8_t hi = denom > 0 ? f32_to_e2m1(x[2 * i + 1] / denom) : 0;
        codes[i] = (uint8_t)(lo | (hi << 4));
    }
    return sf;
}

/* amax of the finite |x| of n values */
static float finite_amax(const float *x, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a <= FLT_MAX)
            m = fmaxf(m, a);
    }
    return m;
}

void fp4_quantize(const float *x, enum fp4_act_scale mode, float input_scale, const struct fp4_act *out)
{
    const int64_t K = out->K;
    ASSERT(K > 0 && K % 16 == 0 && out->rows >= 0);
    ASSERT(mode != FP4_ACT_STATIC || (input_scale > 0 && input_scale <= FLT_MAX));
    float dec = 1.0f;
    if (mode == FP4_ACT_TENSOR)
        dec = fp4_global_scale(finite_amax(x, (size_t)out->rows * (size_t)K));
    else if (mode == FP4_ACT_STATIC)
        dec = input_scale;
    for (int r = 0; r < out->rows; r++) {
        const float *xr = x + (size_t)r * (size_t)K;
        float d = mode == FP4_ACT_ROW ? fp4_global_scale(finite_amax(xr, (size_t)K)) : dec;
        bool row_ok = true;
        for (int64_t b = 0; b < K / 16; b++) {
            bool ok;
            size_t blk = (size_t)r * (size_t)(K / 16) + (size_t)b;
            out->scales[blk] = fp4_quantize_block(xr + 16 * b, d, out->codes + 8 * blk, &ok);
            row_ok = row_ok && ok;
        }
        out->row_scale[r] = row_ok ? d : NAN;
    }
}

/* Row r of an NVFP4 matrix (codes (rows, K/2), scales (rows, K/16)) as e2m1 * e4m3 (exact). */
static void dequant_row(const uint8_t *codes, const uint8_t *scales, int64_t r, int64_t K, float *out)
{
    const uint8_t *c = codes + (size_t)r * (size_t)(K / 2);
    const uint8_t *s = scales + (size_t)r * (size_t)(K / 16);
    for (int64_t k = 0; k < K; k++) {
        uint8_t code = (k & 1) ? (uint8_t)(c[k / 2] >> 4) : (uint8_t)(c[k / 2] & 15);
        out[k] = e2m1_to_f32(code) * e4m3_to_f32(s[k / 16]);
    }
}

void fp4_ref_gemm(const struct weight *w, const struct fp4_act *x, float *y)
{
    ASSERT(w->format == WEIGHT_NVFP4 && w->cols == x->K && x->K % 16 == 0);
    const int64_t K = x->K, N = w->rows;
    const int m = x->rows;
    float *xq = malloc((size_t)m * (size_t)K * sizeof(float) + 4);
    ASSERT(xq);
    for (int i = 0; i < m; i++)
        dequant_row(x->codes, x->scales, i, K, xq + (size_t)i * (size_t)K);
    int failed = 0;
#pragma omp parallel
    {
        float *wq = malloc((size_t)K * sizeof(float) + 4);
        if (!wq) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            if (!wq)
                continue;
            dequant_row(w->data, w->scale, n, K, wq);
            for (int i = 0; i < m; i++) {
                const float *xi = xq + (size_t)i * (size_t)K;
                double dot = 0;
                for (int64_t k = 0; k < K; k++)
                    dot += (double)xi[k] * (double)wq[k]; /* each product exact */
                float alpha = x->row_scale[i] * w->scale2;
                float v = (float)dot * alpha;
                y[(size_t)i * (size_t)N + (size_t)n] = v + (w->bias ? w->bias[n] : 0.0f);
            }
        }
        free(wq);
    }
    free(xq);
    ASSERT(!failed);
}
