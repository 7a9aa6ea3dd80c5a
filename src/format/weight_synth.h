/* weight_synth.h — random valid weights of real shapes, made where they are used.
 *
 * `bench --synthetic PRESET` runs models no disk here holds (GLM-5 in NVFP4 is 421 GB): each rank
 * makes its own share of every weight in the memory that computes with it, so no file and no host
 * copy exists. A value is a pure function of (the tensor's seed, the element's place in the WHOLE
 * tensor), so a rank's share is exactly that slice of the one-rank weight (sharded runs compare
 * with unsharded ones), and the CPU (weight_synth_fill) and the CUDA kernel (common.h,
 * cuda_weight_synth) make the same bytes from the inline functions below.
 *
 * Values as tools/make_synth_checkpoint writes them, never zeros (zeros make matmuls look faster
 * than real data): plain matrices uniform with std 1/sqrt(in-features); NVFP4 codes uniformly
 * random, block scales uniform among the E4M3 values 64..448 and a global scale that gives the
 * dequantised weight the same std (weight_synth_nvfp4_scale2); vectors: norms 1 +- 0.2, biases
 * small. Not done: FP8 block and F16 (no preset uses them).
 *
 * defines: struct weight_synth, enum weight_synth_vec, weight_synth_seed(), weight_synth_share(),
 *          weight_synth_nvfp4_scale2(), weight_synth_fill(), weight_synth_vector(),
 *          ws_hash(), ws_uniform(), ws_bf16(), ws_code(), ws_scale(), WS_SCALE_LO, WS_SCALE_HI
 */
#ifndef MOESERVE_FORMAT_WEIGHT_SYNTH_H
#define MOESERVE_FORMAT_WEIGHT_SYNTH_H

#include <stdint.h>

#ifdef __CUDACC__
#define WS_HD __host__ __device__ __forceinline__
#else
#define WS_HD static inline
#include "format/weight.h"
#endif

/* E4M3 block scales 0x68 = 64.0 .. 0x7e = 448.0 (the largest finite E4M3) */
#define WS_SCALE_LO 0x68
#define WS_SCALE_HI 0x7e
/* a block scale's generator is the tensor's seed with this flipped in (codes and scales independent) */
#define WS_SCALE_SALT 0x5ca1ab1e5ca1ab1eull

/* A share of one tensor: rows [row_off, row_off + rows) and in-features [col_off, col_off + cols)
 * of the whole [*, full_cols]. */
struct weight_synth {
    uint64_t seed;
    int64_t row_off, col_off;
    int64_t full_cols;
    float amp; /* plain formats: values uniform in [-amp, amp) (sqrt(3 / full_cols)) */
};

/* splitmix64 of (seed, index): every element its own independent draw */
WS_HD uint64_t ws_hash(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1), exact in float (24 bits) so host and device agree bit for bit */
WS_HD float ws_uniform(uint64_t h)
{
    return (float)(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/* f32 -> bf16 nearest even (finite inputs only) */
WS_HD uint16_t ws_bf16(float f)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.f = f;
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

/* the E2M1 code of element g (its index in the whole tensor) */
WS_HD uint8_t ws_code(uint64_t seed, uint64_t g)
{
    return (uint8_t)(ws_hash(seed, g) >> 60);
}

/* the E4M3 scale byte of block gb (its index in the whole tensor's scale matrix) */
WS_HD uint8_t ws_scale(uint64_t seed, uint64_t gb)
{
    return (uint8_t)(WS_SCALE_LO + (ws_hash(seed ^ WS_SCALE_SALT, gb) >> 33) % (WS_SCALE_HI - WS_SCALE_LO + 1));
}

#ifndef __CUDACC__
/* What a vector holds. */
enum weight_synth_vec { WS_VEC_NORM, WS_VEC_BIAS };

/* The seed of tensor `name` in a model made from seed `base`. */
uint64_t weight_synth_seed(uint64_t base, const char *name);
/* s for the share of w's rows [row_off, +w->rows) and in-features [col_off, +w->cols) of a tensor
 * of full_cols in-features. */
struct weight_synth weight_synth_share(uint64_t seed, int64_t row_off, int64_t col_off, int64_t full_cols);
/* NVFP4 global scale: dequantised values then have std 1/sqrt(full_cols). */
float weight_synth_nvfp4_scale2(int64_t full_cols);
/* Fills w's share (w->format, w->rows x w->cols) into data (weight_data_bytes(w)) and scale
 * (weight_scale_bytes(w); NULL for plain formats). NULL, or why the format cannot be made. */
const char *weight_synth_fill(const struct weight_synth *s, const struct weight *w, void *data, void *scale);
/* Entries [off, off + n) of a vector made from seed: norms 1 + 0.2u, biases 0.01u. */
void weight_synth_vector(uint64_t seed, enum weight_synth_vec kind, int64_t off, int64_t n, float *out);
#endif

#endif
