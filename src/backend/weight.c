/* weight.c — see weight.h. */
#include "backend/weight.h"

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
