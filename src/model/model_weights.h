/* model_weights.h — checkpoint tensors bound to the slots the forward uses.
 *
 * Binding reads names from the tensor-name table of the model's family,
 * checks every shape against the model description and hands each weight to
 * the backend (the CPU borrows the mmap'ed bytes; a GPU copies them once).
 * Small vectors (norm weights, biases, the router correction bias) are
 * converted to fp32 once; big matrices stay in their file format.
 *
 * A missing tensor is reported with the full list of what is missing; extra
 * tensors (MTP layers at index >= num_hidden_layers) are ignored.
 *
 * defines: struct layer_weights, struct model_weights, enum weight_kind,
 *          struct weight_kind_stats, model_weights_load(), model_weights_load_shard(),
 *          model_weights_make_shard(),
 *          model_weights_free(),
 *          weight_kind_name()
 */
#ifndef MOESERVE_MODEL_MODEL_WEIGHTS_H
#define MOESERVE_MODEL_MODEL_WEIGHTS_H

#include "backend/backend.h"
#include "format/checkpoint.h"
#include "format/quant_config.h"
#include "model/model_desc.h"
#include "model/model_shard.h"

struct layer_weights {
    float *attn_norm; /* (d_model) f32, backend memory, owned */
    float *ffn_norm;  /* (d_model) f32, backend memory, owned */

    /* GQA attention */
    struct weight wq; /* [n_heads * head_dim, d_model] (+ bias) */
    struct weight wk; /* [n_kv_heads * head_dim, d_model] (+ bias) */
    struct weight wv; /* [n_kv_heads * head_dim, d_model] (+ bias) */
    struct weight wo; /* [d_model, n_heads * head_dim] (+ bias) */
    float *q_norm;    /* (head_dim) f32 or NULL */
    float *k_norm;    /* (head_dim) f32 or NULL */

    /* MLA attention (glm_moe_dsa, spec C.2/C.7); o_proj is wo above, [d_model, n_heads * v] */
    struct weight q_a;  /* [q_lora_rank, d_model] (+ bias) */
    struct weight q_b;  /* [n_heads * (nope + rope), q_lora_rank] */
    struct weight kv_a; /* [kv_lora_rank + rope, d_model] (+ bias): kv_a_proj_with_mqa */
    struct weight kv_b; /* [n_heads * (nope + v), kv_lora_rank] */
    float *q_a_norm;    /* (q_lora_rank) f32 */
    float *kv_a_norm;   /* (kv_lora_rank) f32 */
    /* DSA indexer: "full" layers only (spec C.5) */
    bool has_indexer;
    struct weight idx_wq;    /* [index_n_heads * index_head_dim, q_lora_rank]: indexer.wq_b */
    struct weight idx_wk;    /* [index_head_dim, d_model]: indexer.wk */
    struct weight idx_wproj; /* [index_n_heads, d_model]: indexer.weights_proj */
    float *idx_k_norm_w;     /* (index_head_dim) f32: indexer.k_norm (LayerNorm) weight */
    float *idx_k_norm_b;     /* (index_head_dim) f32: its bias */

    /* dense FFN (also the shared expert of MoE layers) */
    struct weight ffn_gate; /* [d_ff or d_expert * n_shared, d_model] */
    struct weight ffn_up;
    struct weight ffn_down; /* [d_model, ...] */
    bool has_ffn;           /* dense layer, or MoE layer with a shared expert */

    /* MoE */
    struct weight router;   /* [n_experts, d_model] */
    float *correction_bias; /* (n_experts) f32 or NULL */
    struct weight *exp_gate; /* (n_experts) owned array, each [d_expert, d_model] */
    struct weight *exp_up;   /* (n_experts) owned array */
    struct weight *exp_down; /* (n_experts) owned array, each [d_model, d_expert] */
};

/* Module kinds, for reporting which format each part of the model uses. */
enum weight_kind {
    WK_EMBEDDING,
    WK_ATTENTION,
    WK_DENSE_MLP,
    WK_SHARED_EXPERT,
    WK_ROUTED_EXPERTS,
    WK_ROUTER,
    WK_LM_HEAD,
    WK_COUNT,
};

struct weight_kind_stats {
    uint64_t params;
    uint64_t bytes;
    unsigned formats; /* bit (1 << enum weight_format) per format seen */
};

struct model_weights {
    struct weight embed;   /* [vocab, d_model] */
    struct weight lm_head; /* [vocab, d_model]; the embedding when tied */
    float *final_norm;     /* (d_model) f32 */
    struct layer_weights *layers; /* (n_layers) owned */
    int n_layers;
    struct backend *be;    /* borrowed: owner of the f32 vectors */
    uint64_t bytes_by_format[WEIGHT_FORMAT_COUNT]; /* matrix bytes per format */
    uint64_t n_params;     /* logical parameters bound */
    struct weight_kind_stats kinds[WK_COUNT];
    void **owned;          /* (n_owned) host copies of the rank's in-feature shares (model_shard), owned */
    int n_owned, cap_owned;
};

const char *weight_kind_name(enum weight_kind k);

/* qc (may be NULL) is what the checkpoint's config promises; a tensor that
 * contradicts it is an error naming both. */
enum status model_weights_load(struct model_weights *w, const struct model_desc *d,
                               const struct checkpoint *ck, const struct quant_config *qc, struct backend *be,
                               struct err *err);
/* Only rank shard->rank's share of every weight (model_shard.h; NULL: the whole model); d is the
 * whole model's description (the checkpoint's shapes). */
enum status model_weights_load_shard(struct model_weights *w, const struct model_desc *d,
                                     const struct checkpoint *ck, const struct quant_config *qc, struct backend *be,
                                     const struct model_shard *shard, struct err *err);
/* No checkpoint: every weight of rank shard->rank's share made from seed (format/weight_synth.h) in
 * the format qc promises its module (BF16 where it promises none), by the backend where it can
 * (backend_ops.weight_make), else in host memory kept here; the values are the one-rank model's,
 * sliced. */
enum status model_weights_make_shard(struct model_weights *w, const struct model_desc *d,
                                     const struct quant_config *qc, struct backend *be,
                                     const struct model_shard *shard, uint64_t seed, struct err *err);
/* Safe on a zeroed struct. */
void model_weights_free(struct model_weights *w);

#endif
