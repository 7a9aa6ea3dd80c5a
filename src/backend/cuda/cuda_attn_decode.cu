/* cuda_attn_decode.cu — split-K decode attention with the merge done by the last split.
 *
 * Decode reads little (a few keys per sequence) and every dependent memory
 * round trip costs about a microsecond, so this kernel is built around the
 * number of round trips, not the flops:
 *  - a block takes one (token, KV head, key range); the key range is walked
 *    in rounds of 4 warps x KPW keys. In a round every lane issues all of its
 *    loads at once: the KPW cache slots (one table read per key, lane-parallel),
 *    then the KPW K rows and KPW V rows (16 bytes of each per lane, coalesced);
 *  - scores need a sum over the 32 lanes for each (key, head) pair. Instead of
 *    one butterfly per pair (5 shuffles each), a reduce-scatter halves the set
 *    of values at every step: 64 pairs cost 62 shuffles and leave lane l with
 *    pairs 2l and 2l + 1;
 *  - the online softmax runs per head over the round's keys (one warp, lane =
 *    key), each warp accumulates P.V for its keys in registers, and the warps'
 *    accumulators are added through shared memory at the end;
 *  - the splits' partials (max, sum, unnormalised output) go to a workspace;
 *    each block then counts itself in on a per-(token, KV head) counter, and
 *    the block that arrives last merges them in split order and resets the
 *    counter, so no second kernel (and no second launch) is needed. With one
 *    active split the block writes the output directly;
 *  - where the device has thread block clusters (caps "clusters"), 8
 *    consecutive splits form a cluster and its first block merges them from
 *    the others' shared memory: no fence, counter or L2 round trip (H200,
 *    session 7: 391.7 -> 408.9 tok/s at batch 1);
 *  - the slot table and the first round of old keys are read before the PDL
 *    wait (no kernel of the pass writes them), so they overlap attn_prep.
 * Numbers: scores are fp32 dot products of the pre-scaled query with the
 * fp32 cache, expf as the CPU reference does; the merge order is fixed, so
 * the result does not depend on which block arrives last.
 * Shapes: head_dim <= 128 and a multiple of 4, at most 16 query heads per KV
 * head; cuda_attention() keeps the older kernel for anything else.
 */
#include "backend/cuda/cuda_attn_decode.cuh"
#include "backend/cuda/cuda_attn_prep.cuh"
#include "backend/cuda/cuda_ktrace.cuh"

KT_MODULE(attn_decode, "attn_decode_split0", "attn_decode_merger", "attn_prep_cluster_split0")

static_assert((int)AD_CLUSTER == (int)CUDA_ATTN_CLUSTER, "cuda_kernels.h states the cluster size");

namespace
{

template <int NH, int CL>
__global__ void __launch_bounds__(AD_THREADS) attn_decode_split_kernel(const __grid_constant__ adec_params p)
{
    KT_BEGIN();
    pdl_trigger();
    /* this kernel reads a few KB of cache and spends its time in round trips: the DRAM is free to
     * bring in the output projection (and whatever else the backend was told comes next) */
    l2_prefetch_ranges(p.pf, (int)((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x),
                       (int)(gridDim.x * gridDim.y * gridDim.z));
    /* the block waits inside, after issuing its first round of old keys (see attn_split_block) */
    /* trace builds: the blocks of split 0 (it always has keys) and of the split that merges
     * record their phases (kernel 0 and 1) */
    bool merged = false;
    attn_split_block<NH, false, true, CL>(
        p, blockIdx.x, blockIdx.y, blockIdx.z, adec_cur{},
        [&]() {
            pdl_wait();
            KT_MARK(1);
        },
        [&](int i) {
            KT_MARK(i);
            merged |= i == 6 && CL == 1;
        });
    (void)merged;
    if (merged)
        KT_END(attn_decode, 1);
    else if (blockIdx.z == 0)
        KT_END(attn_decode, 0);
}

/* attn_prep's work for one decode token, done by the attention blocks themselves. */
struct aprep_params {
    const float *k, *v;           /* (n_kv, hd): the new token's raw key and value projections */
    const float *q_norm, *k_norm; /* (hd) or NULL */
    float eps;
    int dim, offset, interleaved; /* RoPE: the rotated slice, its layout */
    float attention_factor;
    const float *inv_freq;
    const int32_t *slots; /* [0]: the new key's cache slot */
};

/* After a block holds the token's prepped heads in shared memory: the split that owns the
 * newest position writes the new key and value into the cache (the steps after this one read
 * them there); every split attends with them from shared memory (adec_cur). */
template <int NH>
__device__ __forceinline__ adec_cur aprep_finish(const adec_params &p, const aprep_params &a, int g,
                                                 int split, const float *s_q, const float *s_k,
                                                 const float *s_v)
{
    const int klen = p.pos[0] + 1, hd = p.hd;
    if (split == (klen - 1) / adec_chunk(klen, p.n_splits, adec_shape<NH>::round)) {
        const size_t at = (size_t)a.slots[0] * (size_t)p.n_kv * hd + (size_t)g * hd;
        for (int i = threadIdx.x; i < hd; i += AD_THREADS) {
            ((float *)p.kc)[at + i] = s_k[i];
            ((float *)p.vc)[at + i] = s_v[i];
        }
    }
    adec_cur cur;
    cur.q = s_q;
    cur.k = s_k;
    cur.v = s_v;
    cur.key = klen - 1;
    return cur;
}

/* One token's attention with attn_prep folded in (n_tokens == 1, so no other block of the
 * kernel reads the key it writes): every (KV head, split) block norms and ropes its group's query
 * heads and the new key itself (a warp per head, the sum of squares in double as attn_prep), the
 * split that owns the newest position writes the key and value into the cache for later steps,
 * and all of them attend with the new key taken from shared memory. This saves attn_prep's
 * kernel and its boundary; p.q is the raw query projection. */
template <int NH>
__global__ void __launch_bounds__(AD_THREADS)
    attn_decode_prep_kernel(const __grid_constant__ adec_params p, const __grid_constant__ aprep_params a)
{
    __shared__ __align__(16) float s_q[NH * 128];
    __shared__ __align__(16) float s_k[128], s_v[128];
    __shared__ __align__(16) float s_n[AD_WARPS][128]; /* a head after its norm, before RoPE */
    pdl_trigger();
    pdl_wait();
    const int g = blockIdx.y, split = blockIdx.z, G = p.group, hd = p.hd;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float pos = (float)p.pos[0];
    /* the raw heads (the group's queries, the key, the value) into shared memory, all loads at once */
    constexpr int MAXV = (NH + 2) * 32 / AD_THREADS + 1; /* float4s a thread (head_dim <= 128) */
    const int n4 = hd / 4, total = (G + 2) * n4;
    float4 rv[MAXV];
#pragma unroll
    for (int u = 0; u < MAXV; u++) {
        const int i = threadIdx.x + u * AD_THREADS, hh = i / n4, c = i % n4;
        if (i < total) {
            const float *src =
                hh < G ? p.q + ((size_t)g * G + hh) * hd : (hh == G ? a.k : a.v) + (size_t)g * hd;
            rv[u] = ((const float4 *)src)[c];
        }
    }
#pragma unroll
    for (int u = 0; u < MAXV; u++) {
        const int i = threadIdx.x + u * AD_THREADS, hh = i / n4, c = i % n4;
        if (i < total)
            ((float4 *)(hh < G ? s_q + (size_t)hh * hd : hh == G ? s_k : s_v))[c] = rv[u];
    }
    __syncthreads();
    /* per-head RMSNorm and RoPE in place, a warp a head (the value needs neither) */
    for (int hh = warp; hh < G + 1; hh += AD_WARPS) {
        float *dst = hh < G ? s_q + (size_t)hh * hd : s_k;
        const bool mine = 4 * lane < hd;
        float4 x = mine ? ((const float4 *)dst)[lane] : make_float4(0.f, 0.f, 0.f, 0.f);
        const float *w = hh < G ? a.q_norm : a.k_norm;
        if (w) {
            double ss = (double)x.x * (double)x.x + (double)x.y * (double)x.y + (double)x.z * (double)x.z +
                        (double)x.w * (double)x.w;
            for (int o = 16; o > 0; o >>= 1)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / hd), a.eps)));
            if (mine) {
                const float4 wv = ((const float4 *)w)[lane];
                x = make_float4(__fmul_rn(wv.x, __fmul_rn(x.x, inv)), __fmul_rn(wv.y, __fmul_rn(x.y, inv)),
                                __fmul_rn(wv.z, __fmul_rn(x.z, inv)), __fmul_rn(wv.w, __fmul_rn(x.w, inv)));
            }
        }
        if (mine)
            ((float4 *)s_n[warp])[lane] = x;
        __syncwarp();
        for (int i = lane; i < hd; i += 32)
            dst[i] =
                rope_elem(s_n[warp], i, a.offset, a.dim, a.interleaved, a.attention_factor, a.inv_freq, pos);
        __syncwarp(); /* s_n[warp] is the next head's */
    }
    __syncthreads();
    attn_split_block<NH, true>(p, 0, g, split, aprep_finish<NH>(p, a, g, split, s_q, s_k, s_v));
}

/* attn_decode_prep_kernel's work shared by a thread block cluster of AD_CLUSTER splits (caps
 * "clusters", one token): instead of every block normalising and roping all G query heads and
 * the key (the reason attn_decode_prep_kernel measured slower than attn_prep + attention), warp w
 * of cluster block r takes head r + AD_CLUSTER * w of the G + 2 (queries, key, value) and stores
 * the result into every block's shared memory (distributed shared memory); one barrier phase
 * later every block holds the group's queries and the new key and value, and attends as the
 * split kernel does with clusters (CUR: the new key from shared memory). The split that owns
 * the newest position writes it into the cache. A cluster without keys leaves at once. */
template <int NH>
__global__ void __launch_bounds__(AD_THREADS)
    attn_decode_prep_cluster_kernel(const __grid_constant__ adec_params p,
                                    const __grid_constant__ aprep_params a)
{
    constexpr int CL = AD_CLUSTER;
    __shared__ __align__(16) float s_q[NH * 128];
    __shared__ __align__(16) float s_k[128], s_v[128];
    __shared__ __align__(16) float s_n[AD_WARPS][128], s_r[AD_WARPS][128]; /* a head normed, then roped */
    KT_BEGIN(); /* trace builds, split 0: 1 waited, 2 heads in, 3 all rounds, 4 merged */
    pdl_trigger();
    pdl_wait();
    KT_MARK(1);
    const int g = blockIdx.y, split = blockIdx.z, rank = split % CL, G = p.group, hd = p.hd;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int klen = p.pos[0] + 1;
    const int chunk = adec_chunk(klen, p.n_splits, adec_shape<NH>::round);
    if (split - rank >= (klen + chunk - 1) / chunk)
        return; /* no split of this cluster has keys (every block of it decides the same) */
    cluster_arrive_relaxed();
    cluster_wait(); /* every block has started: their shared memory may be written */
    const float pos = (float)p.pos[0];
    const bool mine = 4 * lane < hd;
    for (int hh = rank + CL * warp; hh < G + 2; hh += CL * AD_WARPS) {
        const float *src = hh < G ? p.q + ((size_t)g * G + hh) * hd : (hh == G ? a.k : a.v) + (size_t)g * hd;
        float4 x = mine ? ((const float4 *)src)[lane] : make_float4(0.f, 0.f, 0.f, 0.f);
        if (hh <= G) { /* a query or the key: RMSNorm (sum of squares in double, as attn_prep), RoPE */
            const float *w = hh < G ? a.q_norm : a.k_norm;
            if (w) {
                double ss = (double)x.x * (double)x.x + (double)x.y * (double)x.y +
                            (double)x.z * (double)x.z + (double)x.w * (double)x.w;
                for (int o = 16; o > 0; o >>= 1)
                    ss += __shfl_xor_sync(0xffffffffu, ss, o);
                const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / hd), a.eps)));
                if (mine) {
                    const float4 wv = ((const float4 *)w)[lane];
                    x = make_float4(
                        __fmul_rn(wv.x, __fmul_rn(x.x, inv)), __fmul_rn(wv.y, __fmul_rn(x.y, inv)),
                        __fmul_rn(wv.z, __fmul_rn(x.z, inv)), __fmul_rn(wv.w, __fmul_rn(x.w, inv)));
                }
            }
            if (mine)
                ((float4 *)s_n[warp])[lane] = x;
            __syncwarp();
            for (int i = lane; i < hd; i += 32)
                s_r[warp][i] = rope_elem(s_n[warp], i, a.offset, a.dim, a.interleaved, a.attention_factor,
                                         a.inv_freq, pos);
            __syncwarp();
            if (mine)
                x = ((const float4 *)s_r[warp])[lane];
            __syncwarp(); /* s_n and s_r are the warp's next head's */
        }
        float4 *dst = (float4 *)(hh < G ? s_q + (size_t)hh * hd : hh == G ? s_k : s_v) + lane;
        if (mine)
#pragma unroll
            for (int r = 0; r < CL; r++)
                *cluster_peer(dst, (unsigned)r) = x;
    }
    cluster_arrive();
    cluster_wait(); /* every head is in every block of the cluster */
    KT_MARK(2);
    const adec_cur cur = aprep_finish<NH>(p, a, g, split, s_q, s_k, s_v);
    attn_split_block<NH, true, false, CL>(p, 0, g, split, cur, adec_no_wait{}, [&](int i) {
        if (i == 4)
            KT_MARK(3);
        else if (i == 6)
            KT_MARK(4);
    });
    if (split == 0)
        KT_END(attn_decode, 2);
}

} // namespace

/* The kernel's static shared memory for a group of G query heads (plan_attention_decode states
 * the same formula). */
static size_t adec_smem(int group)
{
    int nh = group <= 4 ? 4 : group <= 8 ? 8 : 16, round = nh >= 16 ? 16 : 32;
    return (size_t)nh * round * 4 + (size_t)nh * 5 * 4 + (size_t)AD_WARPS * nh * 32 * 16 +
           (size_t)AD_MAX_SPLITS * nh * 4 + 4;
}

/* The split kernels' parameters (no L2 hint); work: the splits' partials, as sized by
 * cuda_attention_workspace_floats. */
static adec_params adec_params_of(const float *q, const struct paged_kv *kv, const struct attn_batch *b,
                                  int n_heads, float scale, float *out, int n_splits, float *work, int *sem)
{
    adec_params p = {};
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
    p.n_heads = n_heads;
    p.group = n_heads / kv->n_kv_heads;
    p.n_splits = n_splits;
    p.n_tokens = b->n_tokens;
    p.scale = scale;
    p.out = out;
    size_t parts = (size_t)b->n_tokens * n_heads * n_splits; /* (token, kv head, split, head of group) */
    p.part_o = work;
    p.part_ml = work ? work + parts * (size_t)kv->head_dim : NULL;
    p.sem = sem;
    return p;
}

extern "C" int cuda_attn_decode_supported(int group, int head_dim, int n_splits, size_t smem_budget)
{
    return group >= 1 && group <= 16 && head_dim % 4 == 0 && head_dim >= 4 && head_dim <= 128 &&
           n_splits >= 1 && n_splits <= AD_MAX_SPLITS && adec_smem(group) <= smem_budget;
}

extern "C" size_t cuda_attn_decode_push_smem(int group, int head_dim)
{
    return adec_smem(group) + adec_push_smem(AD_CLUSTER, group, head_dim);
}

template <int NH>
static cudaError_t adec_launch(cudaStream_t stream, const adec_params &p, dim3 grid, int cluster, int pdl)
{
    if (cluster == AD_CLUSTER) {
        const size_t dyn = p.push ? adec_push_smem(AD_CLUSTER, p.group, p.hd) : 0;
        if (adec_smem(p.group) + dyn > 48 * 1024) {
            cudaError_t e = cudaFuncSetAttribute(attn_decode_split_kernel<NH, AD_CLUSTER>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn);
            if (e != cudaSuccess)
                return e;
        }
        return launch_pdl_cluster(pdl != 0, dim3(1, 1, AD_CLUSTER), attn_decode_split_kernel<NH, AD_CLUSTER>,
                                  grid, dim3(AD_THREADS), dyn, stream, p);
    }
    return launch_pdl(pdl != 0, attn_decode_split_kernel<NH, 1>, grid, dim3(AD_THREADS), 0, stream, p);
}

extern "C" cudaError_t cuda_attn_decode(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                                        const struct attn_batch *b, int n_heads, float scale, float *out,
                                        int n_splits, float *work, int *sem, int pdl, int prewait,
                                        int cluster, int push, const struct cuda_l2_ranges *pf)
{
    if (b->n_tokens <= 0)
        return cudaSuccess;
    int group = n_heads / kv->n_kv_heads;
    if (n_heads % kv->n_kv_heads || !cuda_attn_decode_supported(group, kv->head_dim, n_splits, (size_t)-1) ||
        (cluster != 1 && (cluster != AD_CLUSTER || n_splits % AD_CLUSTER)) ||
        !sem || (n_splits > 1 && !work) || kv->n_kv_heads > 65535 ||
        ((uintptr_t)q | (uintptr_t)kv->k | (uintptr_t)kv->v | (uintptr_t)out | (uintptr_t)work) % 16)
        return cudaErrorInvalidValue;
    adec_params p = adec_params_of(q, kv, b, n_heads, scale, out, n_splits, work, sem);
    p.pf = pf ? *pf : cuda_l2_ranges{};
    p.prewait = prewait != 0;
    p.push = cluster == AD_CLUSTER && push != 0;
    dim3 grid((unsigned)b->n_tokens, (unsigned)kv->n_kv_heads, (unsigned)n_splits);
    if (group <= 4)
        return adec_launch<4>(stream, p, grid, cluster, pdl);
    if (group <= 8)
        return adec_launch<8>(stream, p, grid, cluster, pdl);
    return adec_launch<16>(stream, p, grid, cluster, pdl);
}

/* attn_decode_prep_kernel's own static shared memory on top of the split block's. */
static size_t aprep_smem(int group)
{
    int nh = group <= 4 ? 4 : 8;
    return ((size_t)nh * 128 + 2 * 128 + (size_t)AD_WARPS * 128) * sizeof(float);
}

/* attn_decode_prep_cluster_kernel's own static shared memory on top of the split block's. */
static size_t aprep_cluster_smem(int group)
{
    return aprep_smem(group) + (size_t)AD_WARPS * 128 * sizeof(float);
}

extern "C" int cuda_attn_decode_prep_cluster_supported(int group, int head_dim, int n_splits,
                                                       const struct rope_args *rope, int push,
                                                       size_t smem_budget)
{
    return n_splits % AD_CLUSTER == 0 && group + 2 <= AD_CLUSTER * AD_WARPS &&
           cuda_attn_decode_prep_supported(group, head_dim, n_splits, rope, (size_t)-1) &&
           adec_smem(group) + aprep_cluster_smem(group) +
                   (push ? adec_push_smem(AD_CLUSTER, group, head_dim) : 0) <=
               smem_budget;
}

extern "C" int cuda_attn_decode_prep_supported(int group, int head_dim, int n_splits,
                                               const struct rope_args *rope, size_t smem_budget)
{
    /* at most 8 query heads a KV head: with 16 the static shared memory passes 48 KB */
    return group <= 8 && cuda_attn_decode_supported(group, head_dim, n_splits, (size_t)-1) &&
           adec_smem(group) + aprep_smem(group) <= smem_budget && rope->dim % 2 == 0 && rope->dim >= 0 &&
           rope->offset >= 0 && rope->offset + rope->dim <= head_dim;
}

extern "C" cudaError_t cuda_attn_decode_prep(cudaStream_t stream, const float *q, const float *k,
                                             const float *v, const struct paged_kv *kv,
                                             const struct attn_batch *b, int n_heads, float scale, float *out,
                                             int n_splits, float *work, int *sem, const float *q_norm,
                                             const float *k_norm, float eps, const struct rope_args *rope,
                                             const int32_t *slots, int pdl, int cluster, int push)
{
    const int group = kv->n_kv_heads > 0 ? n_heads / kv->n_kv_heads : 0;
    if (b->n_tokens != 1 || n_heads % kv->n_kv_heads ||
        !cuda_attn_decode_prep_supported(group, kv->head_dim, n_splits, rope, (size_t)-1) || !sem ||
        (cluster != 1 &&
         (cluster != AD_CLUSTER ||
          !cuda_attn_decode_prep_cluster_supported(group, kv->head_dim, n_splits, rope, push, (size_t)-1))) ||
        (n_splits > 1 && !work) || kv->n_kv_heads > 65535 ||
        ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)kv->k | (uintptr_t)kv->v | (uintptr_t)out |
         (uintptr_t)work | (uintptr_t)q_norm | (uintptr_t)k_norm) %
            16)
        return cudaErrorInvalidValue;
    adec_params p = adec_params_of(q, kv, b, n_heads, scale, out, n_splits, work, sem);
    aprep_params a;
    a.k = k;
    a.v = v;
    a.q_norm = q_norm;
    a.k_norm = k_norm;
    a.eps = eps;
    a.dim = rope->dim;
    a.offset = rope->offset;
    a.interleaved = rope->interleaved ? 1 : 0;
    a.attention_factor = rope->attention_factor;
    a.inv_freq = rope->inv_freq;
    a.slots = slots;
    dim3 grid(1u, (unsigned)kv->n_kv_heads, (unsigned)n_splits);
    if (cluster == AD_CLUSTER) {
        p.push = push != 0;
        const size_t dyn = p.push ? adec_push_smem(AD_CLUSTER, group, kv->head_dim) : 0;
        void (*kern)(adec_params, aprep_params) =
            group <= 4 ? attn_decode_prep_cluster_kernel<4> : attn_decode_prep_cluster_kernel<8>;
        if (adec_smem(group) + aprep_cluster_smem(group) + dyn > 48 * 1024) {
            cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn);
            if (e != cudaSuccess)
                return e;
        }
        return launch_pdl_cluster(pdl != 0, dim3(1, 1, AD_CLUSTER), kern, grid, dim3(AD_THREADS), dyn, stream,
                                  p, a);
    }
    if (group <= 4)
        return launch_pdl(pdl != 0, attn_decode_prep_kernel<4>, grid, dim3(AD_THREADS), 0, stream, p, a);
    return launch_pdl(pdl != 0, attn_decode_prep_kernel<8>, grid, dim3(AD_THREADS), 0, stream, p, a);
}
