/* bench_stream_floor.cu — the floor for one decode kernel's weight read: how long a kernel that
 * only reads S bytes of cold weights (and does nothing else) takes, launched 48 times back to back
 * in a CUDA graph on 48 different buffers (as the 48 layers of a step: nothing is in L2), with
 * and without programmatic dependent launch (PDL). This separates what a decode kernel's design
 * can win (its time above the floor) from what the one-kernel-per-op structure costs anyway.
 *
 * Read patterns:
 *  - flat: each warp reads U x 512 contiguous bytes per round (16 bytes a lane), grid-stride;
 *  - rows8: the decode kernels' pattern: a warp owns 8 rows of 1024 bytes (NVFP4 K = 2048),
 *    lane (g, t) reads 16 bytes of row g at chunk t + 4u, U chunks per round;
 *  - bulk: each block copies its slice to shared memory with cp.async.bulk (TMA, one thread
 *    issues, an mbarrier counts the bytes), STAGES chunks in flight, the threads read the
 *    shared copy.
 * Sizes: 14.2 MB (Qwen3-30B-A3B's 8 experts' gate + up at NVFP4), 7.1 MB (their down), 5.9 MB
 * (q/k/v), 0 (an empty kernel: the launch and drain alone).
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -o bench_stream_floor tools/bench_stream_floor.cu && ./bench_stream_floor
 */
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>
#include <vector>

#define CK(x)                                                                                                   \
    do {                                                                                                        \
        cudaError_t e_ = (x);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                  \
            return 1;                                                                                           \
        }                                                                                                       \
    } while (0)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ uint4 ld_nc(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

template <int U>
__global__ void flat_kernel(const uint4 *buf, size_t n16, unsigned *sink)
{
    pdl_wait();
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32;
    const size_t gw = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    unsigned acc = 0;
    for (size_t s = gw; s * U * 32 < n16; s += warps) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            size_t i = s * U * 32 + (size_t)u * 32 + lane;
            v[u] = i < n16 ? ld_nc(buf + i) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    pdl_trigger();
    if (acc == 0x12345678u)
        *sink = acc;
}

/* rows of 64 uint4 (1024 bytes); a warp unit is 8 rows */
template <int U>
__global__ void rows8_kernel(const uint4 *buf, size_t n16, unsigned *sink)
{
    pdl_wait();
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32;
    const size_t gw = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const size_t units = n16 / (64 * 8);
    unsigned acc = 0;
    for (size_t s = gw; s < units; s += warps) {
        const uint4 *row = buf + (s * 8 + g) * 64;
        for (int c0 = 0; c0 < 16; c0 += U) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                v[u] = ld_nc(row + 4 * (c0 + u) + t);
#pragma unroll
            for (int u = 0; u < U; u++)
                acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
    }
    pdl_trigger();
    if (acc == 0x12345678u)
        *sink = acc;
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

template <int STAGES, int CHUNK>
__global__ void bulk_kernel(const uint8_t *buf, size_t bytes, unsigned *sink)
{
    extern __shared__ __align__(128) uint8_t sb[];
    __shared__ __align__(8) uint64_t bar[STAGES];
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++)
            asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem_addr(&bar[s])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    pdl_wait();
    const size_t per = (bytes / gridDim.x + CHUNK - 1) / CHUNK * CHUNK;
    const size_t lo = per * blockIdx.x, hi = lo + per < bytes ? lo + per : bytes;
    const int n = lo < hi ? (int)((hi - lo + CHUNK - 1) / CHUNK) : 0;
    auto issue = [&](int i) {
        const int s = i % STAGES;
        const size_t off = lo + (size_t)i * CHUNK;
        const uint32_t len = (uint32_t)(hi - off < (size_t)CHUNK ? hi - off : CHUNK);
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem_addr(&bar[s])), "r"(len)
                     : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_addr(sb + (size_t)s * CHUNK)),
                     "l"(buf + off), "r"(len), "r"(smem_addr(&bar[s]))
                     : "memory");
    };
    if (threadIdx.x == 0)
        for (int i = 0; i < STAGES && i < n; i++)
            issue(i);
    unsigned acc = 0;
    for (int i = 0; i < n; i++) {
        const int s = i % STAGES;
        const uint32_t phase = (uint32_t)(i / STAGES) & 1u;
        uint32_t done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done)
                         : "r"(smem_addr(&bar[s])), "r"(phase)
                         : "memory");
        const uint4 *src = (const uint4 *)(sb + (size_t)s * CHUNK);
        for (int j = threadIdx.x; j < CHUNK / 16; j += blockDim.x) {
            uint4 v = src[j];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
        __syncthreads();
        if (threadIdx.x == 0 && i + STAGES < n)
            issue(i + STAGES);
    }
    pdl_trigger();
    if (acc == 0x12345678u)
        *sink = acc;
}

struct cfg {
    const char *name;
    int kind; /* 0 flat, 1 rows8, 2 bulk */
    int u;    /* flat/rows8: U; bulk: stages */
    int blocks, threads;
};

typedef void (*kfn)(const void *, size_t, unsigned *);

static int launch(const cfg &c, const uint8_t *buf, size_t bytes, unsigned *sink, cudaStream_t st, bool pdl)
{
    cudaLaunchConfig_t lc = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.gridDim = dim3(c.blocks);
    lc.blockDim = dim3(c.threads);
    lc.stream = st;
    lc.attrs = at;
    lc.numAttrs = pdl ? 1 : 0;
    const uint4 *b16 = (const uint4 *)buf;
    size_t n16 = bytes / 16;
    cudaError_t e = cudaErrorInvalidValue;
    if (c.kind == 0) {
        if (c.u == 4)
            e = cudaLaunchKernelEx(&lc, flat_kernel<4>, b16, n16, sink);
        else if (c.u == 8)
            e = cudaLaunchKernelEx(&lc, flat_kernel<8>, b16, n16, sink);
        else if (c.u == 16)
            e = cudaLaunchKernelEx(&lc, flat_kernel<16>, b16, n16, sink);
    } else if (c.kind == 1) {
        if (c.u == 4)
            e = cudaLaunchKernelEx(&lc, rows8_kernel<4>, b16, n16, sink);
        else if (c.u == 8)
            e = cudaLaunchKernelEx(&lc, rows8_kernel<8>, b16, n16, sink);
        else if (c.u == 16)
            e = cudaLaunchKernelEx(&lc, rows8_kernel<16>, b16, n16, sink);
    } else {
        lc.dynamicSmemBytes = (size_t)c.u * 16384;
        if (c.u == 4)
            e = cudaLaunchKernelEx(&lc, bulk_kernel<4, 16384>, buf, bytes, sink);
        else if (c.u == 8)
            e = cudaLaunchKernelEx(&lc, bulk_kernel<8, 16384>, buf, bytes, sink);
    }
    if (e != cudaSuccess) {
        fprintf(stderr, "launch %s: %s\n", c.name, cudaGetErrorString(e));
        return 1;
    }
    return 0;
}

int main()
{
    const int L = 48;
    const size_t sizes[] = {14155776, 7077888, 5898240, 0};
    const size_t maxb = sizes[0];
    std::vector<uint8_t *> bufs(L);
    for (int i = 0; i < L; i++) {
        CK(cudaMalloc(&bufs[i], maxb));
        CK(cudaMemset(bufs[i], i + 1, maxb));
    }
    unsigned *sink;
    CK(cudaMalloc(&sink, 4));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaFuncSetAttribute(bulk_kernel<4, 16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 16384));
    CK(cudaFuncSetAttribute(bulk_kernel<8, 16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 16384));
    std::vector<cfg> cfgs = {
        {"flat U4 x132x256", 0, 4, sms, 256},     {"flat U8 x132x256", 0, 8, sms, 256},
        {"flat U16 x132x256", 0, 16, sms, 256},   {"flat U8 x264x256", 0, 8, 2 * sms, 256},
        {"flat U8 x528x256", 0, 8, 4 * sms, 256}, {"flat U4 x1056x256", 0, 4, 8 * sms, 256},
        {"rows8 U8 x132x256", 1, 8, sms, 256},    {"rows8 U8 x192x256", 1, 8, 192, 256},
        {"rows8 U8 x264x256", 1, 8, 2 * sms, 256}, {"rows8 U16 x264x256", 1, 16, 2 * sms, 256},
        {"rows8 U8 x528x256", 1, 8, 4 * sms, 256}, {"rows8 U4 x1056x256", 1, 4, 8 * sms, 256},
        {"bulk 4x16K x132x256", 2, 4, sms, 256},  {"bulk 8x16K x132x256", 2, 8, sms, 256},
        {"bulk 4x16K x264x256", 2, 4, 2 * sms, 256},
    };
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%-22s %9s %5s %10s %8s\n", "config", "MB", "pdl", "us/kernel", "GB/s");
    for (size_t bytes : sizes) {
        for (const cfg &c : cfgs) {
            if (bytes == 0 && c.kind != 0)
                continue;
            for (int pdl = 0; pdl < 2; pdl++) {
                cudaGraph_t g;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int l = 0; l < L; l++)
                    if (launch(c, bufs[l], bytes, sink, st, pdl != 0))
                        return 1;
                CK(cudaStreamEndCapture(st, &g));
                cudaGraphExec_t ge;
                CK(cudaGraphInstantiate(&ge, g, 0));
                for (int w = 0; w < 3; w++)
                    CK(cudaGraphLaunch(ge, st));
                const int R = 20;
                CK(cudaEventRecord(e0, st));
                for (int r = 0; r < R; r++)
                    CK(cudaGraphLaunch(ge, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                double us = ms * 1000.0 / (R * L);
                printf("%-22s %9.2f %5d %10.2f %8.0f\n", c.name, bytes / 1e6, pdl, us,
                       bytes ? bytes / (us * 1e3) : 0.0);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
            }
        }
    }
    return 0;
}
