/* cpu_mla.c — the CPU reference of the MLA and DSA ops (see cpu_mla.h).
 *
 * MLA runs in its absorbed form here too, the same algorithm the GPU runs:
 * the query's no-rope part is mapped into latent space (W_uk_h^T q), scores
 * are taken against the cached latent row [c_kv | k_r] of each key, the
 * softmax-weighted sum of the c_kv rows is taken, and W_uv_h maps it back to
 * the head's values. This equals transformers' expanded K/V (spec C.3) up to
 * rounding, and it needs nothing per key but the latent row: the cache never
 * holds expanded keys or values.
 *
 * kv_b_proj is read row by row through weight_dequant_row (any format),
 * once per call per row, never kept dequantised. Sums run in a fixed order
 * (ascending index) so that the CUDA kernels, which use the same order, stay
 * within a few ulps of this reference.
 *
 * The DSA selection keeps a bounded heap of the best (score, position) pairs
 * per query while it walks the keys in ascending position; an equal score
 * never displaces an earlier key, so ties go to the lower position. The
 * result is written in ascending position order.
 */
#include "backend/cpu/cpu_mla.h"

#include "base/dtype.h"
#include "format/quant_codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CPU_MLA_MAX_DIM 8192 /* latent + rope dims, head dims: stack rows */
/* Below this many multiply-adds an op runs on one thread: waking the team costs more (and
 * on a loaded machine far more) than tiny models' whole layers. */
#define CPU_MLA_PAR_MIN ((double)(1 << 18))

/* The largest pos + 1 of the batch (host memory on this backend). */
static int batch_max_keys(const struct attn_batch *b)
{
    int m = 0;
    for (int t = 0; t < b->n_tokens; t++)
        m = b->pos[t] + 1 > m ? b->pos[t] + 1 : m;
    return m;
}

static size_t slot_of(const struct attn_batch *b, int t, int j, int block_size)
{
    const int32_t *blocks = b->block_table + (size_t)b->seq[t] * (size_t)b->max_blocks;
    return (size_t)blocks[j / block_size] * (size_t)block_size + (size_t)(j % block_size);
}

void cpu_layernorm(struct backend *be, const float *x, const float *w, const float *b, int rows, int dim,
                   float eps, float *y)
{
    (void)be;
#pragma omp parallel for schedule(static) if ((double)rows * dim > CPU_MLA_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)dim;
        float *yr = y + (size_t)r * (size_t)dim;
        double sum = 0, ss = 0;
        for (int j = 0; j < dim; j++)
            sum += xr[j];
        float mean = (float)(sum / dim);
        for (int j = 0; j < dim; j++) {
            double c = (double)xr[j] - (double)mean;
            ss += c * c;
        }
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int j = 0; j < dim; j++)
            yr[j] = w[j] * ((xr[j] - mean) * inv) + b[j];
    }
}

const float *cpu_mla_get_row(const void *base, enum kv_dtype t, size_t slot, int nq, int nr, float *buf)
{
    const int n = nq + nr;
    if (t == KV_DTYPE_F32)
        return (const float *)base + slot * (size_t)n;
    if (t == KV_DTYPE_BF16) {
        const uint16_t *r = (const uint16_t *)base + slot * (size_t)n;
        for (int i = 0; i < n; i++)
            buf[i] = bf16_to_f32(r[i]);
        return buf;
    }
    const uint8_t *r = (const uint8_t *)base + slot * kv_latent_row_bytes(t, nq, nr);
    const int nb = (nq + KV_FP8_BLOCK - 1) / KV_FP8_BLOCK;
    for (int b = 0; b < nb; b++) {
        float s;
        memcpy(&s, r + nq + 4 * (size_t)b, 4);
        for (int i = b * KV_FP8_BLOCK; i < nq && i < (b + 1) * KV_FP8_BLOCK; i++)
            buf[i] = e4m3_to_f32(r[i]) * s;
    }
    for (int i = 0; i < nr; i++) {
        uint16_t h;
        memcpy(&h, r + nq + 4 * (size_t)nb + 2 * (size_t)i, 2);
        buf[nq + i] = bf16_to_f32(h);
    }
    return buf;
}

/* Stores the f32 row v (nq values, then nr rope values) as row `slot` of type t: bf16 rounds to
 * nearest even, fp8 takes a scale amax / 448 per 128 values (1 for an all-zero block) and rounds
 * v / scale to e4m3 (nearest even, saturating), as CUDA's store does. */
void cpu_mla_put_row(void *base, enum kv_dtype t, size_t slot, int nq, int nr, const float *v)
{
    const int n = nq + nr;
    if (t == KV_DTYPE_F32) {
        memcpy((float *)base + slot * (size_t)n, v, (size_t)n * sizeof(float));
        return;
    }
    if (t == KV_DTYPE_BF16) {
        uint16_t *r = (uint16_t *)base + slot * (size_t)n;
        for (int i = 0; i < n; i++)
            r[i] = f32_to_bf16(v[i]);
        return;
    }
    uint8_t *r = (uint8_t *)base + slot * kv_latent_row_bytes(t, nq, nr);
    const int nb = (nq + KV_FP8_BLOCK - 1) / KV_FP8_BLOCK;
    for (int b = 0; b < nb; b++) {
        const int i0 = b * KV_FP8_BLOCK, i1 = i0 + KV_FP8_BLOCK < nq ? i0 + KV_FP8_BLOCK : nq;
        float amax = 0.0f;
        for (int i = i0; i < i1; i++)
            amax = fmaxf(amax, fabsf(v[i]));
        const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
        memcpy(r + nq + 4 * (size_t)b, &s, 4);
        for (int i = i0; i < i1; i++)
            r[i] = f32_to_e4m3(v[i] / s);
    }
    for (int i = 0; i < nr; i++) {
        uint16_t h = f32_to_bf16(v[nq + i]);
        memcpy(r + nq + 4 * (size_t)nb + 2 * (size_t)i, &h, 2);
    }
}

void cpu_mla_store(struct backend *be, const struct paged_latent *kv, const float *ckv, const float *w, float eps,
                   const float *idx_k, int n_tokens, const int32_t *slots)
{
    (void)be;
    int R = kv->kv_rank, row = kv->kv_rank + kv->rope_dim;
    ASSERT(row <= CPU_MLA_MAX_DIM && kv->index_dim <= CPU_MLA_MAX_DIM);
    for (int t = 0; t < n_tokens; t++) {
        const float *src = ckv + (size_t)t * (size_t)row;
        float dst[CPU_MLA_MAX_DIM];
        double ss = 0;
        for (int c = 0; c < R; c++)
            ss += (double)src[c] * (double)src[c];
        float inv = 1.0f / sqrtf((float)(ss / R) + eps);
        for (int c = 0; c < R; c++)
            dst[c] = w[c] * (src[c] * inv);
        memcpy(dst + R, src + R, (size_t)kv->rope_dim * sizeof(float));
        cpu_mla_put_row(kv->latent, kv->dtype, (size_t)slots[t], R, kv->rope_dim, dst);
        if (idx_k && kv->index_k)
            cpu_mla_put_row(kv->index_k, kv->index_dtype, (size_t)slots[t], kv->index_dim, 0,
                      idx_k + (size_t)t * (size_t)kv->index_dim);
    }
}

void cpu_mla_absorb_q(struct backend *be, const struct weight *kv_b, const struct mla_dims *m, const float *q,
                      int n_tokens, float *q_abs)
{
    (void)be;
    int H = m->n_heads, R = m->kv_rank, qd = m->nope + m->rope, ad = m->kv_rank + m->rope;
    int64_t head_rows = (int64_t)m->nope + m->v;
    ASSERT(R <= CPU_MLA_MAX_DIM && kv_b->cols == R && kv_b->rows == head_rows * H);
    double work = (double)H * m->nope * R * (n_tokens + 1);
#pragma omp parallel for schedule(dynamic, 1) if (work > CPU_MLA_PAR_MIN)
    for (int h = 0; h < H; h++) {
        float row[CPU_MLA_MAX_DIM];
        for (int t = 0; t < n_tokens; t++) {
            float *o = q_abs + ((size_t)t * (size_t)H + (size_t)h) * (size_t)ad;
            memset(o, 0, (size_t)R * sizeof(float));
            memcpy(o + R, q + ((size_t)t * (size_t)H + (size_t)h) * (size_t)qd + m->nope,
                   (size_t)m->rope * sizeof(float));
        }
        for (int i = 0; i < m->nope; i++) {
            weight_dequant_row(kv_b, (int64_t)h * head_rows + i, row);
            for (int t = 0; t < n_tokens; t++) {
                float qi = q[((size_t)t * (size_t)H + (size_t)h) * (size_t)qd + (size_t)i];
                float *o = q_abs + ((size_t)t * (size_t)H + (size_t)h) * (size_t)ad;
                for (int c = 0; c < R; c++)
                    o[c] = fmaf(qi, row[c], o[c]);
            }
        }
    }
}

void cpu_mla_attention(struct backend *be, const float *q_abs, const struct paged_latent *kv,
                       const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k, float scale,
                       float *o_lat)
{
    (void)be;
    int R = kv->kv_rank, Dk = kv->kv_rank + kv->rope_dim;
    ASSERT(Dk <= CPU_MLA_MAX_DIM);
    int keys = sel ? sel_k : batch_max_keys(b);
    double work = (double)b->n_tokens * n_heads * (Dk + R) * keys;
#pragma omp parallel for collapse(2) schedule(dynamic, 4) if (work > CPU_MLA_PAR_MIN)
    for (int t = 0; t < b->n_tokens; t++) {
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q_abs + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)Dk;
            float acc[CPU_MLA_MAX_DIM];
            memset(acc, 0, (size_t)R * sizeof(float));
            float mx = -INFINITY, sum = 0.0f;
            int n_keys = sel ? sel_k : b->pos[t] + 1;
            for (int i = 0; i < n_keys; i++) {
                int j = sel ? sel[(size_t)t * (size_t)sel_k + (size_t)i] : i;
                if (j < 0)
                    break; /* -1 padding ends a selection */
                float kbuf[CPU_MLA_MAX_DIM];
                const float *kj = cpu_mla_get_row(kv->latent, kv->dtype, slot_of(b, t, j, kv->block_size), R, kv->rope_dim, kbuf);
                float dot = 0.0f;
                for (int d = 0; d < Dk; d++)
                    dot = fmaf(qh[d], kj[d], dot);
                float z = dot * scale;
                if (z > mx) {
                    float corr = expf(mx - z); /* rescale what was accumulated */
                    sum *= corr;
                    for (int d = 0; d < R; d++)
                        acc[d] *= corr;
                    mx = z;
                }
                float p = expf(z - mx);
                sum += p;
                for (int d = 0; d < R; d++)
                    acc[d] = fmaf(p, kj[d], acc[d]); /* values are the c_kv part of the row */
            }
            float *o = o_lat + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)R;
            for (int d = 0; d < R; d++)
                o[d] = acc[d] / sum;
        }
    }
}

void cpu_mla_expand_o(struct backend *be, const struct weight *kv_b, const struct mla_dims *m, const float *o_lat,
                      int n_tokens, float *out)
{
    (void)be;
    int H = m->n_heads, R = m->kv_rank, V = m->v;
    int64_t head_rows = (int64_t)m->nope + m->v;
    ASSERT(R <= CPU_MLA_MAX_DIM && kv_b->cols == R && kv_b->rows == head_rows * H);
    double work = (double)H * V * R * (n_tokens + 1);
#pragma omp parallel for collapse(2) schedule(dynamic, 4) if (work > CPU_MLA_PAR_MIN)
    for (int h = 0; h < H; h++) {
        for (int j = 0; j < V; j++) {
            float row[CPU_MLA_MAX_DIM];
            weight_dequant_row(kv_b, (int64_t)h * head_rows + m->nope + j, row);
            for (int t = 0; t < n_tokens; t++) {
                const float *x = o_lat + ((size_t)t * (size_t)H + (size_t)h) * (size_t)R;
                float s = 0.0f;
                for (int c = 0; c < R; c++)
                    s = fmaf(row[c], x[c], s);
                out[(size_t)t * (size_t)H * (size_t)V + (size_t)h * (size_t)V + (size_t)j] = s;
            }
        }
    }
}

void cpu_mla_attention_expanded(struct backend *be, const float *q, const struct weight *kv_b,
                                const struct mla_dims *m, const struct paged_latent *kv, const struct attn_batch *b,
                                int n_seqs, const int32_t *seq_keys, float scale, float *out)
{
    const int H = m->n_heads, R = m->kv_rank, nope = m->nope, rope = m->rope, V = m->v;
    const size_t head_rows = (size_t)nope + (size_t)V, dq = (size_t)nope + (size_t)rope;
    ASSERT(R + rope <= CPU_MLA_MAX_DIM && kv->kv_rank == R && kv->rope_dim == rope &&
           kv_b->rows == (int64_t)head_rows * H);
    for (int s = 0; s < n_seqs; s++) {
        const int nk = seq_keys[s];
        if (nk <= 0)
            continue;
        /* this row's keys: the latent c_kv through kv_b gives [k_nope_h | v_h] per head */
        float *lat = malloc((size_t)nk * (size_t)R * sizeof(float));
        float *kr = malloc((size_t)nk * (size_t)rope * sizeof(float));
        float *e = malloc((size_t)nk * head_rows * (size_t)H * sizeof(float));
        ASSERT(lat && kr && e);
        const int32_t *blocks = b->block_table + (size_t)s * (size_t)b->max_blocks;
        for (int j = 0; j < nk; j++) {
            float buf[CPU_MLA_MAX_DIM];
            size_t slot = (size_t)blocks[j / kv->block_size] * (size_t)kv->block_size + (size_t)(j % kv->block_size);
            const float *row = cpu_mla_get_row(kv->latent, kv->dtype, slot, R, rope, buf);
            memcpy(lat + (size_t)j * R, row, (size_t)R * sizeof(float));
            memcpy(kr + (size_t)j * rope, row + R, (size_t)rope * sizeof(float));
        }
        be->ops->linear(be, kv_b, lat, nk, e);
        double work = (double)b->n_tokens * H * (double)(dq + V) * nk;
#pragma omp parallel for collapse(2) schedule(dynamic, 4) if (work > CPU_MLA_PAR_MIN)
        for (int t = 0; t < b->n_tokens; t++) {
            for (int h = 0; h < H; h++) {
                if (b->seq[t] != s)
                    continue;
                const float *qh = q + ((size_t)t * (size_t)H + (size_t)h) * dq;
                float acc[CPU_MLA_MAX_DIM];
                memset(acc, 0, (size_t)V * sizeof(float));
                float mx = -INFINITY, sum = 0.0f;
                for (int j = 0; j <= b->pos[t] && j < nk; j++) {
                    const float *kn = e + ((size_t)j * (size_t)H + (size_t)h) * head_rows, *vj = kn + nope;
                    float dot = 0.0f;
                    for (int d = 0; d < nope; d++)
                        dot = fmaf(qh[d], kn[d], dot);
                    for (int d = 0; d < rope; d++)
                        dot = fmaf(qh[nope + d], kr[(size_t)j * rope + d], dot);
                    float z = dot * scale;
                    if (z > mx) {
                        float corr = expf(mx - z);
                        sum *= corr;
                        for (int d = 0; d < V; d++)
                            acc[d] *= corr;
                        mx = z;
                    }
                    float p = expf(z - mx);
                    sum += p;
                    for (int d = 0; d < V; d++)
                        acc[d] = fmaf(p, vj[d], acc[d]);
                }
                float *o = out + (size_t)t * (size_t)H * (size_t)V + (size_t)h * (size_t)V;
                for (int d = 0; d < V; d++)
                    o[d] = acc[d] / sum;
            }
        }
        free(lat), free(kr), free(e);
    }
}

/* Heap order: the root is the worst kept candidate (lowest score; among equal
 * scores the highest position). */
static int cand_worse(float sa, int32_t pa, float sb, int32_t pb)
{
    return sa < sb || (sa == sb && pa > pb);
}

static void heap_sift_down(float *hs, int32_t *hp, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_worse(hs[l], hp[l], hs[w], hp[w]))
            w = l;
        if (r < n && cand_worse(hs[r], hp[r], hs[w], hp[w]))
            w = r;
        if (w == i)
            return;
        float ts = hs[i];
        int32_t tp = hp[i];
        hs[i] = hs[w], hp[i] = hp[w];
        hs[w] = ts, hp[w] = tp;
        i = w;
    }
}

static void heap_sift_up(float *hs, int32_t *hp, int i)
{
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_worse(hs[i], hp[i], hs[p], hp[p]))
            return;
        float ts = hs[i];
        int32_t tp = hp[i];
        hs[i] = hs[p], hp[i] = hp[p];
        hs[p] = ts, hp[p] = tp;
        i = p;
    }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* I(t, j) of spec C.4, in the order transformers sums it. */
static float dsa_score(const float *q, const float *w, const float *k, const struct dsa_args *a)
{
    float s = 0.0f;
    for (int h = 0; h < a->n_heads; h++) {
        const float *qh = q + (size_t)h * (size_t)a->head_dim;
        float dot = 0.0f;
        for (int d = 0; d < a->head_dim; d++)
            dot = fmaf(qh[d], k[d], dot);
        float r = dot * a->score_scale;
        r = r > 0.0f ? r : 0.0f;
        s = fmaf(w[h] * a->head_scale, r, s);
    }
    return s;
}

void cpu_dsa_select(struct backend *be, const float *q_idx, const float *w_idx, const struct paged_latent *kv,
                    const struct attn_batch *b, const struct dsa_args *a, float *work, int32_t *sel)
{
    (void)be;
    int K = a->topk, keys = batch_max_keys(b);
    double cost = keys > K ? (double)b->n_tokens * keys * a->n_heads * a->head_dim : 0;
#pragma omp parallel for schedule(dynamic, 1) if (cost > CPU_MLA_PAR_MIN)
    for (int t = 0; t < b->n_tokens; t++) {
        int32_t *out = sel + (size_t)t * (size_t)K;
        int n_keys = b->pos[t] + 1;
        if (n_keys <= K) {
            /* every causal key is kept: no scores needed */
            for (int i = 0; i < K; i++)
                out[i] = i < n_keys ? i : -1;
            continue;
        }
        float *hs = work + (size_t)t * (size_t)K * 2;
        int32_t *hp = (int32_t *)(hs + K);
        const float *q = q_idx + (size_t)t * (size_t)a->n_heads * (size_t)a->head_dim;
        const float *w = w_idx + (size_t)t * (size_t)a->n_heads;
        int n = 0;
        for (int j = 0; j < n_keys; j++) {
            float kbuf[CPU_MLA_MAX_DIM];
            const float *k = cpu_mla_get_row(kv->index_k, kv->index_dtype, slot_of(b, t, j, kv->block_size), kv->index_dim, 0, kbuf);
            float s = dsa_score(q, w, k, a);
            if (n < K) {
                hs[n] = s, hp[n] = j;
                heap_sift_up(hs, hp, n++);
            } else if (s > hs[0]) { /* keys come in ascending order: an equal score loses */
                hs[0] = s, hp[0] = j;
                heap_sift_down(hs, hp, n, 0);
            }
        }
        memcpy(out, hp, (size_t)K * sizeof(int32_t));
        qsort(out, (size_t)K, sizeof(int32_t), cmp_i32);
    }
}
