/* ranks.c — see ranks.h. One message a pass: a fixed header, then one int32 payload. */
#include "engine/ranks.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

enum { MSG_STOP = 0, MSG_PASS = 1 };

struct pass_header {
    int32_t kind;      /* MSG_STOP or MSG_PASS */
    int32_t n_tokens;
    int32_t n_seqs;
    int32_t n_logits;  /* rows whose logits the pass computes (a vocabulary-parallel lm_head gathers them) */
    int32_t n_ints;    /* payload length */
};

/* The payload's largest size: tokens, positions, sequence rows, logit rows, then per sequence its
 * block count, token count, attention rank (data-parallel attention: kv_seq.attn_rank) and blocks. */
static size_t payload_max(const struct forward *f)
{
    return 4 * (size_t)f->max_tokens + (size_t)f->max_seqs * (3 + (size_t)f->max_blocks);
}

static bool multi(const struct forward *f)
{
    return f->comm && f->comm->size > 1;
}

static int32_t *rank_buf(struct forward *f)
{
    if (!f->rank_buf)
        f->rank_buf = malloc(payload_max(f) * sizeof(int32_t));
    return f->rank_buf;
}

void ranks_send_pass(struct forward *f, const struct forward_batch *b)
{
    if (!multi(f) || f->comm->rank != 0)
        return;
    int32_t *p = rank_buf(f);
    ASSERT(p); /* forward_init's sizes; a failed malloc of a few KB is not a state to go on from */
    size_t o = 0, n = (size_t)b->n_tokens;
    memcpy(p + o, b->tokens, n * 4), o += n;
    memcpy(p + o, b->pos, n * 4), o += n;
    memcpy(p + o, b->seq, n * 4), o += n;
    memcpy(p + o, b->logit_rows, (size_t)b->n_logits * 4), o += (size_t)b->n_logits;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct kv_seq *ks = b->seqs[s];
        p[o++] = ks->n_blocks;
        p[o++] = ks->n_tokens;
        p[o++] = ks->attn_rank;
        memcpy(p + o, ks->blocks, (size_t)ks->n_blocks * 4), o += (size_t)ks->n_blocks;
    }
    struct pass_header h = {.kind = MSG_PASS, .n_tokens = b->n_tokens, .n_seqs = b->n_seqs, .n_logits = b->n_logits,
                            .n_ints = (int32_t)o};
    comm_broadcast(f->comm, &h, sizeof h, 0);
    comm_broadcast(f->comm, p, o * 4, 0);
}

void ranks_send_stop(struct forward *f)
{
    if (!multi(f) || f->comm->rank != 0)
        return;
    struct pass_header h = {.kind = MSG_STOP};
    comm_broadcast(f->comm, &h, sizeof h, 0);
}

enum status ranks_follow(struct forward *f, struct err *err)
{
    if (!multi(f) || f->comm->rank == 0)
        return STATUS_OK;
    int32_t *p = rank_buf(f);
    struct kv_seq *seqs = calloc((size_t)f->max_seqs, sizeof *seqs);
    struct kv_seq **ptrs = calloc((size_t)f->max_seqs, sizeof *ptrs);
    enum status st = STATUS_OK;
    if (!p || !seqs || !ptrs)
        st = err_set(err, STATUS_NOMEM, "rank %d: out of memory for the step messages", f->comm->rank);
    long passes = 0;
    while (!st) {
        struct pass_header h;
        comm_broadcast(f->comm, &h, sizeof h, 0);
        if (h.kind == MSG_STOP)
            break;
        if (h.kind != MSG_PASS || h.n_tokens < 1 || h.n_tokens > f->max_tokens || h.n_seqs < 1 ||
            h.n_seqs > f->max_seqs || h.n_logits < 0 || h.n_logits > h.n_tokens || h.n_ints < 0 ||
            (size_t)h.n_ints > payload_max(f)) {
            st = err_set(err, STATUS_INVALID, "rank %d: a malformed pass from rank 0 (%d tokens, %d sequences)",
                         f->comm->rank, h.n_tokens, h.n_seqs);
            break;
        }
        comm_broadcast(f->comm, p, (size_t)h.n_ints * 4, 0);
        size_t o = 3 * (size_t)h.n_tokens + (size_t)h.n_logits;
        for (int s = 0; s < h.n_seqs && !st; s++) {
            if (o + 3 > (size_t)h.n_ints || p[o] < 0 || p[o] > f->max_blocks ||
                o + 3 + (size_t)p[o] > (size_t)h.n_ints) {
                st = err_set(err, STATUS_INVALID, "rank %d: sequence %d's block table overruns the pass",
                             f->comm->rank, s);
                break;
            }
            /* a view of rank 0's table: the forward only reads blocks and n_blocks */
            seqs[s] = (struct kv_seq){.blocks = p + o + 3, .n_blocks = p[o], .cap = p[o], .n_tokens = p[o + 1],
                                      .attn_rank = p[o + 2]};
            ptrs[s] = &seqs[s];
            o += 3 + (size_t)p[o];
        }
        if (st)
            break;
        const int n = h.n_tokens;
        /* the logit rows too: a vocabulary-parallel lm_head's gather needs every rank; the logits
         * themselves stay here (rank 0 samples) */
        struct forward_batch b = {.n_tokens = n, .tokens = p, .pos = p + n, .seq = p + 2 * n, .n_seqs = h.n_seqs,
                                  .seqs = ptrs, .n_logits = h.n_logits, .logit_rows = p + 3 * n};
        st = forward_run(f, &b, NULL, err);
        passes++;
    }
    free(seqs);
    free(ptrs);
    if (st) {
        LOG_ERROR("%s", err->msg);
        comm_abort(f->comm, 1);
    }
    LOG_DEBUG("rank %d: followed %ld passes", f->comm->rank, passes);
    return st;
}
