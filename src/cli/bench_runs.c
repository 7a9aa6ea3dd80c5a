/* bench_runs.c — see bench_runs.h.
 *
 * Host buffers are taken before the timed part, never inside it. The decode
 * sequences are prefilled several per forward pass (as many whole prompts as
 * the forward's max_tokens allows), which is not timed: the prefill figure
 * comes from bench_prefill alone. Greedy tokens come from the forward's own
 * argmax (forward_batch.tokens_out: on the device where the backend has it),
 * so no pass copies logits to the host.
 */
#include "cli/bench_runs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

/* Kernels report their failures asynchronously on the CUDA backend; ask after every pass. */
static enum status bench_backend_status(struct model_session *s, struct err *err)
{
#ifdef MOESERVE_HAVE_CUDA
    if (strcmp(s->be.ops->name, "cuda") == 0)
        return backend_cuda_status(&s->be, err);
#endif
    (void)s;
    (void)err;
    return STATUS_OK;
}

static enum status bench_power_start(struct power_sampler *ps, struct err *err)
{
    return ps ? power_sampler_start(ps, err) : STATUS_OK;
}

static void bench_power_stop(struct power_sampler *ps, struct bench_timing *out)
{
    if (ps)
        power_sampler_stop(ps, &out->power);
}

/* One sequence of n tokens in one forward pass; its cache blocks are returned at once. */
static enum status bench_prefill_once(struct model_session *s, const int32_t *toks, int n, const int32_t *pos,
                                      const int32_t *seq, struct err *err)
{
    struct kv_seq ks;
    kv_seq_init(&ks);
    struct kv_seq *seqs[1] = {&ks};
    int32_t last = n - 1, next = 0;
    enum status st = kv_seq_reserve(&ks, &s->kv, n, err);
    if (!st) {
        struct forward_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .n_seqs = 1,
                                  .seqs = seqs, .n_logits = 1, .logit_rows = &last, .tokens_out = &next};
        st = forward_run(&s->fwd, &b, NULL, err);
    }
    kv_seq_release(&ks, &s->kv);
    return st ? st : bench_backend_status(s, err);
}

enum status bench_prefill(struct model_session *s, const int32_t *toks, int n, int reps, struct power_sampler *ps,
                          struct bench_timing *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    if (n <= 0 || n > s->fwd.max_tokens || reps <= 0)
        return err_set(err, STATUS_INVALID, "bench: prefill of %d tokens x %d reps (the forward takes 1..%d)", n,
                       reps, s->fwd.max_tokens);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *seq = calloc((size_t)n, sizeof *seq);
    enum status st = STATUS_OK;
    if (!pos || !seq) {
        st = err_set(err, STATUS_NOMEM, "bench: out of memory for a %d-token prefill", n);
        goto done;
    }
    for (int i = 0; i < n; i++)
        pos[i] = i;
    if ((st = bench_prefill_once(s, toks, n, pos, seq, err)) || (st = bench_power_start(ps, err)))
        goto done;
    double t0 = timer_now();
    for (int r = 0; r < reps && !st; r++)
        st = bench_prefill_once(s, toks, n, pos, seq, err);
    out->seconds = timer_now() - t0;
    out->tokens = (long)n * reps;
    bench_power_stop(ps, out);
done:
    free(pos);
    free(seq);
    return st;
}

/* Host scratch of one decode run, sized once. */
struct decode_scratch {
    struct kv_seq *ks;     /* (batch) */
    struct kv_seq **seqs;  /* (batch) pointers into ks */
    int32_t *tok, *pos, *seq, *rows; /* (max(batch, per_pass * context)) batch metadata */
    int32_t *next;         /* (batch) next token of each sequence */
};

static void decode_scratch_free(struct decode_scratch *d, int batch, struct kv_cache *kv)
{
    if (d->ks)
        for (int i = 0; i < batch; i++)
            kv_seq_release(&d->ks[i], kv);
    free(d->ks);
    free(d->seqs);
    free(d->tok);
    free(d->pos);
    free(d->seq);
    free(d->rows);
    free(d->next);
    memset(d, 0, sizeof *d);
}

/* Prefills the prompts, per_pass sequences per forward pass; next[] gets each one's first token. */
static enum status decode_prefill(struct model_session *s, const struct bench_decode_args *a, int per_pass,
                                  struct decode_scratch *d, struct err *err)
{
    int B = a->batch, C = a->context;
    enum status st = STATUS_OK;
    for (int first = 0; first < B && !st; first += per_pass) {
        int m = B - first < per_pass ? B - first : per_pass;
        for (int j = 0; j < m; j++) {
            for (int p = 0; p < C; p++) {
                d->tok[j * C + p] = a->prompts[(size_t)(first + j) * (size_t)C + (size_t)p];
                d->pos[j * C + p] = p;
                d->seq[j * C + p] = j;
            }
            d->rows[j] = j * C + C - 1;
        }
        struct forward_batch b = {.n_tokens = m * C, .tokens = d->tok, .pos = d->pos, .seq = d->seq, .n_seqs = m,
                                  .seqs = d->seqs + first, .n_logits = m, .logit_rows = d->rows,
                                  .tokens_out = d->next + first};
        st = forward_run(&s->fwd, &b, NULL, err);
        if (!st)
            st = bench_backend_status(s, err);
        if (st)
            break;
        for (int j = 0; j < m; j++)
            d->ks[first + j].n_tokens = C;
    }
    return st;
}

/* One token for every sequence: its last greedy choice at its next position. */
static enum status decode_step(struct model_session *s, int B, struct decode_scratch *d, struct err *err)
{
    for (int i = 0; i < B; i++) {
        d->tok[i] = d->next[i];
        d->pos[i] = d->ks[i].n_tokens;
        d->seq[i] = i;
        d->rows[i] = i;
    }
    /* the tokens were copied out above, so the greedy choice may overwrite next[] */
    struct forward_batch b = {.n_tokens = B, .tokens = d->tok, .pos = d->pos, .seq = d->seq, .n_seqs = B,
                              .seqs = d->seqs, .n_logits = B, .logit_rows = d->rows, .tokens_out = d->next};
    enum status st = forward_run(&s->fwd, &b, NULL, err);
    if (st)
        return st;
    for (int i = 0; i < B; i++)
        d->ks[i].n_tokens++;
    return STATUS_OK;
}

enum status bench_decode(struct model_session *s, const struct bench_decode_args *a, struct power_sampler *ps,
                         struct bench_timing *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    int B = a->batch, C = a->context, T = s->fwd.max_tokens;
    if (B <= 0 || B > s->fwd.max_seqs || B > T || C <= 0 || (C > T && !a->fill_random) || a->steps <= 0)
        return err_set(err, STATUS_INVALID,
                       "bench: decode batch %d, context %d, %d steps do not fit the session (max %d sequences, "
                       "%d tokens per pass)",
                       B, C, a->steps, s->fwd.max_seqs, T);
    int per_pass = C <= T ? T / C : 1;
    size_t meta = (size_t)(B > per_pass * C ? B : per_pass * C);
    struct decode_scratch d = {
        .ks = calloc((size_t)B, sizeof *d.ks),
        .seqs = calloc((size_t)B, sizeof *d.seqs),
        .tok = malloc(meta * sizeof(int32_t)),
        .pos = malloc(meta * sizeof(int32_t)),
        .seq = malloc(meta * sizeof(int32_t)),
        .rows = malloc(meta * sizeof(int32_t)),
        .next = malloc((size_t)B * sizeof(int32_t)),
    };
    enum status st = STATUS_OK;
    if (!d.ks || !d.seqs || !d.tok || !d.pos || !d.seq || !d.rows || !d.next) {
        st = err_set(err, STATUS_NOMEM, "bench: out of memory for a decode batch of %d", B);
        goto done;
    }
    for (int i = 0; i < B && !st; i++) {
        kv_seq_init(&d.ks[i]);
        d.seqs[i] = &d.ks[i];
        st = kv_seq_reserve(&d.ks[i], &s->kv, C + BENCH_WARMUP_STEPS + a->steps, err);
    }
    if (!st && a->fill_random) {
        /* the rows are there already (kv_cache_fill_random): each sequence just owns its context */
        for (int i = 0; i < B; i++) {
            d.ks[i].n_tokens = C;
            d.next[i] = a->prompts[(size_t)i * (size_t)C + (size_t)C - 1];
        }
    } else if (!st) {
        st = decode_prefill(s, a, per_pass, &d, err);
    }
    /* untimed steps: the first grows the backend's scratch to this batch shape, the second
     * captures the decode graph that the timed steps replay */
    for (int i = 0; i < BENCH_WARMUP_STEPS && !st; i++)
        st = decode_step(s, B, &d, err);
    if (st || (st = bench_backend_status(s, err)) || (st = bench_power_start(ps, err)))
        goto done;
    double t0 = timer_now();
    for (int i = 0; i < a->steps && !st; i++)
        st = decode_step(s, B, &d, err);
    out->seconds = timer_now() - t0;
    out->tokens = (long)B * a->steps;
    bench_power_stop(ps, out);
    if (!st)
        st = bench_backend_status(s, err);
done:
    decode_scratch_free(&d, B, &s->kv);
    return st;
}

double bench_decode_bytes(const struct model_session *s, int batch)
{
    const struct model_desc *d = &s->desc;
    const struct model_weights *w = &s->w;
    double b = (double)weight_bytes(&w->lm_head);
    if (d->vocab_size > 0)
        b += (double)batch * (double)weight_bytes(&w->embed) / d->vocab_size; /* one embedding row per token */
    for (int l = 0; l < d->n_layers; l++) {
        const struct layer_weights *lw = &w->layers[l];
        /* every attention kind: the weights a layer does not have are zeroed, 0 bytes */
        const struct weight *attn[] = {&lw->wq,  &lw->wk,   &lw->wv,     &lw->wo,     &lw->q_a,     &lw->q_b,
                                       &lw->kv_a, &lw->kv_b, &lw->idx_wq, &lw->idx_wk, &lw->idx_wproj};
        for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++)
            b += (double)weight_bytes(attn[i]);
        if (lw->has_ffn)
            b += (double)(weight_bytes(&lw->ffn_gate) + weight_bytes(&lw->ffn_up) + weight_bytes(&lw->ffn_down));
        if (d->layers[l].ffn == FFN_MOE && d->n_experts > 0) {
            double experts = 0;
            for (int e = 0; e < d->n_experts; e++)
                experts += (double)(weight_bytes(&lw->exp_gate[e]) + weight_bytes(&lw->exp_up[e]) +
                                    weight_bytes(&lw->exp_down[e]));
            double E = d->n_experts, k = d->n_experts_used;
            double touched = batch == 1 ? k : E * (1.0 - pow(1.0 - k / E, batch));
            b += (double)weight_bytes(&lw->router) + experts / E * touched;
        }
    }
    return b;
}
