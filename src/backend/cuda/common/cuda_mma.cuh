/* cuda_mma.cuh — warp-level bf16 tensor-core helpers (sm_80 and later): ldmatrix loads from
 * shared memory, the m16n8k16 bf16 MMA with fp32 accumulators, and the hi + lo bf16 split
 * that keeps fp32-grade operands exact to ~2^-16.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): lane l holds rows l/4 and l/4 + 8 and
 * columns 2*(l%4), +1 of each 8-wide block; tools in this header only load and multiply. */
#ifndef MOESERVE_BACKEND_CUDA_COMMON_CUDA_MMA_CUH
#define MOESERVE_BACKEND_CUDA_COMMON_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t mma_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. */
__device__ __forceinline__ void mma_ldsm_x4(uint32_t r[4], const uint16_t *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mma_smem_addr(p)));
}

/* The same, each matrix transposed (B operands stored k-major). */
__device__ __forceinline__ void mma_ldsm_x4_trans(uint32_t r[4], const uint16_t *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mma_smem_addr(p)));
}

/* c += a b: a 16x16 (row), b 16x8 (col), c 16x8 fp32. Registers only, so not volatile: the
 * compiler may move it past the next ldmatrix and overlap the two. */
__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* (a, b) as bf16x2 hi (a in the low half, as the MMA operands want) and lo = bf16x2(x - hi);
 * x - hi is exact in fp32. */
__device__ __forceinline__ void mma_split_bf16x2(float a, float b, uint32_t &hi, uint32_t &lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 f = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - f.x, b - f.y);
    hi = *(uint32_t *)&h;
    lo = *(uint32_t *)&l;
}

/* The online softmax of one tile of S held in the m16n8 accumulator layout (mma.sync's, and each
 * warp's part of wgmma's): element i of the N a thread holds is row lane/4 (i % 4 < 2) or lane/4 + 8
 * of the warp's 16, key 8 (i / 4) + 2 (lane % 4) + (i & 1); at(i) is that element. Keys that
 * key_ok(key) refuses weigh 0. The elements become exp(s scale - m), the unnormalised weights; the
 * two rows' running maxima (m_a, m_b) and this thread's sums of their weights (l_a, l_b: summed over
 * the quad at the end) move on, and the factors the rows' accumulated output must be scaled by come
 * back in al_a, al_b. */
template <int N, typename At, typename KeyOk>
__device__ __forceinline__ void mma_softmax_tile(At at, float scale, KeyOk key_ok, float &m_a, float &m_b,
                                                 float &l_a, float &l_b, float &al_a, float &al_b)
{
    const int lane = (int)threadIdx.x % 32;
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int key = (i / 4) * 8 + 2 * (lane & 3) + (i & 1);
        const float v = key_ok(key) ? at(i) * scale : -INFINITY;
        at(i) = v;
        if ((i & 2) == 0)
            mx_a = fmaxf(mx_a, v);
        else
            mx_b = fmaxf(mx_b, v);
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    al_a = mn_a == -INFINITY ? 1.0f : expf(m_a - mn_a);
    al_b = mn_b == -INFINITY ? 1.0f : expf(m_b - mn_b);
    float ps_a = 0.0f, ps_b = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float mref = (i & 2) ? mn_b : mn_a;
        const float pv = at(i) == -INFINITY ? 0.0f : expf(at(i) - mref);
        at(i) = pv;
        if ((i & 2) == 0)
            ps_a += pv;
        else
            ps_b += pv;
    }
    l_a = l_a * al_a + ps_a;
    l_b = l_b * al_b + ps_b;
    m_a = mn_a, m_b = mn_b;
}

#endif
