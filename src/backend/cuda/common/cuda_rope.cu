/* cuda_rope.cu — rotary position embedding, in place, every head of every token; rope_multi:
 * several tensors at the same positions in one launch (MLA's query, latent key and indexer
 * query and key: four launches of a few microseconds each at one token otherwise).
 *
 * One block per (token, head); the rotated slice is staged in shared memory
 * so the interleaved layout (pairs (2i, 2i+1) written back de-interleaved)
 * can be done in place. The phase is the fp32 product p * inv_freq[i], as
 * transformers and the CPU backend compute it; cos and sin are the accurate
 * (non-intrinsic) functions, scaled by attention_factor (YaRN).
 */
#include "backend/cuda/common/common.h"
#include "backend/cuda/common/cuda_common.cuh"

namespace
{

/* One head's rotated slice v[0, dim) at position p, through sv (dim floats of shared memory). */
__device__ __forceinline__ void rope_head(float *v, float *sv, int dim, int interleaved, float attention_factor,
                                          const float *inv_freq, float p)
{
    const int half = dim / 2;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        sv[i] = v[i];
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float phi = __fmul_rn(p, inv_freq[i]);
        float c = __fmul_rn(cosf(phi), attention_factor);
        float s = __fmul_rn(sinf(phi), attention_factor);
        float x0 = interleaved ? sv[2 * i] : sv[i];
        float x1 = interleaved ? sv[2 * i + 1] : sv[i + half];
        v[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        v[i + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

__global__ void rope_kernel(float *x, int n_heads, int head_stride, int dim, int offset, int interleaved,
                            float attention_factor, const float *inv_freq, const int32_t *pos)
{
    extern __shared__ float sv[]; /* (dim) the head's rotated slice */
    pdl_wait_trigger_small();
    int t = blockIdx.x, h = blockIdx.y;
    float *v = x + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_stride + (size_t)offset;
    rope_head(v, sv, dim, interleaved, attention_factor, inv_freq, (float)pos[t]);
}

struct rope_multi_params {
    float *x[ROPE_MAX_JOBS];
    int n_heads[ROPE_MAX_JOBS], head_stride[ROPE_MAX_JOBS], offset[ROPE_MAX_JOBS];
    int n_jobs, dim, interleaved;
    float attention_factor;
    const float *inv_freq;
    const int32_t *pos;
};

/* grid (tokens, the jobs' heads in job order): rope_kernel's block for the job owning the head */
__global__ void rope_multi_kernel(const __grid_constant__ rope_multi_params p)
{
    extern __shared__ float sv[];
    pdl_wait_trigger_small();
    int t = blockIdx.x, h = blockIdx.y, j = 0;
    while (j + 1 < p.n_jobs && h >= p.n_heads[j])
        h -= p.n_heads[j++];
    float *v = p.x[j] + ((size_t)t * (size_t)p.n_heads[j] + (size_t)h) * (size_t)p.head_stride[j] + (size_t)p.offset[j];
    rope_head(v, sv, p.dim, p.interleaved, p.attention_factor, p.inv_freq, (float)p.pos[t]);
}

unsigned rope_threads(int dim)
{
    const int half = dim / 2;
    return half >= 128 ? 128u : half > 32 ? 64u : 32u;
}

} // namespace

extern "C" cudaError_t cuda_rope(cudaStream_t stream, float *x, int n_tokens, int n_heads, int head_stride,
                                 const struct rope_args *a, const int32_t *pos, int pdl)
{
    if (n_tokens <= 0 || n_heads <= 0 || a->dim < 2)
        return cudaSuccess;
    if (n_heads > 65535 || a->offset + a->dim > head_stride)
        return cudaErrorInvalidValue;
    unsigned threads = rope_threads(a->dim);
    dim3 grid((unsigned)n_tokens, (unsigned)n_heads);
    return launch_pdl(pdl != 0, rope_kernel, grid, dim3(threads), (size_t)a->dim * sizeof(float), stream, x, n_heads,
                      head_stride, a->dim, a->offset, a->interleaved ? 1 : 0, a->attention_factor, a->inv_freq, pos);
}

extern "C" cudaError_t cuda_rope_multi(cudaStream_t stream, int n_jobs, const struct rope_job *jobs, int n_tokens,
                                       const struct rope_args *a, const int32_t *pos, int pdl)
{
    if (n_tokens <= 0 || n_jobs <= 0 || a->dim < 2)
        return cudaSuccess;
    if (n_jobs > ROPE_MAX_JOBS)
        return cudaErrorInvalidValue;
    rope_multi_params p = {};
    int heads = 0;
    for (int j = 0; j < n_jobs; j++) {
        if (jobs[j].n_heads <= 0 || jobs[j].offset + a->dim > jobs[j].head_stride)
            return cudaErrorInvalidValue;
        p.x[j] = jobs[j].x;
        p.n_heads[j] = jobs[j].n_heads;
        p.head_stride[j] = jobs[j].head_stride;
        p.offset[j] = jobs[j].offset;
        heads += jobs[j].n_heads;
    }
    if (heads > 65535)
        return cudaErrorInvalidValue;
    p.n_jobs = n_jobs;
    p.dim = a->dim;
    p.interleaved = a->interleaved ? 1 : 0;
    p.attention_factor = a->attention_factor;
    p.inv_freq = a->inv_freq;
    p.pos = pos;
    dim3 grid((unsigned)n_tokens, (unsigned)heads);
    return launch_pdl(pdl != 0, rope_multi_kernel, grid, dim3(rope_threads(a->dim)), (size_t)a->dim * sizeof(float),
                      stream, p);
}
