/* model_shard.c — see model_shard.h. */
#include "model/model_shard.h"

#include <stdlib.h>
#include <string.h>

static bool desc_has_mla(const struct model_desc *d)
{
    for (int l = 0; l < d->n_layers; l++)
        if (d->layers[l].attn == ATTN_MLA)
            return true;
    return false;
}

static bool desc_has(const struct model_desc *d, enum ffn_kind k)
{
    for (int l = 0; l < d->n_layers; l++)
        if (d->layers[l].ffn == k)
            return true;
    return false;
}

enum status model_shard_check(const struct model_desc *d, const struct model_shard *s, struct err *err)
{
    const int n = s->size;
    if (n < 1 || s->rank < 0 || s->rank >= n)
        return err_set(err, STATUS_INVALID, "rank %d of %d ranks", s->rank, n);
    if (n == 1)
        return STATUS_OK;
    if (d->n_heads % n)
        return err_set(err, STATUS_UNSUPPORTED, "%s: %d attention heads do not divide over %d ranks",
                       model_family_name(d->family), d->n_heads, n);
    if (!desc_has_mla(d) && d->n_kv_heads % n && n % d->n_kv_heads)
        return err_set(err, STATUS_UNSUPPORTED,
                       "%s: %d kv heads over %d ranks: neither divides the other (each rank needs whole kv "
                       "heads, or one kv head for all its q heads)",
                       model_family_name(d->family), d->n_kv_heads, n);
    if (desc_has(d, FFN_DENSE) && d->d_ff % n)
        return err_set(err, STATUS_UNSUPPORTED, "%s: intermediate_size %d does not divide over %d ranks",
                       model_family_name(d->family), d->d_ff, n);
    if (desc_has(d, FFN_MOE)) {
        if (s->expert_parallel && d->n_experts % n)
            return err_set(err, STATUS_UNSUPPORTED, "%s: %d routed experts do not divide over %d ranks (expert "
                           "parallel)", model_family_name(d->family), d->n_experts, n);
        if (!s->expert_parallel && d->d_expert % n)
            return err_set(err, STATUS_UNSUPPORTED,
                           "%s: moe_intermediate_size %d does not divide over %d ranks (try --expert-parallel)",
                           model_family_name(d->family), d->d_expert, n);
        if (d->n_shared_experts && ((int64_t)d->d_expert * d->n_shared_experts) % n)
            return err_set(err, STATUS_UNSUPPORTED, "%s: the shared experts' width %d does not divide over %d ranks",
                           model_family_name(d->family), d->d_expert * d->n_shared_experts, n);
    }
    return STATUS_OK;
}

static struct shard_range range_share(int64_t of, int rank, int size)
{
    const int64_t n = of / size;
    return (struct shard_range){.off = (int64_t)rank * n, .n = n, .of = of};
}

struct shard_range model_shard_heads(const struct model_desc *d, const struct model_shard *s)
{
    return range_share(d->n_heads, s->rank, s->size);
}

struct shard_range model_shard_kv_heads(const struct model_desc *d, const struct model_shard *s)
{
    if (d->n_kv_heads >= s->size)
        return range_share(d->n_kv_heads, s->rank, s->size);
    /* q head h reads kv head h / (n_heads / n_kv_heads); the rank's q heads all read one */
    const int64_t q0 = (int64_t)s->rank * (d->n_heads / s->size);
    return (struct shard_range){.off = q0 / (d->n_heads / d->n_kv_heads), .n = 1, .of = d->n_kv_heads};
}

struct shard_range model_shard_width(int64_t width, const struct model_shard *s)
{
    return range_share(width, s->rank, s->size);
}

struct shard_range model_shard_experts(const struct model_desc *d, const struct model_shard *s)
{
    if (!s->expert_parallel)
        return (struct shard_range){.off = 0, .n = d->n_experts, .of = d->n_experts};
    return range_share(d->n_experts, s->rank, s->size);
}

enum status model_shard_desc(const struct model_desc *d, const struct model_shard *s, struct model_desc *local,
                             struct err *err)
{
    enum status st = model_shard_check(d, s, err);
    if (st)
        return st;
    *local = *d;
    local->layers = malloc((size_t)d->n_layers * sizeof *d->layers);
    if (!local->layers)
        return err_set(err, STATUS_NOMEM, "out of memory for %d layer descriptions", d->n_layers);
    memcpy(local->layers, d->layers, (size_t)d->n_layers * sizeof *d->layers);
    if (s->size == 1)
        return STATUS_OK;
    local->n_heads = d->n_heads / s->size;
    if (!desc_has_mla(d)) /* MLA's cache is the latent, not per-head keys */
        local->n_kv_heads = (int)model_shard_kv_heads(d, s).n;
    local->d_ff = d->d_ff / s->size;
    if (!s->expert_parallel)
        local->d_expert = d->d_expert / s->size;
    return STATUS_OK;
}
