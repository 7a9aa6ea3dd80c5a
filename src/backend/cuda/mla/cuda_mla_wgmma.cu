/* cuda_mla_wgmma.cu — MLA attention in latent space on Hopper warpgroup MMA (wgmma, sm_90a only),
 * over a bf16 or fp8 latent cache: the plan's "mla_latent_attn_wgmma_bf16".
 *
 * The contract of cuda_mla_mma.cu's kernel (backend_ops.mla_attention), with the same precision:
 * the keys and values are the cache's values exactly, the query and the softmax weights are split
 * into bf16 hi + lo (two products each), so the result is fp32-grade; an fp8 cache's scales enter
 * where they factor out of the products, per 128-value block, as there.
 *
 * A block takes all 64 head rows of one token (fewer heads: zero rows) and a share of its keys
 * (split-K, merged by cuda_mla_merge()), 32 keys a tile, two warpgroups:
 *   S (64 heads x 32 keys) = Q K^T: wgmma with both operands in shared memory, the query as A,
 *     the key tile as B. Warpgroup g takes half of the k-steps; the halves are summed through
 *     shared memory (warpgroup 1's part to warpgroup 0, the sum back), so both hold the same S
 *     and run the same online softmax on it.
 *   O (64 heads x R) += P V: P straight from S's accumulators as wgmma's A in registers (the
 *     accumulator layout is the A fragment's), V as B read from the same key tile, transposed by
 *     the instruction (MN-major). Warpgroup g owns value columns [g R/2, (g+1) R/2) in 128-wide
 *     n-tiles: 128 accumulators a thread at R 512.
 * So a key byte staged serves 64 heads where mla_mma's 16- or 32-row blocks read each key two or
 * four times per token; the price is the query: 64 rows x Dk x (hi, lo) = 147 KB at GLM-5's 576,
 * beside two 36 KB key tiles, 225 KB of shared memory, which only the sm_90 budget holds (and only
 * sm_90 has wgmma).
 *
 * Shared memory, no swizzle, in wgmma's 8 x 8 core matrices (128 contiguous bytes, 8 rows of 16
 * bytes): the query [Dk / 8][8 row groups][8 rows][8 values] (hi, then lo); a key tile [Dk / 8]
 * [4 key groups][8 keys][8 values], two stages, filled by cp.async (bf16) or through registers
 * (fp8 codes -> bf16, exact); that one layout is B for both products: K-major for S (8 values
 * of a key contiguous) and MN-major for P V (8 value columns of a key contiguous). Then the S
 * exchange (16 x 128 f32) and the fp8 scales [2][32 keys][ceil(Dk / 128)];
 * plan_mla_wgmma_smem() is the formula.
 *
 * Pipeline per tile: wait for its keys; a barrier; the next tile's loads go out; S's wgmmas, their
 * wait; the exchange; softmax; P V and its wait. The body exists only in the sm_90a image
 * (__CUDA_ARCH_FEAT_SM90_ALL).
 */
#include "backend/cuda/mla/mla.h"
#include <math.h>

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_mma.cuh"
#include "backend/cuda/common/cuda_wgmma.cuh"
#include "backend/cuda/mla/cuda_latent.cuh"
extern "C" {
#include "plan/plan.h"
}

namespace
{

constexpr int MW_ROWS = PLAN_MLA_WGMMA_ROWS; /* head rows a block: wgmma's M */

struct mw_params {
    const float *q;     /* (T, H, Dk) */
    const void *latent; /* bf16 rows of Dk, or fp8 rows of row_bytes (cuda_latent.cuh) */
    int row_bytes, nb;  /* fp8: bytes a row, scales a row */
    const int32_t *sel; /* (T, sel_k) or NULL */
    int sel_k;
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size;
    int n_tokens, H, Dk, R;
    int head_blocks;
    float scale;
    int n_splits;
    float *out;  /* (T, H, R) when n_splits == 1 */
    float *part; /* (n_splits, T, H, R + 2) otherwise: m, l, unnormalised O */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int MW_KEYS = PLAN_MLA_WGMMA_KEYS;  /* keys a tile: S's N */
constexpr int MW_NT = PLAN_MLA_WGMMA_R / 256; /* 128-column P V n-tiles a warpgroup */
constexpr int MW_QB = 12;                     /* query loads a thread keeps in flight while staging */

/* A shared-memory operand's descriptor (common/cuda_wgmma.cuh) from its generic address. */
__device__ __forceinline__ uint64_t mw_desc(const void *p, uint32_t lbo, uint32_t sbo)
{
    return wgmma_desc((uint32_t)__cvta_generic_to_shared(p), lbo, sbo);
}

/* Pins an A fragment's computation before the fence that follows (as wgmma_fence_acc()). */
__device__ __forceinline__ void mw_pin(uint32_t (&a)[4])
{
#pragma unroll
    for (int i = 0; i < 4; i++)
        asm volatile("" : "+r"(a[i])::"memory");
}

/* d (64 heads x 32 keys, fp32) += A (64 x 16, descriptor, K-major) B (16 x 32 keys, descriptor, K-major) */
__device__ __forceinline__ void mw_qk(float (&d)[16], uint64_t a, uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, "
                 "0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15])
                 : "l"(a), "l"(b), "r"(1));
}

/* acc += the query's (hi, then lo) products with the key tile over k-steps kk0 .. kk0 + CNT - 1
 * (core-matrix layouts: the file's header). */
template <int CNT>
__device__ __forceinline__ void mw_qk_steps(float (&acc)[16], const uint16_t *Qh, const uint16_t *Ql,
                                            const uint16_t *K, int kk0)
{
    constexpr int KG = MW_KEYS / 8;
#pragma unroll
    for (int i = 0; i < CNT; i++) {
        const int kk = kk0 + i;
        const uint64_t dk = mw_desc(K + (size_t)kk * 2 * KG * 64, KG * 128, 128);
        mw_qk(acc, mw_desc(Qh + (size_t)kk * 1024, 1024, 128), dk);
        mw_qk(acc, mw_desc(Ql + (size_t)kk * 1024, 1024, 128), dk);
    }
}

#endif

/* grid (T * head_blocks, n_splits), 256 threads. One function past 100 lines: the O accumulators
 * (128 registers a thread) live through every phase of the tile loop. */
template <bool FP8>
__global__ void __launch_bounds__(256, 1) mla_wgmma_kernel(mw_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int TN = MW_KEYS, KG = TN / 8;
    pdl_wait(); /* PDL: the previous kernel's writes are visible from here */
    extern __shared__ __align__(128) uint16_t mw_sm[];
    constexpr int Dk = PLAN_MLA_WGMMA_DK, R = PLAN_MLA_WGMMA_R, ksteps = Dk / 16, cpr = Dk / 8;
    constexpr int nbs = PLAN_MLA_MMA_SCALE_BLOCKS(Dk);
    static_assert(Dk == 576 && R == 512, "the k-step split below: latent blocks 2g, 2g + 1, rope 32 + 2g");
    uint16_t *Qh = mw_sm, *Ql = Qh + (size_t)MW_ROWS * Dk, *Kb = Ql + (size_t)MW_ROWS * Dk;
    float *Sx = (float *)(Kb + (size_t)2 * TN * Dk); /* warpgroup 1's S part, then the sum */
    float *Scb = Sx + 16 * 128;                      /* FP8: [2][TN][nbs] */
    __shared__ int kpos[2][TN]; /* each key slot's position (-1: none), for the softmax's mask */
    const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, g = warp / 4, wt = tid % 128;
    const int t = blockIdx.x / p.head_blocks, h0 = (blockIdx.x % p.head_blocks) * MW_ROWS, split = blockIdx.y;
    const int nh = p.H - h0 < MW_ROWS ? p.H - h0 : MW_ROWS;
    const int pos = p.pos[t];
    const int n_keys = p.sel ? (pos + 1 < p.sel_k ? pos + 1 : p.sel_k) : pos + 1;
    int lo = 0, hi = n_keys;
    if (p.n_splits > 1) {
        int chunk = (n_keys + p.n_splits - 1) / p.n_splits;
        chunk = (chunk + TN - 1) / TN * TN; /* whole tiles */
        lo = split * chunk < n_keys ? split * chunk : n_keys;
        hi = lo + chunk < n_keys ? lo + chunk : n_keys;
    }
    /* the query as hi + lo in core matrices: a warp unit is 8 heads x 16 values, a lane 4 values
     * of one head (64 contiguous bytes a head read, 8-byte stores two to a 16-byte row) */
    {
        const int units = 8 * ksteps, hr = lane / 4, dq = (lane % 4) * 4;
        for (int u0 = warp; u0 < units; u0 += 8 * MW_QB) {
            float4 v[MW_QB];
#pragma unroll
            for (int i = 0; i < MW_QB; i++) {
                const int u = u0 + 8 * i, h = (u % 8) * 8 + hr, d = (u / 8) * 16 + dq;
                v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (u < units && h < nh)
                    v[i] = __ldg((const float4 *)(p.q + ((size_t)t * p.H + h0 + h) * Dk + d));
            }
#pragma unroll
            for (int i = 0; i < MW_QB; i++) {
                const int u = u0 + 8 * i, h = (u % 8) * 8 + hr, d = (u / 8) * 16 + dq;
                if (u >= units)
                    break;
                const size_t at = ((size_t)(d / 8) * 8 + h / 8) * 64 + (h % 8) * 8 + d % 8;
                uint32_t h0w, l0w, h1w, l1w;
                mma_split_bf16x2(v[i].x, v[i].y, h0w, l0w);
                mma_split_bf16x2(v[i].z, v[i].w, h1w, l1w);
                *(uint2 *)(Qh + at) = make_uint2(h0w, h1w);
                *(uint2 *)(Ql + at) = make_uint2(l0w, l1w);
            }
        }
    }

    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    const int32_t *sel = p.sel ? p.sel + (size_t)t * p.sel_k : nullptr;
    /* A tile: a warp takes key group kg = warp % KG and every (8 / KG)-th 4-chunk group; a lane key
     * kg * 8 + lane % 8, chunk c = 4 cg + lane / 8 (a warp's stores: 4 whole core-matrix rows of
     * 128 bytes, no bank conflict). */
    auto load = [&](int k0, int buf) {
        const int nk = hi - k0 < TN ? hi - k0 : TN;
        const int kg = warp % KG, jj = kg * 8 + lane % 8;
        const int kp = jj < nk ? (sel ? __ldg(sel + k0 + jj) : k0 + jj) : -1;
        const size_t slot =
            kp >= 0 ? (size_t)blocks[kp / p.block_size] * p.block_size + kp % p.block_size : 0;
        uint16_t *dst = Kb + (size_t)buf * TN * Dk + kg * 64 + (lane % 8) * 8;
        if (warp < KG && lane < 8)
            kpos[buf][jj] = kp;
        for (int cg = warp / KG; cg < cpr / 4; cg += 8 / KG) {
            const int c = cg * 4 + lane / 8;
            uint16_t *d = dst + (size_t)c * KG * 64;
            if (kp < 0) { /* past the keys or -1 padding: zeros (masked, and weight 0 times 0) */
                *(uint4 *)d = make_uint4(0, 0, 0, 0);
                continue;
            }
            if constexpr (FP8) {
                const uint8_t *row = (const uint8_t *)p.latent + slot * (size_t)p.row_bytes;
                uint4 v;
                if (c * 8 < R) { /* 8 codes -> 8 bf16 values */
                    const uint32_t w0 = *(const uint32_t *)(row + c * 8),
                                   w1 = *(const uint32_t *)(row + c * 8 + 4);
                    v = make_uint4(e4m3x2_to_bf16x2(w0 & 0xffffu), e4m3x2_to_bf16x2(w0 >> 16),
                                   e4m3x2_to_bf16x2(w1 & 0xffffu), e4m3x2_to_bf16x2(w1 >> 16));
                } else { /* 8 rope values, already bf16 */
                    const uint32_t *r = (const uint32_t *)(row + R + 4 * p.nb + 2 * (c * 8 - R));
                    v = make_uint4(r[0], r[1], r[2], r[3]);
                }
                *(uint4 *)d = v;
            } else {
                cp_async16(d, (const uint16_t *)p.latent + slot * Dk + c * 8);
            }
        }
        if constexpr (FP8) { /* the scales; 0 for missing keys (their weight 0 must stay 0 in P V) */
            float *sc = Scb + (size_t)buf * TN * nbs;
            for (int i = tid; i < TN * nbs; i += 256) {
                const int j = i / nbs, b = i % nbs;
                const int kq = j < nk ? (sel ? sel[k0 + j] : k0 + j) : -1;
                float v = 0.0f;
                if (kq >= 0 && b < p.nb) {
                    const size_t sl = (size_t)blocks[kq / p.block_size] * p.block_size + kq % p.block_size;
                    v = *(const float *)((const uint8_t *)p.latent + sl * (size_t)p.row_bytes + R + 4 * b);
                }
                sc[i] = v;
            }
        }
        cp_async_commit(); /* FP8: an empty group, so the waits count alike */
    };

    float o[MW_NT][64];
#pragma unroll
    for (int n = 0; n < MW_NT; n++)
#pragma unroll
        for (int i = 0; i < 64; i++)
            o[n][i] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f,
          l_b = 0.0f; /* rows lane/4 and lane/4 + 8 of the warp */
    const int n_tiles = (hi - lo + TN - 1) / TN;
    if (n_tiles > 0)
        load(lo, 0);
    for (int it = 0; it < n_tiles; it++) {
        const int k0 = lo + it * TN, buf = it & 1;
        cp_async_wait_upto(0);
        wgmma_fence_proxy();
        __syncthreads();
        if (it + 1 < n_tiles)
            load(k0 + TN, buf ^ 1); /* streams in under this tile */
        const uint16_t *K = Kb + (size_t)buf * TN * Dk;
        const float *Ksc = Scb + (size_t)buf * TN * nbs; /* FP8 */

        /* S: this warpgroup's k-steps; FP8: a 128-value block's products at a time, each scaled by
         * its keys' scales of that block (1 for the rope part) */
        float s[16];
#pragma unroll
        for (int i = 0; i < 16; i++)
            s[i] = 0.0f;
        /* Warpgroup g: latent blocks 2g and 2g + 1 (k-steps 16g ..) and rope k-steps 32 + 2g, 33 +
         * 2g: the same trip counts in both warpgroups (a count that depends on g reads to ptxas as
         * a divergent path, which serialises the wgmmas), and under FP8 one accumulator a block */
        if constexpr (FP8) {
            float s0[16], s1[16];
#pragma unroll
            for (int i = 0; i < 16; i++)
                s0[i] = s1[i] = 0.0f;
            wgmma_fence_acc(s), wgmma_fence_acc(s0), wgmma_fence_acc(s1); /* the zeros before the fence */
            wgmma_fence();
            mw_qk_steps<8>(s0, Qh, Ql, K, 16 * g);
            mw_qk_steps<8>(s1, Qh, Ql, K, 16 * g + 8);
            mw_qk_steps<2>(s, Qh, Ql, K, 32 + 2 * g);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_acc(s), wgmma_fence_acc(s0), wgmma_fence_acc(s1);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int key = (i / 4) * 8 + 2 * (lane & 3) + (i & 1);
                s[i] = fmaf(s1[i], Ksc[key * nbs + 2 * g + 1], fmaf(s0[i], Ksc[key * nbs + 2 * g], s[i]));
            }
        } else {
            wgmma_fence_acc(s);
            wgmma_fence();
            mw_qk_steps<16>(s, Qh, Ql, K, 16 * g);
            mw_qk_steps<2>(s, Qh, Ql, K, 32 + 2 * g);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_acc(s);
        }
        /* warpgroup 1's part to warpgroup 0, which adds its own first and hands the sum back */
        if (g == 1)
#pragma unroll
            for (int i = 0; i < 16; i++)
                Sx[i * 128 + wt] = s[i];
        __syncthreads();
        if (g == 0)
#pragma unroll
            for (int i = 0; i < 16; i++) {
                s[i] += Sx[i * 128 + wt];
                Sx[i * 128 + wt] = s[i];
            }
        __syncthreads();
        if (g == 1)
#pragma unroll
            for (int i = 0; i < 16; i++)
                s[i] = Sx[i * 128 + wt];

        /* online softmax over this tile; the 4 lanes of a row reduce by shuffles */
        float al_a, al_b;
        mma_softmax_tile<16>([&](int i) -> float & { return s[i]; }, p.scale,
                             [&](int key) { return kpos[buf][key] >= 0; }, m_a, m_b, l_a, l_b, al_a, al_b);
#pragma unroll
        for (int n = 0; n < MW_NT; n++)
#pragma unroll
            for (int i = 0; i < 64; i++)
                o[n][i] *= (i & 2) ? al_b : al_a;

        /* O += P V: n-tile n of this warpgroup is value columns c0 = (g * MW_NT + n) * 128. P's
         * fragments for keys 16 k2.. (this thread's: ka, ka + 1 in s[8 k2 ..], ka + 8, ka + 9 in
         * s[8 k2 + 4 ..]), times the keys' scales of the columns' block under FP8 (one set a
         * n-tile; bf16: one set), all built, and O's rescale done, before the fence: a register
         * write between two wgmmas makes ptxas serialise them */
        constexpr int NF = FP8 ? MW_NT : 1;
        uint32_t ph[NF][TN / 16][4], pl[NF][TN / 16][4];
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int k2 = 0; k2 < TN / 16; k2++) {
                const int ka = k2 * 16 + 2 * (lane & 3);
                float a0 = 1.0f, a1 = 1.0f, b0 = 1.0f, b1 = 1.0f;
                if constexpr (FP8) {
                    const int blk = (g * MW_NT + f) * 128 / KV_FP8_BLOCK;
                    a0 = Ksc[ka * nbs + blk], a1 = Ksc[(ka + 1) * nbs + blk];
                    b0 = Ksc[(ka + 8) * nbs + blk], b1 = Ksc[(ka + 9) * nbs + blk];
                }
                const float *sa = s + 8 * k2;
                mma_split_bf16x2(sa[0] * a0, sa[1] * a1, ph[f][k2][0], pl[f][k2][0]);
                mma_split_bf16x2(sa[2] * a0, sa[3] * a1, ph[f][k2][1], pl[f][k2][1]);
                mma_split_bf16x2(sa[4] * b0, sa[5] * b1, ph[f][k2][2], pl[f][k2][2]);
                mma_split_bf16x2(sa[6] * b0, sa[7] * b1, ph[f][k2][3], pl[f][k2][3]);
                mw_pin(ph[f][k2]);
                mw_pin(pl[f][k2]);
            }
        wgmma_fence_acc(o[0]);
        wgmma_fence_acc(o[1]);
        wgmma_fence();
#pragma unroll
        for (int n = 0; n < MW_NT; n++)
#pragma unroll
            for (int k2 = 0; k2 < TN / 16; k2++) {
                const int c0 = (g * MW_NT + n) * 128;
                const uint64_t dv = mw_desc(K + ((size_t)(c0 / 8) * KG + 2 * k2) * 64, 128, KG * 128);
                wgmma_rs_n128<1>(o[n], pl[FP8 ? n : 0][k2], dv); /* V as stored: MN-major */
                wgmma_rs_n128<1>(o[n], ph[FP8 ? n : 0][k2], dv);
            }
        /* retired here: left in flight across the loop's back edge, ptxas serialises every wgmma
         * (C7515); the next tile's loads went out before S, so they still overlap all of this */
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_acc(o[0]);
        wgmma_fence_acc(o[1]);
    }
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    /* each quad writes 32 contiguous bytes of a row: whole sectors */
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = (warp % 4) * 16 + lane / 4 + 8 * half;
        if (r >= nh)
            continue;
        const float m = half ? m_b : m_a, l = half ? l_b : l_a;
        const float inv = p.n_splits == 1 ? 1.0f / l : 1.0f;
        const size_t th = (size_t)t * p.H + h0 + r;
        float *dst =
            p.n_splits == 1 ? p.out + th * R : p.part + ((size_t)split * p.n_tokens * p.H + th) * (R + 2) + 2;
#pragma unroll
        for (int n = 0; n < MW_NT; n++) {
            const int c0 = (g * MW_NT + n) * 128 + 2 * (lane & 3);
#pragma unroll
            for (int j = 0; j < 16; j++)
                *(float2 *)(dst + c0 + j * 8) =
                    make_float2(o[n][j * 4 + half * 2] * inv, o[n][j * 4 + half * 2 + 1] * inv);
        }
        if (p.n_splits > 1 && g == 0 && (lane & 3) == 0) {
            float *ml = p.part + ((size_t)split * p.n_tokens * p.H + th) * (R + 2);
            ml[0] = m;
            ml[1] = l;
        }
    }
#endif
}

} // namespace

extern "C" int cuda_mla_wgmma_fits(int n_heads, int k_dim, int v_dim, size_t budget)
{
    return n_heads > 0 && k_dim == PLAN_MLA_WGMMA_DK && v_dim == PLAN_MLA_WGMMA_R &&
           plan_mla_wgmma_smem(k_dim) + 256 <= budget;
}

extern "C" int cuda_mla_wgmma_takes_cache(const struct paged_latent *kv)
{
    return kv->dtype == KV_DTYPE_BF16 ||
           (kv->dtype == KV_DTYPE_FP8 && fp8_dims_ok(kv->kv_rank, kv->rope_dim));
}

extern "C" cudaError_t cuda_mla_attention_wgmma(cudaStream_t stream, const float *q_abs,
                                                const struct paged_latent *kv, const struct attn_batch *b,
                                                int n_heads, const int32_t *sel, int sel_k, float scale,
                                                float *o_lat, int n_splits, float *work, int pdl)
{
    if (b->n_tokens <= 0)
        return cudaSuccess;
    mw_params p;
    latent_params_fill(p, q_abs, kv, b, n_heads, sel, sel_k, scale, n_splits, o_lat, work);
    latent_rows_fill(p, kv);
    const bool fp8 = kv->dtype == KV_DTYPE_FP8;
    p.head_blocks = (n_heads + MW_ROWS - 1) / MW_ROWS;
    int64_t blocks = (int64_t)b->n_tokens * p.head_blocks;
    if (!cuda_mla_wgmma_takes_cache(kv) || n_splits < 1 || n_splits > PLAN_ATTN_MAX_SPLITS ||
        (n_splits > 1 && !work) || (sel && sel_k < 1) || blocks > 0x7fffffff ||
        !cuda_mla_wgmma_fits(n_heads, p.Dk, p.R, ~(size_t)0))
        return cudaErrorInvalidValue;
    const size_t smem = plan_mla_wgmma_smem(p.Dk);
    void (*kernel)(mw_params) = fp8 ? mla_wgmma_kernel<true> : mla_wgmma_kernel<false>;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    e = launch_pdl(pdl != 0, kernel, dim3((unsigned)blocks, (unsigned)n_splits), dim3(256), smem, stream, p);
    if (e != cudaSuccess || n_splits == 1)
        return e;
    return cuda_mla_merge(stream, work, n_splits, b->n_tokens * n_heads, p.R, o_lat, pdl);
}
