/* test_tool_parse.c — tool calls cut out of a model's answer (server/tool_parse.h).
 *
 * 1. Cases per format: each text is fed whole, byte by byte, and cut at every position into two
 *    feeds; the content and the calls must be the same every time (what a stream's deltas add up
 *    to is the whole answer's), and equal to what is expected.
 * 2. The inverse of the templates: tool calls rendered by GLM-4.5's and Qwen3's real chat templates
 *    (tests/golden/templates/) parse back to the same arguments, as JSON values.
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
#include "server/tool_parse.h"
#include "template/chat_template.h"

struct result {
    char content[4096];
    int n;
    char name[8][64], args[8][1024];
    bool done[8];
};

static void run(enum tool_format fmt, const struct json *tools, const char *text, const size_t *cuts, int n_cuts,
                struct result *out)
{
    struct tool_parse p;
    tool_parse_init(&p, fmt, tools);
    memset(out, 0, sizeof *out);
    size_t at = 0, n = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : n;
        assert_int_equal(tool_parse_feed(&p, text + at, end - at, i == n_cuts, NULL), STATUS_OK);
        assert_int_equal(strlen(p.content), p.n_content);
        strncat(out->content, p.content, p.n_content);
        at = end;
    }
    out->n = p.n_calls;
    assert_true(p.n_calls <= 8);
    for (int i = 0; i < p.n_calls; i++) {
        snprintf(out->name[i], sizeof out->name[i], "%s", p.calls[i].name);
        snprintf(out->args[i], sizeof out->args[i], "%s", p.calls[i].args);
        out->done[i] = p.calls[i].done;
    }
    tool_parse_free(&p);
}

static void same(const struct result *a, const struct result *b)
{
    assert_string_equal(a->content, b->content);
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        assert_string_equal(a->name[i], b->name[i]);
        assert_string_equal(a->args[i], b->args[i]);
        assert_int_equal(a->done[i], b->done[i]);
    }
}

/* want: the content, then (name, args, done) per call as "name|args|1" strings, NULL-ended. */
static void check_tools(enum tool_format fmt, const char *tools_json, const char *text, const char *want_content, ...)
{
    struct json *tools = NULL;
    if (tools_json)
        assert_int_equal(json_parse(tools_json, strlen(tools_json), "tools", &tools, NULL), STATUS_OK);
    struct result whole, r;
    run(fmt, tools, text, NULL, 0, &whole);
    assert_string_equal(whole.content, want_content);
    va_list ap;
    va_start(ap, want_content);
    int i = 0;
    for (const char *w = va_arg(ap, const char *); w; w = va_arg(ap, const char *), i++) {
        char got[1200];
        assert_true(i < whole.n);
        snprintf(got, sizeof got, "%s|%s|%d", whole.name[i], whole.args[i], whole.done[i]);
        assert_string_equal(got, w);
    }
    va_end(ap);
    assert_int_equal(whole.n, i);
    const size_t n = strlen(text);
    size_t *every = malloc((n + 1) * sizeof *every);
    for (size_t k = 0; k < n; k++)
        every[k] = k + 1;
    run(fmt, tools, text, every, n > 0 ? (int)n - 1 : 0, &r); /* byte by byte */
    same(&whole, &r);
    for (size_t k = 0; k <= n; k++) { /* two feeds, cut at k */
        run(fmt, tools, text, &k, 1, &r);
        same(&whole, &r);
    }
    free(every);
    json_free(tools);
}

#define check(fmt, text, content, ...) check_tools(fmt, NULL, text, content, __VA_ARGS__)

static void test_qwen3(void **state)
{
    (void)state;
    const enum tool_format Q = TOOL_FORMAT_QWEN3;
    check(Q, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
          "get_weather|{\"city\": \"Paris\"}|1", NULL);
    check(Q, "Let me check.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "Let me check.",
          "f|{}|1", NULL);
    check(Q,
          "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
          "\"arguments\": {\"y\": [1, {\"z\": null}]}}\n</tool_call>",
          "", "a|{\"x\": 1}|1", "b|{\"y\": [1, {\"z\": null}]}|1", NULL);
    /* braces, quotes, escapes and the closing tag inside strings are the arguments' */
    check(Q, "<tool_call>{\"name\":\"run\",\"arguments\":{\"code\":\"if (a) { return \\\"}\\\"; } </tool_call>\"}}</tool_call>",
          "", "run|{\"code\":\"if (a) { return \\\"}\\\"; } </tool_call>\"}|1", NULL);
    /* another key order, or arguments as a JSON string: read whole */
    check(Q, "<tool_call>\n{\"arguments\": {\"a\": 1}, \"name\": \"f\"}\n</tool_call>", "", "f|{\"a\":1}|1", NULL);
    check(Q, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 2}\"}</tool_call>", "", "f|{\"a\": 2}|1", NULL);
    check(Q, "<tool_call>{\"name\": \"f\"}</tool_call>", "", "f|{}|1", NULL);
    /* not a call: content, tags included */
    check(Q, "<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", NULL);
    check(Q, "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>", "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
          NULL);
    check(Q, "a <tool b <tool_cal", "a <tool b <tool_cal", NULL);
    check(Q, "x<<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", "x<", "f|{}|1", NULL);
    /* ended early: before the name the text comes back; after it the call keeps what it had */
    check(Q, "<tool_call>\n{\"na", "<tool_call>\n{\"na", NULL);
    check(Q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1", "", "f|{\"a\": 1|0", NULL);
    check(Q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "", "f|{\"a\": 1}|0", NULL);
    /* the object cut short by the closing tag */
    check(Q, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1</tool_call>ok", "ok", "f|{\"a\": 1|1", NULL);
    /* white space: dropped before and between calls and after the last; kept elsewhere */
    check(Q, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nDone.", "Done.", "f|{}|1", NULL);
    check(Q, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n \n", "", "f|{}|1", NULL);
    check(Q, "Hi \n", "Hi \n", NULL);
    check(Q, "a  \n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n  b", "a  \n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n  b", NULL);
    /* a run longer than the hold: its start is content (13 bytes of white space are held before a tag) */
    check(Q, "  \n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n  <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
          "  \n\n\n\n\n", "f|{}|1", NULL);
    check(Q, "<tool_call>{\"name\": \"f\\u00e9\\\"\", \"arguments\": {}}</tool_call>", "", "f\xc3\xa9\"|{}|1", NULL);
    check(Q, "", "", NULL);
    check(TOOL_FORMAT_NONE, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
          "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", NULL);
}

static const char GLM_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, \"zip\": {\"type\": "
    "\"string\"}, \"opt\": {\"type\": [\"string\", \"null\"]}, \"any\": {}}}}}]";

static void test_glm45(void **state)
{
    (void)state;
    const enum tool_format G = TOOL_FORMAT_GLM45;
    check_tools(G, GLM_TOOLS,
                "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
                "<arg_value>3</arg_value>\n</tool_call>",
                "", "get_weather|{\"city\": \"Paris\", \"days\": 3}|1", NULL);
    /* GLM-4.7/5: no newlines; a string parameter stays a string even where it reads as JSON */
    check_tools(G, GLM_TOOLS,
                "I'll look.<tool_call>get_weather<arg_key>zip</arg_key><arg_value>01234</arg_value><arg_key>any</arg_key>"
                "<arg_value>{\"x\": [1, 2]}</arg_value><arg_key>opt</arg_key><arg_value>null</arg_value></tool_call>",
                "I'll look.", "get_weather|{\"zip\": \"01234\", \"any\": {\"x\": [1, 2]}, \"opt\": \"null\"}|1", NULL);
    /* no schema: JSON where it parses, else a string (escaped) */
    check(G, "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value> 12 </arg_value>\n<arg_key>s</arg_key>\n<arg_value>a \"q\"\nb"
             "</arg_value>\n</tool_call>",
          "", "f|{\"n\": 12, \"s\": \"a \\\"q\\\"\\nb\"}|1", NULL);
    check(G, "<tool_call>now\n</tool_call>", "", "now|{}|1", NULL);
    check(G, "<tool_call>now</tool_call>", "", "now|{}|1", NULL);
    check(G, "<tool_call>\nnow\n</tool_call>", "", "now|{}|1", NULL);
    check(G,
          "Two.\n<tool_call>a\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>\n<tool_call>b\n</tool_call>\n",
          "Two.", "a|{\"x\": 1}|1", "b|{}|1", NULL);
    /* ended inside a value: the call keeps the arguments it had, closed */
    check(G, "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n<arg_key>b</arg_key>\n<arg_value>2", "",
          "f|{\"a\": 1}|0", NULL);
    check(G, "<tool_call>f", "<tool_call>f", NULL);
    check(G, "<tool_call>two\tnames\n</tool_call>", "<tool_call>two\tnames\n</tool_call>", NULL); /* not a name */
    check(G, "<tool_call>a>b</tool_call>x", "<tool_call>a>b</tool_call>x", NULL);
    check(G, "<tool_call></tool_call>", "<tool_call></tool_call>", NULL);
    check(G, "a <tool_call", "a <tool_call", NULL);
}

/* ---- the templates' inverse ---- */

/* *out: the template at tmpl_path rendered with ctx_json (malloc'ed). */
static void render(const char *tmpl_path, const char *ctx_json, char **out)
{
    struct err err = {0};
    struct chat_template *t = NULL;
    struct json *ctx = NULL;
    FILE *f = fopen(tmpl_path, "rb");
    assert_non_null(f);
    static char src[65536];
    size_t n = fread(src, 1, sizeof src, f);
    fclose(f);
    assert_int_equal(chat_template_compile(&t, src, n, &err), STATUS_OK);
    assert_int_equal(json_parse(ctx_json, strlen(ctx_json), "ctx", &ctx, &err), STATUS_OK);
    size_t len = 0;
    if (chat_template_render(t, ctx, out, &len, &err) != STATUS_OK)
        fail_msg("render: %s", err.msg);
    chat_template_free(t);
    json_free(ctx);
}

/* JSON text -> its compact print, for comparing values. */
static char *canon(const char *s)
{
    struct json *j = NULL;
    if (json_parse(s, strlen(s), "canon", &j, NULL) != STATUS_OK)
        fail_msg("not JSON: %s", s);
    char *out = json_print(j, false);
    json_free(j);
    return out;
}

static const char ROUND_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, "
    "\"zip\": {\"type\": \"string\"}, \"opts\": {\"type\": \"object\"}, \"tags\": {\"type\": \"array\"}, \"ok\": "
    "{\"type\": \"boolean\"}, \"note\": {\"type\": \"string\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": "
    "\"now\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}]";
static const char *const ROUND_ARGS[] = {
    "{\"city\": \"Paris\", \"days\": 3, \"zip\": \"01234\", \"opts\": {\"a\": [1, 2.5, \"é\"]}, \"tags\": [\"x\"], "
    "\"ok\": false, \"note\": \"line1\\nline2 \\\"q\\\" </arg_value\"}",
    "{}"};

static void round_trip(const char *path, enum tool_format fmt)
{
    char ctx[8192];
    snprintf(ctx, sizeof ctx,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": "
             "\"Looking.\", \"tool_calls\": [{\"type\": \"function\", \"id\": \"call_1\", \"function\": {\"name\": "
             "\"get_weather\", \"arguments\": %s}}, {\"type\": \"function\", \"id\": \"call_2\", \"function\": {\"name\": "
             "\"now\", \"arguments\": %s}}]}], \"tools\": %s, \"add_generation_prompt\": false}",
             ROUND_ARGS[0], ROUND_ARGS[1], ROUND_TOOLS);
    char *out = NULL;
    render(path, ctx, &out);
    assert_non_null(out);
    /* the assistant's turn: from its text to the end of the last call */
    char *a = strstr(out, "Looking."), *z = NULL;
    assert_non_null(a);
    for (char *q = strstr(a, "</tool_call>"); q; q = strstr(q + 1, "</tool_call>"))
        z = q + strlen("</tool_call>");
    assert_non_null(z);
    *z = 0;
    struct json *tools = NULL;
    assert_int_equal(json_parse(ROUND_TOOLS, strlen(ROUND_TOOLS), "tools", &tools, NULL), STATUS_OK);
    struct tool_parse p;
    tool_parse_init(&p, fmt, tools);
    assert_int_equal(tool_parse_feed(&p, a, strlen(a), true, NULL), STATUS_OK);
    assert_string_equal(p.content, "Looking.");
    assert_int_equal(p.n_calls, 2);
    assert_string_equal(p.calls[0].name, "get_weather");
    assert_string_equal(p.calls[1].name, "now");
    for (int i = 0; i < 2; i++) {
        assert_true(p.calls[i].done);
        char *got = canon(p.calls[i].args), *want = canon(ROUND_ARGS[i]);
        assert_string_equal(got, want);
        free(got), free(want);
    }
    tool_parse_free(&p);
    json_free(tools);
    free(out);
}

static void test_templates_inverse(void **state)
{
    (void)state;
    const char *src = getenv("MOESERVE_SRC") ? getenv("MOESERVE_SRC") : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/templates/glm45_chat_template.jinja", src);
    round_trip(path, TOOL_FORMAT_GLM45);
    snprintf(path, sizeof path, "%s/tests/golden/templates/qwen3_chat_template.jinja", src);
    round_trip(path, TOOL_FORMAT_QWEN3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_qwen3), cmocka_unit_test(test_glm45),
                                       cmocka_unit_test(test_templates_inverse)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
