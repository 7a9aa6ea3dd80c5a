/* cuda_latent.cuh — reading and writing rows of the MLA latent cache and the DSA key cache in
 * their dtype (struct paged_latent: f32, or bf16 rounded to nearest even like the CPU's
 * f32_to_bf16), for the kernels of cuda_mla.cu and cuda_dsa.cu. */
#ifndef MOESERVE_BACKEND_CUDA_MLA_CUDA_LATENT_CUH
#define MOESERVE_BACKEND_CUDA_MLA_CUDA_LATENT_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "backend/backend.h"

/* Value i of a cache array: bf16 != 0 for bf16 rows, else f32. */
__device__ __forceinline__ float latent_get(const void *base, int bf16, size_t i)
{
    return bf16 ? __uint_as_float((uint32_t)((const uint16_t *)base)[i] << 16) : ((const float *)base)[i];
}

__device__ __forceinline__ void latent_put(void *base, int bf16, size_t i, float v)
{
    if (bf16)
        ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(v);
    else
        ((float *)base)[i] = v;
}

/* The fields both latent attention kernels' parameter structs share (same names in each): the
 * batch, its key lists and the cache geometry, then the output and split workspace. */
template <class P>
inline void latent_params_fill(P &p, const float *q_abs, const struct paged_latent *kv, const struct attn_batch *b,
                               int n_heads, const int32_t *sel, int sel_k, float scale, int n_splits, float *o_lat,
                               float *work)
{
    p.q = q_abs;
    p.sel = sel;
    p.sel_k = sel_k;
    p.pos = b->pos;
    p.seq = b->seq;
    p.table = b->block_table;
    p.max_blocks = b->max_blocks;
    p.block_size = kv->block_size;
    p.n_tokens = b->n_tokens;
    p.H = n_heads;
    p.Dk = kv->kv_rank + kv->rope_dim;
    p.R = kv->kv_rank;
    p.scale = scale;
    p.n_splits = n_splits;
    p.out = o_lat;
    p.part = work;
}

#endif
