/* weight.h — a linear layer's weight as the checkpoint stores it.
 *
 * Weights are never converted to a full-precision copy: kernels read this
 * format directly (DESIGN.md decision 3). A struct weight only borrows its
 * pointers (from the mmap'ed checkpoint on the CPU, from device memory on a
 * GPU backend).
 *
 * defines: enum weight_format, struct weight, weight_format_name(), weight_data_bytes(),
 *          weight_scale_bytes(), weight_bytes(),
 *          weight_dequant_row(), weight_slice_rows(), weight_slice_cols(), weight_format_in_block()
 */
#ifndef MOESERVE_FORMAT_WEIGHT_H
#define MOESERVE_FORMAT_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

enum weight_format {
    WEIGHT_F32,
    WEIGHT_BF16,
    WEIGHT_F16,
    WEIGHT_FP8_BLOCK, /* E4M3 [rows, cols] + f32 scale [ceil(rows/128), ceil(cols/128)] */
    WEIGHT_NVFP4,     /* E2M1 pairs [rows, cols/2] (low nibble first) + E4M3 scale [rows, cols/16] + f32 scale2 */
    WEIGHT_FORMAT_COUNT,
};

struct weight {
    enum weight_format format;
    int64_t rows;      /* N: output features */
    int64_t cols;      /* K: input features */
    const void *data;  /* row-major, see format; borrowed */
    const void *scale; /* FP8_BLOCK / NVFP4 block scales; NULL otherwise; borrowed */
    float scale2;      /* NVFP4 per-tensor global scale; 1 otherwise */
    const float *bias; /* (rows) f32 or NULL; borrowed */
};

const char *weight_format_name(enum weight_format f);
/* Bytes of w->data, and of w->scale (0 when the format has none). */
size_t weight_data_bytes(const struct weight *w);
size_t weight_scale_bytes(const struct weight *w);
/* Bytes a kernel reads for this weight (data + scales + bias). */
size_t weight_bytes(const struct weight *w);
/* Row `row` of W as fp32 (exact for every format: e2m1*e4m3*scale2 and
 * e4m3*scale are representable products). Host memory only; the portable
 * reference that kernels and round-trip tests compare against. */
void weight_dequant_row(const struct weight *w, int64_t row, float *out);
/* In-features one scale block covers: 16 NVFP4, 128 FP8 block, 1 for the plain formats (a split of
 * the in-features must fall on these). */
int weight_format_in_block(enum weight_format f);
/* Rows [off, off + n) of w as a view into the same memory (a rank's share of a column-parallel
 * layer); the bias is not touched. NULL, or the reason the split does not fall on w's scale
 * blocks (FP8: 128 rows; NVFP4 and plain formats: any row). */
const char *weight_slice_rows(const struct weight *w, int64_t off, int64_t n, struct weight *out);
/* In-features [off, off + n) of w copied into *buf (malloc'd, the caller's: the share of a
 * row-parallel layer); the bias is not touched. NULL, or the reason: a split off w's scale
 * blocks (NVFP4: 16 in-features, FP8: 128), or no memory. */
const char *weight_slice_cols(const struct weight *w, int64_t off, int64_t n, struct weight *out, void **buf);

#endif
