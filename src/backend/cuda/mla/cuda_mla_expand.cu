/* cuda_mla_expand.cu — the data movement of the expanded MLA form (backend_ops.mla_attention_expanded;
 * the host side is cuda_mla_expand.c): the latent rows of the batch's sequences gathered into
 * compact f32 rows for kv_b, and kv_b's output ([k_nope_h | v_h] per head) with the shared rope
 * key assembled into an f32 paged K/V cache of head dim hd that the causal attention kernels read.
 *
 * Compact rows: sequence s owns whole blocks of `bs` rows (the attention kernels address keys
 * through a block table); blk_seq[b] / blk_idx[b] name the sequence and its block number of
 * compact block b; rows past a sequence's keys are zero. */
#include "backend/cuda/mla/mla.h"

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/mla/cuda_latent.cuh"

namespace
{

struct gather_params {
    cache_rows lat;
    const int32_t *table; /* the real block table (n_seqs, max_blocks) */
    int max_blocks, bs;
    const int32_t *blk_seq, *blk_idx, *seq_keys; /* device */
    float *lat_out;                              /* (rows, kv_rank) */
    float *rope_out;                             /* (rows, rope) */
};

/* grid (compact rows), 128 threads */
__global__ void mla_expand_gather_kernel(gather_params p)
{
    const int r = blockIdx.x, b = r / p.bs, s = p.blk_seq[b];
    const int j = p.blk_idx[b] * p.bs + r % p.bs;
    const int R = p.lat.nq, rope = p.lat.nr;
    float *lo = p.lat_out + (size_t)r * R, *ro = p.rope_out + (size_t)r * rope;
    if (j >= p.seq_keys[s]) {
        for (int i = threadIdx.x; i < R + rope; i += blockDim.x)
            (i < R ? lo[i] : ro[i - R]) = 0.0f;
        return;
    }
    const size_t slot = (size_t)p.table[(size_t)s * p.max_blocks + j / p.bs] * p.bs + (size_t)(j % p.bs);
    for (int i = threadIdx.x; i < R + rope; i += blockDim.x)
        (i < R ? lo[i] : ro[i - R]) = cache_get(p.lat, slot, i);
}

/* grid (rows, heads), threads >= hd: K[r, h] = [e[r, h, :nope] | rope[r] | 0], V[r, h] = [e[r, h, nope:] | 0]
 */
__global__ void mla_expand_assemble_kernel(const float *e, const float *rope_in, int H, int nope, int rope,
                                           int v, int hd, float *k, float *vv)
{
    const int r = blockIdx.x, h = blockIdx.y;
    const float *eh = e + ((size_t)r * H + h) * (size_t)(nope + v);
    float *kh = k + ((size_t)r * H + h) * (size_t)hd, *vh = vv + ((size_t)r * H + h) * (size_t)hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        kh[d] = d < nope ? eh[d] : d < nope + rope ? rope_in[(size_t)r * rope + (d - nope)] : 0.0f;
        vh[d] = d < v ? eh[nope + d] : 0.0f;
    }
}

/* grid (rows), y[r, :cols_out] = [x[r, :cols_in] | 0] for rows of heads: (rows * H, hd_in) -> (rows * H,
 * hd_out) */
__global__ void mla_expand_repad_kernel(const float *x, int hd_in, int hd_out, float *y)
{
    const size_t r = blockIdx.x;
    for (int d = threadIdx.x; d < hd_out; d += blockDim.x)
        y[r * hd_out + d] = d < hd_in ? x[r * hd_in + d] : 0.0f;
}

} // namespace

extern "C" cudaError_t cuda_mla_expand_gather(cudaStream_t stream, const struct paged_latent *kv,
                                              const struct attn_batch *b, const int32_t *blk_seq,
                                              const int32_t *blk_idx, const int32_t *seq_keys, int rows,
                                              float *lat_out, float *rope_out)
{
    if (rows <= 0)
        return cudaSuccess;
    if (kv->dtype > KV_DTYPE_FP8 || (kv->dtype == KV_DTYPE_FP8 && !fp8_dims_ok(kv->kv_rank, kv->rope_dim)) ||
        rows % kv->block_size)
        return cudaErrorInvalidValue;
    gather_params p;
    p.lat = cache_rows_make(kv->latent, kv->dtype, kv->kv_rank, kv->rope_dim);
    p.table = b->block_table;
    p.max_blocks = b->max_blocks;
    p.bs = kv->block_size;
    p.blk_seq = blk_seq;
    p.blk_idx = blk_idx;
    p.seq_keys = seq_keys;
    p.lat_out = lat_out;
    p.rope_out = rope_out;
    mla_expand_gather_kernel<<<(unsigned)rows, 128, 0, stream>>>(p);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_mla_expand_assemble(cudaStream_t stream, const float *e, const float *rope_in,
                                                int rows, const struct mla_dims *m, int hd, float *k,
                                                float *v)
{
    if (rows <= 0)
        return cudaSuccess;
    if (hd < m->nope + m->rope || hd < m->v || m->n_heads > 65535)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)rows, (unsigned)m->n_heads);
    unsigned threads = hd >= 256 ? 256u : hd > 128 ? 256u : 128u;
    mla_expand_assemble_kernel<<<grid, threads, 0, stream>>>(e, rope_in, m->n_heads, m->nope, m->rope, m->v,
                                                             hd, k, v);
    return CUDA_LAUNCH_RESULT();
}

extern "C" cudaError_t cuda_mla_expand_repad(cudaStream_t stream, const float *x, int rows, int hd_in,
                                             int hd_out, float *y)
{
    if (rows <= 0)
        return cudaSuccess;
    mla_expand_repad_kernel<<<(unsigned)rows, 128, 0, stream>>>(x, hd_in, hd_out, y);
    return CUDA_LAUNCH_RESULT();
}
