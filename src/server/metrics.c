/* metrics.c — see metrics.h. Names carry the moeserve_ prefix and the units
 * Prometheus conventions ask for (_seconds, _total). */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Latency buckets from 1 ms (a fast GPU's inter-token gap) to 60 s (a long queue). */
static const double LATENCY_BOUNDS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25,
                                        0.5,   0.75,   1.0,   2.5,  5.0,   10.0, 20.0,  40.0, 60.0};
static const double E2E_BOUNDS[] = {0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0};
/* tokens per request, 1 to 1M in 1-2-5 steps */
static const double TOKEN_BOUNDS[] = {1,    2,    5,     10,    20,    50,     100,    200,    500,    1000,   2000,
                                      5000, 10000, 20000, 50000, 100000, 200000, 500000, 1000000};

static const char *const EP_NAMES[METRICS_EP_COUNT] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/v1/models/{id}",
    "/tokenize",       "/detokenize",          "/version",   "/",       "/v1/responses", "other"};
static const char *const FINISH_NAMES[6] = {"running", "stop", "length", "cancelled", "timeout", "error"};

void metrics_init(struct metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft.bounds = m->itl.bounds = LATENCY_BOUNDS;
    m->ttft.n_bounds = m->itl.n_bounds = (int)(sizeof LATENCY_BOUNDS / sizeof LATENCY_BOUNDS[0]);
    m->e2e.bounds = m->decode.bounds = E2E_BOUNDS;
    m->e2e.n_bounds = m->decode.n_bounds = (int)(sizeof E2E_BOUNDS / sizeof E2E_BOUNDS[0]);
    m->n_prompt.bounds = m->n_gen.bounds = TOKEN_BOUNDS;
    m->n_prompt.n_bounds = m->n_gen.n_bounds = (int)(sizeof TOKEN_BOUNDS / sizeof TOKEN_BOUNDS[0]);
    snprintf(m->model_name, sizeof m->model_name, "model");
}

void metrics_set_model(struct metrics *m, const char *model_name)
{
    /* a label value: quotes, backslashes and newlines would need escapes; names do not have them */
    size_t j = 0;
    for (size_t i = 0; model_name && model_name[i] && j + 1 < sizeof m->model_name; i++)
        if (model_name[i] != '"' && model_name[i] != '\\' && model_name[i] != '\n')
            m->model_name[j++] = model_name[i];
    m->model_name[j] = 0;
}

void metrics_free(struct metrics *m)
{
    pthread_mutex_destroy(&m->mu);
    memset(m, 0, sizeof *m);
}

void metrics_count_request(struct metrics *m, enum metrics_endpoint ep, int http_status)
{
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < METRICS_MAX_CODES; i++) {
        if (m->codes[ep][i] == 0)
            m->codes[ep][i] = http_status;
        if (m->codes[ep][i] == http_status) {
            m->requests[ep][i]++;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

static void hist_observe(struct metrics_hist *h, double v)
{
    int b = 0;
    while (b < h->n_bounds && v > h->bounds[b])
        b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
}

void metrics_observe_generation(struct metrics *m, int n_prompt, int n_out, double t_submit,
                                const double *out_time, double t_end, enum sched_finish finish)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)n_prompt;
    m->generation_tokens += (uint64_t)n_out;
    if ((unsigned)finish < 6)
        m->finished[finish]++;
    if (n_out > 0)
        hist_observe(&m->ttft, out_time[0] - t_submit);
    for (int i = 1; i < n_out; i++)
        hist_observe(&m->itl, out_time[i] - out_time[i - 1]);
    hist_observe(&m->e2e, t_end - t_submit);
    if (n_out > 0)
        hist_observe(&m->decode, t_end - out_time[0]);
    hist_observe(&m->n_prompt, n_prompt);
    hist_observe(&m->n_gen, n_out);
    pthread_mutex_unlock(&m->mu);
}

struct buf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
    for (int attempt = 0; attempt < 2 && !b->oom; attempt++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k >= 0 && b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + (size_t)k + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* A histogram; label: "" or `key="value",` put before le (and alone, without its comma, on _sum
 * and _count). */
static void put_hist_l(struct buf *b, const char *name, const char *help, const char *label,
                       const struct metrics_hist *h)
{
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, label, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    size_t ln = strlen(label);
    put(b, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, label, (unsigned long long)cum);
    put(b, "%s_sum%s%.*s%s %.6f\n%s_count%s%.*s%s %llu\n", name, ln ? "{" : "", (int)(ln ? ln - 1 : 0), label,
        ln ? "}" : "", h->sum, name, ln ? "{" : "", (int)(ln ? ln - 1 : 0), label, ln ? "}" : "",
        (unsigned long long)h->count);
}

static void put_hist(struct buf *b, const char *name, const char *help, const struct metrics_hist *h)
{
    put_hist_l(b, name, help, "", h);
}

static void put_gauge(struct buf *b, const char *name, const char *help, const char *type, double v)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* One sample with the model_name label (vLLM's series). */
static void put_vllm(struct buf *b, const char *model, const char *name, const char *help, const char *type,
                     double v)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=\"%s\"} %.17g\n", name, help, name, type, name, model, v);
}

/* The same figures under vLLM's names and labels, for the dashboards, autoscalers and gateways
 * built on them (vLLM V1's series; its "vllm:" prefix is part of the metric name). */
static void put_vllm_series(struct buf *b, const struct metrics *m, const struct scheduler_stats *st)
{
    const char *mn = m->model_name;
    char label[160];
    snprintf(label, sizeof label, "model_name=\"%s\",", mn);
    put_vllm(b, mn, "vllm:num_requests_running", "Requests in the running batch.", "gauge", st->n_running);
    put_vllm(b, mn, "vllm:num_requests_waiting", "Requests waiting for admission.", "gauge", st->n_waiting);
    put_vllm(b, mn, "vllm:kv_cache_usage_perc", "KV cache usage, 0 to 1 (1: all blocks held).", "gauge",
             st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
    put_vllm(b, mn, "vllm:num_preemptions_total", "Preemptions (KV blocks taken back).", "counter",
             (double)st->n_preemptions);
    put_vllm(b, mn, "vllm:prompt_tokens_total", "Prompt tokens of finished requests.", "counter",
             (double)m->prompt_tokens);
    put_vllm(b, mn, "vllm:generation_tokens_total", "Generated tokens of finished requests.", "counter",
             (double)m->generation_tokens);
    put_vllm(b, mn, "vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", "counter",
             (double)(st->prompt_tokens_computed + st->prompt_tokens_cached));
    put_vllm(b, mn, "vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", "counter",
             (double)st->prompt_tokens_cached);
    put(b, "# HELP vllm:request_success_total Finished requests by reason.\n"
           "# TYPE vllm:request_success_total counter\n");
    for (int f = 1; f < 6; f++)
        put(b, "vllm:request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %llu\n", mn,
            FINISH_NAMES[f], (unsigned long long)m->finished[f]);
    put_hist_l(b, "vllm:time_to_first_token_seconds", "From arrival to the first token.", label, &m->ttft);
    put_hist_l(b, "vllm:inter_token_latency_seconds", "Between consecutive tokens.", label, &m->itl);
    put_hist_l(b, "vllm:time_per_output_token_seconds", "Between consecutive tokens.", label, &m->itl);
    put_hist_l(b, "vllm:e2e_request_latency_seconds", "From arrival to the end of generation.", label, &m->e2e);
    put_hist_l(b, "vllm:request_decode_time_seconds", "From the first token to the end of generation.", label,
               &m->decode);
    put_hist_l(b, "vllm:request_prompt_tokens", "Prompt tokens per finished request.", label, &m->n_prompt);
    put_hist_l(b, "vllm:request_generation_tokens", "Generated tokens per finished request.", label, &m->n_gen);
}

enum status metrics_render(struct metrics *m, const struct scheduler_stats *st, long rss_bytes, char **out,
                           size_t *len, struct err *err)
{
    struct buf b = {0};
    pthread_mutex_lock(&m->mu);
    put(&b, "# HELP moeserve_requests_total HTTP requests by endpoint and status.\n"
            "# TYPE moeserve_requests_total counter\n");
    for (int e = 0; e < METRICS_EP_COUNT; e++)
        for (int i = 0; i < METRICS_MAX_CODES && m->codes[e][i]; i++)
            put(&b, "moeserve_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", EP_NAMES[e], m->codes[e][i],
                (unsigned long long)m->requests[e][i]);
    put(&b, "# HELP moeserve_generations_total Finished generations by reason.\n"
            "# TYPE moeserve_generations_total counter\n");
    for (int f = 1; f < 6; f++)
        put(&b, "moeserve_generations_total{reason=\"%s\"} %llu\n", FINISH_NAMES[f],
            (unsigned long long)m->finished[f]);
    put_gauge(&b, "moeserve_prompt_tokens_total", "Prompt tokens of finished generations.", "counter",
              (double)m->prompt_tokens);
    put_gauge(&b, "moeserve_generation_tokens_total", "Tokens generated by finished generations.", "counter",
              (double)m->generation_tokens);
    put_hist(&b, "moeserve_time_to_first_token_seconds", "From submission to the first generated token.", &m->ttft);
    put_hist(&b, "moeserve_inter_token_latency_seconds", "Between consecutive tokens of one request.", &m->itl);
    put_hist(&b, "moeserve_request_duration_seconds", "From submission to the end of generation.", &m->e2e);
    put_vllm_series(&b, m, st);
    pthread_mutex_unlock(&m->mu);
    put_gauge(&b, "moeserve_queue_depth", "Requests waiting for admission (preempted ones included).", "gauge",
              st->n_waiting);
    put_gauge(&b, "moeserve_running_requests", "Sequences in the running batch.", "gauge", st->n_running);
    put_gauge(&b, "moeserve_kv_blocks", "KV cache blocks.", "gauge", st->kv_blocks_total);
    put_gauge(&b, "moeserve_kv_blocks_used", "KV cache blocks held by requests.", "gauge", st->kv_blocks_used);
    put_gauge(&b, "moeserve_kv_blocks_cached", "KV cache blocks held only by the prefix cache.", "gauge",
              st->kv_blocks_cached);
    put_gauge(&b, "moeserve_kv_usage_ratio", "Fraction of KV blocks held by requests.", "gauge",
              st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
    put_gauge(&b, "moeserve_preemptions_total", "Sequences that lost their KV blocks and were requeued.", "counter",
              (double)st->n_preemptions);
    put_gauge(&b, "moeserve_prefill_tokens_total", "Prompt rows computed (recomputation included).", "counter",
              (double)st->prompt_tokens_computed);
    put_gauge(&b, "moeserve_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.",
              "counter", (double)st->prompt_tokens_cached);
    put_gauge(&b, "moeserve_engine_steps_total", "Forward passes of the scheduler.", "counter",
              (double)st->n_steps);
    put_gauge(&b, "moeserve_engine_forward_seconds_total",
              "Scheduler thread time in the forward (uploads, the pass, the ids back).", "counter", st->forward_seconds);
    put_gauge(&b, "moeserve_engine_host_seconds_total",
              "Scheduler thread time in steps outside the forward (batching, host sampling, publishing).", "counter",
              st->host_seconds);
    put_gauge(&b, "process_resident_memory_bytes", "Resident set size.", "gauge", (double)rss_bytes);
    if (b.oom) {
        free(b.p);
        return err_set(err, STATUS_NOMEM, "metrics: out of memory");
    }
    *out = b.p;
    *len = b.n;
    return STATUS_OK;
}
