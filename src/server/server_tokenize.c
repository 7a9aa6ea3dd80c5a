/* server_tokenize.c — POST /tokenize and /detokenize (vLLM's routes, for clients that count
 * tokens or budget prompts without generating).
 *
 * /tokenize takes a completions body ("prompt": text or ids) or a chat body ("messages") and
 * answers the ids generation would start from — the same parse (api_request_parse) and the same
 * prompt_build, so the chat template, BOS and every limit are the ones /v1/... applies:
 *   {"count": N, "max_model_len": M, "tokens": [...]}
 * /detokenize takes {"model": ..., "tokens": [ids]} and answers {"prompt": text} (special tokens
 * kept, as vLLM does). "model", when given, must be the served one. Errors are OpenAI error
 * bodies, 400 naming the field. */
#include "server/server_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

static char *finish(struct json *root)
{
    char *s = root ? json_print(root, false) : NULL;
    json_free(root);
    return s;
}

static enum MHD_Result reply_json(struct conn_ctx *cc, struct json *root)
{
    char *s = finish(root);
    if (!s) {
        struct api_error e;
        api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return server_reply_error(cc, &e);
    }
    return server_reply(cc, 200, "application/json", s);
}

static bool model_ok(struct conn_ctx *cc, const char *model, struct api_error *e)
{
    if (!model || strcmp(model, cc->srv->o.model_name) == 0)
        return true;
    api_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                  "the model '%.200s' does not exist: this server has '%.200s'", model,
                  cc->srv->o.model_name);
    return false;
}

/* cc's body as a JSON object (bounded before it is parsed), or NULL with e filled. */
static struct json *parse_body(const struct conn_ctx *cc, struct api_error *e)
{
    struct json *body = NULL;
    struct err err = {0};
    if (!server_body_bounded(cc, e))
        return NULL;
    if (json_parse(cc->body ? cc->body : "", cc->len, "request body", &body, &err) || !json_is_object(body)) {
        json_free(body);
        api_error_set(e, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object");
        return NULL;
    }
    return body;
}

enum MHD_Result server_tokenize(struct conn_ctx *cc)
{
    struct server *srv = cc->srv;
    struct api_error e;
    struct json *body = parse_body(cc, &e);
    if (!body)
        return server_reply_error(cc, &e);
    /* a chat body has messages; the parse is generation's own (both need a model) */
    enum api_kind kind = json_get(body, "messages") ? API_CHAT : API_COMPLETIONS;
    json_free(body);
    struct api_request rq;
    if (api_request_parse_opts(&rq, kind, cc->body ? cc->body : "", cc->len, srv->o.lenient, &e))
        return server_reply_error(cc, &e);
    struct tok_ids ids = {0};
    if (!model_ok(cc, rq.model, &e) || prompt_build(&srv->m.pm, &rq, &ids, &e)) {
        api_request_free(&rq);
        tok_ids_free(&ids);
        return server_reply_error(cc, &e);
    }
    api_request_free(&rq);
    struct json *root = json_new_object(), *arr = json_new_array();
    for (size_t i = 0; arr && i < ids.n; i++)
        json_append(arr, json_new_number(ids.ids[i]));
    json_add(root, "count", json_new_number((double)ids.n));
    json_add(root, "max_model_len", json_new_number(srv->m.max_context));
    json_add(root, "tokens", arr);
    tok_ids_free(&ids);
    return reply_json(cc, root);
}

enum MHD_Result server_detokenize(struct conn_ctx *cc)
{
    struct server *srv = cc->srv;
    struct api_error e;
    struct json *body = parse_body(cc, &e);
    if (!body)
        return server_reply_error(cc, &e);
    const char *dup = json_duplicate_key(body);
    const struct json *model = json_get(body, "model"), *toks = json_get(body, "tokens");
    int32_t *ids = NULL;
    size_t n = 0;
    bool ok = false;
    if (dup)
        api_error_set(&e, 400, "invalid_request_error", dup, NULL, "the key '%.100s' appears twice", dup);
    else if (model && !json_is_string(model))
        api_error_set(&e, 400, "invalid_request_error", "model", NULL, "'model' must be a string");
    else if (!model_ok(cc, model ? json_string(model) : NULL, &e))
        ;
    else if (!json_is_array(toks))
        api_error_set(&e, 400, "invalid_request_error", "tokens", NULL,
                      "'tokens' must be a list of token ids");
    else if (!(ids = malloc((json_array_size(toks) + 1) * sizeof *ids)))
        api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    else {
        ok = true;
        const int vocab = srv->m.pm.vocab;
        for (const struct json *t = json_child(toks); t && ok; t = json_next(t)) {
            double v = json_number(t);
            if (!json_is_number(t) || v != floor(v) || v < 0 || v >= vocab) {
                api_error_set(&e, 400, "invalid_request_error", "tokens", NULL,
                              "'tokens'[%zu] must be a token id in [0, %d)", n, vocab);
                ok = false;
            } else {
                ids[n++] = (int32_t)v;
            }
        }
    }
    json_free(body);
    char *text = NULL;
    size_t len = 0;
    struct err err = {0};
    if (ok && tokenizer_decode(srv->m.pm.tok, ids, n, false, &text, &len, &err)) {
        api_error_set(&e, 400, "invalid_request_error", "tokens", NULL, "%s", err.msg);
        ok = false;
    }
    free(ids);
    if (!ok) {
        free(text);
        return server_reply_error(cc, &e);
    }
    struct json *root = json_new_object();
    json_add(root, "prompt", json_new_string(text));
    free(text);
    return reply_json(cc, root);
}
