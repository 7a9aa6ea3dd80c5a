/* cuda_moe_grouped_mma.cu — the routed experts sorted by expert, for a few tokens an expert, on bf16
 * tensor cores: each expert's weights stream once and up to 8 of its tokens share every mma.
 *
 * Why: past the pair kernels' limit a batch is sorted by expert and run through the grouped GEMMs,
 * whose 64-row wgmma tiles hold 2-4 real rows at decode (GLM-5 at batch 64: 512 pairs over 256
 * experts, ~2.3 an expert). Their dequantisation of every weight into shared memory is then work
 * for 2 rows, and the H200 ran them at ~0.93 TB/s. Here the weights go straight from registers
 * into the mma's B operand as in cuda_decode_mma.cu (~2.4 instructions a weight, no shared-memory
 * round trip), and the tile's tokens are the A operand's rows (token g's hi in row g, its lo in
 * row g + 8, as xfrag_group_tokens), so a tile of 8 tokens costs what one token costs.
 *
 * A block: 8 warps, each 8 rows of one weight, over one row tile of cuda_moe_sort (an expert, up
 * to 8 compact rows). x is staged GG_SEG groups (GG_SEG x 128 k) of the tile's tokens at a time,
 * double-buffered: the next segment's x is loaded into registers while this one is multiplied and
 * stored to the other buffer after it, one barrier a segment. The weights keep GG_U groups in
 * flight a warp the whole way (the loads run on across the barriers). Static shared memory only:
 * 2 x 8 tokens x GG_SEG x 512 bytes.
 */
#include "backend/cuda/decode/decode.h"
#include "backend/cuda/decode/cuda_decode_mma.cuh"

namespace
{

/* GG_U groups in flight a warp; a segment is half of them, so that each unrolled round of GG_U
 * groups crosses exactly one segment boundary at a fixed place */
enum { GG_SEG = GG_SEG_GROUPS, GG_U = 2 * GG_SEG, GG_WARPS = MD_WARPS, GG_ROWS = 8 * GG_WARPS };
/* x items (4 floats of one token, xfrag_load) a thread stages a segment: 8 tokens x GG_SEG x 32 */
enum { GG_ITEMS = GG_TILE_ROWS * GG_SEG * 32 / MD_THREADS };
static_assert(GG_TILE_ROWS * GG_SEG * 32 % MD_THREADS == 0, "x items split evenly");
static_assert(GG_TILE_ROWS == 8, "a tile's tokens are the mma's 8 A rows (and their lo halves)");

struct gg_params {
    const cuda_wdev *table[2]; /* per weight: n_experts entries, indexed by expert */
    float *y[2];               /* per weight: compact rows x N */
    int n_w;
    int64_t N, K;
    const float *x;
    const int32_t *sorted_pair; /* compact row -> pair (x row pair / n_used); NULL: x row = compact row */
    int n_used;
    const int32_t *tiles, *n_tiles; /* cuda_moe_sort's (expert, first row, rows) */
};

/* One segment's x items of the tile's tokens into registers: item m of this thread is token
 * idx / (GG_SEG * 32), fragment entry idx % (GG_SEG * 32) (xfrag_load's numbering). */
__device__ __forceinline__ void seg_load(const gg_params &p, const int *rows, int T, int s, float2 (&a)[GG_ITEMS],
                                         float2 (&b)[GG_ITEMS])
{
    const int64_t k0 = (int64_t)s * GG_SEG * 128, G = p.K / 128;
    const int len = (int)((G - (int64_t)s * GG_SEG < GG_SEG ? G - (int64_t)s * GG_SEG : GG_SEG) * 32);
#pragma unroll
    for (int m = 0; m < GG_ITEMS; m++) {
        const int idx = threadIdx.x + m * MD_THREADS, tok = idx / (GG_SEG * 32), it = idx % (GG_SEG * 32);
        if (tok < T && it < len)
            xfrag_load(p.x + (size_t)rows[tok] * (size_t)p.K + k0, it, a[m], b[m]);
    }
}

__device__ __forceinline__ void seg_put(uint4 (*buf)[GG_SEG * 32], int T, const float2 (&a)[GG_ITEMS],
                                        const float2 (&b)[GG_ITEMS])
{
#pragma unroll
    for (int m = 0; m < GG_ITEMS; m++) {
        const int idx = threadIdx.x + m * MD_THREADS, tok = idx / (GG_SEG * 32), it = idx % (GG_SEG * 32);
        if (tok < T) /* entries past K's end are never read */
            xfrag_put((uint2 *)buf[tok], it, a[m], b[m]);
    }
}

/* grid (n_w x ceil(N / GG_ROWS), max_tiles); blocks past *n_tiles return at once */
__global__ void __launch_bounds__(MD_THREADS, 2) moe_grouped_mma_kernel(const __grid_constant__ gg_params p)
{
    __shared__ uint4 xs[2][GG_TILE_ROWS][GG_SEG * 32];
    __shared__ int rows[GG_TILE_ROWS];
    pdl_wait(); /* the sort (and x) come from the kernels before */
    const int tile = blockIdx.y;
    if (tile >= *p.n_tiles)
        return;
    const int e = p.tiles[3 * tile], r0 = p.tiles[3 * tile + 1], T = p.tiles[3 * tile + 2];
    const int64_t bpw = (p.N + GG_ROWS - 1) / GG_ROWS;
    const int j = (int)(blockIdx.x / bpw);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t n0 = (int64_t)(blockIdx.x % bpw) * GG_ROWS + warp * 8, row = n0 + g;
    const bool ok = row < p.N;
    const cuda_wdev w = p.table[j][e];
    const int G = (int)(p.K / 128), S = (G + GG_SEG - 1) / GG_SEG;
    chunk16 q[GG_U];
    rows8_prefetch<GG_U>(w, row, ok, p.K, 0, G, q);
    xfrag_zeros_init();
    if ((int)threadIdx.x < T)
        rows[threadIdx.x] = p.sorted_pair ? p.sorted_pair[r0 + threadIdx.x] / p.n_used : r0 + (int)threadIdx.x;
    __syncthreads();
    float2 xa[GG_ITEMS], xb[GG_ITEMS];
    seg_load(p, rows, T, 0, xa, xb);
    seg_put(xs[0], T, xa, xb);
    if (S > 1)
        seg_load(p, rows, T, 1, xa, xb);
    __syncthreads();
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i0 = 0; i0 < G; i0 += GG_U) {
#pragma unroll
        for (int u = 0; u < GG_U; u++) {
            const int i = i0 + u, s = i / GG_SEG;
            if (i >= G)
                break; /* uniform: i depends on the loop alone */
            if (u % GG_SEG == 0 && s > 0) {
                /* segment s starts: its x (loaded during segment s - 1) into the buffer segment
                 * s - 2 used, which every warp finished before the last barrier */
                seg_put(xs[s & 1], T, xa, xb);
                if (s + 1 < S)
                    seg_load(p, rows, T, s + 1, xa, xb);
                __syncthreads();
            }
            const uint4 *xg = g < T ? xs[s & 1][g] + (i % GG_SEG) * 32 : xfrag_zeros();
            chunk_mma(q[u], xg, lane, d0, d1);
            if (i + GG_U < G)
                q[u] = load_chunk(w, row, 4 * (i + GG_U) + t, p.K, ok);
        }
    }
    pdl_trigger(); /* late: see pdl_trigger() */
    if (g >= T)
        return;
    /* lane (g, t): token g's rows n0 + 2t and n0 + 2t + 1 (C rows g and g + 8: its hi and lo) */
    const float r[2] = {(d0[0] + d1[0]) + (d0[2] + d1[2]), (d0[1] + d1[1]) + (d0[3] + d1[3])};
    float *y = p.y[j] + (size_t)(r0 + g) * (size_t)p.N;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int64_t n = n0 + 2 * t + c;
        if (n < p.N)
            y[n] = r[c] * (0x1p62f * w.scale2) + (w.bias ? w.bias[n] : 0.0f);
    }
}

} // namespace

extern "C" cudaError_t cuda_moe_grouped_mma(cudaStream_t stream, int n_w, const struct cuda_wdev *const *tables,
                                            int64_t N, int64_t K, const float *x, const int32_t *sorted_pair,
                                            int n_used, const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
                                            float *const *y, int pdl)
{
    if (max_tiles <= 0 || N <= 0)
        return cudaSuccess;
    if (n_w < 1 || n_w > 2 || K <= 0 || K % 128 || max_tiles > 65535 || n_used < 1)
        return cudaErrorInvalidValue;
    gg_params p = {};
    for (int j = 0; j < n_w; j++)
        p.table[j] = tables[j], p.y[j] = y[j];
    p.n_w = n_w;
    p.N = N;
    p.K = K;
    p.x = x;
    p.sorted_pair = sorted_pair;
    p.n_used = n_used;
    p.tiles = tiles;
    p.n_tiles = n_tiles;
    const int64_t blocks = (int64_t)n_w * ((N + GG_ROWS - 1) / GG_ROWS);
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidValue;
    return launch_pdl(pdl != 0, moe_grouped_mma_kernel, dim3((unsigned)blocks, (unsigned)max_tiles),
                      dim3(MD_THREADS), 0, stream, p);
}
