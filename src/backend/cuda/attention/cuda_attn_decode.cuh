/* cuda_attn_decode.cuh — the split decode attention's block (see cuda_attn_decode.cu for the
 * design): its parameters, shapes and attn_split_block, which attn_decode_split_kernel runs.
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_ATTN_DECODE_CUH
#define MOESERVE_BACKEND_CUDA_CUDA_ATTN_DECODE_CUH

#include <math.h>

#include "backend/cuda/common/cuda_common.cuh"

namespace
{

/* AD_CLUSTER: the splits a cluster merges in shared memory (8: the portable cluster size) */
enum { AD_THREADS = 128, AD_WARPS = AD_THREADS / 32, AD_MAX_SPLITS = 64, AD_CLUSTER = 8 };

struct adec_params {
    const float *q; /* (n_tokens, n_heads, hd) */
    const float *kc, *vc;
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size, n_kv, hd, n_heads, group, n_splits;
    int n_tokens;      /* of the batch: a token's last n_tokens keys may be written by this pass */
    int push;          /* CL > 1: the splits push their partials into the leader's dynamic shared
                          memory (adec_push_smem bytes), 0: the leader pulls them */
    float scale;
    float *out;        /* (n_tokens, n_heads, hd) */
    float *part_o;     /* (n_tokens * n_kv, n_splits, group, hd) */
    float *part_ml;    /* (n_tokens * n_kv, n_splits, group, 2) */
    int *sem;          /* (n_tokens * n_kv), zero between launches */
};

/* Sum over the warp of NV values per lane; afterwards v[m] (m < NV / 32) holds the total of the
 * value index m + (NV / 32) * lane. Each step sends the half this lane does not keep. */
template <int NV> __device__ __forceinline__ void warp_reduce_scatter(float (&v)[NV])
{
    const int lane = threadIdx.x % 32;
    int n = NV;
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        if (n <= NV / 32)
            break;
        const bool upper = (lane & o) != 0;
        const int half = n / 2;
#pragma unroll
        for (int i = 0; i < NV / 2; i++) {
            if (i < half) {
                float send = upper ? v[i] : v[i + half];
                float keep = upper ? v[i + half] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        }
        n = half;
    }
}

/* The dynamic shared memory of a cluster's push merge: the partial outputs and (max, sum) of
 * the cluster's splits but the leader's, (CL - 1) x group x hd floats and (CL - 1) x group float2. */
__host__ __device__ constexpr size_t adec_push_smem(int cl, int group, int hd)
{
    return (size_t)(cl - 1) * (size_t)group * ((size_t)hd * 4 + 8);
}

/* Keys per round: 64 (key, head) pairs per warp keep the reduce-scatter at 2 values per lane. */
template <int NH> struct adec_shape {
    static constexpr int kpw = NH >= 16 ? 4 : 8; /* keys per warp per round */
    static constexpr int round = AD_WARPS * kpw;
    static constexpr int nv = kpw * NH;
};

/* The keys a split takes: klen keys over n_splits, in whole rounds of `round` keys. */
__device__ __forceinline__ int adec_chunk(int klen, int n_splits, int round)
{
    int chunk = (klen + n_splits - 1) / n_splits;
    return (chunk < round ? round : chunk + round - 1) / round * round;
}

/* One (token t, KV head g, key split) of the split decode attention, by a block of AD_THREADS
 * threads. The caller has not waited for its predecessor: the block reads the batch metadata and
 * issues its first round of old keys and values first, then calls wait() (every block calls it
 * once, those without keys too). Nothing the pass writes is read before that: the metadata is
 * uploaded before the pass's first kernel, and the keys a pass writes for a token's sequence are
 * its last n_tokens positions at most (the batch's tokens of that sequence), so keys below
 * klen - n_tokens were written by earlier passes. This takes the slot-table and cache round trips
 * off the path after the wait (they overlap attn_prep).
 * mark(i) is called at the phase boundaries (2: the first round's dot products, 3: its scores in
 * shared memory, 4: all rounds, 5: the partials out (counted in, or the cluster's first barrier
 * passed), 6: merged, 7: the cluster's second barrier passed), for kernel-trace builds.
 * CL > 1: the block is one of a thread block cluster of CL consecutive splits (caps "clusters").
 * The cluster's first split merges the cluster's partials from the others' shared memory
 * (distributed shared memory, two cluster barriers) instead of through global memory, a fence
 * and an atomic: in the kernel trace the global merge takes 2.5k cycles to count in and 7.5k more
 * in the last block (H200, 192 keys in 6 splits, docs/lab/journal.md). When one cluster holds
 * every split with keys (klen <= CL * chunk: 256 keys for 8 splits of 32) that block writes the
 * output; with more, the clusters' leaders merge as the splits do without clusters.
 * With p.push the other splits store their partials into the leader's dynamic shared memory
 * (adec_push_smem) and leave; one barrier phase, and the leader merges from its own memory. The
 * pull form's merge takes ~4k cycles in the same trace: three rounds of remote loads between two
 * cluster barriers. Every block arrives once at its start ("started": the leader's memory
 * may be written after the matching wait); blocks without keys leave then (exited threads do
 * not hold a cluster barrier up). */
template <int NH, int CL, typename Wait, typename Mark>
__device__ __forceinline__ void attn_split_block(const adec_params &p, const int t, const int g,
                                                 const int split, Wait wait, Mark mark)
{
    using S = adec_shape<NH>;
    constexpr int KPW = S::kpw, ROUND = S::round, NV = S::nv;
    __shared__ float sc[NH][ROUND];
    __shared__ float s_m[NH], s_l[NH], s_alpha[NH];
    __shared__ __align__(16) float4 red[AD_WARPS][NH][32];
    __shared__ float wts[AD_MAX_SPLITS][NH];
    __shared__ float s_cm[NH], s_cl[NH]; /* a cluster's merged max and sum */
    __shared__ int s_last;
    extern __shared__ float4 adec_dyn[]; /* CL > 1 with p.push: the pushed partials */
    const int G = p.group, hd = p.hd, hd4 = hd / 4;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if constexpr (CL > 1) {
        if (p.push)
            cluster_arrive_relaxed(); /* phase 0: this block has started */
    }
    const int klen = p.pos[t] + 1;
    const int chunk = adec_chunk(klen, p.n_splits, ROUND);
    const int active = (klen + chunk - 1) / chunk;
    if (split >= active) {
        wait(); /* as every block of the kernel, so that its end implies its predecessor's */
        if constexpr (CL > 1) {
            if (!p.push && split - split % CL < active) { /* the cluster has keys: its two barriers */
                cluster_sync();
                cluster_sync();
            }
        }
        return;
    }
    const int lo = split * chunk, hi = lo + chunk < klen ? lo + chunk : klen;
    const size_t tg = (size_t)t * p.n_kv + g;
    const bool dim_ok = lane < hd4;
    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    const size_t kv_stride = (size_t)p.n_kv * hd;
    const size_t head_off = (size_t)g * hd + 4 * (size_t)lane;

    /* a round's keys [from, to) of this warp into kr / vr (the others are left as they are); the
     * slot of key kw + j is in lane j's my_slot */
    float4 kr[KPW], vr[KPW];
    auto load_keys = [&](int kw, size_t my_slot, int from, int to) {
#pragma unroll
        for (int j = 0; j < KPW; j++) {
            size_t sj = (size_t)__shfl_sync(0xffffffffu, (unsigned long long)my_slot, j);
            if (kw + j >= from && kw + j < to && dim_ok) {
                kr[j] = __ldg((const float4 *)(p.kc + sj * kv_stride + head_off));
                vr[j] = __ldg((const float4 *)(p.vc + sj * kv_stride + head_off));
            }
        }
    };
    auto slot_of = [&](int kw) {
        const int my_key = kw + lane % KPW;
        size_t my_slot = 0;
        if (my_key < hi)
            my_slot = (size_t)__ldg(blocks + my_key / p.block_size) * p.block_size + my_key % p.block_size;
        return my_slot;
    };
#pragma unroll
    for (int j = 0; j < KPW; j++)
        kr[j] = vr[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    /* the first round: its old keys before the wait, the rest after it */
    const int kw0 = lo + warp * KPW;
    const size_t slot0 = slot_of(kw0);
    const int old_end = klen - p.n_tokens < hi ? klen - p.n_tokens : hi;
    load_keys(kw0, slot0, lo, old_end);
    wait();
    load_keys(kw0, slot0, old_end > lo ? old_end : lo, hi);

    float4 q[NH];
#pragma unroll
    for (int h = 0; h < NH; h++) {
        q[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h < G && dim_ok) {
            float4 v = __ldcg((const float4 *)(p.q + ((size_t)t * p.n_heads + (size_t)g * G + h) * hd) + lane);
            q[h] = make_float4(v.x * p.scale, v.y * p.scale, v.z * p.scale, v.w * p.scale);
        }
    }
    if (threadIdx.x < NH)
        s_m[threadIdx.x] = -INFINITY, s_l[threadIdx.x] = 0.0f;
    float4 acc[NH];
#pragma unroll
    for (int h = 0; h < NH; h++)
        acc[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int k0 = lo; k0 < hi; k0 += ROUND) {
        const int kw = k0 + warp * KPW; /* this warp's first key */
        if (k0 != lo) { /* the first round's are in already */
#pragma unroll
            for (int j = 0; j < KPW; j++)
                kr[j] = vr[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            load_keys(kw, slot_of(kw), kw, hi);
        }
        float v[NV];
#pragma unroll
        for (int j = 0; j < KPW; j++)
#pragma unroll
            for (int h = 0; h < NH; h++)
                v[j * NH + h] =
                    fmaf(q[h].x, kr[j].x, fmaf(q[h].y, kr[j].y, fmaf(q[h].z, kr[j].z, q[h].w * kr[j].w)));
        if (k0 == lo)
            mark(2);
        warp_reduce_scatter<NV>(v);
#pragma unroll
        for (int m = 0; m < NV / 32; m++) {
            int i = m + (NV / 32) * lane, j = i / NH, h = i % NH;
            sc[h][warp * KPW + j] = kw + j < hi ? v[m] : -INFINITY;
        }
        __syncthreads();
        if (k0 == lo)
            mark(3);
        /* online softmax over the round: warp w takes heads w, w + 4, ...; lane = key */
        for (int h = warp; h < G; h += AD_WARPS) {
            float s = lane < ROUND ? sc[h][lane] : -INFINITY;
            float m_old = s_m[h], m_new = fmaxf(m_old, warp_max(s));
            float e = s == -INFINITY ? 0.0f : expf(s - m_new);
            if (lane < ROUND)
                sc[h][lane] = e;
            float l = warp_sum(e);
            __syncwarp(); /* every lane has read s_m[h] before lane 0 replaces it */
            if (lane == 0) {
                float a = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                s_alpha[h] = a;
                s_l[h] = s_l[h] * a + l;
                s_m[h] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int h = 0; h < NH; h++) {
            if (h >= G)
                break;
            float a = s_alpha[h];
            float4 o = make_float4(acc[h].x * a, acc[h].y * a, acc[h].z * a, acc[h].w * a);
#pragma unroll
            for (int j = 0; j < KPW; j++) {
                float pj = sc[h][warp * KPW + j];
                o.x = fmaf(pj, vr[j].x, o.x);
                o.y = fmaf(pj, vr[j].y, o.y);
                o.z = fmaf(pj, vr[j].z, o.z);
                o.w = fmaf(pj, vr[j].w, o.w);
            }
            acc[h] = o;
        }
        __syncthreads(); /* sc and s_alpha are rewritten by the next round */
    }

    mark(4);
    /* the warps' accumulators -> this split's output (with clusters: red[0], for the leader;
     * pushed: the leader's adec_dyn, slot rank - 1) */
    const bool direct = CL == 1 && active == 1;
    const int rank = split % CL;
    float4 *const pushed = adec_dyn;                                             /* (CL - 1, G, hd4) */
    float2 *const pushed_ml = (float2 *)(adec_dyn + (size_t)(CL - 1) * G * hd4); /* (CL - 1, G) */
#pragma unroll
    for (int h = 0; h < NH; h++)
        if (h < G)
            red[warp][h][lane] = acc[h];
    if constexpr (CL > 1) {
        if (p.push)
            cluster_wait(); /* phase 0 passed: every block of the cluster has started */
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * hd4; i += AD_THREADS) {
        int h = i / hd4, d4 = i % hd4;
        float4 o = red[0][h][d4];
#pragma unroll
        for (int w = 1; w < AD_WARPS; w++) {
            float4 b = red[w][h][d4];
            o.x += b.x, o.y += b.y, o.z += b.z, o.w += b.w;
        }
        if (direct) {
            float l = s_l[h];
            float4 *dst = (float4 *)(p.out + ((size_t)t * p.n_heads + (size_t)g * G + h) * hd) + d4;
            *dst = make_float4(o.x / l, o.y / l, o.z / l, o.w / l);
        } else if (CL > 1) {
            if (p.push && rank != 0)
                *cluster_peer(pushed + (size_t)(rank - 1) * G * hd4 + i, 0u) = o;
            else
                red[0][h][d4] = o; /* only this thread reads or writes entry (h, d4) */
        } else {
            float4 *dst = (float4 *)(p.part_o + ((tg * p.n_splits + split) * G + h) * hd) + d4;
            *dst = o;
        }
    }
    if (direct)
        return;
    /* the partial this block counts in with: its own, or its cluster's (pidx of pcount) */
    int pidx = split, pcount = active;
    if constexpr (CL > 1) {
        pidx = split / CL, pcount = (active + CL - 1) / CL;
        if (p.push) {
            const int n_in = active - (split - rank) < CL ? active - (split - rank) : CL;
            if (rank != 0) { /* the (max, sum) too, then arrive with release and leave */
                if (threadIdx.x < G)
                    *cluster_peer(pushed_ml + (size_t)(rank - 1) * G + threadIdx.x, 0u) =
                        make_float2(s_m[threadIdx.x], s_l[threadIdx.x]);
                cluster_arrive();
                return;
            }
            cluster_arrive_relaxed();
            cluster_wait(); /* phase 1: the splits' partials are in adec_dyn */
            mark(5);
            if (threadIdx.x < G) { /* the merge weights, in split order as the global merge */
                const int h = threadIdx.x;
                float mr[CL], lr[CL], M = -INFINITY;
#pragma unroll
                for (int r = 0; r < CL; r++) {
                    if (r < n_in) {
                        const float2 ml =
                            r == 0 ? make_float2(s_m[h], s_l[h]) : pushed_ml[(size_t)(r - 1) * G + h];
                        mr[r] = ml.x, lr[r] = ml.y, M = fmaxf(M, ml.x);
                    }
                }
                float L = 0.0f;
#pragma unroll
                for (int r = 0; r < CL; r++) {
                    if (r < n_in) {
                        const float w = lr[r] > 0.0f ? expf(mr[r] - M) : 0.0f;
                        wts[r][h] = w;
                        L += lr[r] * w;
                    }
                }
                s_cm[h] = M, s_cl[h] = L;
            }
            __syncthreads();
            for (int i = threadIdx.x; i < G * hd4; i += AD_THREADS) {
                const int h = i / hd4, d4 = i % hd4;
                float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int r = 0; r < CL; r++) {
                    if (r < n_in) {
                        const float w = wts[r][h];
                        const float4 b = r == 0 ? red[0][h][d4] : pushed[(size_t)(r - 1) * G * hd4 + i];
                        o.x = fmaf(w, b.x, o.x);
                        o.y = fmaf(w, b.y, o.y);
                        o.z = fmaf(w, b.z, o.z);
                        o.w = fmaf(w, b.w, o.w);
                    }
                }
                if (pcount == 1) {
                    const float L = s_cl[h];
                    float4 *dst = (float4 *)(p.out + ((size_t)t * p.n_heads + (size_t)g * G + h) * hd) + d4;
                    *dst = make_float4(o.x / L, o.y / L, o.z / L, o.w / L);
                } else {
                    float4 *dst = (float4 *)(p.part_o + ((tg * p.n_splits + pidx) * G + h) * hd) + d4;
                    *dst = o;
                }
            }
            mark(6);
            if (pcount == 1)
                return;
            if (threadIdx.x < G) /* the cluster's max and sum, for the merge of the clusters */
                s_m[threadIdx.x] = s_cm[threadIdx.x], s_l[threadIdx.x] = s_cl[threadIdx.x];
            __syncthreads();
        }
    }
    if (CL > 1 && !p.push) {
        const int base = split - split % CL, n_in = active - base < CL ? active - base : CL;
        cluster_sync(); /* every split's s_m, s_l and red[0] are written */
        mark(5);
        if (split == base) {
            if (threadIdx.x < G) { /* the merge weights, in split order as the global merge */
                const int h = threadIdx.x;
                float mr[CL], M = -INFINITY;
#pragma unroll
                for (int r = 0; r < CL; r++)
                    if (r < n_in)
                        mr[r] = *cluster_peer(&s_m[h], (unsigned)r), M = fmaxf(M, mr[r]);
                float L = 0.0f;
#pragma unroll
                for (int r = 0; r < CL; r++) {
                    if (r < n_in) {
                        const float ls = *cluster_peer(&s_l[h], (unsigned)r);
                        const float w = ls > 0.0f ? expf(mr[r] - M) : 0.0f;
                        wts[r][h] = w;
                        L += ls * w;
                    }
                }
                s_cm[h] = M, s_cl[h] = L;
            }
            __syncthreads();
            for (int i = threadIdx.x; i < G * hd4; i += AD_THREADS) {
                const int h = i / hd4, d4 = i % hd4;
                float4 b[CL];
#pragma unroll
                for (int r = 0; r < CL; r++)
                    if (r < n_in)
                        b[r] = *cluster_peer(&red[0][h][d4], (unsigned)r);
                float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int r = 0; r < CL; r++) {
                    if (r < n_in) {
                        const float w = wts[r][h];
                        o.x = fmaf(w, b[r].x, o.x);
                        o.y = fmaf(w, b[r].y, o.y);
                        o.z = fmaf(w, b[r].z, o.z);
                        o.w = fmaf(w, b[r].w, o.w);
                    }
                }
                if (pcount == 1) {
                    const float L = s_cl[h];
                    float4 *dst = (float4 *)(p.out + ((size_t)t * p.n_heads + (size_t)g * G + h) * hd) + d4;
                    *dst = make_float4(o.x / L, o.y / L, o.z / L, o.w / L);
                } else {
                    float4 *dst = (float4 *)(p.part_o + ((tg * p.n_splits + pidx) * G + h) * hd) + d4;
                    *dst = o;
                }
            }
        }
        if (split == base)
            mark(6);
        cluster_sync(); /* the leader is done with the others' shared memory */
        mark(7);
        if (pcount == 1 || split != base)
            return;
        if (threadIdx.x < G) /* the cluster's max and sum, for the merge of the clusters */
            s_m[threadIdx.x] = s_cm[threadIdx.x], s_l[threadIdx.x] = s_cl[threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.x < G)
        ((float2 *)p.part_ml)[(tg * p.n_splits + pidx) * G + threadIdx.x] =
            make_float2(s_m[threadIdx.x], s_l[threadIdx.x]);

    /* count in; the last split's block merges (writes before the count, reads after it) */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        s_last = atomicAdd(p.sem + tg, 1) == pcount - 1;
    __syncthreads();
    mark(5);
    if (!s_last)
        return;
    __threadfence();
    /* every split's (max, sum) in one round trip: the maxima into wts, the sums into red (free
     * now: AD_WARPS * NH * 128 floats >= AD_MAX_SPLITS * NH) */
    const float2 *ml = (const float2 *)p.part_ml + tg * p.n_splits * G;
    float *sums = (float *)red;
    for (int i = threadIdx.x; i < pcount * G; i += AD_THREADS) {
        float2 v = __ldcg(ml + i);
        wts[i / G][i % G] = v.x; /* the split's max for now */
        sums[i] = v.y;
    }
    __syncthreads();
    if (threadIdx.x < G) {
        const int h = threadIdx.x;
        float M = -INFINITY;
        for (int s = 0; s < pcount; s++)
            M = fmaxf(M, wts[s][h]);
        float L = 0.0f;
        for (int s = 0; s < pcount; s++) {
            float ls = sums[s * G + h];
            float w = ls > 0.0f ? expf(wts[s][h] - M) : 0.0f;
            wts[s][h] = w;
            L += ls * w;
        }
        s_l[h] = L;
    }
    __syncthreads();
    const float4 *po = (const float4 *)(p.part_o + tg * p.n_splits * G * hd);
    const size_t split_stride4 = (size_t)G * hd4;
    for (int i = threadIdx.x; i < G * hd4; i += AD_THREADS) {
        int h = i / hd4;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int s = 0; s < pcount; s++) {
            float w = wts[s][h];
            float4 b = __ldcg(po + s * split_stride4 + i);
            o.x = fmaf(w, b.x, o.x);
            o.y = fmaf(w, b.y, o.y);
            o.z = fmaf(w, b.z, o.z);
            o.w = fmaf(w, b.w, o.w);
        }
        float L = s_l[h];
        float4 *dst = (float4 *)(p.out + ((size_t)t * p.n_heads + (size_t)g * G) * hd) + i;
        *dst = make_float4(o.x / L, o.y / L, o.z / L, o.w / L);
    }
    if (threadIdx.x == 0)
        p.sem[tg] = 0; /* ready for the next launch (graph replays reuse it) */
    mark(6);
}

} // namespace

#endif
