/* api_response.c — see api_response.h. Built with the JSON wrapper, so every
 * string is escaped by one printer. */
#include "server/api_response.h"

#include <stdbool.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

/* json_new_string of a slice that need not be NUL-terminated. */
static struct json *new_string_n(const char *s, size_t n)
{
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    memcpy(t, s, n);
    t[n] = 0;
    struct json *j = json_new_string(t);
    free(t);
    return j;
}

static char *finish(struct json *root)
{
    char *s = root ? json_print(root, false) : NULL;
    json_free(root);
    return s;
}

void api_scrub_paths(char *msg)
{
    char *w = msg;
    for (const char *r = msg; *r;) {
        bool start = *r == '/' && (r == msg || r[-1] == ' ' || r[-1] == '"' || r[-1] == '\'' || r[-1] == '(');
        if (start) {
            /* a run of path characters with at least two '/': keep what follows the last one */
            const char *e = r, *last = r;
            int slashes = 0;
            while (*e && *e != ' ' && *e != ':' && *e != '"' && *e != '\'' && *e != ',' && *e != ')') {
                if (*e == '/')
                    slashes++, last = e;
                e++;
            }
            if (slashes >= 2) {
                for (const char *c = last + 1; c < e; c++)
                    *w++ = *c;
                r = e;
                continue;
            }
        }
        *w++ = *r++;
    }
    *w = 0;
}

char *api_error_json(const struct api_error *e)
{
    struct json *root = json_new_object();
    struct json *err = json_add(root, "error", json_new_object());
    char msg[sizeof e->message];
    memcpy(msg, e->message, sizeof msg);
    msg[sizeof msg - 1] = 0;
    /* the client is told what went wrong, not where this server keeps its files; a route error
     * names the client's own URL, which stays */
    if (e->http_status != 404 && e->http_status != 405)
        api_scrub_paths(msg);
    json_add(err, "message", json_new_string(msg));
    json_add(err, "type", json_new_string(e->type));
    json_add(err, "param", e->param[0] ? json_new_string(e->param) : json_new_null());
    json_add(err, "code", e->code[0] ? json_new_string(e->code) : json_new_null());
    return finish(root);
}

static struct json *model_object(const char *model, long created, int max_context)
{
    struct json *m = json_new_object();
    json_add(m, "id", json_new_string(model));
    json_add(m, "object", json_new_string("model"));
    json_add(m, "created", json_new_number((double)created));
    json_add(m, "owned_by", json_new_string("moeserve"));
    json_add(m, "max_model_len", json_new_number(max_context));
    return m;
}

char *api_models_json(const char *model, long created, int max_context)
{
    struct json *root = json_new_object();
    json_add(root, "object", json_new_string("list"));
    struct json *data = json_add(root, "data", json_new_array());
    json_append(data, model_object(model, created, max_context));
    return finish(root);
}

char *api_model_json(const char *model, long created, int max_context)
{
    return finish(model_object(model, created, max_context));
}

/* The text of one token as a client sees it (special tokens included). */
static char *token_text(const struct tokenizer *tok, int32_t id, size_t *len)
{
    char *s = NULL;
    struct err err;
    if (tokenizer_decode(tok, &id, 1, false, &s, len, &err)) {
        *len = 0;
        return calloc(1, 1);
    }
    return s;
}

static struct json *bytes_array(const char *s, size_t n)
{
    struct json *a = json_new_array();
    for (size_t i = 0; i < n; i++)
        json_append(a, json_new_number((unsigned char)s[i]));
    return a;
}

static struct json *chat_logprobs(const struct api_logprobs *lp)
{
    struct json *root = json_new_object();
    struct json *content = json_add(root, "content", json_new_array());
    for (int i = 0; i < lp->n; i++) {
        struct json *t = json_append(content, json_new_object());
        size_t n;
        char *s = token_text(lp->tok, lp->ids[i], &n);
        json_add(t, "token", new_string_n(s ? s : "", s ? n : 0));
        json_add(t, "logprob", json_new_number(lp->lp[i]));
        json_add(t, "bytes", bytes_array(s, s ? n : 0));
        free(s);
        struct json *top = json_add(t, "top_logprobs", json_new_array());
        for (int j = 0; j < lp->k; j++) {
            struct json *a = json_append(top, json_new_object());
            char *ts = token_text(lp->tok, lp->top_ids[i * lp->k + j], &n);
            json_add(a, "token", new_string_n(ts ? ts : "", ts ? n : 0));
            json_add(a, "logprob", json_new_number(lp->top_lp[i * lp->k + j]));
            json_add(a, "bytes", bytes_array(ts, ts ? n : 0));
            free(ts);
        }
    }
    return root;
}

static void add_prompt_entry(struct json *pos, const struct tokenizer *tok, int32_t id, float lp, int rank)
{
    char key[16];
    snprintf(key, sizeof key, "%d", (int)id);
    if (json_get(pos, key))
        return;
    struct json *o = json_add(pos, key, json_new_object());
    json_add(o, "logprob", json_new_number(lp));
    json_add(o, "rank", json_new_number(rank));
    size_t n;
    char *s = token_text(tok, id, &n);
    json_add(o, "decoded_token", new_string_n(s ? s : "", s ? n : 0));
    free(s);
}

static struct json *prompt_logprobs_array(const struct api_prompt_logprobs *p)
{
    struct json *a = json_new_array();
    for (int i = 0; i < p->n; i++) {
        if (i == 0) { /* nothing before the first token to condition on */
            json_append(a, json_new_null());
            continue;
        }
        struct json *pos = json_append(a, json_new_object());
        add_prompt_entry(pos, p->tok, p->ids[i], p->lp[i], p->rank[i]);
        for (int j = 0; j < p->k; j++)
            add_prompt_entry(pos, p->tok, p->top_ids[(size_t)i * p->stride + j], p->top_lp[(size_t)i * p->stride + j],
                             j + 1);
    }
    return a;
}

static struct json *completion_logprobs(const struct api_logprobs *lp)
{
    struct json *root = json_new_object();
    struct json *tokens = json_add(root, "tokens", json_new_array());
    struct json *lps = json_add(root, "token_logprobs", json_new_array());
    struct json *tops = json_add(root, "top_logprobs", json_new_array());
    struct json *offs = json_add(root, "text_offset", json_new_array());
    size_t off = lp->text_offset;
    for (int i = 0; i < lp->n; i++) {
        size_t n;
        char *s = token_text(lp->tok, lp->ids[i], &n);
        json_append(tokens, new_string_n(s ? s : "", s ? n : 0));
        json_append(offs, json_new_number((double)off));
        off += s ? n : 0;
        free(s);
        if (isnan(lp->lp[i])) { /* echo's first prompt token: nothing before it to condition on */
            json_append(lps, json_new_null());
            json_append(tops, json_new_null());
            continue;
        }
        json_append(lps, json_new_number(lp->lp[i]));
        struct json *top = json_append(tops, json_new_object());
        for (int j = 0; j < lp->k; j++) {
            char *ts = token_text(lp->tok, lp->top_ids[i * lp->k + j], &n);
            /* a JSON object keyed by token text: duplicates (two ids, one text) keep the first */
            if (ts && !json_get(top, ts))
                json_add(top, ts, json_new_number(lp->top_lp[i * lp->k + j]));
            free(ts);
        }
    }
    return root;
}

static struct json *usage_object(const struct api_result *r)
{
    struct json *u = json_new_object();
    json_add(u, "prompt_tokens", json_new_number(r->prompt_tokens));
    json_add(u, "completion_tokens", json_new_number(r->completion_tokens));
    json_add(u, "total_tokens", json_new_number(r->prompt_tokens + r->completion_tokens));
    struct json *d = json_add(u, "prompt_tokens_details", json_new_object());
    json_add(d, "cached_tokens", json_new_number(r->cached_tokens));
    return u;
}

static struct json *header(const struct api_result *r, bool chunk)
{
    struct json *root = json_new_object();
    json_add(root, "id", json_new_string(r->id));
    const char *object = r->kind == API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    json_add(root, "object", json_new_string(object));
    json_add(root, "created", json_new_number((double)r->created));
    json_add(root, "model", json_new_string(r->model));
    return root;
}

/* message.tool_calls, or a chunk's delta.tool_calls (those carry their index). */
static struct json *tool_calls_array(const struct api_result *r, bool chunk)
{
    struct json *arr = json_new_array();
    for (int i = 0; i < r->n_tool_calls; i++) {
        const struct api_tool_call *t = &r->tool_calls[i];
        struct json *c = json_append(arr, json_new_object());
        if (chunk)
            json_add(c, "index", json_new_number(t->index));
        if (t->id) {
            json_add(c, "id", json_new_string(t->id));
            json_add(c, "type", json_new_string("function"));
        }
        struct json *f = json_add(c, "function", json_new_object());
        if (t->id)
            json_add(f, "name", json_new_string(t->name));
        json_add(f, "arguments", new_string_n(t->args ? t->args : "", t->args ? t->n_args : 0));
    }
    return arr;
}

static void add_choice(struct json *choices, const struct api_result *r, bool chunk, int index)
{
    struct json *c = json_append(choices, json_new_object());
    json_add(c, "index", json_new_number(index));
    if (r->kind == API_CHAT) {
        struct json *m = json_add(c, chunk ? "delta" : "message", json_new_object());
        if (!chunk || r->role)
            json_add(m, "role", json_new_string("assistant"));
        if (!chunk && !r->text_len && r->n_tool_calls) /* an answer that is only calls: content null */
            json_add(m, "content", json_new_null());
        else if (!chunk || r->text_len || r->role)
            json_add(m, "content", new_string_n(r->text, r->text_len));
        /* vLLM's field for a thinking model's reasoning: null when it wrote none */
        if (r->reasoning_on && !chunk)
            json_add(m, "reasoning_content",
                     r->reasoning_len ? new_string_n(r->reasoning, r->reasoning_len) : json_new_null());
        else if (r->reasoning_on && r->reasoning_len)
            json_add(m, "reasoning_content", new_string_n(r->reasoning, r->reasoning_len));
        if (r->n_tool_calls)
            json_add(m, "tool_calls", tool_calls_array(r, chunk));
    } else {
        json_add(c, "text", new_string_n(r->text, r->text_len));
    }
    if (r->logprobs)
        json_add(c, "logprobs", r->kind == API_CHAT ? chat_logprobs(r->logprobs) : completion_logprobs(r->logprobs));
    else
        json_add(c, "logprobs", json_new_null());
    json_add(c, "finish_reason", r->finish_reason ? json_new_string(r->finish_reason) : json_new_null());
    if (r->prompt_logprobs && r->kind == API_COMPLETIONS) /* chat: the response's, once (its one prompt) */
        json_add(c, "prompt_logprobs", prompt_logprobs_array(r->prompt_logprobs));
}

char *api_result_json(const struct api_result *r, bool chunk)
{
    struct json *root = header(r, chunk);
    add_choice(json_add(root, "choices", json_new_array()), r, chunk, r->index);
    if (!chunk && r->has_usage)
        json_add(root, "usage", usage_object(r));
    if (!chunk && r->prompt_logprobs && r->kind == API_CHAT)
        json_add(root, "prompt_logprobs", prompt_logprobs_array(r->prompt_logprobs));
    return finish(root);
}

char *api_results_json(const struct api_result *r, int k, const struct api_result *usage)
{
    struct json *root = header(&r[0], false);
    struct json *choices = json_add(root, "choices", json_new_array());
    for (int i = 0; i < k; i++)
        add_choice(choices, &r[i], false, i);
    json_add(root, "usage", usage_object(usage));
    if (r[0].prompt_logprobs && r[0].kind == API_CHAT)
        json_add(root, "prompt_logprobs", prompt_logprobs_array(r[0].prompt_logprobs));
    return finish(root);
}

char *api_usage_chunk_json(const struct api_result *r)
{
    struct json *root = header(r, true);
    json_add(root, "choices", json_new_array());
    json_add(root, "usage", usage_object(r));
    return finish(root);
}

struct json *api_responses_message_item(const char *id, const char *status, const char *text, size_t n)
{
    struct json *it = json_new_object();
    json_add(it, "type", json_new_string("message"));
    json_add(it, "id", json_new_string(id));
    json_add(it, "status", json_new_string(status));
    json_add(it, "role", json_new_string("assistant"));
    struct json *content = json_add(it, "content", json_new_array());
    if (text) {
        struct json *part = json_append(content, json_new_object());
        json_add(part, "type", json_new_string("output_text"));
        json_add(part, "text", new_string_n(text, n));
        json_add(part, "annotations", json_new_array());
    }
    return it;
}

struct json *api_responses_call_item(const struct api_tool_call *c, const char *status, bool with_args)
{
    struct json *it = json_new_object();
    char id[64];
    snprintf(id, sizeof id, "fc_%s", strncmp(c->id, "call_", 5) == 0 ? c->id + 5 : c->id);
    json_add(it, "type", json_new_string("function_call"));
    json_add(it, "id", json_new_string(id));
    json_add(it, "call_id", json_new_string(c->id));
    json_add(it, "name", json_new_string(c->name));
    json_add(it, "arguments", with_args ? new_string_n(c->args ? c->args : "", c->args ? c->n_args : 0) : json_new_string(""));
    json_add(it, "status", json_new_string(status));
    return it;
}

struct json *api_responses_reasoning_item(const char *id, const char *status, const char *text, size_t n)
{
    struct json *it = json_new_object();
    json_add(it, "type", json_new_string("reasoning"));
    json_add(it, "id", json_new_string(id));
    json_add(it, "status", json_new_string(status));
    json_add(it, "summary", json_new_array());
    struct json *content = json_add(it, "content", json_new_array());
    if (text) {
        struct json *part = json_append(content, json_new_object());
        json_add(part, "type", json_new_string("reasoning_text"));
        json_add(part, "text", new_string_n(text, n));
    }
    return it;
}

struct json *api_responses_object(const struct api_responses_view *v)
{
    struct json *o = json_new_object();
    json_add(o, "id", json_new_string(v->id));
    json_add(o, "object", json_new_string("response"));
    json_add(o, "created_at", json_new_number((double)v->created));
    json_add(o, "status", json_new_string(v->status));
    if (v->incomplete_reason) {
        struct json *d = json_add(o, "incomplete_details", json_new_object());
        json_add(d, "reason", json_new_string(v->incomplete_reason));
    } else {
        json_add(o, "incomplete_details", json_new_null());
    }
    json_add(o, "error", json_new_null());
    json_add(o, "model", json_new_string(v->model));
    struct json *out = json_add(o, "output", json_new_array());
    if (v->output) {
        if (v->reasoning_len)
            json_append(out, api_responses_reasoning_item(v->rs_id, "completed", v->reasoning, v->reasoning_len));
        if (v->text_len || !v->n_calls)
            json_append(out, api_responses_message_item(v->msg_id, strcmp(v->status, "completed") == 0 ? "completed"
                                                                                                      : "incomplete",
                                                        v->text ? v->text : "", v->text_len));
        for (int i = 0; i < v->n_calls; i++)
            json_append(out, api_responses_call_item(&v->calls[i], "completed", true));
    }
    json_add(o, "parallel_tool_calls", json_new_bool(false));
    if (v->tool_choice == API_TOOL_NAMED && v->tool_name) {
        struct json *tc = json_add(o, "tool_choice", json_new_object());
        json_add(tc, "type", json_new_string("function"));
        json_add(tc, "name", json_new_string(v->tool_name));
    } else {
        json_add(o, "tool_choice", json_new_string(!v->tools                           ? "none"
                                                   : v->tool_choice == API_TOOL_NONE     ? "none"
                                                   : v->tool_choice == API_TOOL_REQUIRED ? "required"
                                                                                         : "auto"));
    }
    /* the tools as the Responses API writes them: {type, name, description, parameters, strict} */
    struct json *tools = json_add(o, "tools", json_new_array());
    for (const struct json *t = json_child(v->tools); t && tools; t = json_next(t)) {
        struct json *r = json_append(tools, json_new_object());
        json_add(r, "type", json_new_string("function"));
        for (const struct json *m = json_child(json_get(t, "function")); m && r; m = json_next(m))
            json_add(r, json_key(m), json_copy(m));
    }
    json_add(o, "temperature", json_new_number(v->temperature));
    json_add(o, "top_p", json_new_number(v->top_p));
    json_add(o, "max_output_tokens", v->max_output_tokens ? json_new_number(v->max_output_tokens) : json_new_null());
    struct json *text = json_add(o, "text", json_new_object());
    json_add(json_add(text, "format", json_new_object()), "type", json_new_string("text"));
    json_add(o, "store", json_new_bool(false)); /* nothing is kept: no GET /v1/responses/{id} */
    if (v->output) {
        struct json *u = json_add(o, "usage", json_new_object());
        json_add(u, "input_tokens", json_new_number(v->input_tokens));
        json_add(json_add(u, "input_tokens_details", json_new_object()), "cached_tokens", json_new_number(v->cached_tokens));
        json_add(u, "output_tokens", json_new_number(v->output_tokens));
        json_add(json_add(u, "output_tokens_details", json_new_object()), "reasoning_tokens", json_new_number(0));
        json_add(u, "total_tokens", json_new_number(v->input_tokens + v->output_tokens));
    } else {
        json_add(o, "usage", json_new_null());
    }
    return o;
}

char *api_responses_json(const struct api_responses_view *v)
{
    return finish(api_responses_object(v));
}

char *api_responses_event(const char *type, int seq, struct json *fields)
{
    struct json *o = json_new_object();
    json_add(o, "type", json_new_string(type));
    json_add(o, "sequence_number", json_new_number(seq));
    char *body = fields ? json_print(fields, false) : NULL;
    json_free(fields);
    char *head = finish(o);
    if (!head || (fields && !body)) {
        free(head), free(body);
        return NULL;
    }
    /* the fields' members after type and sequence_number: splice the two objects' texts */
    size_t nh = strlen(head), nb = body ? strlen(body) : 0;
    size_t cap = strlen(type) + nh + nb + 32;
    char *ev = malloc(cap);
    if (ev) {
        int k = snprintf(ev, cap, "event: %s\ndata: %.*s", type, (int)(nh - 1), head); /* without its '}' */
        if (nb > 2)
            k += snprintf(ev + k, cap - (size_t)k, ",%s", body + 1); /* without its '{' */
        else
            k += snprintf(ev + k, cap - (size_t)k, "}");
        snprintf(ev + k, cap - (size_t)k, "\n\n");
    }
    free(head), free(body);
    return ev;
}
