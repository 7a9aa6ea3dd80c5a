/* test_tool_grammar.c — tool_choice "required" / named as a grammar (server/tool_grammar.h).
 *
 * The grammar takes exactly the calls the model's template writes for the allowed functions, with
 * arguments valid for their schemas, and nothing else: checked byte by byte with the grammar's
 * matcher on calls rendered by the real templates (tests/golden/templates: Qwen3's; GLM-4.5's, and
 * the same calls without its newlines as GLM-4.7/5 write them), and on near misses. glm45: what
 * the grammar takes is read back by tool_parse as the arguments rendered (raw strings, JSON for
 * the rest). Refusals: no call format, a keyword outside the compilers' subset (glm45: also what
 * its tags cannot carry), naming the tool's parameters.
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
#include "server/tool_parse.h"
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

/* The call text the chat template tests/golden/templates/<tmpl>_chat_template.jinja writes for
 * name(args) (args: a JSON object's text), as a model would answer. */
static char *template_call(const char *tmpl, const char *name, const char *args)
{
    const char *src = getenv("MOESERVE_SRC") ? getenv("MOESERVE_SRC") : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/templates/%s_chat_template.jinja", src, tmpl);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char tpl[16384];
    size_t n = fread(tpl, 1, sizeof tpl, f);
    fclose(f);
    struct chat_template *t = NULL;
    struct err err = {0};
    assert_int_equal(chat_template_compile(&t, tpl, n, &err), STATUS_OK);
    char ctx[2048];
    snprintf(ctx, sizeof ctx,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"\", "
             "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"%s\", \"arguments\": %s}}]}]}",
             name, args);
    struct json *c = parse(ctx);
    char *out = NULL;
    size_t len = 0;
    if (chat_template_render(t, c, &out, &len, &err) != STATUS_OK)
        fail_msg("render: %s", err.msg);
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

static char *qwen3_call(const char *name, const char *args)
{
    return template_call("qwen3", name, args);
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
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_NONE, tools, NULL, &g, &e), STATUS_INVALID);
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

/* ---- glm45 ---- */

static const char GLM_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\", \"description\": \"a city\"}, \"unit\": {\"type\": \"string\", "
    "\"enum\": [\"celsius\", \"fahrenheit\"]}, \"days\": {\"type\": \"integer\"}, \"opts\": {\"type\": \"object\", "
    "\"properties\": {\"lang\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}, \"max\": {\"type\": "
    "\"number\"}}}, \"ok\": {\"type\": [\"boolean\", \"null\"]}}, \"required\": [\"city\", \"days\"], "
    "\"additionalProperties\": false}}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"query\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 12}, \"when\": {\"type\": \"string\", "
    "\"format\": \"date\"}, \"kind\": {\"const\": \"web\"}}, \"required\": [\"query\"], \"additionalProperties\": true}}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}]";

/* GLM-4.7/5's layout of a GLM-4.5 call: no newline before a tag that opens a key or a value or
 * closes the call (the test's values end with no newline). */
static char *no_newlines(const char *call)
{
    char *out = strdup(call), *w = out;
    for (const char *r = call; *r; r++)
        if (!(*r == '\n' && (strncmp(r + 1, "<arg_key>", 9) == 0 || strncmp(r + 1, "<arg_value>", 11) == 0 ||
                             strncmp(r + 1, "</tool_call>", 12) == 0)))
            *w++ = *r;
    *w = 0;
    return out;
}

/* g takes text, and what tool_parse reads from it is the call name(args). */
static void takes_as(struct grammar *g, const struct json *tools, const char *text, const char *name, const char *args)
{
    if (!takes(g, text))
        fail_msg("refused: %s", text);
    struct tool_parse p;
    tool_parse_init(&p, TOOL_FORMAT_GLM45, tools);
    assert_int_equal(tool_parse_feed(&p, text, strlen(text), true, NULL), STATUS_OK);
    assert_string_equal(p.content, "");
    assert_int_equal(p.n_calls, 1);
    assert_true(p.calls[0].done);
    assert_string_equal(p.calls[0].name, name);
    struct json *got = parse(p.calls[0].args), *want = parse(args);
    char *g_txt = json_print(got, false), *w_txt = json_print(want, false);
    assert_string_equal(g_txt, w_txt);
    free(g_txt), free(w_txt);
    json_free(got), json_free(want);
    tool_parse_free(&p);
}

/* The template's call for name(args) is taken, in GLM-4.5's layout and GLM-4.7/5's, and parses
 * back to args. */
static void takes_rendered(struct grammar *g, const struct json *tools, const char *name, const char *args)
{
    char *call = template_call("glm45", name, args), *bare = no_newlines(call);
    takes_as(g, tools, call, name, args);
    takes_as(g, tools, bare, name, args);
    free(call), free(bare);
}

static void test_glm45_forced(void **state)
{
    (void)state;
    struct json *tools = parse(GLM_TOOLS);
    struct api_error e;
    struct grammar *weather = NULL, *search = NULL, *any = NULL;
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_GLM45, tools, "get_weather", &weather, &e), STATUS_OK);
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_GLM45, tools, "search", &search, &e), STATUS_OK);
    assert_int_equal(tool_grammar_compile(TOOL_FORMAT_GLM45, tools, NULL, &any, &e), STATUS_OK);
    /* the template's calls: raw strings (quotes, tags' prefixes, non-ASCII as they are), JSON for the rest */
    const char *full = "{\"city\": \"S\\u00e3o \\\"Paulo\\\" <b></arg_valu</ x\", \"unit\": \"celsius\", \"days\": 3, "
                       "\"opts\": {\"lang\": [\"fr\", \"\\u6771\\u4eac\"], \"max\": 2.5}, \"ok\": null}";
    takes_rendered(weather, tools, "get_weather", full);
    takes_rendered(any, tools, "get_weather", full);
    takes_rendered(weather, tools, "get_weather", "{\"city\": \"\", \"days\": -1}");
    takes_rendered(weather, tools, "get_weather", "{\"city\": \"{\\\"a\\\": 1}\", \"days\": 0, \"ok\": true}");
    takes_rendered(search, tools, "search", "{\"query\": \"a<b\", \"when\": \"2026-12-06\", \"kind\": \"web\"}");
    takes_rendered(search, tools, "search", "{\"query\": \"x\", \"note\": \"free text\", \"n\": [1, {\"y\": null}]}");
    takes_rendered(any, tools, "now", "{}");
    takes_rendered(any, tools, "now", "{\"anything\": 5}");
    /* a multi-line raw value, the newlines its own */
    takes_as(weather, tools, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>\nOslo\n\n</arg_value>\n"
             "<arg_key>days</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", "get_weather",
             "{\"city\": \"\\nOslo\\n\\n\", \"days\": 1}");
    assert_false(takes(weather, "<tool_call>now\n</tool_call>"));
    assert_false(takes(search, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>P</arg_value>\n<arg_key>"
                               "days</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"));
    /* near misses */
#define W(body) "<tool_call>get_weather\n" body "</tool_call>"
#define KV(k, v) "<arg_key>" k "</arg_key>\n<arg_value>" v "</arg_value>\n"
    assert_true(takes(weather, W(KV("city", "P") KV("unit", "celsius") KV("days", "2"))));
    assert_false(takes(weather, W(KV("city", "P") KV("unit", "kelvin") KV("days", "2"))));       /* another enum value */
    assert_false(takes(weather, W(KV("city", "P") KV("unit", "\"celsius\"") KV("days", "2")))); /* JSON-quoted */
    assert_false(takes(weather, W(KV("city", "P"))));                                            /* days missing */
    assert_false(takes(weather, W(KV("days", "2"))));                                            /* city missing */
    assert_false(takes(weather, W(KV("city", "P") KV("days", "2") KV("zip", "1"))));            /* unknown key */
    assert_false(takes(weather, W(KV("days", "2") KV("city", "P"))));                            /* out of order */
    assert_false(takes(weather, W(KV("city", "P") KV("days", "two"))));                          /* not an integer */
    assert_false(takes(weather, W(KV("city", "P") KV("days", "\"2\""))));                        /* nor a string */
    assert_false(takes(weather, W(KV("city", "P") KV("days", " 2"))));                           /* blanks */
    assert_false(takes(weather, W(KV("city", "P\xff") KV("days", "2"))));                        /* not UTF-8 */
    assert_false(takes(weather, "<tool_call>get_weather\n" KV("city", "P") KV("days", "2")));   /* no end tag */
    assert_false(takes(weather, "Sure. " W(KV("city", "P") KV("days", "2"))));                   /* text first */
    assert_false(takes(weather, W(KV("city", "P") KV("days", "2")) "\n"));                       /* text after */
    assert_false(takes(weather, "<tool_call>get_weather\n\n" KV("city", "P") KV("days", "2") "</tool_call>"));
#define S(body) "<tool_call>search\n" body "</tool_call>"
    assert_true(takes(search, S(KV("query", "123456789012"))));
    assert_false(takes(search, S(KV("query", "1234567890123"))));                                /* maxLength */
    assert_false(takes(search, S(KV("query", ""))));                                             /* minLength */
    assert_true(takes(search, S(KV("query", "\xe6\x9d\xb1\xe4\xba\xac")))); /* two characters, six bytes */
    assert_false(takes(search, S(KV("query", "a</b"))));             /* with lengths, "</" is not written */
    assert_false(takes(search, S(KV("query", "x") KV("when", "2026-13-01"))));                   /* format */
    assert_false(takes(search, S(KV("query", "x") KV("kind", "news"))));                         /* const */
    assert_false(takes(search, S(KV("query", "x") KV("a b", "1"))));                   /* an extra key with a blank */
#undef W
#undef S
#undef KV
    grammar_put(weather);
    grammar_put(search);
    grammar_put(any);
    json_free(tools);
}

static void test_glm45_refusals(void **state)
{
    (void)state;
    struct api_error e;
    struct grammar *g = NULL;
    static const struct {
        const char *params, *path, *keyword;
    } BAD[] = {
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"pattern\": \"^a+$\"}}}",
         "tools[1].function.parameters.properties.s", "pattern"},
        {"{\"anyOf\": [{\"type\": \"object\"}]}", "tools[1].function.parameters", "anyOf"},
        {"{\"type\": \"array\"}", "tools[1].function.parameters", "type"},
        {"{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 3}}}",
         "tools[1].function.parameters.properties.n", "minimum"},
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"enum\": [\"a\", 1]}}}",
         "tools[1].function.parameters.properties.s", "enum"},
        {"{\"type\": \"object\", \"properties\": {\" s\": {\"type\": \"string\"}}}",
         "tools[1].function.parameters.properties. s", "<arg_key>"},
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"maxLength\": 1000000}}}",
         "tools[1].function.parameters.properties.s", "maxLength"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "[{\"type\": \"function\", \"function\": {\"name\": \"ok\"}}, {\"type\": \"function\", \"function\": "
                 "{\"name\": \"f\", \"parameters\": %s}}]", BAD[i].params);
        struct json *tools = parse(text);
        for (int named = 0; named < 2; named++) {
            assert_int_equal(tool_grammar_compile(TOOL_FORMAT_GLM45, tools, named ? "f" : NULL, &g, &e), STATUS_INVALID);
            assert_null(g);
            assert_int_equal(e.http_status, 400);
            assert_string_equal(e.param, "tools");
            if (!strstr(e.message, BAD[i].path) || !strstr(e.message, BAD[i].keyword))
                fail_msg("%s: %s", BAD[i].params, e.message);
        }
        /* the other tool alone compiles */
        assert_int_equal(tool_grammar_compile(TOOL_FORMAT_GLM45, tools, "ok", &g, &e), STATUS_OK);
        grammar_put(g);
        g = NULL;
        json_free(tools);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_forced_calls), cmocka_unit_test(test_refusals),
                                       cmocka_unit_test(test_glm45_forced), cmocka_unit_test(test_glm45_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
