/* api_request.c — see api_request.h.
 *
 * Limits follow OpenAI's API where it states them (temperature 0..2, top_p in
 * (0, 1], at most 4 stop sequences, completions logprobs 0..5, chat
 * top_logprobs 0..20, n = 1 here since one request is one sequence).
 */
#include "server/api_request.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "engine/grammar.h"
#include "server/api_format.h"

enum status api_error_set(struct api_error *e, int http_status, const char *type, const char *param,
                          const char *code, const char *fmt, ...)
{
    e->http_status = http_status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return STATUS_INVALID;
}

static enum status bad(struct api_error *e, const char *param, const char *fmt, const char *what)
{
    return api_error_set(e, 400, "invalid_request_error", param, NULL, fmt, param, what);
}

/* The member named key, NULL when absent or JSON null. */
static const struct json *field(const struct json *obj, const char *key)
{
    const struct json *j = json_get(obj, key);
    return json_is_null(j) ? NULL : j;
}

static bool is_int(const struct json *j, double lo, double hi)
{
    if (!json_is_number(j))
        return false;
    double v = json_number(j);
    return v == floor(v) && v >= lo && v <= hi;
}

static enum status get_int(const struct json *obj, const char *key, double lo, double hi, int *out, bool *given,
                           struct api_error *e)
{
    const struct json *j = field(obj, key);
    if (given)
        *given = j != NULL;
    if (!j)
        return STATUS_OK;
    if (!json_is_number(j) || json_number(j) != floor(json_number(j)))
        return bad(e, key, "'%s' must be an integer%s", "");
    if (!is_int(j, lo, hi))
        return api_error_set(e, 400, "invalid_request_error", key, NULL, "'%s' must be between %.0f and %.0f, got %.17g",
                             key, lo, hi, json_number(j));
    *out = (int)json_number(j);
    return STATUS_OK;
}

static enum status get_num(const struct json *obj, const char *key, double lo, double hi, bool lo_open,
                           double *out, struct api_error *e)
{
    const struct json *j = field(obj, key);
    if (!j)
        return STATUS_OK;
    if (!json_is_number(j))
        return bad(e, key, "'%s' must be a number%s", "");
    double v = json_number(j);
    if (!(lo_open ? v > lo : v >= lo) || !(v <= hi))
        return api_error_set(e, 400, "invalid_request_error", key, NULL, "'%s' must be in %s%g, %g], got %.17g", key,
                             lo_open ? "(" : "[", lo, hi, v);
    *out = v;
    return STATUS_OK;
}

static enum status get_bool(const struct json *obj, const char *key, bool *out, struct api_error *e)
{
    const struct json *j = field(obj, key);
    if (!j)
        return STATUS_OK;
    if (!json_is_bool(j))
        return bad(e, key, "'%s' must be a boolean%s", "");
    *out = json_bool(j);
    return STATUS_OK;
}

static char *dup_str(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static enum status oom(struct api_error *e)
{
    return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory while reading the request");
}

/* A JSON array of token ids: [1, 2, 3]. */
static enum status parse_ids(const struct json *arr, struct api_request *rq, struct api_error *e)
{
    size_t n = json_array_size(arr);
    rq->prompt_ids = malloc((n ? n : 1) * sizeof *rq->prompt_ids);
    if (!rq->prompt_ids)
        return oom(e);
    int i = 0;
    for (const struct json *c = json_child(arr); c; c = json_next(c), i++) {
        if (!is_int(c, 0, 2147483647.0))
            return bad(e, "prompt", "'%s' as a list of tokens must hold non-negative integers%s", "");
        rq->prompt_ids[i] = (int32_t)json_number(c);
    }
    rq->n_prompt_ids = i;
    return STATUS_OK;
}

static enum status parse_prompt(const struct json *body, struct api_request *rq, struct api_error *e)
{
    const struct json *p = field(body, "prompt");
    if (!p)
        return bad(e, "prompt", "'%s' is required%s", "");
    if (json_is_string(p)) {
        rq->prompt_text = dup_str(json_string(p), strlen(json_string(p)));
        return rq->prompt_text ? STATUS_OK : oom(e);
    }
    if (!json_is_array(p))
        return bad(e, "prompt", "'%s' must be a string, a list of token ids, or a list of one of those%s", "");
    size_t n = json_array_size(p);
    const struct json *first = json_child(p);
    if (n == 0)
        return bad(e, "prompt", "'%s' must not be empty%s", "");
    if (json_is_number(first))
        return parse_ids(p, rq, e);
    if (n > API_MAX_PROMPTS)
        return api_error_set(e, 400, "invalid_request_error", "prompt", NULL, "'prompt' holds %zu prompts; at most %d",
                             n, API_MAX_PROMPTS);
    if (n > 1 && !(rq->more = calloc(n - 1, sizeof *rq->more)))
        return oom(e);
    int i = 0;
    for (const struct json *c = first; c; c = json_next(c), i++) {
        /* each prompt parsed as the request's own, then moved to its slot */
        struct api_request one = {0};
        enum status st;
        if (json_is_string(c))
            st = (one.prompt_text = dup_str(json_string(c), strlen(json_string(c)))) ? STATUS_OK : oom(e);
        else if (json_is_array(c) && json_array_size(c) > 0)
            st = parse_ids(c, &one, e);
        else
            st = bad(e, "prompt", "'%s' as a list must hold strings or lists of token ids, none empty%s", "");
        if (st) {
            free(one.prompt_text), free(one.prompt_ids);
            return st;
        }
        if (i == 0) {
            rq->prompt_text = one.prompt_text, rq->prompt_ids = one.prompt_ids, rq->n_prompt_ids = one.n_prompt_ids;
        } else {
            rq->more[i - 1] = (struct api_prompt){.text = one.prompt_text, .ids = one.prompt_ids, .n_ids = one.n_prompt_ids};
            rq->n_more = i;
        }
    }
    return STATUS_OK;
}

/* content: a string, null, or a list of parts of which the text ones count. */
static enum status parse_content(const struct json *c, int i, char **out, struct api_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!c) {
        *out = dup_str("", 0);
        return *out ? STATUS_OK : oom(e);
    }
    if (json_is_string(c)) {
        *out = dup_str(json_string(c), strlen(json_string(c)));
        return *out ? STATUS_OK : oom(e);
    }
    if (!json_is_array(c))
        return bad(e, param, "'%s' must be a string or a list of content parts%s", "");
    size_t total = 0;
    for (const struct json *p = json_child(c); p; p = json_next(p)) {
        const struct json *type = json_get(p, "type"), *text = json_get(p, "text");
        if (!json_is_object(p) || !json_is_string(type))
            return bad(e, param, "'%s': each content part must be an object with a string 'type'%s", "");
        /* chat's "text"; the Responses API's "input_text" / "output_text" */
        if (strcmp(json_string(type), "text") != 0 && strcmp(json_string(type), "input_text") != 0 &&
            strcmp(json_string(type), "output_text") != 0)
            return api_error_set(e, 400, "invalid_request_error", param, NULL,
                                 "'%s': content parts of type '%.40s' are not supported (text only)", param,
                                 json_string(type));
        if (!json_is_string(text))
            return bad(e, param, "'%s': a text part needs a string 'text'%s", "");
        total += strlen(json_string(text));
    }
    char *s = malloc(total + 1);
    if (!s)
        return oom(e);
    size_t at = 0;
    for (const struct json *p = json_child(c); p; p = json_next(p)) {
        const char *t = json_string(json_get(p, "text"));
        memcpy(s + at, t, strlen(t));
        at += strlen(t);
    }
    s[at] = 0;
    *out = s;
    return STATUS_OK;
}

/* OpenAI's function names: a-z, A-Z, 0-9, _ and -, 1 to 64 of them. */
static bool tool_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > API_MAX_TOOL_NAME)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

/* One assistant tool call, checked, into `out` as the templates take it: {id, type, function:
 * {name, arguments}} with arguments an object (OpenAI sends them as JSON text; the templates of
 * GLM-4.5 iterate over them, Qwen3's print them with tojson either way, as vLLM passes them). */
static enum status parse_tool_call(const struct json *tc, int i, int k, struct json *out, struct api_error *e)
{
    char param[96];
    snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, k);
    const struct json *id = field(tc, "id"), *type = field(tc, "type"), *fn = field(tc, "function");
    if (!json_is_object(tc) || !json_is_object(fn))
        return bad(e, param, "'%s' must be an object with a 'function' object%s", "");
    if (type && !(json_is_string(type) && strcmp(json_string(type), "function") == 0))
        return bad(e, param, "'%s': 'type' must be \"function\"%s", "");
    if (id && !json_is_string(id))
        return bad(e, param, "'%s': 'id' must be a string%s", "");
    const struct json *name = field(fn, "name"), *args = field(fn, "arguments");
    if (!json_is_string(name) || !*json_string(name)) {
        snprintf(param, sizeof param, "messages[%d].tool_calls[%d].function.name", i, k);
        return bad(e, param, "'%s' must be a non-empty string%s", "");
    }
    struct json *obj = NULL;
    snprintf(param, sizeof param, "messages[%d].tool_calls[%d].function.arguments", i, k);
    if (json_is_string(args)) {
        const char *a = json_string(args);
        if (json_parse(a, strlen(a), "arguments", &obj, NULL) != STATUS_OK || !json_is_object(obj)) {
            json_free(obj);
            return bad(e, param, "'%s' must be a JSON object (as text)%s", "");
        }
    } else if (json_is_object(args)) {
        obj = json_copy(args);
    } else if (!args) {
        obj = json_new_object();
    } else {
        return bad(e, param, "'%s' must be a JSON object as text%s", "");
    }
    if (!obj)
        return oom(e);
    struct json *f = json_new_object(); /* json_add takes its value, also when it fails */
    if (!f || !json_add(f, "name", json_new_string(json_string(name)))) {
        json_free(f);
        json_free(obj);
        return oom(e);
    }
    if (!json_add(f, "arguments", obj) ||
        !((!id || json_add(out, "id", json_new_string(json_string(id)))) && json_add(out, "type", json_new_string("function")))) {
        json_free(f);
        return oom(e);
    }
    bool ok = json_add(out, "function", f) != NULL;
    return ok ? STATUS_OK : oom(e);
}

/* What a message carries beside role and content for the template: an assistant's tool_calls
 * (checked; arguments as objects) and reasoning_content, a tool result's tool_call_id, a name. */
static enum status parse_message_extra(const struct json *c, int i, struct api_message *m, struct api_error *e)
{
    char param[64];
    const struct json *tcs = field(c, "tool_calls"), *tid = field(c, "tool_call_id"), *name = field(c, "name"),
                      *rc = field(c, "reasoning_content");
    if (!tcs && !tid && !name && !rc)
        return STATUS_OK;
    static const char *const KEYS[] = {"tool_call_id", "name", "reasoning_content"};
    const struct json *vals[] = {tid, name, rc};
    for (int k = 0; k < 3; k++)
        if (vals[k] && !json_is_string(vals[k])) {
            snprintf(param, sizeof param, "messages[%d].%s", i, KEYS[k]);
            return bad(e, param, "'%s' must be a string%s", "");
        }
    if (tcs && strcmp(m->role, "assistant") != 0) {
        snprintf(param, sizeof param, "messages[%d].tool_calls", i);
        return bad(e, param, "'%s': only assistant messages have tool calls%s", "");
    }
    if (tcs && !json_is_array(tcs)) {
        snprintf(param, sizeof param, "messages[%d].tool_calls", i);
        return bad(e, param, "'%s' must be a list%s", "");
    }
    struct json *x = json_new_object();
    enum status st = x ? STATUS_OK : oom(e);
    if (!st && tcs && json_child(tcs)) {
        struct json *arr = json_add(x, "tool_calls", json_new_array());
        if (!arr)
            st = oom(e);
        int k = 0;
        for (const struct json *tc = json_child(tcs); tc && !st; tc = json_next(tc), k++) {
            struct json *one = json_append(arr, json_new_object());
            st = one ? parse_tool_call(tc, i, k, one, e) : oom(e);
        }
    }
    for (int k = 0; k < 3 && !st; k++)
        if (vals[k] && !json_add(x, KEYS[k], json_new_string(json_string(vals[k]))))
            st = oom(e);
    if (!st && json_child(x) && !(m->extra = json_print(x, false)))
        st = oom(e);
    json_free(x);
    return st;
}

static enum status parse_messages(const struct json *body, struct api_request *rq, struct api_error *e)
{
    const struct json *m = field(body, "messages");
    if (!m)
        return bad(e, "messages", "'%s' is required%s", "");
    if (!json_is_array(m))
        return bad(e, "messages", "'%s' must be a list of messages%s", "");
    size_t n = json_array_size(m);
    if (n == 0)
        return bad(e, "messages", "'%s' must not be empty%s", "");
    rq->messages = calloc(n, sizeof *rq->messages);
    if (!rq->messages)
        return oom(e);
    int i = 0;
    for (const struct json *c = json_child(m); c; c = json_next(c), i++) {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        rq->n_messages = i + 1;
        if (!json_is_object(c))
            return bad(e, param, "'%s' must be an object%s", "");
        const struct json *role = json_get(c, "role");
        if (!json_is_string(role)) {
            snprintf(param, sizeof param, "messages[%d].role", i);
            return bad(e, param, "'%s' must be a string%s", "");
        }
        rq->messages[i].role = dup_str(json_string(role), strlen(json_string(role)));
        if (!rq->messages[i].role)
            return oom(e);
        enum status st = parse_content(field(c, "content"), i, &rq->messages[i].content, e);
        if (!st)
            st = parse_message_extra(c, i, &rq->messages[i], e);
        if (st)
            return st;
    }
    return STATUS_OK;
}

static enum status parse_stop(const struct json *body, struct api_request *rq, struct api_error *e)
{
    const struct json *s = field(body, "stop");
    if (!s)
        return STATUS_OK;
    if (json_is_string(s)) {
        if (!*json_string(s))
            return STATUS_OK;
        rq->stop[0] = dup_str(json_string(s), strlen(json_string(s)));
        rq->n_stop = 1;
        return rq->stop[0] ? STATUS_OK : oom(e);
    }
    if (!json_is_array(s))
        return bad(e, "stop", "'%s' must be a string or a list of strings%s", "");
    if (json_array_size(s) > API_MAX_STOP)
        return api_error_set(e, 400, "invalid_request_error", "stop", NULL, "'stop' takes at most %d sequences, got %zu",
                             API_MAX_STOP, json_array_size(s));
    for (const struct json *c = json_child(s); c; c = json_next(c)) {
        if (!json_is_string(c))
            return bad(e, "stop", "'%s' must be a string or a list of strings%s", "");
        if (!*json_string(c))
            continue;
        rq->stop[rq->n_stop] = dup_str(json_string(c), strlen(json_string(c)));
        if (!rq->stop[rq->n_stop++])
            return oom(e);
    }
    return STATUS_OK;
}

/* The logit processors and min-p (engine/sampler.h), min_tokens and stop_token_ids. */
static enum status parse_penalties(const struct json *body, struct api_request *rq, struct api_error *e)
{
    enum status st;
    rq->repetition_penalty = 1.0;
    if ((st = get_num(body, "frequency_penalty", -2, 2, false, &rq->frequency_penalty, e)) ||
        (st = get_num(body, "presence_penalty", -2, 2, false, &rq->presence_penalty, e)) ||
        (st = get_num(body, "repetition_penalty", 0, 10, true, &rq->repetition_penalty, e)) ||
        (st = get_num(body, "min_p", 0, 1, false, &rq->min_p, e)) ||
        (st = get_int(body, "min_tokens", 0, 2147483647.0, &rq->min_tokens, NULL, e)))
        return st;
    if (rq->max_tokens > 0 && rq->min_tokens > rq->max_tokens)
        return api_error_set(e, 400, "invalid_request_error", "min_tokens", NULL,
                             "'min_tokens' (%d) must not exceed 'max_tokens' (%d)", rq->min_tokens, rq->max_tokens);
    const struct json *lb = field(body, "logit_bias");
    if (lb && !json_is_object(lb))
        return bad(e, "logit_bias", "'%s' must be an object of token ids to numbers%s", "");
    for (const struct json *m = lb ? json_child(lb) : NULL; m; m = json_next(m)) {
        const char *k = json_key(m);
        char *end = NULL;
        long id = k ? strtol(k, &end, 10) : -1;
        if (!k || !*k || *end || id < 0 || id > 2147483647L)
            return api_error_set(e, 400, "invalid_request_error", "logit_bias", NULL,
                                 "'logit_bias' keys must be token ids (non-negative integers), got \"%.40s\"", k ? k : "");
        if (!json_is_number(m) || !(json_number(m) >= -100 && json_number(m) <= 100))
            return api_error_set(e, 400, "invalid_request_error", "logit_bias", NULL,
                                 "'logit_bias' values must be numbers in [-100, 100] (token %ld)", id);
        if (rq->n_bias == API_MAX_BIAS)
            return api_error_set(e, 400, "invalid_request_error", "logit_bias", NULL,
                                 "'logit_bias' takes at most %d tokens", API_MAX_BIAS);
        rq->bias_ids[rq->n_bias] = (int32_t)id;
        rq->bias[rq->n_bias++] = (float)json_number(m);
    }
    const struct json *si = field(body, "stop_token_ids");
    if (si && !json_is_array(si))
        return bad(e, "stop_token_ids", "'%s' must be a list of token ids%s", "");
    for (const struct json *c = si ? json_child(si) : NULL; c; c = json_next(c)) {
        if (!is_int(c, 0, 2147483647.0) || json_number(c) != floor(json_number(c)))
            return bad(e, "stop_token_ids", "'%s' must be a list of token ids (non-negative integers)%s", "");
        if (rq->n_stop_ids == API_MAX_STOP_IDS)
            return api_error_set(e, 400, "invalid_request_error", "stop_token_ids", NULL,
                                 "'stop_token_ids' takes at most %d ids", API_MAX_STOP_IDS);
        rq->stop_ids[rq->n_stop_ids++] = (int32_t)json_number(c);
    }
    return STATUS_OK;
}

/* chat_template_kwargs: extra variables of the chat template (Qwen3's enable_thinking, ...), kept as
 * JSON text; the names the server itself sets are refused. */
static enum status parse_template_kwargs(const struct json *body, struct api_request *rq, struct api_error *e)
{
    const struct json *k = field(body, "chat_template_kwargs");
    if (!k)
        return STATUS_OK;
    if (rq->kind != API_CHAT)
        return bad(e, "chat_template_kwargs", "'%s' applies to chat completions only%s", "");
    if (!json_is_object(k))
        return bad(e, "chat_template_kwargs", "'%s' must be an object%s", "");
    static const char *const RESERVED[] = {"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"};
    for (const struct json *m = json_child(k); m; m = json_next(m))
        for (size_t i = 0; i < sizeof RESERVED / sizeof RESERVED[0]; i++)
            if (strcmp(json_key(m), RESERVED[i]) == 0)
                return api_error_set(e, 400, "invalid_request_error", "chat_template_kwargs", NULL,
                                     "'chat_template_kwargs' cannot set '%s' (the server sets it)", RESERVED[i]);
    rq->template_kwargs = json_print(k, false);
    return rq->template_kwargs ? STATUS_OK : oom(e);
}

/* chat_template: the request's own template, compiled when the prompt is built. */
static enum status parse_chat_template(const struct json *body, struct api_request *rq, struct api_error *e)
{
    const struct json *t = field(body, "chat_template");
    if (!t)
        return STATUS_OK;
    if (rq->kind != API_CHAT)
        return bad(e, "chat_template", "'%s' applies to chat completions only%s", "");
    if (!json_is_string(t))
        return bad(e, "chat_template", "'%s' must be a string (a Jinja template)%s", "");
    size_t n = strlen(json_string(t));
    if (n > API_MAX_TEMPLATE_BYTES)
        return api_error_set(e, 400, "invalid_request_error", "chat_template", NULL,
                             "'chat_template' is %zu bytes; at most %d", n, API_MAX_TEMPLATE_BYTES);
    rq->chat_template = dup_str(json_string(t), n);
    return rq->chat_template ? STATUS_OK : oom(e);
}

/* tools: a list of {type: "function", function: {name, description?, parameters?, strict?}},
 * kept as JSON text for the template (and the call parser: parameter types); tool_choice (required
 * and named are constrained decoding: the server compiles their grammar, which needs the model's
 * call format). */
/* response_format {"type": "text"}: no constraint. */
static bool asks_nothing_format(const struct json *f)
{
    const struct json *t = json_get(f, "type");
    return json_is_string(t) && strcmp(json_string(t), "text") == 0;
}

static enum status parse_tools(const struct json *body, struct api_request *rq, struct api_error *e)
{
    const struct json *tools = field(body, "tools"), *tc = field(body, "tool_choice");
    if (tools && json_is_array(tools) && !json_child(tools))
        tools = NULL; /* [] asks for nothing */
    if (rq->kind != API_CHAT) {
        if (tools || (tc && !(json_is_string(tc) && strcmp(json_string(tc), "none") == 0)))
            return api_error_set(e, 400, "invalid_request_error", tools ? "tools" : "tool_choice", "unsupported_parameter",
                                 "'%s' applies to chat completions only", tools ? "tools" : "tool_choice");
        return STATUS_OK;
    }
    if (tools && !json_is_array(tools))
        return bad(e, "tools", "'%s' must be a list of tools%s", "");
    if (json_array_size(tools) > API_MAX_TOOLS)
        return api_error_set(e, 400, "invalid_request_error", "tools", NULL, "'tools' holds %zu tools; at most %d",
                             json_array_size(tools), API_MAX_TOOLS);
    int i = 0;
    for (const struct json *t = json_child(tools); t; t = json_next(t), i++) {
        char param[64];
        snprintf(param, sizeof param, "tools[%d]", i);
        const struct json *type = json_get(t, "type"), *fn = json_get(t, "function");
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string(type), "function") != 0 ||
            !json_is_object(fn))
            return bad(e, param, "'%s' must be {\"type\": \"function\", \"function\": {...}} (function tools only)%s", "");
        const struct json *name = json_get(fn, "name"), *desc = field(fn, "description"), *par = field(fn, "parameters"),
                          *strict = field(fn, "strict");
        snprintf(param, sizeof param, "tools[%d].function.name", i);
        if (!json_is_string(name) || !tool_name_ok(json_string(name)))
            return bad(e, param, "'%s' must be 1 to 64 of a-z, A-Z, 0-9, _ and -%s", "");
        for (const struct json *u = json_child(tools); u != t; u = json_next(u))
            if (strcmp(json_string(json_get(json_get(u, "function"), "name")), json_string(name)) == 0)
                return api_error_set(e, 400, "invalid_request_error", param, NULL, "'%s': '%s' is defined twice",
                                     param, json_string(name));
        snprintf(param, sizeof param, "tools[%d].function.description", i);
        if (desc && !json_is_string(desc))
            return bad(e, param, "'%s' must be a string%s", "");
        snprintf(param, sizeof param, "tools[%d].function.parameters", i);
        if (par && !json_is_object(par))
            return bad(e, param, "'%s' must be a JSON Schema object%s", "");
        snprintf(param, sizeof param, "tools[%d].function.strict", i);
        if (strict && !json_is_bool(strict))
            return bad(e, param, "'%s' must be a boolean%s", "");
    }
    rq->tool_choice = tools ? API_TOOL_AUTO : API_TOOL_NONE;
    if (tc && json_is_string(tc)) {
        const char *v = json_string(tc);
        if (strcmp(v, "none") == 0)
            rq->tool_choice = API_TOOL_NONE;
        else if (strcmp(v, "auto") == 0 || strcmp(v, "required") == 0)
            rq->tool_choice = v[0] == 'a' ? API_TOOL_AUTO : API_TOOL_REQUIRED;
        else
            return bad(e, "tool_choice", "'%s' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}%s", "");
    } else if (tc) {
        const struct json *type = json_get(tc, "type"), *name = json_get(json_get(tc, "function"), "name");
        if (!json_is_object(tc) || !json_is_string(type) || strcmp(json_string(type), "function") != 0 ||
            !json_is_string(name))
            return bad(e, "tool_choice", "'%s' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}%s", "");
        bool known = false;
        for (const struct json *t = json_child(tools); t && !known; t = json_next(t))
            known = strcmp(json_string(json_get(json_get(t, "function"), "name")), json_string(name)) == 0;
        if (!known)
            return api_error_set(e, 400, "invalid_request_error", "tool_choice", NULL,
                                 "'tool_choice' names the function '%.64s', which is not in 'tools'", json_string(name));
        rq->tool_choice = API_TOOL_NAMED;
        snprintf(rq->tool_name, sizeof rq->tool_name, "%s", json_string(name));
    }
    if (!tools && rq->tool_choice == API_TOOL_AUTO)
        rq->tool_choice = API_TOOL_NONE; /* "auto" among no tools asks for nothing */
    if (!tools && rq->tool_choice != API_TOOL_NONE)
        return bad(e, "tool_choice", "'%s' forcing a call needs 'tools'%s", "");
    if ((rq->tool_choice == API_TOOL_REQUIRED || rq->tool_choice == API_TOOL_NAMED) && field(body, "response_format") &&
        !asks_nothing_format(field(body, "response_format")))
        return bad(e, "tool_choice", "'%s' forcing a call and 'response_format' both constrain the answer: one at a "
                   "time%s", "");
    bool parallel = true;
    enum status st = get_bool(body, "parallel_tool_calls", &parallel, e);
    if (st)
        return st;
    rq->single_call = !parallel;
    if (tools && !(rq->tools = json_print(tools, false)))
        return oom(e);
    return STATUS_OK;
}

/* What an unsupported field's value may be and still ask for nothing. */
/* EMPTY: null, false, 0, "", [], {}; ONE: those or 1; NONE: or "none"; TEXT: or {"type": "text"};
 * NULL: null only; TRUE: null or true (a default that is on); DEFAULT: null or the bool this server
 * does for the request's kind (true on completions, false on chat: add_special_tokens);
 * TEXT_ONLY: or ["text"]; MEDIUM: or "medium". */
enum neutral { NEUTRAL_EMPTY, NEUTRAL_ONE, NEUTRAL_NONE, NEUTRAL_TEXT, NEUTRAL_NULL, NEUTRAL_TRUE, NEUTRAL_DEFAULT,
               NEUTRAL_TEXT_ONLY, NEUTRAL_MEDIUM };

static const struct {
    const char *name;
    enum neutral ok;
} UNSUPPORTED[] = {
    {"functions", NEUTRAL_EMPTY},
    {"function_call", NEUTRAL_NONE},
    {"suffix", NEUTRAL_EMPTY},          {"best_of", NEUTRAL_ONE},
    {"guided_json", NEUTRAL_EMPTY},     {"guided_regex", NEUTRAL_EMPTY},   {"guided_choice", NEUTRAL_EMPTY},
    {"guided_grammar", NEUTRAL_EMPTY},  {"structured_outputs", NEUTRAL_EMPTY}, {"audio", NEUTRAL_EMPTY},
    {"prediction", NEUTRAL_EMPTY},      {"reasoning_effort", NEUTRAL_EMPTY},
    /* OpenAI's that change an answer (store: retrievable later; none is kept here) */
    {"store", NEUTRAL_EMPTY},           {"modalities", NEUTRAL_TEXT_ONLY},
    {"verbosity", NEUTRAL_MEDIUM},      {"web_search_options", NEUTRAL_EMPTY},
    /* vLLM's sampling and rendering extensions, at their defaults (this server's behaviour) */
    {"use_beam_search", NEUTRAL_EMPTY}, {"length_penalty", NEUTRAL_ONE},
    {"include_stop_str_in_output", NEUTRAL_EMPTY},
    {"skip_special_tokens", NEUTRAL_TRUE}, {"spaces_between_special_tokens", NEUTRAL_TRUE},
    {"truncate_prompt_tokens", NEUTRAL_NULL}, {"allowed_token_ids", NEUTRAL_EMPTY},
    {"bad_words", NEUTRAL_EMPTY},       {"add_generation_prompt", NEUTRAL_TRUE},
    {"continue_final_message", NEUTRAL_EMPTY}, {"add_special_tokens", NEUTRAL_DEFAULT},
    {"documents", NEUTRAL_EMPTY},       {"mm_processor_kwargs", NEUTRAL_EMPTY},
    {"structural_tag", NEUTRAL_EMPTY},  {"guided_decoding_backend", NEUTRAL_EMPTY},
    {"guided_whitespace_pattern", NEUTRAL_EMPTY}, {"priority", NEUTRAL_EMPTY},
    {"request_id", NEUTRAL_EMPTY},      {"logits_processors", NEUTRAL_EMPTY},
    {"return_tokens_as_token_ids", NEUTRAL_EMPTY}, {"return_token_ids", NEUTRAL_EMPTY},
    {"cache_salt", NEUTRAL_EMPTY},      {"kv_transfer_params", NEUTRAL_EMPTY},
    {"vllm_xargs", NEUTRAL_EMPTY},      {"prompt_embeds", NEUTRAL_EMPTY},
    {"logprobs_mode", NEUTRAL_EMPTY},
};

static bool asks_nothing(const struct json *j, enum neutral ok, enum api_kind kind)
{
    if (ok == NEUTRAL_NULL)
        return json_is_null(j);
    if (ok == NEUTRAL_TRUE || ok == NEUTRAL_DEFAULT)
        return json_is_null(j) ||
               (json_is_bool(j) && json_bool(j) == (ok == NEUTRAL_TRUE || kind == API_COMPLETIONS));
    if (json_is_null(j) || (json_is_bool(j) && !json_bool(j)) || (json_is_number(j) && json_number(j) == 0) ||
        (json_is_string(j) && !json_string(j)[0]) ||
        ((json_is_array(j) || json_is_object(j)) && !json_child(j)))
        return true;
    switch (ok) {
    case NEUTRAL_ONE: return json_is_number(j) && json_number(j) == 1;
    case NEUTRAL_NONE: return json_is_string(j) && strcmp(json_string(j), "none") == 0;
    case NEUTRAL_TEXT: {
        const struct json *t = json_get(j, "type");
        return json_is_string(t) && strcmp(json_string(t), "text") == 0 && !json_next(json_child(j));
    }
    case NEUTRAL_TEXT_ONLY:
        return json_is_array(j) && json_array_size(j) == 1 && json_is_string(json_child(j)) &&
               strcmp(json_string(json_child(j)), "text") == 0;
    case NEUTRAL_MEDIUM: return json_is_string(j) && strcmp(json_string(j), "medium") == 0;
    case NEUTRAL_EMPTY:
    case NEUTRAL_NULL:
    case NEUTRAL_TRUE:
    case NEUTRAL_DEFAULT: break;
    }
    return false;
}

/* 400 for the first unsupported field that asks for something; lenient: listed in rq->ignored. */
static enum status check_unsupported(const struct json *body, struct api_request *rq, bool lenient,
                                     struct api_error *e)
{
    size_t at = 0;
    for (size_t i = 0; i < sizeof UNSUPPORTED / sizeof UNSUPPORTED[0]; i++) {
        const struct json *j = json_get(body, UNSUPPORTED[i].name);
        if (!j || asks_nothing(j, UNSUPPORTED[i].ok, rq->kind))
            continue;
        if (!lenient)
            return api_error_set(e, 400, "invalid_request_error", UNSUPPORTED[i].name, "unsupported_parameter",
                                 "'%s' is not supported by this server: refused rather than ignored "
                                 "(serve --lenient ignores it with a warning)",
                                 UNSUPPORTED[i].name);
        at += (size_t)snprintf(rq->ignored + at, at < sizeof rq->ignored ? sizeof rq->ignored - at : 0, "%s%s",
                               at ? ", " : "", UNSUPPORTED[i].name);
        if (at >= sizeof rq->ignored)
            at = sizeof rq->ignored - 1;
    }
    return STATUS_OK;
}

static enum status parse_fields(const struct json *body, struct api_request *rq, struct api_error *e)
{
    const struct json *model = field(body, "model");
    if (!model)
        return bad(e, "model", "'%s' is required%s", "");
    if (!json_is_string(model))
        return bad(e, "model", "'%s' must be a string%s", "");
    rq->model = dup_str(json_string(model), strlen(json_string(model)));
    if (!rq->model)
        return oom(e);
    enum status st = rq->kind == API_CHAT ? parse_messages(body, rq, e) : parse_prompt(body, rq, e);
    if (st)
        return st;
    /* max_completion_tokens is the chat API's newer name; either may come */
    bool given = false;
    const char *mt = rq->kind == API_CHAT && field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((st = get_int(body, mt, 0, 2147483647.0, &rq->max_tokens, &given, e)) ||
        (rq->kind == API_COMPLETIONS && (st = get_bool(body, "echo", &rq->echo, e))))
        return st;
    bool chat_echo = false;
    if (rq->kind == API_CHAT && ((st = get_bool(body, "echo", &chat_echo, e)) || chat_echo))
        return st ? st
                  : api_error_set(e, 400, "invalid_request_error", "echo", "unsupported_parameter",
                                  "'echo' applies to /v1/completions, not to chat: refused rather than ignored");
    if (given && rq->max_tokens == 0) { /* lm-eval's loglikelihood: score the prompt, generate nothing */
        if (!rq->echo)
            return api_error_set(e, 400, "invalid_request_error", mt, NULL,
                                 "'%s' must be at least 1 (0 only with 'echo' on completions: the prompt scored)", mt);
        rq->max_tokens_zero = true;
    }
    if (!given && rq->kind == API_COMPLETIONS)
        rq->max_tokens = API_COMPLETIONS_DEFAULT_MAX_TOKENS; /* OpenAI's; chat's default is the context */
    rq->n = 1;
    if ((st = get_int(body, "n", 1, API_MAX_CHOICES, &rq->n, NULL, e)))
        return st;
    if ((st = get_num(body, "temperature", 0, 2, false, &rq->temperature, e)) ||
        (st = get_num(body, "top_p", 0, 1, true, &rq->top_p, e)) ||
        (st = get_int(body, "top_k", -1, 2147483647.0, &rq->top_k, &rq->has_top_k, e)))
        return st;
    rq->has_temperature = field(body, "temperature") != NULL;
    rq->has_top_p = field(body, "top_p") != NULL;
    if (rq->top_k < 0)
        rq->top_k = 0;
    const struct json *seed = field(body, "seed");
    if (seed) {
        if (!is_int(seed, -9223372036854775808.0, 18446744073709551615.0))
            return bad(e, "seed", "'%s' must be an integer%s", "");
        double v = json_number(seed);
        rq->seed = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
        rq->has_seed = true;
    }
    if ((st = parse_penalties(body, rq, e)) || (st = parse_template_kwargs(body, rq, e)) ||
        (st = parse_chat_template(body, rq, e)) || (st = parse_stop(body, rq, e)) ||
        (st = get_bool(body, "stream", &rq->stream, e)) ||
        (st = get_bool(body, "ignore_eos", &rq->ignore_eos, e)))
        return st;
    if (rq->echo && rq->stream)
        return bad(e, "echo", "'%s' with 'stream' is not supported: ask for the whole answer%s", "");
    const struct json *so = field(body, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return bad(e, "stream_options", "'%s' must be an object%s", "");
        if (!rq->stream)
            return bad(e, "stream_options", "'%s' is only allowed when 'stream' is true%s", "");
        if ((st = get_bool(so, "include_usage", &rq->include_usage, e)))
            return st;
        bool continuous = false; /* vLLM's: usage in every chunk */
        if ((st = get_bool(so, "continuous_usage_stats", &continuous, e)))
            return st;
        if (continuous)
            return api_error_set(e, 400, "invalid_request_error", "stream_options.continuous_usage_stats",
                                 "unsupported_parameter",
                                 "'stream_options.continuous_usage_stats' is not supported by this server: refused "
                                 "rather than ignored (include_usage gives the usage once, at the end)");
    }
    if (rq->kind == API_COMPLETIONS) {
        bool has = false;
        if ((st = get_int(body, "logprobs", 0, 5, &rq->top_logprobs, &has, e)))
            return st;
        rq->logprobs = has;
    } else {
        if ((st = get_bool(body, "logprobs", &rq->logprobs, e)))
            return st;
        bool has = false;
        if ((st = get_int(body, "top_logprobs", 0, 20, &rq->top_logprobs, &has, e)))
            return st;
        if (has && !rq->logprobs)
            return bad(e, "top_logprobs", "'%s' needs 'logprobs' to be true%s", "");
    }
    /* vLLM's: each prompt token's log-probability, rank and the likeliest k at its position (0 asks for
       the tokens' own) */
    if ((st = get_int(body, "prompt_logprobs", 0, 20, &rq->prompt_top, &rq->prompt_logprobs, e)))
        return st;
    if (rq->prompt_logprobs && rq->stream)
        return bad(e, "prompt_logprobs", "'%s' with 'stream' is not supported: ask for the whole answer%s", "");
    return STATUS_OK;
}

/* The Responses API fields this server does not implement: refused where they ask for something. */
static const char *const RESPONSES_UNSUPPORTED[] = {"previous_response_id", "reasoning", "background",
                                                    "include", "prompt", "conversation", "max_tool_calls",
                                                    "top_logprobs", "store"};

/* A string member of a Responses input item, or 400 naming it. */
static enum status item_string(const struct json *it, int i, const char *key, const char **out, struct api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "input[%d].%s", i, key);
    const struct json *j = field(it, key);
    if (!json_is_string(j))
        return bad(e, param, "'%s' must be a string%s", "");
    *out = json_string(j);
    return STATUS_OK;
}

/* One input item into msgs, chat's form: a message {role, content} (type "message" or none), a
 * function_call (joins the assistant message before it, or makes one) or a function_call_output
 * (a tool message). Checked here with the item's name; parse_messages checks the rest. */
static enum status responses_item(const struct json *it, int i, struct json *msgs, struct api_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "input[%d]", i);
    const struct json *type = json_get(it, "type"), *role = json_get(it, "role");
    const char *t = json_is_string(type) ? json_string(type) : NULL;
    if (!json_is_object(it) || (type && !t))
        return bad(e, param, "'%s' must be an object with a string 'type'%s", "");
    struct json *m = NULL;
    if (!t || strcmp(t, "message") == 0) {
        static const char *const ROLES[] = {"user", "assistant", "system", "developer"};
        bool known = false;
        for (size_t r = 0; json_is_string(role) && r < sizeof ROLES / sizeof ROLES[0]; r++)
            known |= strcmp(json_string(role), ROLES[r]) == 0;
        if (!known)
            return bad(e, param, "'%s' needs a role: user, assistant, system or developer%s", "");
        /* a developer message is the system prompt of the chat templates */
        const char *rn = strcmp(json_string(role), "developer") == 0 ? "system" : json_string(role);
        m = json_append(msgs, json_new_object());
        const struct json *content = field(it, "content");
        bool ok = m && json_add(m, "role", json_new_string(rn)) &&
                  (!content || json_add(m, "content", json_copy(content)));
        return ok ? STATUS_OK : oom(e);
    }
    if (strcmp(t, "function_call") == 0) {
        const char *id = NULL, *name = NULL, *args = NULL;
        enum status st;
        if ((st = item_string(it, i, "call_id", &id, e)) || (st = item_string(it, i, "name", &name, e)) ||
            (st = item_string(it, i, "arguments", &args, e)))
            return st;
        /* the assistant turn it belongs to: the message just before, if it is the assistant's */
        struct json *owner = NULL;
        for (const struct json *c = json_child(msgs); c; c = json_next(c))
            owner = (struct json *)c; /* msgs is this function's own tree */
        const char *lr = owner ? json_string(json_get(owner, "role")) : NULL;
        if (!lr || strcmp(lr, "assistant") != 0) {
            owner = json_append(msgs, json_new_object());
            if (!owner || !json_add(owner, "role", json_new_string("assistant")) || !json_add(owner, "content", json_new_null()))
                return oom(e);
        }
        struct json *calls = (struct json *)json_get(owner, "tool_calls");
        if (!calls && !(calls = json_add(owner, "tool_calls", json_new_array())))
            return oom(e);
        struct json *c = json_append(calls, json_new_object()), *f = NULL;
        bool ok = c && json_add(c, "id", json_new_string(id)) && json_add(c, "type", json_new_string("function")) &&
                  (f = json_add(c, "function", json_new_object())) && json_add(f, "name", json_new_string(name)) &&
                  json_add(f, "arguments", json_new_string(args));
        return ok ? STATUS_OK : oom(e);
    }
    if (strcmp(t, "function_call_output") == 0) {
        const char *id = NULL, *out = NULL;
        enum status st;
        if ((st = item_string(it, i, "call_id", &id, e)) || (st = item_string(it, i, "output", &out, e)))
            return st;
        m = json_append(msgs, json_new_object());
        bool ok = m && json_add(m, "role", json_new_string("tool")) && json_add(m, "tool_call_id", json_new_string(id)) &&
                  json_add(m, "content", json_new_string(out));
        return ok ? STATUS_OK : oom(e);
    }
    return api_error_set(e, 400, "invalid_request_error", param, "unsupported_parameter",
                         "'%s': items of type '%.40s' are not supported (message, function_call, "
                         "function_call_output)", param, t);
}

/* The Responses API's function tools {type, name, description, parameters, strict} and
 * tool_choice {type, name}, in chat's form ({type, function: {...}}) for parse_tools. */
static struct json *responses_tools_as_chat(const struct json *tools, const struct json *tc)
{
    struct json *b = json_new_object();
    struct json *arr = tools ? json_add(b, "tools", json_new_array()) : NULL;
    for (const struct json *t = json_child(tools); t && b; t = json_next(t)) {
        struct json *c = json_append(arr, json_new_object());
        if (!c) {
            json_free(b);
            return NULL;
        }
        for (const struct json *m = json_child(t); m; m = json_next(m)) /* type stays; the rest moves down */
            if (strcmp(json_key(m), "type") == 0)
                json_add(c, "type", json_copy(m));
        struct json *f = json_add(c, "function", json_new_object());
        for (const struct json *m = json_child(t); m && f; m = json_next(m))
            if (strcmp(json_key(m), "type") != 0)
                json_add(f, json_key(m), json_copy(m));
    }
    if (tc && b) {
        const struct json *name = json_get(tc, "name");
        if (json_is_object(tc) && json_is_string(name)) {
            struct json *c = json_add(b, "tool_choice", json_new_object());
            json_add(c, "type", json_copy(json_get(tc, "type")));
            json_add(json_add(c, "function", json_new_object()), "name", json_new_string(json_string(name)));
        } else {
            json_add(b, "tool_choice", json_copy(tc));
        }
    }
    return b;
}

/* chat's names in a refusal of a converted field (tools[0].function.name) back to the Responses
 * API's (tools[0].name). */
static void responses_param_names(struct api_error *e)
{
    for (char *s = e->param; (s = strstr(s, "].function.")) != NULL;)
        memmove(s + 1, s + 10, strlen(s + 10) + 1);
    for (char *s = e->message; (s = strstr(s, "].function.")) != NULL;)
        memmove(s + 1, s + 10, strlen(s + 10) + 1);
}

/* POST /v1/responses: instructions and input become messages; max_output_tokens, temperature,
 * top_p, stream; what it asks beyond text generation is refused (not ignored). Not stored: no
 * GET /v1/responses/{id}. */
static enum status parse_responses(const struct json *body, struct api_request *rq, bool lenient, struct api_error *e)
{
    const struct json *model = field(body, "model"), *input = field(body, "input"), *ins = field(body, "instructions");
    if (!json_is_string(model))
        return bad(e, "model", "'%s' is required (a string)%s", "");
    if (!(rq->model = dup_str(json_string(model), strlen(json_string(model)))))
        return oom(e);
    if (!input)
        return bad(e, "input", "'%s' is required%s", "");
    if (!json_is_string(input) && !(json_is_array(input) && json_array_size(input) > 0))
        return bad(e, "input", "'%s' must be a string or a non-empty list of messages%s", "");
    if (ins && !json_is_string(ins))
        return bad(e, "instructions", "'%s' must be a string%s", "");
    /* instructions and input as chat messages, then read as chat's (tool calls and results included) */
    struct json *chat = json_new_object();
    struct json *msgs = json_add(chat, "messages", json_new_array());
    enum status st = msgs ? STATUS_OK : oom(e);
    if (!st && ins) {
        struct json *m = json_append(msgs, json_new_object());
        if (!m || !json_add(m, "role", json_new_string("system")) || !json_add(m, "content", json_new_string(json_string(ins))))
            st = oom(e);
    }
    if (!st && json_is_string(input)) {
        struct json *m = json_append(msgs, json_new_object());
        if (!m || !json_add(m, "role", json_new_string("user")) || !json_add(m, "content", json_new_string(json_string(input))))
            st = oom(e);
    } else if (!st) {
        int i = 0;
        for (const struct json *it = json_child(input); it && !st; it = json_next(it), i++)
            st = responses_item(it, i, msgs, e);
    }
    if (!st)
        st = parse_messages(chat, rq, e);
    json_free(chat);
    if (st)
        return st;
    /* function tools and tool_choice, read as chat's */
    const struct json *tools = field(body, "tools"), *tcj = field(body, "tool_choice");
    for (const struct json *t = json_is_array(tools) ? json_child(tools) : NULL; t; t = json_next(t))
        if (!json_is_string(json_get(t, "type")) || strcmp(json_string(json_get(t, "type")), "function") != 0)
            return api_error_set(e, 400, "invalid_request_error", "tools", "unsupported_parameter",
                                 "'tools': only function tools are supported (not '%.40s')",
                                 json_is_string(json_get(t, "type")) ? json_string(json_get(t, "type")) : "?");
    if (tools || tcj) {
        struct json *b = responses_tools_as_chat(json_is_array(tools) ? tools : NULL, tcj);
        if (!b)
            return oom(e);
        if (tools && !json_is_array(tools))
            json_add(b, "tools", json_copy(tools)); /* refused with its own message */
        const struct json *ptc = field(body, "parallel_tool_calls");
        if (ptc)
            json_add(b, "parallel_tool_calls", json_copy(ptc));
        rq->kind = API_CHAT;
        st = parse_tools(b, rq, e);
        rq->kind = API_RESPONSES;
        json_free(b);
        if (st) {
            responses_param_names(e);
            return st;
        }
        const struct json *tf = json_get(field(body, "text"), "format");
        if ((rq->tool_choice == API_TOOL_REQUIRED || rq->tool_choice == API_TOOL_NAMED) && tf &&
            !asks_nothing_format(tf))
            return bad(e, "tool_choice", "'%s' forcing a call and 'text.format' both constrain the answer: one at a "
                       "time%s", "");
    }
    if ((st = get_int(body, "max_output_tokens", 1, 2147483647.0, &rq->max_tokens, NULL, e)) ||
        (st = get_num(body, "temperature", 0, 2, false, &rq->temperature, e)) ||
        (st = get_num(body, "top_p", 0, 1, true, &rq->top_p, e)) || (st = get_bool(body, "stream", &rq->stream, e)))
        return st;
    rq->has_temperature = field(body, "temperature") != NULL;
    rq->has_top_p = field(body, "top_p") != NULL;
    rq->repetition_penalty = 1.0;
    const struct json *fmt = json_get(field(body, "text"), "format");
    const struct json *tr = field(body, "truncation");
    const char *asks = NULL;
    for (size_t i = 0; i < sizeof RESPONSES_UNSUPPORTED / sizeof RESPONSES_UNSUPPORTED[0] && !asks; i++) {
        const struct json *j = field(body, RESPONSES_UNSUPPORTED[i]);
        if (j && !asks_nothing(j, NEUTRAL_EMPTY, API_RESPONSES))
            asks = RESPONSES_UNSUPPORTED[i];
    }
    if (!asks && fmt && !api_format_takes(fmt)) /* text, json_object, json_schema: api_format.c */
        asks = "text";
    if (!asks && tr && !(json_is_string(tr) && strcmp(json_string(tr), "disabled") == 0))
        asks = "truncation";
    if (asks && !lenient)
        return api_error_set(e, 400, "invalid_request_error", asks, "unsupported_parameter",
                             "'%s' is not supported by this server's Responses API: refused rather than ignored", asks);
    if (asks)
        snprintf(rq->ignored, sizeof rq->ignored, "%s", asks);
    return STATUS_OK;
}

enum status api_request_parse(struct api_request *rq, enum api_kind kind, const char *body, size_t len,
                              struct api_error *e)
{
    return api_request_parse_opts(rq, kind, body, len, false, e);
}

enum status api_request_parse_opts(struct api_request *rq, enum api_kind kind, const char *body, size_t len,
                                   bool lenient, struct api_error *e)
{
    memset(rq, 0, sizeof *rq);
    rq->kind = kind;
    rq->n = 1;
    rq->temperature = 1.0;
    rq->top_p = 1.0;
    struct json *root = NULL;
    struct err err = {0};
    if (json_has_nul_escape(body, len))
        return api_error_set(e, 400, "invalid_request_error", NULL, NULL,
                             "a string holds \\u0000 (NUL), which this server does not take");
    if (json_parse(body, len, "request body", &root, &err))
        return api_error_set(e, 400, "invalid_request_error", NULL, NULL,
                             "the request body is not valid JSON: %s", err.msg);
    enum status st;
    const char *dup = json_duplicate_key(root);
    if (!json_is_object(root))
        st = api_error_set(e, 400, "invalid_request_error", NULL, NULL, "the request body must be a JSON object");
    else if (dup)
        st = api_error_set(e, 400, "invalid_request_error", NULL, NULL,
                           "the key \"%.100s\" appears twice in one object (which one counts is ambiguous)", dup);
    else if (kind == API_RESPONSES)
        st = parse_responses(root, rq, lenient, e);
    else if (!(st = parse_fields(root, rq, e)) && !(st = parse_tools(root, rq, e)))
        st = check_unsupported(root, rq, lenient, e);
    if (!st)
        st = api_format_parse(root, rq, e);
    json_free(root);
    if (st) {
        api_request_free(rq);
        rq->kind = kind;
    }
    return st;
}

void api_request_free(struct api_request *rq)
{
    free(rq->model);
    free(rq->prompt_text);
    free(rq->prompt_ids);
    for (int i = 0; i < rq->n_messages; i++) {
        free(rq->messages[i].role);
        free(rq->messages[i].content);
        free(rq->messages[i].extra);
    }
    free(rq->tools);
    grammar_put(rq->grammar);
    free(rq->messages);
    for (int i = 0; i < rq->n_stop; i++)
        free(rq->stop[i]);
    free(rq->template_kwargs);
    free(rq->chat_template);
    for (int i = 0; i < rq->n_more; i++)
        free(rq->more[i].text), free(rq->more[i].ids);
    free(rq->more);
    memset(rq, 0, sizeof *rq);
}

enum status api_request_copy_one(const struct api_request *src, int prompt, struct api_request *dst, struct api_error *e)
{
    *dst = *src; /* the plain fields; every owned pointer is replaced below */
    grammar_ref(dst->grammar); /* shared: the copy owns a reference */
    dst->model = dst->prompt_text = dst->template_kwargs = dst->chat_template = dst->tools = NULL;
    dst->prompt_ids = NULL;
    dst->more = NULL;
    dst->messages = NULL;
    dst->n_more = dst->n_messages = 0;
    dst->n = 1;
    for (int i = 0; i < API_MAX_STOP; i++)
        dst->stop[i] = NULL;
    dst->n_stop = 0;
    const char *text = prompt ? src->more[prompt - 1].text : src->prompt_text;
    const int32_t *ids = prompt ? src->more[prompt - 1].ids : src->prompt_ids;
    const int n_ids = prompt ? src->more[prompt - 1].n_ids : src->n_prompt_ids;
    bool ok = (dst->model = dup_str(src->model, strlen(src->model))) != NULL;
    if (ok && text)
        ok = (dst->prompt_text = dup_str(text, strlen(text))) != NULL;
    if (ok && ids) {
        ok = (dst->prompt_ids = malloc((size_t)(n_ids ? n_ids : 1) * sizeof *ids)) != NULL;
        if (ok)
            memcpy(dst->prompt_ids, ids, (size_t)n_ids * sizeof *ids);
        dst->n_prompt_ids = n_ids;
    }
    if (ok && src->n_messages) {
        ok = (dst->messages = calloc((size_t)src->n_messages, sizeof *dst->messages)) != NULL;
        for (int i = 0; ok && i < src->n_messages; i++) {
            dst->n_messages = i + 1;
            ok = (dst->messages[i].role = dup_str(src->messages[i].role, strlen(src->messages[i].role))) &&
                 (dst->messages[i].content = dup_str(src->messages[i].content, strlen(src->messages[i].content))) &&
                 (!src->messages[i].extra ||
                  (dst->messages[i].extra = dup_str(src->messages[i].extra, strlen(src->messages[i].extra))));
        }
    }
    for (int i = 0; ok && i < src->n_stop; i++) {
        ok = (dst->stop[i] = dup_str(src->stop[i], strlen(src->stop[i]))) != NULL;
        dst->n_stop = i + 1;
    }
    if (ok && src->template_kwargs)
        ok = (dst->template_kwargs = dup_str(src->template_kwargs, strlen(src->template_kwargs))) != NULL;
    if (ok && src->tools)
        ok = (dst->tools = dup_str(src->tools, strlen(src->tools))) != NULL;
    if (ok && src->chat_template)
        ok = (dst->chat_template = dup_str(src->chat_template, strlen(src->chat_template))) != NULL;
    if (ok)
        return STATUS_OK;
    api_request_free(dst);
    return oom(e);
}
