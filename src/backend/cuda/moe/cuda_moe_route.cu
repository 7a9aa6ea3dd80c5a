/* cuda_moe_route.cu — router scores -> top-k expert ids and weights: without expert groups one
 * block per token counting ranks (decode-sized batches, up to 256 experts) or one warp per token
 * (up to 512 experts), else one block per token.
 *
 * Mirrors route_one() of backend_cpu.c step by step: softmax (max, expf,
 * double sum, double division) or sigmoid; selection scores = prob +
 * correction bias; optional grouped selection (a group scores the sum of its
 * two best selection scores, the topk_group best groups stay); top-k by
 * repeated arg-max with ties to the lower expert id; weights are the
 * unbiased probabilities, renormalised in double (+ eps) and scaled. The
 * small serial parts (group scores, the final k weights) run on one thread
 * in the CPU's order so that the results are the same numbers.
 *
 * Limits (checked by the launcher): n_experts <= 4096, n_used <= 64,
 * n_group <= 64 and dividing n_experts.
 */
#include "backend/cuda/moe/moe.h"
#include <math.h>

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_ktrace.cuh"
#include "backend/cuda/moe/cuda_route_warp.cuh"

KT_MODULE(route, "moe_route_warp", "moe_route_rank")

namespace
{

enum { ROUTE_MAX_E = 4096, ROUTE_MAX_K = 64, ROUTE_MAX_G = 64, ROUTE_THREADS = 256 };

/* Arg-max of s over the entries not taken; every thread gets the index. */
__device__ int block_argmax_untaken(const float *s, const unsigned char *taken, int n)
{
    __shared__ float wv[32];
    __shared__ int wi[32];
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (!taken[i] && better(s[i], i, bv, bi)) {
            bv = s[i];
            bi = i;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    __syncthreads(); /* wv/wi may still be read by the previous call */
    if (threadIdx.x % 32 == 0) {
        wv[threadIdx.x / 32] = bv;
        wi[threadIdx.x / 32] = bi;
    }
    __syncthreads();
    bv = -INFINITY;
    bi = -1;
    for (int w = 0; w < (int)(blockDim.x / 32); w++)
        if (better(wv[w], wi[w], bv, bi)) {
            bv = wv[w];
            bi = wi[w];
        }
    return bi;
}

__global__ void __launch_bounds__(ROUTE_THREADS)
    moe_route_kernel(const float *logits, int E, int k, int sigmoid, const float *bias, int n_group,
                     int topk_group, int normalize, float eps, float scaling, int32_t *ids, float *wout)
{
    extern __shared__ float rsm[];
    float *prob = rsm;                                    /* (E) */
    float *choice = prob + E;                             /* (E) */
    unsigned char *taken = (unsigned char *)(choice + E); /* (E) */
    __shared__ float gscore[ROUTE_MAX_G];
    __shared__ unsigned char gtaken[ROUTE_MAX_G];
    __shared__ int sel[ROUTE_MAX_K];
    const float *lg = logits + (size_t)blockIdx.x * E;

    if (!sigmoid) {
        float m = -INFINITY;
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            m = fmaxf(m, lg[e]);
        float mx = block_max(m);
        double sum = 0;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            prob[e] = expf(__fsub_rn(lg[e], mx));
            sum += prob[e];
        }
        sum = block_sum_double(sum);
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            prob[e] = (float)((double)prob[e] / sum);
    } else {
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            prob[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lg[e])));
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        choice[e] = __fadd_rn(prob[e], bias ? bias[e] : 0.0f);
        taken[e] = 0;
    }
    __syncthreads();
    if (n_group > 1) {
        int gsize = E / n_group;
        for (int g = threadIdx.x; g < n_group; g += blockDim.x) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * gsize; e < (g + 1) * gsize; e++) {
                if (choice[e] > b1) {
                    b2 = b1;
                    b1 = choice[e];
                } else if (choice[e] > b2) {
                    b2 = choice[e];
                }
            }
            gscore[g] = __fadd_rn(b1, b2);
            gtaken[g] = 0;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 0; i < topk_group; i++) {
                int best = -1;
                for (int g = 0; g < n_group; g++)
                    if (!gtaken[g] && (best < 0 || gscore[g] > gscore[best]))
                        best = g;
                gtaken[best] = 1;
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (!gtaken[e / gsize])
                choice[e] = -INFINITY;
        __syncthreads();
    }
    for (int j = 0; j < k; j++) {
        int e = block_argmax_untaken(choice, taken, E);
        if (threadIdx.x == 0) {
            sel[j] = e;
            taken[e] = 1;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int32_t *io = ids + (size_t)blockIdx.x * k;
        float *wo = wout + (size_t)blockIdx.x * k;
        double wsum = 0;
        for (int j = 0; j < k; j++) {
            io[j] = sel[j];
            wo[j] = prob[sel[j]];
            wsum += prob[sel[j]];
        }
        for (int j = 0; j < k; j++) {
            float w = wo[j];
            if (normalize)
                w = (float)((double)w / (wsum + (double)eps));
            wo[j] = __fmul_rn(w, scaling);
        }
    }
}

/* The same routing for the common case without expert groups, one warp per token: a block's
 * k rounds of arg-max each cost two barriers, which makes the routing of one decode token take
 * as long as an expert GEMV. See cuda_route_warp.cuh. */
template <int NPL>
__global__ void __launch_bounds__(128)
    moe_route_warp_kernel(const float *logits, int n_tokens, route_warp_args a, int32_t *ids, float *wout)
{
    KT_BEGIN();
    pdl_trigger();
    pdl_wait();
    KT_MARK(1);
    const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= n_tokens)
        return;
    /* marks 2..4 (trace builds): logits in, probabilities, picks; the end: ids and weights stored */
    route_warp<NPL>(logits + (size_t)t * a.E, a, ids + (size_t)t * a.k, wout + (size_t)t * a.k,
                    [&](int i) { KT_MARK(i + 1); });
    KT_END(route, 0);
}

template <int NPL>
cudaError_t route_warp_launch(cudaStream_t stream, const float *logits, int n_tokens, const struct route_args *a,
                              int32_t *ids, float *weights, int pdl)
{
    unsigned blocks = (unsigned)((n_tokens + 3) / 4);
    return launch_pdl(pdl != 0, moe_route_warp_kernel<NPL>, dim3(blocks), dim3(128), 0, stream, logits, n_tokens,
                      route_warp_args_from(a), ids, weights);
}

/* One token per block of ROUTE_RANK_THREADS threads (route_rank_block, cuda_route_warp.cuh),
 * for decode-sized batches. */
template <int EP>
__global__ void __launch_bounds__(ROUTE_RANK_THREADS) moe_route_rank_kernel(const float *logits, route_warp_args a,
                                                                          int32_t *ids, float *wout)
{
    KT_BEGIN();
    pdl_trigger();
    pdl_wait();
    KT_MARK(1);
    const int t = blockIdx.x;
    /* marks 2..4 (trace builds): the max, the selection keys, the ranks; the end: ids stored */
    route_rank_block<EP>(logits + (size_t)t * a.E, a, ids + (size_t)t * a.k, wout + (size_t)t * a.k,
                         [&](int i) { KT_MARK(i + 1); });
    if (threadIdx.x == 0)
        KT_END(route, 1);
}

/* Whether moe_route_rank_kernel takes these arguments and this batch: no groups, at most 256
 * experts, and decode-sized batches (the rank counts cost E compares an expert: at prefill
 * sizes the warp kernel's rounds are cheaper work). */
static bool route_rank_supported(const struct route_args *a, int n_tokens)
{
    return cuda_route_warp_supported(a) && a->n_experts <= ROUTE_RANK_MAX_E && n_tokens <= 256;
}

} // namespace

extern "C" cudaError_t cuda_moe_route(cudaStream_t stream, const float *logits, int n_tokens,
                                      const struct route_args *a, int32_t *ids, float *weights, int pdl)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    int n_group = a->n_group > 1 ? a->n_group : 1;
    if (a->n_experts < 1 || a->n_experts > ROUTE_MAX_E || a->n_used < 1 || a->n_used > ROUTE_MAX_K ||
        a->n_used > a->n_experts || n_group > ROUTE_MAX_G || a->n_experts % n_group ||
        (n_group > 1 && (a->topk_group < 1 || a->topk_group > n_group)))
        return cudaErrorInvalidValue;
    if (route_rank_supported(a, n_tokens)) { /* one block per token, ranks counted */
        route_warp_args ra = route_warp_args_from(a);
        if (a->n_experts <= 128)
            return launch_pdl(pdl != 0, moe_route_rank_kernel<128>, dim3((unsigned)n_tokens),
                              dim3(ROUTE_RANK_THREADS), 0, stream, logits, ra, ids, weights);
        return launch_pdl(pdl != 0, moe_route_rank_kernel<256>, dim3((unsigned)n_tokens), dim3(ROUTE_RANK_THREADS),
                          0, stream, logits, ra, ids, weights);
    }
    if (cuda_route_warp_supported(a)) { /* one warp per token */
        if (a->n_experts <= 64)
            return route_warp_launch<2>(stream, logits, n_tokens, a, ids, weights, pdl);
        if (a->n_experts <= 128)
            return route_warp_launch<4>(stream, logits, n_tokens, a, ids, weights, pdl);
        if (a->n_experts <= 256)
            return route_warp_launch<8>(stream, logits, n_tokens, a, ids, weights, pdl);
        return route_warp_launch<16>(stream, logits, n_tokens, a, ids, weights, pdl);
    }
    size_t smem = (size_t)a->n_experts * (2 * sizeof(float) + 1);
    /* the k rounds of arg-max are latency, not work: a small block syncs faster (one warp per
     * 64 experts, at least two) */
    unsigned threads = (unsigned)(((a->n_experts + 63) / 64) * 32);
    threads = threads < 64u ? 64u : threads > (unsigned)ROUTE_THREADS ? (unsigned)ROUTE_THREADS : threads;
    moe_route_kernel<<<(unsigned)n_tokens, threads, smem, stream>>>(
        logits, a->n_experts, a->n_used, a->score == ROUTE_SIGMOID, a->correction_bias, n_group,
        a->topk_group, a->normalize ? 1 : 0, a->normalize_eps, a->scaling, ids, weights);
    return CUDA_LAUNCH_RESULT();
}
