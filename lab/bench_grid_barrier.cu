/* bench_grid_barrier.cu — what one grid-wide barrier costs inside a persistent kernel (all blocks
 * resident), for deciding whether a decode layer can run as one kernel with barriers between its
 * phases instead of one kernel per phase. Prints us per barrier for a few grid sizes, and the
 * same with each block streaming a slice of a buffer between barriers (a GEMV-like phase).
 *
 *   nvcc -O3 -arch=sm_90a -o bench_grid_barrier tools/bench_grid_barrier.cu && ./bench_grid_barrier
 */
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

struct gbar {
    unsigned count;
    unsigned gen;
};

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Sense by generation: the last block to arrive resets the count and bumps gen. */
__device__ __forceinline__ void grid_barrier(gbar *b)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned gen = ld_acquire(&b->gen);
        __threadfence();
        if (atomicAdd(&b->count, 1u) == gridDim.x - 1) {
            b->count = 0;
            __threadfence();
            atomicAdd(&b->gen, 1u);
        } else {
            while (ld_acquire(&b->gen) == gen)
                ;
        }
    }
    __syncthreads();
}

__global__ void barrier_kernel(gbar *b, int iters, const uint4 *buf, size_t n16, size_t stride16, float *sink)
{
    float acc = 0.f;
    for (int i = 0; i < iters; i++) {
        if (buf) { /* a phase: each block streams its slice of n16 uint4 */
            const size_t per = n16 / gridDim.x, lo = per * blockIdx.x;
            for (size_t j = lo + threadIdx.x; j < lo + per; j += blockDim.x) {
                uint4 v = __ldcs(buf + j + (size_t)(i & 3) * stride16);
                acc += __uint_as_float(v.x ^ v.y ^ v.z ^ v.w);
            }
        }
        grid_barrier(b);
    }
    if (acc == 1.2345f)
        *sink = acc;
}

int main()
{
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    gbar *b;
    float *sink;
    cudaMalloc(&b, sizeof(gbar));
    cudaMemset(b, 0, sizeof(gbar));
    cudaMalloc(&sink, 4);
    const size_t bytes = (size_t)64 << 20; /* four 64 MB regions in turn: L2 (50 MB) cannot hold them */
    uint4 *buf;
    cudaMalloc(&buf, 4 * bytes);
    cudaMemset(buf, 1, 4 * bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int iters = 2000;
    printf("%-34s %10s %12s %10s\n", "grid", "phase MB", "us/barrier", "GB/s");
    for (int per_sm = 1; per_sm <= 4; per_sm *= 2)
        for (int threads = 256; threads <= 512; threads *= 2) {
            int occ = 0;
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, barrier_kernel, threads, 0);
            if (occ < per_sm)
                continue;
            const int grid = sms * per_sm;
            for (int ph = 0; ph < 3; ph++) {
                const size_t phase_bytes = ph == 0 ? 0 : ph == 1 ? (size_t)6 << 20 : (size_t)16 << 20;
                const int it = ph == 0 ? iters : 200;
                barrier_kernel<<<grid, threads>>>(b, 10, phase_bytes ? buf : nullptr, phase_bytes / 16,
                                                  bytes / 16, sink);
                cudaEventRecord(e0);
                barrier_kernel<<<grid, threads>>>(b, it, phase_bytes ? buf : nullptr, phase_bytes / 16,
                                                  bytes / 16, sink);
                cudaEventRecord(e1);
                cudaError_t err = cudaEventSynchronize(e1);
                float ms = 0;
                cudaEventElapsedTime(&ms, e0, e1);
                char name[64];
                snprintf(name, sizeof name, "%d blocks x %d threads", grid, threads);
                printf("%-34s %10.1f %12.3f %10.1f %s\n", name, phase_bytes / 1048576.0, ms * 1000.0 / it,
                       phase_bytes ? phase_bytes * (double)it / (ms * 1e-3) / 1e9 : 0.0,
                       err == cudaSuccess ? "" : cudaGetErrorString(err));
            }
        }
    return 0;
}
