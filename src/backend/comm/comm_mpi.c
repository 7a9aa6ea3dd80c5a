/* comm_mpi.c — comm.h over MPI_COMM_WORLD (Open MPI from Debian), for CPU ranks started by
 * mpirun. The default error handler (MPI_ERRORS_ARE_FATAL) stays: a collective that fails, or a
 * peer that died, ends the job with Open MPI's message naming the rank, which is the bounded stop
 * DESIGN.md asks for. Threads: requested MPI_THREAD_SERIALIZED (the server's engine thread makes
 * every call, one at a time). */
#include "backend/comm/comm.h"

#ifdef MOESERVE_HAVE_MPI
#include <limits.h>
#include <mpi.h>

static int g_users; /* live MPI communicators of the process: MPI_Finalize after the last */

/* MPI counts are int: long buffers go in pieces */
enum { MPI_PIECE = INT_MAX / 8 };

static void mpi_all_reduce_sum(struct comm *c, float *buf, size_t n)
{
    (void)c;
    for (size_t o = 0; o < n; o += MPI_PIECE) {
        int k = (int)(n - o < MPI_PIECE ? n - o : MPI_PIECE);
        MPI_Allreduce(MPI_IN_PLACE, buf + o, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
}

static void mpi_broadcast(struct comm *c, void *buf, size_t bytes, int root)
{
    (void)c;
    for (size_t o = 0; o < bytes; o += MPI_PIECE) {
        int k = (int)(bytes - o < MPI_PIECE ? bytes - o : MPI_PIECE);
        MPI_Bcast((char *)buf + o, k, MPI_BYTE, root, MPI_COMM_WORLD);
    }
}

static void mpi_all_gather(struct comm *c, const void *in, void *out, size_t bytes)
{
    (void)c;
    MPI_Allgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
}

/* MPI lays each rank's block out itself: a receive type of `rows` runs of k floats, strided by a
 * whole output row and resized so that rank r's block starts k floats after rank r - 1's */
static void mpi_all_gather_cols(struct comm *c, const float *in, float *out, size_t rows, size_t k)
{
    MPI_Datatype block, placed;
    MPI_Type_vector((int)rows, (int)k, (int)k * c->size, MPI_FLOAT, &block);
    MPI_Type_create_resized(block, 0, (MPI_Aint)(k * sizeof(float)), &placed);
    MPI_Type_commit(&placed);
    MPI_Allgather(in, (int)(rows * k), MPI_FLOAT, out, 1, placed, MPI_COMM_WORLD);
    MPI_Type_free(&placed);
    MPI_Type_free(&block);
}

static void mpi_all_gather_rows(struct comm *c, const float *in, float *out, size_t n)
{
    ASSERT(n * (size_t)c->size <= INT_MAX); /* the forward's activations: far below */
    MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
}

static void mpi_reduce_scatter_sum(struct comm *c, const float *in, float *out, size_t n)
{
    ASSERT(n * (size_t)c->size <= INT_MAX);
    MPI_Reduce_scatter_block(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static void mpi_barrier(struct comm *c)
{
    (void)c;
    MPI_Barrier(MPI_COMM_WORLD);
}

static void mpi_abort(struct comm *c, int code)
{
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code);
}

static void mpi_destroy(struct comm *c)
{
    (void)c;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (--g_users == 0 && !finalized)
        MPI_Finalize();
}

static const struct comm_ops MPI_OPS = {
    .name = "mpi",
    .all_reduce_sum = mpi_all_reduce_sum,
    .broadcast = mpi_broadcast,
    .all_gather = mpi_all_gather,
    .all_gather_cols = mpi_all_gather_cols,
    .all_gather_rows = mpi_all_gather_rows,
    .reduce_scatter_sum = mpi_reduce_scatter_sum,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

enum status comm_init_mpi(struct comm *c, struct err *err)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return err_set(err, STATUS_IO, "MPI_Init_thread failed");
        if (provided < MPI_THREAD_SERIALIZED)
            return err_set(err, STATUS_UNSUPPORTED, "MPI: this MPI library gives thread level %d, moeserve needs "
                           "MPI_THREAD_SERIALIZED", provided);
    }
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    *c = (struct comm){.ops = &MPI_OPS, .rank = rank, .size = size};
    g_users++;
    return STATUS_OK;
}

#else

enum status comm_init_mpi(struct comm *c, struct err *err)
{
    comm_init_single(c);
    return err_set(err, STATUS_UNSUPPORTED, "this build has no MPI (install libopenmpi-dev and rebuild)");
}

#endif
