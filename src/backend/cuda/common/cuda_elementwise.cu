/* cuda_elementwise.cu — memory-bound element-wise ops: embedding gather, add,
 * SiLU * up, bias add, fp32 -> bf16 hi + lo split and the sum of the two
 * halves of a split GEMM, NVFP4 weights expanded to bf16, paged KV store.
 *
 * Grid-stride loops, 256 threads; no shared memory. Rounding matches the
 * CPU reference exactly (no fused multiply-adds where the CPU has none).
 */
#include "backend/cuda/common/common.h"
#include "backend/cuda/common/cuda_common.cuh"

namespace
{

template <int FMT>
__global__ void embed_kernel(const void *table, int64_t dim, const int32_t *tokens, int n, float *out)
{
    size_t total = (size_t)n * (size_t)dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)dim, j = i % (size_t)dim;
        size_t src = (size_t)tokens[t] * (size_t)dim + j;
        if constexpr (FMT == WEIGHT_F32)
            out[i] = ((const float *)table)[src];
        else if constexpr (FMT == WEIGHT_BF16)
            out[i] = dev_bf16(((const uint16_t *)table)[src]);
        else
            out[i] = dev_f16(((const uint16_t *)table)[src]);
    }
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void silu_mul_kernel(const float *gate, const float *up, size_t n, float *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = dev_silu_mul(gate[i], up[i]);
    }
}

__global__ void bias_add_kernel(float *y, const float *bias, int rows, int64_t cols)
{
    size_t total = (size_t)rows * (size_t)cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], bias[i % (size_t)cols]);
}

__global__ void f32_to_bf16_split_kernel(const float *x, uint16_t *hi, uint16_t *lo, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        dev_bf16_split(x[i], &hi[i], &lo[i]);
    }
}

__global__ void sum_halves_kernel(const float *a, const float *b, const float *bias, int rows, int64_t cols,
                                  float *y)
{
    size_t total = (size_t)rows * (size_t)cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = __fadd_rn(a[i], b[i]);
        y[i] = bias ? __fadd_rn(v, bias[i % (size_t)cols]) : v;
    }
}

__global__ void kv_store_kernel(float *kc, float *vc, const float *k, const float *v, int n_tokens,
                                int64_t row, const int32_t *slots)
{
    size_t total = (size_t)n_tokens * (size_t)row;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)row, j = i % (size_t)row;
        size_t dst = (size_t)slots[t] * (size_t)row + j;
        kc[dst] = k[i];
        vc[dst] = v[i];
    }
}

/* NVFP4 -> bf16, DQ_WORDS words of 8 E2M1 codes (low nibble first) a thread, blockDim apart so that
 * each load and store of a warp is contiguous. Why this form: one word a thread kept too few bytes
 * in flight for DRAM and decoded each weight through f32 in ~10 instructions. Here the decode is
 * the tensor-core GEMV's (cuda_common.cuh): a pair of nibbles as a bf16x2 of value x 2^-126
 * (subnormal for 0.5), times the block scale x 2^64 and then 2^62 in bf16x2 FMAs. Every step is
 * exact: E2M1 x E4M3 has at most 6 significant bits and lies in [2^-10, 2688], x 2^-62 still
 * normal. The pairs come out as nibbles (i, i + 4) and a byte permute puts them in order. The
 * tensor's global scale is left to the caller (the GEMM's alpha). */
enum { DQ_WORDS = 4 };

__device__ __forceinline__ uint4 nvfp4_word_bf16(uint32_t u, uint32_t scale_x2)
{
    const uint32_t two62 = 0x5E805E80u, neg0 = 0x80008000u;
    const uint32_t p0 = bf16x2_fma(bf16x2_fma(e2m1x2_raw<0>(u), scale_x2, neg0), two62, neg0);
    const uint32_t p1 = bf16x2_fma(bf16x2_fma(e2m1x2_raw<1>(u), scale_x2, neg0), two62, neg0);
    const uint32_t p2 = bf16x2_fma(bf16x2_fma(e2m1x2_raw<2>(u), scale_x2, neg0), two62, neg0);
    const uint32_t p3 = bf16x2_fma(bf16x2_fma(e2m1x2_raw<3>(u), scale_x2, neg0), two62, neg0);
    return make_uint4(__byte_perm(p0, p1, 0x5410), __byte_perm(p2, p3, 0x5410), __byte_perm(p0, p1, 0x7632),
                      __byte_perm(p2, p3, 0x7632));
}

__global__ void nvfp4_to_bf16_kernel(const uint32_t *data, const uint8_t *scale, size_t words, uint4 *out)
{
    const size_t span = (size_t)blockDim.x * DQ_WORDS;
    for (size_t base = blockIdx.x * span + threadIdx.x; base < words; base += (size_t)gridDim.x * span) {
        uint32_t u[DQ_WORDS], sc[DQ_WORDS];
#pragma unroll
        for (int k = 0; k < DQ_WORDS; k++) { /* every load first */
            const size_t i = base + (size_t)k * blockDim.x;
            u[k] = i < words ? __ldg(data + i) : 0u;
            sc[k] = i < words ? __ldg(scale + i / 2) : 0u;
        }
#pragma unroll
        for (int k = 0; k < DQ_WORDS; k++) {
            const size_t i = base + (size_t)k * blockDim.x;
            uint32_t lo, hi;
            scales_x2(sc[k], lo, hi);
            if (i < words)
                out[i] = nvfp4_word_bf16(u[k], lo);
        }
    }
}

} // namespace

extern "C" cudaError_t cuda_embed(cudaStream_t stream, enum weight_format fmt, const void *table, int64_t dim,
                                  const int32_t *tokens, int n, float *out)
{
    if (n <= 0 || dim <= 0)
        return cudaSuccess;
    unsigned g = cuda_blocks((size_t)n * (size_t)dim, 256);
    switch (fmt) {
    case WEIGHT_F32: embed_kernel<WEIGHT_F32><<<g, 256, 0, stream>>>(table, dim, tokens, n, out); break;
    case WEIGHT_BF16: embed_kernel<WEIGHT_BF16><<<g, 256, 0, stream>>>(table, dim, tokens, n, out); break;
    case WEIGHT_F16: embed_kernel<WEIGHT_F16><<<g, 256, 0, stream>>>(table, dim, tokens, n, out); break;
    default: return cudaErrorInvalidValue;
    }
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_add(cudaStream_t stream, float *y, const float *x, size_t n)
{
    if (!n)
        return cudaSuccess;
    add_kernel<<<cuda_blocks(n, 256), 256, 0, stream>>>(y, x, n);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_silu_mul(cudaStream_t stream, const float *gate, const float *up, size_t n,
                                     float *out)
{
    if (!n)
        return cudaSuccess;
    silu_mul_kernel<<<cuda_blocks(n, 256), 256, 0, stream>>>(gate, up, n, out);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_bias_add(cudaStream_t stream, float *y, const float *bias, int rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0)
        return cudaSuccess;
    bias_add_kernel<<<cuda_blocks((size_t)rows * (size_t)cols, 256), 256, 0, stream>>>(y, bias, rows, cols);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_f32_to_bf16_split(cudaStream_t stream, const float *x, uint16_t *hi, uint16_t *lo,
                                              size_t n)
{
    if (!n)
        return cudaSuccess;
    f32_to_bf16_split_kernel<<<cuda_blocks(n, 256), 256, 0, stream>>>(x, hi, lo, n);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_sum_halves(cudaStream_t stream, const float *a, const float *b, const float *bias,
                                       int rows, int64_t cols, float *y)
{
    if (rows <= 0 || cols <= 0)
        return cudaSuccess;
    sum_halves_kernel<<<cuda_blocks((size_t)rows * (size_t)cols, 256), 256, 0, stream>>>(a, b, bias, rows,
                                                                                         cols, y);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_nvfp4_to_bf16(cudaStream_t stream, const struct cuda_wdev *w, int64_t N,
                                          int64_t K, uint16_t *out)
{
    if (N <= 0 || K <= 0 || K % 16 || !w->data || !w->scale || (uintptr_t)w->data % 4 || (uintptr_t)out % 16)
        return cudaErrorInvalidValue;
    const size_t words = (size_t)N * (size_t)K / 8;
    nvfp4_to_bf16_kernel<<<cuda_blocks((words + DQ_WORDS - 1) / DQ_WORDS, 256), 256, 0, stream>>>(
        (const uint32_t *)w->data, (const uint8_t *)w->scale, words, (uint4 *)out);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_kv_store(cudaStream_t stream, const struct paged_kv *kv, const float *k,
                                     const float *v, int n_tokens, const int32_t *slots)
{
    int64_t row = (int64_t)kv->n_kv_heads * kv->head_dim;
    if (n_tokens <= 0 || row <= 0)
        return cudaSuccess;
    kv_store_kernel<<<cuda_blocks((size_t)n_tokens * (size_t)row, 256), 256, 0, stream>>>(
        kv->k, kv->v, k, v, n_tokens, row, slots);
    return CUDA_LAUNCH_RESULT();
}
