/* test_rand.h — the seeded random inputs the op and GEMM tests share (never all zeros).
 *
 * Include after <cmocka.h> (rand_floats asserts its allocation).
 *
 * defines: rng_next(), rng_unit(), rand_floats()
 */
#ifndef MOESERVE_TESTS_TEST_RAND_H
#define MOESERVE_TESTS_TEST_RAND_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

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

#endif
