/* make_synth_checkpoint.c — a large random checkpoint with real shapes, for benchmarks.
 *
 * Writes DIR/config.json and DIR/model.safetensors (per-expert tensor names,
 * as released checkpoints have them) of a qwen3_moe model (presets tiny,
 * cpu-bench, qwen3-30b-a3b) or a glm_moe_dsa one (glm5-slice: GLM-5's widths,
 * ../shared/spec/models.md C.1, over a few layers), in one of two layouts:
 *   bf16  (default) every tensor BF16;
 *   nvfp4 ModelOpt NVFP4 as ../shared/spec/nvfp4.md describes it: each 2-D
 *         `.weight` of a linear layer becomes `.weight` U8 [rows, cols/2] (E2M1
 *         codes, low nibble first), `.weight_scale` F8_E4M3 [rows, cols/16],
 *         `.weight_scale_2` F32 and `.input_scale` F32 scalars, unless it
 *         matches one of the excludes `moeserve quantize` uses by default
 *         (engine/quantize.c DEFAULT_EXCLUDES: embeddings, lm_head, the router
 *         `mlp.gate`, a shared-expert gate, the DSA indexer's weights_proj),
 *         which stay BF16 like norms and biases. config.json gains
 *         quantization_config and hf_quant_config.json is written, as
 *         `moeserve quantize` does, with the same exclude list.
 *
 * glm5-slice keeps GLM-5's layer types in order but with ONE dense layer
 * (GLM-5 has three): a slice of 4-8 layers is then 1 dense + MoE layers,
 * and the benchmark's per-layer figure is the difference of two slices, so
 * it is a MoE layer's. Every layer owns an indexer ("full"), as in GLM-5
 * (spec C.5: no indexer_types in its config). Vocabulary and lm_head are
 * GLM-5's (154880 x 6144 BF16, 1.9 GB each).
 *
 * --config-only writes config.json (and hf_quant_config.json) and prints the
 * size model.safetensors would have, writing no weights: the loader reads
 * layers 0..num_hidden_layers-1 and ignores the rest (as it does MTP layers),
 * so a directory with this config and a link to the weights of a longer
 * slice is the shorter slice, with no second copy on disk.
 *
 * Values are random but realistic, never zeros (zeros make matmuls look
 * faster than real data): BF16 matrices uniform with std 1/sqrt(fan_in),
 * norms near 1, so activations stay O(1) and routing spreads over experts.
 * NVFP4 codes are uniformly random nibbles and block scales uniformly random
 * among the E4M3 values 64..448 (where ModelOpt puts the scales of Gaussian
 * weights: 448 * block amax / tensor amax); weight_scale_2 is then chosen so
 * the dequantized weights have std 1/sqrt(fan_in) as well.
 *
 * Routing: in a random model the residual stream soon carries a component common to every
 * token (the layers' outputs are ~45x the embeddings' norm, and attention over random keys
 * averages the values), so deeper layers route nearly every token to the same ~30 experts
 * (cpu-bench, 256 tokens: 64 experts used in layer 0, 29-32 in layers 4-7, up to 256 rows an
 * expert; qwen3-30b-a3b on the H200: 29-34 of 128). --embed-scale X multiplies the embeddings,
 * keeping each token's own direction in the stream: at 200, cpu-bench's 8 layers all use 64 of
 * 64 experts with at most 42-49 rows an expert (32 on average), as a load-balanced trained model
 * would. The default (1) is the checkpoint of sessions 2-13's benchmarks.
 *
 * Speed: the 30B preset is ~17 GB in NVFP4 (~61 GB in BF16), a glm5-slice
 * MoE layer 5.6 GB in NVFP4, so data is made by all OpenMP threads into a
 * 64 MiB buffer and written with one fwrite per buffer; the disk is the
 * limit. Each piece of at most 1 MiB of a tensor has its own generator keyed
 * by (seed, tensor, offset), so the bytes depend on --seed only, never on the
 * thread count.
 * Nothing here is committed: benchmarks make the checkpoint on the machine
 * that runs them.
 *
 * usage: make_synth_checkpoint --out DIR [--preset tiny|cpu-bench|qwen3-30b-a3b|glm5-slice|glm5]
 *                              [--format bf16|nvfp4] [--layers N] [--seed S] [--embed-scale X]
 *                              [--tokenizer DIR] [--config-only]
 * --tokenizer DIR copies DIR's tokenizer.json (and tokenizer_config.json) beside the weights, so
 * that the checkpoint serves (e.g. the Qwen3 tokenizer of tests/npm for qwen3-30b-a3b).
 */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/dtype.h"
#include "format/safetensors_header.h"
#include "base/json.h"
#include "base/timer.h"
#include "format/tokenizer.h"
#include "format/weight_synth.h"
#include "model/synth_preset.h"

enum synth_format { SYNTH_BF16, SYNTH_NVFP4 };

enum fill {
    FILL_MATRIX, /* BF16 uniform in [-value, value) */
    FILL_NORM,   /* BF16 1 + uniform in [-0.2, 0.2) */
    FILL_CODES,  /* random bytes: two E2M1 codes each */
    FILL_SCALES, /* random E4M3 bytes in [WS_SCALE_LO, WS_SCALE_HI] */
    FILL_SCALAR, /* one F32 = value */
};

/* amax of a block's input activations assumed by input_scale (RMSNorm'ed inputs are O(1)) */
#define INPUT_AMAX 8.0f

struct tensor_spec {
    char name[160];
    enum dtype dtype;
    int n_dims; /* 0 (a scalar), 1 or 2 */
    int64_t shape[2];
    enum fill fill;
    float value;     /* FILL_MATRIX: amplitude; FILL_SCALAR: the value */
    uint64_t offset; /* in the data section */
    uint64_t bytes;
};

struct synth {
    struct synth_preset s;
    enum synth_format format;
    struct tensor_spec *ts; /* (n) owned */
    size_t n, cap;
    uint64_t data_bytes;
    float embed_scale;       /* --embed-scale: see "Routing" above */
};

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64*: fast, and plenty for benchmark data */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* splitmix64 finaliser: turns (seed, tensor, byte position) into an independent non-zero state */
static uint64_t rng_seed(uint64_t seed, uint64_t tensor, uint64_t pos)
{
    uint64_t z = seed + tensor * 0x9e3779b97f4a7c15ull + (pos + 1) * 0xd1b54a32d192ed03ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z ? z : 1;
}

static int synth_add(struct synth *sy, enum fill fill, enum dtype dt, int n_dims, int64_t rows, int64_t cols,
                     float value, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static int synth_add(struct synth *sy, enum fill fill, enum dtype dt, int n_dims, int64_t rows, int64_t cols,
                     float value, const char *fmt, ...)
{
    if (sy->n == sy->cap) {
        size_t cap = sy->cap ? sy->cap * 2 : 1024;
        struct tensor_spec *g = realloc(sy->ts, cap * sizeof *g);
        if (!g)
            return -1;
        sy->ts = g;
        sy->cap = cap;
    }
    struct tensor_spec *t = &sy->ts[sy->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->dtype = dt;
    t->n_dims = n_dims;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->fill = fill;
    t->value = value;
    uint64_t elems = n_dims == 0 ? 1 : n_dims == 1 ? (uint64_t)rows : (uint64_t)rows * (uint64_t)cols;
    t->bytes = elems * dtype_size(dt);
    /* every size here keeps the next tensor aligned; a preset that breaks this is a bug */
    if (sy->data_bytes % dtype_size(dt) != 0) {
        fprintf(stderr, "make_synth_checkpoint: %s would be misaligned at offset %llu\n", t->name,
                (unsigned long long)sy->data_bytes);
        return -1;
    }
    t->offset = sy->data_bytes;
    sy->data_bytes += t->bytes;
    return 0;
}

/* One linear layer `prefix` with W [rows out, cols in]: the four NVFP4 tensors with --format
 * nvfp4 unless an exclude names the module, else BF16. */
static int synth_add_linear(struct synth *sy, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int synth_add_linear(struct synth *sy, int64_t rows, int64_t cols, const char *fmt, ...)
{
    char prefix[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (sy->format != SYNTH_NVFP4 || synth_preset_excluded(prefix))
        return synth_add(sy, FILL_MATRIX, DTYPE_BF16, 2, rows, cols, sqrtf(3.0f / (float)cols), "%s.weight",
                         prefix);
    if (cols % 16 != 0) { /* a preset bug: NVFP4 blocks are 16 inputs */
        fprintf(stderr, "make_synth_checkpoint: %s: %lld in-features are not a multiple of 16\n", prefix,
                (long long)cols);
        return -1;
    }
    float scale2 = weight_synth_nvfp4_scale2(cols);
    return synth_add(sy, FILL_CODES, DTYPE_U8, 2, rows, cols / 2, 0, "%s.weight", prefix) ||
           synth_add(sy, FILL_SCALES, DTYPE_F8_E4M3, 2, rows, cols / 16, 0, "%s.weight_scale", prefix) ||
           synth_add(sy, FILL_SCALAR, DTYPE_F32, 0, 0, 0, scale2, "%s.weight_scale_2", prefix) ||
           synth_add(sy, FILL_SCALAR, DTYPE_F32, 0, 0, 0, INPUT_AMAX / (6.0f * 448.0f), "%s.input_scale",
                     prefix);
}

static int synth_add_norm(struct synth *sy, int64_t len, const char *name)
{
    return synth_add(sy, FILL_NORM, DTYPE_BF16, 1, len, 0, 0, "%s", name);
}

/* Routed experts (per-expert names, spec 0.7), the BF16 router: one MoE block without its shared expert. */
static int synth_add_experts(struct synth *sy, int l)
{
    const struct synth_preset *s = &sy->s;
    int64_t D = s->d_model, I = s->d_expert;
    int rc = synth_add_linear(sy, s->n_experts, D, "model.layers.%d.mlp.gate", l);
    for (int e = 0; e < s->n_experts && !rc; e++)
        rc = synth_add_linear(sy, I, D, "model.layers.%d.mlp.experts.%d.gate_proj", l, e) ||
             synth_add_linear(sy, I, D, "model.layers.%d.mlp.experts.%d.up_proj", l, e) ||
             synth_add_linear(sy, D, I, "model.layers.%d.mlp.experts.%d.down_proj", l, e);
    return rc;
}

/* The tensor list of a qwen3_moe model, in file order. */
static int synth_plan_qwen3_moe(struct synth *sy)
{
    const struct synth_preset *s = &sy->s;
    int64_t D = s->d_model, qd = (int64_t)s->n_heads * s->head_dim, kvd = (int64_t)s->n_kv * s->head_dim;
    char p[160];
    int rc = synth_add(sy, FILL_MATRIX, DTYPE_BF16, 2, s->vocab, D, sy->embed_scale * sqrtf(3.0f / (float)D),
                       "model.embed_tokens.weight");
    for (int l = 0; l < s->n_layers && !rc; l++) {
        snprintf(p, sizeof p, "model.layers.%d.input_layernorm.weight", l);
        rc |= synth_add_norm(sy, D, p);
        snprintf(p, sizeof p, "model.layers.%d.post_attention_layernorm.weight", l);
        rc |= synth_add_norm(sy, D, p);
        const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        int64_t rows[4] = {qd, kvd, kvd, D}, cols[4] = {D, D, D, qd};
        for (int i = 0; i < 4; i++)
            rc |= synth_add_linear(sy, rows[i], cols[i], "model.layers.%d.self_attn.%s", l, proj[i]);
        snprintf(p, sizeof p, "model.layers.%d.self_attn.q_norm.weight", l);
        rc |= synth_add_norm(sy, s->head_dim, p);
        snprintf(p, sizeof p, "model.layers.%d.self_attn.k_norm.weight", l);
        rc |= synth_add_norm(sy, s->head_dim, p);
        rc |= synth_add_experts(sy, l);
    }
    rc |= synth_add_norm(sy, D, "model.norm.weight");
    rc |= synth_add(sy, FILL_MATRIX, DTYPE_BF16, 2, s->vocab, D, sqrtf(3.0f / (float)D), "lm_head.weight");
    return rc;
}

/* One glm_moe_dsa decoder layer (spec C.7): MLA, the DSA indexer (every layer is "full"),
 * then a dense MLP (l < n_dense) or the MoE block with its shared expert. */
static int synth_plan_glm_layer(struct synth *sy, int l)
{
    const struct synth_preset *s = &sy->s;
    int64_t D = s->d_model, H = s->n_heads, qk = (int64_t)s->nope + s->rope;
    int64_t HI = s->index_heads, DI = s->index_dim, shared = (int64_t)s->d_expert * s->n_shared;
    char p[160];
    int rc = 0;
    snprintf(p, sizeof p, "model.layers.%d.input_layernorm.weight", l);
    rc |= synth_add_norm(sy, D, p);
    snprintf(p, sizeof p, "model.layers.%d.post_attention_layernorm.weight", l);
    rc |= synth_add_norm(sy, D, p);
    rc |= synth_add_linear(sy, s->q_lora, D, "model.layers.%d.self_attn.q_a_proj", l);
    snprintf(p, sizeof p, "model.layers.%d.self_attn.q_a_layernorm.weight", l);
    rc |= synth_add_norm(sy, s->q_lora, p);
    rc |= synth_add_linear(sy, H * qk, s->q_lora, "model.layers.%d.self_attn.q_b_proj", l);
    rc |= synth_add_linear(sy, (int64_t)s->kv_lora + s->rope, D,
                           "model.layers.%d.self_attn.kv_a_proj_with_mqa", l);
    snprintf(p, sizeof p, "model.layers.%d.self_attn.kv_a_layernorm.weight", l);
    rc |= synth_add_norm(sy, s->kv_lora, p);
    rc |= synth_add_linear(sy, H * ((int64_t)s->nope + s->v_dim), s->kv_lora,
                           "model.layers.%d.self_attn.kv_b_proj", l);
    rc |= synth_add_linear(sy, D, H * s->v_dim, "model.layers.%d.self_attn.o_proj", l);
    rc |= synth_add_linear(sy, HI * DI, s->q_lora, "model.layers.%d.self_attn.indexer.wq_b", l);
    rc |= synth_add_linear(sy, DI, D, "model.layers.%d.self_attn.indexer.wk", l);
    snprintf(p, sizeof p, "model.layers.%d.self_attn.indexer.k_norm.weight", l);
    rc |= synth_add_norm(sy, DI, p);
    rc |= synth_add(sy, FILL_MATRIX, DTYPE_BF16, 1, DI, 0, 0.1f,
                    "model.layers.%d.self_attn.indexer.k_norm.bias", l);
    rc |= synth_add_linear(sy, HI, D, "model.layers.%d.self_attn.indexer.weights_proj", l);
    if (l < s->n_dense) {
        rc |= synth_add_linear(sy, s->d_ff, D, "model.layers.%d.mlp.gate_proj", l);
        rc |= synth_add_linear(sy, s->d_ff, D, "model.layers.%d.mlp.up_proj", l);
        rc |= synth_add_linear(sy, D, s->d_ff, "model.layers.%d.mlp.down_proj", l);
        return rc;
    }
    /* the selection bias only ranks experts (spec B.3); small, so routing stays the router's */
    rc |= synth_add(sy, FILL_MATRIX, DTYPE_BF16, 1, s->n_experts, 0, 0.01f,
                    "model.layers.%d.mlp.gate.e_score_correction_bias", l);
    rc |= synth_add_experts(sy, l);
    rc |= synth_add_linear(sy, shared, D, "model.layers.%d.mlp.shared_experts.gate_proj", l);
    rc |= synth_add_linear(sy, shared, D, "model.layers.%d.mlp.shared_experts.up_proj", l);
    rc |= synth_add_linear(sy, D, shared, "model.layers.%d.mlp.shared_experts.down_proj", l);
    return rc;
}

static int synth_plan_glm_moe_dsa(struct synth *sy)
{
    const struct synth_preset *s = &sy->s;
    int64_t D = s->d_model;
    int rc = synth_add(sy, FILL_MATRIX, DTYPE_BF16, 2, s->vocab, D, sy->embed_scale * sqrtf(3.0f / (float)D),
                       "model.embed_tokens.weight");
    for (int l = 0; l < s->n_layers && !rc; l++)
        rc = synth_plan_glm_layer(sy, l);
    rc |= synth_add_norm(sy, D, "model.norm.weight");
    rc |= synth_add(sy, FILL_MATRIX, DTYPE_BF16, 2, s->vocab, D, sqrtf(3.0f / (float)D), "lm_head.weight");
    return rc;
}

static int synth_plan(struct synth *sy)
{
    return sy->s.family == SYNTH_GLM_MOE_DSA ? synth_plan_glm_moe_dsa(sy) : synth_plan_qwen3_moe(sy);
}

/* Bytes [pos, pos + n) of tensor t (index ti); pos and n are multiples of the element size. */
static void synth_fill(const struct tensor_spec *t, size_t ti, uint64_t seed, uint64_t pos, uint8_t *dst,
                       size_t n)
{
    uint64_t rng = rng_seed(seed, ti, pos);
    switch (t->fill) {
    case FILL_MATRIX:
    case FILL_NORM:
        for (size_t i = 0; i < n / 2; i += 2) { /* two 24-bit uniforms per draw */
            uint64_t r = rng_next(&rng);
            for (size_t j = 0; j < 2 && i + j < n / 2; j++) {
                /* u in [-1, 1) */
                float u = (float)((r >> (40 - 24 * j)) & 0xffffff) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
                uint16_t h = f32_to_bf16(t->fill == FILL_NORM ? 1.0f + 0.2f * u : t->value * u);
                memcpy(dst + 2 * (i + j), &h, 2);
            }
        }
        break;
    case FILL_CODES:
        for (size_t i = 0; i < n; i += 8) {
            uint64_t r = rng_next(&rng);
            memcpy(dst + i, &r, n - i < 8 ? n - i : 8);
        }
        break;
    case FILL_SCALES:
        for (size_t i = 0; i < n; i++)
            dst[i] = (uint8_t)(WS_SCALE_LO + (rng_next(&rng) >> 33) % (WS_SCALE_HI - WS_SCALE_LO + 1));
        break;
    case FILL_SCALAR: memcpy(dst, &t->value, 4); break;
    }
}

static void synth_entry(const void *ctx, size_t i, struct st_header_entry *e)
{
    const struct tensor_spec *t = &((const struct synth *)ctx)->ts[i];
    *e = (struct st_header_entry){.name = t->name, .dtype = t->dtype, .n_dims = t->n_dims, .shape = t->shape,
                                  .begin = t->offset, .end = t->offset + t->bytes};
}

/* The safetensors header of every tensor, padded (format/safetensors_header.h). */
static char *synth_header(const struct synth *sy, size_t *len)
{
    return st_header_build(sy->n, synth_entry, sy, len);
}

/* One piece of work for a thread: a chunk of one tensor into the buffer. */
struct fill_job {
    size_t tensor;
    uint64_t pos; /* in the tensor; also the generator's key, so a job's bytes never depend on threads */
    size_t buf_off, n;
};

enum { CHUNK_BYTES = 1 << 20, BUF_BYTES = 64 << 20, MAX_JOBS = 1 << 16 };

static int synth_write_data(const struct synth *sy, FILE *fp, uint64_t seed, const char *path)
{
    uint8_t *buf = malloc(BUF_BYTES);
    struct fill_job *jobs = malloc(MAX_JOBS * sizeof *jobs);
    if (!buf || !jobs) {
        free(buf);
        free(jobs);
        fprintf(stderr, "make_synth_checkpoint: out of memory\n");
        return -1;
    }
    size_t ti = 0;
    uint64_t pos = 0, written = 0;
    double t0 = timer_now(), last = t0;
    int rc = 0;
    while (ti < sy->n && !rc) {
        /* gather jobs until the buffer is full: whole chunks, tensors back to back */
        size_t n_jobs = 0, used = 0;
        while (ti < sy->n && used < BUF_BYTES && n_jobs < MAX_JOBS) {
            const struct tensor_spec *t = &sy->ts[ti];
            uint64_t left = t->bytes - pos;
            size_t n = left < CHUNK_BYTES ? (size_t)left : CHUNK_BYTES;
            if (n > BUF_BYTES - used)
                n = (BUF_BYTES - used) / 8 * 8; /* chunk boundaries stay element-aligned */
            if (n == 0)
                break;
            jobs[n_jobs++] = (struct fill_job){.tensor = ti, .pos = pos, .buf_off = used, .n = n};
            used += n;
            pos += n;
            if (pos == t->bytes) {
                ti++;
                pos = 0;
            }
        }
#pragma omp parallel for schedule(dynamic, 1)
        for (size_t j = 0; j < n_jobs; j++)
            synth_fill(&sy->ts[jobs[j].tensor], jobs[j].tensor, seed, jobs[j].pos, buf + jobs[j].buf_off,
                       jobs[j].n);
        if (fwrite(buf, 1, used, fp) != used) {
            fprintf(stderr, "\nmake_synth_checkpoint: write failed on %s: %s (disk full?)\n", path,
                    strerror(errno));
            rc = -1;
        }
        written += used;
        double now = timer_now();
        if (now - last > 0.5 || ti == sy->n) {
            fprintf(stderr, "\rwriting %s: %5.1f%% (%.2f of %.2f GB, %.0f MB/s)", path,
                    100.0 * (double)written / (double)(sy->data_bytes ? sy->data_bytes : 1),
                    (double)written / 1e9, (double)sy->data_bytes / 1e9,
                    (double)written / 1e6 / (now - t0 > 0 ? now - t0 : 1));
            last = now;
        }
    }
    free(buf);
    free(jobs);
    return rc;
}

/* dir/name (a regular file) -> out/name, byte for byte; 0, or 1 with a message. */
static int copy_file(const char *dir, const char *name, const char *out)
{
    char src[4096], dst[4096], buf[1 << 16];
    snprintf(src, sizeof src, "%s/%s", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", out, name);
    struct stat sb;
    FILE *in = stat(src, &sb) == 0 && S_ISREG(sb.st_mode) ? fopen(src, "rb") : NULL, *o = in ? fopen(dst, "wb") : NULL;
    int rc = !in || !o;
    for (size_t n; !rc && (n = fread(buf, 1, sizeof buf, in)) > 0;)
        rc = fwrite(buf, 1, n, o) != n;
    rc |= (in && ferror(in)) | (in && fclose(in) != 0) | (o && fclose(o) != 0);
    if (rc)
        fprintf(stderr, "make_synth_checkpoint: --tokenizer: cannot copy %s to %s\n", src, dst);
    return rc;
}

/* A real tokenizer beside the random weights (tokenizer.json, and tokenizer_config.json where the
 * directory has one: its chat template), so that `moeserve serve` and `bench serve` take the
 * checkpoint. Its ids must fit the preset's vocabulary. */
static int synth_copy_tokenizer(const char *dir, const char *out, int vocab)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct tokenizer *tok = NULL;
    struct err err = {0};
    if (tokenizer_load(&tok, path, &err)) {
        fprintf(stderr, "make_synth_checkpoint: --tokenizer: %s\n", err.msg);
        return 1;
    }
    int n = tokenizer_vocab_size(tok);
    tokenizer_free(tok);
    if (n > vocab) {
        fprintf(stderr, "make_synth_checkpoint: --tokenizer: %s has %d ids, the preset's vocabulary %d\n", path, n,
                vocab);
        return 1;
    }
    if (copy_file(dir, "tokenizer.json", out))
        return 1;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    struct stat sb;
    return stat(path, &sb) == 0 ? copy_file(dir, "tokenizer_config.json", out) : 0;
}

static int synth_write_configs(const struct synth *sy, const char *out)
{
    struct err err = {0};
    if (synth_preset_write(&sy->s, sy->format == SYNTH_NVFP4, out, &err) == STATUS_OK)
        return 0;
    fprintf(stderr, "make_synth_checkpoint: %s\n", err.msg);
    return 1;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s --out DIR [--preset tiny|cpu-bench|qwen3-30b-a3b|glm5-slice|glm5] [--format bf16|nvfp4] "
            "[--layers N] [--seed S] [--embed-scale X] [--tokenizer DIR] [--config-only]\n",
            argv0);
    return 2;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *preset = "cpu-bench", *format = "bf16", *tokenizer = NULL;
    int layers = 0;
    double embed_scale = 1.0;
    bool config_only = false;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--preset") && i + 1 < argc)
            preset = argv[++i];
        else if (!strcmp(argv[i], "--format") && i + 1 < argc)
            format = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--embed-scale") && i + 1 < argc) {
            char *end = NULL;
            embed_scale = strtod(argv[++i], &end);
            if (!end || *end || !(embed_scale > 0.0) || !isfinite(embed_scale) || embed_scale > 1e4) {
                fprintf(stderr, "make_synth_checkpoint: --embed-scale %s: expected a number in (0, 10000]\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tokenizer = argv[++i];
        else if (!strcmp(argv[i], "--config-only"))
            config_only = true;
        else
            return usage(argv[0]);
    }
    struct synth sy = {0};
    const struct synth_preset *p = synth_preset_find(preset);
    if (!out || !p) {
        fprintf(stderr, "make_synth_checkpoint: need --out DIR and a known --preset (%s)\n", synth_preset_names());
        return usage(argv[0]);
    }
    if (!strcmp(format, "nvfp4"))
        sy.format = SYNTH_NVFP4;
    else if (strcmp(format, "bf16") != 0) {
        fprintf(stderr, "make_synth_checkpoint: --format %s: expected bf16 or nvfp4\n", format);
        return 2;
    }
    sy.s = *p;
    sy.embed_scale = (float)embed_scale;
    if (layers > 0)
        sy.s.n_layers = layers;
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "make_synth_checkpoint: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    int rc = 1;
    char path[4096];
    size_t hl = 0;
    char *hdr = NULL;
    FILE *fp = NULL;
    if (synth_plan(&sy) != 0 || !(hdr = synth_header(&sy, &hl))) {
        fprintf(stderr, "make_synth_checkpoint: cannot plan the tensors (out of memory?)\n");
        goto done;
    }
    if (config_only) {
        /* the bytes a script checks against the free space before the real write */
        printf("%llu\n", (unsigned long long)(8 + hl + sy.data_bytes));
        rc = synth_write_configs(&sy, out) || (tokenizer && synth_copy_tokenizer(tokenizer, out, sy.s.vocab)) ? 1 : 0;
        goto done;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    fp = fopen(path, "wb");
    if (!fp) {
        fprintf(stderr, "make_synth_checkpoint: cannot write %s: %s\n", path, strerror(errno));
        goto done;
    }
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    double t0 = timer_now();
    if (fwrite(le, 1, 8, fp) != 8 || fwrite(hdr, 1, hl, fp) != hl ||
        synth_write_data(&sy, fp, seed, path) != 0)
        goto done;
    int closed = fclose(fp);
    fp = NULL;
    if (closed != 0) {
        fprintf(stderr, "\nmake_synth_checkpoint: write failed on %s: %s\n", path, strerror(errno));
        goto done;
    }
    fprintf(stderr, "\rwrote %s: %.2f GB, %zu tensors, %s, %d layers, %.1f s\n", path,
            (double)sy.data_bytes / 1e9, sy.n, sy.format == SYNTH_NVFP4 ? "NVFP4 (ModelOpt)" : "BF16",
            sy.s.n_layers, timer_now() - t0);
    rc = synth_write_configs(&sy, out) || (tokenizer && synth_copy_tokenizer(tokenizer, out, sy.s.vocab)) ? 1 : 0;
done:
    if (fp)
        fclose(fp);
    free(hdr);
    free(sy.ts);
    return rc;
}
