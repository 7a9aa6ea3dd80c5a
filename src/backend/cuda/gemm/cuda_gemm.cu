/* cuda_gemm.cu — y = x W^T (+ bias) with W read in its stored format, fp32 accumulation.
 *
 * Two kernels, every weight format (F32, BF16, F16, FP8 block-128, NVFP4):
 *  - gemv (m <= 8, decode): memory bound, so W is streamed once. One warp
 *    per output feature; each lane dequantises 8 consecutive weights at a
 *    time in registers (one 4/8/16/32-byte load) and multiplies them into
 *    all m rows; a warp reduction finishes the dot products.
 *  - tiled (larger m, and every grouped MoE GEMM): BM x 64 output tile
 *    (BM = 16, 32 or 64, the plan's tile_m) per block of 256 threads, K in steps of 32; x and the dequantised
 * W tile are staged in shared memory (fp32), each thread accumulates a (BM/16) x (BN/16) micro-tile with fp32
 * FMAs. The grouped form walks a device list of (expert, first row, rows) tiles and gathers x rows through an
 * index, so MoE needs no host sync. NVFP4's global scale multiplies the fp32 sum in the epilogue (the block
 * products e2m1 * e4m3 are exact); FP8 applies its 128x128 block scale per
 * element, as weight_dequant_row() does.
 *
 * Deliberately not here: tensor cores (the plan's mma.sync and wgmma variants
 * are cuda_gemm_mma.cu and cuda_gemm_wgmma.cu) and split-K.
 */
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/common/cuda_common.cuh"

namespace
{

enum { GEMV_MAX_M = 8, GEMV_THREADS = 256, TILE_THREADS = 256, BK = 32 };

template <int FMT>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_kernel(cuda_wdev w, int64_t N, int64_t K, const float *x, int m, int vec, float *y)
{
    const int lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * (GEMV_THREADS / 32) + threadIdx.x / 32;
    if (n >= N)
        return;
    float acc[GEMV_MAX_M];
#pragma unroll
    for (int i = 0; i < GEMV_MAX_M; i++)
        acc[i] = 0.0f;
    if (vec) {
        for (int64_t k = (int64_t)lane * 8; k < K; k += 32 * 8) {
            float wv[8];
            w_load8<FMT>(w, n, k, K, wv);
#pragma unroll
            for (int i = 0; i < GEMV_MAX_M; i++) {
                if (i < m) {
                    const float4 *xp = (const float4 *)(x + (size_t)i * K + k);
                    float4 a = xp[0], b = xp[1];
                    float s = acc[i];
                    s = fmaf(a.x, wv[0], s);
                    s = fmaf(a.y, wv[1], s);
                    s = fmaf(a.z, wv[2], s);
                    s = fmaf(a.w, wv[3], s);
                    s = fmaf(b.x, wv[4], s);
                    s = fmaf(b.y, wv[5], s);
                    s = fmaf(b.z, wv[6], s);
                    s = fmaf(b.w, wv[7], s);
                    acc[i] = s;
                }
            }
        }
    } else {
        for (int64_t k = lane; k < K; k += 32) {
            float wv = w_load1<FMT>(w, n, k, K);
#pragma unroll
            for (int i = 0; i < GEMV_MAX_M; i++)
                if (i < m)
                    acc[i] = fmaf(x[(size_t)i * K + k], wv, acc[i]);
        }
    }
    const float s2 = FMT == WEIGHT_NVFP4 ? w.scale2 : 1.0f;
    const float b = w.bias ? w.bias[n] : 0.0f;
#pragma unroll
    for (int i = 0; i < GEMV_MAX_M; i++) {
        if (i < m) {
            float s = warp_sum(acc[i]);
            if (lane == 0)
                y[(size_t)i * N + n] = s * s2 + b;
        }
    }
}

struct tiled_params {
    cuda_wdev w;            /* the weight when table == NULL */
    const cuda_wdev *table; /* per-expert weights (device) or NULL */
    int64_t N, K;
    const float *x;        /* rows of K floats */
    const int32_t *x_rows; /* compact row -> x row * x_row_div, or NULL */
    int x_row_div;
    int m;                /* rows when tiles == NULL */
    const int32_t *tiles; /* (max_tiles, 3) or NULL */
    const int32_t *n_tiles;
    float *y; /* rows of N floats */
    int vec;  /* K % 8 == 0: 8-wide weight loads */
};

template <int FMT, int BM, int BN>
__global__ void __launch_bounds__(TILE_THREADS) gemm_tiled_kernel(tiled_params p)
{
    constexpr int TM = BM / 16, TN = BN / 16;
    __shared__ float As[BK][BM + 1]; /* x tile, transposed; +1: conflict-free stores */
    __shared__ float Bs[BK][BN + 1]; /* dequantised W tile, transposed */
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
    const int64_t n0 = (int64_t)blockIdx.y * BN, N = p.N, K = p.K;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

    for (int r = tid; r < BM; r += TILE_THREADS) {
        int64_t src = -1;
        if (r < nrows) {
            int64_t cr = row0 + r;
            src = p.x_rows ? (int64_t)(p.x_rows[cr] / p.x_row_div) : cr;
        }
        src_row[r] = src;
    }

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++)
            acc[i][j] = 0.0f;

    __syncthreads();
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        for (int idx = tid; idx < BM * BK; idx += TILE_THREADS) {
            int r = idx / BK, kk = idx % BK;
            int64_t src = src_row[r];
            As[kk][r] = (src >= 0 && k0 + kk < K) ? p.x[src * K + k0 + kk] : 0.0f;
        }
        for (int idx = tid; idx < BN * (BK / 8); idx += TILE_THREADS) {
            int nn = idx / (BK / 8), c = idx % (BK / 8);
            int64_t n = n0 + nn, k = k0 + c * 8;
            float v[8];
            if (n < N && p.vec && k < K) {
                w_load8<FMT>(w, n, k, K, v);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    v[j] = (n < N && k + j < K) ? w_load1<FMT>(w, n, k + j, K) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < 8; j++)
                Bs[c * 8 + j][nn] = v[j];
        }
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < BK; kk++) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; i++)
                a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < TN; j++)
                b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    const float s2 = FMT == WEIGHT_NVFP4 ? w.scale2 : 1.0f;
#pragma unroll
    for (int i = 0; i < TM; i++) {
        int r = ty + 16 * i;
        if (r >= nrows)
            continue;
        float *yr = p.y + (size_t)(row0 + r) * (size_t)N;
#pragma unroll
        for (int j = 0; j < TN; j++) {
            int64_t n = n0 + tx + 16 * j;
            if (n < N)
                yr[n] = acc[i][j] * s2 + (w.bias ? w.bias[n] : 0.0f);
        }
    }
}

template <int FMT>
cudaError_t launch_tiled(cudaStream_t stream, const tiled_params &p, int max_tiles, enum cuda_gemm_tile tile)
{
    const int bn = 64;
    int64_t n_tiles_n = (p.N + bn - 1) / bn;
    if (max_tiles <= 0)
        return cudaSuccess;
    if (n_tiles_n > 65535)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)max_tiles, (unsigned)n_tiles_n);
    switch (tile) {
    case CUDA_GEMM_16x64: gemm_tiled_kernel<FMT, 16, 64><<<grid, TILE_THREADS, 0, stream>>>(p); break;
    case CUDA_GEMM_32x64: gemm_tiled_kernel<FMT, 32, 64><<<grid, TILE_THREADS, 0, stream>>>(p); break;
    case CUDA_GEMM_64x64: gemm_tiled_kernel<FMT, 64, 64><<<grid, TILE_THREADS, 0, stream>>>(p); break;
    default: return cudaErrorInvalidValue;
    }
    return CUDA_LAUNCH_RESULT();
}

cudaError_t launch_tiled_fmt(cudaStream_t stream, enum weight_format fmt, const tiled_params &p,
                             int max_tiles, enum cuda_gemm_tile tile)
{
    switch (fmt) {
    case WEIGHT_F32: return launch_tiled<WEIGHT_F32>(stream, p, max_tiles, tile);
    case WEIGHT_BF16: return launch_tiled<WEIGHT_BF16>(stream, p, max_tiles, tile);
    case WEIGHT_F16: return launch_tiled<WEIGHT_F16>(stream, p, max_tiles, tile);
    case WEIGHT_FP8_BLOCK: return launch_tiled<WEIGHT_FP8_BLOCK>(stream, p, max_tiles, tile);
    case WEIGHT_NVFP4: return launch_tiled<WEIGHT_NVFP4>(stream, p, max_tiles, tile);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

extern "C" int cuda_gemm_tile_rows(enum cuda_gemm_tile t)
{
    return t == CUDA_GEMM_16x64 ? 16 : t == CUDA_GEMM_32x64 ? 32 : 64;
}

extern "C" cudaError_t cuda_gemm(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                                 int64_t N, int64_t K, const float *x, int m, float *y,
                                 enum cuda_gemm_tile tile)
{
    if (m <= 0 || N <= 0)
        return cudaSuccess;
    if (fmt == WEIGHT_NVFP4 && K % 16)
        return cudaErrorInvalidValue;
    int vec = K % 8 == 0;
    if (m <= GEMV_MAX_M) {
        int vx = vec && ((uintptr_t)x % 16 == 0);
        int64_t blocks = (N + GEMV_THREADS / 32 - 1) / (GEMV_THREADS / 32);
        if (blocks > 0x7fffffff)
            return cudaErrorInvalidValue;
        switch (fmt) {
        case WEIGHT_F32:
            gemv_kernel<WEIGHT_F32><<<(unsigned)blocks, GEMV_THREADS, 0, stream>>>(*w, N, K, x, m, vx, y);
            break;
        case WEIGHT_BF16:
            gemv_kernel<WEIGHT_BF16><<<(unsigned)blocks, GEMV_THREADS, 0, stream>>>(*w, N, K, x, m, vx, y);
            break;
        case WEIGHT_F16:
            gemv_kernel<WEIGHT_F16><<<(unsigned)blocks, GEMV_THREADS, 0, stream>>>(*w, N, K, x, m, vx, y);
            break;
        case WEIGHT_FP8_BLOCK:
            gemv_kernel<WEIGHT_FP8_BLOCK>
                <<<(unsigned)blocks, GEMV_THREADS, 0, stream>>>(*w, N, K, x, m, vx, y);
            break;
        case WEIGHT_NVFP4:
            gemv_kernel<WEIGHT_NVFP4><<<(unsigned)blocks, GEMV_THREADS, 0, stream>>>(*w, N, K, x, m, vx, y);
            break;
        default: return cudaErrorInvalidValue;
        }
        return CUDA_LAUNCH_RESULT();
    }
    tiled_params p = {};
    p.w = *w;
    p.N = N;
    p.K = K;
    p.x = x;
    p.x_row_div = 1;
    p.m = m;
    p.y = y;
    p.vec = vec;
    int bm = cuda_gemm_tile_rows(tile);
    return launch_tiled_fmt(stream, fmt, p, (m + bm - 1) / bm, tile);
}

extern "C" cudaError_t cuda_gemm_grouped(cudaStream_t stream, enum weight_format fmt,
                                         const struct cuda_wdev *table, int64_t N, int64_t K, const float *x,
                                         const int32_t *x_rows, int x_row_div, const int32_t *tiles,
                                         const int32_t *n_tiles, int max_tiles, float *y,
                                         enum cuda_gemm_tile tile)
{
    if (N <= 0 || max_tiles <= 0)
        return cudaSuccess;
    if ((fmt == WEIGHT_NVFP4 && K % 16) || x_row_div < 1)
        return cudaErrorInvalidValue;
    tiled_params p = {};
    p.table = table;
    p.N = N;
    p.K = K;
    p.x = x;
    p.x_rows = x_rows;
    p.x_row_div = x_row_div;
    p.tiles = tiles;
    p.n_tiles = n_tiles;
    p.y = y;
    p.vec = K % 8 == 0;
    return launch_tiled_fmt(stream, fmt, p, max_tiles, tile);
}
