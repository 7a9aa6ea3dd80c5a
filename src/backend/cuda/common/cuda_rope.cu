/* cuda_rope.cu — rotary position embedding, in place, every head of every token.
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

__global__ void rope_kernel(float *x, int n_heads, int head_stride, int dim, int offset, int interleaved,
                            float attention_factor, const float *inv_freq, const int32_t *pos)
{
    extern __shared__ float sv[]; /* (dim) the head's rotated slice */
    pdl_wait_trigger_small();
    int t = blockIdx.x, h = blockIdx.y, half = dim / 2;
    float *v = x + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_stride + (size_t)offset;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        sv[i] = v[i];
    __syncthreads();
    float p = (float)pos[t];
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

} // namespace

extern "C" cudaError_t cuda_rope(cudaStream_t stream, float *x, int n_tokens, int n_heads, int head_stride,
                                 const struct rope_args *a, const int32_t *pos, int pdl)
{
    if (n_tokens <= 0 || n_heads <= 0 || a->dim < 2)
        return cudaSuccess;
    if (n_heads > 65535 || a->offset + a->dim > head_stride)
        return cudaErrorInvalidValue;
    int half = a->dim / 2;
    unsigned threads = half >= 128 ? 128u : half > 32 ? 64u : 32u;
    dim3 grid((unsigned)n_tokens, (unsigned)n_heads);
    return launch_pdl(pdl != 0, rope_kernel, grid, dim3(threads), (size_t)a->dim * sizeof(float), stream, x, n_heads,
                      head_stride, a->dim, a->offset, a->interleaved ? 1 : 0, a->attention_factor, a->inv_freq, pos);
}
