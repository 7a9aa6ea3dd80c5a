/* test_stop_strings.c — stop strings are found off the scheduler thread and still end generation
 * at once (the shipped tiny model on the CPU, its tokenizer).
 *
 * The scheduler only moves ids; the server's reader (server_generate.c) pushes each new id into
 * a text_stream and cancels the request when a stop string appears. Checked here with the same
 * two pieces: driven step by step, a cancel that lands between steps lets no further token be
 * computed and frees every KV block in the next step; with the scheduler's thread running and a
 * reader thread that waits on the request's condition variable as the server's does, at most one
 * token (the step in flight when the cancel came) is computed after it, and none reaches the text:
 * the text is the greedy answer cut just before the stop string.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/log.h"
#include "engine/scheduler.h"
#include "server/text_stream.h"

static char g_model[4096];
static struct tokenizer *g_tok;

enum { MAX_NEW = 48 };

static void open_session(struct model_session *s)
{
    struct session_opts so = {.max_seqs = 4, .max_tokens = 64, .block_size = 16, .max_context = 256};
    struct err err = {0};
    if (model_session_open(s, g_model, &so, &err))
        fail_msg("%s", err.msg);
}

static struct sched_req *make_req(void)
{
    const int32_t prompt[] = {10, 200, 3000, 47, 512, 9};
    struct sched_params sp = {.max_new = MAX_NEW, .ignore_eos = true, .top_logprobs = -1,
                              .sampling = {.temperature = 0, .top_p = 1}};
    struct sched_req *r;
    struct err err = {0};
    if (sched_req_create(&r, prompt, 6, &sp, &err))
        fail_msg("%s", err.msg);
    return r;
}

static bool finished(struct sched_req *r)
{
    pthread_mutex_lock(&r->mu);
    bool f = sched_req_finished(r);
    pthread_mutex_unlock(&r->mu);
    return f;
}

static void init_sched(struct scheduler *sch, struct model_session *s)
{
    struct scheduler_opts o = {.no_prefix_cache = true};
    struct err err = {0};
    if (scheduler_init(sch, s, &o, &err))
        fail_msg("%s", err.msg);
}

static void submit(struct scheduler *sch, struct sched_req *r)
{
    struct err err = {0};
    if (scheduler_submit(sch, r, &err))
        fail_msg("%s", err.msg);
}

/* The whole greedy text of MAX_NEW tokens, and a stop string from its middle: the text of a few
 * bytes that starts past the first 8 tokens' text. */
static char *full_text(struct model_session *s, char *stop, size_t stop_cap)
{
    struct scheduler sch;
    init_sched(&sch, s);
    struct sched_req *r = make_req();
    submit(&sch, r);
    while (!finished(r))
        scheduler_step(&sch);
    assert_int_equal(r->n_out, MAX_NEW);
    struct text_stream ts;
    text_stream_init(&ts, g_tok, NULL, 0);
    struct err err = {0};
    size_t after8 = 0;
    for (int i = 0; i < MAX_NEW; i++) {
        if (text_stream_push(&ts, r->out_ids[i], &err))
            fail_msg("%s", err.msg);
        if (i == 7)
            after8 = ts.len;
    }
    assert_int_equal(text_stream_finish(&ts, &err), STATUS_OK);
    char *all = strdup(ts.text);
    assert_true(strlen(all) > after8 + 8);
    snprintf(stop, stop_cap, "%.4s", all + after8 + 2);
    text_stream_free(&ts);
    sched_req_put(r);
    scheduler_free(&sch);
    return all;
}

static void assert_no_blocks(struct scheduler *sch)
{
    scheduler_step(sch);
    struct scheduler_stats st;
    scheduler_get_stats(sch, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.n_running, 0);
}

/* Between steps: the reader cancels as soon as its text shows the stop; the next step computes
 * nothing for the request and frees its blocks. */
static void test_stop_between_steps(void **state)
{
    (void)state;
    struct model_session s;
    open_session(&s);
    char stop[16];
    char *all = full_text(&s, stop, sizeof stop);
    char *stops[] = {stop};
    struct scheduler sch;
    init_sched(&sch, &s);
    struct sched_req *r = make_req();
    submit(&sch, r);
    struct text_stream ts;
    text_stream_init(&ts, g_tok, stops, 1);
    struct err err = {0};
    int consumed = 0, at_cancel = -1;
    while (!finished(r)) {
        scheduler_step(&sch);
        pthread_mutex_lock(&r->mu);
        int n = r->n_out;
        pthread_mutex_unlock(&r->mu);
        while (consumed < n && !ts.stopped)
            assert_int_equal(text_stream_push(&ts, r->out_ids[consumed++], &err), STATUS_OK);
        if (ts.stopped && at_cancel < 0) {
            at_cancel = n;
            scheduler_cancel(&sch, r);
        }
    }
    assert_true(at_cancel > 0 && at_cancel < MAX_NEW);
    assert_int_equal(r->finish, SCHED_FINISH_CANCELLED);
    assert_int_equal(r->n_out, at_cancel); /* not one token after the cancel */
    assert_no_blocks(&sch);
    char *cut = strndup(all, (size_t)(strstr(all, stop) - all));
    assert_string_equal(ts.text, cut);
    free(cut);
    text_stream_free(&ts);
    sched_req_put(r);
    scheduler_free(&sch);
    free(all);
    model_session_close(&s);
}

struct reader {
    struct scheduler *sch;
    struct sched_req *r;
    struct text_stream ts;
    int at_cancel; /* n_out when the reader cancelled */
};

/* The server's reader: waits for tokens on the request's condition variable, pushes them into its
 * text stream, cancels on a stop string. */
static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    struct sched_req *r = rd->r;
    struct err err = {0};
    int consumed = 0;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (r->n_out == consumed && !sched_req_finished(r))
            pthread_cond_wait(&r->cv, &r->mu);
        int n = r->n_out;
        bool done = sched_req_finished(r);
        pthread_mutex_unlock(&r->mu);
        while (consumed < n && !rd->ts.stopped)
            if (text_stream_push(&rd->ts, r->out_ids[consumed++], &err))
                return NULL;
        if (rd->ts.stopped) {
            pthread_mutex_lock(&r->mu);
            rd->at_cancel = r->n_out;
            pthread_mutex_unlock(&r->mu);
            scheduler_cancel(rd->sch, r);
            return NULL;
        }
        if (done)
            return NULL;
    }
}

static void test_stop_with_threads(void **state)
{
    (void)state;
    struct model_session s;
    open_session(&s);
    char stop[16];
    char *all = full_text(&s, stop, sizeof stop);
    char *stops[] = {stop};
    struct scheduler sch;
    init_sched(&sch, &s);
    struct err err = {0};
    if (scheduler_start(&sch, &err))
        fail_msg("%s", err.msg);
    for (int round = 0; round < 5; round++) {
        struct reader rd = {.sch = &sch, .r = make_req(), .at_cancel = -1};
        text_stream_init(&rd.ts, g_tok, stops, 1);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, reader_main, &rd), 0);
        submit(&sch, rd.r);
        pthread_join(t, NULL);
        pthread_mutex_lock(&rd.r->mu);
        while (!sched_req_finished(rd.r))
            pthread_cond_wait(&rd.r->cv, &rd.r->mu);
        pthread_mutex_unlock(&rd.r->mu);
        assert_true(rd.ts.stopped);
        assert_int_equal(rd.r->finish, SCHED_FINISH_CANCELLED);
        /* the step running when the cancel came may add its token; the next one sees the cancel */
        assert_true(rd.r->n_out - rd.at_cancel <= 1);
        assert_true(rd.r->n_out < MAX_NEW);
        char *cut = strndup(all, (size_t)(strstr(all, stop) - all));
        assert_string_equal(rd.ts.text, cut);
        free(cut);
        text_stream_free(&rd.ts);
        sched_req_put(rd.r);
    }
    scheduler_stop(&sch);
    assert_no_blocks(&sch);
    scheduler_free(&sch);
    free(all);
    model_session_close(&s);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    const char *src = getenv("MOESERVE_SRC");
    snprintf(g_model, sizeof g_model, "%s/models/moeserve-tiny", src ? src : ".");
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_model);
    struct err err = {0};
    if (tokenizer_load(&g_tok, path, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_between_steps),
        cmocka_unit_test(test_stop_with_threads),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tokenizer_free(g_tok);
    return rc;
}
