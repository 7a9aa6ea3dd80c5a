/* forward_dp.c — see forward_dp.h. */
#include "engine/forward_dp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void dp_free_buf(struct forward *f, void **p)
{
    if (*p)
        f->be->ops->free(f->be, *p);
    *p = NULL;
}

void forward_dp_free(struct forward *f)
{
    struct forward_dp *dp = f->dp;
    if (!dp)
        return;
    dp_free_buf(f, (void **)&dp->xg);
    dp_free_buf(f, (void **)&dp->dg);
    free(dp->tokens);
    free(dp->pos);
    free(dp->seq);
    free(dp->logit_rows);
    free(dp->place);
    free(dp->local_seq);
    free(dp->seqs);
    free(dp->lseqs);
    free(dp->places);
    free(dp);
    f->dp = NULL;
}

enum status forward_dp_init(struct forward *f, struct err *err)
{
    if (!f->comm)
        return err_set(err, STATUS_INVALID, "data-parallel attention needs ranks");
    const struct model_desc *d = f->d;
    const size_t R = (size_t)f->comm->size * (size_t)f->max_tokens, T = (size_t)f->max_tokens, D = (size_t)d->d_model;
    struct forward_dp *dp = calloc(1, sizeof *dp);
    if (!dp)
        return err_set(err, STATUS_NOMEM, "forward: out of host memory");
    f->dp = dp;
    dp->tokens = malloc(T * sizeof(int32_t));
    dp->pos = malloc(T * sizeof(int32_t));
    dp->seq = malloc(T * sizeof(int32_t));
    dp->logit_rows = malloc(T * sizeof(int32_t));
    dp->place = malloc(T * sizeof(int32_t));
    dp->local_seq = malloc((size_t)f->max_seqs * sizeof(int32_t));
    dp->seqs = calloc((size_t)f->max_seqs, sizeof *dp->seqs);
    dp->lseqs = calloc((size_t)f->max_seqs, sizeof *dp->lseqs);
    dp->places = malloc((size_t)f->max_seqs * (size_t)f->kv->pool_blocks * sizeof *dp->places);
    float *zeros = calloc(T * D, sizeof(float));
    bool ok = dp->tokens && dp->pos && dp->seq && dp->logit_rows && dp->place && dp->local_seq && dp->seqs &&
              dp->lseqs && dp->places && zeros;
    if (!ok) {
        free(zeros);
        forward_dp_free(f);
        return err_set(err, STATUS_NOMEM, "forward: out of host memory");
    }
    /* every rank's rows, in and out of the FFN (which runs over them max_tokens rows at a time) */
    dp->xg = f->be->ops->alloc(f->be, R * D * sizeof(float));
    dp->dg = f->be->ops->alloc(f->be, R * D * sizeof(float));
    ok = dp->xg && dp->dg;
    if (ok) {
        /* a rank's rows past its count go into the gathers as padding: finite (zero) from the start,
         * later the rows of an earlier pass; the FFN's rows are independent, so they touch nothing */
        f->be->ops->upload(f->be, f->x, zeros, T * D * sizeof(float));
        f->be->ops->upload(f->be, f->h, zeros, T * D * sizeof(float));
    }
    free(zeros);
    if (!ok) {
        forward_dp_free(f);
        return err_set(err, STATUS_NOMEM, "forward: cannot allocate 2 x %zu rows of %zu floats (%d ranks' tokens) "
                       "on %s", R, D, f->comm->size, f->be->ops->name);
    }
    return STATUS_OK;
}

void forward_dp_assign(struct forward *f, const struct forward_batch *b)
{
    struct forward_dp *dp = f->dp;
    if (!dp || f->comm->rank != 0)
        return;
    const int N = f->comm->size;
    int n_seqs[4096] = {0}, n_tok[4096] = {0};
    ASSERT(N <= 4096);
    for (int i = 0; i < b->n_tokens; i++)
        if (b->seqs[b->seq[i]]->attn_rank > 0)
            n_tok[b->seqs[b->seq[i]]->attn_rank - 1]++;
    for (int s = 0; s < b->n_seqs; s++)
        if (b->seqs[s]->attn_rank > 0)
            n_seqs[b->seqs[s]->attn_rank - 1]++;
    for (int s = 0; s < b->n_seqs; s++) {
        struct kv_seq *ks = b->seqs[s];
        if (ks->attn_rank > 0)
            continue;
        int r = 0;
        for (int q = 1; q < N; q++)
            if (n_seqs[q] < n_seqs[r] || (n_seqs[q] == n_seqs[r] && n_tok[q] < n_tok[r]))
                r = q;
        ks->attn_rank = r + 1;
        n_seqs[r]++;
        for (int i = 0; i < b->n_tokens; i++)
            n_tok[r] += b->seq[i] == s;
    }
}

enum status forward_dp_split(struct forward *f, const struct forward_batch **pb, struct err *err)
{
    struct forward_dp *dp = f->dp;
    if (!dp)
        return STATUS_OK;
    const struct forward_batch *b = *pb;
    const int N = f->comm->size, me = f->comm->rank;
    int count[4096] = {0};
    ASSERT(N <= 4096);
    int n_local_seqs = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const int r = b->seqs[s]->attn_rank - 1;
        if (r < 0 || r >= N)
            return err_set(err, STATUS_INVALID, "data-parallel attention: sequence %d of the pass has rank %d of %d",
                           s, r, N);
        dp->local_seq[s] = r == me ? n_local_seqs : -1;
        if (r != me)
            continue;
        const struct kv_seq *ks = b->seqs[s];
        struct kv_seq *ls = &dp->lseqs[n_local_seqs];
        *ls = *ks;
        if (f->kv->n_pools > 1) { /* its blocks as places in this rank's pool, which must hold them all */
            if (ks->n_blocks > f->kv->pool_blocks)
                return err_set(err, STATUS_INVALID, "data-parallel attention: sequence %d holds %d blocks, more "
                               "than a rank's pool (%d)", s, ks->n_blocks, f->kv->pool_blocks);
            ls->blocks = dp->places + (size_t)n_local_seqs * (size_t)f->kv->pool_blocks;
            for (int j = 0; j < ks->n_blocks; j++) {
                if (ks->blocks[j] < 0 || ks->blocks[j] >= f->kv->n_blocks)
                    return err_set(err, STATUS_INVALID, "data-parallel attention: sequence %d names block %d of %d",
                                   s, ks->blocks[j], f->kv->n_blocks);
                if (kv_block_pool(f->kv, ks->blocks[j]) != me)
                    return err_set(err, STATUS_INVALID, "data-parallel attention: sequence %d's block %d is in "
                                   "rank %d's pool, not rank %d's", s, ks->blocks[j],
                                   kv_block_pool(f->kv, ks->blocks[j]), me);
                ls->blocks[j] = kv_block_place(f->kv, ks->blocks[j]);
            }
        }
        dp->seqs[n_local_seqs++] = ls;
    }
    int n = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        const int s = b->seq[i], r = b->seqs[s]->attn_rank - 1;
        dp->place[i] = count[r]++; /* the rank's k-th row; the rank's block offset once t_max is known */
        if (r == me) {
            dp->tokens[n] = b->tokens[i];
            dp->pos[n] = b->pos[i];
            dp->seq[n] = dp->local_seq[s];
            n++;
        }
    }
    int t_max = 0;
    for (int r = 0; r < N; r++)
        t_max = count[r] > t_max ? count[r] : t_max;
    dp->t_max = t_max;
    for (int i = 0; i < b->n_tokens; i++)
        dp->place[i] += (b->seqs[b->seq[i]]->attn_rank - 1) * t_max;
    for (int i = 0; i < b->n_logits; i++)
        dp->logit_rows[i] = dp->place[b->logit_rows[i]];
    dp->local = (struct forward_batch){.n_tokens = n, .tokens = dp->tokens, .pos = dp->pos, .seq = dp->seq,
                                       .n_seqs = n_local_seqs, .seqs = dp->seqs, .n_logits = b->n_logits,
                                       .logit_rows = dp->logit_rows, .tokens_out = b->tokens_out,
                                       .sample = b->sample, .masks = b->masks,
                                       .edit_start = b->edit_start, .edits = b->edits,
                                       .lp_out = b->lp_out, .top_ids_out = b->top_ids_out,
                                       .top_lp_out = b->top_lp_out, .logprob_k = b->logprob_k};
    *pb = &dp->local;
    return STATUS_OK;
}
