/* cuda_router_route.cu — a decode step's MoE router GEMV and its routing in one kernel.
 *
 * Why: at a few tokens the router (Qwen3-30B-A3B: 128 x 2048 BF16, 0.5 MB) and the top-k are
 * two tiny kernels in a chain that every MoE layer waits on: the experts' kernel cannot start its
 * loads before the ids exist (a block trace on the H200 showed gate/up blocks sitting ~3 us in
 * their PDL wait behind them). Here
 *  - a warp computes one (token, expert) logit; its router row is loaded before the PDL wait
 *    (weights never change), so only x is fetched after it;
 *  - each block counts itself in on a device counter once its logits are written; the block
 *    that arrives last reads all logits back through L2 and routes every token with one warp
 *    per token (route_warp, the standalone routing kernel's code), then resets the counter for
 *    the next launch (graph replays reuse it).
 * Numbers: a logit is the fp32 sum over the lane's 8-element chunks in order, then a butterfly
 * over the warp, plus the bias; the routing is route_warp's (the CPU reference's order).
 * Shapes: BF16 router rows with K % 8 == 0, no expert groups, at most CUDA_RR_MAX_LOGITS logits
 * (tokens x experts), their floats within the shared-memory budget (cuda_route_limits.h, which
 * the kernel table's limits read too); otherwise the plan's next choice runs, linear + moe_route.
 * That form's last block costs about what the kernel boundary does (the fence, the atomic, the
 * read-back), so where the device has thread block clusters (caps "clusters", at most 128
 * experts) there is a second form: a cluster per token, whose blocks store their logits straight
 * into block 0's shared memory; block 0 routes them with route_rank_block (every expert's rank at
 * once). Two cluster barrier phases replace the counter, the fences and the L2 round trip; with
 * norm_w the add + RMSNorm before the router runs in its prologue too (cuda_norm_router_route).
 * At one token both forms are slower than the two kernels (H200, batch 1: 346.8 and 386.5 vs
 * 367.9 and 408.3 tok/s, docs/lab/journal.md), so the plan lists them from 2 tokens
 * (plan_dispatch.c, op moe_route).
 */
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_ktrace.cuh"
#include "backend/cuda/moe/cuda_route_warp.cuh"

/* trace builds: the cluster form's block 0 (kernel 0) and the others (kernel 1) */
KT_MODULE(router_route, "rr_cluster_leader", "rr_cluster_peer")

namespace
{

enum { RR_THREADS = 256, RR_WARPS = RR_THREADS / 32, RR_U = 8 };

struct rr_params {
    const uint4 *w;    /* (E, K) bf16 rows as 8-element chunks */
    const float *bias; /* (E) or NULL: the linear's bias */
    const float *x;    /* (n_tokens, K) */
    int64_t K;
    int n_tokens;
    route_warp_args ra;
    float *logits;   /* (n_tokens, E) */
    int32_t *ids;    /* (n_tokens, k) */
    float *weights;  /* (n_tokens, k) */
    unsigned *count; /* zero between launches */
    /* the cluster form only: norm_w not NULL: x is the residual rows h (+= delta where not NULL),
     * the router reads rmsnorm(h) * norm_w; block 0 of each token's cluster writes h and it to
     * h_out and x_out */
    const float *norm_w, *delta;
    float eps;
    float *h_out, *x_out;
};

/* 8 bf16 of w times 8 floats of x (two float4), added in order to acc */
__device__ __forceinline__ float chunk_dot(uint4 w, const float *x, float acc)
{
    const float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
    acc = fmaf(__uint_as_float(w.x << 16), a.x, acc);
    acc = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, acc);
    acc = fmaf(__uint_as_float(w.y << 16), a.z, acc);
    acc = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, acc);
    acc = fmaf(__uint_as_float(w.z << 16), b.x, acc);
    acc = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, acc);
    acc = fmaf(__uint_as_float(w.w << 16), b.z, acc);
    return fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, acc);
}

/* The lane's part of one logit: router row wr (NC chunks of 8) times x row xr, the first RR_U
 * chunks of each lane already in pre (loaded before the PDL wait), the rest loaded here; fp32
 * in chunk order, not yet summed over the warp. */
__device__ __forceinline__ float router_dot(const uint4 (&pre)[RR_U], const uint4 *wr, const float *xr, int64_t NC,
                                            int lane)
{
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < RR_U; u++) {
        const int64_t c = lane + 32 * u;
        if (c < NC)
            acc = chunk_dot(pre[u], xr + 8 * c, acc);
    }
    for (int64_t c0 = 32 * RR_U; c0 < NC; c0 += 32 * RR_U) {
        uint4 q[RR_U];
#pragma unroll
        for (int u = 0; u < RR_U; u++) {
            const int64_t c = c0 + lane + 32 * u;
            q[u] = c < NC ? __ldg(wr + c) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < RR_U; u++) {
            const int64_t c = c0 + lane + 32 * u;
            if (c < NC)
                acc = chunk_dot(q[u], xr + 8 * c, acc);
        }
    }
    return acc;
}

/* pre: the first RR_U chunks of each lane of router row wr (zero where live is false). */
__device__ __forceinline__ void router_prefetch(uint4 (&pre)[RR_U], const uint4 *wr, int64_t NC, bool live, int lane)
{
#pragma unroll
    for (int u = 0; u < RR_U; u++) {
        const int64_t c = lane + 32 * u;
        pre[u] = live && c < NC ? __ldg(wr + c) : make_uint4(0u, 0u, 0u, 0u);
    }
}

template <int NPL>
__global__ void __launch_bounds__(RR_THREADS) router_route_kernel(const __grid_constant__ rr_params p)
{
    extern __shared__ float lg[]; /* (n_tokens, E), used by the last block */
    __shared__ int s_last;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, E = p.ra.E;
    const int row = (int)blockIdx.x * RR_WARPS + warp; /* token * E + expert */
    const bool live = row < p.n_tokens * E;
    const int t = live ? row / E : 0, e = live ? row % E : 0;
    const int64_t NC = p.K / 8;
    const uint4 *wr = p.w + (size_t)e * (size_t)NC;
    uint4 pre[RR_U];
    router_prefetch(pre, wr, NC, live, lane);
    pdl_trigger(); /* the experts' kernel may take its slots now; it waits for the ids anyway */
    pdl_wait();
    const float *xr = p.x + (size_t)t * (size_t)p.K;
    float acc = live ? router_dot(pre, wr, xr, NC, lane) : 0.0f;
    acc = warp_sum(acc);
    if (live && lane == 0)
        p.logits[row] = p.bias ? __fadd_rn(acc, p.bias[e]) : acc;

    /* count in; the last block routes (logits written before the count, read after it) */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        s_last = atomicAdd(p.count, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    for (int i = threadIdx.x; i < p.n_tokens * E; i += RR_THREADS)
        lg[i] = __ldcg(p.logits + i);
    __syncthreads();
    for (int tt = warp; tt < p.n_tokens; tt += RR_WARPS)
        route_warp<NPL>(lg + (size_t)tt * E, p.ra, p.ids + (size_t)tt * p.ra.k,
                        p.weights + (size_t)tt * p.ra.k);
    if (threadIdx.x == 0)
        *p.count = 0u;
}

/* The cluster form: grid (ceil(E / RC_WARPS), n_tokens) in clusters of the first dimension (one
 * cluster a token, at most 8 blocks); warp w of block b computes the token's logit b * RC_WARPS +
 * w and stores it into block 0's shared memory, which routes the token from there. With
 * p.norm_w every block first makes x = rmsnorm(h + delta) * norm_w itself in its shared memory
 * (K floats, dynamic), rounded as the CPU's add and RMSNorm; block 0 writes h + delta and x out
 * only after the cluster's second barrier, when no block of the token reads h any more. */
enum { RC_THREADS = CUDA_RC_THREADS, RC_WARPS = RC_THREADS / 32, RC_MAX_E = CUDA_RC_MAX_E, RC_NORM_IT = CUDA_RC_NORM_IT };
static_assert((int)RC_THREADS == (int)ROUTE_RANK_THREADS, "block 0 ranks with route_rank_block's threads");

__global__ void __launch_bounds__(RC_THREADS) router_route_cluster_kernel(const __grid_constant__ rr_params p)
{
    __shared__ float s_lg[RC_MAX_E];
    extern __shared__ float4 s_x[]; /* with norm_w: x of the token (K / 4 float4) */
    KT_BEGIN();
    cluster_arrive_relaxed(); /* phase 0: this block has started (its s_lg may be written) */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, E = p.ra.E;
    const int t = (int)blockIdx.y, e = (int)blockIdx.x * RC_WARPS + warp;
    const bool live = e < E;
    const int64_t NC = p.K / 8;
    const uint4 *wr = p.w + (size_t)(live ? e : 0) * (size_t)NC;
    uint4 pre[RR_U];
    router_prefetch(pre, wr, NC, live, lane);
    pdl_trigger();
    pdl_wait();
    KT_MARK(1);
    const float *xr = p.x + (size_t)t * (size_t)p.K;
    float4 hv[RC_NORM_IT]; /* with norm_w: this thread's h + delta, for block 0 to write out */
    const int K4 = (int)(p.K / 4);
    if (p.norm_w) {
        const float4 *h4 = (const float4 *)xr, *d4 = p.delta ? (const float4 *)(p.delta + (size_t)t * p.K) : nullptr;
        double ss = 0;
#pragma unroll
        for (int i = 0; i < RC_NORM_IT; i++) {
            const int f = (int)threadIdx.x + i * RC_THREADS;
            if (f < K4) {
                float4 v = h4[f];
                if (d4) {
                    const float4 d = d4[f];
                    v = make_float4(__fadd_rn(v.x, d.x), __fadd_rn(v.y, d.y), __fadd_rn(v.z, d.z), __fadd_rn(v.w, d.w));
                }
                hv[i] = v;
                ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
            }
        }
        const float inv = dev_rms_inv(block_sum_double(ss), (int)p.K, p.eps);
#pragma unroll
        for (int i = 0; i < RC_NORM_IT; i++) {
            const int f = (int)threadIdx.x + i * RC_THREADS;
            if (f < K4) {
                const float4 w = __ldg((const float4 *)p.norm_w + f), v = hv[i];
                s_x[f] = make_float4(__fmul_rn(w.x, __fmul_rn(v.x, inv)), __fmul_rn(w.y, __fmul_rn(v.y, inv)),
                                     __fmul_rn(w.z, __fmul_rn(v.z, inv)), __fmul_rn(w.w, __fmul_rn(v.w, inv)));
            }
        }
        __syncthreads();
        xr = (const float *)s_x;
    }
    KT_MARK(2);
    float acc = live ? router_dot(pre, wr, xr, NC, lane) : 0.0f;
    acc = warp_sum(acc);
    KT_MARK(3);
    cluster_wait(); /* every block of the cluster has started: block 0's s_lg may be written */
    KT_MARK(4);
    if (live && lane == 0) {
        const float v = p.bias ? __fadd_rn(acc, p.bias[e]) : acc;
        *cluster_peer(&s_lg[e], 0u) = v;
        p.logits[(size_t)t * E + e] = v;
    }
    cluster_arrive(); /* phase 1: this block's logits are in block 0 */
    if (blockIdx.x != 0) { /* the cluster's rank (clusters span the first grid dimension) */
        KT_END(router_route, 1);
        return;
    }
    cluster_wait();
    KT_MARK(5);
    if (p.norm_w) { /* every block of the token has read h: the new h and x go out */
        float4 *ho = (float4 *)(p.h_out + (size_t)t * p.K), *xo = (float4 *)(p.x_out + (size_t)t * p.K);
#pragma unroll
        for (int i = 0; i < RC_NORM_IT; i++) {
            const int f = (int)threadIdx.x + i * RC_THREADS;
            if (f < K4) {
                ho[f] = hv[i];
                xo[f] = s_x[f];
            }
        }
    }
    KT_MARK(6);
    route_rank_block<RC_MAX_E>(s_lg, p.ra, p.ids + (size_t)t * p.ra.k, p.weights + (size_t)t * p.ra.k);
    KT_END(router_route, 0);
}

} // namespace

extern "C" int cuda_router_route_supported(const struct weight *router, int n_tokens,
                                           const struct route_args *a, size_t smem_budget)
{
    return cuda_router_route_fits(router->format, router->cols, n_tokens, a->n_experts, a->n_used, a->n_group,
                                  smem_budget) &&
           router->rows == a->n_experts && (uintptr_t)router->data % 16 == 0;
}

/* The parameters both forms share (the rest zero). */
static rr_params rr_params_of(const struct weight *router, const float *x, int n_tokens, const struct route_args *a,
                              float *logits, int32_t *ids, float *weights)
{
    rr_params p = {};
    p.w = (const uint4 *)router->data;
    p.bias = router->bias;
    p.x = x;
    p.K = router->cols;
    p.n_tokens = n_tokens;
    p.ra = route_warp_args_from(a);
    p.logits = logits;
    p.ids = ids;
    p.weights = weights;
    return p;
}

/* The cluster form over p.n_tokens tokens (x of K floats in shared memory with p.norm_w). */
static cudaError_t rr_cluster_launch(cudaStream_t stream, const rr_params &p, int pdl)
{
    const unsigned per = (unsigned)((p.ra.E + RC_WARPS - 1) / RC_WARPS);
    const size_t smem = p.norm_w ? (size_t)p.K * 4 : 0;
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(router_route_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess)
            return e;
    }
    return launch_pdl_cluster(pdl != 0, dim3(per, 1, 1), router_route_cluster_kernel,
                              dim3(per, (unsigned)p.n_tokens), dim3(RC_THREADS), smem, stream, p);
}

extern "C" int cuda_router_route_cluster_supported(const struct weight *router, int n_tokens,
                                                   const struct route_args *a, size_t smem_budget)
{
    return cuda_router_route_supported(router, n_tokens, a, smem_budget) &&
           cuda_router_route_cluster_fits(router->format, router->cols, n_tokens, a->n_experts, a->n_used,
                                          a->n_group, smem_budget);
}

extern "C" int cuda_norm_router_route_supported(const struct weight *router, int n_tokens, const struct route_args *a,
                                                size_t smem_budget)
{
    return cuda_router_route_supported(router, n_tokens, a, smem_budget) &&
           cuda_norm_router_route_fits(router->format, router->cols, n_tokens, a->n_experts, a->n_used, a->n_group,
                                       smem_budget);
}

extern "C" cudaError_t cuda_norm_router_route(cudaStream_t stream, float *h, const float *delta, const float *norm_w,
                                              float eps, const struct weight *router, int n_tokens,
                                              const struct route_args *a, float *x, float *logits, int32_t *ids,
                                              float *weights, int pdl)
{
    if (!cuda_norm_router_route_supported(router, n_tokens, a, (size_t)-1) ||
        ((uintptr_t)h | (uintptr_t)delta | (uintptr_t)norm_w | (uintptr_t)x) % 16)
        return cudaErrorInvalidValue;
    rr_params p = rr_params_of(router, h, n_tokens, a, logits, ids, weights);
    p.norm_w = norm_w;
    p.delta = delta;
    p.eps = eps;
    p.h_out = h;
    p.x_out = x;
    return rr_cluster_launch(stream, p, pdl);
}

extern "C" cudaError_t cuda_router_route(cudaStream_t stream, const struct weight *router, const float *x,
                                         int n_tokens, const struct route_args *a, float *logits,
                                         int32_t *ids, float *weights, unsigned *count, int pdl, int cluster)
{
    if (!cuda_router_route_supported(router, n_tokens, a, (size_t)-1) || (!cluster && !count) || (uintptr_t)x % 16)
        return cudaErrorInvalidValue;
    rr_params p = rr_params_of(router, x, n_tokens, a, logits, ids, weights);
    p.count = count;
    if (cluster) {
        if (!cuda_router_route_cluster_supported(router, n_tokens, a, (size_t)-1))
            return cudaErrorInvalidValue;
        return rr_cluster_launch(stream, p, pdl);
    }
    const unsigned blocks = (unsigned)(((int64_t)n_tokens * a->n_experts + RR_WARPS - 1) / RR_WARPS);
    const size_t smem = (size_t)n_tokens * (size_t)a->n_experts * sizeof(float);
    if (a->n_experts <= 64)
        return launch_pdl(pdl != 0, router_route_kernel<2>, dim3(blocks), dim3(RR_THREADS), smem, stream, p);
    if (a->n_experts <= 128)
        return launch_pdl(pdl != 0, router_route_kernel<4>, dim3(blocks), dim3(RR_THREADS), smem, stream, p);
    if (a->n_experts <= 256)
        return launch_pdl(pdl != 0, router_route_kernel<8>, dim3(blocks), dim3(RR_THREADS), smem, stream, p);
    return launch_pdl(pdl != 0, router_route_kernel<16>, dim3(blocks), dim3(RR_THREADS), smem, stream, p);
}
