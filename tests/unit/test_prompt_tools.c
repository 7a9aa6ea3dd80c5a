/* test_prompt_tools.c — tools and tool-call histories from an OpenAI request to the prompt text.
 *
 * Each chat of tests/golden/templates/tool_chats.jsonl (tools/make_tool_template_fixtures.py) is a
 * request body as an OpenAI client sends it (tool-call arguments as JSON text, content null beside
 * calls, tool results with tool_call_id, tool_choice, chat_template_kwargs) and the text the real
 * Qwen3 and GLM-4.5 templates render for it with the arguments as objects (transformers, or jinja2
 * in its environment). Parsed by api_request_parse and rendered by prompt_render_chat, the server's
 * prompt must be that text byte for byte.
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
#include "server/api_request.h"
#include "server/prompt_build.h"
#include "template/chat_template.h"

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)len, f), (size_t)len);
    s[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return s;
}

static struct chat_template *load_template(const char *src, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/templates/%s_chat_template.jinja", src, name);
    size_t n = 0;
    char *text = read_file(path, &n);
    assert_non_null(text);
    struct chat_template *t = NULL;
    struct err err = {0};
    if (chat_template_compile(&t, text, n, &err))
        fail_msg("%s: %s", path, err.msg);
    free(text);
    return t;
}

static void test_tool_chats(void **state)
{
    (void)state;
    const char *src = getenv("MOESERVE_SRC") ? getenv("MOESERVE_SRC") : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/templates/tool_chats.jsonl", src);
    size_t n = 0;
    char *all = read_file(path, &n);
    assert_non_null(all);
    struct chat_template *qwen3 = load_template(src, "qwen3"), *glm45 = load_template(src, "glm45");
    int done = 0;
    for (char *line = all, *end; *line; line = end + 1) {
        end = strchr(line, '\n');
        if (!end)
            end = line + strlen(line);
        struct json *rec = NULL;
        assert_int_equal(json_parse(line, (size_t)(end - line), path, &rec, NULL), STATUS_OK);
        const char *tname = json_string(json_get(rec, "template"));
        const char *want = json_string(json_get(rec, "rendered"));
        assert_non_null(tname);
        assert_non_null(want);
        /* the request body: the chat plus a model name */
        struct json *body = json_new_object();
        json_add(body, "model", json_new_string("m"));
        for (const struct json *m = json_child(json_get(rec, "request")); m; m = json_next(m)) {
            char *t = json_print(m, false);
            struct json *copy = NULL;
            assert_int_equal(json_parse(t, strlen(t), "member", &copy, NULL), STATUS_OK);
            json_add(body, json_key(m), copy);
            free(t);
        }
        char *text = json_print(body, false);
        struct api_request rq;
        struct api_error e;
        if (api_request_parse(&rq, API_CHAT, text, strlen(text), &e))
            fail_msg("chat %d refused: %s (%s)", done, e.message, e.param);
        struct prompt_model pm = {.tmpl = strcmp(tname, "glm45") == 0 ? glm45 : qwen3};
        char *got = NULL;
        size_t len = 0;
        if (prompt_render_chat(&pm, &rq, &got, &len, &e))
            fail_msg("chat %d (%s): %s", done, tname, e.message);
        if (strcmp(got, want) != 0)
            fail_msg("chat %d (%s) differs\n want: [%s]\n  got: [%s]", done, tname, want, got);
        assert_int_equal(len, strlen(want));
        free(got);
        api_request_free(&rq);
        free(text);
        json_free(body);
        json_free(rec);
        done++;
        if (!*end)
            break;
    }
    print_message("%d tool chats rendered as the fixture's renderer did\n", done);
    assert_true(done >= 14);
    chat_template_free(qwen3);
    chat_template_free(glm45);
    free(all);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tool_chats)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
