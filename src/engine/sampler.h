/* sampler.h — next-token choice from a row of logits.
 *
 * temperature == 0 is greedy (argmax, lowest id on ties). Otherwise softmax
 * at that temperature, optional top-k, min-p and top-p (nucleus) truncation, then a
 * draw from a seeded PCG32 stream, so the same seed gives the same text. A
 * row containing NaN is refused (the caller reports it) rather than sampled.
 *
 * Logit processors (sampler_apply, before the choice, greedy too), as vLLM defines them: logit_bias
 * added; repetition_penalty over the prompt's and the generated tokens (a positive logit divided
 * by it, a negative one multiplied); frequency_penalty x count and presence_penalty x (count > 0)
 * subtracted over the generated tokens. The counts follow sampler_observe*(). Where a backend
 * draws (its sample op takes min-p), the processors go to it as a row's sparse edits
 * (sampler_edits: struct logit_edit, backend_ops.logits_edit), the same arithmetic in the same
 * order (a row whose edits do not fit the pass is drawn here instead).
 *
 * defines: struct sampler_params, struct sampler, sampler_init(), sampler_free(),
 *          sampler_sample(), sampler_sample_masked(), sampler_uniform(), struct sampler_cand, SAMPLER_MAX_BIAS,
 *          sampler_apply(), sampler_observe(), sampler_observe_prompt(),
 *          sampler_has_edits(), sampler_edits(), sampler_edit_slot()
 */
#ifndef MOESERVE_ENGINE_SAMPLER_H
#define MOESERVE_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"

enum { SAMPLER_MAX_BIAS = 300 }; /* logit_bias entries (OpenAI's limit) */

struct sampler_params {
    float temperature; /* 0 = greedy */
    float top_p;       /* (0, 1]; 1 = off */
    int top_k;         /* 0 = off */
    uint64_t seed;
    float min_p;              /* [0, 1]; 0 = off: tokens below min_p x the likeliest's probability dropped */
    float frequency_penalty;  /* [-2, 2]; 0 = off */
    float presence_penalty;   /* [-2, 2]; 0 = off */
    float repetition_penalty; /* > 0; 1 (or 0, unset) = off */
    int n_bias;
    int32_t bias_ids[SAMPLER_MAX_BIAS]; /* logit_bias: ids (checked against the vocabulary at init) */
    float bias[SAMPLER_MAX_BIAS];       /* and what each adds, [-100, 100] */
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
    int32_t *counts;           /* (vocab_size) generated tokens, owned; only with penalties */
    uint8_t *in_prompt;        /* (vocab_size) 1 for the prompt's tokens, owned; only with repetition_penalty */
    int32_t *touched;          /* (vocab_size) the ids with counts > 0 or in_prompt, each once, owned; with counts */
    int n_touched;
};

enum status sampler_init(struct sampler *s, const struct sampler_params *p, int vocab_size,
                         struct err *err);
/* Safe on a zeroed struct. */
void sampler_free(struct sampler *s);
/* Picks a token from logits[vocab_size]; STATUS_INVALID if a logit is NaN. */
enum status sampler_sample(struct sampler *s, const float *logits, int32_t *token, struct err *err);
/* sampler_sample over the ids whose bit is set in allowed ((vocab_size + 31) / 32 words) only: the
 * same token (and the same draw) as sampler_sample on the row with every other logit at -inf, in
 * time of the allowed ids rather than the vocabulary (grammar-constrained rows). */
enum status sampler_sample_masked(struct sampler *s, const float *logits, const uint32_t *allowed, int32_t *token,
                                  struct err *err);
/* The next draw of the seeded stream, uniform in [0, 1): what a backend's sample op takes
 * (a device-side draw follows the same seed). */
float sampler_uniform(struct sampler *s);
/* The logit processors above on one row, in place. */
void sampler_apply(const struct sampler *s, float *logits);
/* A generated token joins the counts; the prompt's tokens join the repetition set. */
void sampler_observe(struct sampler *s, int32_t token);
void sampler_observe_prompt(struct sampler *s, const int32_t *ids, int n);
/* Whether sampler_apply changes anything (logit_bias or a penalty set). */
bool sampler_has_edits(const struct sampler *s);
/* sampler_apply as sparse edits of one row: at most one an id, in out[0 .. cap); returns how many,
 * or -1 when more than cap would be needed (the row is then processed on the host). */
int sampler_edits(const struct sampler *s, struct logit_edit *out, int cap);
/* id's edit among out[0 .. search), else a new no-op one appended at out[*n] (++*n); NULL when
 * that would pass cap. */
struct logit_edit *sampler_edit_slot(struct logit_edit *out, int *n, int cap, int search, int32_t id);

#endif
