/* test_model_desc.c — config.json -> struct model_desc, family by family.
 *
 * The golden fixtures prove the common shapes end to end; this covers the
 * config rules that a tiny fixture cannot show on its own (GLM-5 indexer
 * type resolution, YaRN attention factor, defaults that differ from the
 * class defaults) and the errors a bad config must produce.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "base/json.h"
#include "model/model_desc.h"

static enum status parse(const char *text, struct model_desc *d, struct err *err)
{
    struct json *j = NULL;
    enum status st = json_parse(text, strlen(text), "config.json", &j, err);
    if (st)
        return st;
    st = model_desc_parse(d, j, "config.json", err);
    json_free(j);
    return st;
}

/* JSON keeps the first of duplicate keys, so variants spell out the fields they change. */
#define QWEN_CFG(hidden, kv, k)                                                                            \
    "\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":" hidden ",\"num_hidden_layers\":4,"  \
    "\"num_attention_heads\":4,\"num_key_value_heads\":" kv ",\"head_dim\":32,\"intermediate_size\":96,"    \
    "\"moe_intermediate_size\":32,\"num_experts\":8,\"num_experts_per_tok\":" k
#define QWEN_BASE QWEN_CFG("64", "2", "2")

static void test_qwen3_layers_and_defaults(void **state)
{
    (void)state;
    struct model_desc d;
    struct err err = {0};
    assert_int_equal(parse("{" QWEN_BASE ",\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]}", &d, &err), STATUS_OK);
    assert_int_equal(d.family, MODEL_QWEN3_MOE);
    assert_int_equal(d.head_dim, 32); /* read, not hidden/heads = 16 */
    assert_int_equal(d.rope.dim, 32);
    assert_true(d.qk_norm);
    assert_false(d.norm_topk_prob); /* class default false */
    assert_int_equal(d.layers[0].ffn, FFN_DENSE);
    assert_int_equal(d.layers[1].ffn, FFN_MOE);
    assert_int_equal(d.layers[2].ffn, FFN_DENSE);
    assert_int_equal(d.layers[3].ffn, FFN_DENSE); /* mlp_only_layers */
    assert_true(d.rope.theta == 10000.0);
    model_desc_free(&d);
}

static void test_num_local_experts_alias(void **state)
{
    (void)state;
    struct model_desc d;
    struct err err = {0};
    const char *cfg = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":1,"
                      "\"num_attention_heads\":4,\"head_dim\":16,\"moe_intermediate_size\":32,"
                      "\"num_local_experts\":6,\"num_experts_per_tok\":2}";
    assert_int_equal(parse(cfg, &d, &err), STATUS_OK);
    assert_int_equal(d.n_experts, 6);
    model_desc_free(&d);
}

static void test_glm4_partial_rotary_default(void **state)
{
    (void)state;
    struct model_desc d;
    struct err err = {0};
    const char *cfg = "{\"model_type\":\"glm4_moe\",\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":3,"
                      "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":96,"
                      "\"moe_intermediate_size\":32,\"n_routed_experts\":8,\"num_experts_per_tok\":2,"
                      "\"n_shared_experts\":1,\"first_k_dense_replace\":2,\"attention_bias\":true,"
                      "\"routed_scaling_factor\":2.5}";
    assert_int_equal(parse(cfg, &d, &err), STATUS_OK);
    assert_int_equal(d.rope.dim, 16); /* partial_rotary_factor defaults to 0.5 */
    assert_true(d.qkv_bias);
    assert_false(d.o_bias); /* o_proj never has a bias in GLM-4.5 */
    assert_false(d.qk_norm);
    assert_int_equal(d.router, ROUTER_SIGMOID);
    assert_true(d.norm_topk_eps > 0);
    assert_int_equal(d.layers[1].ffn, FFN_DENSE);
    assert_int_equal(d.layers[2].ffn, FFN_MOE);
    assert_true(d.routed_scaling == 2.5f);
    model_desc_free(&d);
}

#define DSA_CFG(layers)                                                                                    \
    "\"model_type\":\"glm_moe_dsa\",\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":" layers ","  \
    "\"num_attention_heads\":4,\"q_lora_rank\":32,\"kv_lora_rank\":16,\"qk_nope_head_dim\":12,"            \
    "\"qk_rope_head_dim\":8,\"v_head_dim\":16,\"index_n_heads\":4,\"index_head_dim\":16,\"index_topk\":8,"  \
    "\"intermediate_size\":96,\"moe_intermediate_size\":32,\"n_routed_experts\":8,\"num_experts_per_tok\":2"
#define DSA_BASE DSA_CFG("12")

static void test_dsa_indexer_formula(void **state)
{
    (void)state;
    struct model_desc d;
    struct err err = {0};
    /* freq 4, offset 3: full iff max(l - 2, 0) % 4 == 0 -> layers 0,1,2,6,10 */
    assert_int_equal(parse("{" DSA_BASE ",\"index_topk_freq\":4,\"index_skip_topk_offset\":3}", &d, &err), STATUS_OK);
    int full[12] = {1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0};
    for (int l = 0; l < 12; l++)
        assert_int_equal(d.layers[l].indexer, full[l] ? INDEXER_FULL : INDEXER_SHARED);
    assert_int_equal(d.layers[0].attn, ATTN_MLA);
    assert_int_equal(d.layers[2].ffn, FFN_DENSE); /* first_k_dense_replace defaults to 3 */
    assert_int_equal(d.layers[3].ffn, FFN_MOE);
    assert_int_equal(d.rope.layout, ROPE_INTERLEAVED);
    assert_int_equal(d.head_dim, 8); /* forced to qk_rope_head_dim */
    assert_true(d.attn_scale == 1.0f / sqrtf(20.0f));
    /* KV per token: latent 16 + rope 8 (+ indexer key 16 on full layers) */
    assert_int_equal(model_desc_kv_elems_per_token(&d, 0), 16 + 8 + 16);
    assert_int_equal(model_desc_kv_elems_per_token(&d, 3), 16 + 8);
    model_desc_free(&d);
}

static void test_dsa_indexer_list_wins(void **state)
{
    (void)state;
    struct model_desc d;
    struct err err = {0};
    assert_int_equal(parse("{" DSA_CFG("3") ",\"index_topk_freq\":4,"
                           "\"indexer_types\":[\"full\",\"shared\",\"full\"]}",
                           &d, &err),
                     STATUS_OK);
    assert_int_equal(d.layers[1].indexer, INDEXER_SHARED);
    assert_int_equal(d.layers[2].indexer, INDEXER_FULL);
    model_desc_free(&d);
    assert_int_not_equal(parse("{" DSA_CFG("2") ",\"indexer_types\":[\"shared\",\"full\"]}", &d,
                               &err),
                         STATUS_OK);
    assert_non_null(strstr(err.msg, "layer 0"));
}

static void test_yarn_attention_factor(void **state)
{
    (void)state;
    struct model_desc d;
    struct err err = {0};
    assert_int_equal(parse("{" QWEN_BASE ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":10000,"
                           "\"factor\":4.0,\"original_max_position_embeddings\":16}}",
                           &d, &err),
                     STATUS_OK);
    assert_int_equal(d.rope.type, ROPE_TYPE_YARN);
    /* m(4, 1) = 0.1 ln 4 + 1 */
    assert_true(fabsf(d.rope.attention_factor - (float)(0.1 * log(4.0) + 1.0)) < 1e-6f);
    model_desc_free(&d);
}

static void test_errors_name_the_field(void **state)
{
    (void)state;
    struct model_desc d;
    struct err err = {0};
    struct {
        const char *cfg, *want;
    } cases[] = {
        {"{\"model_type\":\"mixtral\"}", "model_type \"mixtral\" is not supported"},
        {"{\"vocab_size\":3}", "\"model_type\" is missing"},
        {"{\"model_type\":\"qwen3_moe\",\"hidden_size\":64}", "\"vocab_size\" is missing"},
        {"{" QWEN_CFG("64", "3", "2") "}", "num_key_value_heads"},
        {"{" QWEN_CFG("64", "2", "9") "}", "num_experts_per_tok"},
        {"{" QWEN_CFG("-5", "2", "2") "}", "hidden_size"},
        {"{" QWEN_CFG("64.5", "2", "2") "}", "hidden_size"},
        {"{" QWEN_BASE ",\"rope_parameters\":{\"rope_type\":\"longrope\"}}", "longrope"},
        {"{" QWEN_BASE ",\"use_sliding_window\":true}", "use_sliding_window"},
        {"{" QWEN_BASE ",\"hidden_act\":\"gelu\"}", "hidden_act"},
        {"[1,2]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&err, 0, sizeof err);
        assert_int_not_equal(parse(cases[i].cfg, &d, &err), STATUS_OK);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, cases[i].want);
        assert_null(d.layers);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_layers_and_defaults), cmocka_unit_test(test_num_local_experts_alias),
        cmocka_unit_test(test_glm4_partial_rotary_default), cmocka_unit_test(test_dsa_indexer_formula),
        cmocka_unit_test(test_dsa_indexer_list_wins),       cmocka_unit_test(test_yarn_attention_factor),
        cmocka_unit_test(test_errors_name_the_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
