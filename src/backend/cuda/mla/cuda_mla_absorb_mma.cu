/* cuda_mla_absorb_mma.cu — MLA's query absorption at one token from an NVFP4 kv_b_proj on bf16
 * tensor cores: q_abs[h, c] = sum_i q_nope[h, i] W_uk_h[i, c], the rope part copied after it.
 *
 * Why: the contraction runs over W's rows (the nope dims), so the one-token GEMV machinery, which
 * walks a row's K, does not apply; cuda_mla.cu's fp32 kernel decodes each weight on CUDA cores
 * (~6 instructions a weight: GLM-5's 3.5 MB took 13.4 us at batch 1 on the H100). Here a block
 * decodes its slab of W (nope rows x 64 columns) into shared memory as exact bf16 products of
 * the E2M1 value and its E4M3 scale (times 2^-62, as the decode kernels build them: ~2
 * instructions a weight, issued before the PDL wait since W does not depend on the previous
 * kernel), then tensor cores take it as B through ldmatrix.trans with the query as A (hi + lo
 * bf16: fp32-grade). A word's 8 columns are stored in the order the pair builder gives them
 * (c, c+4, c+1, c+5, ...), and the outputs are written back through that order.
 */
#include "backend/cuda/mla/mla.h"

#include "backend/cuda/common/cuda_mma.cuh"
#include "backend/cuda/decode/cuda_decode_mma.cuh"

namespace
{

constexpr int ABS_COLS = 64;                /* latent columns a block: 8 words of a row */
constexpr int ABS_WARPS = ABS_COLS / 16;    /* a warp: two 8-column n-tiles */
constexpr int ABS_LD = ABS_COLS + 8;        /* bf16 a slab row: ldmatrix rows in distinct banks */
constexpr int ABS_MAX_NOPE = 256;           /* the slab's rows (GLM-5: 192) */
constexpr int ABS_WPT = ABS_MAX_NOPE * 8 / (ABS_WARPS * 32); /* words a thread at most */

/* grid (R / ABS_COLS, H), ABS_WARPS warps; smem: the slab [nope][ABS_LD] bf16, then q_nope [nope] f32 */
__global__ void __launch_bounds__(ABS_WARPS * 32)
    mla_absorb_mma_kernel(cuda_wdev w, int nope, int rope, int v, int R, const float *q, float *q_abs)
{
    extern __shared__ __align__(16) uint16_t slab[];
    float *qs = (float *)(slab + (size_t)nope * ABS_LD);
    const int h = blockIdx.y, c0 = blockIdx.x * ABS_COLS, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row0 = (int64_t)h * (nope + v);
    /* the slab's words (row i, word j: columns c0 + 8 j ..) and their scale bytes, all in flight */
    uint32_t wd[ABS_WPT], sb[ABS_WPT];
#pragma unroll
    for (int u = 0; u < ABS_WPT; u++) {
        const int wi = (int)threadIdx.x + u * ABS_WARPS * 32, i = wi / 8, j = wi % 8;
        wd[u] = sb[u] = 0;
        if (i < nope) {
            const int64_t row = row0 + i;
            wd[u] = __ldg((const uint32_t *)((const uint8_t *)w.data + row * (R / 2) + (c0 + 8 * j) / 2));
            sb[u] = __ldg((const uint8_t *)w.scale + row * (R / 16) + (c0 + 8 * j) / 16);
        }
    }
#pragma unroll
    for (int u = 0; u < ABS_WPT; u++) {
        const int wi = (int)threadIdx.x + u * ABS_WARPS * 32, i = wi / 8, j = wi % 8;
        if (i < nope) {
            uint32_t sc, unused;
            scales_x2(sb[u], sc, unused);
            const uint32_t u0 = bf16x2_fma(e2m1x2_raw<0>(wd[u]), sc, 0x80008000u);
            const uint32_t u1 = bf16x2_fma(e2m1x2_raw<1>(wd[u]), sc, 0x80008000u);
            const uint32_t u2 = bf16x2_fma(e2m1x2_raw<2>(wd[u]), sc, 0x80008000u);
            const uint32_t u3 = bf16x2_fma(e2m1x2_raw<3>(wd[u]), sc, 0x80008000u);
            *(uint4 *)(slab + (size_t)i * ABS_LD + 8 * j) = make_uint4(u0, u1, u2, u3);
        }
    }
    pdl_wait();
    for (int i = threadIdx.x; i < nope; i += blockDim.x)
        qs[i] = q[(size_t)h * (nope + rope) + i];
    if (blockIdx.x == 0)
        for (int d = threadIdx.x; d < rope; d += blockDim.x)
            q_abs[(size_t)h * (R + rope) + R + d] = q[(size_t)h * (nope + rope) + nope + d];
    __syncthreads();
    /* A: the query in row 0 (hi) and row 8 (lo), lanes 0..3 (k 2t, 2t + 1 and 2t + 8, 2t + 9) */
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
    const int t = lane % 4;
    for (int kk = 0; kk < nope / 16; kk++) {
        uint4 a = make_uint4(0u, 0u, 0u, 0u);
        if (lane < 4) {
            const float *qk = qs + kk * 16 + 2 * t;
            const float x0 = qk[0], x1 = qk[1], x8 = qk[8], x9 = qk[9];
            const float h0 = bf16_round(x0), h1 = bf16_round(x1), h8 = bf16_round(x8), h9 = bf16_round(x9);
            a = make_uint4(bf16x2_of(h0, h1), bf16x2_of(x0 - h0, x1 - h1), bf16x2_of(h8, h9), bf16x2_of(x8 - h8, x9 - h9));
        }
        uint32_t b[4];
        mma_ldsm_x4_trans(b, slab + (size_t)(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ABS_LD + warp * 16 +
                                 (lane >> 4) * 8);
        mma_bf16_16816(d0, a, b[0], b[1]);
        mma_bf16_16816(d1, a, b[2], b[3]);
    }
    if (lane < 4) { /* stored position p of an n-tile is column p / 2 + 4 (p % 2) of its word */
        const float s = 0x1p62f * w.scale2;
        float *out = q_abs + (size_t)h * (R + rope) + c0 + warp * 16;
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const float *dd = nt ? d1 : d0;
            out[nt * 8 + t] = (dd[0] + dd[2]) * s;         /* position 2t */
            out[nt * 8 + t + 4] = (dd[1] + dd[3]) * s;     /* position 2t + 1 */
        }
    }
}

} // namespace

extern "C" int cuda_mla_absorb_mma_fits(enum weight_format fmt, const struct cuda_wdev *w, const struct mla_dims *m,
                                        int n_tokens)
{
    return fmt == WEIGHT_NVFP4 && n_tokens == 1 && m->kv_rank % ABS_COLS == 0 && m->nope % 16 == 0 &&
           m->nope <= ABS_MAX_NOPE && m->n_heads <= 65535 && (uintptr_t)w->data % 4 == 0 && !w->bias;
}

extern "C" cudaError_t cuda_mla_absorb_mma(cudaStream_t stream, const struct cuda_wdev *w, const struct mla_dims *m,
                                           const float *q, float *q_abs, int pdl)
{
    if (!cuda_mla_absorb_mma_fits(WEIGHT_NVFP4, w, m, 1))
        return cudaErrorInvalidValue;
    const size_t smem = (size_t)m->nope * ABS_LD * 2 + (size_t)m->nope * 4;
    dim3 grid((unsigned)(m->kv_rank / ABS_COLS), (unsigned)m->n_heads);
    return launch_pdl(pdl != 0, mla_absorb_mma_kernel, grid, dim3(ABS_WARPS * 32), smem, stream, *w, m->nope, m->rope,
                      m->v, m->kv_rank, q, q_abs);
}
