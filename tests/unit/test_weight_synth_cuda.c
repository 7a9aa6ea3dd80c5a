/* test_weight_synth_cuda.c — synthetic weights made on the GPU (backend_ops.weight_make, the
 * cuda_weight_synth kernel) are the CPU's weight_synth_fill bytes, bit for bit, for whole tensors
 * and shares (rows and in-features off zero) in BF16, F32 and NVFP4; and `--synthetic tiny` run
 * on CUDA gives the CPU's logits (tolerance of the CUDA goldens: the same weights, two backends).
 * Skips without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "base/log.h"
#include "engine/model_session.h"

static void check_make(struct backend *be, enum weight_format f, int64_t rows, int64_t cols, int64_t row_off,
                       int64_t col_off, int64_t full_cols)
{
    struct weight shape = {.format = f, .rows = rows, .cols = cols, .scale2 = 1.0f}, dev;
    struct weight_synth s = weight_synth_share(0x1234 + (uint64_t)f, row_off, col_off, full_cols);
    struct err err = {0};
    if (be->ops->weight_make(be, &shape, &s, &dev, 0, &err))
        fail_msg("%s", err.msg);
    size_t db = weight_data_bytes(&shape), sb = weight_scale_bytes(&shape);
    uint8_t *want = malloc(db + sb + 1), *got = malloc(db + sb + 1);
    assert_null(weight_synth_fill(&s, &shape, want, want + db));
    be->ops->download(be, got, dev.data, db);
    if (sb)
        be->ops->download(be, got + db, dev.scale, sb);
    assert_memory_equal(want, got, db + sb);
    free(want), free(got);
}

static void test_kernel_is_the_host(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cuda_create(&be, 0, 0, &err), STATUS_OK);
    for (int fi = 0; fi < 3; fi++) {
        enum weight_format f = fi == 0 ? WEIGHT_BF16 : fi == 1 ? WEIGHT_F32 : WEIGHT_NVFP4;
        check_make(&be, f, 300, 512, 0, 0, 512);       /* whole */
        check_make(&be, f, 77, 160, 1000, 96, 2048);   /* a share: rows and in-features off zero */
        check_make(&be, f, 3000, 1024, 0, 0, 1024);    /* more elements than one grid pass */
    }
    assert_int_equal(backend_cuda_status(&be, &err), STATUS_OK);
    backend_destroy(&be);
}

enum { N_TOK = 9 };

static void logits(const char *backend, const char *fmt_bf16, float *out, int *vocab)
{
    struct session_opts so = {.backend = backend, .max_tokens = N_TOK, .max_seqs = 1, .max_context = 64,
                              .synthetic = "tiny", .synthetic_bf16 = fmt_bf16 != NULL};
    struct model_session s;
    struct err err = {0};
    if (model_session_open(&s, NULL, &so, &err))
        fail_msg("%s: %s", backend, err.msg);
    *vocab = s.desc.vocab_size;
    struct kv_seq ks;
    kv_seq_init(&ks);
    struct kv_seq *seqs[1] = {&ks};
    assert_int_equal(kv_seq_reserve(&ks, &s.kv, N_TOK, &err), STATUS_OK);
    int32_t tok[N_TOK] = {1, 17, 42, 99, 7, 300, 5, 1000, 2}, pos[N_TOK], seq[N_TOK] = {0}, rows[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        pos[i] = rows[i] = i;
    struct forward_batch b = {.n_tokens = N_TOK, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 1, .seqs = seqs,
                              .n_logits = N_TOK, .logit_rows = rows};
    assert_int_equal(forward_run(&s.fwd, &b, out, &err), STATUS_OK);
    kv_seq_release(&ks, &s.kv);
    model_session_close(&s);
}

static void test_model_matches_cpu(void **state)
{
    (void)state;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        int V = 0;
        float *cpu = malloc((size_t)N_TOK * 4096 * sizeof(float)), *gpu = malloc((size_t)N_TOK * 4096 * sizeof(float));
        logits("cpu", bf16 ? "bf16" : NULL, cpu, &V);
        assert_true(V <= 4096);
        logits("cuda", bf16 ? "bf16" : NULL, gpu, &V);
        double m = 0, d = 0;
        for (size_t i = 0; i < (size_t)N_TOK * (size_t)V; i++) {
            m = fmax(m, fabs(cpu[i]));
            d = fmax(d, fabs((double)cpu[i] - gpu[i]));
        }
        print_message("    synthetic tiny %s: CUDA vs CPU logits rel %.2e (max |logit| %.2f)\n", bf16 ? "bf16" : "nvfp4",
                      d / m, m);
        assert_true(m > 0.1 && d / m <= 1e-4);
        free(cpu), free(gpu);
    }
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    if (backend_cuda_device_count() == 0) {
        printf("test_weight_synth_cuda: no CUDA device found, skipping (needs a GPU)\n");
        return 0;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_kernel_is_the_host), cmocka_unit_test(test_model_matches_cpu)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
