/* test_sampler.c — the host sampler's logit processors and min-p (engine/sampler.h), as vLLM
 * defines them: logit_bias moves the greedy choice; repetition_penalty divides a positive logit
 * (multiplies a negative one) of every prompt or generated token; frequency and presence
 * penalties subtract count x f + p from generated tokens only; min-p keeps only tokens at least
 * min_p x the likeliest's probability; without any of them a row needs no host sampling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

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
    assert_true(sampler_needs_host(&p));
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
    assert_false(sampler_needs_host(&p));
    for (int i = 0; i < 2000; i++)
        seen[pick(&s, logits)]++;
    sampler_free(&s);
    assert_true(seen[2] > 0); /* without min-p it occurs (~4%) */
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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bias), cmocka_unit_test(test_penalties),
                                       cmocka_unit_test(test_min_p), cmocka_unit_test(test_masked)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
