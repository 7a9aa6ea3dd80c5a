/* kv_cache.h — paged KV cache: fixed-size blocks shared by all sequences.
 *
 * Memory for every layer is taken once at init (backend memory); sequences
 * own lists of block ids (their block table) and grow one block at a time.
 * A full cache is a recoverable STATUS_NOMEM naming how many blocks were
 * needed and free, never a crash; freeing a sequence returns its blocks at
 * once.
 *
 * defines: struct kv_cache, struct kv_seq, kv_cache_init(), kv_cache_free(),
 *          kv_cache_bytes(), kv_seq_init(), kv_seq_release(), kv_seq_reserve(),
 *          kv_seq_slot()
 */
#ifndef MOESERVE_ENGINE_KV_CACHE_H
#define MOESERVE_ENGINE_KV_CACHE_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model_desc.h"

struct kv_cache {
    struct backend *be;       /* borrowed */
    int n_layers;
    int block_size;           /* tokens per block */
    int n_blocks;
    struct paged_kv *layers;  /* (n_layers) owned; k/v in backend memory, owned */
    int32_t *free_ids;        /* (n_blocks) stack of free block ids, host, owned */
    int n_free;
};

struct kv_seq {
    int32_t *blocks; /* (cap) block ids, host, owned */
    int n_blocks;
    int cap;
    int n_tokens;    /* tokens whose K/V are in the cache */
};

/* Bytes of backend memory a cache of n_blocks would take. */
uint64_t kv_cache_bytes(const struct model_desc *d, int n_blocks, int block_size);
enum status kv_cache_init(struct kv_cache *kv, struct backend *be, const struct model_desc *d,
                          int n_blocks, int block_size, struct err *err);
/* Safe on a zeroed struct. */
void kv_cache_free(struct kv_cache *kv);

void kv_seq_init(struct kv_seq *s);
/* Returns the sequence's blocks to the cache and empties it. */
void kv_seq_release(struct kv_seq *s, struct kv_cache *kv);
/* Makes room for positions [0, n_tokens). */
enum status kv_seq_reserve(struct kv_seq *s, struct kv_cache *kv, int n_tokens, struct err *err);

static inline int32_t kv_seq_slot(const struct kv_seq *s, int pos, int block_size)
{
    return s->blocks[pos / block_size] * block_size + pos % block_size;
}

#endif
