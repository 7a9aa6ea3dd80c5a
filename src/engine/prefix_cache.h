/* prefix_cache.h — KV blocks of earlier requests, found again by their tokens.
 *
 * A radix tree whose edges are full KV blocks: a node stands for the
 * block_size tokens of one block, following the tokens of its ancestors, and
 * holds one reference on the KV block that contains their keys and values.
 * A new request walks the tree with its prompt and borrows the longest
 * matching run of blocks, so a shared system prompt is computed once.
 *
 * Invariants: only full blocks enter the tree, so a cached block is never
 * written again; a block id appears in the tree at most once; a sequence that
 * holds a node's block holds every ancestor's block too (insertion stops at the
 * first node that holds a different block for the same tokens), so a node whose
 * block only the tree holds has no descendant that a sequence holds, and
 * eviction (least recently used leaves first) can always reach it.
 * Node storage is taken at init (one node per KV block at most); nothing is
 * allocated afterwards. Not thread-safe: the scheduler thread owns it.
 *
 * defines: struct prefix_cache, prefix_cache_init(), prefix_cache_free(),
 *          prefix_cache_match(), prefix_cache_insert(), prefix_cache_evict(),
 *          prefix_cache_evictable(), prefix_cache_evict_pool(), prefix_cache_evictable_pool(),
 *          prefix_cache_clear()
 */
#ifndef MOESERVE_ENGINE_PREFIX_CACHE_H
#define MOESERVE_ENGINE_PREFIX_CACHE_H

#include <stdint.h>

#include "base/status.h"
#include "engine/kv_cache.h"

struct prefix_node;

struct prefix_cache {
    struct kv_cache *kv;          /* borrowed */
    int block_size;
    int cap;                      /* nodes: kv->n_blocks */
    struct prefix_node *nodes;    /* (cap) owned */
    int32_t *tokens;              /* (cap, block_size) tokens of each node, owned */
    int32_t *free_nodes;          /* (cap) stack of unused node indices, owned */
    int n_free_nodes;
    int32_t *scratch;             /* (cap) eviction candidates, owned */
    int root;                     /* first child of the (implicit) root, -1 if empty */
    uint64_t clock;               /* advances on every match/insert: the LRU order */
    int n_nodes;
};

enum status prefix_cache_init(struct prefix_cache *pc, struct kv_cache *kv, struct err *err);
/* Returns every cached block to the KV cache. Safe on a zeroed struct. */
void prefix_cache_free(struct prefix_cache *pc);
/* Drops every node whose block only the tree holds (all of them when no
 * sequence is running). */
void prefix_cache_clear(struct prefix_cache *pc);

/* Blocks matching tokens[0 .. max_blocks * block_size): writes their ids to
 * blocks_out and returns how many (0..max_blocks). Marks them recently used.
 * Takes no reference: the caller shares them (kv_seq_share) before anything
 * can evict them. */
int prefix_cache_match(struct prefix_cache *pc, const int32_t *tokens, int max_blocks, int32_t *blocks_out);

/* Offers the first n_blocks full blocks of a sequence (tokens, and the block
 * ids that hold their K/V). New nodes take a reference on their block. */
void prefix_cache_insert(struct prefix_cache *pc, const int32_t *tokens, int n_blocks, const int32_t *blocks);

/* Frees up to n blocks that only the tree holds, least recently used leaves
 * first; returns how many went back to the KV cache's free list. */
int prefix_cache_evict(struct prefix_cache *pc, int n);

/* Blocks that only the tree holds (what prefix_cache_evict could free). */
int prefix_cache_evictable(const struct prefix_cache *pc);
/* The same within the KV cache's pool `pool` (kv_cache.h: data-parallel attention's; -1: any). */
int prefix_cache_evict_pool(struct prefix_cache *pc, int n, int pool);
int prefix_cache_evictable_pool(const struct prefix_cache *pc, int pool);

#endif
