/* bench_grammar.c — the cost of grammar-constrained decoding: token masks per step, one thread.
 *
 * Usage: bench_grammar TOKENIZER_JSON [ROUNDS]
 * For each case (a JSON schema and a document that validates against it), the document is encoded
 * with the tokenizer (the ids a model would emit), then decoded under the constraint: before each
 * id the mask is computed (the walk of the vocabulary trie, or the per-state cache), the id is
 * checked to be in it, and the matcher accepts it; at the end the grammar must be complete. Prints
 * per case: steps, microseconds a mask (mean, p50, max, the first mask of the document), cache
 * hits, the mean walked mask, and what 64 such masks a step would cost. A mismatch (the document's
 * own tokens refused) exits 1: the benchmark doubles as a check on a real vocabulary.
 * Compile cost (schema -> grammar) is printed too. The vocabulary trie's build time comes first.
 * Then the scheduler's form: 64 sequences decoding the same document, a step's 64 masks computed in
 * parallel over the OpenMP threads (OMP_NUM_THREADS) as scheduler.c does: milliseconds a step,
 * mean and max; in lock step (every row in the same state: the shared cache's best case), and
 * staggered (row b starts 2 x (b mod 16) steps late: 16 different states a step, the mean over the
 * steps where all 64 rows run).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "engine/grammar_json.h"
#include "engine/token_mask.h"
#include "format/tokenizer.h"

struct bench_case {
    const char *name;
    const char *schema; /* NULL: json_object (any object) */
    const char *doc;
};

static const struct bench_case CASES[] = {
    {"person", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
               "\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
               "\"string\"},\"maxItems\":8}},\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}",
     "{\"name\": \"Ada Lovelace, Countess of Lovelace\", \"age\": 36, \"email\": \"ada@example.org\", \"tags\": "
     "[\"mathematician\", \"writer\", \"first programmer\"]}"},
    {"free_text", "{\"type\":\"object\",\"properties\":{\"answer\":{\"type\":\"string\"}},\"required\":[\"answer\"],"
                  "\"additionalProperties\":false}",
     "{\"answer\": \"In the beginning God created the heaven and the earth. And the earth was without form, and void; "
     "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
     "said, Let there be light: and there was light.\"}"},
    {"nested", "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\","
               "\"properties\":{\"id\":{\"type\":\"integer\"},\"price\":{\"type\":\"number\"},\"kind\":{\"enum\":["
               "\"book\",\"pen\",\"lamp\"]},\"note\":{\"type\":[\"string\",\"null\"]}},\"required\":[\"id\",\"price\","
               "\"kind\",\"note\"],\"additionalProperties\":false}}},\"required\":[\"items\"],\"additionalProperties\":"
               "false}",
     "{\n  \"items\": [\n    {\"id\": 1, \"price\": 12.5, \"kind\": \"book\", \"note\": null},\n    {\"id\": 2, "
     "\"price\": 0.99, \"kind\": \"pen\", \"note\": \"blue ink\"},\n    {\"id\": 3, \"price\": 40, \"kind\": "
     "\"lamp\", \"note\": \"brass, 1920s\"}\n  ]\n}"},
    {"json_object", NULL, "{\"title\": \"Genesis\", \"chapters\": 50, \"verses\": [1, 2, 3], \"meta\": {\"lang\": "
                          "\"en\", \"ok\": true, \"x\": null}}"},
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON [ROUNDS]\n", argv[0]);
        return 2;
    }
    int rounds = argc == 3 ? atoi(argv[2]) : 3;
    if (rounds < 1)
        rounds = 1;
    struct err err = {0};
    struct tokenizer *tok = NULL;
    if (tokenizer_load(&tok, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t eos[2] = {tokenizer_token_id(tok, "<|im_end|>"), tokenizer_token_id(tok, "<|endoftext|>")};
    struct token_vocab tv;
    double t0 = timer_now();
    if (token_vocab_init(&tv, tok, eos, 2, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        tokenizer_free(tok);
        return 1;
    }
    printf("vocabulary %d ids, trie %d nodes, longest token %d bytes, built in %.1f ms\n", tv.vocab, (int)tv.n_nodes,
           tv.max_len, (timer_now() - t0) * 1e3);
    printf("%-12s %6s %9s %9s %9s %9s %7s %9s %12s %10s\n", "case", "steps", "mean_us", "p50_us", "max_us",
           "first_us", "cached", "walk_us", "64_masks_ms", "compile_ms");
    int rc = 0;
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0] && !rc; c++) {
        const struct bench_case *bc = &CASES[c];
        struct tok_ids ids = {0};
        if (tokenizer_encode(tok, bc->doc, strlen(bc->doc), false, &ids, &err)) {
            fprintf(stderr, "%s: %s\n", bc->name, err.msg);
            rc = 1;
            break;
        }
        double *t = malloc((ids.n + 1) * (size_t)rounds * sizeof *t);
        size_t nt = 0;
        double first = 0, compile_ms = 0, walk_sum = 0;
        uint64_t walked = 0, cached = 0;
        for (int r = 0; r < rounds && !rc; r++) {
            struct grammar *g = NULL;
            double tc = timer_now();
            if (grammar_json_compile_text(bc->schema, bc->schema ? strlen(bc->schema) : 0, NULL, &g, &err)) {
                fprintf(stderr, "%s: %s\n", bc->name, err.msg);
                rc = 1;
                break;
            }
            compile_ms = (timer_now() - tc) * 1e3;
            struct token_mask tm;
            if (token_mask_init(&tm, &tv, g, &err)) {
                fprintf(stderr, "%s: %s\n", bc->name, err.msg);
                grammar_put(g);
                rc = 1;
                break;
            }
            grammar_put(g);
            for (size_t i = 0; i <= ids.n && !rc; i++) {
                uint64_t before = tm.n_computed;
                double ts = timer_now();
                enum status st = token_mask_compute(&tm, &err);
                double dt = timer_now() - ts;
                t[nt++] = dt;
                if (tm.n_computed > before)
                    walk_sum += dt;
                if (i == 0 && r == 0)
                    first = dt;
                int32_t next = i < ids.n ? ids.ids[i] : eos[0];
                if (st || !token_mask_allows(&tm, next) || token_mask_accept(&tm, next, &err)) {
                    fprintf(stderr, "%s: step %zu: token %d refused (%s)\n", bc->name, i, (int)next,
                            st ? err.msg : "not in the mask");
                    rc = 1;
                }
            }
            walked += tm.n_computed;
            cached += tm.n_cached;
            token_mask_free(&tm);
        }
        if (!rc) {
            double sum = 0;
            for (size_t i = 0; i < nt; i++)
                sum += t[i];
            qsort(t, nt, sizeof *t, cmp_d);
            double mean = sum / (double)nt;
            printf("%-12s %6zu %9.1f %9.1f %9.1f %9.1f %6.0f%% %9.1f %12.2f %10.2f\n", bc->name, ids.n + 1, mean * 1e6,
                   t[nt / 2] * 1e6, t[nt - 1] * 1e6, first * 1e6, 100.0 * (double)cached / (double)(walked + cached),
                   walked ? walk_sum / (double)walked * 1e6 : 0.0, 64 * mean * 1e3, compile_ms);
        }
        free(t);
        tok_ids_free(&ids);
    }
    /* batch 64, lock step, parallel masks */
    enum { B = 64 };
    printf("\nbatch %d, masks in parallel on %d threads\n%-12s %12s %12s %14s %14s\n", B, omp_get_max_threads(), "case",
           "step_ms_mean", "step_ms_max", "stagger_mean", "stagger_max");
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0] && !rc; c++) {
        const struct bench_case *bc = &CASES[c];
        struct tok_ids ids = {0};
        struct grammar *g = NULL;
        if (tokenizer_encode(tok, bc->doc, strlen(bc->doc), false, &ids, &err) ||
            grammar_json_compile_text(bc->schema, bc->schema ? strlen(bc->schema) : 0, NULL, &g, &err)) {
            fprintf(stderr, "%s: %s\n", bc->name, err.msg);
            rc = 1;
            break;
        }
        struct token_mask *tms = calloc(B, sizeof *tms);
        for (int b = 0; b < B; b++)
            if (token_mask_init(&tms[b], &tv, g, &err))
                rc = 1;
        grammar_put(g);
        double sum[2] = {0, 0}, mx[2] = {0, 0};
        int n_steps[2] = {0, 0}, bad = 0;
        for (int mode = 0; mode < 2 && !rc; mode++) {
            if (mode == 1) { /* fresh rows (the vocabulary's shared cache stays warm, as in a server) */
                for (int b = 0; b < B; b++) {
                    token_mask_free(&tms[b]);
                    if (grammar_json_compile_text(bc->schema, bc->schema ? strlen(bc->schema) : 0, NULL, &g, &err) ||
                        token_mask_init(&tms[b], &tv, g, &err))
                        rc = 1;
                    grammar_put(g);
                }
            }
            const int lag_max = mode ? 30 : 0;
            for (int step = 0; step <= (int)ids.n + lag_max && !rc; step++) {
                double ts = timer_now();
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : bad)
                for (int b = 0; b < B; b++) {
                    int i = step - (mode ? 2 * (b % 16) : 0);
                    if (i < 0 || i > (int)ids.n)
                        continue;
                    int32_t next = i < (int)ids.n ? ids.ids[i] : eos[0];
                    struct err e2 = {0};
                    bad += token_mask_compute(&tms[b], &e2) != STATUS_OK || !token_mask_allows(&tms[b], next);
                }
                double dt = timer_now() - ts;
                for (int b = 0; b < B; b++) {
                    int i = step - (mode ? 2 * (b % 16) : 0);
                    if (i >= 0 && i <= (int)ids.n)
                        bad += token_mask_accept(&tms[b], i < (int)ids.n ? ids.ids[i] : eos[0], &err) != STATUS_OK;
                }
                if (step >= lag_max && step <= (int)ids.n) { /* every row running */
                    sum[mode] += dt;
                    mx[mode] = dt > mx[mode] ? dt : mx[mode];
                    n_steps[mode]++;
                }
            }
        }
        if (bad) {
            fprintf(stderr, "%s: %d refusals in the batch\n", bc->name, bad);
            rc = 1;
        } else if (!rc) {
            printf("%-12s %12.3f %12.3f %14.3f %14.3f\n", bc->name, sum[0] / n_steps[0] * 1e3, mx[0] * 1e3,
                   n_steps[1] ? sum[1] / n_steps[1] * 1e3 : 0.0, mx[1] * 1e3);
        }
        for (int b = 0; b < B; b++)
            token_mask_free(&tms[b]);
        free(tms);
        tok_ids_free(&ids);
    }
    token_vocab_free(&tv);
    tokenizer_free(tok);
    return rc;
}
