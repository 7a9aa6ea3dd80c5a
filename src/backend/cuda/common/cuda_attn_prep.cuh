/* cuda_attn_prep.cuh — one head of attn_prep (per-head RMSNorm, RoPE, KV-cache write; see
 * cuda_fused.cu), shared by its two kernels there (a block a head, a warp a head).
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_ATTN_PREP_CUH
#define MOESERVE_BACKEND_CUDA_CUDA_ATTN_PREP_CUH

#include "backend/cuda/common/cuda_common.cuh"

namespace
{

/* Element i of a head after RoPE at position p: sv is the head after its norm (shared memory), the
 * rotated slice is [offset, offset + dim); rounded as the CPU's rope. */
__device__ __forceinline__ float rope_elem(const float *sv, int i, int offset, int dim, int interleaved,
                                           float attention_factor, const float *inv_freq, float p)
{
    const int j = i - offset, half = dim / 2;
    if (j < 0 || j >= dim)
        return sv[i];
    const int f = j < half ? j : j - half;
    const float phi = __fmul_rn(p, inv_freq[f]);
    const float c = __fmul_rn(cosf(phi), attention_factor);
    const float s = __fmul_rn(sinf(phi), attention_factor);
    const float x0 = interleaved ? sv[offset + 2 * f] : sv[offset + f];
    const float x1 = interleaved ? sv[offset + 2 * f + 1] : sv[offset + f + half];
    return j < half ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)) : __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

/* Head h of token t (q heads, then k heads, then v heads) through the per-head RMSNorm, RoPE and
 * the cache write, by the calling block (any size; WARP: by the calling warp alone, so that a block
 * may take several heads); sv: hd floats of shared memory (the warp's own with WARP). */
template <bool WARP = false>
__device__ __forceinline__ void
attn_prep_head(float *q, float *k, const float *v, int n_heads, int n_kv, int hd, const float *q_norm,
               const float *k_norm, float eps, int dim, int offset, int interleaved, float attention_factor,
               const float *inv_freq, const int32_t *pos, float *kc, float *vc, const int32_t *slots,
               const int t, const int h, float *sv)
{
    const int i0 = WARP ? (int)(threadIdx.x % 32) : (int)threadIdx.x, step = WARP ? 32 : (int)blockDim.x;
    const size_t row = (size_t)n_kv * (size_t)hd; /* one token's K (or V) in the cache */
    const size_t slot = (size_t)slots[t];
    if (h >= n_heads + n_kv) { /* a V head: straight into the cache */
        int vh = h - n_heads - n_kv;
        const float *src = v + ((size_t)t * n_kv + vh) * hd;
        for (int i = i0; i < hd; i += step)
            vc[slot * row + (size_t)vh * hd + i] = src[i];
        return;
    }
    const bool is_q = h < n_heads;
    const int kh = h - n_heads;
    float *x = is_q ? q + ((size_t)t * n_heads + h) * hd : k + ((size_t)t * n_kv + kh) * hd;
    const float *w = is_q ? q_norm : k_norm;
    if (w) {
        double ss = 0;
        for (int i = i0; i < hd; i += step)
            ss += (double)x[i] * (double)x[i];
        if constexpr (WARP)
            for (int o = 16; o > 0; o >>= 1)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
        else
            ss = block_sum_double(ss);
        float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / hd), eps)));
        for (int i = i0; i < hd; i += step)
            sv[i] = __fmul_rn(w[i], __fmul_rn(x[i], inv));
    } else {
        for (int i = i0; i < hd; i += step)
            sv[i] = x[i];
    }
    if constexpr (WARP)
        __syncwarp();
    else
        __syncthreads();
    /* out = sv, with the rotated slice [offset, offset + dim) replaced */
    float *out = x;
    float *cache = is_q ? nullptr : kc + slot * row + (size_t)kh * hd;
    const float p = (float)pos[t];
    for (int i = i0; i < hd; i += step) {
        const float r = rope_elem(sv, i, offset, dim, interleaved, attention_factor, inv_freq, p);
        out[i] = r;
        if (cache)
            cache[i] = r;
    }
}

} // namespace

#endif
