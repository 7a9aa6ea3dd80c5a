/* test_tool_grammar.c — tool_choice "required" / named as a grammar (server/tool_grammar.h).
 *
 * The grammar takes exactly the calls Qwen3's template writes for the allowed functions, with
 * arguments valid for their schemas, and nothing else: checked byte by byte with the grammar's
 * matcher on calls rendered by the real template (tests/golden/templates/qwen3_chat_template.jinja),
 * and on near misses. Refusals: glm45, a keyword outside the compiler's subset.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/tool_grammar.h"
#include "template/chat_template.h"

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", "
    "\"fahrenheit\"]}}, \"required\": [\"city\"], \"additionalProperties\": false}}}, {\"type\": \"function\", "
    "\"function\": {\"name\": \"now\"}}]";

static struct json *parse(const char *s)
{
    struct json *j = NULL;
    assert_int_equal(json_parse(s, strlen(s), "test", &j, NULL), STATUS_OK);
    return j;
}

/* Whether g takes text whole (every byte, then the end). */
static bool takes(struct grammar *g, const char *text)
{
    struct grammar_matcher m;
    struct err err = {0};
    assert_int_equal(grammar_matcher_init(&m, g, &err), STATUS_OK);
    bool ok = grammar_matcher_accept_bytes(&m, (const uint8_t *)text, strlen(text)) && grammar_matcher_can_end(&m);
    grammar_matcher_free(&m);
    return ok;
}

/* The call text Qwen3's template writes for name(args), as a model would answer. */
static char *qwen3_call(const char *name, const char *args)
{
    const char *src = getenv("MOESERVE_SRC") ? getenv("MOESERVE_SRC") : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/templates/qwen3_chat_template.jinja", src);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char tpl[16384];
    size_t n = fread(tpl, 1, sizeof tpl, f);
    fclose(f);
    struct chat_template *t = NULL;
    struct err err = {0};
    assert_int_equal(chat_template_compile(&t, tpl, n, &err), STATUS_OK);
    char ctx[1024];
    snprintf(ctx, sizeof ctx,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"\", "
             "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"%s\", \"arguments\": %s}}]}]}",
             name, args);
    struct json *c = parse(ctx);
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(chat_template_render(t, c, &out, &len, &err), STATUS_OK);
    json_free(c);
    chat_template_free(t);
    /* the assistant's answer: from its call to the end of it */
    char *a = strstr(out, "<tool_call>"), *z = strstr(out, "</tool_call>");
    assert_non_null(a);
    assert_non_null(z);
    z[strlen("</tool_call>")] = 0;
    char *call = strdup(a);
    free(out);
    return call;
}

static void test_forced_calls(void **state)
{
    (void)state;
    struct json *tools = parse(TOOLS);
    struct api_error e;
    struct grammar *named = NULL, *any = NULL;
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_QWEN3, tools, "get_weather", &named, &e), STATUS_OK);
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_QWEN3, tools, NULL, &any, &e), STATUS_OK);
    char *weather = qwen3_call("get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}");
    char *city = qwen3_call("get_weather", "{\"city\": \"Oslo\"}");
    char *now = qwen3_call("now", "{}");
    char *now_args = qwen3_call("now", "{\"x\": [1, {\"y\": null}]}"); /* no schema: any object */
    assert_true(takes(named, weather));
    assert_true(takes(named, city));
    assert_false(takes(named, now));
    assert_true(takes(any, weather));
    assert_true(takes(any, now));
    assert_true(takes(any, now_args));
    /* near misses: another enum value, an unknown key, a missing required key, no end tag, text first */
    assert_false(takes(named, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"unit\": \"kelvin\"}}\n</tool_call>"));
    assert_false(takes(named, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"zip\": 1}}\n</tool_call>"));
    assert_false(takes(named, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}}\n</tool_call>"));
    assert_false(takes(named, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n"));
    assert_false(takes(any, "Sure. <tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
    free(weather), free(city), free(now), free(now_args);
    grammar_put(named);
    grammar_put(any);
    json_free(tools);
}

static void test_refusals(void **state)
{
    (void)state;
    struct json *tools = parse(TOOLS);
    struct api_error e;
    struct grammar *g = NULL;
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_GLM45, tools, NULL, &g, &e), STATUS_INVALID);
    assert_int_equal(e.http_status, 400);
    assert_string_equal(e.param, "tool_choice");
    assert_null(g);
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_QWEN3, tools, "absent", &g, &e), STATUS_INVALID);
    assert_string_equal(e.param, "tool_choice");
    json_free(tools);
    struct json *bad = parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
                             "\"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 3}}}}}]");
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_QWEN3, bad, "f", &g, &e), STATUS_INVALID);
    assert_string_equal(e.param, "tools");
    assert_string_equal(e.code, "unsupported_parameter");
    assert_non_null(strstr(e.message, "tools[0].function.parameters"));
    assert_non_null(strstr(e.message, "minimum"));
    json_free(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_forced_calls), cmocka_unit_test(test_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
