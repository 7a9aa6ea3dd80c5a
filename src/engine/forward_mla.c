/* forward_mla.c — MLA attention with the DSA indexer, one layer (see forward_mla.h).
 *
 * Spec: ../shared/spec/models.md C.2 (projections), C.3 (attention), C.4
 * (indexer), C.5 (full/shared layers), C.8 (cache). The order of one layer:
 *   c_q = rmsnorm(W_qa x) (eps 1e-6);  q = W_qb c_q;  RoPE on each head's rope dims
 *   [c_kv | k_r] = W_kva x;  RoPE on k_r
 *   full layers: k_I = RoPE(LayerNorm(W_Ik x)) -> the indexer key cache
 *   cache <- [rmsnorm(c_kv) | k_r]  (eps 1e-6; the latent, never expanded K/V)
 *   full layers: Sel = the index_topk keys with the highest indexer score (all causal
 *     keys while there are no more than index_topk)
 *   shared layers: Sel of the last full layer, unchanged
 *   q_abs = [W_uk^T q_nope | q_rope];  o_lat = attention over Sel in latent space;
 *   o = W_uv o_lat;  delta = W_o o
 * The selection is a property of the query token, not of the layer, which is
 * why a shared layer can reuse it (spec C.5): it is kept in f->mla->sel
 * between layers of one forward pass.
 *
 * Dense passes (every row over all its causal keys) that the backend's plan runs faster
 * expanded take backend_ops.mla_attention_expanded instead of absorb / attention / expand:
 * K/V through kv_b from the same cache rows, then ordinary attention (the cache format does
 * not change). Not here: the FFN (forward.c).
 */
#include "engine/forward_mla.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* eps of q_a_layernorm / kv_a_layernorm (module default) and of the indexer's k_norm (spec D.2) */
#define MLA_LATENT_EPS 1e-6f
#define DSA_KEY_NORM_EPS 1e-6f

static bool desc_has_mla(const struct model_desc *d)
{
    for (int l = 0; l < d->n_layers; l++)
        if (d->layers[l].attn == ATTN_MLA)
            return true;
    return false;
}

static bool desc_has_indexer(const struct model_desc *d)
{
    for (int l = 0; l < d->n_layers; l++)
        if (d->layers[l].indexer == INDEXER_FULL)
            return true;
    return false;
}

enum status forward_mla_init(struct forward *f, struct err *err)
{
    const struct model_desc *d = f->d;
    struct backend *be = f->be;
    f->mla = NULL;
    if (!desc_has_mla(d))
        return STATUS_OK;
    if (d->q_lora_rank <= 0)
        return err_set(err, STATUS_UNSUPPORTED, "forward: MLA without q_lora_rank (q_proj) is not supported");
    struct forward_mla *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(err, STATUS_NOMEM, "forward: out of host memory");
    f->mla = m;
    size_t T = (size_t)f->max_tokens, H = (size_t)d->n_heads;
    size_t dk = (size_t)d->kv_lora_rank + (size_t)d->qk_rope_head_dim;
    bool dsa = desc_has_indexer(d);
    size_t HI = dsa ? (size_t)d->index_n_heads : 1, DI = dsa ? (size_t)d->index_head_dim : 1;
    size_t K = dsa ? (size_t)d->index_topk : 1;
    struct {
        void **p;
        size_t bytes;
    } bufs[] = {
        {(void **)&m->cq, T * (size_t)d->q_lora_rank * 4},
        {(void **)&m->q, T * H * ((size_t)d->qk_nope_head_dim + (size_t)d->qk_rope_head_dim) * 4},
        {(void **)&m->ckv, T * dk * 4},
        {(void **)&m->q_abs, T * H * dk * 4},
        {(void **)&m->o_lat, T * H * (size_t)d->kv_lora_rank * 4},
        {(void **)&m->attn, T * H * (size_t)d->v_head_dim * 4},
        {(void **)&m->idx_q, T * HI * DI * 4},
        {(void **)&m->idx_k, T * DI * 4},
        {(void **)&m->idx_w, T * HI * 4},
        {(void **)&m->sel, T * K * 4},
        {(void **)&m->dsa_work, backend_dsa_workspace_floats(f->max_tokens, (int)K) * 4},
    };
    m->seq_keys = calloc((size_t)f->max_seqs, sizeof *m->seq_keys);
    if (!m->seq_keys)
        return err_set(err, STATUS_NOMEM, "forward: out of host memory");
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = be->ops->alloc(be, bufs[i].bytes);
        if (!*bufs[i].p)
            return err_set(err, STATUS_NOMEM, "forward: cannot allocate %zu bytes of MLA activations on %s",
                           bufs[i].bytes, be->ops->name);
    }
    if (!be->ops->mla_attention || !be->ops->mla_store || !be->ops->mla_absorb_q || !be->ops->mla_expand_o ||
        (dsa && (!be->ops->layernorm || !be->ops->dsa_select)))
        return err_set(err, STATUS_UNSUPPORTED, "forward: backend %s has no MLA/DSA ops", be->ops->name);
    return STATUS_OK;
}

void forward_mla_free(struct forward *f)
{
    struct forward_mla *m = f->mla;
    if (!m)
        return;
    void *bufs[] = {m->cq,    m->q,     m->ckv,   m->q_abs, m->o_lat,   m->attn,
                    m->idx_q, m->idx_k, m->idx_w, m->sel,   m->dsa_work};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            f->be->ops->free(f->be, bufs[i]);
    free(m->seq_keys);
    free(m);
    f->mla = NULL;
}

/* RoPE on `dim` dims at `offset` of each of n_heads vectors of length stride, per token. */
static void mla_rope(struct forward *f, float *x, int n, int n_heads, int stride, int offset)
{
    const struct rope_desc *r = &f->d->rope;
    struct rope_args ra = {.dim = r->dim, .offset = offset, .interleaved = r->layout == ROPE_INTERLEAVED,
                           .attention_factor = r->attention_factor, .inv_freq = f->inv_freq};
    f->be->ops->rope(f->be, x, n, n_heads, stride, &ra, f->d_pos);
}

/* The indexer's selection for this batch (spec C.4), into m->sel. It runs for every
 * batch, also while no query has more than index_topk causal keys (then the op keeps
 * them all without scoring): what runs never depends on the positions, so a captured
 * sequence of ops stays valid as the context grows past index_topk. */
static void mla_select(struct forward *f, int n, const struct layer_weights *lw, const struct attn_batch *ab,
                       const struct paged_latent *kv, bool have_q)
{
    const struct model_desc *d = f->d;
    struct backend *be = f->be;
    struct forward_mla *m = f->mla;
    int HI = d->index_n_heads, DI = d->index_head_dim;
    if (!have_q) { /* else made beside q and roped with it (forward_mla_attention) */
        be->ops->linear(be, &lw->idx_wq, m->cq, n, m->idx_q);
        mla_rope(f, m->idx_q, n, HI, DI, 0); /* the indexer's rope dims come first (spec D.4) */
    }
    be->ops->linear(be, &lw->idx_wproj, f->x, n, m->idx_w);
    struct dsa_args da = {.n_heads = HI, .head_dim = DI, .topk = d->index_topk,
                          .head_scale = 1.0f / sqrtf((float)HI), .score_scale = 1.0f / sqrtf((float)DI)};
    be->ops->dsa_select(be, m->idx_q, m->idx_w, kv, ab, &da, m->dsa_work, m->sel);
}

void forward_mla_batch(struct forward *f, const struct forward_batch *b)
{
    struct forward_mla *m = f->mla;
    ASSERT(b->n_seqs <= f->max_seqs);
    m->n_seqs = b->n_seqs;
    memset(m->seq_keys, 0, (size_t)b->n_seqs * sizeof *m->seq_keys);
    m->rows_dense = true;
    for (int i = 0; i < b->n_tokens; i++) {
        int32_t *k = &m->seq_keys[b->seq[i]];
        *k = b->pos[i] + 1 > *k ? b->pos[i] + 1 : *k;
        m->rows_dense &= b->pos[i] < f->d->index_topk;
    }
    m->n_keys = 0;
    m->max_keys = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        m->n_keys += m->seq_keys[s];
        m->max_keys = m->seq_keys[s] > m->max_keys ? m->seq_keys[s] : m->max_keys;
    }
}

void forward_mla_attention(struct forward *f, int n, int l)
{
    const struct model_desc *d = f->d;
    const struct layer_weights *lw = &f->w->layers[l];
    struct backend *be = f->be;
    struct forward_mla *m = f->mla;
    const struct paged_latent *kv = &f->kv->latent[l];
    int H = d->n_heads, R = d->kv_lora_rank;
    int nope = d->qk_nope_head_dim, rope = d->qk_rope_head_dim;
    ASSERT(m && kv->latent);

    /* the projections of x: c_q, the latent row, the indexer key (one pass where the backend
     * takes several weights sharing their input: at one token each is a short launch) */
    {
        const struct weight *ws[3] = {&lw->q_a, &lw->kv_a, &lw->idx_wk};
        float *ys[3] = {m->cq, m->ckv, m->idx_k};
        const int n_w = lw->has_indexer ? 3 : 2;
        if (be->ops->linear_multi) {
            be->ops->linear_multi(be, n_w, ws, f->x, n, ys);
        } else {
            for (int j = 0; j < n_w; j++)
                be->ops->linear(be, ws[j], f->x, n, ys[j]);
        }
    }

    /* queries: c_q (kept for the indexer), then per-head q; the indexer's query from the same
     * c_q in the same pass where the backend takes several weights */
    be->ops->rmsnorm(be, m->cq, lw->q_a_norm, n, d->q_lora_rank, MLA_LATENT_EPS, m->cq);
    const bool idx_q_now = lw->has_indexer && be->ops->linear_multi;
    if (idx_q_now) {
        const struct weight *ws[2] = {&lw->q_b, &lw->idx_wq};
        float *ys[2] = {m->q, m->idx_q};
        be->ops->linear_multi(be, 2, ws, m->cq, n, ys);
    } else {
        be->ops->linear(be, &lw->q_b, m->cq, n, m->q);
    }
    int DI = d->index_head_dim, HI = d->index_n_heads;
    if (lw->has_indexer)
        be->ops->layernorm(be, m->idx_k, lw->idx_k_norm_w, lw->idx_k_norm_b, n, DI, DSA_KEY_NORM_EPS, m->idx_k);

    /* the rope dims of q, of this token's latent row and of the indexer's key (and query): they
     * share the positions, so one pass where the backend has it (the indexer's rope dims come
     * first, spec D.4) */
    struct rope_job jobs[ROPE_MAX_JOBS] = {{m->q, H, nope + rope, nope}, {m->ckv, 1, R + rope, R}};
    int n_jobs = 2;
    if (lw->has_indexer)
        jobs[n_jobs++] = (struct rope_job){m->idx_k, 1, DI, 0};
    if (idx_q_now)
        jobs[n_jobs++] = (struct rope_job){m->idx_q, HI, DI, 0};
    if (be->ops->rope_multi) {
        const struct rope_desc *r = &d->rope;
        struct rope_args ra = {.dim = r->dim, .offset = 0, .interleaved = r->layout == ROPE_INTERLEAVED,
                               .attention_factor = r->attention_factor, .inv_freq = f->inv_freq};
        be->ops->rope_multi(be, n_jobs, jobs, n, &ra, f->d_pos);
    } else {
        for (int j = 0; j < n_jobs; j++)
            mla_rope(f, jobs[j].x, n, jobs[j].n_heads, jobs[j].head_stride, jobs[j].offset);
    }

    /* this token's latent row and indexer key, into the cache */
    be->ops->mla_store(be, kv, m->ckv, lw->kv_a_norm, MLA_LATENT_EPS, lw->has_indexer ? m->idx_k : NULL, n,
                       f->d_slots);

    struct attn_batch ab = {.n_tokens = n, .pos = f->d_pos, .seq = f->d_seq, .block_table = f->d_table,
                            .max_blocks = f->max_blocks, .max_len = f->mla->max_keys};
    if (lw->has_indexer)
        mla_select(f, n, lw, &ab, kv, idx_q_now);
    /* INDEXER_SHARED: the last full layer's selection stands (layer 0 is always full);
     * INDEXER_NONE (MLA without DSA): every causal key */
    bool dense = d->layers[l].indexer == INDEXER_NONE;

    struct mla_dims md = {.n_heads = H, .nope = nope, .rope = rope, .v = d->v_head_dim, .kv_rank = R};
    /* every row over all its causal keys (no indexer, or no row past index_topk: the selection
     * is then every key) and a pass long enough: K/V expanded, ordinary attention */
    if ((dense || m->rows_dense) && be->ops->mla_attention_expanded && be->ops->mla_prefers_expanded &&
        be->ops->mla_prefers_expanded(be, n, m->n_keys)) {
        be->ops->mla_attention_expanded(be, m->q, &lw->kv_b, &md, kv, &ab, m->n_seqs, m->seq_keys, d->attn_scale,
                                        m->attn);
        be->ops->linear(be, &lw->wo, m->attn, n, f->delta);
        return;
    }
    be->ops->mla_absorb_q(be, &lw->kv_b, &md, m->q, n, m->q_abs);
    be->ops->mla_attention(be, m->q_abs, kv, &ab, H, dense ? NULL : m->sel, d->index_topk,
                           d->attn_scale, m->o_lat);
    be->ops->mla_expand_o(be, &lw->kv_b, &md, m->o_lat, n, m->attn);
    be->ops->linear(be, &lw->wo, m->attn, n, f->delta);
}
