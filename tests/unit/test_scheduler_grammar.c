/* test_scheduler_grammar.c — grammar-constrained requests through the scheduler (tiny model, its
 * tokenizer): every answer parses as JSON and fits its schema, ends with SCHED_FINISH_STOP when the
 * grammar is complete (the end-of-sequence id is not published), max_new still cuts; under a KV
 * cache too small for the load (preemption and recomputation), each request's tokens equal the
 * same request run alone (batch-invariant CPU backend): the matcher's state survives preemption.
 * Where the backend draws tokens itself (the CUDA backend's sample op), the masks go to it with
 * the rows (forward_batch.masks): a host stand-in for that op, drawing greedily among the
 * allowed ids, must give the host path's tokens exactly, and sampled answers still fit. The
 * logit processors (penalties, logit_bias, min_tokens) go to such a backend as edits, applied by
 * its logits_edit op (the CPU backend's here): greedy tokens equal the host path's too, and so do the
 * log-probabilities the backend computes beside the logits (its logprobs op).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "base/json.h"
#include "base/log.h"
#include "engine/grammar_json.h"
#include "engine/scheduler.h"
#include "engine/token_mask.h"
#include "format/tokenizer.h"

static char g_src[4096];

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"n\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"yy\"]},\"maxItems\":2},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"n\",\"tags\",\"ok\"],\"additionalProperties\":false}";

struct fixture {
    struct model_session s;
    struct tokenizer *tok;
    struct token_vocab tv;
    struct grammar *g;
};

static void fixture_open(struct fixture *f, int max_seqs, int kv_blocks)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/models/moeserve-tiny", g_src);
    struct session_opts so = {.max_seqs = max_seqs, .max_tokens = 64, .block_size = 16,
                              .max_context = kv_blocks / max_seqs * 16, .batch_invariant = true};
    struct err err = {0};
    if (model_session_open(&f->s, path, &so, &err))
        fail_msg("%s", err.msg);
    snprintf(path, sizeof path, "%s/models/moeserve-tiny/tokenizer.json", g_src);
    assert_int_equal(tokenizer_load(&f->tok, path, &err), STATUS_OK);
    int32_t eos[8];
    for (int i = 0; i < f->s.desc.n_eos; i++)
        eos[i] = f->s.desc.eos_ids[i];
    assert_int_equal(token_vocab_init(&f->tv, f->tok, eos, f->s.desc.n_eos, &err), STATUS_OK);
    assert_int_equal(grammar_json_compile_text(SCHEMA, strlen(SCHEMA), NULL, &f->g, &err), STATUS_OK);
}

static void fixture_close(struct fixture *f)
{
    grammar_put(f->g);
    token_vocab_free(&f->tv);
    tokenizer_free(f->tok);
    model_session_close(&f->s);
}

static struct sched_req *make_req(struct fixture *f, int seed, int n_prompt, int max_new)
{
    int32_t p[64];
    uint32_t x = (uint32_t)seed * 2654435761u + 7u;
    for (int i = 0; i < n_prompt; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = 10 + (int32_t)((x >> 8) % 4000);
    }
    struct sched_params sp = {.max_new = max_new, .top_logprobs = -1, .grammar = f->g, .grammar_vocab = &f->tv,
                              .sampling = {.temperature = 1.0f, .top_p = 1, .seed = (uint64_t)seed}};
    struct sched_req *r = NULL;
    struct err err = {0};
    if (sched_req_create(&r, p, n_prompt, &sp, &err))
        fail_msg("%s", err.msg);
    return r;
}

static void run(struct scheduler *sch, struct sched_req **r, int n)
{
    struct err err = {0};
    for (int i = 0; i < n; i++)
        if (scheduler_submit(sch, r[i], &err))
            fail_msg("%s", err.msg);
    for (int steps = 0;; steps++) {
        assert_true(steps < 100000);
        bool done = true;
        for (int i = 0; i < n; i++) {
            pthread_mutex_lock(&r[i]->mu);
            done &= sched_req_finished(r[i]);
            pthread_mutex_unlock(&r[i]->mu);
        }
        if (done)
            break;
        scheduler_step(sch);
    }
}

/* The answer's text parses and has the schema's required keys with the right types. */
static void check_answer(struct fixture *f, const struct sched_req *r)
{
    assert_int_equal(r->finish, SCHED_FINISH_STOP);
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(tokenizer_decode(f->tok, r->out_ids, (size_t)r->n_out, false, &text, &n, NULL), STATUS_OK);
    struct json *j = NULL;
    struct err err = {0};
    if (json_parse(text, n, "answer", &j, &err))
        fail_msg("not JSON (%s): %s", err.msg, text);
    assert_true(json_is_string(json_get(j, "name")) && strlen(json_string(json_get(j, "name"))) <= 8 * 4);
    assert_true(json_is_number(json_get(j, "n")));
    assert_true(json_is_array(json_get(j, "tags")) && json_array_size(json_get(j, "tags")) <= 2);
    assert_true(json_is_bool(json_get(j, "ok")));
    json_free(j);
    free(text);
}

static void test_answers_fit(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, 8, 512);
    struct scheduler sch;
    struct scheduler_opts o = {.max_context = 512};
    struct err err = {0};
    if (scheduler_init(&sch, &f.s, &o, &err))
        fail_msg("%s", err.msg);
    enum { N = 8 };
    struct sched_req *r[N];
    for (int i = 0; i < N; i++)
        r[i] = make_req(&f, 100 + i, 12 + i, 400);
    run(&sch, r, N);
    for (int i = 0; i < N; i++) {
        check_answer(&f, r[i]);
        sched_req_put(r[i]);
    }
    /* max_new still cuts a grammar short: LENGTH, a live prefix */
    struct sched_req *c = make_req(&f, 7, 10, 3);
    run(&sch, &c, 1);
    assert_int_equal(c->finish, SCHED_FINISH_LENGTH);
    assert_int_equal(c->n_out, 3);
    sched_req_put(c);
    scheduler_free(&sch);
    fixture_close(&f);
}

static void test_preemption_keeps_state(void **state)
{
    (void)state;
    enum { N = 8, NEW = 200 };
    int32_t want[N][NEW];
    int want_n[N];
    struct fixture f;
    /* alone: a roomy cache */
    fixture_open(&f, 8, 512);
    for (int i = 0; i < N; i++) {
        struct scheduler sch;
        struct scheduler_opts o = {.max_context = 256, .no_prefix_cache = true};
        struct err err = {0};
        if (scheduler_init(&sch, &f.s, &o, &err))
            fail_msg("%s", err.msg);
        struct sched_req *r = make_req(&f, 300 + i, 20 + i, NEW);
        run(&sch, &r, 1);
        want_n[i] = r->n_out;
        memcpy(want[i], r->out_ids, (size_t)r->n_out * sizeof *r->out_ids);
        sched_req_put(r);
        scheduler_free(&sch);
    }
    fixture_close(&f);
    /* together in 24 blocks of 16 tokens: preempted and recomputed */
    fixture_open(&f, 8, 24);
    struct scheduler sch;
    struct scheduler_opts o = {.max_context = 256};
    struct err err = {0};
    if (scheduler_init(&sch, &f.s, &o, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[N];
    for (int i = 0; i < N; i++)
        r[i] = make_req(&f, 300 + i, 20 + i, NEW);
    run(&sch, r, N);
    struct scheduler_stats st;
    scheduler_get_stats(&sch, &st);
    assert_true(st.n_preemptions > 0);
    int stops = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(r[i]->n_out, want_n[i]);
        assert_memory_equal(r[i]->out_ids, want[i], (size_t)want_n[i] * sizeof *r[i]->out_ids);
        if (r[i]->finish == SCHED_FINISH_STOP) {
            check_answer(&f, r[i]);
            stops++;
        }
        sched_req_put(r[i]);
    }
    print_message("  %d of %d answers complete within %d tokens, %llu preemptions\n", stops, N, NEW,
                  (unsigned long long)st.n_preemptions);
    assert_true(stops >= N / 2);
    scheduler_free(&sch);
    fixture_close(&f);
}

/* A host stand-in for a backend's sample op (CPU memory is the backend's): the argmax among the
 * row's allowed ids at T = 0; else the id where u * mass falls, walking the allowed ids in order
 * under softmax(l / T) (top-k / top-p left to the CUDA op test). Counts the masked rows it saw. */
static int g_masked_rows, g_sample_calls;

static void stand_in_sample(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
                            const uint32_t *masks, int32_t *ids)
{
    (void)be;
    g_sample_calls++;
    const int words = (vocab + 31) / 32;
    for (int r = 0; r < rows; r++) {
        const float *l = logits + (size_t)r * vocab;
        const uint32_t *m = masks && params[r].mask > 0 ? masks + (size_t)(params[r].mask - 1) * words : NULL;
        g_masked_rows += m != NULL;
        int best = -1;
        for (int i = 0; i < vocab; i++)
            if ((!m || (m[i >> 5] >> (i & 31) & 1u)) && (best < 0 || l[i] > l[best]))
                best = i;
        ids[r] = best;
        if (best < 0 || !(params[r].temperature > 0))
            continue;
        double mass = 0;
        for (int i = 0; i < vocab; i++)
            if (!m || (m[i >> 5] >> (i & 31) & 1u))
                mass += exp(((double)l[i] - l[best]) / params[r].temperature);
        double acc = 0, target = params[r].u * mass;
        for (int i = 0; i < vocab; i++)
            if (!m || (m[i >> 5] >> (i & 31) & 1u))
                if ((acc += exp(((double)l[i] - l[best]) / params[r].temperature)) > target) {
                    ids[r] = i;
                    break;
                }
    }
}

/* The CPU backend's logits_edit, counting the edits it applies. */
static void (*g_cpu_edit)(struct backend *, float *, int, int, const int32_t *, const struct logit_edit *);
static long g_edits;

static void counting_edit(struct backend *be, float *logits, int rows, int vocab, const int32_t *start,
                          const struct logit_edit *edits)
{
    g_edits += start[rows] - start[0];
    g_cpu_edit(be, logits, rows, vocab, start, edits);
}

/* The CPU backend's logprobs, counted. */
static void (*g_cpu_lp)(struct backend *, const float *, int, int, const struct sample_row *, const uint32_t *,
                        const int32_t *, int, float *, int32_t *, float *);
static long g_lp_rows;

static void counting_logprobs(struct backend *be, const float *logits, int rows, int vocab,
                              const struct sample_row *params, const uint32_t *masks, const int32_t *ids, int k,
                              float *lp, int32_t *top_ids, float *top_lp)
{
    g_lp_rows += rows;
    g_cpu_lp(be, logits, rows, vocab, params, masks, ids, k, lp, top_ids, top_lp);
}

/* The stand-in backend: the CPU backend's ops with the stand-in sample op and the counting edit and
 * log-probability ops; returns the host's ops, to put back. */
static const struct backend_ops *stand_in_install(struct fixture *f, struct backend_ops *ops)
{
    const struct backend_ops *host = f->s.be.ops;
    *ops = *host;
    ops->sample = stand_in_sample;
    g_cpu_edit = host->logits_edit;
    ops->logits_edit = counting_edit;
    g_cpu_lp = host->logprobs;
    ops->logprobs = counting_logprobs;
    f->s.be.ops = ops;
    return host;
}

static void sched_open(struct fixture *f, struct scheduler *sch)
{
    struct scheduler_opts o = {.max_context = 512, .no_prefix_cache = true};
    struct err err = {0};
    if (scheduler_init(sch, &f->s, &o, &err))
        fail_msg("%s", err.msg);
}

/* Runs N greedy grammar requests (then N sampled ones when sampled) with or without the stand-in
 * sample op; out receives the greedy requests' tokens. */
static void run_masked(struct fixture *f, bool device, int32_t (*out)[400], int *out_n, bool sampled)
{
    struct backend_ops ops;
    const struct backend_ops *host_ops = device ? stand_in_install(f, &ops) : f->s.be.ops;
    struct scheduler sch;
    sched_open(f, &sch);
    enum { N = 6 };
    struct sched_req *r[N];
    for (int i = 0; i < N; i++) {
        r[i] = make_req(f, 500 + i, 8 + 3 * i, 400);
        r[i]->p.sampling.temperature = 0.0f;
    }
    run(&sch, r, N);
    for (int i = 0; i < N; i++) {
        out_n[i] = r[i]->n_out;
        memcpy(out[i], r[i]->out_ids, (size_t)r[i]->n_out * sizeof *r[i]->out_ids);
        if (r[i]->finish == SCHED_FINISH_STOP)
            check_answer(f, r[i]);
        sched_req_put(r[i]);
    }
    if (sampled) {
        for (int i = 0; i < N; i++)
            r[i] = make_req(f, 600 + i, 8 + 3 * i, 400);
        run(&sch, r, N);
        for (int i = 0; i < N; i++) {
            check_answer(f, r[i]);
            sched_req_put(r[i]);
        }
    }
    scheduler_free(&sch);
    f->s.be.ops = host_ops;
}

static void test_device_masks(void **state)
{
    (void)state;
    static int32_t host[6][400], dev[6][400];
    int host_n[6], dev_n[6];
    struct fixture f;
    fixture_open(&f, 8, 512);
    run_masked(&f, false, host, host_n, false);
    assert_int_equal(g_sample_calls, 0);
    run_masked(&f, true, dev, dev_n, true);
    print_message("  stand-in sample op: %d calls, %d masked rows\n", g_sample_calls, g_masked_rows);
    assert_true(g_masked_rows > 0);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(dev_n[i], host_n[i]);
        assert_memory_equal(dev[i], host[i], (size_t)host_n[i] * sizeof host[i][0]);
    }
    fixture_close(&f);
}

/* Greedy requests with every logit processor and min_tokens, no grammar, some with log-probabilities
 * (3 likeliest): host path and stand-in; lp receives each token's log-probability and its top 3. */
static void run_edits(struct fixture *f, bool device, int32_t (*out)[64], int *out_n, float (*lp)[64 * 4],
                      int32_t (*top)[64 * 3])
{
    struct backend_ops ops;
    const struct backend_ops *host_ops = device ? stand_in_install(f, &ops) : f->s.be.ops;
    struct scheduler sch;
    sched_open(f, &sch);
    struct err err = {0};
    assert_true(!device || forward_edit_capacity(&f->s.fwd) > 0);
    enum { N = 5 };
    struct sched_req *r[N];
    for (int i = 0; i < N; i++) {
        int32_t p[40];
        for (int k = 0; k < 10 + 6 * i; k++)
            p[k] = 20 + (k * 7 + i) % 30; /* repeated ids: the repetition penalty bites */
        struct sched_params sp = {.max_new = 48, .min_new = 12 + 4 * i, .top_logprobs = i % 2 ? 3 : -1, .n_stop_ids = 1,
                                  .stop_ids = {f->s.desc.eos_ids[0] + 1 + i},
                                  .sampling = {.top_p = 1, .repetition_penalty = 1.0f + 0.2f * (float)i,
                                               .frequency_penalty = 0.3f * (float)(i % 3), .presence_penalty = 0.25f,
                                               .n_bias = 2, .bias_ids = {25, 100 + i}, .bias = {3.0f, -2.0f}}};
        if (sched_req_create(&r[i], p, 10 + 6 * i, &sp, &err))
            fail_msg("%s", err.msg);
    }
    run(&sch, r, N);
    for (int i = 0; i < N; i++) {
        assert_true(r[i]->n_out >= r[i]->p.min_new || r[i]->finish == SCHED_FINISH_LENGTH);
        out_n[i] = r[i]->n_out;
        memcpy(out[i], r[i]->out_ids, (size_t)r[i]->n_out * sizeof *r[i]->out_ids);
        for (int t = 0; r[i]->out_logprob && t < r[i]->n_out; t++) {
            lp[i][4 * t] = r[i]->out_logprob[t];
            for (int q = 0; q < 3; q++) {
                lp[i][4 * t + 1 + q] = r[i]->out_top_lp[3 * t + q];
                top[i][3 * t + q] = r[i]->out_top_ids[3 * t + q];
            }
        }
        sched_req_put(r[i]);
    }
    scheduler_free(&sch);
    f->s.be.ops = host_ops;
}

static void test_device_edits(void **state)
{
    (void)state;
    static int32_t host[5][64], dev[5][64], host_top[5][64 * 3], dev_top[5][64 * 3];
    static float host_lp[5][64 * 4], dev_lp[5][64 * 4];
    int host_n[5], dev_n[5];
    struct fixture f;
    fixture_open(&f, 8, 512);
    g_sample_calls = 0;
    run_edits(&f, false, host, host_n, host_lp, host_top);
    assert_int_equal(g_sample_calls, 0);
    run_edits(&f, true, dev, dev_n, dev_lp, dev_top);
    print_message("  stand-in sample op: %d calls, %ld logit edits applied, %ld rows' log-probabilities\n",
                  g_sample_calls, g_edits, g_lp_rows);
    assert_true(g_sample_calls > 0 && g_edits > 0 && g_lp_rows > 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(dev_n[i], host_n[i]);
        assert_memory_equal(dev[i], host[i], (size_t)host_n[i] * sizeof host[i][0]);
        if (i % 2) { /* log-probabilities after the processors, as the host computes them */
            assert_memory_equal(dev_lp[i], host_lp[i], (size_t)host_n[i] * 4 * sizeof(float));
            assert_memory_equal(dev_top[i], host_top[i], (size_t)host_n[i] * 3 * sizeof(int32_t));
        }
    }
    fixture_close(&f);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    const char *src = getenv("MOESERVE_SRC");
    snprintf(g_src, sizeof g_src, "%s", src ? src : ".");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_answers_fit), cmocka_unit_test(test_preemption_keeps_state),
                                       cmocka_unit_test(test_device_masks), cmocka_unit_test(test_device_edits)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
