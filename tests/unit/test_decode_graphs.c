/* test_decode_graphs.c — decode passes padded to the graph sizes (engine/forward.h), on the CPU.
 *
 * The CPU backend has no graphs, so it never pads by itself; the test turns padding on
 * (forward.pad_decode) to check what a GPU's graphs rely on: a decode batch of n rows run as a
 * batch of the next graph size gives the same logits as run alone (bit for bit, batch-invariant
 * CPU), and its padding rows write only the cache's pad block: every other block of the cache,
 * filled with the same random rows in both runs, ends equal, while the pad block's first slot
 * was written (and only it). The same through the scheduler: tokens and log-probabilities equal
 * while decode steps shrink as requests end, every KV block back. Also the list of sizes itself
 * (plan_decode_graph_sizes): ascending from 1 to max_rows, small, each batch padded by at most 7
 * rows up to 64 and at most a fifth of its size above.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/log.h"
#include "engine/model_session.h"
#include "engine/scheduler.h"
#include "plan/plan.h"

static char g_model[4096];

enum { N_SEQS_MAX = 8, BLOCK = 16 };

static void test_sizes(void **state)
{
    (void)state;
    const int maxes[] = {1, 2, 3, 7, 8, 9, 63, 64, 65, 100, 128, 256, 1000, 4096};
    for (size_t m = 0; m < sizeof maxes / sizeof maxes[0]; m++) {
        int sizes[PLAN_MAX_DECODE_GRAPHS];
        int n = plan_decode_graph_sizes(maxes[m], sizes, PLAN_MAX_DECODE_GRAPHS);
        assert_true(n >= 1);
        assert_int_equal(sizes[0], 1);
        assert_int_equal(sizes[n - 1], maxes[m]);
        for (int i = 1; i < n; i++)
            assert_true(sizes[i] > sizes[i - 1]);
        assert_true(n <= 35); /* 4096 rows: 35 sizes (128 graphs a size before) */
        if (maxes[m] == 64) {
            const int want[] = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64};
            assert_int_equal(n, 11);
            assert_memory_equal(sizes, want, sizeof want);
        }
        for (int b = 1; b <= maxes[m]; b++) {
            int r = plan_decode_graph_rows(b, maxes[m]);
            assert_true(r >= b && r <= maxes[m]);
            if (b > 4)
                assert_true(b <= 64 ? r - b <= 7 : (r - b) * 5 <= r);
        }
        assert_int_equal(plan_decode_graph_rows(maxes[m] + 1, maxes[m]), 0);
    }
}

static void open_session(struct model_session *s)
{
    struct session_opts so = {.max_seqs = N_SEQS_MAX, .max_tokens = 64, .block_size = BLOCK, .max_context = 128,
                              .batch_invariant = true};
    struct err err = {0};
    if (model_session_open(s, g_model, &so, &err))
        fail_msg("%s", err.msg);
    if (kv_cache_fill_random(&s->kv, 7, &err))
        fail_msg("%s", err.msg);
}

/* One GQA layer's K or V array, whole (pad block included), downloaded. */
static float *layer_copy(struct model_session *s, int l, bool v)
{
    const struct paged_kv *p = &s->kv.layers[l];
    size_t n = ((size_t)s->kv.n_blocks + 1) * BLOCK * (size_t)p->n_kv_heads * (size_t)p->head_dim;
    float *h = malloc(n * sizeof *h);
    assert_non_null(h);
    s->be.ops->download(&s->be, h, v ? p->v : p->k, n * sizeof *h);
    return h;
}

#define MARK 12345.0f

/* Fills layer l's pad block (K and V) with MARK. */
static void mark_pad_block(struct model_session *s, int l)
{
    const struct paged_kv *p = &s->kv.layers[l];
    size_t n = BLOCK * (size_t)p->n_kv_heads * (size_t)p->head_dim;
    float *m = malloc(n * sizeof *m);
    assert_non_null(m);
    for (size_t i = 0; i < n; i++)
        m[i] = MARK;
    s->be.ops->upload(&s->be, p->k + (size_t)s->kv.pad_block * n, m, n * sizeof *m);
    s->be.ops->upload(&s->be, p->v + (size_t)s->kv.pad_block * n, m, n * sizeof *m);
    free(m);
}

/* Prefills n_seqs prompts of different lengths, then runs one decode pass (one row a sequence)
 * with or without padding; the decode logits go to logits (n_seqs, vocab), the chosen ids to ids. */
static void run(struct model_session *s, int n_seqs, bool pad, float *logits, int32_t *ids)
{
    struct forward *f = &s->fwd;
    struct kv_seq seqs[N_SEQS_MAX];
    struct kv_seq *ptrs[N_SEQS_MAX];
    int32_t tok[64], pos[64], seq[64], rows[N_SEQS_MAX];
    struct err err = {0};
    for (int j = 0; j < n_seqs; j++) {
        kv_seq_init(&seqs[j]);
        ptrs[j] = &seqs[j];
        int len = 5 + 7 * j;
        if (kv_seq_reserve(&seqs[j], &s->kv, len + 1, &err))
            fail_msg("%s", err.msg);
        for (int i = 0; i < len; i++)
            tok[i] = 10 + (j * 131 + i * 17) % 4000, pos[i] = i, seq[i] = 0;
        rows[0] = len - 1;
        struct forward_batch b = {.n_tokens = len, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 1,
                                  .seqs = &ptrs[j], .n_logits = 1, .logit_rows = rows};
        if (forward_run(f, &b, NULL, &err))
            fail_msg("%s", err.msg);
        seqs[j].n_tokens = len;
    }
    for (int j = 0; j < n_seqs; j++)
        tok[j] = 100 + 37 * j, pos[j] = seqs[j].n_tokens, seq[j] = j, rows[j] = j;
    f->pad_decode = pad;
    f->graph_rows = N_SEQS_MAX;
    struct forward_batch b = {.n_tokens = n_seqs, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = n_seqs,
                              .seqs = ptrs, .n_logits = n_seqs, .logit_rows = rows, .tokens_out = ids};
    if (forward_run(f, &b, logits, &err))
        fail_msg("%s", err.msg);
    for (int j = 0; j < n_seqs; j++)
        kv_seq_release(&seqs[j], &s->kv);
}

static void check_padding(int n_seqs)
{
    struct model_session a, b;
    open_session(&a);
    open_session(&b);
    const int V = a.desc.vocab_size;
    float *la = malloc((size_t)n_seqs * V * sizeof *la), *lb = malloc((size_t)n_seqs * V * sizeof *lb);
    int32_t ia[N_SEQS_MAX], ib[N_SEQS_MAX];
    assert_non_null(la);
    assert_non_null(lb);
    /* b's pad block marked: the padded pass must write its first slot (the tiny model's token 0
     * embeds to zeros, so what it writes is zeros) and nothing else of it */
    for (int l = 0; l < b.desc.n_layers; l++)
        mark_pad_block(&b, l);
    run(&a, n_seqs, false, la, ia);
    run(&b, n_seqs, true, lb, ib);
    assert_memory_equal(la, lb, (size_t)n_seqs * V * sizeof *la);
    assert_memory_equal(ia, ib, (size_t)n_seqs * sizeof *ia);
    for (int l = 0; l < a.desc.n_layers; l++) {
        for (int v = 0; v < 2; v++) {
            const struct paged_kv *p = &a.kv.layers[l];
            size_t block = BLOCK * (size_t)p->n_kv_heads * (size_t)p->head_dim;
            float *ka = layer_copy(&a, l, v), *kb = layer_copy(&b, l, v);
            /* every block but the pad block: equal (no padding row wrote into a sequence's or a free block) */
            assert_memory_equal(ka, kb, (size_t)a.kv.n_blocks * block * sizeof *ka);
            /* the pad block's first slot: written by the padding rows (token 0 at position 0), finite;
             * the rest as marked */
            const float *pad = kb + (size_t)b.kv.pad_block * block;
            for (size_t i = 0; i < block; i++) {
                if (i < block / BLOCK)
                    assert_true(isfinite(pad[i]) && pad[i] != MARK);
                else
                    assert_true(pad[i] == MARK);
            }
            free(ka);
            free(kb);
        }
    }
    free(la);
    free(lb);
    model_session_close(&a);
    model_session_close(&b);
}

/* 3 rows run as 4, 5 as 8 (sizes 1, 2, 4, 8); 4 is a size: nothing to pad, the pad block stays
 * as marked. */
static void test_pad_3_to_4(void **state)
{
    (void)state;
    check_padding(3);
}

static void test_pad_5_to_8(void **state)
{
    (void)state;
    check_padding(5);
}

static void test_no_pad_at_a_size(void **state)
{
    (void)state;
    struct model_session s;
    open_session(&s);
    const struct paged_kv *p = &s.kv.layers[0];
    size_t n = BLOCK * (size_t)p->n_kv_heads * (size_t)p->head_dim;
    mark_pad_block(&s, 0);
    float *back = malloc(n * sizeof *back);
    assert_non_null(back);
    float *logits = malloc((size_t)4 * s.desc.vocab_size * sizeof *logits);
    int32_t ids[4];
    run(&s, 4, true, logits, ids);
    s.be.ops->download(&s.be, back, p->k + (size_t)s.kv.pad_block * n, n * sizeof *back);
    for (size_t i = 0; i < n; i++)
        assert_true(back[i] == MARK);
    free(back);
    free(logits);
    model_session_close(&s);
}

/* Through the scheduler: 6 requests of different prompt and output lengths (decode steps of 6, 5,
 * .. 1 rows as they end, most padded), greedy with log-probabilities, give the same tokens and
 * numbers with padding as without, and every KV block comes back. */
static void run_sched(bool pad, int32_t out[6][24], float lp[6][24])
{
    struct model_session s;
    open_session(&s);
    s.fwd.pad_decode = pad;
    struct scheduler sch;
    struct scheduler_opts o = {.no_prefix_cache = true};
    struct err err = {0};
    if (scheduler_init(&sch, &s, &o, &err))
        fail_msg("%s", err.msg);
    struct sched_req *r[6];
    for (int i = 0; i < 6; i++) {
        int32_t prompt[40];
        for (int j = 0; j < 3 + 7 * i; j++)
            prompt[j] = 10 + (i * 97 + j * 13) % 4000;
        struct sched_params sp = {.max_new = 4 + 4 * i, .ignore_eos = true, .top_logprobs = 0,
                                  .sampling = {.temperature = 0, .top_p = 1}};
        if (sched_req_create(&r[i], prompt, 3 + 7 * i, &sp, &err) || scheduler_submit(&sch, r[i], &err))
            fail_msg("%s", err.msg);
    }
    while (scheduler_step(&sch))
        ;
    struct scheduler_stats st;
    scheduler_get_stats(&sch, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(s.kv.n_free, s.kv.n_blocks);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(r[i]->n_out, 4 + 4 * i);
        memcpy(out[i], r[i]->out_ids, (size_t)r[i]->n_out * sizeof **out);
        memcpy(lp[i], r[i]->out_logprob, (size_t)r[i]->n_out * sizeof **lp);
        sched_req_put(r[i]);
    }
    scheduler_free(&sch);
    model_session_close(&s);
}

static void test_scheduler_padded(void **state)
{
    (void)state;
    static int32_t a[6][24], b[6][24];
    static float la[6][24], lb[6][24];
    run_sched(false, a, la);
    run_sched(true, b, lb);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_equal(la, lb, sizeof la);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    const char *src = getenv("MOESERVE_SRC");
    snprintf(g_model, sizeof g_model, "%s/models/moeserve-tiny", src ? src : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_pad_3_to_4),
        cmocka_unit_test(test_pad_5_to_8),
        cmocka_unit_test(test_no_pad_at_a_size),
        cmocka_unit_test(test_scheduler_padded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
