/* cuda_weight_synth.cu — a synthetic weight's share made in device memory (format/weight_synth.h:
 * the values are the CPU's weight_synth_fill's, bit for bit, from the same inline functions).
 *
 * One thread a byte of codes (two elements) or a block scale, or an element of a plain matrix;
 * grid-stride over the share. Runs once at load: simplicity over speed (~1 TB/s of writes on an
 * H200 is far above what the binder needs).
 */
#include "backend/cuda/common/common.h"
#include "backend/cuda/common/cuda_common.cuh"

namespace
{

template <int FMT>
__global__ void synth_plain_kernel(struct weight_synth s, int64_t rows, int64_t cols, void *data)
{
    size_t total = (size_t)rows * (size_t)cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int64_t r = (int64_t)(i / (size_t)cols), c = (int64_t)(i % (size_t)cols);
        uint64_t g = (uint64_t)(s.row_off + r) * (uint64_t)s.full_cols + (uint64_t)(s.col_off + c);
        float v = __fmul_rn(s.amp, ws_uniform(ws_hash(s.seed, g)));
        if constexpr (FMT == WEIGHT_BF16)
            ((uint16_t *)data)[i] = ws_bf16(v);
        else
            ((float *)data)[i] = v;
    }
}

__global__ void synth_nvfp4_kernel(struct weight_synth s, int64_t rows, int64_t cols, uint8_t *codes, uint8_t *scale)
{
    size_t half = (size_t)cols / 2, n_codes = (size_t)rows * half;
    size_t blocks = (size_t)cols / 16, n_scales = (size_t)rows * blocks;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_codes + n_scales;
         i += (size_t)gridDim.x * blockDim.x) {
        if (i < n_codes) {
            int64_t r = (int64_t)(i / half), c = 2 * (int64_t)(i % half);
            uint64_t g = (uint64_t)(s.row_off + r) * (uint64_t)s.full_cols + (uint64_t)(s.col_off + c);
            codes[i] = (uint8_t)(ws_code(s.seed, g) | ws_code(s.seed, g + 1) << 4);
        } else {
            size_t j = i - n_codes;
            int64_t r = (int64_t)(j / blocks), b = (int64_t)(j % blocks);
            uint64_t gb = (uint64_t)(s.row_off + r) * (uint64_t)(s.full_cols / 16) + (uint64_t)(s.col_off / 16 + b);
            scale[j] = ws_scale(s.seed, gb);
        }
    }
}

unsigned synth_grid(size_t n)
{
    size_t g = (n + 255) / 256;
    return (unsigned)(g < 65536 ? (g ? g : 1) : 65536);
}

} // namespace

extern "C" cudaError_t cuda_weight_synth(cudaStream_t stream, enum weight_format fmt, const struct weight_synth *s,
                                         int64_t rows, int64_t cols, void *data, void *scale)
{
    switch (fmt) {
    case WEIGHT_BF16:
        synth_plain_kernel<WEIGHT_BF16><<<synth_grid((size_t)rows * cols), 256, 0, stream>>>(*s, rows, cols, data);
        break;
    case WEIGHT_F32:
        synth_plain_kernel<WEIGHT_F32><<<synth_grid((size_t)rows * cols), 256, 0, stream>>>(*s, rows, cols, data);
        break;
    case WEIGHT_NVFP4:
        if (cols % 16 || s->col_off % 16 || s->full_cols % 16)
            return cudaErrorInvalidValue;
        synth_nvfp4_kernel<<<synth_grid((size_t)rows * cols / 2 + (size_t)rows * cols / 16), 256, 0, stream>>>(
            *s, rows, cols, (uint8_t *)data, (uint8_t *)scale);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
