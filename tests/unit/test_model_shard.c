/* test_model_shard.c — one rank's share of a model (model/model_shard.h) and the weight slices it
 * binds (format/weight.h): every slice, dequantised row by row, equals the same rows or
 * in-features of the whole weight in every format; splits off a format's scale blocks are refused;
 * heads, kv heads, widths, experts and the vocabulary divide as the layout says; data-parallel
 * attention keeps the heads whole and is chosen by its rule. */
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

/* Data-parallel attention: whole heads on every rank (6 heads over 4 ranks too), the FFN still split;
 * the rule picks it for MLA at large batches, never for GQA whose kv heads split evenly (each rank
 * reads the same KV bytes either way and the weights cost more), nor with fewer sequences than ranks. */
static void test_data_parallel_attention(void **state)
{
    (void)state;
    struct layer_desc l[2];
    struct model_desc d = toy(6, 2, 96, 32, 8, 320, l);
    struct err err = {0};
    struct model_shard s = {.rank = 1, .size = 4, .data_parallel_attention = true};
    assert_int_equal(model_shard_check(&d, &s, &err), STATUS_OK);
    assert_int_equal(model_shard_heads(&d, &s).n, 6);
    assert_int_equal(model_shard_kv_heads(&d, &s).n, 2);
    struct model_desc local;
    assert_int_equal(model_shard_desc(&d, &s, &local, &err), STATUS_OK);
    assert_int_equal(local.n_heads, 6);
    assert_int_equal(local.n_kv_heads, 2);
    assert_int_equal(local.d_ff, 24);
    assert_int_equal(local.d_expert, 8);
    model_desc_free(&local);
    struct shard_part parts[12];
    const int n = model_shard_layout(&d, &s, parts, 12);
    assert_true(n > 0);
    assert_string_equal(parts[0].split, "data-parallel");
    assert_non_null(strstr(parts[0].per_rank, "replicated"));
    /* the rule: GQA with kv heads >= ranks never (same KV bytes a rank, the weights whole) */
    char why[400];
    d = toy(8, 4, 96, 32, 8, 320, l);
    assert_false(model_shard_choose_attention(&d, 4, 256, 4096, 2.0, 4.0, why, sizeof why));
    assert_non_null(strstr(why, "by heads"));
    /* MLA (a GLM-5-like layer in miniature): data-parallel once the latent rows outweigh the weights */
    struct layer_desc ml[2] = {{.attn = ATTN_MLA, .ffn = FFN_DENSE}, {.attn = ATTN_MLA, .ffn = FFN_MOE}};
    struct model_desc m = {.family = MODEL_GLM_MOE_DSA, .vocab_size = 320, .d_model = 1024, .n_layers = 2,
                           .n_heads = 16, .n_kv_heads = 16, .head_dim = 64, .d_ff = 96, .d_expert = 32,
                           .n_experts = 8, .n_experts_used = 2, .q_lora_rank = 256, .kv_lora_rank = 128,
                           .qk_nope_head_dim = 32, .qk_rope_head_dim = 16, .v_head_dim = 32, .layers = ml};
    const struct shard_attn_cost c = model_shard_attn_cost(&m, 4, 64, 2048, 2.0, 2.0);
    /* q_a 1024 x 256 and kv_a 1024 x 144 whole on every rank either way; q_b 256 x 16 x 48, kv_b
     * 128 x 16 x 64 and o_proj 512 x 1024 by heads a quarter each; bf16 */
    assert_true(c.weights_dp == 2.0 * (262144 + 147456 + 196608 + 131072 + 524288));
    assert_true(c.weights_tp == 2.0 * (262144 + 147456 + (196608 + 131072 + 524288) / 4));
    /* 64 sequences of 2048 latent rows of 144 bf16: every rank's by heads, a quarter data-parallel */
    assert_true(c.cache_tp == 64.0 * 2048 * 144 * 2 && c.cache_dp == c.cache_tp / 4);
    assert_true(model_shard_choose_attention(&m, 4, 64, 2048, 2.0, 2.0, why, sizeof why));
    assert_non_null(strstr(why, ": data-parallel"));
    assert_false(model_shard_choose_attention(&m, 4, 1, 16, 2.0, 2.0, why, sizeof why)); /* fewer seqs than ranks */
    assert_false(model_shard_choose_attention(&m, 4, 4, 1, 2.0, 2.0, why, sizeof why));  /* weights outweigh 1 row */
    assert_false(model_shard_choose_attention(&m, 1, 64, 2048, 2.0, 2.0, why, sizeof why));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices_equal_the_whole),
        cmocka_unit_test(test_splits_off_the_blocks_are_refused),
        cmocka_unit_test(test_ranges_and_local_desc),
        cmocka_unit_test(test_data_parallel_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
