/* model_plan.c — see model_plan.h. */
#include "model/model_plan.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum status model_plan_shapes(const struct model_desc *d, const char *source, struct plan_shapes *s,
                              struct err *err)
{
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s", source ? source : "model description");
    if (d->n_layers <= 0 || !d->layers || d->d_model <= 0 || d->n_heads <= 0 || d->vocab_size <= 0)
        return err_set(err, STATUS_INVALID, "plan: %s has no layers, heads, width or vocab", s->source);
    bool dense = false;
    for (int l = 0; l < d->n_layers; l++) {
        s->mla |= d->layers[l].attn == ATTN_MLA;
        dense |= d->layers[l].ffn == FFN_DENSE;
    }
    s->d_model = d->d_model, s->vocab = d->vocab_size;
    s->n_heads = d->n_heads, s->n_kv_heads = d->n_kv_heads > 0 ? d->n_kv_heads : d->n_heads;
    s->head_dim = d->head_dim;
    s->n_experts = d->n_experts, s->n_experts_used = d->n_experts_used, s->d_expert = d->d_expert;
    s->d_ff = dense ? d->d_ff : d->n_shared_experts * d->d_expert;
    s->qk_norm = d->qk_norm;
    s->router_sigmoid = d->router == ROUTER_SIGMOID;
    if (s->mla) {
        s->q_lora_rank = d->q_lora_rank, s->kv_lora_rank = d->kv_lora_rank;
        s->qk_nope_dim = d->qk_nope_head_dim, s->qk_rope_dim = d->qk_rope_head_dim;
        s->v_head_dim = d->v_head_dim;
        s->index_n_heads = d->index_n_heads, s->index_head_dim = d->index_head_dim, s->index_topk = d->index_topk;
        s->latent_mma = true; /* the session's default cache, bf16 (engine/kv_cache.h) */
    }
    return STATUS_OK;
}

void model_plan_weights(const struct model_desc *d, const struct quant_config *q, struct plan_weights *w)
{
    int moe_l = 0, dense_l = -1;
    bool mla = false;
    for (int l = d->n_layers - 1; l >= 0; l--) {
        if (d->layers[l].ffn == FFN_MOE)
            moe_l = l;
        else
            dense_l = l;
    }
    if (d->n_layers > 0)
        mla = d->layers[0].attn == ATTN_MLA;
    char m[160];
    snprintf(m, sizeof m, "model.layers.%d.mlp.experts.0.gate_proj", moe_l);
    w->experts = quant_config_expect(q, m);
    bool a4 = false;
    if (w->experts == WEIGHT_NVFP4) {
        if (q->algo == QUANT_MIXED) {
            void *v = strmap_get(&q->mixed, m);
            a4 = v && (enum quant_algo)(intptr_t)v == QUANT_NVFP4;
        } else {
            a4 = q->algo == QUANT_NVFP4; /* compressed-tensors: input scheme not recorded, so weight-only */
        }
    }
    w->fp4_activations = a4;
    snprintf(m, sizeof m, "model.layers.0.self_attn.%s", mla ? (d->q_lora_rank > 0 ? "q_a_proj" : "q_proj") : "q_proj");
    w->attn = quant_config_expect(q, m);
    if (dense_l >= 0)
        snprintf(m, sizeof m, "model.layers.%d.mlp.gate_proj", dense_l);
    else
        snprintf(m, sizeof m, "model.layers.%d.mlp.shared_experts.gate_proj", moe_l);
    w->ffn = quant_config_expect(q, m);
    w->lm_head = quant_config_expect(q, "lm_head");
}
