/* fuzz_chat_template.c — libFuzzer target for the chat-template interpreter.
 *
 * The input is a template, optionally followed by a NUL and a JSON context;
 * without a NUL (or when the JSON does not parse) a fixed chat context is
 * used: messages of every role with tool calls, tools, special tokens. The
 * template is compiled and, when it compiles, rendered twice. Beyond "no
 * crash, no sanitizer report, no leak, no hang" it checks the promises of
 * chat_template.h: failures carry a message; output is NUL-terminated and
 * within the 16 MiB cap; a render is a pure function of template and context
 * (both renders agree, unless the template reads the clock).
 *
 * Build and run (from the repository root):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Isrc \
 *     tests/fuzz/fuzz_chat_template.c src/format/chat_template.c src/format/jinja_*.c \
 *     $(find src/base -name '*.c') $(pkg-config --cflags --libs libcjson) -lm -o /tmp/fz
 *   /tmp/fz -max_total_time=60 /tmp/corpus tests/fuzz/corpus_chat_template
 * (the first corpus directory receives new inputs; keep the committed seeds
 * directory second so it stays read-only).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "template/chat_template.h"

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

static const char FUZZ_CONTEXT[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": \"What's the weather in Paris?\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nlook it up\\n</think>\\n\\n\", \"tool_calls\": ["
    "{\"type\": \"function\", \"id\": \"call_1\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"Paris\", \"days\": 2}}}]},"
    "{\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 18}\", \"tool_call_id\": \"call_1\"},"
    "{\"role\": \"assistant\", \"content\": \"18 \\u00b0C\", \"reasoning_content\": \"easy\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"thanks \\ud83d\\ude4f\"}]}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"description\": \"Weather\", \"parameters\": {\"type\": \"object\", \"properties\":"
    " {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"minimum\": 0.5}},"
    " \"required\": [\"city\"]}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    size_t tpl_len = nul ? (size_t)(nul - text) : size;

    struct err err = {0};
    struct chat_template *t = NULL;
    enum status st = chat_template_compile(&t, text, tpl_len, &err);
    if (st != STATUS_OK) {
        FUZZ_CHECK(t == NULL && err.msg[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(t != NULL);

    struct json *ctx = NULL;
    struct err jerr = {0};
    if (!nul || json_parse(nul + 1, size - tpl_len - 1, "fuzz context", &ctx, &jerr) != STATUS_OK) {
        st = json_parse(FUZZ_CONTEXT, sizeof FUZZ_CONTEXT - 1, "fuzz context", &ctx, &jerr);
        FUZZ_CHECK(st == STATUS_OK);
    }

    char *out[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    enum status rs[2];
    for (int k = 0; k < 2; k++) {
        struct err rerr = {0};
        rs[k] = chat_template_render(t, ctx, &out[k], &len[k], &rerr);
        if (rs[k] == STATUS_OK) {
            FUZZ_CHECK(out[k] != NULL && out[k][len[k]] == '\0');
            FUZZ_CHECK(len[k] <= ((size_t)16 << 20));
        } else {
            FUZZ_CHECK(out[k] == NULL && rerr.msg[0] != '\0');
        }
    }
    if (!memmem(text, tpl_len, "strftime", 8)) {
        FUZZ_CHECK(rs[0] == rs[1]);
        if (rs[0] == STATUS_OK)
            FUZZ_CHECK(len[0] == len[1] && memcmp(out[0], out[1], len[0]) == 0);
    }
    free(out[0]);
    free(out[1]);
    json_free(ctx);
    chat_template_free(t);
    return 0;
}
