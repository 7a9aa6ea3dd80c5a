/* cuda_gemm_wgmma.cu — y = x W^T on Hopper warpgroup MMA (wgmma.mma_async, sm_90a only) for NVFP4
 * and BF16 weights: the plan's "gemm_nvfp4_wo_wgmma", "moe_gemm_nvfp4_wo_wgmma", "moe_gemm_bf16_wgmma".
 *
 * Computed transposed, Y^T = W X^T, so that the weight rows are wgmma's M (64 per warpgroup) and the
 * A operand comes from registers: every thread dequantises its own share of W straight into its A
 * fragments (NVFP4: e2m1 x e4m3 is exact in bf16, as in cuda_gemm_mma.cu; BF16: as stored), so
 * weights never pass through shared memory. The tokens are B (wgmma's N = the token tile, 64 or
 * 128), staged in shared memory as bf16 hi + lo (x = hi + lo, ~16 significant bits: the mma.sync
 * path's split); both halves accumulate into the same fp32 accumulators, the global scale and the
 * bias are applied in the epilogue.
 *
 * K order. Within a k-step of BK (64 or 128) wgmma's logical k is a permutation of the stored k,
 * chosen so that a thread's A elements are BK/4 consecutive stored k of each of its two rows (one
 * 8- or 16-byte load and one or two scale bytes per row for NVFP4, two 16-byte loads for BF16):
 * quad lane c holds stored k [c BK/4, (c+1) BK/4), and k16 step s puts stored k c BK/4 + 4s + {0..3}
 * into its fragment slots of logical k 16s + {2c, 2c+1, 2c+8, 2c+9}. The activations are written
 * to shared memory in the same permuted order, so every product meets its partner.
 *
 * B layout: wgmma's no-swizzle K-major canonical layout, 8 tokens x 16 bytes per core matrix (128
 * contiguous bytes); the two k halves of a k16 step are 128 bytes apart (leading byte offset), 8-token
 * groups 16 BK bytes apart (stride byte offset). A thread writes whole 16-byte core-matrix rows.
 *
 * Block: 2 or 4 warpgroups (128 or 256 weight rows) x TM tokens; every thread loads and computes.
 * Per k-step: the next step's weight bytes and x floats are loaded into registers first; then for
 * each k16 step the thread builds its A fragment in registers of its own (two sets, alternating; see
 * wg_bf16_frag()), issues the lo and hi wgmmas as one commit group and waits until at most one
 * group is in flight, so the tensor core always has the next step queued while the following
 * fragment is built. After the k16 steps the next x tile is split and stored into a third
 * shared-memory stage (three: after a block barrier a warpgroup may still be reading the previous
 * stage) and fenced for the async proxy; one barrier per k-step. NVFP4 fragments: bit moves turn a
 * byte into its two e2m1 values as bf16x2 (wg_e2m1x2), one bf16x2 multiply applies the block scale.
 * Shared memory: stages x 2 x TM x BK x 2 bytes plus the source rows: with 3 stages at most
 * 98816 bytes (within the sm_120 budget too); the 4-stage ring (NVFP4, BK 64, x's image only) up
 * to 131600 for 128 tokens. cuda_gemm_wgmma_fit() keeps the plan's 4 stages where such a tile is
 * compiled and fits the budget; every other tile runs 3.
 *
 * The kernel bodies exist only in the sm_90a image (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere they are
 * empty and declare no shared memory, which is how cuda_gemm_wgmma_loadable() tells them apart.
 *
 * Deliberately not here: TMA, warp specialisation, swizzled layouts, split-K, FP8 weights.
 */
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_wgmma.cuh"

#include <cuda_bf16.h>

namespace
{

enum { WG_STAGES = 3 }; /* the default ring: one k-step of x in flight (a 4-stage ring: two) */

struct wg_params {
    cuda_wdev w;            /* the weight when table == NULL */
    const uint8_t *img;     /* x pre-split by wg_image_kernel (the IMG kernels), or NULL */
    const cuda_wdev *table; /* per-expert weights (device) or NULL */
    int64_t N, K;
    const float *x;
    const int32_t *x_rows; /* compact row -> x row * x_row_div, or NULL */
    int x_row_div;
    int m;
    const int32_t *tiles;
    const int32_t *n_tiles;
    float *y;
};

/* Shared memory of a tile: dynamic (the x stages) and static (the source rows). */
constexpr size_t wg_dyn_smem(int tm, int bk, int stages)
{
    return (size_t)stages * 2 * (size_t)tm * (size_t)bk * 2; /* = cuda_wgmma_dyn_smem() */
}
constexpr size_t wg_static_smem(int fmt, int tm)
{
    (void)fmt;
    return (size_t)tm * 4 + 16; /* = cuda_wgmma_static_smem() */
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t wg_pack(float a, float b)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b); /* a -> low half */
    return *(uint32_t *)&v;
}

/* A byte's two e2m1 nibbles as bf16x2 (the low nibble in the low half), each worth e2m1 x 2^-126:
 * a nibble's two exponent bits become the lowest two of bf16's exponent field and its mantissa bit
 * bf16's top mantissa bit, so 0.5 lands on a bf16 subnormal (bf16 multiplies keep subnormals).
 * Bit moves instead of a shared-memory table: a table's loads are the GEMM's largest stall
 * (short scoreboard, ncu on the H200). The block scale, taken times 2^64, brings the product back
 * into the normal range exactly (<= 6 significant bits); the epilogue multiplies by 2^62. */
__device__ __forceinline__ uint32_t wg_e2m1x2(uint32_t b)
{
    return ((b & 7u) << 6) | ((b & 8u) << 12) | ((b & 0x70u) << 18) | ((b & 0x80u) << 24);
}

__device__ __forceinline__ uint32_t wg_mul(uint32_t a, __nv_bfloat162 s)
{
    __nv_bfloat162 r = __hmul2(*(const __nv_bfloat162 *)&a, s); /* exact: <= 6 significant bits */
    return *(uint32_t *)&r;
}

/* A BF16 A-fragment word, computed into a register of its own. wgmma reads its A registers
 * asynchronously, so they must hold their value until the wait that retires it (PTX: writing them
 * earlier is undefined). Used directly, the loop-carried weight words get overwritten while the last
 * k16 step's wgmma is still in flight (ptxas reuses them for the x split, then wcur = wnext): wrong
 * products, now and then. A plain copy is propagated away by ptxas; an exact bf16x2 multiply by one is
 * not, and ptxas keeps its result until the retiring wait, as it does for the NVFP4 fragments (seen
 * in the sm_90a SASS: no write to a pending group's A registers before its WARPGROUP.DEPBAR). */
__device__ __forceinline__ uint32_t wg_bf16_frag(uint32_t v)
{
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(v), "r"(0x3f803f80u)); /* x (1.0, 1.0) */
    return r;
}

/* no-swizzle descriptor of x's stage: k halves 128 bytes apart, 8-token groups sbo apart */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t sbo)
{
    return wgmma_desc(addr, 128, sbo);
}

/* d (64 x 64 fp32, fragment order) += A (64 x 16 bf16, registers) B (16 x 64 bf16, descriptor) */
__device__ __forceinline__ void wgmma_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

template <int TM>
__device__ __forceinline__ void wgmma_tile(float (&d)[TM / 2], const uint32_t (&a)[4], uint64_t b)
{
    if constexpr (TM == 64)
        wgmma_n64(d, a, b);
    else
        wgmma_rs_n128<0>(d, a, b);
}

/* One thread's weights for one k-step: rows m0 and m0 + 8, stored k [k0 + c BK/4, k0 + (c+1) BK/4). */
template <int FMT, int BK>
struct wg_wraw {
    static_assert(FMT == WEIGHT_NVFP4 || BK == 64, "BF16: 64-wide k-steps only");
    static constexpr int WORDS = FMT == WEIGHT_NVFP4 ? BK / 32 : BK / 8;
    uint32_t q[2][WORDS];
    uint32_t sc[2]; /* NVFP4: the row's BK/64 e4m3 scale bytes, first block lowest */

    __device__ __forceinline__ void load(const cuda_wdev &w, int64_t m0, int64_t kc, int64_t N, int64_t K)
    {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t n = m0 + 8 * h;
            const bool ok = n < N && kc < K; /* K % 16 == 0 (BK 128: K % 128 == 0): whole chunks */
            if constexpr (FMT == WEIGHT_NVFP4) {
                if constexpr (BK == 64) {
                    uint2 u = make_uint2(0, 0);
                    sc[h] = 0;
                    if (ok) {
                        u = __ldg((const uint2 *)((const uint8_t *)w.data + n * (K / 2) + kc / 2));
                        sc[h] = __ldg((const uint8_t *)w.scale + n * (K / 16) + kc / 16);
                    }
                    q[h][0] = u.x, q[h][1] = u.y;
                } else {
                    uint4 u = make_uint4(0, 0, 0, 0);
                    sc[h] = 0;
                    if (ok) {
                        u = __ldg((const uint4 *)((const uint8_t *)w.data + n * (K / 2) + kc / 2));
                        sc[h] = __ldg((const uint16_t *)((const uint8_t *)w.scale + n * (K / 16) + kc / 16));
                    }
                    q[h][0] = u.x, q[h][1] = u.y, q[h][2] = u.z, q[h][3] = u.w;
                }
            } else {
                uint4 u0 = make_uint4(0, 0, 0, 0), u1 = u0;
                if (ok) {
                    const uint4 *p = (const uint4 *)((const uint16_t *)w.data + n * K + kc);
                    u0 = __ldg(p);
                    u1 = __ldg(p + 1);
                }
                q[h][0] = u0.x, q[h][1] = u0.y, q[h][2] = u0.z, q[h][3] = u0.w;
                q[h][4] = u1.x, q[h][5] = u1.y, q[h][6] = u1.z, q[h][7] = u1.w;
            }
        }
    }
};

#endif

template <int FMT, int TM, int NWG, int BK, bool IMG, int ST = WG_STAGES>
__global__ void __launch_bounds__(128 * NWG, 1) gemm_wgmma_kernel(wg_params p)
{
    /* ST = 4 (x's image only): k-step kt + 2's x copy and weights are issued during k-step kt */
    static_assert(ST == WG_STAGES || (ST == 4 && IMG), "a 4-stage ring reads x's image");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int THREADS = 128 * NWG, STEPS = BK / 16, KC = BK / 4, SC = BK / 64;
    constexpr int UNITS = TM * STEPS, UPT = (UNITS + THREADS - 1) / THREADS; /* x: (token, k16 step) */
    constexpr uint32_t HALF = TM * BK * 2, SBO = 16 * BK;                    /* bytes of hi (or lo) */
    static_assert(STEPS % 2 == 0, "the A register sets alternate by k16 step across k-steps");
    __shared__ int32_t src_row[TM];
    extern __shared__ __align__(128) uint8_t wg_smem[];        /* (3, {hi, lo}, TM / 8, BK / 8, 8, 8) bf16 */

    int expert = 0, row0, nrows;
    if (p.tiles) {
        if ((int)blockIdx.x >= *p.n_tiles)
            return;
        expert = p.tiles[3 * blockIdx.x];
        row0 = p.tiles[3 * blockIdx.x + 1];
        nrows = p.tiles[3 * blockIdx.x + 2];
    } else {
        row0 = blockIdx.x * TM;
        nrows = p.m - row0 < TM ? p.m - row0 : TM;
    }
    const cuda_wdev w = p.table ? p.table[expert] : p.w;
    const int64_t N = p.N, K = p.K;
    const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, c = lane % 4;
    /* this thread's weight rows m0 and m0 + 8: warpgroup tid / 128, its warp (tid / 32) % 4 */
    const int64_t m0 = (int64_t)blockIdx.y * (64 * NWG) + 64 * (tid / 128) + 16 * ((tid / 32) % 4) + g;

    for (int r = tid; r < TM; r += THREADS) {
        int32_t src = -1;
        if (r < nrows)
            src = p.x_rows ? p.x_rows[row0 + r] / p.x_row_div : row0 + r;
        src_row[r] = src;
    }
    __syncthreads();

    /* x: unit u = (token u / STEPS, k16 step u % STEPS) holds stored k c KC + 4s .. + 3 for c = 0..3 */
    constexpr int XU = IMG ? 0 : UPT; /* IMG: x arrives by copy_x below */
    float4 xr[IMG ? 1 : UPT][4];
    auto load_x = [&](int64_t k0) {
#pragma unroll
        for (int i = 0; i < XU; i++) {
            const int u = tid + i * THREADS, n = u / STEPS, s = u % STEPS;
            const int32_t src = u < UNITS ? src_row[n] : -1;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int64_t k = k0 + KC * q + 4 * s;
                xr[i][q] = src >= 0 && k < K ? __ldg((const float4 *)(p.x + (int64_t)src * K + k))
                                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
    };
    /* into stage st: the unit's two 16-byte core-matrix rows (logical k 8h .. 8h + 7 of step s) */
    auto store_x = [&](int st) {
        uint8_t *hi = wg_smem + (size_t)st * 2 * HALF, *lo = hi + HALF;
#pragma unroll
        for (int i = 0; i < XU; i++) {
            const int u = tid + i * THREADS, n = u / STEPS, s = u % STEPS;
            if (u >= UNITS)
                continue;
            const uint32_t off = (uint32_t)(((n / 8) * (BK / 8) + 2 * s) * 128 + (n % 8) * 16);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float v[8];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    v[2 * q] = h ? xr[i][q].z : xr[i][q].x;
                    v[2 * q + 1] = h ? xr[i][q].w : xr[i][q].y;
                }
                uint32_t vh[4], vl[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float h0 = __bfloat162float(__float2bfloat16_rn(v[2 * j]));
                    float h1 = __bfloat162float(__float2bfloat16_rn(v[2 * j + 1]));
                    vh[j] = wg_pack(h0, h1);
                    vl[j] = wg_pack(v[2 * j] - h0, v[2 * j + 1] - h1);
                }
                *(uint4 *)(hi + off + 128 * h) = make_uint4(vh[0], vh[1], vh[2], vh[3]);
                *(uint4 *)(lo + off + 128 * h) = make_uint4(vl[0], vl[1], vl[2], vl[3]);
            }
        }
    };

    const int kt_n = (int)((K + BK - 1) / BK);
    /* IMG: k-step kt of every token's pre-split row (wg_image_kernel: BK * 4 bytes a row and
     * k-step, hi chunks then lo chunks, chunk cc = 2s + h already in the stage's order) copied
     * into stage stg with cp.async. A warp's 32 copies are 8 tokens x 4 consecutive chunks: 64
     * contiguous global bytes per token, 4 whole 128-byte shared-memory rows (no bank conflict). */
    auto copy_x = [&](int kt, int stg) {
        constexpr int CH = BK / 8, CPT = TM * 2 * CH / THREADS;
        static_assert(TM * 2 * CH % THREADS == 0 && CH % 4 == 0, "whole copy rounds");
        uint8_t *base = wg_smem + (size_t)stg * 2 * HALF;
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const int u = tid + i * THREADS, r8 = u & 7, rest = u >> 5;
            const int cc = (rest % (CH / 4)) * 4 + ((u >> 3) & 3), hl = (rest / (CH / 4)) & 1;
            const int n = (rest / (CH / 4) >> 1) * 8 + r8;
            uint8_t *dst = base + hl * HALF + (n / 8) * CH * 128 + cc * 128 + r8 * 16;
            const int32_t src = src_row[n];
            if (src >= 0)
                cp_async16(dst, p.img + ((size_t)src * (size_t)kt_n + (size_t)kt) * (BK * 4) + hl * (BK * 2) +
                                    cc * 16);
            else
                *(uint4 *)dst = make_uint4(0, 0, 0, 0);
        }
        cp_async_commit();
    };

    float acc[TM / 2];
#pragma unroll
    for (int i = 0; i < TM / 2; i++)
        acc[i] = 0.0f;

    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(wg_smem);
    wg_wraw<FMT, BK> wcur, wnext, wnext2;
    wcur.load(w, m0, (int64_t)KC * c, N, K);
    if constexpr (ST == 4) {
        copy_x(0, 0);
        if (kt_n > 1) {
            copy_x(1, 1);
            wnext.load(w, m0, (int64_t)BK + KC * c, N, K);
        }
        cp_async_wait_upto(kt_n > 1 ? 1 : 0); /* stage 0 landed; stage 1 may still be in flight */
    } else if constexpr (IMG) {
        copy_x(0, 0);
        cp_async_wait_upto(0);
    } else {
        load_x(0);
        store_x(0);
    }
    wgmma_fence_proxy();
    __syncthreads();

    int st = 0;
    for (int kt = 0; kt < kt_n; kt++) {
        const bool more = kt + 1 < kt_n;
        if constexpr (ST == 4) {
            /* stage (st + 2) % 4 was last read by k-step kt - 2, retired everywhere as below */
            if (kt + 2 < kt_n) {
                copy_x(kt + 2, (st + 2) % 4);
                wnext2.load(w, m0, (int64_t)(kt + 2) * BK + KC * c, N, K);
            }
        } else if (more) { /* in flight during this k-step's wgmmas */
            const int64_t k0 = (int64_t)(kt + 1) * BK;
            /* IMG: the next stage was last read by k-step kt - 2, whose wgmmas every warpgroup
             * retired in k-step kt - 1 (its first wait), before the barrier that ended it */
            if constexpr (IMG)
                copy_x(kt + 1, st + 1 == WG_STAGES ? 0 : st + 1);
            wnext.load(w, m0, k0 + KC * c, N, K);
            load_x(k0);
        }
        __nv_bfloat162 scale[2][SC]; /* NVFP4: the block scales as bf16 pairs */
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < SC; j++) {
                float f = FMT == WEIGHT_NVFP4 ? dev_e4m3((wcur.sc[h] >> (8 * j)) & 255u) : 1.0f;
                f *= FMT == WEIGHT_NVFP4 ? 0x1p64f : 1.0f; /* see wg_e2m1x2() */
                scale[h][j] = __floats2bfloat162_rn(f, f);
            }
        const uint32_t hi0 = smem0 + (uint32_t)st * 2 * HALF;
        uint32_t a[2][4];
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            uint32_t(&f)[4] = a[s & 1]; /* the set step s - 2 used: retired by the last wait */
            if constexpr (FMT == WEIGHT_NVFP4) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t bytes = wcur.q[h][s / 2] >> (16 * (s % 2)); /* chunk bytes 2s, 2s + 1 */
                    f[h] = wg_mul(wg_e2m1x2(bytes & 255u), scale[h][s / 4]);
                    f[h + 2] = wg_mul(wg_e2m1x2((bytes >> 8) & 255u), scale[h][s / 4]);
                }
            } else {
                /* never wcur itself: it is overwritten while the last step is in flight */
                f[0] = wg_bf16_frag(wcur.q[0][2 * s]), f[1] = wg_bf16_frag(wcur.q[1][2 * s]);
                f[2] = wg_bf16_frag(wcur.q[0][2 * s + 1]), f[3] = wg_bf16_frag(wcur.q[1][2 * s + 1]);
            }
            wgmma_fence();
            wgmma_tile<TM>(acc, f, wg_desc(hi0 + HALF + 256 * s, SBO)); /* lo first: the smaller terms */
            wgmma_tile<TM>(acc, f, wg_desc(hi0 + 256 * s, SBO));
            wgmma_commit();
            wgmma_wait<1>();
        }
        if (more && ST == 4) {
            st = (st + 1) % 4;
            cp_async_wait_upto(kt + 2 < kt_n ? 1 : 0); /* k-step kt + 1's stage landed */
            wgmma_fence_proxy();
            wcur = wnext;
            wnext = wnext2;
        } else if (more) {
            st = st + 1 == WG_STAGES ? 0 : st + 1; /* last read by k-step kt - 2: retired everywhere */
            store_x(st);
            if constexpr (IMG)
                cp_async_wait_upto(0);
            wgmma_fence_proxy();
            wcur = wnext;
        }
        __syncthreads();
    }
    wgmma_wait<0>();
    wgmma_fence_acc(acc);

    const float s2 = FMT == WEIGHT_NVFP4 ? w.scale2 * 0x1p62f : 1.0f; /* wg_e2m1x2's 2^-126, scale's 2^64 */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t n = m0 + 8 * h;
        if (n >= N)
            continue;
        const float b = w.bias ? w.bias[n] : 0.0f;
#pragma unroll
        for (int j = 0; j < TM / 8; j++)
#pragma unroll
            for (int v = 0; v < 2; v++) {
                int t = 8 * j + 2 * c + v; /* token */
                if (t < nrows)
                    p.y[(size_t)(row0 + t) * (size_t)N + (size_t)n] = acc[4 * j + 2 * h + v] * s2 + b;
            }
    }
#endif /* not an sm_90a image: an empty body with no shared memory (see the file comment) */
}

/* x (rows x K fp32) split into the bf16 hi + lo halves the kernels stage, in their order: for row
 * r and k-step kt, BK * 4 bytes at (r * kt_n + kt) * BK * 4: BK / 8 hi chunks of 16 bytes, then
 * the lo chunks; chunk cc = 2s + h holds, for q = 0..3, the pair of stored k kt BK + q BK/4 + 4s
 * + 2h, + 1 (store_x's permutation; k >= K reads as 0). A thread a chunk, hi and lo. Every block
 * that reads a row shares one split instead of redoing it in its k loop (16 x-loads and ~100
 * conversion instructions a thread a k-step, most of the gate/up GEMM's issue stalls). */
__global__ void wg_image_kernel(const float *x, int64_t rows, int64_t K, int bk, int kt_n, uint8_t *img)
{
    const int ch = bk / 8;
    const int64_t total = rows * kt_n * ch;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int cc = (int)(i % ch), kt = (int)(i / ch % kt_n);
        const int64_t r = i / ch / kt_n;
        const int s = cc / 2, h = cc % 2;
        uint32_t vh[4], vl[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int64_t k = (int64_t)kt * bk + (int64_t)(bk / 4) * q + 4 * s + 2 * h;
            const float2 v = k < K ? *(const float2 *)(x + r * K + k) : make_float2(0.0f, 0.0f);
            const float h0 = __bfloat162float(__float2bfloat16_rn(v.x));
            const float h1 = __bfloat162float(__float2bfloat16_rn(v.y));
            __nv_bfloat162 a = __floats2bfloat162_rn(h0, h1), b = __floats2bfloat162_rn(v.x - h0, v.y - h1);
            vh[q] = *(uint32_t *)&a;
            vl[q] = *(uint32_t *)&b;
        }
        uint8_t *dst = img + ((size_t)r * (size_t)kt_n + (size_t)kt) * (size_t)(bk * 4) + (size_t)cc * 16;
        *(uint4 *)dst = make_uint4(vh[0], vh[1], vh[2], vh[3]);
        *(uint4 *)(dst + bk * 2) = make_uint4(vl[0], vl[1], vl[2], vl[3]);
    }
}

/* The compiled tiles (CUDA_WGMMA_TILES, cuda_gemm_limits.h: the planner's list too), as the
 * dispatch below matches them; the first that matches a fitted tile runs. */
struct wg_config {
    int fmt, tm, nwg, bk, st;
};

struct wg_configs {
    wg_config c[CUDA_WGMMA_N_TILES];
    wg_configs() : c()
    {
        for (int i = 0; i < CUDA_WGMMA_N_TILES; i++)
            c[i] = wg_config{(int)CUDA_WGMMA_TILES[i].format, CUDA_WGMMA_TILES[i].m, CUDA_WGMMA_TILES[i].n / 64,
                             CUDA_WGMMA_TILES[i].k, CUDA_WGMMA_TILES[i].stages};
    }
    const wg_config *begin() const { return c; }
    const wg_config *end() const { return c + CUDA_WGMMA_N_TILES; }
};
const wg_configs WG_CONFIGS;

template <int FMT, int TM, int NWG, int BK, int ST> cudaError_t wg_attrs(cudaFuncAttributes *a)
{
    cudaError_t e = cudaFuncGetAttributes(a, gemm_wgmma_kernel<FMT, TM, NWG, BK, true, ST>);
    if constexpr (ST != WG_STAGES)
        return e;
    else
        return e != cudaSuccess ? e : cudaFuncGetAttributes(a, gemm_wgmma_kernel<FMT, TM, NWG, BK, false>);
}

template <int FMT, int TM, int NWG, int BK, int ST>
cudaError_t wg_launch(cudaStream_t stream, const wg_params &p, int row_tiles)
{
    auto kernel = gemm_wgmma_kernel<FMT, TM, NWG, BK, true, ST>;
    if constexpr (ST == WG_STAGES) {
        if (!p.img)
            kernel = gemm_wgmma_kernel<FMT, TM, NWG, BK, false>;
    } else if (!p.img) {
        return cudaErrorInvalidValue; /* wg_run picks a 3-stage config without an image */
    }
    const size_t smem = wg_dyn_smem(TM, BK, ST);
    int64_t col_tiles = (p.N + 64 * NWG - 1) / (64 * NWG);
    if (col_tiles > 65535)
        return cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)row_tiles, (unsigned)col_tiles);
    kernel<<<grid, 128 * NWG, smem, stream>>>(p);
    return CUDA_LAUNCH_RESULT();
}

/* cfg's kernel: attributes (a != NULL) or a launch. */
cudaError_t wg_dispatch(const wg_config &cfg, cudaFuncAttributes *a, cudaStream_t stream, const wg_params *p,
                        int row_tiles)
{
#define WG_CASE(F, TM, NWG, BK, ST)                                                                          \
    if (cfg.fmt == F && cfg.tm == TM && cfg.nwg == NWG && cfg.bk == BK && cfg.st == ST)                      \
        return a ? wg_attrs<F, TM, NWG, BK, ST>(a) : wg_launch<F, TM, NWG, BK, ST>(stream, *p, row_tiles);
    WG_CASE(WEIGHT_BF16, 64, 2, 64, 3)
    WG_CASE(WEIGHT_BF16, 64, 4, 64, 3)
    WG_CASE(WEIGHT_BF16, 128, 2, 64, 3)
    WG_CASE(WEIGHT_NVFP4, 64, 2, 64, 3)
    WG_CASE(WEIGHT_NVFP4, 64, 4, 64, 3)
    WG_CASE(WEIGHT_NVFP4, 128, 2, 64, 3)
    WG_CASE(WEIGHT_NVFP4, 64, 2, 128, 3)
    WG_CASE(WEIGHT_NVFP4, 64, 4, 128, 3)
    WG_CASE(WEIGHT_NVFP4, 64, 2, 64, 4)
    WG_CASE(WEIGHT_NVFP4, 64, 4, 64, 4)
    WG_CASE(WEIGHT_NVFP4, 128, 2, 64, 4)
#undef WG_CASE
    return cudaErrorInvalidValue;
}

/* t's stages: 4 where asked for and compiled, else 3 */
int wg_stages(enum weight_format fmt, const cuda_wgmma_tile *t)
{
    if (t->stages == 4)
        for (const wg_config &cfg : WG_CONFIGS)
            if (cfg.st == 4 && cfg.fmt == (int)fmt && cfg.tm == t->tokens && 64 * cfg.nwg == t->rows &&
                cfg.bk == t->k)
                return 4;
    return WG_STAGES;
}

bool wg_find(enum weight_format fmt, const cuda_wgmma_tile *t, int stages, wg_config *out)
{
    for (const wg_config &cfg : WG_CONFIGS)
        if (cfg.fmt == (int)fmt && cfg.tm == t->tokens && 64 * cfg.nwg == t->rows && cfg.bk == t->k &&
            cfg.st == stages) {
            *out = cfg;
            return true;
        }
    return false;
}

size_t wg_smem_bytes(enum weight_format fmt, int tm, int bk, int stages)
{
    return wg_dyn_smem(tm, bk, stages) + wg_static_smem(fmt, tm);
}

cudaError_t wg_run(cudaStream_t stream, enum weight_format fmt, const wg_params &p, int row_tiles,
                   const cuda_wgmma_tile *t)
{
    wg_config cfg;
    const int stages = p.img ? wg_stages(fmt, t) : WG_STAGES; /* 4 stages read x's image */
    if (!wg_find(fmt, t, stages, &cfg) || (fmt == WEIGHT_NVFP4 && t->k == 128 && p.K % 128))
        return cudaErrorInvalidValue;
    if (row_tiles <= 0)
        return cudaSuccess;
    return wg_dispatch(cfg, NULL, stream, &p, row_tiles);
}

} // namespace

extern "C" int cuda_gemm_wgmma_loadable(int device)
{
    if (cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    for (const wg_config &cfg : WG_CONFIGS) {
        cudaFuncAttributes a;
        if (wg_dispatch(cfg, &a, 0, NULL, 0) != cudaSuccess) {
            (void)cudaGetLastError(); /* no image for this device: not a sticky error */
            return 0;
        }
        if (a.sharedSizeBytes < (size_t)cfg.tm * 4)
            return 0; /* the empty body of a non-sm_90a image: no source-row table */
    }
    return 1;
}

extern "C" int cuda_gemm_wgmma_supported(enum weight_format fmt, int64_t K, const float *x)
{
    /* whole 16-wide k chunks (cuda_gemm_limits.h), 16-byte x loads */
    return cuda_gemm_wgmma_fits(fmt, K) && (uintptr_t)x % 16 == 0;
}

extern "C" int cuda_gemm_wgmma_fit(struct cuda_wgmma_tile *t, enum weight_format fmt, int64_t K,
                                   double rows_hint, size_t budget)
{
    if (fmt != WEIGHT_BF16 && fmt != WEIGHT_NVFP4)
        return 0;
    /* 128 tokens hold 64 fp32 accumulators per thread: with 2 warpgroups only, and 64-wide k */
    int tm = t->tokens >= 128 && rows_hint > 64 ? 128 : 64;
    int nwg = t->rows >= 256 && tm == 64 ? 4 : 2;
    int bk = fmt == WEIGHT_NVFP4 && t->k >= 128 && K % 128 == 0 && tm == 64 ? 128 : 64;
    while (wg_smem_bytes(fmt, tm, bk, WG_STAGES) > budget) {
        if (bk > 64)
            bk = 64;
        else if (tm > 64)
            tm = 64;
        else
            return 0;
    }
    t->tokens = tm;
    t->rows = 64 * nwg;
    t->k = bk;
    /* a 4-stage ring where asked for, compiled for this tile and within the budget */
    t->stages = wg_stages(fmt, t) == 4 && wg_smem_bytes(fmt, tm, bk, 4) <= budget ? 4 : WG_STAGES;
    t->smem_bytes = wg_smem_bytes(fmt, tm, bk, t->stages);
    return 1;
}

extern "C" size_t cuda_gemm_wgmma_image_bytes(int64_t rows, int64_t K, const struct cuda_wgmma_tile *t)
{
    return (size_t)rows * (size_t)((K + t->k - 1) / t->k) * (size_t)t->k * 4;
}

extern "C" cudaError_t cuda_gemm_wgmma_image(cudaStream_t stream, const float *x, int64_t rows, int64_t K,
                                             const struct cuda_wgmma_tile *t, void *img)
{
    if (rows <= 0)
        return cudaSuccess;
    if ((t->k != 64 && t->k != 128) || K % 16 || (uintptr_t)x % 8 || (uintptr_t)img % 16)
        return cudaErrorInvalidValue;
    const int kt_n = (int)((K + t->k - 1) / t->k);
    const size_t chunks = (size_t)rows * (size_t)kt_n * (size_t)(t->k / 8);
    wg_image_kernel<<<cuda_blocks(chunks, 256), 256, 0, stream>>>(x, rows, K, t->k, kt_n, (uint8_t *)img);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_gemm_wgmma(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                                       int64_t N, int64_t K, const float *x, int m, float *y,
                                       const struct cuda_wgmma_tile *t, const void *img)
{
    if (m <= 0 || N <= 0)
        return cudaSuccess;
    if (!cuda_gemm_wgmma_supported(fmt, K, x))
        return cudaErrorInvalidValue;
    wg_params p = {};
    p.w = *w;
    p.N = N;
    p.K = K;
    p.x = x;
    p.img = (const uint8_t *)img;
    p.x_row_div = 1;
    p.m = m;
    p.y = y;
    return wg_run(stream, fmt, p, (m + t->tokens - 1) / t->tokens, t);
}

extern "C" cudaError_t cuda_gemm_wgmma_grouped(cudaStream_t stream, enum weight_format fmt,
                                               const struct cuda_wdev *table, int64_t N, int64_t K,
                                               const float *x, const int32_t *x_rows, int x_row_div,
                                               const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
                                               float *y, const struct cuda_wgmma_tile *t, const void *img)
{
    if (N <= 0 || max_tiles <= 0)
        return cudaSuccess;
    if (!cuda_gemm_wgmma_supported(fmt, K, x) || x_row_div < 1)
        return cudaErrorInvalidValue;
    wg_params p = {};
    p.table = table;
    p.N = N;
    p.K = K;
    p.x = x;
    p.img = (const uint8_t *)img;
    p.x_rows = x_rows;
    p.x_row_div = x_row_div;
    p.tiles = tiles;
    p.n_tiles = n_tiles;
    p.y = y;
    return wg_run(stream, fmt, p, max_tiles, t);
}
