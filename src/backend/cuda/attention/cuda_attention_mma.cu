/* cuda_attention_mma.cu — causal paged GQA attention for prefill on bf16 tensor cores
 * (mma.sync m16n8k16, fp32 accumulation, sm_80 and later): the plan's "attn_prefill_mma_bf16".
 *
 * Same contract as attn_kernel (cuda_attention.cu) with n_splits == 1: rows are (token, head
 * of the KV group) pairs, token-major, so all rows of a block share one KV head's K and V; a
 * row at position p sees keys 0..p of its sequence; a batch may mix sequences: a block walks
 * the keys once per sequence among its rows, the other rows masked out of that pass.
 *
 * Precision is kept near the fp32 kernel's, not bf16's: q, K, V and the probabilities P are
 * split into bf16 hi + lo (x - hi rounded again: ~16 significant bits together) and
 *   S = Qhi Khi + Qhi Klo + Qlo Khi,   O += Phi Vhi + Phi Vlo + Plo Vhi (+ Plo Vlo)
 * with fp32 accumulation; the online softmax (max, sum, rescale) runs in fp32 registers. P V
 * keeps its lo x lo: there the error lands on the output unscaled (a row of few keys is a plain
 * mix of V rows). A CPU emulation of this arithmetic on uniform [-1, 1) inputs (the ops
 * test's) gave 6.6e-6 of max |out| at worst (rows of 1..8 keys), 8.2e-6 without P V's lo x lo,
 * against the fp32 tolerance of 1e-5. The error of S grows with |scores| (q and k each
 * carry ~2^-17): with 16x larger q it reached 4e-5.
 * Two lower precisions (cfg->prec, head_dim 128 only, --attention-precision; off by default):
 *   1 "pv_bf16": S as above, O += Phi Vhi (P and V single bf16; one P V product of four);
 *   2 "bf16": S = Qhi Khi, O += Phi Vhi (what a bf16 engine computes; two products of seven).
 * ncu on the 2048-token prefill (H200, docs/lab/journal.md): tensor pipe 31%, issue 36%, the
 * largest stall "wait" (the accumulator chains of the seven products): the product count is the
 * lever.
 *
 * Tile: `rows` query rows (16 per warp) x `keys` keys per step. Shared memory (bytes):
 *   Q hi/lo 4 x rows x hd | K, V hi/lo 4 x keys x 2hd | stages 2: K, V fp32 4 x keys x 2hd |
 *   row data 16 x rows
 * (cuda_attention_mma_smem; the planner's formula for the variant). With stages 2, the next
 * step's fp32 K/V rows are copied by cp.async while this step's MMAs run; the conversion to
 * hi/lo happens once per block, not once per warp. The bf16 tiles are rows of hd elements
 * whose 16-byte chunks are XOR-swizzled by (row % 8), so that the 8 row addresses of an
 * ldmatrix hit 8 distinct bank groups without padding.
 * Warp w owns query rows 16w..16w+15 and all of hd: per KC keys it computes S (16 x KC),
 * masks and updates its softmax state, and adds P V, P taken straight from the S registers
 * (the m16n8 accumulator layout is the m16k16 A-operand layout). A warp skips the keys past
 * its rows' last position (the causal triangle), the block stages the keys up to the last
 * position of all its rows.
 *
 * Deliberately not here: split-K (decode is cuda_attn_decode.cu's and cuda_attention.cu's), head
 * dims other than 64/128/256 (the caller falls back to the fp32 kernel), a K/V cache in any type
 * but fp32.
 */
#include "backend/cuda/attention/attention.h"
#include <math.h>

#include <cuda_bf16.h>

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_mma.cuh"

namespace
{

enum { AM_MAX_ROWS = 128, AM_MAX_THREADS = AM_MAX_ROWS / 16 * 32, AM_MAX_KEYS = 256 };

/* The 4th P V product (lo x lo): see the file comment. */
constexpr bool AM_PV_LO_LO = true;

struct am_params {
    const float *q;  /* (n_tokens, n_heads, hd) */
    const float *kc; /* (slots, n_kv, hd) */
    const float *vc;
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size, n_kv;
    int n_tokens, n_heads, group;
    int rows, keys, stages;
    float scale_log2; /* scale * log2(e): scores in base 2 for exp2f */
    float *out;       /* (n_tokens, n_heads, hd) */
};

__host__ __device__ inline size_t am_smem_bytes(int rows, int keys, int hd, int stages)
{
    size_t kv = (size_t)keys * 2 * (size_t)hd * 4; /* K and V: hi + lo bf16, or fp32 */
    return (size_t)rows * (size_t)hd * 4 + kv * (stages >= 2 ? 2 : 1) + (size_t)rows * 16;
}

/* Element offset of (row, col) in a [rows][HD] bf16 tile with swizzled 16-byte chunks; the
 * 8 elements of a chunk stay together (needs HD >= 64: 8 chunks per row). */
template <int HD>
__device__ __forceinline__ int swz(int row, int col)
{
    return row * HD + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

/* 4 consecutive elements (off % 4 == 0) into the hi and (LO) lo tiles */
template <bool LO = true>
__device__ __forceinline__ void store_split4(uint16_t *hi, uint16_t *lo, int off, float4 v)
{
    uint32_t h0, h1, l0, l1;
    mma_split_bf16x2(v.x, v.y, h0, l0);
    mma_split_bf16x2(v.z, v.w, h1, l1);
    *(uint2 *)(hi + off) = make_uint2(h0, h1);
    if constexpr (LO)
        *(uint2 *)(lo + off) = make_uint2(l0, l1);
}

__device__ __forceinline__ void cp_async_wait_all()
{
    cp_async_wait_upto(0);
}

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* c += (ah + al)(bh + bl), the small products first; lo x lo only when asked */
template <bool LO_LO>
__device__ __forceinline__ void mma_split(float c[4], const uint32_t ah[4], const uint32_t al[4],
                                          const uint32_t bh[2], const uint32_t bl[2])
{
    if constexpr (LO_LO)
        mma_bf16(c, al, bl);
    mma_bf16(c, al, bh);
    mma_bf16(c, ah, bl);
    mma_bf16(c, ah, bh);
}

/* Element offset of key kk's head kvh in the paged cache */
__device__ __forceinline__ size_t kv_offset(const am_params &p, const int32_t *blocks, int kvh, int kk,
                                            int hd)
{
    size_t slot = (size_t)blocks[kk / p.block_size] * (size_t)p.block_size + (size_t)(kk % p.block_size);
    return (slot * (size_t)p.n_kv + (size_t)kvh) * (size_t)hd;
}

/* Starts the fp32 copy of keys k0..k0+nk-1 (K and V) into kf / vf ([keys][HD], dense). */
template <int HD>
__device__ __forceinline__ void kv_fetch_async(const am_params &p, const int32_t *blocks, int kvh, int k0,
                                               int nk, float *kf, float *vf)
{
    constexpr int C = HD / 4;
    for (int i = threadIdx.x; i < nk * C; i += blockDim.x) {
        int j = i / C, d = (i % C) * 4;
        size_t src = kv_offset(p, blocks, kvh, k0 + j, HD) + (size_t)d;
        cp_async16(kf + j * HD + d, p.kc + src);
        cp_async16(vf + j * HD + d, p.vc + src);
    }
    cp_async_commit();
}

/* The step's K and V as hi/lo tiles (lo only where QK_LO / PV_LO), rows nk..keys-1 zero (their
 * P is 0, but 0 x NaN is not): from the fp32 copy in kf / vf when there is one, else straight
 * from the cache. */
template <int HD, bool QK_LO, bool PV_LO>
__device__ __forceinline__ void kv_stage(const am_params &p, const int32_t *blocks, int kvh, int k0, int nk,
                                         const float *kf, const float *vf, uint16_t *kh, uint16_t *kl,
                                         uint16_t *vh, uint16_t *vl)
{
    constexpr int C = HD / 4;
    for (int i = threadIdx.x; i < p.keys * C; i += blockDim.x) {
        int j = i / C, d = (i % C) * 4;
        float4 k = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v = k;
        if (j < nk && kf) {
            k = *(const float4 *)(kf + j * HD + d);
            v = *(const float4 *)(vf + j * HD + d);
        } else if (j < nk) {
            size_t src = kv_offset(p, blocks, kvh, k0 + j, HD) + (size_t)d;
            k = __ldg((const float4 *)(p.kc + src));
            v = __ldg((const float4 *)(p.vc + src));
        }
        int off = swz<HD>(j, d);
        store_split4<QK_LO>(kh, kl, off, k);
        store_split4<PV_LO>(vh, vl, off, v);
    }
}

/* A warp's running state: O (16 rows x HD, m16n8 accumulator layout: this thread's rows are
 * lane / 4 and lane / 4 + 8), the rows' maxima (base 2) and this thread's part of their sums. */
template <int HD>
struct am_state {
    float o[HD / 8][4];
    float m[2];
    float l[2];
};

/* One warp, its 16 query rows (from qrow0) against tile keys [c0, c0 + KC) of the staged step
 * whose first key is k0; keys from lim on are not live. pa / pb: the positions of this thread's
 * two rows in this pass (-1: not in it). */
template <int HD, int KC, bool QK_LO, bool PV_LO>
__device__ __forceinline__ void attend_chunk(am_state<HD> &st, const uint16_t *qh, const uint16_t *ql,
                                             const uint16_t *kh, const uint16_t *kl, const uint16_t *vh,
                                             const uint16_t *vl, int qrow0, int k0, int c0, int lim, int pa,
                                             int pb, float scale_log2)
{
    const int lane = threadIdx.x % 32, qc = lane % 4;
    const int live = lim - c0;
    float s[KC / 8][4];
#pragma unroll
    for (int j = 0; j < KC / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s[j][e] = 0.0f;

    /* S = Q K^T; ldmatrix x4 row addresses: A (Q) rows lane % 16, columns + 8 for lanes 16..31;
     * B (K, keys as rows) matrices (keys +0, dims +0), (+0, +8), (+8, +0), (+8, +8) */
    const int a_row = qrow0 + (lane & 15), a_col = (lane >> 4) * 8;
    const int b_row = c0 + (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        uint32_t ah[4], al[4];
        mma_ldsm_x4(ah, qh + swz<HD>(a_row, 16 * ks + a_col));
        if constexpr (QK_LO)
            mma_ldsm_x4(al, ql + swz<HD>(a_row, 16 * ks + a_col));
#pragma unroll
        for (int jp = 0; jp < KC / 16; jp++) {
            if (16 * jp >= live)
                continue;
            uint32_t bh[4], bl[4];
            mma_ldsm_x4(bh, kh + swz<HD>(b_row + 16 * jp, 16 * ks + b_col));
            if constexpr (QK_LO) {
                mma_ldsm_x4(bl, kl + swz<HD>(b_row + 16 * jp, 16 * ks + b_col));
                mma_split<false>(s[2 * jp], ah, al, bh, bl);
                mma_split<false>(s[2 * jp + 1], ah, al, bh + 2, bl + 2);
            } else {
                mma_bf16(s[2 * jp], ah, bh);
                mma_bf16(s[2 * jp + 1], ah, bh + 2);
            }
        }
    }

    /* causal mask, chunk maxima */
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < KC / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = c0 + 8 * j + 2 * qc + (e & 1);
            bool ok = key < lim && k0 + key <= (e < 2 ? pa : pb);
            s[j][e] = ok ? s[j][e] * scale_log2 : -INFINITY;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
        }
    float base[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        float mn = fmaxf(st.m[h], mx[h]);
        base[h] = mn == -INFINITY ? 0.0f : mn; /* no live key yet: exp2(-inf - 0) = 0, not NaN */
        alpha[h] = exp2f(st.m[h] - base[h]);
        st.m[h] = mn;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < KC / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[j][e] = exp2f(s[j][e] - base[e >> 1]);
            sum[e >> 1] += s[j][e];
        }
#pragma unroll
    for (int h = 0; h < 2; h++)
        st.l[h] = st.l[h] * alpha[h] + sum[h];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        st.o[n][0] *= alpha[0], st.o[n][1] *= alpha[0];
        st.o[n][2] *= alpha[1], st.o[n][3] *= alpha[1];
    }

    /* O += P V; V (keys as rows) through ldmatrix.trans: matrices (keys +0, dims +0), (+8, +0),
     * (+0, +8), (+8, +8) give the B fragments of dims n8 tiles 2np and 2np + 1 */
    const int v_row = c0 + (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < KC / 16; kk++) {
        if (16 * kk >= live)
            continue;
        uint32_t ph[4], pl[4];
        mma_split_bf16x2(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
        mma_split_bf16x2(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
        mma_split_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
        mma_split_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
        for (int np = 0; np < HD / 16; np++) {
            uint32_t bh[4], bl[4];
            mma_ldsm_x4_trans(bh, vh + swz<HD>(v_row + 16 * kk, 16 * np + v_col));
            if constexpr (PV_LO) {
                mma_ldsm_x4_trans(bl, vl + swz<HD>(v_row + 16 * kk, 16 * np + v_col));
                mma_split<AM_PV_LO_LO>(st.o[2 * np], ph, pl, bh, bl);
                mma_split<AM_PV_LO_LO>(st.o[2 * np + 1], ph, pl, bh + 2, bl + 2);
            } else {
                mma_bf16(st.o[2 * np], ph, bh);
                mma_bf16(st.o[2 * np + 1], ph, bh + 2);
            }
        }
    }
}

template <int HD, bool QK_LO = true, bool PV_LO = true>
__global__ void __launch_bounds__(AM_MAX_THREADS) attn_mma_kernel(am_params p)
{
    constexpr int KC = HD >= 256 ? 16 : 64; /* keys per softmax chunk: S is KC / 2 registers */
    extern __shared__ __align__(16) unsigned char am_smem[];
    const int R = p.rows, TN = p.keys;
    uint16_t *qh = (uint16_t *)am_smem, *ql = qh + R * HD;
    uint16_t *kh = ql + R * HD, *kl = kh + TN * HD, *vh = kl + TN * HD, *vl = vh + TN * HD;
    float *kf = p.stages >= 2 ? (float *)(vl + TN * HD) : nullptr;
    float *vf = p.stages >= 2 ? kf + TN * HD : nullptr;
    int *rpos = (int *)(vl + TN * HD + (p.stages >= 2 ? 4 * TN * HD : 0));
    int *rseq = rpos + R, *rdone = rseq + R, *next = rdone + R; /* next: this pass's sequence, last pos */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int kvh = blockIdx.y;
    const int64_t row0 = (int64_t)blockIdx.x * R, total = (int64_t)p.n_tokens * p.group;

    for (int r = tid; r < R; r += blockDim.x) {
        int64_t rg = row0 + r;
        bool in = rg < total;
        int t = in ? (int)(rg / p.group) : 0;
        rpos[r] = in ? p.pos[t] : -1;
        rseq[r] = in ? p.seq[t] : -1;
        rdone[r] = !in;
    }
    for (int i = tid; i < R * (HD / 4); i += blockDim.x) {
        int r = i / (HD / 4), d = (i % (HD / 4)) * 4;
        int64_t rg = row0 + r;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (rg < total) {
            int t = (int)(rg / p.group), h = kvh * p.group + (int)(rg % p.group);
            v = __ldg((const float4 *)(p.q + ((size_t)t * p.n_heads + h) * HD + d));
        }
        store_split4<QK_LO>(qh, ql, swz<HD>(r, d), v);
    }

    am_state<HD> st;
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
        st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.0f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.0f;
    const int ra = warp * 16 + lane / 4, rb = ra + 8; /* this thread's rows */

    for (;;) {
        __syncthreads();
        if (tid == 0) {
            /* the next sequence among the rows not yet done, and its last position */
            int cur = -1, kmax = -1;
            for (int r = 0; r < R; r++) {
                if (rdone[r])
                    continue;
                if (cur < 0)
                    cur = rseq[r];
                if (rseq[r] == cur && rpos[r] > kmax)
                    kmax = rpos[r];
            }
            next[0] = cur;
            next[1] = kmax;
        }
        __syncthreads();
        const int cur = next[0], klen = next[1] + 1;
        if (cur < 0)
            break;
        const int pa = !rdone[ra] && rseq[ra] == cur ? rpos[ra] : -1;
        const int pb = !rdone[rb] && rseq[rb] == cur ? rpos[rb] : -1;
        const int wend = __reduce_max_sync(0xffffffffu, max(pa, pb)) + 1; /* this warp needs keys < wend */
        const int32_t *blocks = p.table + (size_t)cur * p.max_blocks;
        if (kf && klen > 0)
            kv_fetch_async<HD>(p, blocks, kvh, 0, min(TN, klen), kf, vf);
        for (int k0 = 0; k0 < klen; k0 += TN) {
            const int nk = min(TN, klen - k0);
            if (kf)
                cp_async_wait_all();
            __syncthreads(); /* this step's fp32 copy landed; every warp is done with the last tiles */
            kv_stage<HD, QK_LO, PV_LO>(p, blocks, kvh, k0, nk, kf, vf, kh, kl, vh, vl);
            __syncthreads(); /* tiles ready; the fp32 copy is free again */
            if (kf && k0 + TN < klen)
                kv_fetch_async<HD>(p, blocks, kvh, k0 + TN, min(TN, klen - k0 - TN), kf, vf);
            const int lim = min(nk, wend - k0);
            for (int c0 = 0; c0 < lim; c0 += KC)
                attend_chunk<HD, KC, QK_LO, PV_LO>(st, qh, ql, kh, kl, vh, vl, warp * 16, k0, c0, lim, pa, pb,
                                                   p.scale_log2);
        }
        __syncthreads(); /* every thread has read rdone for this pass */
        for (int r = tid; r < R; r += blockDim.x)
            if (!rdone[r] && rseq[r] == cur)
                rdone[r] = 1;
    }

    /* every row's state is final: the four threads of a row add their parts of its sum */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = st.l[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        int64_t rg = row0 + (h ? rb : ra);
        if (rg >= total)
            continue;
        int t = (int)(rg / p.group), head = kvh * p.group + (int)(rg % p.group);
        float *dst = p.out + ((size_t)t * p.n_heads + head) * HD + 2 * (lane % 4);
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2 *)(dst + 8 * n) = make_float2(st.o[n][2 * h] / l, st.o[n][2 * h + 1] / l);
    }
}

template <int HD, bool QK_LO = true, bool PV_LO = true>
cudaError_t launch_hd(cudaStream_t stream, const am_params &p, const cuda_attn_mma_cfg *cfg, dim3 grid)
{
    auto kernel = attn_mma_kernel<HD, QK_LO, PV_LO>;
    if (cfg->smem_bytes > 48 * 1024) {
        cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cfg->smem_bytes);
        if (e != cudaSuccess)
            return e;
    }
    kernel<<<grid, (unsigned)cfg->threads, cfg->smem_bytes, stream>>>(p);
    return CUDA_LAUNCH_RESULT();
}

int clamp16(int v, int lo, int hi)
{
    v = v / 16 * 16;
    return v < lo ? lo : v > hi ? hi : v;
}

} // namespace

extern "C" size_t cuda_attention_mma_smem(int rows, int keys, int head_dim, int stages)
{
    return am_smem_bytes(rows, keys, head_dim, stages);
}

extern "C" int cuda_attention_mma_fit(struct cuda_attn_mma_cfg *cfg, int head_dim, size_t budget)
{
    if (head_dim != 64 && head_dim != 128 && head_dim != 256)
        return 0;
    cfg->rows = clamp16(cfg->rows, 16, AM_MAX_ROWS);
    cfg->keys = clamp16(cfg->keys, 16, AM_MAX_KEYS);
    cfg->stages = cfg->stages >= 2 ? 2 : 1;
    for (;;) {
        size_t bytes = am_smem_bytes(cfg->rows, cfg->keys, head_dim, cfg->stages);
        if (bytes <= budget) {
            cfg->threads = cfg->rows / 16 * 32;
            cfg->smem_bytes = bytes;
            return 1;
        }
        /* keys down to 32 (a step still pays for its two barriers), rows down to 64 (4 warps
         * share each staged step), then no prefetch, then keys and rows down to 16 */
        if (cfg->keys > 32)
            cfg->keys = clamp16(cfg->keys / 2, 32, AM_MAX_KEYS);
        else if (cfg->rows > 64)
            cfg->rows = clamp16(cfg->rows / 2, 64, AM_MAX_ROWS);
        else if (cfg->stages > 1)
            cfg->stages = 1;
        else if (cfg->keys > 16)
            cfg->keys = 16;
        else if (cfg->rows > 16)
            cfg->rows = clamp16(cfg->rows / 2, 16, AM_MAX_ROWS);
        else
            return 0;
    }
}

extern "C" int cuda_attention_mma_supported(const float *q, const struct paged_kv *kv, const float *out)
{
    int hd = kv->head_dim;
    return (hd == 64 || hd == 128 || hd == 256) && kv->n_kv_heads <= 65535 &&
           ((uintptr_t)q | (uintptr_t)kv->k | (uintptr_t)kv->v) % 16 == 0 && (uintptr_t)out % 8 == 0;
}

extern "C" cudaError_t cuda_attention_mma(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                                          const struct attn_batch *b, int n_heads, float scale, float *out,
                                          const struct cuda_attn_mma_cfg *cfg)
{
    if (b->n_tokens <= 0)
        return cudaSuccess;
    const int hd = kv->head_dim;
    if (kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads || !cuda_attention_mma_supported(q, kv, out) ||
        cfg->rows % 16 || cfg->rows < 16 || cfg->rows > AM_MAX_ROWS || cfg->keys % 16 || cfg->keys < 16 ||
        cfg->keys > AM_MAX_KEYS || cfg->threads != cfg->rows / 16 * 32 ||
        cfg->smem_bytes != am_smem_bytes(cfg->rows, cfg->keys, hd, cfg->stages))
        return cudaErrorInvalidValue; /* not fitted by cuda_attention_mma_fit for this head_dim */
    am_params p;
    p.q = q;
    p.kc = kv->k;
    p.vc = kv->v;
    p.pos = b->pos;
    p.seq = b->seq;
    p.table = b->block_table;
    p.max_blocks = b->max_blocks;
    p.block_size = kv->block_size;
    p.n_kv = kv->n_kv_heads;
    p.n_tokens = b->n_tokens;
    p.n_heads = n_heads;
    p.group = n_heads / kv->n_kv_heads;
    p.rows = cfg->rows;
    p.keys = cfg->keys;
    p.stages = cfg->stages >= 2 ? 2 : 1;
    p.scale_log2 = scale * 1.4426950408889634f;
    p.out = out;
    int64_t row_tiles = ((int64_t)p.n_tokens * p.group + p.rows - 1) / p.rows;
    if (row_tiles > 0x7fffffff)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)row_tiles, (unsigned)p.n_kv);
    switch (hd) {
    case 64: return launch_hd<64>(stream, p, cfg, grid);
    case 128:
        /* the lower precisions only for head_dim 128 (Qwen3, GLM-4.5): fewer kernels to build */
        return cfg->prec == 2   ? launch_hd<128, false, false>(stream, p, cfg, grid)
               : cfg->prec == 1 ? launch_hd<128, true, false>(stream, p, cfg, grid)
                                : launch_hd<128>(stream, p, cfg, grid);
    default: return launch_hd<256>(stream, p, cfg, grid);
    }
}
