/* cuda_comm_p2p.c — see cuda_comm_p2p.h. */
#include "backend/cuda/cuda_comm_p2p.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_backend_internal.h"
#include "base/log.h"

enum { P2P_WARMUP = 3, P2P_ITERS = 20 };

const char *cuda_p2p_form_name(enum cuda_p2p_form f)
{
    static const char *const names[CUDA_P2P_FORMS] = {"nccl", "one-shot", "two-shot"};
    return (unsigned)f < CUDA_P2P_FORMS ? names[f] : "?";
}

static int p2p_class(size_t bytes)
{
    int k = 0;
    while (k < CUDA_P2P_CLASSES - 1 && ((size_t)256 << k) < bytes)
        k++;
    return k;
}

/* One all-reduce of n floats by form f (n * 4 <= CUDA_P2P_MAX_BYTES): buf into this rank's
 * buffer, the barriers around the reading, the result back into buf. */
static void p2p_run(struct cuda_p2p *p, enum cuda_p2p_form f, float *buf, size_t n)
{
    struct cuda_backend *c = p->be;
    CHECK(c, cudaMemcpyAsync(p->peers.data[p->peers.rank], buf, n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    CHECK(c, cuda_ar_barrier(c->stream, p->peers));
    if (f == CUDA_P2P_ONE_SHOT) {
        CHECK(c, cuda_ar_one_shot(c->stream, p->peers, n, buf));
    } else {
        CHECK(c, cuda_ar_reduce_slice(c->stream, p->peers, n));
        CHECK(c, cuda_ar_barrier(c->stream, p->peers));
        CHECK(c, cuda_ar_gather_slices(c->stream, p->peers, n, buf));
    }
    CHECK(c, cuda_ar_barrier(c->stream, p->peers)); /* nobody rewrites its buffer while another reads it */
}

bool cuda_p2p_all_reduce(struct cuda_p2p *p, float *buf, size_t n)
{
    if (!p->on || n * sizeof(float) > CUDA_P2P_MAX_BYTES)
        return false;
    enum cuda_p2p_form f = p->form[p2p_class(n * sizeof(float))];
    if (f == CUDA_P2P_NCCL)
        return false;
    p2p_run(p, f, buf, n);
    return true;
}

bool cuda_p2p_fuses_add_rmsnorm(const struct cuda_p2p *p, size_t n)
{
    return p->on && n * sizeof(float) <= CUDA_P2P_MAX_BYTES && p->form[p2p_class(n * sizeof(float))] ==
                                                                  CUDA_P2P_ONE_SHOT;
}

/* The one-shot form with the residual add and the norm in its reading kernel: delta into this
 * rank's buffer, a barrier, every rank sums every buffer row by row into h and writes x, a
 * barrier before any buffer is rewritten. delta itself is left as it was. */
bool cuda_p2p_all_reduce_add_rmsnorm(struct cuda_p2p *p, const float *delta, float *h, const float *w, int rows,
                                     int dim, float eps, float *x)
{
    const size_t n = (size_t)rows * (size_t)dim;
    if (!cuda_p2p_fuses_add_rmsnorm(p, n))
        return false;
    struct cuda_backend *c = p->be;
    CHECK(c, cudaMemcpyAsync(p->peers.data[p->peers.rank], delta, n * sizeof(float), cudaMemcpyDeviceToDevice,
                             c->stream));
    CHECK(c, cuda_ar_barrier(c->stream, p->peers));
    CHECK(c, cuda_ar_add_rmsnorm(c->stream, p->peers, rows, dim, h, w, eps, x));
    CHECK(c, cuda_ar_barrier(c->stream, p->peers));
    return true;
}

static enum status p2p_off(struct cuda_p2p *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static enum status p2p_off(struct cuda_p2p *p, const char *fmt, ...)
{
    p->on = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why_off, sizeof p->why_off, fmt, ap);
    va_end(ap);
    return STATUS_OK;
}

/* Every pair of the ranks' GPUs reaches each other (the same answer on every rank). */
static enum status p2p_reach(struct cuda_p2p *p, struct comm *c, bool *ok, int *bad_a, int *bad_b)
{
    int dev = p->be->device, devs[CUDA_AR_MAX_RANKS];
    comm_all_gather(c, &dev, devs, sizeof dev);
    int mine = 1, all[CUDA_AR_MAX_RANKS], first_bad = -1;
    for (int r = 0; r < c->size; r++) {
        int can = 1;
        if (devs[r] != dev && !CHECK(p->be, cudaDeviceCanAccessPeer(&can, dev, devs[r])))
            can = 0;
        if (!can && first_bad < 0)
            first_bad = devs[r];
        mine &= can;
    }
    comm_all_gather(c, &mine, all, sizeof mine);
    *ok = true;
    for (int r = 0; r < c->size && *ok; r++)
        if (!all[r])
            *ok = false, *bad_a = devs[r], *bad_b = r == c->rank ? first_bad : -1;
    return STATUS_OK;
}

static enum status p2p_map(struct cuda_p2p *p, struct comm *c, struct err *err)
{
    struct cuda_backend *be = p->be;
    const size_t bytes = CUDA_P2P_MAX_BYTES + CUDA_AR_FLAG_BYTES;
    if (!CHECK(be, cudaMalloc(&p->base, bytes)) || !CHECK(be, cudaMemset(p->base, 0, bytes)) ||
        !CHECK(be, cudaDeviceSynchronize()))
        return cuda_sink_status(&be->sink, err);
    cudaIpcMemHandle_t mine, all[CUDA_AR_MAX_RANKS];
    if (!CHECK(be, cudaIpcGetMemHandle(&mine, p->base)))
        return cuda_sink_status(&be->sink, err);
    comm_all_gather(c, &mine, all, sizeof mine);
    p->peers.rank = c->rank, p->peers.size = c->size;
    for (int r = 0; r < c->size; r++) {
        void *q = p->base;
        if (r != c->rank) {
            if (!CHECK(be, cudaIpcOpenMemHandle(&q, all[r], cudaIpcMemLazyEnablePeerAccess)))
                return cuda_sink_status(&be->sink, err);
            p->mapped[r] = q;
        }
        p->peers.data[r] = q;
        p->peers.flags[r] = (uint32_t *)((uint8_t *)q + CUDA_P2P_MAX_BYTES);
    }
    comm_barrier(c); /* every row zeroed and mapped before the first barrier kernel */
    return STATUS_OK;
}

/* Times every form at every size class, the slowest rank's time of each, the fastest form a class. */
static enum status p2p_measure(struct cuda_p2p *p, struct comm *c, cuda_p2p_nccl_fn nccl, struct err *err)
{
    struct cuda_backend *be = p->be;
    float *buf = NULL;
    cudaEvent_t t0, t1;
    if (!CHECK(be, cudaMalloc((void **)&buf, CUDA_P2P_MAX_BYTES)) ||
        !CHECK(be, cudaMemsetAsync(buf, 0, CUDA_P2P_MAX_BYTES, be->stream)) || !CHECK(be, cudaEventCreate(&t0)) ||
        !CHECK(be, cudaEventCreate(&t1))) {
        if (buf)
            cudaFree(buf);
        return cuda_sink_status(&be->sink, err);
    }
    float mine[CUDA_P2P_CLASSES * CUDA_P2P_FORMS], all[CUDA_AR_MAX_RANKS * CUDA_P2P_CLASSES * CUDA_P2P_FORMS];
    for (int k = 0; k < CUDA_P2P_CLASSES; k++) {
        const size_t n = ((size_t)256 << k) / sizeof(float);
        for (int f = 0; f < CUDA_P2P_FORMS; f++) {
            float ms = 0;
            for (int i = 0; i < P2P_WARMUP + P2P_ITERS; i++) {
                if (i == P2P_WARMUP)
                    CHECK(be, cudaEventRecord(t0, be->stream));
                if (f == CUDA_P2P_NCCL)
                    nccl(c, buf, n);
                else
                    p2p_run(p, (enum cuda_p2p_form)f, buf, n);
            }
            CHECK(be, cudaEventRecord(t1, be->stream));
            CHECK(be, cudaEventSynchronize(t1));
            CHECK(be, cudaEventElapsedTime(&ms, t0, t1));
            mine[k * CUDA_P2P_FORMS + f] = 1e3f * ms / P2P_ITERS;
        }
    }
    cudaEventDestroy(t0), cudaEventDestroy(t1);
    cudaFree(buf);
    int timed_out = 0;
    CHECK(be, cuda_ar_timed_out(p->peers, &timed_out));
    enum status st = cuda_sink_status(&be->sink, err);
    if (st)
        return st;
    comm_all_gather(c, mine, all, sizeof mine);
    int any_timeout = timed_out, flags[CUDA_AR_MAX_RANKS];
    comm_all_gather(c, &any_timeout, flags, sizeof any_timeout);
    for (int r = 0; r < c->size; r++)
        any_timeout |= flags[r];
    if (any_timeout)
        return p2p_off(p, "the P2P barrier timed out at start-up (a rank never arrived): NCCL alone");
    for (int k = 0; k < CUDA_P2P_CLASSES; k++) {
        enum cuda_p2p_form best = CUDA_P2P_NCCL;
        for (int f = 0; f < CUDA_P2P_FORMS; f++) {
            float worst = 0;
            for (int r = 0; r < c->size; r++) {
                float t = all[(size_t)r * CUDA_P2P_CLASSES * CUDA_P2P_FORMS + (size_t)k * CUDA_P2P_FORMS + (size_t)f];
                worst = t > worst ? t : worst;
            }
            p->us[k][f] = worst;
            if (worst < p->us[k][best])
                best = (enum cuda_p2p_form)f;
        }
        p->form[k] = best;
    }
    return STATUS_OK;
}

enum status cuda_p2p_init(struct cuda_p2p *p, struct comm *c, struct backend *be, bool allow,
                          cuda_p2p_nccl_fn nccl, struct err *err)
{
    memset(p, 0, sizeof *p);
    p->be = cuda_ctx(be);
    if (c->size < 2)
        return p2p_off(p, "one rank: nothing to reduce");
    if (!allow)
        return p2p_off(p, "--collectives nccl");
    if (c->size > CUDA_AR_MAX_RANKS)
        return p2p_off(p, "%d ranks: the P2P kernels take up to %d", c->size, CUDA_AR_MAX_RANKS);
    bool ok = false;
    int a = -1, b = -1;
    p2p_reach(p, c, &ok, &a, &b);
    if (!ok)
        return p2p_off(p, "GPU %d cannot reach a peer's memory (cudaDeviceCanAccessPeer; first: GPU %d): NCCL alone",
                       a, b);
    enum status st = p2p_map(p, c, err);
    if (!st) {
        p->on = true;
        st = p2p_measure(p, c, nccl, err);
    }
    if (st)
        cuda_p2p_free(p);
    return st;
}

static void fmt_bytes(size_t b, char *buf, size_t n)
{
    if (b >= (1u << 20))
        snprintf(buf, n, "%zu MiB", b >> 20);
    else if (b >= 1024)
        snprintf(buf, n, "%zu KiB", b >> 10);
    else
        snprintf(buf, n, "%zu B", b);
}

void cuda_p2p_describe(const struct cuda_p2p *p, char *buf, size_t n)
{
    size_t o = 0;
    if (!p->on) {
        snprintf(buf, n, "all-reduce: NCCL for every size (%s)", p->why_off);
        return;
    }
    o += (size_t)snprintf(buf + o, n - o, "all-reduce by message size (start-up measurement, slowest rank, us):\n");
    for (int k = 0; k < CUDA_P2P_CLASSES && o < n; k++) {
        char sz[32];
        fmt_bytes((size_t)256 << k, sz, sizeof sz);
        o += (size_t)snprintf(buf + o, n - o, "  %8s  nccl %8.1f  one-shot %8.1f  two-shot %8.1f  -> %s\n", sz,
                              p->us[k][0], p->us[k][1], p->us[k][2], cuda_p2p_form_name(p->form[k]));
    }
    /* the crossovers: where the chosen form changes */
    for (int k = 1; k < CUDA_P2P_CLASSES && o < n; k++)
        if (p->form[k] != p->form[k - 1]) {
            char sz[32];
            fmt_bytes((size_t)256 << (k - 1), sz, sizeof sz);
            o += (size_t)snprintf(buf + o, n - o, "  crossover: %s up to %s, then %s\n", cuda_p2p_form_name(p->form[k - 1]),
                                  sz, cuda_p2p_form_name(p->form[k]));
        }
    if (o < n) {
        char sz[32];
        fmt_bytes(CUDA_P2P_MAX_BYTES, sz, sizeof sz);
        snprintf(buf + o, n - o, "  above %s: nccl", sz);
    }
}

void cuda_p2p_free(struct cuda_p2p *p)
{
    if (!p->be) {
        memset(p, 0, sizeof *p);
        return;
    }
    for (int r = 0; r < CUDA_AR_MAX_RANKS; r++)
        if (p->mapped[r])
            CHECK(p->be, cudaIpcCloseMemHandle(p->mapped[r]));
    if (p->base)
        CHECK(p->be, cudaFree(p->base));
    memset(p, 0, sizeof *p);
}
