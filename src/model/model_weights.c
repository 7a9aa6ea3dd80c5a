/* model_weights.c — bind checkpoint tensors to model slots (see model_weights.h).
 *
 * The binder keeps going after a missing tensor so that one error message can
 * list everything that is missing (a wrong family or a half-copied checkpoint
 * shows at once). Shape mismatches and malformed quantization stop at once.
 * Weight format is decided per tensor from the dtypes present:
 *   BF16 / F16 / F32 `.weight`                      -> plain
 *   U8 `.weight` + F8_E4M3 `.weight_scale` (+ F32 `.weight_scale_2`) -> NVFP4
 *   F8_E4M3 `.weight` + F32 `.weight_scale_inv`     -> FP8 block 128x128
 *   U8 `.weight_packed` + `.weight_scale` + `.weight_global_scale` -> NVFP4
 *     (compressed-tensors; its global scale is the inverse of ModelOpt's)
 * and checked against the config's promise (quant_config_expect). Scales are
 * scanned once at load: NaN, Inf or negative block scales are refused here
 * rather than turning into NaN logits later.
 */
#include "model/model_weights.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/progress.h"
#include "format/weight_synth.h"

#define MISSING_LIST_MAX 12

/* How the next weight bound is split over the ranks (struct model_shard): its rows (a
 * column-parallel layer: the rank's output features) or its in-features (row-parallel: the
 * rank's share of a sum that the all-reduce completes; the bias then on rank 0 only). */
enum bind_split { SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS };

struct binder {
    const struct checkpoint *ck;
    const struct quant_config *qc; /* may be NULL */
    enum weight_kind kind;         /* module kind being bound, for the stats */
    bool expert_down;              /* binding a routed expert's down projection (WEIGHT_LOAD_EXPERT_DOWN) */
    struct backend *be;
    struct model_weights *w;
    struct err *err;
    enum status st;  /* first hard failure */
    int n_missing;
    char missing[MISSING_LIST_MAX][160];
    struct progress prog;
    uint64_t bytes_done;
    const struct model_shard *shard; /* this rank's share; size 1: the whole model */
    enum bind_split split;           /* for the next weight bound only */
    struct shard_range range;
    bool synth;                      /* no checkpoint: every weight made (format/weight_synth.h) */
    uint64_t synth_seed;
};

/* The next bind_matrix / bind_finish keeps only the rank's share `r` of the weight's rows or
 * in-features (nothing with one rank). */
static void bind_split(struct binder *b, enum bind_split split, struct shard_range r)
{
    b->split = b->shard->size > 1 && r.n < r.of ? split : SPLIT_NONE;
    b->range = r;
}

static void bind_missing(struct binder *b, const char *name)
{
    if (b->n_missing < MISSING_LIST_MAX)
        snprintf(b->missing[b->n_missing], sizeof b->missing[0], "%s", name);
    b->n_missing++;
}

static enum status bind_fail(struct binder *b, enum status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static enum status bind_fail(struct binder *b, enum status code, const char *fmt, ...)
{
    if (!b->st) {
        char msg[ERR_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        b->st = err_set(b->err, code, "%s", msg);
    }
    return b->st;
}

static const struct st_tensor *bind_find(struct binder *b, const char *fmt, const char *prefix)
{
    char name[512];
    snprintf(name, sizeof name, fmt, prefix);
    return checkpoint_find(b->ck, name);
}

static bool shape_is(const struct st_tensor *t, int n, int64_t d0, int64_t d1)
{
    if (t->n_dims != n)
        return false;
    if (n >= 1 && t->shape[0] != d0)
        return false;
    if (n >= 2 && t->shape[1] != d1)
        return false;
    return true;
}

static void shape_str(const struct st_tensor *t, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->n_dims && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

static enum status bind_shape_error(struct binder *b, const struct st_tensor *t, int64_t d0, int64_t d1,
                                    int nd)
{
    char got[96], want[96];
    shape_str(t, got, sizeof got);
    if (nd == 1)
        snprintf(want, sizeof want, "[%lld]", (long long)d0);
    else
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)d0, (long long)d1);
    if (!b->st)
        b->st = err_set(b->err, STATUS_FORMAT, "%s: tensor %s: shape %s %s, expected %s", t->file,
                        t->name, dtype_name(t->dtype), got, want);
    return b->st;
}

/* Entries [off, off + n) of the synthetic vector `name` (a bias where the name says so, else a
 * norm's weight) in backend memory. */
static float *bind_vector_synth(struct binder *b, const char *name, int64_t off, int64_t n)
{
    size_t len = strlen(name);
    bool bias = len > 5 && strcmp(name + len - 5, ".bias") == 0;
    bias |= strstr(name, "correction_bias") != NULL;
    float *host = malloc((size_t)n * sizeof(float));
    float *dev = host ? b->be->ops->alloc(b->be, (size_t)n * sizeof(float)) : NULL;
    if (!dev) {
        free(host);
        b->st = err_set(b->err, STATUS_NOMEM, "%s: out of memory", name);
        return NULL;
    }
    weight_synth_vector(weight_synth_seed(b->synth_seed, name), bias ? WS_VEC_BIAS : WS_VEC_NORM, off, n, host);
    b->be->ops->upload(b->be, dev, host, (size_t)n * sizeof(float));
    free(host);
    return dev;
}

/* Converts entries [off, off + n) of a 1-D tensor of `len` to fp32 into backend memory. */
static float *bind_vector_range(struct binder *b, const char *name, int64_t len, int64_t off, int64_t n,
                                bool required)
{
    if (b->st)
        return NULL;
    if (b->synth)
        return bind_vector_synth(b, name, off, n);
    const struct st_tensor *t = checkpoint_find(b->ck, name);
    if (!t) {
        if (required)
            bind_missing(b, name);
        return NULL;
    }
    if (!shape_is(t, 1, len, 0)) {
        bind_shape_error(b, t, len, 0, 1);
        return NULL;
    }
    float *host = malloc((size_t)len * sizeof(float));
    float *dev = b->be->ops->alloc(b->be, (size_t)n * sizeof(float));
    if (!host || !dev) {
        free(host);
        if (dev)
            b->be->ops->free(b->be, dev);
        b->st = err_set(b->err, STATUS_NOMEM, "%s: out of memory", name);
        return NULL;
    }
    for (int64_t i = 0; i < len; i++) {
        const unsigned char *p = (const unsigned char *)t->data + (size_t)i * dtype_size(t->dtype);
        uint16_t h;
        float f;
        switch (t->dtype) {
        case DTYPE_BF16: memcpy(&h, p, 2); host[i] = bf16_to_f32(h); break;
        case DTYPE_F16: memcpy(&h, p, 2); host[i] = f16_to_f32(h); break;
        case DTYPE_F32: memcpy(&f, p, 4); host[i] = f; break;
        default:
            free(host);
            b->be->ops->free(b->be, dev);
            bind_fail(b, STATUS_UNSUPPORTED, "%s: dtype %s is not supported for a vector", name,
                      dtype_name(t->dtype));
            return NULL;
        }
    }
    b->be->ops->upload(b->be, dev, host + off, (size_t)n * sizeof(float));
    free(host);
    return dev;
}

/* Converts a 1-D tensor to fp32 into backend memory. */
static float *bind_vector(struct binder *b, const char *name, int64_t len, bool required)
{
    return bind_vector_range(b, name, len, 0, len, required);
}

static bool dtype_plain(enum dtype t, enum weight_format *f)
{
    switch (t) {
    case DTYPE_BF16: *f = WEIGHT_BF16; return true;
    case DTYPE_F16: *f = WEIGHT_F16; return true;
    case DTYPE_F32: *f = WEIGHT_F32; return true;
    default: return false;
    }
}

/* Keeps a shard's memory until model_weights_free (the CPU computes from it in place). */
static bool bind_keep(struct binder *b, void *buf)
{
    struct model_weights *w = b->w;
    if (w->n_owned == w->cap_owned) {
        int cap = w->cap_owned ? 2 * w->cap_owned : 64;
        void **p = realloc(w->owned, (size_t)cap * sizeof *p);
        if (!p)
            return false;
        w->owned = p, w->cap_owned = cap;
    }
    w->owned[w->n_owned++] = buf;
    return true;
}

/* A synthetic weight's share: the shape only (its values are made from their place in the whole,
 * weight_synth.h), on the scale blocks as a real one's must be. */
static const char *weight_synth_slice(const struct weight *w, bool rows, int64_t off, int64_t n, struct weight *out)
{
    const int64_t blk = rows ? (w->format == WEIGHT_FP8_BLOCK ? 128 : 1) : weight_format_in_block(w->format);
    if (off < 0 || n <= 0 || off % blk || (n % blk && off + n != (rows ? w->rows : w->cols)))
        return "the split does not fall on the format's scale blocks";
    *out = *w;
    if (rows)
        out->rows = n;
    else
        out->cols = n;
    return NULL;
}

/* The rank's share of a host weight (bind_split); the bias is the caller's. */
static void bind_shard(struct binder *b, const char *prefix, enum bind_split split, struct shard_range r,
                       struct weight *host)
{
    struct weight part;
    void *buf = NULL;
    const char *why = b->synth                ? weight_synth_slice(host, split == SPLIT_ROWS, r.off, r.n, &part)
                      : split == SPLIT_ROWS ? weight_slice_rows(host, r.off, r.n, &part)
                                            : weight_slice_cols(host, r.off, r.n, &part, &buf);
    if (why) {
        bind_fail(b, STATUS_UNSUPPORTED, "%s: %s [%lld, %lld) of %lld for rank %d of %d: %s", prefix,
                  split == SPLIT_ROWS ? "rows" : "in-features", (long long)r.off, (long long)(r.off + r.n),
                  (long long)r.of, b->shard->rank, b->shard->size, why);
        return;
    }
    if (buf && !bind_keep(b, buf)) {
        free(buf);
        bind_fail(b, STATUS_NOMEM, "%s: out of memory for the shard table", prefix);
        return;
    }
    part.bias = host->bias;
    *host = part;
}

/* A synthetic weight's share made by the backend, or in host memory that the binder keeps and the
 * backend then loads (a backend without weight_make: the CPU computes from it in place). */
static enum status bind_make(struct binder *b, const char *prefix, const struct weight *host, enum bind_split split,
                             struct shard_range r, int64_t full_cols, unsigned flags, struct weight *out)
{
    const int64_t row_off = split == SPLIT_ROWS ? r.off : 0, col_off = split == SPLIT_COLS ? r.off : 0;
    const struct weight_synth ws = weight_synth_share(weight_synth_seed(b->synth_seed, prefix), row_off, col_off,
                                                      full_cols);
    if (b->be->ops->weight_make)
        return b->be->ops->weight_make(b->be, host, &ws, out, flags, b->err);
    struct weight w = *host;
    size_t db = weight_data_bytes(&w), sb = weight_scale_bytes(&w);
    void *data = malloc(db ? db : 1), *scale = NULL;
    bool ok = data && bind_keep(b, data);
    if (!ok)
        free(data);
    if (ok && sb) {
        scale = malloc(sb);
        ok = scale && bind_keep(b, scale);
        if (!ok)
            free(scale);
    }
    if (!ok)
        return err_set(b->err, STATUS_NOMEM, "%s: out of memory for a synthetic weight of %zu bytes", prefix, db + sb);
    const char *why = weight_synth_fill(&ws, &w, data, scale);
    if (why)
        return err_set(b->err, STATUS_UNSUPPORTED, "%s: %s (%s)", prefix, why, weight_format_name(w.format));
    w.data = data, w.scale = scale;
    return b->be->ops->weight_load(b->be, &w, out, flags, b->err);
}

/* Finishes a host weight: optional bias, the rank's share, accounting, hand-off to the backend. */
static void bind_finish(struct binder *b, const char *prefix, struct weight *host, bool bias,
                        struct weight *out)
{
    char name[512];
    const enum bind_split split = b->split;
    const struct shard_range r = b->range;
    b->split = SPLIT_NONE;
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", prefix);
        if (split == SPLIT_ROWS)
            host->bias = bind_vector_range(b, name, host->rows, r.off, r.n, true);
        else if (split == SPLIT_COLS && b->shard->rank != 0)
            host->bias = NULL; /* added once, by rank 0, to the sum */
        else
            host->bias = bind_vector(b, name, host->rows, true);
    }
    const int64_t full_cols = host->cols;
    if (!b->st && split != SPLIT_NONE)
        bind_shard(b, prefix, split, r, host);
    if (b->st)
        return;
    b->w->bytes_by_format[host->format] += weight_bytes(host);
    b->w->n_params += (uint64_t)host->rows * (uint64_t)host->cols;
    struct weight_kind_stats *ks = &b->w->kinds[b->kind];
    ks->params += (uint64_t)host->rows * (uint64_t)host->cols;
    ks->bytes += weight_bytes(host);
    ks->formats |= 1u << host->format;
    /* every token reads these in full (the routed experts and the router are the exceptions) */
    const unsigned flags =
        b->kind == WK_ATTENTION || b->kind == WK_DENSE_MLP || b->kind == WK_SHARED_EXPERT ? WEIGHT_LOAD_DENSE
        : b->kind == WK_ROUTED_EXPERTS ? WEIGHT_LOAD_EXPERT | (b->expert_down ? WEIGHT_LOAD_EXPERT_DOWN : 0u)
                                       : 0u;
    enum status st = b->synth ? bind_make(b, prefix, host, split, r, full_cols, flags, out)
                              : b->be->ops->weight_load(b->be, host, out, flags, b->err);
    if (st) {
        b->st = st;
        return;
    }
    b->bytes_done += weight_bytes(host);
    progress_update(&b->prog, b->bytes_done);
}

/* NVFP4 block scales must be finite and non-negative (UE4M3). */
static bool nvfp4_scales_ok(const struct st_tensor *sc)
{
    const uint8_t *p = sc->data;
    for (size_t i = 0; i < sc->n_bytes; i++)
        if ((p[i] & 0x7f) == 0x7f || ((p[i] & 0x80) && (p[i] & 0x7f)))
            return false;
    return true;
}

static void bind_nvfp4(struct binder *b, const char *prefix, const struct st_tensor *t, int64_t rows,
                       int64_t cols, bool compressed_tensors, struct weight *host)
{
    if (cols % 16 != 0) {
        bind_fail(b, STATUS_FORMAT, "%s: tensor %s: NVFP4 needs in-features divisible by 16", t->file, t->name);
        return;
    }
    if (!shape_is(t, 2, rows, cols / 2)) {
        bind_shape_error(b, t, rows, cols / 2, 2);
        return;
    }
    const struct st_tensor *sc = bind_find(b, "%s.weight_scale", prefix);
    const struct st_tensor *s2 = bind_find(b, compressed_tensors ? "%s.weight_global_scale" : "%s.weight_scale_2",
                                           prefix);
    if (!sc || sc->dtype != DTYPE_F8_E4M3) {
        bind_fail(b, STATUS_FORMAT, "%s: tensor %s is U8 (NVFP4) but has no F8_E4M3 weight_scale", t->file, t->name);
        return;
    }
    if (!shape_is(sc, 2, rows, cols / 16)) {
        bind_shape_error(b, sc, rows, cols / 16, 2);
        return;
    }
    if (!nvfp4_scales_ok(sc)) {
        bind_fail(b, STATUS_FORMAT, "%s: tensor %s: NaN or negative E4M3 block scale", sc->file, sc->name);
        return;
    }
    float scale2 = 1.0f;
    if (s2) {
        if (s2->dtype != DTYPE_F32 || s2->n_bytes != 4) {
            bind_fail(b, STATUS_FORMAT, "%s: tensor %s must hold one F32", s2->file, s2->name);
            return;
        }
        memcpy(&scale2, s2->data, 4);
        if (compressed_tensors)
            scale2 = 1.0f / scale2; /* compressed-tensors stores the inverse */
        if (!isfinite(scale2) || !(scale2 > 0)) {
            bind_fail(b, STATUS_FORMAT, "%s: tensor %s: global scale is not a finite positive number", s2->file,
                      s2->name);
            return;
        }
    } else if (compressed_tensors) {
        bind_fail(b, STATUS_FORMAT, "%s: tensor %s has no weight_global_scale", t->file, t->name);
        return;
    }
    *host = (struct weight){.format = WEIGHT_NVFP4, .rows = rows, .cols = cols, .data = t->data,
                            .scale = sc->data, .scale2 = scale2};
}

static void bind_fp8(struct binder *b, const char *prefix, const struct st_tensor *t, int64_t rows,
                     int64_t cols, struct weight *host)
{
    if (!shape_is(t, 2, rows, cols)) {
        bind_shape_error(b, t, rows, cols, 2);
        return;
    }
    const struct st_tensor *sc = bind_find(b, "%s.weight_scale_inv", prefix);
    if (!sc || sc->dtype != DTYPE_F32) {
        bind_fail(b, STATUS_FORMAT, "%s: tensor %s.weight is F8_E4M3 but has no F32 weight_scale_inv",
                  t->file, prefix);
        return;
    }
    if (!shape_is(sc, 2, (rows + 127) / 128, (cols + 127) / 128)) {
        bind_shape_error(b, sc, (rows + 127) / 128, (cols + 127) / 128, 2);
        return;
    }
    for (size_t i = 0; i < sc->n_bytes / 4; i++) {
        float f;
        memcpy(&f, (const char *)sc->data + 4 * i, 4);
        if (!isfinite(f) || f < 0) {
            bind_fail(b, STATUS_FORMAT, "%s: tensor %s: scale %zu is NaN, infinite or negative", sc->file, sc->name, i);
            return;
        }
    }
    *host = (struct weight){.format = WEIGHT_FP8_BLOCK, .rows = rows, .cols = cols, .data = t->data,
                            .scale = sc->data, .scale2 = 1.0f};
}

static const char *format_desc(enum weight_format f)
{
    return f == WEIGHT_BF16 || f == WEIGHT_F16 || f == WEIGHT_F32 ? "unquantized" : weight_format_name(f);
}

/* Binds `<prefix>.weight` of logical shape [rows, cols] (+ `<prefix>.bias`). */
static void bind_matrix(struct binder *b, const char *prefix, int64_t rows, int64_t cols, bool bias,
                        struct weight *out)
{
    if (b->st)
        return;
    if (b->synth) {
        /* the format the config promises the module (BF16 where it promises none) */
        enum weight_format f = b->qc ? quant_config_expect(b->qc, prefix) : WEIGHT_BF16;
        struct weight host = {.format = f, .rows = rows, .cols = cols,
                              .scale2 = f == WEIGHT_NVFP4 ? weight_synth_nvfp4_scale2(cols) : 1.0f};
        bind_finish(b, prefix, &host, bias, out);
        return;
    }
    const struct st_tensor *t = bind_find(b, "%s.weight", prefix);
    bool packed = false;
    if (!t && (t = bind_find(b, "%s.weight_packed", prefix)))
        packed = true;
    if (!t) {
        char name[512];
        snprintf(name, sizeof name, "%s.weight", prefix);
        bind_missing(b, name);
        return;
    }
    struct weight host = {0};
    enum weight_format f;
    if (!packed && dtype_plain(t->dtype, &f)) {
        if (!shape_is(t, 2, rows, cols)) {
            bind_shape_error(b, t, rows, cols, 2);
            return;
        }
        host = (struct weight){.format = f, .rows = rows, .cols = cols, .data = t->data, .scale2 = 1.0f};
    } else if (t->dtype == DTYPE_U8) {
        bind_nvfp4(b, prefix, t, rows, cols, packed, &host);
    } else if (t->dtype == DTYPE_F8_E4M3) {
        bind_fp8(b, prefix, t, rows, cols, &host);
    } else {
        bind_fail(b, STATUS_UNSUPPORTED, "%s: tensor %s: dtype not supported for a linear layer", t->file, t->name);
        return;
    }
    if (b->st)
        return;
    if (b->qc && b->qc->algo != QUANT_NONE) {
        enum weight_format want = quant_config_expect(b->qc, prefix);
        bool want_plain = want == WEIGHT_BF16, got_plain = !strcmp(format_desc(host.format), "unquantized");
        if (want_plain != got_plain || (!want_plain && want != host.format)) {
            bind_fail(b, STATUS_FORMAT, "%s: tensor %s is %s but %s (%s) makes module %s %s", t->file, t->name,
                      format_desc(host.format), b->qc->source, quant_algo_name(b->qc->algo), prefix,
                      format_desc(want));
            return;
        }
    }
    /* safetensors does not promise aligned data; kernels load whole elements */
    if ((uintptr_t)host.data % dtype_size(t->dtype) != 0) {
        bind_fail(b, STATUS_UNSUPPORTED, "%s: tensor %s: data is not aligned to its element size", t->file, t->name);
        return;
    }
    bind_finish(b, prefix, &host, bias, out);
}

/* transformers 5.x fused experts: gate_up_proj [E, 2I, D] and down_proj [E, D, I]. */
static bool bind_fused_experts(struct binder *b, const char *lp, const struct model_desc *d,
                               struct layer_weights *lw)
{
    char name[512];
    if (b->synth)
        return false; /* synthetic experts have per-expert names */
    snprintf(name, sizeof name, "%s.mlp.experts.gate_up_proj", lp);
    const struct st_tensor *gu = checkpoint_find(b->ck, name);
    if (!gu) {
        snprintf(name, sizeof name, "%s.mlp.experts.gate_up_proj.weight", lp);
        gu = checkpoint_find(b->ck, name);
    }
    if (!gu)
        return false;
    snprintf(name, sizeof name, "%s.mlp.experts.down_proj", lp);
    const struct st_tensor *dn = checkpoint_find(b->ck, name);
    if (!dn) {
        snprintf(name, sizeof name, "%s.mlp.experts.down_proj.weight", lp);
        dn = checkpoint_find(b->ck, name);
    }
    if (!dn) {
        bind_missing(b, name);
        return true;
    }
    int64_t E = d->n_experts, I = d->d_expert, D = d->d_model;
    enum weight_format f;
    if (!dtype_plain(gu->dtype, &f) || gu->dtype != dn->dtype) {
        bind_fail(b, STATUS_UNSUPPORTED, "%s: tensor %s: fused experts must be BF16/F16/F32", gu->file,
                  gu->name);
        return true;
    }
    if (gu->n_dims != 3 || gu->shape[0] != E || gu->shape[1] != 2 * I || gu->shape[2] != D) {
        bind_fail(b, STATUS_FORMAT, "%s: tensor %s: fused gate_up_proj shape does not match [E, 2*I, D]",
                  gu->file, gu->name);
        return true;
    }
    if (dn->n_dims != 3 || dn->shape[0] != E || dn->shape[1] != D || dn->shape[2] != I) {
        bind_fail(b, STATUS_FORMAT, "%s: tensor %s: fused down_proj shape does not match [E, D, I]",
                  dn->file, dn->name);
        return true;
    }
    size_t es = dtype_size(gu->dtype);
    const struct shard_range ex = model_shard_experts(d, b->shard);
    const bool tp = !b->shard->expert_parallel;
    for (int64_t e = ex.off; e < ex.off + ex.n && !b->st; e++) {
        const char *g0 = (const char *)gu->data + (size_t)(e * 2 * I * D) * es;
        struct weight g = {.format = f, .rows = I, .cols = D, .data = g0, .scale2 = 1.0f};
        struct weight u = {.format = f, .rows = I, .cols = D, .data = g0 + (size_t)(I * D) * es, .scale2 = 1.0f};
        struct weight dw = {.format = f, .rows = D, .cols = I,
                            .data = (const char *)dn->data + (size_t)(e * D * I) * es, .scale2 = 1.0f};
        bind_split(b, tp ? SPLIT_ROWS : SPLIT_NONE, model_shard_width(I, b->shard));
        bind_finish(b, gu->name, &g, false, &lw->exp_gate[e]);
        bind_split(b, tp ? SPLIT_ROWS : SPLIT_NONE, model_shard_width(I, b->shard));
        bind_finish(b, gu->name, &u, false, &lw->exp_up[e]);
        b->expert_down = true;
        bind_split(b, tp ? SPLIT_COLS : SPLIT_NONE, model_shard_width(I, b->shard));
        bind_finish(b, dn->name, &dw, false, &lw->exp_down[e]);
        b->expert_down = false;
    }
    return true;
}

static void bind_moe(struct binder *b, const char *lp, const struct model_desc *d,
                     struct layer_weights *lw)
{
    char p[512], name[512];
    snprintf(p, sizeof p, "%s.mlp.gate", lp);
    b->kind = WK_ROUTER;
    bind_matrix(b, p, d->n_experts, d->d_model, false, &lw->router);
    b->kind = WK_ROUTED_EXPERTS;
    if (d->has_correction_bias) {
        snprintf(name, sizeof name, "%s.mlp.gate.e_score_correction_bias", lp);
        lw->correction_bias = bind_vector(b, name, d->n_experts, true);
    }
    size_t E = (size_t)d->n_experts;
    lw->exp_gate = calloc(E, sizeof(struct weight));
    lw->exp_up = calloc(E, sizeof(struct weight));
    lw->exp_down = calloc(E, sizeof(struct weight));
    if (!lw->exp_gate || !lw->exp_up || !lw->exp_down) {
        b->st = err_set(b->err, STATUS_NOMEM, "%s: out of memory for expert table", lp);
        return;
    }
    if (!bind_fused_experts(b, lp, d, lw)) {
        /* EP: only the rank's experts (the others stay empty: the routing masks them out);
         * TP-MoE: every expert's share of its width */
        const struct shard_range ex = model_shard_experts(d, b->shard), iw = model_shard_width(d->d_expert, b->shard);
        const enum bind_split rows = b->shard->expert_parallel ? SPLIT_NONE : SPLIT_ROWS;
        const enum bind_split cols = b->shard->expert_parallel ? SPLIT_NONE : SPLIT_COLS;
        for (int64_t e = ex.off; e < ex.off + ex.n && !b->st; e++) {
            snprintf(p, sizeof p, "%s.mlp.experts.%lld.gate_proj", lp, (long long)e);
            bind_split(b, rows, iw);
            bind_matrix(b, p, d->d_expert, d->d_model, false, &lw->exp_gate[e]);
            snprintf(p, sizeof p, "%s.mlp.experts.%lld.up_proj", lp, (long long)e);
            bind_split(b, rows, iw);
            bind_matrix(b, p, d->d_expert, d->d_model, false, &lw->exp_up[e]);
            snprintf(p, sizeof p, "%s.mlp.experts.%lld.down_proj", lp, (long long)e);
            b->expert_down = true;
            bind_split(b, cols, iw);
            bind_matrix(b, p, d->d_model, d->d_expert, false, &lw->exp_down[e]);
            b->expert_down = false;
        }
    }
    if (d->n_shared_experts > 0) {
        b->kind = WK_SHARED_EXPERT;
        int64_t width = (int64_t)d->d_expert * d->n_shared_experts;
        const struct shard_range sw = model_shard_width(width, b->shard);
        snprintf(p, sizeof p, "%s.mlp.shared_experts.gate_proj", lp);
        bind_split(b, SPLIT_ROWS, sw);
        bind_matrix(b, p, width, d->d_model, false, &lw->ffn_gate);
        snprintf(p, sizeof p, "%s.mlp.shared_experts.up_proj", lp);
        bind_split(b, SPLIT_ROWS, sw);
        bind_matrix(b, p, width, d->d_model, false, &lw->ffn_up);
        snprintf(p, sizeof p, "%s.mlp.shared_experts.down_proj", lp);
        bind_split(b, SPLIT_COLS, sw);
        bind_matrix(b, p, d->d_model, width, false, &lw->ffn_down);
        lw->has_ffn = true;
    }
}

static void bind_attention_gqa(struct binder *b, const struct model_desc *d, const char *lp,
                               struct layer_weights *lw)
{
    char p[512];
    int64_t qd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    const struct shard_range h = model_shard_heads(d, b->shard), kh = model_shard_kv_heads(d, b->shard);
    const struct shard_range qr = {h.off * d->head_dim, h.n * d->head_dim, qd};
    const struct shard_range kr = {kh.off * d->head_dim, kh.n * d->head_dim, kvd};
    snprintf(p, sizeof p, "%s.self_attn.q_proj", lp);
    bind_split(b, SPLIT_ROWS, qr);
    bind_matrix(b, p, qd, d->d_model, d->qkv_bias, &lw->wq);
    snprintf(p, sizeof p, "%s.self_attn.k_proj", lp);
    bind_split(b, SPLIT_ROWS, kr);
    bind_matrix(b, p, kvd, d->d_model, d->qkv_bias, &lw->wk);
    snprintf(p, sizeof p, "%s.self_attn.v_proj", lp);
    bind_split(b, SPLIT_ROWS, kr);
    bind_matrix(b, p, kvd, d->d_model, d->qkv_bias, &lw->wv);
    snprintf(p, sizeof p, "%s.self_attn.o_proj", lp);
    bind_split(b, SPLIT_COLS, qr);
    bind_matrix(b, p, d->d_model, qd, d->o_bias, &lw->wo);
    if (d->qk_norm) {
        snprintf(p, sizeof p, "%s.self_attn.q_norm.weight", lp);
        lw->q_norm = bind_vector(b, p, d->head_dim, true);
        snprintf(p, sizeof p, "%s.self_attn.k_norm.weight", lp);
        lw->k_norm = bind_vector(b, p, d->head_dim, true);
    }
}

/* MLA projections and, on "full" layers, the DSA indexer (spec C.7). Shared
 * layers have no indexer tensors; any that are present are left unbound. */
static void bind_attention_mla(struct binder *b, const struct model_desc *d, int l, const char *lp,
                               struct layer_weights *lw)
{
    char p[512];
    int64_t H = d->n_heads, qk = (int64_t)d->qk_nope_head_dim + d->qk_rope_head_dim;
    snprintf(p, sizeof p, "%s.self_attn.q_a_proj", lp);
    bind_matrix(b, p, d->q_lora_rank, d->d_model, d->mla_bias, &lw->q_a);
    snprintf(p, sizeof p, "%s.self_attn.q_a_layernorm.weight", lp);
    lw->q_a_norm = bind_vector(b, p, d->q_lora_rank, true);
    const struct shard_range h = model_shard_heads(d, b->shard);
    const int64_t kvh = (int64_t)d->qk_nope_head_dim + d->v_head_dim;
    snprintf(p, sizeof p, "%s.self_attn.q_b_proj", lp);
    bind_split(b, SPLIT_ROWS, (struct shard_range){h.off * qk, h.n * qk, H * qk});
    bind_matrix(b, p, H * qk, d->q_lora_rank, false, &lw->q_b);
    snprintf(p, sizeof p, "%s.self_attn.kv_a_proj_with_mqa", lp);
    bind_matrix(b, p, (int64_t)d->kv_lora_rank + d->qk_rope_head_dim, d->d_model, d->mla_bias, &lw->kv_a);
    snprintf(p, sizeof p, "%s.self_attn.kv_a_layernorm.weight", lp);
    lw->kv_a_norm = bind_vector(b, p, d->kv_lora_rank, true);
    snprintf(p, sizeof p, "%s.self_attn.kv_b_proj", lp);
    bind_split(b, SPLIT_ROWS, (struct shard_range){h.off * kvh, h.n * kvh, H * kvh});
    bind_matrix(b, p, H * kvh, d->kv_lora_rank, false, &lw->kv_b);
    snprintf(p, sizeof p, "%s.self_attn.o_proj", lp);
    bind_split(b, SPLIT_COLS, (struct shard_range){h.off * d->v_head_dim, h.n * d->v_head_dim, H * d->v_head_dim});
    bind_matrix(b, p, d->d_model, H * d->v_head_dim, d->mla_bias, &lw->wo);
    if (d->layers[l].indexer != INDEXER_FULL)
        return;
    lw->has_indexer = true;
    int64_t HI = d->index_n_heads, DI = d->index_head_dim;
    snprintf(p, sizeof p, "%s.self_attn.indexer.wq_b", lp);
    bind_matrix(b, p, HI * DI, d->q_lora_rank, false, &lw->idx_wq);
    snprintf(p, sizeof p, "%s.self_attn.indexer.wk", lp);
    bind_matrix(b, p, DI, d->d_model, false, &lw->idx_wk);
    snprintf(p, sizeof p, "%s.self_attn.indexer.weights_proj", lp);
    bind_matrix(b, p, HI, d->d_model, false, &lw->idx_wproj);
    snprintf(p, sizeof p, "%s.self_attn.indexer.k_norm.weight", lp);
    lw->idx_k_norm_w = bind_vector(b, p, DI, true);
    snprintf(p, sizeof p, "%s.self_attn.indexer.k_norm.bias", lp);
    lw->idx_k_norm_b = bind_vector(b, p, DI, true);
}

static void bind_layer(struct binder *b, const struct model_desc *d, int l)
{
    struct layer_weights *lw = &b->w->layers[l];
    char lp[128], p[512];
    snprintf(lp, sizeof lp, "model.layers.%d", l);
    snprintf(p, sizeof p, "%s.input_layernorm.weight", lp);
    lw->attn_norm = bind_vector(b, p, d->d_model, true);
    snprintf(p, sizeof p, "%s.post_attention_layernorm.weight", lp);
    lw->ffn_norm = bind_vector(b, p, d->d_model, true);
    b->kind = WK_ATTENTION;
    if (d->layers[l].attn == ATTN_MLA)
        bind_attention_mla(b, d, l, lp, lw);
    else
        bind_attention_gqa(b, d, lp, lw);
    if (d->layers[l].ffn == FFN_MOE) {
        bind_moe(b, lp, d, lw);
    } else {
        b->kind = WK_DENSE_MLP;
        const struct shard_range fw = model_shard_width(d->d_ff, b->shard);
        snprintf(p, sizeof p, "%s.mlp.gate_proj", lp);
        bind_split(b, SPLIT_ROWS, fw);
        bind_matrix(b, p, d->d_ff, d->d_model, false, &lw->ffn_gate);
        snprintf(p, sizeof p, "%s.mlp.up_proj", lp);
        bind_split(b, SPLIT_ROWS, fw);
        bind_matrix(b, p, d->d_ff, d->d_model, false, &lw->ffn_up);
        snprintf(p, sizeof p, "%s.mlp.down_proj", lp);
        bind_split(b, SPLIT_COLS, fw);
        bind_matrix(b, p, d->d_model, d->d_ff, false, &lw->ffn_down);
        lw->has_ffn = true;
    }
}

static void bind_embedding(struct binder *b, const char *name, const struct model_desc *d,
                           struct weight *out)
{
    if (b->synth) {
        struct weight host = {.format = WEIGHT_BF16, .rows = d->vocab_size, .cols = d->d_model, .scale2 = 1.0f};
        bind_finish(b, name, &host, false, out);
        return;
    }
    const struct st_tensor *t = checkpoint_find(b->ck, name);
    if (!t) {
        bind_missing(b, name);
        return;
    }
    enum weight_format f;
    if (!dtype_plain(t->dtype, &f)) {
        bind_fail(b, STATUS_UNSUPPORTED, "%s: tensor %s: embeddings must be BF16, F16 or F32", t->file, name);
        return;
    }
    if (!shape_is(t, 2, d->vocab_size, d->d_model)) {
        bind_shape_error(b, t, d->vocab_size, d->d_model, 2);
        return;
    }
    struct weight host = {.format = f, .rows = d->vocab_size, .cols = d->d_model, .data = t->data,
                          .scale2 = 1.0f};
    bind_finish(b, name, &host, false, out);
}

const char *weight_kind_name(enum weight_kind k)
{
    static const char *const names[WK_COUNT] = {"embedding", "attention", "dense mlp", "shared expert",
                                                 "routed experts", "router", "lm_head"};
    return (unsigned)k < WK_COUNT ? names[k] : "?";
}

enum status model_weights_load(struct model_weights *w, const struct model_desc *d,
                               const struct checkpoint *ck, const struct quant_config *qc, struct backend *be,
                               struct err *err)
{
    return model_weights_load_shard(w, d, ck, qc, be, NULL, err);
}

/* Binds from ck, or makes every weight from seed (synth, ck NULL). */
static enum status weights_bind(struct model_weights *w, const struct model_desc *d, const struct checkpoint *ck,
                                const struct quant_config *qc, struct backend *be, const struct model_shard *shard,
                                bool synth, uint64_t seed, struct err *err)
{
    memset(w, 0, sizeof *w);
    w->be = be;
    static const struct model_shard whole = {.rank = 0, .size = 1};
    struct binder b = {.ck = ck, .qc = qc, .be = be, .w = w, .err = err, .shard = shard ? shard : &whole,
                       .synth = synth, .synth_seed = seed};
    if (shard) {
        enum status st = model_shard_check(d, shard, err);
        if (st)
            return st;
    }
    w->layers = calloc((size_t)d->n_layers, sizeof *w->layers);
    if (!w->layers)
        return err_set(err, STATUS_NOMEM, "out of memory for %d layers", d->n_layers);
    w->n_layers = d->n_layers;
    progress_init(&b.prog, synth ? "making synthetic weights" : "binding weights", synth ? 0 : ck->total_bytes);
    b.kind = WK_EMBEDDING;
    bind_embedding(&b, "model.embed_tokens.weight", d, &w->embed);
    char name[64];
    snprintf(name, sizeof name, "model.norm.weight");
    w->final_norm = bind_vector(&b, name, d->d_model, true);
    b.kind = WK_LM_HEAD;
    const struct shard_range vr = model_shard_vocab(d, b.shard);
    if (d->tie_word_embeddings) {
        w->lm_head = w->embed;
        const char *why = !b.st && vr.n < vr.of ? weight_slice_rows(&w->embed, vr.off, vr.n, &w->lm_head) : NULL;
        if (why)
            bind_fail(&b, STATUS_UNSUPPORTED, "model.embed_tokens.weight as the tied lm_head: rows [%lld, %lld) "
                      "for rank %d of %d: %s", (long long)vr.off, (long long)(vr.off + vr.n), b.shard->rank,
                      b.shard->size, why);
    } else {
        bind_split(&b, SPLIT_ROWS, vr);
        bind_matrix(&b, "lm_head", d->vocab_size, d->d_model, false, &w->lm_head);
    }
    for (int l = 0; l < d->n_layers && !b.st; l++)
        bind_layer(&b, d, l);
    if (!b.st && b.n_missing) {
        char list[MISSING_LIST_MAX * 170] = "";
        size_t o = 0;
        for (int i = 0; i < b.n_missing && i < MISSING_LIST_MAX; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", b.missing[i]);
        b.st = err_set(err, STATUS_NOT_FOUND, "%s: %d tensor%s missing for %s: %s%s", ck ? ck->dir : "?", b.n_missing,
                       b.n_missing == 1 ? "" : "s", model_family_name(d->family), list,
                       b.n_missing > MISSING_LIST_MAX ? ", ..." : "");
    }
    if (b.st) {
        model_weights_free(w);
        return b.st;
    }
    b.prog.total = b.bytes_done; /* the files also hold headers and skipped tensors */
    progress_update(&b.prog, b.bytes_done);
    progress_finish(&b.prog);
    return STATUS_OK;
}

enum status model_weights_load_shard(struct model_weights *w, const struct model_desc *d,
                                     const struct checkpoint *ck, const struct quant_config *qc, struct backend *be,
                                     const struct model_shard *shard, struct err *err)
{
    return weights_bind(w, d, ck, qc, be, shard, false, 0, err);
}

enum status model_weights_make_shard(struct model_weights *w, const struct model_desc *d,
                                     const struct quant_config *qc, struct backend *be,
                                     const struct model_shard *shard, uint64_t seed, struct err *err)
{
    return weights_bind(w, d, NULL, qc, be, shard, true, seed, err);
}

static void free_vec(struct backend *be, float *p)
{
    if (p)
        be->ops->free(be, p);
}

static void free_bias(struct backend *be, struct weight *wt)
{
    free_vec(be, (float *)wt->bias);
    wt->bias = NULL;
}

void model_weights_free(struct model_weights *w)
{
    if (!w->be) {
        memset(w, 0, sizeof *w);
        return;
    }
    struct backend *be = w->be;
    free_vec(be, w->final_norm);
    if (w->layers) {
        size_t n = (size_t)w->n_layers;
        for (size_t l = 0; l < n; l++) {
            struct layer_weights *lw = &w->layers[l];
            free_vec(be, lw->attn_norm);
            free_vec(be, lw->ffn_norm);
            free_vec(be, lw->q_norm);
            free_vec(be, lw->k_norm);
            free_vec(be, lw->correction_bias);
            free_vec(be, lw->q_a_norm);
            free_vec(be, lw->kv_a_norm);
            free_vec(be, lw->idx_k_norm_w);
            free_vec(be, lw->idx_k_norm_b);
            free_bias(be, &lw->q_a);
            free_bias(be, &lw->kv_a);
            free_bias(be, &lw->wq);
            free_bias(be, &lw->wk);
            free_bias(be, &lw->wv);
            free_bias(be, &lw->wo);
            free(lw->exp_gate);
            free(lw->exp_up);
            free(lw->exp_down);
        }
        free(w->layers);
    }
    for (int i = 0; i < w->n_owned; i++)
        free(w->owned[i]);
    free(w->owned);
    memset(w, 0, sizeof *w);
}
