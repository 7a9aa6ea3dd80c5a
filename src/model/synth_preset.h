/* synth_preset.h — the shapes of the models we benchmark without their weights.
 *
 * One table for both users: tools/make_synth_checkpoint writes a preset's config.json and random
 * safetensors, and `bench --synthetic PRESET` writes the same config.json into a temporary
 * directory and makes the weights on each rank's device (model_weights_make_shard), so the two
 * describe one model. NVFP4 presets carry the quantization_config (and hf_quant_config.json)
 * `moeserve quantize` writes, with its default excludes (the modules that stay BF16).
 *
 * defines: enum synth_family, struct synth_preset, synth_preset_find(), synth_preset_names(),
 *          synth_preset_excluded(), synth_preset_write(), synth_preset_dir(), synth_preset_dir_remove()
 */
#ifndef MOESERVE_MODEL_SYNTH_PRESET_H
#define MOESERVE_MODEL_SYNTH_PRESET_H

#include <stdbool.h>

#include "base/status.h"

enum synth_family { SYNTH_QWEN3_MOE, SYNTH_GLM_MOE_DSA };

struct synth_preset {
    const char *name;
    enum synth_family family;
    int vocab, d_model, n_layers, n_heads, n_kv, head_dim, n_experts, k, d_expert;
    int eos; /* the real model's eos_token_id, 0: none (then structured output, which must end, is refused) */
    /* glm_moe_dsa only (spec C.1): leading dense layers and their width, shared experts,
     * MLA ranks and head dims, the DSA indexer */
    int n_dense, d_ff, n_shared, q_lora, kv_lora, nope, rope, v_dim, index_heads, index_dim, index_topk;
};

/* NULL when no preset has that name. */
const struct synth_preset *synth_preset_find(const char *name);
/* "tiny, cpu-bench, ...": for messages and --help. */
const char *synth_preset_names(void);
/* True for the modules an NVFP4 preset keeps in BF16 (engine/quantize.c's default excludes). */
bool synth_preset_excluded(const char *module);
/* DIR/config.json of preset p (n_layers as given), and with nvfp4 its quantization_config and
 * DIR/hf_quant_config.json (else any hf_quant_config.json there is removed). */
enum status synth_preset_write(const struct synth_preset *p, bool nvfp4, const char *dir, struct err *err);
/* A new temporary directory (under tmp_root, at most 40 bytes, else /tmp) in dir[64] holding preset `name`'s config files
 * (layers > 0: that many layers) and, with tokenizer_dir, copies of its tokenizer.json,
 * tokenizer_config.json and generation_config.json (those present): what a command that reads a
 * checkpoint directory's files needs, without weights. Remove it with synth_preset_dir_remove. */
enum status synth_preset_dir(const char *name, bool nvfp4, int layers, const char *tokenizer_dir, const char *tmp_root,
                             char dir[64], struct err *err);
/* Removes what synth_preset_dir made (safe on ""). */
void synth_preset_dir_remove(const char *dir);

#endif
