/* cuda_fused.cu — small ops fused so that decode launches fewer kernels.
 *
 * attn_prep: per (token, head) block, the q/k per-head RMSNorm, RoPE and the
 * KV-cache write that otherwise take five launches (rmsnorm q, rmsnorm k,
 * rope q, rope k, kv_store). Each step rounds exactly as its stand-alone
 * kernel does (cuda_norm.cu, cuda_rope.cu), so the fusion changes no bit.
 *
 * argmax: one block per row, lowest id on ties, -1 for a row with a NaN (the
 * sampler's guard: a broken forward must not silently pick token 0).
 *
 * sample: temperature, top-k and top-p on the device, so a sampled decode
 * step downloads one id per row instead of a vocabulary of logits. The kept
 * set is the CPU sampler's (engine/sampler.c; both keep ties at a cut); the
 * draw walks it in id order (the CPU walks it by descending probability),
 * so a seed gives a different but equally distributed text. One block a row:
 * on the H100 (tools/bench_sample.c, a 152k row) greedy 21 us, temperature
 * alone 57; the cuts by radix select (cut_search): top_p 0.9 673 us on a flat
 * row / 327 on a peaked one, top_k 50 335 / 303, both 463 / 434 (the 32-pass
 * bisections were 1264 / 1047, 877, 1857; docs/lab/experiments.md: the rest
 * of what was tried). Still one block a row: the floor is one SM's passes.
 */
#include "backend/cuda/common/common.h"
#include "backend/cuda/common/cuda_attn_prep.cuh"
#include "backend/cuda/common/cuda_ktrace.cuh"

KT_MODULE(fused, "attn_prep")

namespace
{

enum { ARGMAX_THREADS = 1024 };

__global__ void attn_prep_kernel(float *q, float *k, const float *v, int n_heads, int n_kv, int hd,
                                 const float *q_norm, const float *k_norm, float eps, int dim, int offset,
                                 int interleaved, float attention_factor, const float *inv_freq,
                                 const int32_t *pos, float *kc, float *vc, const int32_t *slots)
{
    extern __shared__ float sv[]; /* (hd) the head after the norm */
    KT_BEGIN();
    pdl_trigger();
    pdl_wait();
    KT_MARK(1);
    attn_prep_head(q, k, v, n_heads, n_kv, hd, q_norm, k_norm, eps, dim, offset, interleaved, attention_factor,
                   inv_freq, pos, kc, vc, slots, blockIdx.x, blockIdx.y, sv);
    KT_END(fused, 0);
}

/* attn_prep for many tokens: a warp a head, AP_HEADS heads a block (a block a head, as
 * attn_prep_kernel, makes 2048 tokens x 40 heads = 82k blocks of 128 threads: 116 us a layer of
 * a 2048-token prefill on the H200 against 61, docs/lab/journal.md). */
enum { AP_HEADS = 4, AP_WARP_MIN_TOKENS = 8 /* up to 8 tokens: the block kernel, as tuned for decode */ };

__global__ void __launch_bounds__(AP_HEADS * 32)
    attn_prep_warp_kernel(float *q, float *k, const float *v, int n_heads, int n_kv, int hd,
                          const float *q_norm, const float *k_norm, float eps, int dim, int offset,
                          int interleaved, float attention_factor, const float *inv_freq, const int32_t *pos,
                          float *kc, float *vc, const int32_t *slots)
{
    extern __shared__ float sw[]; /* (AP_HEADS, hd) a warp's head after the norm */
    pdl_trigger();
    pdl_wait();
    const int warp = threadIdx.x / 32, h = blockIdx.y * AP_HEADS + warp;
    if (h < n_heads + 2 * n_kv)
        attn_prep_head<true>(q, k, v, n_heads, n_kv, hd, q_norm, k_norm, eps, dim, offset, interleaved,
                             attention_factor, inv_freq, pos, kc, vc, slots, blockIdx.x, h,
                             sw + (size_t)warp * hd);
}

/* (v, i) beats (best, bid): larger, or as large with a lower id. */
__device__ __forceinline__ bool arg_better(float v, int i, float best, int bid)
{
    return v > best || (v == best && i < bid);
}

/* The block's best (value, lowest id) from every thread's; thread 0 gets it. */
__device__ __forceinline__ void block_argmax(float &best, int &bid)
{
    __shared__ float bv[32];
    __shared__ int bi[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bid, o);
        if (arg_better(ov, oi, best, bid))
            best = ov, bid = oi;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* bv/bi may still be read by a previous call */
    if (lane == 0)
        bv[warp] = best, bi[warp] = bid;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x / 32); w++)
            if (arg_better(bv[w], bi[w], best, bid))
                best = bv[w], bid = bi[w];
}

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(const float *logits, int vocab, int32_t *ids)
{
    __shared__ int nan_seen;
    const float *row = logits + (size_t)blockIdx.x * (size_t)vocab;
    if (threadIdx.x == 0)
        nan_seen = 0;
    __syncthreads();
    float best = -INFINITY;
    int bid = 0x7fffffff, nan = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = row[i];
        if (v != v)
            nan = 1;
        else if (arg_better(v, i, best, bid))
            best = v, bid = i;
    }
    if (nan)
        atomicExch(&nan_seen, 1);
    block_argmax(best, bid);
    if (threadIdx.x == 0) /* all -inf: the lowest id, as the CPU sampler picks */
        ids[blockIdx.x] = nan_seen ? -1 : (bid == 0x7fffffff ? 0 : bid);
}

/* The same over many blocks a row: one block takes 64 us for a 151936-wide row on the H200 (ncu,
 * docs/lab/journal.md), a chain of ~150 dependent loads per thread.
 * Block (s, r) takes slice s of row r, every thread's loads (up to AS_LOADS float4) issued at
 * once; its partial goes to part[r][s]; the row's last block to count itself in on sem[r]
 * reduces the partials in slice order and resets the counter. */
enum { AS_THREADS = 256, AS_LOADS = 8, AS_SLICE = AS_THREADS * AS_LOADS * 4 };

struct arg_part {
    float v;
    int i, nan;
};

__global__ void __launch_bounds__(AS_THREADS)
    argmax_split_kernel(const float *logits, int vocab, int32_t *ids, arg_part *part, int *sem)
{
    __shared__ int nan_seen, s_last;
    const int r = blockIdx.y, s = blockIdx.x, slices = gridDim.x;
    const float *row = logits + (size_t)r * (size_t)vocab;
    const int lo = s * AS_SLICE, hi = lo + AS_SLICE < vocab ? lo + AS_SLICE : vocab;
    if (threadIdx.x == 0)
        nan_seen = 0;
    __syncthreads();
    float best = -INFINITY;
    int bid = 0x7fffffff, nan = 0;
    float4 v[AS_LOADS];
#pragma unroll
    for (int b = 0; b < AS_LOADS; b++) {
        const int i = lo + 4 * (threadIdx.x + b * AS_THREADS);
        v[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i + 3 < hi)
            v[b] = __ldg((const float4 *)(row + i));
        else /* the row's ragged end, element by element (past it: skipped below) */
            for (int k = 0; k < 4; k++)
                if (i + k < hi)
                    (&v[b].x)[k] = row[i + k];
    }
#pragma unroll
    for (int b = 0; b < AS_LOADS; b++) {
        const int i = lo + 4 * (threadIdx.x + b * AS_THREADS);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float x = (&v[b].x)[k];
            if (i + k >= hi)
                break;
            if (x != x)
                nan = 1;
            else if (arg_better(x, i + k, best, bid))
                best = x, bid = i + k;
        }
    }
    if (nan)
        atomicExch(&nan_seen, 1);
    block_argmax(best, bid);
    if (threadIdx.x == 0) {
        part[(size_t)r * slices + s] = arg_part{best, bid, nan_seen};
        __threadfence();
        s_last = atomicAdd(sem + r, 1) == slices - 1;
    }
    __syncthreads();
    if (!s_last || threadIdx.x != 0)
        return;
    __threadfence();
    float fb = -INFINITY;
    int fi = 0x7fffffff, fnan = 0;
    for (int k = 0; k < slices; k++) {
        const arg_part *q = part + (size_t)r * slices + k; /* other blocks wrote it: through L2 */
        const float qv = __ldcg(&q->v);
        const int qi = __ldcg(&q->i);
        fnan |= __ldcg(&q->nan);
        if (arg_better(qv, qi, fb, fi))
            fb = qv, fi = qi;
    }
    ids[r] = fnan ? -1 : (fi == 0x7fffffff ? 0 : fi);
    sem[r] = 0; /* ready for the next launch (graph replays reuse it) */
}

/* Block-wide sum (float) and count; every thread gets them. */
__device__ __forceinline__ float block_sumf(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++)
        s += sh[i];
    return s;
}

/* One block a row: the row's edits, one a thread (their ids are distinct within the row). */
__global__ void __launch_bounds__(ARGMAX_THREADS)
    logits_edit_kernel(float *logits, int vocab, const int32_t *start, const logit_edit *edits)
{
    float *row = logits + (size_t)blockIdx.x * (size_t)vocab;
    const int k1 = start[blockIdx.x + 1];
    for (int k = start[blockIdx.x] + threadIdx.x; k < k1; k += blockDim.x) {
        const logit_edit e = edits[k];
        /* rounded op by op (no fused multiply-add): the host's sampler_apply, bit for bit */
        float x = __fadd_rn(row[e.id], e.pre);
        if (e.rep != 1.0f)
            x = x > 0.0f ? __fdiv_rn(x, e.rep) : __fmul_rn(x, e.rep);
        row[e.id] = __fadd_rn(x, e.post);
    }
}

/* A row's logit as the draw sees it: -inf where the row's mask (NULL: none) leaves the id out. */
__device__ __forceinline__ float masked_logit(const float *row, const uint32_t *mask, int i)
{
    return !mask || (__ldg(mask + (i >> 5)) >> (i & 31)) & 1u ? row[i] : -INFINITY;
}

/* f(i, masked logit i) for the ids this thread visits of a row, in no particular order: 16-byte
 * loads, RV of them in flight a thread where the row is 16-byte aligned. One block reads a whole
 * row; with one load in flight a thread the pass waits out an L2 round trip per 1024 values. */
enum { RV = 4 };
template <typename F>
__device__ __forceinline__ void row_visit(const float *row, const uint32_t *mask, int vocab, F &&f)
{
    int rest = 0;
    if (((uintptr_t)row & 15u) == 0) {
        const int n4 = vocab / 4;
        const float4 *r4 = (const float4 *)row;
        for (int b = threadIdx.x; b < n4; b += RV * blockDim.x) {
            float4 v[RV];
#pragma unroll
            for (int u = 0; u < RV; u++)
                if (b + u * (int)blockDim.x < n4)
                    v[u] = r4[b + u * blockDim.x];
#pragma unroll
            for (int u = 0; u < RV; u++) {
                const int j = b + u * (int)blockDim.x;
                if (j >= n4)
                    continue;
                const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int i = 4 * j + q;
                    f(i, !mask || (__ldg(mask + (i >> 5)) >> (i & 31)) & 1u ? e[q] : -INFINITY);
                }
            }
        }
        rest = n4 * 4;
    }
    for (int i = rest + threadIdx.x; i < vocab; i += blockDim.x)
        f(i, masked_logit(row, mask, i));
}

/* Whether (v, i) comes before (w, j) in the top-k order: larger first, the lower id on ties. */
__device__ __forceinline__ bool lp_before(float v, int i, float w, int j)
{
    return v > w || (v == w && i < j);
}

/* One block a row: max, then the sum of exp(x - max) (logsumexp), the chosen id's log-probability,
 * then the k likeliest by k passes, each taking the best entry after the previous one in the
 * order (k <= 20: the row stays in L2 between passes). Masked ids are -inf, as in the draw. */
__global__ void __launch_bounds__(ARGMAX_THREADS)
    logprobs_kernel(const float *logits, int vocab, const sample_row *params, const uint32_t *masks,
                    const int32_t *ids, int k, float *lp, int32_t *top_ids, float *top_lp)
{
    __shared__ float sh[32];
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float *row = logits + (size_t)blockIdx.x * (size_t)vocab;
    const sample_row P = params[blockIdx.x];
    const uint32_t *mask =
        masks && P.mask > 0 ? masks + (size_t)(P.mask - 1) * (size_t)((vocab + 31) / 32) : nullptr;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        mx = fmaxf(mx, masked_logit(row, mask, i));
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0)
        bv[warp] = mx;
    __syncthreads();
    mx = bv[0];
    for (int w = 1; w < nw; w++)
        mx = fmaxf(mx, bv[w]);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        sum += expf(masked_logit(row, mask, i) - mx);
    const float lse = mx + logf(block_sumf(sum, sh));
    const int tok = ids[blockIdx.x];
    if (threadIdx.x == 0)
        lp[blockIdx.x] = tok >= 0 && tok < vocab ? masked_logit(row, mask, tok) - lse : -INFINITY;
    float pv = INFINITY;
    int pi = -1;
    for (int j = 0; j < k; j++) {
        float best = -INFINITY;
        int bid = 0x7fffffff;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float v = masked_logit(row, mask, i);
            if (lp_before(pv, pi, v, i) && lp_before(v, i, best, bid))
                best = v, bid = i;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
            if (lp_before(ov, oi, best, bid))
                best = ov, bid = oi;
        }
        __syncthreads(); /* bv / bi of the previous pass read by every thread */
        if (lane == 0)
            bv[warp] = best, bi[warp] = bid;
        __syncthreads();
        best = bv[0], bid = bi[0];
        for (int w = 1; w < nw; w++)
            if (lp_before(bv[w], bi[w], best, bid))
                best = bv[w], bid = bi[w];
        if (threadIdx.x == 0) {
            top_ids[(size_t)blockIdx.x * k + j] = bid == 0x7fffffff ? 0 : bid;
            top_lp[(size_t)blockIdx.x * k + j] = best - lse;
        }
        pv = best, pi = bid;
    }
}

/* The cuts of the sample kernel by radix select on z's bits: z as an ordered 32-bit key; the
 * bits that every key of the candidates shares (from the smallest key: the largest is z = 0's)
 * are fixed at once, then one pass over the row for each 12 bits left (at most three), each a
 * histogram of those bits of the keys that share the bits fixed so far, weighted by 1 (top-k) or
 * by p = exp(z) in fixed point (top-p: 2^-44 units, so the sums are integers and the same
 * whatever order the atomics land in: one seed, one text). At the end the key is the exact z of
 * the cut token. Fixing the shared bits first spreads a narrow row (every z within a few ulps
 * of each other) over the bins instead of sending every atomic to one. Before, each cut was 32
 * bisection passes over the row. */
enum { CUT_BITS = 12, CUT_BINS = 1 << CUT_BITS };

__device__ __forceinline__ uint32_t z_key(float z)
{
    const uint32_t b = __float_as_uint(z);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float key_z(uint32_t k)
{
    return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

/* One histogram pass of cut_search: bins (key >> sh) & (nb - 1) of the keys of z >= lo whose bits
 * above hs equal prefix's. Lanes of a warp adding to the same bin add once: the warp's lanes run
 * every iteration together, group by bin (__match_any_sync), sum their measures (as two 22-bit
 * halves) and the group's first lane adds them. Atomics lane by lane serialised on the few bins a
 * language model's row fills (3.6 ms a 152k row on the H100, bench_sample). */
template <bool MASS>
__device__ void cut_hist(const float *row, const uint32_t *mask, int vocab, float mx, float inv_t, float lo,
                         uint32_t prefix, int hs, int sh, int nb, unsigned long long *hist)
{
    const bool vec = ((uintptr_t)row & 15u) == 0;
    const int lane = threadIdx.x % 32, per = vec ? 4 : 1, n = vec ? (vocab + 3) / 4 : vocab;
    const int rounds = (n + (int)blockDim.x - 1) / (int)blockDim.x;
    for (int r = 0; r < rounds; r++) {
        const int it = r * (int)blockDim.x + (int)threadIdx.x;
        float e[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        if (it < n) {
            if (vec && 4 * it + 3 < vocab) {
                const float4 v = ((const float4 *)row)[it];
                e[0] = v.x, e[1] = v.y, e[2] = v.z, e[3] = v.w;
            } else {
                for (int q = 0; q < per; q++)
                    if (per * it + q < vocab)
                        e[q] = row[per * it + q];
            }
        }
        for (int q = 0; q < per; q++) {
            const int i = per * it + q;
            const bool in = it < n && i < vocab && (!mask || (__ldg(mask + (i >> 5)) >> (i & 31)) & 1u);
            const float z = ((in ? e[q] : -INFINITY) - mx) * inv_t;
            const uint32_t key = z_key(z);
            const bool ok = z >= lo && (hs >= 32 || key >> hs == prefix >> hs);
            const uint32_t bin = ok ? (key >> sh) & (uint32_t)(nb - 1) : 0xffffffffu;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin == 0xffffffffu)
                continue;
            unsigned long long add = __popc(peers);
            if (MASS) {
                const unsigned long long m = __float2ull_rz(expf(z) * 0x1p44f);
                const unsigned lo22 = __reduce_add_sync(peers, (unsigned)(m & 0x3fffffu)),
                               hi22 = __reduce_add_sync(peers, (unsigned)(m >> 22));
                add = ((unsigned long long)hi22 << 22) + lo22;
            }
            if (lane == __ffs(peers) - 1 && add)
                atomicAdd(&hist[bin], add);
        }
    }
}

/* The largest z value t of the row such that the measure of {i : z_i >= t, z_i >= lo} reaches
 * the target: k tokens (!MASS), or top_p of the measure of {z_i >= lo} (MASS); lo when the
 * whole set does not reach it. hist: CUT_BINS counters in shared memory; st: 4 more. */
template <bool MASS>
__device__ float cut_search(const float *row, const uint32_t *mask, int vocab, float mx, float inv_t, float lo,
                            float top_p, int k, unsigned long long *hist, unsigned long long *st)
{
    const int lane = threadIdx.x % 32;
    /* the smallest candidate key: with z = 0's key (the row's max) it bounds every candidate */
    uint32_t kmin = 0xffffffffu;
    row_visit(row, mask, vocab, [&](int, float l) {
        const float z = (l - mx) * inv_t;
        if (z >= lo)
            kmin = min(kmin, z_key(z));
    });
    for (int o = 16; o > 0; o >>= 1)
        kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, o));
    if (threadIdx.x == 0)
        st[0] = 0xffffffffu;
    __syncthreads();
    if (lane == 0)
        atomicMin(&st[0], (unsigned long long)kmin);
    __syncthreads();
    kmin = (uint32_t)st[0];
    __syncthreads(); /* st[0] read by every thread */
    const uint32_t kmax = z_key(0.0f);
    if (kmin > kmax)
        return lo; /* no candidate (lo above the max): nothing to cut */
    int left = 32 - __clz((int)(kmin ^ kmax)); /* the bits still to find */
    uint32_t prefix = left == 32 ? 0u : kmax & ~((1u << left) - 1u);
    for (bool first = true; left > 0; first = false) {
        const int w = left < CUT_BITS ? left : CUT_BITS, sh = left - w, nb = 1 << w, hs = sh + w;
        for (int b = threadIdx.x; b < nb; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        cut_hist<MASS>(row, mask, vocab, mx, inv_t, lo, prefix, hs, sh, nb, hist);
        __syncthreads();
        if (threadIdx.x < 32) {
            /* lane L: bins [nb - (L + 1) per, nb - L per), walked from the top (nb < 32: lane 0 alone) */
            const int per = nb >= 32 ? nb / 32 : (lane == 0 ? nb : 0), top = nb >= 32 ? nb - lane * per : nb;
            unsigned long long mine = 0;
            for (int b = top - 1; b >= top - per; b--)
                mine += hist[b];
            unsigned long long incl = mine;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += v;
            }
            if (first) { /* st[0]: the measure above the band so far, st[1]: the target */
                const unsigned long long total = __shfl_sync(0xffffffffu, incl, 31);
                unsigned long long target = k;
                if (MASS) {
                    const double want = ceil((double)top_p * (double)total);
                    target = want < 1.0 ? 1ull : (unsigned long long)want;
                }
                if (lane == 0)
                    st[0] = 0, st[1] = target, st[2] = total >= target;
            }
            __syncwarp();
            const unsigned long long need = st[1] - st[0];
            const unsigned hit = __ballot_sync(0xffffffffu, per > 0 && st[2] && incl >= need);
            if (hit && lane == __ffs(hit) - 1) {
                unsigned long long acc = incl - mine;
                int b = top - 1;
                for (; b > top - per && acc + hist[b] < need; b--)
                    acc += hist[b];
                st[0] += acc;
                st[3] = (unsigned long long)b;
            }
        }
        __syncthreads();
        if (!st[2])
            return lo; /* fewer than k tokens (or no mass) at or above lo: no cut */
        prefix |= (uint32_t)st[3] << sh;
        left = sh;
        __syncthreads(); /* st and hist read before the next level clears them */
    }
    return kmin == kmax ? 0.0f : key_z(prefix); /* one key: every candidate is z = 0 */
}

/* One block per row. z_i = (l_i - max) / T, p_i = exp(z_i) <= 1. The kept set is
 * {i : z_i >= tau, tau >= -88}: first the top-k cut (the largest tau keeping >= k tokens), then
 * within it the top-p cut (the largest tau keeping >= top_p of the top-k mass), both by
 * cut_search (exact z values of the row; ties at the cut kept). The draw
 * walks the kept tokens in id order: thread t owns ids [t*C, (t+1)*C), an exclusive scan of
 * the threads' kept mass finds the thread holding u * mass, which finds the token. A masked
 * row reads its logits through its mask: the ids it leaves out are -inf (never kept, never
 * the argmax, their NaNs ignored), as the host's token_mask_apply makes them. */
__global__ void __launch_bounds__(ARGMAX_THREADS)
    sample_kernel(const float *logits, int vocab, const sample_row *params, const uint32_t *masks, int32_t *ids)
{
    __shared__ float sh[32];
    __shared__ float bv[32];
    __shared__ int bi[32];
    __shared__ int nan_seen, found;
    __shared__ unsigned long long hist[CUT_BINS], st[4];
    const float *row = logits + (size_t)blockIdx.x * (size_t)vocab;
    const sample_row P = params[blockIdx.x];
    const uint32_t *mask =
        masks && P.mask > 0 ? masks + (size_t)(P.mask - 1) * (size_t)((vocab + 31) / 32) : nullptr;
    if (threadIdx.x == 0)
        nan_seen = 0, found = -1;
    __syncthreads();
    /* argmax (lowest id on ties) and the NaN guard */
    float best = -INFINITY;
    int bid = 0x7fffffff, nan = 0;
    row_visit(row, mask, vocab, [&](int i, float v) {
        if (v != v)
            nan = 1;
        else if (v > best || (v == best && i < bid))
            best = v, bid = i;
    });
    if (nan)
        atomicExch(&nan_seen, 1);
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bid, o);
        if (ov > best || (ov == best && oi < bid))
            best = ov, bid = oi;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    if (lane == 0)
        bv[warp] = best, bi[warp] = bid;
    __syncthreads();
    best = bv[0], bid = bi[0];
    for (int w = 1; w < nw; w++)
        if (bv[w] > best || (bv[w] == best && bi[w] < bid))
            best = bv[w], bid = bi[w];
    if (nan_seen || best == -INFINITY || !(P.temperature > 0.0f)) {
        /* nothing allowed under a mask (every kept logit -inf) is an error, as a NaN is */
        if (threadIdx.x == 0)
            ids[blockIdx.x] = nan_seen || (mask && best == -INFINITY) ? -1 : (bid == 0x7fffffff ? 0 : bid);
        return;
    }
    const float inv_t = 1.0f / P.temperature, mx = best;
    /* tau_k */
    float tau = -88.0f;
    if (P.top_k > 0 && P.top_k < vocab)
        tau = cut_search<false>(row, mask, vocab, mx, inv_t, tau, 1.0f, P.top_k, hist, st);
    /* min-p within the top-k set: p_i >= min_p x p_max is z_i >= log(min_p) */
    if (P.min_p > 0.0f)
        tau = fmaxf(tau, logf(P.min_p));
    /* tau_p within the kept set */
    if (P.top_p < 1.0f)
        tau = cut_search<true>(row, mask, vocab, mx, inv_t, tau, P.top_p, 0, hist, st);
    /* the draw, in id order over the kept set */
    /* chunks of a multiple of 4 ids: 16-byte loads where the row is aligned, summed in id order */
    const int chunk = ((vocab + (int)blockDim.x - 1) / (int)blockDim.x + 3) & ~3;
    const int i0 = min(vocab, (int)threadIdx.x * chunk), i1 = min(vocab, i0 + chunk);
    const bool vec = ((uintptr_t)row & 15u) == 0;
    float mine = 0.0f;
    for (int i = i0; i < i1; i += 4) {
        float e[4];
        if (vec && i + 4 <= i1) {
            const float4 v = *(const float4 *)(row + i);
            e[0] = v.x, e[1] = v.y, e[2] = v.z, e[3] = v.w;
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (i + q >= i1)
                break;
            const float l = vec && i + 4 <= i1 ? (!mask || (__ldg(mask + ((i + q) >> 5)) >> ((i + q) & 31)) & 1u
                                                      ? e[q]
                                                      : -INFINITY)
                                               : masked_logit(row, mask, i + q);
            const float z = (l - mx) * inv_t;
            mine += z >= tau ? expf(z) : 0.0f;
        }
    }
    /* inclusive scan of `mine` over the block: warp scan, then the warp totals */
    float incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
        float t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += t;
    }
    __syncthreads();
    if (lane == 31)
        sh[warp] = incl;
    __syncthreads();
    float before = 0.0f, mass = 0.0f;
    for (int w = 0; w < nw; w++) {
        if (w < warp)
            before += sh[w];
        mass += sh[w];
    }
    const float excl = before + incl - mine, target = P.u * mass;
    if (mine > 0.0f && target >= excl && target < excl + mine) {
        float acc = excl;
        int pick = -1, last = -1;
        for (int i = i0; i < i1 && pick < 0; i++) {
            float z = (masked_logit(row, mask, i) - mx) * inv_t;
            if (z >= tau) {
                last = i;
                acc += expf(z);
                if (target < acc)
                    pick = i;
            }
        }
        atomicMax(&found, pick >= 0 ? pick : last);
    }
    __syncthreads();
    if (threadIdx.x == 0) /* rounding left the draw past every token: the most likely one */
        ids[blockIdx.x] = found >= 0 ? found : bid;
}

} // namespace

extern "C" cudaError_t cuda_sample(cudaStream_t stream, const float *logits, int rows, int vocab,
                                   const struct sample_row *params, const uint32_t *masks, int32_t *ids)
{
    if (rows <= 0)
        return cudaSuccess;
    if (vocab <= 0)
        return cudaErrorInvalidValue;
    sample_kernel<<<(unsigned)rows, ARGMAX_THREADS, 0, stream>>>(logits, vocab, params, masks, ids);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_logprobs(cudaStream_t stream, const float *logits, int rows, int vocab,
                                     const struct sample_row *params, const uint32_t *masks, const int32_t *ids, int k,
                                     float *lp, int32_t *top_ids, float *top_lp)
{
    if (rows <= 0)
        return cudaSuccess;
    logprobs_kernel<<<(unsigned)rows, ARGMAX_THREADS, 0, stream>>>(logits, vocab, params, masks, ids, k, lp, top_ids,
                                                                   top_lp);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_logits_edit(cudaStream_t stream, float *logits, int rows, int vocab,
                                        const int32_t *start, const struct logit_edit *edits)
{
    if (rows <= 0)
        return cudaSuccess;
    logits_edit_kernel<<<(unsigned)rows, ARGMAX_THREADS, 0, stream>>>(logits, vocab, start, edits);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_attn_prep(cudaStream_t stream, float *q, float *k, const float *v, int n_tokens,
                                      int n_heads, int n_kv, int head_dim, const float *q_norm, const float *k_norm,
                                      float eps, const struct rope_args *a, const int32_t *pos,
                                      const struct paged_kv *kv, const int32_t *slots, int pdl)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    if (n_heads + 2 * n_kv > 65535 || a->offset + a->dim > head_dim || a->dim % 2 || kv->head_dim != head_dim ||
        kv->n_kv_heads != n_kv)
        return cudaErrorInvalidValue;
    if (n_tokens > AP_WARP_MIN_TOKENS) {
        dim3 grid((unsigned)n_tokens, (unsigned)((n_heads + 2 * n_kv + AP_HEADS - 1) / AP_HEADS));
        return launch_pdl_smem(pdl != 0, attn_prep_warp_kernel, grid, dim3(AP_HEADS * 32),
                               (size_t)AP_HEADS * head_dim * sizeof(float), stream, q, k, v, n_heads, n_kv,
                               head_dim, q_norm, k_norm, eps, a->dim, a->offset, a->interleaved ? 1 : 0,
                               a->attention_factor, a->inv_freq, pos, kv->k, kv->v, slots);
    }
    unsigned threads = head_dim >= 256 ? 256u : head_dim >= 128 ? 128u : head_dim > 32 ? 64u : 32u;
    dim3 grid((unsigned)n_tokens, (unsigned)(n_heads + 2 * n_kv));
    return launch_pdl(pdl != 0, attn_prep_kernel, grid, dim3(threads), (size_t)head_dim * sizeof(float), stream, q,
                      k, v, n_heads, n_kv, head_dim, q_norm, k_norm, eps, a->dim, a->offset, a->interleaved ? 1 : 0,
                      a->attention_factor, a->inv_freq, pos, kv->k, kv->v, slots);
}

extern "C" size_t cuda_argmax_workspace_bytes(int rows, int vocab)
{
    const size_t slices = ((size_t)vocab + AS_SLICE - 1) / AS_SLICE;
    return (size_t)rows * slices * sizeof(arg_part);
}

extern "C" cudaError_t cuda_argmax(cudaStream_t stream, const float *logits, int rows, int vocab, int32_t *ids,
                                   void *work, int *sem)
{
    if (rows <= 0)
        return cudaSuccess;
    if (vocab <= 0)
        return cudaErrorInvalidValue;
    const int slices = (int)(((size_t)vocab + AS_SLICE - 1) / AS_SLICE);
    if (work && sem && slices > 1 && rows <= 65535 && (uintptr_t)logits % 16 == 0 && vocab % 4 == 0) {
        argmax_split_kernel<<<dim3((unsigned)slices, (unsigned)rows), AS_THREADS, 0, stream>>>(
            logits, vocab, ids, (arg_part *)work, sem);
        return CUDA_LAUNCH_RESULT();
    }
    argmax_kernel<<<(unsigned)rows, ARGMAX_THREADS, 0, stream>>>(logits, vocab, ids);
    return CUDA_LAUNCH_RESULT();
}
