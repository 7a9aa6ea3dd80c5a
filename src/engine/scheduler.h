/* scheduler.h — continuous batching of many requests over one model session.
 *
 * One scheduler thread owns the model session (its forward and KV cache), the
 * prefix cache and every running sequence. Other threads hand it requests
 * through a bounded, mutex-protected queue (scheduler_submit), read tokens as
 * they appear (sched_req's output fields, under the request's mutex, with a
 * condition variable signalled on every new token), and cancel
 * (scheduler_cancel). Each step builds ONE forward batch: one decode token for
 * every running sequence that has its prompt in the cache, then chunks of
 * prompts (prefill) up to the session's token budget; then it samples one
 * token per sequence whose last row was in the batch.
 *
 * KV memory: a request is admitted only when its whole prompt fits (free
 * blocks plus prefix-cache blocks that can be evicted); decode growth that
 * does not fit first evicts cached blocks, then preempts the most recently
 * admitted sequence (its blocks are freed, it goes back to the head of the
 * queue and is recomputed later from its prompt and the tokens it already
 * produced). A full cache therefore slows requests down, never fails them.
 * Cancellation and deadlines are checked at the start of every step; a
 * cancelled sequence's blocks are freed in that step.
 *
 * Sampling is per request (own seeded sampler), so a request's tokens do not
 * depend on which requests share its batches, as far as the backend's math
 * for one row does not depend on the other rows (see NOTES.md).
 *
 * Not here: text (tokenizing, detokenizing, stop strings: the server does
 * them on its connection threads and cancels when a stop string appears).
 *
 * defines: enum sched_finish, struct sched_params, struct sched_req, sched_req_create(),
 *          sched_req_put(), sched_req_finished(), struct scheduler_opts, struct scheduler_stats,
 *          struct scheduler, scheduler_init(), scheduler_free(), scheduler_start(),
 *          scheduler_stop(), scheduler_submit(), scheduler_cancel(), scheduler_step(),
 *          scheduler_get_stats(), SCHED_MAX_TOP_LOGPROBS
 */
#ifndef MOESERVE_ENGINE_SCHEDULER_H
#define MOESERVE_ENGINE_SCHEDULER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/model_session.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"

#define SCHED_MAX_TOP_LOGPROBS 20

enum sched_finish {
    SCHED_RUNNING = 0,
    SCHED_FINISH_STOP,      /* an end-of-sequence token (not counted in the output) */
    SCHED_FINISH_LENGTH,    /* max_new tokens, or the context is full */
    SCHED_FINISH_CANCELLED, /* scheduler_cancel(), or the scheduler stopped */
    SCHED_FINISH_TIMEOUT,   /* the deadline passed */
    SCHED_FINISH_ERROR,     /* the forward or the sampler failed: sched_req.error says why */
};

enum { SCHED_MAX_STOP_IDS = 64 };

struct sched_params {
    int max_new;                    /* tokens to generate, >= 1 */
    struct sampler_params sampling;
    bool ignore_eos;                /* keep going past end-of-sequence tokens */
    int min_new;                    /* min_tokens: end-of-sequence and stop ids are masked before this many */
    int n_stop_ids;
    int32_t stop_ids[SCHED_MAX_STOP_IDS]; /* stop_token_ids: end like end-of-sequence (not published) */
    bool prompt_logprobs;           /* log p of every prompt token after the first (echo + logprobs): the prompt is
                                       computed without the prefix cache, every row's logits read; max_new may be
                                       0 (score the prompt, generate nothing) */
    int top_logprobs;               /* -1: no log-probabilities; 0..SCHED_MAX_TOP_LOGPROBS alternatives */
    double deadline;                /* timer_now() time after which the request fails; 0 = none */
};

struct sched_req {
    /* Set by sched_req_create, read-only afterwards. */
    uint64_t id;
    int32_t *prompt;                /* (n_prompt) owned */
    int n_prompt;
    struct sched_params p;
    double t_submit;                /* timer_now() at scheduler_submit */

    /* Output: the scheduler thread writes under mu and broadcasts cv; readers lock mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_out;
    int32_t *out_ids;               /* (p.max_new) generated tokens (the eos token is not stored) */
    double *out_time;               /* (p.max_new) timer_now() when each was sampled */
    float *out_logprob;             /* (p.max_new) log p(token), NULL without logprobs */
    int32_t *out_top_ids;           /* (p.max_new, p.top_logprobs) most likely tokens, NULL without */
    float *out_top_lp;              /* (p.max_new, p.top_logprobs) their log-probabilities */
    float *prompt_lp;               /* (n_prompt) with p.prompt_logprobs: log p(prompt[i] | prompt[..i)), [0] NaN */
    int32_t *prompt_top_ids;        /* (n_prompt, p.top_logprobs) the likeliest at each prompt position, or NULL */
    float *prompt_top_lp;           /* (n_prompt, p.top_logprobs) */
    int n_cached;                   /* prompt tokens found in the prefix cache at admission */
    int n_preempted;                /* times this request lost its KV blocks */
    enum sched_finish finish;
    char error[256];                /* set with SCHED_FINISH_ERROR */

    atomic_bool cancel;             /* set by scheduler_cancel */
    atomic_int refs;                /* owner + scheduler; the last sched_req_put frees */

    /* Scheduler thread only. */
    struct sched_req *next;         /* in the incoming or waiting list */
    int32_t *tokens;                /* (n_prompt + p.max_new) prompt then generated tokens */
    int n_tokens;
    int n_computed;                 /* tokens whose K/V are in seq's blocks */
    int n_prompt_blocks_cached;     /* prompt blocks already offered to the prefix cache */
    struct kv_seq seq;
    struct sampler smp;             /* created at the first admission */
    uint64_t admit_order;           /* larger = admitted later (preempted first) */
    bool in_batch;                  /* has rows in the batch being built */
    int batch_seq;                  /* its index in the batch's seqs */
    int batch_rows;                 /* tokens in this batch */
    int logit_index;                /* row of the batch's logits, or -1 */
    int logit_first;                /* p.prompt_logprobs: the first of its rows' logits in the batch, or -1 */
};

/* A request with one reference (the caller's). Copies the prompt. */
enum status sched_req_create(struct sched_req **out, const int32_t *prompt, int n_prompt,
                             const struct sched_params *p, struct err *err);
/* Drops a reference; the last one frees the request. NULL is fine. */
void sched_req_put(struct sched_req *r);
/* Whether the request has finished (call with r->mu held). */
static inline bool sched_req_finished(const struct sched_req *r)
{
    return r->finish != SCHED_RUNNING;
}

struct scheduler_opts {
    int max_queue;          /* requests waiting for admission before submit refuses; default 256 */
    int max_seqs;           /* running sequences; default and most: the session's forward max_seqs */
    int max_context;        /* prompt + generated tokens of one request; default: the session's */
    bool no_prefix_cache;   /* turn the prefix cache off */
};

/* A snapshot, published after every step. */
struct scheduler_stats {
    int n_waiting;                  /* queued, preempted ones included */
    int n_running;
    int kv_blocks_total;
    int kv_blocks_used;             /* held by requests */
    int kv_blocks_cached;           /* held only by the prefix cache (free for the taking) */
    uint64_t n_steps;
    uint64_t n_preemptions;
    uint64_t prompt_tokens_computed; /* prefill rows run, recomputation included */
    uint64_t prompt_tokens_cached;   /* prompt tokens served from the prefix cache */
    uint64_t generated_tokens;
    /* Where the scheduler thread's steps spend their time (steps that ran a pass): in forward_run
     * (the uploads, the device's pass, the ids or logits back) and outside it (admission, the
     * batch, sampling parameters, host sampling, publishing tokens). The second is what preparing
     * the next step while the device runs the current one could hide. */
    double forward_seconds;
    double host_seconds;
};

struct scheduler {
    struct model_session *s;        /* borrowed; the scheduler thread's once started */
    struct scheduler_opts o;
    struct prefix_cache pc;
    int vocab;

    pthread_mutex_t mu;             /* guards the fields down to stats */
    pthread_cond_t cv;              /* work arrived, a cancel, or stop */
    struct sched_req *in_head, *in_tail; /* submitted, not yet seen by the scheduler thread */
    int n_incoming;                 /* length of the in list */
    int n_queued;                   /* submitted and never admitted (the bounded part) */
    bool stopping;
    bool wake;                      /* a cancel happened since the thread last looked */
    uint64_t next_id;
    struct scheduler_stats stats;

    /* Scheduler thread only. */
    struct sched_req *wait_head, *wait_tail;
    struct sched_req **running;     /* (o.max_seqs) in admission order */
    int n_running;
    int n_waiting;
    uint64_t admit_counter;
    struct scheduler_stats counters; /* the monotonic part of stats */
    /* one batch, T = forward max_tokens */
    int32_t *b_tokens, *b_pos, *b_seq; /* (T) */
    int32_t *b_logit_rows;          /* (max_seqs) */
    struct sample_row *b_sample;    /* (max_seqs) how each logit row is drawn, where the backend samples */
    int32_t *b_next;                /* (max_seqs) the backend's draws */
    struct kv_seq **b_seqs;         /* (max_seqs) */
    struct sched_req **b_reqs;      /* (max_seqs) request of each batch sequence */
    float *logits;                  /* (max_seqs, vocab) host */
    int32_t *match;                 /* (kv n_blocks) prefix-cache match scratch */

    pthread_t thread;
    bool started;
};

enum status scheduler_init(struct scheduler *sch, struct model_session *s, const struct scheduler_opts *o,
                           struct err *err);
/* Stops the thread if running and cancels whatever is left. Safe on a zeroed struct. */
void scheduler_free(struct scheduler *sch);
enum status scheduler_start(struct scheduler *sch, struct err *err);
/* Joins the thread; every unfinished request ends as SCHED_FINISH_CANCELLED. */
void scheduler_stop(struct scheduler *sch);

/* Queues r (the scheduler takes its own reference). STATUS_NOMEM "queue
 * full" when max_queue requests already wait; STATUS_INVALID when the request
 * cannot fit in the context or the KV cache at all. */
enum status scheduler_submit(struct scheduler *sch, struct sched_req *r, struct err *err);
/* Asks for r to end; its blocks are freed at the start of the next step. */
void scheduler_cancel(struct scheduler *sch, struct sched_req *r);
/* One step: admissions, one forward, sampling. Returns false when there was
 * nothing to run. For the thread and for tests that drive the scheduler
 * without one. */
bool scheduler_step(struct scheduler *sch);
void scheduler_get_stats(struct scheduler *sch, struct scheduler_stats *out);

#endif
