/* make_synth_checkpoint.c — a large random checkpoint with real shapes, for benchmarks.
 *
 * Writes DIR/config.json and DIR/model.safetensors (per-expert tensor names,
 * as released checkpoints have them), in one of two layouts:
 *   bf16  (default) every tensor BF16;
 *   nvfp4 ModelOpt NVFP4 as ../shared/spec/nvfp4.md describes it: each linear
 *         layer of the decoder blocks (attention q/k/v/o, experts) becomes
 *         `.weight` U8 [rows, cols/2] (E2M1 codes, low nibble first),
 *         `.weight_scale` F8_E4M3 [rows, cols/16], `.weight_scale_2` F32 and
 *         `.input_scale` F32 scalars; embeddings, lm_head, norms and the router
 *         (`mlp.gate`) stay BF16 (ModelOpt's default excludes). config.json
 *         gains quantization_config and hf_quant_config.json is written, as
 *         `moeserve quantize` does.
 *
 * Values are random but realistic, never zeros (zeros make matmuls look
 * faster than real data): BF16 matrices uniform with std 1/sqrt(fan_in),
 * norms near 1, so activations stay O(1) and routing spreads over experts.
 * NVFP4 codes are uniformly random nibbles and block scales uniformly random
 * among the E4M3 values 64..448 (where ModelOpt puts the scales of Gaussian
 * weights: 448 * block amax / tensor amax); weight_scale_2 is then chosen so
 * the dequantized weights have std 1/sqrt(fan_in) as well.
 *
 * Speed: the 30B preset is ~17 GB in NVFP4 (~61 GB in BF16), so data is made
 * by all OpenMP threads into a 64 MiB buffer and written with one fwrite per
 * buffer; the disk is the limit. Each piece of at most 1 MiB of a tensor has
 * its own generator keyed by (seed, tensor, offset), so the bytes depend on
 * --seed only, never on the thread count.
 * Nothing here is committed: benchmarks make the checkpoint on the machine
 * that runs them.
 *
 * usage: make_synth_checkpoint --out DIR [--preset tiny|cpu-bench|qwen3-30b-a3b] [--format bf16|nvfp4]
 *                              [--layers N] [--seed S]
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/dtype.h"
#include "base/json.h"
#include "base/timer.h"

struct shape_preset {
    const char *name;
    int vocab, d_model, n_layers, n_heads, n_kv, head_dim, n_experts, k, d_expert;
};

static const struct shape_preset PRESETS[] = {
    /* seconds to write and to run on a CPU: the command-line tests */
    {"tiny", 1024, 256, 2, 4, 2, 64, 8, 2, 128},
    /* hidden 2048, 8 layers, 64 experts top-8: the CPU decode benchmark of issue 2 */
    {"cpu-bench", 151936, 2048, 8, 32, 4, 128, 64, 8, 768},
    /* Qwen3-30B-A3B (spec/models.md A.1) */
    {"qwen3-30b-a3b", 151936, 2048, 48, 32, 4, 128, 128, 8, 768},
};

enum synth_format { SYNTH_BF16, SYNTH_NVFP4 };

enum fill {
    FILL_MATRIX, /* BF16 uniform in [-value, value) */
    FILL_NORM,   /* BF16 1 + uniform in [-0.2, 0.2) */
    FILL_CODES,  /* random bytes: two E2M1 codes each */
    FILL_SCALES, /* random E4M3 bytes in [SCALE_LO, SCALE_HI] */
    FILL_SCALAR, /* one F32 = value */
};

/* E4M3 block scales 0x68 = 64.0 .. 0x7e = 448.0 (the largest finite E4M3). */
enum { SCALE_LO = 0x68, SCALE_HI = 0x7e };
/* amax of a block's input activations assumed by input_scale (RMSNorm'ed inputs are O(1)) */
#define INPUT_AMAX 8.0f

struct tensor_spec {
    char name[160];
    enum dtype dtype;
    int n_dims;       /* 0 (a scalar), 1 or 2 */
    int64_t shape[2];
    enum fill fill;
    float value;      /* FILL_MATRIX: amplitude; FILL_SCALAR: the value */
    uint64_t offset;  /* in the data section */
    uint64_t bytes;
};

struct synth {
    struct shape_preset s;
    enum synth_format format;
    struct tensor_spec *ts; /* (n) owned */
    size_t n, cap;
    uint64_t data_bytes;
    float nvfp4_scale2_unit; /* weight_scale_2 * sqrt(fan_in): see synth_nvfp4_unit() */
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

/* std(e2m1 * e4m3) over uniform codes and scales = rms(codes) * rms(scales), both centred
 * (codes are symmetric); weight_scale_2 = (1/sqrt(fan_in)) / that. */
static float synth_nvfp4_unit(void)
{
    double c2 = 0, s2 = 0;
    for (int c = 0; c < 16; c++)
        c2 += (double)e2m1_to_f32((uint8_t)c) * e2m1_to_f32((uint8_t)c);
    for (int b = SCALE_LO; b <= SCALE_HI; b++)
        s2 += (double)e4m3_to_f32((uint8_t)b) * e4m3_to_f32((uint8_t)b);
    return (float)(1.0 / (sqrt(c2 / 16) * sqrt(s2 / (SCALE_HI - SCALE_LO + 1))));
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

/* One linear layer `prefix` with W [rows out, cols in]: BF16, or the four NVFP4 tensors. */
static int synth_add_linear(struct synth *sy, bool quantized, int64_t rows, int64_t cols, const char *prefix)
{
    if (!quantized)
        return synth_add(sy, FILL_MATRIX, DTYPE_BF16, 2, rows, cols, sqrtf(3.0f / (float)cols), "%s.weight",
                         prefix);
    float scale2 = sy->nvfp4_scale2_unit / sqrtf((float)cols);
    return synth_add(sy, FILL_CODES, DTYPE_U8, 2, rows, cols / 2, 0, "%s.weight", prefix) ||
           synth_add(sy, FILL_SCALES, DTYPE_F8_E4M3, 2, rows, cols / 16, 0, "%s.weight_scale", prefix) ||
           synth_add(sy, FILL_SCALAR, DTYPE_F32, 0, 0, 0, scale2, "%s.weight_scale_2", prefix) ||
           synth_add(sy, FILL_SCALAR, DTYPE_F32, 0, 0, 0, INPUT_AMAX / (6.0f * 448.0f), "%s.input_scale", prefix);
}

/* The tensor list of a qwen3_moe model, in file order. */
static int synth_plan(struct synth *sy)
{
    const struct shape_preset *s = &sy->s;
    bool q = sy->format == SYNTH_NVFP4;
    int64_t D = s->d_model, qd = (int64_t)s->n_heads * s->head_dim, kvd = (int64_t)s->n_kv * s->head_dim;
    char p[160];
    int rc = synth_add(sy, FILL_MATRIX, DTYPE_BF16, 2, s->vocab, D, sqrtf(3.0f / (float)D), "model.embed_tokens.weight");
    for (int l = 0; l < s->n_layers && !rc; l++) {
        rc |= synth_add(sy, FILL_NORM, DTYPE_BF16, 1, D, 0, 0, "model.layers.%d.input_layernorm.weight", l);
        rc |= synth_add(sy, FILL_NORM, DTYPE_BF16, 1, D, 0, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        int64_t rows[4] = {qd, kvd, kvd, D}, cols[4] = {D, D, D, qd};
        for (int i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "model.layers.%d.self_attn.%s", l, proj[i]);
            rc |= synth_add_linear(sy, q, rows[i], cols[i], p);
        }
        rc |= synth_add(sy, FILL_NORM, DTYPE_BF16, 1, s->head_dim, 0, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        rc |= synth_add(sy, FILL_NORM, DTYPE_BF16, 1, s->head_dim, 0, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        snprintf(p, sizeof p, "model.layers.%d.mlp.gate", l);
        rc |= synth_add_linear(sy, false, s->n_experts, D, p); /* the router stays BF16 */
        for (int e = 0; e < s->n_experts; e++) {
            snprintf(p, sizeof p, "model.layers.%d.mlp.experts.%d.gate_proj", l, e);
            rc |= synth_add_linear(sy, q, s->d_expert, D, p);
            snprintf(p, sizeof p, "model.layers.%d.mlp.experts.%d.up_proj", l, e);
            rc |= synth_add_linear(sy, q, s->d_expert, D, p);
            snprintf(p, sizeof p, "model.layers.%d.mlp.experts.%d.down_proj", l, e);
            rc |= synth_add_linear(sy, q, D, s->d_expert, p);
        }
    }
    rc |= synth_add(sy, FILL_NORM, DTYPE_BF16, 1, D, 0, 0, "model.norm.weight");
    rc |= synth_add(sy, FILL_MATRIX, DTYPE_BF16, 2, s->vocab, D, sqrtf(3.0f / (float)D), "lm_head.weight");
    return rc;
}

/* Bytes [pos, pos + n) of tensor t (index ti); pos and n are multiples of the element size. */
static void synth_fill(const struct tensor_spec *t, size_t ti, uint64_t seed, uint64_t pos, uint8_t *dst, size_t n)
{
    uint64_t rng = rng_seed(seed, ti, pos);
    switch (t->fill) {
    case FILL_MATRIX:
    case FILL_NORM:
        for (size_t i = 0; i < n / 2; i += 2) { /* two 24-bit uniforms per draw */
            uint64_t r = rng_next(&rng);
            for (size_t j = 0; j < 2 && i + j < n / 2; j++) {
                float u = (float)((r >> (40 - 24 * j)) & 0xffffff) * (1.0f / 16777216.0f) * 2.0f - 1.0f; /* [-1, 1) */
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
            dst[i] = (uint8_t)(SCALE_LO + (rng_next(&rng) >> 33) % (SCALE_HI - SCALE_LO + 1));
        break;
    case FILL_SCALAR:
        memcpy(dst, &t->value, 4);
        break;
    }
}

/* {"__metadata__":...,"name":{"dtype":..,"shape":[..],"data_offsets":[a,b]},...}, space-padded to 8 bytes. */
static char *synth_header(const struct synth *sy, size_t *len)
{
    struct json *h = json_new_object();
    struct json *meta = json_add(h, "__metadata__", json_new_object());
    json_add(meta, "format", json_new_string("pt"));
    for (size_t i = 0; i < sy->n; i++) {
        const struct tensor_spec *t = &sy->ts[i];
        struct json *e = json_add(h, t->name, json_new_object());
        json_add(e, "dtype", json_new_string(dtype_name(t->dtype)));
        struct json *shape = json_add(e, "shape", json_new_array());
        for (int d = 0; d < t->n_dims; d++)
            json_append(shape, json_new_number((double)t->shape[d]));
        struct json *off = json_add(e, "data_offsets", json_new_array());
        json_append(off, json_new_number((double)t->offset));
        json_append(off, json_new_number((double)(t->offset + t->bytes)));
    }
    char *s = json_print(h, false);
    json_free(h);
    if (!s)
        return NULL;
    size_t n = strlen(s), padded = (n + 7) / 8 * 8; /* data section 8-byte aligned, as the reference writer does */
    char *p = realloc(s, padded + 1);
    if (!p) {
        free(s);
        return NULL;
    }
    memset(p + n, ' ', padded - n);
    p[padded] = 0;
    *len = padded;
    return p;
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
            synth_fill(&sy->ts[jobs[j].tensor], jobs[j].tensor, seed, jobs[j].pos, buf + jobs[j].buf_off, jobs[j].n);
        if (fwrite(buf, 1, used, fp) != used) {
            fprintf(stderr, "\nmake_synth_checkpoint: write failed on %s: %s (disk full?)\n", path, strerror(errno));
            rc = -1;
        }
        written += used;
        double now = timer_now();
        if (now - last > 0.5 || ti == sy->n) {
            fprintf(stderr, "\rwriting %s: %5.1f%% (%.2f of %.2f GB, %.0f MB/s)", path,
                    100.0 * (double)written / (double)(sy->data_bytes ? sy->data_bytes : 1), (double)written / 1e9,
                    (double)sy->data_bytes / 1e9, (double)written / 1e6 / (now - t0 > 0 ? now - t0 : 1));
            last = now;
        }
    }
    free(buf);
    free(jobs);
    return rc;
}

static int write_json_file(const char *path, const struct json *j)
{
    char *s = json_print(j, true);
    FILE *fp = fopen(path, "w");
    bool ok = s && fp && fputs(s, fp) >= 0 && fputc('\n', fp) != EOF;
    if (fp && fclose(fp) != 0)
        ok = false;
    free(s);
    if (!ok)
        fprintf(stderr, "make_synth_checkpoint: cannot write %s\n", path);
    return ok ? 0 : -1;
}

/* ModelOpt's default excludes, the same patterns `moeserve quantize` writes. */
static struct json *synth_excludes(void)
{
    static const char *const EXCLUDES[] = {"lm_head", "*embed_tokens*", "*.mlp.gate"};
    struct json *a = json_new_array();
    for (size_t i = 0; i < sizeof EXCLUDES / sizeof EXCLUDES[0]; i++)
        json_append(a, json_new_string(EXCLUDES[i]));
    return a;
}

static struct json *synth_quant_config(void)
{
    struct json *qc = json_new_object();
    struct json *g0 = json_add(json_add(qc, "config_groups", json_new_object()), "group_0", json_new_object());
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

static int synth_write_configs(const struct synth *sy, const char *out)
{
    const struct shape_preset *s = &sy->s;
    char path[4096];
    struct json *c = json_new_object();
    json_append(json_add(c, "architectures", json_new_array()), json_new_string("Qwen3MoeForCausalLM"));
    json_add(c, "model_type", json_new_string("qwen3_moe"));
    json_add(c, "vocab_size", json_new_number(s->vocab));
    json_add(c, "hidden_size", json_new_number(s->d_model));
    json_add(c, "num_hidden_layers", json_new_number(s->n_layers));
    json_add(c, "num_attention_heads", json_new_number(s->n_heads));
    json_add(c, "num_key_value_heads", json_new_number(s->n_kv));
    json_add(c, "head_dim", json_new_number(s->head_dim));
    json_add(c, "intermediate_size", json_new_number(s->d_expert * 8)); /* dense FFN width: no layer has one */
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
    if (sy->format == SYNTH_NVFP4)
        json_add(c, "quantization_config", synth_quant_config());
    snprintf(path, sizeof path, "%s/config.json", out);
    int rc = write_json_file(path, c);
    json_free(c);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", out);
    if (rc || sy->format != SYNTH_NVFP4) {
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
    rc = write_json_file(path, h);
    json_free(h);
    return rc;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s --out DIR [--preset tiny|cpu-bench|qwen3-30b-a3b] [--format bf16|nvfp4] [--layers N] "
            "[--seed S]\n",
            argv0);
    return 2;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *preset = "cpu-bench", *format = "bf16";
    int layers = 0;
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
        else
            return usage(argv[0]);
    }
    struct synth sy = {0};
    const struct shape_preset *p = NULL;
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (!strcmp(PRESETS[i].name, preset))
            p = &PRESETS[i];
    if (!out || !p) {
        fprintf(stderr, "make_synth_checkpoint: need --out DIR and a known --preset (tiny, cpu-bench, qwen3-30b-a3b)\n");
        return usage(argv[0]);
    }
    if (!strcmp(format, "nvfp4"))
        sy.format = SYNTH_NVFP4;
    else if (strcmp(format, "bf16") != 0) {
        fprintf(stderr, "make_synth_checkpoint: --format %s: expected bf16 or nvfp4\n", format);
        return 2;
    }
    sy.s = *p;
    if (layers > 0)
        sy.s.n_layers = layers;
    sy.nvfp4_scale2_unit = synth_nvfp4_unit();
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
    if (fwrite(le, 1, 8, fp) != 8 || fwrite(hdr, 1, hl, fp) != hl || synth_write_data(&sy, fp, seed, path) != 0)
        goto done;
    int closed = fclose(fp);
    fp = NULL;
    if (closed != 0) {
        fprintf(stderr, "\nmake_synth_checkpoint: write failed on %s: %s\n", path, strerror(errno));
        goto done;
    }
    fprintf(stderr, "\rwrote %s: %.2f GB, %zu tensors, %s, %d layers, %.1f s\n", path, (double)sy.data_bytes / 1e9,
            sy.n, sy.format == SYNTH_NVFP4 ? "NVFP4 (ModelOpt)" : "BF16", sy.s.n_layers, timer_now() - t0);
    rc = synth_write_configs(&sy, out) ? 1 : 0;
done:
    if (fp)
        fclose(fp);
    free(hdr);
    free(sy.ts);
    return rc;
}
