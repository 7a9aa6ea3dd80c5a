/* cuda_latent.cuh — reading and writing rows of the MLA latent cache and the DSA key cache in
 * their dtype (struct paged_latent: f32, or bf16 rounded to nearest even like the CPU's
 * f32_to_bf16), for the kernels of cuda_mla.cu and cuda_dsa.cu. */
#ifndef MOESERVE_BACKEND_CUDA_MLA_CUDA_LATENT_CUH
#define MOESERVE_BACKEND_CUDA_MLA_CUDA_LATENT_CUH

#include <cuda_bf16.h>
#include <stdint.h>

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

#endif
