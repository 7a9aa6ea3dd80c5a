/* fuzz_grammar_json.c — libFuzzer target for the JSON Schema compiler (engine/grammar_json.c) and
 * the grammar matcher it feeds (engine/grammar.c): schemas come from request bodies.
 *
 * Each input is compiled as a schema. A refusal must be STATUS_INVALID, STATUS_UNSUPPORTED or
 * STATUS_FORMAT with a message. A compiled grammar is matched against the input's own bytes, byte
 * by byte: a refused byte must leave the state as it was (same end and completeness) and the
 * matcher must not grow past its bounds; the result is also matched whole against a few JSON
 * texts. ASan and UBSan catch the rest.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/grammar_json.h"

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct grammar *g = NULL;
    struct err err = {0};
    enum status st = grammar_json_compile_text((const char *)data, size, NULL, &g, &err);
    if (st) {
        FUZZ_CHECK(st == STATUS_INVALID || st == STATUS_UNSUPPORTED || st == STATUS_FORMAT || st == STATUS_NOMEM);
        FUZZ_CHECK(err.msg[0] && g == NULL);
        return 0;
    }
    FUZZ_CHECK(g && grammar_n_rules(g) > 0);
    struct grammar_matcher m;
    if (grammar_matcher_init(&m, g, &err) == STATUS_OK) {
        for (size_t i = 0; i < size && i < 4096; i++) {
            bool end = grammar_matcher_can_end(&m);
            int32_t n_tops = m.cur.end - m.cur.begin;
            if (!grammar_matcher_accept_bytes(&m, data + i, 1)) {
                FUZZ_CHECK(m.failed || (grammar_matcher_can_end(&m) == end && m.cur.end - m.cur.begin == n_tops));
                if (m.failed)
                    break;
            }
            FUZZ_CHECK(m.cur.end - m.cur.begin <= GRAMMAR_MAX_STACKS);
        }
        grammar_matcher_free(&m);
    }
    static const char *const texts[] = {"{}", "[]", "0", "\"\"", "null", "{\"a\": [1, 2.5e3, true, \"x\"]}"};
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        if (grammar_matcher_init(&m, g, &err) == STATUS_OK) {
            (void)grammar_matcher_accept_bytes(&m, (const uint8_t *)texts[t], strlen(texts[t]));
            (void)grammar_matcher_done(&m);
            grammar_matcher_free(&m);
        }
    }
    grammar_put(g);
    return 0;
}
