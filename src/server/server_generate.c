/* server_generate.c — one completion or chat completion, on its connection's thread.
 *
 * Request -> prompt ids -> sched_req submitted -> wait for the first token
 * (errors before it still get a proper HTTP status) -> either wait for the
 * end and answer with one JSON body, or answer 200 with an event stream whose
 * reader writes one "data: {chunk}" event per generated token, a last chunk
 * with finish_reason, the usage chunk when asked, and "data: [DONE]".
 * Several choices (n) or prompts: one generation each, answered whole, or streamed as one
 * event stream whose chunks each carry one choice (its index), every choice ending with its
 * own finish_reason, then the usage once and [DONE] (struct several).
 *
 * Ownership: struct gen holds one reference on the sched_req; the stream's
 * response owns the gen (freed by its free callback, which libmicrohttpd calls
 * whether the stream ended or the client left). Whoever frees a gen whose
 * request is still running cancels it first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "base/log.h"
#include "server/reasoning.h"
#include "base/timer.h"
#include "server/api_format.h"
#include "server/api_response.h"
#include "server/server_internal.h"
#include "server/text_stream.h"
#include "server/tool_grammar.h"
#include "server/tool_parse.h"

enum { WAIT_SLICE_MS = 50, STREAM_BLOCK = 16 * 1024 };

struct gen {
    struct server *srv;
    struct MHD_Connection *conn;
    struct api_request rq;
    struct sched_req *req;          /* one reference, owned */
    struct text_stream ts;
    struct reasoning rs;            /* chat with a thinking model: its reasoning apart from its content */
    struct tool_parse tp;           /* chat with tools: the calls cut out of the content */
    struct json *tools;             /* the request's tools, parsed (tp reads parameter types), owned */
    int n_calls_sent;               /* stream: calls whose first delta (id, name) went out */
    size_t args_sent[TOOL_MAX_CALLS]; /* stream: bytes of each call's arguments sent */
    char id[48];
    long created;                   /* unix seconds when the request came in (OpenAI's `created`) */
    int n_prompt;
    int consumed;                   /* tokens pushed into ts */
    bool stop_string;               /* ts found a stop string; the request was cancelled */
    bool role_sent;                 /* chat stream: the first chunk with the role */
    bool done;                      /* stream: [DONE] is in out; a choice of several: its last chunk is */
    bool errored;                   /* stream: an error event went out in place of the rest */
    int choice;                     /* several choices streamed: this one's index */
    const char *chunk_id;           /* several choices streamed: the one id every chunk carries, or NULL */
    /* the Responses API (API_RESPONSES) */
    char msg_id[48], rs_id[48];     /* its message and reasoning items */
    int seq;                        /* stream: the next event's sequence_number */
    bool rs_open, rs_done, msg_open; /* stream: the reasoning item announced / finished, the message announced */
    int n_items, msg_index;         /* stream: output items announced; the message's place among them */
    int call_index[TOOL_MAX_CALLS]; /* stream: each function_call item's place */
    char *all_text, *all_reason;    /* stream: the whole answer and reasoning so far, owned */
    size_t n_all_text, n_all_reason, cap_all_text, cap_all_reason;
    char *out;                      /* (out_cap) stream bytes not yet handed to libmicrohttpd */
    size_t out_len, out_pos, out_cap;
};

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A deadline ends the text with finish_reason "timeout" and a 200: the text so far is the
 * client's, and the SDKs retry a 408 (twice by default), tripling the work. */
static const char *finish_reason(const struct gen *g, enum sched_finish f)
{
    if (g->stop_string || f == SCHED_FINISH_STOP)
        return "stop";
    if (f == SCHED_FINISH_TIMEOUT)
        return "timeout";
    return "length";
}

/* Logs one line and feeds the metrics, then frees. */
static void gen_free(struct gen *g)
{
    if (!g)
        return;
    struct sched_req *r = g->req;
    if (r) {
        pthread_mutex_lock(&r->mu);
        bool running = !sched_req_finished(r);
        pthread_mutex_unlock(&r->mu);
        if (running && !g->stop_string)
            LOG_INFO("request %s: client gone, cancelled", g->id);
        if (running)
            scheduler_cancel(g->srv->m.sch, r);
        pthread_mutex_lock(&r->mu);
        int n_out = r->n_out, n_cached = r->n_cached;
        enum sched_finish f = r->finish;
        double t_first = n_out ? r->out_time[0] : 0, t_last = n_out ? r->out_time[n_out - 1] : 0;
        pthread_mutex_unlock(&r->mu);
        double now = timer_now();
        /* out_time[0 .. n_out) no longer changes: the scheduler writes past n_out only */
        enum sched_finish end = g->stop_string ? SCHED_FINISH_STOP : running ? SCHED_FINISH_CANCELLED : f;
        metrics_observe_generation(&g->srv->metrics, g->n_prompt, n_out, r->t_submit, r->out_time, now, end);
        LOG_INFO("request %s: prompt %d tokens (%d cached), generated %d, ttft %.3f s, %.1f tok/s, %s", g->id,
                 g->n_prompt, n_cached, n_out, n_out ? t_first - r->t_submit : 0.0,
                 n_out > 1 && t_last > t_first ? (n_out - 1) / (t_last - t_first) : 0.0,
                 end == SCHED_FINISH_TIMEOUT     ? "timeout"
                 : end == SCHED_FINISH_ERROR     ? "error"
                 : end == SCHED_FINISH_CANCELLED ? "cancelled"
                                                 : finish_reason(g, end));
        sched_req_put(r);
    }
    text_stream_free(&g->ts);
    reasoning_free(&g->rs);
    tool_parse_free(&g->tp);
    json_free(g->tools);
    free(g->all_text);
    free(g->all_reason);
    api_request_free(&g->rq);
    free(g->out);
    atomic_fetch_sub(&g->srv->n_live, 1);
    free(g);
}

/* Waits until the request has more than `seen` tokens or has finished.
 * False when the client went away or the server is stopping. */
static bool gen_wait(struct gen *g, int seen)
{
    struct sched_req *r = g->req;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool progress = r->n_out > seen || sched_req_finished(r);
        if (!progress) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            progress = r->n_out > seen || sched_req_finished(r);
        }
        pthread_mutex_unlock(&r->mu);
        if (progress)
            return true;
        if (atomic_load(&g->srv->stopping) || atomic_load(&g->srv->failed) || server_client_gone(g->conn))
            return false;
    }
}

/* Feeds token i to the text stream; a stop string cancels the request. */
static enum status gen_push(struct gen *g, int i, struct err *err)
{
    enum status st = text_stream_push(&g->ts, g->req->out_ids[i], err);
    g->consumed = i + 1;
    if (!st && g->ts.stopped && !g->stop_string) {
        g->stop_string = true;
        scheduler_cancel(g->srv->m.sch, g->req);
    }
    return st;
}

static void gen_logprobs(const struct gen *g, int from, int n, size_t text_offset, struct api_logprobs *lp)
{
    const struct sched_req *r = g->req;
    int k = r->p.top_logprobs > 0 ? r->p.top_logprobs : 0;
    *lp = (struct api_logprobs){.n = n, .ids = r->out_ids + from, .lp = r->out_logprob + from, .k = k,
                                .top_ids = k ? r->out_top_ids + (size_t)from * k : NULL,
                                .top_lp = k ? r->out_top_lp + (size_t)from * k : NULL,
                                .text_offset = text_offset, .tok = g->srv->m.pm.tok};
}

static struct api_result gen_result(const struct gen *g)
{
    return (struct api_result){.kind = g->rq.kind, .index = g->choice, .id = g->chunk_id ? g->chunk_id : g->id,
                               .model = g->srv->o.model_name,
                               .created = g->created, .text = "", .prompt_tokens = g->n_prompt,
                               .completion_tokens = g->consumed, .cached_tokens = g->req->n_cached};
}

/* The text that became final into res: the content, and with a thinking model its reasoning
 * apart (final: the output ended). False on no memory. */
static bool gen_take(struct gen *g, struct api_result *res, bool final)
{
    res->text_len = text_stream_take(&g->ts, &res->text);
    if (g->rs.on) {
        if (reasoning_feed(&g->rs, res->text, res->text_len, final, NULL))
            return false;
        res->reasoning_on = true;
        res->text = g->rs.content, res->text_len = g->rs.n_content;
        res->reasoning = g->rs.reason, res->reasoning_len = g->rs.n_reason;
    }
    if (g->tp.fmt != TOOL_FORMAT_NONE) { /* calls come out of the content (a thinking model thinks first) */
        if (tool_parse_feed(&g->tp, res->text, res->text_len, final, NULL))
            return false;
        res->text = g->tp.content, res->text_len = g->tp.n_content;
    }
    return true;
}

/* The calls answered: all of them, or the first with parallel_tool_calls false (the model's later
 * calls are dropped, not turned into text). */
static int gen_n_calls(const struct gen *g)
{
    return g->rq.single_call && g->tp.n_calls > 1 ? 1 : g->tp.n_calls;
}

/* Call i's id: "call_" and the request id's random part, then i (unique per call). */
static void call_id(const struct gen *g, int i, char *out, size_t n)
{
    const char *r = strchr(g->id, '-'); /* chatcmpl-HEX; the Responses API's resp_HEX */
    if (!r)
        r = strchr(g->id, '_');
    snprintf(out, n, "call_%s%02d", r ? r + 1 : g->id, i);
}

/* Call i's Responses API item id: "fc_" and its call id's part after "call_". */
static void call_item_id(const struct gen *g, int i, char *out, size_t n)
{
    char c[48];
    call_id(g, i, c, sizeof c);
    snprintf(out, n, "fc_%s", c + 5);
}

/* Every call so far, whole, into out (ids in ids[]); returns how many. */
static int gen_calls(const struct gen *g, struct api_tool_call *out, char (*ids)[48])
{
    for (int i = 0; i < gen_n_calls(g); i++) {
        call_id(g, i, ids[i], sizeof ids[i]);
        out[i] = (struct api_tool_call){.index = i, .id = ids[i], .name = g->tp.calls[i].name, .args = g->tp.calls[i].args,
                                        .n_args = g->tp.calls[i].n_args};
    }
    return gen_n_calls(g);
}

/* A stream's deltas of the calls since the last chunk into res (ids in ids[]); their names once,
 * then the arguments as they grow. */
static void gen_call_deltas(struct gen *g, struct api_result *res, struct api_tool_call *out, char (*ids)[48])
{
    int n = 0;
    for (int i = 0; i < gen_n_calls(g); i++) {
        const struct tool_call *c = &g->tp.calls[i];
        const bool first = i >= g->n_calls_sent;
        if (!first && c->n_args == g->args_sent[i])
            continue;
        out[n] = (struct api_tool_call){.index = i, .name = c->name, .args = c->args + (first ? 0 : g->args_sent[i]),
                                        .n_args = c->n_args - (first ? 0 : g->args_sent[i])};
        if (first) {
            call_id(g, i, ids[n], sizeof ids[n]);
            out[n].id = ids[n];
            g->n_calls_sent = i + 1;
        }
        g->args_sent[i] = c->n_args;
        n++;
    }
    res->tool_calls = out, res->n_tool_calls = n;
}

/* The chat's finish_reason: "tool_calls" when the model stopped after calling. */
static const char *gen_finish_reason(const struct gen *g, enum sched_finish f)
{
    const char *r = finish_reason(g, f);
    return g->tp.n_calls > 0 && strcmp(r, "stop") == 0 ? "tool_calls" : r;
}

static bool out_put(struct gen *g, const char *a, size_t na, const char *b, size_t nb)
{
    size_t need = g->out_len + na + nb;
    if (need > g->out_cap) {
        size_t cap = g->out_cap ? g->out_cap : 4096;
        while (cap < need)
            cap *= 2;
        char *o = realloc(g->out, cap);
        if (!o)
            return false;
        g->out = o;
        g->out_cap = cap;
    }
    memcpy(g->out + g->out_len, a, na);
    memcpy(g->out + g->out_len + na, b, nb);
    g->out_len = need;
    return true;
}

/* Appends "data: JSON\n\n" (json is freed). */
static bool out_event(struct gen *g, char *json)
{
    if (!json)
        return false;
    bool ok = out_put(g, "data: ", 6, json, strlen(json)) && out_put(g, "\n\n", 2, "", 0);
    free(json);
    return ok;
}

/* ---- the Responses API's stream: typed events (event: TYPE) instead of chat chunks ---- */

static bool grow_put(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return false;
        *buf = b, *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

static struct json *new_text(const char *s, size_t n)
{
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    if (n)
        memcpy(t, s, n);
    t[n] = 0;
    struct json *j = json_new_string(t);
    free(t);
    return j;
}

static struct api_responses_view resp_view(const struct gen *g, const char *status, const char *incomplete, bool output)
{
    const struct sched_req *r = g->req;
    return (struct api_responses_view){
        .id = g->id, .model = g->srv->o.model_name, .created = g->created, .status = status,
        .incomplete_reason = incomplete, .msg_id = g->msg_id, .rs_id = g->rs_id, .text = g->all_text ? g->all_text : "",
        .text_len = g->n_all_text, .reasoning = g->all_reason, .reasoning_len = g->n_all_reason, .output = output,
        .input_tokens = g->n_prompt, .output_tokens = g->consumed, .cached_tokens = r ? r->n_cached : 0,
        .temperature = g->rq.temperature, .top_p = g->rq.top_p, .max_output_tokens = g->rq.max_tokens,
        .tools = g->tools, .tool_choice = g->rq.tool_choice, .tool_name = g->rq.tool_name};
}

static bool resp_event(struct gen *g, const char *type, struct json *fields)
{
    char *ev = api_responses_event(type, g->seq++, fields);
    bool ok = ev && out_put(g, ev, strlen(ev), "", 0);
    free(ev);
    return ok;
}

/* {item_id, output_index, content_index: 0} plus one string member. */
static struct json *resp_at(const char *item, int index, const char *key, const char *s, size_t n)
{
    struct json *f = json_new_object();
    json_add(f, "item_id", json_new_string(item));
    json_add(f, "output_index", json_new_number(index));
    json_add(f, "content_index", json_new_number(0));
    if (key)
        json_add(f, key, new_text(s, n));
    return f;
}

static struct json *resp_item_event(int index, struct json *item)
{
    struct json *f = json_new_object();
    json_add(f, "output_index", json_new_number(index));
    json_add(f, "item", item);
    return f;
}

static bool resp_close_reasoning(struct gen *g)
{
    if (!g->rs_open || g->rs_done)
        return true;
    g->rs_done = true;
    return resp_event(g, "response.output_item.done",
                      resp_item_event(0, api_responses_reasoning_item(g->rs_id, "completed", g->all_reason,
                                                                      g->n_all_reason)));
}

static bool resp_open_message(struct gen *g)
{
    if (g->msg_open)
        return true;
    g->msg_open = true;
    const int at = g->msg_index = g->n_items++;
    struct json *part = json_new_object();
    json_add(part, "type", json_new_string("output_text"));
    json_add(part, "text", json_new_string(""));
    json_add(part, "annotations", json_new_array());
    struct json *f = resp_at(g->msg_id, at, NULL, NULL, 0);
    json_add(f, "part", part);
    return resp_event(g, "response.output_item.added",
                      resp_item_event(at, api_responses_message_item(g->msg_id, "in_progress", NULL, 0))) &&
           resp_event(g, "response.content_part.added", f);
}

/* One take's reasoning and content as delta events. */
static bool resp_stream_piece(struct gen *g, const struct api_result *res)
{
    if (res->reasoning_len) {
        if (!g->rs_open) {
            g->rs_open = true;
            g->n_items++; /* the reasoning comes first: item 0 */
            if (!resp_event(g, "response.output_item.added",
                            resp_item_event(0, api_responses_reasoning_item(g->rs_id, "in_progress", NULL, 0))))
                return false;
        }
        if (!grow_put(&g->all_reason, &g->n_all_reason, &g->cap_all_reason, res->reasoning, res->reasoning_len) ||
            !resp_event(g, "response.reasoning_text.delta",
                        resp_at(g->rs_id, 0, "delta", res->reasoning, res->reasoning_len)))
            return false;
    }
    if (res->text_len &&
        (!resp_close_reasoning(g) || !resp_open_message(g) ||
         !grow_put(&g->all_text, &g->n_all_text, &g->cap_all_text, res->text, res->text_len) ||
         !resp_event(g, "response.output_text.delta", resp_at(g->msg_id, g->msg_index, "delta", res->text, res->text_len))))
        return false;
    /* function calls: an item each, announced with its name, its arguments as deltas */
    for (int i = 0; i < res->n_tool_calls; i++) {
        const struct api_tool_call *c = &res->tool_calls[i];
        if (c->id) {
            g->call_index[c->index] = g->n_items++;
            if (!resp_close_reasoning(g) ||
                !resp_event(g, "response.output_item.added",
                            resp_item_event(g->call_index[c->index], api_responses_call_item(c, "in_progress", false))))
                return false;
        }
        if (!c->n_args)
            continue;
        struct json *f = json_new_object();
        char id[64];
        call_item_id(g, c->index, id, sizeof id);
        json_add(f, "item_id", json_new_string(id));
        json_add(f, "output_index", json_new_number(g->call_index[c->index]));
        json_add(f, "delta", new_text(c->args, c->n_args));
        if (!resp_event(g, "response.function_call_arguments.delta", f))
            return false;
    }
    return true;
}

/* The last events: the items' ends, then response.completed (or response.incomplete). */
static bool resp_stream_finish(struct gen *g, enum sched_finish f)
{
    const bool complete = f == SCHED_FINISH_STOP || g->stop_string;
    struct api_tool_call calls[TOOL_MAX_CALLS];
    char ids[TOOL_MAX_CALLS][48];
    const int n_calls = gen_calls(g, calls, ids);
    /* the message item: for text, or when there is nothing else to answer */
    if (!resp_close_reasoning(g) || ((g->n_all_text || !n_calls) && !resp_open_message(g)))
        return false;
    for (int i = 0; i < n_calls; i++) {
        char id[64];
        call_item_id(g, i, id, sizeof id);
        struct json *d = json_new_object();
        json_add(d, "item_id", json_new_string(id));
        json_add(d, "output_index", json_new_number(g->call_index[i]));
        json_add(d, "arguments", new_text(calls[i].args, calls[i].n_args));
        if (!resp_event(g, "response.function_call_arguments.done", d) ||
            !resp_event(g, "response.output_item.done",
                        resp_item_event(g->call_index[i], api_responses_call_item(&calls[i], "completed", true))))
            return false;
    }
    const int at = g->msg_index;
    struct json *part = json_new_object();
    json_add(part, "type", json_new_string("output_text"));
    json_add(part, "text", new_text(g->all_text, g->n_all_text));
    json_add(part, "annotations", json_new_array());
    struct json *pf = resp_at(g->msg_id, at, NULL, NULL, 0);
    json_add(pf, "part", part);
    struct api_responses_view v = resp_view(g, complete ? "completed" : "incomplete",
                                            complete ? NULL : f == SCHED_FINISH_TIMEOUT ? "timeout" : "max_output_tokens",
                                            true);
    v.calls = calls, v.n_calls = n_calls;
    struct json *fin = json_new_object();
    json_add(fin, "response", api_responses_object(&v));
    g->done = true;
    if (!g->msg_open) {
        json_free(pf);
        return resp_event(g, complete ? "response.completed" : "response.incomplete", fin);
    }
    return resp_event(g, "response.output_text.done", resp_at(g->msg_id, at, "text", g->all_text ? g->all_text : "",
                                                              g->n_all_text)) &&
           resp_event(g, "response.content_part.done", pf) &&
           resp_event(g, "response.output_item.done",
                      resp_item_event(at, api_responses_message_item(g->msg_id, complete ? "completed" : "incomplete",
                                                                     g->all_text ? g->all_text : "", g->n_all_text))) &&
           resp_event(g, complete ? "response.completed" : "response.incomplete", fin);
}

/* The response as it starts: response.created, then response.in_progress. */
static bool resp_stream_start(struct gen *g)
{
    struct api_responses_view v = resp_view(g, "in_progress", NULL, false);
    struct json *a = json_new_object(), *b = json_new_object();
    json_add(a, "response", api_responses_object(&v));
    json_add(b, "response", api_responses_object(&v));
    return resp_event(g, "response.created", a) && resp_event(g, "response.in_progress", b);
}

/* Events for tokens [consumed, n): one chunk per token, with its text (maybe
 * empty while a stop string might be forming) and its log-probabilities. */
static bool stream_tokens(struct gen *g, int n)
{
    struct err err = {0};
    while (g->consumed < n && !g->stop_string) {
        int i = g->consumed;
        size_t offset = g->ts.taken;
        if (gen_push(g, i, &err)) { /* the client is told, not left with a closed stream */
            struct api_error e;
            api_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s", err.msg);
            LOG_ERROR("request %s: %s", g->id, err.msg);
            g->done = g->errored = true;
            return out_event(g, api_error_json(&e)) && (g->chunk_id || out_put(g, "data: [DONE]\n\n", 14, "", 0));
        }
        struct api_result res = gen_result(g);
        if (!gen_take(g, &res, false))
            return false;
        struct api_tool_call calls[TOOL_MAX_CALLS];
        char ids[TOOL_MAX_CALLS][48];
        gen_call_deltas(g, &res, calls, ids);
        if (g->rq.kind == API_RESPONSES) {
            if (!resp_stream_piece(g, &res))
                return false;
            continue;
        }
        struct api_logprobs lp;
        if (g->rq.logprobs) {
            gen_logprobs(g, i, 1, offset, &lp);
            res.logprobs = &lp;
        }
        if (!out_event(g, api_result_json(&res, true)))
            return false;
    }
    return true;
}

static void error_for_finish(enum sched_finish f, const char *msg, struct api_error *e)
{
    if (f == SCHED_FINISH_CANCELLED)
        api_error_set(e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
    else
        api_error_set(e, 500, "server_error", NULL, NULL, "generation failed: %s", msg);
}

/* The final events: remaining text with finish_reason (or an error event),
 * the usage chunk if asked, then [DONE]. A choice of several (chunk_id set) ends with its
 * finish_reason chunk: the usage and [DONE] are the whole stream's (several_produce). */
static bool stream_end(struct gen *g)
{
    struct sched_req *r = g->req;
    pthread_mutex_lock(&r->mu);
    enum sched_finish f = r->finish;
    char msg[sizeof r->error];
    memcpy(msg, r->error, sizeof msg);
    pthread_mutex_unlock(&r->mu);
    if (!g->stop_string && (f == SCHED_FINISH_ERROR || f == SCHED_FINISH_CANCELLED)) {
        struct api_error e;
        error_for_finish(f, msg, &e);
        if (g->rq.kind == API_RESPONSES) { /* the Responses stream's error event, no [DONE] */
            struct json *ef = json_new_object();
            json_add(ef, "code", json_new_string(e.code[0] ? e.code : e.type));
            json_add(ef, "message", json_new_string(e.message));
            g->done = true;
            return resp_event(g, "error", ef);
        }
        g->errored = true;
        if (!out_event(g, api_error_json(&e)))
            return false;
    } else {
        struct err err = {0};
        if (text_stream_finish(&g->ts, &err))
            return false;
        struct api_result res = gen_result(g);
        if (!gen_take(g, &res, true))
            return false;
        struct api_tool_call calls[TOOL_MAX_CALLS];
        char ids[TOOL_MAX_CALLS][48];
        gen_call_deltas(g, &res, calls, ids);
        if (g->rq.kind == API_RESPONSES)
            return resp_stream_piece(g, &res) && resp_stream_finish(g, f);
        res.finish_reason = gen_finish_reason(g, f);
        if (!out_event(g, api_result_json(&res, true)))
            return false;
        if (g->chunk_id) {
            g->done = true;
            return true;
        }
        if (g->rq.include_usage) {
            res.has_usage = true;
            if (!out_event(g, api_usage_chunk_json(&res)))
                return false;
        }
    }
    g->done = true;
    return g->chunk_id || out_put(g, "data: [DONE]\n\n", 14, "", 0);
}

/* What g can write now without waiting: its opening events, the tokens it has, or its end. *ready:
 * something was written. False on no memory. */
static bool stream_step(struct gen *g, bool *ready)
{
    *ready = true;
    if (g->rq.kind == API_RESPONSES && !g->role_sent) {
        g->role_sent = true;
        return resp_stream_start(g);
    }
    if (g->rq.kind == API_CHAT && !g->role_sent) {
        g->role_sent = true;
        struct api_result res = gen_result(g);
        res.role = true;
        return out_event(g, api_result_json(&res, true));
    }
    struct sched_req *r = g->req;
    pthread_mutex_lock(&r->mu);
    int n = r->n_out;
    bool finished = sched_req_finished(r);
    pthread_mutex_unlock(&r->mu);
    if (g->consumed < n && !g->stop_string)
        return stream_tokens(g, n);
    if (finished || g->stop_string)
        return stream_end(g);
    *ready = false;
    return true;
}

/* Fills g->out with the next events, waiting for tokens if there are none. */
static bool stream_produce(struct gen *g)
{
    bool ready;
    if (!stream_step(g, &ready))
        return false;
    if (ready)
        return true;
    if (!gen_wait(g, g->consumed) && atomic_load(&g->srv->failed)) {
        struct api_error e;
        api_error_set(&e, 503, "server_error", NULL, "rank_failed", "%s", g->srv->fail_msg);
        g->done = true;
        return out_event(g, api_error_json(&e)) && out_put(g, "data: [DONE]\n\n", 14, "", 0);
    }
    return !atomic_load(&g->srv->stopping) && !server_client_gone(g->conn);
}

/* A stream's reader for libmicrohttpd over a byte buffer (out, its len bytes, pos of them handed
 * out): what is buffered first; when it is empty, the end once done, else produce(cls) refills it
 * (false: the client left or the server stops). */
static ssize_t sse_drain(void *cls, bool (*produce)(void *), const bool *done, const char *const *out, size_t *len,
                         size_t *pos, char *buf, size_t max)
{
    while (*pos == *len) {
        if (*done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        *len = *pos = 0;
        if (!produce(cls))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = *len - *pos < max ? *len - *pos : max;
    memcpy(buf, *out + *pos, n);
    *pos += n;
    return (ssize_t)n;
}

static bool stream_produce_cb(void *cls)
{
    return stream_produce(cls);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct gen *g = cls;
    return sse_drain(g, stream_produce_cb, &g->done, (const char *const *)&g->out, &g->out_len, &g->out_pos, buf, max);
}

static void stream_free(void *cls)
{
    gen_free(cls);
}

/* Answers 200 with a server-sent event stream that read() produces from cls; free_fn(cls) runs when
 * the connection is done with it, or at once when no response can be made. */
static enum MHD_Result reply_sse(struct conn_ctx *cc, MHD_ContentReaderCallback read, void *cls,
                                 MHD_ContentReaderFreeCallback free_fn)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, read, cls, free_fn);
    if (!resp) {
        free_fn(cls);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(cc->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp); /* the connection holds it */
    metrics_count_request(&cc->srv->metrics, cc->ep, 200);
    return ret;
}

static enum MHD_Result reply_stream(struct conn_ctx *cc, struct gen *g)
{
    return reply_sse(cc, stream_read, g, stream_free);
}

/* ---- several choices (n) or prompts streamed: one event stream, each chunk one choice's ---- */

struct several {
    struct gen **gs;   /* (k) owned; choice c = prompt c / per, its (c % per)-th sample */
    int k, per;
    bool done;         /* [DONE] is in out */
    char *out;         /* (out_cap) stream bytes not yet handed to libmicrohttpd */
    size_t out_len, out_pos, out_cap;
};

/* Frees every choice (gen_free cancels those still running: a client that leaves cancels all). */
static void several_free(struct several *s)
{
    if (!s)
        return;
    for (int c = 0; c < s->k; c++)
        gen_free(s->gs[c]);
    free(s->gs);
    free(s->out);
    free(s);
}

/* Moves g's pending bytes to the end of s->out. */
static bool several_take(struct several *s, struct gen *g)
{
    size_t n = g->out_len - g->out_pos, need = s->out_len + n;
    if (need > s->out_cap) {
        size_t cap = s->out_cap ? s->out_cap : 4096;
        while (cap < need)
            cap *= 2;
        char *o = realloc(s->out, cap);
        if (!o)
            return false;
        s->out = o, s->out_cap = cap;
    }
    memcpy(s->out + s->out_len, g->out + g->out_pos, n);
    s->out_len = need;
    g->out_len = g->out_pos = 0;
    return true;
}

static bool several_put(struct several *s, const char *p, size_t n)
{
    struct gen *g = s->gs[0]; /* through choice 0's buffer, empty between takes */
    return out_put(g, p, n, "", 0) && several_take(s, g);
}

/* The end: the usage chunk with include_usage (completion tokens of every choice, a prompt's tokens
 * once), then [DONE]. */
static bool several_end(struct several *s)
{
    struct gen *g0 = s->gs[0];
    if (g0->rq.include_usage) {
        struct api_result usage = gen_result(g0);
        usage.prompt_tokens = usage.completion_tokens = usage.cached_tokens = 0;
        for (int c = 0; c < s->k; c++) {
            usage.completion_tokens += s->gs[c]->consumed;
            if (c % s->per == 0) {
                usage.prompt_tokens += s->gs[c]->n_prompt;
                usage.cached_tokens += s->gs[c]->req->n_cached;
            }
        }
        usage.has_usage = true;
        char *j = api_usage_chunk_json(&usage);
        if (!j)
            return false;
        bool ok = several_put(s, "data: ", 6) && several_put(s, j, strlen(j)) && several_put(s, "\n\n", 2);
        free(j);
        if (!ok)
            return false;
    }
    s->done = true;
    return several_put(s, "data: [DONE]\n\n", 14);
}

/* Fills s->out with every choice's events that are ready (in choice order), waiting when none is. An
 * error in one choice ends the stream after its error event (the others are cancelled on free). */
static bool several_produce(struct several *s)
{
    struct server *srv = s->gs[0]->srv;
    for (;;) {
        bool any = false, all_done = true;
        for (int c = 0; c < s->k; c++) {
            struct gen *g = s->gs[c];
            if (g->done)
                continue;
            bool ready;
            if (!stream_step(g, &ready) || !several_take(s, g))
                return false;
            if (g->errored) {
                s->done = true;
                return several_put(s, "data: [DONE]\n\n", 14);
            }
            any |= ready;
            all_done &= g->done;
        }
        if (all_done)
            return several_end(s);
        if (any)
            return true;
        if (atomic_load(&srv->failed)) {
            struct api_error e;
            api_error_set(&e, 503, "server_error", NULL, "rank_failed", "%s", srv->fail_msg);
            s->done = true;
            char *j = api_error_json(&e);
            bool ok = j && several_put(s, "data: ", 6) && several_put(s, j, strlen(j)) && several_put(s, "\n\n", 2) &&
                      several_put(s, "data: [DONE]\n\n", 14);
            free(j);
            return ok;
        }
        if (atomic_load(&srv->stopping) || server_client_gone(s->gs[0]->conn))
            return false;
        /* nothing ready: wait a slice on the first running choice (the scheduler steps the choices
           together, so its next token comes with theirs) */
        for (int c = 0; c < s->k; c++) {
            struct gen *g = s->gs[c];
            if (g->done)
                continue;
            struct sched_req *r = g->req;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += 5 * 1000000L;
            if (ts.tv_nsec >= 1000000000L)
                ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_mutex_lock(&r->mu);
            if (r->n_out <= g->consumed && !sched_req_finished(r))
                pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            pthread_mutex_unlock(&r->mu);
            break;
        }
    }
}

static bool several_produce_cb(void *cls)
{
    return several_produce(cls);
}

static ssize_t several_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct several *s = cls;
    return sse_drain(s, several_produce_cb, &s->done, (const char *const *)&s->out, &s->out_len, &s->out_pos, buf,
                     max);
}

static void several_stream_free(void *cls)
{
    several_free(cls);
}

/* Answers 200 with the stream of s's choices (s is the response's from here on). */
static enum MHD_Result reply_several_stream(struct conn_ctx *cc, struct several *s)
{
    return reply_sse(cc, several_read, s, several_stream_free);
}

/* echo: the prompt's text before the answer's in res, and with logprobs the prompt's tokens before
 * the answer's (the first token has no log-probability: null). The buffers are the caller's. */
static bool echo_build(struct gen *g, struct api_result *res, char **text, struct api_logprobs *lp, int32_t **ids,
                       float **lps, int32_t **top, float **top_lp)
{
    const struct sched_req *r = g->req;
    char *prompt = NULL;
    size_t np = 0;
    if (g->rq.prompt_text) {
        np = strlen(g->rq.prompt_text);
        prompt = malloc(np + 1);
        if (prompt)
            memcpy(prompt, g->rq.prompt_text, np + 1);
    } else if (tokenizer_decode(g->srv->m.pm.tok, r->prompt, (size_t)r->n_prompt, false, &prompt, &np, NULL)) {
        prompt = NULL;
    }
    if (!prompt)
        return false;
    *text = malloc(np + res->text_len + 1);
    if (!*text) {
        free(prompt);
        return false;
    }
    memcpy(*text, prompt, np);
    memcpy(*text + np, res->text, res->text_len);
    (*text)[np + res->text_len] = 0;
    free(prompt);
    res->text = *text, res->text_len += np;
    if (!g->rq.logprobs)
        return true;
    const int n = r->n_prompt + g->consumed, k = r->p.top_logprobs > 0 ? r->p.top_logprobs : 0;
    *ids = malloc((size_t)n * sizeof **ids), *lps = malloc((size_t)n * sizeof **lps);
    *top = k ? calloc((size_t)n * k, sizeof **top) : NULL, *top_lp = k ? calloc((size_t)n * k, sizeof **top_lp) : NULL;
    if (!*ids || !*lps || (k && (!*top || !*top_lp)))
        return false;
    memcpy(*ids, r->prompt, (size_t)r->n_prompt * sizeof **ids);
    memcpy(*ids + r->n_prompt, r->out_ids, (size_t)g->consumed * sizeof **ids);
    memcpy(*lps, r->prompt_lp, (size_t)r->n_prompt * sizeof **lps);
    memcpy(*lps + r->n_prompt, r->out_logprob, (size_t)g->consumed * sizeof **lps);
    if (k) { /* the prompt's rows hold prompt_k >= k alternatives (prompt_logprobs may ask more) */
        for (int i = 0; i < r->n_prompt; i++) {
            memcpy(*top + (size_t)i * k, r->prompt_top_ids + (size_t)i * r->prompt_k, (size_t)k * sizeof **top);
            memcpy(*top_lp + (size_t)i * k, r->prompt_top_lp + (size_t)i * r->prompt_k, (size_t)k * sizeof **top_lp);
        }
        memcpy(*top + (size_t)r->n_prompt * k, r->out_top_ids, (size_t)g->consumed * k * sizeof **top);
        memcpy(*top_lp + (size_t)r->n_prompt * k, r->out_top_lp, (size_t)g->consumed * k * sizeof **top_lp);
    }
    *lp = (struct api_logprobs){.n = n, .ids = *ids, .lp = *lps, .k = k, .top_ids = *top, .top_lp = *top_lp,
                                .text_offset = 0, .tok = g->srv->m.pm.tok};
    return true;
}

/* A finished generation's whole answer: res (its text, logprobs and the echo's buffers are owned). */
struct whole {
    struct api_result res;
    struct api_logprobs lp;
    struct api_prompt_logprobs plp; /* prompt_logprobs: the request's arrays (borrowed) */
    enum sched_finish finish;
    char *echo_text;
    int32_t *e_ids, *e_top;
    float *e_lp, *e_top_lp;
    struct api_tool_call *calls;    /* (res.n_tool_calls) */
    char (*call_ids)[48];
};

static void whole_free(struct whole *w)
{
    free(w->echo_text), free(w->e_ids), free(w->e_lp), free(w->e_top), free(w->e_top_lp);
    free(w->calls), free(w->call_ids);
    memset(w, 0, sizeof *w);
}

/* Waits for the end, consuming tokens as they come so that a stop string ends generation early,
 * then fills w. STATUS_OK; STATUS_IO: the client left (nothing to answer); else e is the answer. */
static enum status whole_collect(struct gen *g, struct whole *w, struct api_error *e)
{
    memset(w, 0, sizeof *w);
    struct sched_req *r = g->req;
    struct err err = {0};
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int n = r->n_out;
        bool finished = sched_req_finished(r);
        pthread_mutex_unlock(&r->mu);
        while (g->consumed < n && !g->stop_string)
            if (gen_push(g, g->consumed, &err))
                return api_error_set(e, 500, "server_error", NULL, NULL, "%s", err.msg);
        if (finished || g->stop_string)
            break;
        if (!gen_wait(g, g->consumed)) {
            if (atomic_load(&g->srv->failed))
                return api_error_set(e, 503, "server_error", NULL, "rank_failed", "%s", g->srv->fail_msg);
            return STATUS_IO;
        }
    }
    pthread_mutex_lock(&r->mu);
    enum sched_finish f = r->finish;
    char msg[sizeof r->error];
    memcpy(msg, r->error, sizeof msg);
    pthread_mutex_unlock(&r->mu);
    w->finish = f;
    if (!g->stop_string && (f == SCHED_FINISH_ERROR || f == SCHED_FINISH_CANCELLED)) {
        error_for_finish(f, msg, e);
        return STATUS_INVALID;
    }
    if (text_stream_finish(&g->ts, &err))
        return api_error_set(e, 500, "server_error", NULL, NULL, "%s", err.msg);
    w->res = gen_result(g);
    if (!gen_take(g, &w->res, true))
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    w->res.finish_reason = gen_finish_reason(g, f);
    if (g->tp.n_calls) {
        const int n = gen_n_calls(g);
        w->calls = malloc((size_t)n * sizeof *w->calls);
        w->call_ids = malloc((size_t)n * sizeof *w->call_ids);
        if (!w->calls || !w->call_ids) {
            whole_free(w);
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        for (int i = 0; i < n; i++) {
            call_id(g, i, w->call_ids[i], sizeof w->call_ids[i]);
            w->calls[i] = (struct api_tool_call){.index = i, .id = w->call_ids[i], .name = g->tp.calls[i].name,
                                                 .args = g->tp.calls[i].args, .n_args = g->tp.calls[i].n_args};
        }
        w->res.tool_calls = w->calls, w->res.n_tool_calls = n;
    }
    w->res.has_usage = true;
    if (g->rq.echo && !echo_build(g, &w->res, &w->echo_text, &w->lp, &w->e_ids, &w->e_lp, &w->e_top, &w->e_top_lp)) {
        whole_free(w);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory for echo");
    }
    if (g->rq.logprobs && !g->rq.echo)
        gen_logprobs(g, 0, g->consumed, 0, &w->lp);
    if (g->rq.logprobs)
        w->res.logprobs = &w->lp;
    if (g->rq.prompt_logprobs) {
        w->plp = (struct api_prompt_logprobs){.n = r->n_prompt, .ids = r->prompt, .lp = r->prompt_lp,
                                              .rank = r->prompt_rank, .k = g->rq.prompt_top, .stride = r->prompt_k,
                                              .top_ids = r->prompt_top_ids, .top_lp = r->prompt_top_lp,
                                              .tok = g->srv->m.pm.tok};
        w->res.prompt_logprobs = &w->plp;
    }
    return STATUS_OK;
}

/* Waits for the end and answers with one JSON body. */
static enum MHD_Result reply_whole(struct conn_ctx *cc, struct gen *g)
{
    struct whole w;
    struct api_error e;
    enum status st = whole_collect(g, &w, &e);
    if (st == STATUS_IO) {
        gen_free(g);
        return MHD_NO;
    }
    if (st) {
        gen_free(g);
        return server_reply_error(cc, &e);
    }
    char *body;
    if (g->rq.kind == API_RESPONSES) {
        const bool complete = w.finish == SCHED_FINISH_STOP || g->stop_string;
        struct api_responses_view v = resp_view(g, complete ? "completed" : "incomplete",
                                                complete                           ? NULL
                                                : w.finish == SCHED_FINISH_TIMEOUT ? "timeout"
                                                                                   : "max_output_tokens",
                                                true);
        v.text = w.res.text, v.text_len = w.res.text_len, v.reasoning = w.res.reasoning,
        v.reasoning_len = w.res.reasoning_len;
        v.calls = w.calls, v.n_calls = w.res.n_tool_calls;
        body = api_responses_json(&v);
    } else {
        body = api_result_json(&w.res, false);
    }
    whole_free(&w);
    gen_free(g);
    return server_reply(cc, 200, "application/json", body);
}

/* Turns the parsed request into a submitted sched_req; fills e on failure. */
static enum status gen_submit(struct gen *g, struct api_error *e)
{
    struct server *srv = g->srv;
    /* the model's recommended sampling where the request leaves it out (generation_config.json) */
    const struct server_opts *so = &srv->o;
    if (!g->rq.has_temperature && so->has_temperature)
        g->rq.temperature = so->temperature;
    if (!g->rq.has_top_p && so->has_top_p)
        g->rq.top_p = so->top_p;
    if (!g->rq.has_top_k && so->has_top_k)
        g->rq.top_k = so->top_k;
    const struct api_request *rq = &g->rq;
    if (strcmp(rq->model, srv->o.model_name) != 0)
        return api_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                             "the model '%.200s' does not exist: this server has '%.200s'", rq->model,
                             srv->o.model_name);
    /* calls are looked for where the model may make them: tools given, tool_choice not "none" */
    if (rq->tools && rq->tool_choice != API_TOOL_NONE && srv->o.tool_format == TOOL_FORMAT_NONE) {
        if (!srv->o.lenient)
            return api_error_set(e, 400, "invalid_request_error", "tools", "unsupported_parameter",
                                 "this server reads no tool calls from its model's answers (serve "
                                 "--tool-call-parser qwen3|glm45 names the model's format); tool_choice \"none\" "
                                 "still renders the history");
        g->rq.tool_choice = API_TOOL_NONE; /* lenient: not offered to the model, not parsed */
        size_t at = strlen(g->rq.ignored);
        snprintf(g->rq.ignored + at, sizeof g->rq.ignored - at, "%stools", at ? ", " : "");
    }
    if (rq->tools && rq->tool_choice != API_TOOL_NONE) {
        if (json_parse(rq->tools, strlen(rq->tools), "tools", &g->tools, NULL))
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        /* "required" or a named function: the answer is constrained to one call (bound with the
           response_format grammars below; the parser refused both together) */
        if (rq->tool_choice == API_TOOL_REQUIRED || rq->tool_choice == API_TOOL_NAMED) {
            struct grammar *gr = NULL;
            enum status gs = tool_grammar_compile(srv->o.tool_format, g->tools,
                                                  rq->tool_choice == API_TOOL_NAMED ? rq->tool_name : NULL, &gr, e);
            if (gs)
                return gs;
            grammar_put(g->rq.grammar);
            g->rq.grammar = gr;
        }
    }
    struct tok_ids ids = {0};
    enum status st = prompt_build(&srv->m.pm, rq, &ids, e);
    if (st)
        return st;
    int ctx = srv->m.max_context;
    const char *what = rq->kind == API_CHAT ? "messages" : rq->kind == API_RESPONSES ? "input" : "prompt";
    g->n_prompt = (int)ids.n;
    if (ids.n == 0)
        st = api_error_set(e, 400, "invalid_request_error", what, NULL, "the prompt is empty (0 tokens)");
    else if (ids.n >= (size_t)ctx)
        st = api_error_set(e, 400, "invalid_request_error", what, "context_length_exceeded",
                           "this model's maximum context length is %d tokens, but the prompt has %zu tokens "
                           "(and at least one must be generated)",
                           ctx, ids.n);
    else if (rq->max_tokens > 0 && (long)ids.n + rq->max_tokens > ctx)
        st = api_error_set(e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                           "this model's maximum context length is %d tokens; you asked for %ld (%zu in the "
                           "prompt, %d to generate)",
                           ctx, (long)ids.n + rq->max_tokens, ids.n, rq->max_tokens);
    if (st) {
        tok_ids_free(&ids);
        return st;
    }
    uint64_t n = atomic_fetch_add(&srv->n_ids, 1) + 1;
    uint64_t rnd = splitmix64(srv->salt ^ n);
    struct sched_params sp = {
        .max_new = rq->max_tokens_zero ? 0 : rq->max_tokens > 0 ? rq->max_tokens : ctx - (int)ids.n,
        .prompt_logprobs = (rq->echo && rq->logprobs) || rq->prompt_logprobs,
        .prompt_top = rq->prompt_logprobs ? rq->prompt_top : 0,
        .sampling = {.temperature = (float)rq->temperature, .top_p = (float)rq->top_p, .top_k = rq->top_k,
                     .seed = rq->has_seed ? rq->seed : splitmix64(rnd)},
        .ignore_eos = rq->ignore_eos,
        .min_new = rq->min_tokens,
        .top_logprobs = rq->logprobs ? rq->top_logprobs : -1,
        .deadline = srv->o.request_timeout > 0 ? timer_now() + srv->o.request_timeout : 0,
    };
    sp.sampling.frequency_penalty = (float)rq->frequency_penalty;
    sp.sampling.presence_penalty = (float)rq->presence_penalty;
    sp.sampling.repetition_penalty = (float)rq->repetition_penalty;
    sp.sampling.min_p = (float)rq->min_p;
    const int vocab = srv->m.pm.vocab;
    for (int i = 0; i < rq->n_bias; i++)
        if (rq->bias_ids[i] >= vocab) {
            tok_ids_free(&ids);
            return api_error_set(e, 400, "invalid_request_error", "logit_bias", NULL,
                                 "'logit_bias': token %d is not in the vocabulary (%d ids)", (int)rq->bias_ids[i], vocab);
        }
    for (int i = 0; i < rq->n_stop_ids; i++)
        if (rq->stop_ids[i] >= vocab) {
            tok_ids_free(&ids);
            return api_error_set(e, 400, "invalid_request_error", "stop_token_ids", NULL,
                                 "'stop_token_ids': token %d is not in the vocabulary (%d ids)", (int)rq->stop_ids[i],
                                 vocab);
        }
    sp.sampling.n_bias = rq->n_bias;
    memcpy(sp.sampling.bias_ids, rq->bias_ids, (size_t)rq->n_bias * sizeof rq->bias_ids[0]);
    memcpy(sp.sampling.bias, rq->bias, (size_t)rq->n_bias * sizeof rq->bias[0]);
    sp.n_stop_ids = rq->n_stop_ids;
    memcpy(sp.stop_ids, rq->stop_ids, (size_t)rq->n_stop_ids * sizeof rq->stop_ids[0]);
    /* a thinking model's chat answer may reason before it (reasoning.h): the grammar leaves that free */
    if ((st = api_format_bind(&g->rq, srv->grammar_vocab, rq->kind != API_COMPLETIONS && srv->o.reasoning, &sp, e))) {
        tok_ids_free(&ids);
        return st;
    }
    g->created = (long)time(NULL);
    if (rq->kind == API_RESPONSES) { /* the Responses API's id forms */
        snprintf(g->id, sizeof g->id, "resp_%016llx%08llx", (unsigned long long)rnd, (unsigned long long)n & 0xffffffffull);
        snprintf(g->msg_id, sizeof g->msg_id, "msg_%016llx%08llx", (unsigned long long)rnd, (unsigned long long)n & 0xffffffffull);
        snprintf(g->rs_id, sizeof g->rs_id, "rs_%016llx%08llx", (unsigned long long)rnd, (unsigned long long)n & 0xffffffffull);
    } else {
        snprintf(g->id, sizeof g->id, "%s-%016llx%08llx", rq->kind == API_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)rnd, (unsigned long long)n & 0xffffffffull);
    }
    struct err err = {0};
    st = sched_req_create(&g->req, ids.ids, (int)ids.n, &sp, &err);
    tok_ids_free(&ids);
    if (st)
        return api_error_set(e, 500, "server_error", NULL, NULL, "%s", err.msg);
    st = scheduler_submit(srv->m.sch, g->req, &err);
    if (st == STATUS_NOMEM)
        return api_error_set(e, 503, "server_error", NULL, "overloaded", "%s; retry later", err.msg);
    if (st == STATUS_INVALID)
        return api_error_set(e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded", "%s", err.msg);
    if (st)
        return api_error_set(e, 503, "server_error", NULL, NULL, "%s", err.msg);
    return STATUS_OK;
}

/* The answer's text, reasoning and tool-call parsers (tools parsed in gen_submit). */
static void gen_parsers_init(struct gen *g)
{
    text_stream_init(&g->ts, g->srv->m.pm.tok, g->rq.stop, g->rq.n_stop);
    reasoning_init(&g->rs, g->rq.kind != API_COMPLETIONS && g->srv->o.reasoning);
    tool_parse_init(&g->tp, g->tools ? g->srv->o.tool_format : TOOL_FORMAT_NONE, g->tools);
}

bool server_body_bounded(const struct conn_ctx *cc, struct api_error *e)
{
    /* a parse allocates a node (~200 bytes) per JSON value: bound them by what a request to this
     * model can use before parsing, so a body of ids costs memory in proportion to its use */
    const size_t max_values = 4 * (size_t)cc->srv->m.max_context + 4096;
    const size_t n_values = cc->body ? json_count_values(cc->body, cc->len) : 0;
    if (n_values <= max_values)
        return true;
    api_error_set(e, 400, "invalid_request_error", NULL, NULL,
                  "the body holds about %zu JSON values; a request to this server takes at most %zu "
                  "(4 per token of its %d-token context)",
                  n_values, max_values, cc->srv->m.max_context);
    return false;
}

/* The submitted choices gs[0..k) as one stream: the first token (or an early end) of each decides
 * the status line, as for one. Takes g0, gs and the whole-answer buffers ws, rs. */
static enum MHD_Result several_stream_start(struct conn_ctx *cc, struct gen *g0, struct gen **gs, int k,
                                            struct whole *ws, struct api_result *rs)
{
    free(ws), free(rs);
    struct several *s = calloc(1, sizeof *s);
    struct api_error e;
    enum status st = s ? STATUS_OK : api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    if (s)
        *s = (struct several){.gs = gs, .k = k, .per = g0->rq.n};
    for (int c = 0; c < k && !st; c++) {
        struct gen *g = gs[c];
        g->choice = c, g->chunk_id = gs[0]->id, g->created = gs[0]->created;
        if (!gen_wait(g, 0)) {
            st = atomic_load(&g->srv->failed)
                     ? api_error_set(&e, 503, "server_error", NULL, "rank_failed", "%s", cc->srv->fail_msg)
                     : STATUS_IO;
            break;
        }
        pthread_mutex_lock(&g->req->mu);
        int n = g->req->n_out;
        enum sched_finish f = g->req->finish;
        char msg[sizeof g->req->error];
        memcpy(msg, g->req->error, sizeof msg);
        pthread_mutex_unlock(&g->req->mu);
        if (n == 0 && (f == SCHED_FINISH_ERROR || f == SCHED_FINISH_CANCELLED)) {
            error_for_finish(f, msg, &e);
            st = STATUS_INVALID;
        }
    }
    if (g0->rq.ignored[0])
        LOG_WARN("request %s: ignored (--lenient): %s", gs[0]->id, g0->rq.ignored);
    gen_free(g0);
    if (!st)
        return reply_several_stream(cc, s);
    if (s)
        several_free(s);
    else {
        for (int c = 0; c < k; c++)
            gen_free(gs[c]);
        free(gs);
    }
    return st == STATUS_IO ? MHD_NO : server_reply_error(cc, &e);
}

/* Several choices (n) or prompts in one request: one generation each, submitted together (the
 * scheduler batches them), answered whole with the choices in order and their usage summed (a
 * prompt's tokens counted once), or streamed (several_stream_start). Takes g0, whose parsed
 * request is the template. */
static enum MHD_Result generate_several(struct conn_ctx *cc, struct gen *g0)
{
    const int per = g0->rq.n, n_prompts = 1 + g0->rq.n_more, k = per * n_prompts;
    struct gen **gs = calloc((size_t)k, sizeof *gs);
    struct whole *ws = calloc((size_t)k, sizeof *ws);
    struct api_result *rs = calloc((size_t)k, sizeof *rs);
    struct api_error e;
    enum status st = gs && ws && rs ? STATUS_OK : api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    int made = 0;
    for (int c = 0; c < k && !st; c++) {
        struct gen *g = calloc(1, sizeof *g);
        if (!g) {
            st = api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
            break;
        }
        g->srv = g0->srv, g->conn = g0->conn;
        atomic_fetch_add(&g->srv->n_live, 1);
        gs[made++] = g;
        if ((st = api_request_copy_one(&g0->rq, c / per, &g->rq, &e)))
            break;
        if (g->rq.has_seed) /* a seed repeats the whole answer; its choices still differ */
            g->rq.seed += (uint64_t)(c % per);
        if ((st = gen_submit(g, &e))) {
            sched_req_put(g->req);
            g->req = NULL;
            break;
        }
        gen_parsers_init(g);
    }
    if (!st && g0->rq.stream)
        return several_stream_start(cc, g0, gs, k, ws, rs);
    int collected = 0;
    for (int c = 0; c < k && !st; c++, collected++)
        st = whole_collect(gs[c], &ws[c], &e);
    char *body = NULL;
    if (!st) {
        struct api_result usage = ws[0].res;
        usage.prompt_tokens = usage.completion_tokens = usage.cached_tokens = 0;
        for (int c = 0; c < k; c++) {
            rs[c] = ws[c].res;
            usage.completion_tokens += ws[c].res.completion_tokens;
            if (c % per == 0) { /* a prompt's tokens once, however many choices it has */
                usage.prompt_tokens += ws[c].res.prompt_tokens;
                usage.cached_tokens += ws[c].res.cached_tokens;
            }
        }
        body = api_results_json(rs, k, &usage);
        if (!body)
            st = api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    }
    for (int c = 0; c < collected && ws; c++)
        whole_free(&ws[c]);
    for (int c = 0; c < made; c++)
        gen_free(gs[c]); /* cancels what still runs (an error stopped the others) */
    free(gs), free(ws), free(rs);
    gen_free(g0);
    if (st == STATUS_IO)
        return MHD_NO;
    return st ? server_reply_error(cc, &e) : server_reply(cc, 200, "application/json", body);
}

enum MHD_Result server_generate(struct conn_ctx *cc, enum api_kind kind)
{
    struct api_error e;
    struct gen *g = calloc(1, sizeof *g);
    if (!g)
        return MHD_NO;
    g->srv = cc->srv;
    g->conn = cc->conn;
    atomic_fetch_add(&g->srv->n_live, 1); /* gen_free counts it out: server_drain waits for it */
    if (!server_body_bounded(cc, &e)) {
        gen_free(g);
        return server_reply_error(cc, &e);
    }
    if (api_request_parse_opts(&g->rq, kind, cc->body ? cc->body : "", cc->len, g->srv->o.lenient, &e)) {
        gen_free(g);
        return server_reply_error(cc, &e);
    }
    if (g->rq.n > 1 || g->rq.n_more > 0)
        return generate_several(cc, g);
    if (gen_submit(g, &e)) {
        /* refused before the scheduler took it: no generation to log */
        sched_req_put(g->req);
        g->req = NULL;
        gen_free(g);
        return server_reply_error(cc, &e);
    }
    if (g->rq.ignored[0])
        LOG_WARN("request %s: ignored (--lenient): %s", g->id, g->rq.ignored);
    gen_parsers_init(g);
    /* the first token (or an early end) decides the status line */
    if (!gen_wait(g, 0)) {
        bool failed = atomic_load(&g->srv->failed);
        gen_free(g);
        if (!failed)
            return MHD_NO;
        api_error_set(&e, 503, "server_error", NULL, "rank_failed", "%s", cc->srv->fail_msg);
        return server_reply_error(cc, &e);
    }
    pthread_mutex_lock(&g->req->mu);
    int n = g->req->n_out;
    enum sched_finish f = g->req->finish;
    char msg[sizeof g->req->error];
    memcpy(msg, g->req->error, sizeof msg);
    pthread_mutex_unlock(&g->req->mu);
    if (n == 0 && (f == SCHED_FINISH_ERROR || f == SCHED_FINISH_CANCELLED)) {
        error_for_finish(f, msg, &e);
        gen_free(g);
        return server_reply_error(cc, &e);
    }
    return g->rq.stream ? reply_stream(cc, g) : reply_whole(cc, g);
}
