/* synth_preset.c — see synth_preset.h. */
#include "model/synth_preset.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"

/* one preset per few lines reads better than one field per line */
/* clang-format off */
static const struct synth_preset PRESETS[] = {
    /* seconds to write and to run on a CPU: the command-line tests */
    {.name = "tiny", .family = SYNTH_QWEN3_MOE, .vocab = 1024, .d_model = 256, .n_layers = 2, .n_heads = 4,
     .n_kv = 2, .head_dim = 64, .n_experts = 8, .k = 2, .d_expert = 128},
    /* hidden 2048, 8 layers, 64 experts top-8: the CPU decode benchmark of issue 2 */
    {.name = "cpu-bench", .family = SYNTH_QWEN3_MOE, .vocab = 151936, .d_model = 2048, .n_layers = 8,
     .n_heads = 32, .n_kv = 4, .head_dim = 128, .n_experts = 64, .k = 8, .d_expert = 768, .eos = 151645},
    /* Qwen3-30B-A3B (spec/models.md A.1); eos_token_id 151645 (<|im_end|>) as its config.json has it */
    {.name = "qwen3-30b-a3b", .family = SYNTH_QWEN3_MOE, .vocab = 151936, .d_model = 2048, .n_layers = 48,
     .n_heads = 32, .n_kv = 4, .head_dim = 128, .n_experts = 128, .k = 8, .d_expert = 768, .eos = 151645},
    /* GLM-5 (spec C.1) over 4 layers by default, 1 dense + MoE: the slice benchmark of issue 7.
     * head_dim = qk_rope_head_dim, as the config class sets it; n_kv = n_heads (no GQA). */
    {.name = "glm5-slice", .family = SYNTH_GLM_MOE_DSA, .vocab = 154880, .d_model = 6144, .n_layers = 4,
     .n_heads = 64, .n_kv = 64, .head_dim = 64, .n_experts = 256, .k = 8, .d_expert = 2048, .n_dense = 1,
     .d_ff = 12288, .n_shared = 1, .q_lora = 2048, .kv_lora = 512, .nope = 192, .rope = 64, .v_dim = 256,
     .index_heads = 32, .index_dim = 128, .index_topk = 2048},
    /* glm_moe_dsa in miniature (1 dense + 1 MoE layer, MLA, an indexer keeping 8 keys): CPU ranks in CI shard
     * MLA heads, the indexer and experts of a synthetic model; every in-feature count a multiple of 16 twice over */
    {.name = "glm-tiny", .family = SYNTH_GLM_MOE_DSA, .vocab = 1024, .d_model = 256, .n_layers = 2, .n_heads = 4,
     .n_kv = 4, .head_dim = 16, .n_experts = 8, .k = 2, .d_expert = 64, .n_dense = 1, .d_ff = 256, .n_shared = 1,
     .q_lora = 64, .kv_lora = 32, .nope = 16, .rope = 16, .v_dim = 16, .index_heads = 2, .index_dim = 32,
     .index_topk = 8},
    /* GLM-5 whole (spec C.1: 78 layers, the first 3 dense; the MTP layer is not run): `bench --synthetic glm5`
     * on 8 GPUs, weights made on each */
    {.name = "glm5", .family = SYNTH_GLM_MOE_DSA, .vocab = 154880, .d_model = 6144, .n_layers = 78,
     .n_heads = 64, .n_kv = 64, .head_dim = 64, .n_experts = 256, .k = 8, .d_expert = 2048, .n_dense = 3,
     .d_ff = 12288, .n_shared = 1, .q_lora = 2048, .kv_lora = 512, .nope = 192, .rope = 64, .v_dim = 256,
     .index_heads = 32, .index_dim = 128, .index_topk = 2048},
};
/* clang-format on */


/* The module patterns `moeserve quantize` leaves unquantized by default: keep this list equal to
 * DEFAULT_EXCLUDES in src/engine/quantize.c, so a synthetic NVFP4 model is what quantizing a real
 * BF16 checkpoint would give, and the loader's check against quantization_config agrees. */
static const char *const EXCLUDES[] = {"lm_head", "*embed_tokens*", "*.mlp.gate", "*.mlp.shared_expert_gate",
                                       "*.indexer.weights_proj"};

bool synth_preset_excluded(const char *module)
{
    for (size_t i = 0; i < sizeof EXCLUDES / sizeof EXCLUDES[0]; i++)
        if (fnmatch(EXCLUDES[i], module, 0) == 0)
            return true;
    return false;
}

static enum status write_json_file(const char *path, const struct json *j, struct err *err)
{
    char *s = json_print(j, true);
    FILE *fp = fopen(path, "w");
    bool ok = s && fp && fputs(s, fp) >= 0 && fputc('\n', fp) != EOF;
    if (fp && fclose(fp) != 0)
        ok = false;
    free(s);
    return ok ? STATUS_OK : err_set(err, STATUS_IO, "cannot write %s", path);
}

/* The excludes the weights were made with (EXCLUDES), as `moeserve quantize` writes them. */
static struct json *synth_excludes(void)
{
    struct json *a = json_new_array();
    for (size_t i = 0; i < sizeof EXCLUDES / sizeof EXCLUDES[0]; i++)
        json_append(a, json_new_string(EXCLUDES[i]));
    return a;
}

static struct json *synth_quant_config(void)
{
    struct json *qc = json_new_object();
    struct json *groups = json_add(qc, "config_groups", json_new_object());
    struct json *g0 = json_add(groups, "group_0", json_new_object());
    json_append(json_add(g0, "targets", json_new_array()), json_new_string("Linear"));
    const char *side[2] = {"weights", "input_activations"};
    for (int i = 0; i < 2; i++) {
        struct json *w = json_add(g0, side[i], json_new_object());
        json_add(w, "num_bits", json_new_number(4));
        json_add(w, "type", json_new_string("float"));
        json_add(w, "group_size", json_new_number(16));
        json_add(w, "dynamic", json_new_bool(false));
        json_add(w, "symmetric", json_new_bool(true));
    }
    json_add(qc, "quant_algo", json_new_string("NVFP4"));
    json_add(qc, "group_size", json_new_number(16));
    json_add(qc, "quant_method", json_new_string("modelopt"));
    json_add(qc, "ignore", synth_excludes());
    struct json *prod = json_add(qc, "producer", json_new_object());
    json_add(prod, "name", json_new_string("moeserve make_synth_checkpoint"));
    json_add(prod, "version", json_new_string("0.1"));
    return qc;
}

static struct json *synth_config_qwen3_moe(const struct synth_preset *s)
{
    struct json *c = json_new_object();
    json_append(json_add(c, "architectures", json_new_array()), json_new_string("Qwen3MoeForCausalLM"));
    json_add(c, "model_type", json_new_string("qwen3_moe"));
    json_add(c, "vocab_size", json_new_number(s->vocab));
    json_add(c, "hidden_size", json_new_number(s->d_model));
    json_add(c, "num_hidden_layers", json_new_number(s->n_layers));
    json_add(c, "num_attention_heads", json_new_number(s->n_heads));
    json_add(c, "num_key_value_heads", json_new_number(s->n_kv));
    json_add(c, "head_dim", json_new_number(s->head_dim));
    /* dense FFN width: no layer has one */
    json_add(c, "intermediate_size", json_new_number(s->d_expert * 8));
    json_add(c, "moe_intermediate_size", json_new_number(s->d_expert));
    json_add(c, "num_experts", json_new_number(s->n_experts));
    json_add(c, "num_experts_per_tok", json_new_number(s->k));
    json_add(c, "norm_topk_prob", json_new_bool(true));
    json_add(c, "decoder_sparse_step", json_new_number(1));
    json_add(c, "mlp_only_layers", json_new_array());
    json_add(c, "rms_norm_eps", json_new_number(1e-6));
    json_add(c, "rope_theta", json_new_number(1000000.0));
    json_add(c, "attention_bias", json_new_bool(false));
    json_add(c, "tie_word_embeddings", json_new_bool(false));
    json_add(c, "max_position_embeddings", json_new_number(40960));
    json_add(c, "hidden_act", json_new_string("silu"));
    json_add(c, "torch_dtype", json_new_string("bfloat16"));
    if (s->eos)
        json_add(c, "eos_token_id", json_new_number(s->eos));
    return c;
}

/* The keys transformers 5.17 writes for glm_moe_dsa (tests/golden/dsa/ fixtures): head_dim =
 * qk_rope_head_dim, explicit per-layer mlp_layer_types and indexer_types. GLM-5 values (spec C.1)
 * except the dense layer count (see the top of the file). */
static struct json *synth_config_glm_moe_dsa(const struct synth_preset *s)
{
    struct json *c = json_new_object();
    json_append(json_add(c, "architectures", json_new_array()), json_new_string("GlmMoeDsaForCausalLM"));
    json_add(c, "model_type", json_new_string("glm_moe_dsa"));
    json_add(c, "vocab_size", json_new_number(s->vocab));
    json_add(c, "hidden_size", json_new_number(s->d_model));
    json_add(c, "num_hidden_layers", json_new_number(s->n_layers));
    json_add(c, "num_attention_heads", json_new_number(s->n_heads));
    json_add(c, "num_key_value_heads", json_new_number(s->n_kv));
    json_add(c, "head_dim", json_new_number(s->rope));
    json_add(c, "q_lora_rank", json_new_number(s->q_lora));
    json_add(c, "kv_lora_rank", json_new_number(s->kv_lora));
    json_add(c, "qk_nope_head_dim", json_new_number(s->nope));
    json_add(c, "qk_rope_head_dim", json_new_number(s->rope));
    json_add(c, "qk_head_dim", json_new_number(s->nope + s->rope));
    json_add(c, "v_head_dim", json_new_number(s->v_dim));
    json_add(c, "index_n_heads", json_new_number(s->index_heads));
    json_add(c, "index_head_dim", json_new_number(s->index_dim));
    json_add(c, "index_topk", json_new_number(s->index_topk));
    struct json *it = json_add(c, "indexer_types", json_new_array());
    struct json *lt = json_add(c, "layer_types", json_new_array());
    struct json *mt = json_add(c, "mlp_layer_types", json_new_array());
    for (int l = 0; l < s->n_layers; l++) {
        json_append(it, json_new_string("full"));
        json_append(lt, json_new_string("deepseek_sparse_attention"));
        json_append(mt, json_new_string(l < s->n_dense ? "dense" : "sparse"));
    }
    json_add(c, "first_k_dense_replace", json_new_number(s->n_dense));
    json_add(c, "intermediate_size", json_new_number(s->d_ff));
    json_add(c, "moe_intermediate_size", json_new_number(s->d_expert));
    json_add(c, "n_routed_experts", json_new_number(s->n_experts));
    json_add(c, "n_shared_experts", json_new_number(s->n_shared));
    json_add(c, "num_experts_per_tok", json_new_number(s->k));
    json_add(c, "n_group", json_new_number(1));
    json_add(c, "topk_group", json_new_number(1));
    json_add(c, "norm_topk_prob", json_new_bool(true));
    json_add(c, "routed_scaling_factor", json_new_number(2.5));
    json_add(c, "rms_norm_eps", json_new_number(1e-5));
    struct json *rp = json_add(c, "rope_parameters", json_new_object());
    json_add(rp, "rope_theta", json_new_number(1000000.0));
    json_add(rp, "rope_type", json_new_string("default"));
    json_add(c, "attention_bias", json_new_bool(false));
    json_add(c, "attention_dropout", json_new_number(0));
    json_add(c, "mlp_bias", json_new_bool(false));
    json_add(c, "tie_word_embeddings", json_new_bool(false));
    /* not in spec C.1 (GLM-5's 200K context); only has to exceed any bench context */
    json_add(c, "max_position_embeddings", json_new_number(202752));
    json_add(c, "hidden_act", json_new_string("silu"));
    json_add(c, "dtype", json_new_string("bfloat16"));
    json_add(c, "use_cache", json_new_bool(true));
    return c;
}

enum status synth_preset_write(const struct synth_preset *s, bool nvfp4, const char *out, struct err *err)
{
    char path[4096];
    struct json *c =
        s->family == SYNTH_GLM_MOE_DSA ? synth_config_glm_moe_dsa(s) : synth_config_qwen3_moe(s);
    if (nvfp4)
        json_add(c, "quantization_config", synth_quant_config());
    snprintf(path, sizeof path, "%s/config.json", out);
    enum status rc = write_json_file(path, c, err);
    json_free(c);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", out);
    if (rc || !nvfp4) {
        remove(path); /* a bf16 checkpoint written over an nvfp4 one must not keep its quant config */
        return rc;
    }
    struct json *h = json_new_object();
    struct json *prod = json_add(h, "producer", json_new_object());
    json_add(prod, "name", json_new_string("moeserve make_synth_checkpoint"));
    json_add(prod, "version", json_new_string("0.1"));
    struct json *qs = json_add(h, "quantization", json_new_object());
    json_add(qs, "quant_algo", json_new_string("NVFP4"));
    json_add(qs, "kv_cache_quant_algo", json_new_null());
    json_add(qs, "group_size", json_new_number(16));
    json_add(qs, "exclude_modules", synth_excludes());
    rc = write_json_file(path, h, err);
    json_free(h);
    return rc;
}


const struct synth_preset *synth_preset_find(const char *name)
{
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (name && !strcmp(PRESETS[i].name, name))
            return &PRESETS[i];
    return NULL;
}

const char *synth_preset_names(void)
{
    return "tiny, cpu-bench, qwen3-30b-a3b, glm-tiny, glm5-slice, glm5";
}

/* The files a checkpoint directory carries beside its weights that a preset's directory may borrow. */
static const char *const DIR_FILES[] = {"config.json", "hf_quant_config.json", "tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json"};

/* dir/name -> out/name byte for byte; absent (not a regular file): nothing, STATUS_OK. */
static enum status copy_if_present(const char *dir, const char *name, const char *out, struct err *err)
{
    char src[4096], dst[160];
    snprintf(src, sizeof src, "%s/%s", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", out, name);
    struct stat sb;
    if (stat(src, &sb) != 0 || !S_ISREG(sb.st_mode))
        return STATUS_OK;
    FILE *in = fopen(src, "rb"), *o = in ? fopen(dst, "wb") : NULL;
    bool ok = in && o;
    char buf[1 << 16];
    for (size_t n; ok && (n = fread(buf, 1, sizeof buf, in)) > 0;)
        ok = fwrite(buf, 1, n, o) == n;
    ok = ok && !ferror(in);
    if (in)
        fclose(in);
    if (o && fclose(o) != 0)
        ok = false;
    return ok ? STATUS_OK : err_set(err, STATUS_IO, "cannot copy %s to %s: %s", src, dst, strerror(errno));
}

enum status synth_preset_dir(const char *name, bool nvfp4, int layers, const char *tokenizer_dir, const char *tmp_root,
                             char dir[64], struct err *err)
{
    dir[0] = 0;
    const struct synth_preset *p = synth_preset_find(name);
    if (!p)
        return err_set(err, STATUS_INVALID, "--synthetic %s: no such preset (have: %s)", name ? name : "(none)",
                       synth_preset_names());
    struct synth_preset ps = *p;
    if (layers > 0)
        ps.n_layers = layers;
    snprintf(dir, 64, "%s/moeserve-synth-XXXXXX", tmp_root && *tmp_root && strlen(tmp_root) <= 40 ? tmp_root : "/tmp");
    if (!mkdtemp(dir)) {
        dir[0] = 0;
        return err_set(err, STATUS_IO, "--synthetic: cannot make a temporary directory: %s", strerror(errno));
    }
    enum status st = synth_preset_write(&ps, nvfp4, dir, err);
    for (size_t i = 2; !st && tokenizer_dir && i < sizeof DIR_FILES / sizeof DIR_FILES[0]; i++)
        st = copy_if_present(tokenizer_dir, DIR_FILES[i], dir, err);
    if (st)
        synth_preset_dir_remove(dir), dir[0] = 0;
    return st;
}

void synth_preset_dir_remove(const char *dir)
{
    if (!dir || !dir[0])
        return;
    char path[160];
    for (size_t i = 0; i < sizeof DIR_FILES / sizeof DIR_FILES[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, DIR_FILES[i]);
        (void)remove(path);
    }
    (void)rmdir(dir);
}
