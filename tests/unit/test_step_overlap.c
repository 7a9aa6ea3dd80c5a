/* test_step_overlap.c — a step's host work beside the device's pass (engine/scheduler.h).
 *
 * The scheduler counts where its steps spend their time (forward_seconds: in the forward;
 * host_seconds: the rest), and where the forward overlaps the device it publishes a step's
 * tokens after launching the next pass (defer_publish). The CPU's forward does not overlap, so
 * the tests turn that on (defer_publish 1) and check on the shipped tiny model: the same tokens,
 * log-probabilities and ends as publishing at once (min_tokens, stop ids, sampling, prompt
 * scoring among them); a reader never sees more than one token held back and sees every token
 * before the end; with the scheduler's thread and readers waiting as the server's do, every
 * stream completes, cancels included, and every KV block comes back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

enum { N_REQ = 8, MAX_NEW = 20 };

struct outcome {
    int32_t ids[N_REQ][MAX_NEW];
    float lp[N_REQ][MAX_NEW];
    int n_out[N_REQ];
    enum sched_finish finish[N_REQ];
};

static void open_session(struct model_session *s)
{
    struct session_opts so = {.max_seqs = 8, .max_tokens = 32, .block_size = 16, .max_context = 128};
    struct err err = {0};
    if (model_session_open(s, g_model, &so, &err))
        fail_msg("%s", err.msg);
}

/* Request i of the mix: greedy with log-probabilities, seeded sampling, min_tokens with a stop id,
 * prompt scoring without generation; prompts long enough that prefill chunks and decode rows mix. */
static struct sched_req *mix_req(int i)
{
    int32_t prompt[40];
    const int n = 3 + 5 * i;
    for (int j = 0; j < n; j++)
        prompt[j] = 10 + (i * 131 + j * 17) % 4000;
    struct sched_params sp = {.max_new = 6 + 2 * i, .ignore_eos = i % 2 == 0, .top_logprobs = i % 3 == 0 ? 2 : -1,
                              .sampling = {.temperature = i % 2 ? 0.9f : 0.0f, .top_p = 0.95f, .seed = (uint64_t)i}};
    if (i == 3) {
        sp.min_new = 3, sp.n_stop_ids = 1, sp.stop_ids[0] = 100;
    } else if (i == 5) {
        sp.prompt_logprobs = true, sp.max_new = 0, sp.top_logprobs = 1;
    }
    struct sched_req *r;
    struct err err = {0};
    if (sched_req_create(&r, prompt, n, &sp, &err))
        fail_msg("%s", err.msg);
    return r;
}

static void run_mix(int defer, struct outcome *o)
{
    struct model_session s;
    open_session(&s);
    struct scheduler sch;
    struct scheduler_opts so = {.defer_publish = defer};
    struct err err = {0};
    if (scheduler_init(&sch, &s, &so, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[N_REQ];
    for (int i = 0; i < N_REQ; i++)
        if (scheduler_submit(&sch, r[i] = mix_req(i), &err))
            fail_msg("%s", err.msg);
    while (scheduler_step(&sch)) {
        for (int i = 0; i < N_REQ; i++) { /* the test is the scheduler's thread here: its fields are readable */
            pthread_mutex_lock(&r[i]->mu);
            const int held = r[i]->n_tokens - r[i]->n_prompt - r[i]->n_out;
            const bool done = sched_req_finished(r[i]);
            pthread_mutex_unlock(&r[i]->mu);
            assert_true(held >= 0 && held <= (defer > 0 && !done ? 1 : 0));
        }
    }
    memset(o, 0, sizeof *o);
    for (int i = 0; i < N_REQ; i++) {
        assert_true(sched_req_finished(r[i]));
        o->n_out[i] = r[i]->n_out;
        o->finish[i] = r[i]->finish;
        memcpy(o->ids[i], r[i]->out_ids, (size_t)r[i]->n_out * sizeof(int32_t));
        if (r[i]->out_logprob)
            memcpy(o->lp[i], r[i]->out_logprob, (size_t)r[i]->n_out * sizeof(float));
        sched_req_put(r[i]);
    }
    struct scheduler_stats st;
    scheduler_get_stats(&sch, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    scheduler_free(&sch);
    model_session_close(&s);
}

static void test_deferred_same_output(void **state)
{
    (void)state;
    static struct outcome now, later;
    run_mix(-1, &now);
    run_mix(1, &later);
    assert_memory_equal(&now, &later, sizeof now);
    assert_int_equal(now.n_out[0], 6);       /* greedy, ignore_eos: all of max_new */
    assert_int_equal(now.finish[5], SCHED_FINISH_LENGTH); /* scored prompt, nothing generated */
    assert_int_equal(now.n_out[5], 0);
    assert_true(now.n_out[3] >= 3);          /* min_tokens held the stop id off */
}

/* Prompt scoring (echo + logprobs) takes every logits row a pass has (max_seqs) for its prompt's
 * rows; a prompt that completes in the same pass wants one more. It waits a pass now (its last
 * row alone); it wrote past the host logits buffer and the logit-row array before (this test
 * crashed, valgrind: writes 0 bytes after both blocks). */
static void test_scoring_beside_prompts(void **state)
{
    (void)state;
    struct model_session s;
    struct session_opts so = {.max_seqs = 4, .max_tokens = 64, .block_size = 16, .max_context = 128};
    struct err err = {0};
    if (model_session_open(&s, g_model, &so, &err))
        fail_msg("%s", err.msg);
    struct scheduler sch;
    if (scheduler_init(&sch, &s, NULL, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[4];
    for (int i = 0; i < 4; i++) {
        int32_t prompt[40];
        const int n = i == 0 ? 40 : 6;
        for (int j = 0; j < n; j++)
            prompt[j] = 10 + (i * 7 + j * 29) % 4000;
        struct sched_params sp = {.max_new = i == 0 ? 0 : 3, .prompt_logprobs = i == 0, .top_logprobs = i == 0 ? 0 : -1,
                                  .prompt_top = i == 0 ? 3 : 0, .ignore_eos = true, .sampling = {.top_p = 1}};
        if (sched_req_create(&r[i], prompt, n, &sp, &err) || scheduler_submit(&sch, r[i], &err))
            fail_msg("%s", err.msg);
    }
    while (scheduler_step(&sch))
        ;
    for (int j = 1; j < 40; j++) /* every prompt token scored: a log-probability, finite and <= 0 */
        assert_true(r[0]->prompt_lp[j] <= 0 && r[0]->prompt_lp[j] > -1e30f);
    /* prompt_top 3 beyond top_logprobs 0: 3 alternatives a position, in order; the token's rank agrees
       with them (as many above it as its rank says, and at its rank when that is within the 3) */
    assert_int_equal(r[0]->prompt_k, 3);
    for (int j = 1; j < 40; j++) {
        const float *t = r[0]->prompt_top_lp + (size_t)j * 3, x = r[0]->prompt_lp[j];
        const int rank = r[0]->prompt_rank[j];
        assert_true(t[0] >= t[1] && t[1] >= t[2] && rank >= 1 && x <= t[0]);
        for (int m = 0; m < 3; m++)
            assert_true(m < rank - 1 ? t[m] > x : t[m] <= x);
        if (rank <= 3)
            assert_int_equal(r[0]->prompt_top_ids[(size_t)j * 3 + rank - 1], r[0]->prompt[j]);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r[i]->finish, SCHED_FINISH_LENGTH);
        assert_int_equal(r[i]->n_out, i == 0 ? 0 : 3);
        sched_req_put(r[i]);
    }
    scheduler_free(&sch);
    model_session_close(&s);
}

struct reader {
    struct sched_req *r;
    struct scheduler *sch;
    int cancel_at;  /* cancel once this many tokens are seen; -1 never */
    int seen;       /* tokens read (all of them by the end) */
};

/* Waits as the server's reader does; checks that tokens only grow and the end comes after them. */
static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    struct sched_req *r = rd->r;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (r->n_out == rd->seen && !sched_req_finished(r))
            pthread_cond_wait(&r->cv, &r->mu);
        rd->seen = r->n_out;
        if (sched_req_finished(r))
            break;
        if (rd->cancel_at >= 0 && rd->seen >= rd->cancel_at) {
            pthread_mutex_unlock(&r->mu);
            scheduler_cancel(rd->sch, r);
            pthread_mutex_lock(&r->mu);
            rd->cancel_at = -1;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void test_deferred_threads(void **state)
{
    (void)state;
    struct model_session s;
    open_session(&s);
    struct scheduler sch;
    struct scheduler_opts so = {.defer_publish = 1};
    struct err err = {0};
    if (scheduler_init(&sch, &s, &so, &err) || scheduler_start(&sch, &err))
        fail_msg("%s", err.msg);
    for (int round = 0; round < 4; round++) {
        struct reader rd[N_REQ];
        pthread_t t[N_REQ];
        for (int i = 0; i < N_REQ; i++) {
            const int32_t prompt[] = {10 + i, 20 + round, 30, 40};
            struct sched_params sp = {.max_new = MAX_NEW, .ignore_eos = true, .top_logprobs = -1,
                                      .sampling = {.temperature = 1, .top_p = 1, .seed = (uint64_t)(i + round)}};
            rd[i] = (struct reader){.sch = &sch, .cancel_at = i % 3 == 1 ? 3 + i : -1};
            if (sched_req_create(&rd[i].r, prompt, 4, &sp, &err))
                fail_msg("%s", err.msg);
            assert_int_equal(pthread_create(&t[i], NULL, reader_main, &rd[i]), 0);
            if (scheduler_submit(&sch, rd[i].r, &err))
                fail_msg("%s", err.msg);
        }
        for (int i = 0; i < N_REQ; i++) {
            pthread_join(t[i], NULL);
            assert_int_equal(rd[i].seen, rd[i].r->n_out); /* every published token was seen before the end */
            if (i % 3 == 1) {
                assert_int_equal(rd[i].r->finish, SCHED_FINISH_CANCELLED);
            } else {
                assert_int_equal(rd[i].r->finish, SCHED_FINISH_LENGTH);
                assert_int_equal(rd[i].seen, MAX_NEW);
            }
            sched_req_put(rd[i].r);
        }
    }
    scheduler_stop(&sch);
    struct scheduler_stats st;
    scheduler_get_stats(&sch, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.n_running, 0);
    scheduler_free(&sch);
    model_session_close(&s);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    const char *src = getenv("MOESERVE_SRC");
    snprintf(g_model, sizeof g_model, "%s/models/moeserve-tiny", src ? src : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counted),
        cmocka_unit_test(test_deferred_same_output),
        cmocka_unit_test(test_deferred_threads),
        cmocka_unit_test(test_scoring_beside_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
