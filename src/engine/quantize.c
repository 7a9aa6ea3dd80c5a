/* quantize.c — see quantize.h.
 *
 * Two passes over the input: a plan (which tensors become which output
 * tensors, in which shard, at which offsets) and a write (stream every
 * output tensor in header order). The plan is also what lets the header be
 * written before any data, so nothing is ever held whole in memory.
 */
#include "engine/quantize.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/dtype.h"
#include "base/json.h"
#include "base/log.h"
#include "base/progress.h"
#include "format/checkpoint.h"
#include "format/quant_codec.h"
#include "format/safetensors_header.h"
#include "engine/quantize_calib.h"

/* What an input tensor becomes. */
enum qt_role { QT_COPY, QT_QUANT };

/* One output tensor. */
struct qt_out {
    char name[300];
    enum dtype dtype;
    int n_dims;
    int64_t shape[8];
    uint64_t begin, end;
    const struct st_tensor *src; /* the input tensor it is made from */
    int part;                    /* 0 data, 1 block scale, 2 global scale, 3 input scale */
};

struct qt_shard {
    const char *file_name; /* borrowed from the input path */
    struct qt_out *outs;
    size_t n_outs, cap;
    uint64_t data_bytes;
};

struct quantizer {
    const struct quantize_opts *o;
    struct checkpoint ck;
    struct json *config;          /* input config.json, owned */
    int n_layers;                 /* decoder layers; higher indices are MTP, kept as is */
    char **exclude;               /* defaults + user patterns, owned strings */
    size_t n_exclude;
    struct qt_shard *shards;      /* (ck.n_files) */
    struct quantize_calib calib;  /* NVFP4 activation maxima */
    struct err *err;
};

static const char *const DEFAULT_EXCLUDES[] = {"lm_head", "*embed_tokens*", "*.mlp.gate", "*.mlp.shared_expert_gate",
                                               "*.indexer.weights_proj"};

static bool q_excluded(const struct quantizer *q, const char *module)
{
    for (size_t i = 0; i < q->n_exclude; i++)
        if (fnmatch(q->exclude[i], module, 0) == 0)
            return true;
    int layer;
    if (sscanf(module, "model.layers.%d.", &layer) == 1 && layer >= q->n_layers)
        return true; /* MTP layers stay in their original precision */
    return false;
}

static bool q_add_exclude(struct quantizer *q, const char *pattern)
{
    char **g = realloc(q->exclude, (q->n_exclude + 1) * sizeof *g);
    if (!g)
        return false;
    q->exclude = g;
    q->exclude[q->n_exclude] = strdup(pattern);
    return q->exclude[q->n_exclude++] != NULL;
}

static bool shard_push(struct qt_shard *sh, const struct qt_out *o)
{
    if (sh->n_outs == sh->cap) {
        size_t cap = sh->cap ? sh->cap * 2 : 64;
        struct qt_out *g = realloc(sh->outs, cap * sizeof *g);
        if (!g)
            return false;
        sh->outs = g;
        sh->cap = cap;
    }
    struct qt_out *d = &sh->outs[sh->n_outs++];
    *d = *o;
    uint64_t n = 1;
    for (int i = 0; i < o->n_dims; i++)
        n *= (uint64_t)o->shape[i];
    d->begin = sh->data_bytes;
    d->end = d->begin + n * dtype_size(o->dtype);
    sh->data_bytes = d->end;
    return true;
}

/* Decides the role of one input tensor. */
static enum status q_role(struct quantizer *q, const struct st_tensor *t, enum qt_role *role, char *module,
                          size_t module_cap)
{
    *role = QT_COPY;
    size_t len = strlen(t->name);
    if (t->dtype == DTYPE_U8 || t->dtype == DTYPE_F8_E4M3)
        return err_set(q->err, STATUS_INVALID, "%s: tensor %s is already quantized (%s); quantize wants BF16/F16/F32",
                       t->file, t->name, dtype_name(t->dtype));
    if (len < 8 || strcmp(t->name + len - 7, ".weight") != 0 || t->n_dims != 2)
        return STATUS_OK;
    if (t->dtype != DTYPE_BF16 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_F32)
        return STATUS_OK;
    snprintf(module, module_cap, "%.*s", (int)(len - 7), t->name);
    if (q_excluded(q, module))
        return STATUS_OK;
    if (q->o->format == WEIGHT_NVFP4 && t->shape[1] % 16 != 0)
        return err_set(q->err, STATUS_INVALID,
                       "%s: tensor %s: in-features %lld is not a multiple of 16, so it cannot be NVFP4 "
                       "(exclude it with --exclude %s)",
                       t->file, t->name, (long long)t->shape[1], module);
    *role = QT_QUANT;
    return STATUS_OK;
}

static enum status q_plan(struct quantizer *q)
{
    q->shards = calloc(q->ck.n_files, sizeof *q->shards);
    if (!q->shards)
        return err_set(q->err, STATUS_NOMEM, "quantize: out of memory");
    for (size_t f = 0; f < q->ck.n_files; f++) {
        const struct st_file *sf = &q->ck.files[f];
        struct qt_shard *sh = &q->shards[f];
        const char *slash = strrchr(sf->map.path, '/');
        sh->file_name = slash ? slash + 1 : sf->map.path;
        for (size_t i = 0; i < sf->n_tensors; i++) {
            const struct st_tensor *t = &sf->tensors[i];
            enum qt_role role;
            char module[300];
            enum status st = q_role(q, t, &role, module, sizeof module);
            if (st)
                return st;
            struct qt_out o = {.src = t};
            bool ok = true;
            if (role == QT_COPY) {
                snprintf(o.name, sizeof o.name, "%s", t->name);
                o.dtype = t->dtype;
                o.n_dims = t->n_dims;
                memcpy(o.shape, t->shape, sizeof o.shape);
                ok = shard_push(sh, &o);
            } else if (q->o->format == WEIGHT_NVFP4) {
                int64_t N = t->shape[0], K = t->shape[1];
                struct qt_out parts[4] = {
                    {.dtype = DTYPE_U8, .n_dims = 2, .shape = {N, K / 2}, .part = 0},
                    {.dtype = DTYPE_F8_E4M3, .n_dims = 2, .shape = {N, K / 16}, .part = 1},
                    {.dtype = DTYPE_F32, .n_dims = 0, .part = 2},
                    {.dtype = DTYPE_F32, .n_dims = 0, .part = 3},
                };
                const char *suffix[4] = {"weight", "weight_scale", "weight_scale_2", "input_scale"};
                int n_parts = q->o->calib_tokens > 0 ? 4 : 3;
                for (int p = 0; p < n_parts && ok; p++) {
                    parts[p].src = t;
                    snprintf(parts[p].name, sizeof parts[p].name, "%s.%s", module, suffix[p]);
                    ok = shard_push(sh, &parts[p]);
                }
            } else {
                int64_t N = t->shape[0], K = t->shape[1];
                struct qt_out parts[2] = {
                    {.dtype = DTYPE_F8_E4M3, .n_dims = 2, .shape = {N, K}, .part = 0, .src = t},
                    {.dtype = DTYPE_F32, .n_dims = 2, .shape = {(N + 127) / 128, (K + 127) / 128}, .part = 1, .src = t},
                };
                snprintf(parts[0].name, sizeof parts[0].name, "%s.weight", module);
                snprintf(parts[1].name, sizeof parts[1].name, "%s.weight_scale_inv", module);
                ok = shard_push(sh, &parts[0]) && shard_push(sh, &parts[1]);
            }
            if (!ok)
                return err_set(q->err, STATUS_NOMEM, "quantize: out of memory");
        }
    }
    return STATUS_OK;
}

/* Row r of a float tensor as fp32. */
static void src_row(const struct st_tensor *t, int64_t r, float *out)
{
    int64_t K = t->shape[1];
    const unsigned char *p = (const unsigned char *)t->data + (size_t)(r * K) * dtype_size(t->dtype);
    for (int64_t k = 0; k < K; k++) {
        uint16_t h;
        float f;
        switch (t->dtype) {
        case DTYPE_BF16: memcpy(&h, p + 2 * k, 2); out[k] = bf16_to_f32(h); break;
        case DTYPE_F16: memcpy(&h, p + 2 * k, 2); out[k] = f16_to_f32(h); break;
        default: memcpy(&f, p + 4 * k, 4); out[k] = f; break;
        }
    }
}

static float tensor_amax(const struct st_tensor *t, float *row)
{
    float amax = 0;
    for (int64_t r = 0; r < t->shape[0]; r++) {
        src_row(t, r, row);
        for (int64_t k = 0; k < t->shape[1]; k++)
            amax = fmaxf(amax, fabsf(row[k]));
    }
    return amax;
}

static bool write_all(FILE *fp, const void *p, size_t n)
{
    return n == 0 || fwrite(p, 1, n, fp) == n;
}

/* Writes the three or four NVFP4 tensors of one source, in plan order. */
static bool write_nvfp4(struct quantizer *q, FILE *fp, const struct qt_out *o, float *row, uint8_t *codes,
                        uint8_t *scales, float *scale2_cache)
{
    const struct st_tensor *t = o->src;
    int64_t N = t->shape[0], K = t->shape[1];
    if (o->part == 0) {
        *scale2_cache = nvfp4_global_scale(tensor_amax(t, row));
        for (int64_t r = 0; r < N; r++) {
            src_row(t, r, row);
            nvfp4_quantize_row(row, (size_t)K, *scale2_cache, codes, scales + (size_t)(r * (K / 16)));
            if (!write_all(fp, codes, (size_t)K / 2))
                return false;
        }
        return true;
    }
    if (o->part == 1)
        return write_all(fp, scales, (size_t)(N * (K / 16)));
    if (o->part == 2)
        return write_all(fp, scale2_cache, 4);
    float in_scale = quantize_calib_input_scale(&q->calib, t->name);
    return write_all(fp, &in_scale, 4);
}

static bool write_fp8(FILE *fp, const struct qt_out *o, float *rows, uint8_t *qbuf, float *scale_all)
{
    const struct st_tensor *t = o->src;
    int64_t N = t->shape[0], K = t->shape[1];
    size_t nbk = (size_t)((K + 127) / 128);
    if (o->part == 0) {
        for (int64_t r0 = 0; r0 < N; r0 += 128) {
            int64_t nr = N - r0 < 128 ? N - r0 : 128;
            for (int64_t r = 0; r < nr; r++)
                src_row(t, r0 + r, rows + (size_t)(r * K));
            fp8_block_quantize(rows, (size_t)nr, (size_t)K, qbuf, scale_all + (size_t)(r0 / 128) * nbk);
            if (!write_all(fp, qbuf, (size_t)(nr * K)))
                return false;
        }
        return true;
    }
    return write_all(fp, scale_all, (size_t)((N + 127) / 128) * nbk * 4);
}

static void shard_entry(const void *ctx, size_t i, struct st_header_entry *e)
{
    const struct qt_out *o = &((const struct qt_shard *)ctx)->outs[i];
    *e = (struct st_header_entry){
        .name = o->name, .dtype = o->dtype, .n_dims = o->n_dims, .shape = o->shape, .begin = o->begin, .end = o->end};
}

static char *shard_header(const struct qt_shard *sh, size_t *len)
{
    return st_header_build(sh->n_outs, shard_entry, sh, len);
}

static enum status q_write_shards(struct quantizer *q, const char *out_dir)
{
    int64_t max_k = 1, max_n = 1;
    for (size_t f = 0; f < q->ck.n_files; f++)
        for (size_t i = 0; i < q->shards[f].n_outs; i++) {
            const struct st_tensor *t = q->shards[f].outs[i].src;
            if (t->n_dims == 2) {
                max_k = t->shape[1] > max_k ? t->shape[1] : max_k;
                max_n = t->shape[0] > max_n ? t->shape[0] : max_n;
            }
        }
    float *rows = malloc((size_t)(128 * max_k) * sizeof(float));
    uint8_t *qbuf = malloc((size_t)(128 * max_k));
    uint8_t *scales = malloc((size_t)(max_n * (max_k / 16 + 1)));
    float *fp8_scales = malloc((size_t)((max_n + 127) / 128 * ((max_k + 127) / 128)) * sizeof(float));
    if (!rows || !qbuf || !scales || !fp8_scales) {
        free(rows);
        free(qbuf);
        free(scales);
        free(fp8_scales);
        return err_set(q->err, STATUS_NOMEM, "quantize: out of memory for row buffers");
    }
    struct progress prog;
    progress_init(&prog, "quantizing", q->ck.total_bytes);
    uint64_t done = 0;
    enum status st = STATUS_OK;
    float scale2 = 1;
    for (size_t f = 0; f < q->ck.n_files && !st; f++) {
        struct qt_shard *sh = &q->shards[f];
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", out_dir, sh->file_name);
        FILE *fp = fopen(path, "wb");
        size_t hlen = 0;
        char *hdr = shard_header(sh, &hlen);
        unsigned char le[8];
        for (int i = 0; i < 8; i++)
            le[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
        bool ok = fp && hdr && write_all(fp, le, 8) && write_all(fp, hdr, hlen);
        free(hdr);
        for (size_t i = 0; i < sh->n_outs && ok; i++) {
            const struct qt_out *o = &sh->outs[i];
            bool quant = strcmp(o->name, o->src->name) != 0 || o->dtype != o->src->dtype;
            if (!quant)
                ok = write_all(fp, o->src->data, o->src->n_bytes);
            else if (q->o->format == WEIGHT_NVFP4)
                ok = write_nvfp4(q, fp, o, rows, qbuf, scales, &scale2);
            else
                ok = write_fp8(fp, o, rows, qbuf, fp8_scales);
            if (o->part == 0) {
                done += o->src->n_bytes;
                progress_update(&prog, done);
            }
        }
        if (!fp || !ok || fclose(fp) != 0) {
            st = err_set(q->err, STATUS_IO, "%s: cannot write: %s", path, strerror(errno));
        }
    }
    if (!st)
        progress_finish(&prog);
    free(rows);
    free(qbuf);
    free(scales);
    free(fp8_scales);
    return st;
}

static enum status write_json_file(const char *path, const struct json *j, struct err *err)
{
    char *s = json_print(j, true);
    FILE *fp = fopen(path, "w");
    bool ok = s && fp && fputs(s, fp) >= 0 && fputc('\n', fp) != EOF;
    if (fp && fclose(fp) != 0)
        ok = false;
    free(s);
    return ok ? STATUS_OK : err_set(err, STATUS_IO, "%s: cannot write", path);
}

static struct json *exclude_list(const struct quantizer *q)
{
    struct json *a = json_new_array();
    for (size_t i = 0; i < q->n_exclude; i++)
        json_append(a, json_new_string(q->exclude[i]));
    for (int l = q->n_layers; l < q->n_layers + 8; l++) { /* MTP layers, if the checkpoint has any */
        char p[64];
        snprintf(p, sizeof p, "model.layers.%d*", l);
        json_append(a, json_new_string(p));
    }
    return a;
}

/* config.json gains quantization_config; ModelOpt also writes hf_quant_config.json. */
static enum status q_write_configs(struct quantizer *q, const char *out_dir)
{
    char path[4096];
    struct json *qc = json_new_object();
    bool nv = q->o->format == WEIGHT_NVFP4;
    const char *algo = q->o->calib_tokens > 0 ? "NVFP4" : "W4A16_NVFP4";
    if (nv) {
        struct json *groups = json_add(qc, "config_groups", json_new_object());
        struct json *g0 = json_add(groups, "group_0", json_new_object());
        struct json *targets = json_add(g0, "targets", json_new_array());
        json_append(targets, json_new_string("Linear"));
        for (int side = 0; side < 2; side++) {
            if (side == 1 && q->o->calib_tokens <= 0) {
                json_add(g0, "input_activations", json_new_object());
                continue;
            }
            struct json *w = json_add(g0, side ? "input_activations" : "weights", json_new_object());
            json_add(w, "num_bits", json_new_number(4));
            json_add(w, "type", json_new_string("float"));
            json_add(w, "group_size", json_new_number(16));
            json_add(w, "dynamic", json_new_bool(false));
            json_add(w, "symmetric", json_new_bool(true));
        }
        json_add(qc, "quant_algo", json_new_string(algo));
        json_add(qc, "group_size", json_new_number(16));
        json_add(qc, "quant_method", json_new_string("modelopt"));
        json_add(qc, "ignore", exclude_list(q));
        struct json *prod = json_add(qc, "producer", json_new_object());
        json_add(prod, "name", json_new_string("moeserve"));
        json_add(prod, "version", json_new_string("0.1"));
    } else {
        json_add(qc, "activation_scheme", json_new_string("dynamic"));
        json_add(qc, "fmt", json_new_string("e4m3"));
        json_add(qc, "quant_method", json_new_string("fp8"));
        struct json *bs = json_add(qc, "weight_block_size", json_new_array());
        json_append(bs, json_new_number(128));
        json_append(bs, json_new_number(128));
        json_add(qc, "modules_to_not_convert", exclude_list(q));
    }
    /* rebuild config.json with the section replaced (our JSON tree is read-only) */
    struct json *cfg = json_new_object();
    for (const struct json *m = json_child(q->config); m; m = json_next(m)) {
        if (!strcmp(json_key(m), "quantization_config"))
            continue;
        char *txt = json_print(m, false);
        struct json *copy = NULL;
        struct err ignored = {0};
        if (txt && json_parse(txt, strlen(txt), "config", &copy, &ignored) == STATUS_OK)
            json_add(cfg, json_key(m), copy);
        free(txt);
    }
    json_add(cfg, "quantization_config", qc);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    enum status st = write_json_file(path, cfg, q->err);
    json_free(cfg);
    if (st || !nv)
        return st;
    struct json *hq = json_new_object();
    struct json *prod = json_add(hq, "producer", json_new_object());
    json_add(prod, "name", json_new_string("moeserve"));
    json_add(prod, "version", json_new_string("0.1"));
    struct json *qs = json_add(hq, "quantization", json_new_object());
    json_add(qs, "quant_algo", json_new_string(algo));
    json_add(qs, "kv_cache_quant_algo", json_new_null());
    json_add(qs, "group_size", json_new_number(16));
    json_add(qs, "exclude_modules", exclude_list(q));
    snprintf(path, sizeof path, "%s/hf_quant_config.json", out_dir);
    st = write_json_file(path, hq, q->err);
    json_free(hq);
    return st;
}

static enum status q_write_index(struct quantizer *q, const char *in_dir, const char *out_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", in_dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return STATUS_OK;
    struct json *idx = json_new_object();
    struct json *meta = json_add(idx, "metadata", json_new_object());
    struct json *map = json_add(idx, "weight_map", json_new_object());
    uint64_t total = 0;
    for (size_t f = 0; f < q->ck.n_files; f++)
        for (size_t i = 0; i < q->shards[f].n_outs; i++) {
            const struct qt_out *o = &q->shards[f].outs[i];
            json_add(map, o->name, json_new_string(q->shards[f].file_name));
            total += o->end - o->begin;
        }
    json_add(meta, "total_size", json_new_number((double)total));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out_dir);
    enum status st = write_json_file(path, idx, q->err);
    json_free(idx);
    return st;
}

/* Tokenizer files, generation config, templates...: everything else in the directory. */
static enum status q_copy_other_files(const char *in_dir, const char *out_dir, struct err *err)
{
    DIR *d = opendir(in_dir);
    if (!d)
        return err_set(err, STATUS_IO, "%s: cannot list: %s", in_dir, strerror(errno));
    struct dirent *de;
    enum status st = STATUS_OK;
    while (!st && (de = readdir(d))) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        if (n[0] == '.' || !strcmp(n, "config.json") || !strcmp(n, "hf_quant_config.json") ||
            !strcmp(n, "model.safetensors.index.json") || (len > 12 && !strcmp(n + len - 12, ".safetensors")))
            continue;
        char src[4096], dst[4096];
        snprintf(src, sizeof src, "%s/%s", in_dir, n);
        snprintf(dst, sizeof dst, "%s/%s", out_dir, n);
        struct stat sb;
        if (stat(src, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
        char buf[65536];
        size_t k;
        bool ok = in && out;
        while (ok && (k = fread(buf, 1, sizeof buf, in)) > 0)
            ok = fwrite(buf, 1, k, out) == k;
        if (in)
            fclose(in);
        if (out && fclose(out) != 0)
            ok = false;
        if (!ok)
            st = err_set(err, STATUS_IO, "cannot copy %s to %s", src, dst);
    }
    closedir(d);
    return st;
}

enum status quantize_checkpoint(const char *in_dir, const char *out_dir, const struct quantize_opts *o,
                                struct err *err)
{
    if (o->format != WEIGHT_NVFP4 && o->format != WEIGHT_FP8_BLOCK)
        return err_set(err, STATUS_INVALID, "quantize: format must be nvfp4 or fp8");
    if (strcmp(in_dir, out_dir) == 0)
        return err_set(err, STATUS_INVALID, "quantize: --out must differ from --in");
    struct quantizer q = {.o = o, .err = err};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", in_dir);
    enum status st = json_parse_file(path, &q.config, err);
    if (st)
        return st;
    if (!json_is_null(json_get(q.config, "quantization_config"))) {
        json_free(q.config);
        return err_set(err, STATUS_INVALID, "%s: the checkpoint is already quantized (quantization_config present)",
                       path);
    }
    q.n_layers = (int)json_number(json_get(q.config, "num_hidden_layers"));
    if (q.n_layers <= 0)
        q.n_layers = 1 << 30;
    for (size_t i = 0; i < sizeof DEFAULT_EXCLUDES / sizeof DEFAULT_EXCLUDES[0]; i++)
        q_add_exclude(&q, DEFAULT_EXCLUDES[i]);
    for (int i = 0; i < o->n_exclude; i++)
        q_add_exclude(&q, o->exclude[i]);
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        st = err_set(err, STATUS_IO, "%s: cannot create: %s", out_dir, strerror(errno));
        goto done;
    }
    if (o->format == WEIGHT_NVFP4 && o->calib_tokens > 0 &&
        (st = quantize_calib_run(&q.calib, in_dir, o->calib_tokens, o->calib_seed, err)))
        goto done;
    if ((st = checkpoint_open(&q.ck, in_dir, err)) || (st = q_plan(&q)) || (st = q_write_shards(&q, out_dir)) ||
        (st = q_write_index(&q, in_dir, out_dir)) || (st = q_write_configs(&q, out_dir)) ||
        (st = q_copy_other_files(in_dir, out_dir, err)))
        goto done;
    LOG_INFO("wrote %s (%s)", out_dir, o->format == WEIGHT_NVFP4 ? (o->calib_tokens > 0 ? "NVFP4" : "W4A16_NVFP4")
                                                                   : "FP8 block 128x128");
done:
    if (q.shards)
        for (size_t f = 0; f < q.ck.n_files; f++)
            free(q.shards[f].outs);
    free(q.shards);
    for (size_t i = 0; i < q.n_exclude; i++)
        free(q.exclude[i]);
    free(q.exclude);
    quantize_calib_free(&q.calib);
    checkpoint_close(&q.ck);
    json_free(q.config);
    return st;
}
