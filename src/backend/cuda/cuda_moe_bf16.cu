/* cuda_moe_bf16.cu — the kernels around a prefill MoE block run as cuBLAS GEMMs on bf16 copies
 * of the routed NVFP4 experts (backend_cuda.c moe_experts_bf16).
 *
 * At a long prompt every expert gets a hundred rows or more, and a tensor-core GEMM on bf16
 * weights is far faster than a GEMM that dequantises NVFP4 in its inner loop; the copy costs
 * one pass over the experts' bytes. The expanded weights are exact (E2M1 x E4M3 fits bf16);
 * the activations go in as bf16 hi + lo rows, as for the linears, so every product keeps
 * ~fp32 accuracy. The tensors' global scales (scale2) are applied where the halves are summed.
 *
 * A segment is one used expert's run of sorted rows: segs[3 i] = expert, segs[3 i + 1] = first
 * sorted row, segs[3 i + 2] = rows (cuda_moe_sort with one tile an expert). Activations keep the
 * sorted order with each row doubled: segment i's rows sit at 2 start .. 2 start + rows - 1 (hi)
 * and the next `rows` (lo), so one GEMM a segment reads its expert's weights once for both.
 */
#include "backend/cuda/cuda_common.cuh"

namespace
{

enum { ROW_THREADS = 256 };

/* Segment s of the pass starting at seg0: its expert, first sorted row and rows. */
struct seg_info {
    int e, start, m;
};

__device__ __forceinline__ seg_info seg_of(const int32_t *segs, int seg0, int s)
{
    const int32_t *g = segs + 3 * (seg0 + s);
    return {g[0], g[1], g[2]};
}

/* Segment s (of the pass starting at seg0): gate rows then up rows into wgu (2I x D), down into
 * wd (D x I), all bf16 without the global scales. */
__global__ void experts_bf16_kernel(const cuda_wdev *table, int n_experts, const int32_t *segs, int seg0,
                                    size_t words_id, uint4 *wgu, uint4 *wd)
{
    const int s = blockIdx.y, e = seg_of(segs, seg0, s).e;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < 3 * words_id;
         i += (size_t)gridDim.x * blockDim.x) {
        const int mat = (int)(i / words_id); /* 0 gate, 1 up, 2 down */
        const size_t w = i - (size_t)mat * words_id;
        const cuda_wdev &src = table[(size_t)mat * n_experts + e];
        const uint4 v = dev_nvfp4_word_bf16(__ldg((const uint32_t *)src.data + w),
                                            dev_e4m3(__ldg((const uint8_t *)src.scale + w / 2)));
        if (mat < 2)
            wgu[(size_t)s * 2 * words_id + (size_t)mat * words_id + w] = v;
        else
            wd[(size_t)s * words_id + w] = v;
    }
}

/* One sorted row a block: the row's token's x as bf16 hi and lo. */
__global__ void gather_split_kernel(const float *x, int64_t D, const int32_t *sorted_pair, int n_used,
                                    const int32_t *segs, int seg0, uint16_t *xb)
{
    const int j = blockIdx.x;
    const seg_info g = seg_of(segs, seg0, blockIdx.y);
    if (j >= g.m)
        return;
    uint16_t *hi = xb + ((size_t)2 * g.start + j) * (size_t)D, *lo = hi + (size_t)g.m * (size_t)D;
    const float *row = x + (size_t)(sorted_pair[g.start + j] / n_used) * (size_t)D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
        dev_bf16_split(row[d], &hi[d], &lo[d]);
}

/* y1: a row of 2I (gate then up) for each activation row. The activation silu(gate * s_gate) *
 * (up * s_up) as bf16 hi and lo rows of I into ab. */
__global__ void act_split_kernel(const cuda_wdev *table, int n_experts, const float *y1, int64_t I,
                                 const int32_t *segs, int seg0, uint16_t *ab)
{
    const int j = blockIdx.x;
    const seg_info g = seg_of(segs, seg0, blockIdx.y);
    if (j >= g.m)
        return;
    const float sg = table[g.e].scale2, su = table[(size_t)n_experts + g.e].scale2;
    const float *yh = y1 + ((size_t)2 * g.start + j) * (size_t)(2 * I),
                *yl = yh + (size_t)g.m * (size_t)(2 * I);
    uint16_t *hi = ab + ((size_t)2 * g.start + j) * (size_t)I, *lo = hi + (size_t)g.m * (size_t)I;
    for (int64_t c = threadIdx.x; c < I; c += blockDim.x) {
        const float gv = __fmul_rn(__fadd_rn(yh[c], yl[c]), sg);
        const float uv = __fmul_rn(__fadd_rn(yh[I + c], yl[I + c]), su);
        dev_bf16_split(dev_silu_mul(gv, uv), &hi[c], &lo[c]);
    }
}

/* y2: a row of D for each activation row. Sorted row start + j of yg = (hi + lo) * s_down. */
__global__ void down_rows_kernel(const cuda_wdev *table, int n_experts, const float *y2, int64_t D,
                                 const int32_t *segs, int seg0, float *yg)
{
    const int j = blockIdx.x;
    const seg_info g = seg_of(segs, seg0, blockIdx.y);
    if (j >= g.m)
        return;
    const float sd = table[2 * (size_t)n_experts + g.e].scale2;
    const float *yh = y2 + ((size_t)2 * g.start + j) * (size_t)D, *yl = yh + (size_t)g.m * (size_t)D;
    float *out = yg + (size_t)(g.start + j) * (size_t)D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
        out[d] = __fmul_rn(__fadd_rn(yh[d], yl[d]), sd);
}

} // namespace

extern "C" cudaError_t cuda_moe_bf16_experts(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                                             int64_t D, int64_t I, const int32_t *segs, int seg0, int n_seg,
                                             uint16_t *wgu, uint16_t *wd)
{
    if (n_seg <= 0)
        return cudaSuccess;
    if (D % 16 || I % 16 || n_seg > 65535 || (uintptr_t)wgu % 16 || (uintptr_t)wd % 16)
        return cudaErrorInvalidValue;
    const size_t words = (size_t)D * (size_t)I / 8;
    unsigned bx = cuda_blocks(3 * words, ROW_THREADS);
    bx = bx > 256 ? 256 : bx; /* grid-stride: n_seg x 256 blocks cover a pass of many experts */
    experts_bf16_kernel<<<dim3(bx, (unsigned)n_seg), ROW_THREADS, 0, stream>>>(table, n_experts, segs, seg0, words,
                                                                               (uint4 *)wgu, (uint4 *)wd);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_moe_bf16_gather(cudaStream_t stream, const float *x, int64_t D,
                                            const int32_t *sorted_pair, int n_used, const int32_t *segs,
                                            int seg0, int n_seg, int m_max, uint16_t *xb)
{
    if (n_seg <= 0 || m_max <= 0)
        return cudaSuccess;
    if (n_seg > 65535 || n_used < 1)
        return cudaErrorInvalidValue;
    gather_split_kernel<<<dim3((unsigned)m_max, (unsigned)n_seg), ROW_THREADS, 0, stream>>>(
        x, D, sorted_pair, n_used, segs, seg0, xb);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_moe_bf16_act(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                                         const float *y1, int64_t I, const int32_t *segs, int seg0, int n_seg,
                                         int m_max, uint16_t *ab)
{
    if (n_seg <= 0 || m_max <= 0)
        return cudaSuccess;
    if (n_seg > 65535)
        return cudaErrorInvalidValue;
    act_split_kernel<<<dim3((unsigned)m_max, (unsigned)n_seg), ROW_THREADS, 0, stream>>>(table, n_experts, y1,
                                                                                         I, segs, seg0, ab);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_moe_bf16_down_rows(cudaStream_t stream, const struct cuda_wdev *table,
                                               int n_experts, const float *y2, int64_t D, const int32_t *segs,
                                               int seg0, int n_seg, int m_max, float *yg)
{
    if (n_seg <= 0 || m_max <= 0)
        return cudaSuccess;
    if (n_seg > 65535)
        return cudaErrorInvalidValue;
    down_rows_kernel<<<dim3((unsigned)m_max, (unsigned)n_seg), ROW_THREADS, 0, stream>>>(table, n_experts, y2,
                                                                                         D, segs, seg0, yg);
    return CUDA_LAUNCH_RESULT();
}
