/* backend_cuda.c — the CUDA backend's host side: the ops table, device memory,
 * the stream, the cuBLAS handle, weight upload, and the plan -> kernel
 * configuration (see backend_cuda.h).
 *
 * Everything runs on one non-blocking stream of the device chosen at
 * creation; upload/download/synchronize order against it. Weights are copied
 * once, in their file format, into allocations this backend owns (the
 * model's struct weight only borrows them) and frees at destroy.
 *
 * Linear layers: BF16 and F32 weights go through cuBLAS (F32: SGEMM, no
 * TF32; BF16: bf16 x bf16 -> fp32 GEMM on activations split into bf16
 * hi + lo, because activations rounded to bf16 once put a golden fixture
 * 7.5e-2 away from transformers while the split stays near 1e-5), every
 * other format (F16, FP8 block, NVFP4) through cuda_gemm.cu, which reads the
 * stored format and accumulates in fp32. MoE experts of every format go
 * through the grouped kernel of cuda_gemm.cu (cuda_moe.cu sorts and
 * combines), with no host synchronisation.
 *
 * Tile sizes come from the plan built at creation (plan_build_request with
 * the device's caps, the model's shapes and weight formats where the caller
 * gives them (backend_cuda_create_for), the shared-memory budget, and a filter that admits only
 * the variants this backend has: cuda_variants.c, the wgmma GEMMs only where
 * their sm_90a image loaded on the device); nothing here
 * compares compute capabilities. A plan entry that does not fit this kernel's own
 * shared-memory layout is shrunk to fit the budget, never grown.
 *
 * Not here: multiple devices per backend, CUDA graphs, tensor-core GEMM
 * variants for quantized weights (next), a quantized KV cache.
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
#include "backend/cuda_variants.h"
#include "backend/cuda/cuda_kernels.h"
#include "base/log.h"

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
    int pdl;            /* decode kernels use programmatic dependent launch (device_caps.pdl) */
    int pdl_gemv;       /* the decode GEMVs do */
    int gemv_rows;      /* MOESERVE_GEMV_ROWS: rows per warp of the decode GEMV (0: by shape) */
    bool fuse_attn;     /* decode fusions taken: norm + q/k/v GEMV, o GEMV + residual add */
    bool fuse_moe;      /* norm + router GEMV, routing in the MoE kernel, residual in moe_down */
    bool use_stream;    /* one-token GEMVs through cuda_decode_stream.cu (one wave, weights through
                           shared memory before the wait) */
    bool use_stream_moe; /* ... and the one-token MoE */
    bool decode_mma;     /* few-token NVFP4 MoE on bf16 tensor cores (cuda_decode_mma.cu) */
    bool decode_mma_dense; /* ... and the one-token NVFP4 GEMVs (cuda_gemv_mma) */
    bool dec16_make;       /* dense NVFP4 weights get a second copy in the dec16 layout at load */
    bool dec16;            /* ... and one-token linears without fusions read it (cuda_dec16_gemv) */
    bool dec16_multi_only; /* ... only launches of several weights (q/k/v; MOESERVE_DEC16=qkv) */
    bool dec16_moe;        /* routed NVFP4 experts get dec16 copies; one-token gate/up reads them */
    int gemv_mma_tokens;   /* ... and the NVFP4 linears of up to this many rows (2..8) */
    int gemv_mma_chunks;   /* ... and up to this many such launches for more rows (1: none) */
    int moe_bf16_rows;     /* NVFP4 experts from this many rows an expert: bf16 copies + cuBLAS (0: never) */
    size_t moe_bf16_bytes; /* ... in passes of at most this much scratch */
    bool attn_prewait;     /* decode attention: old keys issued before the PDL wait */
    bool attn_cluster;     /* decode attention: splits merged in a cluster's shared memory */
    bool attn_push;        /* ... the splits pushing their partials to the leader (else pulled) */
    bool moe_l2_down;      /* MoE mma gate/up queues the pairs' down weights into L2 */
    bool moe_early;        /* MoE mma: down starts early and loads its routing and weights first */
    int moe_smem_min;      /* MoE mma: the weights through shared memory (cuda_moe_decode_mma smem_tpw) from
                              this many tokens on (0: never) */
    int moe_smem_tpw;      /* ... the down kernel's tiles a warp (1 | 2; 0: chosen by the SM count) */
    bool moe_smem_down;    /* ... below moe_smem_min tokens, the down kernel alone in that form */
    int moe_mma_unroll;    /* weight groups a warp of those MoE kernels keeps in flight (4 | 8 | 16) */
    int moe_mma_ks;        /* warps sharing one gate/up row tile of those kernels (1 | 2) */
    bool router_route;     /* few tokens: router GEMV + routing in one kernel */
    bool router_cluster;   /* ... in its thread-block-cluster form (caps "clusters") */
    int router_min_tokens; /* ... from this many tokens of a pass */
    bool prep_attention;   /* one decode token: attn_prep folded into the decode attention */
    bool prep_cluster;     /* ... its heads shared out over a thread block cluster of splits */
    bool decode_fp8;       /* ... or on e4m3 tensor cores (cuda_decode_fp8.cu, never run: opt-in) */
    bool l2_pf_experts;  /* routing asks L2 for the chosen experts' weights (caps "tma") */
    int l2_pf_blocks;    /* ... spread over this many extra blocks */
    bool l2_pf_attn;     /* the decode attention takes the prefetch op's hints (caps "tma") */
    bool l2_pf_down;     /* the MoE decode down kernel does */
    struct cuda_l2_ranges pf_pending; /* the last hint, for the next kernel that takes hints */
    bool layer_kernel;   /* one-token GQA + MoE layers in one kernel (cuda_layer_decode.cu) */
    int layer_blocks;    /* ... with at most this many blocks per SM */
    unsigned *bar;       /* device: its grid barrier (count, copies of the generation) */
    unsigned long long *layer_trace; /* device: its phase trace (MOESERVE_LAYER_TRACE=1), or NULL */
    size_t stream_smem_dense, stream_smem_gate_up, stream_smem_down; /* their per-block budgets */
    void **owned; /* (n_owned) device allocations holding weights */
    size_t n_owned, cap_owned;
    struct moe_table *tables; /* (n_tables) */
    int n_tables, cap_tables;
    struct cuda_wdev *tmp; /* (tmp_cap) host scratch for building a table */
    size_t tmp_cap;
    int moe_decode_max_tokens; /* up to this many tokens the MoE block runs pair by pair (0: the plan's) */
    bool moe_mma, linear_mma;  /* the plan chose the bf16 mma.sync GEMM (cuda_gemm_mma.cu) */
    bool moe_wgmma, linear_wgmma; /* ... or the Hopper wgmma GEMM (cuda_gemm_wgmma.cu) */
    int linear_dequant_rows;      /* NVFP4 linears of >= this many rows: bf16 copy + cuBLAS (0: never) */
    struct cuda_wgmma_tile wg_moe, wg_linear; /* its planned tiles, fitted per call */
    int wg_stages; /* 4: two k-steps in flight where compiled and fitting (default), 3: one */
    bool wg_image; /* ... reading x pre-split once into the scratch buffer (cuda_gemm_wgmma_image) */
    int moe_rows_gate_up, moe_rows_down; /* output rows per warp of the MoE decode kernels */
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

/* The dec16 copy of a dense NVFP4 weight (cuda_dec16.cu): the same bytes reordered for the
 * one-token GEMV. Optional: where memory runs out the weight keeps only its checkpoint layout. */
static void dec16_copy(struct cuda_backend *c, struct weight *w)
{
    size_t data = (size_t)w->rows * (size_t)w->cols / 2, scale = (size_t)w->rows * (size_t)w->cols / 16;
    void *d = NULL, *s = NULL;
    if (cudaMalloc(&d, data) != cudaSuccess || cudaMalloc(&s, scale) != cudaSuccess) {
        (void)cudaGetLastError();
        if (d)
            CHECK(c, cudaFree(d));
        LOG_WARN("cuda: no memory for the decode copy of a %lld x %lld NVFP4 weight; its one-token "
                 "GEMV reads the checkpoint layout",
                 (long long)w->rows, (long long)w->cols);
        return;
    }
    if (!own(c, d)) {
        CHECK(c, cudaFree(d));
        CHECK(c, cudaFree(s));
        return;
    }
    if (!own(c, s)) { /* d is owned: freed with the backend */
        CHECK(c, cudaFree(s));
        return;
    }
    struct cuda_wdev wd = {.data = w->data, .scale = w->scale};
    if (CHECK(c, cuda_dec16_pack(c->stream, &wd, w->rows, w->cols, d, s)) &&
        CHECK(c, cudaStreamSynchronize(c->stream)))
        w->dec_data = d, w->dec_scale = s;
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
    out->dec_data = out->dec_scale = NULL;
    enum status st = upload_owned(c, host->data, data, &out->data, err);
    if (!st && scale)
        st = upload_owned(c, host->scale, scale, &out->scale, err);
    if (!st &&
        (((flags & WEIGHT_LOAD_DENSE) && c->dec16_make) ||
         ((flags & WEIGHT_LOAD_EXPERT) && !(flags & WEIGHT_LOAD_EXPERT_DOWN) && c->dec16_moe)) &&
        host->format == WEIGHT_NVFP4 && cuda_dec16_shape_ok(host->rows, host->cols))
        dec16_copy(c, out);
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
 * the plan did not choose wgmma or the kernel cannot take these operands. */
static bool wgmma_fit(const struct cuda_backend *c, bool chosen, const struct cuda_wgmma_tile *planned,
                      enum weight_format fmt, int64_t K, const float *x, double rows,
                      struct cuda_wgmma_tile *t)
{
    if (!chosen || !cuda_gemm_wgmma_supported(fmt, K, x))
        return false;
    *t = *planned;
    return cuda_gemm_wgmma_fit(t, fmt, K, rows, c->smem_budget);
}

/* *img: x (rows x K) pre-split for tile t in the scratch buffer (the wgmma GEMMs then copy it as
 * it is), or NULL: switched off (MOESERVE_WG_IMAGE=0) or no scratch (a capture that must grow it
 * is spoiled by scratch_get and rerun directly); NULL makes the GEMM split x in every block.
 * False when the split failed (recorded). */
static bool wg_image_make(struct cuda_backend *c, const float *x, int64_t rows, int64_t K,
                          const struct cuda_wgmma_tile *t, void **img)
{
    *img = c->wg_image ? scratch_get(c, cuda_gemm_wgmma_image_bytes(rows, K, t)) : NULL;
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

static bool gemv_fused(struct cuda_backend *c, int n_w, const struct weight *const *ws, const float *x, int m,
                       float *const *ys, const struct cuda_gemv_fuse *fz);

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

static void cu_linear(struct backend *be, const struct weight *w, const float *x, int m, float *y)
{
    struct cuda_backend *c = ctx(be);
    if (m <= 0)
        return;
    ASSERT(w->rows <= INT_MAX && w->cols <= INT_MAX);
    int N = (int)w->rows, K = (int)w->cols;
    const float one = 1.0f, zero = 0.0f;
    struct cuda_gemv_fuse none = {0};
    if (m >= 1 && (c->use_stream || c->decode_mma_dense) && gemv_fused(c, 1, &w, x, m, &y, &none))
        return;
    if (m == 1 && cuda_gemv1_supported(w->format, K, x, c->smem_budget)) {
        /* one row: a memory-bound GEMV that reads W once at full width, fp32 products */
        struct cuda_wdev wd = wdev_of(w);
        int64_t n64 = N;
        struct cuda_gemv_fuse fz = {.rows_per_warp = c->gemv_rows};
        CHECK(c, cuda_gemv1(c->stream, w->format, 1, &wd, &n64, K, x, &y, c->pdl_gemv, &fz));
        return;
    }
    if (w->format == WEIGHT_BF16) {
        char *s = scratch_get(c, cublas_split_bytes(m, N, K));
        if (s)
            linear_cublas_bf16(c, w->data, 1.0f, w->bias, x, m, N, K, y, s);
        return;
    } else if (w->format == WEIGHT_NVFP4 && c->linear_dequant_rows > 0 && m >= c->linear_dequant_rows) {
        /* the weight expanded to bf16 in scratch (exact; its global scale as the GEMM's alpha),
         * then cuBLAS as for a bf16 weight (MOESERVE_LINEAR_DEQUANT) */
        size_t w_bytes = ((size_t)N * (size_t)K * sizeof(uint16_t) + 255) / 256 * 256;
        char *s = scratch_get(c, w_bytes + cublas_split_bytes(m, N, K));
        struct cuda_wdev wd = wdev_of(w);
        if (s && CHECK(c, cuda_nvfp4_to_bf16(c->stream, &wd, N, K, (uint16_t *)s)))
            linear_cublas_bf16(c, s, w->scale2, w->bias, x, m, N, K, y, s + w_bytes);
        return;
    } else if (w->format == WEIGHT_F32) {
        if (!CHECK(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, &one, w->data, K, x, K, &zero,
                                  y, N)))
            return;
    } else {
        struct cuda_wdev wd = wdev_of(w);
        enum cuda_gemm_tile tile = tile_for_rows(c->tile_linear, m);
        struct cuda_wgmma_tile wt;
        if (m > 8 && wgmma_fit(c, c->linear_wgmma, &c->wg_linear, w->format, K, x, m, &wt)) {
            void *img;
            if (wg_image_make(c, x, m, K, &wt, &img))
                CHECK(c, cuda_gemm_wgmma(c->stream, w->format, &wd, N, K, x, m, y, &wt, img));
        } else if (m > 8 && c->linear_mma && cuda_gemm_mma_supported(w->format, K, x))
            CHECK(c, cuda_gemm_mma(c->stream, w->format, &wd, N, K, x, m, y, cuda_gemm_tile_rows(tile)));
        else
            CHECK(c, cuda_gemm(c->stream, w->format, &wd, N, K, x, m, y, tile));
        return; /* bias added in the kernel's epilogue */
    }
    if (w->bias)
        CHECK(c, cuda_bias_add(c->stream, y, w->bias, m, N));
}

/* One GEMV launch over n_w weights sharing x, with the prologue/epilogue fz asks for (none: all
 * zero); false if the decode GEMV does not take them (mixed formats or widths, misaligned rows;
 * m > 1: only NVFP4 on tensor cores without fusions, up to the rows cuda_gemv_mma takes). */
static bool gemv_fused(struct cuda_backend *c, int n_w, const struct weight *const *ws, const float *x, int m,
                       float *const *ys, const struct cuda_gemv_fuse *fz)
{
    if (m < 1 || n_w < 1 || n_w > 3 || !cuda_gemv1_supported(ws[0]->format, ws[0]->cols, x, c->smem_budget))
        return false;
    if (m > 1 && (m > c->gemv_mma_tokens * c->gemv_mma_chunks || fz->norm_w || fz->residual || fz->pending ||
                  !c->decode_mma_dense || ws[0]->format != WEIGHT_NVFP4))
        return false;
    if (fz->norm_w && (!aligned16(fz->norm_w) || !aligned16(fz->x_out) || ws[0]->cols % 4))
        return false;
    struct cuda_wdev wd[3];
    int64_t N[3];
    for (int j = 0; j < n_w; j++) {
        if (ws[j]->format != ws[0]->format || ws[j]->cols != ws[0]->cols)
            return false;
        wd[j] = wdev_of(ws[j]);
        N[j] = ws[j]->rows;
    }
    if (m == 1 && c->dec16 && (n_w > 1 || !c->dec16_multi_only) && ws[0]->format == WEIGHT_NVFP4 &&
        !fz->norm_w && !fz->residual && !fz->pending) {
        struct cuda_wdev dd[3];
        bool all = true;
        for (int j = 0; j < n_w; j++) {
            dd[j] = wd[j];
            dd[j].data = ws[j]->dec_data, dd[j].scale = ws[j]->dec_scale;
            all &= ws[j]->dec_data != NULL;
        }
        if (all && cuda_dec16_supported(n_w, dd, N, ws[0]->cols, x, c->smem_budget)) {
            CHECK(c, cuda_dec16_gemv(c->stream, n_w, dd, N, ws[0]->cols, x, ys, c->sm_count, c->pdl));
            return true;
        }
    }
    /* more rows than one launch shares: near-equal chunks, each reading the weights once more
     * (still far fewer bytes than a bf16 copy of them; MOESERVE_GEMV_MMA_CHUNKS) */
    const int chunks = (m + c->gemv_mma_tokens - 1) / c->gemv_mma_tokens, rows = (m + chunks - 1) / chunks;
    if (c->decode_mma_dense && ws[0]->format == WEIGHT_NVFP4 &&
        cuda_gemv_mma_supported(n_w, wd, ws[0]->cols, fz->norm_w != NULL, rows, c->smem_budget) &&
        (!fz->norm_w || ((uintptr_t)x | (uintptr_t)fz->norm_w | (uintptr_t)fz->x_out) % 8 == 0)) {
        for (int r0 = 0; r0 < m; r0 += rows) {
            const int n = m - r0 < rows ? m - r0 : rows;
            float *yc[3];
            for (int j = 0; j < n_w; j++)
                yc[j] = ys[j] + (size_t)r0 * (size_t)N[j];
            if (!CHECK(c,
                       cuda_gemv_mma(c->stream, n_w, wd, N, ws[0]->cols, x + (size_t)r0 * (size_t)ws[0]->cols,
                                     n, yc, fz, c->sm_count, c->pdl)))
                break;
        }
        return true;
    }
    if (m > 1)
        return false;
    if (c->use_stream && !fz->pending &&
        cuda_stream_dense_supported(ws[0]->format, n_w, wd, N, ws[0]->cols, x, c->sm_count,
                                    c->stream_smem_dense)) {
        CHECK(c, cuda_stream_dense(c->stream, ws[0]->format, n_w, wd, N, ws[0]->cols, x, ys, fz, c->sm_count,
                                   c->stream_smem_dense, c->pdl));
        return true;
    }
    struct cuda_gemv_fuse f2 = *fz;
    f2.rows_per_warp = c->gemv_rows;
    CHECK(c, cuda_gemv1(c->stream, ws[0]->format, n_w, wd, N, ws[0]->cols, x, ys, c->pdl_gemv, &f2));
    return true;
}

static void cu_linear_multi(struct backend *be, int n_w, const struct weight *const *ws, const float *x, int m,
                            float *const *ys)
{
    struct cuda_gemv_fuse none = {0};
    if (gemv_fused(ctx(be), n_w, ws, x, m, ys, &none)) /* one launch for all of them */
        return;
    for (int j = 0; j < n_w; j++)
        cu_linear(be, ws[j], x, m, ys[j]);
}

static bool cu_norm_linear_multi(struct backend *be, int n_w, const struct weight *const *ws, const float *h,
                                 const float *delta, const float *norm_w, float eps, int m, float *x_out,
                                 float *const *ys)
{
    struct cuda_gemv_fuse fz = {.norm_w = norm_w, .eps = eps, .x_out = x_out, .pending = delta};
    return norm_w && ctx(be)->fuse_attn && (!delta || aligned16(delta)) &&
           gemv_fused(ctx(be), n_w, ws, h, m, ys, &fz);
}

static bool cu_linear_residual(struct backend *be, const struct weight *w, const float *x, int m, float *h,
                               const float *delta)
{
    struct cuda_gemv_fuse fz = {.residual = 1, .pending = delta};
    return ctx(be)->fuse_attn && gemv_fused(ctx(be), 1, &w, x, m, &h, &fz);
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

/* The prefetch op: ws's data and scales become the pending ranges (replacing any pending ones). */
static void cu_prefetch(struct backend *be, const struct weight *const *ws, int n)
{
    struct cuda_backend *c = ctx(be);
    if (!c->l2_pf_attn && !c->l2_pf_down)
        return;
    struct cuda_l2_ranges r = {.n = 0};
    for (int i = 0; i < n && r.n + 2 <= CUDA_L2_MAX_RANGES; i++) {
        if (!ws[i] || !ws[i]->data)
            continue;
        r.p[r.n] = ws[i]->data;
        r.bytes[r.n++] = weight_data_bytes(ws[i]);
        if (ws[i]->scale) {
            r.p[r.n] = ws[i]->scale;
            r.bytes[r.n++] = weight_scale_bytes(ws[i]);
        }
    }
    c->pf_pending = r;
}

/* The pending hint for a kernel that takes it (NULL: none, or this kernel does not: `takes`);
 * taken once. */
static const struct cuda_l2_ranges *prefetch_take(struct cuda_backend *c, bool takes, struct cuda_l2_ranges *out)
{
    if (c->pf_pending.n == 0 || !takes)
        return NULL;
    *out = c->pf_pending;
    c->pf_pending.n = 0;
    return out;
}

/* One decode token: attn_prep folded into the split decode attention (cuda_attn_decode_prep),
 * where cu_attention would take the split kernel; not with an L2 hint pending for attention. */
static bool cu_prep_attention(struct backend *be, const float *q, const float *k, const float *v, int n_tokens,
                              int n_heads, const float *q_norm, const float *k_norm, float eps,
                              const struct rope_args *rope, const int32_t *pos, const struct paged_kv *kv,
                              const int32_t *slots, const struct attn_batch *b, float scale, float *out)
{
    struct cuda_backend *c = ctx(be);
    (void)pos; /* b->pos: the same positions */
    if (!c->prep_attention || n_tokens != 1 || b->n_tokens != 1 || c->legacy_decode || c->l2_pf_attn ||
        c->force_splits < 0 || kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads)
        return false;
    const int hd = kv->head_dim, group = n_heads / kv->n_kv_heads;
    int splits = c->force_splits > 0 ? c->force_splits : ceil_div(2 * (int64_t)c->sm_count, kv->n_kv_heads);
    splits = splits > 64 ? 64 : splits < 2 ? 2 : splits;
    /* the cluster form as cu_attention takes clusters: one cluster per KV head must fit the SMs,
     * the automatic split count rounded up to a multiple of the cluster */
    int cluster = 1;
    bool push = false;
    if (c->prep_cluster && c->attn_cluster && (int64_t)kv->n_kv_heads * CUDA_ATTN_CLUSTER <= c->sm_count) {
        int sc = c->force_splits > 0 ? splits : ceil_div(splits, CUDA_ATTN_CLUSTER) * CUDA_ATTN_CLUSTER;
        push =
            c->attn_push && cuda_attn_decode_prep_cluster_supported(group, hd, sc, rope, 1, c->smem_budget);
        if (sc <= 64 && cuda_attn_decode_prep_cluster_supported(group, hd, sc, rope, push, c->smem_budget))
            splits = sc, cluster = CUDA_ATTN_CLUSTER;
    }
    if (cluster == 1 && !cuda_attn_decode_prep_supported(group, hd, splits, rope, c->smem_budget))
        return false;
    float *work = scratch_get(c, cuda_attention_workspace_floats(1, n_heads, hd, splits) * sizeof(float));
    int *sem = sem_get(c, (size_t)kv->n_kv_heads);
    if (!work || !sem)
        return false;
    CHECK(c, cuda_attn_decode_prep(c->stream, q, k, v, kv, b, n_heads, scale, out, splits, work, sem, q_norm,
                                   k_norm, eps, rope, slots, c->pdl, cluster, push));
    return true;
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
        struct cuda_l2_ranges pf;
        /* clusters of CUDA_ATTN_CLUSTER splits merge in shared memory (caps "clusters"); the
         * automatic split count is rounded up to a multiple of it (at most 64). Only while one
         * cluster per (token, KV head) fits the SMs: on the H200 (session 7, Qwen3-30B-A3B,
         * 192 keys) batch 1 went 391.7 -> 408.9 tok/s with them, batch 8 (256 cluster blocks on
         * 132 SMs) 730.8 -> 718.8. */
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
            CHECK(c, cuda_attn_decode(c->stream, q, kv, b, n_heads, scale, out, splits, work, sem, c->pdl,
                                      c->attn_prewait, cluster, push, prefetch_take(c, c->l2_pf_attn, &pf)));
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

/* The routed experts' weights as the routing kernel asks L2 for them (false: no prefetch). */
static bool expert_prefetch_from(struct cuda_backend *c, const struct moe_args *a, struct cuda_expert_prefetch *pf)
{
    if (!c->l2_pf_experts || !a || a->n_experts < 1)
        return false;
    const struct cuda_wdev *table = moe_table_get(c, a);
    if (!table)
        return false;
    const struct weight *w[3] = {&a->gate[0], &a->up[0], &a->down[0]};
    *pf = (struct cuda_expert_prefetch){.table = table, .n_experts = a->n_experts, .blocks = c->l2_pf_blocks};
    for (int m = 0; m < 3; m++) {
        pf->data_bytes[m] = weight_data_bytes(w[m]);
        pf->scale_bytes[m] = weight_scale_bytes(w[m]);
    }
    return true;
}

/* The most tokens the MoE block of n_experts, top n_used, runs pair by pair. */
static int moe_pair_max(const struct cuda_backend *c, int n_experts, int n_used)
{
    return c->moe_decode_max_tokens > 0 ? c->moe_decode_max_tokens
                                        : plan_moe_pair_max_tokens(n_experts, n_used);
}

/* A few tokens: the router GEMV and the routing in one kernel (cuda_router_route.cu), unless the
 * routing is asked to prefetch experts (that lives in the routing kernel). */
static bool cu_router_route(struct backend *be, const struct weight *router, const float *x, int n_tokens,
                            const struct route_args *args, float *logits, int32_t *ids, float *weights)
{
    struct cuda_backend *c = ctx(be);
    struct cuda_expert_prefetch pf;
    if (!c->router_route || n_tokens > moe_pair_max(c, args->n_experts, args->n_used) ||
        n_tokens < c->router_min_tokens || expert_prefetch_from(c, args->experts, &pf) ||
        !cuda_router_route_supported(router, n_tokens, args, c->smem_budget) || !aligned16(x))
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
    struct cuda_expert_prefetch pf;
    if (!c->router_route || !c->router_cluster || n_tokens > moe_pair_max(c, args->n_experts, args->n_used) ||
        n_tokens < c->router_min_tokens || expert_prefetch_from(c, args->experts, &pf) ||
        !cuda_norm_router_route_supported(router, n_tokens, args, c->smem_budget) || !aligned16(h) ||
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
    struct cuda_expert_prefetch pf;
    bool pf_on = expert_prefetch_from(c, args->experts, &pf);
    CHECK(c, cuda_moe_route(c->stream, logits, n_tokens, args, ids, weights, c->pdl, pf_on ? &pf : NULL));
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
 * entries each), then gate and up again pointing at their dec16 copies (NULL data where a weight
 * has none; MOESERVE_DEC16_MOE). */
enum { MOE_TABLE_ROWS = 5 };
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
        c->tmp[3 * n + e] = c->tmp[e];
        c->tmp[3 * n + e].data = a->gate[e].dec_data, c->tmp[3 * n + e].scale = a->gate[e].dec_scale;
        c->tmp[4 * n + e] = c->tmp[n + e];
        c->tmp[4 * n + e].data = a->up[e].dec_data, c->tmp[4 * n + e].scale = a->up[e].dec_scale;
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

/* Whether every expert's gate and up have a dec16 copy (MOESERVE_DEC16_MOE=1 at load). */
static bool moe_dec16_ok(const struct moe_args *a)
{
    if (a->gate[0].format != WEIGHT_NVFP4 || a->up[0].format != WEIGHT_NVFP4 ||
        a->down[0].format != WEIGHT_NVFP4)
        return false;
    for (int e = 0; e < a->n_experts; e++)
        if (!a->gate[e].dec_data || !a->up[e].dec_data)
            return false;
    return true;
}

/* Whether the one-token MoE goes through the stream kernels (one format for all three). */
static bool stream_moe_ok(const struct cuda_backend *c, const struct moe_args *a)
{
    enum weight_format fmt = a->gate[0].format;
    return c->use_stream_moe && a->up[0].format == fmt && a->down[0].format == fmt &&
           cuda_stream_moe_supported(fmt, a->d_model, a->d_expert, a->n_used, c->sm_count, c->stream_smem_gate_up,
                                     c->stream_smem_down);
}

/* The down kernel's 8-row tiles a warp of the shared-memory MoE form takes (0: not that form):
 * two where one tile a warp would give more blocks than SMs, so that the down kernel's whole grid
 * can be resident beside gate/up's; one where two do not fit the budget. Its cp.async copies
 * need every expert's data 16-byte and scales 8-byte aligned (c->tmp: the table just built). */
static int moe_smem_tpw(const struct cuda_backend *c, const struct moe_args *a, int n_tokens)
{
    const bool both = c->moe_smem_min && n_tokens >= c->moe_smem_min;
    if (!both && !c->moe_smem_down)
        return 0;
    for (int e = 0; e < 3 * a->n_experts; e++)
        if ((uintptr_t)c->tmp[e].data % 16 || (uintptr_t)c->tmp[e].scale % 8)
            return 0;
    int tpw = c->moe_smem_tpw ? c->moe_smem_tpw : (a->d_model + 7) / 8 > c->sm_count ? 2 : 1;
    for (; tpw >= 1; tpw--)
        if (cuda_moe_decode_mma_smem_supported(a->d_model, a->d_expert, a->n_used, tpw, c->smem_budget))
            return both ? tpw : -tpw;
    return 0;
}

/* Prefill experts as cuBLAS GEMMs on bf16 copies of the used NVFP4 experts (cuda_moe_bf16.cu):
 * sort, read the segments on the host (one sync: never inside a capture), then per pass of
 * experts: copy, gather x, a gate+up GEMM a segment (its own rows, no padding), SiLU, a down GEMM
 * a segment, rows back in sorted order; the usual combine. (cublasGemmGroupedBatchedEx would
 * take a pass in one call, but answers NOT_SUPPORTED for bf16 inputs with f32 outputs: H200,
 * cuBLAS of CUDA 13.0.) False where it does not apply: the caller's kernels run instead. */
static bool moe_experts_bf16(struct cuda_backend *c, const struct cuda_wdev *table, const struct moe_args *a,
                             const float *x, int n_tokens, const int32_t *ids, const float *weights,
                             float *work, float *out)
{
    const int64_t pairs64 = (int64_t)n_tokens * a->n_used;
    if (c->capturing || c->moe_bf16_rows <= 0 || pairs64 < (int64_t)c->moe_bf16_rows * a->n_experts ||
        a->gate[0].format != WEIGHT_NVFP4 || a->up[0].format != WEIGHT_NVFP4 ||
        a->down[0].format != WEIGHT_NVFP4 || a->d_model % 16 || a->d_expert % 16 || 2 * pairs64 > INT_MAX / 8)
        return false;
    const int pairs = (int)pairs64, E = a->n_experts;
    const size_t D = (size_t)a->d_model, I = (size_t)a->d_expert;
    /* the workspace's layout as in cu_moe_experts: only yg and the sort's arrays are used */
    float *yg = work + (size_t)pairs * 2 * I;
    int32_t *sorted_pair = (int32_t *)(yg + (size_t)pairs * D);
    int32_t *row_of_pair = sorted_pair + pairs;
    int32_t *n_tiles = row_of_pair + pairs;
    int32_t *tiles = n_tiles + 1;
    const int max_tiles = cuda_moe_max_tiles(pairs, E, pairs);
    int32_t *h = malloc((1 + 3 * (size_t)max_tiles) * sizeof *h);
    if (!h)
        PANIC("cuda: out of host memory");
    bool ok = CHECK(c, cuda_moe_sort(c->stream, ids, pairs, E, pairs, sorted_pair, row_of_pair, tiles,
                                     n_tiles, max_tiles)) &&
              CHECK(c, cudaMemcpyAsync(h, n_tiles, (1 + 3 * (size_t)max_tiles) * sizeof *h,
                                       cudaMemcpyDeviceToHost, c->stream)) &&
              CHECK(c, cudaStreamSynchronize(c->stream));
    const int n_seg = ok ? h[0] : 0;
    const int32_t *seg = h + 1;
    int m_max = 0;
    for (int i = 0; i < n_seg; i++)
        m_max = seg[3 * i + 2] > m_max ? seg[3 * i + 2] : m_max;
    /* scratch: a pass's expert copies, the activations (x, then the SiLU's; rows doubled: hi,
     * lo) and the GEMM outputs */
    const size_t w_exp = 3 * I * D * 2, act = (2 * (size_t)pairs * (D > I ? D : I) * 2 + 255) / 256 * 256,
                 fixed = act + 2 * (size_t)pairs * (2 * I > D ? 2 * I : D) * 4;
    int group = c->moe_bf16_bytes > fixed ? (int)((c->moe_bf16_bytes - fixed) / w_exp) : 1;
    group = group < 1 ? 1 : group > n_seg ? n_seg : group;
    char *s = ok && n_seg ? scratch_get(c, (size_t)group * w_exp + fixed) : NULL;
    if (!s) {
        free(h);
        if (ok && !n_seg) /* no valid expert id at all: the combine writes zeros */
            CHECK(c, cuda_moe_combine(c->stream, ids, weights, n_tokens, a->n_used, (int)D, row_of_pair, yg,
                                      out));
        return true; /* else an error is recorded */
    }
    uint16_t *wgu = (uint16_t *)s, *wd = wgu + (size_t)group * 2 * I * D;
    uint16_t *xb = (uint16_t *)(s + (size_t)group * w_exp); /* x rows, later the activations */
    float *y = (float *)((char *)xb + act);
    const float one = 1.0f, zero = 0.0f;
    /* MOESERVE_MOE_BF16_TIMES=1: each stage's time (events; a diagnostic, it syncs every pass) */
    static const char *const stage[] = {"copy", "gather", "gemm1", "act", "gemm2", "rows", "combine"};
    enum { N_EV = 8 };
    cudaEvent_t ev[N_EV] = {0};
    float ms[N_EV - 1] = {0};
    const bool timed = getenv("MOESERVE_MOE_BF16_TIMES") != NULL;
    for (int i = 0; timed && i < N_EV; i++)
        CHECK(c, cudaEventCreate(&ev[i]));
#define STAGE(i) (!timed || CHECK(c, cudaEventRecord(ev[i], c->stream)))
    for (int s0 = 0; s0 < n_seg && ok; s0 += group) {
        const int ns = n_seg - s0 < group ? n_seg - s0 : group;
        ok = STAGE(0) &&
             CHECK(c, cuda_moe_bf16_experts(c->stream, table, E, (int64_t)D, (int64_t)I, tiles, s0, ns, wgu,
                                            wd)) &&
             STAGE(1) &&
             CHECK(c, cuda_moe_bf16_gather(c->stream, x, (int64_t)D, sorted_pair, a->n_used, tiles, s0, ns,
                                           m_max, xb)) &&
             STAGE(2);
        /* column-major views, as in linear_cublas_bf16: Y^T (N x 2 rows) = W (K x N)^T . X^T; a
         * segment's rows start at twice its first sorted row (hi rows, then lo rows) */
        for (int i = s0; ok && i < s0 + ns; i++) {
            const size_t r = 2 * (size_t)seg[3 * i + 1];
            ok = CHECK(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)(2 * I), 2 * seg[3 * i + 2],
                                       (int)D, &one, wgu + (size_t)(i - s0) * 2 * I * D, CUDA_R_16BF, (int)D,
                                       xb + r * D, CUDA_R_16BF, (int)D, &zero, y + r * 2 * I, CUDA_R_32F,
                                       (int)(2 * I), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        ok = ok && STAGE(3) &&
             CHECK(c, cuda_moe_bf16_act(c->stream, table, E, y, (int64_t)I, tiles, s0, ns, m_max, xb)) &&
             STAGE(4);
        for (int i = s0; ok && i < s0 + ns; i++) {
            const size_t r = 2 * (size_t)seg[3 * i + 1];
            ok = CHECK(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)D, 2 * seg[3 * i + 2], (int)I,
                                       &one, wd + (size_t)(i - s0) * D * I, CUDA_R_16BF, (int)I, xb + r * I,
                                       CUDA_R_16BF, (int)I, &zero, y + r * D, CUDA_R_32F, (int)D,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        ok =
            ok && STAGE(5) &&
            CHECK(c, cuda_moe_bf16_down_rows(c->stream, table, E, y, (int64_t)D, tiles, s0, ns, m_max, yg)) &&
            STAGE(6);
        for (int i = 0; ok && timed && i < N_EV - 2; i++) {
            float t = 0.0f;
            if (CHECK(c, cudaEventSynchronize(ev[i + 1])) &&
                CHECK(c, cudaEventElapsedTime(&t, ev[i], ev[i + 1])))
                ms[i] += t;
        }
    }
    if (ok)
        ok = CHECK(c, cuda_moe_combine(c->stream, ids, weights, n_tokens, a->n_used, (int)D, row_of_pair, yg,
                                       out)) &&
             STAGE(7);
    if (timed) {
        if (ok && CHECK(c, cudaEventSynchronize(ev[7])))
            CHECK(c, cudaEventElapsedTime(&ms[6], ev[6], ev[7]));
        LOG_INFO("moe_bf16: %d tokens, %d experts in passes of %d, %d rows an expert at most; ms: %s %.3f, "
                 "%s %.3f, %s %.3f, %s %.3f, %s %.3f, %s %.3f, %s %.3f",
                 n_tokens, n_seg, group, m_max, stage[0], ms[0], stage[1], ms[1], stage[2], ms[2], stage[3],
                 ms[3], stage[4], ms[4], stage[5], ms[5], stage[6], ms[6]);
        for (int i = 0; i < N_EV; i++)
            CHECK(c, cudaEventDestroy(ev[i]));
    }
#undef STAGE
    free(h);
    return true;
}

static void cu_moe_experts(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                           const float *weights, const struct moe_args *a, float *work, float *out)
{
    struct cuda_backend *c = ctx(be);
    if (n_tokens <= 0)
        return;
    int64_t pairs64 = (int64_t)n_tokens * a->n_used;
    ASSERT(pairs64 < INT_MAX / 4);
    int pairs = (int)pairs64;
    size_t D = (size_t)a->d_model, I = (size_t)a->d_expert, n = (size_t)a->n_experts;
    const struct cuda_wdev *table = moe_table_get(c, a);
    if (!table)
        return;
    if (n_tokens == 1 && stream_moe_ok(c, a)) {
        CHECK(c, cuda_stream_moe(c->stream, a->gate[0].format, table, a->n_experts, (int64_t)D, (int64_t)I, x,
                                 ids, weights, a->n_used, work, out, 0, c->sm_count, c->stream_smem_gate_up,
                                 c->stream_smem_down, c->pdl));
        return;
    }
    if (n_tokens <= moe_pair_max(c, a->n_experts, a->n_used) && c->decode_fp8 &&
        a->gate[0].format == WEIGHT_NVFP4 && a->up[0].format == WEIGHT_NVFP4 &&
        a->down[0].format == WEIGHT_NVFP4 &&
        cuda_moe_decode_fp8_supported(WEIGHT_NVFP4, a->d_model, a->d_expert, a->n_used, c->smem_budget)) {
        CHECK(c, cuda_moe_decode_fp8(c->stream, table, a->n_experts, (int64_t)D, (int64_t)I, x, n_tokens, ids,
                                     weights, a->n_used, work, out, 0, c->pdl));
        return;
    }
    if (n_tokens == 1 && c->dec16_moe && c->decode_mma && moe_dec16_ok(a) &&
        cuda_moe_decode_mma_supported(WEIGHT_NVFP4, a->d_model, a->d_expert, a->n_used, c->smem_budget) &&
        cuda_dec16_moe_supported(a->d_model, a->d_expert, a->n_used, c->smem_budget)) {
        /* gate/up from the experts' dec16 copies, down as below (MOESERVE_DEC16_MOE=1) */
        struct cuda_l2_ranges pf;
        if (CHECK(c, cuda_dec16_moe_gate_up(c->stream, table + 3 * n, table + 4 * n, a->n_experts, (int64_t)D,
                                            (int64_t)I, x, ids, a->n_used, work, c->sm_count, c->pdl)))
            CHECK(c, cuda_moe_decode_mma_down(c->stream, table, a->n_experts, (int64_t)D, (int64_t)I, 1, ids,
                                              weights, a->n_used, work, out, 0, c->pdl,
                                              prefetch_take(c, c->l2_pf_down, &pf),
                                              c->moe_mma_unroll == 4 ? 4 : 8));
        return;
    }
    if (n_tokens <= moe_pair_max(c, a->n_experts, a->n_used) && c->decode_mma &&
        a->gate[0].format == WEIGHT_NVFP4 && a->up[0].format == WEIGHT_NVFP4 &&
        a->down[0].format == WEIGHT_NVFP4 &&
        cuda_moe_decode_mma_supported(WEIGHT_NVFP4, a->d_model, a->d_expert, a->n_used, c->smem_budget)) {
        struct cuda_l2_ranges pf;
        CHECK(c, cuda_moe_decode_mma(c->stream, table, a->n_experts, (int64_t)D, (int64_t)I, x, n_tokens, ids,
                                     weights, a->n_used, work, out, 0, c->pdl,
                                     prefetch_take(c, c->l2_pf_down, &pf), c->moe_mma_unroll, c->moe_mma_ks,
                                     c->moe_l2_down, c->moe_early, moe_smem_tpw(c, a, n_tokens)));
        return;
    }
    if (n_tokens <= moe_pair_max(c, a->n_experts, a->n_used) &&
        cuda_moe_decode_supported(a->gate[0].format, a->d_model, a->d_expert, a->n_used, c->smem_budget) &&
        a->up[0].format == a->gate[0].format && a->down[0].format == a->gate[0].format) {
        /* few tokens: every (token, slot) pair streams its expert's rows once, no sort (cuda_decode.cu) */
        CHECK(c, cuda_moe_decode(c->stream, a->gate[0].format, table, a->n_experts, (int64_t)D, (int64_t)I, x,
                                 n_tokens, (int32_t *)ids, (float *)weights, a->n_used, work, out,
                                 c->moe_rows_gate_up, c->moe_rows_down, c->pdl, NULL));
        return;
    }
    if (moe_experts_bf16(c, table, a, x, n_tokens, ids, weights, work, out))
        return;
    double rows_per_expert = (double)pairs / (double)(a->n_experts < pairs ? a->n_experts : pairs);
    enum cuda_gemm_tile tile = tile_for_rows(c->tile_moe, rows_per_expert);
    enum weight_format fmt = a->gate[0].format;
    /* wgmma: gate/up (K = D) and down (K = I) share the sort, so their tiles must hold as many rows */
    struct cuda_wgmma_tile wt_in, wt_out;
    bool wg = a->up[0].format == fmt && a->down[0].format == fmt &&
              wgmma_fit(c, c->moe_wgmma, &c->wg_moe, fmt, (int64_t)D, x, rows_per_expert, &wt_in) &&
              wgmma_fit(c, c->moe_wgmma, &c->wg_moe, fmt, (int64_t)I, work, rows_per_expert, &wt_out) &&
              wt_in.tokens == wt_out.tokens;
    int bm = wg ? wt_in.tokens : cuda_gemm_tile_rows(tile);
    int max_tiles = cuda_moe_max_tiles(pairs, a->n_experts, bm);
    /* compact layout inside the caller's workspace (backend_moe_workspace_floats) */
    float *gate = work;
    float *up = gate + (size_t)pairs * I;
    float *yg = up + (size_t)pairs * I;
    int32_t *sorted_pair = (int32_t *)(yg + (size_t)pairs * D);
    int32_t *row_of_pair = sorted_pair + pairs;
    int32_t *n_tiles = row_of_pair + pairs;
    int32_t *tiles = n_tiles + 1;
    size_t used = (size_t)pairs * (2 * I + D) + 2 * (size_t)pairs + 1 + 3 * (size_t)max_tiles;
    ASSERT(used <= backend_moe_workspace_floats(n_tokens, a->n_used, a->d_model, a->d_expert));
    if (!CHECK(c, cuda_moe_sort(c->stream, ids, pairs, a->n_experts, bm, sorted_pair, row_of_pair, tiles,
                                n_tiles, max_tiles)))
        return;
    if (wg) {
        /* gate and up read one image of x; down one of the activations (the same scratch). (K
         * split in two where the used tiles leave SMs idle was measured in session 13: no gain at
         * batch 33-64 or in prefill; commit 8af39d1 has it.) */
        void *img;
        if (!wg_image_make(c, x, n_tokens, (int64_t)D, &wt_in, &img) ||
            !CHECK(c, cuda_gemm_wgmma_grouped(c->stream, fmt, table, (int64_t)I, (int64_t)D, x, sorted_pair,
                                              a->n_used, tiles, n_tiles, max_tiles, gate, &wt_in, img)) ||
            !CHECK(c,
                   cuda_gemm_wgmma_grouped(c->stream, fmt, table + n, (int64_t)I, (int64_t)D, x, sorted_pair,
                                           a->n_used, tiles, n_tiles, max_tiles, up, &wt_in, img)) ||
            !CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)pairs * I, gate)))
            return;
        if (!wg_image_make(c, gate, pairs, (int64_t)I, &wt_out, &img) ||
            !CHECK(c, cuda_gemm_wgmma_grouped(c->stream, fmt, table + 2 * n, (int64_t)D, (int64_t)I, gate,
                                              NULL, 1, tiles, n_tiles, max_tiles, yg, &wt_out, img)))
            return;
        CHECK(c, cuda_moe_combine(c->stream, ids, weights, n_tokens, a->n_used, (int)D, row_of_pair, yg, out));
        return;
    }
    if (c->moe_mma && a->up[0].format == fmt && a->down[0].format == fmt &&
        cuda_gemm_mma_supported(fmt, (int64_t)D, x) && cuda_gemm_mma_supported(fmt, (int64_t)I, gate)) {
        /* tensor cores: tiles of bm rows fit the kernel's 32- or 64-row tile */
        if (!CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table, (int64_t)I, (int64_t)D, x, sorted_pair,
                                            a->n_used, tiles, n_tiles, max_tiles, gate, bm)) ||
            !CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table + n, (int64_t)I, (int64_t)D, x, sorted_pair,
                                            a->n_used, tiles, n_tiles, max_tiles, up, bm)) ||
            !CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)pairs * I, gate)) ||
            !CHECK(c, cuda_gemm_mma_grouped(c->stream, fmt, table + 2 * n, (int64_t)D, (int64_t)I, gate, NULL, 1,
                                            tiles, n_tiles, max_tiles, yg, bm)))
            return;
        CHECK(c, cuda_moe_combine(c->stream, ids, weights, n_tokens, a->n_used, (int)D, row_of_pair, yg, out));
        return;
    }
    if (!CHECK(c, cuda_gemm_grouped(c->stream, a->gate[0].format, table, (int64_t)I, (int64_t)D, x,
                                    sorted_pair, a->n_used, tiles, n_tiles, max_tiles, gate, tile)))
        return;
    if (!CHECK(c, cuda_gemm_grouped(c->stream, a->up[0].format, table + n, (int64_t)I, (int64_t)D, x,
                                    sorted_pair, a->n_used, tiles, n_tiles, max_tiles, up, tile)))
        return;
    if (!CHECK(c, cuda_silu_mul(c->stream, gate, up, (size_t)pairs * I, gate)))
        return;
    if (!CHECK(c, cuda_gemm_grouped(c->stream, a->down[0].format, table + 2 * n, (int64_t)D, (int64_t)I, gate,
                                    NULL, 1, tiles, n_tiles, max_tiles, yg, tile)))
        return;
    CHECK(c, cuda_moe_combine(c->stream, ids, weights, n_tokens, a->n_used, (int)D, row_of_pair, yg, out));
}

/* The whole one-token layer in one kernel: NVFP4 projections and experts, BF16 router, softmax
 * routing without groups or correction bias, no shared expert (the forward checks that one). */
static bool cu_decode_layer(struct backend *be, const struct decode_layer_args *a)
{
    struct cuda_backend *c = ctx(be);
    const struct moe_args *m = a->moe;
    const struct route_args *ra = a->route;
    if (!c->layer_kernel || a->batch->n_tokens != 1 || !a->q_norm || !a->k_norm)
        return false;
    const struct weight *nv[4] = {a->wq, a->wk, a->wv, a->wo};
    for (int i = 0; i < 4; i++)
        if (nv[i]->format != WEIGHT_NVFP4)
            return false;
    if (m->gate[0].format != WEIGHT_NVFP4 || m->up[0].format != WEIGHT_NVFP4 || m->down[0].format != WEIGHT_NVFP4 ||
        a->router->format != WEIGHT_BF16 || ra->score != ROUTE_SOFTMAX || ra->n_group > 1 || ra->correction_bias ||
        ra->n_experts != m->n_experts || ra->n_used != m->n_used || a->router->rows != m->n_experts ||
        a->router->cols != m->d_model || a->rope->dim > a->kv->head_dim)
        return false;
    const int n_kv = a->kv->n_kv_heads, hd = a->kv->head_dim;
    int splits = ceil_div(2 * (int64_t)c->sm_count, n_kv); /* as cu_attention at one token */
    splits = splits > 64 ? 64 : splits < 1 ? 1 : splits;
    struct cuda_layer_decode_args la = {
        .D = m->d_model, .n_heads = a->n_heads, .n_kv = n_kv, .hd = hd, .E = m->n_experts, .n_used = m->n_used,
        .I = m->d_expert, .n_splits = splits, .eps = a->eps, .attn_scale = a->attn_scale, .h = a->h,
        .attn_norm = a->attn_norm, .ffn_norm = a->ffn_norm, .q_norm = a->q_norm, .k_norm = a->k_norm,
        .router = a->router->data, .router_bias = a->router->bias, .route = ra, .rope = a->rope, .kv = a->kv,
        .batch = a->batch, .slots = a->slots, .q = a->q, .k = a->k, .v = a->v, .attn = a->attn,
        .logits = a->logits, .act = a->moe_work};
    la.wq = wdev_of(a->wq);
    la.wk = wdev_of(a->wk);
    la.wv = wdev_of(a->wv);
    la.wo = wdev_of(a->wo);
    if (a->wq->rows != (int64_t)a->n_heads * hd || a->wk->rows != (int64_t)n_kv * hd ||
        a->wv->rows != (int64_t)n_kv * hd || a->wo->cols != (int64_t)a->n_heads * hd ||
        a->wq->cols != m->d_model || a->wo->rows != m->d_model ||
        !cuda_layer_decode_supported(&la, c->smem_budget))
        return false;
    if (!c->bar) {
        if (c->capturing) {
            c->capture_broken = true;
            return true; /* the forward runs the ops directly after the failed capture */
        }
        size_t bytes = cuda_layer_decode_barrier_words() * sizeof(unsigned);
        if (!CHECK(c, cudaMalloc((void **)&c->bar, bytes)) || !CHECK(c, cudaMemset(c->bar, 0, bytes)))
            return true;
    }
    la.bar = c->bar;
    la.trace = c->layer_trace;
    la.experts = moe_table_get(c, m);
    la.attn_work = scratch_get(c, cuda_attention_workspace_floats(1, a->n_heads, hd, splits) * sizeof(float));
    la.sem = sem_get(c, (size_t)n_kv);
    if (!la.experts || !la.attn_work || !la.sem)
        return true; /* the error (or the spoilt capture) is recorded */
    CHECK(c, cuda_layer_decode(c->stream, &la, c->sm_count, c->layer_blocks, c->smem_budget));
    return true;
}

/* Router GEMV with the norm in its prologue, then the pair-by-pair MoE that routes for itself and
 * adds into h: three kernels where the composed ops take five (cuda_decode.cu). */
static bool cu_moe_block_residual(struct backend *be, float *h, const float *delta, const float *norm_w,
                                  float eps, const struct weight *router, const struct route_args *ra,
                                  const struct moe_args *a, int m, float *x, float *logits, int32_t *ids,
                                  float *weights, float *work)
{
    struct cuda_backend *c = ctx(be);
    enum weight_format fmt = a->gate[0].format;
    if (delta) /* every path below takes h as it is: the forward composes the ops */
        return false;
    if (m == 1 && c->fuse_moe && stream_moe_ok(c, a) && norm_w && router->cols == a->d_model) {
        /* router GEMV with the norm, the routing kernel, then gate/up and down (adding into h): the
         * ids exist before down starts, so down fetches its experts while gate/up still runs */
        const struct cuda_wdev *table = moe_table_get(c, a);
        if (!table)
            return true;
        struct cuda_gemv_fuse fz = {.norm_w = norm_w, .eps = eps, .x_out = x};
        if (!gemv_fused(c, 1, &router, h, 1, &logits, &fz))
            return false;
        struct cuda_expert_prefetch pf;
        bool pf_on = expert_prefetch_from(c, a, &pf);
        if (!CHECK(c, cuda_moe_route(c->stream, logits, 1, ra, ids, weights, c->pdl, pf_on ? &pf : NULL)))
            return true;
        CHECK(c, cuda_stream_moe(c->stream, fmt, table, a->n_experts, (int64_t)a->d_model, (int64_t)a->d_expert, x,
                                 ids, weights, a->n_used, work, h, 1, c->sm_count, c->stream_smem_gate_up,
                                 c->stream_smem_down, c->pdl));
        return true;
    }
    /* the tensor-core MoE kernels with the routing inside gate/up (cuda_moe_decode_mma_routed):
     * norm + router GEMV, gate/up (routing), down adding into h; three kernels instead of five */
    if (m == 1 && c->fuse_moe && !c->use_stream_moe && c->decode_mma && fmt == WEIGHT_NVFP4 &&
        a->up[0].format == fmt && a->down[0].format == fmt && norm_w && router->cols == a->d_model &&
        cuda_moe_decode_mma_supported(fmt, a->d_model, a->d_expert, a->n_used, c->smem_budget) &&
        cuda_moe_decode_mma_can_route(ra, a->n_experts, a->n_used)) {
        const struct cuda_wdev *table = moe_table_get(c, a);
        if (!table)
            return true; /* the error is recorded; the pass reports it */
        struct cuda_gemv_fuse fz = {.norm_w = norm_w, .eps = eps, .x_out = x};
        if (!gemv_fused(c, 1, &router, h, 1, &logits, &fz))
            return false;
        CHECK(c, cuda_moe_decode_mma_routed(c->stream, table, a->n_experts, (int64_t)a->d_model,
                                            (int64_t)a->d_expert, x, 1, logits, ra, ids, weights, a->n_used, work, h,
                                            1, c->pdl));
        return true;
    }
    /* the session-3 fusion (routing inside gate/up): measured no faster, so only when asked for */
    if (m != 1 || !c->fuse_moe || c->use_stream_moe || !cuda_moe_decode_can_route(ra) || ra->n_experts != a->n_experts || ra->n_used != a->n_used ||
        !cuda_moe_decode_supported(fmt, a->d_model, a->d_expert, a->n_used, c->smem_budget) ||
        a->up[0].format != fmt || a->down[0].format != fmt || router->cols != a->d_model)
        return false;
    const struct cuda_wdev *table = moe_table_get(c, a);
    if (!table)
        return true; /* the error is recorded; the pass reports it */
    struct cuda_gemv_fuse fz = {.norm_w = norm_w, .eps = eps, .x_out = x};
    if (!norm_w || !gemv_fused(c, 1, &router, h, 1, &logits, &fz))
        return false;
    struct cuda_moe_fuse mf = {.logits = logits, .route = ra, .residual = 1};
    CHECK(c, cuda_moe_decode(c->stream, fmt, table, a->n_experts, (int64_t)a->d_model, (int64_t)a->d_expert, x, 1,
                             ids, weights, a->n_used, work, h, c->moe_rows_gate_up, c->moe_rows_down, c->pdl, &mf));
    return true;
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
    if (c->bar)
        CHECK(c, cudaFree(c->bar));
    if (c->layer_trace) {
        size_t n = cuda_layer_decode_trace_entries();
        unsigned long long *t = malloc(n * sizeof *t);
        double us[14];
        int launches = 0;
        if (t && CHECK(c, cudaMemcpy(t, c->layer_trace, n * sizeof *t, cudaMemcpyDeviceToHost)))
            launches = cuda_layer_decode_trace_summary(t, us);
        if (launches > 0)
            LOG_INFO("cuda: one-kernel layer, mean us per phase over %d launches (of which after the last "
                     "block arrived): q/k/v %.2f (%.2f), attn_prep %.2f (%.2f), attention %.2f (%.2f), o %.2f "
                     "(%.2f), router %.2f (%.2f), gate/up %.2f (%.2f), down %.2f (to the last block's end); sum %.2f",
                     launches, us[0], us[7], us[1], us[8], us[2], us[9], us[3], us[10], us[4], us[11], us[5],
                     us[12], us[6], us[0] + us[1] + us[2] + us[3] + us[4] + us[5] + us[6]);
        free(t);
        CHECK(c, cudaFree(c->layer_trace));
    }
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
    /* MOESERVE_TRACE_OUT=FILE: the kernels' phase records (a -DMOESERVE_KERNEL_TRACE=ON build) */
    const char *kt = getenv("MOESERVE_TRACE_OUT");
    if (kt && be->impl)
        cuda_ktrace_dump(kt);
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
    .prep_attention = cu_prep_attention,
    .moe_experts = cu_moe_experts,
    .add = cu_add,
    .linear_multi = cu_linear_multi,
    .norm_linear_multi = cu_norm_linear_multi,
    .linear_residual = cu_linear_residual,
    .moe_block_residual = cu_moe_block_residual,
    .attn_prep = cu_attn_prep,
    .argmax = cu_argmax,
    .sample = cu_sample,
    .prefetch = cu_prefetch,
    .decode_layer = cu_decode_layer,
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

/* Two kernels share an SM while the next one prefetches: each stream kernel gets part of the
 * SM's shared memory (never more than a block may take; an sm_120 budget of 101376 a block
 * means 102400 an SM). gate/up, whose successor is the small down kernel, gets the larger part. */
static void stream_budgets(struct cuda_backend *c)
{
    size_t sm_smem = c->plan.caps.smem_per_sm ? c->plan.caps.smem_per_sm : c->smem_budget + 1024;
    if (sm_smem > c->smem_budget + 1024)
        sm_smem = c->smem_budget + 1024;
    c->stream_smem_dense = sm_smem * 45 / 100;
    c->stream_smem_down = sm_smem * 45 / 100;
    c->stream_smem_gate_up = sm_smem * 55 / 100;
    if (c->stream_smem_gate_up > c->smem_budget)
        c->stream_smem_gate_up = c->smem_budget;
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
    /* MOESERVE_ATTN_PREC=pv_bf16|bf16: the tensor-core prefill attention at head_dim 128 with P
     * and V as single bf16, or everything single bf16 (fewer products, bf16-grade error); by
     * default q, K, V and P are split into hi + lo (fp32-grade). */
    const char *aprec = getenv("MOESERVE_ATTN_PREC");
    c->attn_mma.prec = !aprec ? 0 : !strcmp(aprec, "bf16") ? 2 : !strcmp(aprec, "pv_bf16") ? 1 : 0;
    /* MOESERVE_ATTN_SPLITS=none: never split the attention's keys. A test switch: the golden
     * fixtures' short prompts give fewer blocks than SMs, so they otherwise run only the split
     * kernels and never reach the prefill ones (the tensor-core kernel included). */
    const char *asp = getenv("MOESERVE_ATTN_SPLITS");
    if (asp && !strcmp(asp, "none"))
        c->force_splits = -1;
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
    /* Pair by pair (no sort) up to plan_moe_pair_max_tokens() tokens for the model's experts
     * (moe_pair_max()); MOESERVE_MOE_DECODE_MAX=N (1..64): up to N tokens whatever the model */
    c->moe_decode_max_tokens = 0;
    /* MOESERVE_MOE_BF16=ROWS: NVFP4 experts through bf16 copies and cuBLAS from ROWS rows an
     * expert on average (pairs / experts; 0: never); MOESERVE_MOE_BF16_MB: scratch a pass */
    const char *mb = getenv("MOESERVE_MOE_BF16"), *mbm = getenv("MOESERVE_MOE_BF16_MB");
    c->moe_bf16_rows = mb && atoi(mb) > 0 ? atoi(mb) : 0;
    c->moe_bf16_bytes = (size_t)(mbm && atoi(mbm) > 0 ? atoi(mbm) : 1024) << 20;
    const char *mdm = getenv("MOESERVE_MOE_DECODE_MAX");
    if (mdm && atoi(mdm) >= 1 && atoi(mdm) <= 64)
        c->moe_decode_max_tokens = atoi(mdm);
    /* Decode kernels overlap their start with the previous kernel's end where the device has
     * programmatic dependent launch (caps "pdl"). Measured on the H200 (Qwen3-30B-A3B NVFP4,
     * batch 1, one call each, session 4): with the multi-wave kernels triggering late (see
     * pdl_trigger()) PDL gives 327.8 tok/s against 309.0 without; the fusions (every block
     * normalising / routing for itself) then lose: attn 326.8, attn+moe 294.7. So PDL is on
     * (MOESERVE_PDL=0 turns it off, =gemv keeps it for the GEMVs only) and the fusions are off
     * (MOESERVE_FUSE=attn,moe).
     * The stream kernels (cuda_decode_stream.cu: one wave, weights copied to shared memory
     * before the wait) are correct but measured slower, so they are off: MOESERVE_STREAM=1
     * (both), =dense or =moe. With them 236 tok/s, dense only 291, MoE only 239: they are
     * instruction-bound (ncu: 8-21 us per kernel even with their weights in L2). With stream
     * kernels on, the fusions default to on (they are what saves their norm kernels). */
    /* MOESERVE_DECODE_MMA=0: the few-token NVFP4 MoE on CUDA cores (cuda_decode.cu) */
    const char *dm = getenv("MOESERVE_DECODE_MMA");
    c->decode_mma = c->plan.caps.bf16_mma && !(dm && strcmp(dm, "0") == 0);
    /* MOESERVE_MOE_MMA_UNROLL=4|8|16: weight groups in flight per warp in those kernels (8: two
     * rounds of loads for a 2048-wide gate/up row, one for a 768-wide down row; 4 as session 4;
     * 16: a whole gate/up row at once, measured slower in session 7: 356.2 vs 414.9 tok/s, its x
     * staging waits behind 16 loads a lane) */
    const char *mu = getenv("MOESERVE_MOE_MMA_UNROLL");
    c->moe_mma_unroll = mu && atoi(mu) == 4 ? 4 : mu && atoi(mu) == 16 ? 16 : 8;
    /* MOESERVE_ROUTER_ROUTE=1: the router GEMV and the routing in one kernel at few tokens.
     * Off: on the H200 (session 6) it was slower at batch 1 (346.8 vs 367.9 tok/s) and within
     * noise at batch 8 (747.1 vs 735.1): its fence, atomic and logits read-back by the last
     * block cost about what the kernel boundary it removes did. */
    /* MOESERVE_PREP_ATTN=1: attn_prep folded into the decode attention at one token. Correct
     * (op test, goldens), slower on the H200 (session 7, before the attention's pre-wait loads
     * and clusters): 329.8 vs 362.9-365.6 tok/s at batch 1: each (KV head, split) block norms
     * and ropes its group's 9 heads itself, serially, after the wait. */
    const char *pa = getenv("MOESERVE_PREP_ATTN");
    c->prep_attention = pa && (strcmp(pa, "1") == 0 || strcmp(pa, "cluster") == 0);
    /* =cluster: where the attention runs in clusters, the cluster's blocks share the heads' norm
     * and RoPE (cuda_attn_decode_prep_cluster_kernel) */
    c->prep_cluster = pa && strcmp(pa, "cluster") == 0;
    const char *rr = getenv("MOESERVE_ROUTER_ROUTE");
    /* Its thread-block-cluster form (caps "clusters", <= 128 experts), with the add + RMSNorm
     * before the router in the same kernel: on the H200 (session 8) slower at batch 1 (386.5 /
     * 393.8 vs 408.3 / 412.9 tok/s: it cannot start before the output projection's blocks leave)
     * and faster at batch 8 (747.2 / 742.6 vs 731.6 / 731.0): by default where the device has
     * clusters, from 2 tokens (router_min_tokens). =cluster: from one token; =1: the one-kernel
     * form without clusters (last block routes); =0: never. */
    const bool rr_auto = !rr || !*rr;
    c->router_route = rr_auto ? c->plan.caps.clusters : strcmp(rr, "1") == 0 || strcmp(rr, "cluster") == 0;
    c->router_cluster = c->plan.caps.clusters && (rr_auto || strcmp(rr, "cluster") == 0);
    c->router_min_tokens = rr_auto ? 2 : 1;
    /* MOESERVE_MOE_MMA_KS=1|2: warps that split K of one gate/up row tile (2 measured slower on
     * the H200, session 6: 341.1 / 352.6 tok/s at unroll 8 / 4 against 358.4) */
    const char *mks = getenv("MOESERVE_MOE_MMA_KS");
    c->moe_mma_ks = mks && atoi(mks) == 2 ? 2 : 1;
    /* MOESERVE_DECODE_FP8=1: the few-token NVFP4 MoE on e4m3 tensor cores (caps fp8_mma), about
     * half the instructions of the bf16 kernels; written after session 5's device time, never
     * run yet (op test test_moe_experts_fp8) */
    const char *df8 = getenv("MOESERVE_DECODE_FP8");
    c->decode_fp8 = c->plan.caps.fp8_mma && df8 && strcmp(df8, "1") == 0;
    /* The one-token NVFP4 GEMVs (q/k/v, o, the lm_head) on bf16 tensor cores (cuda_gemv_mma)
     * where the device has mma.sync; MOESERVE_DECODE_MMA_DENSE=0: on CUDA cores (cuda_decode.cu
     * gemv1). Slower in session 5 (287 vs 327 tok/s); after session 6's changes to the shared
     * mma pieces (scales by bit moves, one shared load per A fragment) faster: 380.9 vs 348.3
     * tok/s at batch 1 in one call (session 7, H200). The kernel trace says why: gemv1's dot
     * after the wait is issue-bound (~5 instructions a weight; o's dot 5910 cycles, q/k/v's
     * 4489 with a second wave of 56 blocks), the mma kernel's ~2.5. */
    const char *dmd = getenv("MOESERVE_DECODE_MMA_DENSE");
    c->decode_mma_dense = c->plan.caps.bf16_mma && !(dmd && strcmp(dmd, "0") == 0);
    /* MOESERVE_DEC16=1: the dense NVFP4 weights (attention, dense MLPs, shared experts) also in
     * the dec16 layout (cuda_dec16.cu: 16 rows as the mma's A operand, a lane's word holding its 8
     * weights of one mma, the block scale applied to C), read by the one-token linears without
     * fusions; =qkv: only by launches of several weights. Alone on the H200 (tools/bench_dot.cu,
     * session 10) q/k/v's shape took 5.80 us against gemv_mma's 8.75 and o's 6.92 against 7.43,
     * but not in a step: batch 1 405.1 / 407.3 tok/s against 412.0 / 409.3 (=qkv 408.3 / 406.9),
     * since gemv_mma's warps have their whole K slice loaded before the PDL wait and what is
     * left after it (x staging, the dot from registers, the store) costs both the same. Off by
     * default: it also costs a second copy of those weights (Qwen3-30B-A3B: ~0.5 GB). */
    const char *d16 = getenv("MOESERVE_DEC16");
    c->dec16_make = c->plan.caps.bf16_mma && d16 && (strcmp(d16, "1") == 0 || strcmp(d16, "qkv") == 0);
    c->dec16 = c->dec16_make;
    c->dec16_multi_only = d16 && strcmp(d16, "qkv") == 0; /* =qkv: only launches of several weights */
    /* NVFP4 linears the GEMV does not take (above gemv_mma_tokens rows) expand their weight to
     * bf16 in scratch and run cuBLAS (the plan's "linear" for weight-only NVFP4,
     * cublas_dequant_bf16; H200, session 12: the whole prefill 1.44x at 32 tokens, 1.68x at 128,
     * 1.12x at 2048 against the wgmma GEMM). MOESERVE_LINEAR_DEQUANT=0: never (our GEMMs, which
     * dequantise in registers); =ROWS: from ROWS rows. */
    const char *ldq = getenv("MOESERVE_LINEAR_DEQUANT");
    const struct op_plan *lin = plan_find(&c->plan, "linear");
    /* a plan for NVFP4 linears names its choice; a generic (bf16) plan leaves the copy on */
    bool dq_planned =
        c->plan.weights.attn != WEIGHT_NVFP4 || !lin || !strcmp(lin->kernel, "cublas_dequant_bf16");
    c->linear_dequant_rows = ldq ? (atoi(ldq) > 0 ? atoi(ldq) : 0) : dq_planned ? 1 : 0;
    /* MOESERVE_WG_IMAGE=0: the wgmma GEMMs split x in every block (before session 11) instead of
     * copying one pre-split image */
    /* The wgmma GEMMs keep two k-steps of x and weights in flight (a 4-stage ring, NVFP4 tiles
     * of 64-wide k reading x's image, where it fits the budget) instead of one: decode batch 33 /
     * 64 +2.6% / +2.5%, prefill 512 / 2048 +1.8% / +2.0% (H200, session 14).
     * MOESERVE_WG_STAGES=3: the 3-stage ring everywhere. */
    const char *wgs = getenv("MOESERVE_WG_STAGES");
    c->wg_stages = wgs && atoi(wgs) == 3 ? 3 : 4;
    const char *wgi = getenv("MOESERVE_WG_IMAGE");
    c->wg_image = !(wgi && strcmp(wgi, "0") == 0);
    /* MOESERVE_DEC16_MOE=1: the routed NVFP4 experts' gate and up also in the dec16 layout (a
     * second copy: the experts' memory grows by two thirds), read by the one-token gate/up
     * (cuda_dec16_moe_gate_up; its weights load only after the routing is known, where the
     * layout's cheaper dot showed in tools/bench_dot.cu: the gate/up shape 8.3 vs 9.9 us). No
     * down copy: a dec16 down kernel (branch next/dec16-down, a 16-row tile a block, a warp a
     * slot) was correct but slower than the mma down on the H200 (406.7 / 410.8 vs 420.2 / 418.5
     * tok/s with gate/up from the copies, session 11). */
    const char *d16m = getenv("MOESERVE_DEC16_MOE");
    c->dec16_moe = c->plan.caps.bf16_mma && d16m && strcmp(d16m, "1") == 0;
    /* MOESERVE_GEMV_MMA_TOKENS=N (1..8, default 8): NVFP4 linears of 2..N rows through the same
     * kernel, the tokens sharing each mma (before session 8: the tiled GEMM of cuda_gemm.cu) */
    const char *gmt = getenv("MOESERVE_GEMV_MMA_TOKENS");
    c->gemv_mma_tokens = gmt && atoi(gmt) >= 1 && atoi(gmt) <= 8 ? atoi(gmt) : 8;
    /* MOESERVE_GEMV_MMA_CHUNKS=N (1..8): NVFP4 linears of up to N x gemv_mma_tokens rows through
     * N launches of that kernel instead of a bf16 copy of the weight and cuBLAS */
    const char *gmc = getenv("MOESERVE_GEMV_MMA_CHUNKS");
    c->gemv_mma_chunks = gmc && atoi(gmc) >= 1 && atoi(gmc) <= 8 ? atoi(gmc) : 1;
    /* MOESERVE_ATTN_PREWAIT=0: the split decode attention issues its old keys after the PDL
     * wait instead of before it (see cuda_attn_decode's prewait) */
    const char *apw = getenv("MOESERVE_ATTN_PREWAIT");
    c->attn_prewait = !(apw && strcmp(apw, "0") == 0);
    /* MOESERVE_MOE_L2_DOWN=1: the tensor-core MoE gate/up kernel queues its pairs' down weights
     * into L2 (caps "tma"), so that the down kernel reads them from there. Correct, slower on the
     * H200 (session 7, one call): batch 1 404.7 vs 414.9 tok/s, batch 8 713.5 vs 726.3. */
    const char *ld = getenv("MOESERVE_MOE_L2_DOWN");
    c->moe_l2_down = c->plan.caps.tma && ld && strcmp(ld, "1") == 0;
    /* MOESERVE_MOE_EARLY=1: the tensor-core MoE gate/up kernel triggers the down kernel right
     * after its wait, and down reads its routing, table entries and first weights before its
     * own. Correct (goldens), slower on the H200 (session 7, twice in one call): batch 1 399.8
     * vs 412.6 tok/s, batch 8 708.3 vs 733.4; that down kernel spills 184 bytes. */
    const char *me = getenv("MOESERVE_MOE_EARLY");
    c->moe_early = me && strcmp(me, "1") == 0;
    /* The tensor-core MoE pair with its weights through shared memory (cp.async: every weight
     * group of a warp in flight at once, 56 / 75 registers instead of 112 / 128, each kernel
     * triggering the next after its wait), from 2 tokens on. H200, session 9, one call:
     * batch 2 567.4 vs 562.1 tok/s, 4 793.2 vs 775.0, 8 933.5 vs 898.9 (more blocks resident:
     * batch 8 is 3072 gate/up blocks); batch 1 slower, 386-395 vs 409-413 with the K split
     * and one or two down tiles a warp (the trace: gate/up's warps stall issuing 16 groups of
     * copies, so its dot starts later; a form with bulk copies into padded rows was slower
     * still, 361, ~16 cycles a copy request). MOESERVE_MOE_SMEM=1: from one token; =0: never. */
    const char *ms = getenv("MOESERVE_MOE_SMEM");
    c->moe_smem_min = ms && strcmp(ms, "0") == 0 ? 0 : ms && strcmp(ms, "1") == 0 ? 1 : 2;
    /* MOESERVE_MOE_SMEM_DOWN=1: below that, the down kernel alone in that form (its blocks
     * resident beside the register gate/up, which triggers it after its wait) */
    const char *msd = getenv("MOESERVE_MOE_SMEM_DOWN");
    c->moe_smem_down = msd && strcmp(msd, "1") == 0;
    const char *mst = getenv("MOESERVE_MOE_SMEM_TPW");
    c->moe_smem_tpw = mst && (atoi(mst) == 1 || atoi(mst) == 2) ? atoi(mst) : 0;
    /* The split decode attention merges its splits in clusters of 8 through distributed shared
     * memory where the device has clusters (caps "clusters"); MOESERVE_ATTN_CLUSTER=0: through
     * global memory, a fence and a counter (the only way before session 7). */
    const char *acl = getenv("MOESERVE_ATTN_CLUSTER");
    c->attn_cluster = c->plan.caps.clusters && !(acl && strcmp(acl, "0") == 0);
    /* MOESERVE_ATTN_PUSH=0: the cluster's leader pulls the partials (session 7's form) */
    const char *apu = getenv("MOESERVE_ATTN_PUSH");
    c->attn_push = !(apu && strcmp(apu, "0") == 0);
    /* L2 prefetch (caps "tma": cp.async.bulk.prefetch): the routing kernel asks for the chosen
     * experts' weights, and the forward's hints (the output projection and router during the
     * decode attention, the next layer's q/k/v during the MoE down kernel) are taken by those
     * kernels. The idea: the decode kernels are limited by how many loads their registers keep
     * in flight, and a prefetch holds no register. Measured on the H200 (session 5, batch 1 /
     * 8 tok/s, one call): off 329.4 / 688.1; experts 311.3 / 636.6 (32 or 264 extra blocks: the
     * same); attn 328.4 / 696.2; down 320.8 / 634.1; all three 300.5 / 597.3. Never faster, so
     * off by default. MOESERVE_L2_PREFETCH: a list of experts, attn, down (the kernels that
     * ask); MOESERVE_L2_PF_BLOCKS: the routing's extra blocks (default: one per SM). */
    const char *pf = getenv("MOESERVE_L2_PREFETCH");
    if (!pf)
        pf = "";
    c->l2_pf_experts = c->plan.caps.tma && strstr(pf, "experts") != NULL;
    c->l2_pf_attn = c->plan.caps.tma && strstr(pf, "attn") != NULL;
    c->l2_pf_down = c->plan.caps.tma && strstr(pf, "down") != NULL;
    const char *pfb = getenv("MOESERVE_L2_PF_BLOCKS");
    c->l2_pf_blocks = pfb && atoi(pfb) > 0 ? atoi(pfb) : c->sm_count;
    /* One kernel per one-token layer (cuda_layer_decode.cu: every SM in every phase, grid
     * barriers between them), where the device has mma.sync (its tiles). Correct (golden
     * qwen3_hd128_nvfp4) but measured SLOWER on the H200 (session 5, Qwen3-30B-A3B NVFP4 batch 1):
     * 189 tok/s against 327 for the per-op kernels. Its phase trace (MOESERVE_LAYER_TRACE=1, us:
     * q/k/v 18.8, attn_prep 3.9, attention 19.3, o 15.5, router 10.5, gate/up 21.2, down 14.6;
     * each barrier ~1.7) and ncu (19.1 M warp instructions a layer, 0.17 issued per scheduler per
     * cycle at 3 warps per scheduler; stalls per issue: CTA barrier 5.5, memory 4.2, instruction
     * fetch 2.0) say it is bound by instruction issue: the NVFP4 decode costs ~0.12 warp
     * instructions a weight, and 168 registers leave too few warps to hide the mma and load
     * latencies. So it is off: MOESERVE_LAYER_KERNEL=1 on; MOESERVE_LAYER_BLOCKS=N at most N
     * blocks per SM (default 3, the kernel's bound). */
    const char *lk = getenv("MOESERVE_LAYER_KERNEL");
    c->layer_kernel = c->plan.caps.bf16_mma && lk && strcmp(lk, "1") == 0;
    const char *lb = getenv("MOESERVE_LAYER_BLOCKS");
    c->layer_blocks = lb && atoi(lb) > 0 ? atoi(lb) : 3;
    const char *lt = getenv("MOESERVE_LAYER_TRACE"); /* phase times, logged when the backend closes */
    if (c->layer_kernel && lt && strcmp(lt, "1") == 0) {
        size_t bytes = cuda_layer_decode_trace_entries() * sizeof(unsigned long long);
        if (!CHECK(c, cudaMalloc((void **)&c->layer_trace, bytes)) ||
            !CHECK(c, cudaMemset(c->layer_trace, 0, bytes)))
            c->layer_trace = NULL;
    }
    const char *st = getenv("MOESERVE_STREAM");
    /* MOESERVE_STREAM=dense|moe: only that half (to measure each) */
    c->use_stream = st && (strcmp(st, "1") == 0 || strcmp(st, "dense") == 0);
    c->use_stream_moe = st && (strcmp(st, "1") == 0 || strcmp(st, "moe") == 0);
    stream_budgets(c);
    const char *pdl = getenv("MOESERVE_PDL");
    /* on unless MOESERVE_PDL=0; =gemv: only the GEMVs */
    bool pdl_on = !(pdl && (strcmp(pdl, "0") == 0 || strcmp(pdl, "gemv") == 0));
    c->pdl = c->plan.caps.pdl && pdl_on;
    c->pdl_gemv = c->plan.caps.pdl && (pdl_on || strcmp(pdl, "gemv") == 0);
    /* MOESERVE_FUSE=attn,moe: measured equal on the H200 in session 7 with the tensor-core GEMVs
     * (which take the fused norm since then): batch 1 408.0 (attn,moe) and 413.2 (moe) against
     * 408.9 / 413.5 without, in one call. Back then the forward took the attention fusions only
     * after a fused MoE (no pending delta). Since session 8 "attn" also takes the pending delta:
     * the q/k/v GEMV normalises h + delta itself, the output projection adds delta and its own
     * output into h, and the router GEMV normalises h: two add+norm kernels less a layer. Still
     * equal (session 8, batch 1: 416.1 / 416.3 against 415.8 / 417.2 without, in one call): the
     * kernel trace shows each GEMV's norm staging taking what the norm kernel took (the loads of
     * h queue behind the block's weight loads), so off unless asked for (or with the stream
     * kernels, whose fusions they are). */
    const char *fuse = getenv("MOESERVE_FUSE");
    c->fuse_attn = fuse ? strstr(fuse, "attn") != NULL : c->use_stream || c->use_stream_moe;
    c->fuse_moe = fuse ? strstr(fuse, "moe") != NULL : c->use_stream_moe;
    const char *gr = getenv("MOESERVE_GEMV_ROWS");
    c->gemv_rows = gr ? atoi(gr) : 0;
    /* measured on the H200 (Qwen3-30B-A3B NVFP4, batch 1 / 8 tok/s), x in shared memory, all
     * loads of a warp issued first (session 3): 2,4 291 / 630; 2,8 281 / 608; 4,8 240 / 570 (4
     * rows spill at the 128 registers two blocks per SM allow) */
    c->moe_rows_gate_up = 2;
    c->moe_rows_down = 4;
    /* MOESERVE_MOE_DECODE_ROWS=GU,DN: a tuning knob for the rows per warp (GU 2|4, DN 4|8) */
    const char *rows = getenv("MOESERVE_MOE_DECODE_ROWS");
    int gu = 0, dn = 0;
    if (rows && sscanf(rows, "%d,%d", &gu, &dn) == 2 && (gu == 2 || gu == 4) && (dn == 4 || dn == 8)) {
        c->moe_rows_gate_up = gu;
        c->moe_rows_down = dn;
    } else if (rows) {
        LOG_WARN("cuda: MOESERVE_MOE_DECODE_ROWS=\"%s\": expected GU,DN with GU 2|4, DN 4|8; ignored", rows);
    }
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
        c->moe_mma = strstr(op->kernel, "_mma") != NULL;
        c->moe_wgmma = strstr(op->kernel, "_wgmma") != NULL;
        c->wg_moe = (struct cuda_wgmma_tile){
            .tokens = op->tile_m, .rows = op->tile_n, .k = op->tile_k, .stages = c->wg_stages};
        c->moe_mma |= c->moe_wgmma; /* where no wgmma tile fits: mma.sync, the same numerics */
    } else {
        LOG_WARN("cuda: the plan has no moe_experts_gemm entry; using the 64x64 fp32 tile");
    }
    /* "linear" is cuBLAS (no tile) for 16-bit weights; the quantised ones then use the expert tile */
    c->tile_linear = c->tile_moe;
    c->linear_mma = c->moe_mma;
    c->linear_wgmma = c->moe_wgmma;
    c->wg_linear = c->wg_moe;
    if ((op = plan_find(&c->plan, "linear")) && op->tile_m > 0) {
        c->tile_linear = gemm_tile_from(op);
        c->linear_mma = strstr(op->kernel, "_mma") != NULL;
        c->linear_wgmma = strstr(op->kernel, "_wgmma") != NULL;
        c->wg_linear = (struct cuda_wgmma_tile){
            .tokens = op->tile_m, .rows = op->tile_n, .k = op->tile_k, .stages = c->wg_stages};
        c->linear_mma |= c->linear_wgmma;
    }
}

/* The plan's variant filter: the variants this backend has kernels for, the wgmma GEMMs only where
 * their sm_90a image loaded on this device (*ctx: cuda_gemm_wgmma_loadable()). */
static bool variant_loads(void *ctx, const char *kernel)
{
    if (!cuda_variant_implemented(NULL, kernel))
        return false;
    return !strstr(kernel, "wgmma") || *(const bool *)ctx;
}

static enum status budget_from_env(size_t *out, struct err *err)
{
    const char *s = getenv("MOESERVE_SMEM_BUDGET");
    *out = 0;
    if (!s || !*s)
        return STATUS_OK;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || !end || *end || v < 1024 || v > (1ull << 30))
        return err_set(err, STATUS_INVALID, "MOESERVE_SMEM_BUDGET=\"%s\": expected a byte count >= 1024", s);
    *out = (size_t)v;
    return STATUS_OK;
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
    enum status st = STATUS_OK;
    if (!smem_budget && (st = budget_from_env(&smem_budget, err)))
        return st;
    struct cuda_backend *c = calloc(1, sizeof *c);
    if (!c)
        return err_set(err, STATUS_NOMEM, "cuda: out of host memory");
    c->device = device;
    struct device_caps caps;
    bool wgmma_loads = cuda_gemm_wgmma_loadable(device);
    const char *generic = getenv("MOESERVE_PLAN_GENERIC");
    bool model = !(generic && strcmp(generic, "1") == 0);
    struct plan_request req = {.desc = model ? desc : NULL,
                               .weights = model ? weights : NULL,
                               .smem_budget = smem_budget,
                               .variant_loads = variant_loads,
                               .variant_ctx = &wgmma_loads};
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
    configure_from_plan(c);
    LOG_DEBUG("cuda: %s", cuda_build_arch_list());
    LOG_INFO(
        "cuda: device %d (%s), %d SMs, shared-memory budget %zu bytes/block; attention prefill %dx%d "
        "(%d threads), decode %d keys (%d threads); quantised GEMMs: experts %s, linears %s%s (tile %d rows)",
        device, c->plan.caps.name, c->sm_count, c->smem_budget, c->attn_prefill.rows, c->attn_prefill.keys,
        c->attn_prefill.threads, c->attn_decode.keys, c->attn_decode.threads,
        c->moe_wgmma ? "bf16 wgmma (else mma)"
        : c->moe_mma ? "bf16 mma"
                     : "fp32 fma",
        c->linear_dequant_rows ? "NVFP4 as bf16 copies through cuBLAS, others " : "",
        c->linear_wgmma ? "bf16 wgmma (else mma)"
        : c->linear_mma ? "bf16 mma"
                        : "fp32 fma",
        cuda_gemm_tile_rows(c->tile_moe));
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

void backend_cuda_set_moe_smem(struct backend *be, int min_tokens, bool down_below)
{
    ctx(be)->moe_smem_min = min_tokens < 0 ? 0 : min_tokens;
    ctx(be)->moe_smem_down = down_below;
}

void backend_cuda_set_gemv_mma_tokens(struct backend *be, int n)
{
    ctx(be)->gemv_mma_tokens = n < 1 ? 1 : n > 8 ? 8 : n;
}

void backend_cuda_set_gemv_mma_chunks(struct backend *be, int n)
{
    ctx(be)->gemv_mma_chunks = n < 1 ? 1 : n > 8 ? 8 : n;
}

int backend_cuda_gemv_mma_chunks(struct backend *be)
{
    return ctx(be)->gemv_mma_chunks;
}

void backend_cuda_set_moe_bf16(struct backend *be, int rows, size_t pass_bytes)
{
    ctx(be)->moe_bf16_rows = rows > 0 ? rows : 0;
    if (pass_bytes)
        ctx(be)->moe_bf16_bytes = pass_bytes;
}

int backend_cuda_moe_bf16_rows(struct backend *be)
{
    return ctx(be)->moe_bf16_rows;
}

void backend_cuda_set_moe_decode_max(struct backend *be, int n)
{
    ctx(be)->moe_decode_max_tokens = n < 0 ? 0 : n > 64 ? 64 : n;
}

int backend_cuda_moe_decode_max(struct backend *be)
{
    return ctx(be)->moe_decode_max_tokens;
}

void backend_cuda_set_dec16_moe(struct backend *be, bool on)
{
    struct cuda_backend *c = ctx(be);
    c->dec16_moe = on && c->plan.caps.bf16_mma;
}

void backend_cuda_set_linear_dequant(struct backend *be, int rows)
{
    ctx(be)->linear_dequant_rows = rows > 0 ? rows : 0;
}

int backend_cuda_linear_dequant_rows(struct backend *be)
{
    return ctx(be)->linear_dequant_rows;
}

void backend_cuda_set_dec16(struct backend *be, bool on)
{
    struct cuda_backend *c = ctx(be);
    c->dec16 = c->dec16_make = on && c->plan.caps.bf16_mma;
    c->dec16_multi_only = false;
}

void backend_cuda_set_decode_mma_dense(struct backend *be, bool on)
{
    struct cuda_backend *c = ctx(be);
    c->decode_mma_dense = on && c->plan.caps.bf16_mma;
}

void backend_cuda_set_decode_fp8(struct backend *be, bool on)
{
    struct cuda_backend *c = ctx(be);
    c->decode_fp8 = on && c->plan.caps.fp8_mma;
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

void backend_cuda_set_fuse_moe(struct backend *be, bool on)
{
    ctx(be)->fuse_moe = on;
}

void backend_cuda_set_prep_attention(struct backend *be, bool on)
{
    ctx(be)->prep_attention = on;
}

void backend_cuda_set_prep_attention_cluster(struct backend *be, bool on)
{
    ctx(be)->prep_cluster = on;
}

void backend_cuda_set_stream(struct backend *be, bool on, size_t smem)
{
    struct cuda_backend *c = ctx(be);
    c->use_stream = c->use_stream_moe = on;
    c->fuse_attn = c->fuse_moe = on; /* the stream kernels' norm and residual fusions */
    stream_budgets(c);
    if (smem)
        c->stream_smem_dense = c->stream_smem_gate_up = c->stream_smem_down = smem;
}
