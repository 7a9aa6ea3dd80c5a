/* model_desc.c — config.json -> struct model_desc (see model_desc.h).
 *
 * One mapper per family fills the family-specific fields; the shared fields
 * (sizes, eps, rope) are read once. Every value is range-checked here so the
 * forward can trust the description: a config that would make a kernel index
 * out of bounds is refused with a message naming the field.
 */
#include "model/model_desc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

struct cfg_reader {
    const struct json *root;
    const char *what; /* file name for messages */
    struct err *err;
    enum status st;   /* first failure, sticky */
};

static bool cfg_ok(const struct cfg_reader *r)
{
    return r->st == STATUS_OK;
}

static void cfg_fail(struct cfg_reader *r, enum status code, const char *field, const char *why)
{
    if (r->st)
        return;
    r->st = err_set(r->err, code, "%s: field \"%s\" %s", r->what, field, why);
}

/* Integer field; `required` fields must be present. Range [lo, hi]. */
static int cfg_int(struct cfg_reader *r, const char *key, bool required, int def, int lo, int hi)
{
    const struct json *j = json_get(r->root, key);
    if (json_is_null(j)) {
        if (required)
            cfg_fail(r, STATUS_FORMAT, key, "is missing");
        return def;
    }
    if (!json_is_number(j)) {
        cfg_fail(r, STATUS_FORMAT, key, "is not a number");
        return def;
    }
    double v = json_number(j);
    if (v != floor(v) || v < lo || v > hi) {
        char why[96];
        snprintf(why, sizeof why, "= %g is out of range [%d, %d]", v, lo, hi);
        cfg_fail(r, STATUS_FORMAT, key, why);
        return def;
    }
    return (int)v;
}

static double cfg_num_in(struct cfg_reader *r, const struct json *obj, const char *key,
                         double def, double lo, double hi)
{
    const struct json *j = json_get(obj, key);
    if (json_is_null(j))
        return def;
    if (!json_is_number(j)) {
        cfg_fail(r, STATUS_FORMAT, key, "is not a number");
        return def;
    }
    double v = json_number(j);
    if (!(v >= lo && v <= hi)) {
        char why[96];
        snprintf(why, sizeof why, "= %g is out of range [%g, %g]", v, lo, hi);
        cfg_fail(r, STATUS_FORMAT, key, why);
        return def;
    }
    return v;
}

static double cfg_num(struct cfg_reader *r, const char *key, double def, double lo, double hi)
{
    return cfg_num_in(r, r->root, key, def, lo, hi);
}

static bool cfg_bool(struct cfg_reader *r, const char *key, bool def)
{
    const struct json *j = json_get(r->root, key);
    if (json_is_null(j))
        return def;
    if (!json_is_bool(j)) {
        cfg_fail(r, STATUS_FORMAT, key, "is not a boolean");
        return def;
    }
    return json_bool(j);
}

/* m(s, mu) of YaRN: 1 if s <= 1 else 0.1 mu ln s + 1. */
static double yarn_mscale(double s, double mu)
{
    return s <= 1.0 ? 1.0 : 0.1 * mu * log(s) + 1.0;
}

/* rope_parameters (transformers 5) or legacy rope_scaling + rope_theta. */
static void cfg_rope(struct cfg_reader *r, struct rope_desc *rope)
{
    const struct json *rp = json_get(r->root, "rope_parameters");
    if (json_is_null(rp))
        rp = json_get(r->root, "rope_scaling");
    if (!json_is_null(rp) && !json_is_object(rp)) {
        cfg_fail(r, STATUS_FORMAT, "rope_parameters", "is not an object");
        return;
    }
    rope->theta = cfg_num_in(r, rp, "rope_theta", 0, 1e-6, 1e12);
    if (rope->theta == 0)
        rope->theta = cfg_num(r, "rope_theta", 10000.0, 1e-6, 1e12);
    const char *type = json_string(json_get(rp, "rope_type"));
    if (!type)
        type = json_string(json_get(rp, "type"));
    if (!type || strcmp(type, "default") == 0) {
        rope->type = ROPE_TYPE_DEFAULT;
    } else if (strcmp(type, "yarn") == 0) {
        rope->type = ROPE_TYPE_YARN;
    } else {
        if (!r->st)
            r->st = err_set(r->err, STATUS_UNSUPPORTED, "%s: rope type \"%s\" is not supported (default, yarn)",
                            r->what, type);
        return;
    }
    rope->attention_factor = 1.0f;
    if (rope->type == ROPE_TYPE_YARN) {
        rope->factor = cfg_num_in(r, rp, "factor", 1.0, 1e-6, 1e6);
        rope->original_max_pos = (int)cfg_num_in(r, rp, "original_max_position_embeddings", 0, 0, 1e9);
        if (rope->original_max_pos == 0)
            rope->original_max_pos = cfg_int(r, "max_position_embeddings", true, 0, 1, 1 << 30);
        rope->beta_fast = cfg_num_in(r, rp, "beta_fast", 32.0, 1e-6, 1e6);
        rope->beta_slow = cfg_num_in(r, rp, "beta_slow", 1.0, 1e-6, 1e6);
        const struct json *tr = json_get(rp, "truncate");
        rope->truncate = json_is_bool(tr) ? json_bool(tr) : true;
        rope->mscale = cfg_num_in(r, rp, "mscale", 0, 0, 1e6);
        rope->mscale_all_dim = cfg_num_in(r, rp, "mscale_all_dim", 0, 0, 1e6);
        double af = cfg_num_in(r, rp, "attention_factor", -1, 0, 1e6);
        if (af < 0) {
            if (rope->mscale != 0 && rope->mscale_all_dim != 0)
                af = yarn_mscale(rope->factor, rope->mscale) /
                     yarn_mscale(rope->factor, rope->mscale_all_dim);
            else
                af = yarn_mscale(rope->factor, 1.0);
        }
        rope->attention_factor = (float)af;
    }
    if (rope->type != ROPE_TYPE_YARN)
        rope->factor = 1.0;
    /* dim, offset and layout depend on the attention kind: set by the family mapper */
    rope->dim = 0;
    rope->offset = 0;
    rope->layout = ROPE_HALF_SPLIT;
}

static double cfg_partial_rotary(struct cfg_reader *r, double def)
{
    const struct json *rp = json_get(r->root, "rope_parameters");
    double prf = json_is_object(rp) ? cfg_num_in(r, rp, "partial_rotary_factor", -1, 0, 1) : -1;
    if (prf < 0)
        prf = cfg_num(r, "partial_rotary_factor", def, 0, 1);
    return prf;
}

/* Reads an int or an array of ints (eos_token_id) into d->eos_ids. */
static void desc_read_eos(struct model_desc *d, const struct json *v)
{
    if (json_is_number(v)) {
        d->eos_ids[0] = (int)json_number(v);
        d->n_eos = 1;
    } else if (json_is_array(v)) {
        d->n_eos = 0;
        for (size_t i = 0; i < json_array_size(v) && d->n_eos < MODEL_MAX_EOS; i++)
            if (json_is_number(json_array_at(v, i)))
                d->eos_ids[d->n_eos++] = (int)json_number(json_array_at(v, i));
    }
}

static void desc_parse_common(struct model_desc *d, struct cfg_reader *r)
{
    d->vocab_size = cfg_int(r, "vocab_size", true, 0, 1, 1 << 24);
    d->d_model = cfg_int(r, "hidden_size", true, 0, 1, 1 << 20);
    d->n_layers = cfg_int(r, "num_hidden_layers", true, 0, 1, 4096);
    d->n_heads = cfg_int(r, "num_attention_heads", true, 0, 1, 4096);
    d->n_kv_heads = cfg_int(r, "num_key_value_heads", false, d->n_heads, 1, 4096);
    d->norm_eps = (float)cfg_num(r, "rms_norm_eps", 1e-6, 0, 1);
    d->tie_word_embeddings = cfg_bool(r, "tie_word_embeddings", false);
    d->max_position_embeddings = cfg_int(r, "max_position_embeddings", false, 4096, 1, 1 << 30);
    d->bos_id = cfg_int(r, "bos_token_id", false, -1, 0, 1 << 24);
    desc_read_eos(d, json_get(r->root, "eos_token_id"));
    if (cfg_ok(r) && d->n_heads % d->n_kv_heads != 0)
        cfg_fail(r, STATUS_FORMAT, "num_key_value_heads", "does not divide num_attention_heads");
    if (cfg_ok(r)) {
        d->layers = calloc((size_t)d->n_layers, sizeof *d->layers);
        if (!d->layers)
            r->st = err_set(r->err, STATUS_NOMEM, "%s: out of memory", r->what);
    }
}

static void desc_check_routing(struct model_desc *d, struct cfg_reader *r)
{
    if (!cfg_ok(r) || d->n_experts == 0)
        return;
    if (d->n_experts_used < 1 || d->n_experts_used > d->n_experts)
        cfg_fail(r, STATUS_FORMAT, "num_experts_per_tok", "must be in [1, number of experts]");
    else if (d->n_group < 1 || d->n_experts % d->n_group != 0)
        cfg_fail(r, STATUS_FORMAT, "n_group", "must divide the number of routed experts");
    else if (d->topk_group < 1 || d->topk_group > d->n_group)
        cfg_fail(r, STATUS_FORMAT, "topk_group", "must be in [1, n_group]");
    else if (d->n_group > 1 && d->n_experts / d->n_group < 2)
        cfg_fail(r, STATUS_FORMAT, "n_group", "leaves fewer than 2 experts per group");
    else if (d->n_experts_used > d->topk_group * (d->n_experts / d->n_group))
        cfg_fail(r, STATUS_FORMAT, "num_experts_per_tok", "exceeds the experts of the kept groups");
}

static void desc_parse_gqa_rope(struct model_desc *d, struct cfg_reader *r, double partial_default)
{
    cfg_rope(r, &d->rope);
    if (!cfg_ok(r))
        return;
    double prf = cfg_partial_rotary(r, partial_default);
    d->rope.dim = (int)(d->head_dim * prf);
    d->rope.dim -= d->rope.dim % 2;
    d->rope.offset = 0;
    d->rope.layout = ROPE_HALF_SPLIT;
    if (d->rope.dim < 2)
        cfg_fail(r, STATUS_FORMAT, "partial_rotary_factor", "leaves fewer than 2 rotary dims");
    d->attn_scale = 1.0f / sqrtf((float)d->head_dim);
}

static void desc_parse_qwen3_moe(struct model_desc *d, struct cfg_reader *r)
{
    d->head_dim = cfg_int(r, "head_dim", false, d->n_heads ? d->d_model / d->n_heads : 0, 1, 1 << 16);
    bool bias = cfg_bool(r, "attention_bias", false);
    d->qkv_bias = bias;
    d->o_bias = bias;
    d->qk_norm = true;
    desc_parse_gqa_rope(d, r, 1.0);
    if (cfg_bool(r, "use_sliding_window", false))
        cfg_fail(r, STATUS_UNSUPPORTED, "use_sliding_window", "= true is not supported");
    d->d_ff = cfg_int(r, "intermediate_size", false, 0, 0, 1 << 20);
    d->d_expert = cfg_int(r, "moe_intermediate_size", false, 0, 0, 1 << 20);
    /* transformers 5 saves num_local_experts; released checkpoints say num_experts */
    const char *ne_key = json_is_null(json_get(r->root, "num_experts")) ? "num_local_experts" : "num_experts";
    d->n_experts = cfg_int(r, ne_key, false, 0, 0, 1 << 16);
    d->n_experts_used = cfg_int(r, "num_experts_per_tok", false, 1, 1, 1 << 16);
    d->norm_topk_prob = cfg_bool(r, "norm_topk_prob", false);
    d->norm_topk_eps = 0.0f;
    d->routed_scaling = 1.0f;
    d->router = ROUTER_SOFTMAX;
    d->n_group = 1;
    d->topk_group = 1;
    int step = cfg_int(r, "decoder_sparse_step", false, 1, 1, 1 << 16);
    const struct json *only = json_get(r->root, "mlp_only_layers");
    if (!json_is_null(only) && !json_is_array(only))
        cfg_fail(r, STATUS_FORMAT, "mlp_only_layers", "is not an array");
    if (!cfg_ok(r))
        return;
    for (int l = 0; l < d->n_layers; l++) {
        bool dense_only = false;
        for (size_t i = 0; i < json_array_size(only); i++)
            if ((int)json_number(json_array_at(only, i)) == l)
                dense_only = true;
        bool moe = !dense_only && d->n_experts > 0 && (l + 1) % step == 0;
        d->layers[l] = (struct layer_desc){.attn = ATTN_GQA, .ffn = moe ? FFN_MOE : FFN_DENSE};
    }
}

/* GLM-family MoE fields shared by glm4_moe and glm_moe_dsa (spec B.3 / C.6). */
static void desc_parse_glm_moe(struct model_desc *d, struct cfg_reader *r)
{
    d->d_ff = cfg_int(r, "intermediate_size", false, 0, 0, 1 << 20);
    d->d_expert = cfg_int(r, "moe_intermediate_size", false, 0, 0, 1 << 20);
    d->n_experts = cfg_int(r, "n_routed_experts", false, 0, 0, 1 << 16);
    d->n_experts_used = cfg_int(r, "num_experts_per_tok", false, 1, 1, 1 << 16);
    d->n_shared_experts = cfg_int(r, "n_shared_experts", false, 0, 0, 64);
    d->n_group = cfg_int(r, "n_group", false, 1, 1, 1 << 16);
    d->topk_group = cfg_int(r, "topk_group", false, 1, 1, 1 << 16);
    d->norm_topk_prob = cfg_bool(r, "norm_topk_prob", true);
    d->norm_topk_eps = 1e-20f;
    d->routed_scaling = (float)cfg_num(r, "routed_scaling_factor", 1.0, 0, 1e6);
    d->router = ROUTER_SIGMOID;
    d->has_correction_bias = true;
}

static void desc_parse_glm4_moe(struct model_desc *d, struct cfg_reader *r)
{
    d->head_dim = cfg_int(r, "head_dim", false, d->n_heads ? d->d_model / d->n_heads : 0, 1, 1 << 16);
    d->qkv_bias = cfg_bool(r, "attention_bias", false);
    d->o_bias = false;
    d->qk_norm = cfg_bool(r, "use_qk_norm", false);
    desc_parse_gqa_rope(d, r, 0.5);
    desc_parse_glm_moe(d, r);
    int first_dense = cfg_int(r, "first_k_dense_replace", false, 1, 0, 1 << 16);
    if (!cfg_ok(r))
        return;
    for (int l = 0; l < d->n_layers; l++) {
        bool moe = l >= first_dense && d->n_experts > 0;
        d->layers[l] = (struct layer_desc){.attn = ATTN_GQA, .ffn = moe ? FFN_MOE : FFN_DENSE};
    }
}

/* indexer_types list, else index_topk_pattern, else the freq/offset formula (spec C.5). */
static void desc_parse_indexer_types(struct model_desc *d, struct cfg_reader *r)
{
    const struct json *types = json_get(r->root, "indexer_types");
    const char *pattern = json_string(json_get(r->root, "index_topk_pattern"));
    int freq = cfg_int(r, "index_topk_freq", false, 1, 0, 1 << 16);
    int off = cfg_int(r, "index_skip_topk_offset", false, 2, 0, 1 << 16);
    if (freq < 1)
        freq = 1;
    if (!json_is_null(types) && (!json_is_array(types) || json_array_size(types) < (size_t)d->n_layers)) {
        cfg_fail(r, STATUS_FORMAT, "indexer_types", "must list a type for every layer");
        return;
    }
    if (pattern && strlen(pattern) < (size_t)d->n_layers) {
        cfg_fail(r, STATUS_FORMAT, "index_topk_pattern", "is shorter than num_hidden_layers");
        return;
    }
    for (int l = 0; l < d->n_layers && cfg_ok(r); l++) {
        bool full;
        if (!json_is_null(types)) {
            const char *t = json_string(json_array_at(types, (size_t)l));
            if (!t || (strcmp(t, "full") != 0 && strcmp(t, "shared") != 0)) {
                cfg_fail(r, STATUS_FORMAT, "indexer_types", "entries must be \"full\" or \"shared\"");
                return;
            }
            full = strcmp(t, "full") == 0;
        } else if (pattern) {
            full = pattern[l] == 'F' || pattern[l] == 'f';
        } else {
            int x = l - off + 1;
            full = (x < 0 ? 0 : x) % freq == 0;
        }
        d->layers[l].indexer = full ? INDEXER_FULL : INDEXER_SHARED;
    }
    if (cfg_ok(r) && d->layers[0].indexer != INDEXER_FULL)
        cfg_fail(r, STATUS_FORMAT, "indexer_types", "must make layer 0 \"full\"");
}

static void desc_parse_glm_moe_dsa(struct model_desc *d, struct cfg_reader *r)
{
    d->q_lora_rank = cfg_int(r, "q_lora_rank", true, 0, 1, 1 << 16);
    d->kv_lora_rank = cfg_int(r, "kv_lora_rank", true, 0, 1, 1 << 16);
    d->qk_nope_head_dim = cfg_int(r, "qk_nope_head_dim", true, 0, 1, 1 << 16);
    d->qk_rope_head_dim = cfg_int(r, "qk_rope_head_dim", true, 0, 2, 1 << 16);
    d->v_head_dim = cfg_int(r, "v_head_dim", true, 0, 1, 1 << 16);
    d->mla_bias = cfg_bool(r, "attention_bias", false);
    d->index_n_heads = cfg_int(r, "index_n_heads", false, 32, 1, 4096);
    d->index_head_dim = cfg_int(r, "index_head_dim", false, 128, 1, 1 << 16);
    d->index_topk = cfg_int(r, "index_topk", false, 2048, 1, 1 << 30);
    d->head_dim = d->qk_rope_head_dim; /* the config class overwrites it (spec C.1) */
    d->n_kv_heads = d->n_heads;
    cfg_rope(r, &d->rope);
    if (!cfg_ok(r))
        return;
    d->rope.dim = d->qk_rope_head_dim;
    d->rope.offset = d->qk_nope_head_dim;
    d->rope.layout = ROPE_INTERLEAVED;
    if (d->qk_rope_head_dim % 2 || d->index_head_dim <= d->qk_rope_head_dim)
        cfg_fail(r, STATUS_FORMAT, "qk_rope_head_dim", "must be even and smaller than index_head_dim");
    float scale = 1.0f / sqrtf((float)(d->qk_nope_head_dim + d->qk_rope_head_dim));
    if (d->rope.type != ROPE_TYPE_DEFAULT && d->rope.mscale_all_dim != 0) {
        double m = yarn_mscale(d->rope.factor, d->rope.mscale_all_dim);
        scale *= (float)(m * m);
    }
    d->attn_scale = scale;
    desc_parse_glm_moe(d, r);
    const struct json *mlp_types = json_get(r->root, "mlp_layer_types");
    int first_dense = cfg_int(r, "first_k_dense_replace", false, 3, 0, 1 << 16);
    if (!json_is_null(mlp_types) && (!json_is_array(mlp_types) || json_array_size(mlp_types) < (size_t)d->n_layers))
        cfg_fail(r, STATUS_FORMAT, "mlp_layer_types", "must list a type for every layer");
    if (!cfg_ok(r))
        return;
    for (int l = 0; l < d->n_layers; l++) {
        bool moe;
        if (!json_is_null(mlp_types)) {
            const char *t = json_string(json_array_at(mlp_types, (size_t)l));
            moe = t && strcmp(t, "sparse") == 0;
        } else {
            moe = l >= first_dense;
        }
        moe = moe && d->n_experts > 0;
        d->layers[l] = (struct layer_desc){.attn = ATTN_MLA, .ffn = moe ? FFN_MOE : FFN_DENSE};
    }
    desc_parse_indexer_types(d, r);
}

static const struct {
    const char *model_type;
    enum model_family family;
    void (*parse)(struct model_desc *, struct cfg_reader *);
} FAMILIES[] = {
    {"qwen3_moe", MODEL_QWEN3_MOE, desc_parse_qwen3_moe},
    {"glm4_moe", MODEL_GLM4_MOE, desc_parse_glm4_moe},
    {"glm_moe_dsa", MODEL_GLM_MOE_DSA, desc_parse_glm_moe_dsa},
};

enum status model_desc_parse(struct model_desc *d, const struct json *cfg, const char *what,
                             struct err *err)
{
    memset(d, 0, sizeof *d);
    d->bos_id = -1;
    if (!json_is_object(cfg))
        return err_set(err, STATUS_FORMAT, "%s: not a JSON object", what);
    const char *mt = json_string(json_get(cfg, "model_type"));
    if (!mt)
        return err_set(err, STATUS_FORMAT, "%s: field \"model_type\" is missing", what);
    size_t fi = 0;
    while (fi < sizeof FAMILIES / sizeof FAMILIES[0] && strcmp(FAMILIES[fi].model_type, mt) != 0)
        fi++;
    if (fi == sizeof FAMILIES / sizeof FAMILIES[0])
        return err_set(err, STATUS_UNSUPPORTED,
                       "%s: model_type \"%s\" is not supported (supported: qwen3_moe, glm4_moe, glm_moe_dsa)",
                       what, mt);
    struct cfg_reader r = {.root = cfg, .what = what, .err = err};
    d->family = FAMILIES[fi].family;
    const char *act = json_string(json_get(cfg, "hidden_act"));
    if (act && strcmp(act, "silu") != 0)
        cfg_fail(&r, STATUS_UNSUPPORTED, "hidden_act", "is not \"silu\"");
    desc_parse_common(d, &r);
    if (cfg_ok(&r))
        FAMILIES[fi].parse(d, &r);
    desc_check_routing(d, &r);
    if (cfg_ok(&r)) {
        for (int l = 0; l < d->n_layers; l++) {
            if (d->layers[l].ffn == FFN_DENSE && d->d_ff <= 0)
                cfg_fail(&r, STATUS_FORMAT, "intermediate_size", "must be positive (dense layers exist)");
            if (d->layers[l].ffn == FFN_MOE && d->d_expert <= 0)
                cfg_fail(&r, STATUS_FORMAT, "moe_intermediate_size", "must be positive (MoE layers exist)");
        }
    }
    if (!cfg_ok(&r)) {
        model_desc_free(d);
        return r.st;
    }
    return STATUS_OK;
}

enum status model_desc_load(struct model_desc *d, const char *dir, struct err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct json *cfg = NULL;
    enum status st = json_parse_file(path, &cfg, err);
    if (st)
        return st;
    st = model_desc_parse(d, cfg, path, err);
    json_free(cfg);
    if (st)
        return st;
    /* generation_config.json overrides eos ids when present (what generate() uses) */
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct json *gen = NULL;
    struct err ignored = {0};
    if (json_parse_file(path, &gen, &ignored) == STATUS_OK) {
        desc_read_eos(d, json_get(gen, "eos_token_id"));
        const struct json *bos = json_get(gen, "bos_token_id");
        if (json_is_number(bos))
            d->bos_id = (int)json_number(bos);
        json_free(gen);
    }
    return STATUS_OK;
}

void model_desc_free(struct model_desc *d)
{
    free(d->layers);
    d->layers = NULL;
}

const char *model_family_name(enum model_family f)
{
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++)
        if (FAMILIES[i].family == f)
            return FAMILIES[i].model_type;
    return "?";
}

size_t model_desc_kv_elems_per_token(const struct model_desc *d, int layer)
{
    if (d->layers[layer].attn == ATTN_MLA) {
        size_t n = (size_t)d->kv_lora_rank + (size_t)d->qk_rope_head_dim;
        if (d->layers[layer].indexer == INDEXER_FULL)
            n += (size_t)d->index_head_dim;
        return n;
    }
    return 2 * (size_t)d->n_kv_heads * (size_t)d->head_dim;
}
