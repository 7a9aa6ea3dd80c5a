/* weight.c — see weight.h. */
#include "format/weight.h"

#include <string.h>

#include "base/dtype.h"

const char *weight_format_name(enum weight_format f)
{
    switch (f) {
    case WEIGHT_F32: return "f32";
    case WEIGHT_BF16: return "bf16";
    case WEIGHT_F16: return "f16";
    case WEIGHT_FP8_BLOCK: return "fp8-block128";
    case WEIGHT_NVFP4: return "nvfp4";
    case WEIGHT_FORMAT_COUNT: break;
    }
    return "?";
}

size_t weight_data_bytes(const struct weight *w)
{
    size_t n = (size_t)w->rows * (size_t)w->cols;
    switch (w->format) {
    case WEIGHT_F32: return n * 4;
    case WEIGHT_BF16:
    case WEIGHT_F16: return n * 2;
    case WEIGHT_FP8_BLOCK: return n;
    case WEIGHT_NVFP4: return n / 2;
    case WEIGHT_FORMAT_COUNT: break;
    }
    return 0;
}

size_t weight_scale_bytes(const struct weight *w)
{
    switch (w->format) {
    case WEIGHT_FP8_BLOCK: return (size_t)((w->rows + 127) / 128) * (size_t)((w->cols + 127) / 128) * 4;
    case WEIGHT_NVFP4: return (size_t)w->rows * (size_t)w->cols / 16;
    default: return 0;
    }
}

size_t weight_bytes(const struct weight *w)
{
    size_t n = (size_t)w->rows * (size_t)w->cols;
    size_t b = 0;
    switch (w->format) {
    case WEIGHT_F32: b = n * 4; break;
    case WEIGHT_BF16:
    case WEIGHT_F16: b = n * 2; break;
    case WEIGHT_FP8_BLOCK:
        b = n + (size_t)((w->rows + 127) / 128) * (size_t)((w->cols + 127) / 128) * 4;
        break;
    case WEIGHT_NVFP4: b = n / 2 + n / 16 + 4; break;
    case WEIGHT_FORMAT_COUNT: break;
    }
    if (w->bias)
        b += (size_t)w->rows * 4;
    return b;
}

void weight_dequant_row(const struct weight *w, int64_t row, float *out)
{
    size_t K = (size_t)w->cols, r = (size_t)row;
    switch (w->format) {
    case WEIGHT_F32:
        memcpy(out, (const float *)w->data + r * K, K * sizeof(float));
        break;
    case WEIGHT_BF16:
        for (size_t k = 0; k < K; k++)
            out[k] = bf16_to_f32(((const uint16_t *)w->data)[r * K + k]);
        break;
    case WEIGHT_F16:
        for (size_t k = 0; k < K; k++)
            out[k] = f16_to_f32(((const uint16_t *)w->data)[r * K + k]);
        break;
    case WEIGHT_FP8_BLOCK: {
        const uint8_t *q = (const uint8_t *)w->data + r * K;
        const float *sc = (const float *)w->scale + (r / 128) * ((K + 127) / 128);
        for (size_t k = 0; k < K; k++)
            out[k] = e4m3_to_f32(q[k]) * sc[k / 128];
        break;
    }
    case WEIGHT_NVFP4: {
        const uint8_t *q = (const uint8_t *)w->data + r * (K / 2);
        const uint8_t *sc = (const uint8_t *)w->scale + r * (K / 16);
        for (size_t k = 0; k < K; k++) {
            uint8_t code = (k & 1) ? (uint8_t)(q[k / 2] >> 4) : (uint8_t)(q[k / 2] & 15);
            out[k] = e2m1_to_f32(code) * e4m3_to_f32(sc[k / 16]) * w->scale2;
        }
        break;
    }
    case WEIGHT_FORMAT_COUNT:
        break;
    }
}
