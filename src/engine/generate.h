/* generate.h — prompt in, tokens out, for one sequence.
 *
 * The prompt is prefilled in batched passes of up to max_tokens tokens, then
 * tokens are decoded one at a time; each new token goes to a callback
 * (printing, streaming). Stops at max_new tokens, at a stop id, or when the
 * callback says so.
 *
 * defines: struct generate_params, struct generate_stats, generate_token_fn, generate_run()
 */
#ifndef MOESERVE_ENGINE_GENERATE_H
#define MOESERVE_ENGINE_GENERATE_H

#include <stdbool.h>

#include "engine/model_session.h"
#include "engine/sampler.h"

struct generate_params {
    int max_new;
    struct sampler_params sampling;
    const int32_t *stop_ids; /* (n_stop) borrowed */
    int n_stop;
};

struct generate_stats {
    int n_prompt;
    int n_generated;
    double t_prefill; /* seconds */
    int n_decode_steps; /* single-token forward passes */
    double t_decode;  /* seconds, all decode steps and sampling */
    bool stopped_by_eos;
};

/* Return false to stop generation. */
typedef bool (*generate_token_fn)(void *user, int32_t token);

enum status generate_run(struct model_session *s, const int32_t *prompt, int n_prompt,
                         const struct generate_params *p, generate_token_fn on_token, void *user,
                         struct generate_stats *stats, struct err *err);

#endif
