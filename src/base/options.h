/* options.h — every environment variable moeserve reads, read in one place.
 *
 * The environment carries only test and measurement switches and a few defaults for the
 * command line; what a user chooses is a command-line flag. options_read() takes a snapshot
 * of the variables below and validates them, so a bad value is an error naming the variable,
 * not a silently ignored setting. Nothing else in src/ reads the environment (tests/cli/env_in_one_file.sh
 * checks that), except main.c for MOESERVE_LOG before anything runs.
 *
 *   MOESERVE_MODEL        default for --model
 *   MOESERVE_API_KEY      default for serve's --api-key
 *   MOESERVE_SMEM_BUDGET  shared-memory budget per block in bytes (tests: the sm_120 tiles on a
 *                         larger GPU); --smem-budget where a command has it
 *   MOESERVE_ATTN_SPLITS  "none": never split the attention's keys (tests: the golden fixtures
 *                         then reach the prefill attention kernels); N: always N splits where the
 *                         kernel splits (measuring the plan's split rule)
 *   MOESERVE_NO_GRAPHS    "1": every pass runs op by op (measuring what graphs save, debugging)
 *   MOESERVE_CUDA_FORCE   "op[@bucket]:kernel,...": run these kernels instead of the plan's
 *                         choice (measuring); validated against the kernel registry; a plan
 *                         entry's form too (mla_prefill:mla_prefill_expanded | _absorbed,
 *                         mla_proj:mla_proj_fp32 | mla_proj_mma_bf16)
 *   MOESERVE_TRACE_OUT    FILE: the kernels' phase records (a -DMOESERVE_KERNEL_TRACE=ON build)
 *   OMPI_COMM_WORLD_SIZE, PMIX_RANK  set by mpirun: this process is one of its ranks
 *   OMPI_COMM_WORLD_LOCAL_RANK       its index on its node (a GPU rank's GPU)
 *   TMPDIR                where temporary directories go (--synthetic's config), else /tmp
 *
 * defines: struct options, options_read()
 */
#ifndef MOESERVE_BASE_OPTIONS_H
#define MOESERVE_BASE_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

struct options {
    const char *model;      /* NULL when unset; borrowed from the environment */
    const char *api_key;    /* NULL when unset; "" is kept (serve refuses it) */
    size_t smem_budget;     /* 0: the device's own */
    bool attn_splits_none;
    int attn_splits;        /* MOESERVE_ATTN_SPLITS=N; 0 when unset or "none" */
    bool no_graphs;
    const char *cuda_force; /* "" when unset */
    const char *trace_out;  /* "" when unset */
    bool mpi_launched;      /* started by mpirun (Open MPI / PMIx environment) */
    int mpi_local_rank;     /* this rank's index on its node (OMPI_COMM_WORLD_LOCAL_RANK); -1 unset */
    const char *tmp_dir;    /* TMPDIR, else "/tmp" */
};

/* Fills o from the environment; STATUS_INVALID names the variable with a bad value. */
enum status options_read(struct options *o, struct err *err);

#endif
