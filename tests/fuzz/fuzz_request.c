/* fuzz_request.c — libFuzzer target for OpenAI request bodies (server/api_request.c).
 *
 * Each input is parsed as a completions and as a chat completions body. The
 * parser must return OK or an error with an HTTP status in 400..599 and a
 * non-empty message; an accepted request must hold what the API promises
 * (one prompt form, non-empty messages with strings, n_stop <= 4 non-empty
 * strings, values in range); the error and result JSON must print. ASan and
 * UBSan catch the rest.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/api_request.h"
#include "server/api_response.h"

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int k = 0; k < 3; k++) {
        struct api_request rq;
        struct api_error e;
        memset(&e, 0, sizeof e);
        enum api_kind kind = k == 2 ? API_RESPONSES : k ? API_CHAT : API_COMPLETIONS;
        enum status st = api_request_parse(&rq, kind, (const char *)data, size, &e);
        if (st) {
            FUZZ_CHECK(st == STATUS_INVALID);
            FUZZ_CHECK(e.http_status >= 400 && e.http_status < 600 && e.message[0]);
            FUZZ_CHECK(rq.model == NULL && rq.messages == NULL && rq.n_stop == 0);
            char *j = api_error_json(&e);
            FUZZ_CHECK(j && strstr(j, "\"error\""));
            free(j);
            continue;
        }
        FUZZ_CHECK(rq.model != NULL);
        if (kind != API_COMPLETIONS) {
            FUZZ_CHECK(rq.n_messages > 0 && rq.messages);
            for (int i = 0; i < rq.n_messages; i++) {
                FUZZ_CHECK(rq.messages[i].role && rq.messages[i].content);
                struct json *x = NULL; /* what the template gets beside them: an object */
                if (rq.messages[i].extra) {
                    const char *t = rq.messages[i].extra;
                    FUZZ_CHECK(json_parse(t, strlen(t), "extra", &x, NULL) == STATUS_OK && json_is_object(x));
                    json_free(x);
                }
            }
            struct json *t = NULL; /* tools: a non-empty array, or none */
            FUZZ_CHECK(!rq.tools || (json_parse(rq.tools, strlen(rq.tools), "tools", &t, NULL) == STATUS_OK &&
                                     json_array_size(t) > 0 && json_array_size(t) <= API_MAX_TOOLS));
            json_free(t);
            FUZZ_CHECK(kind != API_CHAT || rq.tools || rq.tool_choice == API_TOOL_NONE);
        } else {
            FUZZ_CHECK((rq.prompt_text != NULL) != (rq.prompt_ids != NULL));
            FUZZ_CHECK(rq.n_more >= 0 && rq.n_more < API_MAX_PROMPTS && rq.n >= 1 && rq.n <= API_MAX_CHOICES);
            for (int i = 0; i <= rq.n_more; i++) { /* each prompt copies into a request of its own */
                struct api_request one;
                FUZZ_CHECK(i == 0 || (rq.more[i - 1].text != NULL) != (rq.more[i - 1].ids != NULL));
                if (api_request_copy_one(&rq, i, &one, &e) == STATUS_OK) {
                    FUZZ_CHECK(one.n == 1 && one.n_more == 0 && (one.prompt_text != NULL) != (one.prompt_ids != NULL));
                    api_request_free(&one);
                }
            }
            for (int i = 0; i < rq.n_prompt_ids; i++)
                FUZZ_CHECK(rq.prompt_ids[i] >= 0);
        }
        FUZZ_CHECK(rq.n_stop >= 0 && rq.n_stop <= API_MAX_STOP);
        for (int i = 0; i < rq.n_stop; i++)
            FUZZ_CHECK(rq.stop[i] && rq.stop[i][0]);
        FUZZ_CHECK(rq.max_tokens >= 0 && rq.temperature >= 0 && rq.temperature <= 2);
        FUZZ_CHECK(rq.top_p > 0 && rq.top_p <= 1 && rq.top_k >= 0);
        FUZZ_CHECK(rq.top_logprobs >= 0 && rq.top_logprobs <= 20);
        FUZZ_CHECK(!rq.include_usage || rq.stream);
        FUZZ_CHECK(!rq.prompt_logprobs || (kind != API_RESPONSES && !rq.stream && rq.prompt_top >= 0 && rq.prompt_top <= 20));
        FUZZ_CHECK(rq.n_bias >= 0 && rq.n_bias <= API_MAX_BIAS && rq.n_stop_ids >= 0 && rq.n_stop_ids <= API_MAX_STOP_IDS);
        FUZZ_CHECK(rq.frequency_penalty >= -2 && rq.frequency_penalty <= 2 && rq.min_p >= 0 && rq.min_p <= 1);
        FUZZ_CHECK(rq.repetition_penalty > 0 && rq.min_tokens >= 0);
        for (int i = 0; i < rq.n_bias; i++)
            FUZZ_CHECK(rq.bias_ids[i] >= 0 && rq.bias[i] >= -100 && rq.bias[i] <= 100);
        if (kind == API_RESPONSES) {
            struct api_responses_view v = {.id = "resp_fuzz", .model = rq.model, .status = "completed", .msg_id = "m",
                                           .rs_id = "r", .text = rq.messages[0].content,
                                           .text_len = strlen(rq.messages[0].content), .output = true};
            char *rj = api_responses_json(&v);
            FUZZ_CHECK(rj != NULL);
            free(rj);
            api_request_free(&rq);
            continue;
        }
        /* a response echoing the parsed strings must print */
        /* (a stream of several choices prints each chunk under its choice's index) */
        struct api_result res = {.kind = kind, .index = rq.n * (1 + rq.n_more) - 1, .id = "cmpl-fuzz",
                                 .model = rq.model, .created = 1,
                                 .text = rq.prompt_text ? rq.prompt_text : "",
                                 .text_len = rq.prompt_text ? strlen(rq.prompt_text) : 0, .has_usage = true};
        char *j = api_result_json(&res, rq.stream);
        FUZZ_CHECK(j != NULL);
        free(j);
        api_request_free(&rq);
    }
    return 0;
}
