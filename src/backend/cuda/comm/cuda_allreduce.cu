/* cuda_allreduce.cu — see allreduce.h. */
#include "backend/cuda/comm/allreduce.h"
#include "backend/cuda/common/cuda_common.cuh"

namespace
{

__device__ __forceinline__ uint64_t globaltimer_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void flag_store(uint32_t *p, uint32_t v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t flag_load(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* element i summed over the ranks' buffers in rank order (the same bits on every rank) */
__device__ __forceinline__ float sum_over_ranks(const cuda_ar_peers &p, size_t i)
{
    float s = __ldcv(p.data[0] + i);
    for (int r = 1; r < p.size; r++)
        s = __fadd_rn(s, __ldcv(p.data[r] + i));
    return s;
}

/* one block, a thread a peer: announce, then wait for every peer's announcement */
__global__ void ar_barrier_kernel(cuda_ar_peers p)
{
    const int q = threadIdx.x;
    /* the epoch counts in device memory, so that a captured graph's replays meet at new epochs */
    uint32_t *count = p.flags[p.rank] + CUDA_AR_MAX_RANKS + 1;
    const uint32_t epoch = *count + 1;
    __syncwarp();
    if (q == 0)
        *count = epoch;
    __threadfence_system(); /* this rank's buffer writes before its arrival */
    if (q < p.size)
        flag_store(p.flags[q] + p.rank, epoch);
    if (q < p.size) {
        const uint64_t t0 = globaltimer_ns();
        while (flag_load(p.flags[p.rank] + q) < epoch) {
            if (globaltimer_ns() - t0 > CUDA_AR_SPIN_NS) {
                flag_store(p.flags[p.rank] + CUDA_AR_MAX_RANKS, 1u);
                break;
            }
            __nanosleep(64);
        }
    }
}

__global__ void ar_one_shot_kernel(cuda_ar_peers p, size_t n, float *out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = sum_over_ranks(p, i);
}

__global__ void ar_reduce_slice_kernel(cuda_ar_peers p, size_t off, size_t len)
{
    float *mine = p.data[p.rank] + off;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (size_t)gridDim.x * blockDim.x)
        mine[i] = sum_over_ranks(p, off + i);
}

__global__ void ar_gather_slices_kernel(cuda_ar_peers p, size_t n, float *out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / ((n + p.size - 1) / p.size));
        out[i] = __ldcv(p.data[r < p.size ? r : p.size - 1] + i);
    }
}

/* a block a row: the row's sum over the ranks into h, then its RMSNorm into x (the CPU's order:
 * the squares summed by one thread's strided share, then across the block) */
__global__ void ar_add_rmsnorm_kernel(cuda_ar_peers p, int dim, float *h, const float *w, float eps, float *x)
{
    __shared__ float part[32];
    const size_t r = blockIdx.x;
    float *hr = h + r * (size_t)dim;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        const float v = __fadd_rn(hr[d], sum_over_ranks(p, r * (size_t)dim + d));
        hr[d] = v;
        ss = fmaf(v, v, ss);
    }
    for (int o = 16; o; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < (int)(blockDim.x / 32); i++)
        tot += part[i];
    const float inv = rsqrtf(tot / (float)dim + eps);
    for (int d = threadIdx.x; d < dim; d += blockDim.x)
        x[r * (size_t)dim + d] = hr[d] * inv * w[d];
}

unsigned blocks_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 1024 ? 1024 : b);
}

} // namespace

extern "C" void cuda_ar_slice(size_t n, int r, int size, size_t *off, size_t *len)
{
    const size_t per = (n + (size_t)size - 1) / (size_t)size;
    *off = per * (size_t)r < n ? per * (size_t)r : n;
    *len = *off + per < n ? per : n - *off;
}

extern "C" cudaError_t cuda_ar_barrier(cudaStream_t s, struct cuda_ar_peers p)
{
    if (p.size < 1 || p.size > CUDA_AR_MAX_RANKS)
        return cudaErrorInvalidValue;
    ar_barrier_kernel<<<1, 32, 0, s>>>(p);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_ar_one_shot(cudaStream_t s, struct cuda_ar_peers p, size_t n, float *out)
{
    if (!n)
        return cudaSuccess;
    ar_one_shot_kernel<<<blocks_for(n), 256, 0, s>>>(p, n, out);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_ar_reduce_slice(cudaStream_t s, struct cuda_ar_peers p, size_t n)
{
    size_t off, len;
    cuda_ar_slice(n, p.rank, p.size, &off, &len);
    if (!len)
        return cudaSuccess;
    ar_reduce_slice_kernel<<<blocks_for(len), 256, 0, s>>>(p, off, len);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_ar_gather_slices(cudaStream_t s, struct cuda_ar_peers p, size_t n, float *out)
{
    if (!n)
        return cudaSuccess;
    ar_gather_slices_kernel<<<blocks_for(n), 256, 0, s>>>(p, n, out);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_ar_add_rmsnorm(cudaStream_t s, struct cuda_ar_peers p, int rows, int dim, float *h,
                                           const float *w, float eps, float *x)
{
    if (rows <= 0 || dim <= 0)
        return cudaSuccess;
    ar_add_rmsnorm_kernel<<<(unsigned)rows, 256, 0, s>>>(p, dim, h, w, eps, x);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_ar_timed_out(struct cuda_ar_peers p, int *timed_out)
{
    uint32_t v = 0;
    cudaError_t e = cudaMemcpy(&v, p.flags[p.rank] + CUDA_AR_MAX_RANKS, 4, cudaMemcpyDeviceToHost);
    *timed_out = v != 0;
    return e;
}
