/* fuzz_safetensors.c — libFuzzer target for the safetensors parser.
 *
 * Feeds the input, as a whole file image, to st_parse_buffer (the same code
 * st_file_open runs on its mapping). Beyond "no crash, no sanitizer report",
 * it checks the promises of safetensors.h on every accepted input: each
 * tensor lies inside the buffer past the header, its byte count is
 * numel * dtype size, names are findable. A failure must carry a message
 * naming the input. Every byte of every accepted tensor is read, so a bad
 * bound shows up as an ASan report.
 *
 * Build and run (from the repository root):
 *   tests/fuzz/make_seeds.sh
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Isrc \
 *     tests/fuzz/fuzz_safetensors.c src/format/safetensors.c $(find src/base -name '*.c') \
 *     $(pkg-config --cflags --libs libcjson) -lm -o /tmp/fz
 *   /tmp/fz -max_total_time=60 /tmp/corpus tests/fuzz/corpus_safetensors
 * (the first corpus directory receives new inputs; keep the committed seeds
 * directory second so it stays read-only).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

/* An array, not a literal, so the borrowed `file` pointer can be compared. */
static const char FUZZ_NAME[] = "fuzz.safetensors";

/* Crash loudly so libFuzzer records the input. */
#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct st_file f = {0};
    struct err err = {0};
    enum status st = st_parse_buffer(&f, data, size, FUZZ_NAME, &err);
    if (st != STATUS_OK) {
        FUZZ_CHECK(f.tensors == NULL && f.metadata == NULL);
        FUZZ_CHECK(strncmp(err.msg, FUZZ_NAME, strlen(FUZZ_NAME)) == 0 &&
                   err.msg[strlen(FUZZ_NAME)] == ':');
        st_file_close(&f);
        return 0;
    }

    FUZZ_CHECK(size >= 8);
    unsigned volatile sink = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const struct st_tensor *t = &f.tensors[i];
        FUZZ_CHECK(t->n_dims >= 0 && t->n_dims <= ST_MAX_DIMS);
        FUZZ_CHECK(t->file == FUZZ_NAME);
        FUZZ_CHECK((uint64_t)st_tensor_numel(t) * dtype_size(t->dtype) == t->n_bytes);
        const uint8_t *p = t->data;
        FUZZ_CHECK(p >= data + 8 && p <= data + size && t->n_bytes <= (size_t)(data + size - p));
        for (size_t j = 0; j < t->n_bytes; j++)
            sink += p[j];
        FUZZ_CHECK(st_file_find(&f, t->name) == t); /* names are unique */
    }
    (void)sink;
    st_file_close(&f);
    return 0;
}
