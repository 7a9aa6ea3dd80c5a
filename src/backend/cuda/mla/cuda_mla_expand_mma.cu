/* cuda_mla_expand_mma.cu — MLA's value expansion at one token from an NVFP4 kv_b_proj on bf16
 * tensor cores: out[h * v + j] = W_uv_h[j, :] . o_lat[h, :].
 *
 * Why: cuda_mla.cu's fp32 expand decodes every weight on CUDA cores (~6 instructions a weight);
 * GLM-5's 64 heads x 256 rows x 512 latent columns (4.7 MB) took 16 us at batch 1 on the H100
 * (0.3 TB/s). Each head's rows are an ordinary NVFP4 GEMV against that head's latent output, so
 * the one-token GEMV machinery of cuda_decode_mma.cuh runs it: a warp takes 8-row tiles of one
 * head as the mma's B operand, the head's o_lat staged once a block as hi + lo bf16 A fragments
 * (fp32-grade: the products are exact, the sums fp32), the weight loads issued before the PDL
 * wait and rolling across the warp's tiles.
 */
#include "backend/cuda/mla/mla.h"

#include "backend/cuda/decode/cuda_decode_mma.cuh"

namespace
{

constexpr int EXP_WARPS = 8;
constexpr int EXP_TPW = 2;  /* 8-row tiles a warp: GLM-5's 256 rows a head are 2 blocks, 128 in all */
constexpr int EXP_U = 8;    /* weight groups in flight a warp: all of its two tiles (R 512 is 4 groups a row), loaded before the PDL wait */

/* grid (ceil(v / (EXP_WARPS 8 EXP_TPW)), H); smem: the head's o_lat as A fragments (R x 4 bytes) */
__global__ void __launch_bounds__(EXP_WARPS * 32)
    mla_expand_mma_kernel(cuda_wdev w, int nope, int v, int R, const float *o_lat, float *out)
{
    extern __shared__ uint2 xf[];
    const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    const int j0 = (blockIdx.x * EXP_WARPS + warp) * 8 * EXP_TPW; /* the warp's first row of the head's v */
    const int64_t head0 = (int64_t)h * (nope + v) + nope;        /* the head's first value row of kv_b */
    const int64_t rend = head0 + v;                               /* rows past it are the next head's */
    const int G = R / 128;
    chunk16 pre[EXP_U];
    rows8_stream_prefetch<EXP_U, EXP_TPW>(w, head0 + j0 + g, rend, R, 0, G, pre);
    xfrag_zeros_init();
    pdl_wait();
    xfrag_stage(xf, o_lat + (size_t)h * (size_t)R, R, threadIdx.x, EXP_WARPS * 32);
    __syncthreads();
    float2 r[EXP_TPW];
    rows8_stream_dot<EXP_U, EXP_TPW>(w, head0 + j0 + g, rend, R, xf, 0, G, pre, r);
    pdl_trigger();
    if (lane < 4) /* lane t: rows 2t and 2t + 1 of each tile */
#pragma unroll
        for (int tt = 0; tt < EXP_TPW; tt++) {
            const int j = j0 + 8 * tt + 2 * lane;
            const float s = 0x1p62f * w.scale2;
            if (j < v)
                out[(size_t)h * v + j] = r[tt].x * s;
            if (j + 1 < v)
                out[(size_t)h * v + j + 1] = r[tt].y * s;
        }
}

} // namespace

extern "C" int cuda_mla_expand_mma_fits(enum weight_format fmt, const struct cuda_wdev *w, const struct mla_dims *m,
                                        int n_tokens)
{
    return fmt == WEIGHT_NVFP4 && n_tokens == 1 && m->kv_rank % 128 == 0 &&
           m->n_heads <= 65535 && (uintptr_t)w->data % 16 == 0 && (uintptr_t)w->scale % 2 == 0 && !w->bias;
}

extern "C" cudaError_t cuda_mla_expand_mma(cudaStream_t stream, const struct cuda_wdev *w, const struct mla_dims *m,
                                           const float *o_lat, float *out, int pdl)
{
    if (!cuda_mla_expand_mma_fits(WEIGHT_NVFP4, w, m, 1))
        return cudaErrorInvalidValue;
    const int rows_per_block = EXP_WARPS * 8 * EXP_TPW;
    dim3 grid((unsigned)((m->v + rows_per_block - 1) / rows_per_block), (unsigned)m->n_heads);
    return launch_pdl(pdl != 0, mla_expand_mma_kernel, grid, dim3(EXP_WARPS * 32), (size_t)m->kv_rank * 4, stream,
                      *w, m->nope, m->v, m->kv_rank, o_lat, out);
}
