/* bench_allreduce.h — `moeserve bench --allreduce`: the ranks' all-reduce (the communicator a
 * forward pass uses: MPI for CPU ranks, NCCL for GPU ranks) timed at message sizes from 256 B to
 * 16 MiB, doubling; every rank runs it, rank 0 prints the table (or JSON): time a call, algorithm
 * bandwidth (bytes / time) and bus bandwidth (x 2 (N - 1) / N, NCCL's convention).
 *
 * defines: bench_allreduce_run()
 */
#ifndef MOESERVE_CLI_BENCH_ALLREDUCE_H
#define MOESERVE_CLI_BENCH_ALLREDUCE_H

#include <stdbool.h>

#include "backend/comm/comm.h"
#include "engine/model_session.h"

/* The command's exit code. c: the session's communicator, or the single one. */
int bench_allreduce_run(struct model_session *s, struct comm *c, bool json);

#endif
