/* forward_mla.h — the attention block of MLA layers with the DSA indexer (glm_moe_dsa).
 *
 * forward.c's layer loop calls forward_mla_attention() for layers whose
 * attention kind is ATTN_MLA; everything else (norms, residuals, FFN/MoE,
 * logits) stays in forward.c. The buffers it needs exist only when the model
 * has MLA layers (forward_mla_init() is a no-op otherwise).
 *
 * defines: struct forward_mla, forward_mla_init(), forward_mla_free(), forward_mla_attention()
 */
#ifndef MOESERVE_ENGINE_FORWARD_MLA_H
#define MOESERVE_ENGINE_FORWARD_MLA_H

#include "engine/forward.h"

struct forward_mla {
    /* backend memory, owned; T = max_tokens, H = n_heads, Dk = kv_lora_rank + rope */
    float *cq;      /* (T, q_lora_rank) normalised query latent, shared by MLA and the indexer */
    float *q;       /* (T, H, nope + rope) */
    float *ckv;     /* (T, Dk) latent and rope key before the cache store */
    float *q_abs;   /* (T, H, Dk) query absorbed into latent space */
    float *o_lat;   /* (T, H, kv_lora_rank) attention output in latent space */
    float *attn;    /* (T, H * v_head_dim) heads' values, o_proj input */
    float *idx_q;   /* (T, index_n_heads * index_head_dim) */
    float *idx_k;   /* (T, index_head_dim) */
    float *idx_w;   /* (T, index_n_heads) weights_proj output */
    int32_t *sel;   /* (T, index_topk) key positions chosen by the last "full" layer */
    float *dsa_work; /* backend_dsa_workspace_floats(T, index_topk) */
    /* host, per pass (forward_mla_batch): the keys of each block-table row (its rows' max pos
     * + 1), their sum and largest (the DSA scratch's row length: attn_batch.max_len), and
     * whether every row attends densely under DSA (pos < index_topk) */
    int32_t *seq_keys; /* (max_seqs) */
    int n_seqs;
    int64_t n_keys;
    int max_keys;
    bool rows_dense;
};

/* Takes the MLA/DSA buffers when f's model has MLA layers; leaves f->mla NULL otherwise.
 * Called by forward_init after its own buffers. */
enum status forward_mla_init(struct forward *f, struct err *err);
/* Safe when f->mla is NULL. */
void forward_mla_free(struct forward *f);
/* The host-side facts of batch b that the MLA layers' choice of form needs; before the layers. */
void forward_mla_batch(struct forward *f, const struct forward_batch *b);
/* Layer l's attention on f->x (normed input) for the n tokens of the uploaded batch
 * (f->d_pos, d_seq, d_slots, d_table); writes f->delta (n, d_model). Stores the layer's
 * latent rows (and indexer keys) in the cache at the batch's slots. Dense passes the backend
 * runs faster expanded (mla_prefers_expanded: long prompts, never a decode step) take the
 * expanded form; every other op sequence reads no host-side batch data. */
void forward_mla_attention(struct forward *f, int n, int l);

#endif
