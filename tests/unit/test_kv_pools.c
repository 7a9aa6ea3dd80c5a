/* test_kv_pools.c — the KV cache's block pools of data-parallel attention (engine/kv_cache.h): a
 * sequence takes every block from one pool (the roomiest when it first reserves, or that of the
 * prefix blocks it shares), a block's place is its index in its pool's memory, a full pool refuses
 * even when others have room (naming the pool), freed blocks go back to their pool, the backend
 * memory holds one pool; the prefix cache evicts and counts within a pool. One pool is the plain
 * cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/kv_cache.h"
#include "engine/prefix_cache.h"

static struct model_desc toy(struct layer_desc *l)
{
    l[0] = (struct layer_desc){.attn = ATTN_GQA, .ffn = FFN_DENSE};
    return (struct model_desc){.family = MODEL_QWEN3_MOE, .vocab_size = 64, .d_model = 16, .n_layers = 1,
                               .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .d_ff = 32, .layers = l};
}

static void test_pools(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cpu_create(&be, &err), STATUS_OK);
    struct layer_desc l[1];
    struct model_desc d = toy(l);
    struct kv_cache kv;
    assert_int_equal(kv_cache_init_pools(&kv, &be, &d, KV_DTYPE_F32, 8, 4, 3, &err), STATUS_INVALID); /* 8 / 3 */
    assert_int_equal(kv_cache_init_pools(&kv, &be, &d, KV_DTYPE_F32, 8, 4, 2, &err), STATUS_OK);
    assert_int_equal(kv.pool_blocks, 4);
    assert_int_equal(kv.pad_block, 4); /* memory: one pool and the pad block */
    struct kv_seq a, b, c, e;
    kv_seq_init(&a), kv_seq_init(&b), kv_seq_init(&c), kv_seq_init(&e);
    /* a new sequence takes the roomiest pool (the first of equals), its blocks all from it */
    assert_int_equal(kv_seq_reserve(&a, &kv, 6, &err), STATUS_OK);
    assert_int_equal(a.attn_rank, 1);
    assert_true(a.blocks[0] < 4 && a.blocks[1] < 4);
    assert_int_equal(kv_seq_reserve(&b, &kv, 5, &err), STATUS_OK);
    assert_int_equal(b.attn_rank, 2);
    assert_true(b.blocks[0] >= 4 && b.blocks[1] >= 4);
    assert_int_equal(kv_block_pool(&kv, b.blocks[1]), 1);
    assert_int_equal(kv_block_place(&kv, b.blocks[1]), b.blocks[1] - 4);
    assert_int_equal(kv_cache_pool_free(&kv, 0), 2);
    assert_int_equal(kv_cache_pool_free(&kv, 1), 2);
    assert_int_equal(kv.n_free, 4);
    /* 3 blocks fit no pool, though 4 are free in all */
    assert_int_equal(kv_seq_reserve(&c, &kv, 12, &err), STATUS_NOMEM);
    assert_non_null(strstr(err.msg, "rank's pool"));
    assert_int_equal(c.attn_rank, 0);
    /* a sequence grows in its own pool only */
    assert_int_equal(kv_seq_reserve(&a, &kv, 16, &err), STATUS_OK);
    assert_int_equal(kv_cache_pool_free(&kv, 0), 0);
    assert_int_equal(kv_seq_room(&kv, &a), 0);
    assert_int_equal(kv_seq_room(&kv, &b), 2);
    assert_int_equal(kv_seq_reserve(&a, &kv, 17, &err), STATUS_NOMEM);
    /* shared prefix blocks bring the sequence to their pool */
    b.n_tokens = 4;
    assert_int_equal(kv_seq_share(&e, &kv, b.blocks, 1, &err), STATUS_OK);
    assert_int_equal(e.attn_rank, 2);
    assert_int_equal(kv_seq_reserve(&e, &kv, 8, &err), STATUS_OK);
    assert_int_equal(kv_block_pool(&kv, e.blocks[1]), 1);
    /* released blocks go back to their pool */
    kv_seq_release(&a, &kv);
    assert_int_equal(kv_cache_pool_free(&kv, 0), 4);
    assert_int_equal(kv_cache_roomiest_pool(&kv), 0);
    kv_seq_release(&e, &kv);
    kv_seq_release(&b, &kv);
    assert_int_equal(kv.n_free, 8);
    assert_int_equal(kv_cache_pool_free(&kv, 1), 4);
    kv_cache_free(&kv);
    /* one pool: the plain cache (low ids first, the whole count) */
    assert_int_equal(kv_cache_init(&kv, &be, &d, KV_DTYPE_F32, 8, 4, &err), STATUS_OK);
    assert_int_equal(kv_seq_reserve(&a, &kv, 12, &err), STATUS_OK);
    assert_int_equal(a.blocks[0], 0);
    assert_int_equal(a.attn_rank, 0);
    assert_int_equal(kv_block_place(&kv, 7), 7);
    assert_int_equal(kv_cache_pool_free(&kv, 0), 5);
    kv_seq_release(&a, &kv);
    kv_cache_free(&kv);
    backend_destroy(&be);
}

/* The prefix cache evicts and counts within a pool: a pool's blocks come free only from its paths. */
static void test_prefix_cache_pools(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cpu_create(&be, &err), STATUS_OK);
    struct layer_desc l[1];
    struct model_desc d = toy(l);
    struct kv_cache kv;
    assert_int_equal(kv_cache_init_pools(&kv, &be, &d, KV_DTYPE_F32, 8, 4, 2, &err), STATUS_OK);
    struct prefix_cache pc;
    assert_int_equal(prefix_cache_init(&pc, &kv, &err), STATUS_OK);
    struct kv_seq a, b;
    kv_seq_init(&a), kv_seq_init(&b);
    const int32_t ta[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tb[8] = {9, 9, 9, 9, 8, 8, 8, 8};
    assert_int_equal(kv_seq_reserve(&a, &kv, 8, &err), STATUS_OK); /* pool 0 */
    assert_int_equal(kv_seq_reserve(&b, &kv, 8, &err), STATUS_OK); /* pool 1 */
    prefix_cache_insert(&pc, ta, 2, a.blocks);
    prefix_cache_insert(&pc, tb, 2, b.blocks);
    kv_seq_release(&a, &kv);
    kv_seq_release(&b, &kv);
    assert_int_equal(prefix_cache_evictable_pool(&pc, 0), 2);
    assert_int_equal(prefix_cache_evictable_pool(&pc, 1), 2);
    assert_int_equal(prefix_cache_evictable(&pc), 4);
    assert_int_equal(prefix_cache_evict_pool(&pc, 8, 1), 2); /* only pool 1's */
    assert_int_equal(kv_cache_pool_free(&kv, 1), 4);
    assert_int_equal(kv_cache_pool_free(&kv, 0), 2);
    assert_int_equal(prefix_cache_evictable_pool(&pc, 0), 2);
    prefix_cache_free(&pc);
    kv_cache_free(&kv);
    backend_destroy(&be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pools),
        cmocka_unit_test(test_prefix_cache_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
