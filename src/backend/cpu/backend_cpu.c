/* backend_cpu.c — the reference backend: every op, fp32, OpenMP threads.
 *
 * This is the ground truth other backends are tested against, so it favours
 * plain loops whose math can be checked against spec/models.md line by line.
 * The one hot spot, the weight GEMM, lives in cpu_gemm.c (SIMD, reads every
 * weight format in place). Attention uses an online softmax over the paged
 * cache, so it needs no per-call scratch.
 *
 * Not here: anything model-specific (the forward decides what to call).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_mla.h"
#include "base/dtype.h"
#include "base/logprobs.h"

#define CPU_MAX_HEAD_DIM 1024

static void *cpu_alloc(struct backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return NULL;
    return p;
}

static void cpu_free(struct backend *be, void *p)
{
    (void)be;
    free(p);
}

static void cpu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes)
        memcpy(dst, src, bytes);
}

static void cpu_synchronize(struct backend *be)
{
    (void)be;
}

static enum status cpu_weight_load(struct backend *be, const struct weight *host, struct weight *out,
                                   unsigned flags, struct err *err)
{
    (void)be;
    (void)flags;
    (void)err;
    *out = *host; /* the mmap'ed checkpoint is the CPU's weight memory */
    return STATUS_OK;
}

static void cpu_embed(struct backend *be, const struct weight *table, const int32_t *tokens, int n,
                      float *out)
{
    (void)be;
    int64_t dim = table->cols;
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * (size_t)dim;
        size_t row = (size_t)tokens[i] * (size_t)dim;
        switch (table->format) {
        case WEIGHT_F32:
            memcpy(o, (const float *)table->data + row, (size_t)dim * sizeof(float));
            break;
        case WEIGHT_BF16:
            for (int64_t j = 0; j < dim; j++)
                o[j] = bf16_to_f32(((const uint16_t *)table->data)[row + (size_t)j]);
            break;
        case WEIGHT_F16:
            for (int64_t j = 0; j < dim; j++)
                o[j] = f16_to_f32(((const uint16_t *)table->data)[row + (size_t)j]);
            break;
        default:
            /* model_weights refuses quantized embeddings at load */
            PANIC("embedding in format %s", weight_format_name(table->format));
        }
    }
}

/* The backend's options (backend_cpu_create_opts), held in be->impl. */
static bool cpu_rowwise(const struct backend *be)
{
    return be->impl && ((const struct backend_cpu_opts *)be->impl)->batch_invariant;
}

static void cpu_linear(struct backend *be, const struct weight *w, const float *x, int m, float *y)
{
    cpu_gemm_mode(w, x, m, (size_t)w->cols, y, (size_t)w->rows, cpu_rowwise(be));
}

static void rmsnorm_row(const float *x, const float *w, int dim, float eps, float *y)
{
    double ss = 0;
    for (int j = 0; j < dim; j++)
        ss += (double)x[j] * (double)x[j];
    float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int j = 0; j < dim; j++)
        y[j] = w[j] * (x[j] * inv);
}

static void cpu_rmsnorm(struct backend *be, const float *x, const float *w, int rows, int dim,
                        float eps, float *y)
{
    (void)be;
#pragma omp parallel for schedule(static) if (rows > 64)
    for (int r = 0; r < rows; r++)
        rmsnorm_row(x + (size_t)r * (size_t)dim, w, dim, eps, y + (size_t)r * (size_t)dim);
}

static void cpu_add_rmsnorm(struct backend *be, float *h, const float *delta, const float *w,
                            int rows, int dim, float eps, float *y)
{
    (void)be;
#pragma omp parallel for schedule(static) if (rows > 64)
    for (int r = 0; r < rows; r++) {
        float *hr = h + (size_t)r * (size_t)dim;
        const float *dr = delta + (size_t)r * (size_t)dim;
        for (int j = 0; j < dim; j++)
            hr[j] += dr[j];
        rmsnorm_row(hr, w, dim, eps, y + (size_t)r * (size_t)dim);
    }
}

/* backend_ops.logprobs: base/logprobs.h row by row (the scheduler's own computation). */
static void cpu_logprobs(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
                         const uint32_t *masks, const int32_t *ids, int k, float *lp, int32_t *top_ids, float *top_lp)
{
    (void)be;
    const size_t words = ((size_t)vocab + 31) / 32;
    for (int r = 0; r < rows; r++) {
        const uint32_t *m = masks && params[r].mask > 0 ? masks + (size_t)(params[r].mask - 1) * words : NULL;
        lp[r] = logprobs_row(logits + (size_t)r * (size_t)vocab, vocab, m, ids[r], k, top_ids + (size_t)r * k,
                             top_lp + (size_t)r * k);
    }
}

/* The reference of backend_ops.logits_edit (the CPU draws on the host: the forward never asks it). */
static void cpu_logits_edit(struct backend *be, float *logits, int rows, int vocab, const int32_t *start,
                            const struct logit_edit *edits)
{
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int k = start[r]; k < start[r + 1]; k++) {
            const struct logit_edit e = edits[k];
            float x = logits[(size_t)r * (size_t)vocab + (size_t)e.id] + e.pre;
            if (e.rep != 1.0f)
                x = x > 0 ? x / e.rep : x * e.rep;
            logits[(size_t)r * (size_t)vocab + (size_t)e.id] = x + e.post;
        }
}

static void cpu_rope(struct backend *be, float *x, int n_tokens, int n_heads, int head_stride,
                     const struct rope_args *a, const int32_t *pos)
{
    (void)be;
    int half = a->dim / 2;
    ASSERT(half <= CPU_MAX_HEAD_DIM);
#pragma omp parallel for schedule(static) if (n_tokens > 16)
    for (int t = 0; t < n_tokens; t++) {
        float c[CPU_MAX_HEAD_DIM], s[CPU_MAX_HEAD_DIM], tmp[2 * CPU_MAX_HEAD_DIM];
        float p = (float)pos[t];
        for (int i = 0; i < half; i++) {
            float phi = p * a->inv_freq[i]; /* fp32 product, as transformers */
            c[i] = cosf(phi) * a->attention_factor;
            s[i] = sinf(phi) * a->attention_factor;
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)t * (size_t)n_heads * (size_t)head_stride +
                       (size_t)h * (size_t)head_stride + (size_t)a->offset;
            if (a->interleaved) {
                for (int i = 0; i < half; i++) {
                    float x0 = v[2 * i], x1 = v[2 * i + 1];
                    tmp[i] = x0 * c[i] - x1 * s[i];
                    tmp[half + i] = x1 * c[i] + x0 * s[i];
                }
                memcpy(v, tmp, sizeof(float) * (size_t)a->dim);
            } else {
                for (int i = 0; i < half; i++) {
                    float x0 = v[i], x1 = v[i + half];
                    v[i] = x0 * c[i] - x1 * s[i];
                    v[i + half] = x1 * c[i] + x0 * s[i];
                }
            }
        }
    }
}

static void cpu_kv_store(struct backend *be, const struct paged_kv *kv, const float *k,
                         const float *v, int n_tokens, const int32_t *slots)
{
    (void)be;
    size_t row = (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
    for (int t = 0; t < n_tokens; t++) {
        memcpy(kv->k + (size_t)slots[t] * row, k + (size_t)t * row, row * sizeof(float));
        memcpy(kv->v + (size_t)slots[t] * row, v + (size_t)t * row, row * sizeof(float));
    }
}

static void cpu_attention(struct backend *be, const float *q, const struct paged_kv *kv,
                          const struct attn_batch *b, int n_heads, float scale, float *out)
{
    (void)be;
    int hd = kv->head_dim;
    int group = n_heads / kv->n_kv_heads;
    size_t kv_row = (size_t)kv->n_kv_heads * (size_t)hd;
    ASSERT(hd <= CPU_MAX_HEAD_DIM);
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
    for (int t = 0; t < b->n_tokens; t++) {
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)hd;
            const int32_t *blocks = b->block_table + (size_t)b->seq[t] * (size_t)b->max_blocks;
            int g = h / group;
            float acc[CPU_MAX_HEAD_DIM];
            memset(acc, 0, sizeof(float) * (size_t)hd);
            float mx = -INFINITY, sum = 0.0f;
            for (int j = 0; j <= b->pos[t]; j++) {
                size_t slot = (size_t)blocks[j / kv->block_size] * (size_t)kv->block_size +
                              (size_t)(j % kv->block_size);
                const float *kj = kv->k + slot * kv_row + (size_t)g * (size_t)hd;
                const float *vj = kv->v + slot * kv_row + (size_t)g * (size_t)hd;
                float dot = 0.0f;
                for (int d = 0; d < hd; d++)
                    dot += qh[d] * kj[d];
                float z = dot * scale;
                if (z > mx) {
                    float corr = expf(mx - z); /* rescale what was accumulated */
                    sum *= corr;
                    for (int d = 0; d < hd; d++)
                        acc[d] *= corr;
                    mx = z;
                }
                float p = expf(z - mx);
                sum += p;
                for (int d = 0; d < hd; d++)
                    acc[d] += p * vj[d];
            }
            float *o = out + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)hd;
            for (int d = 0; d < hd; d++)
                o[d] = acc[d] / sum;
        }
    }
}

static void cpu_silu_mul(struct backend *be, const float *gate, const float *up, int rows, int dim,
                         float *out)
{
    (void)be;
    size_t n = (size_t)rows * (size_t)dim;
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* Index of the largest score not yet taken; ties go to the lower index. */
static int argmax_untaken(const float *s, const unsigned char *taken, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || s[i] > s[best]))
            best = i;
    return best;
}

static void route_one(const float *logits, const struct route_args *a, int32_t *ids, float *w)
{
    enum { MAX_E = 4096 };
    int n = a->n_experts;
    ASSERT(n <= MAX_E);
    float prob[MAX_E], choice[MAX_E];
    unsigned char taken[MAX_E];
    if (a->score == ROUTE_SOFTMAX) {
        float mx = -INFINITY;
        for (int e = 0; e < n; e++)
            mx = logits[e] > mx ? logits[e] : mx;
        double sum = 0;
        for (int e = 0; e < n; e++) {
            prob[e] = expf(logits[e] - mx);
            sum += prob[e];
        }
        for (int e = 0; e < n; e++)
            prob[e] = (float)(prob[e] / sum);
    } else {
        for (int e = 0; e < n; e++)
            prob[e] = 1.0f / (1.0f + expf(-logits[e]));
    }
    for (int e = 0; e < n; e++)
        choice[e] = prob[e] + (a->correction_bias ? a->correction_bias[e] : 0.0f);
    if (a->n_group > 1) {
        /* Keep the topk_group groups whose two best (biased) scores sum highest. */
        int gsize = n / a->n_group;
        float gscore[MAX_E];
        unsigned char gtaken[MAX_E];
        for (int g = 0; g < a->n_group; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * gsize; e < (g + 1) * gsize; e++) {
                if (choice[e] > b1) {
                    b2 = b1;
                    b1 = choice[e];
                } else if (choice[e] > b2) {
                    b2 = choice[e];
                }
            }
            gscore[g] = b1 + b2;
            gtaken[g] = 0;
        }
        for (int i = 0; i < a->topk_group; i++)
            gtaken[argmax_untaken(gscore, gtaken, a->n_group)] = 1;
        for (int e = 0; e < n; e++)
            if (!gtaken[e / gsize])
                choice[e] = -INFINITY;
    }
    memset(taken, 0, (size_t)n);
    double wsum = 0;
    for (int j = 0; j < a->n_used; j++) {
        int e = argmax_untaken(choice, taken, n);
        taken[e] = 1;
        ids[j] = e;
        w[j] = prob[e];
        wsum += prob[e];
    }
    for (int j = 0; j < a->n_used; j++) {
        if (a->normalize)
            w[j] = (float)(w[j] / (wsum + a->normalize_eps));
        w[j] *= a->scaling;
    }
}

static void cpu_moe_route(struct backend *be, const float *logits, int n_tokens,
                          const struct route_args *a, int32_t *ids, float *weights)
{
    (void)be;
#pragma omp parallel for schedule(static) if (n_tokens > 16)
    for (int t = 0; t < n_tokens; t++)
        route_one(logits + (size_t)t * (size_t)a->n_experts, a, ids + (size_t)t * (size_t)a->n_used,
                  weights + (size_t)t * (size_t)a->n_used);
}

/* Groups (token, slot) pairs by expert, then runs each expert once on its
 * gathered rows: every expert weight is read once per call, however many
 * tokens chose it. Experts are visited in ascending id, as transformers sums. */
static void cpu_moe_experts(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                            const float *weights, const struct moe_args *a, float *work,
                            float *out)
{
    const bool rowwise = cpu_rowwise(be);
    size_t pairs = (size_t)n_tokens * (size_t)a->n_used;
    size_t D = (size_t)a->d_model, I = (size_t)a->d_expert;
    float *xg = work;
    float *yg = xg + pairs * D;
    float *gate = yg + pairs * D;
    float *up = gate + pairs * I;
    int32_t *order = (int32_t *)(up + pairs * I); /* pair indices sorted by expert */
    int32_t *count = order + pairs;               /* reused as a cursor per expert */
    (void)count;
    memset(out, 0, (size_t)n_tokens * D * sizeof(float));
    /* counting sort of pairs by expert id; ids outside [0, n_experts) are skipped (another rank's
     * experts under expert parallelism: moe_mask_ids) */
    size_t n_sorted = 0;
    for (int e = 0; e < a->n_experts; e++)
        for (size_t p = 0; p < pairs; p++)
            if (ids[p] == e)
                order[n_sorted++] = (int32_t)p;
    size_t start = 0;
    while (start < n_sorted) {
        int e = ids[order[start]];
        size_t end = start;
        while (end < n_sorted && ids[order[end]] == e)
            end++;
        int cnt = (int)(end - start);
        for (int i = 0; i < cnt; i++) {
            size_t t = (size_t)order[start + (size_t)i] / (size_t)a->n_used;
            memcpy(xg + (size_t)i * D, x + t * D, D * sizeof(float));
        }
        cpu_gemm_mode(&a->gate[e], xg, cnt, D, gate, I, rowwise);
        cpu_gemm_mode(&a->up[e], xg, cnt, D, up, I, rowwise);
        cpu_silu_mul(be, gate, up, cnt, (int)I, gate);
        cpu_gemm_mode(&a->down[e], gate, cnt, I, yg, D, rowwise);
        for (int i = 0; i < cnt; i++) {
            size_t p = (size_t)order[start + (size_t)i];
            float wgt = weights[p];
            float *o = out + (p / (size_t)a->n_used) * D;
            const float *y = yg + (size_t)i * D;
            for (size_t d = 0; d < D; d++)
                o[d] += wgt * y[d];
        }
        start = end;
    }
}

static void cpu_moe_mask_ids(struct backend *be, int32_t *ids, size_t n, int lo, int hi)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < lo || ids[i] >= hi)
            ids[i] = -1;
}

static void cpu_add(struct backend *be, float *y, const float *x, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

static void cpu_destroy(struct backend *be)
{
    free(be->impl);
    be->impl = NULL;
}

static const struct backend_ops CPU_OPS = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = cpu_synchronize,
    .weight_load = cpu_weight_load,
    .embed = cpu_embed,
    .linear = cpu_linear,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .moe_route = cpu_moe_route,
    .moe_experts = cpu_moe_experts,
    .moe_mask_ids = cpu_moe_mask_ids,
    .add = cpu_add,
    .layernorm = cpu_layernorm,
    .mla_store = cpu_mla_store,
    .mla_absorb_q = cpu_mla_absorb_q,
    .mla_attention = cpu_mla_attention,
    .mla_expand_o = cpu_mla_expand_o,
    .mla_attention_expanded = cpu_mla_attention_expanded, /* the reference; the CPU runs the absorbed form */
    .dsa_select = cpu_dsa_select,
    .logits_edit = cpu_logits_edit,
    .logprobs = cpu_logprobs,
};

enum status backend_cpu_create(struct backend *be, struct err *err)
{
    return backend_cpu_create_opts(be, NULL, err);
}

enum status backend_cpu_create_opts(struct backend *be, const struct backend_cpu_opts *o, struct err *err)
{
    be->ops = &CPU_OPS;
    be->impl = NULL;
    if (o && o->batch_invariant) {
        struct backend_cpu_opts *c = malloc(sizeof *c);
        if (!c)
            return err_set(err, STATUS_NOMEM, "cpu backend: out of memory");
        *c = *o;
        be->impl = c;
    }
    return STATUS_OK;
}
