/* prefix_cache.c — see prefix_cache.h.
 *
 * Children of a node form a doubly linked sibling list; a 64-bit hash of the
 * block's tokens makes the walk compare whole blocks only on a likely match.
 * Root-level nodes have parent -1 and are listed from pc->root.
 */
#include "engine/prefix_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct prefix_node {
    int32_t block;      /* KV block id, one reference held by the tree */
    int parent;         /* node index, -1 at the root level */
    int first_child;    /* -1 for a leaf */
    int prev, next;     /* siblings, -1 at the ends */
    uint64_t hash;      /* of the block's tokens */
    uint64_t last_use;  /* pc->clock when last matched or inserted */
};

static uint64_t block_hash(const int32_t *t, int n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the ids' bytes */
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)t[i];
        for (int b = 0; b < 4; b++) {
            h ^= (v >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

enum status prefix_cache_init(struct prefix_cache *pc, struct kv_cache *kv, struct err *err)
{
    memset(pc, 0, sizeof *pc);
    pc->kv = kv;
    pc->block_size = kv->block_size;
    pc->cap = kv->n_blocks;
    pc->root = -1;
    pc->nodes = calloc((size_t)pc->cap, sizeof *pc->nodes);
    pc->tokens = malloc((size_t)pc->cap * (size_t)pc->block_size * sizeof *pc->tokens);
    pc->free_nodes = malloc((size_t)pc->cap * sizeof *pc->free_nodes);
    pc->scratch = malloc((size_t)pc->cap * sizeof *pc->scratch);
    if (!pc->nodes || !pc->tokens || !pc->free_nodes || !pc->scratch) {
        prefix_cache_free(pc);
        return err_set(err, STATUS_NOMEM, "prefix cache: out of memory for %d nodes", kv->n_blocks);
    }
    for (int i = 0; i < pc->cap; i++)
        pc->free_nodes[i] = pc->cap - 1 - i;
    pc->n_free_nodes = pc->cap;
    return STATUS_OK;
}

void prefix_cache_free(struct prefix_cache *pc)
{
    if (pc->nodes && pc->kv) {
        for (int i = 0; i < pc->cap; i++)
            if (pc->nodes[i].last_use) /* 0: never used or removed */
                kv_block_unref(pc->kv, pc->nodes[i].block);
    }
    free(pc->nodes);
    free(pc->tokens);
    free(pc->free_nodes);
    free(pc->scratch);
    memset(pc, 0, sizeof *pc);
}

static const int32_t *node_tokens(const struct prefix_cache *pc, int i)
{
    return pc->tokens + (size_t)i * (size_t)pc->block_size;
}

/* The child of `parent` (-1: root level) for these block tokens, or -1. */
static int find_child(const struct prefix_cache *pc, int parent, const int32_t *t, uint64_t h)
{
    int c = parent < 0 ? pc->root : pc->nodes[parent].first_child;
    for (; c >= 0; c = pc->nodes[c].next)
        if (pc->nodes[c].hash == h && memcmp(node_tokens(pc, c), t, (size_t)pc->block_size * sizeof *t) == 0)
            return c;
    return -1;
}

int prefix_cache_match(struct prefix_cache *pc, const int32_t *tokens, int max_blocks, int32_t *blocks_out)
{
    int bs = pc->block_size, parent = -1, n = 0;
    pc->clock++;
    while (n < max_blocks) {
        const int32_t *t = tokens + (size_t)n * (size_t)bs;
        int c = find_child(pc, parent, t, block_hash(t, bs));
        if (c < 0)
            break;
        pc->nodes[c].last_use = pc->clock;
        blocks_out[n++] = pc->nodes[c].block;
        parent = c;
    }
    return n;
}

void prefix_cache_insert(struct prefix_cache *pc, const int32_t *tokens, int n_blocks, const int32_t *blocks)
{
    int bs = pc->block_size, parent = -1;
    pc->clock++;
    for (int i = 0; i < n_blocks; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)bs;
        uint64_t h = block_hash(t, bs);
        int c = find_child(pc, parent, t, h);
        if (c >= 0) {
            /* Another sequence computed these tokens into a different block:
             * ours stays private, and nothing of ours may hang below theirs. */
            if (pc->nodes[c].block != blocks[i])
                return;
            pc->nodes[c].last_use = pc->clock;
            parent = c;
            continue;
        }
        ASSERT(pc->n_free_nodes > 0); /* one node per block at most */
        c = pc->free_nodes[--pc->n_free_nodes];
        struct prefix_node *nd = &pc->nodes[c];
        *nd = (struct prefix_node){.block = blocks[i], .parent = parent, .first_child = -1, .prev = -1,
                                   .hash = h, .last_use = pc->clock};
        memcpy(pc->tokens + (size_t)c * (size_t)bs, t, (size_t)bs * sizeof *t);
        int *head = parent < 0 ? &pc->root : &pc->nodes[parent].first_child;
        nd->next = *head;
        if (*head >= 0)
            pc->nodes[*head].prev = c;
        *head = c;
        kv_block_ref(pc->kv, blocks[i]);
        pc->n_nodes++;
        parent = c;
    }
}

/* Unlinks leaf c and drops the tree's reference on its block. */
static void remove_leaf(struct prefix_cache *pc, int c)
{
    struct prefix_node *nd = &pc->nodes[c];
    ASSERT(nd->first_child < 0);
    if (nd->prev >= 0)
        pc->nodes[nd->prev].next = nd->next;
    else if (nd->parent >= 0)
        pc->nodes[nd->parent].first_child = nd->next;
    else
        pc->root = nd->next;
    if (nd->next >= 0)
        pc->nodes[nd->next].prev = nd->prev;
    kv_block_unref(pc->kv, nd->block);
    nd->last_use = 0; /* marks the node unused for prefix_cache_free */
    pc->free_nodes[pc->n_free_nodes++] = c;
    pc->n_nodes--;
}

static bool node_used(const struct prefix_cache *pc, int i)
{
    return pc->nodes[i].last_use != 0;
}

static int cmp_last_use(const void *a, const void *b, void *ctx)
{
    const struct prefix_node *nodes = ctx;
    uint64_t x = nodes[*(const int32_t *)a].last_use, y = nodes[*(const int32_t *)b].last_use;
    return x < y ? -1 : x > y;
}

int prefix_cache_evict(struct prefix_cache *pc, int n)
{
    return prefix_cache_evict_pool(pc, n, -1);
}

/* Whether node i's block is in pool p (-1: any; a path's blocks are one sequence's, so one pool) */
static bool in_pool(const struct prefix_cache *pc, int i, int p)
{
    return p < 0 || kv_block_pool(pc->kv, pc->nodes[i].block) == p;
}

int prefix_cache_evict_pool(struct prefix_cache *pc, int n, int pool)
{
    int freed = 0;
    while (freed < n) {
        /* Evictable leaves, oldest first; their parents may become leaves,
         * so repeat until enough are freed or none is left. */
        int m = 0;
        for (int i = 0; i < pc->cap; i++)
            if (node_used(pc, i) && pc->nodes[i].first_child < 0 && pc->kv->refs[pc->nodes[i].block] == 1 &&
                in_pool(pc, i, pool))
                pc->scratch[m++] = i;
        if (m == 0)
            break;
        qsort_r(pc->scratch, (size_t)m, sizeof *pc->scratch, cmp_last_use, pc->nodes);
        for (int j = 0; j < m && freed < n; j++, freed++)
            remove_leaf(pc, pc->scratch[j]);
    }
    return freed;
}

int prefix_cache_evictable(const struct prefix_cache *pc)
{
    return prefix_cache_evictable_pool(pc, -1);
}

int prefix_cache_evictable_pool(const struct prefix_cache *pc, int pool)
{
    int n = 0;
    for (int i = 0; i < pc->cap; i++)
        if (node_used(pc, i) && pc->kv->refs[pc->nodes[i].block] == 1 && in_pool(pc, i, pool))
            n++;
    return n;
}

void prefix_cache_clear(struct prefix_cache *pc)
{
    prefix_cache_evict(pc, pc->cap);
}
