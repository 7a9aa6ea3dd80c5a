/* kv_cache.c — see kv_cache.h. */
#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

uint64_t kv_cache_bytes(const struct model_desc *d, int n_blocks, int block_size)
{
    uint64_t per_token = 0;
    for (int l = 0; l < d->n_layers; l++)
        per_token += model_desc_kv_elems_per_token(d, l) * sizeof(float);
    return per_token * (uint64_t)n_blocks * (uint64_t)block_size;
}

enum status kv_cache_init(struct kv_cache *kv, struct backend *be, const struct model_desc *d,
                          int n_blocks, int block_size, struct err *err)
{
    memset(kv, 0, sizeof *kv);
    if (n_blocks < 1 || block_size < 1)
        return err_set(err, STATUS_INVALID, "KV cache: %d blocks of %d tokens is not a cache", n_blocks,
                       block_size);
    kv->be = be;
    kv->n_layers = d->n_layers;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->layers = calloc((size_t)d->n_layers, sizeof *kv->layers);
    kv->free_ids = malloc((size_t)n_blocks * sizeof *kv->free_ids);
    if (!kv->layers || !kv->free_ids) {
        kv_cache_free(kv);
        return err_set(err, STATUS_NOMEM, "KV cache: out of host memory");
    }
    size_t row = (size_t)d->n_kv_heads * (size_t)d->head_dim;
    size_t bytes = (size_t)n_blocks * (size_t)block_size * row * sizeof(float);
    for (int l = 0; l < d->n_layers; l++) {
        struct paged_kv *p = &kv->layers[l];
        p->block_size = block_size;
        p->n_kv_heads = d->n_kv_heads;
        p->head_dim = d->head_dim;
        p->k = be->ops->alloc(be, bytes);
        p->v = be->ops->alloc(be, bytes);
        if (!p->k || !p->v) {
            kv_cache_free(kv);
            return err_set(err, STATUS_NOMEM,
                           "KV cache: cannot allocate %d blocks x %d tokens (%.1f MiB per layer) on %s",
                           n_blocks, block_size, 2.0 * (double)bytes / 1048576.0, be->ops->name);
        }
    }
    /* hand out low block ids first: pop from the end of the stack */
    for (int i = 0; i < n_blocks; i++)
        kv->free_ids[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    return STATUS_OK;
}

void kv_cache_free(struct kv_cache *kv)
{
    if (kv->layers) {
        for (int l = 0; l < kv->n_layers; l++) {
            if (kv->layers[l].k)
                kv->be->ops->free(kv->be, kv->layers[l].k);
            if (kv->layers[l].v)
                kv->be->ops->free(kv->be, kv->layers[l].v);
        }
    }
    free(kv->layers);
    free(kv->free_ids);
    memset(kv, 0, sizeof *kv);
}

void kv_seq_init(struct kv_seq *s)
{
    memset(s, 0, sizeof *s);
}

void kv_seq_release(struct kv_seq *s, struct kv_cache *kv)
{
    for (int i = s->n_blocks - 1; i >= 0; i--)
        kv->free_ids[kv->n_free++] = s->blocks[i];
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

enum status kv_seq_reserve(struct kv_seq *s, struct kv_cache *kv, int n_tokens, struct err *err)
{
    int need = (n_tokens + kv->block_size - 1) / kv->block_size;
    if (need <= s->n_blocks)
        return STATUS_OK;
    if (need - s->n_blocks > kv->n_free)
        return err_set(err, STATUS_NOMEM,
                       "KV cache full: %d tokens need %d more blocks of %d tokens, %d of %d free",
                       n_tokens, need - s->n_blocks, kv->block_size, kv->n_free, kv->n_blocks);
    if (need > s->cap) {
        int cap = s->cap ? s->cap : 8;
        while (cap < need)
            cap *= 2;
        int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
        if (!nb)
            return err_set(err, STATUS_NOMEM, "KV cache: out of host memory for a block table");
        s->blocks = nb;
        s->cap = cap;
    }
    while (s->n_blocks < need)
        s->blocks[s->n_blocks++] = kv->free_ids[--kv->n_free];
    return STATUS_OK;
}
