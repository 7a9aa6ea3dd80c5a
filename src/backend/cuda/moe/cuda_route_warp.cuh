/* cuda_route_warp.cuh — MoE routing of one token by one warp (no expert groups, <= 512 experts).
 *
 * Mirrors route_one() of the CPU backend: softmax (max, expf, a double sum, a double division)
 * or sigmoid; selection score = prob + correction bias; top-k by repeated arg-max with ties to
 * the lower expert id; weights = the unbiased probabilities, renormalised in double (+ eps) and
 * scaled. Lane l holds experts l, l + 32, ... (NPL of them) in registers, so an arg-max is five
 * shuffles and the whole routing needs no barrier: the routing kernel (cuda_moe_route.cu) and the
 * router + routing kernel (cuda_router_route.cu) use it. route_rank_block is the block-wide form.
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_ROUTE_WARP_CUH
#define MOESERVE_BACKEND_CUDA_CUDA_ROUTE_WARP_CUH

#include <math.h>

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/moe/cuda_route_limits.h"

struct route_warp_args {
    int E, k, sigmoid, normalize;
    const float *bias;
    float eps, scaling;
};

static inline route_warp_args route_warp_args_from(const struct route_args *a)
{
    route_warp_args r;
    r.E = a->n_experts;
    r.k = a->n_used;
    r.sigmoid = a->score == ROUTE_SIGMOID ? 1 : 0;
    r.normalize = a->normalize ? 1 : 0;
    r.bias = a->correction_bias;
    r.eps = a->normalize_eps;
    r.scaling = a->scaling;
    return r;
}

/* Whether route_warp takes these arguments. */
static inline bool cuda_route_warp_supported(const struct route_args *a)
{
    return cuda_route_warp_fits(a->n_experts, a->n_used, a->n_group);
}

/* a better than b: larger value, ties to the lower index; idx < 0 is "none" */
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib)
{
    if (ib < 0)
        return ia >= 0;
    if (ia < 0)
        return false;
    return va > vb || (va == vb && ia < ib);
}

/* f32 bits mapped so that unsigned order is float order (-inf lowest; 0 is below every value). */
__device__ __forceinline__ uint32_t sortable_bits(float f)
{
    uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* What route_warp calls at its phase boundaries (1: logits in, 2: probabilities, 3: picks):
 * nothing, unless a kernel-trace build hands it a functor that records them. */
struct route_no_mark {
    __device__ void operator()(int) const {}
};

/* Routes one token (lg: its E router logits) with the calling warp (all 32 lanes): lane l writes
 * picks l and l + 32 (those below k) to ids[] / wout[]. */
template <int NPL, typename Mark = route_no_mark>
__device__ __forceinline__ void route_warp(const float *lg, const route_warp_args a, int32_t *ids, float *wout,
                                           Mark mark = Mark{})
{
    const int lane = threadIdx.x % 32, E = a.E, k = a.k;
    float prob[NPL], choice[NPL], lv[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int e = lane + 32 * i;
        lv[i] = e < E ? lg[e] : -INFINITY;
    }
    if (!a.sigmoid) {
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < NPL; i++)
            m = fmaxf(m, lv[i]);
        m = warp_max(m);
        mark(1);
        double sum = 0;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            prob[i] = lane + 32 * i < E ? expf(__fsub_rn(lv[i], m)) : 0.0f;
            sum += prob[i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int i = 0; i < NPL; i++)
            prob[i] = (float)((double)prob[i] / sum);
    } else {
#pragma unroll
        for (int i = 0; i < NPL; i++)
            prob[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lv[i])));
    }
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int e = lane + 32 * i;
        choice[i] = e < E ? __fadd_rn(prob[i], a.bias ? a.bias[e] : 0.0f) : -INFINITY;
    }
    mark(2);
    uint32_t taken = 0;
    int id0 = -1, id1 = -1; /* the picks of rounds lane and lane + 32 */
    float p0 = 0.0f, p1 = 0.0f;
    double wsum = 0;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY, bp = 0.0f;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            int e = lane + 32 * i;
            if (e < E && !(taken >> i & 1u) && better(choice[i], e, bv, bi))
                bv = choice[i], bi = e, bp = prob[i];
        }
        /* the warp's best: the largest value (as order-preserving bits), then the lowest id among
         * the lanes holding it; two warp reductions instead of five rounds of three shuffles */
        const uint32_t key = bi < 0 ? 0u : sortable_bits(bv);
        const uint32_t kmax = __reduce_max_sync(0xffffffffu, key);
        const uint32_t imin = __reduce_min_sync(0xffffffffu, key == kmax && bi >= 0 ? (uint32_t)bi : 0xffffffffu);
        bi = imin == 0xffffffffu ? -1 : (int)imin;
        bp = __shfl_sync(0xffffffffu, bp, bi < 0 ? 0 : bi % 32);
        if (bi >= 0 && bi % 32 == lane)
            taken |= 1u << (bi / 32);
        wsum += bp; /* every lane adds in the same order: the same double */
        if (j == lane)
            id0 = bi, p0 = bp;
        else if (j == lane + 32)
            id1 = bi, p1 = bp;
    }
    mark(3);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int j = lane + 32 * r;
        if (j >= k)
            break;
        float w = r ? p1 : p0;
        if (a.normalize)
            w = (float)((double)w / (wsum + (double)a.eps));
        w = __fmul_rn(w, a.scaling);
        ids[j] = r ? id1 : id0, wout[j] = w;
    }
}

/* Routes one token (lg: its E router logits, global or shared memory) with the whole block of
 * ROUTE_RANK_THREADS threads, expert e in thread e (E <= EP, EP 128 or 256). The warp routing's
 * top-k is k rounds of arg-max, each a chain of dependent compares, two warp reductions and a
 * shuffle: ~490 cycles a round in the kernel trace, 3900 of the kernel's ~5800 (H200, 128 experts,
 * k 8, docs/lab/journal.md). Here every expert's rank is counted at once instead (how many
 * selection keys beat its own; a key is the order-preserving bits of the score above the
 * complement of the id, so ties go to the lower id as in better()): EP / P independent compares
 * for each of the P threads that share an expert (16 warps, so that a scheduler has four to
 * interleave; with 4 warps of 128 compares the count takes 2160 cycles, with 16 ~1600). The
 * experts ranked below k put themselves at their rank, and the weights are renormalised in that
 * order, as route_warp does. Threads 0..k-1 of warp 0 write ids[j] / wout[j]. mark(1..3): the
 * max, the selection keys, the ranks (trace builds). Every thread of the block calls it. */
enum { ROUTE_RANK_THREADS = 512, ROUTE_RANK_MAX_E = 256, ROUTE_RANK_MAX_K = CUDA_ROUTE_MAX_K };

template <int EP, typename Mark = route_no_mark>
__device__ __forceinline__ void route_rank_block(const float *lg, const route_warp_args a, int32_t *ids, float *wout,
                                                 Mark mark = Mark{})
{
    constexpr int P = ROUTE_RANK_THREADS / EP, SPAN = EP / P;
    __shared__ unsigned long long s_key[EP];
    __shared__ int s_rank[P][EP];
    __shared__ float s_p[ROUTE_RANK_MAX_K];
    __shared__ int s_id[ROUTE_RANK_MAX_K];
    const int E = a.E, k = a.k, e = threadIdx.x, lane = threadIdx.x % 32;
    const float lv = e < E ? lg[e] : -INFINITY;
    float prob;
    if (!a.sigmoid) {
        const float m = block_max(lv);
        mark(1);
        prob = e < E ? expf(__fsub_rn(lv, m)) : 0.0f;
        prob = (float)((double)prob / block_sum_double(prob));
    } else {
        prob = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lv)));
        mark(1);
    }
    if (e < E) {
        const float c = __fadd_rn(prob, a.bias ? a.bias[e] : 0.0f);
        /* a NaN score ranks below every number, as better() never prefers it */
        s_key[e] = ((unsigned long long)(c == c ? sortable_bits(c) : 0u) << 32) | (0xffffffffu - (unsigned)e);
    }
    __syncthreads();
    mark(2);
    { /* thread (part, ee) counts the keys of span `part` that beat expert ee's */
        const int ee = threadIdx.x % EP, part = threadIdx.x / EP;
        int cnt = 0;
        if (ee < E) {
            const unsigned long long mine = s_key[ee];
            const int j0 = part * SPAN, j1 = j0 + SPAN < E ? j0 + SPAN : E;
#pragma unroll 8
            for (int j = j0; j < j1; j++)
                cnt += s_key[j] > mine;
        }
        s_rank[part][ee] = cnt;
    }
    __syncthreads();
    if (e < E) {
        int rank = 0;
#pragma unroll
        for (int q = 0; q < P; q++)
            rank += s_rank[q][e];
        if (rank < k)
            s_id[rank] = e, s_p[rank] = prob;
    }
    __syncthreads();
    mark(3);
    if (threadIdx.x >= 32)
        return;
    double wsum = 0; /* in pick order, as route_warp */
    for (int j = 0; j < k; j++)
        wsum += s_p[j];
    for (int j = lane; j < k; j += 32) {
        float w = s_p[j];
        if (a.normalize)
            w = (float)((double)w / (wsum + (double)a.eps));
        ids[j] = s_id[j];
        wout[j] = __fmul_rn(w, a.scaling);
    }
}

#endif
