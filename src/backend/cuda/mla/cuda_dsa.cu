/* cuda_dsa.cu — the DSA indexer of glm_moe_dsa: its key LayerNorm, scores and top-k, fp32.
 *
 *  - layernorm: one block per row, mean and variance in double (as the CPU takes them),
 *    then w * ((x - mean) * inv) + b rounded step by step like the CPU's C code. The
 *    indexer's k_norm is the only LayerNorm of the supported families, hence here.
 *  - dsa_score: I(t, j) = sum_h (w[t, h] * head_scale) * relu(score_scale * q[t, h] . k_j),
 *    one key per thread, `keys` keys staged per step, the query's heads and weights in
 *    shared memory. Every sum runs in the CPU reference's order with fmaf, so the scores
 *    are bit-identical to cpu_mla.c's and both backends select the same keys (a tie
 *    broken differently would change a whole attention row). Rows whose query has at most
 *    topk causal keys are not scored: every key is kept. Blocks stride over the keys, so
 *    the grid does not depend on the context length.
 *  - dsa_topk: one block per query row: a 4-pass radix select (8 bits per pass) over an
 *    order-preserving integer image of the scores finds the topk-th largest value; keys
 *    above it and the lowest-positioned keys equal to it are written in ascending
 *    position order (two block-wide prefix sums), which is exactly the CPU's rule.
 *    Rows past TOPK_THREADS x 16 keys (read from the row each pass, one SM doing all the
 *    work at batch 1) start from an 11-bit histogram of the row that dsa_hist_kernel builds
 *    over many blocks; the keys of its threshold bin are gathered into shared memory and the
 *    remaining 21 bits are selected there, so the row is read twice more instead of 4 passes.
 * The keys are f32, bf16 or fp8 rows (cuda_latent.cuh decodes them as the CPU does).
 * Scores live in a scratch of (rows, ctx) floats, ctx = the longest context a block table
 * can hold; the host runs the rows in chunks that keep it bounded.
 *
 * Shared memory of dsa_score (floats): q[H_I][D_I], w[H_I], K[keys][D_I + 1], or none
 * for the unstaged variant — plan_dsa_index_smem() in the planner is the same formula.
 */
#include "backend/cuda/mla/mla.h"
#include <math.h>

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/mla/cuda_latent.cuh"
extern "C" {
#include "plan/plan.h"
}

namespace
{

constexpr int TOPK_THREADS = 1024;
constexpr int DSA_WARPS = 8; /* dsa_score_warp_kernel: warps (keys in flight) per block */

__global__ void layernorm_kernel(const float *x, const float *w, const float *b, int dim, float eps, float *y)
{
    pdl_wait_trigger_small();
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    double sum = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        sum += (double)xr[j];
    const float mean = (float)(block_sum_double(sum) / dim);
    double ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        double c = (double)xr[j] - (double)mean;
        ss += c * c;
    }
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(block_sum_double(ss) / dim), eps)));
    for (int j = threadIdx.x; j < dim; j += blockDim.x) /* x == y: each thread rereads only its own */
        yr[j] = __fadd_rn(__fmul_rn(w[j], __fmul_rn(__fsub_rn(xr[j], mean), inv)), b[j]);
}

struct score_params {
    const float *q;       /* (T, HI, DI) */
    const float *w;       /* (T, HI) */
    cache_rows index_k;  /* (slots, DI) */
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size;
    int HI, DI, topk, keys;
    float head_scale, score_scale;
    int row0;      /* first token of this chunk */
    int ctx;       /* scratch row length */
    float *scores; /* (chunk rows, ctx) */
};

/* grid (key blocks, chunk rows); blockDim.x == keys. STAGED: the query's heads and weights
 * and each step's keys in shared memory; otherwise everything is read from global memory. */
template <bool STAGED>
__global__ void dsa_score_kernel(score_params p)
{
    extern __shared__ float smem[];
    const int t = p.row0 + blockIdx.y, n = dsa_row_len(p.pos[t], p.ctx);
    if (n <= p.topk)
        return; /* every key is kept: dsa_topk writes 0..pos without scores */
    const int HI = p.HI, DI = p.DI, TN = p.keys;
    const float *q = p.q + (size_t)t * HI * DI, *wt = p.w + (size_t)t * HI;
    float *qs = smem;
    float *ws = qs + (size_t)HI * DI;
    float *ks = ws + HI;
    if (STAGED) {
        for (int i = threadIdx.x; i < HI * DI; i += blockDim.x)
            qs[i] = q[i];
        for (int h = threadIdx.x; h < HI; h += blockDim.x)
            ws[h] = __fmul_rn(wt[h], p.head_scale);
    }
    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    float *row = p.scores + (size_t)blockIdx.y * p.ctx;
    for (int k0 = blockIdx.x * TN; k0 < n; k0 += gridDim.x * TN) {
        const int nk = n - k0 < TN ? n - k0 : TN;
        if (STAGED) {
            __syncthreads(); /* the previous step's keys are consumed (and q, w are staged) */
            for (int i = threadIdx.x; i < nk * DI; i += blockDim.x) {
                int jj = i / DI, d = i % DI, kp = k0 + jj;
                size_t slot = (size_t)blocks[kp / p.block_size] * p.block_size + (size_t)(kp % p.block_size);
                ks[(size_t)jj * (DI + 1) + d] = cache_get(p.index_k, slot, d);
            }
            __syncthreads();
        }
        const int jj = threadIdx.x;
        if (jj < nk) {
            const float *k = ks + (size_t)jj * (DI + 1); /* STAGED */
            size_t kslot = 0;                            /* !STAGED: the key's slot */
            if (!STAGED) {
                int kp = k0 + jj;
                kslot = (size_t)blocks[kp / p.block_size] * p.block_size + (size_t)(kp % p.block_size);
            }
            float s = 0.0f;
            for (int h = 0; h < HI; h++) {
                const float *qh = (STAGED ? qs : q) + (size_t)h * DI;
                float dot = 0.0f;
                for (int d = 0; d < DI; d++)
                    dot = fmaf(qh[d], STAGED ? k[d] : cache_get(p.index_k, kslot, d), dot);
                float r = __fmul_rn(dot, p.score_scale);
                r = r > 0.0f ? r : 0.0f;
                s = fmaf(STAGED ? ws[h] : __fmul_rn(wt[h], p.head_scale), r, s);
            }
            row[k0 + jj] = s;
        }
    }
}

/* grid (key blocks, chunk rows), DSA_WARPS warps: a warp per key, lane h the dot product of head
 * h (h += 32 past 32 heads), then the heads' terms summed in head order like the CPU, so the
 * score is bit-identical to dsa_score_kernel's; key j of row t goes to warp j % DSA_WARPS of
 * block (j / DSA_WARPS) % gridDim.x. Shared memory (floats): q[HI][DI + 1] (+1: lanes read
 * different heads' rows in distinct banks), w[HI], per warp one key row [DI] and its terms [HI]. */
__global__ void dsa_score_warp_kernel(score_params p)
{
    extern __shared__ float smem[];
    const int t = p.row0 + blockIdx.y, n = dsa_row_len(p.pos[t], p.ctx);
    if (n <= p.topk)
        return;
    const int HI = p.HI, DI = p.DI, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float *q = p.q + (size_t)t * HI * DI, *wt = p.w + (size_t)t * HI;
    float *qs = smem, *ws = qs + (size_t)HI * (DI + 1), *ks = ws + HI + (size_t)warp * (DI + HI), *rs = ks + DI;
    for (int i = threadIdx.x; i < HI * DI; i += blockDim.x)
        qs[(i / DI) * (DI + 1) + i % DI] = q[i];
    for (int h = threadIdx.x; h < HI; h += blockDim.x)
        ws[h] = __fmul_rn(wt[h], p.head_scale);
    __syncthreads();
    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    float *row = p.scores + (size_t)blockIdx.y * p.ctx;
    for (int j = blockIdx.x * DSA_WARPS + warp; j < n; j += gridDim.x * DSA_WARPS) {
        const size_t slot = (size_t)blocks[j / p.block_size] * p.block_size + (size_t)(j % p.block_size);
        if (DI % 4 == 0) { /* 4 values a load (the per-value reads cost fp8 keys 20% at 32768 keys) */
            for (int d4 = lane; d4 < DI / 4; d4 += 32) {
                float v[4];
                cache_get4(p.index_k, slot, d4, v);
                ks[4 * d4] = v[0], ks[4 * d4 + 1] = v[1], ks[4 * d4 + 2] = v[2], ks[4 * d4 + 3] = v[3];
            }
        } else {
            for (int d = lane; d < DI; d += 32)
                ks[d] = cache_get(p.index_k, slot, d);
        }
        __syncwarp();
        for (int h = lane; h < HI; h += 32) {
            const float *qh = qs + (size_t)h * (DI + 1);
            float dot = 0.0f;
            for (int d = 0; d < DI; d++)
                dot = fmaf(qh[d], ks[d], dot);
            float r = __fmul_rn(dot, p.score_scale);
            rs[h] = r > 0.0f ? r : 0.0f;
        }
        __syncwarp();
        if (lane == 0) {
            float s = 0.0f;
            for (int h = 0; h < HI; h++)
                s = fmaf(ws[h], rs[h], s);
            row[j] = s;
        }
        __syncwarp(); /* ks and rs are free for the warp's next key */
    }
}

/* Larger score -> larger key; -0 and +0 map to one key. */
__device__ __forceinline__ uint32_t score_key(float s)
{
    uint32_t u = __float_as_uint(s == 0.0f ? 0.0f : s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive prefix sum over the block (blockDim.x a multiple of 32); every thread gets its own. */
__device__ int block_exclusive_scan(int v, int *warp_tot)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    __syncthreads(); /* warp_tot may still be read by a previous call */
    if (lane == 31)
        warp_tot[warp] = x;
    __syncthreads();
    int before = 0;
    for (int i = 0; i < warp; i++)
        before += warp_tot[i];
    return before + x - v;
}

/* A row of at most topk keys keeps them all, in order, -1 past them: true when it was one. */
__device__ bool topk_short_row(int n, int topk, int32_t *out)
{
    if (n > topk)
        return false;
    for (int i = threadIdx.x; i < topk; i += blockDim.x)
        out[i] = i < n ? i : -1;
    return true;
}

/* This thread's contiguous share [j0, j1) of a row of n keys: the selection comes out in
 * ascending position order from block-wide prefix sums over the threads. */
__device__ void thread_chunk(int n, int &j0, int &j1)
{
    const int chunk = (n + blockDim.x - 1) / blockDim.x;
    j0 = threadIdx.x * chunk < n ? threadIdx.x * chunk : n;
    j1 = j0 + chunk < n ? j0 + chunk : n;
}

/* Warp 0: the bin of h[0 .. NB) (counts of the keys matching prefix, by the digit at shift)
 * that holds the remaining-th largest key: lane l sums bins l NB/32 .. (l + 1) NB/32 - 1, a
 * suffix scan over the lanes finds the lane, then that lane walks its bins down. Writes the
 * prefix extended by that digit and the rank left within the bin. */
template <int NB>
__device__ void find_bin(const unsigned *h, int remaining, uint32_t prefix, int shift, uint32_t *s_prefix,
                         int *s_remaining)
{
    constexpr int PER = NB / 32;
    const int lane = (int)threadIdx.x;
    int mine = 0;
    for (int i = 0; i < PER; i++)
        mine += (int)h[PER * lane + i];
    int suffix = mine; /* bins PER lane .. NB - 1 */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_down_sync(0xffffffffu, suffix, o);
        if (lane + o < 32)
            suffix += y;
    }
    const int above_lane = suffix - mine; /* keys in bins past this lane's */
    const unsigned hit = __ballot_sync(0xffffffffu, suffix >= remaining);
    const int l = hit ? 31 - __clz(hit) : 0; /* the highest lane whose suffix reaches it */
    if (lane == l) {
        int above = above_lane, bin = PER * lane + PER - 1;
        for (; bin > PER * lane; bin--) {
            if (above + (int)h[bin] >= remaining)
                break;
            above += (int)h[bin];
        }
        *s_prefix = prefix | ((uint32_t)bin << shift);
        *s_remaining = remaining - above;
    }
}

/* The top HIST_BITS of every key of a long row, counted: grid (blocks a row, chunk rows), HIST_THREADS
 * threads, each block a contiguous share of the row into shared memory, then its nonzero bins
 * added to the row's hist (HIST_BINS counters, zeroed by the caller). */
constexpr int HIST_BITS = 11, HIST_BINS = 1 << HIST_BITS, HIST_SHIFT = 32 - HIST_BITS, HIST_THREADS = 256;
constexpr int CAND_CAP = 4096; /* threshold-bin keys dsa_topk_hist_kernel gathers in shared memory */

__global__ void __launch_bounds__(HIST_THREADS)
    dsa_hist_kernel(const float *scores, int ctx, const int32_t *pos, int row0, int topk, unsigned *hist)
{
    __shared__ unsigned h[HIST_BINS];
    pdl_wait();
    const int t = row0 + blockIdx.y, n = dsa_row_len(pos[t], ctx);
    if (n <= topk)
        return;
    for (int i = threadIdx.x; i < HIST_BINS; i += blockDim.x)
        h[i] = 0;
    __syncthreads();
    const float *row = scores + (size_t)blockIdx.y * ctx;
    const int share = (n + gridDim.x - 1) / gridDim.x, j0 = blockIdx.x * share;
    const int j1 = j0 + share < n ? j0 + share : n;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x)
        atomicAdd(&h[score_key(row[j]) >> HIST_SHIFT], 1u);
    __syncthreads();
    unsigned *g = hist + (size_t)blockIdx.y * HIST_BINS;
    for (int i = threadIdx.x; i < HIST_BINS; i += blockDim.x)
        if (h[i])
            atomicAdd(&g[i], h[i]);
}

/* Keys above the threshold key `prefix` and the first `remaining` equal to it, in ascending
 * position: each thread its contiguous chunk [j0, j1) of the row, score(j) read twice. */
template <class Score>
__device__ void topk_write(Score score, int j0, int j1, uint32_t prefix, int remaining, int *warp_tot,
                           int32_t *out)
{
    int gt = 0, eq = 0;
    for (int j = j0; j < j1; j++) {
        const uint32_t k = score_key(score(j));
        gt += k > prefix;
        eq += k == prefix;
    }
    const int eq_before = block_exclusive_scan(eq, warp_tot);
    int take = remaining - eq_before;
    take = take < 0 ? 0 : take > eq ? eq : take;
    int o = block_exclusive_scan(gt + take, warp_tot);
    for (int j = j0; j < j1; j++) {
        const uint32_t k = score_key(score(j));
        if (k > prefix) {
            out[o++] = j;
        } else if (k == prefix && take > 0) {
            out[o++] = j;
            take--;
        }
    }
}

/* A long row (grid (chunk rows), TOPK_THREADS): the threshold's top 11 bits from hist; then the
 * keys of that bin, gathered into shared memory where at most CAND_CAP (else the row re-read each
 * pass, matching keys counted), give the other 21 bits in 8 + 8 + 5-bit passes. STAGED: the row
 * is first copied (coalesced) into dynamic shared memory, each thread's chunk at threadIdx.x x
 * stride, stride = chunk | 1 (odd: the threads' chunk reads fall in distinct banks), and every
 * later pass reads it there, where the re-read form's thread-chunk loads from L2 were its time. */
template <bool STAGED>
__global__ void __launch_bounds__(TOPK_THREADS)
    dsa_topk_hist_kernel(const float *scores, int ctx, const int32_t *pos, int row0, int topk,
                         const unsigned *hist, int32_t *sel)
{
    extern __shared__ float srow[]; /* STAGED: TOPK_THREADS x stride */
    __shared__ unsigned h[HIST_BINS];
    __shared__ uint32_t cand[CAND_CAP];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining, s_n;
    __shared__ int warp_tot[32];
    pdl_wait_trigger_small();
    const int t = row0 + blockIdx.x, n = dsa_row_len(pos[t], ctx);
    int32_t *out = sel + (size_t)t * topk;
    if (topk_short_row(n, topk, out))
        return;
    const float *row = scores + (size_t)blockIdx.x * ctx;
    for (int i = threadIdx.x; i < HIST_BINS; i += blockDim.x)
        h[i] = hist[(size_t)blockIdx.x * HIST_BINS + i];
    if (threadIdx.x == 0)
        s_n = 0;
    __syncthreads();
    if (threadIdx.x < 32)
        find_bin<HIST_BINS>(h, topk, 0u, HIST_SHIFT, &s_prefix, &s_remaining);
    __syncthreads();
    uint32_t prefix = s_prefix, mask = ~0u << HIST_SHIFT;
    int remaining = s_remaining;
    const int n_cand = (int)h[prefix >> HIST_SHIFT];
    __syncthreads(); /* every thread has read it before the passes reuse h */
    int j0, j1;
    thread_chunk(n, j0, j1);
    const int chunk = (n + blockDim.x - 1) / blockDim.x, stride = chunk | 1;
    if (STAGED) { /* key j to (j / chunk) x stride + j % chunk, the quotient carried along */
        const int dq = (int)blockDim.x / chunk, dr = (int)blockDim.x % chunk;
        int q = (int)threadIdx.x / chunk, r = (int)threadIdx.x % chunk;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            srow[q * stride + r] = row[j];
            q += dq, r += dr;
            if (r >= chunk)
                r -= chunk, q++;
        }
        __syncthreads();
    }
    float *mine = srow + threadIdx.x * stride - j0; /* STAGED: mine[j] for j in [j0, j1) */
    /* every key of the row once, in any order: the thread's chunk in shared memory, or the row
     * from global memory in the block's stride */
    auto each_key = [&](auto f) {
        if (STAGED)
            for (int j = j0; j < j1; j++)
                f(score_key(mine[j]));
        else
            for (int j = threadIdx.x; j < n; j += blockDim.x)
                f(score_key(row[j]));
    };
    const bool gathered = n_cand <= CAND_CAP;
    if (gathered) { /* order does not matter here: the passes only count */
        each_key([&](uint32_t k) {
            if ((k & mask) == prefix)
                cand[atomicAdd(&s_n, 1)] = k;
        });
        __syncthreads();
    }
    const int shifts[3] = {13, 5, 0}, widths[3] = {8, 8, 5};
    for (int ps = 0; ps < 3; ps++) {
        const int shift = shifts[ps];
        const uint32_t dmask = (1u << widths[ps]) - 1u;
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            h[i] = 0;
        __syncthreads();
        if (gathered) {
            for (int i = threadIdx.x; i < n_cand; i += blockDim.x) {
                const uint32_t k = cand[i];
                if ((k & mask) == prefix)
                    atomicAdd(&h[(k >> shift) & dmask], 1u);
            }
        } else {
            each_key([&](uint32_t k) {
                if ((k & mask) == prefix)
                    atomicAdd(&h[(k >> shift) & dmask], 1u);
            });
        }
        __syncthreads();
        if (threadIdx.x < 32)
            find_bin<256>(h, remaining, prefix, shift, &s_prefix, &s_remaining);
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= dmask << shift;
    }
    if (STAGED)
        topk_write([&](int j) { return mine[j]; }, j0, j1, prefix, remaining, warp_tot, out);
    else
        topk_write([&](int j) { return row[j]; }, j0, j1, prefix, remaining, warp_tot, out);
}

/* grid (chunk rows); blockDim.x == TOPK_THREADS. Each thread owns a contiguous chunk of the row
 * (so that the selection comes out in ascending position order), its KPT keys read once into
 * registers (rows of up to TOPK_THREADS x KPT keys): every radix pass works there. */
template <int KPT>
__global__ void __launch_bounds__(TOPK_THREADS)
    dsa_topk_kernel(const float *scores, int ctx, const int32_t *pos, int row0, int topk, int32_t *sel)
{
    __shared__ unsigned hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining;
    __shared__ int warp_tot[32];
    pdl_wait_trigger_small();
    const int t = row0 + blockIdx.x, n = dsa_row_len(pos[t], ctx);
    int32_t *out = sel + (size_t)t * topk;
    if (topk_short_row(n, topk, out))
        return;
    const float *row = scores + (size_t)blockIdx.x * ctx;
    int j0, j1;
    thread_chunk(n, j0, j1);
    uint32_t kr[KPT];
#pragma unroll
    for (int i = 0; i < KPT; i++)
        kr[i] = j0 + i < j1 ? score_key(row[j0 + i]) : 0u;
    uint32_t prefix = 0, mask = 0;
    int remaining = topk; /* rank of the wanted value among those matching prefix */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            hist[i] = 0;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < KPT; i++) {
            const uint32_t k = kr[i];
            const bool in = j0 + i < j1 && (k & mask) == prefix;
            /* one atomic per distinct bin a warp: the scores of a row share a few top bytes, and
             * same-address shared atomics serialise */
            const unsigned bin = in ? (k >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (in && (threadIdx.x % 32) == (unsigned)(__ffs(peers) - 1))
                atomicAdd(&hist[bin], (unsigned)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < 32)
            find_bin<256>(hist, remaining, prefix, shift, &s_prefix, &s_remaining);
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 255u << shift;
    }
    /* prefix: the topk-th largest key; take every key above it and the first `remaining` equal */
    int gt = 0, eq = 0;
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        if (j0 + i < j1) {
            gt += kr[i] > prefix;
            eq += kr[i] == prefix;
        }
    }
    const int eq_before = block_exclusive_scan(eq, warp_tot);
    int take = remaining - eq_before;
    take = take < 0 ? 0 : take > eq ? eq : take;
    int o = block_exclusive_scan(gt + take, warp_tot);
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        if (j0 + i < j1) {
            if (kr[i] > prefix) {
                out[o++] = j0 + i;
            } else if (kr[i] == prefix && take > 0) {
                out[o++] = j0 + i;
                take--;
            }
        }
    }
}

} // namespace

extern "C" cudaError_t cuda_layernorm(cudaStream_t stream, const float *x, const float *w, const float *b, int rows,
                                      int dim, float eps, float *y, int pdl)
{
    if (rows <= 0 || dim <= 0)
        return cudaSuccess;
    unsigned threads = dim >= 512 ? 256u : dim >= 128 ? 128u : 32u;
    return launch_pdl(pdl != 0, layernorm_kernel, dim3((unsigned)rows), dim3(threads), 0, stream, x, w, b, dim, eps, y);
}

extern "C" int cuda_dsa_fit(struct cuda_dsa_cfg *cfg, int idx_heads, int idx_dim, size_t budget)
{
    if (cfg->per_warp) {
        size_t bytes = plan_dsa_warp_smem(DSA_WARPS, idx_heads, idx_dim);
        if (bytes + 256 <= budget) {
            cfg->keys = DSA_WARPS;
            cfg->stages = 1;
            cfg->smem_bytes = bytes;
            return 1;
        }
        cfg->per_warp = 0; /* the key-per-thread kernel's tiles, below */
        cfg->keys = 128;
    }
    int k = cfg->keys < 32 ? 32 : cfg->keys > 1024 ? 1024 : cfg->keys;
    k = k / 32 * 32;
    int st = cfg->stages > 0 ? 1 : 0;
    budget = budget > 256 ? budget - 256 : 0;
    while (plan_dsa_index_smem(k, idx_heads, idx_dim, st) > budget) {
        if (k > 32)
            k = k / 2 / 32 * 32;
        else if (st)
            st = 0, k = cfg->keys < 32 ? 32 : cfg->keys > 1024 ? 1024 : cfg->keys / 32 * 32;
        else
            return 0;
    }
    cfg->keys = k;
    cfg->stages = st;
    cfg->smem_bytes = plan_dsa_index_smem(k, idx_heads, idx_dim, st);
    return 1;
}

extern "C" cudaError_t cuda_dsa_scores(cudaStream_t stream, const float *q_idx, const float *w_idx,
                                       const struct paged_latent *kv, const struct attn_batch *b,
                                       const struct dsa_args *a, int row0, int n_rows, int ctx,
                                       const struct cuda_dsa_cfg *cfg, int key_blocks, float *scores)
{
    if (n_rows <= 0)
        return cudaSuccess;
    int keys = cfg->keys;
    size_t smem = cfg->smem_bytes;
    if (n_rows > 65535 || key_blocks < 1 || !kv->index_k || kv->index_dtype > KV_DTYPE_FP8 ||
        (kv->index_dtype == KV_DTYPE_FP8 && !fp8_dims_ok(a->head_dim, 0)) ||
        (cfg->per_warp ? keys != DSA_WARPS || smem != plan_dsa_warp_smem(DSA_WARPS, a->n_heads, a->head_dim)
                       : keys < 32 || keys > 1024 || smem != plan_dsa_index_smem(keys, a->n_heads, a->head_dim,
                                                                                 cfg->stages)))
        return cudaErrorInvalidValue;
    score_params p;
    p.q = q_idx;
    p.w = w_idx;
    p.index_k = cache_rows_make(kv->index_k, kv->index_dtype, a->head_dim, 0);
    p.pos = b->pos;
    p.seq = b->seq;
    p.table = b->block_table;
    p.max_blocks = b->max_blocks;
    p.block_size = kv->block_size;
    p.HI = a->n_heads;
    p.DI = a->head_dim;
    p.topk = a->topk;
    p.keys = keys;
    p.head_scale = a->head_scale;
    p.score_scale = a->score_scale;
    p.row0 = row0;
    p.ctx = ctx;
    p.scores = scores;
    void (*kernel)(score_params) = cfg->per_warp      ? dsa_score_warp_kernel
                                   : cfg->stages > 0 ? dsa_score_kernel<true>
                                                     : dsa_score_kernel<false>;
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return e;
    }
    dim3 grid((unsigned)key_blocks, (unsigned)n_rows);
    kernel<<<grid, (unsigned)(cfg->per_warp ? DSA_WARPS * 32 : keys), smem, stream>>>(p);
    return CUDA_LAUNCH_RESULT();
}

extern "C" size_t cuda_dsa_topk_hist_floats(int ctx)
{
    return ctx > DSA_TOPK_REG_KEYS ? HIST_BINS : 0;
}

/* dsa_topk_hist_kernel<true>'s dynamic shared memory for rows of up to ctx keys. */
static size_t topk_staged_bytes(int ctx)
{
    const int chunk = (ctx + TOPK_THREADS - 1) / TOPK_THREADS;
    return (size_t)TOPK_THREADS * (size_t)(chunk | 1) * sizeof(float);
}

extern "C" cudaError_t cuda_dsa_topk(cudaStream_t stream, const float *scores, int ctx, const int32_t *pos,
                                     int row0, int n_rows, int topk, int32_t *sel, unsigned *hist,
                                     int sm_count, size_t smem_budget, int pdl)
{
    static_assert(DSA_TOPK_REG_KEYS == TOPK_THREADS * 16, "the register form's longest row");
    if (n_rows <= 0)
        return cudaSuccess;
    if (topk < 1 || (ctx > DSA_TOPK_REG_KEYS && !hist))
        return cudaErrorInvalidValue;
    if (ctx <= DSA_TOPK_REG_KEYS) /* the row's keys in registers (ctx bounds every row's length) */
        return launch_pdl(pdl != 0, ctx <= TOPK_THREADS * 4 ? dsa_topk_kernel<4> : dsa_topk_kernel<16>,
                          dim3((unsigned)n_rows), dim3(TOPK_THREADS), 0, stream, scores, ctx, pos, row0, topk,
                          sel);
    /* the histogram over about two blocks an SM in all, at least 2048 keys a block */
    int per_row = (2 * sm_count + n_rows - 1) / n_rows, most = (ctx + 2047) / 2048;
    per_row = per_row < 1 ? 1 : per_row > most ? most : per_row;
    cudaError_t e = cudaMemsetAsync(hist, 0, (size_t)n_rows * HIST_BINS * sizeof *hist, stream);
    if (e == cudaSuccess)
        e = launch_pdl(false, dsa_hist_kernel, dim3((unsigned)per_row, (unsigned)n_rows), dim3(HIST_THREADS),
                       0, stream, scores, ctx, pos, row0, topk, hist);
    /* the row staged where it fits the budget beside the kernel's static arrays */
    cudaFuncAttributes fa;
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&fa, dsa_topk_hist_kernel<true>);
    const size_t staged = topk_staged_bytes(ctx);
    const bool stage = e == cudaSuccess && fa.sharedSizeBytes + staged + 256 <= smem_budget;
    if (stage)
        e = cudaFuncSetAttribute(dsa_topk_hist_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)staged);
    if (e == cudaSuccess)
        e = launch_pdl(pdl != 0, stage ? dsa_topk_hist_kernel<true> : dsa_topk_hist_kernel<false>,
                       dim3((unsigned)n_rows), dim3(TOPK_THREADS), stage ? staged : 0, stream, scores, ctx,
                       pos, row0, topk, (const unsigned *)hist, sel);
    return e;
}
