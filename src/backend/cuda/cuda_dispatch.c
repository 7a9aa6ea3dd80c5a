/* cuda_dispatch.c — the linears, the routed experts and the routing run the first kernel of the
 * plan's dispatch list (plan_dispatch_for) whose limits and launcher take the call; nothing here
 * chooses otherwise (see cuda_backend_internal.h). */
#include "backend/cuda/cuda_backend_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_registry.h"
#include "backend/cuda/decode/cuda_decode_limits.h"
#include "base/log.h"

/* The planned tile, or a shorter one when there are fewer rows than it has. */
static enum cuda_gemm_tile tile_for_rows(enum cuda_gemm_tile planned, double rows)
{
    if (rows <= 16)
        return CUDA_GEMM_16x64;
    if (rows <= 32 && planned == CUDA_GEMM_64x64)
        return CUDA_GEMM_32x64;
    return planned;
}

/* The planned wgmma tile fitted to one GEMM (rows: its rows, or rows per expert), or false when
 * the kernel cannot take these operands. */
static bool wgmma_fit(const struct cuda_backend *c, const struct cuda_wgmma_tile *planned, enum weight_format fmt,
                      int64_t K, const float *x, double rows, struct cuda_wgmma_tile *t)
{
    if (!cuda_gemm_wgmma_supported(fmt, K, x))
        return false;
    *t = *planned;
    return cuda_gemm_wgmma_fit(t, fmt, K, rows, c->smem_budget);
}

/* *img: x (rows x K) pre-split for tile t in the scratch buffer (the wgmma GEMMs then copy it as
 * it is), or NULL: no scratch (a capture that must grow it is spoiled by cuda_scratch_get and rerun
 * directly); NULL makes the GEMM split x in every block. False when the split failed (recorded). */
static bool wg_image_make(struct cuda_backend *c, const float *x, int64_t rows, int64_t K,
                          const struct cuda_wgmma_tile *t, void **img)
{
    *img = cuda_scratch_get(c, cuda_gemm_wgmma_image_bytes(rows, K, t));
    return !*img || CHECK(c, cuda_gemm_wgmma_image(c->stream, x, rows, K, t, *img));
}

struct cuda_wdev cuda_wdev_of(const struct weight *w)
{
    return (struct cuda_wdev){.data = w->data, .scale = w->scale, .bias = w->bias, .scale2 = w->scale2};
}


/* Scratch bytes of linear_cublas_bf16 for m rows of K into N. */
static size_t cublas_split_bytes(int m, int N, int K)
{
    size_t xn = (size_t)m * (size_t)K;
    return (2 * xn * sizeof(uint16_t) + 255) / 256 * 256 + 2 * (size_t)m * (size_t)N * sizeof(float);
}

/* y = alpha x W^T (+ bias) through cuBLAS for a bf16 W (N x K, row-major, at wdata), s: scratch of
 * cublas_split_bytes(). x = hi + lo (two bf16 rows per activation row): one GEMM over 2m columns
 * reads W once, and y = W hi + W lo is within ~1e-5 of the fp32 product (bf16 alone: ~1e-2). */
static void linear_cublas_bf16(struct cuda_backend *c, const void *wdata, float alpha, const float *bias,
                               const float *x, int m, int N, int K, float *y, char *s)
{
    const float zero = 0.0f;
    size_t xn = (size_t)m * (size_t)K, x_bytes = (2 * xn * sizeof(uint16_t) + 255) / 256 * 256;
    uint16_t *xb = (uint16_t *)s;
    float *y2 = (float *)(s + x_bytes); /* (2m, N): W hi rows, then W lo rows */
    ASSERT(2 * (int64_t)m <= INT_MAX);
    if (!CHECK(c, cuda_f32_to_bf16_split(c->stream, x, xb, xb + xn, xn)))
        return;
    /* column-major view: Y^T (N x 2m) = W (K x N)^T . X^T (K x 2m) */
    if (!CHECK(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, 2 * m, K, &alpha, wdata, CUDA_R_16BF, K,
                               xb, CUDA_R_16BF, K, &zero, y2, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT)))
        return;
    CHECK(c, cuda_sum_halves(c->stream, y2, y2 + (size_t)m * (size_t)N, bias, m, N, y));
}

/* The linears' call record, as the launchers get it (cuda_launch.h): ws[0 .. n_w) of one format
 * and width sharing x, weights' device views and rows beside them. */
struct linear_call {
    int n_w;
    const struct weight *const *ws;
    const float *x;
    int m;
    float *const *ys;
    struct cuda_wdev wd[3];
    int64_t N[3];
    int K;
    enum weight_format fmt;
};

/* The launchers below (the kernel table's kernel_desc.launch): each launches its kernel on the call,
 * one launch for the GEMVs and a weight at a time otherwise, or returns false, having launched
 * nothing, where its launcher does not take these pointers (alignment, a tile that does not fit):
 * the caller tries the plan's next kernel. */
bool cuda_launch_gemv_mma(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct linear_call *l = call;
    if (!cuda_gemv_mma_supported(l->n_w, l->wd, l->K, l->m, c->smem_budget) || !aligned16(l->x))
        return false;
    CHECK(c, cuda_gemv_mma(c->stream, l->n_w, l->wd, l->N, l->K, l->x, l->m, l->ys, c->sm_count, c->pdl));
    return true;
}

bool cuda_launch_gemv1(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct linear_call *l = call;
    if (!cuda_gemv1_supported(l->fmt, l->K, l->x, c->smem_budget))
        return false;
    CHECK(c, cuda_gemv1(c->stream, l->fmt, l->n_w, l->wd, l->N, l->K, l->x, l->ys, c->pdl));
    return true;
}

bool cuda_launch_gemm_wgmma(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct linear_call *l = call;
    struct cuda_wgmma_tile wt;
    if (!wgmma_fit(c, &c->wg_linear, l->fmt, l->K, l->x, l->m, &wt))
        return false;
    for (int j = 0; j < l->n_w; j++) {
        void *img;
        if (wg_image_make(c, l->x, l->m, l->K, &wt, &img))
            CHECK(c, cuda_gemm_wgmma(c->stream, l->fmt, &l->wd[j], l->N[j], l->K, l->x, l->m, l->ys[j], &wt, img));
    }
    return true;
}

bool cuda_launch_gemm_mma(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct linear_call *l = call;
    if (!cuda_gemm_mma_supported(l->fmt, l->K, l->x))
        return false;
    for (int j = 0; j < l->n_w; j++)
        CHECK(c, cuda_gemm_mma(c->stream, l->fmt, &l->wd[j], l->N[j], l->K, l->x, l->m, l->ys[j],
                               cuda_gemm_tile_rows(tile_for_rows(c->tile_linear, l->m))));
    return true;
}

bool cuda_launch_gemm_fp32(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct linear_call *l = call;
    for (int j = 0; j < l->n_w; j++) /* the bias is added in the kernels' epilogue */
        CHECK(c, cuda_gemm(c->stream, l->fmt, &l->wd[j], l->N[j], l->K, l->x, l->m, l->ys[j],
                           tile_for_rows(c->tile_linear, l->m)));
    return true;
}

bool cuda_launch_cublas_sgemm(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct linear_call *l = call;
    const float one = 1.0f, zero = 0.0f;
    for (int j = 0; j < l->n_w; j++) {
        const int Nj = (int)l->N[j];
        if (CHECK(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, Nj, l->m, l->K, &one, l->ws[j]->data, l->K, l->x,
                                 l->K, &zero, l->ys[j], Nj)) &&
            l->ws[j]->bias)
            CHECK(c, cuda_bias_add(c->stream, l->ys[j], l->ws[j]->bias, l->m, Nj));
    }
    return true;
}

bool cuda_launch_cublas_bf16(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct linear_call *l = call;
    for (int j = 0; j < l->n_w; j++) {
        char *s = cuda_scratch_get(c, cublas_split_bytes(l->m, (int)l->N[j], l->K));
        if (s)
            linear_cublas_bf16(c, l->ws[j]->data, 1.0f, l->ws[j]->bias, l->x, l->m, (int)l->N[j], l->K, l->ys[j], s);
    }
    return true;
}

/* the weight's resident bf16 copy (cuda_dense_copy.c), else the weight expanded to bf16 in scratch
 * (exact; its global scale as the GEMM's alpha), then cuBLAS as for a bf16 weight */
bool cuda_launch_cublas_dequant(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct linear_call *l = call;
    for (int j = 0; j < l->n_w; j++) {
        const int Nj = (int)l->N[j];
        const uint16_t *resident = cuda_dense_copy_find(c, l->ws[j]->data);
        if (resident) {
            char *s = cuda_scratch_get(c, cublas_split_bytes(l->m, Nj, l->K));
            if (s)
                linear_cublas_bf16(c, resident, l->ws[j]->scale2, l->ws[j]->bias, l->x, l->m, Nj, l->K,
                                   l->ys[j], s);
            continue;
        }
        size_t w_bytes = ((size_t)Nj * (size_t)l->K * sizeof(uint16_t) + 255) / 256 * 256;
        char *s = cuda_scratch_get(c, w_bytes + cublas_split_bytes(l->m, Nj, l->K));
        if (s && CHECK(c, cuda_nvfp4_to_bf16(c->stream, &l->wd[j], Nj, l->K, (uint16_t *)s)))
            linear_cublas_bf16(c, s, l->ws[j]->scale2, l->ws[j]->bias, l->x, l->m, Nj, l->K, l->ys[j], s + w_bytes);
    }
    return true;
}

/* ws[0 .. n_w) (one format and width, sharing x) through the first kernel of the plan's list for
 * this token count and format that takes the call (plan_dispatch_pick's rule, then the launcher's
 * pointer checks). */
static void linear_run(struct cuda_backend *c, int n_w, const struct weight *const *ws, const float *x, int m,
                       float *const *ys)
{
    ASSERT(n_w >= 1 && n_w <= 3 && ws[0]->rows <= INT_MAX && ws[0]->cols <= INT_MAX);
    struct kernel_shape sh = {.format = ws[0]->format, .tokens = m, .n_weights = n_w, .n = 0, .k = ws[0]->cols};
    for (int j = 0; j < n_w; j++)
        sh.n = ws[j]->rows > sh.n ? ws[j]->rows : sh.n;
    struct linear_call call = {.n_w = n_w, .ws = ws, .x = x, .m = m, .ys = ys, .K = (int)ws[0]->cols,
                               .fmt = ws[0]->format};
    for (int j = 0; j < n_w; j++)
        call.wd[j] = cuda_wdev_of(ws[j]), call.N[j] = ws[j]->rows;
    const struct plan_dispatch *d = plan_dispatch_for(&c->plan, PLAN_OP_LINEAR, m, sh.format);
    for (int i = 0; i < d->n; i++) {
        const struct kernel_desc *k = d->kernels[i];
        if ((!k->fits || k->fits(&sh, c->smem_budget)) && k->launch && k->launch(c, &call))
            return;
    }
    PANIC("cuda: no kernel of the plan takes a %s linear of %d rows, K %lld", weight_format_name(sh.format), m,
          (long long)sh.k);
}

void cu_linear(struct backend *be, const struct weight *w, const float *x, int m, float *y)
{
    if (m > 0)
        linear_run(cuda_ctx(be), 1, &w, x, m, &y);
}

void cu_linear_multi(struct backend *be, int n_w, const struct weight *const *ws, const float *x, int m,
                            float *const *ys)
{
    if (m <= 0)
        return;
    bool same = true;
    for (int j = 1; j < n_w; j++)
        same &= ws[j]->format == ws[0]->format && ws[j]->cols == ws[0]->cols;
    if (same) {
        linear_run(cuda_ctx(be), n_w, ws, x, m, ys);
        return;
    }
    for (int j = 0; j < n_w; j++)
        linear_run(cuda_ctx(be), 1, &ws[j], x, m, &ys[j]);
}

/* The down kernel's 8-row tiles a warp of the shared-memory MoE form takes (0: not that form):
 * two where one tile a warp would give more blocks than SMs, so that the down kernel's whole grid
 * can be resident beside gate/up's; one where two do not fit the budget. Its cp.async copies
 * need every expert's data 16-byte and scales 8-byte aligned (c->tmp: the table just built). */
static int moe_smem_tpw(const struct cuda_backend *c, const struct moe_args *a, int n_tokens, int n_table)
{
    if (!c->moe_smem_min || n_tokens < c->moe_smem_min)
        return 0;
    for (int e = 0; e < 3 * n_table; e++)
        if ((uintptr_t)c->tmp[e].data % 16 || (uintptr_t)c->tmp[e].scale % 8)
            return 0;
    return cuda_moe_decode_mma_smem_tpw(a->d_model, a->d_expert, a->n_used, c->sm_count, c->smem_budget);
}

/* The sorted path with the GEMM kernel k: sort the (token, slot) pairs by expert into row tiles
 * of the GEMM's height, gate/up, SiLU, down, combine. False, having launched nothing, when k's
 * launcher does not take these operands (a wgmma tile that does not fit both GEMMs, misaligned
 * x): the caller tries the plan's next kernel. */
/* The routed experts' call record, as the launchers get it (cuda_launch.h). */
struct moe_call {
    const struct cuda_wdev *table; /* the layer's device table (cuda_moe_table_get) */
    const struct moe_args *a;
    int shared_e; /* the table's shared expert, a slot after the routed ones (pair kernel only); -1: none */
    const float *x;
    int n_tokens;
    const int32_t *ids;
    const float *weights;
    float *work, *out;
};

/* The grouped tensor-core kernel loads each expert's rows as 16-byte chunks and 2-byte scale
 * pairs and x as 8-byte pairs (c->tmp: the table just built). */
static bool moe_grouped_aligned(const struct cuda_backend *c, const struct moe_args *a, const float *x)
{
    if ((uintptr_t)x % 8)
        return false;
    for (int e = 0; e < 3 * a->n_experts; e++)
        if ((uintptr_t)c->tmp[e].data % 16 || (uintptr_t)c->tmp[e].scale % 2)
            return false;
    return true;
}

enum sorted_gemm { SORTED_WGMMA, SORTED_MMA, SORTED_FP32, SORTED_GROUPED_MMA };

static bool moe_sorted(struct cuda_backend *c, enum sorted_gemm kind, const struct moe_call *m)
{
    const struct cuda_wdev *table = m->table;
    const struct moe_args *a = m->a;
    const float *x = m->x, *weights = m->weights;
    const int32_t *ids = m->ids;
    float *work = m->work, *out = m->out;
    const int n_tokens = m->n_tokens;
    const int pairs = n_tokens * a->n_used;
    const size_t D = (size_t)a->d_model, I = (size_t)a->d_expert, n = (size_t)a->n_experts;
    const enum weight_format fmt = a->gate[0].format;
    const double rows_per_expert = (double)pairs / (double)(a->n_experts < pairs ? a->n_experts : pairs);
    const enum cuda_gemm_tile tile = tile_for_rows(c->tile_moe, rows_per_expert);
    /* compact layout inside the caller's workspace (backend_moe_workspace_floats) */
    float *gate = work;
    float *up = gate + (size_t)pairs * I;
    float *yg = up + (size_t)pairs * I;
    int32_t *sorted_pair = (int32_t *)(yg + (size_t)pairs * D);
    int32_t *row_of_pair = sorted_pair + pairs;
    int32_t *n_tiles = row_of_pair + pairs;
    int32_t *tiles = n_tiles + 1;
    /* wgmma: gate/up (K = D) and down (K = I) share the sort, so their tiles must hold as many rows */
    struct cuda_wgmma_tile wt_in, wt_out;
    int bm = cuda_gemm_tile_rows(tile);
    if (kind == SORTED_WGMMA) {
        if (!wgmma_fit(c, &c->wg_moe, fmt, (int64_t)D, x, rows_per_expert, &wt_in) ||
            !wgmma_fit(c, &c->wg_moe, fmt, (int64_t)I, work, rows_per_expert, &wt_out) ||
            wt_in.tokens != wt_out.tokens)
            return false;
        bm = wt_in.tokens;
    } else if (kind == SORTED_MMA &&
               (!cuda_gemm_mma_supported(fmt, (int64_t)D, x) || !cuda_gemm_mma_supported(fmt, (int64_t)I, gate))) {
        return false;
    } else if (kind == SORTED_GROUPED_MMA) {
        if (!moe_grouped_aligned(c, a, x))
            return false;
        bm = GG_TILE_ROWS;
    }
    const int max_tiles = cuda_moe_max_tiles(pairs, a->n_experts, bm);
    size_t used = (size_t)pairs * (2 * I + D) + 2 * (size_t)pairs + 1 + 3 * (size_t)max_tiles;
    ASSERT(used <= backend_moe_workspace_floats(n_tokens, a->n_used, a->d_model, a->d_expert));
    if (!CHECK(c, cuda_moe_sort(c->stream, ids, pairs, a->n_experts, bm, sorted_pair, row_of_pair, tiles,
                                n_tiles, max_tiles)))
        return true;
    bool ok = true;
    if (kind == SORTED_WGMMA) {
        /* gate and up read one image of x; down one of the activations (the same scratch) */
        void *img;
        ok = wg_image_make(c, x, n_tokens, (int64_t)D, &wt_in, &img) &&
             CHECK(c, cuda_gemm_wgmma_grouped(c->stream, fmt, table, (int64_t)I, (int64_t)D, x, sorted_pair,
                                              a->n_used, tiles, n_tiles, max_tiles, gate, &wt_in, img)) &&
             CHECK(c, cuda_gemm_wgmma_grouped(c->stream, fmt, table + n, (int64_t)I, (int64_t)D, x, sorted_pair,
                                              a->n_used, tiles, n_tiles, max_tiles, up, &wt_in, img)) &&
             CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)pairs * I, gate)) &&
             wg_image_make(c, gate, pairs, (int64_t)I, &wt_out, &img) &&
             CHECK(c, cuda_gemm_wgmma_grouped(c->stream, fmt, table + 2 * n, (int64_t)D, (int64_t)I, gate, NULL, 1,
                                              tiles, n_tiles, max_tiles, yg, &wt_out, img));
    } else if (kind == SORTED_MMA) {
        /* tensor cores: tiles of bm rows fit the kernel's 32- or 64-row tile */
        ok = CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table, (int64_t)I, (int64_t)D, x, sorted_pair,
                                            a->n_used, tiles, n_tiles, max_tiles, gate, bm)) &&
             CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table + n, (int64_t)I, (int64_t)D, x, sorted_pair,
                                            a->n_used, tiles, n_tiles, max_tiles, up, bm)) &&
             CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)pairs * I, gate)) &&
             CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table + 2 * n, (int64_t)D, (int64_t)I, gate, NULL, 1,
                                            tiles, n_tiles, max_tiles, yg, bm));
    } else if (kind == SORTED_GROUPED_MMA) {
        /* gate and up in one launch (they share x's staging), down over the compact activations */
        const struct cuda_wdev *gu_tab[2] = {table, table + n}, *dn_tab = table + 2 * n;
        float *gu_y[2] = {gate, up};
        ok = CHECK(c, cuda_moe_grouped_mma(c->stream, 2, gu_tab, (int64_t)I, (int64_t)D, x, sorted_pair, a->n_used,
                                           tiles, n_tiles, max_tiles, gu_y, c->pdl)) &&
             CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)pairs * I, gate)) &&
             CHECK(c, cuda_moe_grouped_mma(c->stream, 1, &dn_tab, (int64_t)D, (int64_t)I, gate, NULL, 1, tiles,
                                           n_tiles, max_tiles, &yg, c->pdl));
    } else {
        ok = CHECK(c, cuda_gemm_grouped(c->stream, a->gate[0].format, table, (int64_t)I, (int64_t)D, x, sorted_pair,
                                        a->n_used, tiles, n_tiles, max_tiles, gate, tile)) &&
             CHECK(c, cuda_gemm_grouped(c->stream, a->up[0].format, table + n, (int64_t)I, (int64_t)D, x,
                                        sorted_pair, a->n_used, tiles, n_tiles, max_tiles, up, tile)) &&
             CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)pairs * I, gate)) &&
             CHECK(c, cuda_gemm_grouped(c->stream, a->down[0].format, table + 2 * n, (int64_t)D, (int64_t)I, gate,
                                        NULL, 1, tiles, n_tiles, max_tiles, yg, tile));
    }
    if (ok)
        CHECK(c, cuda_moe_combine(c->stream, ids, weights, n_tokens, a->n_used, (int)D, row_of_pair, yg, out));
    return true;
}

bool cuda_launch_moe_pair_mma(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct moe_call *m = call;
    const struct moe_args *a = m->a;
    const int n_table = a->n_experts + (m->shared_e >= 0);
    const int smem_tpw = moe_smem_tpw(c, a, m->n_tokens, n_table);
    if (m->shared_e >= 0 && smem_tpw)
        return false; /* the shared-memory form has no shared-expert slot */
    CHECK(c, cuda_moe_decode_mma(c->stream, m->table, n_table, a->d_model, a->d_expert, m->x, m->n_tokens, m->ids,
                                 m->weights, a->n_used, m->work, m->out, c->pdl, smem_tpw, m->shared_e));
    return true;
}

/* every (token, slot) pair streams its expert's rows once, no sort (cuda_decode.cu) */
bool cuda_launch_moe_pair(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct moe_call *m = call;
    const struct moe_args *a = m->a;
    CHECK(c, cuda_moe_decode(c->stream, a->gate[0].format, m->table, a->n_experts, a->d_model, a->d_expert, m->x,
                             m->n_tokens, m->ids, m->weights, a->n_used, m->work, m->out, c->pdl));
    return true;
}

bool cuda_launch_moe_wgmma(void *backend, const void *call)
{
    return moe_sorted(backend, SORTED_WGMMA, call);
}

bool cuda_launch_moe_mma(void *backend, const void *call)
{
    return moe_sorted(backend, SORTED_MMA, call);
}

bool cuda_launch_moe_grouped_mma(void *backend, const void *call)
{
    return moe_sorted(backend, SORTED_GROUPED_MMA, call);
}

bool cuda_launch_moe_fp32(void *backend, const void *call)
{
    return moe_sorted(backend, SORTED_FP32, call);
}

void cu_moe_experts(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                           const float *weights, const struct moe_args *a, float *work, float *out)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (n_tokens <= 0)
        return;
    ASSERT((int64_t)n_tokens * a->n_used < INT_MAX / 4);
    const struct cuda_wdev *table = cuda_moe_table_get(c, a, NULL);
    if (!table)
        return;
    const enum weight_format fmt = a->gate[0].format;
    const struct moe_call call = {.table = table, .a = a, .shared_e = -1, .x = x, .n_tokens = n_tokens, .ids = ids,
                                  .weights = weights, .work = work, .out = out};
    if (a->up[0].format != fmt || a->down[0].format != fmt) {
        /* experts of mixed formats (no checkpoint we read has them): the portable grouped GEMM reads
         * each projection in its own format */
        moe_sorted(c, SORTED_FP32, &call);
        return;
    }
    const struct kernel_shape sh = {.format = fmt, .tokens = n_tokens, .n_weights = 1, .d_model = a->d_model,
                                    .d_expert = a->d_expert, .n_used = a->n_used, .n_experts = a->n_experts};
    const struct plan_dispatch *d = plan_dispatch_for(&c->plan, PLAN_OP_MOE_EXPERTS, n_tokens, fmt);
    for (int i = 0; i < d->n; i++) {
        const struct kernel_desc *k = d->kernels[i];
        if ((!k->fits || k->fits(&sh, c->smem_budget)) && k->launch && k->launch(c, &call))
            return;
    }
    PANIC("cuda: no kernel of the plan takes %s experts at %d tokens (d_model %d, d_expert %d)",
          weight_format_name(fmt), n_tokens, a->d_model, a->d_expert);
}

/* Whether w has the shape [rows, cols] and format of the routed experts' projection w0. */
static bool moe_shaped_like(const struct weight *w, const struct weight *w0)
{
    return w->format == w0->format && w->rows == w0->rows && w->cols == w0->cols;
}

/* The routed experts and the shared expert in the pair kernels' one pass: the shared expert is
 * one more slot of every token (weight 1, added after the routed slots), where the plan runs the
 * pair kernel at this many tokens in its register form. GLM-5 at one token: its shared expert
 * (a routed expert's shape) costs an eighth of the pair kernels' time instead of four launches of
 * its own. False, having launched nothing, otherwise. */
bool cu_moe_experts_shared(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                           const float *weights, const struct moe_args *a, const struct weight *const shared[3],
                           float *work, float *out)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (n_tokens <= 0 || !moe_shaped_like(shared[0], &a->gate[0]) || !moe_shaped_like(shared[1], &a->up[0]) ||
        !moe_shaped_like(shared[2], &a->down[0]) || a->up[0].format != a->gate[0].format ||
        a->down[0].format != a->gate[0].format)
        return false;
    const enum weight_format fmt = a->gate[0].format;
    const struct kernel_shape sh = {.format = fmt, .tokens = n_tokens, .n_weights = 1, .d_model = a->d_model,
                                    .d_expert = a->d_expert, .n_used = a->n_used + 1, .n_experts = a->n_experts + 1};
    const struct plan_dispatch *d = plan_dispatch_for(&c->plan, PLAN_OP_MOE_EXPERTS, n_tokens, fmt);
    const struct kernel_desc *k = NULL;
    for (int i = 0; i < d->n && !k; i++)
        if (!d->kernels[i]->fits || d->kernels[i]->fits(&sh, c->smem_budget))
            k = d->kernels[i];
    /* the extra slot's act rows (tokens x (n_used + 1) x d_expert floats) always fit the caller's
     * workspace (backend_moe_workspace_floats: tokens x n_used x (2 d_model + 2 d_expert) and more) */
    if (!k || k->id != CK_MOE_PAIR_MMA)
        return false;
    const struct cuda_wdev *table = cuda_moe_table_get(c, a, shared);
    if (!table)
        return false;
    const struct moe_call call = {.table = table, .a = a, .shared_e = a->n_experts, .x = x, .n_tokens = n_tokens,
                                  .ids = ids, .weights = weights, .work = work, .out = out};
    return cuda_launch_moe_pair_mma(c, &call);
}

/* ---------------------------------------------------------------- routing */

/* The routing's call record (the launchers of cuda_launch.h): the router on x, or with norm_w
 * the norm before it as well (h += delta, x = rmsnorm(h) * norm_w, written to x_out). */
struct route_call {
    const struct weight *router;
    const float *x;
    float *h;
    const float *delta, *norm_w;
    float eps;
    float *x_out;
    int n_tokens;
    const struct route_args *args;
    float *logits;
    int32_t *ids;
    float *weights;
};

bool cuda_launch_norm_router_route(void *backend, const void *call)
{
    struct cuda_backend *c = backend;
    const struct route_call *r = call;
    if (!r->norm_w || !cuda_norm_router_route_supported(r->router, r->n_tokens, r->args, c->smem_budget) ||
        !aligned16(r->h) || !aligned16(r->delta) || !aligned16(r->norm_w) || !aligned16(r->x_out))
        return false;
    CHECK(c, cuda_norm_router_route(c->stream, r->h, r->delta, r->norm_w, r->eps, r->router, r->n_tokens, r->args,
                                    r->x_out, r->logits, r->ids, r->weights, c->pdl));
    return true;
}

/* cuda_router_route in its cluster form or its counting form (which needs the device counter). */
static bool router_route_launch(struct cuda_backend *c, const struct route_call *r, bool cluster)
{
    const bool takes = cluster ? cuda_router_route_cluster_supported(r->router, r->n_tokens, r->args, c->smem_budget)
                               : cuda_router_route_supported(r->router, r->n_tokens, r->args, c->smem_budget);
    int *sem = takes && !cluster ? cuda_sem_get(c, 1) : NULL;
    if (!takes || !aligned16(r->x) || (!cluster && !sem))
        return false;
    CHECK(c, cuda_router_route(c->stream, r->router, r->x, r->n_tokens, r->args, r->logits, r->ids, r->weights,
                               (unsigned *)sem, c->pdl, cluster));
    return true;
}

bool cuda_launch_router_route_cluster(void *backend, const void *call)
{
    return router_route_launch(backend, call, true);
}

bool cuda_launch_router_route_count(void *backend, const void *call)
{
    return router_route_launch(backend, call, false);
}

/* The first kernel of the plan's moe_route list that takes the call; false, having run nothing,
 * where that is the routing kernel alone (the caller runs the router linear, then moe_route) or,
 * for a call that offers the norm, a form without it (the caller runs the norm, then asks again
 * without it). */
static bool route_run(struct cuda_backend *c, const struct route_call *r)
{
    const struct kernel_shape sh = {.format = r->router->format, .tokens = r->n_tokens, .n_weights = 1,
                                    .n = r->args->n_experts, .k = r->router->cols, .n_used = r->args->n_used,
                                    .n_experts = r->args->n_experts, .n_group = r->args->n_group,
                                    .norm_first = r->norm_w != NULL};
    const struct plan_dispatch *d = plan_dispatch_for(&c->plan, PLAN_OP_MOE_ROUTE, r->n_tokens, sh.format);
    for (int i = 0; i < d->n; i++) {
        const struct kernel_desc *k = d->kernels[i];
        if (k->fits && !k->fits(&sh, c->smem_budget))
            continue;
        if (k->id == CK_FIXED || (r->norm_w && k->id != CK_NORM_ROUTER_ROUTE))
            return false;
        if (k->launch && k->launch(c, r))
            return true;
    }
    return false;
}

bool cu_router_route(struct backend *be, const struct weight *router, const float *x, int n_tokens,
                     const struct route_args *args, float *logits, int32_t *ids, float *weights)
{
    const struct route_call r = {.router = router, .x = x, .n_tokens = n_tokens, .args = args, .logits = logits,
                                 .ids = ids, .weights = weights};
    return route_run(cuda_ctx(be), &r);
}

bool cu_norm_router_route(struct backend *be, float *h, const float *delta, const float *norm_w, float eps,
                          const struct weight *router, int n_tokens, const struct route_args *args, float *x,
                          float *logits, int32_t *ids, float *weights)
{
    const struct route_call r = {.router = router, .x = h, .h = h, .delta = delta, .norm_w = norm_w, .eps = eps,
                                 .x_out = x, .n_tokens = n_tokens, .args = args, .logits = logits, .ids = ids,
                                 .weights = weights};
    return route_run(cuda_ctx(be), &r);
}
