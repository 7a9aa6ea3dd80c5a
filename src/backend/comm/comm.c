/* comm.c — the single-rank communicator and the dispatch of comm.h. */
#include "backend/comm/comm.h"

#include <stdlib.h>
#include <string.h>

#include "base/options.h"

static void single_all_reduce_sum(struct comm *c, float *buf, size_t n)
{
    (void)c, (void)buf, (void)n;
}

static void single_broadcast(struct comm *c, void *buf, size_t bytes, int root)
{
    (void)c, (void)buf, (void)bytes, (void)root;
}

static void single_all_gather(struct comm *c, const void *in, void *out, size_t bytes)
{
    (void)c;
    if (out != in)
        memmove(out, in, bytes);
}

static void single_all_gather_cols(struct comm *c, const float *in, float *out, size_t rows, size_t k)
{
    (void)c;
    if (out != in)
        memmove(out, in, rows * k * sizeof(float));
}

static void single_all_gather_rows(struct comm *c, const float *in, float *out, size_t n)
{
    (void)c;
    if (out != in)
        memmove(out, in, n * sizeof(float));
}

static void single_reduce_scatter_sum(struct comm *c, const float *in, float *out, size_t n)
{
    (void)c;
    if (out != in)
        memmove(out, in, n * sizeof(float));
}

static void single_barrier(struct comm *c)
{
    (void)c;
}

static void single_destroy(struct comm *c)
{
    (void)c;
}

static const struct comm_ops SINGLE_OPS = {
    .name = "single",
    .all_reduce_sum = single_all_reduce_sum,
    .broadcast = single_broadcast,
    .all_gather = single_all_gather,
    .all_gather_cols = single_all_gather_cols,
    .all_gather_rows = single_all_gather_rows,
    .reduce_scatter_sum = single_reduce_scatter_sum,
    .barrier = single_barrier,
    .destroy = single_destroy,
};

void comm_init_single(struct comm *c)
{
    *c = (struct comm){.ops = &SINGLE_OPS, .rank = 0, .size = 1};
}

bool comm_mpi_launched(void)
{
    struct options o;
    struct err e;
    return options_read(&o, &e) == STATUS_OK && o.mpi_launched;
}

void comm_free(struct comm *c)
{
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c);
    memset(c, 0, sizeof *c);
}

/* Every call reaches the implementation, one rank too (a one-rank NCCL communicator is how the
 * lent single GPU tests the GPU path); the single communicator's ops are empty. */
void comm_all_reduce_sum(struct comm *c, float *buf, size_t n)
{
    if (n)
        c->ops->all_reduce_sum(c, buf, n);
}

void comm_broadcast(struct comm *c, void *buf, size_t bytes, int root)
{
    if (bytes)
        c->ops->broadcast(c, buf, bytes, root);
}

void comm_all_gather(struct comm *c, const void *in, void *out, size_t bytes)
{
    c->ops->all_gather(c, in, out, bytes);
}

void comm_all_gather_cols(struct comm *c, const float *in, float *out, size_t rows, size_t k)
{
    c->ops->all_gather_cols(c, in, out, rows, k);
}

void comm_all_gather_rows(struct comm *c, const float *in, float *out, size_t n)
{
    c->ops->all_gather_rows(c, in, out, n);
}

void comm_reduce_scatter_sum(struct comm *c, const float *in, float *out, size_t n)
{
    c->ops->reduce_scatter_sum(c, in, out, n);
}

void comm_all_reduce_add_rmsnorm(struct comm *c, struct backend *be, float *delta, float *h, const float *w,
                                 int rows, int dim, float eps, float *x)
{
    const size_t n = (size_t)rows * (size_t)dim;
    if (n && c->ops->all_reduce_add_rmsnorm && c->ops->all_reduce_add_rmsnorm(c, delta, h, w, rows, dim, eps, x))
        return;
    comm_all_reduce_sum(c, delta, n);
    be->ops->add_rmsnorm(be, h, delta, w, rows, dim, eps, x);
}

bool comm_fuses_add_rmsnorm(const struct comm *c, size_t n)
{
    return c->ops->fuses_add_rmsnorm && c->ops->fuses_add_rmsnorm(c, n);
}

void comm_barrier(struct comm *c)
{
    if (c->size > 1)
        c->ops->barrier(c);
}

void comm_abort(struct comm *c, int code)
{
    if (c->size > 1 && c->ops->abort)
        c->ops->abort(c, code);
}

/* FNV-1a, 64-bit: enough to tell configurations apart, not a defence against a forger */
static uint64_t hash_bytes(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

enum status comm_check_same(struct comm *c, const void *bytes, size_t n, const char *what, struct err *err)
{
    if (c->size <= 1)
        return STATUS_OK;
    uint64_t mine = hash_bytes(bytes, n);
    uint64_t *all = malloc((size_t)c->size * sizeof *all);
    if (!all)
        return err_set(err, STATUS_NOMEM, "comm: out of memory for %d ranks", c->size);
    comm_all_gather(c, &mine, all, sizeof mine);
    int bad = -1;
    for (int r = 1; r < c->size && bad < 0; r++)
        if (all[r] != all[0])
            bad = r;
    free(all);
    if (bad >= 0)
        return err_set(err, STATUS_INVALID, "rank %d of %d runs with another %s than rank 0", bad, c->size, what);
    return STATUS_OK;
}

enum status comm_agree(struct comm *c, enum status st, struct err *err)
{
    if (c->size <= 1)
        return st;
    int32_t mine = (int32_t)st, all[4096];
    if (c->size > (int)(sizeof all / sizeof all[0]))
        return err_set(err, STATUS_UNSUPPORTED, "comm: %d ranks is more than supported", c->size);
    comm_all_gather(c, &mine, all, sizeof mine);
    if (st)
        return st;
    for (int r = 0; r < c->size; r++)
        if (all[r])
            return err_set(err, (enum status)all[r], "rank %d of %d failed (its message is in its log)", r,
                           c->size);
    return STATUS_OK;
}
