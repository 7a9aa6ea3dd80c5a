/* quantize_calib.h — activation ranges for NVFP4 input scales.
 *
 * ModelOpt's W4A4 NVFP4 stores, per linear layer, input_scale =
 * amax(input activations) / (6 * 448) measured on calibration data. We run
 * the unquantized model once on the CPU over calibration tokens and record
 * the largest |x| that reaches each weight, by tensor name. Experts that no
 * calibration token chose get the largest scale of their layer and
 * projection (so native FP4 never clips them harder than their neighbours).
 *
 * defines: struct quantize_calib, quantize_calib_run(), quantize_calib_input_scale(),
 *          quantize_calib_free()
 */
#ifndef MOESERVE_ENGINE_QUANTIZE_CALIB_H
#define MOESERVE_ENGINE_QUANTIZE_CALIB_H

#include "base/status.h"
#include "base/strmap.h"

struct quantize_calib {
    struct strmap amax_by_name; /* "<module>.weight" -> float* (owned) */
    struct strmap name_by_ptr;  /* "%p" of the weight data -> const char* name (borrowed while running) */
    int n_tokens;
};

/* Runs the model in DIR on n_tokens seeded random token ids. */
enum status quantize_calib_run(struct quantize_calib *c, const char *dir, int n_tokens, unsigned seed,
                               struct err *err);
/* input_scale for the weight tensor whose name ends the lookup; 1/(6*448) if nothing was seen. */
float quantize_calib_input_scale(const struct quantize_calib *c, const char *weight_name);
/* Safe on a zeroed struct. */
void quantize_calib_free(struct quantize_calib *c);

#endif
