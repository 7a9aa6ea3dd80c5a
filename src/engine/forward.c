/* forward.c — the model forward over struct model_desc (see forward.h).
 *
 * Written once for every family: the layer description says which attention
 * and FFN to run, the backend ops do the math. Spec: ../shared/spec/models.md
 * section 0.1 (skeleton), A.2/B.2 (GQA attention), A.3/B.3 (MoE).
 */
#include "engine/forward.h"

#include <stdlib.h>
#include <string.h>

#include "model/rope.h"

static size_t ffn_width(const struct model_desc *d)
{
    size_t wdt = (size_t)d->d_ff;
    size_t shared = (size_t)d->d_expert * (size_t)d->n_shared_experts;
    if (shared > wdt)
        wdt = shared;
    if ((size_t)d->d_expert > wdt)
        wdt = (size_t)d->d_expert;
    return wdt;
}

enum status forward_init(struct forward *f, const struct model_desc *d, const struct model_weights *w,
                         struct backend *be, struct kv_cache *kv, int max_tokens, int max_seqs,
                         struct err *err)
{
    memset(f, 0, sizeof *f);
    if (max_tokens < 1 || max_seqs < 1)
        return err_set(err, STATUS_INVALID, "forward: max_tokens and max_seqs must be positive");
    f->d = d;
    f->w = w;
    f->be = be;
    f->kv = kv;
    f->max_tokens = max_tokens;
    f->max_seqs = max_seqs;
    f->max_blocks = kv->n_blocks;
    f->logit_chunk = max_tokens < 64 ? max_tokens : 64;
    size_t T = (size_t)max_tokens, D = (size_t)d->d_model;
    size_t qd = (size_t)d->n_heads * (size_t)d->head_dim;
    size_t kvd = (size_t)d->n_kv_heads * (size_t)d->head_dim;
    size_t E = (size_t)(d->n_experts ? d->n_experts : 1), K = (size_t)(d->n_experts_used ? d->n_experts_used : 1);
    size_t F = ffn_width(d);
    struct {
        void **p;
        size_t bytes;
    } bufs[] = {
        {(void **)&f->h, T * D * 4},
        {(void **)&f->x, T * D * 4},
        {(void **)&f->delta, T * D * 4},
        {(void **)&f->tmp, T * D * 4},
        {(void **)&f->q, T * qd * 4},
        {(void **)&f->k, T * kvd * 4},
        {(void **)&f->v, T * kvd * 4},
        {(void **)&f->attn, T * qd * 4},
        {(void **)&f->gate, T * F * 4},
        {(void **)&f->up, T * F * 4},
        {(void **)&f->router, T * E * 4},
        {(void **)&f->route_w, T * K * 4},
        {(void **)&f->route_ids, T * K * 4},
        {(void **)&f->moe_work,
         backend_moe_workspace_floats(max_tokens, (int)K, d->d_model, d->d_expert ? d->d_expert : 1) * 4},
        {(void **)&f->logits, (size_t)f->logit_chunk * (size_t)d->vocab_size * 4},
        {(void **)&f->x_sel, (size_t)f->logit_chunk * D * 4},
        {(void **)&f->inv_freq, (size_t)(d->rope.dim / 2 + 1) * 4},
        {(void **)&f->d_tokens, T * 4},
        {(void **)&f->d_pos, T * 4},
        {(void **)&f->d_seq, T * 4},
        {(void **)&f->d_slots, T * 4},
        {(void **)&f->d_table, (size_t)max_seqs * (size_t)f->max_blocks * 4},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = be->ops->alloc(be, bufs[i].bytes);
        if (!*bufs[i].p) {
            forward_free(f);
            return err_set(err, STATUS_NOMEM, "forward: cannot allocate %zu bytes of activations on %s",
                           bufs[i].bytes, be->ops->name);
        }
    }
    f->h_slots = malloc(T * sizeof(int32_t));
    f->h_table = malloc((size_t)max_seqs * (size_t)f->max_blocks * sizeof(int32_t));
    if (!f->h_slots || !f->h_table) {
        forward_free(f);
        return err_set(err, STATUS_NOMEM, "forward: out of host memory");
    }
    float inv_freq[4096];
    if (d->rope.dim / 2 > 4096) {
        forward_free(f);
        return err_set(err, STATUS_UNSUPPORTED, "forward: %d rotary dims is more than supported", d->rope.dim);
    }
    rope_inv_freq(&d->rope, inv_freq);
    be->ops->upload(be, f->inv_freq, inv_freq, (size_t)(d->rope.dim / 2) * sizeof(float));
    return STATUS_OK;
}

void forward_free(struct forward *f)
{
    if (f->be) {
        void *bufs[] = {f->h,        f->x,        f->delta,     f->tmp,      f->q,        f->k,
                        f->v,        f->attn,     f->gate,      f->up,       f->router,   f->route_w,
                        f->route_ids, f->moe_work, f->logits,   f->x_sel,    f->inv_freq, f->d_tokens,
                        f->d_pos,    f->d_seq,    f->d_slots,   f->d_table};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i])
                f->be->ops->free(f->be, bufs[i]);
    }
    free(f->h_slots);
    free(f->h_table);
    memset(f, 0, sizeof *f);
}

static enum status forward_check_batch(const struct forward *f, const struct forward_batch *b,
                                       struct err *err)
{
    if (b->n_tokens < 1 || b->n_tokens > f->max_tokens)
        return err_set(err, STATUS_INVALID, "batch of %d tokens: must be 1..%d", b->n_tokens, f->max_tokens);
    if (b->n_seqs < 1 || b->n_seqs > f->max_seqs)
        return err_set(err, STATUS_INVALID, "batch of %d sequences: must be 1..%d", b->n_seqs, f->max_seqs);
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= f->d->vocab_size)
            return err_set(err, STATUS_INVALID, "token id %d at batch row %d is outside the vocabulary [0, %d)",
                           b->tokens[i], i, f->d->vocab_size);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
            return err_set(err, STATUS_INVALID, "batch row %d names sequence %d of %d", i, b->seq[i], b->n_seqs);
        const struct kv_seq *s = b->seqs[b->seq[i]];
        if (b->pos[i] < 0 || b->pos[i] >= s->n_blocks * f->kv->block_size)
            return err_set(err, STATUS_INVALID, "batch row %d: position %d has no reserved KV cache slot", i,
                           b->pos[i]);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return err_set(err, STATUS_INVALID, "logit row %d is outside the batch", b->logit_rows[i]);
    return STATUS_OK;
}

/* Uploads tokens, positions, cache slots and block tables. */
static void forward_upload_batch(struct forward *f, const struct forward_batch *b)
{
    struct backend *be = f->be;
    int bs = f->kv->block_size;
    for (int i = 0; i < b->n_tokens; i++)
        f->h_slots[i] = kv_seq_slot(b->seqs[b->seq[i]], b->pos[i], bs);
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t *row = f->h_table + (size_t)s * (size_t)f->max_blocks;
        memcpy(row, b->seqs[s]->blocks, (size_t)b->seqs[s]->n_blocks * sizeof(int32_t));
    }
    size_t n = (size_t)b->n_tokens * sizeof(int32_t);
    be->ops->upload(be, f->d_tokens, b->tokens, n);
    be->ops->upload(be, f->d_pos, b->pos, n);
    be->ops->upload(be, f->d_seq, b->seq, n);
    be->ops->upload(be, f->d_slots, f->h_slots, n);
    be->ops->upload(be, f->d_table, f->h_table, (size_t)b->n_seqs * (size_t)f->max_blocks * sizeof(int32_t));
}

static void forward_attention_gqa(struct forward *f, int l, int n)
{
    const struct model_desc *d = f->d;
    const struct layer_weights *lw = &f->w->layers[l];
    struct backend *be = f->be;
    be->ops->linear(be, &lw->wq, f->x, n, f->q);
    be->ops->linear(be, &lw->wk, f->x, n, f->k);
    be->ops->linear(be, &lw->wv, f->x, n, f->v);
    if (lw->q_norm) {
        be->ops->rmsnorm(be, f->q, lw->q_norm, n * d->n_heads, d->head_dim, d->norm_eps, f->q);
        be->ops->rmsnorm(be, f->k, lw->k_norm, n * d->n_kv_heads, d->head_dim, d->norm_eps, f->k);
    }
    struct rope_args ra = {.dim = d->rope.dim, .offset = d->rope.offset,
                           .interleaved = d->rope.layout == ROPE_INTERLEAVED,
                           .attention_factor = d->rope.attention_factor, .inv_freq = f->inv_freq};
    be->ops->rope(be, f->q, n, d->n_heads, d->head_dim, &ra, f->d_pos);
    be->ops->rope(be, f->k, n, d->n_kv_heads, d->head_dim, &ra, f->d_pos);
    const struct paged_kv *kv = &f->kv->layers[l];
    be->ops->kv_store(be, kv, f->k, f->v, n, f->d_slots);
    struct attn_batch ab = {.n_tokens = n, .pos = f->d_pos, .seq = f->d_seq, .block_table = f->d_table,
                            .max_blocks = f->max_blocks};
    be->ops->attention(be, f->q, kv, &ab, d->n_heads, d->attn_scale, f->attn);
    be->ops->linear(be, &lw->wo, f->attn, n, f->delta);
}

/* Gated MLP on f->x: out = down(silu(gate x) * up x). */
static void forward_mlp(struct forward *f, const struct layer_weights *lw, int n, float *out)
{
    struct backend *be = f->be;
    int width = (int)lw->ffn_gate.rows;
    be->ops->linear(be, &lw->ffn_gate, f->x, n, f->gate);
    be->ops->linear(be, &lw->ffn_up, f->x, n, f->up);
    be->ops->silu_mul(be, f->gate, f->up, n, width, f->gate);
    be->ops->linear(be, &lw->ffn_down, f->gate, n, out);
}

static void forward_ffn(struct forward *f, int l, int n)
{
    const struct model_desc *d = f->d;
    const struct layer_weights *lw = &f->w->layers[l];
    struct backend *be = f->be;
    if (d->layers[l].ffn == FFN_DENSE) {
        forward_mlp(f, lw, n, f->delta);
        return;
    }
    be->ops->linear(be, &lw->router, f->x, n, f->router);
    struct route_args ra = {
        .n_experts = d->n_experts,
        .n_used = d->n_experts_used,
        .score = d->router == ROUTER_SOFTMAX ? ROUTE_SOFTMAX : ROUTE_SIGMOID,
        .correction_bias = lw->correction_bias,
        .n_group = d->n_group,
        .topk_group = d->topk_group,
        .normalize = d->norm_topk_prob,
        .normalize_eps = d->norm_topk_eps,
        .scaling = d->routed_scaling,
    };
    be->ops->moe_route(be, f->router, n, &ra, f->route_ids, f->route_w);
    struct moe_args ma = {.n_experts = d->n_experts, .n_used = d->n_experts_used, .d_model = d->d_model,
                          .d_expert = d->d_expert, .gate = lw->exp_gate, .up = lw->exp_up,
                          .down = lw->exp_down};
    be->ops->moe_experts(be, f->x, n, f->route_ids, f->route_w, &ma, f->moe_work, f->delta);
    if (lw->has_ffn) {
        forward_mlp(f, lw, n, f->tmp);
        be->ops->add(be, f->delta, f->tmp, (size_t)n * (size_t)d->d_model);
    }
}

/* Final norm on the wanted rows of the residual stream h, then lm_head. */
static void forward_logits(struct forward *f, const struct forward_batch *b, const float *h,
                           float *logits_out)
{
    struct backend *be = f->be;
    size_t D = (size_t)f->d->d_model, V = (size_t)f->d->vocab_size;
    for (int c0 = 0; c0 < b->n_logits; c0 += f->logit_chunk) {
        int cn = b->n_logits - c0 < f->logit_chunk ? b->n_logits - c0 : f->logit_chunk;
        /* gather the wanted rows (device-to-device through the backend) */
        for (int i = 0; i < cn; i++) {
            const float *src = h + (size_t)b->logit_rows[c0 + i] * D;
            float *dst = f->x_sel + (size_t)i * D;
            be->ops->rmsnorm(be, src, f->w->final_norm, 1, (int)D, f->d->norm_eps, dst);
        }
        be->ops->linear(be, &f->w->lm_head, f->x_sel, cn, f->logits);
        be->ops->download(be, logits_out + (size_t)c0 * V, f->logits, (size_t)cn * V * sizeof(float));
    }
}

enum status forward_run(struct forward *f, const struct forward_batch *b, float *logits_out,
                        struct err *err)
{
    enum status st = forward_check_batch(f, b, err);
    if (st)
        return st;
    const struct model_desc *d = f->d;
    struct backend *be = f->be;
    int n = b->n_tokens;
    forward_upload_batch(f, b);
    be->ops->embed(be, &f->w->embed, f->d_tokens, n, f->h);
    for (int l = 0; l < d->n_layers; l++) {
        const struct layer_weights *lw = &f->w->layers[l];
        if (l == 0)
            be->ops->rmsnorm(be, f->h, lw->attn_norm, n, d->d_model, d->norm_eps, f->x);
        else
            be->ops->add_rmsnorm(be, f->h, f->delta, lw->attn_norm, n, d->d_model, d->norm_eps, f->x);
        if (d->layers[l].attn != ATTN_GQA)
            return err_set(err, STATUS_UNSUPPORTED, "layer %d: MLA attention is not implemented yet", l);
        forward_attention_gqa(f, l, n);
        be->ops->add_rmsnorm(be, f->h, f->delta, lw->ffn_norm, n, d->d_model, d->norm_eps, f->x);
        forward_ffn(f, l, n);
    }
    /* final residual add; the final norm is applied per selected row in forward_logits */
    be->ops->add(be, f->h, f->delta, (size_t)n * (size_t)d->d_model);
    forward_logits(f, b, f->h, logits_out);
    be->ops->synchronize(be);
    return STATUS_OK;
}
