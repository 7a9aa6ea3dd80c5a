/* api_format.c — response_format / text.format to a compiled grammar (see api_format.h).
 *
 * Error messages carry the compiler's path under the request field's name, so a client sees
 * where in its schema the problem is; param is the request field itself.
 */
#include "server/api_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/grammar_json.h"
#include "engine/token_mask.h"
#include "format/tokenizer.h"
#include "model/model_desc.h"
#include "server/reasoning.h"

bool api_format_takes(const struct json *format)
{
    const char *t = json_string(json_get(format, "type"));
    return t && (strcmp(t, "text") == 0 || strcmp(t, "json_object") == 0 || strcmp(t, "json_schema") == 0);
}

/* OpenAI's rule for a schema's name: 1 to 64 of a-z, A-Z, 0-9, _ and -. */
static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-'))
            return false;
    return true;
}

/* fmt: the format object; where: its name in messages ("response_format", "text.format");
 * js: where the schema's fields are (response_format.json_schema, or fmt itself in the Responses API). */
static enum status compile_format(const struct json *fmt, const struct json *js, const char *where, const char *js_where,
                                  struct api_request *rq, struct api_error *e)
{
    const char *param = where;
    const char *type = json_string(json_get(fmt, "type"));
    if (!json_is_object(fmt) || !type)
        return api_error_set(e, 400, "invalid_request_error", param, NULL,
                             "'%s' must be an object with a \"type\": \"text\", \"json_object\" or \"json_schema\"", where);
    if (strcmp(type, "text") == 0)
        return STATUS_OK;
    struct err err = {0};
    char path[96];
    enum status st;
    if (strcmp(type, "json_object") == 0) {
        snprintf(path, sizeof path, "%s", where);
        struct grammar_json_part part = {0};
        st = grammar_json_compile(&part, 1, &(struct grammar_json_opts){.path = path}, &rq->grammar, &err);
    } else if (strcmp(type, "json_schema") == 0) {
        if (!json_is_object(js))
            return api_error_set(e, 400, "invalid_request_error", param, NULL,
                                 "'%s' must be an object {\"name\", \"schema\", \"strict\"}", js_where);
        const struct json *name = json_get(js, "name"), *schema = json_get(js, "schema"), *strict = json_get(js, "strict");
        const struct json *desc = json_get(js, "description");
        if (!json_is_null(name) && (!json_is_string(name) || !name_ok(json_string(name))))
            return api_error_set(e, 400, "invalid_request_error", param, NULL,
                                 "'%s.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", js_where);
        if (!json_is_null(strict) && !json_is_bool(strict))
            return api_error_set(e, 400, "invalid_request_error", param, NULL, "'%s.strict' must be a boolean", js_where);
        if (!json_is_null(desc) && !json_is_string(desc))
            return api_error_set(e, 400, "invalid_request_error", param, NULL, "'%s.description' must be a string",
                                 js_where);
        if (!json_is_object(schema))
            return api_error_set(e, 400, "invalid_request_error", param, NULL,
                                 "'%s.schema' must be a JSON Schema object", js_where);
        snprintf(path, sizeof path, "%s.schema", js_where);
        struct grammar_json_part part = {.schema = schema};
        st = grammar_json_compile(&part, 1, &(struct grammar_json_opts){.path = path}, &rq->grammar, &err);
    } else {
        return api_error_set(e, 400, "invalid_request_error", param, NULL,
                             "'%s.type' \"%.32s\" is not one of \"text\", \"json_object\", \"json_schema\"", where, type);
    }
    if (st == STATUS_NOMEM)
        return api_error_set(e, 500, "server_error", NULL, NULL, "%s", err.msg);
    if (st)
        return api_error_set(e, 400, "invalid_request_error", param,
                             st == STATUS_UNSUPPORTED ? "unsupported_parameter" : NULL, "%s", err.msg);
    return STATUS_OK;
}

enum status api_format_parse(const struct json *body, struct api_request *rq, struct api_error *e)
{
    if (rq->kind == API_RESPONSES) {
        const struct json *fmt = json_get(json_get(body, "text"), "format");
        if (json_is_null(fmt) || !api_format_takes(fmt))
            return STATUS_OK; /* absent, or refused by the Responses parser */
        return compile_format(fmt, fmt, "text.format", "text.format", rq, e);
    }
    const struct json *fmt = json_get(body, "response_format");
    if (json_is_null(fmt))
        return STATUS_OK;
    return compile_format(fmt, json_get(fmt, "json_schema"), "response_format", "response_format.json_schema", rq, e);
}

struct token_vocab *api_format_vocab_new(const struct tokenizer *tok, const struct model_desc *d)
{
    struct token_vocab *tv = calloc(1, sizeof *tv);
    int32_t eos[MODEL_MAX_EOS];
    for (int i = 0; i < d->n_eos; i++)
        eos[i] = d->eos_ids[i];
    struct err err = {0};
    if (!tv || token_vocab_init(tv, tok, eos, d->n_eos, &err)) {
        LOG_WARN("serve: structured output (response_format) is off: %s", tv ? err.msg : "out of memory");
        free(tv);
        return NULL;
    }
    tv->n_logits = d->vocab_size; /* rows are the model's: its padding ids are masked too */
    return tv;
}

void api_format_vocab_free(struct token_vocab *tv)
{
    if (tv)
        token_vocab_free(tv);
    free(tv);
}

/* REASONING_OPEN, then any text without REASONING_CLOSE, REASONING_CLOSE and up to 4 blanks (the
 * templates put newlines there): states S_k = k bytes of the closing tag matched; a '<' restarts
 * the match, any other byte goes back to S_0 (the tag starts with its only '<'). */
static enum status think_grammar(struct grammar **out, struct err *err)
{
    const char *close = REASONING_CLOSE;
    enum { L = sizeof REASONING_CLOSE - 1 };
    struct gram_builder b;
    gram_builder_init(&b);
    int s[L];
    for (int k = 0; k < L; k++)
        s[k] = gram_rule(&b);
    struct gram_class blank = {{0}};
    gram_class_range(&blank, ' ', ' ');
    gram_class_range(&blank, '\n', '\n');
    int blank_r = gram_rule(&b);
    gram_push_class(&b, gram_alt(&b, blank_r), &blank);
    int after = gram_repeat(&b, blank_r, -1, 0, 4);
    for (int k = 0; k < L; k++) {
        int a = gram_alt(&b, s[k]);
        gram_push_bytes(&b, a, close + k, 1);
        gram_push_ref(&b, a, k + 1 < L ? s[k + 1] : after);
        if (close[k] != close[0]) {
            a = gram_alt(&b, s[k]);
            gram_push_bytes(&b, a, close, 1);
            gram_push_ref(&b, a, s[1]);
        }
        struct gram_class other = {{0}};
        gram_class_range(&other, 0, 255);
        other.w[(unsigned char)close[k] >> 6] &= ~(1ull << ((unsigned char)close[k] & 63));
        other.w[(unsigned char)close[0] >> 6] &= ~(1ull << ((unsigned char)close[0] & 63));
        a = gram_alt(&b, s[k]);
        gram_push_class(&b, a, &other);
        gram_push_ref(&b, a, s[0]);
    }
    int root = gram_rule(&b);
    int a = gram_alt(&b, root);
    gram_push_bytes(&b, a, REASONING_OPEN, sizeof REASONING_OPEN - 1);
    gram_push_ref(&b, a, s[0]);
    return gram_builder_finish(&b, root, out, err);
}

enum status api_format_bind(struct api_request *rq, const struct token_vocab *tv, bool think, struct sched_params *sp,
                            struct api_error *e)
{
    if (!rq->grammar)
        return STATUS_OK;
    const char *param = rq->kind == API_RESPONSES ? "text.format" : "response_format";
    if (!tv)
        return api_error_set(e, 400, "invalid_request_error", param, "unsupported_parameter",
                             "'%s': this model's tokenizer has no fixed bytes per token, so structured output is off",
                             param);
    if (tv->n_eos == 0)
        return api_error_set(e, 400, "invalid_request_error", param, "unsupported_parameter",
                             "'%s': the model has no end-of-sequence token to end a structured answer", param);
    if (think) {
        struct grammar *tg = NULL, *wide = NULL;
        struct err err = {0};
        enum status st = think_grammar(&tg, &err);
        if (!st)
            st = grammar_prefix(tg, rq->grammar, true, &wide, &err);
        grammar_put(tg);
        if (st)
            return api_error_set(e, 500, "server_error", NULL, NULL, "%s", err.msg);
        grammar_put(rq->grammar);
        rq->grammar = wide;
    }
    sp->grammar = rq->grammar;
    sp->grammar_vocab = tv;
    return STATUS_OK;
}
