/* cuda_memory.c — the CUDA backend's memory: the alloc/free/copy ops on its one stream, grow-only
 * scratch and counters, weights copied once (or made there: cu_weight_make) into allocations it owns, the experts' device tables
 * (see cuda_backend_internal.h). */
#include "backend/cuda/cuda_backend_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* ---------------------------------------------------------------- memory */

void *cu_alloc(struct backend *be, size_t bytes)
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

void cu_free(struct backend *be, void *p)
{
    if (p)
        CHECK(cuda_ctx(be), cudaFree(p));
}

void cu_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (!bytes)
        return;
    /* synchronous for the caller: src may be reused as soon as we return */
    if (CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream)))
        CHECK(c, cudaStreamSynchronize(c->stream));
}

void cu_download(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (!bytes)
        return;
    if (CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream)))
        CHECK(c, cudaStreamSynchronize(c->stream));
}

void cu_synchronize(struct backend *be)
{
    struct cuda_backend *c = cuda_ctx(be);
    CHECK(c, cudaStreamSynchronize(c->stream));
}

/* A device buffer of at least `bytes` for one op's temporaries. Grows
 * rarely (the first calls at a new largest shape); cudaFree waits for the
 * device, so no kernel still reads the old buffer. */

/* *buf grown to at least bytes (+ slack), outside captures only; graphs hold the old address. */
static void *grow(struct cuda_backend *c, void **buf, size_t *have, size_t bytes, size_t slack, const char *what)
{
    if (bytes <= *have)
        return *buf;
    if (c->capturing) {
        /* cannot free or allocate inside a capture: spoil it, the forward runs the ops directly */
        c->capture_broken = true;
        return NULL;
    }
    cuda_graphs_drop(c);
    size_t want = bytes + slack;
    if (*buf)
        CHECK(c, cudaFree(*buf));
    *buf = NULL;
    *have = 0;
    if (!CHECK(c, cudaMalloc(buf, want))) {
        *buf = NULL;
        return NULL;
    }
    *have = want;
    LOG_DEBUG("cuda: %s grown to %zu bytes", what, want);
    return *buf;
}

void *cuda_scratch_get(struct cuda_backend *c, size_t bytes)
{
    return grow(c, &c->scratch, &c->scratch_bytes, bytes, bytes / 4, "scratch");
}

void *cuda_expand_buf_get(struct cuda_backend *c, size_t bytes)
{
    return grow(c, &c->expand_buf, &c->expand_bytes, bytes, 0, "MLA expand buffer");
}

/* n zeroed counters for kernels whose last block finishes the work (each resets its own). */
int *cuda_sem_get(struct cuda_backend *c, size_t n)
{
    if (n <= c->sem_count)
        return c->sem;
    if (c->capturing) {
        c->capture_broken = true;
        return NULL;
    }
    cuda_graphs_drop(c);
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

bool cuda_own(struct cuda_backend *c, void *p)
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

/* A new device allocation of bytes this backend owns (not cleared). */
static enum status alloc_owned(struct cuda_backend *c, size_t bytes, void **out, struct err *err)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return err_set(err, STATUS_NOMEM, "cuda: cannot allocate %zu bytes of device memory for a weight: %s",
                       bytes, cudaGetErrorString(e));
    }
    if (!cuda_own(c, p)) {
        CHECK(c, cudaFree(p));
        return err_set(err, STATUS_NOMEM, "cuda: out of host memory");
    }
    *out = p;
    return STATUS_OK;
}

/* Copies bytes of host memory into a new device allocation this backend owns. */
static enum status upload_owned(struct cuda_backend *c, const void *src, size_t bytes, const void **out,
                                struct err *err)
{
    void *p = NULL;
    enum status st = alloc_owned(c, bytes, &p, err);
    if (st)
        return st;
    /* On the backend's stream (a plain cudaMemcpy from pageable memory may return before its DMA
     * lands, and the legacy stream does not order against a non-blocking one), then wait, so the
     * caller may unmap src. */
    if (bytes && (!CHECK(c, cudaMemcpyAsync(p, src, bytes, cudaMemcpyHostToDevice, c->stream)) ||
                  !CHECK(c, cudaStreamSynchronize(c->stream))))
        return cuda_sink_status(&c->sink, err);
    *out = p;
    return STATUS_OK;
}

enum status cu_weight_load(struct backend *be, const struct weight *host, struct weight *out,
                                  unsigned flags, struct err *err)
{
    struct cuda_backend *c = cuda_ctx(be);
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
    if (!st)
        cuda_dense_copy_make(c, out, flags);
    return st;
}

enum status cu_weight_make(struct backend *be, const struct weight *shape, const struct weight_synth *s,
                           struct weight *out, unsigned flags, struct err *err)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (shape->format != WEIGHT_BF16 && shape->format != WEIGHT_F32 && shape->format != WEIGHT_NVFP4)
        return err_set(err, STATUS_UNSUPPORTED, "cuda: synthetic weights exist in BF16, F32 and NVFP4, not %s",
                       weight_format_name(shape->format));
    *out = *shape;
    void *data = NULL, *scale = NULL;
    size_t sb = weight_scale_bytes(shape);
    enum status st = alloc_owned(c, weight_data_bytes(shape), &data, err);
    if (!st && sb)
        st = alloc_owned(c, sb, &scale, err);
    if (st)
        return st;
    if (!CHECK(c, cuda_weight_synth(c->stream, shape->format, s, shape->rows, shape->cols, data, scale)) ||
        !CHECK(c, cudaStreamSynchronize(c->stream)))
        return cuda_sink_status(&c->sink, err);
    out->data = data;
    out->scale = scale;
    cuda_dense_copy_make(c, out, flags);
    return STATUS_OK;
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
 * entries each; with shared, n_experts + 1 each, the shared expert last). */
enum { MOE_TABLE_ROWS = 3 };
const struct cuda_wdev *cuda_moe_table_get(struct cuda_backend *c, const struct moe_args *a,
                                           const struct weight *const *shared)
{
    const size_t n_routed = (size_t)a->n_experts, n = n_routed + (shared != NULL);
    const size_t bytes = MOE_TABLE_ROWS * n * sizeof(struct cuda_wdev);
    if (c->tmp_cap < MOE_TABLE_ROWS * n) {
        struct cuda_wdev *t = realloc(c->tmp, bytes);
        if (!t)
            PANIC("cuda: out of host memory");
        c->tmp = t;
        c->tmp_cap = MOE_TABLE_ROWS * n;
    }
    for (size_t e = 0; e < n; e++) {
        const bool sh = e == n_routed;
        wdev_from(&c->tmp[e], sh ? shared[0] : &a->gate[e], &a->gate[0]);
        wdev_from(&c->tmp[n + e], sh ? shared[1] : &a->up[e], &a->up[0]);
        wdev_from(&c->tmp[2 * n + e], sh ? shared[2] : &a->down[e], &a->down[0]);
    }
    struct moe_table *t = NULL;
    for (int i = 0; i < c->n_tables; i++)
        if (c->tables[i].key == a->gate && c->tables[i].n_experts == (int)n)
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
        t->n_experts = (int)n;
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
