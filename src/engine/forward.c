/* forward.c — the model forward over struct model_desc (see forward.h).
 *
 * Written once for every family: the layer description says which attention
 * and FFN to run, the backend ops do the math. Spec: ../shared/spec/models.md
 * section 0.1 (skeleton), A.2/B.2 (GQA attention), A.3/B.3 (MoE).
 */
#include "engine/forward.h"

#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "engine/forward_dp.h"
#include "engine/forward_mla.h"
#include "engine/ranks.h"
#include "model/rope.h"
#include "plan/plan.h"

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

/* int32s of batch metadata: tokens, positions, sequence rows, cache slots (T each), block tables. */
static size_t forward_meta_ints(const struct forward *f)
{
    return 4 * (size_t)f->max_tokens + (size_t)f->max_seqs * (size_t)f->max_blocks;
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
    struct options opt;
    enum status ost = options_read(&opt, err);
    if (ost)
        return ost;
    f->use_graphs = !opt.no_graphs;
    /* with graphs, a decode step of every sequence is one lm_head call (one graph) */
    const bool graphs = f->use_graphs && be->ops->graph_replay;
    int rows = graphs ? (max_seqs < FORWARD_MAX_GRAPH_ROWS ? max_seqs : FORWARD_MAX_GRAPH_ROWS) : 0;
    rows = rows > 64 ? rows : 64;
    f->logit_chunk = max_tokens < rows ? max_tokens : rows;
    f->sample_rows = max_seqs > f->logit_chunk ? max_seqs : f->logit_chunk;
    f->graph_rows = max_seqs < f->logit_chunk ? max_seqs : f->logit_chunk;
    f->pad_decode = graphs;
    f->edit_cap = be->ops->logits_edit ? f->sample_rows * FORWARD_EDITS_PER_ROW : 0;
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
        {(void **)&f->logits_part, w->lm_head.rows < d->vocab_size ? (size_t)f->logit_chunk * (size_t)w->lm_head.rows * 4 : 0},
        {(void **)&f->x_sel, (size_t)f->logit_chunk * D * 4},
        {(void **)&f->inv_freq, (size_t)(d->rope.dim / 2 + 1) * 4},
        {(void **)&f->d_meta, forward_meta_ints(f) * 4},
        {(void **)&f->d_argmax, (size_t)f->logit_chunk * 4},
        {(void **)&f->d_sample, (size_t)f->sample_rows * sizeof(struct sample_row)},
        {(void **)&f->d_edit_start, f->edit_cap ? ((size_t)f->sample_rows + 1) * 4 : 0},
        {(void **)&f->d_edits, (size_t)f->edit_cap * sizeof(struct logit_edit)},
        {(void **)&f->d_lp, be->ops->logprobs ? (size_t)f->logit_chunk * 4 : 0},
        {(void **)&f->d_top_ids, be->ops->logprobs ? (size_t)f->logit_chunk * FORWARD_MAX_TOP_LOGPROBS * 4 : 0},
        {(void **)&f->d_top_lp, be->ops->logprobs ? (size_t)f->logit_chunk * FORWARD_MAX_TOP_LOGPROBS * 4 : 0},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (!bufs[i].bytes) /* a buffer this model does not need */
            continue;
        *bufs[i].p = be->ops->alloc(be, bufs[i].bytes);
        if (!*bufs[i].p) {
            forward_free(f);
            return err_set(err, STATUS_NOMEM, "forward: cannot allocate %zu bytes of activations on %s",
                           bufs[i].bytes, be->ops->name);
        }
    }
    /* the five metadata arrays live in one device buffer, filled by one upload per pass */
    f->d_tokens = f->d_meta;
    f->d_pos = f->d_tokens + T;
    f->d_seq = f->d_pos + T;
    f->d_slots = f->d_seq + T;
    f->d_table = f->d_slots + T;
    f->h_meta = malloc(forward_meta_ints(f) * sizeof(int32_t));
    f->graph_seen = calloc(FORWARD_MAX_GRAPH_KEYS, sizeof *f->graph_seen);
    f->h_rows = malloc((size_t)f->logit_chunk * sizeof *f->h_rows);
    f->h_sample = malloc((size_t)f->logit_chunk * sizeof *f->h_sample);
    f->h_edit_start = malloc(((size_t)f->sample_rows + 1) * sizeof *f->h_edit_start);
    if (!f->h_meta || !f->graph_seen || !f->h_rows || !f->h_sample || !f->h_edit_start) {
        forward_free(f);
        return err_set(err, STATUS_NOMEM, "forward: out of host memory");
    }
    for (int i = 0; i < f->logit_chunk; i++) {
        f->h_rows[i] = i;
        f->h_sample[i] = (struct sample_row){.top_p = 1.0f}; /* greedy: a padding row's draw */
    }
    float inv_freq[4096];
    if (d->rope.dim / 2 > 4096) {
        forward_free(f);
        return err_set(err, STATUS_UNSUPPORTED, "forward: %d rotary dims is more than supported", d->rope.dim);
    }
    rope_inv_freq(&d->rope, inv_freq);
    be->ops->upload(be, f->inv_freq, inv_freq, (size_t)(d->rope.dim / 2) * sizeof(float));
    enum status st = forward_mla_init(f, err);
    if (st)
        forward_free(f);
    return st;
}

void forward_free(struct forward *f)
{
    forward_dp_free(f);
    forward_mla_free(f);
    if (f->be) {
        void *bufs[] = {f->h,        f->x,        f->delta,     f->tmp,      f->q,        f->k,
                        f->v,        f->attn,     f->gate,      f->up,       f->router,   f->route_w,
                        f->route_ids, f->moe_work, f->logits,   f->x_sel,    f->inv_freq, f->d_meta,
                        f->d_argmax, f->d_sample, f->logits_part, f->d_masks, f->d_edit_start, f->d_edits,
                        f->d_lp,     f->d_top_ids, f->d_top_lp};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i])
                f->be->ops->free(f->be, bufs[i]);
    }
    free(f->h_meta);
    free(f->h_logits);
    free(f->rank_buf);
    free(f->graph_seen);
    free(f->h_rows);
    free(f->h_sample);
    free(f->h_masks);
    free(f->h_edit_start);
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
    if (b->sample && (!b->tokens_out || !f->be->ops->sample))
        return err_set(err, STATUS_UNSUPPORTED, "forward: backend %s cannot sample on its own",
                       f->be->ops->name);
    if (b->sample && b->n_logits > f->sample_rows)
        return err_set(err, STATUS_INVALID, "forward: %d sampled rows in one pass (at most %d)", b->n_logits,
                       f->sample_rows);
    if (b->edit_start && (!b->sample || b->edit_start[0] != 0 || b->edit_start[b->n_logits] > f->edit_cap))
        return err_set(err, STATUS_INVALID, "forward: %d logit edits in one pass (at most %d, with sampling)",
                       b->edit_start[b->n_logits], f->edit_cap);
    if (b->masks && !b->sample)
        return err_set(err, STATUS_INVALID, "forward: grammar masks need the backend's sampling");
    if (b->lp_out && (!b->sample || !f->be->ops->logprobs || b->logprob_k < 0 ||
                      b->logprob_k > FORWARD_MAX_TOP_LOGPROBS || (b->logprob_k > 0 && (!b->top_ids_out || !b->top_lp_out))))
        return err_set(err, STATUS_INVALID, "forward: log-probabilities beside the logits need the backend's sampling "
                       "and 0 .. %d likeliest (asked %d)", FORWARD_MAX_TOP_LOGPROBS, b->logprob_k);
    return STATUS_OK;
}

/* Uploads tokens, positions, sequence rows, cache slots and block tables: one copy, laid out as
 * d_meta is (a synchronous upload per array cost more than the decode step's kernels). A decode
 * batch padded to `rows` (> n_tokens; one row a sequence) gets, per extra row, token 0 at position
 * 0 of a sequence of its own whose one block is the pad block: what it writes lands there. */
static void forward_upload_batch(struct forward *f, const struct forward_batch *b, int rows)
{
    struct backend *be = f->be;
    int bs = f->kv->block_size, n = b->n_tokens;
    size_t T = (size_t)f->max_tokens;
    int32_t *tok = f->h_meta, *pos = tok + T, *seq = pos + T, *slots = seq + T, *table = slots + T;
    memcpy(tok, b->tokens, (size_t)n * sizeof(int32_t));
    memcpy(pos, b->pos, (size_t)n * sizeof(int32_t));
    memcpy(seq, b->seq, (size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        slots[i] = kv_seq_slot(b->seqs[b->seq[i]], b->pos[i], bs);
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t *row = table + (size_t)s * (size_t)f->max_blocks;
        memcpy(row, b->seqs[s]->blocks, (size_t)b->seqs[s]->n_blocks * sizeof(int32_t));
    }
    int n_seqs = b->n_seqs;
    for (int i = n; i < rows; i++, n_seqs++) {
        tok[i] = 0;
        pos[i] = 0;
        seq[i] = n_seqs;
        slots[i] = f->kv->pad_block * bs;
        table[(size_t)n_seqs * (size_t)f->max_blocks] = f->kv->pad_block;
    }
    size_t used = 4 * T + (size_t)n_seqs * (size_t)f->max_blocks;
    be->ops->upload(be, f->d_meta, f->h_meta, used * sizeof(int32_t));
}

static void forward_attention_gqa(struct forward *f, int l, int n)
{
    const struct model_desc *d = f->d;
    const struct layer_weights *lw = &f->w->layers[l];
    struct backend *be = f->be;
    struct rope_args ra = {.dim = d->rope.dim, .offset = d->rope.offset,
                           .interleaved = d->rope.layout == ROPE_INTERLEAVED,
                           .attention_factor = d->rope.attention_factor, .inv_freq = f->inv_freq};
    const struct paged_kv *kv = &f->kv->layers[l];
    struct attn_batch ab = {.n_tokens = n, .pos = f->d_pos, .seq = f->d_seq, .block_table = f->d_table,
                            .max_blocks = f->max_blocks};
    if (be->ops->linear_multi) {
        const struct weight *ws[3] = {&lw->wq, &lw->wk, &lw->wv};
        float *ys[3] = {f->q, f->k, f->v};
        be->ops->linear_multi(be, 3, ws, f->x, n, ys);
    } else {
        be->ops->linear(be, &lw->wq, f->x, n, f->q);
        be->ops->linear(be, &lw->wk, f->x, n, f->k);
        be->ops->linear(be, &lw->wv, f->x, n, f->v);
    }
    if (be->ops->attn_prep) {
        be->ops->attn_prep(be, f->q, f->k, f->v, n, d->n_heads, lw->q_norm, lw->k_norm, d->norm_eps, &ra, f->d_pos,
                           kv, f->d_slots);
        be->ops->attention(be, f->q, kv, &ab, d->n_heads, d->attn_scale, f->attn);
        be->ops->linear(be, &lw->wo, f->attn, n, f->delta);
        return;
    }
    if (lw->q_norm) {
        be->ops->rmsnorm(be, f->q, lw->q_norm, n * d->n_heads, d->head_dim, d->norm_eps, f->q);
        be->ops->rmsnorm(be, f->k, lw->k_norm, n * d->n_kv_heads, d->head_dim, d->norm_eps, f->k);
    }
    be->ops->rope(be, f->q, n, d->n_heads, d->head_dim, &ra, f->d_pos);
    be->ops->rope(be, f->k, n, d->n_kv_heads, d->head_dim, &ra, f->d_pos);
    be->ops->kv_store(be, kv, f->k, f->v, n, f->d_slots);
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

/* The routing and expert arguments of layer l's MoE. */
static void forward_moe_args(const struct forward *f, int l, struct route_args *ra, struct moe_args *ma)
{
    const struct model_desc *d = f->d;
    const struct layer_weights *lw = &f->w->layers[l];
    *ra = (struct route_args){
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
    *ma = (struct moe_args){.n_experts = d->n_experts, .n_used = d->n_experts_used, .d_model = d->d_model,
                            .d_expert = d->d_expert, .gate = lw->exp_gate, .up = lw->exp_up,
                            .down = lw->exp_down};
}

/* The FFN half of layer l on x. routed: a MoE layer whose routing is done already (ids and
 * weights in f->route_ids / f->route_w, see forward_ffn_norm_routed). */
static void forward_ffn(struct forward *f, int l, int n, bool routed)
{
    const struct model_desc *d = f->d;
    const struct layer_weights *lw = &f->w->layers[l];
    struct backend *be = f->be;
    if (d->layers[l].ffn == FFN_DENSE) {
        forward_mlp(f, lw, n, f->delta);
        return;
    }
    struct route_args ra;
    struct moe_args ma;
    forward_moe_args(f, l, &ra, &ma);
    if (!routed && (!be->ops->router_route ||
                    !be->ops->router_route(be, &lw->router, f->x, n, &ra, f->router, f->route_ids, f->route_w))) {
        be->ops->linear(be, &lw->router, f->x, n, f->router);
        be->ops->moe_route(be, f->router, n, &ra, f->route_ids, f->route_w);
    }
    if (f->expert_hi) /* other ranks' experts add nothing here; the all-reduce adds them */
        be->ops->moe_mask_ids(be, f->route_ids, (size_t)n * (size_t)d->n_experts_used, f->expert_lo, f->expert_hi);
    if (lw->has_ffn && be->ops->moe_experts_shared) {
        const struct weight *const shared[3] = {&lw->ffn_gate, &lw->ffn_up, &lw->ffn_down};
        if (be->ops->moe_experts_shared(be, f->x, n, f->route_ids, f->route_w, &ma, shared, f->moe_work, f->delta))
            return;
    }
    be->ops->moe_experts(be, f->x, n, f->route_ids, f->route_w, &ma, f->moe_work, f->delta);
    if (lw->has_ffn) {
        forward_mlp(f, lw, n, f->tmp);
        be->ops->add(be, f->delta, f->tmp, (size_t)n * (size_t)d->d_model);
    }
}

/* The norm before a MoE layer's FFN, its router and its routing in the backend's one op
 * (norm_router_route: h += the pending delta, x = rmsnorm(h), logits, ids, weights), then the
 * experts; false (nothing run) where the backend does not take it. */
static bool forward_ffn_norm_routed(struct forward *f, int l, int n, bool *pending)
{
    const struct model_desc *d = f->d;
    const struct layer_weights *lw = &f->w->layers[l];
    struct backend *be = f->be;
    if (d->layers[l].ffn == FFN_DENSE || !be->ops->norm_router_route)
        return false;
    struct route_args ra;
    struct moe_args ma;
    forward_moe_args(f, l, &ra, &ma);
    if (!be->ops->norm_router_route(be, f->h, *pending ? f->delta : NULL, lw->ffn_norm, d->norm_eps, &lw->router, n,
                                    &ra, f->x, f->router, f->route_ids, f->route_w))
        return false;
    *pending = false;
    forward_ffn(f, l, n, true);
    return true;
}

/* Final norm on the wanted rows c0 .. c0+cn of the residual stream h, then lm_head into f->logits. */
static void forward_logits_chunk(struct forward *f, const struct forward_batch *b, int c0, int cn)
{
    struct backend *be = f->be;
    size_t D = (size_t)f->d->d_model;
    const float *h = f->dp ? f->dp->xg : f->h; /* data-parallel attention: every rank's rows, gathered */
    if (cn <= 0)
        return;
    bool contiguous = true;
    for (int i = 1; i < cn && contiguous; i++)
        contiguous = b->logit_rows[c0 + i] == b->logit_rows[c0] + i;
    if (contiguous) {
        be->ops->rmsnorm(be, h + (size_t)b->logit_rows[c0] * D, f->w->final_norm, cn, (int)D,
                         f->d->norm_eps, f->x_sel);
    } else {
        /* gather the wanted rows (device-to-device through the backend) */
        for (int i = 0; i < cn; i++)
            be->ops->rmsnorm(be, h + (size_t)b->logit_rows[c0 + i] * D, f->w->final_norm, 1, (int)D,
                             f->d->norm_eps, f->x_sel + (size_t)i * D);
    }
    if (f->logits_part) { /* vocabulary-parallel: this rank's rows, then every rank's side by side */
        be->ops->linear(be, &f->w->lm_head, f->x_sel, cn, f->logits_part);
        comm_all_gather_cols(f->comm, f->logits_part, f->logits, (size_t)cn, (size_t)f->w->lm_head.rows);
    } else {
        be->ops->linear(be, &f->w->lm_head, f->x_sel, cn, f->logits);
    }
    if (b->tokens_out && b->sample && b->edit_start)
        be->ops->logits_edit(be, f->logits, cn, f->d->vocab_size, f->d_edit_start + c0, f->d_edits);
    if (b->tokens_out && b->sample)
        be->ops->sample(be, f->logits, cn, f->d->vocab_size, f->d_sample + c0, NULL, f->d_argmax);
    else if (b->tokens_out && be->ops->argmax)
        be->ops->argmax(be, f->logits, cn, f->d->vocab_size, f->d_argmax);
}

bool forward_can_sample(const struct forward *f)
{
    return f->be->ops->sample != NULL;
}

int forward_edit_capacity(const struct forward *f)
{
    return f->be->ops->sample ? f->edit_cap : 0;
}

bool forward_can_logprobs(const struct forward *f)
{
    return f->be->ops->sample && f->be->ops->logprobs;
}

/* Draws chunk c0 .. c0+cn again where its rows carry masks (b->masks, complete only now: the
 * host made them while the device ran the pass): the masks go up compacted, each masked row's
 * parameters name its own, and the sample op rewrites the chunk's ids. The unmasked rows draw
 * what they drew before (the same logits and uniforms); only ids come back, never a row of
 * logits, which at batch 64 of a 152k vocabulary would be 39 MB a step. */
static enum status forward_sample_masked(struct forward *f, const struct forward_batch *b, int c0, int cn,
                                         struct err *err)
{
    struct backend *be = f->be;
    int n = 0;
    for (int i = 0; i < cn; i++)
        n += b->masks[c0 + i] != NULL;
    if (!n)
        return STATUS_OK;
    const size_t words = ((size_t)f->d->vocab_size + 31) / 32, bytes = (size_t)f->logit_chunk * words * 4;
    if (!f->d_masks) {
        f->d_masks = be->ops->alloc(be, bytes);
        f->h_masks = malloc(bytes);
        if (!f->d_masks || !f->h_masks)
            return err_set(err, STATUS_NOMEM, "forward: cannot allocate %zu bytes for the grammar masks on %s",
                           bytes, be->ops->name);
    }
    int k = 0;
    for (int i = 0; i < cn; i++) {
        f->h_sample[i] = b->sample[c0 + i];
        f->h_sample[i].mask = 0;
        if (b->masks[c0 + i]) {
            memcpy(f->h_masks + (size_t)k * words, b->masks[c0 + i], words * 4);
            f->h_sample[i].mask = ++k;
        }
    }
    be->ops->upload(be, f->d_masks, f->h_masks, (size_t)k * words * 4);
    be->ops->upload(be, f->d_sample + c0, f->h_sample, (size_t)cn * sizeof *f->h_sample);
    for (int i = 0; i < cn; i++) /* greedy again: h_sample is the padding's rows too */
        f->h_sample[i] = (struct sample_row){.top_p = 1.0f};
    be->ops->sample(be, f->logits, cn, f->d->vocab_size, f->d_sample + c0, f->d_masks, f->d_argmax);
    return STATUS_OK;
}

/* The host's share of chunk c0 .. c0+cn: logits and/or their argmax. A row with a NaN logit
 * is an error (the argmax guard), never token 0. */
static enum status forward_emit(struct forward *f, const struct forward_batch *b, int c0, int cn,
                                float *logits_out, struct err *err)
{
    struct backend *be = f->be;
    size_t V = (size_t)f->d->vocab_size;
    if (logits_out)
        be->ops->download(be, logits_out + (size_t)c0 * V, f->logits, (size_t)cn * V * sizeof(float));
    if (!b->tokens_out)
        return STATUS_OK;
    int32_t *ids = b->tokens_out + c0;
    enum status st;
    if (b->sample && b->masks && (st = forward_sample_masked(f, b, c0, cn, err)))
        return st;
    if (b->sample && b->lp_out) { /* from the rows as drawn (their masks too), only the figures come back */
        const int k = b->logprob_k;
        be->ops->logprobs(be, f->logits, cn, (int)V, f->d_sample + c0, f->d_masks, f->d_argmax, k, f->d_lp,
                          f->d_top_ids, f->d_top_lp);
        be->ops->download(be, b->lp_out + c0, f->d_lp, (size_t)cn * sizeof(float));
        if (k > 0) {
            be->ops->download(be, b->top_ids_out + (size_t)c0 * k, f->d_top_ids, (size_t)cn * k * sizeof(int32_t));
            be->ops->download(be, b->top_lp_out + (size_t)c0 * k, f->d_top_lp, (size_t)cn * k * sizeof(float));
        }
    }
    if (b->sample || be->ops->argmax) {
        be->ops->download(be, ids, f->d_argmax, (size_t)cn * sizeof(int32_t));
    } else {
        const float *host = logits_out ? logits_out + (size_t)c0 * V : NULL;
        if (!host) {
            if (!f->h_logits && !(f->h_logits = malloc((size_t)f->logit_chunk * V * sizeof(float))))
                return err_set(err, STATUS_NOMEM, "forward: out of host memory for logits");
            be->ops->download(be, f->h_logits, f->logits, (size_t)cn * V * sizeof(float));
            host = f->h_logits;
        }
        for (int i = 0; i < cn; i++) {
            const float *row = host + (size_t)i * V;
            int32_t best = 0;
            for (size_t v = 0; v < V && best >= 0; v++) {
                if (row[v] != row[v])
                    best = -1;
                else if (row[v] > row[best])
                    best = (int32_t)v;
            }
            ids[i] = best;
        }
    }
    for (int i = 0; i < cn; i++)
        if (ids[i] < 0)
            return err_set(err, STATUS_INVALID, b->masks && b->masks[c0 + i]
                                                    ? "forward: batch row %d: NaN among the logits its mask allows, "
                                                      "or no id allowed"
                                                    : "forward: the logits of batch row %d contain NaN",
                           b->logit_rows[c0 + i]);
    return STATUS_OK;
}

/* x = rmsnorm(h (+ delta when an output is still pending)) * w; the pending output joins h. */
static void forward_norm(struct forward *f, const float *w, int n, bool *pending)
{
    const struct model_desc *d = f->d;
    if (*pending)
        f->be->ops->add_rmsnorm(f->be, f->h, f->delta, w, n, d->d_model, d->norm_eps, f->x);
    else
        f->be->ops->rmsnorm(f->be, f->h, w, n, d->d_model, d->norm_eps, f->x);
    *pending = false;
}

/* Under tensor parallelism a half-layer's output in f->delta is this rank's partial sum: the
 * all-reduce makes it the whole output, the same on every rank, before the residual takes it.
 * Where the plan fuses them (f->fuse_norm) and a norm w follows, the residual add and that norm
 * come in the same comm op (h += sum, x = rmsnorm(h) * w): true, nothing left pending. Not before
 * a MoE FFN whose backend folds that norm into its router (norm_router_route) unless the
 * communicator has a one-kernel form for this size: that fusion is worth more than two kernels. */
static bool forward_reduce(struct forward *f, const float *w, int n, bool router_next)
{
    if (!f->comm)
        return false;
    const struct model_desc *d = f->d;
    const size_t floats = (size_t)n * (size_t)d->d_model;
    if (w && f->fuse_norm &&
        !(router_next && f->be->ops->norm_router_route && !comm_fuses_add_rmsnorm(f->comm, floats))) {
        comm_all_reduce_add_rmsnorm(f->comm, f->be, f->delta, f->h, w, n, d->d_model, d->norm_eps, f->x);
        return true;
    }
    comm_all_reduce_sum(f->comm, f->delta, floats);
    return false;
}

/* Data-parallel attention's FFN half (engine/forward_dp.h): this rank's normed rows in f->x join
 * every rank's (t_max rows each, padded), this rank's FFN share runs over all of them in passes of
 * at most max_tokens rows (the FFN's buffers stay one rank's size; its rows are independent), and
 * the partial sums of its own rows come back into f->delta, whole. */
static void forward_dp_ffn(struct forward *f, int l)
{
    struct forward_dp *dp = f->dp;
    const size_t rows = (size_t)dp->t_max, D = (size_t)f->d->d_model, all = rows * (size_t)f->comm->size;
    float *x = f->x, *delta = f->delta;
    comm_all_gather_rows(f->comm, x, dp->xg, rows * D);
    for (size_t o = 0; o < all; o += (size_t)f->max_tokens) {
        const size_t k = all - o < (size_t)f->max_tokens ? all - o : (size_t)f->max_tokens;
        f->x = dp->xg + o * D, f->delta = dp->dg + o * D;
        forward_ffn(f, l, (int)k, false);
    }
    f->x = x, f->delta = delta;
    comm_reduce_scatter_sum(f->comm, dp->dg, delta, rows * D);
}

/* Every op of the pass up to the residual stream's last add (no host work, no copies). Each half
 * of a layer leaves its output in f->delta, pending until the next norm adds it (or a fused
 * all-reduce added and normed it: normed). Under data-parallel attention b is this rank's part of
 * the pass, which may be empty: the rank then only takes part in the FFN. */
static void forward_layers(struct forward *f, const struct forward_batch *b)
{
    const struct model_desc *d = f->d;
    struct backend *be = f->be;
    int n = b->n_tokens;
    bool pending = false, normed = false;
    if (n > 0) {
        if (f->mla)
            forward_mla_batch(f, b);
        be->ops->embed(be, &f->w->embed, f->d_tokens, n, f->h);
    }
    for (int l = 0; l < d->n_layers; l++) {
        const struct layer_weights *lw = &f->w->layers[l];
        if (n > 0) {
            if (!normed)
                forward_norm(f, lw->attn_norm, n, &pending);
            if (d->layers[l].attn == ATTN_MLA)
                forward_mla_attention(f, n, l);
            else
                forward_attention_gqa(f, l, n);
        }
        pending = true;
        if (f->dp) { /* the attention is whole here: nothing to reduce */
            if (n > 0)
                forward_norm(f, lw->ffn_norm, n, &pending);
            forward_dp_ffn(f, l);
            pending = true;
            continue;
        }
        if (forward_reduce(f, lw->ffn_norm, n, d->layers[l].ffn == FFN_MOE)) {
            pending = false;
            forward_ffn(f, l, n, false);
        } else if (!forward_ffn_norm_routed(f, l, n, &pending)) {
            forward_norm(f, lw->ffn_norm, n, &pending);
            forward_ffn(f, l, n, false);
        }
        normed = forward_reduce(f, l + 1 < d->n_layers ? f->w->layers[l + 1].attn_norm : NULL, n, false);
        pending = !normed;
    }
    /* final residual add; the final norm is applied per selected row in forward_logits_chunk */
    if (pending)
        be->ops->add(be, f->h, f->delta, (size_t)n * (size_t)d->d_model);
    if (f->dp) /* the lm_head's rows: every rank's */
        comm_all_gather_rows(f->comm, f->h, f->dp->xg, (size_t)f->dp->t_max * (size_t)d->d_model);
}

/* The rows a decode-shaped pass (one row a sequence, every row's logits in order, one chunk)
 * runs as: its size padded up to the next graph size, or its own where nothing pads; 0 when the
 * pass is not of that shape. Such a pass depends on nothing but its row count once the metadata
 * is uploaded, so it is captured once and replayed. MLA passes size scratch from host-side
 * positions: never. */
static int forward_decode_rows(const struct forward *f, const struct forward_batch *b)
{
    /* a prompt chunk whose every row wants logits (prompt log-probabilities) is not a decode
     * step, whatever its count */
    if (!f->use_graphs || f->mla || f->dp || b->n_logits != b->n_tokens || b->n_logits > f->logit_chunk ||
        b->n_seqs != b->n_tokens)
        return 0;
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] != i)
            return 0;
    int rows = f->pad_decode ? plan_decode_graph_rows(b->n_tokens, f->graph_rows) : 0;
    return rows >= b->n_tokens ? rows : b->n_tokens;
}

/* The graph key of a decode-shaped pass of `rows` rows (0: not one). */
static uint64_t forward_graph_key(const struct forward_batch *b, int rows)
{
    return rows ? (uint64_t)rows << BACKEND_GRAPH_KEY_MODE_BITS | (b->tokens_out ? 1u : 0u) | (b->sample ? 2u : 0u) |
                      (b->edit_start ? 4u : 0u)
                : 0;
}

/* Runs the pass from a graph when one is captured for its key; captures it the second time
 * the key is seen (the first run grew every scratch buffer to this shape). */
static void forward_run_device(struct forward *f, const struct forward_batch *b, uint64_t key)
{
    struct backend *be = f->be;
    if (key && be->ops->graph_replay) {
        if (be->ops->graph_replay(be, key))
            return;
        bool seen = false;
        for (int i = 0; i < f->n_graph_seen && !seen; i++)
            seen = f->graph_seen[i] == key;
        if (seen && be->ops->graph_capture_begin(be)) {
            forward_layers(f, b);
            forward_logits_chunk(f, b, 0, b->n_logits);
            if (be->ops->graph_capture_end(be, key) && be->ops->graph_replay(be, key))
                return;
            /* capture failed: nothing ran, run the ops directly below */
        } else if (!seen && f->n_graph_seen < FORWARD_MAX_GRAPH_KEYS) {
            f->graph_seen[f->n_graph_seen++] = key;
        }
    }
    forward_layers(f, b);
    if (b->n_logits <= f->logit_chunk)
        forward_logits_chunk(f, b, 0, b->n_logits);
}

enum status forward_launch(struct forward *f, const struct forward_batch *b, struct err *err)
{
    f->launched = NULL;
    enum status st = forward_check_batch(f, b, err);
    if (st)
        return st;
    forward_dp_assign(f, b); /* data-parallel attention: rank 0 gives each new sequence a rank */
    ranks_send_pass(f, b); /* the other ranks run it too (nothing with one rank) */
    if ((st = forward_dp_split(f, &b, err))) /* data-parallel attention: from here on, this rank's part */
        return st;
    /* the device runs pb: b, or b padded to its graph size (the same on every rank: it follows
     * from the batch's shape); only b's rows come back */
    const int rows = forward_decode_rows(f, b);
    struct forward_batch pb = *b;
    if (rows > b->n_tokens) {
        pb.n_tokens = pb.n_seqs = pb.n_logits = rows;
        pb.logit_rows = f->h_rows;
    }
    forward_upload_batch(f, b, rows);
    if (b->sample && rows > b->n_tokens) {
        memcpy(f->h_sample, b->sample, (size_t)b->n_logits * sizeof *b->sample);
        f->be->ops->upload(f->be, f->d_sample, f->h_sample, (size_t)rows * sizeof(struct sample_row));
        for (int i = 0; i < b->n_logits; i++) /* greedy again for the next pass's padding */
            f->h_sample[i] = (struct sample_row){.top_p = 1.0f};
    } else if (b->sample) {
        f->be->ops->upload(f->be, f->d_sample, b->sample, (size_t)b->n_logits * sizeof(struct sample_row));
    }
    if (b->edit_start) { /* the padding rows' ranges empty */
        const int n = rows > b->n_logits ? rows : b->n_logits;
        memcpy(f->h_edit_start, b->edit_start, ((size_t)b->n_logits + 1) * sizeof *f->h_edit_start);
        for (int i = b->n_logits + 1; i <= n; i++)
            f->h_edit_start[i] = b->edit_start[b->n_logits];
        f->be->ops->upload(f->be, f->d_edit_start, f->h_edit_start, ((size_t)n + 1) * sizeof *f->h_edit_start);
        f->be->ops->upload(f->be, f->d_edits, b->edits, (size_t)b->edit_start[b->n_logits] * sizeof *b->edits);
    }
    forward_run_device(f, &pb, forward_graph_key(&pb, rows));
    f->launched = b;
    return STATUS_OK;
}

enum status forward_finish(struct forward *f, float *logits_out, struct err *err)
{
    const struct forward_batch *b = f->launched;
    enum status st = STATUS_OK;
    ASSERT(b); /* forward_launch succeeded */
    f->launched = NULL;
    if (b->n_logits <= f->logit_chunk) {
        if (b->n_logits > 0)
            st = forward_emit(f, b, 0, b->n_logits, logits_out, err);
    } else {
        for (int c0 = 0; c0 < b->n_logits && !st; c0 += f->logit_chunk) {
            int cn = b->n_logits - c0 < f->logit_chunk ? b->n_logits - c0 : f->logit_chunk;
            forward_logits_chunk(f, b, c0, cn);
            st = forward_emit(f, b, c0, cn, logits_out, err);
        }
    }
    f->be->ops->synchronize(f->be);
    return st;
}

enum status forward_run(struct forward *f, const struct forward_batch *b, float *logits_out,
                        struct err *err)
{
    enum status st = forward_launch(f, b, err);
    return st ? st : forward_finish(f, logits_out, err);
}

bool forward_overlaps(const struct forward *f)
{
    return f->be->ops->graph_replay != NULL;
}
