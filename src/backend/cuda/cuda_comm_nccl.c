/* cuda_comm_nccl.c — see cuda_comm_nccl.h. */
#include "backend/cuda/cuda_comm_nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/cuda_comm_p2p.h"
#include "base/log.h"

/* The NCCL entry points moeserve uses, from libnccl.so.2. */
struct nccl_lib {
    void *lib;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_async_error)(ncclComm_t, ncclResult_t *);
};

struct nccl_comm {
    struct nccl_lib nl;
    ncclComm_t comm;
    struct cuda_backend *be; /* its stream and its error sink */
    void *stage;             /* device: host collectives' and the gather's staging */
    size_t stage_bytes;
    struct cuda_p2p p2p;     /* the peer-to-peer all-reduce, where the start-up measurement chose it */
    int rank;
    pthread_t checker;       /* polls NCCL's asynchronous errors (ranks > 1) */
    bool checking;
    atomic_bool stop;
};

/* A peer that died or a network that failed shows as an asynchronous error of the communicator,
 * not as a failed call: the collectives in flight would wait forever. Polled every 100 ms; on an
 * error this rank aborts NCCL and exits naming itself and the error, which the launcher's
 * watchdog (or mpirun) turns into the end of every rank. */
static void *nccl_check_run(void *arg)
{
    struct nccl_comm *x = arg;
    while (!atomic_load(&x->stop)) {
        ncclResult_t async = ncclSuccess;
        if (x->nl.get_async_error(x->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
            LOG_ERROR("rank %d: NCCL reports an asynchronous error (%s): a peer died or its link failed; "
                      "stopping this rank", x->rank, x->nl.error_string(async));
            x->nl.comm_abort(x->comm);
            _exit(1);
        }
        usleep(100 * 1000);
    }
    return NULL;
}

static enum status nccl_load(struct nccl_lib *nl, struct err *err)
{
    memset(nl, 0, sizeof *nl);
    /* NODELETE: ncclGetUniqueId leaves its bootstrap thread running in the library, which a dlclose
     * would unmap under it */
    nl->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!nl->lib)
        return err_set(err, STATUS_UNSUPPORTED, "GPU ranks need NCCL: cannot load libnccl.so.2 (%s); put its "
                       "folder on LD_LIBRARY_PATH", dlerror());
    /* POSIX: dlsym results convert to function pointers through this memcpy */
#define NCCL_SYM(field, name)                                                                                \
    do {                                                                                                     \
        void *s_ = dlsym(nl->lib, name);                                                                     \
        if (!s_)                                                                                             \
            return err_set(err, STATUS_UNSUPPORTED, "libnccl.so.2 has no %s", name);                         \
        memcpy(&nl->field, &s_, sizeof s_);                                                                  \
    } while (0)
    NCCL_SYM(get_unique_id, "ncclGetUniqueId");
    NCCL_SYM(comm_init_rank, "ncclCommInitRank");
    NCCL_SYM(comm_destroy, "ncclCommDestroy");
    NCCL_SYM(comm_abort, "ncclCommAbort");
    NCCL_SYM(all_reduce, "ncclAllReduce");
    NCCL_SYM(broadcast, "ncclBroadcast");
    NCCL_SYM(all_gather, "ncclAllGather");
    NCCL_SYM(reduce_scatter, "ncclReduceScatter");
    NCCL_SYM(error_string, "ncclGetErrorString");
    NCCL_SYM(get_async_error, "ncclCommGetAsyncError");
#undef NCCL_SYM
    return STATUS_OK;
}

/* NCCL's results through the backend's one checked-call function (cuda_check.h). */
static bool nccl_ok(struct nccl_comm *n, ncclResult_t r, const char *expr, const char *file, int line)
{
    struct cuda_result cr = {r == ncclSuccess, "NCCL", "ncclResult_t",
                             n->nl.error_string ? n->nl.error_string(r) : "?"};
    return cuda_check(n->be ? &n->be->sink : NULL, cr, expr, file, line);
}
#define NCCL_CHECK(n, call) nccl_ok((n), (call), #call, __FILE__, __LINE__)

static bool stage_grow(struct nccl_comm *n, size_t bytes)
{
    if (bytes <= n->stage_bytes)
        return true;
    if (n->be->capturing) { /* a capture cannot allocate: the pass's sizes are grown on its first run */
        n->be->capture_broken = true;
        return false;
    }
    if (n->stage)
        CHECK(n->be, cudaFree(n->stage));
    n->stage = NULL, n->stage_bytes = 0;
    if (!CHECK(n->be, cudaMalloc(&n->stage, bytes)))
        return false;
    n->stage_bytes = bytes;
    return true;
}

/* NCCL's own all-reduce (the P2P table's measurement calls it too) */
static void nccl_sum(struct comm *c, float *buf, size_t n)
{
    struct nccl_comm *x = c->impl;
    NCCL_CHECK(x, x->nl.all_reduce(buf, buf, n, ncclFloat32, ncclSum, x->comm, x->be->stream));
}

static void nccl_all_reduce_sum(struct comm *c, float *buf, size_t n)
{
    struct nccl_comm *x = c->impl;
    if (!cuda_p2p_all_reduce(&x->p2p, buf, n))
        nccl_sum(c, buf, n);
}

static void nccl_broadcast(struct comm *c, void *buf, size_t bytes, int root)
{
    struct nccl_comm *x = c->impl;
    if (!stage_grow(x, bytes))
        return;
    cudaStream_t s = x->be->stream;
    if (c->rank == root)
        CHECK(x->be, cudaMemcpyAsync(x->stage, buf, bytes, cudaMemcpyHostToDevice, s));
    NCCL_CHECK(x, x->nl.broadcast(x->stage, x->stage, bytes, ncclUint8, root, x->comm, s));
    CHECK(x->be, cudaMemcpyAsync(buf, x->stage, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(x->be, cudaStreamSynchronize(s));
}

static void nccl_all_gather(struct comm *c, const void *in, void *out, size_t bytes)
{
    struct nccl_comm *x = c->impl;
    const size_t all = bytes * (size_t)c->size;
    if (!stage_grow(x, all + bytes))
        return;
    cudaStream_t s = x->be->stream;
    uint8_t *mine = (uint8_t *)x->stage + all;
    CHECK(x->be, cudaMemcpyAsync(mine, in, bytes, cudaMemcpyHostToDevice, s));
    NCCL_CHECK(x, x->nl.all_gather(mine, x->stage, bytes, ncclUint8, x->comm, s));
    CHECK(x->be, cudaMemcpyAsync(out, x->stage, all, cudaMemcpyDeviceToHost, s));
    CHECK(x->be, cudaStreamSynchronize(s));
}

/* NCCL gathers rank-major ([size][rows][k]); one 2-D copy a rank puts each block at its columns */
static void nccl_all_gather_cols(struct comm *c, const float *in, float *out, size_t rows, size_t k)
{
    struct nccl_comm *x = c->impl;
    const size_t block = rows * k * sizeof(float);
    if (!stage_grow(x, block * (size_t)c->size))
        return;
    cudaStream_t s = x->be->stream;
    NCCL_CHECK(x, x->nl.all_gather(in, x->stage, rows * k, ncclFloat32, x->comm, s));
    for (int r = 0; r < c->size; r++)
        CHECK(x->be, cudaMemcpy2DAsync(out + (size_t)r * k, k * (size_t)c->size * sizeof(float),
                                       (const uint8_t *)x->stage + (size_t)r * block, k * sizeof(float),
                                       k * sizeof(float), rows, cudaMemcpyDeviceToDevice, s));
}

/* data-parallel attention's gather of the ranks' tokens: NCCL's rank-major layout is the one asked */
static void nccl_all_gather_rows(struct comm *c, const float *in, float *out, size_t n)
{
    struct nccl_comm *x = c->impl;
    NCCL_CHECK(x, x->nl.all_gather(in, out, n, ncclFloat32, x->comm, x->be->stream));
}

static void nccl_reduce_scatter_sum(struct comm *c, const float *in, float *out, size_t n)
{
    struct nccl_comm *x = c->impl;
    NCCL_CHECK(x, x->nl.reduce_scatter(in, out, n, ncclFloat32, ncclSum, x->comm, x->be->stream));
}

/* The fused kernel where the start-up table chose the one-shot form for this size; elsewhere the
 * caller runs the all-reduce (NCCL or two-shot, by the table) and the backend's add+norm kernel */
static bool nccl_all_reduce_add_rmsnorm(struct comm *c, float *delta, float *h, const float *w, int rows, int dim,
                                        float eps, float *x)
{
    struct nccl_comm *n = c->impl;
    return cuda_p2p_all_reduce_add_rmsnorm(&n->p2p, delta, h, w, rows, dim, eps, x);
}

static bool nccl_fuses_add_rmsnorm(const struct comm *c, size_t n)
{
    const struct nccl_comm *x = c->impl;
    return cuda_p2p_fuses_add_rmsnorm(&x->p2p, n);
}

static void nccl_barrier(struct comm *c)
{
    uint8_t one = 1;
    nccl_broadcast(c, &one, 1, 0);
}

static void nccl_abort(struct comm *c, int code)
{
    struct nccl_comm *x = c->impl;
    x->nl.comm_abort(x->comm);
    _exit(code); /* the other ranks' NCCL calls fail on the aborted communicator */
}

static void nccl_destroy(struct comm *c)
{
    struct nccl_comm *x = c->impl;
    if (!x)
        return;
    if (x->checking) {
        atomic_store(&x->stop, true);
        pthread_join(x->checker, NULL);
    }
    cuda_p2p_free(&x->p2p);
    if (x->comm)
        NCCL_CHECK(x, x->nl.comm_destroy(x->comm));
    if (x->stage)
        CHECK(x->be, cudaFree(x->stage));
    if (x->nl.lib)
        dlclose(x->nl.lib);
    free(x);
    c->impl = NULL;
}

void cuda_comm_nccl_describe(const struct comm *c, char *buf, size_t n)
{
    if (!c->ops || strcmp(c->ops->name, "nccl") != 0) {
        snprintf(buf, n, "all-reduce: %s", c->ops ? c->ops->name : "none");
        return;
    }
    cuda_p2p_describe(&((const struct nccl_comm *)c->impl)->p2p, buf, n);
}

static const struct comm_ops NCCL_OPS = {
    .name = "nccl",
    .all_reduce_sum = nccl_all_reduce_sum,
    .broadcast = nccl_broadcast,
    .all_gather = nccl_all_gather,
    .all_gather_cols = nccl_all_gather_cols,
    .all_gather_rows = nccl_all_gather_rows,
    .reduce_scatter_sum = nccl_reduce_scatter_sum,
    .all_reduce_add_rmsnorm = nccl_all_reduce_add_rmsnorm,
    .fuses_add_rmsnorm = nccl_fuses_add_rmsnorm,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

enum status cuda_comm_nccl_unique_id(uint8_t id[CUDA_NCCL_ID_BYTES], struct err *err)
{
    struct nccl_lib nl;
    enum status st = nccl_load(&nl, err);
    if (!st) {
        ncclUniqueId u;
        ncclResult_t r = nl.get_unique_id(&u);
        if (r != ncclSuccess)
            st = err_set(err, STATUS_IO, "ncclGetUniqueId: %s", nl.error_string(r));
        else
            memcpy(id, u.internal, CUDA_NCCL_ID_BYTES);
    }
    if (nl.lib)
        dlclose(nl.lib);
    return st;
}

enum status cuda_comm_nccl_init(struct comm *c, struct backend *be, int rank, int size,
                                const uint8_t id[CUDA_NCCL_ID_BYTES], bool p2p, struct err *err)
{
    memset(c, 0, sizeof *c);
    if (strcmp(be->ops->name, "cuda") != 0)
        return err_set(err, STATUS_INVALID, "NCCL ranks need the cuda backend, not %s", be->ops->name);
    struct nccl_comm *x = calloc(1, sizeof *x);
    if (!x)
        return err_set(err, STATUS_NOMEM, "out of memory for a NCCL communicator");
    enum status st = nccl_load(&x->nl, err);
    if (st) {
        if (x->nl.lib)
            dlclose(x->nl.lib);
        free(x);
        return st;
    }
    x->be = cuda_ctx(be);
    if (!CHECK(x->be, cudaSetDevice(x->be->device))) {
        dlclose(x->nl.lib);
        free(x);
        return cuda_sink_status(&cuda_ctx(be)->sink, err);
    }
    ncclUniqueId u;
    memcpy(u.internal, id, CUDA_NCCL_ID_BYTES);
    ncclResult_t r = x->nl.comm_init_rank(&x->comm, size, u, rank);
    if (r != ncclSuccess) {
        st = err_set(err, STATUS_IO, "ncclCommInitRank (rank %d of %d): %s", rank, size, x->nl.error_string(r));
        dlclose(x->nl.lib);
        free(x);
        return st;
    }
    *c = (struct comm){.ops = &NCCL_OPS, .rank = rank, .size = size, .impl = x};
    x->rank = rank;
    LOG_DEBUG("nccl: rank %d of %d on device %d", rank, size, x->be->device);
    if (size > 1 && pthread_create(&x->checker, NULL, nccl_check_run, x) == 0)
        x->checking = true;
    st = cuda_p2p_init(&x->p2p, c, be, p2p, nccl_sum, err);
    if (st) {
        comm_free(c);
        return st;
    }
    if (rank == 0 && size > 1) {
        char table[4096];
        cuda_p2p_describe(&x->p2p, table, sizeof table);
        LOG_INFO("%s", table);
    }
    return STATUS_OK;
}
