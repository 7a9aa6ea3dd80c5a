/* test_prefix_cache.c — the radix tree of KV blocks over a bookkeeping-only KV cache.
 *
 * The KV cache here has no layers (no memory): only block ids, the free stack
 * and the reference counts, which is all the prefix cache touches.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/prefix_cache.h"

enum { BS = 4, NB = 16 };

static void fake_kv(struct kv_cache *kv)
{
    memset(kv, 0, sizeof *kv);
    kv->block_size = BS;
    kv->n_blocks = NB;
    kv->free_ids = malloc(NB * sizeof(int32_t));
    kv->refs = calloc(NB, sizeof(int32_t));
    for (int i = 0; i < NB; i++)
        kv->free_ids[i] = NB - 1 - i;
    kv->n_free = NB;
}

static void fake_kv_free(struct kv_cache *kv)
{
    free(kv->free_ids);
    free(kv->refs);
}

/* A sequence holding tokens t[0..n) in fresh blocks. */
static void seq_fill(struct kv_cache *kv, struct kv_seq *s, int n)
{
    kv_seq_init(s);
    assert_int_equal(kv_seq_reserve(s, kv, n, NULL), STATUS_OK);
    s->n_tokens = n;
}

static void test_match_after_insert(void **state)
{
    (void)state;
    struct kv_cache kv;
    fake_kv(&kv);
    struct prefix_cache pc;
    assert_int_equal(prefix_cache_init(&pc, &kv, NULL), STATUS_OK);
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    struct kv_seq s;
    seq_fill(&kv, &s, 12);
    prefix_cache_insert(&pc, a, 3, s.blocks);
    assert_int_equal(pc.n_nodes, 3);
    int32_t got[4];
    assert_int_equal(prefix_cache_match(&pc, a, 3, got), 3);
    assert_memory_equal(got, s.blocks, 3 * sizeof(int32_t));
    /* a prompt that diverges inside the second block matches only the first */
    int32_t b[12] = {1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12};
    assert_int_equal(prefix_cache_match(&pc, b, 3, got), 1);
    assert_int_equal(got[0], s.blocks[0]);
    /* max_blocks caps the match (the caller keeps the last prompt token out) */
    assert_int_equal(prefix_cache_match(&pc, a, 2, got), 2);
    /* while the sequence holds them, nothing is evictable */
    assert_int_equal(prefix_cache_evictable(&pc), 0);
    assert_int_equal(prefix_cache_evict(&pc, 5), 0);
    kv_seq_release(&s, &kv);
    assert_int_equal(kv.n_free, NB - 3);
    assert_int_equal(prefix_cache_evictable(&pc), 3);
    /* a second sequence borrows the blocks: refs go up, nothing is computed twice */
    struct kv_seq s2;
    kv_seq_init(&s2);
    int n = prefix_cache_match(&pc, a, 2, got);
    assert_int_equal(kv_seq_share(&s2, &kv, got, n, NULL), STATUS_OK);
    assert_int_equal(kv.refs[got[0]], 2);
    assert_int_equal(prefix_cache_evictable(&pc), 1); /* only the third block */
    kv_seq_release(&s2, &kv);
    prefix_cache_free(&pc);
    assert_int_equal(kv.n_free, NB);
    fake_kv_free(&kv);
}

static void test_evict_lru_leaves_first(void **state)
{
    (void)state;
    struct kv_cache kv;
    fake_kv(&kv);
    struct prefix_cache pc;
    assert_int_equal(prefix_cache_init(&pc, &kv, NULL), STATUS_OK);
    int32_t a[8] = {1, 1, 1, 1, 2, 2, 2, 2};
    int32_t b[8] = {1, 1, 1, 1, 3, 3, 3, 3}; /* shares a's first block */
    int32_t c[4] = {9, 9, 9, 9};
    struct kv_seq sa, sb, sc;
    seq_fill(&kv, &sa, 8);
    prefix_cache_insert(&pc, a, 2, sa.blocks);
    /* b computed its own copy of the first block: insertion must stop there */
    seq_fill(&kv, &sb, 8);
    prefix_cache_insert(&pc, b, 2, sb.blocks);
    assert_int_equal(pc.n_nodes, 2);
    seq_fill(&kv, &sc, 4);
    prefix_cache_insert(&pc, c, 1, sc.blocks);
    assert_int_equal(pc.n_nodes, 3);
    int32_t blocks_a[2] = {sa.blocks[0], sa.blocks[1]}, block_c = sc.blocks[0];
    kv_seq_release(&sa, &kv);
    kv_seq_release(&sb, &kv);
    kv_seq_release(&sc, &kv);
    assert_int_equal(kv.n_free, NB - 3);
    /* touch c so that a's chain is the least recently used */
    int32_t got[2];
    assert_int_equal(prefix_cache_match(&pc, c, 1, got), 1);
    /* one block: a's leaf (its second block) goes first, never an inner node */
    assert_int_equal(prefix_cache_evict(&pc, 1), 1);
    assert_int_equal(kv.refs[blocks_a[1]], 0);
    assert_int_equal(kv.refs[blocks_a[0]], 1);
    assert_int_equal(kv.refs[block_c], 1);
    /* next: a's first block (now a leaf, older than c) */
    assert_int_equal(prefix_cache_evict(&pc, 1), 1);
    assert_int_equal(kv.refs[blocks_a[0]], 0);
    assert_int_equal(prefix_cache_match(&pc, a, 2, got), 0);
    assert_int_equal(prefix_cache_match(&pc, c, 1, got), 1);
    prefix_cache_clear(&pc);
    assert_int_equal(pc.n_nodes, 0);
    assert_int_equal(kv.n_free, NB);
    prefix_cache_free(&pc);
    fake_kv_free(&kv);
}

static void test_refill_after_eviction(void **state)
{
    (void)state;
    /* Fill the cache completely many times over: node storage never runs out
     * and every block comes back. */
    struct kv_cache kv;
    fake_kv(&kv);
    struct prefix_cache pc;
    assert_int_equal(prefix_cache_init(&pc, &kv, NULL), STATUS_OK);
    for (int round = 0; round < 50; round++) {
        int32_t t[8];
        for (int i = 0; i < 8; i++)
            t[i] = round * 8 + i;
        struct kv_seq s;
        kv_seq_init(&s);
        if (kv.n_free < 2)
            prefix_cache_evict(&pc, 2 - kv.n_free);
        assert_int_equal(kv_seq_reserve(&s, &kv, 8, NULL), STATUS_OK);
        s.n_tokens = 8;
        prefix_cache_insert(&pc, t, 2, s.blocks);
        kv_seq_release(&s, &kv);
        assert_int_equal(kv.n_free + prefix_cache_evictable(&pc), NB);
    }
    prefix_cache_free(&pc);
    assert_int_equal(kv.n_free, NB);
    fake_kv_free(&kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_after_insert),
        cmocka_unit_test(test_evict_lru_leaves_first),
        cmocka_unit_test(test_refill_after_eviction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
