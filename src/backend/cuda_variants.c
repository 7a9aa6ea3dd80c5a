/* cuda_variants.c — see cuda_variants.h. */
#include "backend/cuda_variants.h"

#include <string.h>

bool cuda_variant_implemented(void *ctx, const char *kernel)
{
    (void)ctx;
    /* not written yet: Hopper warpgroup MMA, Blackwell tcgen05 */
    if (strstr(kernel, "wgmma") || strstr(kernel, "tcgen05"))
        return false;
    /* mma.sync: the bf16 GEMMs of cuda_gemm_mma.cu (NVFP4 weight-only, BF16); not the fp8 / native
     * fp4 GEMMs, not mma attention */
    if (strstr(kernel, "_mma"))
        return strstr(kernel, "gemm_nvfp4_wo_mma") || strstr(kernel, "gemm_bf16_mma");
    return true;
}
