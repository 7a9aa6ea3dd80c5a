/* test_ops_attention_cuda.c — attention: the portable and split decode kernels over a paged cache, the tensor-core prefill kernel and its tile fit, on the CUDA backend against the CPU reference (ops_cuda_common.h). */
#include "ops_cuda_common.h"

/* ---------------------------------------------------------------- attention */

struct attn_case {
    const char *name;
    int n_heads, n_kv, hd;
    int n_seqs;
    int len[6];   /* keys each sequence has after this step */
    int fresh[6]; /* its last `fresh` positions are the batch's query tokens */
    bool shuffle; /* batch rows in random order (sequences interleaved) */
};

static void run_attention_case(struct pair *p, const struct attn_case *ac, uint64_t *rng)
{
    const int bs = 16;
    int max_blocks = 0, n_blocks = 0, T = 0;
    for (int s = 0; s < ac->n_seqs; s++) {
        int b = (ac->len[s] + bs - 1) / bs;
        max_blocks = b > max_blocks ? b : max_blocks;
        n_blocks += b;
        T += ac->fresh[s];
    }
    n_blocks += 3; /* unused blocks in the pool */
    /* a scattered block table: a random permutation of the pool */
    int32_t *perm = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *table = calloc((size_t)ac->n_seqs * (size_t)max_blocks, 4);
    int used = 0;
    for (int s = 0; s < ac->n_seqs; s++)
        for (int b = 0; b < (ac->len[s] + bs - 1) / bs; b++)
            table[s * max_blocks + b] = perm[used++];
    int32_t *pos = malloc((size_t)T * 4), *seq = malloc((size_t)T * 4);
    int t = 0;
    for (int s = 0; s < ac->n_seqs; s++)
        for (int i = ac->len[s] - ac->fresh[s]; i < ac->len[s]; i++, t++) {
            pos[t] = i;
            seq[t] = s;
        }
    if (ac->shuffle)
        for (int i = T - 1; i > 0; i--) {
            int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
            int32_t a = pos[i], b = seq[i];
            pos[i] = pos[j], seq[i] = seq[j];
            pos[j] = a, seq[j] = b;
        }
    size_t row = (size_t)ac->n_kv * (size_t)ac->hd, cache = (size_t)n_blocks * bs * row;
    size_t qn = (size_t)T * (size_t)ac->n_heads * (size_t)ac->hd;
    float *kc = rand_floats(cache, 1.0f, rng), *vc = rand_floats(cache, 1.0f, rng),
          *q = rand_floats(qn, 1.0f, rng);
    float scale = 1.0f / sqrtf((float)ac->hd);
    struct paged_kv hkv = {.k = kc, .v = vc, .block_size = bs, .n_kv_heads = ac->n_kv, .head_dim = ac->hd};
    struct attn_batch hb = {
        .n_tokens = T, .pos = pos, .seq = seq, .block_table = table, .max_blocks = max_blocks};
    float *want = malloc(qn * 4);
    p->cpu.ops->attention(&p->cpu, q, &hkv, &hb, ac->n_heads, scale, want);

    struct paged_kv dkv = hkv;
    dkv.k = dev_copy(&p->gpu, kc, cache * 4);
    dkv.v = dev_copy(&p->gpu, vc, cache * 4);
    struct attn_batch db = hb;
    db.pos = dev_copy(&p->gpu, pos, (size_t)T * 4);
    db.seq = dev_copy(&p->gpu, seq, (size_t)T * 4);
    db.block_table = dev_copy(&p->gpu, table, (size_t)ac->n_seqs * (size_t)max_blocks * 4);
    float *dq = dev_copy(&p->gpu, q, qn * 4);
    /* mode 5: 7 splits through the older split kernel + merge kernel pair; 6: 64 splits merged
     * through global memory where the default (auto, 64) merges in clusters of 8 (caps
     * "clusters"; 700 keys in 22 splits: three clusters, then their leaders), pushing their
     * partials into the leader; 7 and 8: the leader pulls them */
    int modes[] = {0, -1, 2, 7, 64, 7, 64, 0, 64};
    const char *mode_names[] = {"auto",
                                "unsplit",
                                "2 splits",
                                "7 splits",
                                "64 splits",
                                "7 splits, older kernels",
                                "64 splits, no clusters",
                                "auto, clusters pulled",
                                "64 splits, clusters pulled"};
    for (int m = 0; m < 9; m++) {
        backend_cuda_set_attention_splits(&p->gpu, modes[m]);
        backend_cuda_set_legacy_decode(&p->gpu, m == 5);
        backend_cuda_set_attn_cluster(&p->gpu, m != 6);
        backend_cuda_set_attn_push(&p->gpu, m < 7);
        float *dout = dev_nan(&p->gpu, qn);
        p->gpu.ops->attention(&p->gpu, dq, &dkv, &db, ac->n_heads, scale, dout);
        gpu_ok(&p->gpu);
        float *got = fetch(&p->gpu, dout, qn);
        char what[128];
        snprintf(what, sizeof what, "attention %s (%s)", ac->name, mode_names[m]);
        double e = check_close(what, got, want, qn, TOL_F32);
        print_message("    %-48s rel err %.2e\n", what, e);
        free(got);
        p->gpu.ops->free(&p->gpu, dout);
    }
    backend_cuda_set_attention_splits(&p->gpu, 0);
    backend_cuda_set_legacy_decode(&p->gpu, false);
    backend_cuda_set_attn_cluster(&p->gpu, true);
    backend_cuda_set_attn_push(&p->gpu, true);
    p->gpu.ops->free(&p->gpu, dkv.k), p->gpu.ops->free(&p->gpu, dkv.v);
    p->gpu.ops->free(&p->gpu, (void *)db.pos), p->gpu.ops->free(&p->gpu, (void *)db.seq);
    p->gpu.ops->free(&p->gpu, (void *)db.block_table), p->gpu.ops->free(&p->gpu, dq);
    free(kc), free(vc), free(q), free(want), free(pos), free(seq), free(table), free(perm);
}

static void test_attention(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 17;
    static const struct attn_case cases[] = {
        {"hd64 gqa4 chunked prefill", 8, 2, 64, 4, {1, 17, 40, 100}, {1, 17, 9, 100}, false},
        {"hd128 gqa8 prefill+decode", 16, 2, 128, 3, {300, 33, 16}, {300, 1, 16}, false},
        {"hd128 mha decode", 4, 4, 128, 2, {50, 129}, {1, 1}, false},
        {"hd64 gqa8 decode 5 seqs", 8, 1, 64, 5, {1, 15, 16, 17, 700}, {1, 1, 1, 1, 1}, false},
        {"hd24 gqa6 interleaved rows", 6, 1, 24, 2, {37, 10}, {37, 10}, true},
        {"hd128 gqa2 mixed, shuffled", 8, 4, 128, 3, {64, 200, 5}, {1, 64, 5}, true},
        {"hd128 gqa8 large prefill", 32, 4, 128, 2, {512, 384}, {512, 384}, false},
    };
    size_t n = sizeof cases / sizeof cases[0];
    if (getenv("MOESERVE_OPS_QUICK"))
        n--; /* under compute-sanitizer: the large prefill would take minutes */
    for (size_t c = 0; c < n; c++)
        run_attention_case(p, &cases[c], &rng);
}

#include "ops_cuda_attn_mma.inc" /* the tensor-core prefill attention, its tile fit */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_mma),
    };
    return ops_cuda_main("test_ops_attention_cuda", tests, sizeof tests / sizeof tests[0]);
}
