/* cuda_mla.cu — MLA (glm_moe_dsa) over the paged latent cache, fp32, absorbed weights.
 *
 * Four kernels (and mla_attn's split merge), the same algorithm as the CPU reference (cpu_mla.c):
 *  - mla_store: [w * rmsnorm(c_kv) | k_r] (+ the indexer key) into the cache slots; the
 *    norm's sum of squares in double, as cuda_norm.cu and the CPU take it.
 *  - mla_absorb: q_abs[t, h, :R] = W_uk_h^T q_nope[t, h] straight from kv_b_proj in its
 *    stored format (8 latent columns a thread over one of 32 slices of the nope dims, a
 *    tile of tokens per block; the slices then add up), and the rope part copied after it.
 *  - mla_attn: attention in latent space. A block takes `rows` heads of ONE token, walks
 *    that token's keys (its DSA selection, or 0..pos) in steps of `keys`, staging each
 *    key's latent row [c_kv | k_r] once in shared memory for all its heads; the values are
 *    the c_kv part of the same staged rows. Online softmax; with n_splits > 1 each block
 *    takes one contiguous share of the key list and mla_merge combines the partials (decode:
 *    one token has too few heads to fill the GPU).
 *  - mla_expand: out[t, h*v + j] = W_uv_h[j, :] . o_lat[t, h, :], one warp per output
 *    feature for a tile of tokens, 8 consecutive columns a lane, kv_b_proj read in its
 *    stored format.
 * NVFP4's global scale is applied per element (e2m1 * e4m3 * scale2), exactly as
 * weight_dequant_row does, so both backends see the same weight values.
 *
 * Shared memory of mla_attn (floats): Q[rows][Dk], O[rows][R], K[keys][Dk + 1] (+1: the
 * lanes of a warp read different keys' rows without bank conflicts), P[warps][keys],
 * m[rows], l[rows]; the unstaged variant (a budget too small for any tile) keeps only
 * P, m, l and the step's key slots — plan_mla_attention_smem() is the same formula.
 *
 * The latent rows are f32, bf16 or fp8 (cuda_latent.cuh); the tensor-core form over a bf16 or
 * fp8 cache is cuda_mla_mma.cu. Deliberately not here: an expanded-K/V prefill path.
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

constexpr int ABSORB_COLS = 64;  /* latent columns per absorb block: 8 groups of 8 */
constexpr int ABSORB_WARPS = 8;  /* its 256 threads: 32 slices of the nope dims x 8 groups */
constexpr int TOK_TILE = 8;      /* tokens per absorb / expand block */
constexpr int EXPAND_WARPS = 8;
constexpr int MERGE_COLS = 128; /* latent columns a merge block */
constexpr int STORE_THREADS = 256;
/* One token: the weight rows an absorb thread (nope / 32 of them) or the words an expand lane
 * (R / 256 for each of its RPW rows) reads, loaded before q / o_lat is staged and before the wait
 * on the kernel that wrote it: the block then pays one DRAM round trip, overlapped with that
 * kernel's tail, instead of one per unrolled pair of loads after an L2 round trip. */
constexpr int ABSORB_PRE_ROWS = 8;  /* nope <= 256 */
constexpr int EXPAND_PRE_ITERS = 2; /* R <= 512 */

struct mla_shape {
    int H, nope, rope, v, R;
};

/* grid (tokens), STORE_THREADS threads; smem v[R + rope]: the normalised row, which the warps
 * then write in the cache's dtype (cuda_latent.cuh: fp8 scale blocks shared among them). */
__global__ void __launch_bounds__(STORE_THREADS) mla_store_kernel(cache_rows lat, cache_rows idx, const float *ckv,
                                                                  const float *w, float eps, const float *idx_k,
                                                                  const int32_t *slots)
{
    pdl_wait_trigger_small();
    extern __shared__ float v[];
    const int t = blockIdx.x, R = lat.nq, row = lat.nq + lat.nr, warp = threadIdx.x / 32;
    const float *src = ckv + (size_t)t * row;
    double ss = 0;
    for (int c = threadIdx.x; c < R; c += blockDim.x)
        ss += (double)src[c] * (double)src[c];
    float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(block_sum_double(ss) / R), eps)));
    for (int c = threadIdx.x; c < R; c += blockDim.x)
        v[c] = __fmul_rn(w[c], __fmul_rn(src[c], inv));
    for (int c = threadIdx.x; c < lat.nr; c += blockDim.x)
        v[R + c] = src[R + c];
    __syncthreads();
    cache_put_row(lat, (size_t)slots[t], v, warp, STORE_THREADS / 32);
    if (idx_k)
        cache_put_row(idx, (size_t)slots[t], idx_k + (size_t)t * idx.nq, warp, STORE_THREADS / 32);
}

/* W[n, k] as weight_dequant_row gives it (NVFP4 with its global scale). */
template <int FMT>
__device__ __forceinline__ float w_value(const cuda_wdev &w, int64_t n, int64_t k, int64_t K)
{
    float v = w_load1<FMT>(w, n, k, K);
    if constexpr (FMT == WEIGHT_NVFP4)
        v = __fmul_rn(v, w.scale2);
    return v;
}

/* grid (H, ceil(R / ABSORB_COLS), ceil(T / NT)), 256 threads: thread (slice, group) takes 8
 * consecutive latent columns (one 4-byte NVFP4 word a row) over the nope dims slice, slice + 32, ...
 * (ascending); the 32 slices add up by shuffles within a warp, then over the 8 warps in order.
 * smem qn[NT][nope], part[8 warps][NT][ABSORB_COLS]. One thread per column walking
 * all 192 dims left the GPU waiting on each load (decode: 147 us a layer on the H200). */
template <int FMT, int NT>
__global__ void __launch_bounds__(256) mla_absorb_kernel(cuda_wdev w, mla_shape s, int n_tokens, const float *q,
                                                         float *q_abs)
{
    extern __shared__ float qn[];
    float *part = qn + NT * s.nope;
    const int h = blockIdx.x, cg = threadIdx.x % 8, slice = threadIdx.x / 8, warp = threadIdx.x / 32;
    const int c0 = blockIdx.y * ABSORB_COLS + cg * 8, t0 = blockIdx.z * NT;
    const int nt = n_tokens - t0 < NT ? n_tokens - t0 : NT;
    const int qd = s.nope + s.rope, ad = s.R + s.rope;
    const int64_t row0 = (int64_t)h * (s.nope + s.v);
    const bool whole = s.R % 8 == 0 && c0 + 8 <= s.R;
    const bool pre = NT == 1 && whole && s.nope <= 32 * ABSORB_PRE_ROWS;
    float wpre[NT == 1 ? ABSORB_PRE_ROWS : 1][8];
    if constexpr (NT == 1)
        if (pre)
#pragma unroll
            for (int r = 0; r < ABSORB_PRE_ROWS; r++) {
                const int i = slice + 32 * r;
                if (i < s.nope) {
                    w_load8<FMT>(w, row0 + i, c0, s.R, wpre[r]);
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        if constexpr (FMT == WEIGHT_NVFP4)
                            wpre[r][e] = __fmul_rn(wpre[r][e], w.scale2); /* as w_value */
                }
            }
    pdl_wait();
    for (int i = threadIdx.x; i < nt * s.nope; i += blockDim.x) {
        int tt = i / s.nope, d = i % s.nope;
        qn[i] = q[((size_t)(t0 + tt) * s.H + h) * qd + d];
    }
    if (blockIdx.y == 0)
        for (int i = threadIdx.x; i < nt * s.rope; i += blockDim.x) {
            int tt = i / s.rope, d = i % s.rope;
            q_abs[((size_t)(t0 + tt) * s.H + h) * ad + s.R + d] = q[((size_t)(t0 + tt) * s.H + h) * qd + s.nope + d];
        }
    __syncthreads();
    float acc[NT][8];
#pragma unroll
    for (int tt = 0; tt < NT; tt++)
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[tt][e] = 0.0f;
    if constexpr (NT == 1) {
        if (pre) /* the same sums in the same order as the loop below */
#pragma unroll
            for (int r = 0; r < ABSORB_PRE_ROWS; r++) {
                const int i = slice + 32 * r;
                if (i < s.nope)
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[0][e] = fmaf(qn[i], wpre[r][e], acc[0][e]);
            }
    }
    if (c0 < s.R && !pre)
#pragma unroll 2
        for (int i = slice; i < s.nope; i += 32) {
            float wv[8];
            if (whole) {
                w_load8<FMT>(w, row0 + i, c0, s.R, wv);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if constexpr (FMT == WEIGHT_NVFP4)
                        wv[e] = __fmul_rn(wv[e], w.scale2); /* as w_value: e2m1 * e4m3 * scale2 */
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    wv[e] = c0 + e < s.R ? w_value<FMT>(w, row0 + i, c0 + e, s.R) : 0.0f;
            }
#pragma unroll
            for (int tt = 0; tt < NT; tt++)
                if (tt < nt)
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[tt][e] = fmaf(qn[tt * s.nope + i], wv[e], acc[tt][e]);
        }
    /* lanes l, l ^ 8, l ^ 16, l ^ 24 hold one column group's four slices of this warp */
#pragma unroll
    for (int tt = 0; tt < NT; tt++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float v = acc[tt][e];
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            acc[tt][e] = v;
        }
    if ((threadIdx.x % 32) < 8)
#pragma unroll
        for (int tt = 0; tt < NT; tt++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                part[(warp * NT + tt) * ABSORB_COLS + cg * 8 + e] = acc[tt][e];
    __syncthreads();
    const int lc = threadIdx.x, c = blockIdx.y * ABSORB_COLS + lc;
    if (lc < ABSORB_COLS && c < s.R)
        for (int tt = 0; tt < nt; tt++) {
            float v = 0.0f;
            for (int wi = 0; wi < 8; wi++)
                v += part[(wi * NT + tt) * ABSORB_COLS + lc];
            q_abs[((size_t)(t0 + tt) * s.H + h) * ad + c] = v;
        }
}

/* grid (H, ceil(v / (EXPAND_WARPS RPW)), ceil(T / NT)); smem ol[NT][R]. A warp takes RPW consecutive
 * output features (their loads in flight together); each lane sums its columns in ascending order,
 * so RPW and NT do not change a result. One token (decode) runs NT 1, RPW 4: NT 8 spent its
 * registers and shuffles on empty token slots and left one 4-byte load a lane in flight. */
template <int FMT, int NT, int RPW>
__global__ void mla_expand_kernel(cuda_wdev w, mla_shape s, int n_tokens, const float *o_lat, float *out)
{
    extern __shared__ float ol[];
    const int h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int j0 = (blockIdx.y * EXPAND_WARPS + warp) * RPW, t0 = blockIdx.z * NT;
    const int nt = n_tokens - t0 < NT ? n_tokens - t0 : NT;
    const int64_t row = (int64_t)h * (s.nope + s.v) + s.nope + j0;
    const bool pre = NT == 1 && s.R % 8 == 0 && s.R <= 256 * EXPAND_PRE_ITERS && j0 < s.v;
    float wpre[NT == 1 ? EXPAND_PRE_ITERS : 1][RPW][8];
    if constexpr (NT == 1)
        if (pre)
#pragma unroll
            for (int it = 0; it < EXPAND_PRE_ITERS; it++)
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const int c0 = lane * 8 + 256 * it;
                    if (c0 < s.R && j0 + r < s.v)
                        w_load8<FMT>(w, row + r, c0, s.R, wpre[it][r]);
                    else
#pragma unroll
                        for (int i = 0; i < 8; i++)
                            wpre[it][r][i] = 0.0f;
                }
    pdl_wait();
    for (int i = threadIdx.x; i < nt * s.R; i += blockDim.x) {
        int tt = i / s.R, c = i % s.R;
        ol[i] = o_lat[((size_t)(t0 + tt) * s.H + h) * s.R + c];
    }
    __syncthreads();
    if (j0 >= s.v)
        return;
    float acc[RPW][NT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int tt = 0; tt < NT; tt++)
            acc[r][tt] = 0.0f;
    if constexpr (NT == 1) {
        if (pre) /* the loop below's sums, in its order */
#pragma unroll
            for (int it = 0; it < EXPAND_PRE_ITERS; it++) {
                const int c0 = lane * 8 + 256 * it;
                if (c0 >= s.R)
                    continue;
#pragma unroll
                for (int r = 0; r < RPW; r++)
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        float x = wpre[it][r][i];
                        if constexpr (FMT == WEIGHT_NVFP4)
                            x = __fmul_rn(x, w.scale2);
                        acc[r][0] = fmaf(x, ol[c0 + i], acc[r][0]);
                    }
            }
    }
    if (!pre && s.R % 8 == 0) {
        /* 8 consecutive columns a lane: one 4-byte NVFP4 word (8-32 bytes in the other formats) */
#pragma unroll 2
        for (int c0 = lane * 8; c0 < s.R; c0 += 256) {
            float wv[RPW][8];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                if (j0 + r < s.v)
                    w_load8<FMT>(w, row + r, c0, s.R, wv[r]);
                else
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        wv[r][i] = 0.0f;
            }
#pragma unroll
            for (int r = 0; r < RPW; r++)
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float x = wv[r][i];
                    if constexpr (FMT == WEIGHT_NVFP4)
                        x = __fmul_rn(x, w.scale2); /* as w_value: e2m1 * e4m3 * scale2 */
#pragma unroll
                    for (int tt = 0; tt < NT; tt++)
                        if (tt < nt)
                            acc[r][tt] = fmaf(x, ol[tt * s.R + c0 + i], acc[r][tt]);
                }
        }
    } else if (!pre) {
        for (int c = lane; c < s.R; c += 32)
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const float x = j0 + r < s.v ? w_value<FMT>(w, row + r, c, s.R) : 0.0f;
#pragma unroll
                for (int tt = 0; tt < NT; tt++)
                    if (tt < nt)
                        acc[r][tt] = fmaf(x, ol[tt * s.R + c], acc[r][tt]);
            }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int tt = 0; tt < NT; tt++) {
            float v = warp_sum(acc[r][tt]);
            if (lane == 0 && tt < nt && j0 + r < s.v)
                out[(size_t)(t0 + tt) * s.H * s.v + (size_t)h * s.v + j0 + r] = v;
        }
}

struct attn_params {
    const float *q;      /* (T, H, Dk) */
    cache_rows latent;   /* (slots, Dk) */
    const int32_t *sel;  /* (T, sel_k) or NULL */
    int sel_k;
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size;
    int n_tokens, H, Dk, R;
    int rows, keys, head_blocks;
    float scale;
    int n_splits;
    float *out;  /* (T, H, R) when n_splits == 1 */
    float *part; /* (n_splits, T, H, R + 2) otherwise */
};

/* grid (T * head_blocks, n_splits): block (token t, heads h0 .. h0 + rows). STAGED: the
 * queries, the accumulators and each step's keys in shared memory; otherwise queries and
 * keys are read from global memory and each row accumulates in its output (or partial) row
 * in global memory, which only the warp owning the row touches. */
template <bool STAGED>
__global__ void mla_attn_kernel(attn_params p)
{
    extern __shared__ float smem[];
    const int Dk = p.Dk, R = p.R, RW = p.rows, TN = p.keys;
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *Qs = smem, *Os = smem, *Ks = smem; /* STAGED only */
    float *Ps;
    if (STAGED) {
        Os = Qs + (size_t)RW * Dk;
        Ks = Os + (size_t)RW * R;
        Ps = Ks + (size_t)TN * (Dk + 1);
    } else {
        Ps = smem;
    }
    float *Ms = Ps + (size_t)warps * TN;
    float *Ls = Ms + RW;
    int *slots = (int *)(Ls + RW); /* !STAGED: the step's key slots */

    const int t = blockIdx.x / p.head_blocks, h0 = (blockIdx.x % p.head_blocks) * RW, split = blockIdx.y;
    const int nh = p.H - h0 < RW ? p.H - h0 : RW;
    const int pos = p.pos[t];
    const int n_keys = p.sel ? (pos + 1 < p.sel_k ? pos + 1 : p.sel_k) : pos + 1;
    int lo = 0, hi = n_keys;
    if (p.n_splits > 1) {
        int chunk = (n_keys + p.n_splits - 1) / p.n_splits;
        lo = split * chunk < n_keys ? split * chunk : n_keys;
        hi = lo + chunk < n_keys ? lo + chunk : n_keys;
    }
    /* where row r accumulates: shared memory, or its final place in global memory */
    const size_t acc_stride = p.n_splits == 1 ? (size_t)R : (size_t)(R + 2);
    float *acc_g = p.n_splits == 1 ? p.out + ((size_t)t * p.H + h0) * R
                                   : p.part + ((size_t)split * p.n_tokens * p.H + (size_t)t * p.H + h0) * (R + 2) + 2;
    if (STAGED) {
        for (int i = threadIdx.x; i < RW * Dk; i += blockDim.x) {
            int r = i / Dk, d = i % Dk;
            Qs[i] = r < nh ? p.q[((size_t)t * p.H + h0 + r) * Dk + d] : 0.0f;
        }
        for (int i = threadIdx.x; i < RW * R; i += blockDim.x)
            Os[i] = 0.0f;
    } else {
        for (int r = warp; r < nh; r += warps)
            for (int d = lane; d < R; d += 32)
                acc_g[r * acc_stride + d] = 0.0f;
    }
    for (int r = threadIdx.x; r < RW; r += blockDim.x) {
        Ms[r] = -INFINITY;
        Ls[r] = 0.0f;
    }
    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    const int32_t *sel = p.sel ? p.sel + (size_t)t * p.sel_k : nullptr;
    for (int k0 = lo; k0 < hi; k0 += TN) {
        const int nk = hi - k0 < TN ? hi - k0 : TN;
        __syncthreads(); /* the previous step's keys are consumed (and the setup above is done) */
        if (STAGED) {
            for (int i = threadIdx.x; i < nk * Dk; i += blockDim.x) {
                int jj = i / Dk, d = i % Dk, kp = sel ? sel[k0 + jj] : k0 + jj;
                size_t slot = (size_t)blocks[kp / p.block_size] * p.block_size + (size_t)(kp % p.block_size);
                Ks[(size_t)jj * (Dk + 1) + d] = cache_get(p.latent, slot, d);
            }
        } else {
            for (int jj = threadIdx.x; jj < nk; jj += blockDim.x) {
                int kp = sel ? sel[k0 + jj] : k0 + jj;
                slots[jj] = blocks[kp / p.block_size] * p.block_size + kp % p.block_size;
            }
        }
        __syncthreads();
        float *Pw = Ps + (size_t)warp * TN;
        for (int r = warp; r < nh; r += warps) {
            const float *qr = STAGED ? Qs + (size_t)r * Dk : p.q + ((size_t)t * p.H + h0 + r) * Dk;
            float mloc = -INFINITY;
            for (int jj = lane; jj < nk; jj += 32) {
                float dot = 0.0f;
                if (STAGED) {
                    const float *kr = Ks + (size_t)jj * (Dk + 1);
                    for (int d = 0; d < Dk; d++)
                        dot = fmaf(qr[d], kr[d], dot);
                } else {
                    for (int d = 0; d < Dk; d++)
                        dot = fmaf(qr[d], cache_get(p.latent, (size_t)slots[jj], d), dot);
                }
                float sc = __fmul_rn(dot, p.scale);
                Pw[jj] = sc;
                mloc = fmaxf(mloc, sc);
            }
            mloc = warp_max(mloc);
            const float m_old = Ms[r];
            const float m_new = fmaxf(m_old, mloc);
            const float alpha = expf(m_old - m_new); /* 0 on the first tile (m_old = -inf) */
            float lsum = 0.0f;
            for (int jj = lane; jj < nk; jj += 32) {
                float e = expf(Pw[jj] - m_new);
                Pw[jj] = e;
                lsum += e;
            }
            lsum = warp_sum(lsum);
            __syncwarp();
            float *orow = STAGED ? Os + (size_t)r * R : acc_g + r * acc_stride;
            for (int d = lane; d < R; d += 32) {
                float a = orow[d] * alpha;
                for (int jj = 0; jj < nk; jj++) {
                    /* values: the c_kv part of the key's row */
                    float v = STAGED ? Ks[(size_t)jj * (Dk + 1) + d]
                                     : cache_get(p.latent, (size_t)slots[jj], d);
                    a = fmaf(Pw[jj], v, a);
                }
                orow[d] = a;
            }
            if (lane == 0) {
                Ms[r] = m_new;
                Ls[r] = Ls[r] * alpha + lsum;
            }
            __syncwarp();
        }
    }
    __syncthreads();
    if (STAGED) {
        for (int i = threadIdx.x; i < nh * R; i += blockDim.x) {
            int r = i / R, d = i % R;
            acc_g[r * acc_stride + d] = p.n_splits == 1 ? Os[i] / Ls[r] : Os[i];
        }
    } else if (p.n_splits == 1) {
        for (int r = warp; r < nh; r += warps)
            for (int d = lane; d < R; d += 32)
                acc_g[r * acc_stride + d] /= Ls[r];
    }
    if (p.n_splits > 1)
        for (int r = threadIdx.x; r < nh; r += blockDim.x) {
            acc_g[r * acc_stride - 2] = Ms[r];
            acc_g[r * acc_stride - 1] = Ls[r];
        }
}

/* o_lat[t, h, :] from the n_splits partials of (t, h); grid (n_th, ceil(R / MERGE_COLS)). An
 * empty split (no keys) has l = 0 and is skipped. One warp weighs the splits (their maxima and
 * sums by shuffles) into shared memory, then each thread adds one column over the splits in
 * ascending order. One block a (token, head) with thread 0 walking the splits took 17 us at
 * batch 1 (64 blocks, H200). */
__global__ void __launch_bounds__(MERGE_COLS) mla_merge_kernel(const float *part, int n_splits, int n_th, int R,
                                                                float *out)
{
    __shared__ float wsplit[PLAN_ATTN_MAX_SPLITS];
    __shared__ float inv_l;
    pdl_wait_trigger_small();

    const size_t th = blockIdx.x, stride = (size_t)n_th * (R + 2);
    const float *p0 = part + th * (size_t)(R + 2);
    if (threadIdx.x < 32) {
        float M = -INFINITY;
        for (int s = threadIdx.x; s < n_splits; s += 32)
            if (p0[s * stride + 1] > 0.0f)
                M = fmaxf(M, p0[s * stride]);
        M = warp_max(M);
        float l = 0.0f;
        for (int s = threadIdx.x; s < n_splits; s += 32) {
            const float *ps = p0 + s * stride;
            const float w = ps[1] > 0.0f ? expf(ps[0] - M) : 0.0f;
            wsplit[s] = w;
            l += ps[1] * w;
        }
        l = warp_sum(l);
        if (threadIdx.x == 0)
            inv_l = 1.0f / l;
    }
    __syncthreads();
    const int d = blockIdx.y * MERGE_COLS + threadIdx.x;
    if (d >= R)
        return;
    float a = 0.0f;
#pragma unroll 16 /* 16 L2 loads a thread in flight (8: 8 round trips for 64 splits) */
    for (int s = 0; s < n_splits; s++) {
        const float v = p0[s * stride + 2 + d], w = wsplit[s];
        a += w != 0.0f ? v * w : 0.0f; /* an empty split's values are not read into the sum */
    }
    out[th * R + d] = a * inv_l;
}

template <int FMT, int NT>
cudaError_t launch_absorb_nt(cudaStream_t stream, const cuda_wdev &w, const mla_shape &s, int n_tokens, const float *q,
                             float *q_abs, int pdl)
{
    dim3 grid((unsigned)s.H, (unsigned)((s.R + ABSORB_COLS - 1) / ABSORB_COLS), (unsigned)((n_tokens + NT - 1) / NT));
    size_t smem = ((size_t)NT * s.nope + (size_t)ABSORB_WARPS * NT * ABSORB_COLS) * sizeof(float);
    return launch_pdl(pdl != 0, mla_absorb_kernel<FMT, NT>, grid, dim3(ABSORB_WARPS * 32), smem, stream, w, s,
                      n_tokens, q, q_abs);
}

/* One token (decode at batch 1) gets its own token tile: the same sums, without 7 empty slots. */
template <int FMT>
cudaError_t launch_absorb(cudaStream_t stream, const cuda_wdev &w, const mla_shape &s, int n_tokens, const float *q,
                          float *q_abs, int pdl)
{
    return n_tokens == 1 ? launch_absorb_nt<FMT, 1>(stream, w, s, n_tokens, q, q_abs, pdl)
                         : launch_absorb_nt<FMT, TOK_TILE>(stream, w, s, n_tokens, q, q_abs, pdl);
}

template <int FMT, int NT, int RPW>
cudaError_t launch_expand_nt(cudaStream_t stream, const cuda_wdev &w, const mla_shape &s, int n_tokens,
                             const float *o_lat, float *out, int pdl)
{
    dim3 grid((unsigned)s.H, (unsigned)((s.v + EXPAND_WARPS * RPW - 1) / (EXPAND_WARPS * RPW)),
              (unsigned)((n_tokens + NT - 1) / NT));
    size_t smem = (size_t)NT * s.R * sizeof(float);
    return launch_pdl(pdl != 0, mla_expand_kernel<FMT, NT, RPW>, grid, dim3(EXPAND_WARPS * 32), smem, stream, w, s,
                      n_tokens, o_lat, out);
}

template <int FMT>
cudaError_t launch_expand(cudaStream_t stream, const cuda_wdev &w, const mla_shape &s, int n_tokens,
                          const float *o_lat, float *out, int pdl)
{
    return n_tokens == 1 ? launch_expand_nt<FMT, 1, 4>(stream, w, s, n_tokens, o_lat, out, pdl)
                         : launch_expand_nt<FMT, TOK_TILE, 1>(stream, w, s, n_tokens, o_lat, out, pdl);
}

bool mla_shape_ok(const struct mla_dims *m, int n_tokens)
{
    return m->n_heads > 0 && m->n_heads <= 65535 && m->nope > 0 && m->rope >= 0 && m->v > 0 && m->kv_rank > 0 &&
           (n_tokens + TOK_TILE - 1) / TOK_TILE <= 65535 &&
           (size_t)TOK_TILE * ((size_t)m->nope + (size_t)ABSORB_WARPS * ABSORB_COLS) * sizeof(float) <= 48 * 1024 &&
           (size_t)TOK_TILE * (size_t)m->kv_rank * sizeof(float) <= 48 * 1024;
}

} // namespace

extern "C" cudaError_t cuda_mla_store(cudaStream_t stream, const struct paged_latent *kv, const float *ckv,
                                      const float *w, float eps, const float *idx_k, int n_tokens,
                                      const int32_t *slots, int pdl)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    if (idx_k && !kv->index_k)
        idx_k = nullptr;
    const size_t smem = (size_t)(kv->kv_rank + kv->rope_dim) * sizeof(float);
    if (kv->dtype > KV_DTYPE_FP8 || kv->index_dtype > KV_DTYPE_FP8 || smem > 48 * 1024 ||
        (kv->dtype == KV_DTYPE_FP8 && !fp8_dims_ok(kv->kv_rank, kv->rope_dim)) ||
        (idx_k && kv->index_dtype == KV_DTYPE_FP8 && !fp8_dims_ok(kv->index_dim, 0)))
        return cudaErrorInvalidValue;
    const cache_rows lat = cache_rows_make(kv->latent, kv->dtype, kv->kv_rank, kv->rope_dim);
    const cache_rows idx = cache_rows_make(kv->index_k, kv->index_dtype, kv->index_dim, 0);
    return launch_pdl(pdl != 0, mla_store_kernel, dim3((unsigned)n_tokens), dim3(STORE_THREADS), smem, stream, lat, idx,
                      ckv, w, eps, idx_k, slots);
}

extern "C" cudaError_t cuda_mla_absorb_q(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                                         const struct mla_dims *m, const float *q, int n_tokens, float *q_abs,
                                         int mma, int pdl)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    if (!mla_shape_ok(m, n_tokens))
        return cudaErrorInvalidValue;
    if (mma && cuda_mla_absorb_mma_fits(fmt, w, m, n_tokens))
        return cuda_mla_absorb_mma(stream, w, m, q, q_abs, pdl);
    mla_shape s = {m->n_heads, m->nope, m->rope, m->v, m->kv_rank};
    switch (fmt) {
    case WEIGHT_F32: return launch_absorb<WEIGHT_F32>(stream, *w, s, n_tokens, q, q_abs, pdl);
    case WEIGHT_BF16: return launch_absorb<WEIGHT_BF16>(stream, *w, s, n_tokens, q, q_abs, pdl);
    case WEIGHT_F16: return launch_absorb<WEIGHT_F16>(stream, *w, s, n_tokens, q, q_abs, pdl);
    case WEIGHT_FP8_BLOCK: return launch_absorb<WEIGHT_FP8_BLOCK>(stream, *w, s, n_tokens, q, q_abs, pdl);
    case WEIGHT_NVFP4: return launch_absorb<WEIGHT_NVFP4>(stream, *w, s, n_tokens, q, q_abs, pdl);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cuda_mla_expand_o(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                                         const struct mla_dims *m, const float *o_lat, int n_tokens, float *out,
                                         int mma, int pdl)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    if (!mla_shape_ok(m, n_tokens))
        return cudaErrorInvalidValue;
    if (mma && cuda_mla_expand_mma_fits(fmt, w, m, n_tokens))
        return cuda_mla_expand_mma(stream, w, m, o_lat, out, pdl);
    mla_shape s = {m->n_heads, m->nope, m->rope, m->v, m->kv_rank};
    switch (fmt) {
    case WEIGHT_F32: return launch_expand<WEIGHT_F32>(stream, *w, s, n_tokens, o_lat, out, pdl);
    case WEIGHT_BF16: return launch_expand<WEIGHT_BF16>(stream, *w, s, n_tokens, o_lat, out, pdl);
    case WEIGHT_F16: return launch_expand<WEIGHT_F16>(stream, *w, s, n_tokens, o_lat, out, pdl);
    case WEIGHT_FP8_BLOCK: return launch_expand<WEIGHT_FP8_BLOCK>(stream, *w, s, n_tokens, o_lat, out, pdl);
    case WEIGHT_NVFP4: return launch_expand<WEIGHT_NVFP4>(stream, *w, s, n_tokens, o_lat, out, pdl);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" int cuda_mla_attention_fit(struct cuda_mla_cfg *cfg, int n_heads, int k_dim, int v_dim, size_t budget)
{
    if (cfg->threads < 32)
        cfg->threads = 32;
    cfg->threads = (cfg->threads / 32) * 32;
    if (cfg->threads > 1024)
        cfg->threads = 1024;
    if (cfg->rows < 1)
        cfg->rows = 1;
    if (cfg->rows > n_heads)
        cfg->rows = n_heads; /* a block never holds two tokens' heads */
    if (cfg->keys < 1)
        cfg->keys = 1;
    cfg->stages = cfg->stages > 0 ? 1 : 0;
    budget = budget > 256 ? budget - 256 : 0; /* the reductions' static shared memory */
    for (;;) {
        size_t bytes = plan_mla_attention_smem(cfg->rows, cfg->keys, cfg->threads, k_dim, v_dim, cfg->stages);
        if (bytes <= budget) {
            cfg->smem_bytes = bytes;
            return 1;
        }
        /* keys first (down to 8), then heads, then the unstaged variant, then keys to 1 */
        if (cfg->keys > 8)
            cfg->keys /= 2;
        else if (cfg->rows > 1)
            cfg->rows /= 2;
        else if (cfg->stages > 0)
            cfg->stages = 0;
        else if (cfg->keys > 1)
            cfg->keys /= 2;
        else if (cfg->threads > 32)
            cfg->threads /= 2;
        else
            return 0;
    }
}

extern "C" size_t cuda_mla_attention_workspace_floats(int n_tokens, int n_heads, int kv_rank, int n_splits)
{
    if (n_splits <= 1)
        return 0;
    return (size_t)n_splits * (size_t)n_tokens * (size_t)n_heads * (size_t)(kv_rank + 2);
}

extern "C" cudaError_t cuda_mla_attention(cudaStream_t stream, const float *q_abs, const struct paged_latent *kv,
                                          const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k,
                                          float scale, float *o_lat, const struct cuda_mla_cfg *cfg,
                                          int n_splits, float *work)
{
    if (b->n_tokens <= 0)
        return cudaSuccess;
    attn_params p;
    latent_params_fill(p, q_abs, kv, b, n_heads, sel, sel_k, scale, n_splits, o_lat, work);
    p.latent = cache_rows_make(kv->latent, kv->dtype, kv->kv_rank, kv->rope_dim);
    p.rows = cfg->rows;
    p.keys = cfg->keys;
    p.head_blocks = (n_heads + cfg->rows - 1) / cfg->rows;
    if (n_splits < 1 || n_splits > PLAN_ATTN_MAX_SPLITS || (n_splits > 1 && !work) || (sel && sel_k < 1) ||
        cfg->rows > n_heads || kv->dtype > KV_DTYPE_FP8 ||
        (kv->dtype == KV_DTYPE_FP8 && !fp8_dims_ok(kv->kv_rank, kv->rope_dim)) ||
        cfg->smem_bytes != plan_mla_attention_smem(cfg->rows, cfg->keys, cfg->threads, p.Dk, p.R, cfg->stages))
        return cudaErrorInvalidValue; /* not fitted for these dims */
    int64_t blocks = (int64_t)b->n_tokens * p.head_blocks;
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidValue;
    void (*kernel)(attn_params) = cfg->stages > 0 ? mla_attn_kernel<true> : mla_attn_kernel<false>;
    if (cfg->smem_bytes > 48 * 1024) {
        cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cfg->smem_bytes);
        if (e != cudaSuccess)
            return e;
    }
    dim3 grid((unsigned)blocks, (unsigned)n_splits);
    kernel<<<grid, (unsigned)cfg->threads, cfg->smem_bytes, stream>>>(p);
    if (n_splits > 1) {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return e;
        return cuda_mla_merge(stream, work, n_splits, b->n_tokens * n_heads, p.R, o_lat, 0);
    }
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_mla_merge(cudaStream_t stream, const float *part, int n_splits, int n_th, int R,
                                      float *out, int pdl)
{
    if (n_splits < 1 || n_splits > PLAN_ATTN_MAX_SPLITS)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)n_th, (unsigned)((R + MERGE_COLS - 1) / MERGE_COLS));
    return launch_pdl(pdl != 0, mla_merge_kernel, grid, dim3(MERGE_COLS), 0, stream, part, n_splits, n_th, R, out);
}
