/* cuda_dec16.cu — one-token NVFP4 GEMV from a second copy of the weight in a layout made for it
 * ("dec16"): the backend's q/k/v and o at batch 1 where the copy exists (backend_cuda.c).
 *
 * Why a second layout: the checkpoint's row-major E2M1 pairs cost the decode kernels of
 * cuda_decode_mma.cu five instructions a bf16x2 pair (two shifts, two LOP3, one HMUL2 by the
 * block scale), most of them on the 16-lane integer pipe, and one mma covers only 128 weights
 * (8 rows as the B operand). Here (measured alone on the H200 with tools/bench_dot.cu, session 10:
 * q/k/v's shape 5.80 us against gemv_mma's 8.75, o's 6.92 against 7.43):
 *  - a warp's 16 weight rows are the mma's A operand (m16n8k16: 256 weights an mma), x's bf16 hi
 *    and lo (times 2^100) are B's columns 0 and 1, so one 8-byte shared load a lane per mma;
 *  - lane (g, t)'s 32-bit word of mma j holds exactly its 8 weights (rows g and g + 8, k 4t ..
 *    4t + 3 of the 16-k block; x uses the same k order), placed so that three of the four bf16x2
 *    pairs come out with at most one shift and one LOP3 and the fourth with three of each
 *    (dec16_pairs); (e1 e0 m) at bf16 bits 8..6 is the E2M1 value times 2^-126 (0.5 becomes the
 *    bf16 subnormal 2^-127, which the tensor core keeps: checked by the bench and the op tests);
 *  - an mma covers exactly one 16-k block of its rows, so the E4M3 block scales multiply its
 *    fresh fp32 C (one cvt for the two rows' scales, four FFMA) instead of every weight pair.
 * Layout: tile T (rows 16T .. 16T + 15) and segment s (k 64s .. 64s + 63) are 512 bytes at data +
 * (T * K / 64 + s) * 512, lane L's 16 at + 16 L (word j: mma j, the block 4s + j); the scales 64
 * bytes at scale + (T * K / 64 + s) * 64, lane group g's 8 at + 8 g (byte 2j: row g's, 2j + 1: row
 * g + 8's). Same byte counts as the checkpoint's layout. Needs N % 16 == 0 and K % 64 == 0.
 * The sum of a row is added in a different order than the CPU's (per block, in fp32): the parity
 * tests' tolerances are those of the other tensor-core paths.
 */
#include "backend/cuda/cuda_decode_mma.cuh"

namespace
{

/* DQ_U: segments a warp loads before the PDL wait and keeps in flight after it; the K split
 * gives every warp at most DQ_U segments where the grid allows, so that (as gemv_mma's warps) a
 * warp's whole slice is asked for while the previous kernel still runs (DQ_U = 4 left half of
 * q/k/v's slices for after the wait: 398.6 vs 413.8 tok/s against gemv_mma on the H200) */
enum { DQ_THREADS = 256, DQ_WARPS = DQ_THREADS / 32, DQ_MAX_JOBS = 3, DQ_U = 8 };

/* bit positions (m, e0, e1, sign) of the low and high weight of pairs a0 .. a3 in a lane's word */
__constant__ const uint8_t kDq16Pos[4][2][4] = {
    {{6, 7, 8, 15}, {22, 23, 24, 31}},
    {{3, 4, 5, 12}, {19, 20, 21, 28}},
    {{0, 1, 2, 9}, {16, 17, 18, 25}},
    {{10, 11, 14, 13}, {26, 27, 30, 29}},
};

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

__global__ void dec16_pack_kernel(const uint8_t *data, const uint8_t *scale, int64_t N, int64_t K,
                                  uint32_t *wq, uint8_t *sq)
{
    const int64_t nseg = K / 64, words = N / 16 * nseg * 128;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(i % 4), lane = (int)(i / 4 % 32);
        const int64_t seg = i / 128, T = seg / nseg, s = seg % nseg;
        const int g = lane / 4, t = lane % 4;
        const int64_t k0 = 64 * s + 16 * j + 4 * t, rg = 16 * T + g;
        /* rows g and g + 8, k0 .. k0 + 3: two bytes each (low nibble first) */
        const uint32_t lo = data[rg * (K / 2) + k0 / 2] | (uint32_t)data[rg * (K / 2) + k0 / 2 + 1] << 8;
        const uint32_t hi =
            data[(rg + 8) * (K / 2) + k0 / 2] | (uint32_t)data[(rg + 8) * (K / 2) + k0 / 2 + 1] << 8;
        const uint32_t codes[4] = {lo & 0xffu, hi & 0xffu, lo >> 8,
                                   hi >> 8}; /* pairs a0 .. a3: two nibbles each */
        uint32_t w = 0;
        for (int p = 0; p < 4; p++)
            for (int h = 0; h < 2; h++) {
                const uint32_t c = codes[p] >> (4 * h) & 15u;
                for (int b = 0; b < 4; b++)
                    w |= (c >> b & 1u) << kDq16Pos[p][h][b];
            }
        wq[i] = w;
        if (t == 0) { /* lane group g's two scales of block 4s + j */
            const int64_t blk = 4 * s + j;
            uint8_t *o = sq + seg * 64 + g * 8 + 2 * j;
            o[0] = scale[rg * (K / 16) + blk];
            o[1] = scale[(rg + 8) * (K / 16) + blk];
        }
    }
}

struct dec16_params {
    cuda_wdev w[DQ_MAX_JOBS]; /* data / scale: the dec16 copies */
    int64_t N[DQ_MAX_JOBS];
    float *y[DQ_MAX_JOBS];
    int64_t first_tile[DQ_MAX_JOBS + 1];
    int n_jobs;
    int64_t K;
    const float *x;
    int ks; /* warps splitting K of one tile: 1, 2, 4 or 8 */
};

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

/* y_j = W_j x for the jobs' 16-row tiles; a block: DQ_WARPS / ks tiles, ks warps each splitting
 * K (their sums added in order through shared memory). The first DQ_U segments of a warp are
 * loaded before the PDL wait (weights never change), then kept DQ_U in flight. */
__global__ void __launch_bounds__(DQ_THREADS) dec16_gemv_kernel(const __grid_constant__ dec16_params p)
{
    extern __shared__ uint2 xb[];
    __shared__ float4 part[DQ_WARPS][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t tile = (int64_t)blockIdx.x * (DQ_WARPS / p.ks) + warp / p.ks;
    const bool live = tile < p.first_tile[p.n_jobs];
    int j = 0;
    while (j + 1 < p.n_jobs && tile >= p.first_tile[j + 1])
        j++;
    const int64_t lt = tile - p.first_tile[j];
    const int nseg = (int)(p.K / 64), ks = warp % p.ks, s0 = ks * nseg / p.ks, s1 = (ks + 1) * nseg / p.ks;
    const uint4 *wp = (const uint4 *)p.w[j].data + (size_t)lt * (size_t)nseg * 32 + lane;
    const uint2 *sp = (const uint2 *)p.w[j].scale + (size_t)lt * (size_t)nseg * 8 + g;
    uint4 wv[DQ_U];
    uint2 sv[DQ_U];
#pragma unroll
    for (int u = 0; u < DQ_U; u++)
        if (live && s0 + u < s1) {
            wv[u] = __ldg(wp + (size_t)(s0 + u) * 32);
            sv[u] = __ldg(sp + (size_t)(s0 + u) * 8);
        }
    pdl_wait();
    dec16_stage_x(xb, p.x, (int)p.K, [] {});
    __syncthreads();
    const uint2 *xl = xb + (g == 0 ? t : g == 1 ? 4 + t : 8 + t);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (live)
        for (int s = s0; s < s1; s += DQ_U) {
#pragma unroll
            for (int u = 0; u < DQ_U; u++) {
                if (s + u >= s1)
                    break;
                dec16_segment(wv[u], sv[u], xl + (size_t)(s + u) * 64, acc);
                if (s + u + DQ_U < s1) {
                    wv[u] = __ldg(wp + (size_t)(s + u + DQ_U) * 32);
                    sv[u] = __ldg(sp + (size_t)(s + u + DQ_U) * 8);
                }
            }
        }
    pdl_trigger(); /* late: see pdl_trigger() */
    part[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (!live || ks != 0 || t != 0)
        return;
    float4 v = part[warp][lane];
    for (int k = 1; k < p.ks; k++) {
        const float4 q = part[warp + k][lane];
        v.x += q.x, v.y += q.y, v.z += q.z, v.w += q.w;
    }
    const cuda_wdev &w = p.w[j];
    const float fs = 0x1p26f * w.scale2; /* weights 2^-126, x 2^100 */
    const int64_t r = lt * 16 + g;
    p.y[j][r] = (v.x + v.y) * fs + (w.bias ? w.bias[r] : 0.0f);
    p.y[j][r + 8] = (v.z + v.w) * fs + (w.bias ? w.bias[r + 8] : 0.0f);
}

/* act[pair, n] = silu(x G_e[n]) * (x U_e[n]) for one token's pairs (the MoE's gate/up at batch
 * 1) from the experts' dec16 copies (gt, ut: n_experts entries each). A warp: 16 rows of gate and
 * the same 16 rows of up over a K slice (ks warps a tile); grid (row tiles / tiles a block, pairs).
 * The experts are known only after the wait: ids, then the first weights asked for behind x's
 * loads. The down kernel stays cuda_decode_mma.cu's (cuda_moe_decode_mma_down). */
__global__ void __launch_bounds__(DQ_THREADS)
    dec16_gate_up_kernel(const cuda_wdev *gt, const cuda_wdev *ut, int n_experts, int64_t I, int64_t D,
                         const float *x, const int32_t *ids, int n_used, float *act, int ks_n)
{
    constexpr int U = 4; /* segments of each matrix in flight */
    extern __shared__ uint2 xb[];
    __shared__ float4 part[DQ_WARPS][2][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int pair = blockIdx.y;
    const int64_t tile = (int64_t)blockIdx.x * (DQ_WARPS / ks_n) + warp / ks_n;
    const int nseg = (int)(D / 64), ks = warp % ks_n, s0 = ks * nseg / ks_n, s1 = (ks + 1) * nseg / ks_n;
    pdl_wait();
    const int e = ids[pair];
    const bool expert = e >= 0 && e < n_experts, live = expert && tile * 16 < I;
    cuda_wdev wg = {}, wu = {};
    if (live)
        wg = gt[e], wu = ut[e];
    const size_t base = (size_t)tile * (size_t)nseg;
    const uint4 *gp = (const uint4 *)wg.data + base * 32 + lane,
                *up = (const uint4 *)wu.data + base * 32 + lane;
    const uint2 *gs = (const uint2 *)wg.scale + base * 8 + g, *us = (const uint2 *)wu.scale + base * 8 + g;
    uint4 gv[U], uv[U];
    uint2 gsv[U], usv[U];
    dec16_stage_x(xb, x + (size_t)(pair / n_used) * (size_t)D, (int)D, [&] {
#pragma unroll
        for (int u = 0; u < U; u++)
            if (live && s0 + u < s1) {
                gv[u] = __ldg(gp + (size_t)(s0 + u) * 32);
                gsv[u] = __ldg(gs + (size_t)(s0 + u) * 8);
                uv[u] = __ldg(up + (size_t)(s0 + u) * 32);
                usv[u] = __ldg(us + (size_t)(s0 + u) * 8);
            }
    });
    __syncthreads();
    const uint2 *xl = xb + (g == 0 ? t : g == 1 ? 4 + t : 8 + t);
    float ag[4] = {0.f, 0.f, 0.f, 0.f}, au[4] = {0.f, 0.f, 0.f, 0.f};
    if (live)
        for (int s = s0; s < s1; s += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (s + u >= s1)
                    break;
                dec16_segment(gv[u], gsv[u], xl + (size_t)(s + u) * 64, ag);
                dec16_segment(uv[u], usv[u], xl + (size_t)(s + u) * 64, au);
                if (s + u + U < s1) {
                    gv[u] = __ldg(gp + (size_t)(s + u + U) * 32);
                    gsv[u] = __ldg(gs + (size_t)(s + u + U) * 8);
                    uv[u] = __ldg(up + (size_t)(s + u + U) * 32);
                    usv[u] = __ldg(us + (size_t)(s + u + U) * 8);
                }
            }
        }
    pdl_trigger(); /* late: see pdl_trigger() */
    part[warp][0][lane] = make_float4(ag[0], ag[1], ag[2], ag[3]);
    part[warp][1][lane] = make_float4(au[0], au[1], au[2], au[3]);
    __syncthreads();
    if (ks != 0 || t != 0 || tile * 16 >= I)
        return;
    float *out = act + (size_t)pair * (size_t)I;
    const int64_t r = tile * 16 + g;
    if (!expert) { /* no expert: contributes nothing (down skips it too) */
        out[r] = out[r + 8] = 0.0f;
        return;
    }
    float4 a = part[warp][0][lane], b = part[warp][1][lane];
    for (int k = 1; k < ks_n; k++) {
        const float4 qa = part[warp + k][0][lane], qb = part[warp + k][1][lane];
        a.x += qa.x, a.y += qa.y, a.z += qa.z, a.w += qa.w;
        b.x += qb.x, b.y += qb.y, b.z += qb.z, b.w += qb.w;
    }
    const float fg = 0x1p26f * wg.scale2, fu = 0x1p26f * wu.scale2;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t n = r + 8 * h;
        float gvl = (h ? a.z + a.w : a.x + a.y) * fg, uvl = (h ? b.z + b.w : b.x + b.y) * fu;
        if (wg.bias)
            gvl += wg.bias[n];
        if (wu.bias)
            uvl += wu.bias[n];
        out[n] = dev_silu_mul(gvl, uvl);
    }
}

} // namespace

extern "C" int cuda_dec16_shape_ok(int64_t N, int64_t K)
{
    return N > 0 && K > 0 && N % 16 == 0 && K % 64 == 0;
}

extern "C" cudaError_t cuda_dec16_pack(cudaStream_t stream, const struct cuda_wdev *w, int64_t N, int64_t K,
                                       void *data, void *scale)
{
    if (!cuda_dec16_shape_ok(N, K) || !w->data || !w->scale || !data || !scale || (uintptr_t)data % 16 ||
        (uintptr_t)scale % 8)
        return cudaErrorInvalidValue;
    const int64_t words = N / 16 * (K / 64) * 128;
    dec16_pack_kernel<<<cuda_blocks((size_t)words, 256), 256, 0, stream>>>(
        (const uint8_t *)w->data, (const uint8_t *)w->scale, N, K, (uint32_t *)data, (uint8_t *)scale);
    return CUDA_LAUNCH_RESULT();
}

extern "C" size_t cuda_dec16_smem_bytes(int64_t K)
{
    return (size_t)(K / 16) * 16 * sizeof(uint2) + sizeof(float4) * DQ_WARPS * 32;
}

extern "C" int cuda_dec16_supported(int n_w, const struct cuda_wdev *w, const int64_t *N, int64_t K,
                                    const float *x, size_t smem_budget)
{
    if (n_w < 1 || n_w > DQ_MAX_JOBS || K <= 0 || K % 64 || K > INT32_MAX / 4 || (uintptr_t)x % 16 ||
        cuda_dec16_smem_bytes(K) + 1024 > smem_budget)
        return 0;
    for (int j = 0; j < n_w; j++)
        if (!cuda_dec16_shape_ok(N[j], K) || !w[j].data || !w[j].scale || (uintptr_t)w[j].data % 16 ||
            (uintptr_t)w[j].scale % 8)
            return 0;
    return 1;
}

extern "C" cudaError_t cuda_dec16_gemv(cudaStream_t stream, int n_w, const struct cuda_wdev *w,
                                       const int64_t *N, int64_t K, const float *x, float *const *y,
                                       int sm_count, int pdl)
{
    if (!cuda_dec16_supported(n_w, w, N, K, x, (size_t)-1))
        return cudaErrorInvalidValue;
    dec16_params p = {};
    p.n_jobs = n_w;
    p.K = K;
    p.x = x;
    const int64_t tiles = gemv_jobs_fill(p, n_w, w, N, y, 16); /* N % 16 == 0 */
    /* K split until the grid has ~8 warps an SM or a warp's slice fits DQ_U segments (H200,
     * tools/bench_dot.cu: q/k/v's 320 tiles best at 4 of the 1, 2, 4 measured), each slice at
     * least two segments */
    p.ks = 1;
    while (p.ks < DQ_WARPS && (tiles * p.ks < 8 * (int64_t)sm_count || K / 64 > DQ_U * p.ks) &&
           K / 64 >= 4 * p.ks)
        p.ks *= 2;
    const int64_t per = DQ_WARPS / p.ks, blocks = (tiles + per - 1) / per;
    const size_t smem = (size_t)(K / 16) * 16 * sizeof(uint2);
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidValue;
    return launch_pdl_smem(pdl != 0, dec16_gemv_kernel, dim3((unsigned)blocks), dim3(DQ_THREADS), smem,
                           stream, p);
}

extern "C" int cuda_dec16_moe_supported(int64_t d_model, int64_t d_expert, int n_used, size_t smem_budget)
{
    return cuda_dec16_shape_ok(d_expert, d_model) && n_used >= 1 && n_used <= 65535 &&
           d_model <= INT32_MAX / 4 &&
           (size_t)(d_model / 16) * 16 * sizeof(uint2) + sizeof(float4) * DQ_WARPS * 64 + 1024 <= smem_budget;
}

extern "C" cudaError_t cuda_dec16_moe_gate_up(cudaStream_t stream, const struct cuda_wdev *gate,
                                              const struct cuda_wdev *up, int n_experts, int64_t d_model,
                                              int64_t d_expert, const float *x, const int32_t *ids,
                                              int n_used, float *act, int sm_count, int pdl)
{
    if (!cuda_dec16_moe_supported(d_model, d_expert, n_used, (size_t)-1) || (uintptr_t)x % 16)
        return cudaErrorInvalidValue;
    const int64_t tiles = d_expert / 16, units = tiles * n_used, nseg = d_model / 64;
    /* K split as cuda_dec16_gemv's, for the pairs' tiles together */
    int ks = 1;
    while (ks < DQ_WARPS && units * ks < 8 * (int64_t)sm_count && nseg >= 4 * ks)
        ks *= 2;
    const int64_t per = DQ_WARPS / ks, bx = (tiles + per - 1) / per;
    const size_t smem = (size_t)(d_model / 16) * 16 * sizeof(uint2);
    return launch_pdl_smem(pdl != 0, dec16_gate_up_kernel, dim3((unsigned)bx, (unsigned)n_used),
                           dim3(DQ_THREADS), smem, stream, gate, up, n_experts, d_expert, d_model, x, ids,
                           n_used, act, ks);
}
