/* cuda_mla_gemm.c — MLA's absorb and expand (backend_ops.mla_absorb_q / mla_expand_o) as cuBLAS
 * GEMMs batched over the heads, for many tokens (prefill, large decode batches: the plan's rule,
 * plan_mla_proj_gemm()).
 *
 * Per head h, with kv_b_proj's rows [h(nope+v), h(nope+v)+nope) = W_uk_h and the next v = W_uv_h:
 *   absorb: q_abs[t, h, :R] = q[t, h, :nope] W_uk_h,   expand: out[t, h*v + j] = o_lat[t, h, :] . W_uv_h[j, :]
 * kv_b in bf16 (an NVFP4 one expanded into scratch exactly, its global scale as alpha), the
 * activations as bf16 hi + lo (two GEMMs into one fp32 result, within ~1e-5 of fp32 like the
 * linears' cuBLAS path) — where the fp32 kernels of mla/cuda_mla.cu re-read the weights for every
 * tile of 8 tokens on CUDA cores.
 */
#include "backend/cuda/cuda_backend_internal.h"

#include <limits.h>

#include "plan/plan.h"

/* kv_b as bf16 rows: the weight itself, or (NVFP4) its resident copy (cuda_dense_copy.c) or its exact
 * expansion at *s; *alpha its scale. */
static const void *kvb_bf16(struct cuda_backend *c, const struct weight *kv_b, char **s, float *alpha)
{
    *alpha = 1.0f;
    if (kv_b->format == WEIGHT_BF16)
        return kv_b->data;
    *alpha = kv_b->scale2;
    const uint16_t *resident = cuda_dense_copy_find(c, kv_b->data);
    if (resident)
        return resident;
    struct cuda_wdev wd = cuda_wdev_of(kv_b);
    uint16_t *w = (uint16_t *)*s;
    size_t bytes = ((size_t)kv_b->rows * (size_t)kv_b->cols * sizeof(uint16_t) + 255) / 256 * 256;
    *s += bytes;
    *alpha = kv_b->scale2;
    return CHECK(c, cuda_nvfp4_to_bf16(c->stream, &wd, kv_b->rows, kv_b->cols, w)) ? w : NULL;
}

static size_t kvb_scratch(const struct weight *kv_b)
{
    return kv_b->format == WEIGHT_BF16 ? 0
                                       : ((size_t)kv_b->rows * (size_t)kv_b->cols * sizeof(uint16_t) + 255) / 256 * 256;
}

/* C_h = alpha op(A_h) B_h for h < H, B = hi then + lo (column-major views, cuBLAS's). */
static bool gemm_heads(struct cuda_backend *c, cublasOperation_t ta, int m, int n, int k, float alpha, const void *a,
                       int lda, long long sa, const uint16_t *bh, const uint16_t *bl, int ldb, long long sb, float *out,
                       int ldc, long long sc, int H)
{
    const float zero = 0.0f, one = 1.0f;
    return CHECK(c, cublasGemmStridedBatchedEx(c->blas, ta, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16BF, lda, sa, bh,
                                               CUDA_R_16BF, ldb, sb, &zero, out, CUDA_R_32F, ldc, sc, H,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)) &&
           CHECK(c, cublasGemmStridedBatchedEx(c->blas, ta, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16BF, lda, sa, bl,
                                               CUDA_R_16BF, ldb, sb, &one, out, CUDA_R_32F, ldc, sc, H,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

bool cuda_mla_absorb_gemm(struct cuda_backend *c, const struct weight *kv_b, const struct mla_dims *md, const float *q,
                          int T, float *q_abs)
{
    const int H = md->n_heads, nope = md->nope, rope = md->rope, R = md->kv_rank, qd = nope + rope, ad = R + rope;
    size_t qn = (size_t)T * (size_t)H * (size_t)qd, qb = (qn * 2 * sizeof(uint16_t) + 255) / 256 * 256;
    char *s = cuda_scratch_get(c, kvb_scratch(kv_b) + qb);
    if (!s)
        return true; /* the scratch error is recorded */
    float alpha;
    const uint16_t *w = kvb_bf16(c, kv_b, &s, &alpha);
    uint16_t *qh = (uint16_t *)s, *ql = qh + qn;
    if (!w || !CHECK(c, cuda_f32_to_bf16_split(c->stream, q, qh, ql, qn)))
        return true;
    /* column-major: q_abs_h^T (R x T) = W_uk_h^T (R x nope, W_uk_h row-major) . q_h^T (nope x T) */
    if (!gemm_heads(c, CUBLAS_OP_N, R, T, nope, alpha, w, R, (long long)(nope + md->v) * R, qh, ql, H * qd, qd, q_abs,
                    H * ad, ad, H))
        return true;
    if (rope > 0) /* the rope dims pass through */
        CHECK(c, cudaMemcpy2DAsync(q_abs + R, (size_t)ad * sizeof(float), q + nope, (size_t)qd * sizeof(float),
                                   (size_t)rope * sizeof(float), (size_t)T * (size_t)H, cudaMemcpyDeviceToDevice,
                                   c->stream));
    return true;
}

bool cuda_mla_expand_gemm(struct cuda_backend *c, const struct weight *kv_b, const struct mla_dims *md,
                          const float *o_lat, int T, float *out)
{
    const int H = md->n_heads, nope = md->nope, V = md->v, R = md->kv_rank;
    size_t on = (size_t)T * (size_t)H * (size_t)R, ob = (on * 2 * sizeof(uint16_t) + 255) / 256 * 256;
    char *s = cuda_scratch_get(c, kvb_scratch(kv_b) + ob);
    if (!s)
        return true;
    float alpha;
    const uint16_t *w = kvb_bf16(c, kv_b, &s, &alpha);
    uint16_t *oh = (uint16_t *)s, *ol = oh + on;
    if (!w || !CHECK(c, cuda_f32_to_bf16_split(c->stream, o_lat, oh, ol, on)))
        return true;
    /* column-major: out_h^T (V x T) = W_uv_h (V x R; row-major R-wide rows: op T) . o_lat_h^T (R x T) */
    gemm_heads(c, CUBLAS_OP_T, V, T, R, alpha, w + (size_t)nope * (size_t)R, R, (long long)(nope + V) * R, oh, ol,
               H * R, R, out, H * V, V, H);
    return true;
}
