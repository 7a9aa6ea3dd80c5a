/* cuda_moe.cu — the bookkeeping around the grouped expert GEMMs: sort the
 * (token, slot) pairs by expert, and combine the expert outputs per token.
 *
 * moe_sort_kernel (one block) counts the pairs per expert, lays the experts'
 * rows out contiguously in ascending expert order (compact: no padding rows,
 * so the buffers fit in backend_moe_workspace_floats()), cuts each expert's
 * rows into tiles of tile_rows, and places every pair. Rows within one
 * expert come in arbitrary order, which changes no result: every row of a
 * GEMM is computed on its own.
 *
 * moe_combine_kernel sums a token's expert outputs in ascending expert id,
 * starting from zero, with separate multiply and add roundings, exactly as
 * the CPU reference does.
 */
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/common/cuda_common.cuh"

namespace
{

enum { SORT_THREADS = 1024, SORT_MAX_E = 4096, COMBINE_MAX_K = 64 };

__global__ void __launch_bounds__(SORT_THREADS)
    moe_sort_kernel(const int32_t *ids, int pairs, int n_experts, int tile_rows, int32_t *sorted_pair,
                    int32_t *row_of_pair, int32_t *tiles, int32_t *n_tiles, int max_tiles)
{
    extern __shared__ int ssm[];
    int *count = ssm;              /* (n_experts) */
    int *cursor = ssm + n_experts; /* (n_experts) */
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x)
        count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int e = ids[p];
        if (e >= 0 && e < n_experts)
            atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int row = 0, nt = 0;
        for (int e = 0; e < n_experts; e++) {
            cursor[e] = row;
            for (int r = 0; r < count[e] && nt < max_tiles; r += tile_rows) {
                tiles[3 * nt] = e;
                tiles[3 * nt + 1] = row + r;
                tiles[3 * nt + 2] = count[e] - r < tile_rows ? count[e] - r : tile_rows;
                nt++;
            }
            row += count[e];
        }
        *n_tiles = nt;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int e = ids[p];
        int row = -1;
        if (e >= 0 && e < n_experts) {
            row = atomicAdd(&cursor[e], 1);
            sorted_pair[row] = p;
        }
        row_of_pair[p] = row;
    }
}

__global__ void moe_combine_kernel(const int32_t *ids, const float *weights, int n_used, int dim,
                                   const int32_t *row_of_pair, const float *y, float *out)
{
    __shared__ int order[COMBINE_MAX_K];
    const size_t t = blockIdx.x;
    const int32_t *it = ids + t * n_used;
    if (threadIdx.x == 0) /* the token's slots by ascending expert id */
        slots_by_expert(it, n_used, order);
    __syncthreads();
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float o = 0.0f;
        for (int jj = 0; jj < n_used; jj++) {
            int j = order[jj];
            int row = row_of_pair[t * n_used + j];
            if (row >= 0)
                o = __fadd_rn(o, __fmul_rn(weights[t * n_used + j], y[(size_t)row * dim + d]));
        }
        out[t * dim + d] = o;
    }
}

__global__ void moe_mask_ids_kernel(int32_t *ids, size_t n, int lo, int hi)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && (ids[i] < lo || ids[i] >= hi))
        ids[i] = -1;
}

} // namespace

extern "C" int cuda_moe_max_tiles(int pairs, int n_experts, int tile_rows)
{
    return (pairs + tile_rows - 1) / tile_rows + (n_experts < pairs ? n_experts : pairs);
}

extern "C" cudaError_t cuda_moe_mask_ids(cudaStream_t stream, int32_t *ids, size_t n, int lo, int hi)
{
    if (!n)
        return cudaSuccess;
    moe_mask_ids_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(ids, n, lo, hi);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_moe_sort(cudaStream_t stream, const int32_t *ids, int pairs, int n_experts,
                                     int tile_rows, int32_t *sorted_pair, int32_t *row_of_pair,
                                     int32_t *tiles, int32_t *n_tiles, int max_tiles)
{
    if (pairs <= 0)
        return cudaSuccess;
    if (n_experts < 1 || n_experts > SORT_MAX_E || tile_rows < 1)
        return cudaErrorInvalidValue;
    moe_sort_kernel<<<1, SORT_THREADS, (size_t)n_experts * 2 * sizeof(int), stream>>>(
        ids, pairs, n_experts, tile_rows, sorted_pair, row_of_pair, tiles, n_tiles, max_tiles);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_moe_combine(cudaStream_t stream, const int32_t *ids, const float *weights,
                                        int n_tokens, int n_used, int dim, const int32_t *row_of_pair,
                                        const float *y, float *out)
{
    if (n_tokens <= 0 || dim <= 0)
        return cudaSuccess;
    if (n_used < 1 || n_used > COMBINE_MAX_K)
        return cudaErrorInvalidValue;
    unsigned threads = dim >= 1024 ? 256u : dim >= 256 ? 128u : 64u;
    moe_combine_kernel<<<(unsigned)n_tokens, threads, 0, stream>>>(ids, weights, n_used, dim, row_of_pair, y,
                                                                   out);
    return CUDA_LAUNCH_RESULT();
}
