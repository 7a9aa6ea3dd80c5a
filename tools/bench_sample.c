/* bench_sample.c — the device sampler's cost a decode step: the sample op (argmax for greedy; the
 * top-k / top-p cuts and the draw otherwise) on rows of a vocabulary's width, against the argmax op.
 *
 * Two kinds of rows: "flat" (logits uniform in [-3, 3): a random model's, the synthetic checkpoints')
 * and "peaked" (a language model's: logit 12 - 1.5 ln(rank + 1) over a random ranking, plus noise).
 * Each (rows, kind, parameters) is timed over --iters calls after 3 warm-up calls, synchronised at
 * the end; the table gives microseconds a call. Needs a CUDA device.
 *
 * Usage: bench_sample [--vocab N] [--iters N] [--device N]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/status.h"
#include "base/timer.h"
#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_01(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1p-53;
}

/* rows x vocab logits of one kind, each row its own */
static float *logits_make(int rows, int vocab, int peaked, uint64_t *rng)
{
    float *l = malloc((size_t)rows * (size_t)vocab * sizeof(float));
    int *rank = malloc((size_t)vocab * sizeof(int));
    if (!l || !rank) {
        free(l), free(rank);
        return NULL;
    }
    for (int r = 0; r < rows; r++) {
        float *row = l + (size_t)r * (size_t)vocab;
        if (!peaked) {
            for (int i = 0; i < vocab; i++)
                row[i] = (float)(6.0 * rng_01(rng) - 3.0);
            continue;
        }
        for (int i = 0; i < vocab; i++)
            rank[i] = i;
        for (int i = vocab - 1; i > 0; i--) { /* Fisher-Yates */
            int j = (int)(rng_next(rng) % (uint64_t)(i + 1)), t = rank[i];
            rank[i] = rank[j], rank[j] = t;
        }
        for (int i = 0; i < vocab; i++)
            row[i] = (float)(12.0 - 1.5 * log1p((double)rank[i]) + 0.3 * rng_01(rng));
    }
    free(rank);
    return l;
}

static int int_arg(int argc, char **argv, const char *name, int dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return atoi(argv[i + 1]);
    return dflt;
}
#endif

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_sample [--vocab N] [--iters N] [--device N]\n"
                   "Times the CUDA backend's sample op (greedy, temperature, top-k, top-p, min-p) and its argmax op\n"
                   "on flat and peaked rows of N logits (default 151936, Qwen3's vocabulary), at 1 and 64 rows.\n");
            return 0;
        }
#ifndef MOESERVE_HAVE_CUDA
    (void)argc, (void)argv;
    fprintf(stderr, "bench_sample: built without CUDA\n");
    return 2;
#else
    const int vocab = int_arg(argc, argv, "--vocab", 151936), iters = int_arg(argc, argv, "--iters", 50),
              device = int_arg(argc, argv, "--device", 0);
    struct backend be;
    struct err err = {0};
    if (backend_cuda_create(&be, device, 0, &err)) {
        fprintf(stderr, "bench_sample: %s\n", err.msg);
        return 1;
    }
    struct {
        const char *name;
        struct sample_row p;
    } modes[] = {
        {"greedy", {.top_p = 1.0f}},
        {"T 1", {.temperature = 1.0f, .top_p = 1.0f}},
        {"T 1 top_p 0.9", {.temperature = 1.0f, .top_p = 0.9f}},
        {"T 1 top_k 50", {.temperature = 1.0f, .top_p = 1.0f, .top_k = 50}},
        {"T 0.7 top_k 50 top_p 0.95", {.temperature = 0.7f, .top_p = 0.95f, .top_k = 50}},
        {"T 1 min_p 0.05", {.temperature = 1.0f, .top_p = 1.0f, .min_p = 0.05f}},
    };
    const int row_counts[] = {1, 64};
    uint64_t rng = 7;
    printf("%-6s %-7s %-28s %10s\n", "rows", "rows of", "parameters", "us a call");
    for (int rc = 0; rc < 2; rc++)
        for (int peaked = 0; peaked < 2; peaked++) {
            const int rows = row_counts[rc];
            float *l = logits_make(rows, vocab, peaked, &rng);
            float *dl = l ? be.ops->alloc(&be, (size_t)rows * (size_t)vocab * sizeof(float)) : NULL;
            struct sample_row *dp = be.ops->alloc(&be, (size_t)rows * sizeof(struct sample_row));
            int32_t *dids = be.ops->alloc(&be, (size_t)rows * sizeof(int32_t));
            struct sample_row *hp = malloc((size_t)rows * sizeof(struct sample_row));
            if (!dl || !dp || !dids || !hp) {
                fprintf(stderr, "bench_sample: out of memory\n");
                return 1;
            }
            be.ops->upload(&be, dl, l, (size_t)rows * (size_t)vocab * sizeof(float));
            for (int m = -1; m < (int)(sizeof modes / sizeof modes[0]); m++) {
                if (m >= 0) {
                    for (int r = 0; r < rows; r++) {
                        hp[r] = modes[m].p;
                        hp[r].u = (float)rng_01(&rng);
                    }
                    be.ops->upload(&be, dp, hp, (size_t)rows * sizeof(struct sample_row));
                }
                double t0 = 0;
                for (int it = 0; it < iters + 3; it++) {
                    if (it == 3) {
                        be.ops->synchronize(&be);
                        t0 = timer_now();
                    }
                    if (m < 0)
                        be.ops->argmax(&be, dl, rows, vocab, dids);
                    else
                        be.ops->sample(&be, dl, rows, vocab, dp, NULL, dids);
                }
                be.ops->synchronize(&be);
                const double us = (timer_now() - t0) * 1e6 / iters;
                printf("%-6d %-7s %-28s %10.1f\n", rows, peaked ? "peaked" : "flat", m < 0 ? "argmax op" : modes[m].name,
                       us);
            }
            be.ops->free(&be, dl), be.ops->free(&be, dp), be.ops->free(&be, dids);
            free(l), free(hp);
        }
    backend_destroy(&be);
    return 0;
#endif
}
