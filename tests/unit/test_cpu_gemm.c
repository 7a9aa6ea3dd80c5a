/* test_cpu_gemm.c — cpu_gemm for every weight format against a double-precision reference.
 *
 * The reference decodes each weight element with base/dtype.h and sums in
 * double, so it sees exactly the values the kernels see; the only permitted
 * difference is fp32 accumulation order, hence max|diff| / max|ref| < 1e-5.
 * Every case runs twice, on the AVX2 kernels (where the CPU has them) and on
 * the portable ones (cpu_gemm_force_scalar), and the two are also compared.
 * y is poisoned (NaN inside [m, rows], a sentinel in the ldy padding) so an
 * unwritten element or a write past rows is caught; x padding is NaN so a read
 * past cols poisons the result.
 *
 * Not here: speed (tools/bench_gemm.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_gemm.h"
#include "base/dtype.h"
#include "test_rand.h"

#define SENTINEL (-12345.5f)

/* W[n, k] decoded element by element, straight from the format description. */
static double ref_w(const struct weight *w, int64_t n, int64_t k)
{
    size_t i = (size_t)(n * w->cols + k);
    switch (w->format) {
    case WEIGHT_F32: return ((const float *)w->data)[i];
    case WEIGHT_BF16: return bf16_to_f32(((const uint16_t *)w->data)[i]);
    case WEIGHT_F16: return f16_to_f32(((const uint16_t *)w->data)[i]);
    case WEIGHT_FP8_BLOCK: {
        const float *s = w->scale;
        int64_t kb = (w->cols + 127) / 128;
        return (double)e4m3_to_f32(((const uint8_t *)w->data)[i]) * s[(n / 128) * kb + k / 128];
    }
    case WEIGHT_NVFP4: {
        uint8_t b = ((const uint8_t *)w->data)[(size_t)(n * (w->cols / 2) + k / 2)];
        uint8_t code = (k % 2 == 0) ? (b & 15) : (b >> 4);
        uint8_t sc = ((const uint8_t *)w->scale)[(size_t)(n * (w->cols / 16) + k / 16)];
        return (double)e2m1_to_f32(code) * (double)e4m3_to_f32(sc) * (double)w->scale2;
    }
    case WEIGHT_FORMAT_COUNT: break;
    }
    fail();
    return 0;
}

/* ref (m, N) = x W^T + bias in double. */
static void reference(const struct weight *w, const float *x, int m, size_t ldx, double *ref)
{
    int64_t N = w->rows, K = w->cols;
    double *wd = malloc((size_t)(N * K) * sizeof(double) + 8);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            wd[n * K + k] = ref_w(w, n, k);
    for (int i = 0; i < m; i++) {
        for (int64_t n = 0; n < N; n++) {
            double s = w->bias ? w->bias[n] : 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (double)x[(size_t)i * ldx + (size_t)k] * wd[n * K + k];
            ref[(size_t)i * (size_t)N + (size_t)n] = s;
        }
    }
    free(wd);
}

/* Runs cpu_gemm into a poisoned y (m rows, or one when m == 0) and checks that
 * exactly [m, N] was written. Returns y; caller frees. */
static float *run_gemm(const struct weight *w, const float *x, int m, size_t ldx, size_t ldy,
                       bool scalar)
{
    size_t rows = m > 0 ? (size_t)m : 1;
    float *y = malloc(rows * ldy * sizeof(float));
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < ldy; c++)
            y[i * ldy + c] = (int64_t)c < w->rows && (int)i < m ? NAN : SENTINEL;
    cpu_gemm_force_scalar(scalar);
    cpu_gemm(w, x, m, ldx, y, ldy);
    cpu_gemm_force_scalar(false);
    for (size_t i = 0; i < rows; i++) {
        for (size_t c = 0; c < ldy; c++) {
            float v = y[i * ldy + c];
            if ((int64_t)c < w->rows && (int)i < m) {
                if (isnan(v))
                    fail_msg("y[%zu][%zu] not written (m=%d N=%lld K=%lld scalar=%d)", i, c, m,
                             (long long)w->rows, (long long)w->cols, scalar);
            } else if (memcmp(&v, &(float){SENTINEL}, sizeof(float)) != 0) {
                fail_msg("y[%zu][%zu] outside [m, N] written", i, c);
            }
        }
    }
    return y;
}

static double rel_err(const float *y, size_t ldy, const double *ref, int m, int64_t N)
{
    double max_diff = 0.0, max_ref = 1e-30;
    for (int i = 0; i < m; i++) {
        for (int64_t n = 0; n < N; n++) {
            double r = ref[(size_t)i * (size_t)N + (size_t)n];
            double d = fabs((double)y[(size_t)i * ldy + (size_t)n] - r);
            if (!(d <= max_diff)) /* NaN-safe */
                max_diff = d;
            if (fabs(r) > max_ref)
                max_ref = fabs(r);
        }
    }
    return max_diff / max_ref;
}

static double g_worst; /* largest error seen by check_case since the last reset */

static void check_case(enum weight_format fmt, int m, int64_t N, int64_t K, bool bias, uint64_t seed)
{
    uint64_t rng = seed;
    struct rand_weight t;
    rand_weight_init(&t, fmt, N, K, bias, &rng);
    const size_t ldx = (size_t)K + 5, ldy = (size_t)N + 3;
    size_t xrows = m > 0 ? (size_t)m : 1;
    float *x = malloc(xrows * ldx * sizeof(float));
    for (size_t i = 0; i < xrows; i++)
        for (size_t k = 0; k < ldx; k++)
            x[i * ldx + k] = (int64_t)k < K ? rng_unit(&rng) : NAN;
    double *ref = malloc(xrows * (size_t)N * sizeof(double));
    reference(&t.w, x, m, ldx, ref);

    float *y_fast = run_gemm(&t.w, x, m, ldx, ldy, false);
    float *y_port = run_gemm(&t.w, x, m, ldx, ldy, true);
    double e_fast = rel_err(y_fast, ldy, ref, m, N);
    double e_port = rel_err(y_port, ldy, ref, m, N);
    /* the two paths against each other, on the reference's scale */
    for (int i = 0; i < m; i++)
        for (int64_t n = 0; n < N; n++)
            ref[(size_t)i * (size_t)N + (size_t)n] = y_port[(size_t)i * ldy + (size_t)n];
    double e_pair = rel_err(y_fast, ldy, ref, m, N);
    g_worst = fmax(g_worst, fmax(e_fast, fmax(e_port, e_pair)));
    if (!(e_fast < 1e-5 && e_port < 1e-5 && e_pair < 1e-5))
        fail_msg("%s m=%d N=%lld K=%lld bias=%d: rel err fast %.3g portable %.3g between %.3g",
                 weight_format_name(fmt), m, (long long)N, (long long)K, bias, e_fast, e_port,
                 e_pair);
    free(y_fast);
    free(y_port);
    free(ref);
    free(x);
    rand_weight_free(&t);
}

static void check_format(enum weight_format fmt)
{
    static const int MS[] = {0, 1, 3, 4, 5, 17, 64};
    static const int64_t KS[] = {16, 48, 100, 576, 1024};
    static const int64_t NS[] = {1, 7, 33, 576};
    uint64_t seed = 1000 * (uint64_t)fmt;
    int cases = 0;
    g_worst = 0.0;
    for (size_t a = 0; a < sizeof(MS) / sizeof(MS[0]); a++)
        for (size_t b = 0; b < sizeof(KS) / sizeof(KS[0]); b++)
            for (size_t c = 0; c < sizeof(NS) / sizeof(NS[0]); c++)
                for (int bias = 0; bias < 2; bias++) {
                    if (fmt == WEIGHT_NVFP4 && KS[b] % 16 != 0)
                        continue;
                    check_case(fmt, MS[a], NS[c], KS[b], bias, ++seed);
                    cases++;
                }
    print_message("%s: %d cases, worst rel err %.2g\n", weight_format_name(fmt), cases, g_worst);
}

static void test_f32(void **state)
{
    (void)state;
    check_format(WEIGHT_F32);
}

static void test_bf16(void **state)
{
    (void)state;
    check_format(WEIGHT_BF16);
}

static void test_f16(void **state)
{
    (void)state;
    check_format(WEIGHT_F16);
}

static void test_fp8_block(void **state)
{
    (void)state;
    check_format(WEIGHT_FP8_BLOCK);
}

static void test_nvfp4(void **state)
{
    (void)state;
    check_format(WEIGHT_NVFP4);
}

/* Odd shapes the grid above misses: K tails of every length around a vector,
 * fp8 row blocks straddled by a 4-row group, m at the fused/panel boundary. */
static void test_edges(void **state)
{
    (void)state;
    uint64_t seed = 77;
    for (int64_t K = 1; K <= 40; K++)
        for (enum weight_format f = WEIGHT_F32; f < WEIGHT_NVFP4; f++)
            check_case(f, 2, 5, K, K & 1, ++seed);
    for (int m = 6; m <= 10; m++) {
        check_case(WEIGHT_FP8_BLOCK, m, 130, 200, true, ++seed);
        check_case(WEIGHT_NVFP4, m, 19, 272, false, ++seed);
        check_case(WEIGHT_BF16, m, 129, 263, true, ++seed);
    }
}

/* Other team sizes partition rows differently (uneven panel items, a thread
 * with no rows); results must not depend on it beyond rounding. */
static void test_threads(void **state)
{
    (void)state;
    const int saved = omp_get_max_threads();
    uint64_t seed = 500;
    for (int t = 1; t <= 5; t += 2) {
        omp_set_num_threads(t);
        check_case(WEIGHT_BF16, 1, 576, 1024, true, ++seed);
        check_case(WEIGHT_NVFP4, 8, 33, 1024, false, ++seed);
        check_case(WEIGHT_FP8_BLOCK, 64, 576, 576, true, ++seed);
        check_case(WEIGHT_F16, 17, 7, 1024, true, ++seed);
    }
    omp_set_num_threads(saved);
}

/* Hand-built nvfp4 row, independent of the reference's reading of the layout:
 * element 2i is byte i's low nibble. Identity x makes y the decoded row. */
static void test_nvfp4_layout(void **state)
{
    (void)state;
    uint8_t data[8] = {0x21, 0xf3, 0x07, 0x80, 0, 0, 0, 0xa5};
    uint8_t scale[1] = {0x38}; /* e4m3 1.0 */
    const float want[16] = {0.5f, 1.0f, 1.5f, -6.0f, 6.0f, 0.0f, 0.0f, -0.0f,
                            0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 3.0f, -1.0f};
    struct weight w = {.format = WEIGHT_NVFP4, .rows = 1, .cols = 16, .data = data,
                       .scale = scale, .scale2 = 2.0f};
    float x[16 * 16] = {0};
    for (int i = 0; i < 16; i++)
        x[i * 16 + i] = 1.0f;
    for (int scalar = 0; scalar < 2; scalar++) {
        for (int m = 1; m <= 16; m += 15) { /* fused (single rows) and panel paths */
            for (int i0 = 0; i0 + m <= 16; i0 += m) {
                float y[16];
                cpu_gemm_force_scalar(scalar);
                cpu_gemm(&w, x + i0 * 16, m, 16, y, 1);
                cpu_gemm_force_scalar(false);
                for (int i = 0; i < m; i++)
                    assert_float_equal(y[i], 2.0f * want[i0 + i], 0.0f);
            }
        }
    }
}

/* A NaN code (0x7f) must reach y in every path, not decode as 480. */
static void test_fp8_nan(void **state)
{
    (void)state;
    enum { N = 8, K = 24 };
    uint8_t data[N * K];
    memset(data, 0x38, sizeof(data)); /* 1.0 */
    data[3 * K + 9] = 0x7f;
    data[5 * K + 20] = 0xff; /* in the scalar K tail */
    float scale[1] = {0.5f}, x[10 * K], y[10 * N];
    for (int i = 0; i < 10 * K; i++)
        x[i] = 1.0f;
    struct weight w = {.format = WEIGHT_FP8_BLOCK, .rows = N, .cols = K, .data = data,
                       .scale = scale, .scale2 = 1.0f};
    for (int scalar = 0; scalar < 2; scalar++) {
        for (int m = 1; m <= 10; m += 9) {
            cpu_gemm_force_scalar(scalar);
            cpu_gemm(&w, x, m, K, y, N);
            cpu_gemm_force_scalar(false);
            for (int i = 0; i < m; i++)
                for (int n = 0; n < N; n++) {
                    if (n == 3 || n == 5)
                        assert_true(isnan(y[i * N + n]));
                    else
                        assert_float_equal(y[i * N + n], 0.5f * K, 0.0f);
                }
        }
    }
}

/* cols == 0: the empty sum, y = bias (or 0). */
static void test_k_zero(void **state)
{
    (void)state;
    float bias[3] = {1.0f, -2.0f, 3.0f}, y[2 * 3], x[2] = {0};
    uint16_t dummy = 0;
    struct weight w = {.format = WEIGHT_BF16, .rows = 3, .cols = 0, .data = &dummy, .bias = bias,
                       .scale2 = 1.0f};
    for (int i = 0; i < 6; i++)
        y[i] = NAN;
    cpu_gemm(&w, x, 2, 0, y, 3);
    for (int i = 0; i < 6; i++)
        assert_float_equal(y[i], bias[i % 3], 0.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvfp4_layout), cmocka_unit_test(test_fp8_nan),
        cmocka_unit_test(test_k_zero),       cmocka_unit_test(test_edges),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_f32),          cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_f16),          cmocka_unit_test(test_fp8_block),
        cmocka_unit_test(test_nvfp4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
