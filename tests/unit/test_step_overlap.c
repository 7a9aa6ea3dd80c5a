/* test_step_times.c — the scheduler counts where its steps spend their time (forward_seconds:
 * in forward_run; host_seconds: the rest of a step), the figures behind overlapping the next
 * step's host work with the device's pass. Checked on the shipped tiny model (CPU): both grow
 * with steps, and together they stay within the steps' wall time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "base/log.h"
#include "base/timer.h"
#include "engine/scheduler.h"

static char g_model[4096];

static void test_counted(void **state)
{
    (void)state;
    struct model_session s;
    struct session_opts so = {.max_seqs = 8, .max_tokens = 64, .block_size = 16, .max_context = 128};
    struct err err = {0};
    if (model_session_open(&s, g_model, &so, &err))
        fail_msg("%s", err.msg);
    struct scheduler sch;
    if (scheduler_init(&sch, &s, NULL, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[8];
    for (int i = 0; i < 8; i++) {
        const int32_t prompt[] = {10 + i, 20, 30, 40};
        struct sched_params sp = {.max_new = 16, .ignore_eos = true, .top_logprobs = -1,
                                  .sampling = {.temperature = 1, .top_p = 1, .seed = (uint64_t)i}};
        if (sched_req_create(&r[i], prompt, 4, &sp, &err) || scheduler_submit(&sch, r[i], &err))
            fail_msg("%s", err.msg);
    }
    const double t0 = timer_now();
    while (scheduler_step(&sch))
        ;
    const double wall = timer_now() - t0;
    struct scheduler_stats st;
    scheduler_get_stats(&sch, &st);
    assert_true(st.n_steps >= 16);
    assert_true(st.forward_seconds > 0);
    assert_true(st.host_seconds > 0);
    assert_true(st.forward_seconds + st.host_seconds <= wall);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(r[i]->n_out, 16);
        sched_req_put(r[i]);
    }
    scheduler_free(&sch);
    model_session_close(&s);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    const char *src = getenv("MOESERVE_SRC");
    snprintf(g_model, sizeof g_model, "%s/models/moeserve-tiny", src ? src : ".");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_counted)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
