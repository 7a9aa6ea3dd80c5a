/* scheduler.c — see scheduler.h.
 *
 * A request's life on the scheduler thread: waiting (list) -> running (array
 * in admission order) -> finished, with preemption moving a running request
 * back to the head of the waiting list. Uniform bookkeeping makes prefill,
 * decode and recomputation one case: tokens[0 .. n_tokens) is the prompt
 * followed by the generated tokens, n_computed of them have K/V in the cache,
 * and the sequence wants rows for tokens[n_computed .. n_tokens); its logits
 * are needed when the rows reach n_tokens. A decode is the case of one row.
 */
#include "engine/scheduler.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/logprobs.h"
#include "base/timer.h"

static void cond_init_monotonic(pthread_cond_t *cv)
{
    /* waits take CLOCK_MONOTONIC deadlines (timer_now), immune to clock changes */
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

enum status sched_req_create(struct sched_req **out, const int32_t *prompt, int n_prompt,
                             const struct sched_params *p, struct err *err)
{
    *out = NULL;
    if (n_prompt < 1)
        return err_set(err, STATUS_INVALID, "request: the prompt is empty");
    if (p->max_new < (p->prompt_logprobs ? 0 : 1))
        return err_set(err, STATUS_INVALID, "request: max_new must be >= 1 (got %d)", p->max_new);
    if (p->grammar && !p->grammar_vocab)
        return err_set(err, STATUS_INVALID, "request: a grammar without the vocabulary's bytes");
    if (p->top_logprobs > SCHED_MAX_TOP_LOGPROBS || p->prompt_top < 0 || p->prompt_top > SCHED_MAX_TOP_LOGPROBS)
        return err_set(err, STATUS_INVALID, "request: at most %d top log-probabilities (got %d, prompt %d)",
                       SCHED_MAX_TOP_LOGPROBS, p->top_logprobs, p->prompt_top);
    struct sched_req *r = calloc(1, sizeof *r);
    if (!r)
        return err_set(err, STATUS_NOMEM, "request: out of memory");
    size_t nm = (size_t)(p->max_new > 0 ? p->max_new : 1), top = p->top_logprobs > 0 ? (size_t)p->top_logprobs : 0;
    r->n_prompt = n_prompt;
    r->p = *p;
    grammar_ref(r->p.grammar); /* put by sched_req_put */
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    r->tokens = malloc(((size_t)n_prompt + nm) * sizeof *r->tokens);
    r->out_ids = malloc(nm * sizeof *r->out_ids);
    r->out_time = malloc(nm * sizeof *r->out_time);
    bool ok = r->prompt && r->tokens && r->out_ids && r->out_time;
    if (p->top_logprobs >= 0) {
        r->out_logprob = malloc(nm * sizeof *r->out_logprob);
        ok = ok && r->out_logprob;
        if (top) {
            r->out_top_ids = malloc(nm * top * sizeof *r->out_top_ids);
            r->out_top_lp = malloc(nm * top * sizeof *r->out_top_lp);
            ok = ok && r->out_top_ids && r->out_top_lp;
        }
    }
    if (p->prompt_logprobs) {
        r->prompt_lp = malloc((size_t)n_prompt * sizeof *r->prompt_lp);
        r->prompt_rank = calloc((size_t)n_prompt, sizeof *r->prompt_rank);
        ok = ok && r->prompt_lp && r->prompt_rank;
        if (ok)
            for (int i = 0; i < n_prompt; i++)
                r->prompt_lp[i] = NAN;
        const size_t kp = top > (size_t)p->prompt_top ? top : (size_t)p->prompt_top;
        r->prompt_k = (int)kp;
        if (kp) {
            r->prompt_top_ids = calloc((size_t)n_prompt * kp, sizeof *r->prompt_top_ids);
            r->prompt_top_lp = calloc((size_t)n_prompt * kp, sizeof *r->prompt_top_lp);
            ok = ok && r->prompt_top_ids && r->prompt_top_lp;
        }
    }
    pthread_mutex_init(&r->mu, NULL);
    cond_init_monotonic(&r->cv);
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancel, false);
    kv_seq_init(&r->seq);
    r->logit_index = -1;
    if (!ok) {
        sched_req_put(r);
        return err_set(err, STATUS_NOMEM, "request: out of memory for %d prompt and %d new tokens", n_prompt,
                       p->max_new);
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_tokens = n_prompt;
    *out = r;
    return STATUS_OK;
}

void sched_req_put(struct sched_req *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    ASSERT(r->seq.n_blocks == 0); /* the scheduler released the KV blocks */
    sampler_free(&r->smp);
    if (r->tm)
        token_mask_free(r->tm);
    free(r->tm);
    grammar_put(r->p.grammar);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->prompt);
    free(r->tokens);
    free(r->out_ids);
    free(r->out_time);
    free(r->out_logprob);
    free(r->out_top_ids);
    free(r->out_top_lp);
    free(r->prompt_lp);
    free(r->prompt_rank);
    free(r->prompt_top_ids);
    free(r->prompt_top_lp);
    free(r);
}

enum status scheduler_init(struct scheduler *sch, struct model_session *s, const struct scheduler_opts *o,
                           struct err *err)
{
    memset(sch, 0, sizeof *sch);
    sch->s = s;
    sch->o = o ? *o : (struct scheduler_opts){0};
    if (sch->o.max_queue <= 0)
        sch->o.max_queue = 256;
    if (sch->o.max_seqs <= 0 || sch->o.max_seqs > s->fwd.max_seqs)
        sch->o.max_seqs = s->fwd.max_seqs;
    if (sch->o.max_context <= 0)
        sch->o.max_context = s->max_context;
    enum status st = STATUS_OK;
    if (sch->o.max_seqs > s->fwd.max_tokens)
        st = err_set(err, STATUS_INVALID,
                     "scheduler: %d sequences need a batch of at least %d tokens (the batch budget is %d)",
                     sch->o.max_seqs, sch->o.max_seqs, s->fwd.max_tokens);
    else if ((long)s->kv.pool_blocks * s->kv.block_size < sch->o.max_context)
        st = err_set(err, STATUS_INVALID,
                     "scheduler: the KV cache (%d blocks of %d tokens) cannot hold one request of %d tokens",
                     s->kv.n_blocks, s->kv.block_size, sch->o.max_context);
    else if (!sch->o.no_prefix_cache)
        st = prefix_cache_init(&sch->pc, &s->kv, err);
    if (st) {
        memset(sch, 0, sizeof *sch); /* nothing to free yet */
        return st;
    }
    sch->vocab = s->desc.vocab_size;
    pthread_mutex_init(&sch->mu, NULL);
    cond_init_monotonic(&sch->cv);
    size_t T = (size_t)s->fwd.max_tokens, S = (size_t)sch->o.max_seqs;
    sch->running = calloc(S, sizeof *sch->running);
    sch->b_tokens = malloc(T * sizeof(int32_t));
    sch->b_pos = malloc(T * sizeof(int32_t));
    sch->b_seq = malloc(T * sizeof(int32_t));
    sch->b_logit_rows = malloc(S * sizeof(int32_t));
    sch->b_sample = malloc(S * sizeof *sch->b_sample);
    sch->b_next = malloc(S * sizeof(int32_t));
    sch->b_masks = calloc(S, sizeof *sch->b_masks);
    sch->b_edit_start = calloc(S + 1, sizeof *sch->b_edit_start);
    sch->b_lp = malloc(S * sizeof *sch->b_lp);
    sch->b_top_ids = malloc(S * SCHED_MAX_TOP_LOGPROBS * sizeof *sch->b_top_ids);
    sch->b_top_lp = malloc(S * SCHED_MAX_TOP_LOGPROBS * sizeof *sch->b_top_lp);
    const int edit_cap = forward_edit_capacity(&s->fwd);
    sch->b_edits = edit_cap ? malloc((size_t)edit_cap * sizeof *sch->b_edits) : NULL;
    sch->b_seqs = malloc(S * sizeof *sch->b_seqs);
    sch->b_reqs = malloc(S * sizeof *sch->b_reqs);
    sch->pub = malloc(S * sizeof *sch->pub);
    sch->defer = sch->o.defer_publish > 0 || (sch->o.defer_publish == 0 && forward_overlaps(&s->fwd));
    sch->logits = malloc(S * (size_t)sch->vocab * sizeof(float));
    sch->match = malloc((size_t)s->kv.n_blocks * sizeof(int32_t));
    if (!sch->running || !sch->b_tokens || !sch->b_pos || !sch->b_seq || !sch->b_logit_rows || !sch->b_seqs ||
        !sch->b_reqs || !sch->logits || !sch->match || !sch->b_sample || !sch->b_next || !sch->b_masks ||
        !sch->b_edit_start || (edit_cap && !sch->b_edits) || !sch->b_lp || !sch->b_top_ids || !sch->b_top_lp ||
        !sch->pub) {
        scheduler_free(sch);
        return err_set(err, STATUS_NOMEM, "scheduler: out of memory for %d sequences", sch->o.max_seqs);
    }
    return STATUS_OK;
}

static bool pc_on(const struct scheduler *sch)
{
    return !sch->o.no_prefix_cache;
}

/* Offers the computed full blocks to the prefix cache, then frees the KV. */
static void seq_release(struct scheduler *sch, struct sched_req *r)
{
    int bs = sch->s->kv.block_size;
    if (pc_on(sch) && r->n_computed >= bs)
        prefix_cache_insert(&sch->pc, r->tokens, r->n_computed / bs, r->seq.blocks);
    kv_seq_release(&r->seq, &sch->s->kv);
    r->n_computed = 0;
}

/* Tokens generated so far (published or not: see publish_token). */
static int generated(const struct sched_req *r)
{
    return r->n_tokens - r->n_prompt;
}

/* Makes every generated token of r visible to its readers (r->mu held). */
static void publish_locked(struct sched_req *r)
{
    if (r->n_out < generated(r)) {
        r->n_out = generated(r);
        pthread_cond_broadcast(&r->cv);
    }
}

/* Publishes the end and drops the scheduler's reference. */
static void req_finish(struct scheduler *sch, struct sched_req *r, enum sched_finish f, const char *msg)
{
    seq_release(sch, r);
    if (r->admit_order == 0) { /* never admitted: it still counted against the queue bound */
        pthread_mutex_lock(&sch->mu);
        sch->n_queued--;
        pthread_mutex_unlock(&sch->mu);
    }
    pthread_mutex_lock(&r->mu);
    publish_locked(r); /* a token held back for the next step's launch comes out before the end */
    r->finish = f;
    if (msg)
        snprintf(r->error, sizeof r->error, "%s", msg);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    sched_req_put(r);
}

static void running_remove(struct scheduler *sch, struct sched_req *r)
{
    for (int i = 0; i < sch->n_running; i++) {
        if (sch->running[i] == r) {
            memmove(sch->running + i, sch->running + i + 1, (size_t)(sch->n_running - i - 1) * sizeof *sch->running);
            sch->n_running--;
            return;
        }
    }
    PANIC("scheduler: request %llu is not running", (unsigned long long)r->id);
}

static void waiting_push_front(struct scheduler *sch, struct sched_req *r)
{
    r->next = sch->wait_head;
    sch->wait_head = r;
    if (!sch->wait_tail)
        sch->wait_tail = r;
    sch->n_waiting++;
}

static struct sched_req *waiting_pop(struct scheduler *sch)
{
    struct sched_req *r = sch->wait_head;
    sch->wait_head = r->next;
    if (!sch->wait_head)
        sch->wait_tail = NULL;
    r->next = NULL;
    sch->n_waiting--;
    return r;
}

/* Moves newly submitted requests to the end of the waiting list. */
static void take_incoming(struct scheduler *sch)
{
    pthread_mutex_lock(&sch->mu);
    struct sched_req *h = sch->in_head;
    int n = sch->n_incoming;
    sch->in_head = sch->in_tail = NULL;
    sch->n_incoming = 0;
    sch->wake = false;
    pthread_mutex_unlock(&sch->mu);
    if (!h)
        return;
    struct sched_req *t = h;
    while (t->next)
        t = t->next;
    if (sch->wait_tail)
        sch->wait_tail->next = h;
    else
        sch->wait_head = h;
    sch->wait_tail = t;
    sch->n_waiting += n;
}

/* Why r must end now (cancel, deadline), or SCHED_RUNNING. */
static enum sched_finish must_end(const struct sched_req *r, double now)
{
    if (atomic_load(&r->cancel))
        return SCHED_FINISH_CANCELLED;
    if (r->p.deadline > 0 && now > r->p.deadline)
        return SCHED_FINISH_TIMEOUT;
    return SCHED_RUNNING;
}

static void end_cancelled(struct scheduler *sch)
{
    double now = timer_now();
    for (int i = sch->n_running - 1; i >= 0; i--) {
        struct sched_req *r = sch->running[i];
        enum sched_finish f = must_end(r, now);
        if (f != SCHED_RUNNING) {
            running_remove(sch, r);
            req_finish(sch, r, f, f == SCHED_FINISH_TIMEOUT ? "the request's deadline passed" : NULL);
        }
    }
    struct sched_req **link = &sch->wait_head, *prev = NULL;
    while (*link) {
        struct sched_req *r = *link;
        enum sched_finish f = must_end(r, now);
        if (f == SCHED_RUNNING) {
            prev = r;
            link = &r->next;
            continue;
        }
        *link = r->next;
        if (sch->wait_tail == r)
            sch->wait_tail = prev;
        r->next = NULL;
        sch->n_waiting--;
        req_finish(sch, r, f, f == SCHED_FINISH_TIMEOUT ? "the request's deadline passed in the queue" : NULL);
    }
}

/* Makes n blocks free in the KV cache's pool p (0 with one pool; data-parallel attention: a rank's,
 * kv_cache.h), evicting cached ones of that pool if needed. */
static bool ensure_free(struct scheduler *sch, int p, int n)
{
    struct kv_cache *kv = &sch->s->kv;
    if (kv_cache_pool_free(kv, p) < n && pc_on(sch))
        prefix_cache_evict_pool(&sch->pc, n - kv_cache_pool_free(kv, p), kv->n_pools > 1 ? p : -1);
    return kv_cache_pool_free(kv, p) >= n;
}

/* The pool of r's sequence: its own, else where its cached prefix is, else the roomiest. */
static int seq_pool(const struct kv_cache *kv, const struct kv_seq *s, const int32_t *match, int n_match)
{
    if (kv->n_pools <= 1)
        return 0;
    if (s->attn_rank > 0)
        return s->attn_rank - 1;
    return n_match > 0 ? kv_block_pool(kv, match[0]) : kv_cache_roomiest_pool(kv);
}

static int blocks_for(int tokens, int bs)
{
    return (tokens + bs - 1) / bs;
}

/* Takes r's blocks away and puts it back at the head of the queue. */
static void preempt(struct scheduler *sch, struct sched_req *r)
{
    running_remove(sch, r);
    seq_release(sch, r);
    r->n_prompt_blocks_cached = 0;
    waiting_push_front(sch, r);
    sch->counters.n_preemptions++;
    pthread_mutex_lock(&r->mu);
    r->n_preempted++;
    pthread_mutex_unlock(&r->mu);
    LOG_DEBUG("scheduler: preempted request %llu (%d tokens) for lack of KV blocks", (unsigned long long)r->id,
              r->n_tokens);
}

static void admit(struct scheduler *sch)
{
    struct kv_cache *kv = &sch->s->kv;
    int bs = kv->block_size;
    struct err err = {0};
    while (sch->n_running < sch->o.max_seqs && sch->wait_head) {
        struct sched_req *r = sch->wait_head;
        /* never the last token: its logits are needed, so it must be computed */
        /* prompt log-probabilities need every prompt row's logits: no cached rows */
        int n_match = pc_on(sch) && !r->p.prompt_logprobs
                          ? prefix_cache_match(&sch->pc, r->tokens, (r->n_tokens - 1) / bs, sch->match)
                          : 0;
        /* pools (data-parallel attention): a sequence's blocks are one rank's, the prefix's first
         * block's pool; a cached path whose later blocks another rank wrote is cut there */
        for (int i = 1; kv->n_pools > 1 && i < n_match; i++)
            if (kv_block_pool(kv, sch->match[i]) != kv_block_pool(kv, sch->match[0]))
                n_match = i;
        const int pool = seq_pool(kv, &r->seq, sch->match, n_match);
        int need = blocks_for(r->n_tokens, bs) - n_match;
        int avail = kv_cache_pool_free(kv, pool);
        if (pc_on(sch)) {
            avail += prefix_cache_evictable_pool(&sch->pc, kv->n_pools > 1 ? pool : -1);
            for (int i = 0; i < n_match; i++) /* ours once shared: not evictable */
                avail -= kv->refs[sch->match[i]] == 1;
        }
        /* keep a block per running sequence (of the pool) for its decode growth */
        int growing = sch->n_running;
        if (kv->n_pools > 1) {
            growing = 0;
            for (int i = 0; i < sch->n_running; i++)
                growing += sch->running[i]->seq.attn_rank == pool + 1;
        }
        if (sch->n_running > 0 && need + growing > avail)
            break;
        waiting_pop(sch);
        if (need > avail) { /* cannot happen: submit checked the size against the whole cache */
            snprintf(err.msg, sizeof err.msg, "needs %d KV blocks, only %d exist", need, avail);
            req_finish(sch, r, SCHED_FINISH_ERROR, err.msg);
            continue;
        }
        enum status st = kv_seq_share(&r->seq, kv, sch->match, n_match, &err);
        if (!st) {
            r->n_computed = r->seq.n_tokens = n_match * bs;
            if (kv->n_pools > 1)
                r->seq.attn_rank = pool + 1;
            ensure_free(sch, pool, need);
            st = kv_seq_reserve(&r->seq, kv, r->n_tokens, &err);
        }
        if (!st && r->admit_order == 0 && !(st = sampler_init(&r->smp, &r->p.sampling, sch->vocab, &err)))
            sampler_observe_prompt(&r->smp, r->prompt, r->n_prompt);
        if (!st && r->admit_order == 0 && r->p.grammar && !(r->tm = calloc(1, sizeof *r->tm)))
            st = err_set(&err, STATUS_NOMEM, "out of memory for the grammar's state");
        if (!st && r->admit_order == 0 && r->p.grammar)
            st = token_mask_init(r->tm, r->p.grammar_vocab, r->p.grammar, &err);
        if (st) {
            req_finish(sch, r, SCHED_FINISH_ERROR, err.msg);
            continue;
        }
        if (r->admit_order == 0) {
            pthread_mutex_lock(&sch->mu);
            sch->n_queued--;
            pthread_mutex_unlock(&sch->mu);
        }
        r->admit_order = ++sch->admit_counter;
        sch->counters.prompt_tokens_cached += (uint64_t)r->n_computed;
        pthread_mutex_lock(&r->mu);
        r->n_cached = r->n_computed;
        pthread_mutex_unlock(&r->mu);
        sch->running[sch->n_running++] = r;
    }
}

/* Appends rows tokens[n_computed .. n_computed + rows) of r to the batch. */
static void batch_add(struct scheduler *sch, struct sched_req *r, int rows, int *nt, int *ns, int *nl)
{
    if (!r->in_batch) {
        r->in_batch = true;
        r->batch_seq = *ns;
        r->batch_rows = 0;
        r->logit_index = -1;
        r->logit_first = -1;
        sch->b_seqs[*ns] = &r->seq;
        sch->b_reqs[*ns] = r;
        (*ns)++;
    }
    const bool every = r->p.prompt_logprobs && r->n_computed < r->n_prompt; /* a prompt row's logits score the next */
    if (every && r->logit_first < 0)
        r->logit_first = *nl;
    for (int i = 0; i < rows; i++) {
        int p = r->n_computed + r->batch_rows + i;
        sch->b_tokens[*nt] = r->tokens[p];
        sch->b_pos[*nt] = p;
        sch->b_seq[*nt] = r->batch_seq;
        (*nt)++;
        if (every && (i < rows - 1 || r->n_computed + r->batch_rows + rows < r->n_tokens))
            sch->b_logit_rows[(*nl)++] = *nt - 1;
    }
    r->batch_rows += rows;
    if (r->n_computed + r->batch_rows == r->n_tokens) {
        r->logit_index = *nl;
        sch->b_logit_rows[(*nl)++] = *nt - 1;
    }
}

/* Decode rows first (they are latency), then prompt chunks up to the budget. */
static void build_batch(struct scheduler *sch, int *nt, int *ns, int *nl)
{
    struct kv_cache *kv = &sch->s->kv;
    int T = sch->s->fwd.max_tokens;
    struct err err = {0};
    *nt = *ns = *nl = 0;
    for (int i = 0; i < sch->n_running; i++) {
        struct sched_req *r = sch->running[i];
        if (r->n_tokens - r->n_computed != 1)
            continue;
        bool dropped = false;
        while (r->seq.n_blocks * kv->block_size <= r->n_computed) {
            const int pool = seq_pool(kv, &r->seq, NULL, 0);
            if (ensure_free(sch, pool, 1)) {
                if (kv_seq_reserve(&r->seq, kv, r->n_computed + 1, &err))
                    PANIC("scheduler: %s", err.msg); /* a block was free */
                break;
            }
            /* the newest sequence is at the end and not in the batch yet (we go oldest first); with
             * pools, the newest of r's pool (another's blocks would not help) */
            int v = sch->n_running - 1;
            while (kv->n_pools > 1 && v > 0 && sch->running[v] != r && sch->running[v]->seq.attn_rank != pool + 1)
                v--;
            struct sched_req *victim = sch->running[v];
            preempt(sch, victim);
            if (victim == r) {
                dropped = true;
                break;
            }
        }
        if (!dropped)
            batch_add(sch, r, 1, nt, ns, nl);
    }
    for (int i = 0; i < sch->n_running && *nt < T; i++) {
        struct sched_req *r = sch->running[i];
        int rem = r->n_tokens - r->n_computed;
        if (rem < 2)
            continue;
        int chunk = rem < T - *nt ? rem : T - *nt;
        if (r->p.prompt_logprobs) { /* every row a logits row: the host buffer holds max_seqs of them */
            chunk = chunk < sch->o.max_seqs - *nl ? chunk : sch->o.max_seqs - *nl;
            if (chunk < 1)
                continue;
        } else if (chunk == rem && *nl >= sch->o.max_seqs) {
            chunk = rem - 1; /* the prompt's last row wants a logits row, and prompt scoring took them all */
        }
        ASSERT(r->seq.n_blocks * kv->block_size >= r->n_tokens); /* reserved at admission */
        batch_add(sch, r, chunk, nt, ns, nl);
        sch->counters.prompt_tokens_computed += (uint64_t)chunk;
    }
}

static bool is_eos(const struct model_desc *d, int32_t tok)
{
    for (int i = 0; i < d->n_eos; i++)
        if (d->eos_ids[i] == tok)
            return true;
    return false;
}

static bool is_stop_id(const struct sched_params *p, int32_t tok)
{
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == tok)
            return true;
    return false;
}

/* r's logit processors as edits for the backend's draw (sampler_edits), and before min_tokens the
 * ids that would end the request at -inf, into out[0 .. cap); -1 when they do not fit. */
static int row_edits(const struct scheduler *sch, const struct sched_req *r, struct logit_edit *out, int cap)
{
    int n = sampler_edits(&r->smp, out, cap);
    if (n < 0 || generated(r) >= r->p.min_new)
        return n;
    const struct model_desc *d = &sch->s->desc;
    for (int i = 0; i < d->n_eos + r->p.n_stop_ids; i++) {
        const int32_t id = i < d->n_eos ? d->eos_ids[i] : r->p.stop_ids[i - d->n_eos];
        if (id < 0 || id >= sch->vocab)
            continue;
        struct logit_edit *e = sampler_edit_slot(out, &n, cap, n, id);
        if (!e)
            return -1;
        e->post = -INFINITY;
    }
    return n;
}

/* Before min_tokens: the tokens that would end the request cannot be drawn. */
static void mask_enders(const struct scheduler *sch, const struct sched_req *r, float *row)
{
    if (generated(r) >= r->p.min_new)
        return;
    const struct model_desc *d = &sch->s->desc;
    for (int i = 0; i < d->n_eos; i++)
        if (d->eos_ids[i] >= 0 && d->eos_ids[i] < sch->vocab)
            row[d->eos_ids[i]] = -INFINITY;
    for (int i = 0; i < r->p.n_stop_ids; i++)
        if (r->p.stop_ids[i] >= 0 && r->p.stop_ids[i] < sch->vocab)
            row[r->p.stop_ids[i]] = -INFINITY;
}

/* Hands r's newest token to its readers: at once, or (sch->defer) after the next step's pass is
 * launched, so that the locks and wake-ups of a step's tokens overlap the device's work instead of
 * delaying the next launch. A queued request keeps a reference until publish_flush. */
static void publish_token(struct scheduler *sch, struct sched_req *r)
{
    if (!sch->defer) {
        pthread_mutex_lock(&r->mu);
        publish_locked(r);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    ASSERT(sch->n_pub < sch->o.max_seqs); /* one token a request a step, flushed every step */
    atomic_fetch_add(&r->refs, 1);
    sch->pub[sch->n_pub++] = r;
}

static void publish_flush(struct scheduler *sch)
{
    for (int i = 0; i < sch->n_pub; i++) {
        struct sched_req *r = sch->pub[i];
        pthread_mutex_lock(&r->mu);
        publish_locked(r); /* nothing left when req_finish published it already */
        pthread_mutex_unlock(&r->mu);
        sched_req_put(r);
    }
    sch->n_pub = 0;
}

/* r's grammar mask for this step: computed now, or taken from grammar_masks (used once). */
static enum status grammar_mask(struct sched_req *r, struct err *err)
{
    enum status st = r->tm_ready ? r->tm_status : token_mask_compute(r->tm, &r->tm_err);
    r->tm_ready = false;
    if (st)
        *err = r->tm_err;
    return st;
}

/* The grammar masks of this step's sampled rows, made while the device runs the pass, in
 * parallel: each request has its own matcher and scratch and the vocabulary is read-only; one
 * after another they would add up at batch 64. Where the backend draws (dev), each mask goes with
 * its row (masks, the pass's forward_batch.masks): the draw happens beside the logits. */
static void grammar_masks(struct scheduler *sch, int ns, bool dev, const uint32_t **masks)
{
    int n = 0;
    for (int j = 0; j < ns; j++)
        n += sch->b_reqs[j]->tm && sch->b_reqs[j]->logit_index >= 0;
    if (n == 0)
        return;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int j = 0; j < ns; j++) {
        struct sched_req *r = sch->b_reqs[j];
        if (r->tm && r->logit_index >= 0 && r->p.max_new > 0) {
            r->tm_status = token_mask_compute(r->tm, &r->tm_err);
            r->tm_ready = true;
            if (dev && !r->tm_status && !r->host_draw)
                masks[r->logit_index] = r->tm->bits;
        }
    }
}

/* Publishes r's next token: drawn by the backend (drawn >= 0), else sampled here from its logits
 * row. row is the logits row wherever r wants log-probabilities. */
static void sample_next(struct scheduler *sch, struct sched_req *r, float *row, int32_t drawn)
{
    struct err err = {0};
    int32_t tok = drawn;
    if (drawn < 0) {
        mask_enders(sch, r, row);
        if (r->tm && !grammar_mask(r, &err)) /* only what keeps the grammar alive */
            token_mask_apply(r->tm, row);
        sampler_apply(&r->smp, row);
    } else if (r->tm && !grammar_mask(r, &err) && row && sch->b_top_k < 0) {
        token_mask_apply(r->tm, row); /* drawn under the mask on the device: log-probabilities under it too */
    }
    if (err.msg[0] || (drawn < 0 && (r->tm ? sampler_sample_masked(&r->smp, row, r->tm->bits, &tok, &err)
                                                   : sampler_sample(&r->smp, row, &tok, &err)))) {
        running_remove(sch, r);
        req_finish(sch, r, SCHED_FINISH_ERROR, err.msg);
        return;
    }
    if (r->tm && token_mask_accept(r->tm, tok, &err)) {
        running_remove(sch, r);
        req_finish(sch, r, SCHED_FINISH_ERROR, err.msg);
        return;
    }
    if (((!r->p.ignore_eos || r->tm) && is_eos(&sch->s->desc, tok)) || is_stop_id(&r->p, tok)) {
        running_remove(sch, r);
        req_finish(sch, r, SCHED_FINISH_STOP, NULL);
        return;
    }
    sampler_observe(&r->smp, tok);
    r->tokens[r->n_tokens++] = tok;
    /* slot i is past n_out: no reader looks at it until publish_token's lock makes it visible */
    const int i = generated(r) - 1;
    r->out_ids[i] = tok;
    r->out_time[i] = timer_now();
    if (r->out_logprob) {
        const int k = r->p.top_logprobs;
        if (!r->host_draw && sch->b_top_k >= 0) { /* the backend's, beside the logits: the first k of its b_top_k */
            const size_t at = (size_t)r->logit_index * (size_t)sch->b_top_k;
            r->out_logprob[i] = sch->b_lp[r->logit_index];
            if (k) {
                memcpy(r->out_top_ids + (size_t)i * k, sch->b_top_ids + at, (size_t)k * sizeof *r->out_top_ids);
                memcpy(r->out_top_lp + (size_t)i * k, sch->b_top_lp + at, (size_t)k * sizeof *r->out_top_lp);
            }
        } else {
            r->out_logprob[i] = logprobs_row(row, sch->vocab, NULL, tok, k, k ? r->out_top_ids + (size_t)i * k : NULL,
                                             k ? r->out_top_lp + (size_t)i * k : NULL);
        }
    }
    publish_token(sch, r);
    sch->counters.generated_tokens++;
    if (r->tm && token_mask_done(r->tm)) { /* the grammar is complete and nothing can follow */
        running_remove(sch, r);
        req_finish(sch, r, SCHED_FINISH_STOP, NULL);
    } else if (generated(r) == r->p.max_new || r->n_tokens >= sch->o.max_context) {
        running_remove(sch, r);
        req_finish(sch, r, SCHED_FINISH_LENGTH, NULL);
    }
}

/* The batch's rows of r (from logit_first) score the prompt tokens after them: log p and the
 * likeliest alternatives, before any processor touches the rows. */
static void prompt_logprobs_take(struct scheduler *sch, struct sched_req *r)
{
    const int k = r->prompt_k;
    pthread_mutex_lock(&r->mu);
    for (int j = 0; j < r->batch_rows; j++) {
        const int p = r->n_computed + j; /* this row's position */
        if (p + 1 >= r->n_prompt)
            break;
        const float *row = sch->logits + (size_t)(r->logit_first + j) * (size_t)sch->vocab;
        r->prompt_lp[p + 1] = logprobs_row(row, sch->vocab, NULL, r->tokens[p + 1], k,
                                           k ? r->prompt_top_ids + (size_t)(p + 1) * k : NULL,
                                           k ? r->prompt_top_lp + (size_t)(p + 1) * k : NULL);
        const float x = row[r->tokens[p + 1]];
        int32_t rank = 1;
        for (int i = 0; i < sch->vocab; i++)
            rank += row[i] > x;
        r->prompt_rank[p + 1] = rank;
    }
    pthread_mutex_unlock(&r->mu);
}

static void publish_stats(struct scheduler *sch)
{
    struct kv_cache *kv = &sch->s->kv;
    int cached = pc_on(sch) ? prefix_cache_evictable(&sch->pc) : 0;
    pthread_mutex_lock(&sch->mu);
    sch->stats = sch->counters;
    sch->stats.n_waiting = sch->n_waiting + sch->n_incoming;
    sch->stats.n_running = sch->n_running;
    sch->stats.kv_blocks_total = kv->n_blocks;
    sch->stats.kv_blocks_cached = cached;
    sch->stats.kv_blocks_used = kv->n_blocks - kv->n_free - cached;
    pthread_mutex_unlock(&sch->mu);
}

bool scheduler_step(struct scheduler *sch)
{
    const double t_start = timer_now();
    take_incoming(sch);
    end_cancelled(sch);
    admit(sch);
    int nt, ns, nl;
    build_batch(sch, &nt, &ns, &nl);
    if (nt == 0) {
        publish_flush(sch);
        publish_stats(sch);
        return false;
    }
    struct forward_batch b = {.n_tokens = nt, .tokens = sch->b_tokens, .pos = sch->b_pos, .seq = sch->b_seq,
                              .n_seqs = ns, .seqs = sch->b_seqs, .n_logits = nl, .logit_rows = sch->b_logit_rows};
    /* where the backend samples, the draws happen beside the logits and only the ids come back
     * (the logits too only when a request wants log-probabilities): each row's own temperature,
     * top-p, top-k and the next uniform of its seeded stream, as the host sampler would take it */
    const bool dev = nl > 0 && forward_can_sample(&sch->s->fwd);
    bool want_rows = !dev;
    for (int i = 0; dev && i < nl; i++) { /* rows only read on the host (prompt log-probabilities): greedy */
        sch->b_sample[i] = (struct sample_row){.top_p = 1.0f};
        sch->b_masks[i] = NULL; /* grammar_masks fills them while the pass runs */
    }
    for (int j = 0; j < ns; j++)
        want_rows |= sch->b_reqs[j]->logit_first >= 0;
    /* each drawn row's logit processors go with it as edits (rows in logit order), unless they do
     * not fit what the pass can carry: that row is drawn here */
    const int edit_cap = forward_edit_capacity(&sch->s->fwd);
    /* and where the backend computes log-probabilities, those of its rows come back as figures */
    const bool dev_lp = dev && forward_can_logprobs(&sch->s->fwd);
    int top_k = -1;
    for (int j = 0; dev_lp && j < ns; j++)
        if (sch->b_reqs[j]->logit_index >= 0 && sch->b_reqs[j]->out_logprob)
            top_k = 0; /* raised below to the largest top_logprobs of a device-drawn row */
    int filled = 0;
    sch->b_edit_start[0] = 0;
    for (int j = 0; j < ns; j++) {
        struct sched_req *r = sch->b_reqs[j];
        if (r->logit_index < 0)
            continue;
        const struct sampler_params *sp = &r->p.sampling;
        const int li = r->logit_index;
        ASSERT(li >= filled); /* batch_add numbers a request's rows after the previous request's */
        for (; filled < li; filled++) /* rows without edits (prompt log-probabilities) */
            sch->b_edit_start[filled + 1] = sch->b_edit_start[filled];
        int ne = 0;
        r->host_draw = !dev;
        if (dev && (sampler_has_edits(&r->smp) || generated(r) < r->p.min_new)) {
            const int at = sch->b_edit_start[li];
            ne = edit_cap ? row_edits(sch, r, sch->b_edits + at, edit_cap - at) : -1;
            r->host_draw = ne < 0;
            ne = ne < 0 ? 0 : ne;
        }
        sch->b_edit_start[li + 1] = sch->b_edit_start[li] + ne;
        filled = li + 1;
        if (!dev)
            continue;
        /* drawn here from its row: greedy on the device, no uniform taken for its draw */
        const bool host = r->host_draw;
        sch->b_sample[li] = (struct sample_row){
            .temperature = host ? 0.0f : sp->temperature, .top_p = sp->top_p, .top_k = sp->top_k,
            .min_p = sp->min_p, .u = !host && sp->temperature > 0 ? sampler_uniform(&r->smp) : 0.0f};
        want_rows |= host || (r->out_logprob && !dev_lp);
        if (dev_lp && !host && r->out_logprob && r->p.top_logprobs > top_k)
            top_k = r->p.top_logprobs;
    }
    for (; filled < nl; filled++)
        sch->b_edit_start[filled + 1] = sch->b_edit_start[filled];
    if (dev)
        b.tokens_out = sch->b_next, b.sample = sch->b_sample, b.masks = sch->b_masks;
    if (dev && sch->b_edit_start[nl] > 0)
        b.edit_start = sch->b_edit_start, b.edits = sch->b_edits;
    sch->b_top_k = top_k;
    if (top_k >= 0)
        b.lp_out = sch->b_lp, b.top_ids_out = sch->b_top_ids, b.top_lp_out = sch->b_top_lp, b.logprob_k = top_k;
    struct err err = {0};
    const double t_fwd = timer_now();
    enum status st = forward_launch(&sch->s->fwd, &b, &err);
    const double t_launched = timer_now();
    publish_flush(sch); /* the last step's tokens, while the device runs this one */
    if (!st) /* and this step's grammar masks: they need only the tokens accepted so far */
        grammar_masks(sch, ns, dev, sch->b_masks);
    const double t_wait = timer_now();
    if (!st)
        st = forward_finish(&sch->s->fwd, want_rows ? sch->logits : NULL, &err);
    const double t_fwd_end = timer_now();
    int bs = sch->s->kv.block_size;
    for (int j = 0; j < ns; j++) {
        struct sched_req *r = sch->b_reqs[j];
        r->in_batch = false;
        if (st) {
            running_remove(sch, r);
            req_finish(sch, r, SCHED_FINISH_ERROR, err.msg);
            continue;
        }
        if (r->logit_first >= 0) /* row p's logits score prompt token p + 1 */
            prompt_logprobs_take(sch, r);
        r->n_computed += r->batch_rows;
        r->seq.n_tokens = r->n_computed;
        /* the prompt's blocks become findable as soon as they are computed, so
         * requests that arrive meanwhile with the same prefix share them */
        if (pc_on(sch) && r->n_computed >= r->n_prompt && r->n_prompt_blocks_cached == 0 && r->n_prompt >= bs) {
            prefix_cache_insert(&sch->pc, r->tokens, r->n_prompt / bs, r->seq.blocks);
            r->n_prompt_blocks_cached = r->n_prompt / bs;
        }
        if (r->logit_index >= 0 && r->p.max_new == 0) { /* the prompt scored, nothing to generate */
            running_remove(sch, r);
            req_finish(sch, r, SCHED_FINISH_LENGTH, NULL);
        } else if (r->logit_index >= 0) {
            sample_next(sch, r, want_rows ? sch->logits + (size_t)r->logit_index * (size_t)sch->vocab : NULL,
                        r->host_draw ? -1 : sch->b_next[r->logit_index]);
        }
    }
    if (st)
        LOG_ERROR("scheduler: forward of %d tokens failed: %s", nt, err.msg);
    sch->counters.n_steps++;
    const double fwd = (t_launched - t_fwd) + (t_fwd_end - t_wait);
    sch->counters.forward_seconds += fwd;
    sch->counters.host_seconds += timer_now() - t_start - fwd;
    publish_stats(sch);
    return true;
}

static void *scheduler_main(void *arg)
{
    struct scheduler *sch = arg;
    for (;;) {
        pthread_mutex_lock(&sch->mu);
        bool stop = sch->stopping;
        pthread_mutex_unlock(&sch->mu);
        if (stop)
            break;
        if (scheduler_step(sch))
            continue;
        /* idle: sleep until a submit, a cancel or stop; wake now and then for deadlines */
        pthread_mutex_lock(&sch->mu);
        if (!sch->stopping && !sch->in_head && !sch->wake) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += 100 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&sch->cv, &sch->mu, &ts);
        }
        pthread_mutex_unlock(&sch->mu);
    }
    return NULL;
}

enum status scheduler_start(struct scheduler *sch, struct err *err)
{
    int rc = pthread_create(&sch->thread, NULL, scheduler_main, sch);
    if (rc)
        return err_set(err, STATUS_IO, "scheduler: cannot start its thread: %s", strerror(rc));
    sch->started = true;
    return STATUS_OK;
}

/* Ends every request still known (caller: the scheduler thread, or after it). */
static void drain(struct scheduler *sch)
{
    publish_flush(sch);
    take_incoming(sch);
    while (sch->n_running > 0) {
        struct sched_req *r = sch->running[sch->n_running - 1];
        running_remove(sch, r);
        req_finish(sch, r, SCHED_FINISH_CANCELLED, "the server is shutting down");
    }
    while (sch->wait_head)
        req_finish(sch, waiting_pop(sch), SCHED_FINISH_CANCELLED, "the server is shutting down");
    publish_stats(sch);
}

void scheduler_stop(struct scheduler *sch)
{
    if (!sch->s)
        return;
    pthread_mutex_lock(&sch->mu);
    sch->stopping = true;
    pthread_cond_broadcast(&sch->cv);
    pthread_mutex_unlock(&sch->mu);
    if (sch->started) {
        pthread_join(sch->thread, NULL);
        sch->started = false;
    }
    drain(sch);
}

void scheduler_free(struct scheduler *sch)
{
    if (!sch->s)
        return;
    if (sch->running) /* fully initialised */
        scheduler_stop(sch);
    if (pc_on(sch))
        prefix_cache_free(&sch->pc);
    pthread_mutex_destroy(&sch->mu);
    pthread_cond_destroy(&sch->cv);
    free(sch->running);
    free(sch->b_tokens);
    free(sch->b_pos);
    free(sch->b_seq);
    free(sch->b_logit_rows);
    free(sch->b_sample);
    free(sch->b_masks);
    free(sch->b_edit_start);
    free(sch->b_edits);
    free(sch->b_lp);
    free(sch->b_top_ids);
    free(sch->b_top_lp);
    free(sch->b_next);
    free(sch->b_seqs);
    free(sch->b_reqs);
    free(sch->pub);
    free(sch->logits);
    free(sch->match);
    memset(sch, 0, sizeof *sch);
}

enum status scheduler_submit(struct scheduler *sch, struct sched_req *r, struct err *err)
{
    int bs = sch->s->kv.block_size;
    long total = (long)r->n_prompt + r->p.max_new;
    if (total > sch->o.max_context)
        return err_set(err, STATUS_INVALID,
                       "%d prompt tokens + %d new tokens exceed the context of %d tokens", r->n_prompt,
                       r->p.max_new, sch->o.max_context);
    if (blocks_for((int)total, bs) > sch->s->kv.pool_blocks)
        return err_set(err, STATUS_INVALID, "%ld tokens need more KV blocks than the cache has (%d)", total,
                       sch->s->kv.pool_blocks);
    const struct token_vocab *gv = r->p.grammar_vocab;
    if (gv && (gv->n_logits > gv->vocab ? gv->n_logits : gv->vocab) < sch->vocab) /* masks cover every row */
        return err_set(err, STATUS_INVALID, "the grammar's vocabulary (%d ids) is smaller than the model's rows (%d)",
                       gv->n_logits > gv->vocab ? gv->n_logits : gv->vocab, sch->vocab);
    pthread_mutex_lock(&sch->mu);
    if (sch->stopping) {
        pthread_mutex_unlock(&sch->mu);
        return err_set(err, STATUS_UNSUPPORTED, "the server is shutting down");
    }
    if (sch->n_queued >= sch->o.max_queue) {
        int n = sch->n_queued;
        pthread_mutex_unlock(&sch->mu);
        return err_set(err, STATUS_NOMEM, "the queue is full (%d requests waiting)", n);
    }
    r->id = ++sch->next_id;
    r->t_submit = timer_now();
    atomic_fetch_add(&r->refs, 1);
    r->next = NULL;
    if (sch->in_tail)
        sch->in_tail->next = r;
    else
        sch->in_head = r;
    sch->in_tail = r;
    sch->n_incoming++;
    sch->n_queued++;
    pthread_cond_signal(&sch->cv);
    pthread_mutex_unlock(&sch->mu);
    return STATUS_OK;
}

void scheduler_cancel(struct scheduler *sch, struct sched_req *r)
{
    atomic_store(&r->cancel, true);
    pthread_mutex_lock(&sch->mu);
    sch->wake = true;
    pthread_cond_signal(&sch->cv);
    pthread_mutex_unlock(&sch->mu);
}

void scheduler_get_stats(struct scheduler *sch, struct scheduler_stats *out)
{
    pthread_mutex_lock(&sch->mu);
    *out = sch->stats;
    pthread_mutex_unlock(&sch->mu);
}
