/* test_rand.h — the seeded random inputs the op and GEMM tests share (never all zeros).
 *
 * Include after <cmocka.h> (rand_floats asserts its allocation).
 *
 * defines: rng_next(), rng_unit(), rand_floats(), struct rand_weight + rand_weight_init/_free
 */
#ifndef MOESERVE_TESTS_TEST_RAND_H
#define MOESERVE_TESTS_TEST_RAND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "format/weight.h"

static inline uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float rng_unit(uint64_t *s) /* uniform [-1, 1) */
{
    return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0);
}

/* n floats uniform in [-scale, scale); the caller frees */
static inline float *rand_floats(size_t n, float scale, uint64_t *rng)
{
    float *p = malloc(n * sizeof(float) + 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * rng_unit(rng);
    return p;
}

/* A random weight in host memory and the buffers it borrows. */
struct rand_weight {
    struct weight w;
    void *data;
    void *scale;
    float *bias;
};

/* Valid bit patterns only: no NaN fp8 codes, positive e4m3 scales; f16
 * includes subnormals, which the hardware conversion must get right too. */
static inline void rand_weight_init(struct rand_weight *t, enum weight_format fmt, int64_t n, int64_t k, bool bias,
                                    uint64_t *rng)
{
    memset(t, 0, sizeof(*t));
    size_t nk = (size_t)(n * k);
    t->w = (struct weight){.format = fmt, .rows = n, .cols = k, .scale2 = 1.0f};
    switch (fmt) {
    case WEIGHT_F32: t->data = rand_floats(nk, 1.0f, rng); break;
    case WEIGHT_BF16: {
        uint16_t *d = malloc(nk * 2 + 2);
        assert_non_null(d);
        for (size_t i = 0; i < nk; i++)
            d[i] = f32_to_bf16(rng_unit(rng));
        t->data = d;
        break;
    }
    case WEIGHT_F16: {
        uint16_t *d = malloc(nk * 2 + 2);
        assert_non_null(d);
        for (size_t i = 0; i < nk; i++) {
            uint64_t r = rng_next(rng);
            /* 1 in 8 subnormal, else |v| in [2^-5, 2) like the other formats */
            uint16_t exp = (uint16_t)(r % 8 == 0 ? 0 : 10 + (r >> 3) % 6);
            d[i] = (uint16_t)(((r >> 8) & 0x8000u) | (exp << 10) | ((r >> 20) & 0x3ffu));
        }
        t->data = d;
        break;
    }
    case WEIGHT_FP8_BLOCK: {
        uint8_t *d = malloc(nk + 1);
        assert_non_null(d);
        for (size_t i = 0; i < nk; i++) {
            uint8_t b;
            do
                b = (uint8_t)rng_next(rng);
            while ((b & 0x7f) == 0x7f);
            d[i] = b;
        }
        size_t ns = (size_t)((n + 127) / 128 * ((k + 127) / 128));
        float *s = malloc(ns * 4 + 4);
        assert_non_null(s);
        for (size_t i = 0; i < ns; i++)
            s[i] = ldexpf(1.0f + 0.5f * rng_unit(rng), -(int)(rng_next(rng) % 12));
        t->data = d;
        t->scale = s;
        break;
    }
    case WEIGHT_NVFP4: {
        uint8_t *d = malloc(nk / 2 + 1);
        uint8_t *s = malloc(nk / 16 + 1);
        assert_non_null(d);
        assert_non_null(s);
        for (size_t i = 0; i < nk / 2; i++)
            d[i] = (uint8_t)rng_next(rng);
        for (size_t i = 0; i < nk / 16; i++)
            s[i] = (uint8_t)(1 + rng_next(rng) % 0x7e); /* 0x01..0x7e: positive, not NaN */
        t->data = d;
        t->scale = s;
        t->w.scale2 = 0.37f;
        break;
    }
    case WEIGHT_FORMAT_COUNT: fail();
    }
    t->w.data = t->data;
    t->w.scale = t->scale;
    if (bias) {
        t->bias = rand_floats((size_t)n, 1.0f, rng);
        t->w.bias = t->bias;
    }
}

static inline void rand_weight_free(struct rand_weight *t)
{
    free(t->data);
    free(t->scale);
    free(t->bias);
    memset(t, 0, sizeof(*t));
}

#endif
