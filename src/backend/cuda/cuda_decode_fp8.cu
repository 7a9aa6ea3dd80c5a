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
 * MOESERVE_DECODE_FP8=1; its op test is test_moe_experts_fp8 (ops_cuda_stream.inc). What can be
 * checked without one is: tests/unit/test_fp8_decode.c runs the lanes' own code (the F8_HD
 * pieces below) on the host through a model of the mma built from the PTX fragment layout, and
 * gets the exact dot products to 6.9e-6 of sum |w x| (swapping b0 and b1 gives 0.14).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"

namespace
{

enum { F8_THREADS = 256, F8_WARPS = F8_THREADS / 32, F8_MAX_USED = 64, F8_U = 4 };

/* What a lane computes, as __host__ __device__ pieces: the kernels below and
 * cuda_moe_fp8_emulate() (tests, on the host, through a model of the mma) share them. */
#define F8_HD __host__ __device__ __forceinline__
/* the device side unrolls (constant register indices); the host compiler does not know the pragma */
#ifdef __CUDA_ARCH__
#define F8_UNROLL _Pragma("unroll")
#else
#define F8_UNROLL
#endif

/* The e4m3 byte of v (nearest even, saturating at 448). */
F8_HD uint32_t e4m3_byte(float v)
{
    return (uint32_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

/* xq layout: for group i (128 k), step j (word of a chunk), lane-block b (the chunk 4i + b) and
 * level l, two words: the 4 bytes of the even k (8j + 0, 2, 4, 6 of the chunk) and of the odd k.
 * Index ((((i * 4 + j) * 4 + b) * 3 + l) * 2 + odd). 96 words a group. */
F8_HD int xq_index(int i, int j, int b, int l, int odd)
{
    return ((((i * 4 + j) * 4 + b) * 3 + l) * 2) + odd;
}

/* Slot s of x / S (8 k: group s / 16, step (s / 4) % 4, block s % 4) into its 6 xq words. */
F8_HD void xq_slot(uint32_t *xq, const float *x, int s, float S)
{
    const int i = s / 16, j = (s / 4) % 4, b = s % 4;
    const int k0 = 128 * i + 32 * b + 8 * j;
    uint32_t w[3][2] = {{0u, 0u}, {0u, 0u}, {0u, 0u}};
    F8_UNROLL
    for (int m = 0; m < 8; m++) {
        float rest = x[k0 + m] / S;
        F8_UNROLL
        for (int l = 0; l < 3; l++) {
            const float up = l == 0 ? 1.0f : l == 1 ? 16.0f : 256.0f;
            const uint32_t q = e4m3_byte(rest * up);
            rest -= e4m3_value(q) / up;
            w[l][m & 1] |= q << (8 * (m / 2));
        }
    }
    F8_UNROLL
    for (int l = 0; l < 3; l++) {
        xq[xq_index(i, j, b, l, 0)] = w[l][0];
        xq[xq_index(i, j, b, l, 1)] = w[l][1];
    }
}

/* B registers of one word of 8 E2M1 codes: b0 the even nibbles, b1 the odd, each as the e4m3
 * byte s << 7 | magnitude << 2 (the value times 2^-6). */
F8_HD void b_regs(uint32_t u, uint32_t &b0, uint32_t &b1)
{
    b0 = ((u << 2) & 0x1C1C1C1Cu) | ((u << 4) & 0x80808080u);
    b1 = ((u >> 2) & 0x1C1C1C1Cu) | (u & 0x80808080u);
}

/* A registers of lane (g, t) for group i, step j: rows g (level g / 4, block g % 4) where
 * t == g % 4, rows g + 8 (level 2, block g) where g < 4 and t == g; zero elsewhere. */
F8_HD void a_regs(const uint32_t *xq, int i, int j, int g, int t, uint32_t (&a)[4])
{
    a[0] = a[1] = a[2] = a[3] = 0u;
    if (g % 4 == t) {
        a[0] = xq[xq_index(i, j, t, g / 4, 0)];
        a[2] = xq[xq_index(i, j, t, g / 4, 1)];
    }
    if (g < 4 && g == t) {
        a[1] = xq[xq_index(i, j, t, 2, 0)];
        a[3] = xq[xq_index(i, j, t, 2, 1)];
    }
}

/* Lane (g, t)'s block scales applied to a group's two C sets (c[h]: the chunk's 16-k half h):
 * s01 / s23 the two scale bytes of columns 2t / 2t + 1 at chunk 4i + g % 4. */
F8_HD void c_scale(const float (&c)[2][4], uint32_t s01, uint32_t s23, float (&lo)[2], float (&hi)[2])
{
    const float s0h0 = e4m3_value(s01 & 255u), s0h1 = e4m3_value((s01 >> 8) & 255u);
    const float s1h0 = e4m3_value(s23 & 255u), s1h1 = e4m3_value((s23 >> 8) & 255u);
    lo[0] = fmaf(c[0][0], s0h0, fmaf(c[1][0], s0h1, lo[0]));
    lo[1] = fmaf(c[0][1], s1h0, fmaf(c[1][1], s1h1, lo[1]));
    hi[0] = fmaf(c[0][2], s0h0, fmaf(c[1][2], s0h1, hi[0]));
    hi[1] = fmaf(c[0][3], s1h0, fmaf(c[1][3], s1h1, hi[1]));
}

/* Lane (g, t)'s share of columns 2t, 2t + 1 with the levels' weights (rows g < 4: level 0, and
 * level 2 in hi; rows 4..7: level 1); the warp then adds the shares of the same t. */
F8_HD float2 lane_share(const float (&lo)[2], const float (&hi)[2], int g)
{
    const float f = g < 4 ? 1.0f : 0x1p-4f;
    return make_float2(lo[0] * f + (g < 4 ? hi[0] * 0x1p-8f : 0.0f),
                       lo[1] * f + (g < 4 ? hi[1] * 0x1p-8f : 0.0f));
}

/* x[0 .. K) / S into xq (levels as at the top), S = max|x| / 448 (1 for x == 0); threads tid0,
 * tid0 + stride, ... of one warp (stride 32) or of the block (then red: LD_WARPS floats of
 * shared memory and the caller's barrier after). Returns S in every participating thread. */
__device__ __forceinline__ float xq_stage(uint32_t *xq, const float *x, int K, int tid0, int stride,
                                          float *red)
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
    for (int s = tid0; s < K / 8; s += stride) /* one thread a (group, step, block) slot */
        xq_slot(xq, x, s, S);
    return S;
}

__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1)
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
__device__ __forceinline__ chunk8 f8_load(const cuda_wdev &w, int64_t row, bool ok, const cuda_wdev &w0,
                                          int64_t r0, bool ok0, const cuda_wdev &w1, int64_t r1, bool ok1,
                                          int64_t K, int i)
{
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    chunk8 q;
    q.w = ok ? __ldg((const uint4 *)((const uint8_t *)w.data + row * (K / 2)) + 4 * i + t)
             : make_uint4(0u, 0u, 0u, 0u);
    const int64_t c = 4 * i + g % 4;
    q.s01 = ok0 ? __ldg((const uint16_t *)((const uint8_t *)w0.scale + r0 * (K / 16)) + c) : 0u;
    q.s23 = ok1 ? __ldg((const uint16_t *)((const uint8_t *)w1.scale + r1 * (K / 16)) + c) : 0u;
    return q;
}

/* One chunk group (4 mma steps) into the lane's accumulators: lo[c] = rows g, hi[c] = rows g + 8
 * (level 2 for g < 4), columns 2t + c, each already times its block scale. */
__device__ __forceinline__ void f8_group(const chunk8 &q, const uint32_t *xq, int i, float (&lo)[2],
                                         float (&hi)[2])
{
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    const uint32_t words[4] = {q.w.x, q.w.y, q.w.z, q.w.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t b0, b1, a[4];
        b_regs(words[j], b0, b1);
        a_regs(xq, i, j, g, t, a);
        mma_e4m3_16832(c[j / 2], a[0], a[1], a[2], a[3], b0, b1);
    }
    c_scale(c, q.s01, q.s23, lo, hi);
}

/* The warp's 8 columns over all of K (groups of 128 k, F8_U loaded a round): lanes 0..3 return
 * columns 2t, 2t + 1 as sums times 2^-6 / S (the caller multiplies by S * 2^6 * scale2). w is
 * row g's weight (row `row`), w0 / w1 and r0 / r1 the weights and rows of columns 2t, 2t + 1. */
__device__ __forceinline__ float2 f8_dot(const cuda_wdev &w, int64_t row, bool ok, const cuda_wdev &w0,
                                         int64_t r0, bool ok0, const cuda_wdev &w1, int64_t r1, bool ok1,
                                         int64_t K, const uint32_t *xq)
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
    const float2 sh = lane_share(lo, hi, g);
    float v0 = sh.x, v1 = sh.y;
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
    const cuda_wdev w = g < 4 ? wg : wu,
                    wc = t < 2 ? wg : wu; /* copies: a selected reference lives in memory */
    const float S =
        xq_stage(xq, x + (size_t)(pair / n_used) * (size_t)D, (int)D, threadIdx.x, F8_THREADS, red);
    __syncthreads();
    const float2 r = f8_dot(w, row, row < I, wc, r0, r0 < I, wc, r1, r1 < I, D, xq);
    pdl_trigger(); /* late: see pdl_trigger() */
    /* lanes 0, 1: gate rows n0 + 2t, 2t + 1; lanes 2, 3: the same up rows */
    silu_pair_store(r, S * 0x1p6f * wg.scale2, S * 0x1p6f * wu.scale2, wg.bias, wu.bias, n0, I, out, lane);
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
        float s = 0.0f;
        const float *bias = nullptr;
        if (e >= 0 && e < n_experts) {
            const cuda_wdev w = table[2 * n_experts + e];
            __syncwarp();
            const float S =
                xq_stage(mine, act + ((size_t)tok * n_used + j) * (size_t)I, (int)I, lane, 32, nullptr);
            __syncwarp();
            r = f8_dot(w, n0 + g, n0 + g < D, w, n0 + 2 * t, n0 + 2 * t < D, w, n0 + 2 * t + 1,
                       n0 + 2 * t + 1 < D, I, mine);
            s = S * 0x1p6f * w.scale2, bias = w.bias;
        }
        slot_part_put(part, j, r, e >= 0 && e < n_experts, s, bias, n0, D, lane);
    }
    pdl_trigger(); /* late: see pdl_trigger() */
    __syncthreads();
    if (threadIdx.x < 8 && n0 + threadIdx.x < D) {
        const int rr = threadIdx.x;
        const float o = slots_combine<8>(it, weights + (size_t)tok * n_used, order, part, n_used, n_experts, rr);
        float *dst = out + (size_t)tok * (size_t)D + n0 + rr;
        *dst = residual ? __fadd_rn(*dst, o) : o;
    }
}

} // namespace

/* ---- the host model (tests): a warp's lanes through the helpers above and the mma as the PTX
 * ISA lays out m16n8k32 (8-bit A/B, f32 C): lane 4g + t gives a0..a3 (rows g, g + 8 at k 4t..4t+3,
 * then k + 16) and b0, b1 (column g at k 4t..4t+3, k + 16), low bytes first, and gets c0, c1 (row
 * g, columns 2t, 2t + 1) and c2, c3 (row g + 8). */
static void mma_model(const uint32_t (*a)[4], const uint32_t (*b)[2], float (*c)[4])
{
    float A[16][32], B[32][8];
    for (int L = 0; L < 32; L++) {
        const int g = L / 4, t = L % 4;
        for (int p = 0; p < 4; p++) {
            A[g][4 * t + p] = e4m3_value((a[L][0] >> (8 * p)) & 255u);
            A[g + 8][4 * t + p] = e4m3_value((a[L][1] >> (8 * p)) & 255u);
            A[g][16 + 4 * t + p] = e4m3_value((a[L][2] >> (8 * p)) & 255u);
            A[g + 8][16 + 4 * t + p] = e4m3_value((a[L][3] >> (8 * p)) & 255u);
            B[4 * t + p][g] = e4m3_value((b[L][0] >> (8 * p)) & 255u);
            B[16 + 4 * t + p][g] = e4m3_value((b[L][1] >> (8 * p)) & 255u);
        }
    }
    for (int L = 0; L < 32; L++) {
        const int g = L / 4, t = L % 4;
        const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
        for (int q = 0; q < 4; q++) {
            double acc = 0.0;
            for (int k = 0; k < 32; k++)
                acc += (double)A[rows[q]][k] * (double)B[k][cols[q]];
            c[L][q] += (float)acc;
        }
    }
}

extern "C" int cuda_moe_fp8_emulate(const uint8_t *codes, const uint8_t *scales, const float *x, int K,
                                    float *out)
{
    if (K <= 0 || K % 128)
        return -1;
    uint32_t *xq = (uint32_t *)calloc((size_t)K * 3 / 4, sizeof(uint32_t));
    if (!xq)
        return -1;
    float amax = 0.0f;
    for (int k = 0; k < K; k++)
        amax = fmaxf(amax, fabsf(x[k]));
    const float S = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int sl = 0; sl < K / 8; sl++)
        xq_slot(xq, x, sl, S);
    float lo[32][2] = {}, hi[32][2] = {};
    for (int i = 0; i < K / 128; i++) {
        float c[2][32][4] = {};
        for (int j = 0; j < 4; j++) {
            uint32_t a[32][4], b[32][2];
            for (int L = 0; L < 32; L++) {
                const int g = L / 4, t = L % 4;
                const uint8_t *wp = codes + (size_t)g * (size_t)(K / 2) + (size_t)(4 * i + t) * 16 + 4 * j;
                const uint32_t u =
                    (uint32_t)wp[0] | (uint32_t)wp[1] << 8 | (uint32_t)wp[2] << 16 | (uint32_t)wp[3] << 24;
                b_regs(u, b[L][0], b[L][1]);
                a_regs(xq, i, j, g, t, a[L]);
            }
            mma_model(a, b, c[j / 2]);
        }
        for (int L = 0; L < 32; L++) {
            const int g = L / 4, t = L % 4;
            const size_t ch = (size_t)(4 * i + g % 4) * 2; /* the chunk's two scale bytes */
            const uint8_t *s0 = scales + (size_t)(2 * t) * (size_t)(K / 16) + ch;
            const uint8_t *s1 = scales + (size_t)(2 * t + 1) * (size_t)(K / 16) + ch;
            const float cl[2][4] = {{c[0][L][0], c[0][L][1], c[0][L][2], c[0][L][3]},
                                    {c[1][L][0], c[1][L][1], c[1][L][2], c[1][L][3]}};
            c_scale(cl, (uint32_t)s0[0] | (uint32_t)s0[1] << 8, (uint32_t)s1[0] | (uint32_t)s1[1] << 8, lo[L],
                    hi[L]);
        }
    }
    for (int t = 0; t < 4; t++) {
        float v0 = 0.0f, v1 = 0.0f;
        for (int g = 0; g < 8; g++) {
            const float2 sh = lane_share(lo[4 * g + t], hi[4 * g + t], g);
            v0 += sh.x, v1 += sh.y;
        }
        out[2 * t] = v0 * S * 0x1p6f;
        out[2 * t + 1] = v1 * S * 0x1p6f;
    }
    free(xq);
    return 0;
}

extern "C" int cuda_moe_decode_fp8_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert,
                                             int n_used, size_t smem_budget)
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
    if (d_model % 128 || d_expert % 128 || n_used < 1 || n_used > F8_MAX_USED ||
        (int64_t)n_tokens * n_used > 65535)
        return cudaErrorInvalidValue;
    const size_t smem1 = (size_t)d_model * 3, smem2 = (size_t)F8_WARPS * (size_t)d_expert * 3;
    cudaError_t e = cudaSuccess;
    if (smem1 > 48 * 1024)
        e = cudaFuncSetAttribute(moe_gate_up_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem1);
    if (e == cudaSuccess && smem2 > 48 * 1024)
        e = cudaFuncSetAttribute(moe_down_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem2);
    if (e != cudaSuccess)
        return e;
    dim3 g1((unsigned)((d_expert + 4 * F8_WARPS - 1) / (4 * F8_WARPS)), (unsigned)(n_tokens * n_used));
    e = launch_pdl(pdl != 0, moe_gate_up_fp8_kernel, g1, dim3(F8_THREADS), smem1, stream, table, n_experts,
                   d_expert, d_model, x, ids, n_used, act);
    if (e != cudaSuccess)
        return e;
    dim3 g2((unsigned)((d_model + 7) / 8), (unsigned)n_tokens);
    return launch_pdl(pdl != 0, moe_down_fp8_kernel, g2, dim3(F8_THREADS), smem2, stream, table, n_experts,
                      d_model, d_expert, act, ids, weights, n_used, out, residual);
}
