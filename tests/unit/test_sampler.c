/* test_sampler.c — the host sampler's logit processors and min-p (engine/sampler.h), as vLLM
 * defines them: logit_bias moves the greedy choice; repetition_penalty divides a positive logit
 * (multiplies a negative one) of every prompt or generated token; frequency and presence
 * penalties subtract count x f + p from generated tokens only; min-p keeps only tokens at least
 * min_p x the likeliest's probability. The same processors as a backend's sparse edits
 * (sampler_edits, applied by the CPU backend's logits_edit, the reference of the device's) give
 * sampler_apply's row bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "base/status.h"
#include "engine/sampler.h"

enum { V = 8 };

static int32_t pick(struct sampler *s, const float *in)
{
    float row[V];
    memcpy(row, in, sizeof row);
    sampler_apply(s, row);
    int32_t tok = -1;
    assert_int_equal(sampler_sample(s, row, &tok, NULL), STATUS_OK);
    return tok;
}

static void test_bias(void **state)
{
    (void)state;
    const float logits[V] = {0, 1, 2, 3, 0, 0, 0, 0};
    struct sampler_params p = {.top_p = 1, .n_bias = 2, .bias_ids = {6, 3}, .bias = {5, -10}};
    struct sampler s;
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_OK);
    assert_true(sampler_has_edits(&s));
    assert_int_equal(pick(&s, logits), 6);
    sampler_free(&s);
    p.bias_ids[0] = V; /* not in the vocabulary */
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_INVALID);
}

static void test_penalties(void **state)
{
    (void)state;
    const float logits[V] = {0, 1.5f, 2.0f, -1.0f, 0, 0, 0, 0};
    /* repetition: the prompt holds token 2 (2.0 -> 1.0 at 2x): token 1 wins */
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 2};
    struct sampler s;
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_OK);
    assert_int_equal(pick(&s, logits), 2);
    const int32_t prompt[2] = {2, 3};
    sampler_observe_prompt(&s, prompt, 2);
    float row[V];
    memcpy(row, logits, sizeof row);
    sampler_apply(&s, row);
    assert_true(row[2] == 1.0f && row[3] == -2.0f && row[1] == 1.5f);
    assert_int_equal(pick(&s, logits), 1);
    sampler_free(&s);
    /* frequency and presence: generated tokens only; token 2 seen twice: 2 - 2 x 0.4 - 0.5 = 0.7 */
    p = (struct sampler_params){.top_p = 1, .frequency_penalty = 0.4f, .presence_penalty = 0.5f};
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_OK);
    sampler_observe_prompt(&s, prompt, 2); /* no effect on these two */
    sampler_observe(&s, 2);
    sampler_observe(&s, 2);
    memcpy(row, logits, sizeof row);
    sampler_apply(&s, row);
    assert_true(fabsf(row[2] - 0.7f) < 1e-6f && row[3] == -1.0f);
    assert_int_equal(pick(&s, logits), 1);
    sampler_free(&s);
    p.frequency_penalty = 3; /* out of [-2, 2] */
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_INVALID);
}

static void test_min_p(void **state)
{
    (void)state;
    /* at temperature 1: p(1) / p(0) = e^-1 = 0.37, p(2) / p(0) = e^-3 = 0.05 */
    const float logits[V] = {0, -1, -3, -30, -30, -30, -30, -30};
    int seen[V] = {0};
    struct sampler_params p = {.temperature = 1, .top_p = 1, .min_p = 0.2f, .seed = 5};
    struct sampler s;
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_OK);
    for (int i = 0; i < 2000; i++)
        seen[pick(&s, logits)]++;
    sampler_free(&s);
    assert_true(seen[0] > 0 && seen[1] > 0);
    assert_int_equal(seen[2], 0); /* below 0.2 x the top */
    p.min_p = 0;
    memset(seen, 0, sizeof seen);
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_OK);
    assert_false(sampler_has_edits(&s));
    for (int i = 0; i < 2000; i++)
        seen[pick(&s, logits)]++;
    sampler_free(&s);
    assert_true(seen[2] > 0); /* without min-p it occurs (~4%) */
}

/* Ties at a cut stay: top_k 2 over logits {3, 1, 1, 1, ...} keeps the three tokens tied at the
 * second place (transformers' top-k, and the device sampler), and top_p 0.5 over {1, 1, 1, 1, -30...}
 * keeps all four equal ones though two reach half the mass. */
static void test_cut_ties(void **state)
{
    (void)state;
    const float k_logits[V] = {3, 1, 1, 1, -30, -30, -30, -30}, p_logits[V] = {1, 1, 1, 1, -30, -30, -30, -30};
    int seen[V] = {0};
    struct sampler_params p = {.temperature = 1, .top_p = 1, .top_k = 2, .seed = 9};
    struct sampler s;
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_OK);
    for (int i = 0; i < 3000; i++)
        seen[pick(&s, k_logits)]++;
    sampler_free(&s);
    for (int i = 0; i < 4; i++)
        assert_true(seen[i] > 0);
    memset(seen, 0, sizeof seen);
    p.top_k = 0;
    p.top_p = 0.5f;
    assert_int_equal(sampler_init(&s, &p, V, NULL), STATUS_OK);
    for (int i = 0; i < 3000; i++)
        seen[pick(&s, p_logits)]++;
    sampler_free(&s);
    for (int i = 0; i < 4; i++)
        assert_true(seen[i] > 500); /* ~750 each */
    for (int i = 4; i < V; i++)
        assert_int_equal(seen[i], 0);
}

/* Sampling among a mask's ids draws what sampler_sample draws from the row with the rest at -inf,
 * the same stream consumed: greedy, temperature, top-k, top-p, min-p, a mask of one id. */
static void test_masked(void **state)
{
    (void)state;
    enum { W = 200 };
    float base[W];
    for (int i = 0; i < W; i++)
        base[i] = (float)((i * 37) % 23) * 0.25f - 2.0f;
    uint32_t bits[(W + 31) / 32];
    const struct sampler_params ps[] = {{.temperature = 0, .top_p = 1}, {.temperature = 1, .top_p = 1, .seed = 1},
                                        {.temperature = 0.7f, .top_p = 0.9f, .seed = 2},
                                        {.temperature = 1.3f, .top_p = 1, .top_k = 5, .seed = 3},
                                        {.temperature = 1, .top_p = 1, .min_p = 0.2f, .seed = 4}};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++)
        for (int mask = 0; mask < 3; mask++) {
            memset(bits, 0, sizeof bits);
            for (int i = 0; i < W; i++)
                if (mask == 0 ? i % 3 == 0 : mask == 1 ? i > 150 : i == 77)
                    bits[i >> 5] |= 1u << (i & 31);
            struct sampler a, b;
            assert_int_equal(sampler_init(&a, &ps[k], W, NULL), STATUS_OK);
            assert_int_equal(sampler_init(&b, &ps[k], W, NULL), STATUS_OK);
            for (int draw = 0; draw < 50; draw++) {
                float row[W];
                for (int i = 0; i < W; i++)
                    row[i] = (bits[i >> 5] >> (i & 31)) & 1u ? base[i] : -INFINITY;
                int32_t ta = -1, tb = -1;
                assert_int_equal(sampler_sample(&a, row, &ta, NULL), STATUS_OK);
                assert_int_equal(sampler_sample_masked(&b, base, bits, &tb, NULL), STATUS_OK);
                assert_int_equal(ta, tb);
                assert_true((bits[tb >> 5] >> (tb & 31)) & 1u);
            }
            sampler_free(&a);
            sampler_free(&b);
        }
}

/* Every processor at once over a larger vocabulary, the prompt and output overlapping the biased
 * ids: the edits applied by the CPU backend's op equal sampler_apply exactly; too small a cap is -1. */
static void test_edits(void **state)
{
    (void)state;
    enum { VE = 3000 };
    static float row[VE], want[VE];
    uint64_t x = 99;
    for (int i = 0; i < VE; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        row[i] = (float)((int)(x >> 40) % 2000 - 1000) / 97.0f;
    }
    struct sampler_params p = {.temperature = 1, .top_p = 1, .frequency_penalty = 0.7f, .presence_penalty = -0.3f,
                               .repetition_penalty = 1.3f, .n_bias = 3, .bias_ids = {5, 17, 2999},
                               .bias = {2.5f, -100, 7}};
    struct sampler s;
    assert_int_equal(sampler_init(&s, &p, VE, NULL), STATUS_OK);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = (i * 37) % 200; /* repeats; 5 and 17 among them */
    sampler_observe_prompt(&s, prompt, 40);
    for (int i = 0; i < 60; i++)
        sampler_observe(&s, (i * i) % 250); /* overlaps the prompt, repeats */
    memcpy(want, row, sizeof row);
    sampler_apply(&s, want);
    struct logit_edit e[VE];
    const int n = sampler_edits(&s, e, VE);
    assert_true(n > 3 && n < 500);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            assert_int_not_equal(e[i].id, e[j].id);
    struct backend be;
    assert_int_equal(backend_cpu_create(&be, NULL), STATUS_OK);
    const int32_t start[2] = {0, n};
    be.ops->logits_edit(&be, row, 1, VE, start, e);
    backend_destroy(&be);
    for (int i = 0; i < VE; i++)
        if (memcmp(&row[i], &want[i], sizeof row[i]) != 0)
            fail_msg("id %d: edits give %a, sampler_apply %a", i, (double)row[i], (double)want[i]);
    assert_int_equal(sampler_edits(&s, e, n - 1), -1);
    sampler_free(&s);
    /* no processors: no edits */
    p = (struct sampler_params){.temperature = 1, .top_p = 1};
    assert_int_equal(sampler_init(&s, &p, VE, NULL), STATUS_OK);
    sampler_observe(&s, 3);
    assert_int_equal(sampler_edits(&s, e, VE), 0);
    sampler_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bias), cmocka_unit_test(test_penalties),
                                       cmocka_unit_test(test_min_p), cmocka_unit_test(test_masked),
                                       cmocka_unit_test(test_edits), cmocka_unit_test(test_cut_ties)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
