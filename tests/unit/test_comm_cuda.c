/* test_comm_cuda.c — the NCCL communicator on one GPU (backend/cuda/cuda_comm_nccl.h).
 *
 * The lent machine has one GPU and NCCL puts one rank on a GPU, so this is the one-rank path:
 * its collectives on device and host memory (the 2-D placing of a gather, the staged host
 * broadcast and gather), and the shipped model's decode with the half-layer all-reduces going
 * through NCCL — captured into the decode graphs — which must give exactly the logits of the run
 * without a communicator. Skips without a GPU or without libnccl.so.2 (saying which).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_comm_nccl.h"
#include "base/log.h"
#include "engine/model_session.h"

static enum status comm_one(struct comm *c, struct backend *be, struct err *err)
{
    uint8_t id[CUDA_NCCL_ID_BYTES];
    enum status st = cuda_comm_nccl_unique_id(id, err);
    return st ? st : cuda_comm_nccl_init(c, be, 0, 1, id, true, err);
}

static void test_collectives(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cuda_create(&be, 0, 0, &err), STATUS_OK);
    struct comm c;
    assert_int_equal(comm_one(&c, &be, &err), STATUS_OK);
    assert_string_equal(c.ops->name, "nccl");
    /* device: the all-reduce of one rank, the gather into columns */
    float host[15], back[15];
    for (int i = 0; i < 15; i++)
        host[i] = (float)i * 0.5f - 3.0f;
    float *d_in = be.ops->alloc(&be, sizeof host), *d_out = be.ops->alloc(&be, sizeof host);
    be.ops->upload(&be, d_in, host, sizeof host);
    comm_all_reduce_sum(&c, d_in, 15);
    comm_all_gather_cols(&c, d_in, d_out, 3, 5);
    be.ops->download(&be, back, d_out, sizeof back);
    be.ops->synchronize(&be);
    assert_memory_equal(host, back, sizeof host);
    /* host: the staged broadcast and gather (engine/ranks.c's step messages) */
    int32_t msg[4] = {7, -1, 1 << 30, 3}, got[4];
    comm_broadcast(&c, msg, sizeof msg, 0);
    assert_int_equal(msg[2], 1 << 30);
    comm_all_gather(&c, msg, got, sizeof msg);
    assert_memory_equal(msg, got, sizeof msg);
    assert_int_equal(comm_agree(&c, STATUS_OK, &err), STATUS_OK);
    assert_int_equal(backend_cuda_status(&be, &err), STATUS_OK);
    be.ops->free(&be, d_in), be.ops->free(&be, d_out);
    comm_free(&c);
    backend_destroy(&be);
}

enum { PROMPT = 6, STEPS = 12 };

/* Greedy decode of the shipped model on the GPU: every step's logits into out (STEPS x vocab). */
static void decode(bool nccl, float *out, int *vocab)
{
    char dir[1024];
    const char *src = getenv("MOESERVE_SRC");
    snprintf(dir, sizeof dir, "%s/models/moeserve-tiny", src ? src : ".");
    struct session_opts so = {.backend = "cuda", .max_tokens = PROMPT, .max_seqs = 1, .max_context = 64};
    struct model_session s;
    struct err err = {0};
    if (model_session_open(&s, dir, &so, &err))
        fail_msg("%s", err.msg);
    struct comm c = {0};
    if (nccl) {
        if (comm_one(&c, &s.be, &err))
            fail_msg("%s", err.msg);
        s.fwd.comm = &c; /* the all-reduce of every half-layer through NCCL, one rank */
    }
    *vocab = s.desc.vocab_size;
    struct kv_seq ks;
    kv_seq_init(&ks);
    struct kv_seq *seqs[1] = {&ks};
    assert_int_equal(kv_seq_reserve(&ks, &s.kv, PROMPT + STEPS, &err), STATUS_OK);
    int32_t tok[PROMPT] = {1, 17, 42, 99, 7, 300}, pos[PROMPT], seq[PROMPT] = {0}, last = PROMPT - 1, next = 0;
    for (int i = 0; i < PROMPT; i++)
        pos[i] = i;
    struct forward_batch b = {.n_tokens = PROMPT, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 1, .seqs = seqs,
                              .n_logits = 1, .logit_rows = &last, .tokens_out = &next};
    float *tmp = malloc((size_t)*vocab * sizeof(float));
    assert_int_equal(forward_run(&s.fwd, &b, tmp, &err), STATUS_OK);
    for (int t = 0; t < STEPS; t++) {
        int32_t p = PROMPT + t, row = 0, in = next;
        struct forward_batch d = {.n_tokens = 1, .tokens = &in, .pos = &p, .seq = seq, .n_seqs = 1, .seqs = seqs,
                                  .n_logits = 1, .logit_rows = &row, .tokens_out = &next};
        assert_int_equal(forward_run(&s.fwd, &d, out + (size_t)t * (size_t)*vocab, &err), STATUS_OK);
    }
    if (backend_cuda_status(&s.be, &err))
        fail_msg("CUDA or NCCL error: %s", err.msg);
    free(tmp);
    kv_seq_release(&ks, &s.kv);
    model_session_close(&s);
    if (nccl)
        comm_free(&c);
}

static void test_decode_through_nccl(void **state)
{
    (void)state;
    int V = 0;
    float *plain = malloc((size_t)STEPS * 8192 * sizeof(float)), *nccl = malloc((size_t)STEPS * 8192 * sizeof(float));
    decode(false, plain, &V);
    assert_true(V <= 8192);
    decode(true, nccl, &V);
    /* one rank's in-place sum is the buffer itself: the same bits */
    assert_memory_equal(plain, nccl, (size_t)STEPS * (size_t)V * sizeof(float));
    print_message("    %d decode steps (graphs from the second) with NCCL all-reduces: logits identical\n", STEPS);
    free(plain), free(nccl);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    if (backend_cuda_device_count() == 0) {
        printf("test_comm_cuda: no CUDA device found, skipping (needs a GPU)\n");
        return 0;
    }
    uint8_t id[CUDA_NCCL_ID_BYTES];
    struct err err = {0};
    if (cuda_comm_nccl_unique_id(id, &err)) {
        printf("test_comm_cuda: skipping: %s\n", err.msg);
        return 0;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_collectives), cmocka_unit_test(test_decode_through_nccl)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
