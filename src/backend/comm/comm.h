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
 *          comm_all_gather_cols(), comm_barrier(),
 *          comm_abort(), comm_check_same(), comm_agree()
 */
#ifndef MOESERVE_BACKEND_COMM_COMM_H
#define MOESERVE_BACKEND_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
