/* bench_gemm.c — cpu_gemm speed: decode bandwidth against the memcpy roofline, prefill GFLOP/s.
 *
 * Decode (m = 1, 8): GB/s of weight bytes read (weight_bytes(): data + scales),
 * with each timed pass rotating over enough distinct weights (> 256 MB) that
 * none is cache-resident, as in a real forward. Median of --runs passes (and
 * the best one); %memcpy compares the median with the median memcpy rate.
 * Prefill (m = 512): GFLOP/s on one weight, which does stay in cache.
 * Weight contents are random but valid (no NaN codes, realistic bf16 range).
 *
 * Usage: bench_gemm [--scalar] [--runs N]
 *   --scalar  the portable kernels instead of AVX2 (cpu_gemm_force_scalar)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_membw.h"
#include "base/dtype.h"
#include "base/timer.h"

#define ROTATE_BYTES (256u << 20)

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_unit(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0);
}

/* A weight owning its buffers, filled in parallel so pages are spread like
 * the GEMM threads that read them. */
struct bench_weight {
    struct weight w;
    void *data;
    void *scale;
};

static int bench_weight_init(struct bench_weight *b, enum weight_format fmt, int64_t n, int64_t k,
                             uint64_t seed)
{
    memset(b, 0, sizeof(*b));
    size_t nk = (size_t)(n * k), data_bytes = 0, scale_bytes = 0;
    switch (fmt) {
    case WEIGHT_F32: data_bytes = nk * 4; break;
    case WEIGHT_BF16:
    case WEIGHT_F16: data_bytes = nk * 2; break;
    case WEIGHT_FP8_BLOCK:
        data_bytes = nk;
        scale_bytes = (size_t)((n + 127) / 128 * ((k + 127) / 128)) * 4;
        break;
    case WEIGHT_NVFP4:
        data_bytes = nk / 2;
        scale_bytes = nk / 16;
        break;
    case WEIGHT_FORMAT_COUNT: return -1;
    }
    b->data = malloc(data_bytes);
    b->scale = scale_bytes ? malloc(scale_bytes) : NULL;
    if (!b->data || (scale_bytes && !b->scale))
        return -1;
#pragma omp parallel
    {
        uint64_t s = seed * 1315423911u + (uint64_t)omp_get_thread_num();
#pragma omp for schedule(static)
        for (size_t i = 0; i < nk; i++) {
            switch (fmt) {
            case WEIGHT_F32: ((float *)b->data)[i] = rng_unit(&s); break;
            case WEIGHT_BF16: ((uint16_t *)b->data)[i] = f32_to_bf16(0.05f * rng_unit(&s)); break;
            case WEIGHT_F16: /* |v| in [2^-9, 2^-3): typical weights, no subnormals */
                ((uint16_t *)b->data)[i] = (uint16_t)(rng_next(&s) & 0x83ffu) | (uint16_t)((6 + i % 6) << 10);
                break;
            case WEIGHT_FP8_BLOCK: {
                uint8_t v = (uint8_t)rng_next(&s);
                ((uint8_t *)b->data)[i] = (v & 0x7f) == 0x7f ? 0x7e : v;
                break;
            }
            case WEIGHT_NVFP4:
                if (i % 2 == 0)
                    ((uint8_t *)b->data)[i / 2] = (uint8_t)rng_next(&s);
                if (i % 16 == 0)
                    ((uint8_t *)b->scale)[i / 16] = (uint8_t)(0x30 + rng_next(&s) % 16);
                break;
            case WEIGHT_FORMAT_COUNT: break;
            }
        }
    }
    if (fmt == WEIGHT_FP8_BLOCK)
        for (size_t i = 0; i < scale_bytes / 4; i++)
            ((float *)b->scale)[i] = 1e-3f * (1.5f + rng_unit(&seed));
    b->w = (struct weight){.format = fmt, .rows = n, .cols = k, .data = b->data,
                           .scale = b->scale, .scale2 = 1.0f};
    return 0;
}

static void bench_weight_free(struct bench_weight *b)
{
    free(b->data);
    free(b->scale);
    memset(b, 0, sizeof(*b));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and fastest seconds of runs passes, one pass = cpu_gemm on each of
 * nw weights. Both are printed: on a shared machine the gap shows the noise. */
static void time_passes(const struct bench_weight *ws, int nw, const float *x, int m, float *y,
                        int runs, double *median, double *best)
{
    double *t = malloc((size_t)runs * sizeof(double));
    for (int r = -1; r < runs; r++) { /* r = -1: warm-up */
        double t0 = timer_now();
        for (int i = 0; i < nw; i++)
            cpu_gemm(&ws[i].w, x, m, (size_t)ws[i].w.cols, y, (size_t)ws[i].w.rows);
        if (r >= 0)
            t[r] = timer_now() - t0;
    }
    qsort(t, (size_t)runs, sizeof(double), cmp_double);
    *median = t[runs / 2];
    *best = t[0];
    free(t);
}

int main(int argc, char **argv)
{
    int runs = 7;
    bool scalar = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--scalar") == 0) {
            scalar = true;
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--scalar] [--runs N]\n", argv[0]);
            return 2;
        }
    }
    if (runs < 1)
        runs = 1;
    cpu_gemm_force_scalar(scalar);

    double membw = cpu_memcpy_bandwidth(ROTATE_BYTES, runs);
    printf("threads %d, kernels %s, median of %d runs\n", omp_get_max_threads(),
           scalar ? "portable" : "best available", runs);
    printf("memcpy bandwidth (read + write): %.1f GB/s\n\n", membw);

    static const enum weight_format FMTS[] = {WEIGHT_BF16, WEIGHT_NVFP4, WEIGHT_FP8_BLOCK, WEIGHT_F32};
    static const int64_t SHAPES[][2] = {{2048, 2048}, {768 * 8, 2048}};
    static const int MS[] = {1, 8};
    enum { M_MAX = 512 };
    float *x = malloc((size_t)M_MAX * 8192 * sizeof(float));
    float *y = malloc((size_t)M_MAX * 8192 * sizeof(float));
    uint64_t s = 1;
    for (size_t i = 0; i < (size_t)M_MAX * 8192; i++)
        x[i] = rng_unit(&s);

    printf("decode: weight bytes read per second\n");
    printf("%-14s %6s %6s %3s %8s %8s %8s %8s %9s\n", "format", "N", "K", "m", "weights", "GB/s",
           "%memcpy", "best", "GFLOP/s");
    for (size_t f = 0; f < sizeof(FMTS) / sizeof(FMTS[0]); f++) {
        for (size_t sh = 0; sh < sizeof(SHAPES) / sizeof(SHAPES[0]); sh++) {
            int64_t N = SHAPES[sh][0], K = SHAPES[sh][1];
            struct bench_weight probe;
            if (bench_weight_init(&probe, FMTS[f], N, K, 0) != 0)
                return 1;
            size_t wb = weight_bytes(&probe.w);
            bench_weight_free(&probe);
            int nw = (int)(ROTATE_BYTES / wb) + 1;
            struct bench_weight *ws = calloc((size_t)nw, sizeof(*ws));
            for (int i = 0; i < nw; i++) {
                if (bench_weight_init(&ws[i], FMTS[f], N, K, (uint64_t)i + 1) != 0) {
                    fprintf(stderr, "out of memory\n");
                    return 1;
                }
            }
            for (size_t mi = 0; mi < sizeof(MS) / sizeof(MS[0]); mi++) {
                int m = MS[mi];
                double t, t_best;
                time_passes(ws, nw, x, m, y, runs, &t, &t_best);
                double gbs = (double)wb * nw / t / 1e9;
                double gflops = 2.0 * m * (double)N * (double)K * nw / t / 1e9;
                printf("%-14s %6lld %6lld %3d %8d %8.2f %7.0f%% %8.2f %9.1f\n",
                       weight_format_name(FMTS[f]), (long long)N, (long long)K, m, nw, gbs,
                       100.0 * gbs / membw, (double)wb * nw / t_best / 1e9, gflops);
                fflush(stdout);
            }
            for (int i = 0; i < nw; i++)
                bench_weight_free(&ws[i]);
            free(ws);
        }
    }

    printf("\nprefill: one weight (cache-resident), m = %d\n", M_MAX);
    printf("%-14s %6s %6s %3s %9s\n", "format", "N", "K", "m", "GFLOP/s");
    for (size_t f = 0; f < sizeof(FMTS) / sizeof(FMTS[0]); f++) {
        int64_t N = 2048, K = 2048;
        struct bench_weight b;
        if (bench_weight_init(&b, FMTS[f], N, K, 99) != 0)
            return 1;
        double t, t_best;
        time_passes(&b, 1, x, M_MAX, y, runs, &t, &t_best);
        printf("%-14s %6lld %6lld %3d %9.1f\n", weight_format_name(FMTS[f]), (long long)N,
               (long long)K, M_MAX, 2.0 * M_MAX * (double)N * (double)K / t / 1e9);
        fflush(stdout);
        bench_weight_free(&b);
    }
    free(x);
    free(y);
    return 0;
}
