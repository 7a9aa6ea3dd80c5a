/* cuda_mla_mma.cu — MLA attention in latent space on bf16 tensor cores, over a bf16 or fp8 latent
 * cache.
 *
 * The same contract as cuda_mla.cu's fp32 kernel (backend_ops.mla_attention): every head of a
 * token attends to the token's keys (its DSA selection, or 0..pos) through the one cached latent
 * row [c_kv | k_r] per key, the values being the c_kv part of the same row. Multi-query attention
 * with 64 heads on a 576-wide row is a pair of small matrix products per key tile, which is what
 * this kernel gives the tensor cores:
 *   S[heads, keys] = Q[heads, Dk] K[keys, Dk]^T,   O[heads, R] += softmax(S) K[keys, :R].
 * A block takes `rows` heads of ONE token (16 a row group of PLAN_MLA_MMA_PARTS warps) and a
 * contiguous share of its keys (split-K: the partials merge in cuda_mla_merge(), as the fp32
 * kernel's do). The warps of a row group split its S by dims (each its quarter of the k-steps,
 * summed through shared memory, so each holds the whole S and the softmax stays inside a warp)
 * and its R value columns (each a quarter in registers): at batch 1 a block is all an SM has, and
 * four warps a row group are twice the warps a pair was, each with half the chain to walk. The
 * key tiles come into shared memory by cp.async straight from the bf16 cache (gathered by index
 * under DSA), double-buffered where the budget holds two.
 *
 * Precision: the keys and values are the cache's bf16 values exactly; the query and the softmax
 * weights are split into bf16 hi + lo (two MMAs each), so the result is fp32-grade (~1e-5 of the
 * fp32 kernel on the same cache) and does not depend on how the keys were split.
 *
 * An fp8 cache (e4m3 codes, an f32 scale per 128 latent values, the rope part in bf16): a key
 * tile is staged as the codes themselves in bf16 (exact: e4m3 is a subset) beside its scales, and
 * the scales enter where they factor out of the products: S sums each 128-column block's
 * product separately and adds it times the key's scale of that block; P V takes P times the
 * key's scale of the value columns' block. So the values are the CPU's e4m3 * scale exactly and
 * the result stays fp32-grade. These tiles are loaded through registers (a row is not a whole
 * number of 16-byte bf16 chunks), not by cp.async.
 *
 * Shared memory: Qhi[rows][ld], Qlo[rows][ld], K[stages][keys][ld] in bf16, ld = Dk rounded up to
 * 16, + 8 (the ldmatrix rows then fall in distinct banks), then the fp8 scales [stages][keys]
 * [ceil(Dk / 128)] in f32, then the row groups' S exchange [rows / 16][PARTS - 1][16][keys] in f32;
 * plan_mla_mma_smem() is the formula.
 */
#include "backend/cuda/mla/mla.h"
#include <math.h>

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_mma.cuh"
#include "backend/cuda/mla/cuda_latent.cuh"
extern "C" {
#include "plan/plan.h"
}

namespace
{

constexpr int PARTS = PLAN_MLA_MMA_PARTS; /* warps a 16-head row group */
constexpr int MAX_VT = 16;                /* value n-tiles (8 columns) a warp: R / PARTS <= 128 */
constexpr int Q_BATCH = 16; /* query loads a thread keeps in flight while staging */

struct mma_params {
    const float *q;         /* (T, H, Dk) */
    const void *latent;     /* (slots) rows of Dk bf16, or fp8 rows of row_bytes (cuda_latent.cuh) */
    int row_bytes, nb;      /* fp8: bytes a row, scales a row */
    const int32_t *sel;     /* (T, sel_k) or NULL */
    int sel_k;
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size;
    int n_tokens, H, Dk, R;
    int rows, stages, head_blocks, ld;
    float scale;
    int n_splits;
    float *out;  /* (T, H, R) when n_splits == 1 */
    float *part; /* (n_splits, T, H, R + 2) otherwise: m, l, unnormalised O */
};

/* grid (T * head_blocks, n_splits), (rows / 16) * PARTS warps; TN keys per tile. One function past
 * 100 lines: the O accumulators (up to 128 registers a thread) live through every phase of the
 * tile loop (load, S, softmax, P V), which reads best, and compiles best, in one piece. */
template <int TN, bool FP8>
__global__ void __launch_bounds__(256) mla_mma_kernel(mma_params p)
{
    pdl_wait(); /* PDL: the previous kernel's writes are visible from here */
    extern __shared__ __align__(16) uint16_t sm[];
    const int ld = p.ld, RW = p.rows, nbs = PLAN_MLA_MMA_SCALE_BLOCKS(p.Dk);
    uint16_t *Qh = sm, *Ql = Qh + (size_t)RW * ld, *Kb = Ql + (size_t)RW * ld;
    float *Scb = (float *)(Kb + (size_t)(p.stages > 1 ? 2 : 1) * TN * ld); /* FP8: the tiles' scales */
    /* a row group's exchange of its S partials (PARTS - 1 areas of 16 x TN) */
    float *Sx = Scb + (size_t)(p.stages > 1 ? 2 : 1) * TN * nbs;
    /* each key slot's position in the cache's order (-1: none), for the softmax's mask */
    __shared__ int kpos[2][64];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = (int)blockDim.x / 32;
    const int r0 = (warp / PARTS) * 16, vp = warp % PARTS;
    const int t = blockIdx.x / p.head_blocks, h0 = (blockIdx.x % p.head_blocks) * RW, split = blockIdx.y;
    const int nh = p.H - h0 < RW ? p.H - h0 : RW;
    const int pos = p.pos[t];
    const int n_keys = p.sel ? (pos + 1 < p.sel_k ? pos + 1 : p.sel_k) : pos + 1;
    int lo = 0, hi = n_keys;
    if (p.n_splits > 1) {
        int chunk = (n_keys + p.n_splits - 1) / p.n_splits;
        chunk = (chunk + TN - 1) / TN * TN; /* whole tiles: fewer, fuller blocks */
        lo = split * chunk < n_keys ? split * chunk : n_keys;
        hi = lo + chunk < n_keys ? lo + chunk : n_keys;
    }
    const int Dk = p.Dk, ksteps = (Dk + 15) / 16, cpr = Dk / 8, q4 = ld / 4;
    /* the queries as hi + lo, 4 values a load, Q_BATCH loads a thread in flight before their
     * stores (a block stages 37-74 KB from L2: ~36 loads a thread at 32 rows and 128 threads).
     * A thread's (row, float4) steps by blockDim.x float4s: carried along, not divided out per
     * load (two divisions a load were a quarter of a batch-1 block's instructions) */
    {
        const int step_r = (int)blockDim.x / q4, step_c = (int)blockDim.x % q4;
        int r = (int)threadIdx.x / q4, c = (int)threadIdx.x % q4;
        for (int base = threadIdx.x; base < RW * q4; base += Q_BATCH * blockDim.x) {
            float4 v[Q_BATCH];
            int at[Q_BATCH]; /* the smem offset of the load, -1 past the rows */
#pragma unroll
            for (int u = 0; u < Q_BATCH; u++) {
                const int d = c * 4;
                at[u] = r < RW ? r * ld + d : -1;
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (r < nh && d < Dk)
                    v[u] = __ldg((const float4 *)(p.q + ((size_t)t * p.H + h0 + r) * Dk + d));
                c += step_c, r += step_r;
                if (c >= q4)
                    c -= q4, r++;
            }
#pragma unroll
            for (int u = 0; u < Q_BATCH; u++) {
                if (at[u] < 0)
                    break;
                uint32_t h0w, l0w, h1w, l1w;
                mma_split_bf16x2(v[u].x, v[u].y, h0w, l0w);
                mma_split_bf16x2(v[u].z, v[u].w, h1w, l1w);
                *(uint2 *)(Qh + at[u]) = make_uint2(h0w, h1w);
                *(uint2 *)(Ql + at[u]) = make_uint2(l0w, l1w);
            }
        }
    }
    /* the key rows' pad columns past Dk are never loaded: zero once */
    for (int i = threadIdx.x; i < p.stages * TN * (ld - Dk); i += blockDim.x)
        Kb[(size_t)(i / (ld - Dk)) * ld + Dk + i % (ld - Dk)] = 0;
    __syncthreads();

    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    const int32_t *sel = p.sel ? p.sel + (size_t)t * p.sel_k : nullptr;
    auto slot_of = [&](int kp) {
        return (size_t)blocks[kp / p.block_size] * p.block_size + (size_t)(kp % p.block_size);
    };
    auto load = [&](int k0, int buf) {
        const int nk = hi - k0 < TN ? hi - k0 : TN;
        uint16_t *dst = Kb + (size_t)buf * TN * ld;
        if constexpr (FP8) {
            /* a short tile's missing rows: zeros (weight 0 times whatever the buffer held could be NaN) */
            for (int i = threadIdx.x; i < (TN - nk) * cpr; i += blockDim.x)
                *(uint4 *)(dst + (size_t)(nk + i / cpr) * ld + (i % cpr) * 8) = make_uint4(0, 0, 0, 0);
            const uint8_t *lat = (const uint8_t *)p.latent;
            for (int i = threadIdx.x; i < nk * cpr; i += blockDim.x) {
                const int jj = i / cpr, d0 = (i % cpr) * 8, kp = sel ? sel[k0 + jj] : k0 + jj;
                uint4 v = make_uint4(0, 0, 0, 0); /* -1 padding: masked below, zeros meanwhile */
                if (kp >= 0) {
                    const uint8_t *row = lat + slot_of(kp) * (size_t)p.row_bytes;
                    if (d0 < p.R) { /* 8 codes -> 8 bf16 values */
                        const uint32_t w0 = *(const uint32_t *)(row + d0), w1 = *(const uint32_t *)(row + d0 + 4);
                        v = make_uint4(e4m3x2_to_bf16x2(w0 & 0xffffu), e4m3x2_to_bf16x2(w0 >> 16),
                                       e4m3x2_to_bf16x2(w1 & 0xffffu), e4m3x2_to_bf16x2(w1 >> 16));
                    } else { /* 8 rope values, already bf16 */
                        const uint32_t *r = (const uint32_t *)(row + p.R + 4 * p.nb + 2 * (d0 - p.R));
                        v = make_uint4(r[0], r[1], r[2], r[3]);
                    }
                }
                *(uint4 *)(dst + (size_t)jj * ld + d0) = v;
            }
            for (int jj = threadIdx.x; jj < TN; jj += blockDim.x)
                kpos[buf][jj] = jj < nk ? (sel ? sel[k0 + jj] : k0 + jj) : -1;
            /* the scales; 0 for missing and padded keys (their weight 0 must stay 0 in P V) */
            float *sc = Scb + (size_t)buf * TN * nbs;
            for (int i = threadIdx.x; i < TN * nbs; i += blockDim.x) {
                const int jj = i / nbs, b = i % nbs, kp = jj < nk ? (sel ? sel[k0 + jj] : k0 + jj) : -1;
                sc[i] = kp >= 0 && b < p.nb ? *(const float *)(lat + slot_of(kp) * (size_t)p.row_bytes + p.R + 4 * b)
                                            : 0.0f;
            }
        } else {
            /* KL rows a warp at a time: their positions, then their slots, each KL loads in flight
             * together (a position -> block table -> row chain a chunk was the latency of a tile),
             * then the lanes' 16-byte chunks of each row */
            constexpr int KL = 4;
            for (int j0 = warp * KL; j0 < TN; j0 += nwarps * KL) {
                int kp[KL];
#pragma unroll
                for (int u = 0; u < KL; u++) {
                    const int jj = j0 + u;
                    kp[u] = jj < nk ? (sel ? __ldg(sel + k0 + jj) : k0 + jj) : -1;
                }
                size_t sl[KL];
#pragma unroll
                for (int u = 0; u < KL; u++)
                    sl[u] = kp[u] >= 0 ? slot_of(kp[u]) : 0;
#pragma unroll
                for (int u = 0; u < KL; u++) {
                    const int jj = j0 + u;
                    if (jj >= TN)
                        break;
                    uint16_t *drow = dst + (size_t)jj * ld;
                    if (lane == 0)
                        kpos[buf][jj] = kp[u];
                    if (kp[u] < 0) { /* past the tile or -1 padding: zeros (masked below) */
                        for (int c = lane; c < cpr; c += 32)
                            *(uint4 *)(drow + c * 8) = make_uint4(0, 0, 0, 0);
                        continue;
                    }
                    const uint16_t *srow = (const uint16_t *)p.latent + sl[u] * Dk;
                    for (int c = lane; c < cpr; c += 32)
                        cp_async16(drow + c * 8, srow + c * 8);
                }
            }
        }
        cp_async_commit(); /* FP8: an empty group, so the waits below count alike */
    };

    float o[MAX_VT][4];
#pragma unroll
    for (int j = 0; j < MAX_VT; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f; /* rows lane/4 and lane/4 + 8 */
    const int vt = p.R / (8 * PARTS), vcol = vp * (p.R / PARTS);
    const int n_tiles = (hi - lo + TN - 1) / TN;
    if (n_tiles > 0)
        load(lo, 0);
    for (int it = 0; it < n_tiles; it++) {
        const int k0 = lo + it * TN, buf = p.stages > 1 ? (it & 1) : 0;
        if (p.stages > 1 && it + 1 < n_tiles) {
            load(k0 + TN, buf ^ 1); /* the next tile streams in under this one */
            cp_async_wait_upto(1);
        } else {
            if (p.stages == 1 && it > 0)
                load(k0, 0); /* one buffer: this tile now (the previous one is consumed) */
            cp_async_wait_upto(0);
        }
        __syncthreads();
        const uint16_t *K = Kb + (size_t)buf * TN * ld;
        const float *Ksc = Scb + (size_t)buf * TN * nbs; /* FP8 */

        /* st: FP8, one scale block's partial S; bf16, the lo half's products (their own chain: the
         * hi and lo MMAs of a step into one accumulator made a chain of 2 x ksteps dependent MMAs) */
        float s[TN / 8][4], st[TN / 8][4];
#pragma unroll
        for (int n = 0; n < TN / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
        }
        auto qk_step = [&](int kk, float (&acc_lo)[TN / 8][4], float (&acc)[TN / 8][4]) {
            uint32_t ah[4], al[4];
            const size_t qo = (size_t)(r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + kk * 16 + (lane >> 4) * 8;
            mma_ldsm_x4(ah, Qh + qo);
            mma_ldsm_x4(al, Ql + qo);
#pragma unroll
            for (int n2 = 0; n2 < TN / 16; n2++) {
                uint32_t b[4];
                mma_ldsm_x4(b, K + (size_t)(n2 * 16 + (lane & 7) + (lane >> 4) * 8) * ld + kk * 16 +
                                   ((lane >> 3) & 1) * 8);
                mma_bf16_16816(acc_lo[2 * n2], al, b[0], b[1]);
                mma_bf16_16816(acc[2 * n2], ah, b[0], b[1]);
                mma_bf16_16816(acc_lo[2 * n2 + 1], al, b[2], b[3]);
                mma_bf16_16816(acc[2 * n2 + 1], ah, b[2], b[3]);
            }
        };
        /* the row group's warps split the k-steps: warp vp takes [kk0, kk1). FP8: the latent
         * columns block by block, each block's part times its key scales (at the block's end or
         * the warp's); bf16: st holds the lo half's products (their own chain: the hi and lo
         * MMAs of a step into one accumulator made a chain of 2 x ksteps dependent MMAs) */
        const int kq = (ksteps + PARTS - 1) / PARTS, kk0 = vp * kq < ksteps ? vp * kq : ksteps,
                  kk1 = kk0 + kq < ksteps ? kk0 + kq : ksteps;
        if constexpr (FP8) {
            for (int kk = kk0; kk < kk1; kk++) {
                if (kk * 16 >= p.R) {
                    qk_step(kk, s, s);
                    continue;
                }
                qk_step(kk, st, st);
                if ((kk + 1) * 16 == p.R || ((kk + 1) * 16) % KV_FP8_BLOCK == 0 || kk + 1 == kk1) {
                    const int blk = kk * 16 / KV_FP8_BLOCK;
#pragma unroll
                    for (int n = 0; n < TN / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int key = n * 8 + 2 * (lane & 3) + (e & 1);
                            s[n][e] = fmaf(st[n][e], Ksc[key * nbs + blk], s[n][e]);
                            st[n][e] = 0.0f;
                        }
                }
            }
        } else {
#pragma unroll 2 /* the next step's ldmatrix issues under this step's MMAs */
            for (int kk = kk0; kk < kk1; kk++)
                qk_step(kk, st, s);
#pragma unroll
            for (int n = 0; n < TN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[n][e] += st[n][e];
        }
        {
            /* warps 1.. of the group hand their parts over, warp 0 sums them in a fixed order and
             * hands the sum back: every warp holds the same S */
            float *px = Sx + (size_t)(warp / PARTS) * (PARTS - 1) * 16 * TN;
            if (vp)
#pragma unroll
                for (int n = 0; n < TN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        px[(size_t)(vp - 1) * 16 * TN + (n * 4 + e) * 32 + lane] = s[n][e];
            __syncthreads();
            if (!vp) {
#pragma unroll
                for (int n = 0; n < TN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
#pragma unroll
                        for (int w = 0; w < PARTS - 1; w++)
                            s[n][e] += px[(size_t)w * 16 * TN + (n * 4 + e) * 32 + lane];
                        px[(n * 4 + e) * 32 + lane] = s[n][e];
                    }
            }
            __syncthreads();
            if (vp)
#pragma unroll
                for (int n = 0; n < TN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[n][e] = px[(n * 4 + e) * 32 + lane];
        }
        /* online softmax over this tile; the 4 lanes of a row reduce by shuffles */
        float al_a, al_b;
        mma_softmax_tile<TN / 2>([&](int i) -> float & { return s[i / 4][i % 4]; }, p.scale,
                                 [&](int key) { return kpos[buf][key] >= 0; }, m_a, m_b, l_a, l_b, al_a,
                                 al_b);
#pragma unroll
        for (int j = 0; j < MAX_VT; j++) {
            o[j][0] *= al_a, o[j][1] *= al_a;
            o[j][2] *= al_b, o[j][3] *= al_b;
        }
        /* O += P V: P's accumulator layout is the A fragment's, 16 keys a step */
#pragma unroll
        for (int k2 = 0; k2 < TN / 16; k2++) {
            uint32_t ph[4], pl[4];
            /* P's fragment, times the keys' scales of value block blk under FP8 (this thread's
             * keys: ka, ka + 1 in s[2 k2], ka + 8, ka + 9 in s[2 k2 + 1]) */
            const int ka = k2 * 16 + 2 * (lane & 3);
            auto p_frag = [&](int blk) {
                float a0 = 1.0f, a1 = 1.0f, b0 = 1.0f, b1 = 1.0f;
                if constexpr (FP8) {
                    a0 = Ksc[ka * nbs + blk], a1 = Ksc[(ka + 1) * nbs + blk];
                    b0 = Ksc[(ka + 8) * nbs + blk], b1 = Ksc[(ka + 9) * nbs + blk];
                }
                mma_split_bf16x2(s[2 * k2][0] * a0, s[2 * k2][1] * a1, ph[0], pl[0]);
                mma_split_bf16x2(s[2 * k2][2] * a0, s[2 * k2][3] * a1, ph[1], pl[1]);
                mma_split_bf16x2(s[2 * k2 + 1][0] * b0, s[2 * k2 + 1][1] * b1, ph[2], pl[2]);
                mma_split_bf16x2(s[2 * k2 + 1][2] * b0, s[2 * k2 + 1][3] * b1, ph[3], pl[3]);
            };
            int cur = FP8 ? -1 : 0;
            if (!FP8)
                p_frag(0);
            const uint16_t *vrow = K + (size_t)(k2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + vcol + (lane >> 4) * 8;
#pragma unroll
            for (int j = 0; j < MAX_VT; j += 2) {
                if (j >= vt)
                    break;
                uint32_t b[4];
                mma_ldsm_x4_trans(b, vrow + j * 8);
                if (FP8 && (vcol + j * 8) / KV_FP8_BLOCK != cur)
                    p_frag(cur = (vcol + j * 8) / KV_FP8_BLOCK);
                mma_bf16_16816(o[j], pl, b[0], b[1]);
                mma_bf16_16816(o[j], ph, b[0], b[1]);
                if (j + 1 < vt) {
                    if (FP8 && (vcol + (j + 1) * 8) / KV_FP8_BLOCK != cur)
                        p_frag(cur = (vcol + (j + 1) * 8) / KV_FP8_BLOCK);
                    mma_bf16_16816(o[j + 1], pl, b[2], b[3]);
                    mma_bf16_16816(o[j + 1], ph, b[2], b[3]);
                }
            }
        }
        __syncthreads(); /* this buffer is consumed before a later load refills it */
    }
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    const int ra = r0 + lane / 4, rb = ra + 8, R = p.R, os_ld = R + 8;
    /* O through shared memory (the queries' area, free after the loop's last barrier; rows of R + 8
     * floats: 2-way bank conflicts at most), then a warp a row: whole 256-byte spans a store where
     * the fragments' stores left each 32 bytes across two sectors of the partial rows */
    float *os = (float *)sm;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = half ? rb : ra;
        if (r >= nh)
            continue;
        const float m = half ? m_b : m_a, l = half ? l_b : l_a;
        const float inv = p.n_splits == 1 ? 1.0f / l : 1.0f;
#pragma unroll
        for (int j = 0; j < MAX_VT; j++) {
            if (j >= vt)
                break;
            const int col = vcol + j * 8 + 2 * (lane & 3);
            *(float2 *)(os + r * os_ld + col) = make_float2(o[j][half * 2] * inv, o[j][half * 2 + 1] * inv);
        }
        if (p.n_splits > 1 && vp == 0 && (lane & 3) == 0) {
            float *ml = p.part + ((size_t)split * p.n_tokens * p.H + (size_t)t * p.H + h0 + r) * (R + 2);
            ml[0] = m;
            ml[1] = l;
        }
    }
    __syncthreads();
    for (int r = warp; r < nh; r += nwarps) {
        const size_t th = (size_t)t * p.H + h0 + r;
        float *dst = p.n_splits == 1 ? p.out + th * R : p.part + ((size_t)split * p.n_tokens * p.H + th) * (R + 2) + 2;
        for (int c = 2 * lane; c < R; c += 64) /* R even (v_dim % 16 == 0): 8-byte aligned */
            *(float2 *)(dst + c) = *(const float2 *)(os + r * os_ld + c);
    }
}

} // namespace

extern "C" int cuda_mla_mma_fits(int n_heads, int k_dim, int v_dim, int rows, int keys, int stages, size_t budget)
{
    return n_heads > 0 && k_dim > v_dim && k_dim % 8 == 0 && v_dim % (8 * PARTS) == 0 &&
           v_dim <= 8 * PARTS * MAX_VT && (rows == 16 || rows == 32) &&
           (keys == 16 || keys == 32 || keys == 64) && (stages == 1 || stages == 2) &&
           plan_mla_mma_smem(rows, keys, k_dim, stages) + 256 <= budget;
}

extern "C" int cuda_mla_mma_takes_cache(const struct paged_latent *kv)
{
    return kv->dtype == KV_DTYPE_BF16 || (kv->dtype == KV_DTYPE_FP8 && fp8_dims_ok(kv->kv_rank, kv->rope_dim));
}

extern "C" cudaError_t cuda_mla_attention_mma(cudaStream_t stream, const float *q_abs, const struct paged_latent *kv,
                                              const struct attn_batch *b, int n_heads, const int32_t *sel,
                                              int sel_k, float scale, float *o_lat, int rows, int keys, int stages,
                                              int n_splits, float *work, int pdl)
{
    if (b->n_tokens <= 0)
        return cudaSuccess;
    mma_params p;
    latent_params_fill(p, q_abs, kv, b, n_heads, sel, sel_k, scale, n_splits, o_lat, work);
    latent_rows_fill(p, kv);
    const bool fp8 = kv->dtype == KV_DTYPE_FP8;
    p.rows = rows;
    p.stages = stages;
    p.head_blocks = (n_heads + rows - 1) / rows;
    p.ld = plan_mla_mma_ld(p.Dk);
    int64_t blocks = (int64_t)b->n_tokens * p.head_blocks;
    if (!cuda_mla_mma_takes_cache(kv) || n_splits < 1 || n_splits > PLAN_ATTN_MAX_SPLITS || (n_splits > 1 && !work) ||
        (sel && sel_k < 1) || blocks > 0x7fffffff || !cuda_mla_mma_fits(n_heads, p.Dk, p.R, rows, keys, stages, ~(size_t)0))
        return cudaErrorInvalidValue;
    size_t smem = plan_mla_mma_smem(rows, keys, p.Dk, stages);
    void (*kernel)(mma_params) =
        fp8 ? (keys == 16 ? mla_mma_kernel<16, true> : keys == 32 ? mla_mma_kernel<32, true> : mla_mma_kernel<64, true>)
            : (keys == 16 ? mla_mma_kernel<16, false> : keys == 32 ? mla_mma_kernel<32, false> : mla_mma_kernel<64, false>);
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)blocks, (unsigned)n_splits);
    e = launch_pdl(pdl != 0, kernel, grid, dim3((unsigned)(rows / 16 * 32 * PARTS)), smem, stream, p);
    if (e != cudaSuccess || n_splits == 1)
        return e;
    return cuda_mla_merge(stream, work, n_splits, b->n_tokens * n_heads, p.R, o_lat, pdl);
}
