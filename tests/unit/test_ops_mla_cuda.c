/* test_ops_mla_cuda.c — the glm_moe_dsa ops: layernorm, the latent cache, absorb/expand, MLA attention, the DSA selection, on the CUDA backend against the CPU reference (ops_cuda_common.h). */
#include "ops_cuda_common.h"
#include "backend/cpu/cpu_mla.h" /* cpu_mla_put_row: the fp8 caches the cases read */

#include "ops_cuda_mla.inc" /* layernorm, mla_*, dsa_select (glm_moe_dsa) */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_mla_store),
        cmocka_unit_test(test_mla_absorb_expand),
        cmocka_unit_test(test_mla_attention),
        cmocka_unit_test(test_mla_expanded),
        cmocka_unit_test(test_dsa_select),
        cmocka_unit_test(test_mla_unstaged),
    };
    return ops_cuda_main("test_ops_mla_cuda", tests, sizeof tests / sizeof tests[0]);
}
