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
 *    the others' shared memory: no fence, counter or L2 round trip;
 *  - the slot table and the first round of old keys are read before the PDL
 *    wait (no kernel of the pass writes them), so they overlap attn_prep.
 * Numbers: scores are fp32 dot products of the pre-scaled query with the
 * fp32 cache, expf as the CPU reference does; the merge order is fixed, so
 * the result does not depend on which block arrives last.
 * Shapes: head_dim <= 128 and a multiple of 4, at most 16 query heads per KV
 * head; cuda_attention() (cuda_attention.cu) takes anything else.
 */
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/attention/cuda_attn_decode.cuh"
#include "backend/cuda/common/cuda_ktrace.cuh"

KT_MODULE(attn_decode, "attn_decode_split0", "attn_decode_merger")

static_assert((int)AD_CLUSTER == (int)CUDA_ATTN_CLUSTER, "cuda_kernels.h states the cluster size");

namespace
{

template <int NH, int CL>
__global__ void __launch_bounds__(AD_THREADS) attn_decode_split_kernel(const __grid_constant__ adec_params p)
{
    KT_BEGIN();
    pdl_trigger();
    /* the block waits inside, after issuing its first round of old keys (see attn_split_block) */
    /* trace builds: the blocks of split 0 (it always has keys) and of the split that merges
     * record their phases (kernel 0 and 1) */
    bool merged = false;
    attn_split_block<NH, CL>(
        p, blockIdx.x, blockIdx.y, blockIdx.z,
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

} // namespace

/* The kernel's static shared memory for a group of G query heads (the planner's
 * attn_decode_split_fp32 candidate, plan/planner.c, states the same formula). */
static size_t adec_smem(int group)
{
    int nh = group <= 4 ? 4 : group <= 8 ? 8 : 16, round = nh >= 16 ? 16 : 32;
    return (size_t)nh * round * 4 + (size_t)nh * 5 * 4 + (size_t)AD_WARPS * nh * 32 * 16 +
           (size_t)AD_MAX_SPLITS * nh * 4 + 4;
}

/* The split kernels' parameters; work: the splits' partials, as sized by
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
                                        int n_splits, float *work, int *sem, int pdl, int cluster, int push)
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
    p.push = cluster == AD_CLUSTER && push != 0;
    dim3 grid((unsigned)b->n_tokens, (unsigned)kv->n_kv_heads, (unsigned)n_splits);
    if (group <= 4)
        return adec_launch<4>(stream, p, grid, cluster, pdl);
    if (group <= 8)
        return adec_launch<8>(stream, p, grid, cluster, pdl);
    return adec_launch<16>(stream, p, grid, cluster, pdl);
}
