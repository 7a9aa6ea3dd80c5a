/* cuda_decode.cu — memory-bound kernels for decode: one activation row per weight pass.
 *
 * At batch 1 a linear layer reads every weight byte once and does two flops
 * per weight, so the kernels here exist to keep HBM busy: each warp owns
 * GEMV_R consecutive output rows, each lane streams 16-byte chunks of the
 * rows and keeps its slice of x in registers across those rows.
 *
 * NVFP4 decode without a lookup: an E2M1 nibble (s e1 e0 m) is moved with
 * two shifts and a mask into f32 bits (sign -> 31, e1 e0 -> 24..23,
 * m -> 22). That pattern is exactly the value times 2^-126 for every code,
 * the code 0.5 included (it lands on the f32 denormal 2^-127). The products
 * with x would then sink into denormals, so x is taken times 2^100 first
 * (exact) and the sum of each 16-element block is brought back with its
 * E4M3 block scale times 2^26. Four integer ops and one FMA per weight: the
 * dequantisation the generic path does in ~10 is what made it compute bound.
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
#include "backend/cuda/cuda_common.cuh"

namespace
{

enum { DEC_THREADS = 256, DEC_WARPS = DEC_THREADS / 32, MAX_JOBS = 3, MAX_K_USED = 64 };

constexpr float X_PRESCALE = 0x1p100f;
constexpr float W_POSTSCALE = 0x1p26f; /* 2^126 / 2^100 */

/* Nibble I of u as f32 bits: exactly its E2M1 value times 2^-126. */
template <int I>
__device__ __forceinline__ float e2m1_raw(uint32_t u)
{
    constexpr int mag_shift = 22 - 4 * I, sign_shift = 28 - 4 * I; /* left; negative: right */
    uint32_t mag = mag_shift >= 0 ? (u << (mag_shift >= 0 ? mag_shift : 0)) : (u >> (mag_shift < 0 ? -mag_shift : 0));
    uint32_t sgn = sign_shift >= 0 ? (u << (sign_shift >= 0 ? sign_shift : 0)) : (u >> (sign_shift < 0 ? -sign_shift : 0));
    return __uint_as_float((mag & 0x01C00000u) | (sgn & 0x80000000u));
}

__device__ __forceinline__ float e2m1_dot8(uint32_t u, const float *x, float acc)
{
    acc = fmaf(e2m1_raw<0>(u), x[0], acc);
    acc = fmaf(e2m1_raw<1>(u), x[1], acc);
    acc = fmaf(e2m1_raw<2>(u), x[2], acc);
    acc = fmaf(e2m1_raw<3>(u), x[3], acc);
    acc = fmaf(e2m1_raw<4>(u), x[4], acc);
    acc = fmaf(e2m1_raw<5>(u), x[5], acc);
    acc = fmaf(e2m1_raw<6>(u), x[6], acc);
    acc = fmaf(e2m1_raw<7>(u), x[7], acc);
    return acc;
}

/* Elements of one lane's chunk: 16 bytes of weights. */
template <int FMT>
struct chunk {
    static constexpr int n = FMT == WEIGHT_NVFP4 ? 32 : FMT == WEIGHT_FP8_BLOCK ? 16 : FMT == WEIGHT_F32 ? 4 : 8;
};

/* The lane's x chunk into registers (NVFP4: times 2^100). */
template <int FMT>
__device__ __forceinline__ void load_x(const float *x, int64_t k, float *xs)
{
    constexpr int C = chunk<FMT>::n;
    const float4 *p = (const float4 *)(x + k);
#pragma unroll
    for (int i = 0; i < C / 4; i++) {
        float4 v = p[i];
        if constexpr (FMT == WEIGHT_NVFP4) {
            xs[4 * i] = v.x * X_PRESCALE;
            xs[4 * i + 1] = v.y * X_PRESCALE;
            xs[4 * i + 2] = v.z * X_PRESCALE;
            xs[4 * i + 3] = v.w * X_PRESCALE;
        } else {
            xs[4 * i] = v.x, xs[4 * i + 1] = v.y, xs[4 * i + 2] = v.z, xs[4 * i + 3] = v.w;
        }
    }
}

/* Partial dot product of W[n, k .. k+C) with the lane's x chunk (NVFP4: over 2^26, see top). */
template <int FMT>
__device__ __forceinline__ float dot_chunk(const cuda_wdev &w, int64_t n, int64_t k, int64_t K, const float *xs)
{
    if constexpr (FMT == WEIGHT_NVFP4) {
        uint4 u = __ldg((const uint4 *)((const uint8_t *)w.data + n * (K / 2) + k / 2));
        uint32_t sc = __ldg((const uint16_t *)((const uint8_t *)w.scale + n * (K / 16) + k / 16));
        float a0 = e2m1_dot8(u.y, xs + 8, e2m1_dot8(u.x, xs, 0.0f));
        float a1 = e2m1_dot8(u.w, xs + 24, e2m1_dot8(u.z, xs + 16, 0.0f));
        return fmaf(a0, dev_e4m3(sc & 255u), a1 * dev_e4m3(sc >> 8));
    } else if constexpr (FMT == WEIGHT_FP8_BLOCK) {
        float v[8], s = 0.0f;
        w_load8<FMT>(w, n, k, K, v);
#pragma unroll
        for (int i = 0; i < 8; i++)
            s = fmaf(v[i], xs[i], s);
        w_load8<FMT>(w, n, k + 8, K, v);
#pragma unroll
        for (int i = 0; i < 8; i++)
            s = fmaf(v[i], xs[8 + i], s);
        return s;
    } else if constexpr (FMT == WEIGHT_F32) {
        float4 v = __ldg((const float4 *)((const float *)w.data + n * K + k));
        return fmaf(v.w, xs[3], fmaf(v.z, xs[2], fmaf(v.y, xs[1], v.x * xs[0])));
    } else {
        float v[8], s = 0.0f;
        w_load8<FMT>(w, n, k, K, v);
#pragma unroll
        for (int i = 0; i < 8; i++)
            s = fmaf(v[i], xs[i], s);
        return s;
    }
}

template <int FMT>
__device__ __forceinline__ float finish(const cuda_wdev &w, float s)
{
    if constexpr (FMT == WEIGHT_NVFP4)
        return s * (W_POSTSCALE * w.scale2);
    return s;
}

/* acc[r] = W[n0 + r, k-slice] . x for r < R (rows past N stay 0), reduced over the warp (every
 * lane gets them), before finish(): the k-slice is every n_slices-th 32-chunk run from `slice`. */
template <int FMT, int R>
__device__ __forceinline__ void warp_rows_dot(const cuda_wdev &w, int64_t n0, int64_t N, int64_t K, const float *x,
                                              float acc[R], int slice = 0, int n_slices = 1)
{
    constexpr int C = chunk<FMT>::n;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int64_t k = ((int64_t)slice * 32 + lane) * C; k < K; k += (int64_t)n_slices * 32 * C) {
        float xs[C];
        load_x<FMT>(x, k, xs);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (n0 + r < N)
                acc[r] += dot_chunk<FMT>(w, n0 + r, k, K, xs);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = warp_sum(acc[r]);
}

/* warp_rows_dot over two weights of the same shape at once (gate and up): one x chunk, both
 * weights' loads in flight together. */
template <int FMT, int R>
__device__ __forceinline__ void warp_rows_dot2(const cuda_wdev &wa, const cuda_wdev &wb, int64_t n0, int64_t N,
                                               int64_t K, const float *x, float a[R], float b[R])
{
    constexpr int C = chunk<FMT>::n;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < R; r++)
        a[r] = 0.0f, b[r] = 0.0f;
    for (int64_t k = (int64_t)lane * C; k < K; k += 32 * C) {
        float xs[C];
        load_x<FMT>(x, k, xs);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (n0 + r < N) {
                a[r] += dot_chunk<FMT>(wa, n0 + r, k, K, xs);
                b[r] += dot_chunk<FMT>(wb, n0 + r, k, K, xs);
            }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        a[r] = warp_sum(a[r]), b[r] = warp_sum(b[r]);
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
 * through shared memory): many rows -> R = 4, KS = 1; few rows with a long K -> R = 1, KS = 8,
 * so that a 128-row router still spreads over 128 blocks. p.job[].first_warp counts row groups. */
template <int FMT, int R, int KS>
__global__ void __launch_bounds__(DEC_THREADS, 2) gemv1_kernel(gemv1_params p)
{
    __shared__ float part[DEC_WARPS][R];
    const int wib = threadIdx.x / 32, lane = threadIdx.x % 32, slice = wib % KS;
    const int64_t grp = (int64_t)blockIdx.x * (DEC_WARPS / KS) + wib / KS;
    int j = 0;
    while (j + 1 < p.n_jobs && grp >= p.job[j + 1].first_warp)
        j++;
    const gemv1_job &jb = p.job[j];
    const cuda_wdev w = jb.w; /* in registers: a dynamically indexed parameter lives in local memory */
    const int64_t n0 = (grp - jb.first_warp) * R;
    const bool live = grp < p.job[p.n_jobs - 1].first_warp + (p.job[p.n_jobs - 1].N + R - 1) / R && n0 < jb.N;
    float acc[R];
    if (live)
        warp_rows_dot<FMT, R>(w, n0, jb.N, p.K, p.x, acc, slice, KS);
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
        jb.y[n0 + lane] = finish<FMT>(w, v) + (w.bias ? w.bias[n0 + lane] : 0.0f);
    }
}

/* act[pair, n] = silu(x_t G_e[n]) * (x_t U_e[n]); grid (row groups, pairs). */
template <int FMT, int GU_R>
__global__ void __launch_bounds__(DEC_THREADS, 2)
    moe_gate_up_kernel(const cuda_wdev *table, int n_experts, int64_t I, int64_t D, const float *x,
                       const int32_t *ids, int n_used, float *act)
{
    const int pair = blockIdx.y;
    const int e = ids[pair];
    const int64_t n0 = ((int64_t)blockIdx.x * DEC_WARPS + threadIdx.x / 32) * GU_R;
    if (n0 >= I)
        return;
    float *out = act + (size_t)pair * (size_t)I;
    const int lane = threadIdx.x % 32;
    if (e < 0 || e >= n_experts) { /* no expert: contributes nothing (moe_down skips it too) */
        if (lane < GU_R && n0 + lane < I)
            out[n0 + lane] = 0.0f;
        return;
    }
    const float *xr = x + (size_t)(pair / n_used) * (size_t)D;
    float g[GU_R], u[GU_R];
    /* local copies: through a reference into global memory every chunk would reload the pointers */
    const cuda_wdev wg = table[e], wu = table[n_experts + e];
    warp_rows_dot2<FMT, GU_R>(wg, wu, n0, I, D, xr, g, u);
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
        out[n0 + lane] = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), uv);
    }
}

/* out[t, d] = sum over the token's slots in ascending expert id of w * (act_pair D_e[d]);
 * grid (groups of DOWN_R rows, tokens). Warp j of the block takes slots j, j + 8, ...: the
 * experts stream in parallel, and one thread per row adds them up in expert order. */
template <int FMT, int DOWN_R>
__global__ void __launch_bounds__(DEC_THREADS, 2)
    moe_down_kernel(const cuda_wdev *table, int n_experts, int64_t D, int64_t I, const float *act,
                    const int32_t *ids, const float *weights, int n_used, float *out)
{
    __shared__ int order[MAX_K_USED];
    __shared__ float part[MAX_K_USED][DOWN_R];
    const int t = blockIdx.y;
    const int32_t *it = ids + (size_t)t * n_used;
    if (threadIdx.x == 0) {
        for (int j = 0; j < n_used; j++) { /* insertion sort by expert id, k is small */
            int i = j;
            while (i > 0 && it[order[i - 1]] > it[j]) {
                order[i] = order[i - 1];
                i--;
            }
            order[i] = j;
        }
    }
    const int64_t n0 = (int64_t)blockIdx.x * DOWN_R;
    const int wib = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j = wib; j < n_used; j += DEC_WARPS) {
        const int e = it[j];
        float acc[DOWN_R];
        if (e >= 0 && e < n_experts) {
            const cuda_wdev w = table[2 * n_experts + e];
            warp_rows_dot<FMT, DOWN_R>(w, n0, D, I, act + ((size_t)t * n_used + j) * (size_t)I, acc);
#pragma unroll
            for (int r = 0; r < DOWN_R; r++)
                acc[r] = finish<FMT>(w, acc[r]) + (w.bias && n0 + r < D ? w.bias[n0 + r] : 0.0f);
        }
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < DOWN_R; r++)
                part[j][r] = e >= 0 && e < n_experts ? acc[r] : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < DOWN_R && n0 + threadIdx.x < D) {
        const int r = threadIdx.x;
        float o = 0.0f;
        for (int jj = 0; jj < n_used; jj++) {
            const int j = order[jj], e = it[j];
            if (e >= 0 && e < n_experts)
                o = __fadd_rn(o, __fmul_rn(weights[(size_t)t * n_used + j], part[j][r]));
        }
        out[(size_t)t * (size_t)D + n0 + r] = o;
    }
}

/* K must split into whole 16-byte chunks for every format's vector loads. */
bool k_ok(enum weight_format fmt, int64_t K)
{
    int c = fmt == WEIGHT_NVFP4 ? 32 : fmt == WEIGHT_FP8_BLOCK ? 16 : fmt == WEIGHT_F32 ? 4 : 8;
    return K > 0 && K % c == 0;
}

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

template <int FMT>
struct launch_gemv1 {
    template <int R, int KS>
    static cudaError_t go(cudaStream_t s, gemv1_params p)
    {
        int64_t groups = 0;
        for (int j = 0; j < p.n_jobs; j++) {
            p.job[j].first_warp = groups;
            groups += (p.job[j].N + R - 1) / R;
        }
        int64_t blocks = (groups + DEC_WARPS / KS - 1) / (DEC_WARPS / KS);
        if (blocks > 0x7fffffff)
            return cudaErrorInvalidValue;
        gemv1_kernel<FMT, R, KS><<<(unsigned)blocks, DEC_THREADS, 0, s>>>(p);
        return CUDA_LAUNCH_RESULT();
    }
    /* enough warps in flight to cover HBM latency: about 16 per SM on every current GPU */
    static cudaError_t run(cudaStream_t s, const gemv1_params *p, int64_t rows)
    {
        if (rows >= 4 * 4096)
            return go<4, 1>(s, *p);
        if (rows >= 2048)
            return go<2, 2>(s, *p);
        return go<1, 8>(s, *p);
    }
};

/* rows per warp: gate_up gu (2 or 4), down dn (4 or 8): more rows, more loads in flight per warp
 * and fewer blocks (one wave instead of two on a 132-SM part). */
template <int FMT, int GU, int DN>
cudaError_t moe_launch(cudaStream_t s, const cuda_wdev *table, int n_experts, int64_t D, int64_t I, const float *x,
                       int n_tokens, const int32_t *ids, const float *weights, int n_used, float *act, float *out)
{
    int64_t warps_i = (I + GU - 1) / GU;
    dim3 g1((unsigned)((warps_i + DEC_WARPS - 1) / DEC_WARPS), (unsigned)(n_tokens * n_used));
    moe_gate_up_kernel<FMT, GU><<<g1, DEC_THREADS, 0, s>>>(table, n_experts, I, D, x, ids, n_used, act);
    cudaError_t e = CUDA_LAUNCH_RESULT();
    if (e != cudaSuccess)
        return e;
    dim3 g2((unsigned)((D + DN - 1) / DN), (unsigned)n_tokens);
    moe_down_kernel<FMT, DN><<<g2, DEC_THREADS, 0, s>>>(table, n_experts, D, I, act, ids, weights, n_used, out);
    return CUDA_LAUNCH_RESULT();
}

template <int FMT>
struct launch_moe {
    static cudaError_t run(cudaStream_t s, const cuda_wdev *table, int n_experts, int64_t D, int64_t I,
                           const float *x, int n_tokens, const int32_t *ids, const float *weights, int n_used,
                           float *act, float *out, int gu, int dn)
    {
        if (gu >= 4)
            return dn >= 8 ? moe_launch<FMT, 4, 8>(s, table, n_experts, D, I, x, n_tokens, ids, weights, n_used, act, out)
                           : moe_launch<FMT, 4, 4>(s, table, n_experts, D, I, x, n_tokens, ids, weights, n_used, act, out);
        return dn >= 8 ? moe_launch<FMT, 2, 8>(s, table, n_experts, D, I, x, n_tokens, ids, weights, n_used, act, out)
                       : moe_launch<FMT, 2, 4>(s, table, n_experts, D, I, x, n_tokens, ids, weights, n_used, act, out);
    }
};

} // namespace

extern "C" int cuda_gemv1_supported(enum weight_format fmt, int64_t K, const float *x)
{
    return k_ok(fmt, K) && (uintptr_t)x % 16 == 0;
}

extern "C" cudaError_t cuda_gemv1(cudaStream_t stream, enum weight_format fmt, int n_w, const struct cuda_wdev *w,
                                  const int64_t *N, int64_t K, const float *x, float *const *y)
{
    if (n_w < 1 || n_w > MAX_JOBS || !cuda_gemv1_supported(fmt, K, x))
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
    return by_format<launch_gemv1>(fmt, stream, (const gemv1_params *)&p, rows);
}

extern "C" int cuda_moe_decode_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used)
{
    return k_ok(fmt, d_model) && k_ok(fmt, d_expert) && n_used >= 1 && n_used <= MAX_K_USED;
}

extern "C" cudaError_t cuda_moe_decode(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                                       int n_experts, int64_t d_model, int64_t d_expert, const float *x,
                                       int n_tokens, const int32_t *ids, const float *weights, int n_used,
                                       float *act, float *out, int rows_gate_up, int rows_down)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    if (!cuda_moe_decode_supported(fmt, d_model, d_expert, n_used) || (int64_t)n_tokens * n_used > 65535)
        return cudaErrorInvalidValue;
    return by_format<launch_moe>(fmt, stream, table, n_experts, d_model, d_expert, x, n_tokens, ids, weights,
                                 n_used, act, out, rows_gate_up, rows_down);
}
