/* prompt_build.c — see prompt_build.h. */
#include "server/prompt_build.h"

#include <stdlib.h>
#include <string.h>

/* The members of the object in JSON text `extra` (NULL: none) added to obj; false on no memory. */
static bool add_members(struct json *obj, const char *extra)
{
    if (!extra)
        return true;
    struct json *x = NULL;
    bool ok = obj && json_parse(extra, strlen(extra), "message", &x, NULL) == STATUS_OK;
    for (const struct json *m = ok ? json_child(x) : NULL; m && ok; m = json_next(m))
        ok = json_add(obj, json_key(m), json_copy(m)) != NULL;
    json_free(x);
    return ok;
}

enum status prompt_render_chat(const struct prompt_model *pm, const struct api_request *rq, char **text, size_t *len,
                               struct api_error *e)
{
    if (!pm->tmpl && !rq->chat_template)
        return api_error_set(e, 400, "invalid_request_error", "messages", NULL,
                             "this model has no chat template: use /v1/completions, or send chat_template");
    struct json *ctx = json_new_object();
    for (const struct json *v = json_child(pm->special_vars); v; v = json_next(v))
        if (json_is_string(v))
            json_add(ctx, json_key(v), json_new_string(json_string(v)));
    struct json *msgs = json_add(ctx, "messages", json_new_array());
    bool ok = true;
    for (int i = 0; i < rq->n_messages && ok; i++) {
        struct json *m = json_append(msgs, json_new_object());
        json_add(m, "role", json_new_string(rq->messages[i].role));
        json_add(m, "content", json_new_string(rq->messages[i].content));
        ok = add_members(m, rq->messages[i].extra); /* tool calls, tool_call_id, ... (checked when parsed) */
    }
    /* tool_choice "none": the model is not shown the tools, so that it answers in text */
    if (ok && rq->tools && rq->tool_choice != API_TOOL_NONE) {
        struct json *tools = NULL;
        ok = json_parse(rq->tools, strlen(rq->tools), "tools", &tools, NULL) == STATUS_OK &&
             json_add(ctx, "tools", json_copy(tools)) != NULL;
        json_free(tools);
    }
    ok = ok && json_add(ctx, "add_generation_prompt", json_new_bool(true)) != NULL && msgs &&
         (int)json_array_size(msgs) == rq->n_messages;
    if (ok && rq->template_kwargs) { /* checked an object without the server's names when parsed */
        struct json *kw = NULL;
        ok = json_parse(rq->template_kwargs, strlen(rq->template_kwargs), "chat_template_kwargs", &kw, NULL) == STATUS_OK;
        for (const struct json *m = ok ? json_child(kw) : NULL; m && ok; m = json_next(m))
            ok = json_add(ctx, json_key(m), json_copy(m)) != NULL;
        json_free(kw);
    }
    struct err err = {0};
    struct chat_template *own = NULL; /* the request's template */
    enum status st = ok ? STATUS_OK : STATUS_NOMEM;
    if (!st && rq->chat_template &&
        (st = chat_template_compile(&own, rq->chat_template, strlen(rq->chat_template), &err))) {
        json_free(ctx);
        return st == STATUS_NOMEM ? api_error_set(e, 500, "server_error", NULL, NULL, "out of memory")
                                  : api_error_set(e, 400, "invalid_request_error", "chat_template", NULL, "%s", err.msg);
    }
    if (!st)
        st = chat_template_render(own ? own : pm->tmpl, ctx, text, len, &err);
    chat_template_free(own);
    json_free(ctx);
    if (st == STATUS_NOMEM)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory rendering the chat template");
    if (st)
        return api_error_set(e, 400, "invalid_request_error", "messages", NULL, "chat template: %s", err.msg);
    return STATUS_OK;
}

enum status prompt_build(const struct prompt_model *pm, const struct api_request *rq, struct tok_ids *ids,
                         struct api_error *e)
{
    struct err err = {0};
    if (rq->kind == API_COMPLETIONS && rq->prompt_ids) {
        for (int i = 0; i < rq->n_prompt_ids; i++)
            if (rq->prompt_ids[i] >= pm->vocab)
                return api_error_set(e, 400, "invalid_request_error", "prompt", NULL,
                                     "token id %d at prompt[%d] is outside the vocabulary [0, %d)",
                                     rq->prompt_ids[i], i, pm->vocab);
        ids->ids = malloc(((size_t)rq->n_prompt_ids + 1) * sizeof *ids->ids);
        if (!ids->ids)
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(ids->ids, rq->prompt_ids, (size_t)rq->n_prompt_ids * sizeof *ids->ids);
        ids->n = (size_t)rq->n_prompt_ids;
        ids->cap = ids->n + 1;
        return STATUS_OK;
    }
    char *chat = NULL;
    size_t len = 0;
    const char *text = rq->prompt_text;
    if (rq->kind == API_CHAT || rq->kind == API_RESPONSES) {
        enum status st = prompt_render_chat(pm, rq, &chat, &len, e);
        if (st)
            return st;
        text = chat;
    } else {
        len = strlen(text);
    }
    enum status st = tokenizer_encode(pm->tok, text, len, rq->kind == API_COMPLETIONS, ids, &err);
    free(chat);
    if (st == STATUS_NOMEM)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory tokenizing the prompt");
    if (st)
        return api_error_set(e, 400, "invalid_request_error", rq->kind == API_COMPLETIONS ? "prompt" : rq->kind == API_CHAT ? "messages" : "input", NULL,
                             "%s", err.msg);
    return STATUS_OK;
}
