/* quant_config.h — what a checkpoint says about its quantization.
 *
 * Reads config.json's "quantization_config" and hf_quant_config.json
 * (ModelOpt), in the forms of ../shared/spec/nvfp4.md: quant_algo NVFP4,
 * W4A16_NVFP4, FP8 with weight_block_size [128, 128] (DeepSeek/GLM style,
 * quant_method "fp8"), MIXED_PRECISION (a per-module map) and
 * compressed-tensors nvfp4-pack-quantized. Exclude/ignore entries are shell
 * wildcards on module paths; a pattern without wildcards also matches a
 * module whose path contains it at component boundaries ("lm_head",
 * "mlp.gate"), as older exports expect.
 *
 * The weights decide what each tensor is (model_weights.c looks at dtypes);
 * this module only says what the config promises, so a contradiction can be
 * reported with both sides named.
 *
 * defines: enum quant_algo, struct quant_config, quant_config_load(),
 *          quant_config_parse(), quant_config_free(), quant_config_expect(),
 *          quant_algo_name(), quant_config_excluded()
 */
#ifndef MOESERVE_FORMAT_QUANT_CONFIG_H
#define MOESERVE_FORMAT_QUANT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "format/weight.h"
#include "base/json.h"
#include "base/status.h"
#include "base/strmap.h"

enum quant_algo {
    QUANT_NONE,
    QUANT_NVFP4,       /* ModelOpt W4A4 (input_scale present) */
    QUANT_W4A16_NVFP4, /* ModelOpt weight-only */
    QUANT_FP8_BLOCK,   /* E4M3 + 128x128 weight_scale_inv */
    QUANT_MIXED,       /* ModelOpt MIXED_PRECISION: per-module algo */
    QUANT_CT_NVFP4,    /* compressed-tensors nvfp4-pack-quantized */
};

struct quant_config {
    enum quant_algo algo;
    char **exclude;        /* (n_exclude) owned patterns */
    size_t n_exclude;
    int group_size;        /* NVFP4: 16 */
    int block_n, block_k;  /* FP8: 128, 128 */
    struct strmap mixed;   /* MIXED_PRECISION: module -> (void *)(intptr_t)enum quant_algo */
    char source[64];       /* which file said so, for messages */
};

/* Reads DIR/hf_quant_config.json (preferred) and DIR/config.json. A missing
 * quantization section is QUANT_NONE, not an error. */
enum status quant_config_load(struct quant_config *q, const char *dir, struct err *err);
/* Parses a config.json object's "quantization_config" (or an
 * hf_quant_config.json object when `hf_quant` is true). */
enum status quant_config_parse(struct quant_config *q, const struct json *obj, bool hf_quant, const char *what,
                               struct err *err);
/* Safe on a zeroed struct. */
void quant_config_free(struct quant_config *q);

bool quant_config_excluded(const struct quant_config *q, const char *module);
/* The weight format the config promises for linear module `module`
 * (WEIGHT_BF16 meaning "not quantized", whatever the float dtype). */
enum weight_format quant_config_expect(const struct quant_config *q, const char *module);
const char *quant_algo_name(enum quant_algo a);

#endif
