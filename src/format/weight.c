/* weight.c — see weight.h. */
#include "format/weight.h"

#include <stdlib.h>
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

int weight_format_in_block(enum weight_format f)
{
    return f == WEIGHT_NVFP4 ? 16 : f == WEIGHT_FP8_BLOCK ? 128 : 1;
}

/* bytes of one row of data (every format stores whole rows) */
static size_t row_bytes(const struct weight *w)
{
    struct weight one = *w;
    one.rows = 1;
    return weight_data_bytes(&one);
}

const char *weight_slice_rows(const struct weight *w, int64_t off, int64_t n, struct weight *out)
{
    if (off < 0 || n <= 0 || off + n > w->rows)
        return "rows outside the weight";
    *out = *w;
    out->rows = n;
    out->data = (const uint8_t *)w->data + (size_t)off * row_bytes(w);
    switch (w->format) {
    case WEIGHT_NVFP4: out->scale = (const uint8_t *)w->scale + (size_t)off * (size_t)(w->cols / 16); break;
    case WEIGHT_FP8_BLOCK:
        if (off % 128 || (n % 128 && off + n != w->rows))
            return "the split is not on the 128-row scale blocks of fp8-block128";
        out->scale = (const float *)w->scale + (size_t)(off / 128) * (size_t)((w->cols + 127) / 128);
        break;
    default: break;
    }
    return NULL;
}

const char *weight_slice_cols(const struct weight *w, int64_t off, int64_t n, struct weight *out, void **buf)
{
    *buf = NULL;
    if (off < 0 || n <= 0 || off + n > w->cols)
        return "in-features outside the weight";
    size_t esz_num = 0, esz_den = 1; /* data bytes per in-feature */
    switch (w->format) {
    case WEIGHT_F32: esz_num = 4; break;
    case WEIGHT_BF16:
    case WEIGHT_F16: esz_num = 2; break;
    case WEIGHT_FP8_BLOCK:
        if (off % weight_format_in_block(w->format) || (n % weight_format_in_block(w->format) && off + n != w->cols))
            return "the split is not on the 128 in-feature scale blocks of fp8-block128";
        esz_num = 1;
        break;
    case WEIGHT_NVFP4:
        if (off % weight_format_in_block(w->format) || n % weight_format_in_block(w->format))
            return "the split is not on the 16 in-feature scale blocks of nvfp4";
        esz_num = 1, esz_den = 2;
        break;
    case WEIGHT_FORMAT_COUNT: return "unknown format";
    }
    *out = *w;
    out->cols = n;
    const size_t rows = (size_t)w->rows, src_row = (size_t)w->cols * esz_num / esz_den,
                 dst_row = (size_t)n * esz_num / esz_den, skip = (size_t)off * esz_num / esz_den;
    const size_t data = rows * dst_row, scales = weight_scale_bytes(out);
    uint8_t *p = malloc(data + scales + 16);
    if (!p)
        return "out of memory for the shard";
    for (size_t r = 0; r < rows; r++)
        memcpy(p + r * dst_row, (const uint8_t *)w->data + r * src_row + skip, dst_row);
    /* scales after the data, 16-byte aligned for the loads that read them whole */
    uint8_t *sc = p + ((data + 15) / 16) * 16;
    if (w->format == WEIGHT_NVFP4) {
        for (size_t r = 0; r < rows; r++)
            memcpy(sc + r * (size_t)(n / 16), (const uint8_t *)w->scale + r * (size_t)(w->cols / 16) + off / 16,
                   (size_t)(n / 16));
        out->scale = sc;
    } else if (w->format == WEIGHT_FP8_BLOCK) {
        const size_t rb = (rows + 127) / 128, src_cb = (size_t)(w->cols + 127) / 128, dst_cb = (size_t)(n + 127) / 128;
        for (size_t r = 0; r < rb; r++)
            memcpy(sc + r * dst_cb * 4, (const float *)w->scale + r * src_cb + off / 128, dst_cb * 4);
        out->scale = sc;
    }
    out->data = p;
    *buf = p;
    return NULL;
}
