/* dtype.h — element types of checkpoint tensors and their conversions.
 *
 * The scalar converters are static inline because they sit in the innermost
 * loops of the CPU kernels. Conversions are exact where the format allows
 * (bf16/f16/e4m3/e2m1 -> f32 always are); f32 -> bf16 rounds to nearest even.
 *
 * defines: enum dtype, dtype_size(), dtype_name(), dtype_parse(),
 *          bf16_to_f32(), f32_to_bf16(), f16_to_f32(), e4m3_to_f32(), e2m1_to_f32()
 */
#ifndef MOESERVE_BASE_DTYPE_H
#define MOESERVE_BASE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

enum dtype {
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_F32,
    DTYPE_F64,
    DTYPE_F8_E4M3,
    DTYPE_U8,
    DTYPE_I8,
    DTYPE_I16,
    DTYPE_I32,
    DTYPE_I64,
    DTYPE_BOOL,
    DTYPE_COUNT,
};

/* Bytes per element. */
size_t dtype_size(enum dtype t);
/* The safetensors spelling ("BF16", "F8_E4M3", ...). */
const char *dtype_name(enum dtype t);
/* Parses the safetensors spelling; false if unknown. */
bool dtype_parse(const char *s, enum dtype *out);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24); /* zero or subnormal */
        return sign ? -f : f;
    }
    uint32_t u;
    if (exp == 31)
        u = sign | 0x7f800000u | (man << 13);
    else
        u = sign | ((exp + 112u) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

/* OCP E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN. */
static inline float e4m3_to_f32(uint8_t b)
{
    uint32_t exp = (b >> 3) & 0xfu;
    uint32_t man = b & 0x7u;
    float f;
    if (exp == 0xf && man == 0x7)
        f = NAN;
    else if (exp == 0)
        f = ldexpf((float)man, -9);
    else
        f = ldexpf((float)(8 + man), (int)exp - 10);
    return (b & 0x80) ? -f : f;
}

/* E2M1 (4-bit): bit 3 sign, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6. */
static inline float e2m1_to_f32(uint8_t code)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float f = mag[code & 7u];
    return (code & 8u) ? -f : f;
}

#endif
