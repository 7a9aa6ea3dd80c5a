/* kv_cache.c — see kv_cache.h. */
#include "engine/kv_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"

uint64_t kv_cache_layer_bytes(const struct model_desc *d, int l, enum kv_dtype latent)
{
    if (d->layers[l].attn != ATTN_MLA)
        return model_desc_kv_elems_per_token(d, l) * sizeof(float);
    uint64_t b = kv_latent_row_bytes(latent, d->kv_lora_rank, d->qk_rope_head_dim);
    if (d->layers[l].indexer == INDEXER_FULL)
        b += kv_index_row_bytes(kv_cache_index_dtype(latent), d->index_head_dim);
    return b;
}

enum kv_dtype kv_cache_index_dtype(enum kv_dtype latent)
{
    return latent; /* the keys follow the latent: f32, bf16 or fp8 (backend.h) */
}

enum kv_dtype kv_cache_latent_dtype(int requested)
{
    return requested == KV_DTYPE_AUTO ? KV_DTYPE_BF16 : (enum kv_dtype)requested;
}

enum status kv_cache_check_dtype(const struct model_desc *d, int requested, struct err *err)
{
    if (requested == KV_DTYPE_AUTO)
        return STATUS_OK;
    if (requested < KV_DTYPE_F32 || requested > KV_DTYPE_FP8)
        return err_set(err, STATUS_INVALID, "--kv-cache-dtype: expected f32, bf16 or fp8");
    bool mla = false;
    for (int l = 0; l < d->n_layers; l++)
        mla |= d->layers[l].attn == ATTN_MLA;
    if (requested != KV_DTYPE_F32 && !mla)
        return err_set(err, STATUS_UNSUPPORTED,
                       "--kv-cache-dtype %s: only MLA latent caches (glm_moe_dsa) have it; this model's GQA cache "
                       "is f32",
                       kv_dtype_name((enum kv_dtype)requested));
    return STATUS_OK;
}

uint64_t kv_cache_bytes(const struct model_desc *d, enum kv_dtype latent, int n_blocks, int block_size)
{
    uint64_t per_token = 0;
    for (int l = 0; l < d->n_layers; l++) {
        per_token += kv_cache_layer_bytes(d, l, latent);
    }
    return per_token * (uint64_t)n_blocks * (uint64_t)block_size;
}

/* Layer l's latent rows (c_kv | k_r) and, when it owns an indexer, its key rows. */
static enum status kv_cache_init_latent(struct kv_cache *kv, const struct model_desc *d, int l, struct err *err)
{
    struct paged_latent *p = &kv->latent[l];
    size_t slots = ((size_t)kv->pool_blocks + 1) * (size_t)kv->block_size; /* + the pad block */
    p->block_size = kv->block_size;
    p->kv_rank = d->kv_lora_rank;
    p->rope_dim = d->qk_rope_head_dim;
    p->dtype = kv->latent_dtype;
    p->index_dtype = kv_cache_index_dtype(p->dtype);
    size_t bytes = slots * kv_latent_row_bytes(p->dtype, p->kv_rank, p->rope_dim);
    p->latent = kv->be->ops->alloc(kv->be, bytes);
    if (p->latent && d->layers[l].indexer == INDEXER_FULL) {
        p->index_dim = d->index_head_dim;
        bytes = slots * kv_index_row_bytes(p->index_dtype, p->index_dim);
        p->index_k = kv->be->ops->alloc(kv->be, bytes);
    }
    if (!p->latent || (p->index_dim && !p->index_k))
        return err_set(err, STATUS_NOMEM,
                       "KV cache: cannot allocate %d blocks x %d tokens of MLA latent (%.1f MiB for layer %d) on %s",
                       kv->pool_blocks, kv->block_size, (double)bytes / 1048576.0, l, kv->be->ops->name);
    return STATUS_OK;
}

enum status kv_cache_init(struct kv_cache *kv, struct backend *be, const struct model_desc *d,
                          enum kv_dtype latent, int n_blocks, int block_size, struct err *err)
{
    return kv_cache_init_pools(kv, be, d, latent, n_blocks, block_size, 1, err);
}

enum status kv_cache_init_pools(struct kv_cache *kv, struct backend *be, const struct model_desc *d,
                                enum kv_dtype latent, int n_blocks, int block_size, int n_pools, struct err *err)
{
    memset(kv, 0, sizeof *kv);
    kv->latent_dtype = latent;
    if (n_blocks < 1 || block_size < 1)
        return err_set(err, STATUS_INVALID, "KV cache: %d blocks of %d tokens is not a cache", n_blocks,
                       block_size);
    if (n_pools < 1 || n_blocks % n_pools)
        return err_set(err, STATUS_INVALID, "KV cache: %d blocks do not split into %d pools", n_blocks, n_pools);
    kv->be = be;
    kv->n_layers = d->n_layers;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->n_pools = n_pools;
    kv->pool_blocks = n_blocks / n_pools;
    kv->pad_block = kv->pool_blocks; /* a place in memory, past every pool's blocks */
    kv->layers = calloc((size_t)d->n_layers, sizeof *kv->layers);
    kv->free_ids = malloc((size_t)n_blocks * sizeof *kv->free_ids);
    kv->refs = calloc((size_t)n_blocks, sizeof *kv->refs);
    kv->n_free_pool = calloc((size_t)n_pools, sizeof *kv->n_free_pool);
    bool mla = false;
    for (int l = 0; l < d->n_layers; l++)
        mla |= d->layers[l].attn == ATTN_MLA;
    if (mla)
        kv->latent = calloc((size_t)d->n_layers, sizeof *kv->latent);
    if (!kv->layers || !kv->free_ids || !kv->refs || !kv->n_free_pool || (mla && !kv->latent)) {
        kv_cache_free(kv);
        return err_set(err, STATUS_NOMEM, "KV cache: out of host memory");
    }
    size_t row = (size_t)d->n_kv_heads * (size_t)d->head_dim;
    size_t bytes = ((size_t)kv->pool_blocks + 1) * (size_t)block_size * row * sizeof(float); /* + the pad block */
    for (int l = 0; l < d->n_layers; l++) {
        if (d->layers[l].attn == ATTN_MLA) {
            enum status st = kv_cache_init_latent(kv, d, l, err);
            if (st) {
                kv_cache_free(kv);
                return st;
            }
            continue;
        }
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
                           kv->pool_blocks, block_size, 2.0 * (double)bytes / 1048576.0, be->ops->name);
        }
    }
    /* hand out low block ids first: pop from the end of each pool's stack */
    for (int p = 0; p < n_pools; p++) {
        int32_t *stack = kv->free_ids + (size_t)p * (size_t)kv->pool_blocks;
        for (int i = 0; i < kv->pool_blocks; i++)
            stack[i] = (p + 1) * kv->pool_blocks - 1 - i;
        kv->n_free_pool[p] = kv->pool_blocks;
    }
    kv->n_free = n_blocks;
    return STATUS_OK;
}

int kv_cache_pool_free(const struct kv_cache *kv, int p)
{
    return kv->n_pools > 1 ? kv->n_free_pool[p] : kv->n_free;
}

int kv_cache_roomiest_pool(const struct kv_cache *kv)
{
    int best = 0;
    for (int p = 1; p < kv->n_pools; p++)
        if (kv->n_free_pool[p] > kv->n_free_pool[best])
            best = p;
    return best;
}

int kv_seq_room(const struct kv_cache *kv, const struct kv_seq *s)
{
    if (kv->n_pools <= 1)
        return kv->n_free;
    return kv->n_free_pool[s->attn_rank > 0 ? s->attn_rank - 1 : kv_cache_roomiest_pool(kv)];
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
    if (kv->latent) {
        for (int l = 0; l < kv->n_layers; l++) {
            if (kv->latent[l].latent)
                kv->be->ops->free(kv->be, kv->latent[l].latent);
            if (kv->latent[l].index_k)
                kv->be->ops->free(kv->be, kv->latent[l].index_k);
        }
    }
    free(kv->latent);
    free(kv->layers);
    free(kv->free_ids);
    free(kv->refs);
    free(kv->n_free_pool);
    memset(kv, 0, sizeof *kv);
}

void kv_seq_init(struct kv_seq *s)
{
    memset(s, 0, sizeof *s);
}

void kv_block_ref(struct kv_cache *kv, int32_t id)
{
    ASSERT(id >= 0 && id < kv->n_blocks && kv->refs[id] > 0);
    kv->refs[id]++;
}

void kv_block_unref(struct kv_cache *kv, int32_t id)
{
    ASSERT(id >= 0 && id < kv->n_blocks && kv->refs[id] > 0);
    if (--kv->refs[id] != 0)
        return;
    if (kv->n_pools > 1) {
        const int p = kv_block_pool(kv, id);
        kv->free_ids[(size_t)p * (size_t)kv->pool_blocks + (size_t)kv->n_free_pool[p]++] = id;
    } else {
        kv->free_ids[kv->n_free] = id;
    }
    kv->n_free++;
}

void kv_seq_release(struct kv_seq *s, struct kv_cache *kv)
{
    for (int i = s->n_blocks - 1; i >= 0; i--)
        kv_block_unref(kv, s->blocks[i]);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

/* Grows the block table to hold at least need ids. */
static enum status kv_seq_grow(struct kv_seq *s, int need, struct err *err)
{
    if (need <= s->cap)
        return STATUS_OK;
    int cap = s->cap ? s->cap : 8;
    while (cap < need)
        cap *= 2;
    int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
    if (!nb)
        return err_set(err, STATUS_NOMEM, "KV cache: out of host memory for a block table");
    s->blocks = nb;
    s->cap = cap;
    return STATUS_OK;
}

enum status kv_seq_share(struct kv_seq *s, struct kv_cache *kv, const int32_t *ids, int n, struct err *err)
{
    ASSERT(s->n_tokens == s->n_blocks * kv->block_size); /* appended blocks start a block */
    if (kv->n_pools > 1 && n > 0) { /* the sequence goes where its prefix is */
        const int p = kv_block_pool(kv, ids[0]);
        ASSERT(s->attn_rank == 0 || s->attn_rank == p + 1);
        s->attn_rank = p + 1;
    }
    enum status st = kv_seq_grow(s, s->n_blocks + n, err);
    if (st)
        return st;
    for (int i = 0; i < n; i++) {
        kv_block_ref(kv, ids[i]);
        s->blocks[s->n_blocks++] = ids[i];
    }
    return STATUS_OK;
}

enum status kv_seq_reserve(struct kv_seq *s, struct kv_cache *kv, int n_tokens, struct err *err)
{
    int need = (n_tokens + kv->block_size - 1) / kv->block_size;
    if (need <= s->n_blocks)
        return STATUS_OK;
    const bool pools = kv->n_pools > 1;
    const int p = pools ? (s->attn_rank > 0 ? s->attn_rank - 1 : kv_cache_roomiest_pool(kv)) : 0;
    if (need - s->n_blocks > kv_cache_pool_free(kv, p))
        return err_set(err, STATUS_NOMEM,
                       "KV cache full: %d tokens need %d more blocks of %d tokens, %d of %d free%s",
                       n_tokens, need - s->n_blocks, kv->block_size, kv_cache_pool_free(kv, p),
                       pools ? kv->pool_blocks : kv->n_blocks, pools ? " in the sequence's rank's pool" : "");
    enum status st = kv_seq_grow(s, need, err);
    if (st)
        return st;
    if (pools)
        s->attn_rank = p + 1;
    int32_t *stack = kv->free_ids + (pools ? (size_t)p * (size_t)kv->pool_blocks : 0);
    while (s->n_blocks < need) {
        int32_t id = stack[pools ? --kv->n_free_pool[p] : kv->n_free - 1];
        kv->n_free--;
        kv->refs[id] = 1;
        s->blocks[s->n_blocks++] = id;
    }
    return STATUS_OK;
}

/* The next of a fixed sequence of uniform values in [-1, 1). */
static float fill_next(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return (float)((*x >> 40) & 0xffffffu) / 8388608.0f - 1.0f;
}

/* n rows of nq + nr values of type t at host buffer h (backend.h's row layouts): fp8 rows get
 * e4m3 codes of values in [-1, 1) at scale 1 / 448 and bf16 rope values. */
static void fill_rows(uint8_t *h, enum kv_dtype t, size_t n, int nq, int nr, uint64_t *x)
{
    size_t rb = kv_latent_row_bytes(t, nq, nr);
    for (size_t r = 0; r < n; r++) {
        uint8_t *row = h + r * rb;
        if (t == KV_DTYPE_F32) {
            for (int i = 0; i < nq + nr; i++) {
                float v = fill_next(x);
                memcpy(row + 4 * (size_t)i, &v, 4);
            }
        } else if (t == KV_DTYPE_BF16) {
            for (int i = 0; i < nq + nr; i++) {
                uint16_t b = f32_to_bf16(fill_next(x));
                memcpy(row + 2 * (size_t)i, &b, 2);
            }
        } else {
            const int nb = (nq + KV_FP8_BLOCK - 1) / KV_FP8_BLOCK;
            for (int i = 0; i < nq; i++) {
                uint8_t c = (uint8_t)((*x >> 24) & 0xffu);
                fill_next(x);
                row[i] = (c & 0x7fu) == 0x7fu ? (uint8_t)(c ^ 1u) : c; /* never the NaN codes */
            }
            for (int b = 0; b < nb; b++) {
                float s = 1.0f / 448.0f;
                memcpy(row + nq + 4 * (size_t)b, &s, 4);
            }
            for (int i = 0; i < nr; i++) {
                uint16_t b = f32_to_bf16(fill_next(x));
                memcpy(row + nq + 4 * (size_t)nb + 2 * (size_t)i, &b, 2);
            }
        }
    }
}

/* Every slot of one cache array (n_slots rows), uploaded in chunks of ~16 MiB. */
static enum status fill_array(struct kv_cache *kv, void *dev, enum kv_dtype t, int nq, int nr, uint64_t *x,
                              struct err *err)
{
    size_t rb = kv_latent_row_bytes(t, nq, nr), slots = (size_t)kv->pool_blocks * (size_t)kv->block_size;
    size_t per = (16u << 20) / rb + 1;
    uint8_t *h = malloc(per * rb);
    if (!h)
        return err_set(err, STATUS_NOMEM, "KV cache: out of host memory for the random fill");
    for (size_t s0 = 0; s0 < slots; s0 += per) {
        size_t n = slots - s0 < per ? slots - s0 : per;
        fill_rows(h, t, n, nq, nr, x);
        kv->be->ops->upload(kv->be, (uint8_t *)dev + s0 * rb, h, n * rb);
    }
    free(h);
    return STATUS_OK;
}

enum status kv_cache_fill_random(struct kv_cache *kv, uint64_t seed, struct err *err)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    enum status st = STATUS_OK;
    for (int l = 0; l < kv->n_layers && !st; l++) {
        if (kv->latent && kv->latent[l].latent) {
            const struct paged_latent *p = &kv->latent[l];
            st = fill_array(kv, p->latent, p->dtype, p->kv_rank, p->rope_dim, &x, err);
            if (!st && p->index_k)
                st = fill_array(kv, p->index_k, p->index_dtype, p->index_dim, 0, &x, err);
        } else if (kv->layers[l].k) {
            const struct paged_kv *p = &kv->layers[l];
            int row = p->n_kv_heads * p->head_dim;
            st = fill_array(kv, p->k, KV_DTYPE_F32, row, 0, &x, err);
            if (!st)
                st = fill_array(kv, p->v, KV_DTYPE_F32, row, 0, &x, err);
        }
    }
    return st;
}
