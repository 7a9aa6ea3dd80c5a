/* test_ops_gemm_cuda.c — the linears: the plan's kernels for every format and row count, the GEMVs of 1-8 rows, the NVFP4 -> bf16 copy bit for bit, the Hopper wgmma GEMM direct and through linear / moe_experts, on the CUDA backend against the CPU reference (ops_cuda_common.h). */
#include "ops_cuda_common.h"

#include "backend/cuda/common/common.h"

/* ---------------------------------------------------------------- linear */


static void test_linear(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 19;
    enum weight_format fmts[] = {WEIGHT_F32, WEIGHT_BF16, WEIGHT_F16, WEIGHT_FP8_BLOCK, WEIGHT_NVFP4};
    /* shapes: aligned; fp8 blocks cut at 128 (N = 200, K = 48 + 256); K % 8 != 0 (scalar loads) */
    struct {
        int64_t N, K;
    } shapes[] = {{96, 64}, {200, 304}, {77, 40}, {130, 37}, {130, 1056}};
    int ms[] = {1, 3, 8, 9, 40, 130};
    for (size_t f = 0; f < 5; f++)
        for (size_t s = 0; s < 5; s++) {
            if (fmts[f] == WEIGHT_NVFP4 && shapes[s].K % 16)
                continue;
            for (size_t i = 0; i < 6; i++)
                run_linear(p, fmts[f], shapes[s].N, shapes[s].K, ms[i], (i + s) % 2 == 0, &rng);
        }
    /* NVFP4 above 8 rows: by default the weight expanded to bf16 for cuBLAS (cublas_dequant_bf16);
     * then, forced (MOESERVE_CUDA_FORCE's way), our GEMMs dequantising in registers; with and
     * without a bias, and at Qwen3-30B-A3B's q width */
    for (int off = 0; off < 2; off++) {
        if (off)
            force_own_gemms(p);
        for (size_t s = 0; s < 5; s++)
            if (shapes[s].K % 16 == 0)
                for (size_t i = 3; i < 6; i++)
                    run_linear(p, WEIGHT_NVFP4, shapes[s].N, shapes[s].K, ms[i], (i + s) % 2 == 0, &rng);
        if (!getenv("MOESERVE_OPS_QUICK")) /* not under compute-sanitizer: minutes there */
            run_linear(p, WEIGHT_NVFP4, 4096, 2048, 64, false, &rng);
    }
    force(p, NULL);
    if (getenv("MOESERVE_OPS_NO_CUBLAS"))
        force_own_gemms(p);
}

/* ---------------------------------------------------------------- fused decode ops */

static void test_linear_multi(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 21;
    enum weight_format fmts[] = {WEIGHT_F32, WEIGHT_BF16, WEIGHT_F16, WEIGHT_FP8_BLOCK, WEIGHT_NVFP4};
    int64_t K = 512, N[3] = {256, 64, 72};
    /* NVFP4 up to 8 rows: the tokens share cuda_gemv_mma's mma; 13 and 24: the GEMMs, as for the
     * other formats */
    int ms[] = {1, 2, 5, 8, 13, 24};
    {
        for (size_t f = 0; f < 5; f++)
            for (size_t mi = 0; mi < 6u; mi++) {
                int m = ms[mi];
                struct test_weight t[3];
                const struct weight *hw[3], *dw[3];
                float *want[3], *dy[3];
                float *x = rand_floats((size_t)m * K, 1.0f, &rng),
                      *dx = dev_copy(&p->gpu, x, (size_t)m * K * 4);
                for (int j = 0; j < 3; j++) {
                    weight_make(&t[j], p, fmts[f], N[j], K, j == 1, &rng);
                    hw[j] = &t[j].src.w, dw[j] = &t[j].dev;
                    want[j] = malloc((size_t)m * N[j] * 4);
                    p->cpu.ops->linear(&p->cpu, hw[j], x, m, want[j]);
                    dy[j] = dev_nan(&p->gpu, (size_t)m * N[j]);
                }
                p->gpu.ops->linear_multi(&p->gpu, 3, dw, dx, m, dy);
                gpu_ok(&p->gpu);
                for (int j = 0; j < 3; j++) {
                    float *got = fetch(&p->gpu, dy[j], (size_t)m * N[j]);
                    char what[128];
                    snprintf(what, sizeof what, "linear_multi %s m=%d weight %d", weight_format_name(fmts[f]),
                             m, j);
                    check_close(what, got, want[j], (size_t)m * N[j],
                                fmts[f] == WEIGHT_BF16 ? TOL_BF16 : TOL_F32);
                    free(got), free(want[j]);
                    p->gpu.ops->free(&p->gpu, dy[j]);
                    weight_free(&t[j], p);
                }
                free(x);
                p->gpu.ops->free(&p->gpu, dx);
            }
    }
}

/* NVFP4 linears of 1..8 rows through cuda_gemv_mma (the rows share each mma): linear_multi
 * against the CPU's linear at Qwen3-30B-A3B's q/k/v and o widths and at widths that leave partial
 * row tiles; then with the portable GEMM forced at 2-8 rows. */
static void test_gemv_mma_tokens(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 47;
    /* and GLM-5's o_proj (K 16384: four K slices a block), q_a + kv_a + wk (K 6144) and q_b (K 2048,
     * 16384 rows), the odd widths at K 16384 */
    const int64_t qkv[3] = {4096, 512, 512}, o[1] = {2048}, odd[3] = {1000, 3, 77};
    const int64_t glm_o[1] = {6144}, glm_qa[3] = {2048, 576, 128}, glm_qb[1] = {16384};
    struct {
        int n_w;
        const int64_t *N;
        int64_t K;
        int m;
    } cs[] = {{3, qkv, 2048, 1}, {1, o, 4096, 1}, {3, odd, 768, 1}, {3, qkv, 2048, 2}, {3, qkv, 2048, 8}, {1, o, 4096, 3}, {1, o, 4096, 8}, {3, odd, 768, 5}, {3, odd, 256, 7},
              {1, glm_o, 16384, 1}, {1, glm_o, 16384, 3}, {3, glm_qa, 6144, 1}, {3, glm_qa, 6144, 2},
              {1, glm_qb, 2048, 1}, {3, odd, 16384, 2}};
    for (int tokens = 8; tokens >= 1; tokens -= 7) {
        if (tokens == 1)
            force(p, "linear@2-8:gemm_nvfp4_wo_fp32");
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            const int n_w = cs[c].n_w, m = cs[c].m;
            const int64_t K = cs[c].K;
            struct test_weight t[3];
            const struct weight *dw[3];
            float *want[3], *dy[3];
            float *x = rand_floats((size_t)m * K, 1.0f, &rng), *dx = dev_copy(&p->gpu, x, (size_t)m * K * 4);
            for (int j = 0; j < n_w; j++) {
                weight_make(&t[j], p, WEIGHT_NVFP4, cs[c].N[j], K, j == 1, &rng);
                dw[j] = &t[j].dev;
                want[j] = malloc((size_t)m * cs[c].N[j] * 4);
                p->cpu.ops->linear(&p->cpu, &t[j].src.w, x, m, want[j]);
                dy[j] = dev_nan(&p->gpu, (size_t)m * cs[c].N[j]);
            }
            p->gpu.ops->linear_multi(&p->gpu, n_w, dw, dx, m, dy);
            gpu_ok(&p->gpu);
            double worst = 0;
            char what[128];
            for (int j = 0; j < n_w; j++) {
                float *got = fetch(&p->gpu, dy[j], (size_t)m * cs[c].N[j]);
                snprintf(what, sizeof what, "nvfp4 linear_multi m=%d N=%lld K=%lld (tokens %d) weight %d", m,
                         (long long)cs[c].N[j], (long long)K, tokens, j);
                double e = check_close(what, got, want[j], (size_t)m * cs[c].N[j], TOL_F32);
                worst = e > worst ? e : worst;
                free(got), free(want[j]);
                p->gpu.ops->free(&p->gpu, dy[j]);
                weight_free(&t[j], p);
            }
            print_message("    %-64s rel err %.2e\n", what, worst);
            free(x);
            p->gpu.ops->free(&p->gpu, dx);
        }
    }
    force(p, NULL);
    if (getenv("MOESERVE_OPS_NO_CUBLAS"))
        force_own_gemms(p);
}

/* A dense NVFP4 weight (loaded as WEIGHT_LOAD_DENSE) keeps a resident bf16 copy within the budget
 * (cuda_dense_copy.c); the 9+-row linears then run cuBLAS on it: against the CPU at every bucket
 * past 8 rows, with and without bias; a second weight past the budget stays per call. */
static void test_dense_copies(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 59;
    const int64_t N = 200, K = 512;
    const struct kernel_shape sh = {.format = WEIGHT_NVFP4, .tokens = 64, .n_weights = 1, .n = N, .k = K};
    const struct kernel_desc *k = plan_dispatch_pick(backend_cuda_plan(&p->gpu), PLAN_OP_LINEAR, &sh);
    if (!k || k->id != CK_CUBLAS_DEQUANT)
        skip();
    const size_t before = backend_cuda_dense_copy_bytes(&p->gpu), one = (size_t)N * K * 2;
    backend_cuda_set_dense_copy_budget(&p->gpu, before + one);
    struct test_weight t[2];
    for (int i = 0; i < 2; i++)
        weight_make_as(&t[i], p, WEIGHT_NVFP4, N, K, i == 0, WEIGHT_LOAD_DENSE, &rng);
    assert_int_equal(backend_cuda_dense_copy_bytes(&p->gpu), before + one); /* the first only */
    const int ms[] = {9, 40, 130};
    for (int i = 0; i < 2; i++)
        for (int mi = 0; mi < 3; mi++) {
            const int m = ms[mi];
            float *x = rand_floats((size_t)m * K, 1.0f, &rng), *want = malloc((size_t)m * N * 4);
            p->cpu.ops->linear(&p->cpu, &t[i].src.w, x, m, want);
            float *dx = dev_copy(&p->gpu, x, (size_t)m * K * 4), *dy = dev_nan(&p->gpu, (size_t)m * N);
            p->gpu.ops->linear(&p->gpu, &t[i].dev, dx, m, dy);
            gpu_ok(&p->gpu);
            float *got = fetch(&p->gpu, dy, (size_t)m * N);
            char what[96];
            snprintf(what, sizeof what, "linear nvfp4 %s m=%d", i ? "per-call copy" : "resident copy", m);
            check_close(what, got, want, (size_t)m * N, TOL_BF16);
            free(got), free(x), free(want);
            p->gpu.ops->free(&p->gpu, dx), p->gpu.ops->free(&p->gpu, dy);
        }
    for (int i = 0; i < 2; i++)
        weight_free(&t[i], p);
    backend_cuda_set_dense_copy_budget(&p->gpu, 0);
}

/* ---------------------------------------------------------------- NVFP4 -> bf16 */

/* cuda_nvfp4_to_bf16 (cuBLAS's bf16 copy of an NVFP4 weight) against E2M1 x E4M3 on the CPU, bit
 * for bit: every nibble, every finite scale byte (subnormals and zero included); sizes that end
 * inside a block's span, pointers off 16-byte alignment. */
static void dequant_case(struct pair *p, int64_t N, int64_t K, size_t data_off, size_t scale_off,
                         uint64_t *rng)
{
    const size_t n = (size_t)N * (size_t)K, data_b = n / 2, scale_b = n / 16;
    uint8_t *data = malloc(data_b), *scale = malloc(scale_b);
    for (size_t i = 0; i < data_b; i++)
        data[i] = (uint8_t)rng_next(rng);
    for (size_t i = 0; i < scale_b; i++) { /* every scale byte but the two NaNs (S.1111.111) */
        uint8_t b = (uint8_t)(i < 256 ? i : rng_next(rng));
        scale[i] = (b & 0x7f) == 0x7f ? (uint8_t)(b - 1) : b;
    }
    char *d_data = p->gpu.ops->alloc(&p->gpu, data_b + 16),
         *d_scale = p->gpu.ops->alloc(&p->gpu, scale_b + 16);
    uint16_t *d_out = p->gpu.ops->alloc(&p->gpu, n * 2);
    assert_non_null(d_data);
    assert_non_null(d_scale);
    assert_non_null(d_out);
    p->gpu.ops->upload(&p->gpu, d_data + data_off, data, data_b);
    p->gpu.ops->upload(&p->gpu, d_scale + scale_off, scale, scale_b);
    struct cuda_wdev w = {.data = d_data + data_off, .scale = d_scale + scale_off, .scale2 = 1.0f};
    assert_int_equal(cuda_nvfp4_to_bf16(0, &w, N, K, d_out), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    uint16_t *got = malloc(n * 2);
    p->gpu.ops->download(&p->gpu, got, d_out, n * 2);
    for (size_t i = 0; i < n; i++) {
        const uint8_t code = (uint8_t)(data[i / 2] >> (4 * (i % 2)) & 15u);
        const uint16_t want = f32_to_bf16(e2m1_to_f32(code) * e4m3_to_f32(scale[i / 16]));
        if (got[i] != want)
            fail_msg("nvfp4_to_bf16 %lld x %lld (data +%zu, scale +%zu): weight %zu (code %u, scale 0x%02x) "
                     "is 0x%04x, want 0x%04x",
                     (long long)N, (long long)K, data_off, scale_off, i, code, scale[i / 16], got[i], want);
    }
    free(got);
    free(data);
    free(scale);
    p->gpu.ops->free(&p->gpu, d_data);
    p->gpu.ops->free(&p->gpu, d_scale);
    p->gpu.ops->free(&p->gpu, d_out);
}

static void test_nvfp4_to_bf16(void **state)
{
    struct pair *p = *state;
    uint64_t rng = 23;
    dequant_case(p, 3, 16, 0, 0, &rng);     /* 6 words */
    dequant_case(p, 64, 2048, 0, 0, &rng);  /* 8192 scales: every byte many times */
    dequant_case(p, 130, 1056, 0, 0, &rng); /* a block's words across rows, a part block last */
    dequant_case(p, 64, 2048, 4, 0, &rng);  /* data 4 bytes off 16-byte alignment */
    dequant_case(p, 64, 2048, 0, 1, &rng);  /* scales at an odd address */
}

#include "ops_cuda_wgmma.inc" /* the Hopper wgmma GEMM, direct and through linear / moe_experts */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),          cmocka_unit_test(test_linear_multi),
        cmocka_unit_test(test_gemv_mma_tokens), cmocka_unit_test(test_nvfp4_to_bf16),
        cmocka_unit_test(test_dense_copies),    cmocka_unit_test(test_wgmma_gemm),
    };
    return ops_cuda_main("test_ops_gemm_cuda", tests, sizeof tests / sizeof tests[0]);
}
