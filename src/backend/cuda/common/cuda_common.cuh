/* cuda_common.cuh — device helpers shared by the .cu files (never included from C).
 *
 * Number decoders that are bit-exact with base/dtype.h (E4M3, E2M1, BF16,
 * F16 -> f32), NVFP4 to bf16x2 pairs (E2M1 nibbles and E4M3 scales, exact), the weight loaders every GEMM
 * uses (one element, or 8 consecutive elements of a row when K % 8 == 0), and warp/block reductions.
 * Arithmetic that must match the CPU reference rounding for rounding uses
 * the explicit __f*_rn intrinsics, which nvcc never contracts into FMAs.
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_COMMON_CUH
#define MOESERVE_BACKEND_CUDA_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/common/common.h"

#define CUDA_LAUNCH_RESULT() cudaGetLastError()

static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 1048576 ? 1048576 : (b ? b : 1)); /* grid-stride loops cover the rest */
}

/* f32 from its bits, on the host (tests' models of a kernel) and the device. */
__host__ __device__ __forceinline__ float f32_of_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* OCP E4M3 "fn" (bias 7, S.1111.111 = NaN), exactly as e4m3_to_f32(); host and device. */
__host__ __device__ __forceinline__ float e4m3_value(uint32_t b)
{
    uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float f;
    if (e == 15u && m == 7u)
        f = f32_of_bits(0x7fc00000u);
    else if (e == 0u)
        f = (float)m * 0x1p-9f;
    else
        f = f32_of_bits(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -f : f;
}

__device__ __forceinline__ float dev_e4m3(uint32_t b)
{
    return e4m3_value(b);
}

/* E2M1: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign. */
__device__ __forceinline__ float dev_e2m1(uint32_t c)
{
    uint32_t e = (c >> 1) & 3u, m = c & 1u;
    float f = e ? __uint_as_float(((e + 126u) << 23) | (m << 22)) : (m ? 0.5f : 0.0f);
    return (c & 8u) ? -f : f;
}

__device__ __forceinline__ float dev_bf16(uint32_t h)
{
    return __uint_as_float(h << 16);
}

/* Nearest even, as f32_to_bf16() of base/dtype.h; NaN stays a quiet NaN. */
__device__ __forceinline__ uint16_t dev_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* v ~= hi + lo in bf16: hi = bf16(v), lo = bf16(v - hi) (the residual is exact, rounded once more). */
__device__ __forceinline__ void dev_bf16_split(float v, uint16_t *hi, uint16_t *lo)
{
    const uint16_t h = dev_to_bf16(v);
    *hi = h;
    *lo = dev_to_bf16(__fsub_rn(v, dev_bf16(h)));
}

/* Nibbles I and I + 4 of u as a bf16x2 (I low): each E2M1 value times 2^-126. */
template <int I> __device__ __forceinline__ uint32_t e2m1x2_raw(uint32_t u)
{
    constexpr int ms = 6 - 4 * I, ss = 12 - 4 * I;
    const uint32_t mag = ms >= 0 ? u << (ms >= 0 ? ms : 0) : u >> (ms < 0 ? -ms : 0);
    const uint32_t sgn = u << ss;
    return (mag & 0x01C001C0u) | (sgn & 0x80008000u);
}

__device__ __forceinline__ uint32_t bf16x2_fma(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* A chunk's two E4M3 block scales (bytes 0 and 1 of s), each times 2^64 as a bf16 pair: lo for
 * words 0-1, hi for words 2-3. An E4M3 byte's exponent and mantissa bits moved to bf16's low
 * exponent bits and top mantissa bits are the same value times 2^-120, normal or subnormal
 * alike (checked for all 256 bytes); two exact multiplications by 2^92 make it times 2^64. Both
 * scales go through in one bf16x2 pair: ~9 instructions for the two instead of ~40 through f32
 * and a rounding. */
__device__ __forceinline__ void scales_x2(uint32_t s, uint32_t &lo, uint32_t &hi)
{
    const uint32_t p = __byte_perm(s, 0u, 0x4140); /* byte 0 -> half 0, byte 1 -> half 1 */
    uint32_t v = ((p & 0x007f007fu) << 4) | ((p & 0x00800080u) << 8);
    v = bf16x2_fma(v, 0x6D806D80u, 0x80008000u); /* x 2^92 */
    v = bf16x2_fma(v, 0x6D806D80u, 0x80008000u);
    lo = __byte_perm(v, 0u, 0x1010);
    hi = __byte_perm(v, 0u, 0x3232);
}

/* silu(g) * u = g / (1 + expf(-g)) * u, rounded step by step as the CPU does. */
__device__ __forceinline__ float dev_silu_mul(float g, float u)
{
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

__device__ __forceinline__ float dev_f16(uint32_t h)
{
    return __half2float(__ushort_as_half((unsigned short)h));
}

/* W[n, k] as fp32 (NVFP4 without scale2, which the callers apply to the sum). */
template <int FMT>
__device__ __forceinline__ float w_load1(const cuda_wdev &w, int64_t n, int64_t k, int64_t K)
{
    if constexpr (FMT == WEIGHT_F32) {
        return ((const float *)w.data)[n * K + k];
    } else if constexpr (FMT == WEIGHT_BF16) {
        return dev_bf16(((const uint16_t *)w.data)[n * K + k]);
    } else if constexpr (FMT == WEIGHT_F16) {
        return dev_f16(((const uint16_t *)w.data)[n * K + k]);
    } else if constexpr (FMT == WEIGHT_FP8_BLOCK) {
        const float *sc = (const float *)w.scale;
        int64_t kb = (K + 127) / 128;
        return dev_e4m3(((const uint8_t *)w.data)[n * K + k]) * sc[(n / 128) * kb + k / 128];
    } else {
        uint32_t byte = ((const uint8_t *)w.data)[n * (K / 2) + k / 2];
        uint32_t code = (k & 1) ? (byte >> 4) : (byte & 15u);
        return dev_e2m1(code) * dev_e4m3(((const uint8_t *)w.scale)[n * (K / 16) + k / 16]);
    }
}

/* W[n, k .. k+8) as fp32; needs K % 8 == 0 and k % 8 == 0 (so every load is
 * aligned to its width: rows start on 32-byte (f32), 16-byte (16-bit),
 * 8-byte (fp8) and 4-byte (nvfp4) boundaries of a cudaMalloc'ed base). */
template <int FMT>
__device__ __forceinline__ void w_load8(const cuda_wdev &w, int64_t n, int64_t k, int64_t K, float v[8])
{
    if constexpr (FMT == WEIGHT_F32) {
        const float4 *p = (const float4 *)((const float *)w.data + n * K + k);
        float4 a = __ldg(p), b = __ldg(p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else if constexpr (FMT == WEIGHT_BF16 || FMT == WEIGHT_F16) {
        uint4 u = __ldg((const uint4 *)((const uint16_t *)w.data + n * K + k));
        uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (FMT == WEIGHT_BF16) {
                v[2 * i] = dev_bf16(q[i] & 0xffffu);
                v[2 * i + 1] = dev_bf16(q[i] >> 16);
            } else {
                v[2 * i] = dev_f16(q[i] & 0xffffu);
                v[2 * i + 1] = dev_f16(q[i] >> 16);
            }
        }
    } else if constexpr (FMT == WEIGHT_FP8_BLOCK) {
        uint2 u = __ldg((const uint2 *)((const uint8_t *)w.data + n * K + k));
        const float *sc = (const float *)w.scale;
        float s = __ldg(sc + (n / 128) * ((K + 127) / 128) + k / 128);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = dev_e4m3((u.x >> (8 * i)) & 255u) * s;
            v[4 + i] = dev_e4m3((u.y >> (8 * i)) & 255u) * s;
        }
    } else {
        uint32_t u = __ldg((const uint32_t *)((const uint8_t *)w.data + n * (K / 2) + k / 2));
        float s = dev_e4m3(__ldg((const uint8_t *)w.scale + n * (K / 16) + k / 16));
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = dev_e2m1((u >> (4 * i)) & 15u) * s; /* low nibble first */
    }
}

/* 1 / sqrt(ss / dim + eps) rounded as the CPU's RMSNorm does (ss: the row's sum of squares). */
__device__ __forceinline__ float dev_rms_inv(double ss, int dim, float eps)
{
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / dim), eps)));
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Max over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
__device__ __forceinline__ float block_max(float v)
{
    __shared__ float part[32];
    v = warp_max(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x / 32); w++)
        m = fmaxf(m, part[w]);
    return m;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
__device__ __forceinline__ double block_sum_double(double v)
{
    __shared__ double part[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < nw; i++) /* same order in every thread: identical results */
        s += part[i];
    return s;
}

/* order[0 .. k) = the slots 0 .. k-1 by ascending expert id ids[slot], ties in slot order (an
 * insertion sort: k is small): the order in which the CPU adds a token's expert outputs, which
 * the decode MoE kernels keep. One thread. */
__device__ __forceinline__ void slots_by_expert(const int32_t *ids, int k, int *order)
{
    for (int j = 0; j < k; j++) {
        int i = j;
        while (i > 0 && ids[order[i - 1]] > ids[j]) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = j;
    }
}

/* A down kernel's routing of token t into shared memory: the slots' expert ids and weights
 * (L2 loads: an earlier kernel of the pass wrote them), a barrier, then order[] by thread 0
 * (slots_by_expert; the block sees it after its next barrier). n_used <= the block's threads. */
__device__ __forceinline__ void slots_load(const int32_t *ids, const float *weights, int t, int n_used,
                                           int *s_ids, float *s_w, int *order)
{
    if ((int)threadIdx.x < n_used) {
        s_ids[threadIdx.x] = __ldcg(ids + (size_t)t * n_used + threadIdx.x);
        s_w[threadIdx.x] = __ldcg(weights + (size_t)t * n_used + threadIdx.x);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        slots_by_expert(s_ids, n_used, order);
}

/* The end of a gate/up warp tile of the tensor-core pair kernels (cuda_decode_mma.cu): lanes 0, 1
 * hold the raw sums of gate rows n0 + 2 lane, + 1, lanes 2, 3 the same up rows; lanes 0, 1 write
 * silu(gate) * up, each sum times its scale (sg, su) plus its bias, rounded as cuda_silu_mul.
 * Call from the whole warp (the up sums come by shuffle). */
__device__ __forceinline__ void silu_pair_store(float2 r, float sg, float su, const float *gbias,
                                                const float *ubias, int64_t n0, int64_t I, float *out,
                                                int lane)
{
    const float ux = __shfl_down_sync(0xffffffffu, r.x, 2), uy = __shfl_down_sync(0xffffffffu, r.y, 2);
    if (lane >= 2)
        return;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int64_t n = n0 + 2 * lane + k;
        if (n >= I)
            continue;
        float gv = (k ? r.y : r.x) * sg, uv = (k ? uy : ux) * su;
        if (gbias)
            gv += gbias[n];
        if (ubias)
            uv += ubias[n];
        out[n] = dev_silu_mul(gv, uv);
    }
}

/* Slot j's partial of a down kernel's 8-row tile (rows n0 .. n0 + 7 of D): lanes 0..3 hold the raw
 * sums of rows 2 * lane and 2 * lane + 1; times s plus the expert's bias into part[j], or zeros
 * when the slot has no valid expert. Both down kernels of cuda_decode_mma.cu use it. */
__device__ __forceinline__ void slot_part_put(float (*part)[8], int j, float2 r, bool valid, float s,
                                              const float *bias, int64_t n0, int64_t D, int lane)
{
    if (lane >= 4)
        return;
    float a = 0.0f, b = 0.0f;
    if (valid) {
        a = r.x * s, b = r.y * s;
        if (bias && n0 + 2 * lane < D)
            a += bias[n0 + 2 * lane];
        if (bias && n0 + 2 * lane + 1 < D)
            b += bias[n0 + 2 * lane + 1];
    }
    part[j][2 * lane] = a;
    part[j][2 * lane + 1] = b;
}

/* Row r of a token's MoE output: the slots' partials part[j][r] times their weights w[j], added
 * in `order` (slots_by_expert: the CPU's order), slots without a valid expert skipped. One thread
 * a row; the down kernels of cuda_decode.cu and cuda_decode_mma.cu share it, so they sum alike. */
template <int R>
__device__ __forceinline__ float slots_combine(const int32_t *ids, const float *w, const int *order,
                                               const float (*part)[R], int n_used, int n_experts, int r)
{
    float o = 0.0f;
    for (int jj = 0; jj < n_used; jj++) {
        const int j = order[jj], e = ids[j];
        if (e >= 0 && e < n_experts)
            o = __fadd_rn(o, __fmul_rn(w[j], part[j][r]));
    }
    return o;
}

/* Programmatic dependent launch (device_caps.pdl, set from plan/caps_table.c). A kernel launched
 * with launch_pdl(true, ...) may start while the kernel before it in the stream still runs, so
 * before pdl_wait() it may only read what no kernel of the pass writes (weights, the metadata
 * uploaded before the pass) and write nothing; pdl_wait() returns once the previous kernel has
 * finished and its writes are visible (at once when there is none, or without PDL).
 * pdl_trigger() lets the next kernel be scheduled; it is safe anywhere because the next kernel
 * waits before touching this one's outputs. Where it goes is a matter of speed: a kernel of
 * more than one wave calls it late (after its arithmetic), or the next kernel's early blocks
 * take the SM slots its later waves need (measured on the H200: trigger-first made the decode
 * GEMVs and MoE kernels 3-4% slower); one-wave kernels call it first thing. The target
 * guard is about the instruction existing in the fatbin image, not a runtime decision. */
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The small kernels between a decode step's GEMVs (norms, RoPE, the latent store, top-k, the
 * split merge): wait, then let the next kernel be scheduled at once where the grid is surely one
 * wave (PDL_EARLY_BLOCKS: 16 small blocks an SM on 32 SMs), so that the next GEMV's weight loads,
 * issued before its own wait, overlap this kernel instead of following it. Larger grids (a long
 * prefill) trigger at their end, as without PDL. */
enum { PDL_EARLY_BLOCKS = 512 };
__device__ __forceinline__ void pdl_wait_trigger_small()
{
    pdl_wait();
    if (gridDim.x * gridDim.y * gridDim.z <= PDL_EARLY_BLOCKS)
        pdl_trigger();
}

/* cp.async (sm_80+): global -> shared copies that hold no register while in flight, grouped by
 * commit; the one set of helpers for every kernel that stages through shared memory. */
__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async8(void *smem, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Waits until at most n of this thread's committed groups are still pending (n > 7 waits for 7:
 * stricter, still correct; n <= 0: all). */
__device__ __forceinline__ void cp_async_wait_upto(int n)
{
    switch (n <= 0 ? 0 : n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    }
}

/* Thread block clusters (caps "clusters", sm_90 on): a barrier over the cluster's threads
 * (release / acquire: shared-memory writes before it are seen by the other blocks after it), and
 * the generic address of a shared variable of block `rank` of the cluster (read and written with
 * ordinary loads and stores: distributed shared memory).
 * Every thread of every block of the cluster calls cluster_sync() the same number of times.
 * Empty below sm_90: the backend launches no cluster kernel where the device lacks them. */
__device__ __forceinline__ void cluster_sync()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* The two halves of cluster_sync, for blocks that go on between them or leave after arriving:
 * cluster_arrive_relaxed() (no ordering: "this block has started", so that a later
 * cluster_wait() lets it write into the others' shared memory), cluster_arrive() (release: this
 * block's writes before it, to any block's shared memory, are seen after the matching wait),
 * cluster_wait() (acquire). A block may exit after arriving; a block's shared memory must not be
 * written by the others after it has exited. */
__device__ __forceinline__ void cluster_arrive_relaxed()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_arrive()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

template <typename T>
__device__ __forceinline__ T *cluster_peer(T *p, unsigned rank)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned long long out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"((unsigned long long)p), "r"(rank));
    return (T *)out;
#else
    (void)rank;
    return p;
#endif
}

/* kernel<<<grid, block, smem, stream>>>(args...) with the n launch attributes attr. */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_with(const cudaLaunchAttribute *attr, int n, void (*kernel)(KArgs...), dim3 grid,
                                      dim3 block, size_t smem, cudaStream_t stream, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = (cudaLaunchAttribute *)attr;
    cfg.numAttrs = (unsigned)n;
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

static inline cudaLaunchAttribute pdl_attribute()
{
    cudaLaunchAttribute a;
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
    return a;
}

/* kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialisation attribute
 * when pdl (the kernel must call pdl_wait() before touching its predecessors' data). */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t stream, Args... args)
{
    const cudaLaunchAttribute attr[1] = {pdl_attribute()};
    return launch_with(attr, pdl ? 1 : 0, kernel, grid, block, smem, stream, args...);
}

/* As launch_pdl, first raising the kernel's dynamic shared memory limit when its static and
 * dynamic shared memory together pass the 48 KB that every kernel may use without asking (the
 * limit counts both: 48 KB dynamic beside 4.8 KB static fails with an invalid argument). */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl_smem(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                          size_t smem, cudaStream_t stream, Args... args)
{
    size_t static_smem = 0;
    if (smem > 0) {
        cudaFuncAttributes fa;
        cudaError_t e = cudaFuncGetAttributes(&fa, kernel);
        if (e != cudaSuccess)
            return e;
        static_smem = fa.sharedSizeBytes;
    }
    if (smem + static_smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return e;
    }
    return launch_pdl(pdl, kernel, grid, block, smem, stream, args...);
}

/* As launch_pdl, in clusters of `cluster` (x, y, z) blocks (the grid a multiple of it). */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl_cluster(bool pdl, dim3 cluster, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                             size_t smem, cudaStream_t stream, Args... args)
{
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster.x;
    attr[0].val.clusterDim.y = cluster.y;
    attr[0].val.clusterDim.z = cluster.z;
    attr[1] = pdl_attribute();
    return launch_with(attr, pdl ? 2 : 1, kernel, grid, block, smem, stream, args...);
}

#endif
