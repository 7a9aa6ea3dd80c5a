/* cuda_decode.cu — memory-bound kernels for decode: one activation row per weight pass.
 *
 * At batch 1 a linear layer reads every weight byte once and does two flops
 * per weight, so the kernels here exist to keep HBM busy: each warp owns R
 * consecutive output rows and each lane issues all of its 16-byte weight
 * loads for them at once (before the kernel even waits for its predecessor
 * where programmatic launch is on), while x is staged once per block in
 * shared memory (in a bank-conflict-free layout) instead of being read by
 * every lane from global memory in 128-byte-strided pieces.
 *
 * NVFP4 decode without a lookup: an E2M1 nibble (s e1 e0 m) is moved with
 * two shifts and a mask into f32 bits (sign -> 31, e1 e0 -> 24..23,
 * m -> 22). That pattern is exactly the value times 2^-126 for every code,
 * the code 0.5 included (it lands on the f32 denormal 2^-127). The products
 * with x would then sink into denormals, so x is taken times 2^100 first
 * (exact) and the sum of each 16-element block is brought back with its
 * E4M3 block scale times 2^26. Four integer ops and one FMA per weight: the
 * dequantisation the generic path does in ~10 is what makes that one compute bound.
 * Denormals must not be flushed (no --use_fast_math on this file).
 *
 * Kernels:
 *  - gemv1: y_j = x W_j^T for up to 3 weights sharing x (q, k, v in one launch)
 *  - moe_gate_up: per (token, slot) pair, act = silu(x G_e^T) * (x U_e^T)
 *  - moe_down: per token, out = sum over its slots in ascending expert id of
 *    w_j * (act_j D_e^T), multiply and add rounded separately as the CPU does
 * The MoE pair kernels need no sort: each pair reads its own expert; with
 * few tokens the pairs rarely share one, and when they do L2 serves the rest.
 */
#include "backend/cuda/decode/decode.h"
#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/decode/cuda_decode_common.cuh"
#include "backend/cuda/common/cuda_ktrace.cuh"

KT_MODULE(decode, "gemv1")

namespace
{


/* acc[r] += the U chunks from c0 (stride step) of rows n0 + r, already loaded in raw. */
template <int FMT, int R, int U>
__device__ __forceinline__ void rows_dot_round(const wraw (&raw)[R][U], int64_t c0, int64_t step, int64_t NC,
                                               int64_t n0, int64_t N, const float4 *xs, float acc[R])
{
    constexpr int Q = chunk<FMT>::q;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t c = c0 + u * step;
        if (c >= NC)
            break;
        const float4 *xc = xs + c * Q;
        const int swz = x_swz<Q>(c);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (n0 + r < N)
                acc[r] += dot_raw<FMT>(raw[r][u], xc, swz);
    }
}

/* acc[r] += W[n0 + r, chunks of this lane's k-slice] . x for r < R, U chunks per lane in flight at
 * once: chunk j*32*KS + slice*32 + lane for j = 0, 1, ...; the first U of them are in `pre`
 * (loaded by rows_prefetch before the kernel waited for its predecessor). Not reduced over the
 * warp. */
template <int FMT, int R, int U>
__device__ __forceinline__ void rows_dot_smem(const cuda_wdev &w, int64_t n0, int64_t N, int64_t K,
                                              const float4 *xs, float acc[R], int slice, int n_slices,
                                              const wraw (&pre)[R][U])
{
    constexpr int C = chunk<FMT>::n;
    const int lane = threadIdx.x % 32;
    const int64_t NC = K / C, step = (int64_t)32 * n_slices;
    int64_t c0 = (int64_t)slice * 32 + lane;
    rows_dot_round<FMT, R, U>(pre, c0, step, NC, n0, N, xs, acc);
    for (c0 += U * step; c0 < NC; c0 += U * step) {
        wraw raw[R][U];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (c0 + u * step < NC && n0 + r < N)
                    raw[r][u] = load_raw<FMT>(w, n0 + r, (c0 + u * step) * C, K);
        rows_dot_round<FMT, R, U>(raw, c0, step, NC, n0, N, xs, acc);
    }
}

/* The first U chunks of each row, issued before the kernel waits (weights never change). */
template <int FMT, int R, int U>
__device__ __forceinline__ void rows_prefetch(const cuda_wdev &w, int64_t n0, int64_t N, int64_t K, int slice,
                                              int n_slices, wraw (&pre)[R][U])
{
    constexpr int C = chunk<FMT>::n;
    const int lane = threadIdx.x % 32;
    const int64_t NC = K / C, step = (int64_t)32 * n_slices, c0 = (int64_t)slice * 32 + lane;
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (c0 + u * step < NC && n0 + r < N)
                pre[r][u] = load_raw<FMT>(w, n0 + r, (c0 + u * step) * C, K);
}

struct gemv1_job {
    cuda_wdev w;
    int64_t N;
    float *y;
    int64_t first_warp;
};

struct gemv1_params {
    gemv1_job job[MAX_JOBS];
    int n_jobs;
    int64_t K;
    const float *x;
};

/* R rows per row group, KS warps per row group (each a slice of K, summed in a fixed order
 * through shared memory), U chunks per lane in flight. x is staged once per block in shared
 * memory (dynamic, K floats). p.job[].first_warp counts row groups. */
template <int FMT, int R, int KS, int U>
__global__ void __launch_bounds__(DEC_THREADS, 2) gemv1_kernel(gemv1_params p)
{
    extern __shared__ float4 xs[];
    __shared__ float part[DEC_WARPS][R];
    const int wib = threadIdx.x / 32, lane = threadIdx.x % 32, slice = wib % KS;
    const int64_t grp = (int64_t)blockIdx.x * (DEC_WARPS / KS) + wib / KS;
    int j = 0;
    while (j + 1 < p.n_jobs && grp >= p.job[j + 1].first_warp)
        j++;
    const gemv1_job &jb = p.job[j];
    const cuda_wdev w = jb.w; /* in registers: a dynamically indexed parameter lives in local memory */
    KT_BEGIN();
    const int64_t n0 = (grp - jb.first_warp) * R;
    const bool live = grp < p.job[p.n_jobs - 1].first_warp + (p.job[p.n_jobs - 1].N + R - 1) / R && n0 < jb.N;
    wraw pre[R][U];
    if (live)
        rows_prefetch<FMT, R, U>(w, n0, jb.N, p.K, slice, KS, pre);
    KT_MARK(1);
    pdl_wait();
    KT_MARK(2);
    stage_x<FMT>(xs, p.x, p.K);
    __syncthreads();
    KT_MARK(3);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    if (live) {
        rows_dot_smem<FMT, R, U>(w, n0, jb.N, p.K, xs, acc, slice, KS, pre);
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r] = warp_sum(acc[r]);
    }
    KT_MARK(4);
    pdl_trigger(); /* late: see pdl_trigger() */
    if constexpr (KS > 1) {
        if (lane == 0 && live)
#pragma unroll
            for (int r = 0; r < R; r++)
                part[wib][r] = acc[r];
        __syncthreads();
        if (!live || slice != 0)
            return;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = part[wib][r];
            for (int s = 1; s < KS; s++)
                v += part[wib + s][r];
            acc[r] = v;
        }
    } else if (!live) {
        return;
    }
    if (lane < R && n0 + lane < jb.N) {
        float v = acc[0];
#pragma unroll
        for (int r = 1; r < R; r++)
            if (lane == r)
                v = acc[r];
        v = finish<FMT>(w, v) + (w.bias ? w.bias[n0 + lane] : 0.0f);
        jb.y[n0 + lane] = v;
    }
    KT_END(decode, 0);
}

/* Rows per warp of the MoE pair kernels: GU_R (gate/up) and DOWN_R (down). More rows would put
 * more loads in flight per warp in fewer blocks, but 4 gate/up rows or 8 down rows exceed the 128
 * registers two blocks per SM allow and spill. Nor one wave by occupancy: the spills cost more
 * than the second wave (H200, batch 1: gate/up at 3 blocks per SM 322.7 tok/s, down at 4 blocks
 * 288.9, against 330.1; docs/lab/journal.md). */
enum { GU_R = 2, DOWN_R = 4 };

/* act[pair, n] = silu(x_t G_e[n]) * (x_t U_e[n]); grid (row groups, pairs). The expert id comes
 * from the previous kernel, so nothing is prefetched: the id, then its table entry, then the
 * weights are issued before x is staged, so x's trip overlaps theirs. */
template <int FMT>
__global__ void __launch_bounds__(DEC_THREADS, 2)
    moe_gate_up_kernel(const cuda_wdev *table, int n_experts, int64_t I, int64_t D, const float *x,
                       const int32_t *ids, int n_used, float *act)
{
    extern __shared__ float4 xs[];
    __shared__ int s_e;
    constexpr int U = 2;
    pdl_wait();
    const int pair = blockIdx.y;
    if (threadIdx.x == 0)
        s_e = ids[pair];
    __syncthreads();
    const int e = s_e;
    const int64_t n0 = ((int64_t)blockIdx.x * DEC_WARPS + threadIdx.x / 32) * GU_R;
    float *out = act + (size_t)pair * (size_t)I;
    const int lane = threadIdx.x % 32;
    if (e < 0 || e >= n_experts) { /* no expert: contributes nothing (moe_down skips it too) */
        if (lane < GU_R && n0 + lane < I)
            out[n0 + lane] = 0.0f;
        return;
    }
    /* local copies: through a reference into global memory every chunk would reload the pointers */
    const cuda_wdev wg = table[e], wu = table[n_experts + e];
    wraw pg[GU_R][U], pu[GU_R][U];
    if (n0 < I) {
        rows_prefetch<FMT, GU_R, U>(wg, n0, I, D, 0, 1, pg);
        rows_prefetch<FMT, GU_R, U>(wu, n0, I, D, 0, 1, pu);
    }
    stage_x<FMT>(xs, x + (size_t)(pair / n_used) * (size_t)D, D);
    __syncthreads();
    if (n0 >= I)
        return;
    float g[GU_R], u[GU_R];
#pragma unroll
    for (int r = 0; r < GU_R; r++)
        g[r] = 0.0f, u[r] = 0.0f;
    rows_dot_smem<FMT, GU_R, U>(wg, n0, I, D, xs, g, 0, 1, pg);
    rows_dot_smem<FMT, GU_R, U>(wu, n0, I, D, xs, u, 0, 1, pu);
    pdl_trigger(); /* late: see pdl_trigger() */
#pragma unroll
    for (int r = 0; r < GU_R; r++)
        g[r] = warp_sum(g[r]), u[r] = warp_sum(u[r]);
    if (lane < GU_R && n0 + lane < I) {
        float gv = g[0], uv = u[0];
#pragma unroll
        for (int r = 1; r < GU_R; r++)
            if (lane == r)
                gv = g[r], uv = u[r];
        gv = finish<FMT>(wg, gv);
        uv = finish<FMT>(wu, uv);
        /* biases of the gate/up projections, then silu(g) * u rounded as cuda_silu_mul does */
        if (wg.bias)
            gv += wg.bias[n0 + lane];
        if (wu.bias)
            uv += wu.bias[n0 + lane];
        out[n0 + lane] = dev_silu_mul(gv, uv);
    }
}

/* out[t, d] = sum over the token's slots in ascending expert id of w * (act_pair D_e[d]);
 * grid (groups of DOWN_R rows, tokens). Warp j of the block takes slots j, j + 8, ...: the
 * experts stream in parallel, and one thread per row adds them up in expert order. Each warp
 * stages its slot's activations in its own slice of shared memory (I floats).
 * The first slot's expert is read after the wait, not before: issuing its loads before it costs
 * more in registers than the overlap gains (H200, batch 1: 310 vs 328 tok/s, docs/lab/journal.md). */
template <int FMT>
__global__ void __launch_bounds__(DEC_THREADS, 2)
    moe_down_kernel(const cuda_wdev *table, int n_experts, int64_t D, int64_t I, const float *act,
                    const int32_t *ids, const float *weights, int n_used, float *out)
{
    extern __shared__ float4 xs[];
    constexpr int U = 1; /* expert widths are short (768 in Qwen3-30B: 24 NVFP4 chunks a row) */
    __shared__ int order[MAX_K_USED];
    __shared__ float part[MAX_K_USED][DOWN_R];
    pdl_wait();
    const int t = blockIdx.y;
    const int32_t *it = ids + (size_t)t * n_used;
    if (threadIdx.x == 0)
        slots_by_expert(it, n_used, order);
    const int64_t n0 = (int64_t)blockIdx.x * DOWN_R;
    const int wib = threadIdx.x / 32, lane = threadIdx.x % 32;
    float4 *mine = xs + (size_t)wib * (size_t)(I / 4);
    for (int j = wib; j < n_used; j += DEC_WARPS) {
        const int e = it[j];
        float acc[DOWN_R];
#pragma unroll
        for (int r = 0; r < DOWN_R; r++)
            acc[r] = 0.0f;
        if (e >= 0 && e < n_experts) {
            const cuda_wdev w = table[2 * n_experts + e];
            wraw pre[DOWN_R][U];
            rows_prefetch<FMT, DOWN_R, U>(w, n0, D, I, 0, 1, pre);
            __syncwarp();
            { /* this warp's slot activations, in the swizzled layout */
                constexpr int Q = chunk<FMT>::q;
                const float4 *src = (const float4 *)(act + ((size_t)t * n_used + j) * (size_t)I);
                for (int64_t f = lane; f < I / 4; f += 32) {
                    float4 v = src[f];
                    if constexpr (FMT == WEIGHT_NVFP4)
                        v = make_float4(v.x * X_PRESCALE, v.y * X_PRESCALE, v.z * X_PRESCALE, v.w * X_PRESCALE);
                    int64_t c = f / Q;
                    mine[c * Q + ((int)(f % Q) ^ x_swz<Q>(c))] = v;
                }
            }
            __syncwarp();
            rows_dot_smem<FMT, DOWN_R, U>(w, n0, D, I, mine, acc, 0, 1, pre);
#pragma unroll
            for (int r = 0; r < DOWN_R; r++)
                acc[r] = finish<FMT>(w, warp_sum(acc[r])) + (w.bias && n0 + r < D ? w.bias[n0 + r] : 0.0f);
        }
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < DOWN_R; r++)
                part[j][r] = e >= 0 && e < n_experts ? acc[r] : 0.0f;
    }
    pdl_trigger(); /* late: see pdl_trigger() */
    __syncthreads();
    if (threadIdx.x < DOWN_R && n0 + threadIdx.x < D) {
        const int r = threadIdx.x;
        const float o = slots_combine<DOWN_R>(it, weights + (size_t)t * n_used, order, part, n_used, n_experts, r);
        out[(size_t)t * (size_t)D + n0 + r] = o;
    }
}

/* K must split into whole 16-byte chunks for every format's vector loads (cuda_decode_limits.h). */
bool k_ok(enum weight_format fmt, int64_t K)
{
    return cuda_dec_k_ok(fmt, K);
}
static_assert(chunk<WEIGHT_NVFP4>::n == 32 && chunk<WEIGHT_FP8_BLOCK>::n == 16 && chunk<WEIGHT_F32>::n == 4 &&
                  chunk<WEIGHT_BF16>::n == 8 && chunk<WEIGHT_F16>::n == 8,
              "cuda_dec_chunk() states the chunk sizes");

template <template <int> class L, typename... A>
cudaError_t by_format(enum weight_format fmt, A... a)
{
    switch (fmt) {
    case WEIGHT_F32: return L<WEIGHT_F32>::run(a...);
    case WEIGHT_BF16: return L<WEIGHT_BF16>::run(a...);
    case WEIGHT_F16: return L<WEIGHT_F16>::run(a...);
    case WEIGHT_FP8_BLOCK: return L<WEIGHT_FP8_BLOCK>::run(a...);
    case WEIGHT_NVFP4: return L<WEIGHT_NVFP4>::run(a...);
    default: return cudaErrorInvalidValue;
    }
}

/* Dynamic shared memory above the default 48 KB needs the kernel's opt-in. */
template <typename K>
cudaError_t smem_opt_in(K kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int FMT>
struct launch_gemv1 {
    template <int R, int KS, int U>
    static cudaError_t go(cudaStream_t s, gemv1_params p, bool pdl)
    {
        int64_t groups = 0;
        for (int j = 0; j < p.n_jobs; j++) {
            p.job[j].first_warp = groups;
            groups += (p.job[j].N + R - 1) / R;
        }
        int64_t blocks = (groups + DEC_WARPS / KS - 1) / (DEC_WARPS / KS);
        if (blocks > 0x7fffffff)
            return cudaErrorInvalidValue;
        size_t smem = (size_t)p.K * sizeof(float);
        cudaError_t e = smem_opt_in(gemv1_kernel<FMT, R, KS, U>, smem);
        if (e != cudaSuccess)
            return e;
        return launch_pdl(pdl, gemv1_kernel<FMT, R, KS, U>, dim3((unsigned)blocks), dim3(DEC_THREADS), smem, s, p);
    }
    /* One wave of warps with all their loads in flight: many rows -> 4 rows a warp; a few
     * thousand -> 2 rows with up to 4 chunks each per lane; short weights -> K split 8 ways.
     * 2 rows for q/k/v and o beat 4 (H200, Qwen3-30B-A3B NVFP4, batch 1: 303 vs 290 tok/s,
     * docs/lab/journal.md). */
    static cudaError_t run(cudaStream_t s, const gemv1_params *p, int64_t rows, bool pdl)
    {
        int64_t rounds = (p->K / chunk<FMT>::n + 31) / 32; /* chunks per lane per row */
        if (rows < 2048)
            return go<1, 8, 1>(s, *p, pdl);
        if (rows >= 4 * 4096)
            return rounds <= 2 ? go<4, 1, 2>(s, *p, pdl) : go<4, 1, 4>(s, *p, pdl);
        return rounds <= 2 ? go<2, 1, 2>(s, *p, pdl) : go<2, 1, 4>(s, *p, pdl);
    }
};

template <int FMT>
struct launch_moe {
    static cudaError_t run(cudaStream_t s, const cuda_wdev *table, int n_experts, int64_t D, int64_t I,
                           const float *x, int n_tokens, const int32_t *ids, const float *weights, int n_used,
                           float *act, float *out, bool pdl)
    {
        int64_t warps_i = (I + GU_R - 1) / GU_R;
        dim3 g1((unsigned)((warps_i + DEC_WARPS - 1) / DEC_WARPS), (unsigned)(n_tokens * n_used));
        size_t smem1 = (size_t)D * sizeof(float), smem2 = (size_t)DEC_WARPS * (size_t)I * sizeof(float);
        cudaError_t e = smem_opt_in(moe_gate_up_kernel<FMT>, smem1);
        if (e == cudaSuccess)
            e = launch_pdl(pdl, moe_gate_up_kernel<FMT>, g1, dim3(DEC_THREADS), smem1, s, table, n_experts, I, D, x,
                           ids, n_used, act);
        if (e == cudaSuccess)
            e = smem_opt_in(moe_down_kernel<FMT>, smem2);
        if (e != cudaSuccess)
            return e;
        dim3 g2((unsigned)((D + DOWN_R - 1) / DOWN_R), (unsigned)n_tokens);
        return launch_pdl(pdl, moe_down_kernel<FMT>, g2, dim3(DEC_THREADS), smem2, s, table, n_experts, D, I, act,
                          ids, weights, n_used, out);
    }
};

} // namespace

extern "C" int cuda_gemv1_supported(enum weight_format fmt, int64_t K, const float *x, size_t smem_budget)
{
    return cuda_gemv1_fits(fmt, K, smem_budget) && (uintptr_t)x % 16 == 0;
}

extern "C" cudaError_t cuda_gemv1(cudaStream_t stream, enum weight_format fmt, int n_w, const struct cuda_wdev *w,
                                  const int64_t *N, int64_t K, const float *x, float *const *y, int pdl)
{
    if (n_w < 1 || n_w > MAX_JOBS || !k_ok(fmt, K) || (uintptr_t)x % 16)
        return cudaErrorInvalidValue;
    gemv1_params p = {};
    p.n_jobs = n_w;
    p.K = K;
    p.x = x;
    int64_t rows = 0;
    for (int j = 0; j < n_w; j++) {
        p.job[j].w = w[j];
        p.job[j].N = N[j];
        p.job[j].y = y[j];
        rows += N[j];
    }
    if (!rows)
        return cudaSuccess;
    return by_format<launch_gemv1>(fmt, stream, (const gemv1_params *)&p, rows, pdl != 0);
}

extern "C" int cuda_moe_decode_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                         size_t smem_budget)
{
    return cuda_moe_decode_fits(fmt, d_model, d_expert, n_used, smem_budget);
}

extern "C" cudaError_t cuda_moe_decode(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                                       int n_experts, int64_t d_model, int64_t d_expert, const float *x,
                                       int n_tokens, const int32_t *ids, const float *weights, int n_used,
                                       float *act, float *out, int pdl)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    if (!k_ok(fmt, d_model) || !k_ok(fmt, d_expert) || n_used < 1 || n_used > MAX_K_USED ||
        (int64_t)n_tokens * n_used > 65535)
        return cudaErrorInvalidValue;
    return by_format<launch_moe>(fmt, stream, table, n_experts, d_model, d_expert, x, n_tokens, ids, weights,
                                 n_used, act, out, pdl != 0);
}
