/* kv_cache.h — paged KV cache: fixed-size blocks shared by all sequences.
 *
 * Memory for every layer is taken once at init (backend memory); sequences
 * own lists of block ids (their block table) and grow one block at a time.
 * Each layer is sized by its attention kind: GQA layers hold K and V, MLA
 * layers only the latent row (kv_lora_rank + rope dims) and, on layers that
 * own a DSA indexer, the indexer key (model_desc_kv_elems_per_token()).
 * A full cache is a recoverable STATUS_NOMEM naming how many blocks were
 * needed and free, never a crash; freeing a sequence returns its blocks at
 * once.
 * Blocks are reference counted so that full blocks of a common prefix can be
 * shared (engine/prefix_cache.c): a block returns to the free stack when its
 * last holder lets go. Only full blocks are ever shared, so a shared block is
 * never written again.
 * Data-parallel attention (engine/forward_dp.h) splits the block ids into pools, one a rank
 * (kv_cache_init_pools): rank r's pool is ids [r P, (r + 1) P), and each rank's memory holds one
 * pool (a block's place there: kv_block_place). A sequence takes every block from one pool, the
 * roomiest when it reserves first, or that of the prefix blocks it shares; kv_seq.attn_rank then
 * names the pool (its rank). With one pool everything is as without pools.
 * The memory holds one block more than n_blocks: pad_block, never handed out, written only by
 * rows whose outputs nobody reads.
 *
 * defines: struct kv_cache, struct kv_seq, kv_cache_init(), kv_cache_init_pools(), kv_cache_free(),
 *          kv_cache_pool_free(), kv_cache_roomiest_pool(), kv_block_pool(), kv_block_place(),
 *          kv_seq_room(),
 *          kv_cache_bytes(), kv_cache_fill_random(), kv_seq_init(), kv_seq_release(), kv_seq_reserve(),
 *          kv_seq_share(), kv_block_ref(), kv_block_unref(), kv_seq_slot()
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
    int32_t pad_block;        /* == n_blocks: one more block of memory that no sequence gets; a padded
                                 decode pass's extra rows write there (engine/forward.h) */
    enum kv_dtype latent_dtype; /* MLA layers' rows */
    struct paged_kv *layers;  /* (n_layers) owned; k/v in backend memory, owned (GQA layers) */
    struct paged_latent *latent; /* (n_layers) owned, NULL without MLA layers; MLA layers' latent
                                    (+ indexer key) rows in backend memory, owned (spec C.8) */
    int32_t *free_ids;        /* (n_blocks) stacks of free block ids, pool p's at p * pool_blocks, host, owned */
    int n_free;               /* free blocks of every pool */
    int n_pools;              /* 1, or the ranks of data-parallel attention */
    int pool_blocks;          /* n_blocks / n_pools: the blocks backend memory holds (+ the pad block) */
    int *n_free_pool;         /* (n_pools) free blocks of each pool, host, owned */
    int32_t *refs;            /* (n_blocks) holders of each block (sequences, prefix cache), host, owned */
};

struct kv_seq {
    int32_t *blocks; /* (cap) block ids, host, owned */
    int n_blocks;
    int cap;
    int n_tokens;    /* tokens whose K/V are in the cache */
    int attn_rank;   /* data-parallel attention (engine/forward_dp.h): 1 + the rank that attends for this
                        sequence and holds its rows; 0: none yet */
};

/* The DSA key rows' type beside a latent of type latent: fp8 with fp8, else f32 (backend.h). */
enum kv_dtype kv_cache_index_dtype(enum kv_dtype latent);
/* The MLA latent dtype a request (KV_DTYPE_AUTO or an enum kv_dtype) gives: bf16 by default. */
enum kv_dtype kv_cache_latent_dtype(int requested);
/* STATUS_OK when the model can have that cache; otherwise an error naming why (bf16 or fp8
 * asked for a GQA-only model, an unknown spelling). */
enum status kv_cache_check_dtype(const struct model_desc *d, int requested, struct err *err);
/* Bytes a token takes in layer l's cache, MLA latent rows of type latent. */
uint64_t kv_cache_layer_bytes(const struct model_desc *d, int l, enum kv_dtype latent);
/* Bytes of backend memory a cache of n_blocks would take, MLA layers' rows of type latent. */
uint64_t kv_cache_bytes(const struct model_desc *d, enum kv_dtype latent, int n_blocks, int block_size);
/* MLA layers' rows are of type latent; GQA layers' K and V are f32. */
enum status kv_cache_init(struct kv_cache *kv, struct backend *be, const struct model_desc *d,
                          enum kv_dtype latent, int n_blocks, int block_size, struct err *err);
/* The same with the block ids in n_pools pools of n_blocks / n_pools (n_pools must divide
 * n_blocks); backend memory holds one pool (data-parallel attention: each rank its own sequences). */
enum status kv_cache_init_pools(struct kv_cache *kv, struct backend *be, const struct model_desc *d,
                                enum kv_dtype latent, int n_blocks, int block_size, int n_pools, struct err *err);
/* Safe on a zeroed struct. */
void kv_cache_free(struct kv_cache *kv);
/* Free blocks of pool p (0 with one pool: all of them). */
int kv_cache_pool_free(const struct kv_cache *kv, int p);
/* The pool with the most free blocks (the first of equals). */
int kv_cache_roomiest_pool(const struct kv_cache *kv);
/* Block id's pool, and its place in its pool's memory (id itself with one pool). */
static inline int kv_block_pool(const struct kv_cache *kv, int32_t id)
{
    return kv->n_pools > 1 ? id / kv->pool_blocks : 0;
}
static inline int32_t kv_block_place(const struct kv_cache *kv, int32_t id)
{
    return kv->n_pools > 1 ? id % kv->pool_blocks : id;
}
/* Fills every slot of every layer with valid random rows of its dtype (values in [-1, 1)), from
 * seed: a benchmark's long contexts without prefilling them (`bench --context-fill random`). */
enum status kv_cache_fill_random(struct kv_cache *kv, uint64_t seed, struct err *err);

void kv_seq_init(struct kv_seq *s);
/* Returns the sequence's blocks to the cache and empties it. */
void kv_seq_release(struct kv_seq *s, struct kv_cache *kv);
/* Blocks s may still take: its pool's free ones (a sequence without a pool: the roomiest's). */
int kv_seq_room(const struct kv_cache *kv, const struct kv_seq *s);
/* Makes room for positions [0, n_tokens) (a sequence without a pool takes the roomiest). */
enum status kv_seq_reserve(struct kv_seq *s, struct kv_cache *kv, int n_tokens, struct err *err);
/* Appends n full, already computed blocks (a cached prefix) to an empty or
 * block-aligned sequence, taking a reference on each; n_tokens is not changed. */
enum status kv_seq_share(struct kv_seq *s, struct kv_cache *kv, const int32_t *ids, int n, struct err *err);
/* One more / one less holder of block id; the last unref frees it. */
void kv_block_ref(struct kv_cache *kv, int32_t id);
void kv_block_unref(struct kv_cache *kv, int32_t id);

static inline int32_t kv_seq_slot(const struct kv_seq *s, int pos, int block_size)
{
    return s->blocks[pos / block_size] * block_size + pos % block_size;
}

#endif
