/* cuda_attention.cu — causal GQA attention over the paged KV cache, fp32.
 *
 * attn_kernel, two uses:
 *  - prefill (n_splits == 1): a block takes `rows` query rows of one KV head
 *    (rows are (token, head-of-the-group) pairs, token-major) and walks the
 *    keys 0..max(pos) of their sequence in steps of `keys`, staging each
 *    step's K and V in dynamic shared memory once for all its rows: a
 *    tile_m x tile_n flash-attention tile with an online softmax.
 *  - decode (n_splits > 1): the same blocks, but each also takes one of
 *    n_splits contiguous key ranges (split-K), writes its unnormalised
 *    partial (max, sum, acc[head_dim]) to a workspace, and attn_merge_kernel
 *    combines the splits. This keeps the GPU busy when there are few query
 *    rows and long contexts.
 * attn_decode_kernel replaces attn_kernel for the split decode where the
 * group and head_dim fit it (one block per (token, KV head, split), see its
 * comment); attn_merge_kernel combines its partials too. The backend's usual
 * split decode is cuda_attn_decode.cu's one-kernel form; these kernels run
 * where that one does not take the shape.
 * The batch may mix sequences: a block whose rows belong to several
 * sequences processes them one sequence at a time (each K/V tile is staged
 * for one sequence), so any batch is correct; the usual batch (one
 * sequence's tokens contiguous) needs one pass.
 *
 * Layout per block (floats): Q[rows][hd], O[rows][hd], K[keys][hd+1] (the
 * +1 keeps the per-lane key reads free of bank conflicts), V[keys][hd],
 * m[rows], l[rows], P[warps][keys]; ints: token, pos, seq, done per row.
 * Warp w owns rows w, w + warps, ...: lanes split the keys for the scores
 * and the head dimension for the P.V update. head_dim is a run-time value.
 *
 * Deliberately not here: tensor cores (the prefill's are cuda_attention_mma.cu),
 * a KV cache in any type but fp32, sliding windows.
 */
#include "backend/cuda/attention/attention.h"
#include <math.h>

#include "backend/cuda/common/cuda_common.cuh"

namespace
{

enum { MAX_SPLITS = 64, MIN_SPLIT_KEYS = 16 };


struct attn_params {
    const float *q;  /* (n_tokens, n_heads, hd) */
    const float *kc; /* (slots, n_kv, hd) */
    const float *vc;
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size, n_kv, hd;
    int n_tokens, n_heads, group;
    int rows, keys;
    float scale;
    int n_splits;
    float *out;  /* (n_tokens, n_heads, hd) when n_splits == 1 */
    float *part; /* (n_splits, n_tokens, n_heads, hd + 2) otherwise */
};

__host__ __device__ inline size_t attn_smem_floats(int rows, int keys, int hd, int warps)
{
    return (size_t)rows * hd * 2 + (size_t)keys * (hd + 1) + (size_t)keys * hd + (size_t)rows * 2 +
           (size_t)warps * keys + (size_t)rows * 4 /* ints */;
}

__global__ void attn_kernel(attn_params p)
{
    extern __shared__ float smem[];
    const int R = p.rows, TN = p.keys, hd = p.hd;
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *Qs = smem;
    float *Os = Qs + (size_t)R * hd;
    float *Ks = Os + (size_t)R * hd;
    float *Vs = Ks + (size_t)TN * (hd + 1);
    float *Ms = Vs + (size_t)TN * hd;
    float *Ls = Ms + R;
    float *Ps = Ls + R;
    int *rtok = (int *)(Ps + (size_t)warps * TN);
    int *rpos = rtok + R;
    int *rseq = rpos + R;
    int *rdone = rseq + R;
    __shared__ int s_cur, s_kmax;

    const int g = blockIdx.y, split = blockIdx.z;
    const int64_t row0 = (int64_t)blockIdx.x * R, total = (int64_t)p.n_tokens * p.group;

    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        int64_t rg = row0 + r;
        if (rg < total) {
            int t = (int)(rg / p.group);
            rtok[r] = t;
            rpos[r] = p.pos[t];
            rseq[r] = p.seq[t];
            rdone[r] = 0;
        } else {
            rtok[r] = -1;
            rpos[r] = -1;
            rseq[r] = -1;
            rdone[r] = 1;
        }
        Ms[r] = -INFINITY;
        Ls[r] = 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < R * hd; i += blockDim.x) {
        int r = i / hd, d = i % hd;
        float qv = 0.0f;
        if (rtok[r] >= 0) {
            int h = g * p.group + (int)((row0 + r) % p.group);
            qv = p.q[((size_t)rtok[r] * p.n_heads + h) * hd + d];
        }
        Qs[i] = qv;
        Os[i] = 0.0f;
    }

    for (;;) {
        __syncthreads();
        if (threadIdx.x == 0) {
            /* the next sequence among the rows not yet done, and its last key */
            int cur = -1, kmax = -1;
            for (int r = 0; r < R; r++) {
                if (rdone[r])
                    continue;
                if (cur < 0)
                    cur = rseq[r];
                if (rseq[r] == cur && rpos[r] > kmax)
                    kmax = rpos[r];
            }
            s_cur = cur;
            s_kmax = kmax;
        }
        __syncthreads();
        const int cur = s_cur;
        if (cur < 0)
            break;
        const int klen = s_kmax + 1;
        int lo = 0, hi = klen;
        if (p.n_splits > 1) {
            /* at least MIN_SPLIT_KEYS keys per split: the split count is fixed by the launch (a
             * captured graph replays it at every length), so short contexts leave the last
             * splits empty instead of cutting the keys into slivers */
            int chunk = (klen + p.n_splits - 1) / p.n_splits;
            chunk = chunk < MIN_SPLIT_KEYS ? MIN_SPLIT_KEYS : chunk;
            lo = split * chunk < klen ? split * chunk : klen;
            hi = lo + chunk < klen ? lo + chunk : klen;
        }
        const int32_t *blocks = p.table + (size_t)cur * p.max_blocks;
        for (int k0 = lo; k0 < hi; k0 += TN) {
            const int nk = hi - k0 < TN ? hi - k0 : TN;
            for (int i = threadIdx.x; i < nk * hd; i += blockDim.x) {
                int j = i / hd, d = i % hd, kk = k0 + j;
                size_t slot = (size_t)blocks[kk / p.block_size] * p.block_size + (size_t)(kk % p.block_size);
                size_t src = (slot * p.n_kv + g) * hd + d;
                Ks[(size_t)j * (hd + 1) + d] = p.kc[src];
                Vs[(size_t)j * hd + d] = p.vc[src];
            }
            __syncthreads();
            float *Pw = Ps + (size_t)warp * TN;
            for (int r = warp; r < R; r += warps) {
                if (rdone[r] || rseq[r] != cur || rpos[r] < k0)
                    continue;
                const int nv = rpos[r] - k0 + 1 < nk ? rpos[r] - k0 + 1 : nk; /* causal: keys <= pos */
                const float *qr = Qs + (size_t)r * hd;
                float mloc = -INFINITY;
                for (int j = lane; j < nv; j += 32) {
                    const float *kr = Ks + (size_t)j * (hd + 1);
                    float dot = 0.0f;
                    for (int d = 0; d < hd; d++)
                        dot = fmaf(qr[d], kr[d], dot);
                    float s = dot * p.scale;
                    Pw[j] = s;
                    mloc = fmaxf(mloc, s);
                }
                mloc = warp_max(mloc);
                const float m_old = Ms[r];
                const float m_new = fmaxf(m_old, mloc);
                const float alpha = expf(m_old - m_new); /* 0 on the first tile (m_old = -inf) */
                float lsum = 0.0f;
                for (int j = lane; j < nv; j += 32) {
                    float e = expf(Pw[j] - m_new);
                    Pw[j] = e;
                    lsum += e;
                }
                lsum = warp_sum(lsum);
                __syncwarp();
                float *orow = Os + (size_t)r * hd;
                for (int d = lane; d < hd; d += 32) {
                    float a = orow[d] * alpha;
                    for (int j = 0; j < nv; j++)
                        a = fmaf(Pw[j], Vs[(size_t)j * hd + d], a);
                    orow[d] = a;
                }
                if (lane == 0) {
                    Ms[r] = m_new;
                    Ls[r] = Ls[r] * alpha + lsum;
                }
                __syncwarp();
            }
            __syncthreads(); /* K/V are overwritten by the next step */
        }
        for (int r = threadIdx.x; r < R; r += blockDim.x)
            if (!rdone[r] && rseq[r] == cur)
                rdone[r] = 1;
    }

    /* every row's state is final; write it out */
    for (int i = threadIdx.x; i < R * hd; i += blockDim.x) {
        int r = i / hd, d = i % hd;
        if (rtok[r] < 0)
            continue;
        int h = g * p.group + (int)((row0 + r) % p.group);
        size_t th = (size_t)rtok[r] * p.n_heads + h;
        if (p.n_splits == 1) {
            p.out[th * hd + d] = Os[i] / Ls[r];
        } else {
            float *dst = p.part + ((size_t)split * p.n_tokens * p.n_heads + th) * (size_t)(hd + 2);
            if (d == 0) {
                dst[0] = Ms[r];
                dst[1] = Ls[r];
            }
            dst[2 + d] = Os[i];
        }
    }
}

/* Decode attention: one block per (token, KV head, split), DEC_KEYS keys at a time.
 * Scores: thread i takes key i of the step and dots it with the group's query heads (q in
 * shared memory, read as float4 broadcasts): no shuffles. Softmax: warp w keeps the running
 * max and sum of heads w, w + 4, ... Values: lanes take 4 dims each (coalesced rows of V),
 * warp w accumulates its heads. Partials go out in the layout attn_merge_kernel reads (or
 * normalised, without splits). Needs group <= DEC_MAX_G, hd % 4 == 0, hd <= 4 * 32 * DEC_D4. */
enum { DEC_THREADS = 128, DEC_KEYS = DEC_THREADS, DEC_MAX_G = 16, DEC_D4 = 2 };

__global__ void __launch_bounds__(DEC_THREADS) attn_decode_kernel(attn_params p)
{
    __shared__ __align__(16) float qs[DEC_MAX_G * 4 * 32 * DEC_D4];
    __shared__ float sc[DEC_MAX_G][DEC_KEYS];
    __shared__ float run_m[DEC_MAX_G], run_l[DEC_MAX_G], alpha[DEC_MAX_G];
    __shared__ size_t slot_s[DEC_KEYS]; /* the step's cache slots: the value loop needs no table lookups */
    const int t = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
    const int G = p.group, hd = p.hd, hd4 = hd / 4;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = DEC_THREADS / 32;
    const int klen = p.pos[t] + 1;
    int lo = 0, hi = klen;
    if (p.n_splits > 1) {
        int chunk = (klen + p.n_splits - 1) / p.n_splits;
        chunk = chunk < MIN_SPLIT_KEYS ? MIN_SPLIT_KEYS : chunk;
        lo = split * chunk < klen ? split * chunk : klen;
        hi = lo + chunk < klen ? lo + chunk : klen;
    }
    /* the group's queries, pre-scaled */
    for (int i = threadIdx.x; i < G * hd; i += DEC_THREADS) {
        int h = i / hd, d = i % hd;
        qs[i] = p.q[((size_t)t * p.n_heads + (size_t)g * G + h) * hd + d] * p.scale;
    }
    if (threadIdx.x < G)
        run_m[threadIdx.x] = -INFINITY, run_l[threadIdx.x] = 0.0f;
    float4 acc[DEC_MAX_G / 4][DEC_D4];
#pragma unroll
    for (int j = 0; j < DEC_MAX_G / 4; j++)
#pragma unroll
        for (int c = 0; c < DEC_D4; c++)
            acc[j][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    const size_t kv_stride = (size_t)p.n_kv * hd;
    __syncthreads();
    for (int k0 = lo; k0 < hi; k0 += DEC_KEYS) {
        const int nk = hi - k0 < DEC_KEYS ? hi - k0 : DEC_KEYS;
        /* scores */
        if ((int)threadIdx.x < nk) {
            int kk = k0 + threadIdx.x;
            size_t slot = (size_t)blocks[kk / p.block_size] * p.block_size + (size_t)(kk % p.block_size);
            slot_s[threadIdx.x] = slot;
            const float4 *kr = (const float4 *)(p.kc + slot * kv_stride + (size_t)g * hd);
            float s[DEC_MAX_G];
#pragma unroll
            for (int h = 0; h < DEC_MAX_G; h++)
                s[h] = 0.0f;
            /* unrolled so that several rows' loads are in flight (one at a time, each waits a
             * full memory latency) */
#pragma unroll 8
            for (int d4 = 0; d4 < hd4; d4++) {
                float4 kv = kr[d4];
#pragma unroll
                for (int h = 0; h < DEC_MAX_G; h++)
                    if (h < G) {
                        float4 qv = ((const float4 *)qs)[h * hd4 + d4];
                        s[h] = fmaf(qv.x, kv.x, fmaf(qv.y, kv.y, fmaf(qv.z, kv.z, fmaf(qv.w, kv.w, s[h]))));
                    }
            }
#pragma unroll
            for (int h = 0; h < DEC_MAX_G; h++)
                if (h < G)
                    sc[h][threadIdx.x] = s[h];
        }
        __syncthreads();
        /* online softmax, warp w for heads w, w + nw, ... */
        for (int h = warp; h < G; h += nw) {
            float m = -INFINITY;
            for (int i = lane; i < nk; i += 32)
                m = fmaxf(m, sc[h][i]);
            m = warp_max(m);
            float m_new = fmaxf(run_m[h], m), l = 0.0f;
            for (int i = lane; i < nk; i += 32) {
                float e = expf(sc[h][i] - m_new);
                sc[h][i] = e;
                l += e;
            }
            l = warp_sum(l);
            if (lane == 0) {
                float a = run_m[h] == -INFINITY ? 0.0f : expf(run_m[h] - m_new);
                alpha[h] = a;
                run_l[h] = run_l[h] * a + l;
                run_m[h] = m_new;
            }
        }
        __syncthreads();
        /* values: warp w, heads w + nw * j, dims 4 * (lane + 32 c) */
#pragma unroll
        for (int j = 0; j < DEC_MAX_G / 4; j++) {
            int h = warp + nw * j;
            if (h >= G)
                continue;
            float a = alpha[h];
#pragma unroll
            for (int c = 0; c < DEC_D4; c++)
                acc[j][c].x *= a, acc[j][c].y *= a, acc[j][c].z *= a, acc[j][c].w *= a;
        }
#pragma unroll 4
        for (int i = 0; i < nk; i++) {
            const float4 *vr = (const float4 *)(p.vc + slot_s[i] * kv_stride + (size_t)g * hd);
            float4 vv[DEC_D4];
#pragma unroll
            for (int c = 0; c < DEC_D4; c++)
                vv[c] = lane + 32 * c < hd4 ? vr[lane + 32 * c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int j = 0; j < DEC_MAX_G / 4; j++) {
                int h = warp + nw * j;
                if (h >= G)
                    continue;
                float pw = sc[h][i];
#pragma unroll
                for (int c = 0; c < DEC_D4; c++) {
                    acc[j][c].x = fmaf(pw, vv[c].x, acc[j][c].x);
                    acc[j][c].y = fmaf(pw, vv[c].y, acc[j][c].y);
                    acc[j][c].z = fmaf(pw, vv[c].z, acc[j][c].z);
                    acc[j][c].w = fmaf(pw, vv[c].w, acc[j][c].w);
                }
            }
        }
        __syncthreads(); /* sc is rewritten by the next step */
    }
#pragma unroll
    for (int j = 0; j < DEC_MAX_G / 4; j++) {
        int h = warp + nw * j;
        if (h >= G)
            continue;
        size_t th = (size_t)t * p.n_heads + (size_t)g * G + h;
        float l = run_l[h];
#pragma unroll
        for (int c = 0; c < DEC_D4; c++) {
            int d4 = lane + 32 * c;
            if (d4 >= hd4)
                continue;
            float4 o = acc[j][c];
            if (p.n_splits == 1) {
                float4 *dst = (float4 *)(p.out + th * hd) + d4;
                *dst = make_float4(o.x / l, o.y / l, o.z / l, o.w / l);
            } else {
                float *dst = p.part + ((size_t)split * p.n_tokens * p.n_heads + th) * (size_t)(hd + 2);
                if (d4 == 0)
                    dst[0] = run_m[h], dst[1] = l;
                dst[2 + 4 * d4] = o.x, dst[3 + 4 * d4] = o.y, dst[4 + 4 * d4] = o.z, dst[5 + 4 * d4] = o.w;
            }
        }
    }
}

/* out[t, h, :] from the n_splits partials of (t, h); one block per (t, h). The splits'
 * maxima and sums are read in parallel into shared memory (a loop of dependent global
 * loads costs a memory latency per split), then every thread weighs its dims. */
__global__ void attn_merge_kernel(const float *part, int n_splits, int n_th, int hd, float *out)
{
    __shared__ float wts[MAX_SPLITS], sm[MAX_SPLITS], sl[MAX_SPLITS];
    __shared__ float s_l;
    size_t th = blockIdx.x;
    size_t stride = (size_t)n_th * (hd + 2);
    const float *p0 = part + th * (size_t)(hd + 2);
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
        sm[s] = p0[s * stride];
        sl[s] = p0[s * stride + 1];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = -INFINITY;
        for (int s = 0; s < n_splits; s++)
            M = fmaxf(M, sm[s]);
        float l = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            wts[s] = sl[s] > 0.0f ? expf(sm[s] - M) : 0.0f;
            l += sl[s] * wts[s];
        }
        s_l = l;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll 8
        for (int s = 0; s < n_splits; s++)
            if (wts[s] > 0.0f)
                a += p0[s * stride + 2 + d] * wts[s];
        out[th * hd + d] = a / s_l;
    }
}

} // namespace

extern "C" int cuda_attention_fit(struct cuda_attn_cfg *cfg, int head_dim, size_t budget)
{
    if (cfg->threads < 32)
        cfg->threads = 32;
    cfg->threads = (cfg->threads / 32) * 32;
    if (cfg->threads > 1024)
        cfg->threads = 1024;
    if (cfg->rows < 1)
        cfg->rows = 1;
    if (cfg->keys < 1)
        cfg->keys = 1;
    budget = budget > 256 ? budget - 256 : 0; /* room for the kernel's static shared variables */
    for (;;) {
        size_t bytes = attn_smem_floats(cfg->rows, cfg->keys, head_dim, cfg->threads / 32) * 4;
        if (bytes <= budget) {
            cfg->smem_bytes = bytes;
            return 1;
        }
        /* keys first (down to 32), then rows (down to one per warp), then both to 1 */
        if (cfg->keys > 32)
            cfg->keys /= 2;
        else if (cfg->rows > cfg->threads / 32)
            cfg->rows /= 2;
        else if (cfg->keys > 1)
            cfg->keys /= 2;
        else if (cfg->rows > 1)
            cfg->rows /= 2;
        else if (cfg->threads > 32)
            cfg->threads /= 2;
        else
            return 0;
    }
}

extern "C" size_t cuda_attention_workspace_floats(int n_tokens, int n_heads, int head_dim, int n_splits)
{
    if (n_splits <= 1)
        return 0;
    return (size_t)n_splits * (size_t)n_tokens * (size_t)n_heads * (size_t)(head_dim + 2);
}

extern "C" cudaError_t cuda_attention(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                                      const struct attn_batch *b, int n_heads, float scale, float *out,
                                      const struct cuda_attn_cfg *cfg, int n_splits, float *work)
{
    if (b->n_tokens <= 0)
        return cudaSuccess;
    if (n_heads % kv->n_kv_heads || n_splits < 1 || n_splits > MAX_SPLITS || kv->n_kv_heads > 65535 ||
        (n_splits > 1 && !work))
        return cudaErrorInvalidValue;
    attn_params p;
    p.q = q;
    p.kc = kv->k;
    p.vc = kv->v;
    p.pos = b->pos;
    p.seq = b->seq;
    p.table = b->block_table;
    p.max_blocks = b->max_blocks;
    p.block_size = kv->block_size;
    p.n_kv = kv->n_kv_heads;
    p.hd = kv->head_dim;
    p.n_tokens = b->n_tokens;
    p.n_heads = n_heads;
    p.group = n_heads / kv->n_kv_heads;
    p.rows = cfg->rows;
    p.keys = cfg->keys;
    p.scale = scale;
    p.n_splits = n_splits;
    p.out = out;
    p.part = work;
    bool dec = n_splits > 1 && p.group <= DEC_MAX_G && p.hd % 4 == 0 && p.hd <= 4 * 32 * DEC_D4 &&
               ((uintptr_t)q | (uintptr_t)kv->k | (uintptr_t)kv->v | (uintptr_t)out) % 16 == 0;
    if (dec) {
        /* one query token per block row: the decode kernel, its smem is static (~17 KB, within any budget) */
        dim3 grid((unsigned)p.n_tokens, (unsigned)p.n_kv, (unsigned)n_splits);
        attn_decode_kernel<<<grid, DEC_THREADS, 0, stream>>>(p);
    } else if (cfg->smem_bytes != attn_smem_floats(cfg->rows, cfg->keys, p.hd, cfg->threads / 32) * 4) {
        return cudaErrorInvalidValue; /* not fitted for this head_dim */
    }
    if (!dec && cfg->smem_bytes > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)cfg->smem_bytes);
        if (e != cudaSuccess)
            return e;
    }
    int64_t row_tiles = ((int64_t)p.n_tokens * p.group + p.rows - 1) / p.rows;
    if (row_tiles > 0x7fffffff)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)row_tiles, (unsigned)p.n_kv, (unsigned)n_splits);
    if (!dec)
        attn_kernel<<<grid, (unsigned)cfg->threads, cfg->smem_bytes, stream>>>(p);
    if (n_splits > 1) {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return e;
        int n_th = p.n_tokens * n_heads;
        unsigned threads = p.hd >= 128 ? 128u : p.hd > 32 ? 64u : 32u;
        attn_merge_kernel<<<(unsigned)n_th, threads, 0, stream>>>(work, n_splits, n_th, p.hd, out);
    }
    return CUDA_LAUNCH_RESULT();
}
