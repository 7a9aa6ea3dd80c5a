/* test_fp8_decode.c — the e4m3 MoE decode kernels' own lane code (cuda_decode_fp8.cu), run on the
 * host through a model of the m16n8k32 mma (cuda_moe_fp8_emulate), against exact dot products of
 * the same NVFP4 rows. No GPU needed: this checks the bookkeeping the kernels depend on (which k
 * each lane's nibbles and x's staged levels stand for, which A rows hold which scale block,
 * which scales multiply which C values, the levels' weights) before any GPU run.
 *
 * Bound: the x split into three e4m3 levels, 3.5e-6 of sum |w x| at worst in tools/
 * fp8_act_error.c's study; 2e-5 here. A wrong mapping gives errors of order 1.
 * Without CUDA in the build the test has nothing to run and says so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "format/quant_codec.h"
#include "test_rand.h"

#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/cuda_kernels.h"

static void run_rows(int K, uint64_t *rng, double *worst)
{
    float *w = malloc(sizeof(float) * (size_t)K), *x = malloc(sizeof(float) * (size_t)K);
    uint8_t *codes = malloc((size_t)8 * (size_t)K / 2), *scales = malloc((size_t)8 * (size_t)K / 16);
    /* activations with a few large channels, as RMSNorm outputs have */
    for (int k = 0; k < K; k++)
        x[k] = rng_unit(rng) * (fabsf(rng_unit(rng)) < 0.02f ? 20.0f : 1.0f); /* 1% of them 20x */
    for (int r = 0; r < 8; r++) {
        for (int k = 0; k < K; k++)
            w[k] = rng_unit(rng) * (0.01f + 0.02f * (float)r); /* rows of different ranges */
        /* scale2 1: the block scales carry the range, as the emulation leaves scale2 out */
        nvfp4_quantize_row(w, (size_t)K, 1.0f, codes + (size_t)r * (size_t)(K / 2),
                           scales + (size_t)r * (size_t)(K / 16));
    }
    float out[8];
    assert_int_equal(cuda_moe_fp8_emulate(codes, scales, x, K, out), 0);
    for (int r = 0; r < 8; r++) {
        double exact = 0.0, mag = 0.0;
        for (int k = 0; k < K; k++) {
            const uint8_t byte = codes[(size_t)r * (size_t)(K / 2) + (size_t)(k / 2)];
            const double wv = (double)e2m1_to_f32((uint8_t)((byte >> (4 * (k % 2))) & 15u)) *
                              (double)e4m3_to_f32(scales[(size_t)r * (size_t)(K / 16) + (size_t)(k / 16)]);
            exact += wv * x[k];
            mag += fabs(wv * x[k]);
        }
        const double e = mag > 0.0 ? fabs((double)out[r] - exact) / mag : fabs((double)out[r]);
        if (e > 2e-5)
            fail_msg("K %d row %d: emulated %.9g, exact %.9g (error %.3g of sum |w x|)", K, r, (double)out[r],
                     exact, e);
        *worst = e > *worst ? e : *worst;
    }
    free(w), free(x), free(codes), free(scales);
}

static void test_emulated_rows_match(void **state)
{
    (void)state;
    uint64_t rng = 77;
    double worst = 0.0;
    const int Ks[] = {128, 256, 768, 2048};
    for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; i++)
        for (int rep = 0; rep < 4; rep++)
            run_rows(Ks[i], &rng, &worst);
    print_message("    worst error %.3g of sum |w x| over 16 tiles of 8 rows\n", worst);
    float out[8];
    assert_int_equal(cuda_moe_fp8_emulate(NULL, NULL, NULL, 100, out), -1); /* K not a multiple of 128 */
}
#else
static void test_emulated_rows_match(void **state)
{
    (void)state;
    print_message("    no CUDA in this build: cuda_decode_fp8.cu is not compiled, nothing to check\n");
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_emulated_rows_match)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
