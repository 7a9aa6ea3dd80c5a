/* sampler.h — next-token choice from a row of logits.
 *
 * temperature == 0 is greedy (argmax, lowest id on ties). Otherwise softmax
 * at that temperature, optional top-k and top-p (nucleus) truncation, then a
 * draw from a seeded PCG32 stream, so the same seed gives the same text. A
 * row containing NaN is refused (the caller reports it) rather than sampled.
 *
 * defines: struct sampler_params, struct sampler, sampler_init(), sampler_free(),
 *          sampler_sample(), sampler_uniform(), struct sampler_cand
 */
#ifndef MOESERVE_ENGINE_SAMPLER_H
#define MOESERVE_ENGINE_SAMPLER_H

#include <stdint.h>

#include "base/status.h"

struct sampler_params {
    float temperature; /* 0 = greedy */
    float top_p;       /* (0, 1]; 1 = off */
    int top_k;         /* 0 = off */
    uint64_t seed;
};

struct sampler_cand {
    float p;
    int32_t id;
};

struct sampler {
    struct sampler_params p;
    int vocab_size;
    uint64_t state, inc;   /* PCG32 */
    struct sampler_cand *cand; /* (vocab_size) scratch, owned */
};

enum status sampler_init(struct sampler *s, const struct sampler_params *p, int vocab_size,
                         struct err *err);
/* Safe on a zeroed struct. */
void sampler_free(struct sampler *s);
/* Picks a token from logits[vocab_size]; STATUS_INVALID if a logit is NaN. */
enum status sampler_sample(struct sampler *s, const float *logits, int32_t *token, struct err *err);
/* The next draw of the seeded stream, uniform in [0, 1): what a backend's sample op takes
 * (a device-side draw follows the same seed). */
float sampler_uniform(struct sampler *s);

#endif
