/* logprobs.h — a row's log-probabilities as the API reports them: the chosen token's and the k
 * likeliest (OpenAI's logprobs / top_logprobs), from logits after every processor and mask, before
 * temperature. The host's computation and the reference of backend_ops.logprobs.
 *
 * defines: logprobs_row()
 */
#ifndef MOESERVE_BASE_LOGPROBS_H
#define MOESERVE_BASE_LOGPROBS_H

#include <stdint.h>

/* log p(tok) = x[tok] - logsumexp(x) over the V logits, ids a mask (NULL: none; a bit an id) leaves
 * out counting as -inf; the k largest into top_ids / top_lp, best first, the lower id first on ties. */
float logprobs_row(const float *x, int V, const uint32_t *mask, int32_t tok, int k, int32_t *top_ids, float *top_lp);

#endif
