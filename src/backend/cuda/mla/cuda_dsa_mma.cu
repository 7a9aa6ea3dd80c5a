/* cuda_dsa_mma.cu — the DSA indexer's scores on bf16 tensor cores (dsa_index_score_mma_bf16).
 *
 * I(t, j) = sum_h (w[t, h] * head_scale) * relu(score_scale * q[t, h] . k_j) as one m16n8k16 MMA
 * chain per 8 keys: A = the query's heads (one or two 16-row tiles, heads past H_I zero), B = 8 keys,
 * K = the D_I dims. The fp32 kernels of cuda_dsa.cu are limited by their multiply-adds (GLM-5 at
 * 32768 keys: 16.8 MB of f32 keys in 59 us, a quarter of the copy bandwidth); here the keys
 * stream from global memory straight into B fragments, so the kernel reads at bandwidth.
 *
 * The sum over dims is order-free, so the dims are permuted the same way in A and B: lane
 * (g, q) = (lane / 4, lane % 4) owns dims [q D_I / 4, (q + 1) D_I / 4) of key g of the tile and
 * of its query heads, and k-step s takes its dims 4s .. 4s + 3 (b0: 4s, 4s + 1; b1: 4s + 2, +3).
 * Each lane thus loads one contiguous quarter row of its key: no shuffles before the MMA.
 *
 * The keys stream at bandwidth only with enough of them in flight: a warp loads TILES tiles of 8
 * keys (its B fragments, 64 registers for bf16) before their first MMA, and the query's fragments
 * (hi + lo: 128 registers, which held the SM to a warp a scheduler) wait in shared memory in
 * fragment order, read back one k-step at a time as 16-byte vectors (one per lane, no bank
 * conflicts) and used for the TILES tiles at once. 4 blocks of 4 warps an SM at <= 128 registers.
 *
 * Precision: the query is split into bf16 hi + lo (two MMAs a product). bf16 keys and fp8 codes
 * (e4m3 -> bf16 is exact; the key's one f32 scale multiplies its dot product) are exact operands;
 * f32 keys are split too (hi x hi + lo x hi + hi x lo). Scores agree with the CPU's to ~1e-6 of
 * their size, not bit for bit: a top-k selection may differ where two scores at the threshold
 * are that close (the op test accepts exactly those differences). */
#include "backend/cuda/mla/mla.h"

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_mma.cuh"
#include "backend/cuda/mla/cuda_latent.cuh"
#include "plan/plan.h"

namespace
{

constexpr int WARPS = CUDA_DSA_MMA_WARPS;
constexpr int KS_MAX = 8; /* k-steps of 16 dims: D_I <= 128 */
constexpr int MT_MAX = 2; /* 16-head tiles: H_I <= 32 */
/* tiles of 8 keys a warp loads at once: f32 keys take hi + lo fragments, twice the registers */
template <int KT> __host__ __device__ constexpr int tiles_of()
{
    return KT == KV_DTYPE_F32 ? 2 : CUDA_DSA_MMA_KEYS / (8 * WARPS);
}

struct mma_params {
    const float *q;      /* (T, HI, DI) */
    const float *w;      /* (T, HI) */
    const uint8_t *keys; /* (slots, row_bytes) */
    int row_bytes;
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size;
    int HI, DI, topk;
    float head_scale, score_scale;
    int row0, ctx;
    float *scores; /* (chunk rows, ctx) */
};

__device__ __forceinline__ uint32_t bf16x2_bits(float a, float b)
{
    /* exact inputs (bf16 values widened, e4m3 values): truncation is the value */
    return (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xffff0000u);
}

/* The lane's quarter of key `slot` for k-steps 0 .. ks - 1 as B fragments (hi; lo for f32). */
template <int KT>
__device__ __forceinline__ void key_load(const mma_params &p, size_t slot, int q4, int ks,
                                         uint32_t bh[KS_MAX][2], uint32_t bl[KS_MAX][2], float &scale)
{
    const int dq = p.DI / 4;
    const uint8_t *row = p.keys + slot * (size_t)p.row_bytes;
    if (KT == KV_DTYPE_BF16) {
        const uint16_t *k = (const uint16_t *)row + (size_t)q4 * dq;
        if (dq % 8 == 0) {
#pragma unroll
            for (int s = 0; s < KS_MAX; s += 2)
                if (s < ks) {
                    const uint4 v = *(const uint4 *)(k + 4 * s);
                    bh[s][0] = v.x, bh[s][1] = v.y, bh[s + 1][0] = v.z, bh[s + 1][1] = v.w;
                }
        } else {
#pragma unroll
            for (int s = 0; s < KS_MAX; s++)
                if (s < ks) {
                    const uint2 v = *(const uint2 *)(k + 4 * s);
                    bh[s][0] = v.x, bh[s][1] = v.y;
                }
        }
        scale = 1.0f;
    } else if (KT == KV_DTYPE_FP8) {
        const uint8_t *k = row + (size_t)q4 * dq;
#pragma unroll
        for (int s = 0; s < KS_MAX; s++)
            if (s < ks) {
                const uint32_t c = *(const uint32_t *)(k + 4 * s);
                bh[s][0] = bf16x2_bits(e4m3_decode(c & 0xffu), e4m3_decode((c >> 8) & 0xffu));
                bh[s][1] = bf16x2_bits(e4m3_decode((c >> 16) & 0xffu), e4m3_decode(c >> 24));
            }
        scale = *(const float *)(row + p.DI); /* D_I <= KV_FP8_BLOCK: one scale a key */
    } else {
        const float *k = (const float *)row + (size_t)q4 * dq;
#pragma unroll
        for (int s = 0; s < KS_MAX; s++)
            if (s < ks) {
                const float4 v = *(const float4 *)(k + 4 * s);
                mma_split_bf16x2(v.x, v.y, bh[s][0], bl[s][0]);
                mma_split_bf16x2(v.z, v.w, bh[s][1], bl[s][1]);
            }
        scale = 1.0f;
    }
}

/* The lane's key of a tile: key j (past n: key 0 again, its scores dropped) -> cache slot. */
__device__ __forceinline__ size_t key_slot(const mma_params &p, const int32_t *blocks, int j, int n)
{
    const int jk = j < n ? j : 0;
    return (size_t)blocks[jk / p.block_size] * p.block_size + (size_t)(jk % p.block_size);
}

/* grid (key blocks, chunk rows), WARPS warps; a warp scores TILES x 8 keys a step, its groups
 * striding over the blocks' warps. MT: 16-head tiles (1 for H_I <= 16). */
template <int KT, int MT>
__global__ void __launch_bounds__(WARPS * 32, CUDA_DSA_MMA_BLOCKS_SM) dsa_score_mma_kernel(mma_params p)
{
    constexpr int TILES = tiles_of<KT>();
    /* query fragments, [m][s][hi, lo][lane]: the four registers of lane's A fragment */
    __shared__ uint4 qa[MT][KS_MAX][2][32];
    static_assert(sizeof qa == PLAN_DSA_MMA_SMEM(16 * MT), "the plan's formula is this layout");
    pdl_wait(); /* PDL: the previous kernel's writes are visible from here */
    const int t = p.row0 + blockIdx.y, n = dsa_row_len(p.pos[t], p.ctx);
    if (n <= p.topk)
        return; /* every key is kept: dsa_topk writes 0..pos without scores */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q4 = lane % 4;
    const int HI = p.HI, ks = p.DI / 16, dq = p.DI / 4;
    /* A fragment registers: rows = heads 16m + g (regs 0, 2) and 16m + g + 8 (regs 1, 3); regs
     * 0, 1 hold dims 4s, 4s + 1 of the lane's quarter, regs 2, 3 dims 4s + 2, 4s + 3 */
    for (int i = threadIdx.x; i < MT * ks * 32; i += WARPS * 32) {
        const int m = i / (ks * 32), s = i / 32 % ks, l = i % 32, lg = l / 4, lq = l % 4;
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int h = 16 * m + lg + 8 * half;
            const float4 v =
                h < HI ? *(const float4 *)(p.q + ((size_t)t * HI + h) * p.DI + (size_t)lq * dq + 4 * s)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
            mma_split_bf16x2(v.x, v.y, hi[half], lo[half]);
            mma_split_bf16x2(v.z, v.w, hi[2 + half], lo[2 + half]);
        }
        qa[m][s][0][l] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        qa[m][s][1][l] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    float wt[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int h = 16 * m + g + 8 * half;
            wt[m][half] = h < HI ? __fmul_rn(p.w[(size_t)t * HI + h], p.head_scale) : 0.0f;
        }
    __syncthreads();
    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    float *row = p.scores + (size_t)blockIdx.y * p.ctx;
    const int groups = (n + 8 * TILES - 1) / (8 * TILES);
    for (int grp = blockIdx.x * WARPS + warp; grp < groups; grp += gridDim.x * WARPS) {
        const int key0 = grp * 8 * TILES;
        uint32_t bh[TILES][KS_MAX][2], bl[TILES][KS_MAX][2];
        float scale[TILES];
#pragma unroll
        for (int i = 0; i < TILES; i++)
            key_load<KT>(p, key_slot(p, blocks, key0 + 8 * i + g, n), q4, ks, bh[i], bl[i], scale[i]);
        float c[TILES][MT][4];
#pragma unroll
        for (int i = 0; i < TILES; i++)
#pragma unroll
            for (int m = 0; m < MT; m++)
                c[i][m][0] = c[i][m][1] = c[i][m][2] = c[i][m][3] = 0.0f;
#pragma unroll
        for (int s = 0; s < KS_MAX; s++)
            if (s < ks)
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const uint4 h4 = qa[m][s][0][lane], l4 = qa[m][s][1][lane];
                    const uint32_t ah[4] = {h4.x, h4.y, h4.z, h4.w}, al[4] = {l4.x, l4.y, l4.z, l4.w};
#pragma unroll
                    for (int i = 0; i < TILES; i++) {
                        mma_bf16_16816(c[i][m], ah, bh[i][s][0], bh[i][s][1]);
                        mma_bf16_16816(c[i][m], al, bh[i][s][0], bh[i][s][1]);
                        if (KT == KV_DTYPE_F32)
                            mma_bf16_16816(c[i][m], ah, bl[i][s][0], bl[i][s][1]);
                    }
                }
#pragma unroll
        for (int i = 0; i < TILES; i++) {
            /* c[i][m]: (head 16m + g, keys 2 q4, 2 q4 + 1) in regs 0, 1; head 16m + g + 8 in regs 2, 3 */
            const float sc0 = __shfl_sync(0xffffffffu, scale[i], 8 * q4) * p.score_scale;
            const float sc1 = __shfl_sync(0xffffffffu, scale[i], 8 * q4 + 4) * p.score_scale;
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int m = 0; m < MT; m++) {
                s0 += wt[m][0] * fmaxf(c[i][m][0] * sc0, 0.0f) + wt[m][1] * fmaxf(c[i][m][2] * sc0, 0.0f);
                s1 += wt[m][0] * fmaxf(c[i][m][1] * sc1, 0.0f) + wt[m][1] * fmaxf(c[i][m][3] * sc1, 0.0f);
            }
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                s0 += __shfl_xor_sync(0xffffffffu, s0, o);
                s1 += __shfl_xor_sync(0xffffffffu, s1, o);
            }
            const int j0 = key0 + 8 * i + 2 * q4;
            if (g == 0 && j0 < n)
                row[j0] = s0;
            if (g == 0 && j0 + 1 < n)
                row[j0 + 1] = s1;
        }
    }
}

} // namespace

extern "C" int cuda_dsa_mma_fits(int idx_heads, int idx_dim, enum kv_dtype keys)
{
    return idx_heads >= 1 && idx_heads <= 16 * MT_MAX && idx_dim % 16 == 0 && idx_dim >= 16 &&
           idx_dim <= 16 * KS_MAX && keys <= KV_DTYPE_FP8 && idx_dim <= KV_FP8_BLOCK;
}

extern "C" cudaError_t cuda_dsa_scores_mma(cudaStream_t stream, const float *q_idx, const float *w_idx,
                                           const struct paged_latent *kv, const struct attn_batch *b,
                                           const struct dsa_args *a, int row0, int n_rows, int ctx,
                                           int key_blocks, float *scores, int pdl)
{
    if (n_rows <= 0)
        return cudaSuccess;
    if (n_rows > 65535 || key_blocks < 1 || !kv->index_k ||
        !cuda_dsa_mma_fits(a->n_heads, a->head_dim, kv->index_dtype))
        return cudaErrorInvalidValue;
    mma_params p;
    p.q = q_idx;
    p.w = w_idx;
    p.keys = (const uint8_t *)kv->index_k;
    p.row_bytes = (int)kv_index_row_bytes(kv->index_dtype, a->head_dim);
    p.pos = b->pos;
    p.seq = b->seq;
    p.table = b->block_table;
    p.max_blocks = b->max_blocks;
    p.block_size = kv->block_size;
    p.HI = a->n_heads;
    p.DI = a->head_dim;
    p.topk = a->topk;
    p.head_scale = a->head_scale;
    p.score_scale = a->score_scale;
    p.row0 = row0;
    p.ctx = ctx;
    p.scores = scores;
    void (*kernel)(mma_params);
    if (a->n_heads <= 16)
        kernel = kv->index_dtype == KV_DTYPE_BF16  ? dsa_score_mma_kernel<KV_DTYPE_BF16, 1>
                 : kv->index_dtype == KV_DTYPE_FP8 ? dsa_score_mma_kernel<KV_DTYPE_FP8, 1>
                                                   : dsa_score_mma_kernel<KV_DTYPE_F32, 1>;
    else
        kernel = kv->index_dtype == KV_DTYPE_BF16  ? dsa_score_mma_kernel<KV_DTYPE_BF16, 2>
                 : kv->index_dtype == KV_DTYPE_FP8 ? dsa_score_mma_kernel<KV_DTYPE_FP8, 2>
                                                   : dsa_score_mma_kernel<KV_DTYPE_F32, 2>;
    dim3 grid((unsigned)key_blocks, (unsigned)n_rows);
    return launch_pdl(pdl != 0, kernel, grid, dim3(WARPS * 32), 0, stream, p);
}
