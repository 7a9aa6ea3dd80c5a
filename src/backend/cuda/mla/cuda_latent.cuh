/* cuda_latent.cuh — reading and writing rows of the MLA latent cache and the DSA key cache in
 * their dtype (backend.h's struct paged_latent and row layouts: f32; bf16 rounded to nearest even
 * like the CPU's f32_to_bf16; fp8: nq e4m3 codes, one f32 scale per KV_FP8_BLOCK of them, then
 * the nr rope values in bf16), for the kernels of cuda_mla.cu, cuda_mla_mma.cu and cuda_dsa.cu.
 * The fp8 conversions are the CPU's (quant_codec.c, dtype.h) operation for operation, so both
 * backends store the same bytes for the same f32 row and read the same values back. */
#ifndef MOESERVE_BACKEND_CUDA_MLA_CUDA_LATENT_CUH
#define MOESERVE_BACKEND_CUDA_MLA_CUDA_LATENT_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "backend/backend.h"

/* One cache array: rows of nq values then nr rope values of type dtype. */
struct cache_rows {
    void *base;
    int dtype;     /* enum kv_dtype */
    int nq, nr;
    int nb;        /* fp8: scales a row, ceil(nq / KV_FP8_BLOCK) */
    int row_bytes; /* kv_latent_row_bytes(dtype, nq, nr) */
};

inline cache_rows cache_rows_make(void *base, enum kv_dtype t, int nq, int nr)
{
    cache_rows r = {base, (int)t, nq, nr, (nq + KV_FP8_BLOCK - 1) / KV_FP8_BLOCK,
                    (int)kv_latent_row_bytes(t, nq, nr)};
    return r;
}

/* fp8 rows hold f32 scales and bf16 rope values at byte offsets of the row: kept 4- and
 * 2-byte aligned by these dims (every GLM shape has them); the kernels refuse others. */
inline bool fp8_dims_ok(int nq, int nr)
{
    return nq % 4 == 0 && nr % 2 == 0;
}

/* The keys the DSA indexer scores for a query at position pos, within its scratch row of ctx:
 * the forward sizes the row from the pass's positions (attn_batch.max_len); the bound only keeps
 * a broken caller from writing past the row. */
__device__ __forceinline__ int dsa_row_len(int32_t pos, int ctx)
{
    return pos + 1 < ctx ? pos + 1 : ctx;
}

/* dtype.h's e4m3_to_f32: OCP E4M3 "fn", S.1111.111 is NaN. */
__device__ __forceinline__ float e4m3_decode(uint32_t b)
{
    const uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float f;
    if (exp == 0xf && man == 0x7)
        f = __int_as_float(0x7fc00000);
    else if (exp == 0)
        f = (float)man * 0.001953125f; /* man * 2^-9, exact */
    else
        f = __uint_as_float(((exp + 120u) << 23) | (man << 20));
    return (b & 0x80u) ? -f : f;
}

/* quant_codec.c's f32_to_e4m3: nearest even, saturating at 448, NaN -> 0x7f. */
__device__ __forceinline__ uint8_t e4m3_encode(float x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    if (isnan(x))
        return 0x7f;
    if (a >= 448.0f)
        return sign | 0x7e;
    if (a < 0.015625f)
        return sign | (uint8_t)rintf(__fmul_rn(a, 512.0f));
    int e;
    const float fr = frexpf(a, &e);
    float m = rintf(__fmul_rn(__fsub_rn(__fmul_rn(fr, 2.0f), 1.0f), 8.0f));
    int exp = e - 1;
    if (m == 8.0f) {
        m = 0.0f;
        exp++;
    }
    int code = ((exp + 7) << 3) | (int)m;
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

/* Two e4m3 codes (low byte first) -> two bf16 values, exactly (e4m3 is a subset of bf16): how the
 * tensor-core kernels stage an fp8 cache's latent values. */
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t codes)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)codes, __NV_E4M3);
    const float lo = __half2float(__half(__half_raw{h.x})), hi = __half2float(__half(__half_raw{h.y}));
    return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) >> 16 << 16);
}

/* Value i (< nq + nr) of row `slot`. */
__device__ __forceinline__ float cache_get(const cache_rows &r, size_t slot, int i)
{
    if (r.dtype == KV_DTYPE_F32)
        return ((const float *)r.base)[slot * (size_t)(r.nq + r.nr) + (size_t)i];
    if (r.dtype == KV_DTYPE_BF16)
        return __uint_as_float((uint32_t)((const uint16_t *)r.base)[slot * (size_t)(r.nq + r.nr) + (size_t)i] << 16);
    const uint8_t *row = (const uint8_t *)r.base + slot * (size_t)r.row_bytes;
    if (i < r.nq)
        return __fmul_rn(e4m3_decode(row[i]), *(const float *)(row + r.nq + 4 * (i / KV_FP8_BLOCK)));
    const uint16_t h = *(const uint16_t *)(row + r.nq + 4 * r.nb + 2 * (i - r.nq));
    return __uint_as_float((uint32_t)h << 16);
}

/* Values 4 i4 .. 4 i4 + 3 of row `slot` as cache_get gives them, in one load (rows without rope
 * values, nq % 4 == 0: the DSA keys). */
__device__ __forceinline__ void cache_get4(const cache_rows &r, size_t slot, int i4, float v[4])
{
    if (r.dtype == KV_DTYPE_F32) {
        const float4 f = *(const float4 *)((const float *)r.base + slot * (size_t)r.nq + 4 * (size_t)i4);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else if (r.dtype == KV_DTYPE_BF16) {
        const uint2 h = *(const uint2 *)((const uint16_t *)r.base + slot * (size_t)r.nq + 4 * (size_t)i4);
        v[0] = __uint_as_float(h.x << 16), v[1] = __uint_as_float(h.x & 0xffff0000u);
        v[2] = __uint_as_float(h.y << 16), v[3] = __uint_as_float(h.y & 0xffff0000u);
    } else {
        const uint8_t *row = (const uint8_t *)r.base + slot * (size_t)r.row_bytes;
        const uint32_t c = *(const uint32_t *)(row + 4 * i4);
        const float sc = *(const float *)(row + r.nq + 4 * (4 * i4 / KV_FP8_BLOCK));
#pragma unroll
        for (int e = 0; e < 4; e++)
            v[e] = __fmul_rn(e4m3_decode((c >> (8 * e)) & 0xffu), sc);
    }
}

/* Row `slot` <- v[0 .. nq + nr), by warps w0 of nw (each calls it with all 32 lanes; the warps
 * share the values and, in fp8, the scale blocks). fp8: each block's scale is amax / 448 (1 for
 * an all-zero block) and the codes are e4m3(v / scale), as the CPU's cache_put does it. */
__device__ __forceinline__ void cache_put_row(const cache_rows &r, size_t slot, const float *v, int w0, int nw)
{
    const int lane = threadIdx.x % 32, n = r.nq + r.nr, i0 = w0 * 32 + lane, step = nw * 32;
    if (r.dtype == KV_DTYPE_F32) {
        for (int i = i0; i < n; i += step)
            ((float *)r.base)[slot * (size_t)n + i] = v[i];
        return;
    }
    if (r.dtype == KV_DTYPE_BF16) {
        for (int i = i0; i < n; i += step)
            ((__nv_bfloat16 *)r.base)[slot * (size_t)n + i] = __float2bfloat16_rn(v[i]);
        return;
    }
    uint8_t *row = (uint8_t *)r.base + slot * (size_t)r.row_bytes;
    for (int b = w0; b < r.nb; b += nw) {
        const int b0 = b * KV_FP8_BLOCK, b1 = b0 + KV_FP8_BLOCK < r.nq ? b0 + KV_FP8_BLOCK : r.nq;
        float amax = 0.0f;
        for (int i = b0 + lane; i < b1; i += 32)
            amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
        if (lane == 0)
            *(float *)(row + r.nq + 4 * b) = s;
        for (int i = b0 + lane; i < b1; i += 32)
            row[i] = e4m3_encode(__fdiv_rn(v[i], s));
    }
    for (int i = i0; i < r.nr; i += step)
        *(__nv_bfloat16 *)(row + r.nq + 4 * r.nb + 2 * i) = __float2bfloat16_rn(v[r.nq + i]);
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

/* The tensor-core kernels' view of the cache: its rows and, for fp8, their bytes and scales a row. */
template <typename P>
inline void latent_rows_fill(P &p, const struct paged_latent *kv)
{
    p.latent = kv->latent;
    p.row_bytes = (int)kv_latent_row_bytes(kv->dtype, kv->kv_rank, kv->rope_dim);
    p.nb = (kv->kv_rank + KV_FP8_BLOCK - 1) / KV_FP8_BLOCK;
}

#endif
