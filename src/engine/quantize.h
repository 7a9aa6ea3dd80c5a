/* quantize.h — write a quantized copy of a BF16/F16/F32 checkpoint.
 *
 * Output is in the producer's exact layout (../shared/spec/nvfp4.md):
 *   nvfp4: ModelOpt — <m>.weight U8 [N, K/2], <m>.weight_scale F8_E4M3 [N, K/16],
 *          <m>.weight_scale_2 F32 [], <m>.input_scale F32 [] (from a calibration
 *          pass), quantization_config in config.json and hf_quant_config.json;
 *   fp8:   DeepSeek/GLM block FP8 — <m>.weight F8_E4M3 [N, K] and
 *          <m>.weight_scale_inv F32 [ceil(N/128), ceil(K/128)], quant_method "fp8".
 * Shards keep the input's file names and grouping; everything that is not a
 * quantized weight is copied byte for byte; other files of the directory
 * (tokenizer, generation config, templates) are copied.
 * ModelOpt's defaults stay unquantized: lm_head, embeddings, router gates,
 * MTP layers (index >= num_hidden_layers); --exclude adds shell-style patterns.
 *
 * Memory: one tensor (NVFP4) or 128 rows (FP8) in fp32 at a time.
 *
 * defines: struct quantize_opts, quantize_checkpoint()
 */
#ifndef MOESERVE_ENGINE_QUANTIZE_H
#define MOESERVE_ENGINE_QUANTIZE_H

#include <stdbool.h>

#include "format/weight.h"
#include "base/status.h"

struct quantize_opts {
    enum weight_format format;   /* WEIGHT_NVFP4 or WEIGHT_FP8_BLOCK */
    const char *const *exclude;  /* (n_exclude) extra module patterns */
    int n_exclude;
    int calib_tokens;            /* NVFP4: tokens of the activation calibration pass (0 = weight-only W4A16) */
    unsigned calib_seed;
};

enum status quantize_checkpoint(const char *in_dir, const char *out_dir, const struct quantize_opts *o,
                                struct err *err);

#endif
