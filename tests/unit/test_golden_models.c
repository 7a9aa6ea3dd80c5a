/* test_golden_models.c — parity with Hugging Face transformers on every fixture, CPU backend.
 *
 * tests/golden/models and tests/golden/dsa (transformers' own fp32 forward) and
 * tests/golden/quant (our quantizer's output; reference from independent PyTorch
 * dequantization + transformers): 1e-3 * max|ref| and identical argmax (DESIGN.md), our own
 * incremental and mixed-batch passes within 1e-5. The checks: golden_parity.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "base/log.h"
#include "golden_parity.h"

static const struct golden_cfg CPU_CFG = {.backend = "cpu", .tol_ref = 1e-3, .tol_self = 1e-5};

static void test_bf16_fixtures(void **state)
{
    (void)state;
    assert_true(check_group(&CPU_CFG, "models") >= 6); /* every variant of tools/make_fixtures.py */
}

static void test_quantized_fixtures(void **state)
{
    (void)state;
    assert_true(check_group(&CPU_CFG, "quant") >= 8); /* every variant of tools/make_quant_inputs.sh */
}

/* glm_moe_dsa (MLA + DSA indexer): index_topk below the sequence length, so one-pass
 * rows, the incremental decode and the mixed batch all run past index_topk. */
static void test_dsa_fixtures(void **state)
{
    (void)state;
    assert_true(check_group(&CPU_CFG, "dsa") >= 2);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bf16_fixtures),
                                       cmocka_unit_test(test_quantized_fixtures),
                                       cmocka_unit_test(test_dsa_fixtures)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
