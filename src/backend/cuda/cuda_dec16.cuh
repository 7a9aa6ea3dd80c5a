/* cuda_dec16.cuh — the dec16 layout's device pieces (see cuda_dec16.cu's header for the layout and
 * why it exists): building a lane's mma A fragments from its word, the mma, the block scales, x
 * staged as B fragments, and one 64-k segment of a 16-row tile. Shared by the one-token GEMVs of
 * cuda_dec16.cu and the chained MoE kernel of cuda_moe_chain.cu.
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_DEC16_CUH
#define MOESERVE_BACKEND_CUDA_CUDA_DEC16_CUH

#include "backend/cuda/cuda_decode_mma.cuh"

namespace
{

/* DQ_U: segments a warp loads before the PDL wait and keeps in flight after it; the K split
 * gives every warp at most DQ_U segments where the grid allows, so that (as gemv_mma's warps) a
 * warp's whole slice is asked for while the previous kernel still runs (DQ_U = 4 left half of
 * q/k/v's slices for after the wait: 398.6 vs 413.8 tok/s against gemv_mma on the H200) */
enum { DQ_THREADS = 256, DQ_WARPS = DQ_THREADS / 32, DQ_MAX_JOBS = 3, DQ_U = 8 };

/* a0 = rows g, k (4t, 4t + 1); a1 = row g + 8, the same k; a2 = row g, k (4t + 2, 4t + 3); a3 =
 * row g + 8, those: the mma's A registers in its own order (rows g / g + 8, k 2t / 2t + 8). */
__device__ __forceinline__ void dec16_pairs(uint32_t u, uint32_t &a0, uint32_t &a1, uint32_t &a2,
                                            uint32_t &a3)
{
    constexpr uint32_t M = 0x81C081C0u;
    a0 = u & M;
    a1 = (u << 3) & M;
    a2 = (u << 6) & M;
    a3 = ((u >> 4) & 0x00C000C0u) | ((u >> 6) & 0x01000100u) | ((u << 2) & 0x80008000u);
}

/* C = A B with a fresh C (the block scale is applied to it) */
__device__ __forceinline__ void dec16_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint2 b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "f"(0.0f));
}

/* two E4M3 bytes (low: row g's scale, high: row g + 8's) as floats, exactly */
__device__ __forceinline__ float2 dec16_scales(uint32_t s16)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t h;
    asm("{.reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t;}" : "=r"(h) : "r"(s16));
    return __half22float2(*(const __half2 *)&h);
#else
    return make_float2(dev_e4m3(s16 & 0xffu), dev_e4m3((s16 >> 8) & 0xffu));
#endif
}

__device__ __forceinline__ void dec16_put_x(uint2 *xb, int i, float4 xv)
{
    const int b = i / 4, t = i % 4;
    const float v0 = xv.x * 0x1p100f, v1 = xv.y * 0x1p100f, v2 = xv.z * 0x1p100f, v3 = xv.w * 0x1p100f;
    const float h0 = bf16_round(v0), h1 = bf16_round(v1), h2 = bf16_round(v2), h3 = bf16_round(v3);
    xb[b * 16 + t] = make_uint2(bf16x2_of(h0, h1), bf16x2_of(h2, h3));
    xb[b * 16 + 4 + t] = make_uint2(bf16x2_of(v0 - h0, v1 - h1), bf16x2_of(v2 - h2, v3 - h3));
    xb[b * 16 + 8 + t] = make_uint2(0u, 0u);
}

/* x * 2^100 as bf16 hi + lo in B-fragment order. Block b's 16 uint2: [0, 4) hi for t = 0..3 (B
 * column 0), [4, 8) lo (column 1), [8, 12) zeros for the lanes of columns 2..7, so that a warp's
 * read is one wavefront (x in banks 0-15, the zeros in 16-23). Each thread's loads are issued
 * before its first store (each is an L2 round trip), and between() runs after them and before
 * the stores when the thread's share fits one round (else first): the MoE kernel issues its
 * weight loads there, behind x's (cuda_decode_mma.cuh's xfrag_stage_around says why). */
template <typename F>
__device__ __forceinline__ void dec16_stage_x(uint2 *xb, const float *x, int K, F &&between)
{
    constexpr int XB = 4;
    if (K / 4 > XB * DQ_THREADS)
        between();
    for (int i0 = threadIdx.x; i0 < K / 4; i0 += XB * DQ_THREADS) {
        float4 xv[XB];
#pragma unroll
        for (int q = 0; q < XB; q++)
            if (i0 + q * DQ_THREADS < K / 4)
                xv[q] = *(const float4 *)(x + 4 * (i0 + q * DQ_THREADS));
        if (K / 4 <= XB * DQ_THREADS)
            between();
#pragma unroll
        for (int q = 0; q < XB; q++)
            if (i0 + q * DQ_THREADS < K / 4)
                dec16_put_x(xb, i0 + q * DQ_THREADS, xv[q]);
    }
    if (threadIdx.x >= K / 4 && K / 4 <= XB * DQ_THREADS) /* threads without x to load */
        between();
}

/* One segment (4 mmas) of a lane's tile into acc (C rows g and g + 8, columns 2t and 2t + 1:
 * lanes t = 0 hold row g's hi and lo sums in acc[0], acc[1] and row g + 8's in acc[2], acc[3]) */
__device__ __forceinline__ void dec16_segment(uint4 wv, uint2 sv, const uint2 *xl, float (&acc)[4])
{
    const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t a0, a1, a2, a3;
        dec16_pairs(words[j], a0, a1, a2, a3);
        float c[4];
        dec16_mma(c, a0, a1, a2, a3, xl[j * 16]);
        const uint32_t sw = j < 2 ? sv.x : sv.y;
        const float2 sc = dec16_scales(j % 2 ? sw >> 16 : sw & 0xffffu);
        acc[0] = fmaf(c[0], sc.x, acc[0]);
        acc[1] = fmaf(c[1], sc.x, acc[1]);
        acc[2] = fmaf(c[2], sc.y, acc[2]);
        acc[3] = fmaf(c[3], sc.y, acc[3]);
    }
}

} // namespace

#endif
