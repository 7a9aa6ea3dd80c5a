/* fuzz_tokenizer_json.c — libFuzzer target for the tokenizer.json loader.
 *
 * The input is a whole tokenizer.json text, loaded with tokenizer_load_buffer
 * (the same code tokenizer_load runs on the file's bytes). Beyond "no crash,
 * no sanitizer report": a refusal carries a message naming the input; an
 * accepted tokenizer encodes a few fixed texts to ids that are all inside the
 * vocabulary and have a text, decodes them, and the streaming detokenizer
 * (one id at a time, small buffer) emits whole UTF-8 pieces adding up to the
 * decode. Invalid UTF-8 text is refused.
 *
 * Build and run (from the repository root): make test-fuzz, or
 *   CC=clang cmake -S . -B build-fuzz -DMOESERVE_FUZZ=ON && cmake --build build-fuzz
 *   build-fuzz/fuzz_tokenizer_json -max_total_time=60 /tmp/corpus tests/fuzz/corpus_tokenizer_json
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "format/tokenizer.h"

static const char FUZZ_NAME[] = "fuzz-tokenizer.json";

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

static const char *const TEXTS[] = {
    "Hello, world! It's 2024-11-29 and 12345 apples.",
    "  spaces\tand\nnewlines\r\n  ",
    "caf\xc3\xa9 cafe\xcc\x81 \xef\xac\x81 \xe2\x84\xab \xc4\xb0",
    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd",
    "<s> <|endoftext|> [MASK] <mask> </s>x<unk>",
    "",
};

/* Streams ids through a 5-byte buffer and compares with decode. */
static void check_stream(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *want,
                         size_t want_len)
{
    struct detok_stream s;
    detok_stream_init(&s, t, skip);
    struct err err = {0};
    char buf[5];
    size_t k, total = 0;
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(detok_stream_push(&s, ids[i], buf, sizeof buf, &k, &err) == STATUS_OK);
        FUZZ_CHECK(unicode_utf8_validate(buf, k, NULL));
        FUZZ_CHECK(total + k <= want_len && memcmp(want + total, buf, k) == 0);
        total += k;
    }
    do {
        FUZZ_CHECK(detok_stream_flush(&s, buf, sizeof buf, &k, &err) == STATUS_OK);
        FUZZ_CHECK(unicode_utf8_validate(buf, k, NULL));
        FUZZ_CHECK(total + k <= want_len && memcmp(want + total, buf, k) == 0);
        total += k;
    } while (k);
    FUZZ_CHECK(total == want_len);
    detok_stream_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct err err = {0};
    struct tokenizer *t = NULL;
    enum status st = tokenizer_load_buffer(&t, (const char *)data, size, FUZZ_NAME, &err);
    if (st != STATUS_OK) {
        FUZZ_CHECK(t == NULL);
        FUZZ_CHECK(strncmp(err.msg, FUZZ_NAME, strlen(FUZZ_NAME)) == 0);
        return 0;
    }
    int n_vocab = tokenizer_vocab_size(t);
    for (size_t i = 0; i < sizeof TEXTS / sizeof *TEXTS; i++) {
        for (int special = 0; special < 2; special++) {
            struct tok_ids ids = {0};
            st = tokenizer_encode(t, TEXTS[i], strlen(TEXTS[i]), special, &ids, &err);
            if (st != STATUS_OK) { /* only resource limits of a hostile regex */
                FUZZ_CHECK(st == STATUS_UNSUPPORTED || st == STATUS_NOMEM);
                tok_ids_free(&ids);
                continue;
            }
            for (size_t k = 0; k < ids.n; k++) {
                FUZZ_CHECK(ids.ids[k] >= 0 && ids.ids[k] < n_vocab);
                FUZZ_CHECK(tokenizer_token_text(t, ids.ids[k]) != NULL);
            }
            for (int skip = 0; skip < 2; skip++) {
                char *text = NULL;
                size_t len = 0;
                st = tokenizer_decode(t, ids.ids, ids.n, skip, &text, &len, &err);
                if (st == STATUS_OK) {
                    FUZZ_CHECK(text != NULL && text[len] == 0);
                    FUZZ_CHECK(unicode_utf8_validate(text, len, NULL));
                    check_stream(t, ids.ids, ids.n, skip, text, len);
                } else {
                    FUZZ_CHECK(st == STATUS_UNSUPPORTED || st == STATUS_NOMEM);
                }
                free(text);
            }
            tok_ids_free(&ids);
        }
    }
    struct tok_ids ids = {0};
    FUZZ_CHECK(tokenizer_encode(t, "ok\xff", 3, false, &ids, &err) == STATUS_INVALID);
    FUZZ_CHECK(ids.n == 0);
    tokenizer_free(t);
    return 0;
}
