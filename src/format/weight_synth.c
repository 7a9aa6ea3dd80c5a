/* weight_synth.c — see weight_synth.h. The CUDA kernel (backend/cuda/common/cuda_weight_synth.cu)
 * makes the same bytes from the same inline functions; test_weight_synth compares the two. */
#include "format/weight_synth.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"

uint64_t weight_synth_seed(uint64_t base, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return ws_hash(base, h);
}

struct weight_synth weight_synth_share(uint64_t seed, int64_t row_off, int64_t col_off, int64_t full_cols)
{
    return (struct weight_synth){.seed = seed, .row_off = row_off, .col_off = col_off, .full_cols = full_cols,
                                 .amp = sqrtf(3.0f / (float)full_cols)};
}

/* std(e2m1 * e4m3) over uniform codes and scales = rms(codes) * rms(scales) (codes are symmetric) */
float weight_synth_nvfp4_scale2(int64_t full_cols)
{
    double c2 = 0, s2 = 0;
    for (int c = 0; c < 16; c++)
        c2 += (double)e2m1_to_f32((uint8_t)c) * e2m1_to_f32((uint8_t)c);
    for (int b = WS_SCALE_LO; b <= WS_SCALE_HI; b++)
        s2 += (double)e4m3_to_f32((uint8_t)b) * e4m3_to_f32((uint8_t)b);
    double unit = 1.0 / (sqrt(c2 / 16) * sqrt(s2 / (WS_SCALE_HI - WS_SCALE_LO + 1)));
    return (float)(unit / sqrt((double)full_cols));
}

const char *weight_synth_fill(const struct weight_synth *s, const struct weight *w, void *data, void *scale)
{
    const int64_t R = w->rows, C = w->cols, FC = s->full_cols;
    switch (w->format) {
    case WEIGHT_BF16:
    case WEIGHT_F32:
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                uint64_t g = (uint64_t)(s->row_off + r) * (uint64_t)FC + (uint64_t)(s->col_off + c);
                float v = s->amp * ws_uniform(ws_hash(s->seed, g));
                if (w->format == WEIGHT_BF16)
                    ((uint16_t *)data)[r * C + c] = ws_bf16(v);
                else
                    ((float *)data)[r * C + c] = v;
            }
        return NULL;
    case WEIGHT_NVFP4: {
        if (C % 16 || s->col_off % 16 || FC % 16)
            return "NVFP4 shares start and end on 16 in-features";
        uint8_t *codes = data, *sc = scale;
        for (int64_t r = 0; r < R; r++) {
            uint64_t g0 = (uint64_t)(s->row_off + r) * (uint64_t)FC + (uint64_t)s->col_off;
            for (int64_t c = 0; c < C; c += 2)
                codes[(r * C + c) / 2] =
                    (uint8_t)(ws_code(s->seed, g0 + (uint64_t)c) | ws_code(s->seed, g0 + (uint64_t)c + 1) << 4);
            uint64_t b0 = (uint64_t)(s->row_off + r) * (uint64_t)(FC / 16) + (uint64_t)(s->col_off / 16);
            for (int64_t b = 0; b < C / 16; b++)
                sc[r * (C / 16) + b] = ws_scale(s->seed, b0 + (uint64_t)b);
        }
        return NULL;
    }
    default: return "synthetic weights exist in BF16, F32 and NVFP4 only";
    }
}

void weight_synth_vector(uint64_t seed, enum weight_synth_vec kind, int64_t off, int64_t n, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        float u = ws_uniform(ws_hash(seed, (uint64_t)(off + i)));
        /* through bf16, as a checkpoint stores vectors */
        out[i] = bf16_to_f32(ws_bf16(kind == WS_VEC_NORM ? 1.0f + 0.2f * u : 0.01f * u));
    }
}
