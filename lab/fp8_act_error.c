/* fp8_act_error.c — how precise would an NVFP4 decode GEMV on FP8 (e4m3) tensor cores be?
 *
 * The bf16 mma decode (cuda_decode_mma.cu) splits x into bf16 hi + lo (~16 significant bits)
 * and costs ~0.11 warp instructions a weight, most of them turning E2M1 nibbles into bf16
 * pairs. An e4m3 mma (m16n8k32, sm_89+) would take E2M1 codes almost as they are (code << 2 is
 * the value times 2^-6) and do twice the k per instruction, but x must then be e4m3 too: split
 * into levels (hi, mid, lo), each an e4m3 of what the levels before left, scaled up so that it
 * stays normal. This tool measures, on the host, what that costs in precision against the bf16
 * hi/lo scheme, with real NVFP4 weights (Gaussian rows through nvfp4_quantize_row, i.e. what
 * `moeserve quantize` writes) and activations with a few large channels, as RMSNorm outputs have.
 * The products E2M1 x e4m3 are exact in fp32 (2 + 4 significant bits), so the error is the
 * split of x plus fp32 accumulation, which is what this measures.
 *
 *   build/fp8_act_error [rows] [K]       (default 4096 rows, K = 2048)
 *
 * Prints per scheme the worst and the RMS of |dot - exact| / sum |w x| over the rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "format/quant_codec.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double rng_unit(void) /* uniform (0, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static float rng_gauss(void)
{
    return (float)(sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit()));
}

static float bf16_round(float v)
{
    return bf16_to_f32(f32_to_bf16(v));
}

static float e4m3_round(float v)
{
    return e4m3_to_f32(f32_to_e4m3(v));
}

/* x split into `levels` e4m3 parts: part i is e4m3((x / S - earlier parts) * 2^(shift * i)) /
 * 2^(shift * i), S = max|x| / 448 so that the first level uses e4m3's whole range. */
static void e4m3_split(const float *x, int K, int levels, int shift, float *parts /* levels x K */, float *S)
{
    float amax = 0.0f;
    for (int k = 0; k < K; k++)
        amax = fmaxf(amax, fabsf(x[k]));
    *S = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int k = 0; k < K; k++) {
        float rest = x[k] / *S;
        for (int l = 0; l < levels; l++) {
            const float up = ldexpf(1.0f, shift * l);
            const float p = e4m3_round(rest * up) / up;
            parts[(size_t)l * K + k] = p;
            rest -= p;
        }
    }
}

struct stat {
    double worst, sum_sq;
    long n;
};

static void stat_add(struct stat *s, double e)
{
    s->worst = e > s->worst ? e : s->worst;
    s->sum_sq += e * e;
    s->n++;
}

int main(int argc, char **argv)
{
    const int rows = argc > 1 ? atoi(argv[1]) : 4096, K = argc > 2 ? atoi(argv[2]) : 2048;
    if (rows < 1 || K < 16 || K % 16) {
        fprintf(stderr, "usage: %s [rows] [K, a multiple of 16]\n", argv[0]);
        return 2;
    }
    float *w = malloc(sizeof(float) * (size_t)K), *wq = malloc(sizeof(float) * (size_t)K);
    float *x = malloc(sizeof(float) * (size_t)K), *parts = malloc(sizeof(float) * 3 * (size_t)K);
    uint8_t *codes = malloc((size_t)K / 2), *scales = malloc((size_t)K / 16);
    /* activations: N(0, 1) with 1% of the channels 20x larger (RMSNorm outputs have a few) */
    for (int k = 0; k < K; k++)
        x[k] = rng_gauss() * (rng_unit() < 0.01 ? 20.0f : 1.0f);
    struct stat st[4] = {{0}};
    const char *names[4] = {"bf16 hi + lo (cuda_decode_mma.cu today)", "e4m3 x 2 levels (shift 4)",
                            "e4m3 x 3 levels (shift 4)", "e4m3 x 3 levels (shift 6)"};
    float sx[3];
    for (int r = 0; r < rows; r++) {
        float amax = 0.0f;
        for (int k = 0; k < K; k++) {
            w[k] = rng_gauss() * 0.02f;
            amax = fmaxf(amax, fabsf(w[k]));
        }
        const float scale2 = nvfp4_global_scale(amax);
        nvfp4_quantize_row(w, (size_t)K, scale2, codes, scales);
        for (int k = 0; k < K; k++) /* the weight as the checkpoint holds it, exactly */
            wq[k] = e2m1_to_f32((uint8_t)((codes[k / 2] >> (4 * (k % 2))) & 15)) *
                    e4m3_to_f32(scales[k / 16]) * scale2;
        double exact = 0.0, mag = 0.0;
        for (int k = 0; k < K; k++) {
            exact += (double)wq[k] * x[k];
            mag += fabs((double)wq[k] * x[k]);
        }
        if (mag == 0.0)
            continue;
        /* bf16 hi + lo, fp32 sums */
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            const float hi = bf16_round(x[k]), lo = bf16_round(x[k] - hi);
            acc += wq[k] * hi + wq[k] * lo;
        }
        stat_add(&st[0], fabs((double)acc - exact) / mag);
        /* e4m3 levels: one fp32 sum per level (a C row each), combined at the end */
        static const int LV[3] = {2, 3, 3}, SH[3] = {4, 4, 6};
        for (int m = 0; m < 3; m++) {
            e4m3_split(x, K, LV[m], SH[m], parts, &sx[m]);
            float total = 0.0f;
            for (int l = 0; l < LV[m]; l++) {
                float a = 0.0f;
                for (int k = 0; k < K; k++)
                    a += wq[k] * parts[(size_t)l * K + k];
                total += a;
            }
            stat_add(&st[m + 1], fabs((double)total * sx[m] - exact) / mag);
        }
    }
    printf("K = %d, %d rows; error = |dot - exact| / sum |w x|\n", K, rows);
    printf("%-42s %12s %12s\n", "scheme", "worst", "rms");
    for (int m = 0; m < 4; m++)
        printf("%-42s %12.3e %12.3e\n", names[m], st[m].worst,
               sqrt(st[m].sum_sq / (double)(st[m].n ? st[m].n : 1)));
    free(w), free(wq), free(x), free(parts), free(codes), free(scales);
    return 0;
}
