/* test_options.c — the environment snapshot (base/options.h): values taken, bad values refused
 * with a message naming the variable, unset variables leaving the defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"

static void read_with(const char *name, const char *value, enum status want, struct options *o, struct err *e)
{
    setenv(name, value, 1);
    assert_int_equal(options_read(o, e), want);
    unsetenv(name);
}

static void test_attn_splits(void **state)
{
    (void)state;
    struct options o;
    struct err e = {0};
    unsetenv("MOESERVE_ATTN_SPLITS");
    assert_int_equal(options_read(&o, &e), STATUS_OK);
    assert_false(o.attn_splits_none);
    assert_int_equal(o.attn_splits, 0);
    read_with("MOESERVE_ATTN_SPLITS", "none", STATUS_OK, &o, &e);
    assert_true(o.attn_splits_none);
    assert_int_equal(o.attn_splits, 0);
    read_with("MOESERVE_ATTN_SPLITS", "16", STATUS_OK, &o, &e);
    assert_false(o.attn_splits_none);
    assert_int_equal(o.attn_splits, 16);
    read_with("MOESERVE_ATTN_SPLITS", "64", STATUS_OK, &o, &e);
    assert_int_equal(o.attn_splits, 64);
    const char *bad[] = {"0", "65", "-3", "12x", "all"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        read_with("MOESERVE_ATTN_SPLITS", bad[i], STATUS_INVALID, &o, &e);
        assert_non_null(strstr(e.msg, "MOESERVE_ATTN_SPLITS"));
        assert_non_null(strstr(e.msg, bad[i]));
    }
}

static void test_smem_budget(void **state)
{
    (void)state;
    struct options o;
    struct err e = {0};
    read_with("MOESERVE_SMEM_BUDGET", "101376", STATUS_OK, &o, &e);
    assert_int_equal(o.smem_budget, 101376);
    read_with("MOESERVE_SMEM_BUDGET", "12", STATUS_INVALID, &o, &e);
    assert_non_null(strstr(e.msg, "MOESERVE_SMEM_BUDGET"));
    assert_int_equal(options_read(&o, &e), STATUS_OK);
    assert_int_equal(o.smem_budget, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_splits),
        cmocka_unit_test(test_smem_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
