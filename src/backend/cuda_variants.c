/* cuda_variants.c — see cuda_variants.h. */
#include "backend/cuda_variants.h"

#include <string.h>

bool cuda_variant_implemented(void *ctx, const char *kernel)
{
    (void)ctx;
    /* warpgroup MMA: the bf16 GEMMs of cuda_gemm_wgmma.cu (NVFP4 weight-only, BF16); not the fp8 GEMM,
     * not wgmma attention. Not written yet: Blackwell tcgen05 */
    if (strstr(kernel, "wgmma"))
        return strstr(kernel, "gemm_nvfp4_wo_wgmma") || strstr(kernel, "gemm_bf16_wgmma");
    if (strstr(kernel, "tcgen05"))
        return false;
    /* mma.sync: the bf16 GEMMs of cuda_gemm_mma.cu (NVFP4 weight-only, BF16), the prefill
     * attention of cuda_attention_mma.cu and the few-token NVFP4 MoE of cuda_decode_mma.cu; not
     * the fp8 / native fp4 GEMMs, not mma decode attention */
    if (strstr(kernel, "_mma"))
        return strstr(kernel, "gemm_nvfp4_wo_mma") || strstr(kernel, "gemm_bf16_mma") ||
               !strcmp(kernel, "attn_prefill_mma_bf16") || !strcmp(kernel, "moe_pair_decode_mma_bf16");
    return true;
}
