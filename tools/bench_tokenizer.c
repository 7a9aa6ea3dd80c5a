/* bench_tokenizer.c — single-thread encode throughput over a corpus, beside HF.
 *
 * Usage: bench_tokenizer TOKENIZER_JSON CORPUS_TXT [HF_BENCH_JSON NAME]
 * The corpus (tools/make_tokenizer_corpus.py) is split into documents at
 * "\n\n" exactly like Python's str.split("\n\n"); each document is encoded
 * with add_special_tokens = false, one thread. Prints MB/s (best of 3 runs,
 * MB = 1e6 bytes of the whole corpus, as tools/bench_tokenizer_hf.py), the
 * number of ids and the SHA-256 of all ids as 4-byte little-endian words.
 * Given hf_bench.json and the tokenizer's name there, also compares n_ids and
 * the hash with HF's and prints HF's speed; exit status 1 on a mismatch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/sha256.h"
#include "base/json.h"
#include "base/mapped_file.h"
#include "format/tokenizer.h"


static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS_TXT [HF_BENCH_JSON NAME]\n", argv[0]);
        return 2;
    }
    struct err err = {0};
    struct tokenizer *t = NULL;
    struct mapped_file mf = {0};
    double t0 = now_s();
    if (tokenizer_load(&t, argv[1], &err) || mapped_file_open(&mf, argv[2], &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    double t_load = now_s() - t0;
    const char *text = mf.data ? mf.data : "";
    size_t size = mf.size;

    /* documents: str.split("\n\n") — separators never overlap, empty parts kept */
    size_t n_docs = 1;
    for (const char *p = text; (p = memmem(p, size - (size_t)(p - text), "\n\n", 2)); p += 2)
        n_docs++;
    const char **doc = malloc(n_docs * sizeof *doc);
    size_t *doc_len = malloc(n_docs * sizeof *doc_len);
    if (!doc || !doc_len)
        return 1;
    const char *start = text;
    for (size_t i = 0; i < n_docs; i++) {
        const char *sep = memmem(start, size - (size_t)(start - text), "\n\n", 2);
        const char *end = sep ? sep : text + size;
        doc[i] = start;
        doc_len[i] = (size_t)(end - start);
        start = end + 2;
    }

    struct tok_ids ids = {0};
    double best = 1e30;
    for (int run = 0; run < 3; run++) {
        ids.n = 0;
        double a = now_s();
        for (size_t i = 0; i < n_docs; i++)
            if (tokenizer_encode(t, doc[i], doc_len[i], false, &ids, &err)) {
                fprintf(stderr, "error: document %zu: %s\n", i, err.msg);
                return 1;
            }
        double dt = now_s() - a;
        best = dt < best ? dt : best;
    }
    struct sha256 sh;
    sha256_init(&sh);
    for (size_t i = 0; i < ids.n; i++) {
        uint32_t v = (uint32_t)ids.ids[i];
        unsigned char le[4] = {v & 255, v >> 8 & 255, v >> 16 & 255, v >> 24};
        sha256_update(&sh, le, 4);
    }
    char hex[65];
    sha256_final_hex(&sh, hex);
    double mbs = size / best / 1e6;
    printf("%s: %zu bytes, %zu documents, load %.2f s\n", argv[1], size, n_docs, t_load);
    printf("moeserve: %.3f MB/s (best of 3: %.3f s), n_ids %zu, sha256_ids %s\n", mbs, best, ids.n, hex);

    int rc = 0;
    if (argc == 5) {
        struct json *hf = NULL;
        if (json_parse_file(argv[3], &hf, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            return 1;
        }
        const struct json *r = json_get(json_get(hf, "results"), argv[4]);
        const char *hsha = json_string(json_get(r, "sha256_ids"));
        double hn = json_number(json_get(r, "n_ids")), hmbs = json_number(json_get(r, "mb_per_s"));
        bool same = hsha && !strcmp(hsha, hex) && hn == (double)ids.n;
        printf("hf:       %.3f MB/s, n_ids %.0f, sha256_ids %s\n", hmbs, hn, hsha ? hsha : "(missing)");
        printf("%s: ids %s HF, speed %.2fx HF\n", argv[4], same ? "IDENTICAL to" : "DIFFER from", mbs / hmbs);
        rc = same ? 0 : 1;
        json_free(hf);
    }
    tok_ids_free(&ids);
    free(doc);
    free(doc_len);
    mapped_file_close(&mf);
    tokenizer_free(t);
    return rc;
}
