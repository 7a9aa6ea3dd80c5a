/* quant_codec.c — see quant_codec.h. All rounding is round-half-to-even, as
 * PyTorch's casts to float8_e4m3fn and ModelOpt's E2M1 cast do. */
#include "format/quant_codec.h"

#include <math.h>

#include "base/dtype.h"

uint8_t f32_to_e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (isnan(x))
        return 0x7f;
    if (a >= 448.0f)
        return sign | 0x7e; /* saturate (satfinite) */
    if (a < 0.015625f) {    /* subnormal range: steps of 2^-9 */
        float m = nearbyintf(a * 512.0f);
        return sign | (uint8_t)m; /* m == 8 is exactly the smallest normal's code */
    }
    int e;
    float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
    float m = nearbyintf((fr * 2.0f - 1.0f) * 8.0f);
    int exp = e - 1;
    if (m == 8.0f) {
        m = 0;
        exp++;
    }
    int code = ((exp + 7) << 3) | (int)m;
    if (code > 0x7e)
        code = 0x7e;
    return sign | (uint8_t)code;
}

uint8_t f32_to_e2m1(float x)
{
    /* thresholds between neighbours; a tie goes to the even code */
    float a = fabsf(x);
    uint8_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    if (isnan(x))
        c = 0;
    return (signbit(x) && c) ? (uint8_t)(c | 8) : c;
}

float nvfp4_global_scale(float amax)
{
    return amax > 0 ? amax / (6.0f * 448.0f) : 1.0f;
}

void nvfp4_quantize_row(const float *w, size_t K, float scale2, uint8_t *codes, uint8_t *scales)
{
    for (size_t b = 0; b < K / 16; b++) {
        float amax = 0;
        for (size_t i = 0; i < 16; i++)
            amax = fmaxf(amax, fabsf(w[b * 16 + i]));
        uint8_t sf = f32_to_e4m3(amax / 6.0f / scale2);
        scales[b] = sf;
        float denom = e4m3_to_f32(sf) * scale2;
        for (size_t i = 0; i < 16; i += 2) {
            uint8_t lo = denom > 0 ? f32_to_e2m1(w[b * 16 + i] / denom) : 0;
            uint8_t hi = denom > 0 ? f32_to_e2m1(w[b * 16 + i + 1] / denom) : 0;
            codes[(b * 16 + i) / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void fp8_block_quantize(const float *w, size_t N, size_t K, uint8_t *q, float *scale)
{
    size_t nb_k = (K + 127) / 128;
    for (size_t bn = 0; bn < (N + 127) / 128; bn++) {
        for (size_t bk = 0; bk < nb_k; bk++) {
            float amax = 0;
            for (size_t n = bn * 128; n < N && n < bn * 128 + 128; n++)
                for (size_t k = bk * 128; k < K && k < bk * 128 + 128; k++)
                    amax = fmaxf(amax, fabsf(w[n * K + k]));
            float s = amax > 0 ? amax / 448.0f : 1.0f;
            scale[bn * nb_k + bk] = s;
            for (size_t n = bn * 128; n < N && n < bn * 128 + 128; n++)
                for (size_t k = bk * 128; k < K && k < bk * 128 + 128; k++)
                    q[n * K + k] = f32_to_e4m3(w[n * K + k] / s);
        }
    }
}
