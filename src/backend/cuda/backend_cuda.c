/* backend_cuda.c — the CUDA backend's host side: the ops table, device memory,
 * the stream, the cuBLAS handle, weight upload, CUDA graphs, and the plan -> kernel
 * configuration (see backend_cuda.h).
 *
 * Everything runs on one non-blocking stream of the device chosen at creation;
 * upload/download/synchronize order against it. Weights are copied once, in their
 * file format, into allocations this backend owns (the model's struct weight only
 * borrows them) and freed at destroy.
 *
 * Linear layers: F32 weights through cuBLAS SGEMM (no TF32); BF16 through cuBLAS on
 * activations split into bf16 hi + lo (rounded once to bf16 they put a golden fixture
 * 7.5e-2 away from transformers, the split stays near 1e-5); NVFP4 at up to 8 rows
 * through the tensor-core GEMV, above that as a bf16 copy made per call and cuBLAS
 * where the plan says so; other formats through our GEMMs, which read the stored
 * format and accumulate in fp32. MoE experts: the pair-by-pair decode kernels at few
 * tokens, the sorted grouped GEMMs above (cuda_moe.cu sorts and combines), with no
 * host synchronisation.
 *
 * Tiles come from the plan built at creation; nothing here compares compute
 * capabilities. A plan entry that does not fit a kernel's own shared-memory layout
 * is shrunk to fit the budget, never grown.
 *
 * Not here: multiple devices per backend, a quantized KV cache.
 */
#include "backend/cuda/backend_cuda.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_decode_limits.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_registry.h"
#include "base/log.h"
#include "base/options.h"

/* One captured op sequence (a decode step of some batch size), replayed by key. */
struct cuda_graph {
    uint64_t key;
    cudaGraphExec_t exec;
};

enum { CUDA_MAX_GRAPHS = 128 };

/* The per-expert weight tables of one MoE layer in device memory: gate, up, down. */
struct moe_table {
    const struct weight *key; /* the layer's gate array (host), identifies the layer */
    int n_experts;
    struct cuda_wdev *host; /* (3 * n_experts) what dev holds, to detect a changed array */
    struct cuda_wdev *dev;  /* (3 * n_experts) device */
};

struct cuda_backend {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    struct plan plan;
    size_t smem_budget; /* bytes of shared memory a block may use */
    int sm_count;
    struct cuda_attn_cfg attn_prefill; /* as planned, fitted per head_dim at each call */
    struct cuda_attn_cfg attn_decode;  /* rows == 0: one KV group of one token */
    struct cuda_attn_mma_cfg attn_mma; /* the plan's attn_prefill_mma_bf16 tile; rows 0: not chosen */
    enum cuda_gemm_tile tile_linear;
    enum cuda_gemm_tile tile_moe;
    int force_splits; /* tests: > 0 split count, -1 never split, 0 auto */
    struct cuda_mla_cfg mla_attn; /* MLA latent attention as planned ("mla_attention"), fitted per call */
    struct cuda_dsa_cfg dsa;      /* DSA score tile as planned ("dsa_index"), fitted per call */
    void *scratch;    /* device: bf16 activations, attention partials */
    size_t scratch_bytes;
    int *sem;         /* device: arrival counters of the split decode attention, zero between launches */
    size_t sem_count;
    bool legacy_decode; /* tests: the older split attention + merge kernel pair */
    bool pdl;           /* decode kernels use programmatic dependent launch (device_caps.pdl) */
    bool attn_cluster;   /* decode attention: splits merged in a cluster's shared memory (caps "clusters") */
    bool attn_push;      /* ... the splits pushing their partials to the leader where that fits (else pulled) */
    int moe_smem_min;    /* MoE mma: the weights through shared memory from this many tokens on (0: never) */
    bool router_route;     /* few tokens: router GEMV + routing in one kernel */
    bool router_cluster;   /* ... in its thread-block-cluster form (caps "clusters") */
    int router_min_tokens; /* ... from this many tokens of a pass */
    int attn_prec;         /* prefill tensor-core attention operands: 0 hi + lo, 1 P and V bf16, 2 all bf16 */
    void **owned; /* (n_owned) device allocations holding weights */
    size_t n_owned, cap_owned;
    struct moe_table *tables; /* (n_tables) */
    int n_tables, cap_tables;
    struct cuda_wdev *tmp; /* (tmp_cap) host scratch for building a table */
    size_t tmp_cap;
    struct cuda_wgmma_tile wg_moe, wg_linear; /* the planned wgmma tiles, fitted per call */
    bool wgmma_loads;                         /* the wgmma GEMMs' sm_90a image loaded on this device */
    struct cuda_graph *graphs; /* (n_graphs) captured decode steps */
    int n_graphs;
    bool capturing;
    bool capture_broken; /* an op could not be recorded: the capture must be thrown away */
    struct cuda_error_sink sink;
};

static struct cuda_backend *ctx(struct backend *be)
{
    return (struct cuda_backend *)be->impl;
}

#define CHECK(c, call) CUDA_CHECK(&(c)->sink, call)

/* ---------------------------------------------------------------- memory */

static void *cu_alloc(struct backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is the caller's to report, not a sticky error */
        LOG_DEBUG("cuda: cudaMalloc(%zu) failed: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cu_free(struct backend *be, void *p)
{
    if (p)
        CHECK(ctx(be), cudaFree(p));
}

static void cu_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = ctx(be);
    if (!bytes)
        return;
    /* synchronous for the caller: src may be reused as soon as we return */
    if (CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream)))
        CHECK(c, cudaStreamSynchronize(c->stream));
}

static void cu_download(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = ctx(be);
    if (!bytes)
        return;
    if (CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream)))
        CHECK(c, cudaStreamSynchronize(c->stream));
}

static void cu_synchronize(struct backend *be)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cudaStreamSynchronize(c->stream));
}

/* A device buffer of at least `bytes` for one op's temporaries. Grows
 * rarely (the first calls at a new largest shape); cudaFree waits for the
 * device, so no kernel still reads the old buffer. */
static void graphs_drop(struct cuda_backend *c);

static void *scratch_get(struct cuda_backend *c, size_t bytes)
{
    if (bytes <= c->scratch_bytes)
        return c->scratch;
    if (c->capturing) {
        /* cannot free or allocate inside a capture: spoil it, the forward runs the ops directly */
        c->capture_broken = true;
        return NULL;
    }
    /* graphs hold the old buffer's address */
    graphs_drop(c);
    size_t want = bytes + bytes / 4;
    if (c->scratch)
        CHECK(c, cudaFree(c->scratch));
    c->scratch = NULL;
    c->scratch_bytes = 0;
    if (!CHECK(c, cudaMalloc(&c->scratch, want))) {
        c->scratch = NULL;
        return NULL;
    }
    c->scratch_bytes = want;
    LOG_DEBUG("cuda: scratch grown to %zu bytes", want);
    return c->scratch;
}

/* n zeroed counters for kernels whose last block finishes the work (each resets its own). */
static int *sem_get(struct cuda_backend *c, size_t n)
{
    if (n <= c->sem_count)
        return c->sem;
    if (c->capturing) {
        c->capture_broken = true;
        return NULL;
    }
    graphs_drop(c);
    if (c->sem)
        CHECK(c, cudaFree(c->sem));
    c->sem = NULL;
    c->sem_count = 0;
    size_t want = n < 1024 ? 1024 : n;
    if (!CHECK(c, cudaMalloc((void **)&c->sem, want * sizeof(int))) ||
        !CHECK(c, cudaMemset(c->sem, 0, want * sizeof(int)))) {
        c->sem = NULL;
        return NULL;
    }
    c->sem_count = want;
    return c->sem;
}

static bool own(struct cuda_backend *c, void *p)
{
    if (c->n_owned == c->cap_owned) {
        size_t cap = c->cap_owned ? c->cap_owned * 2 : 256;
        void **n = realloc(c->owned, cap * sizeof *n);
        if (!n)
            return false;
        c->owned = n;
        c->cap_owned = cap;
    }
    c->owned[c->n_owned++] = p;
    return true;
}

/* Copies bytes of host memory into a new device allocation this backend owns. */
static enum status upload_owned(struct cuda_backend *c, const void *src, size_t bytes, const void **out,
                                struct err *err)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return err_set(err, STATUS_NOMEM, "cuda: cannot allocate %zu bytes of device memory for a weight: %s",
                       bytes, cudaGetErrorString(e));
    }
    if (!own(c, p)) {
        CHECK(c, cudaFree(p));
        return err_set(err, STATUS_NOMEM, "cuda: out of host memory");
    }
    /* On the backend's stream (a plain cudaMemcpy from pageable memory may return before its DMA
     * lands, and the legacy stream does not order against a non-blocking one), then wait, so the
     * caller may unmap src. */
    if (bytes && (!CHECK(c, cudaMemcpyAsync(p, src, bytes, cudaMemcpyHostToDevice, c->stream)) ||
                  !CHECK(c, cudaStreamSynchronize(c->stream))))
        return cuda_sink_status(&c->sink, err);
    *out = p;
    return STATUS_OK;
}

static enum status cu_weight_load(struct backend *be, const struct weight *host, struct weight *out,
                                  unsigned flags, struct err *err)
{
    struct cuda_backend *c = ctx(be);
    size_t n = (size_t)host->rows * (size_t)host->cols, data = 0, scale = 0;
    switch (host->format) {
    case WEIGHT_F32: data = n * 4; break;
    case WEIGHT_BF16:
    case WEIGHT_F16: data = n * 2; break;
    case WEIGHT_FP8_BLOCK:
        data = n;
        scale = (size_t)((host->rows + 127) / 128) * (size_t)((host->cols + 127) / 128) * sizeof(float);
        break;
    case WEIGHT_NVFP4:
        if (host->cols % 16)
            return err_set(err, STATUS_UNSUPPORTED,
                           "cuda: NVFP4 weight with %lld columns (not a multiple of 16)",
                           (long long)host->cols);
        data = n / 2;
        scale = n / 16;
        break;
    default: return err_set(err, STATUS_UNSUPPORTED, "cuda: weight format %d", (int)host->format);
    }
    *out = *host; /* the bias is already backend memory (model_weights binds it first) */
    enum status st = upload_owned(c, host->data, data, &out->data, err);
    if (!st && scale)
        st = upload_owned(c, host->scale, scale, &out->scale, err);
    return st;
}

/* ---------------------------------------------------------------- ops */

static void cu_embed(struct backend *be, const struct weight *table, const int32_t *tokens, int n, float *out)
{
    struct cuda_backend *c = ctx(be);
    if (table->format != WEIGHT_F32 && table->format != WEIGHT_BF16 && table->format != WEIGHT_F16)
        PANIC("embedding in format %s", weight_format_name(table->format)); /* model_weights refuses these */
    CHECK(c, cuda_embed(c->stream, table->format, table->data, table->cols, tokens, n, out));
}

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
 * it is), or NULL: no scratch (a capture that must grow it is spoiled by scratch_get and rerun
 * directly); NULL makes the GEMM split x in every block. False when the split failed (recorded). */
static bool wg_image_make(struct cuda_backend *c, const float *x, int64_t rows, int64_t K,
                          const struct cuda_wgmma_tile *t, void **img)
{
    *img = scratch_get(c, cuda_gemm_wgmma_image_bytes(rows, K, t));
    return !*img || CHECK(c, cuda_gemm_wgmma_image(c->stream, x, rows, K, t, *img));
}

static struct cuda_wdev wdev_of(const struct weight *w)
{
    return (struct cuda_wdev){.data = w->data, .scale = w->scale, .bias = w->bias, .scale2 = w->scale2};
}

static bool aligned16(const void *p)
{
    return (uintptr_t)p % 16 == 0;
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

/* Kernel k (the plan's choice) on the linears ws[0 .. n_w) sharing x: one launch for the GEMVs,
 * a weight at a time otherwise. False, having launched nothing, when its launcher does not take
 * these pointers (alignment): the caller tries the plan's next kernel. */
static bool linear_launch(struct cuda_backend *c, const struct kernel_desc *k, int n_w, const struct weight *const *ws,
                          const float *x, int m, float *const *ys)
{
    const int K = (int)ws[0]->cols;
    const enum weight_format fmt = ws[0]->format;
    struct cuda_wdev wd[3];
    int64_t N[3];
    for (int j = 0; j < n_w; j++)
        wd[j] = wdev_of(ws[j]), N[j] = ws[j]->rows;
    switch ((enum cuda_kernel_id)k->id) {
    case CK_GEMV_MMA:
        if (!cuda_gemv_mma_supported(n_w, wd, K, m, c->smem_budget) || !aligned16(x))
            return false;
        CHECK(c, cuda_gemv_mma(c->stream, n_w, wd, N, K, x, m, ys, c->sm_count, c->pdl));
        return true;
    case CK_GEMV1:
        if (!cuda_gemv1_supported(fmt, K, x, c->smem_budget))
            return false;
        CHECK(c, cuda_gemv1(c->stream, fmt, n_w, wd, N, K, x, ys, c->pdl));
        return true;
    case CK_GEMM_WGMMA: {
        struct cuda_wgmma_tile wt;
        if (!wgmma_fit(c, &c->wg_linear, fmt, K, x, m, &wt))
            return false;
        for (int j = 0; j < n_w; j++) {
            void *img;
            if (wg_image_make(c, x, m, K, &wt, &img))
                CHECK(c, cuda_gemm_wgmma(c->stream, fmt, &wd[j], N[j], K, x, m, ys[j], &wt, img));
        }
        return true;
    }
    case CK_GEMM_MMA:
        if (!cuda_gemm_mma_supported(fmt, K, x))
            return false;
        for (int j = 0; j < n_w; j++)
            CHECK(c, cuda_gemm_mma(c->stream, fmt, &wd[j], N[j], K, x, m, ys[j],
                                   cuda_gemm_tile_rows(tile_for_rows(c->tile_linear, m))));
        return true;
    case CK_GEMM_FP32:
        for (int j = 0; j < n_w; j++) /* the bias is added in the kernels' epilogue */
            CHECK(c, cuda_gemm(c->stream, fmt, &wd[j], N[j], K, x, m, ys[j], tile_for_rows(c->tile_linear, m)));
        return true;
    case CK_CUBLAS_BF16:
    case CK_CUBLAS_DEQUANT:
    case CK_CUBLAS_SGEMM:
        break;
    default: return false;
    }
    for (int j = 0; j < n_w; j++) {
        const int Nj = (int)N[j];
        if (k->id == CK_CUBLAS_SGEMM) {
            const float one = 1.0f, zero = 0.0f;
            if (CHECK(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, Nj, m, K, &one, ws[j]->data, K, x, K, &zero,
                                     ys[j], Nj)) &&
                ws[j]->bias)
                CHECK(c, cuda_bias_add(c->stream, ys[j], ws[j]->bias, m, Nj));
        } else if (k->id == CK_CUBLAS_BF16) {
            char *s = scratch_get(c, cublas_split_bytes(m, Nj, K));
            if (s)
                linear_cublas_bf16(c, ws[j]->data, 1.0f, ws[j]->bias, x, m, Nj, K, ys[j], s);
        } else {
            /* the weight expanded to bf16 in scratch (exact; its global scale as the GEMM's alpha),
             * then cuBLAS as for a bf16 weight */
            size_t w_bytes = ((size_t)Nj * (size_t)K * sizeof(uint16_t) + 255) / 256 * 256;
            char *s = scratch_get(c, w_bytes + cublas_split_bytes(m, Nj, K));
            if (s && CHECK(c, cuda_nvfp4_to_bf16(c->stream, &wd[j], Nj, K, (uint16_t *)s)))
                linear_cublas_bf16(c, s, ws[j]->scale2, ws[j]->bias, x, m, Nj, K, ys[j], s + w_bytes);
        }
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
    const struct plan_dispatch *d = plan_dispatch_for(&c->plan, PLAN_OP_LINEAR, m, sh.format);
    for (int i = 0; i < d->n; i++)
        if ((!d->kernels[i]->fits || d->kernels[i]->fits(&sh, c->smem_budget)) &&
            linear_launch(c, d->kernels[i], n_w, ws, x, m, ys))
            return;
    PANIC("cuda: no kernel of the plan takes a %s linear of %d rows, K %lld", weight_format_name(sh.format), m,
          (long long)sh.k);
}

static void cu_linear(struct backend *be, const struct weight *w, const float *x, int m, float *y)
{
    if (m > 0)
        linear_run(ctx(be), 1, &w, x, m, &y);
}

static void cu_linear_multi(struct backend *be, int n_w, const struct weight *const *ws, const float *x, int m,
                            float *const *ys)
{
    if (m <= 0)
        return;
    bool same = true;
    for (int j = 1; j < n_w; j++)
        same &= ws[j]->format == ws[0]->format && ws[j]->cols == ws[0]->cols;
    if (same) {
        linear_run(ctx(be), n_w, ws, x, m, ys);
        return;
    }
    for (int j = 0; j < n_w; j++)
        linear_run(ctx(be), 1, &ws[j], x, m, &ys[j]);
}

static void cu_attn_prep(struct backend *be, float *q, float *k, const float *v, int n_tokens, int n_heads,
                         const float *q_norm, const float *k_norm, float eps, const struct rope_args *rope,
                         const int32_t *pos, const struct paged_kv *kv, const int32_t *slots)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_attn_prep(c->stream, q, k, v, n_tokens, n_heads, kv->n_kv_heads, kv->head_dim, q_norm, k_norm,
                            eps, rope, pos, kv, slots, c->pdl));
}

static void cu_argmax(struct backend *be, const float *logits, int rows, int vocab, int32_t *ids)
{
    struct cuda_backend *c = ctx(be);
    /* rows split over blocks (scratch for the partials, a counter a row); NULL (no memory, or a
     * capture that would have to grow them and is spoilt instead): one block a row */
    void *work = scratch_get(c, cuda_argmax_workspace_bytes(rows, vocab));
    int *sem = work ? sem_get(c, (size_t)rows) : NULL;
    CHECK(c, cuda_argmax(c->stream, logits, rows, vocab, ids, work, sem));
}

static void cu_sample(struct backend *be, const float *logits, int rows, int vocab, const struct sample_row *params,
                      int32_t *ids)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_sample(c->stream, logits, rows, vocab, params, ids));
}

/* ---------------------------------------------------------------- graphs */

static void graphs_drop(struct cuda_backend *c)
{
    for (int i = 0; i < c->n_graphs; i++)
        CHECK(c, cudaGraphExecDestroy(c->graphs[i].exec));
    c->n_graphs = 0;
}

static bool cu_graph_replay(struct backend *be, uint64_t key)
{
    struct cuda_backend *c = ctx(be);
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key)
            return CHECK(c, cudaGraphLaunch(c->graphs[i].exec, c->stream));
    return false;
}

static bool cu_graph_capture_begin(struct backend *be)
{
    struct cuda_backend *c = ctx(be);
    if (c->capturing || c->n_graphs >= CUDA_MAX_GRAPHS)
        return false;
    /* thread-local: another thread's CUDA calls (a server's HTTP threads) cannot invalidate it */
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        LOG_DEBUG("cuda: graph capture not started: %s", cudaGetErrorString(e));
        return false;
    }
    c->capturing = true;
    c->capture_broken = false;
    return true;
}

static bool cu_graph_capture_end(struct backend *be, uint64_t key)
{
    struct cuda_backend *c = ctx(be);
    if (!c->capturing)
        return false;
    c->capturing = false;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e == cudaSuccess && c->capture_broken)
        e = cudaErrorStreamCaptureInvalidated;
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&exec, g, 0);
    if (g)
        (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        /* a capture that failed (an op that cannot be captured) is not an error of the run:
         * the caller runs the ops eagerly instead */
        (void)cudaGetLastError();
        LOG_DEBUG("cuda: graph capture of key %llu failed: %s", (unsigned long long)key, cudaGetErrorString(e));
        return false;
    }
    struct cuda_graph *n = realloc(c->graphs, (size_t)(c->n_graphs + 1) * sizeof *n);
    if (!n) {
        (void)cudaGraphExecDestroy(exec);
        return false;
    }
    c->graphs = n;
    c->graphs[c->n_graphs++] = (struct cuda_graph){.key = key, .exec = exec};
    return true;
}

static void cu_rmsnorm(struct backend *be, const float *x, const float *w, int rows, int dim, float eps,
                       float *y)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_rmsnorm(c->stream, x, w, rows, dim, eps, y));
}

static void cu_add_rmsnorm(struct backend *be, float *h, const float *delta, const float *w, int rows,
                           int dim, float eps, float *y)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_add_rmsnorm(c->stream, h, delta, w, rows, dim, eps, y, c->pdl));
}

static void cu_rope(struct backend *be, float *x, int n_tokens, int n_heads, int head_stride,
                    const struct rope_args *args, const int32_t *pos)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_rope(c->stream, x, n_tokens, n_heads, head_stride, args, pos));
}

static void cu_kv_store(struct backend *be, const struct paged_kv *kv, const float *k, const float *v,
                        int n_tokens, const int32_t *slots)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_kv_store(c->stream, kv, k, v, n_tokens, slots));
}

static int ceil_div(int64_t a, int64_t b)
{
    int64_t r = (a + b - 1) / b;
    return r > INT_MAX ? INT_MAX : (int)r;
}

static void cu_attention(struct backend *be, const float *q, const struct paged_kv *kv,
                         const struct attn_batch *b, int n_heads, float scale, float *out)
{
    struct cuda_backend *c = ctx(be);
    if (b->n_tokens <= 0)
        return;
    ASSERT(kv->n_kv_heads > 0 && n_heads % kv->n_kv_heads == 0);
    int hd = kv->head_dim, group = n_heads / kv->n_kv_heads;
    int64_t q_rows = (int64_t)b->n_tokens * group;

    struct cuda_attn_cfg cfg = c->attn_prefill;
    if (!cuda_attention_fit(&cfg, hd, c->smem_budget))
        PANIC("cuda: no attention tile fits head_dim %d in %zu bytes of shared memory", hd, c->smem_budget);
    int blocks = ceil_div(q_rows, cfg.rows) * kv->n_kv_heads;
    int splits = 1;
    if (c->force_splits > 0 || (c->force_splits == 0 && blocks < c->sm_count)) {
        /* few query rows: split the keys so that every SM has work (decode) */
        cfg = c->attn_decode;
        if (cfg.rows <= 0 || cfg.rows > group)
            cfg.rows = group; /* a block never mixes tokens: decode rows are one token's heads */
        if (!cuda_attention_fit(&cfg, hd, c->smem_budget))
            PANIC("cuda: no decode attention tile fits head_dim %d in %zu bytes", hd, c->smem_budget);
        int dblocks = ceil_div(q_rows, cfg.rows) * kv->n_kv_heads;
        splits = c->force_splits > 0 ? c->force_splits : ceil_div(2 * (int64_t)c->sm_count, dblocks);
        if (splits > 64)
            splits = 64;
        if (splits < 1)
            splits = 1;
    }
    struct cuda_attn_mma_cfg mcfg = c->attn_mma;
    if (splits == 1 && mcfg.rows > 0 && cuda_attention_mma_supported(q, kv, out) &&
        cuda_attention_mma_fit(&mcfg, hd, c->smem_budget)) {
        CHECK(c, cuda_attention_mma(c->stream, q, kv, b, n_heads, scale, out, &mcfg));
        return;
    }
    float *work = NULL;
    size_t wf = cuda_attention_workspace_floats(b->n_tokens, n_heads, hd, splits);
    if (wf && !(work = scratch_get(c, wf * sizeof(float))))
        return;
    if (splits > 1 && !c->legacy_decode && cuda_attn_decode_supported(group, hd, splits, c->smem_budget)) {
        int *sem = sem_get(c, (size_t)b->n_tokens * (size_t)kv->n_kv_heads);
        /* clusters of CUDA_ATTN_CLUSTER splits merge in shared memory (caps "clusters"); the
         * automatic split count is rounded up to a multiple of it (at most 64). Only while one
         * cluster per (token, KV head) fits the SMs: with more cluster blocks than SMs the merge
         * through global memory measured faster (docs/lab/journal.md, the decode attention). */
        int cluster = 1;
        if (c->attn_cluster && (c->force_splits == 0 || splits % CUDA_ATTN_CLUSTER == 0) &&
            (int64_t)b->n_tokens * kv->n_kv_heads * CUDA_ATTN_CLUSTER <= c->sm_count) {
            int sc = ceil_div(splits, CUDA_ATTN_CLUSTER) * CUDA_ATTN_CLUSTER;
            if (sc <= 64 && cuda_attn_decode_supported(group, hd, sc, c->smem_budget))
                splits = sc, cluster = CUDA_ATTN_CLUSTER;
        }
        /* push: the splits store their partials into the leader's shared memory (one barrier
         * phase), where the budget holds them; pull: the leader loads them (two) */
        bool push = cluster > 1 && c->attn_push && cuda_attn_decode_push_smem(group, hd) <= c->smem_budget;
        if (sem)
            CHECK(c, cuda_attn_decode(c->stream, q, kv, b, n_heads, scale, out, splits, work, sem, c->pdl, cluster,
                                      push));
        return;
    }
    CHECK(c, cuda_attention(c->stream, q, kv, b, n_heads, scale, out, &cfg, splits, work));
}

static void cu_silu_mul(struct backend *be, const float *gate, const float *up, int rows, int dim, float *out)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)rows * (size_t)dim, out));
}

static const struct cuda_wdev *moe_table_get(struct cuda_backend *c, const struct moe_args *a);

/* The most tokens the MoE block of n_experts, top n_used, runs pair by pair (the router fusion
 * follows it: past it the routing kernel's block-per-token ranks are cheaper). */
static int moe_pair_max(const struct cuda_backend *c, int n_experts, int n_used)
{
    (void)c;
    return plan_moe_pair_max_tokens(n_experts, n_used);
}

/* A few tokens: the router GEMV and the routing in one kernel (cuda_router_route.cu). */
static bool cu_router_route(struct backend *be, const struct weight *router, const float *x, int n_tokens,
                            const struct route_args *args, float *logits, int32_t *ids, float *weights)
{
    struct cuda_backend *c = ctx(be);
    if (!c->router_route || n_tokens > moe_pair_max(c, args->n_experts, args->n_used) ||
        n_tokens < c->router_min_tokens || !cuda_router_route_supported(router, n_tokens, args, c->smem_budget) || !aligned16(x))
        return false;
    int *sem = sem_get(c, 1);
    if (!sem)
        return false;
    const int cluster = c->router_cluster && cuda_router_route_cluster_supported(args);
    CHECK(c, cuda_router_route(c->stream, router, x, n_tokens, args, logits, ids, weights, (unsigned *)sem, c->pdl,
                               cluster));
    return true;
}

/* A few tokens: add + RMSNorm, the router GEMV and the routing in one cluster kernel (the
 * router_route cluster form with the norm in its prologue), where that form is asked for. */
static bool cu_norm_router_route(struct backend *be, float *h, const float *delta, const float *norm_w, float eps,
                                 const struct weight *router, int n_tokens, const struct route_args *args, float *x,
                                 float *logits, int32_t *ids, float *weights)
{
    struct cuda_backend *c = ctx(be);
    if (!c->router_route || !c->router_cluster || n_tokens > moe_pair_max(c, args->n_experts, args->n_used) ||
        n_tokens < c->router_min_tokens || !cuda_norm_router_route_supported(router, n_tokens, args, c->smem_budget) || !aligned16(h) ||
        !aligned16(delta) || !aligned16(norm_w) || !aligned16(x))
        return false;
    CHECK(c, cuda_norm_router_route(c->stream, h, delta, norm_w, eps, router, n_tokens, args, x, logits, ids, weights,
                                    c->pdl));
    return true;
}

static void cu_moe_route(struct backend *be, const float *logits, int n_tokens, const struct route_args *args,
                         int32_t *ids, float *weights)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_moe_route(c->stream, logits, n_tokens, args, ids, weights, c->pdl));
}


static void wdev_from(struct cuda_wdev *d, const struct weight *w, const struct weight *w0)
{
    /* one format and shape per projection: the grouped kernel reads them once */
    ASSERT(w->format == w0->format && w->rows == w0->rows && w->cols == w0->cols);
    d->data = w->data;
    d->scale = w->scale;
    d->bias = w->bias;
    d->scale2 = w->scale2;
}

/* The device table of args' expert weights, uploaded at the layer's first
 * call and reused after (the table changes only if the arrays do): gate, up, down (n_experts
 * entries each). */
enum { MOE_TABLE_ROWS = 3 };
static const struct cuda_wdev *moe_table_get(struct cuda_backend *c, const struct moe_args *a)
{
    size_t n = (size_t)a->n_experts, bytes = MOE_TABLE_ROWS * n * sizeof(struct cuda_wdev);
    if (c->tmp_cap < MOE_TABLE_ROWS * n) {
        struct cuda_wdev *t = realloc(c->tmp, bytes);
        if (!t)
            PANIC("cuda: out of host memory");
        c->tmp = t;
        c->tmp_cap = MOE_TABLE_ROWS * n;
    }
    for (size_t e = 0; e < n; e++) {
        wdev_from(&c->tmp[e], &a->gate[e], &a->gate[0]);
        wdev_from(&c->tmp[n + e], &a->up[e], &a->up[0]);
        wdev_from(&c->tmp[2 * n + e], &a->down[e], &a->down[0]);
    }
    struct moe_table *t = NULL;
    for (int i = 0; i < c->n_tables; i++)
        if (c->tables[i].key == a->gate && c->tables[i].n_experts == a->n_experts)
            t = &c->tables[i];
    if (t && memcmp(t->host, c->tmp, bytes) == 0)
        return t->dev;
    if (!t) {
        if (c->n_tables == c->cap_tables) {
            int cap = c->cap_tables ? c->cap_tables * 2 : 64;
            struct moe_table *nt = realloc(c->tables, (size_t)cap * sizeof *nt);
            if (!nt)
                PANIC("cuda: out of host memory");
            c->tables = nt;
            c->cap_tables = cap;
        }
        t = &c->tables[c->n_tables];
        memset(t, 0, sizeof *t);
        t->key = a->gate;
        t->n_experts = a->n_experts;
        t->host = malloc(bytes);
        if (!t->host)
            PANIC("cuda: out of host memory");
        void *dev = NULL;
        if (!CHECK(c, cudaMalloc(&dev, bytes))) {
            free(t->host);
            return NULL;
        }
        t->dev = dev;
        c->n_tables++;
    }
    if (c->capturing) { /* a pageable copy cannot be captured: spoil the capture instead */
        c->capture_broken = true;
        return NULL;
    }
    memcpy(t->host, c->tmp, bytes);
    /* ordered after the kernels already queued; pageable source is staged before the call returns */
    if (!CHECK(c, cudaMemcpyAsync(t->dev, t->host, bytes, cudaMemcpyHostToDevice, c->stream)))
        return NULL;
    return t->dev;
}

/* The down kernel's 8-row tiles a warp of the shared-memory MoE form takes (0: not that form):
 * two where one tile a warp would give more blocks than SMs, so that the down kernel's whole grid
 * can be resident beside gate/up's; one where two do not fit the budget. Its cp.async copies
 * need every expert's data 16-byte and scales 8-byte aligned (c->tmp: the table just built). */
static int moe_smem_tpw(const struct cuda_backend *c, const struct moe_args *a, int n_tokens)
{
    if (!c->moe_smem_min || n_tokens < c->moe_smem_min)
        return 0;
    for (int e = 0; e < 3 * a->n_experts; e++)
        if ((uintptr_t)c->tmp[e].data % 16 || (uintptr_t)c->tmp[e].scale % 8)
            return 0;
    int tpw = (a->d_model + 7) / 8 > c->sm_count ? 2 : 1;
    for (; tpw >= 1; tpw--)
        if (cuda_moe_decode_mma_smem_fits(a->d_model, a->d_expert, a->n_used, tpw, c->smem_budget))
            return tpw;
    return 0;
}

/* The sorted path with the GEMM kernel k: sort the (token, slot) pairs by expert into row tiles
 * of the GEMM's height, gate/up, SiLU, down, combine. False, having launched nothing, when k's
 * launcher does not take these operands (a wgmma tile that does not fit both GEMMs, misaligned
 * x): the caller tries the plan's next kernel. */
static bool moe_sorted(struct cuda_backend *c, const struct kernel_desc *k, const struct cuda_wdev *table,
                       const struct moe_args *a, const float *x, int n_tokens, const int32_t *ids,
                       const float *weights, float *work, float *out)
{
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
    if (k->id == CK_MOE_WGMMA) {
        if (!wgmma_fit(c, &c->wg_moe, fmt, (int64_t)D, x, rows_per_expert, &wt_in) ||
            !wgmma_fit(c, &c->wg_moe, fmt, (int64_t)I, work, rows_per_expert, &wt_out) ||
            wt_in.tokens != wt_out.tokens)
            return false;
        bm = wt_in.tokens;
    } else if (k->id == CK_MOE_MMA &&
               (!cuda_gemm_mma_supported(fmt, (int64_t)D, x) || !cuda_gemm_mma_supported(fmt, (int64_t)I, gate))) {
        return false;
    }
    const int max_tiles = cuda_moe_max_tiles(pairs, a->n_experts, bm);
    size_t used = (size_t)pairs * (2 * I + D) + 2 * (size_t)pairs + 1 + 3 * (size_t)max_tiles;
    ASSERT(used <= backend_moe_workspace_floats(n_tokens, a->n_used, a->d_model, a->d_expert));
    if (!CHECK(c, cuda_moe_sort(c->stream, ids, pairs, a->n_experts, bm, sorted_pair, row_of_pair, tiles,
                                n_tiles, max_tiles)))
        return true;
    bool ok = true;
    if (k->id == CK_MOE_WGMMA) {
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
    } else if (k->id == CK_MOE_MMA) {
        /* tensor cores: tiles of bm rows fit the kernel's 32- or 64-row tile */
        ok = CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table, (int64_t)I, (int64_t)D, x, sorted_pair,
                                            a->n_used, tiles, n_tiles, max_tiles, gate, bm)) &&
             CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table + n, (int64_t)I, (int64_t)D, x, sorted_pair,
                                            a->n_used, tiles, n_tiles, max_tiles, up, bm)) &&
             CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)pairs * I, gate)) &&
             CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table + 2 * n, (int64_t)D, (int64_t)I, gate, NULL, 1,
                                            tiles, n_tiles, max_tiles, yg, bm));
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

/* Kernel k (the plan's choice) on this MoE block; false as for moe_sorted. */
static bool moe_launch(struct cuda_backend *c, const struct kernel_desc *k, const struct cuda_wdev *table,
                       const struct moe_args *a, const float *x, int n_tokens, const int32_t *ids,
                       const float *weights, float *work, float *out)
{
    const int64_t D = a->d_model, I = a->d_expert;
    switch ((enum cuda_kernel_id)k->id) {
    case CK_MOE_PAIR_MMA:
        CHECK(c, cuda_moe_decode_mma(c->stream, table, a->n_experts, D, I, x, n_tokens, ids, weights, a->n_used, work,
                                     out, c->pdl, moe_smem_tpw(c, a, n_tokens)));
        return true;
    case CK_MOE_PAIR:
        /* every (token, slot) pair streams its expert's rows once, no sort (cuda_decode.cu) */
        CHECK(c, cuda_moe_decode(c->stream, a->gate[0].format, table, a->n_experts, D, I, x, n_tokens, (int32_t *)ids,
                                 (float *)weights, a->n_used, work, out, c->pdl));
        return true;
    case CK_MOE_WGMMA:
    case CK_MOE_MMA:
    case CK_MOE_FP32: return moe_sorted(c, k, table, a, x, n_tokens, ids, weights, work, out);
    default: return false;
    }
}

static void cu_moe_experts(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                           const float *weights, const struct moe_args *a, float *work, float *out)
{
    struct cuda_backend *c = ctx(be);
    if (n_tokens <= 0)
        return;
    ASSERT((int64_t)n_tokens * a->n_used < INT_MAX / 4);
    const struct cuda_wdev *table = moe_table_get(c, a);
    if (!table)
        return;
    const enum weight_format fmt = a->gate[0].format;
    if (a->up[0].format != fmt || a->down[0].format != fmt) {
        /* experts of mixed formats (no checkpoint we read has them): the portable grouped GEMM reads
         * each projection in its own format */
        const struct kernel_desc *k = kernel_table_find(&CUDA_KERNELS, "moe_experts_gemm_sorted");
        moe_sorted(c, k, table, a, x, n_tokens, ids, weights, work, out);
        return;
    }
    const struct kernel_shape sh = {.format = fmt, .tokens = n_tokens, .n_weights = 1, .d_model = a->d_model,
                                    .d_expert = a->d_expert, .n_used = a->n_used, .n_experts = a->n_experts};
    const struct plan_dispatch *d = plan_dispatch_for(&c->plan, PLAN_OP_MOE_EXPERTS, n_tokens, fmt);
    for (int i = 0; i < d->n; i++)
        if ((!d->kernels[i]->fits || d->kernels[i]->fits(&sh, c->smem_budget)) &&
            moe_launch(c, d->kernels[i], table, a, x, n_tokens, ids, weights, work, out))
            return;
    PANIC("cuda: no kernel of the plan takes %s experts at %d tokens (d_model %d, d_expert %d)",
          weight_format_name(fmt), n_tokens, a->d_model, a->d_expert);
}

static void cu_add(struct backend *be, float *y, const float *x, size_t n)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_add(c->stream, y, x, n));
}

/* ---------------------------------------------------------------- MLA + DSA (cuda_mla.cu, cuda_dsa.cu) */

/* Scores of the DSA selection are kept for a chunk of query rows at a time, each row as long
 * as the longest context a block table can hold: at most this many floats (256 MiB). */
#define DSA_SCRATCH_FLOATS ((size_t)64 << 20)

static void cu_layernorm(struct backend *be, const float *x, const float *w, const float *b, int rows, int dim,
                         float eps, float *y)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_layernorm(c->stream, x, w, b, rows, dim, eps, y));
}

static void cu_mla_store(struct backend *be, const struct paged_latent *kv, const float *ckv, const float *w,
                         float eps, const float *idx_k, int n_tokens, const int32_t *slots)
{
    struct cuda_backend *c = ctx(be);
    CHECK(c, cuda_mla_store(c->stream, kv, ckv, w, eps, idx_k, n_tokens, slots));
}

static void cu_mla_absorb_q(struct backend *be, const struct weight *kv_b, const struct mla_dims *m, const float *q,
                            int n_tokens, float *q_abs)
{
    struct cuda_backend *c = ctx(be);
    struct cuda_wdev wd = {.data = kv_b->data, .scale = kv_b->scale, .bias = NULL, .scale2 = kv_b->scale2};
    CHECK(c, cuda_mla_absorb_q(c->stream, kv_b->format, &wd, m, q, n_tokens, q_abs));
}

static void cu_mla_expand_o(struct backend *be, const struct weight *kv_b, const struct mla_dims *m,
                            const float *o_lat, int n_tokens, float *out)
{
    struct cuda_backend *c = ctx(be);
    struct cuda_wdev wd = {.data = kv_b->data, .scale = kv_b->scale, .bias = NULL, .scale2 = kv_b->scale2};
    CHECK(c, cuda_mla_expand_o(c->stream, kv_b->format, &wd, m, o_lat, n_tokens, out));
}

static void cu_mla_attention(struct backend *be, const float *q_abs, const struct paged_latent *kv,
                             const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k, float scale,
                             float *o_lat)
{
    struct cuda_backend *c = ctx(be);
    if (b->n_tokens <= 0)
        return;
    int dk = kv->kv_rank + kv->rope_dim;
    struct cuda_mla_cfg cfg = c->mla_attn;
    if (!cuda_mla_attention_fit(&cfg, n_heads, dk, kv->kv_rank, c->smem_budget))
        PANIC("cuda: no MLA attention tile fits %d latent dims in %zu bytes of shared memory", dk, c->smem_budget);
    int64_t blocks = (int64_t)b->n_tokens * ceil_div(n_heads, cfg.rows); /* per split */
    int splits = 1;
    if (c->force_splits > 0) {
        splits = c->force_splits;
    } else if (c->force_splits == 0 && blocks < c->sm_count) {
        /* few tokens (decode): split each token's keys so that every SM has work; the key list is
         * at most sel_k long with a selection, unknown (device-side positions) without */
        splits = ceil_div(2 * (int64_t)c->sm_count, blocks);
        if (sel && splits > ceil_div(sel_k, cfg.keys))
            splits = ceil_div(sel_k, cfg.keys);
        if (splits > 64)
            splits = 64;
    }
    float *work = NULL;
    size_t wf = cuda_mla_attention_workspace_floats(b->n_tokens, n_heads, kv->kv_rank, splits);
    if (wf && !(work = scratch_get(c, wf * sizeof(float))))
        return;
    CHECK(c, cuda_mla_attention(c->stream, q_abs, kv, b, n_heads, sel, sel_k, scale, o_lat, &cfg, splits, work));
}

static void cu_dsa_select(struct backend *be, const float *q_idx, const float *w_idx, const struct paged_latent *kv,
                          const struct attn_batch *b, const struct dsa_args *a, float *work, int32_t *sel)
{
    struct cuda_backend *c = ctx(be);
    (void)work; /* the CPU's candidate heaps; here the scores live in the backend's scratch */
    if (b->n_tokens <= 0)
        return;
    struct cuda_dsa_cfg cfg = c->dsa;
    if (!cuda_dsa_fit(&cfg, a->n_heads, a->head_dim, c->smem_budget))
        PANIC("cuda: no DSA score tile fits %d x %d indexer dims in %zu bytes", a->n_heads, a->head_dim,
              c->smem_budget);
    /* positions are device-side: a row is as long as the longest context the block table holds */
    int64_t ctx64 = (int64_t)b->max_blocks * kv->block_size;
    ASSERT(ctx64 > 0 && ctx64 <= INT_MAX);
    int ctx_len = (int)ctx64;
    size_t rows = DSA_SCRATCH_FLOATS / (size_t)ctx_len;
    int chunk = rows < 1 ? 1 : rows > (size_t)b->n_tokens ? b->n_tokens : (int)rows;
    if (chunk > 65535)
        chunk = 65535;
    float *scores = scratch_get(c, (size_t)chunk * (size_t)ctx_len * sizeof(float));
    if (!scores)
        return;
    int key_blocks = ceil_div(2 * (int64_t)c->sm_count, chunk);
    if (key_blocks > ceil_div(ctx_len, cfg.keys))
        key_blocks = ceil_div(ctx_len, cfg.keys);
    for (int r0 = 0; r0 < b->n_tokens; r0 += chunk) {
        int nr = b->n_tokens - r0 < chunk ? b->n_tokens - r0 : chunk;
        if (!CHECK(c, cuda_dsa_scores(c->stream, q_idx, w_idx, kv, b, a, r0, nr, ctx_len, &cfg, key_blocks,
                                      scores)) ||
            !CHECK(c, cuda_dsa_topk(c->stream, scores, ctx_len, b->pos, r0, nr, a->topk, sel)))
            return;
    }
}

/* ---------------------------------------------------------------- lifetime */

static void cuda_backend_free(struct cuda_backend *c)
{
    if (c->stream)
        CHECK(c, cudaStreamSynchronize(c->stream));
    for (size_t i = 0; i < c->n_owned; i++)
        CHECK(c, cudaFree(c->owned[i]));
    graphs_drop(c);
    free(c->graphs);
    for (int i = 0; i < c->n_tables; i++) {
        CHECK(c, cudaFree(c->tables[i].dev));
        free(c->tables[i].host);
    }
    if (c->scratch)
        CHECK(c, cudaFree(c->scratch));
    if (c->sem)
        CHECK(c, cudaFree(c->sem));
    if (c->blas)
        CHECK(c, cublasDestroy(c->blas));
    if (c->stream)
        CHECK(c, cudaStreamDestroy(c->stream));
    free(c->owned);
    free(c->tables);
    free(c->tmp);
    free(c);
}

static void cu_destroy(struct backend *be)
{
    /* the kernels' phase records (a -DMOESERVE_KERNEL_TRACE=ON build), where asked for */
    struct options o;
    struct err e;
    if (be->impl && options_read(&o, &e) == STATUS_OK && o.trace_out[0])
        cuda_ktrace_dump(o.trace_out);
    if (be->impl)
        cuda_backend_free(ctx(be));
    be->impl = NULL;
}

static const struct backend_ops CUDA_OPS = {
    .name = "cuda",
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .synchronize = cu_synchronize,
    .weight_load = cu_weight_load,
    .embed = cu_embed,
    .linear = cu_linear,
    .rmsnorm = cu_rmsnorm,
    .add_rmsnorm = cu_add_rmsnorm,
    .rope = cu_rope,
    .kv_store = cu_kv_store,
    .attention = cu_attention,
    .silu_mul = cu_silu_mul,
    .moe_route = cu_moe_route,
    .router_route = cu_router_route,
    .norm_router_route = cu_norm_router_route,
    .moe_experts = cu_moe_experts,
    .add = cu_add,
    .linear_multi = cu_linear_multi,
    .attn_prep = cu_attn_prep,
    .argmax = cu_argmax,
    .sample = cu_sample,
    .graph_replay = cu_graph_replay,
    .graph_capture_begin = cu_graph_capture_begin,
    .graph_capture_end = cu_graph_capture_end,
    .layernorm = cu_layernorm,
    .mla_store = cu_mla_store,
    .mla_absorb_q = cu_mla_absorb_q,
    .mla_attention = cu_mla_attention,
    .mla_expand_o = cu_mla_expand_o,
    .dsa_select = cu_dsa_select,
};

/* The compiled tile with the largest tile_m not above the plan's. */
static enum cuda_gemm_tile gemm_tile_from(const struct op_plan *op)
{
    if (op->tile_m >= 64)
        return CUDA_GEMM_64x64;
    if (op->tile_m >= 32)
        return CUDA_GEMM_32x64;
    return CUDA_GEMM_16x64;
}

/* Reads the kernel configuration out of the plan. A missing entry means the
 * portable default, said loudly (devices.md, planner rule 4). */
static void configure_from_plan(struct cuda_backend *c)
{
    const struct op_plan *op;
    c->attn_prefill = (struct cuda_attn_cfg){.rows = 64, .keys = 64, .threads = 128};
    if ((op = plan_find(&c->plan, "attention_prefill"))) {
        if (op->tile_m > 0)
            c->attn_prefill.rows = op->tile_m;
        if (op->tile_n > 0)
            c->attn_prefill.keys = op->tile_n;
        if (op->threads >= 32)
            c->attn_prefill.threads = op->threads;
        if (!strcmp(op->kernel, "attn_prefill_mma_bf16")) /* fitted per head_dim; fp32 for other dims */
            c->attn_mma =
                (struct cuda_attn_mma_cfg){.rows = op->tile_m, .keys = op->tile_n, .stages = op->stages};
    } else {
        LOG_WARN("cuda: the plan has no attention_prefill entry; using the portable 64x64 tile");
    }
    c->attn_mma.prec = c->attn_prec;
    c->attn_decode = (struct cuda_attn_cfg){.rows = 0, .keys = 64, .threads = 128};
    if ((op = plan_find(&c->plan, "attention_decode"))) {
        if (op->tile_m > 0)
            c->attn_decode.rows = op->tile_m; /* query heads of one KV head per block */
        if (op->tile_n > 0)
            c->attn_decode.keys = op->tile_n;
        if (op->threads >= 32)
            c->attn_decode.threads = op->threads;
    } else {
        LOG_WARN("cuda: the plan has no attention_decode entry; using 64 keys per step");
    }
    /* Decode kernels overlap their start with the previous kernel's end where the device has
     * programmatic dependent launch; cluster merges and the fused router + routing where the
     * device has clusters. Which linear and expert kernels run: the plan's dispatch table. */
    const struct device_caps *caps = &c->plan.caps;
    c->pdl = caps->pdl;
    c->moe_smem_min = 2;
    c->attn_cluster = caps->clusters;
    c->attn_push = true;
    c->router_route = caps->clusters;
    c->router_cluster = caps->clusters;
    c->router_min_tokens = 2;
    c->mla_attn = (struct cuda_mla_cfg){.rows = 16, .keys = 16, .threads = 128, .stages = 1};
    if ((op = plan_find(&c->plan, "mla_attention"))) {
        if (op->tile_m > 0)
            c->mla_attn.rows = op->tile_m; /* heads of one token per block */
        if (op->tile_n > 0)
            c->mla_attn.keys = op->tile_n;
        if (op->threads >= 32)
            c->mla_attn.threads = op->threads;
        c->mla_attn.stages = op->stages;
    } else {
        /* a plan for a model without MLA layers has none */
        LOG_DEBUG("cuda: the plan has no mla_attention entry; using 16 heads x 16 keys");
    }
    c->dsa = (struct cuda_dsa_cfg){.keys = 128, .stages = 1};
    if ((op = plan_find(&c->plan, "dsa_index"))) {
        if (op->tile_n > 0)
            c->dsa.keys = op->tile_n;
        c->dsa.stages = op->stages;
    } else {
        LOG_DEBUG("cuda: the plan has no dsa_index entry (no DSA layers); using 128 keys per block");
    }
    c->tile_moe = CUDA_GEMM_64x64;
    if ((op = plan_find(&c->plan, "moe_experts_gemm"))) {
        c->tile_moe = gemm_tile_from(op);
        c->wg_moe = (struct cuda_wgmma_tile){
            .tokens = op->tile_m, .rows = op->tile_n, .k = op->tile_k, .stages = 4};
    } else {
        LOG_WARN("cuda: the plan has no moe_experts_gemm entry; using the 64x64 fp32 tile");
    }
    /* "linear" is cuBLAS (no tile) for 16-bit weights; the quantised ones then use the expert tile */
    c->tile_linear = c->tile_moe;
    c->wg_linear = c->wg_moe;
    if ((op = plan_find(&c->plan, "linear")) && op->tile_m > 0) {
        c->tile_linear = gemm_tile_from(op);
        c->wg_linear = (struct cuda_wgmma_tile){
            .tokens = op->tile_m, .rows = op->tile_n, .k = op->tile_k, .stages = 4};
    }
}

/* The plan's variant filter: the kernels of this backend's table (cuda_registry.c), the wgmma
 * GEMMs only where their sm_90a image loaded on this device (*ctx: cuda_gemm_wgmma_loadable()). */
static bool variant_loads(void *ctx, const char *kernel)
{
    if (!cuda_kernel_registered(NULL, kernel))
        return false;
    return !strstr(kernel, "wgmma") || *(const bool *)ctx;
}

int backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

enum status backend_cuda_create(struct backend *be, int device, size_t smem_budget, struct err *err)
{
    return backend_cuda_create_for(be, device, smem_budget, NULL, NULL, err);
}

enum status backend_cuda_create_for(struct backend *be, int device, size_t smem_budget,
                                    const struct model_desc *desc, const struct plan_weights *weights,
                                    struct err *err)
{
    memset(be, 0, sizeof *be);
    int n = backend_cuda_device_count();
    if (device < 0 || device >= n)
        return err_set(err, STATUS_UNSUPPORTED, "cuda: device %d requested, %d CUDA device%s usable", device,
                       n, n == 1 ? "" : "s");
    struct options opt;
    enum status st = options_read(&opt, err);
    if (st)
        return st;
    if (!smem_budget)
        smem_budget = opt.smem_budget;
    struct cuda_backend *c = calloc(1, sizeof *c);
    if (!c)
        return err_set(err, STATUS_NOMEM, "cuda: out of host memory");
    c->device = device;
    struct device_caps caps;
    c->wgmma_loads = cuda_gemm_wgmma_loadable(device);
    struct plan_request req = {.desc = desc,
                               .weights = weights,
                               .smem_budget = smem_budget,
                               .variant_loads = variant_loads,
                               .variant_ctx = &c->wgmma_loads,
                               .kernels = &CUDA_KERNELS,
                               .force = opt.cuda_force[0] ? opt.cuda_force : NULL};
    if ((st = plan_caps_probe(&caps, device, err)) || (st = plan_build_request(&c->plan, &caps, &req, err))) {
        err_prefix(err, "cuda: planning for device %d", device);
        free(c);
        return st;
    }
    if (!CHECK(c, cudaSetDevice(device)) ||
        !CHECK(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking))) {
        st = cuda_sink_status(&c->sink, err);
        cuda_backend_free(c);
        return st;
    }
    if (!CHECK(c, cublasCreate(&c->blas)) || !CHECK(c, cublasSetStream(c->blas, c->stream)) ||
        !CHECK(c, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH))) {
        st = cuda_sink_status(&c->sink, err);
        cuda_backend_free(c);
        return st;
    }
    c->smem_budget = c->plan.smem_budget ? c->plan.smem_budget : c->plan.caps.smem_per_block_optin;
    if (!c->smem_budget)
        c->smem_budget = 48 * 1024;
    c->sm_count = c->plan.caps.sm_count;
    if (c->sm_count <= 0 &&
        !CHECK(c, cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device)))
        c->sm_count = 1;
    c->attn_prec = opt.attn_prec;
    if (opt.attn_splits_none)
        c->force_splits = -1;
    configure_from_plan(c);
    LOG_DEBUG("cuda: %s", cuda_build_arch_list());
    const struct plan_dispatch *d1 = plan_dispatch_for(&c->plan, PLAN_OP_MOE_EXPERTS, 1, c->plan.weights.experts),
                               *dn = plan_dispatch_for(&c->plan, PLAN_OP_MOE_EXPERTS, 1 << 20, c->plan.weights.experts);
    LOG_INFO("cuda: device %d (%s), %d SMs, shared-memory budget %zu bytes/block; attention prefill %dx%d "
             "(%d threads), decode %d keys; experts %s at 1 token, %s in prefill (moeserve plan: the whole table)",
             device, c->plan.caps.name, c->sm_count, c->smem_budget, c->attn_prefill.rows, c->attn_prefill.keys,
             c->attn_prefill.threads, c->attn_decode.keys, d1->n ? d1->kernels[0]->name : "-",
             dn->n ? dn->kernels[0]->name : "-");
    be->ops = &CUDA_OPS;
    be->impl = c;
    return STATUS_OK;
}

enum status backend_cuda_status(const struct backend *be, struct err *err)
{
    return cuda_sink_status(&((const struct cuda_backend *)be->impl)->sink, err);
}

const struct plan *backend_cuda_plan(const struct backend *be)
{
    return &((const struct cuda_backend *)be->impl)->plan;
}

void backend_cuda_set_attention_splits(struct backend *be, int n)
{
    ctx(be)->force_splits = n;
}

void backend_cuda_set_legacy_decode(struct backend *be, bool on)
{
    ctx(be)->legacy_decode = on;
}

void backend_cuda_set_attn_cluster(struct backend *be, bool on)
{
    struct cuda_backend *c = ctx(be);
    c->attn_cluster = on && c->plan.caps.clusters;
}

void backend_cuda_set_attn_push(struct backend *be, bool on)
{
    ctx(be)->attn_push = on;
}

void backend_cuda_set_moe_smem(struct backend *be, int min_tokens)
{
    ctx(be)->moe_smem_min = min_tokens < 0 ? 0 : min_tokens;
}

enum status backend_cuda_force(struct backend *be, const char *force, struct err *err)
{
    struct cuda_backend *c = ctx(be);
    struct plan_request req = {.variant_loads = variant_loads,
                               .variant_ctx = &c->wgmma_loads,
                               .kernels = &CUDA_KERNELS,
                               .force = force && *force ? force : NULL};
    graphs_drop(c); /* captured steps ran the old choices */
    return plan_dispatch_fill(&c->plan, &req, err);
}

void backend_cuda_set_router_route_cluster(struct backend *be, bool on)
{
    struct cuda_backend *c = ctx(be);
    c->router_cluster = on && c->plan.caps.clusters;
}

void backend_cuda_set_router_route(struct backend *be, bool on)
{
    ctx(be)->router_route = on;
    ctx(be)->router_min_tokens = 1;
}
