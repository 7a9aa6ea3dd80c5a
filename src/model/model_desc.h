/* model_desc.h — config.json turned into one normalised description.
 *
 * The forward (engine/forward.c) is written once over this struct; a new
 * family is a new config mapper here plus a tensor-name table in
 * model_weights.c, not a new forward (DESIGN.md decision 1). Every field of
 * ../shared/spec/models.md parts A, B and C that changes the math is here,
 * with the family's quirks resolved (head_dim read from config, GLM-4.5's
 * partial rotary default 0.5, qwen3's norm without epsilon, GLM's 1e-20, ...).
 *
 * Deliberately not here: weights (model_weights.h), tokenizer, quantization.
 *
 * defines: enum model_family, enum rope_layout, enum rope_type, enum attn_kind,
 *          enum ffn_kind, enum router_score, enum indexer_kind, struct rope_desc,
 *          struct layer_desc, struct model_desc, model_desc_load(),
 *          model_desc_parse(), model_desc_free(), model_family_name(),
 *          model_desc_kv_bytes_per_token_layer()
 */
#ifndef MOESERVE_MODEL_MODEL_DESC_H
#define MOESERVE_MODEL_MODEL_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "base/status.h"

enum model_family { MODEL_QWEN3_MOE, MODEL_GLM4_MOE, MODEL_GLM_MOE_DSA };

enum rope_layout {
    ROPE_HALF_SPLIT,  /* pairs (i, i + d_r/2): Qwen3, GLM-4.5 */
    ROPE_INTERLEAVED, /* pairs (2i, 2i+1), output de-interleaved: GLM-5 */
};

enum rope_type { ROPE_TYPE_DEFAULT, ROPE_TYPE_YARN };

enum attn_kind { ATTN_GQA, ATTN_MLA };
enum ffn_kind { FFN_DENSE, FFN_MOE };
enum router_score { ROUTER_SOFTMAX, ROUTER_SIGMOID };
enum indexer_kind { INDEXER_NONE, INDEXER_FULL, INDEXER_SHARED };

#define MODEL_MAX_EOS 8

struct rope_desc {
    enum rope_type type;
    enum rope_layout layout;
    int dim;       /* d_r: rotated dims per head (even) */
    int offset;    /* first rotated dim inside a head (GQA: 0; MLA: d_nope) */
    double theta;
    /* yarn */
    double factor;
    int original_max_pos;
    double beta_fast, beta_slow;
    bool truncate;
    double mscale, mscale_all_dim;
    float attention_factor; /* multiplies cos and sin; 1 for default */
};

struct layer_desc {
    enum attn_kind attn;
    enum ffn_kind ffn;
    enum indexer_kind indexer;
};

struct model_desc {
    enum model_family family;
    int vocab_size;
    int d_model;    /* hidden_size */
    int n_layers;   /* decoder layers, MTP excluded */
    int n_heads;
    int n_kv_heads;
    int head_dim;   /* GQA head size (q, k, v) */
    float norm_eps; /* rms_norm_eps */
    bool qkv_bias;  /* bias on q, k, v projections */
    bool o_bias;    /* bias on o_proj (qwen3 attention_bias; never GLM-4.5) */
    bool qk_norm;   /* per-head RMSNorm on q and k before RoPE */
    float attn_scale;
    struct rope_desc rope;

    /* MLA (glm_moe_dsa) */
    int q_lora_rank, kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    bool mla_bias; /* q_a_proj, kv_a_proj_with_mqa, o_proj biases */
    /* DSA indexer */
    int index_n_heads, index_head_dim, index_topk;

    /* FFN */
    int d_ff;       /* intermediate_size of dense layers */
    int d_expert;   /* moe_intermediate_size */
    int n_experts;
    int n_experts_used; /* num_experts_per_tok */
    int n_shared_experts;
    enum router_score router;
    bool norm_topk_prob;
    float norm_topk_eps;   /* 0 (qwen3) or 1e-20 (GLM) */
    float routed_scaling;  /* 1 for qwen3 */
    int n_group, topk_group;
    bool has_correction_bias;

    bool tie_word_embeddings;
    int max_position_embeddings;
    int bos_id;            /* -1 if none */
    int eos_ids[MODEL_MAX_EOS];
    int n_eos;

    struct layer_desc *layers; /* (n_layers) owned */
};

/* Reads DIR/config.json (and generation_config.json for eos ids, if present). */
enum status model_desc_load(struct model_desc *d, const char *dir, struct err *err);
/* Parses an already-loaded config object; `what` names it in errors. */
enum status model_desc_parse(struct model_desc *d, const struct json *cfg, const char *what,
                             struct err *err);
/* Safe on a zeroed struct. */
void model_desc_free(struct model_desc *d);

const char *model_family_name(enum model_family f);
/* KV-cache values per token for layer l, in elements (K+V, or latent + indexer key). */
size_t model_desc_kv_elems_per_token(const struct model_desc *d, int layer);

#endif
