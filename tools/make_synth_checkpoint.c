/* make_synth_checkpoint.c — a large random checkpoint with real shapes, for benchmarks.
 *
 * Writes DIR/config.json, DIR/generation_config.json and DIR/model.safetensors
 * (BF16, per-expert tensor names as released checkpoints have them). Values
 * are pseudo-random (never zeros: zeros make matmuls look faster than real
 * data) with std 1/sqrt(fan_in), norms near 1, so activations stay O(1) and
 * routing spreads over experts. Nothing here is committed: benchmarks make it
 * on the machine that runs them.
 *
 * usage: make_synth_checkpoint --out DIR [--preset cpu-bench|qwen3-30b-a3b] [--layers N] [--seed S]
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/dtype.h"

struct shape_preset {
    const char *name;
    int vocab, d_model, n_layers, n_heads, n_kv, head_dim, n_experts, k, d_expert;
};

static const struct shape_preset PRESETS[] = {
    /* hidden 2048, 8 layers, 64 experts top-8: the CPU decode benchmark of issue 2 */
    {"cpu-bench", 151936, 2048, 8, 32, 4, 128, 64, 8, 768},
    /* Qwen3-30B-A3B (spec/models.md A.1) */
    {"qwen3-30b-a3b", 151936, 2048, 48, 32, 4, 128, 128, 8, 768},
};

struct tensor_spec {
    char name[160];
    int64_t rows, cols; /* cols == 0: a vector of `rows` */
    int kind;           /* 0 matrix, 1 norm */
    uint64_t offset;
};

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64*: fast, and plenty for benchmark data */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int write_tensor(FILE *fp, const struct tensor_spec *t, uint64_t *rng, uint16_t *buf, size_t buf_n)
{
    uint64_t n = (uint64_t)t->rows * (uint64_t)(t->cols ? t->cols : 1);
    float amp = t->kind == 1 ? 0.2f : sqrtf(3.0f / (float)(t->cols ? t->cols : 1)); /* uniform, std 1/sqrt(fan_in) */
    while (n) {
        size_t m = n < buf_n ? (size_t)n : buf_n;
        for (size_t i = 0; i < m; i++) {
            uint64_t r = rng_next(rng);
            float u = (float)(r >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; /* [-1, 1) */
            float v = t->kind == 1 ? 1.0f + amp * u : amp * u;
            buf[i] = f32_to_bf16(v);
        }
        if (fwrite(buf, 2, m, fp) != m)
            return -1;
        n -= m;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *preset = "cpu-bench";
    int layers = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--preset") && i + 1 < argc)
            preset = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10) | 1;
        else {
            fprintf(stderr, "usage: %s --out DIR [--preset cpu-bench|qwen3-30b-a3b] [--layers N] [--seed S]\n",
                    argv[0]);
            return 2;
        }
    }
    const struct shape_preset *p = NULL;
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (!strcmp(PRESETS[i].name, preset))
            p = &PRESETS[i];
    if (!out || !p) {
        fprintf(stderr, "make_synth_checkpoint: need --out DIR and a known --preset\n");
        return 2;
    }
    struct shape_preset s = *p;
    if (layers > 0)
        s.n_layers = layers;
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "make_synth_checkpoint: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    size_t max_t = 8 + (size_t)s.n_layers * (9 + 3 * (size_t)s.n_experts);
    struct tensor_spec *ts = calloc(max_t, sizeof *ts);
    size_t nt = 0;
#define ADD(kind_, rows_, cols_, ...)                                                                          \
    do {                                                                                                       \
        snprintf(ts[nt].name, sizeof ts[nt].name, __VA_ARGS__);                                                \
        ts[nt].rows = (rows_);                                                                                 \
        ts[nt].cols = (cols_);                                                                                 \
        ts[nt].kind = (kind_);                                                                                 \
        nt++;                                                                                                  \
    } while (0)
    int64_t D = s.d_model, qd = (int64_t)s.n_heads * s.head_dim, kvd = (int64_t)s.n_kv * s.head_dim;
    ADD(0, s.vocab, D, "model.embed_tokens.weight");
    for (int l = 0; l < s.n_layers; l++) {
        ADD(1, D, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(1, D, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(0, qd, D, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(0, kvd, D, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(0, kvd, D, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(0, D, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(1, s.head_dim, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        ADD(1, s.head_dim, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        ADD(0, s.n_experts, D, "model.layers.%d.mlp.gate.weight", l);
        for (int e = 0; e < s.n_experts; e++) {
            ADD(0, s.d_expert, D, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            ADD(0, s.d_expert, D, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            ADD(0, D, s.d_expert, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
        }
    }
    ADD(1, D, 0, "model.norm.weight");
    ADD(0, s.vocab, D, "lm_head.weight");
#undef ADD
    /* header: {"name":{"dtype":"BF16","shape":[..],"data_offsets":[a,b]},...} */
    size_t hcap = nt * 256 + 64, hl = 0;
    char *hdr = malloc(hcap);
    uint64_t off = 0;
    hl += (size_t)snprintf(hdr + hl, hcap - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < nt; i++) {
        uint64_t bytes = (uint64_t)ts[i].rows * (uint64_t)(ts[i].cols ? ts[i].cols : 1) * 2;
        ts[i].offset = off;
        if (ts[i].cols)
            hl += (size_t)snprintf(hdr + hl, hcap - hl,
                                   ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
                                   ts[i].name, (long long)ts[i].rows, (long long)ts[i].cols,
                                   (unsigned long long)off, (unsigned long long)(off + bytes));
        else
            hl += (size_t)snprintf(hdr + hl, hcap - hl,
                                   ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],\"data_offsets\":[%llu,%llu]}",
                                   ts[i].name, (long long)ts[i].rows, (unsigned long long)off,
                                   (unsigned long long)(off + bytes));
        off += bytes;
    }
    hl += (size_t)snprintf(hdr + hl, hcap - hl, "}");
    while (hl % 8) /* data section 8-byte aligned, as the reference writer does */
        hdr[hl++] = ' ';
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        fprintf(stderr, "make_synth_checkpoint: cannot write %s\n", path);
        return 1;
    }
    uint64_t hlen = hl;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(hlen >> (8 * i));
    fwrite(le, 1, 8, fp);
    fwrite(hdr, 1, hl, fp);
    size_t buf_n = 1 << 20;
    uint16_t *buf = malloc(buf_n * 2);
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < nt; i++) {
        if (write_tensor(fp, &ts[i], &rng, buf, buf_n) != 0) {
            fprintf(stderr, "make_synth_checkpoint: write failed on %s (disk full?)\n", path);
            return 1;
        }
        if (i % 64 == 0)
            fprintf(stderr, "\rwriting %s: %5.1f%%", path, 100.0 * (double)ts[i].offset / (double)off);
    }
    if (fclose(fp) != 0) {
        fprintf(stderr, "make_synth_checkpoint: write failed on %s\n", path);
        return 1;
    }
    fprintf(stderr, "\rwrote %s: %.2f GB, %zu tensors\n", path, (double)off / 1e9, nt);
    snprintf(path, sizeof path, "%s/config.json", out);
    fp = fopen(path, "w");
    fprintf(fp,
            "{\n  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n  \"model_type\": \"qwen3_moe\",\n"
            "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n"
            "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
            "  \"intermediate_size\": %d,\n  \"moe_intermediate_size\": %d,\n  \"num_experts\": %d,\n"
            "  \"num_experts_per_tok\": %d,\n  \"norm_topk_prob\": true,\n  \"decoder_sparse_step\": 1,\n"
            "  \"mlp_only_layers\": [],\n  \"rms_norm_eps\": 1e-06,\n  \"rope_theta\": 1000000.0,\n"
            "  \"attention_bias\": false,\n  \"tie_word_embeddings\": false,\n"
            "  \"max_position_embeddings\": 40960,\n  \"hidden_act\": \"silu\",\n  \"torch_dtype\": \"bfloat16\"\n}\n",
            s.vocab, s.d_model, s.n_layers, s.n_heads, s.n_kv, s.head_dim, 6144, s.d_expert, s.n_experts, s.k);
    fclose(fp);
    free(buf);
    free(hdr);
    free(ts);
    return 0;
}
