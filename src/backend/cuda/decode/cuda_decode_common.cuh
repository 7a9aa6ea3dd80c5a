/* cuda_decode_common.cuh — the device pieces of cuda_decode.cu's CUDA-core decode kernels (one
 * launch per weight pass with its loads in registers): chunk shapes, x's swizzled shared-memory
 * layout, the per-format dot products. See cuda_decode.cu's header for the NVFP4 decode without
 * a lookup (e2m1_raw) and the 2^100 / 2^26 scaling it needs.
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_DECODE_COMMON_CUH
#define MOESERVE_BACKEND_CUDA_CUDA_DECODE_COMMON_CUH

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/decode/cuda_decode_limits.h"

namespace
{


constexpr float X_PRESCALE = 0x1p100f;
constexpr float W_POSTSCALE = 0x1p26f; /* 2^126 / 2^100 */

/* Nibble I of u as f32 bits: exactly its E2M1 value times 2^-126. */
template <int I>
__device__ __forceinline__ float e2m1_raw(uint32_t u)
{
    constexpr int mag_shift = 22 - 4 * I, sign_shift = 28 - 4 * I; /* left; negative: right */
    uint32_t mag = mag_shift >= 0 ? (u << (mag_shift >= 0 ? mag_shift : 0)) : (u >> (mag_shift < 0 ? -mag_shift : 0));
    uint32_t sgn = sign_shift >= 0 ? (u << (sign_shift >= 0 ? sign_shift : 0)) : (u >> (sign_shift < 0 ? -sign_shift : 0));
    return __uint_as_float((mag & 0x01C00000u) | (sgn & 0x80000000u));
}


/* Elements of one lane's chunk: 16 bytes of weights; Q float4s of x. */
template <int FMT>
struct chunk {
    static constexpr int n = FMT == WEIGHT_NVFP4 ? 32 : FMT == WEIGHT_FP8_BLOCK ? 16 : FMT == WEIGHT_F32 ? 4 : 8;
    static constexpr int q = n / 4;
};

/* x lives in shared memory, chunk by chunk: chunk c's float4 i sits at c * Q + (i ^ swz(c)).
 * Lanes read consecutive chunks at the same i; without the XOR, 8 lanes of a 128-byte phase
 * would hit the same banks (a chunk is Q float4s long), with it they hit 8 different ones. */
template <int Q>
__device__ __forceinline__ int x_swz(int64_t c)
{
    if constexpr (Q >= 2)
        return (int)((c / (8 / Q)) & (Q - 1));
    return 0;
}

/* x[0 .. K) into shared memory in the layout above (NVFP4: times 2^100, see top). Block-wide;
 * the caller synchronises. */
template <int FMT>
__device__ __forceinline__ void stage_x(float4 *xs, const float *x, int64_t K)
{
    constexpr int Q = chunk<FMT>::q;
    const float4 *src = (const float4 *)x;
    for (int64_t f = threadIdx.x; f < K / 4; f += blockDim.x) {
        float4 v = src[f];
        if constexpr (FMT == WEIGHT_NVFP4)
            v = make_float4(v.x * X_PRESCALE, v.y * X_PRESCALE, v.z * X_PRESCALE, v.w * X_PRESCALE);
        int64_t c = f / Q;
        xs[c * Q + ((int)(f % Q) ^ x_swz<Q>(c))] = v;
    }
}

/* 16 bytes of one row plus what scales them. */
struct wraw {
    uint4 w;
    uint32_t s; /* NVFP4: the two E4M3 block scales; FP8: the f32 block scale's bits */
};

template <int FMT>
__device__ __forceinline__ wraw load_raw(const cuda_wdev &w, int64_t n, int64_t k, int64_t K)
{
    wraw r;
    r.s = 0;
    if constexpr (FMT == WEIGHT_NVFP4) {
        r.w = __ldg((const uint4 *)((const uint8_t *)w.data + n * (K / 2) + k / 2));
        r.s = __ldg((const uint16_t *)((const uint8_t *)w.scale + n * (K / 16) + k / 16));
    } else if constexpr (FMT == WEIGHT_FP8_BLOCK) {
        r.w = __ldg((const uint4 *)((const uint8_t *)w.data + n * K + k));
        r.s = __float_as_uint(__ldg((const float *)w.scale + (n / 128) * ((K + 127) / 128) + k / 128));
    } else if constexpr (FMT == WEIGHT_F32) {
        r.w = __ldg((const uint4 *)((const float *)w.data + n * K + k));
    } else {
        r.w = __ldg((const uint4 *)((const uint16_t *)w.data + n * K + k));
    }
    return r;
}

template <int I>
__device__ __forceinline__ float e2m1_dot4(uint32_t u, float4 x, float acc)
{
    acc = fmaf(e2m1_raw<I>(u), x.x, acc);
    acc = fmaf(e2m1_raw<I + 1>(u), x.y, acc);
    acc = fmaf(e2m1_raw<I + 2>(u), x.z, acc);
    return fmaf(e2m1_raw<I + 3>(u), x.w, acc);
}

__device__ __forceinline__ float fp8_dot4(uint32_t u, float4 x, float acc)
{
    acc = fmaf(dev_e4m3(u & 255u), x.x, acc);
    acc = fmaf(dev_e4m3((u >> 8) & 255u), x.y, acc);
    acc = fmaf(dev_e4m3((u >> 16) & 255u), x.z, acc);
    return fmaf(dev_e4m3(u >> 24), x.w, acc);
}

template <int FMT>
__device__ __forceinline__ float half2_dot(uint32_t u, float a, float b, float acc)
{
    if constexpr (FMT == WEIGHT_BF16)
        return fmaf(dev_bf16(u >> 16), b, fmaf(dev_bf16(u & 0xffffu), a, acc));
    return fmaf(dev_f16(u >> 16), b, fmaf(dev_f16(u & 0xffffu), a, acc));
}

/* The chunk's dot product with x chunk xc (in the swizzled layout, swz = x_swz(c)); NVFP4 before
 * the global scale and over 2^26 (see top). */
template <int FMT>
__device__ __forceinline__ float dot_raw(const wraw &r, const float4 *xc, int swz)
{
    if constexpr (FMT == WEIGHT_NVFP4) {
        float a0 = e2m1_dot4<0>(r.w.x, xc[0 ^ swz], 0.0f);
        a0 = e2m1_dot4<4>(r.w.x, xc[1 ^ swz], a0);
        a0 = e2m1_dot4<0>(r.w.y, xc[2 ^ swz], a0);
        a0 = e2m1_dot4<4>(r.w.y, xc[3 ^ swz], a0);
        float a1 = e2m1_dot4<0>(r.w.z, xc[4 ^ swz], 0.0f);
        a1 = e2m1_dot4<4>(r.w.z, xc[5 ^ swz], a1);
        a1 = e2m1_dot4<0>(r.w.w, xc[6 ^ swz], a1);
        a1 = e2m1_dot4<4>(r.w.w, xc[7 ^ swz], a1);
        return fmaf(a0, dev_e4m3(r.s & 255u), a1 * dev_e4m3((r.s >> 8) & 255u));
    } else if constexpr (FMT == WEIGHT_FP8_BLOCK) {
        float a = fp8_dot4(r.w.x, xc[0 ^ swz], 0.0f);
        a = fp8_dot4(r.w.y, xc[1 ^ swz], a);
        a = fp8_dot4(r.w.z, xc[2 ^ swz], a);
        a = fp8_dot4(r.w.w, xc[3 ^ swz], a);
        return a * __uint_as_float(r.s);
    } else if constexpr (FMT == WEIGHT_F32) {
        float4 x = xc[0];
        return fmaf(__uint_as_float(r.w.w), x.w,
                    fmaf(__uint_as_float(r.w.z), x.z, fmaf(__uint_as_float(r.w.y), x.y, __uint_as_float(r.w.x) * x.x)));
    } else {
        float4 x0 = xc[0 ^ swz], x1 = xc[1 ^ swz];
        float a = half2_dot<FMT>(r.w.x, x0.x, x0.y, 0.0f);
        a = half2_dot<FMT>(r.w.y, x0.z, x0.w, a);
        a = half2_dot<FMT>(r.w.z, x1.x, x1.y, a);
        return half2_dot<FMT>(r.w.w, x1.z, x1.w, a);
    }
}

template <int FMT>
__device__ __forceinline__ float finish(const cuda_wdev &w, float s)
{
    if constexpr (FMT == WEIGHT_NVFP4)
        return s * (W_POSTSCALE * w.scale2);
    return s;
}

} // namespace

#endif
