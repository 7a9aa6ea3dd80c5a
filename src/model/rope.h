/* rope.h — rotary frequencies for a struct rope_desc (default and YaRN).
 *
 * Computed in fp32 exactly as transformers does (fp32 powers, fp32 ramp), so
 * positions turn into the same angles; cos/sin are taken per position by the
 * backend kernels (phi = p * inv_freq in fp32).
 *
 * defines: rope_inv_freq()
 */
#ifndef MOESERVE_MODEL_ROPE_H
#define MOESERVE_MODEL_ROPE_H

#include "model/model_desc.h"

/* Fills inv_freq[0 .. rope->dim/2). */
void rope_inv_freq(const struct rope_desc *rope, float *inv_freq);

#endif
