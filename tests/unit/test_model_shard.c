/* test_model_shard.c — one rank's share of a model (model/model_shard.h) and the weight slices it
 * binds (format/weight.h): every slice, dequantised row by row, equals the same rows or
 * in-features of the whole weight in every format; splits off a format's scale blocks are refused;
 * heads, kv heads, widths, experts and the vocabulary divide as the layout says. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "format/weight.h"
#include "model/model_shard.h"
#include "test_rand.h"

/* A random weight of the format, its buffers malloc'd into *mem (data, then scales). */
static struct weight random_weight(enum weight_format f, int64_t rows, int64_t cols, uint64_t *rng, void **mem)
{
    struct weight w = {.format = f, .rows = rows, .cols = cols, .scale2 = 1.0f};
    const size_t db = weight_data_bytes(&w), sb = weight_scale_bytes(&w);
    uint8_t *p = malloc(db + sb + 16);
    assert_non_null(p);
    for (size_t i = 0; i < db; i++)
        p[i] = (uint8_t)(rng_next(rng) >> 56);
    if (f == WEIGHT_BF16) /* finite values: exponent bits away from all ones */
        for (size_t i = 1; i < db; i += 2)
            p[i] &= 0x3f;
    if (f == WEIGHT_FP8_BLOCK)
        for (size_t i = 0; i < db; i++)
            if ((p[i] & 0x7f) == 0x7f)
                p[i] = 0x10;
    uint8_t *sc = p + db;
    if (f == WEIGHT_NVFP4) {
        for (size_t i = 0; i < sb; i++)
            sc[i] = (uint8_t)(0x20 + rng_next(rng) % 0x30); /* positive, finite E4M3 */
        w.scale2 = 0.5f;
    } else if (f == WEIGHT_FP8_BLOCK) {
        float *fs = (float *)sc;
        for (size_t i = 0; i < sb / 4; i++)
            fs[i] = 0.25f + (float)(rng_next(rng) % 7);
    }
    w.data = p;
    w.scale = sb ? sc : NULL;
    *mem = p;
    return w;
}

static void check_slices(enum weight_format f, int64_t rows, int64_t cols, int64_t r0, int64_t rn, int64_t c0,
                         int64_t cn)
{
    uint64_t rng = 0x5eed + (uint64_t)f;
    void *mem, *buf = NULL;
    struct weight w = random_weight(f, rows, cols, &rng, &mem);
    float *full = malloc((size_t)cols * sizeof(float)), *part = malloc((size_t)cols * sizeof(float));
    struct weight s;
    assert_null(weight_slice_rows(&w, r0, rn, &s));
    assert_int_equal(s.rows, rn);
    for (int64_t r = 0; r < rn; r++) {
        weight_dequant_row(&w, r0 + r, full);
        weight_dequant_row(&s, r, part);
        assert_memory_equal(full, part, (size_t)cols * sizeof(float));
    }
    assert_null(weight_slice_cols(&w, c0, cn, &s, &buf));
    assert_non_null(buf);
    assert_int_equal(s.cols, cn);
    for (int64_t r = 0; r < rows; r++) {
        weight_dequant_row(&w, r, full);
        weight_dequant_row(&s, r, part);
        assert_memory_equal(full + c0, part, (size_t)cn * sizeof(float));
    }
    free(buf), free(full), free(part), free(mem);
}

static void test_slices_equal_the_whole(void **state)
{
    (void)state;
    check_slices(WEIGHT_BF16, 12, 40, 4, 4, 8, 16);
    check_slices(WEIGHT_F32, 6, 10, 3, 3, 5, 5);
    check_slices(WEIGHT_NVFP4, 16, 96, 8, 8, 32, 32);    /* a rank's 32 of 96 in-features, 2 scale blocks */
    check_slices(WEIGHT_FP8_BLOCK, 384, 256, 128, 256, 128, 128);
    check_slices(WEIGHT_FP8_BLOCK, 300, 300, 256, 44, 256, 44); /* the ragged last blocks */
}

static void test_splits_off_the_blocks_are_refused(void **state)
{
    (void)state;
    uint64_t rng = 7;
    void *mem, *buf = NULL;
    struct weight s;
    struct weight w = random_weight(WEIGHT_NVFP4, 8, 64, &rng, &mem);
    assert_non_null(weight_slice_cols(&w, 8, 24, &s, &buf)); /* 8 in-features: half a scale block */
    assert_null(buf);
    assert_non_null(weight_slice_rows(&w, 4, 8, &s)); /* past the last row */
    free(mem);
    w = random_weight(WEIGHT_FP8_BLOCK, 256, 256, &rng, &mem);
    assert_non_null(weight_slice_rows(&w, 64, 64, &s));      /* inside a 128-row block */
    assert_non_null(weight_slice_cols(&w, 0, 64, &s, &buf)); /* half of a 128 in-feature block */
    free(mem);
}

static struct model_desc toy(int heads, int kv, int d_ff, int d_expert, int experts, int vocab, struct layer_desc *l)
{
    l[0] = (struct layer_desc){.attn = ATTN_GQA, .ffn = FFN_DENSE};
    l[1] = (struct layer_desc){.attn = ATTN_GQA, .ffn = FFN_MOE};
    return (struct model_desc){.family = MODEL_QWEN3_MOE, .vocab_size = vocab, .d_model = 64, .n_layers = 2,
                               .n_heads = heads, .n_kv_heads = kv, .head_dim = 16, .d_ff = d_ff,
                               .d_expert = d_expert, .n_experts = experts, .n_experts_used = 2, .layers = l};
}

static void test_ranges_and_local_desc(void **state)
{
    (void)state;
    struct layer_desc l[2];
    struct model_desc d = toy(8, 2, 96, 32, 8, 320, l);
    struct err err = {0};
    struct model_shard s = {.rank = 3, .size = 4};
    /* 4 ranks over 2 kv heads: ranks 2, 3 read kv head 1 */
    struct shard_range kh = model_shard_kv_heads(&d, &s);
    assert_int_equal(kh.off, 1);
    assert_int_equal(kh.n, 1);
    assert_int_equal(model_shard_heads(&d, &s).off, 6);
    assert_int_equal(model_shard_vocab(&d, &s).off, 240);
    struct model_desc local;
    assert_int_equal(model_shard_desc(&d, &s, &local, &err), STATUS_OK);
    assert_int_equal(local.n_heads, 2);
    assert_int_equal(local.n_kv_heads, 1);
    assert_int_equal(local.d_ff, 24);
    assert_int_equal(local.d_expert, 8);
    model_desc_free(&local);
    s.expert_parallel = true;
    struct shard_range ex = model_shard_experts(&d, &s);
    assert_int_equal(ex.off, 6);
    assert_int_equal(ex.n, 2);
    /* the experts' layout the planner picks: by width while a rank's width is whole NVFP4 blocks */
    const char *why = NULL;
    assert_false(model_shard_choose_experts(&d, 2, WEIGHT_NVFP4, &why));
    assert_true(model_shard_choose_experts(&d, 4, WEIGHT_NVFP4, &why)); /* 8 in-features a rank: by expert */
    assert_non_null(strstr(why, "scale blocks"));
    /* widths that do not divide are refused, naming them */
    d = toy(6, 2, 96, 32, 8, 320, l);
    s = (struct model_shard){.rank = 0, .size = 4};
    assert_int_equal(model_shard_check(&d, &s, &err), STATUS_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "6 attention heads"));
    d = toy(8, 3, 96, 32, 8, 320, l);
    assert_int_equal(model_shard_check(&d, &s, &err), STATUS_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "3 kv heads"));
    d = toy(8, 2, 96, 30, 8, 322, l);
    assert_int_equal(model_shard_check(&d, &s, &err), STATUS_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "moe_intermediate_size 30"));
    assert_int_equal(model_shard_vocab(&d, &s).n, 322); /* 322 does not divide: the lm_head replicated */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices_equal_the_whole),
        cmocka_unit_test(test_splits_off_the_blocks_are_refused),
        cmocka_unit_test(test_ranges_and_local_desc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
