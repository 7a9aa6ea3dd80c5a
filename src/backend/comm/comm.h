/* comm.h — collectives between the ranks of one model (DESIGN.md decision 6), behind one
 * interface: MPI for CPU ranks (comm_mpi.c, ranks started by mpirun), NCCL for GPU ranks (later
 * in this folder), and the single-rank communicator that does nothing.
 *
 * Buffers are the backend's memory (host memory for the CPU backend). Every rank calls every
 * collective in the same order with the same sizes; the forward does so by construction (all
 * ranks run the same pass). A failing collective is not recoverable inside a pass: the MPI
 * implementation aborts the whole job with its message (which names the rank), so that no rank
 * waits forever for a dead peer.
 *
 * defines: struct comm, struct comm_ops, comm_init_single(), comm_init_mpi(), comm_mpi_launched(),
 *          comm_free(), comm_all_reduce_sum(), comm_broadcast(), comm_all_gather(),
 *          comm_all_gather_cols(), comm_all_gather_rows(), comm_reduce_scatter_sum(),
 *          comm_all_reduce_add_rmsnorm(), comm_fuses_add_rmsnorm(), comm_barrier(),
 *          comm_abort(), comm_check_same(), comm_agree()
 */
#ifndef MOESERVE_BACKEND_COMM_COMM_H
#define MOESERVE_BACKEND_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"

struct comm;

struct comm_ops {
    const char *name; /* "single", "mpi" */
    /* buf (n floats) = the sum over the ranks of every rank's buf, the same bits on every rank */
    void (*all_reduce_sum)(struct comm *c, float *buf, size_t n);
    /* root's bytes to every rank */
    void (*broadcast)(struct comm *c, void *buf, size_t bytes, int root);
    /* out (size x bytes) = every rank's in, in rank order (host memory) */
    void (*all_gather)(struct comm *c, const void *in, void *out, size_t bytes);
    /* out [rows][size * k] = the ranks' in [rows][k] side by side, rank r's at columns r k ..
     * (backend memory: a vocabulary-parallel lm_head's logits) */
    void (*all_gather_cols)(struct comm *c, const float *in, float *out, size_t rows, size_t k);
    /* out (size x n floats) = every rank's in (n floats) in rank order (backend memory: the tokens of
     * data-parallel attention's ranks gathered before the FFN) */
    void (*all_gather_rows)(struct comm *c, const float *in, float *out, size_t n);
    /* out (n floats) = the sum over the ranks of block `rank` of their in (size x n floats; backend
     * memory: the FFN's partial sums scattered back to the ranks whose tokens they are) */
    void (*reduce_scatter_sum)(struct comm *c, const float *in, float *out, size_t n);
    /* Optional: the all-reduce of delta (rows x dim), h += delta, x = rmsnorm(h) * w, in one kernel;
     * false (nothing done) where this message size has no fused form (comm_all_reduce_add_rmsnorm
     * then runs the all-reduce and the backend's add_rmsnorm apart) */
    bool (*all_reduce_add_rmsnorm)(struct comm *c, float *delta, float *h, const float *w, int rows, int dim,
                                   float eps, float *x);
    /* Optional: whether all_reduce_add_rmsnorm takes a message of n floats (NULL: never) */
    bool (*fuses_add_rmsnorm)(const struct comm *c, size_t n);
    void (*barrier)(struct comm *c);
    /* ends every rank of the job at once with exit code `code` (after a rank's unrecoverable error) */
    void (*abort)(struct comm *c, int code);
    void (*destroy)(struct comm *c);
};

struct comm {
    const struct comm_ops *ops;
    int rank; /* 0 .. size - 1 */
    int size;
    void *impl; /* the implementation's state, owned */
};

/* One rank: every collective is a no-op (an all-reduce of one buffer is itself). */
void comm_init_single(struct comm *c);
/* Whether this process was started by mpirun (Open MPI's environment): then comm_init_mpi is the
 * way to learn its rank. */
bool comm_mpi_launched(void);
/* MPI_COMM_WORLD's ranks (MPI_Init on first use); STATUS_UNSUPPORTED in a build without MPI. */
enum status comm_init_mpi(struct comm *c, struct err *err);
/* Safe on a zeroed struct; finalises MPI after its last communicator. */
void comm_free(struct comm *c);

void comm_all_reduce_sum(struct comm *c, float *buf, size_t n);
void comm_broadcast(struct comm *c, void *buf, size_t bytes, int root);
void comm_all_gather(struct comm *c, const void *in, void *out, size_t bytes);
void comm_all_gather_cols(struct comm *c, const float *in, float *out, size_t rows, size_t k);
void comm_all_gather_rows(struct comm *c, const float *in, float *out, size_t n);
void comm_reduce_scatter_sum(struct comm *c, const float *in, float *out, size_t n);
/* The all-reduce of a half-layer's partial output delta (rows x dim) followed by the residual add
 * and the next norm: h += sum(delta), x = rmsnorm(h) * w. One kernel where the communicator has a
 * fused form for this size (GPU ranks: the P2P one-shot kernel where the start-up measurement chose
 * it); else the all-reduce, then be's add_rmsnorm: the CPU reference, the same bits as the two ops
 * called apart. delta holds the sum afterwards only in the second case. */
void comm_all_reduce_add_rmsnorm(struct comm *c, struct backend *be, float *delta, float *h, const float *w,
                                 int rows, int dim, float eps, float *x);
/* Whether comm_all_reduce_add_rmsnorm runs one fused kernel for n floats (else two ops). */
bool comm_fuses_add_rmsnorm(const struct comm *c, size_t n);
void comm_barrier(struct comm *c);
/* Ends the whole job (every rank) with `code`; returns only with one rank. */
void comm_abort(struct comm *c, int code);
/* Whether every rank passed the same bytes (a hash of them is compared): what a rank must agree
 * on before it runs its shard (binary, model, options); an error names the first rank that
 * differs and `what`. */
enum status comm_check_same(struct comm *c, const void *bytes, size_t n, const char *what, struct err *err);

/* Every rank's outcome of a step that may fail on some ranks only (loading its shard): st where
 * this rank failed (err as it was), else an error naming the first rank that did; all ranks call
 * it, so none is left waiting in a collective for one that gave up. */
enum status comm_agree(struct comm *c, enum status st, struct err *err);

#endif
