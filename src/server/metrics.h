/* metrics.h — the server's counters and latency histograms, in Prometheus text.
 *
 * Connection threads count requests (by endpoint and HTTP status) and, when a
 * generation ends, its tokens and latencies: time to first token (from
 * submission to the scheduler), inter-token latency (between consecutive
 * tokens of one request) and end-to-end time. Gauges of the engine (queue
 * depth, running sequences, KV blocks) come from a scheduler snapshot at
 * render time. One mutex; nothing is allocated after init except the
 * rendered text.
 *
 * defines: enum metrics_endpoint, struct metrics_hist, struct metrics, metrics_init(),
 *          metrics_free(), metrics_count_request(), metrics_observe_generation(),
 *          metrics_render()
 */
#ifndef MOESERVE_SERVER_METRICS_H
#define MOESERVE_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/scheduler.h"

enum metrics_endpoint {
    METRICS_EP_COMPLETIONS,
    METRICS_EP_CHAT,
    METRICS_EP_MODELS,
    METRICS_EP_HEALTH,
    METRICS_EP_METRICS,
    METRICS_EP_MODEL,      /* GET /v1/models/{id} */
    METRICS_EP_TOKENIZE,
    METRICS_EP_DETOKENIZE,
    METRICS_EP_VERSION,
    METRICS_EP_PAGE, /* GET /: the chat page */
    METRICS_EP_RESPONSES,
    METRICS_EP_OTHER,
    METRICS_EP_COUNT
};

#define METRICS_MAX_BUCKETS 24
#define METRICS_MAX_CODES 16 /* distinct HTTP statuses tracked per endpoint */

struct metrics_hist {
    const double *bounds;                /* (n_bounds) upper bounds in seconds, static */
    int n_bounds;
    uint64_t counts[METRICS_MAX_BUCKETS]; /* not cumulative; [n_bounds] is +Inf */
    double sum;
    uint64_t count;
};

struct metrics {
    pthread_mutex_t mu;
    uint64_t requests[METRICS_EP_COUNT][METRICS_MAX_CODES];
    int codes[METRICS_EP_COUNT][METRICS_MAX_CODES]; /* status of each requests[][] slot, 0 = unused */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t finished[6];                /* by enum sched_finish, plus stop strings under STOP */
    struct metrics_hist ttft, itl, e2e;
    struct metrics_hist decode;           /* first token to the end of generation */
    struct metrics_hist n_prompt, n_gen;  /* tokens per finished request */
    char model_name[128];                 /* the model_name label of the vllm: series */
};

void metrics_init(struct metrics *m);
/* The served model's name, the model_name label of the series under vLLM's names. */
void metrics_set_model(struct metrics *m, const char *model_name);
void metrics_free(struct metrics *m);
void metrics_count_request(struct metrics *m, enum metrics_endpoint ep, int http_status);
/* One finished generation: n_out tokens sampled at out_time[i], submitted at t_submit. */
void metrics_observe_generation(struct metrics *m, int n_prompt, int n_out, double t_submit,
                                const double *out_time, double t_end, enum sched_finish finish);
/* Prometheus text exposition (version 0.0.4); *out is malloc'ed. */
enum status metrics_render(struct metrics *m, const struct scheduler_stats *st, long rss_bytes, char **out,
                           size_t *len, struct err *err);

#endif
