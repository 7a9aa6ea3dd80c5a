/* fuzz_tool_parse.c — libFuzzer target for the tool-call parser (server/tool_parse.c).
 *
 * The parser reads model output, which a prompt can steer into any bytes. The first input byte
 * picks the format (bit 0) and a cut position; the rest is the answer, fed whole and again in
 * two feeds split at the cut. Both must succeed and agree on the content and every call (name,
 * arguments, done); the content is never longer than the input by more than a call's tags given
 * back. ASan and UBSan catch the rest.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/tool_parse.h"

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct out {
    char *content;
    size_t n;
};

static void run(enum tool_format f, const struct json *tools, const char *text, size_t n, size_t cut,
                struct tool_parse *p, struct out *o)
{
    tool_parse_init(p, f, tools);
    o->content = malloc(8 * n + 64);
    o->n = 0;
    FUZZ_CHECK(o->content);
    size_t at = 0;
    for (int i = 0; i < 2; i++) {
        size_t end = i ? n : cut;
        FUZZ_CHECK(tool_parse_feed(p, text + at, end - at, i == 1, NULL) == STATUS_OK);
        FUZZ_CHECK(p->n_content <= 8 * n + 64 - o->n);
        memcpy(o->content + o->n, p->content, p->n_content);
        o->n += p->n_content;
        at = end;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const enum tool_format f = data[0] & 1 ? TOOL_FORMAT_GLM45 : TOOL_FORMAT_QWEN3;
    const char *text = (const char *)data + 1;
    const size_t n = size - 1, cut = n ? (data[0] >> 1) % (n + 1) : 0;
    static const char TOOLS[] = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                                "\"properties\":{\"s\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}}}}}]";
    struct json *tools = NULL;
    FUZZ_CHECK(json_parse(TOOLS, sizeof TOOLS - 1, "tools", &tools, NULL) == STATUS_OK);
    struct tool_parse a, b;
    struct out oa, ob;
    run(f, tools, text, n, 0, &a, &oa);
    run(f, tools, text, n, cut, &b, &ob);
    FUZZ_CHECK(oa.n == ob.n && memcmp(oa.content, ob.content, oa.n) == 0);
    FUZZ_CHECK(oa.n <= n + 64);
    FUZZ_CHECK(a.n_calls == b.n_calls && a.n_calls <= TOOL_MAX_CALLS);
    for (int i = 0; i < a.n_calls; i++) {
        FUZZ_CHECK(a.calls[i].name && a.calls[i].name[0] && strcmp(a.calls[i].name, b.calls[i].name) == 0);
        /* (output bytes are any bytes: a NUL can be in the arguments) */
        FUZZ_CHECK(a.calls[i].n_args == b.calls[i].n_args &&
                   memcmp(a.calls[i].args, b.calls[i].args, a.calls[i].n_args + 1) == 0);
        FUZZ_CHECK(a.calls[i].args[a.calls[i].n_args] == 0 && a.calls[i].done == b.calls[i].done);
    }
    tool_parse_free(&a);
    tool_parse_free(&b);
    free(oa.content);
    free(ob.content);
    json_free(tools);
    return 0;
}
