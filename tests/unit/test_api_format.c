/* test_api_format.c — response_format and text.format through the request parser
 * (server/api_format.h): each form compiles to the grammar it names (checked by matching texts),
 * "text" asks nothing, every malformed value and unsupported keyword is a 400 naming the field and
 * where in the schema; a copied request shares the grammar; binding needs the vocabulary.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "engine/grammar.h"
#include "engine/token_mask.h"
#include "server/api_format.h"
#include "server/api_request.h"

#define CHAT(x) "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], " x "}"
#define COMP(x) "{\"model\": \"m\", \"prompt\": \"a\", " x "}"
#define RESP(x) "{\"model\": \"m\", \"input\": \"a\", " x "}"
#define PERSON                                                                                                   \
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}}, " \
    "\"required\": [\"name\", \"age\"], \"additionalProperties\": false}"

static bool matches(struct grammar *g, const char *s)
{
    struct grammar_matcher m;
    assert_int_equal(grammar_matcher_init(&m, g, NULL), STATUS_OK);
    bool ok = grammar_matcher_accept_bytes(&m, (const uint8_t *)s, strlen(s)) && grammar_matcher_can_end(&m);
    grammar_matcher_free(&m);
    return ok;
}

static void parse_ok(enum api_kind kind, const char *body, struct api_request *rq)
{
    struct api_error e = {0};
    if (api_request_parse(rq, kind, body, strlen(body), &e))
        fail_msg("refused %s: %s", body, e.message);
}

static void expect_400(enum api_kind kind, const char *body, const char *param, const char *in_message)
{
    struct api_request rq;
    struct api_error e = {0};
    assert_int_equal(api_request_parse(&rq, kind, body, strlen(body), &e), STATUS_INVALID);
    if (e.http_status != 400 || strcmp(e.param, param) != 0 || !strstr(e.message, in_message))
        fail_msg("%s: got %d '%s' \"%s\", want 400 '%s' with \"%s\"", body, e.http_status, e.param, e.message, param,
                 in_message);
    assert_null(rq.grammar);
}

static void test_forms(void **state)
{
    (void)state;
    struct api_request rq;
    parse_ok(API_CHAT, CHAT("\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"person\", "
                            "\"strict\": true, \"schema\": " PERSON "}}"),
             &rq);
    assert_non_null(rq.grammar);
    assert_true(matches(rq.grammar, "{\"name\": \"Ada\", \"age\": 36}"));
    assert_false(matches(rq.grammar, "{\"name\": \"Ada\"}"));
    /* n choices: each copy shares the grammar (a reference each) */
    struct api_request one;
    struct api_error e;
    assert_int_equal(api_request_copy_one(&rq, 0, &one, &e), STATUS_OK);
    assert_ptr_equal(one.grammar, rq.grammar);
    api_request_free(&rq);
    assert_true(matches(one.grammar, "{\"name\": \"B\", \"age\": 1}")); /* still alive */
    api_request_free(&one);

    parse_ok(API_COMPLETIONS, COMP("\"response_format\": {\"type\": \"json_object\"}"), &rq);
    assert_non_null(rq.grammar);
    assert_true(matches(rq.grammar, "{\"any\": [1, {\"thing\": null}]}"));
    assert_false(matches(rq.grammar, "[1]"));
    api_request_free(&rq);

    parse_ok(API_CHAT, CHAT("\"response_format\": {\"type\": \"text\"}"), &rq);
    assert_null(rq.grammar);
    api_request_free(&rq);
    parse_ok(API_CHAT, CHAT("\"response_format\": null"), &rq);
    assert_null(rq.grammar);
    api_request_free(&rq);

    /* the Responses API: text.format, flat */
    parse_ok(API_RESPONSES, RESP("\"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"p\", \"schema\": " PERSON
                                 "}}"),
             &rq);
    assert_non_null(rq.grammar);
    assert_true(matches(rq.grammar, "{\"name\":\"x\",\"age\":-2}"));
    api_request_free(&rq);
    parse_ok(API_RESPONSES, RESP("\"text\": {\"format\": {\"type\": \"json_object\"}}"), &rq);
    assert_non_null(rq.grammar);
    api_request_free(&rq);
    parse_ok(API_RESPONSES, RESP("\"text\": {\"format\": {\"type\": \"text\"}}"), &rq);
    assert_null(rq.grammar);
    api_request_free(&rq);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_400(API_CHAT, CHAT("\"response_format\": {\"type\": \"bogus\"}"), "response_format", "\"bogus\"");
    expect_400(API_CHAT, CHAT("\"response_format\": \"json\""), "response_format", "must be an object");
    expect_400(API_CHAT, CHAT("\"response_format\": {\"type\": \"json_schema\"}"), "response_format",
               "response_format.json_schema' must be an object");
    expect_400(API_CHAT, CHAT("\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\"}}"),
               "response_format", "response_format.json_schema.schema' must be a JSON Schema object");
    expect_400(API_CHAT,
               CHAT("\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a b\", \"schema\": {}}}"),
               "response_format", "name' must be 1 to 64");
    expect_400(API_CHAT,
               CHAT("\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"strict\": 1, "
                    "\"schema\": {}}}"),
               "response_format", "strict' must be a boolean");
    expect_400(API_CHAT,
               CHAT("\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": "
                    "{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\", \"maximum\": 150}}}}}"),
               "response_format", "response_format.json_schema.schema.properties.age: 'maximum' is not supported");
    expect_400(API_COMPLETIONS,
               COMP("\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": "
                    "{\"type\": \"string\", \"pattern\": \"^(?!a)\"}}}"),
               "response_format", "'pattern' \"^(?!a)\": lookaround and named groups are not supported");
    expect_400(API_RESPONSES,
               RESP("\"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"x\", \"schema\": {\"allOf\": []}}}"),
               "text.format", "text.format.schema: 'allOf' is not supported");
    expect_400(API_RESPONSES, RESP("\"text\": {\"format\": {\"type\": \"grammar\"}}"), "text", "not supported");
}

static void test_bind(void **state)
{
    (void)state;
    struct api_request rq;
    parse_ok(API_CHAT, CHAT("\"response_format\": {\"type\": \"json_object\"}"), &rq);
    struct sched_params sp = {0};
    struct api_error e = {0};
    assert_int_equal(api_format_bind(&rq, NULL, false, &sp, &e), STATUS_INVALID); /* no vocabulary: refused */
    assert_int_equal(e.http_status, 400);
    assert_string_equal(e.param, "response_format");
    struct token_vocab tv = {.n_eos = 1};
    assert_int_equal(api_format_bind(&rq, &tv, false, &sp, &e), STATUS_OK);
    assert_ptr_equal(sp.grammar, rq.grammar);
    assert_ptr_equal(sp.grammar_vocab, &tv);
    api_request_free(&rq);
    /* a thinking model: an optional reasoning block before the JSON, the block's text free */
    parse_ok(API_CHAT, CHAT("\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", "
                            "\"schema\": " PERSON "}}"),
             &rq);
    assert_int_equal(api_format_bind(&rq, &tv, true, &sp, &e), STATUS_OK);
    assert_ptr_equal(sp.grammar, rq.grammar);
    assert_true(matches(rq.grammar, "{\"name\": \"Ada\", \"age\": 36}"));
    assert_true(matches(rq.grammar, "<think>\nHmm, a </thin> <name> \xe4\xb8\xad {\"x\n</think>\n\n{\"name\": \"A\", \"age\": 1}"));
    assert_true(matches(rq.grammar, "<think></think>{\"name\": \"A\", \"age\": 1}"));
    assert_false(matches(rq.grammar, "<think>x</think>\nnot json"));
    assert_false(matches(rq.grammar, "Sure: {\"name\": \"A\", \"age\": 1}"));
    assert_false(matches(rq.grammar, "<think>never closed {\"name\": \"A\", \"age\": 1}"));
    api_request_free(&rq);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_forms), cmocka_unit_test(test_refusals),
                                       cmocka_unit_test(test_bind)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
