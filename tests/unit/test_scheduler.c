/* test_scheduler.c — continuous batching over the shipped tiny model (CPU).
 *
 * Driven step by step without the thread (scheduler_step), except one test
 * that runs the thread. Checks: a greedy request gives the same tokens alone
 * and with 31 neighbours (mixed prefill/decode, sampled neighbours); a KV
 * cache far too small for the load queues and preempts yet every request ends
 * with the tokens it gets alone; cancellation frees blocks in the next step;
 * the prefix cache serves a repeated prefix and changes no output; a full
 * queue refuses; deadlines end requests; the KV blocks in use return to 0.
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

static void open_session_mode(struct model_session *s, int max_seqs, int max_tokens, int kv_blocks, bool invariant)
{
    /* kv blocks = ceil(max_context / 16) * max_seqs (model_session sizes the cache so) */
    struct session_opts so = {.max_seqs = max_seqs, .max_tokens = max_tokens, .block_size = 16,
                              .max_context = kv_blocks / max_seqs * 16, .batch_invariant = invariant};
    struct err err = {0};
    if (model_session_open(s, g_model, &so, &err))
        fail_msg("%s", err.msg);
}

static void open_session(struct model_session *s, int max_seqs, int max_tokens, int kv_blocks)
{
    open_session_mode(s, max_seqs, max_tokens, kv_blocks, false);
}

static int32_t *prompt_of(int seed, int n)
{
    int32_t *p = malloc((size_t)n * sizeof *p);
    uint32_t x = (uint32_t)seed * 2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = 10 + (int32_t)((x >> 8) % 4000);
    }
    return p;
}

static struct sched_req *make_req(int seed, int n_prompt, int max_new, float temperature)
{
    int32_t *p = prompt_of(seed, n_prompt);
    /* log-probabilities of greedy requests show whether the numbers (not only the argmax) match */
    struct sched_params sp = {.max_new = max_new, .ignore_eos = true, .top_logprobs = temperature == 0 ? 0 : -1,
                              .sampling = {.temperature = temperature, .top_p = 1, .seed = (uint64_t)seed}};
    struct sched_req *r;
    struct err err = {0};
    if (sched_req_create(&r, p, n_prompt, &sp, &err))
        fail_msg("%s", err.msg);
    free(p);
    return r;
}

static bool all_done(struct sched_req **r, int n)
{
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&r[i]->mu);
        bool f = sched_req_finished(r[i]);
        pthread_mutex_unlock(&r[i]->mu);
        if (!f)
            return false;
    }
    return true;
}

static void run_all(struct scheduler *sch, struct sched_req **r, int n)
{
    for (int steps = 0; !all_done(r, n); steps++) {
        assert_true(steps < 100000);
        scheduler_step(sch);
    }
}

static void submit(struct scheduler *sch, struct sched_req *r)
{
    struct err err = {0};
    if (scheduler_submit(sch, r, &err))
        fail_msg("%s", err.msg);
}

static void assert_no_blocks_in_use(struct scheduler *sch)
{
    scheduler_step(sch); /* publishes stats */
    struct scheduler_stats st;
    scheduler_get_stats(sch, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.n_running, 0);
    assert_int_equal(st.n_waiting, 0);
    assert_int_equal(sch->s->kv.n_free + st.kv_blocks_cached, sch->s->kv.n_blocks);
}

/* Greedy tokens of one request run alone, prefix cache off. */
static float g_alone_lp[64];

static void run_alone(struct model_session *s, int max_context, int seed, int n_prompt, int max_new, int32_t *out)
{
    struct scheduler sch;
    struct scheduler_opts o = {.no_prefix_cache = true, .max_context = max_context};
    struct err err = {0};
    if (scheduler_init(&sch, s, &o, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r = make_req(seed, n_prompt, max_new, 0);
    submit(&sch, r);
    run_all(&sch, &r, 1);
    assert_int_equal(r->finish, SCHED_FINISH_LENGTH);
    assert_int_equal(r->n_out, max_new);
    memcpy(out, r->out_ids, (size_t)max_new * sizeof *out);
    if (max_new <= 64)
        memcpy(g_alone_lp, r->out_logprob, (size_t)max_new * sizeof(float));
    sched_req_put(r);
    scheduler_free(&sch);
}

/* The same greedy request alone and among 31 neighbours: identical tokens always; with the
 * batch-invariant CPU backend also identical log-probabilities, bit for bit. */
static void run_alone_vs_31(bool invariant)
{
    struct model_session s;
    open_session_mode(&s, 32, 128, 32 * 16, invariant);
    enum { NEW = 24 };
    int32_t alone[NEW];
    run_alone(&s, 0, 7, 37, NEW, alone);
    for (int cache = 0; cache < 2; cache++) {
        struct scheduler sch;
        struct scheduler_opts o = {.no_prefix_cache = !cache};
        struct err err = {0};
        if (scheduler_init(&sch, &s, &o, &err))
            fail_msg("%s", err.msg);
        struct sched_req *r[32];
        /* neighbours first, so the request under test lands in batches that
         * mix other prompts' chunks with decodes */
        for (int i = 1; i < 32; i++) {
            r[i] = make_req(100 + i, 5 + 7 * i, 8 + i % 20, i % 3 ? 0.8f : 0.0f);
            submit(&sch, r[i]);
        }
        scheduler_step(&sch);
        r[0] = make_req(7, 37, NEW, 0);
        submit(&sch, r[0]);
        run_all(&sch, r, 32);
        assert_int_equal(r[0]->n_out, NEW);
        for (int i = 0; i < NEW; i++)
            if (r[0]->out_ids[i] != alone[i])
                fail_msg("prefix cache %d: token %d is %d with neighbours, %d alone", cache, i, r[0]->out_ids[i],
                         alone[i]);
        float worst = 0;
        for (int i = 0; i < NEW; i++) {
            float d = r[0]->out_logprob[i] - g_alone_lp[i];
            worst = d < 0 ? (d < -worst ? -d : worst) : (d > worst ? d : worst);
        }
        /* default mode, informative: the CPU GEMM sums in another order for batches of more than 8 rows */
        printf("%s, prefix cache %d: greedy tokens identical; max |logprob difference| alone vs 31 neighbours "
               "%.3g\n",
               invariant ? "batch-invariant" : "default", cache, (double)worst);
        if (invariant && worst != 0.0f)
            fail_msg("batch-invariant backend: log-probabilities differ by %g alone vs with neighbours",
                     (double)worst);
        for (int i = 0; i < 32; i++)
            sched_req_put(r[i]);
        assert_no_blocks_in_use(&sch);
        scheduler_free(&sch);
    }
    model_session_close(&s);
}

static void test_alone_vs_31_neighbours(void **state)
{
    (void)state;
    run_alone_vs_31(false);
}

static void test_alone_vs_31_batch_invariant(void **state)
{
    (void)state;
    run_alone_vs_31(true);
}

static void test_kv_exhaustion_preempts(void **state)
{
    (void)state;
    struct model_session s;
    /* 24 blocks of 16 = 384 tokens for 8 sequences of up to 100 tokens */
    open_session(&s, 8, 64, 24);
    assert_int_equal(s.kv.n_blocks, 24);
    enum { N = 10, PROMPT = 30, NEW = 40 };
    int32_t want[N][NEW];
    for (int i = 0; i < N; i++)
        run_alone(&s, 128, 500 + i, PROMPT + i, NEW, want[i]);
    struct scheduler sch;
    struct scheduler_opts o = {.max_context = 128};
    struct err err = {0};
    if (scheduler_init(&sch, &s, &o, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[N];
    for (int i = 0; i < N; i++) {
        r[i] = make_req(500 + i, PROMPT + i, NEW, 0);
        submit(&sch, r[i]);
    }
    run_all(&sch, r, N);
    struct scheduler_stats st;
    scheduler_get_stats(&sch, &st);
    assert_true(st.n_preemptions > 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(r[i]->finish, SCHED_FINISH_LENGTH);
        assert_memory_equal(r[i]->out_ids, want[i], sizeof want[i]);
        sched_req_put(r[i]);
    }
    assert_no_blocks_in_use(&sch);
    scheduler_free(&sch);
    model_session_close(&s);
}

static void test_cancel_frees_blocks(void **state)
{
    (void)state;
    struct model_session s;
    open_session(&s, 4, 64, 64);
    struct scheduler sch;
    struct err err = {0};
    if (scheduler_init(&sch, &s, NULL, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[4];
    for (int i = 0; i < 4; i++) {
        r[i] = make_req(900 + i, 30, 200, 0.5f);
        submit(&sch, r[i]);
    }
    for (int i = 0; i < 4; i++)
        scheduler_step(&sch);
    struct scheduler_stats before, after;
    scheduler_get_stats(&sch, &before);
    assert_int_equal(before.n_running, 4);
    scheduler_cancel(&sch, r[1]);
    scheduler_cancel(&sch, r[2]);
    scheduler_step(&sch);
    scheduler_get_stats(&sch, &after);
    assert_int_equal(after.n_running, 2);
    assert_true(after.kv_blocks_used < before.kv_blocks_used);
    assert_int_equal(r[1]->finish, SCHED_FINISH_CANCELLED);
    scheduler_cancel(&sch, r[0]);
    scheduler_cancel(&sch, r[3]);
    run_all(&sch, r, 4);
    for (int i = 0; i < 4; i++)
        sched_req_put(r[i]);
    assert_no_blocks_in_use(&sch);
    scheduler_free(&sch);
    model_session_close(&s);
}

static void test_prefix_cache_reuse(void **state)
{
    (void)state;
    struct model_session s;
    open_session(&s, 4, 64, 64);
    enum { NEW = 12 };
    int32_t alone[NEW];
    run_alone(&s, 0, 77, 150, NEW, alone);
    struct scheduler sch;
    struct err err = {0};
    if (scheduler_init(&sch, &s, NULL, &err))
        fail_msg("%s", err.msg);
    for (int rep = 0; rep < 3; rep++) {
        struct sched_req *r = make_req(77, 150, NEW, 0);
        submit(&sch, r);
        run_all(&sch, &r, 1);
        /* first: nothing cached; then 9 full blocks (144 tokens) of 150 */
        assert_int_equal(r->n_cached, rep == 0 ? 0 : 144);
        assert_memory_equal(r->out_ids, alone, sizeof alone);
        sched_req_put(r);
    }
    /* a prompt that is exactly the cached tokens still computes its last token */
    struct sched_req *r = make_req(77, 144, 4, 0);
    submit(&sch, r);
    run_all(&sch, &r, 1);
    assert_int_equal(r->n_cached, 128);
    sched_req_put(r);
    struct scheduler_stats st;
    scheduler_get_stats(&sch, &st);
    assert_int_equal(st.prompt_tokens_cached, 144 * 2 + 128);
    assert_no_blocks_in_use(&sch);
    scheduler_free(&sch);
    model_session_close(&s);
}

static void test_queue_bound_deadline_logprobs(void **state)
{
    (void)state;
    struct model_session s;
    open_session(&s, 2, 64, 32);
    struct scheduler sch;
    struct scheduler_opts o = {.max_queue = 2};
    struct err err = {0};
    if (scheduler_init(&sch, &s, &o, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[3];
    for (int i = 0; i < 3; i++)
        r[i] = make_req(i, 10, 4, 0);
    submit(&sch, r[0]);
    submit(&sch, r[1]);
    assert_int_equal(scheduler_submit(&sch, r[2], &err), STATUS_NOMEM);
    assert_non_null(strstr(err.msg, "queue is full"));
    /* too long for the context: refused at submit */
    struct sched_req *big = make_req(3, 200, 400, 0);
    assert_int_equal(scheduler_submit(&sch, big, &err), STATUS_INVALID);
    sched_req_put(big);
    run_all(&sch, r, 2);
    /* a request whose deadline passed ends without tokens */
    struct sched_req *late = make_req(4, 10, 4, 0);
    late->p.deadline = timer_now() - 1;
    submit(&sch, late);
    run_all(&sch, &late, 1);
    assert_int_equal(late->finish, SCHED_FINISH_TIMEOUT);
    assert_int_equal(late->n_out, 0);
    sched_req_put(late);
    /* log-probabilities: the greedy token is the most likely one */
    int32_t *p = prompt_of(5, 12);
    struct sched_params sp = {.max_new = 3, .top_logprobs = 5, .sampling = {.top_p = 1}, .ignore_eos = true};
    struct sched_req *lp;
    assert_int_equal(sched_req_create(&lp, p, 12, &sp, &err), STATUS_OK);
    free(p);
    submit(&sch, lp);
    run_all(&sch, &lp, 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(lp->out_top_ids[i * 5], lp->out_ids[i]);
        assert_true(lp->out_logprob[i] <= 0 && lp->out_logprob[i] == lp->out_top_lp[i * 5]);
        for (int j = 1; j < 5; j++)
            assert_true(lp->out_top_lp[i * 5 + j] <= lp->out_top_lp[i * 5 + j - 1]);
    }
    sched_req_put(lp);
    for (int i = 0; i < 3; i++)
        sched_req_put(r[i]);
    assert_no_blocks_in_use(&sch);
    scheduler_free(&sch);
    model_session_close(&s);
}

static void test_thread(void **state)
{
    (void)state;
    struct model_session s;
    open_session(&s, 4, 64, 64);
    struct scheduler sch;
    struct err err = {0};
    if (scheduler_init(&sch, &s, NULL, &err) || scheduler_start(&sch, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[6];
    for (int i = 0; i < 6; i++) {
        r[i] = make_req(40 + i, 20, 10, 0);
        submit(&sch, r[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_mutex_lock(&r[i]->mu);
        while (!sched_req_finished(r[i]))
            pthread_cond_wait(&r[i]->cv, &r[i]->mu);
        pthread_mutex_unlock(&r[i]->mu);
        assert_int_equal(r[i]->n_out, 10);
    }
    /* a request left running is cancelled by stop */
    struct sched_req *left = make_req(50, 20, 200, 0);
    submit(&sch, left);
    scheduler_stop(&sch);
    assert_int_equal(left->finish, SCHED_FINISH_CANCELLED);
    sched_req_put(left);
    for (int i = 0; i < 6; i++)
        sched_req_put(r[i]);
    assert_no_blocks_in_use(&sch);
    scheduler_free(&sch);
    model_session_close(&s);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    const char *src = getenv("MOESERVE_SRC");
    snprintf(g_model, sizeof g_model, "%s/models/moeserve-tiny", src ? src : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_vs_31_neighbours), cmocka_unit_test(test_alone_vs_31_batch_invariant),
        cmocka_unit_test(test_kv_exhaustion_preempts),
        cmocka_unit_test(test_cancel_frees_blocks),    cmocka_unit_test(test_prefix_cache_reuse),
        cmocka_unit_test(test_queue_bound_deadline_logprobs), cmocka_unit_test(test_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
