/* test_weight_synth.c — synthetic weights (format/weight_synth.h): a share is exactly the slice
 * of the whole tensor (rows and in-features, NVFP4 and BF16), the values are valid and have the
 * std a checkpoint's would (1/sqrt(in-features) after dequantisation), NVFP4 scales lie in
 * 64..448 and every code occurs, vectors are norms near 1 or small biases; formats without a
 * generator are refused. The CUDA kernel's bytes: test_weight_synth_cuda. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "format/weight_synth.h"

struct made {
    struct weight w;
    uint8_t *data, *scale;
};

static struct made make(enum weight_format f, int64_t rows, int64_t cols, int64_t row_off, int64_t col_off,
                        int64_t full_cols, uint64_t seed)
{
    struct made m = {.w = {.format = f, .rows = rows, .cols = cols, .scale2 = 1.0f}};
    m.data = malloc(weight_data_bytes(&m.w));
    m.scale = weight_scale_bytes(&m.w) ? malloc(weight_scale_bytes(&m.w)) : NULL;
    assert_non_null(m.data);
    struct weight_synth s = weight_synth_share(seed, row_off, col_off, full_cols);
    assert_null(weight_synth_fill(&s, &m.w, m.data, m.scale));
    m.w.data = m.data, m.w.scale = m.scale;
    if (f == WEIGHT_NVFP4)
        m.w.scale2 = weight_synth_nvfp4_scale2(full_cols);
    return m;
}

static void made_free(struct made *m)
{
    free(m->data), free(m->scale);
}

/* rows [r0, r0 + R) x in-features [c0, c0 + C) of the whole, dequantised, equal the share's */
static void check_share(enum weight_format f)
{
    const int64_t N = 24, K = 96, r0 = 8, R = 10, c0 = 32, C = 48;
    struct made whole = make(f, N, K, 0, 0, K, 77), part = make(f, R, C, r0, c0, K, 77);
    float *a = malloc(K * sizeof(float)), *b = malloc(C * sizeof(float));
    for (int64_t r = 0; r < R; r++) {
        weight_dequant_row(&whole.w, r0 + r, a);
        weight_dequant_row(&part.w, r, b);
        assert_memory_equal(a + c0, b, C * sizeof(float));
    }
    free(a), free(b);
    made_free(&whole), made_free(&part);
}

static void test_share_is_the_slice(void **state)
{
    (void)state;
    check_share(WEIGHT_BF16);
    check_share(WEIGHT_F32);
    check_share(WEIGHT_NVFP4);
}

static double row_std(const struct weight *w, double *mean_out)
{
    float *row = malloc((size_t)w->cols * sizeof(float));
    double s = 0, s2 = 0, n = 0;
    for (int64_t r = 0; r < w->rows; r++) {
        weight_dequant_row(w, r, row);
        for (int64_t c = 0; c < w->cols; c++) {
            assert_true(isfinite(row[c]));
            s += row[c], s2 += (double)row[c] * row[c], n++;
        }
    }
    free(row);
    *mean_out = s / n;
    return sqrt(s2 / n - (s / n) * (s / n));
}

static void test_values(void **state)
{
    (void)state;
    const int64_t N = 256, K = 1024;
    const double want = 1.0 / sqrt((double)K);
    for (int fi = 0; fi < 2; fi++) {
        enum weight_format f = fi ? WEIGHT_NVFP4 : WEIGHT_BF16;
        struct made m = make(f, N, K, 0, 0, K, 5);
        double mean, sd = row_std(&m.w, &mean);
        print_message("    %s: std %.5f (1/sqrt(K) = %.5f), mean %.2e\n", weight_format_name(f), sd, want, mean);
        assert_true(fabs(sd / want - 1.0) < 0.05);
        assert_true(fabs(mean) < 0.05 * want);
        if (f == WEIGHT_NVFP4) {
            int seen[16] = {0};
            for (size_t i = 0; i < weight_data_bytes(&m.w); i++)
                seen[m.data[i] & 15]++, seen[m.data[i] >> 4]++;
            for (int c = 0; c < 16; c++)
                assert_true(seen[c] > 0);
            for (size_t i = 0; i < weight_scale_bytes(&m.w); i++)
                assert_true(m.scale[i] >= WS_SCALE_LO && m.scale[i] <= WS_SCALE_HI);
        }
        made_free(&m);
    }
    /* another seed, another tensor */
    struct made a = make(WEIGHT_BF16, 4, 64, 0, 0, 64, 1), b = make(WEIGHT_BF16, 4, 64, 0, 0, 64, 2);
    assert_true(memcmp(a.data, b.data, weight_data_bytes(&a.w)) != 0);
    made_free(&a), made_free(&b);
    assert_true(weight_synth_seed(1, "model.layers.0.mlp.gate") != weight_synth_seed(1, "model.layers.1.mlp.gate"));
}

static void test_vectors_and_refusals(void **state)
{
    (void)state;
    float v[64], w[16];
    weight_synth_vector(9, WS_VEC_NORM, 0, 64, v);
    bool varied = false;
    for (int i = 0; i < 64; i++) {
        assert_true(v[i] >= 0.79f && v[i] <= 1.21f);
        varied |= v[i] != v[0];
    }
    assert_true(varied);
    weight_synth_vector(9, WS_VEC_NORM, 16, 16, w); /* a share of a vector is its slice */
    assert_memory_equal(v + 16, w, sizeof w);
    weight_synth_vector(9, WS_VEC_BIAS, 0, 64, v);
    for (int i = 0; i < 64; i++)
        assert_true(fabsf(v[i]) <= 0.0101f);
    uint8_t buf[64];
    struct weight fp8 = {.format = WEIGHT_FP8_BLOCK, .rows = 4, .cols = 16};
    struct weight_synth s = weight_synth_share(1, 0, 0, 16);
    assert_non_null(weight_synth_fill(&s, &fp8, buf, buf));
    struct weight off = {.format = WEIGHT_NVFP4, .rows = 1, .cols = 16};
    s = weight_synth_share(1, 0, 8, 32); /* in-features from 8: off the 16-blocks */
    assert_non_null(weight_synth_fill(&s, &off, buf, buf + 8));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_share_is_the_slice), cmocka_unit_test(test_values),
                                       cmocka_unit_test(test_vectors_and_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
