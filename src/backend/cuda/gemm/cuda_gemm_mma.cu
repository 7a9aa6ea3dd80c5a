/* cuda_gemm_mma.cu — y = x W^T on bf16 tensor cores (mma.sync m16n8k16, sm_80 and later), for
 * NVFP4 and BF16 weights: the plan's "*_wo_mma" (weight-only) and "moe_gemm_bf16_mma" variants.
 *
 * Precision is kept at the fp32 paths' level, not bf16's: each activation
 * is split into bf16 hi + lo (x - hi rounded again; ~16 significant bits
 * together) and both halves go through the tensor core, with fp32
 * accumulation. The weights need no split: an NVFP4 weight e2m1 * e4m3 has
 * at most 6 significant bits and lies in [2^-10, 2688], so it is exact in
 * bf16; the global scale multiplies the fp32 sum in the epilogue.
 *
 * Tile: BM rows (32 or 64, the plan's tile_m) x 64 output features x 32 of
 * K per step, 4 warps as 2 x 2, each warp (BM/2) x 32 of the output. Both
 * operands are staged in shared memory as bf16 with rows padded to 40
 * elements (20 words: the 8 row groups of a fragment load hit distinct
 * banks). The next step's global loads are issued before the current
 * step's MMAs. The grouped form walks the same (expert, first row, rows)
 * tile list as cuda_gemm_grouped, so MoE needs no host sync.
 */
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/common/cuda_common.cuh"

#include <cuda_bf16.h>

namespace
{

enum { MMA_THREADS = 128, MMA_BN = 64, MMA_BK = CUDA_GEMM_MMA_BK, MMA_LD = MMA_BK + 8 };

struct mma_params {
    cuda_wdev w;            /* the weight when table == NULL */
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

__device__ __forceinline__ uint32_t pack_bf16(float a, float b)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b); /* a -> low half */
    return *(uint32_t *)&v;
}

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* One thread's share of a W tile (64 rows x 32 k): row tid / 2, 16 consecutive k at (tid % 2) * 16. */
template <int FMT>
struct w_stage {
    uint4 raw[2]; /* BF16: 32 bytes; NVFP4: 8 bytes in raw[0].x/.y */
    uint32_t scale;
    bool valid;

    __device__ __forceinline__ void load(const cuda_wdev &w, int64_t n, int64_t k, int64_t N)
    {
        valid = n < N;
        if (!valid)
            return;
        if constexpr (FMT == WEIGHT_NVFP4) {
            uint2 u = __ldg((const uint2 *)((const uint8_t *)w.data + n * (w_K / 2) + k / 2));
            raw[0].x = u.x, raw[0].y = u.y;
            scale = __ldg((const uint8_t *)w.scale + n * (w_K / 16) + k / 16);
        } else {
            const uint4 *p = (const uint4 *)((const uint16_t *)w.data + n * w_K + k);
            raw[0] = __ldg(p);
            raw[1] = __ldg(p + 1);
        }
    }
    int64_t w_K;

    /* 16 bf16 into dst (8 words) */
    __device__ __forceinline__ void store(uint32_t *dst) const
    {
        if (!valid) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                dst[i] = 0;
            return;
        }
        if constexpr (FMT == WEIGHT_NVFP4) {
            float s = dev_e4m3(scale);
            uint32_t q[2] = {raw[0].x, raw[0].y};
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    uint32_t b = q[h] >> (8 * i); /* low nibble first */
                    dst[4 * h + i] = pack_bf16(dev_e2m1(b & 15u) * s, dev_e2m1((b >> 4) & 15u) * s);
                }
        } else {
            const uint32_t *r = (const uint32_t *)raw;
#pragma unroll
            for (int i = 0; i < 8; i++)
                dst[i] = r[i];
        }
    }
};

template <int FMT, int BM>
__global__ void __launch_bounds__(MMA_THREADS) gemm_mma_kernel(mma_params p)
{
    constexpr int WM = BM / 2, MT = WM / 16; /* warp rows, m16 tiles per warp */
    __shared__ __align__(16) uint16_t xs_hi[BM][MMA_LD];
    __shared__ __align__(16) uint16_t xs_lo[BM][MMA_LD];
    __shared__ __align__(16) uint16_t ws[MMA_BN][MMA_LD];
    __shared__ int64_t src_row[BM];

    int expert = 0, row0, nrows;
    if (p.tiles) {
        if ((int)blockIdx.x >= *p.n_tiles)
            return;
        expert = p.tiles[3 * blockIdx.x];
        row0 = p.tiles[3 * blockIdx.x + 1];
        nrows = p.tiles[3 * blockIdx.x + 2];
    } else {
        row0 = blockIdx.x * BM;
        nrows = p.m - row0 < BM ? p.m - row0 : BM;
    }
    const cuda_wdev w = p.table ? p.table[expert] : p.w;
    const int64_t n0 = (int64_t)blockIdx.y * MMA_BN, N = p.N, K = p.K;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int wm = (warp / 2) * WM, wn = (warp % 2) * 32;

    for (int r = tid; r < BM; r += MMA_THREADS) {
        int64_t src = -1;
        if (r < nrows) {
            int64_t cr = row0 + r;
            src = p.x_rows ? (int64_t)(p.x_rows[cr] / p.x_row_div) : cr;
        }
        src_row[r] = src;
    }
    __syncthreads();

    /* x: BM rows x 32 k = BM * 8 float4; thread handles float4s tid, tid + 128, ... */
    constexpr int XV = BM * 8 / MMA_THREADS;
    float4 xv[XV];
    w_stage<FMT> wst;
    wst.w_K = K;
    const int w_row = tid / 2, w_k = (tid % 2) * 16;

    auto load_tile = [&](int64_t k0) {
#pragma unroll
        for (int i = 0; i < XV; i++) {
            int idx = tid + i * MMA_THREADS, r = idx / 8, kk = (idx % 8) * 4;
            int64_t src = src_row[r];
            xv[i] = src >= 0 ? __ldg((const float4 *)(p.x + src * K + k0 + kk)) : make_float4(0, 0, 0, 0);
        }
        wst.load(w, n0 + w_row, k0 + w_k, N);
    };
    auto store_tile = [&]() {
#pragma unroll
        for (int i = 0; i < XV; i++) {
            int idx = tid + i * MMA_THREADS, r = idx / 8, kk = (idx % 8) * 4;
            float4 v = xv[i];
            float h0 = __bfloat162float(__float2bfloat16_rn(v.x)), h1 = __bfloat162float(__float2bfloat16_rn(v.y));
            float h2 = __bfloat162float(__float2bfloat16_rn(v.z)), h3 = __bfloat162float(__float2bfloat16_rn(v.w));
            uint32_t *hi = (uint32_t *)&xs_hi[r][kk], *lo = (uint32_t *)&xs_lo[r][kk];
            hi[0] = pack_bf16(h0, h1), hi[1] = pack_bf16(h2, h3);
            lo[0] = pack_bf16(v.x - h0, v.y - h1), lo[1] = pack_bf16(v.z - h2, v.w - h3);
        }
        wst.store((uint32_t *)&ws[w_row][w_k]);
    };

    float acc[MT][4][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;

    load_tile(0);
    for (int64_t k0 = 0; k0 < K; k0 += MMA_BK) {
        store_tile();
        __syncthreads();
        if (k0 + MMA_BK < K)
            load_tile(k0 + MMA_BK); /* in flight during the MMAs below */
#pragma unroll
        for (int ks = 0; ks < MMA_BK; ks += 16) {
            uint32_t bf[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint16_t *b = &ws[wn + 8 * j + g][ks + 2 * c];
                bf[j][0] = *(const uint32_t *)b;
                bf[j][1] = *(const uint32_t *)(b + 8);
            }
#pragma unroll
            for (int i = 0; i < MT; i++) {
                uint32_t ah[4], al[4];
                int r = wm + 16 * i + g;
                ah[0] = *(const uint32_t *)&xs_hi[r][ks + 2 * c];
                ah[1] = *(const uint32_t *)&xs_hi[r + 8][ks + 2 * c];
                ah[2] = *(const uint32_t *)&xs_hi[r][ks + 2 * c + 8];
                ah[3] = *(const uint32_t *)&xs_hi[r + 8][ks + 2 * c + 8];
                al[0] = *(const uint32_t *)&xs_lo[r][ks + 2 * c];
                al[1] = *(const uint32_t *)&xs_lo[r + 8][ks + 2 * c];
                al[2] = *(const uint32_t *)&xs_lo[r][ks + 2 * c + 8];
                al[3] = *(const uint32_t *)&xs_lo[r + 8][ks + 2 * c + 8];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    mma_bf16(acc[i][j], al, bf[j]);
                    mma_bf16(acc[i][j], ah, bf[j]);
                }
            }
        }
        __syncthreads();
    }

    const float s2 = FMT == WEIGHT_NVFP4 ? w.scale2 : 1.0f;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = wm + 16 * i + g + 8 * h;
            if (r >= nrows)
                continue;
            float *yr = p.y + (size_t)(row0 + r) * (size_t)N;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int64_t n = n0 + wn + 8 * j + 2 * c + q;
                    if (n < N)
                        yr[n] = acc[i][j][2 * h + q] * s2 + (w.bias ? w.bias[n] : 0.0f);
                }
        }
}

template <int FMT>
cudaError_t launch(cudaStream_t stream, const mma_params &p, int max_tiles, int bm)
{
    int64_t nt = (p.N + MMA_BN - 1) / MMA_BN;
    if (max_tiles <= 0)
        return cudaSuccess;
    if (nt > 65535)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)max_tiles, (unsigned)nt);
    if (bm >= 64)
        gemm_mma_kernel<FMT, 64><<<grid, MMA_THREADS, 0, stream>>>(p);
    else
        gemm_mma_kernel<FMT, 32><<<grid, MMA_THREADS, 0, stream>>>(p);
    return CUDA_LAUNCH_RESULT();
}

cudaError_t launch_fmt(cudaStream_t stream, enum weight_format fmt, const mma_params &p, int max_tiles, int bm)
{
    switch (fmt) {
    case WEIGHT_BF16: return launch<WEIGHT_BF16>(stream, p, max_tiles, bm);
    case WEIGHT_NVFP4: return launch<WEIGHT_NVFP4>(stream, p, max_tiles, bm);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

extern "C" int cuda_gemm_mma_supported(enum weight_format fmt, int64_t K, const float *x)
{
    /* whole 32-wide K steps (cuda_gemm_limits.h), 16-byte x loads */
    return cuda_gemm_mma_fits(fmt, K) && (uintptr_t)x % 16 == 0;
}

extern "C" cudaError_t cuda_gemm_mma(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                                     int64_t N, int64_t K, const float *x, int m, float *y, int tile_m)
{
    if (m <= 0 || N <= 0)
        return cudaSuccess;
    if (!cuda_gemm_mma_supported(fmt, K, x))
        return cudaErrorInvalidValue;
    mma_params p = {};
    p.w = *w;
    p.N = N;
    p.K = K;
    p.x = x;
    p.x_row_div = 1;
    p.m = m;
    p.y = y;
    int bm = tile_m >= 64 ? 64 : 32;
    return launch_fmt(stream, fmt, p, (m + bm - 1) / bm, bm);
}

extern "C" cudaError_t cuda_gemm_mma_grouped(cudaStream_t stream, enum weight_format fmt,
                                             const struct cuda_wdev *table, int64_t N, int64_t K, const float *x,
                                             const int32_t *x_rows, int x_row_div, const int32_t *tiles,
                                             const int32_t *n_tiles, int max_tiles, float *y, int tile_m)
{
    if (N <= 0 || max_tiles <= 0)
        return cudaSuccess;
    if (!cuda_gemm_mma_supported(fmt, K, x) || x_row_div < 1)
        return cudaErrorInvalidValue;
    mma_params p = {};
    p.table = table;
    p.N = N;
    p.K = K;
    p.x = x;
    p.x_rows = x_rows;
    p.x_row_div = x_row_div;
    p.tiles = tiles;
    p.n_tiles = n_tiles;
    p.y = y;
    return launch_fmt(stream, fmt, p, max_tiles, tile_m >= 64 ? 64 : 32);
}
