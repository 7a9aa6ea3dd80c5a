/* cuda_decode_fp8.cu — the few-token NVFP4 MoE pair kernels on e4m3 tensor cores (mma.sync
 * m16n8k32, sm_89 and later): the same work as cuda_decode_mma.cu's bf16 kernels in about half
 * the instructions.
 *
 * Why: the decode is bound by instruction issue, not DRAM (session 5: ncu, the one-kernel
 * layer's trace, L2 prefetch never helping). The bf16 scheme spends ~112 warp instructions on
 * 1024 weights, most of them turning E2M1 nibbles into bf16 pairs and scaling them. Here:
 *  - weights: an E2M1 code c (sign s, magnitude bits e1 e0 m) becomes the e4m3 byte
 *    s << 7 | (e1 e0 m) << 2, which is exactly the value times 2^-6 (0.5 lands on the e4m3
 *    subnormal 2^-7); 8 codes of a 32-bit word become two words of 4 bytes (the even and the
 *    odd nibbles) in ~5 integer ops, and one mma takes 32 k;
 *  - x: e4m3 in three levels, x / S = h + m / 16 + l / 256 with S = max|x| / 448 and every level
 *    the e4m3 of what the levels before left, times 16 (host study, tools/fp8_act_error.c: worst
 *    error 3.5e-6 of sum |w x| at K = 2048, against 8.0e-7 for bf16 hi + lo);
 *  - block scales: one mma mixes the four lanes' chunks (4 scale blocks), so the A operand puts
 *    each lane's chunk in its own rows: A row 4 * level + b holds that level of x only at the k
 *    slots lane b supplies (rows 0..11 used, 12..15 zero). C row r then is one (level, block)
 *    sum per weight row, and the scales (and 2^(-4 level)) are applied to the C values: mma
 *    steps 0, 1 of a chunk share its first 16-k scale, steps 2, 3 its second;
 *  - the end: lanes of the same column t add their rows (shuffles over g), lanes 0..3 hold the
 *    8 columns (weight rows 2t, 2t + 1) times S * 2^6 * scale2.
 * Fragment layout of m16n8k32 with 8-bit A/B (PTX ISA "Matrix Fragments for mma.m16n8k32", the
 * same for .s8 and .e4m3; low-indexed elements in the low bytes): lane (g, t) = (lane / 4, lane % 4);
 * A: a0 = row g, k 4t .. 4t+3; a1 = row g + 8, same k; a2 / a3 = the same rows, k + 16. B: b0 =
 * k 4t .. 4t+3 of column g, b1 = k + 16. C: c0, c1 = row g, columns 2t, 2t + 1; c2, c3 = row
 * g + 8. Lane (g, t) loads 16 bytes (32 k) of weight row g, chunk c = 4i + t of group i (128 k);
 * mma step j (word j of the chunk) feeds b0 = its even nibbles, b1 = its odd nibbles: a
 * permutation of k that x's staging (xq) applies too.
 * NOT YET RUN ON A GPU (written after session 5's device time): the backend takes it only with
 * MOESERVE_DECODE_FP8=1; its op test is test_moe_experts_fp8 (ops_cuda_stream.inc).
 */
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"

namespace
{

enum { F8_THREADS = 256, F8_WARPS = F8_THREADS / 32, F8_MAX_USED = 64, F8_U = 4 };

/* The e4m3 byte of v (nearest even, saturating at 448) and its value. */
__device__ __forceinline__ uint32_t e4m3_byte(float v)
{
    return (uint32_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

/* xq layout: for group i (128 k), step j (word of a chunk), lane-block b (the chunk 4i + b) and
 * level l, two words: the 4 bytes of the even k (8j + 0, 2, 4, 6 of the chunk) and of the odd k.
 * Index ((((i * 4 + j) * 4 + b) * 3 + l) * 2 + odd). 96 words a group. */
__device__ __forceinline__ int xq_index(int i, int j, int b, int l, int odd)
{
    return ((((i * 4 + j) * 4 + b) * 3 + l) * 2) + odd;
}

/* x[0 .. K) / S into xq (levels as at the top), S = max|x| / 448 (1 for x == 0); threads tid0,
 * tid0 + stride, ... of one warp (stride 32) or of the block (then red: LD_WARPS floats of
 * shared memory and the caller's barrier after). Returns S in every participating thread. */
__device__ __forceinline__ float xq_stage(uint32_t *xq, const float *x, int K, int tid0, int stride, float *red)
{
    float amax = 0.0f;
    for (int k = tid0; k < K; k += stride)
        amax = fmaxf(amax, fabsf(x[k]));
    amax = warp_max(amax);
    if (stride > 32) {
        __syncthreads();
        if (threadIdx.x % 32 == 0)
            red[threadIdx.x / 32] = amax;
        __syncthreads();
        for (int w = 0; w < (int)(blockDim.x / 32); w++)
            amax = fmaxf(amax, red[w]);
    }
    const float S = amax > 0.0f ? amax / 448.0f : 1.0f;
    /* one thread a (group, step, block) slot: its 8 k, 3 levels */
    for (int s = tid0; s < K / 8; s += stride) {
        const int i = s / 16, j = (s / 4) % 4, b = s % 4;
        const int k0 = 128 * i + 32 * b + 8 * j;
        uint32_t w[3][2] = {{0u, 0u}, {0u, 0u}, {0u, 0u}};
#pragma unroll
        for (int m = 0; m < 8; m++) {
            float rest = x[k0 + m] / S;
#pragma unroll
            for (int l = 0; l < 3; l++) {
                const float up = l == 0 ? 1.0f : l == 1 ? 16.0f : 256.0f;
                const uint32_t q = e4m3_byte(rest * up);
                rest -= dev_e4m3(q) / up;
                w[l][m & 1] |= q << (8 * (m / 2));
            }
        }
#pragma unroll
        for (int l = 0; l < 3; l++) {
            xq[xq_index(i, j, b, l, 0)] = w[l][0];
            xq[xq_index(i, j, b, l, 1)] = w[l][1];
        }
    }
    return S;
}

__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    /* no e4m3 mma before sm_89: the backend never launches these kernels there (caps fp8_mma) */
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
    __trap();
#endif
}

struct chunk8 {
    uint4 w;      /* 32 codes of row g, chunk c */
    uint32_t s01; /* the two scale bytes of this lane's columns' rows (see f8_load) */
    uint32_t s23;
};

/* Lane (g, t)'s weight chunk 4i + t of row `row` of w (ok: it exists) and the scales its C
 * columns need: rows r0, r1 (the warp's columns 2t, 2t + 1, in w0 / w1) at chunk 4i + g % 4. */
__device__ __forceinline__ chunk8 f8_load(const cuda_wdev &w, int64_t row, bool ok, const cuda_wdev &w0, int64_t r0,
                                          bool ok0, const cuda_wdev &w1, int64_t r1, bool ok1, int64_t K, int i)
{
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    chunk8 q;
    q.w = ok ? __ldg((const uint4 *)((const uint8_t *)w.data + row * (K / 2)) + 4 * i + t) : make_uint4(0u, 0u, 0u, 0u);
    const int64_t c = 4 * i + g % 4;
    q.s01 = ok0 ? __ldg((const uint16_t *)((const uint8_t *)w0.scale + r0 * (K / 16)) + c) : 0u;
    q.s23 = ok1 ? __ldg((const uint16_t *)((const uint8_t *)w1.scale + r1 * (K / 16)) + c) : 0u;
    return q;
}

/* One chunk group (4 mma steps) into the lane's accumulators: lo[c] = rows g, hi[c] = rows g + 8
 * (level 2 for g < 4), columns 2t + c, each already times its block scale. */
__device__ __forceinline__ void f8_group(const chunk8 &q, const uint32_t *xq, int i, float (&lo)[2], float (&hi)[2])
{
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const bool a_lo = g % 4 == t, a_hi = g < 4 && g == t;
    const int lvl = g / 4; /* level of rows g: 0 for g < 4, 1 for 4 <= g < 8 */
    float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    const uint32_t words[4] = {q.w.x, q.w.y, q.w.z, q.w.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t u = words[j];
        const uint32_t b0 = ((u << 2) & 0x1C1C1C1Cu) | ((u << 4) & 0x80808080u); /* even nibbles */
        const uint32_t b1 = ((u >> 2) & 0x1C1C1C1Cu) | (u & 0x80808080u);        /* odd nibbles */
        uint32_t a0 = 0u, a1 = 0u, a2 = 0u, a3 = 0u;
        if (a_lo) {
            const uint2 v = *(const uint2 *)(xq + xq_index(i, j, t, lvl, 0));
            a0 = v.x, a2 = v.y;
        }
        if (a_hi) {
            const uint2 v = *(const uint2 *)(xq + xq_index(i, j, t, 2, 0));
            a1 = v.x, a3 = v.y;
        }
        mma_e4m3_16832(c[j / 2], a0, a1, a2, a3, b0, b1);
    }
    /* scales: columns 2t (s01) and 2t + 1 (s23), chunk 4i + g % 4: byte 0 its first 16 k, byte 1
     * its second */
    const float s0h0 = dev_e4m3(q.s01 & 255u), s0h1 = dev_e4m3((q.s01 >> 8) & 255u);
    const float s1h0 = dev_e4m3(q.s23 & 255u), s1h1 = dev_e4m3((q.s23 >> 8) & 255u);
    lo[0] = fmaf(c[0][0], s0h0, fmaf(c[1][0], s0h1, lo[0]));
    lo[1] = fmaf(c[0][1], s1h0, fmaf(c[1][1], s1h1, lo[1]));
    hi[0] = fmaf(c[0][2], s0h0, fmaf(c[1][2], s0h1, hi[0]));
    hi[1] = fmaf(c[0][3], s1h0, fmaf(c[1][3], s1h1, hi[1]));
}

/* The warp's 8 columns over all of K (groups of 128 k, F8_U loaded a round): lanes 0..3 return
 * columns 2t, 2t + 1 as sums times 2^-6 / S (the caller multiplies by S * 2^6 * scale2). w is
 * row g's weight (row `row`), w0 / w1 and r0 / r1 the weights and rows of columns 2t, 2t + 1. */
__device__ __forceinline__ float2 f8_dot(const cuda_wdev &w, int64_t row, bool ok, const cuda_wdev &w0, int64_t r0,
                                         bool ok0, const cuda_wdev &w1, int64_t r1, bool ok1, int64_t K,
                                         const uint32_t *xq)
{
    const int lane = threadIdx.x % 32, g = lane / 4;
    const int groups = (int)(K / 128);
    float lo[2] = {0.f, 0.f}, hi[2] = {0.f, 0.f};
    for (int i0 = 0; i0 < groups; i0 += F8_U) {
        chunk8 q[F8_U];
#pragma unroll
        for (int u = 0; u < F8_U; u++)
            if (i0 + u < groups)
                q[u] = f8_load(w, row, ok, w0, r0, ok0, w1, r1, ok1, K, i0 + u);
#pragma unroll
        for (int u = 0; u < F8_U; u++)
            if (i0 + u < groups)
                f8_group(q[u], xq, i0 + u, lo, hi);
    }
    /* levels: rows g < 4 level 0 (and level 2 in hi), rows 4..7 level 1 */
    const float f = g < 4 ? 1.0f : 0x1p-4f;
    float v0 = lo[0] * f + (g < 4 ? hi[0] * 0x1p-8f : 0.0f);
    float v1 = lo[1] * f + (g < 4 ? hi[1] * 0x1p-8f : 0.0f);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) { /* over g, the same t */
        v0 += __shfl_xor_sync(0xffffffffu, v0, o);
        v1 += __shfl_xor_sync(0xffffffffu, v1, o);
    }
    return make_float2(v0, v1);
}

/* act[pair, n] = silu(x G_e[n]) * (x U_e[n]); grid (I / 32, pairs); warp: columns 0..3 gate rows
 * n0 .. n0 + 3, columns 4..7 the same up rows. */
__global__ void __launch_bounds__(F8_THREADS, 2)
    moe_gate_up_fp8_kernel(const cuda_wdev *table, int n_experts, int64_t I, int64_t D, const float *x,
                           const int32_t *ids, int n_used, float *act)
{
    extern __shared__ uint32_t xq[];
    __shared__ float red[F8_WARPS];
    pdl_wait();
    const int pair = blockIdx.y, e = ids[pair];
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t n0 = ((int64_t)blockIdx.x * F8_WARPS + threadIdx.x / 32) * 4;
    float *out = act + (size_t)pair * (size_t)I;
    if (e < 0 || e >= n_experts) { /* no expert: contributes nothing (down skips it too) */
        if (lane < 4 && n0 + lane < I)
            out[n0 + lane] = 0.0f;
        return;
    }
    const cuda_wdev wg = table[e], wu = table[n_experts + e];
    const int64_t row = n0 + g % 4, r0 = n0 + (2 * t) % 4, r1 = r0 + 1;
    const cuda_wdev w = g < 4 ? wg : wu, wc = t < 2 ? wg : wu; /* copies: a selected reference lives in memory */
    const float S = xq_stage(xq, x + (size_t)(pair / n_used) * (size_t)D, (int)D, threadIdx.x, F8_THREADS, red);
    __syncthreads();
    const float2 r = f8_dot(w, row, row < I, wc, r0, r0 < I, wc, r1, r1 < I, D, xq);
    pdl_trigger(); /* late: see pdl_trigger() */
    /* lanes 0, 1: gate rows n0 + 2t, 2t + 1; lanes 2, 3: the same up rows */
    const float ux = __shfl_down_sync(0xffffffffu, r.x, 2), uy = __shfl_down_sync(0xffffffffu, r.y, 2);
    if (lane < 2) {
        const float sg = S * 0x1p6f * wg.scale2, su = S * 0x1p6f * wu.scale2;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int64_t n = n0 + 2 * lane + k;
            if (n >= I)
                continue;
            float gv = (k ? r.y : r.x) * sg, uv = (k ? uy : ux) * su;
            if (wg.bias)
                gv += wg.bias[n];
            if (wu.bias)
                uv += wu.bias[n];
            out[n] = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), uv); /* as cuda_silu_mul */
        }
    }
}

/* out[t, d] = sum over the token's slots in ascending expert id of w * (act_pair D_e[d]); grid
 * (D / 8, tokens); warp j takes slots j, j + 8, ... for the block's 8 rows. residual: out +=. */
__global__ void __launch_bounds__(F8_THREADS, 2)
    moe_down_fp8_kernel(const cuda_wdev *table, int n_experts, int64_t D, int64_t I, const float *act,
                        const int32_t *ids, const float *weights, int n_used, float *out, int residual)
{
    extern __shared__ uint32_t xq[];
    __shared__ int order[F8_MAX_USED];
    __shared__ float part[F8_MAX_USED][8];
    pdl_wait();
    const int tok = blockIdx.y;
    const int32_t *it = ids + (size_t)tok * n_used;
    if (threadIdx.x == 0)
        slots_by_expert(it, n_used, order);
    const int64_t n0 = (int64_t)blockIdx.x * 8;
    const int wib = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t *mine = xq + (size_t)wib * (size_t)(I / 128) * 96;
    for (int j = wib; j < n_used; j += F8_WARPS) {
        const int e = it[j];
        float2 r = make_float2(0.f, 0.f);
        if (e >= 0 && e < n_experts) {
            const cuda_wdev w = table[2 * n_experts + e];
            __syncwarp();
            const float S = xq_stage(mine, act + ((size_t)tok * n_used + j) * (size_t)I, (int)I, lane, 32, nullptr);
            __syncwarp();
            r = f8_dot(w, n0 + g, n0 + g < D, w, n0 + 2 * t, n0 + 2 * t < D, w, n0 + 2 * t + 1, n0 + 2 * t + 1 < D, I,
                       mine);
            const float s = S * 0x1p6f * w.scale2;
            r.x *= s, r.y *= s;
            if (w.bias && lane < 4) {
                if (n0 + 2 * lane < D)
                    r.x += w.bias[n0 + 2 * lane];
                if (n0 + 2 * lane + 1 < D)
                    r.y += w.bias[n0 + 2 * lane + 1];
            }
        }
        if (lane < 4) {
            part[j][2 * lane] = e >= 0 && e < n_experts ? r.x : 0.0f;
            part[j][2 * lane + 1] = e >= 0 && e < n_experts ? r.y : 0.0f;
        }
    }
    pdl_trigger(); /* late: see pdl_trigger() */
    __syncthreads();
    if (threadIdx.x < 8 && n0 + threadIdx.x < D) {
        const int rr = threadIdx.x;
        float o = 0.0f;
        for (int jj = 0; jj < n_used; jj++) {
            const int j = order[jj], e = it[j];
            if (e >= 0 && e < n_experts)
                o = __fadd_rn(o, __fmul_rn(weights[(size_t)tok * n_used + j], part[j][rr]));
        }
        float *dst = out + (size_t)tok * (size_t)D + n0 + rr;
        *dst = residual ? __fadd_rn(*dst, o) : o;
    }
}

} // namespace

extern "C" int cuda_moe_decode_fp8_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                             size_t smem_budget)
{
    /* xq: 96 words a 128-k group = 3 bytes a k (gate/up: D; down: a warp's I each) */
    const size_t smem1 = (size_t)d_model * 3, smem2 = (size_t)F8_WARPS * (size_t)d_expert * 3;
    const size_t smem = smem1 > smem2 ? smem1 : smem2;
    return fmt == WEIGHT_NVFP4 && d_model % 128 == 0 && d_expert % 128 == 0 && n_used >= 1 &&
           n_used <= F8_MAX_USED && smem + 2048 <= smem_budget;
}

extern "C" cudaError_t cuda_moe_decode_fp8(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                                           int64_t d_model, int64_t d_expert, const float *x, int n_tokens,
                                           const int32_t *ids, const float *weights, int n_used, float *act,
                                           float *out, int residual, int pdl)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    if (d_model % 128 || d_expert % 128 || n_used < 1 || n_used > F8_MAX_USED || (int64_t)n_tokens * n_used > 65535)
        return cudaErrorInvalidValue;
    const size_t smem1 = (size_t)d_model * 3, smem2 = (size_t)F8_WARPS * (size_t)d_expert * 3;
    cudaError_t e = cudaSuccess;
    if (smem1 > 48 * 1024)
        e = cudaFuncSetAttribute(moe_gate_up_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem1);
    if (e == cudaSuccess && smem2 > 48 * 1024)
        e = cudaFuncSetAttribute(moe_down_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem2);
    if (e != cudaSuccess)
        return e;
    dim3 g1((unsigned)((d_expert + 4 * F8_WARPS - 1) / (4 * F8_WARPS)), (unsigned)(n_tokens * n_used));
    e = launch_pdl(pdl != 0, moe_gate_up_fp8_kernel, g1, dim3(F8_THREADS), smem1, stream, table, n_experts, d_expert,
                   d_model, x, ids, n_used, act);
    if (e != cudaSuccess)
        return e;
    dim3 g2((unsigned)((d_model + 7) / 8), (unsigned)n_tokens);
    return launch_pdl(pdl != 0, moe_down_fp8_kernel, g2, dim3(F8_THREADS), smem2, stream, table, n_experts, d_model,
                      d_expert, act, ids, weights, n_used, out, residual);
}
