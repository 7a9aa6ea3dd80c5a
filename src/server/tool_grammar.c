/* tool_grammar.c — see tool_grammar.h. */
#include "server/tool_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_json.h"

enum status tool_grammar_compile(enum tool_format fmt, const struct json *tools, const char *name,
                                 struct grammar **out, struct api_error *e)
{
    *out = NULL;
    if (fmt != TOOL_FORMAT_QWEN3)
        return api_error_set(e, 400, "invalid_request_error", "tool_choice", "unsupported_parameter",
                             "'tool_choice' forcing a call needs a JSON call format (qwen3); this model's calls "
                             "(%s) cannot be constrained: use \"auto\"", tool_format_name(fmt));
    const int n_tools = (int)json_array_size(tools);
    struct grammar_json_part *parts = calloc((size_t)(n_tools ? n_tools : 1), sizeof *parts);
    char (*prefix)[128] = calloc((size_t)(n_tools ? n_tools : 1), sizeof *prefix);
    if (!parts || !prefix) {
        free(parts), free(prefix);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    int n = 0;
    for (const struct json *t = json_child(tools); t; t = json_next(t)) {
        const struct json *f = json_get(t, "function");
        const char *fn = json_string(json_get(f, "name")); /* checked: [A-Za-z0-9_-]{1,64}, no escaping */
        if (name && strcmp(fn, name) != 0)
            continue;
        snprintf(prefix[n], sizeof prefix[n], "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", fn);
        const struct json *p = json_get(f, "parameters");
        parts[n] = (struct grammar_json_part){.prefix = prefix[n], .schema = json_is_object(p) ? p : NULL,
                                              .suffix = "}\n</tool_call>"};
        n++;
    }
    enum status st = STATUS_OK;
    if (n == 0) {
        st = api_error_set(e, 400, "invalid_request_error", "tool_choice", NULL, "'tool_choice' names no tool of 'tools'");
    } else {
        struct err err = {0};
        char path[96];
        /* the schema's place in the request, for the compiler's messages */
        int at = 0;
        for (const struct json *t = json_child(tools); t; t = json_next(t), at++)
            if (!name || strcmp(json_string(json_get(json_get(t, "function"), "name")), name) == 0)
                break;
        snprintf(path, sizeof path, name ? "tools[%d].function.parameters" : "tools[].function.parameters", at);
        st = grammar_json_compile(parts, n, &(struct grammar_json_opts){.path = path}, out, &err);
        if (st == STATUS_NOMEM)
            st = api_error_set(e, 500, "server_error", NULL, NULL, "%s", err.msg);
        else if (st)
            st = api_error_set(e, 400, "invalid_request_error", "tools", st == STATUS_UNSUPPORTED ? "unsupported_parameter" : NULL,
                               "tool_choice forces a call of %s: %s", name ? name : "one of the tools", err.msg);
    }
    free(parts), free(prefix);
    return st;
}
