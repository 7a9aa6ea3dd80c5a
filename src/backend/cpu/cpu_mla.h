/* cpu_mla.h — the CPU reference of the MLA and DSA ops (glm_moe_dsa, spec/models.md part C).
 *
 * The members of struct backend_ops that the GLM-5 forward adds: LayerNorm,
 * the latent-cache store, weight absorption of the query, attention in latent
 * space (dense causal or over a DSA selection), the value expansion, and the
 * indexer's top-k selection. Same contracts as backend.h; host memory.
 *
 * defines: cpu_layernorm(), cpu_mla_put_row(), cpu_mla_get_row(), cpu_mla_store(), cpu_mla_absorb_q(), cpu_mla_attention(),
 *          cpu_mla_expand_o(),
 *          cpu_mla_attention_expanded(), cpu_dsa_select()
 */
#ifndef MOESERVE_BACKEND_CPU_CPU_MLA_H
#define MOESERVE_BACKEND_CPU_CPU_MLA_H

#include "backend/backend.h"

void cpu_layernorm(struct backend *be, const float *x, const float *w, const float *b, int rows, int dim,
                   float eps, float *y);
/* Row `slot` of a cache array of type t (backend.h's row layouts) <- v[0 .. nq + nr): the one
 * quantisation of every cache row (mla_store; tests make caches with it). */
void cpu_mla_put_row(void *base, enum kv_dtype t, size_t slot, int nq, int nr, const float *v);
/* Row `slot` of such an array as f32: the row itself (f32) or its values decoded into buf (nq + nr
 * floats): what every reader of the cache computes with. */
const float *cpu_mla_get_row(const void *base, enum kv_dtype t, size_t slot, int nq, int nr, float *buf);
void cpu_mla_store(struct backend *be, const struct paged_latent *kv, const float *ckv, const float *w, float eps,
                   const float *idx_k, int n_tokens, const int32_t *slots);
void cpu_mla_absorb_q(struct backend *be, const struct weight *kv_b, const struct mla_dims *m, const float *q,
                      int n_tokens, float *q_abs);
void cpu_mla_attention(struct backend *be, const float *q_abs, const struct paged_latent *kv,
                       const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k, float scale,
                       float *o_lat);
void cpu_mla_expand_o(struct backend *be, const struct weight *kv_b, const struct mla_dims *m, const float *o_lat,
                      int n_tokens, float *out);
void cpu_mla_attention_expanded(struct backend *be, const float *q, const struct weight *kv_b,
                                const struct mla_dims *m, const struct paged_latent *kv, const struct attn_batch *b,
                                int n_seqs, const int32_t *seq_keys, float scale, float *out);
void cpu_dsa_select(struct backend *be, const float *q_idx, const float *w_idx, const struct paged_latent *kv,
                    const struct attn_batch *b, const struct dsa_args *a, float *work, int32_t *sel);

#endif
