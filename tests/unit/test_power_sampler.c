/* test_power_sampler.c — the NVML power sampler on whatever machine runs it.
 *
 * Without NVML (a CPU machine) init must fail with STATUS_UNSUPPORTED and a
 * message naming NVML, and every other call must be harmless: bench then
 * prints "n/a". With NVML and a GPU (the GPU machine) a 200 ms phase must
 * give at least two samples, a positive average no larger than the peak, an
 * enforced limit and a percentage consistent with them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "plan/power_sampler.h"

static void test_zeroed_is_harmless(void **state)
{
    (void)state;
    struct power_sampler ps;
    memset(&ps, 0, sizeof ps);
    struct err err = {0};
    assert_int_not_equal(power_sampler_start(&ps, &err), STATUS_OK); /* not initialised: an error, no thread */
    struct power_reading r;
    power_sampler_stop(&ps, &r);
    assert_false(r.valid);
    assert_true(r.pct_of_limit < 0);
    power_sampler_free(&ps);
    power_sampler_free(&ps); /* twice: still safe */
}

static void test_phase(void **state)
{
    (void)state;
    struct power_sampler ps;
    struct err err = {0};
    enum status st = power_sampler_init(&ps, NULL, 20, &err);
    if (st != STATUS_OK) {
        assert_int_equal(st, STATUS_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "NVML"));
        power_sampler_free(&ps);
        skip();
    }
    assert_int_equal(power_sampler_start(&ps, &err), STATUS_OK);
    struct timespec nap = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
    nanosleep(&nap, NULL);
    struct power_reading r;
    power_sampler_stop(&ps, &r);
    assert_true(r.valid);
    assert_true(r.n_samples >= 2);
    assert_true(r.avg_w > 0 && r.avg_w <= r.max_w);
    assert_true(r.seconds >= 0.19);
    if (r.limit_w > 0) {
        double w = r.energy_avg_w >= 0 ? r.energy_avg_w : r.avg_w;
        assert_true(r.pct_of_limit > 0);
        assert_true(r.pct_of_limit - 100.0 * w / r.limit_w < 1e-9 && 100.0 * w / r.limit_w - r.pct_of_limit < 1e-9);
    }
    /* a second phase on the same sampler */
    assert_int_equal(power_sampler_start(&ps, &err), STATUS_OK);
    power_sampler_free(&ps); /* stops the running phase first */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zeroed_is_harmless),
        cmocka_unit_test(test_phase),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
