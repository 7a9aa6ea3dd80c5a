/* bench_runs.h — the timed passes of `moeserve bench` over an open model session.
 *
 * Prefill: one sequence of n prompt tokens per forward pass. Decode: `batch`
 * sequences, each prefilled with its own prompt, then BENCH_WARMUP_STEPS
 * untimed and `steps` timed steps of one token per sequence per forward pass
 * (greedy: each sequence's next token is the argmax of its own logits, taken
 * by the forward itself). Power is sampled over the timed part only
 * when a sampler is given. Every pass ends with the backend's error state
 * checked, so a failed kernel is an error here, never a fast-looking number.
 *
 * Not here: option parsing and the report (cmd_bench.c), sampling other than
 * greedy, the HTTP serving benchmark.
 *
 * defines: struct bench_timing, struct bench_decode_args, BENCH_WARMUP_STEPS, bench_prefill(),
 *          bench_decode(), bench_decode_bytes()
 */
#ifndef MOESERVE_CLI_BENCH_RUNS_H
#define MOESERVE_CLI_BENCH_RUNS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/model_session.h"
#include "plan/power_sampler.h"

/* untimed decode steps before the timed ones (see bench_decode) */
enum { BENCH_WARMUP_STEPS = 2 };

struct bench_timing {
    double seconds;             /* the timed part */
    long tokens;                /* tokens consumed (prefill) or produced (decode) in it */
    struct power_reading power; /* .valid false without a sampler */
};

struct bench_decode_args {
    int batch;              /* sequences decoding together */
    int context;            /* prompt tokens prefilled into each sequence before the timed steps */
    int steps;              /* timed steps, one token per sequence each */
    const int32_t *prompts; /* (batch, context) token ids, one prompt per sequence; borrowed */
    bool fill_random;       /* the cache already holds random rows: the contexts are not prefilled */
};

/* One untimed pass (pages weights in, settles threads and kernel choices),
 * then reps timed passes of the n tokens. The cache must hold n tokens. */
enum status bench_prefill(struct model_session *s, const int32_t *toks, int n, int reps, struct power_sampler *ps,
                          struct bench_timing *out, struct err *err);

/* The cache must hold batch * (context + BENCH_WARMUP_STEPS + steps) tokens
 * and the forward max(context, batch) tokens per pass (batch with fill_random); max_seqs >= batch. */
enum status bench_decode(struct model_session *s, const struct bench_decode_args *a, struct power_sampler *ps,
                         struct bench_timing *out, struct err *err);

/* Weight bytes one decode step of `batch` sequences reads: embedding rows,
 * attention, router, lm_head and dense/shared FFNs once, plus the routed
 * experts the batch touches, expected under uniform routing:
 * n_experts * (1 - (1 - k / n_experts)^batch) per MoE layer (k at batch 1).
 * Counts every format by weight_bytes() (NVFP4: codes + block scales). */
double bench_decode_bytes(const struct model_session *s, int batch);

#endif
