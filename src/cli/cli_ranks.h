/* cli_ranks.h — the ranks of a command run with --tensor-parallel N (DESIGN.md decision 6).
 *
 * CPU ranks are processes started by mpirun (`mpirun -np N moeserve logits --tensor-parallel N
 * ...`); GPU ranks (--backend cuda) are started by the command itself, one process a GPU (rank r on
 * GPU r), joined over NCCL, and a rank that dies stops the others within a second with a message
 * naming it (a watchdog in rank 0; the others die with rank 0); `--backend cuda --tensor-parallel 1`
 * is one NCCL rank. Rank 0 runs the command; the others load their shards and then run every forward pass
 * rank 0 sends them (engine/ranks.h) until it stops them. The ranks agree on the binary and the
 * command line before any weight is read (a mismatch is refused, naming the rank), and on whether
 * every one loaded its shard; rank 0 alone writes outputs and logs at the chosen level, the
 * others only warnings and errors. Without --tensor-parallel a command runs as one rank (under a one-process mpirun too).
 *
 * defines: struct cli_ranks, CLI_RANK_OPTS, cli_ranks_open(), cli_ranks_loaded(), cli_ranks_follow(),
 *          cli_ranks_stop(), cli_ranks_close()
 */
#ifndef MOESERVE_CLI_CLI_RANKS_H
#define MOESERVE_CLI_CLI_RANKS_H

#include <stdbool.h>

#include "backend/comm/comm.h"
#include "cli/cli_args.h"
#include "engine/model_session.h"

struct cli_ranks {
    struct comm comm;     /* CPU ranks: MPI_COMM_WORLD; else the single communicator */
    bool expert_parallel;
    int data_parallel_attention; /* as session_opts.data_parallel_attention (--data-parallel-attention) */
    bool collectives_nccl;       /* --collectives nccl */
    /* GPU ranks this process started (the cuda backend, --tensor-parallel N without mpirun): rank 0
     * forks ranks 1 .. N-1, each on its own GPU, joined over NCCL by the session */
    uint8_t nccl_id[128];
    int rank, size;
    int children[256];    /* rank 0: the pids of ranks 1 .. */
    int n_children;
    void *watchdog;       /* rank 0: the thread that stops every rank when one dies, owned */
    void (*on_lost)(void *ctx, const char *msg); /* cli_ranks_on_lost(), or NULL */
    void *lost_ctx;
};

/* The options every command with ranks declares in its table. */
#define CLI_RANK_OPTS                                                                                            \
    {.name = "tensor-parallel", .metavar = "N",                                                                \
     .help = "split the model over N ranks (CPU: start them with mpirun -np N)"},                               \
    {.name = "expert-parallel", .help = "with --tensor-parallel: routed experts partitioned by expert "           \
                                        "instead of split by width"},                                          \
    {.name = "data-parallel-attention", .metavar = "WHEN",                                                      \
     .help = "with --tensor-parallel: on (each rank attends for its own sequences, attention weights "          \
             "replicated), off (by heads) or auto (default: the planner's rule for the batch)"},               \
    {                                                                                                           \
        .name = "collectives", .metavar = "HOW", .help = "GPU ranks' all-reduce: auto (default: NCCL or the "     \
                                                         "P2P kernels per size, measured at start-up) or nccl"  \
    }

/* GPU ranks' rank 0: when a rank dies, the watchdog stops the others and calls fn (on its own
 * thread) with a message naming the rank, instead of ending this process at once; fn must end
 * the process soon (serve answers 503 first). Without a handler the process exits with status 1. */
void cli_ranks_on_lost(struct cli_ranks *r, void (*fn)(void *ctx, const char *msg), void *ctx);
/* Reads --tensor-parallel / --expert-parallel / --data-parallel-attention / --collectives, joins the
 * ranks and checks they agree; sets so->comm, so->expert_parallel, so->data_parallel_attention and
 * so->collectives_nccl. */
enum status cli_ranks_open(struct cli_ranks *r, const struct cli_opt *opts, int n_opts, int argc, char **argv,
                           struct session_opts *so, struct err *err);
/* After model_session_open on every rank: with its outcome st, whether all ranks loaded their
 * shards (an error naming the first that did not). */
enum status cli_ranks_loaded(struct cli_ranks *r, enum status st, struct err *err);
/* Ranks > 0: runs rank 0's passes until it stops them, then true (the command is done, its exit
 * code in *rc); rank 0 and a single rank: false at once. */
bool cli_ranks_follow(struct cli_ranks *r, struct model_session *s, int *rc);
/* Rank 0, on every way out after the session opened: ends the followers. */
void cli_ranks_stop(struct cli_ranks *r, struct model_session *s);
/* Safe on a zeroed struct. */
void cli_ranks_close(struct cli_ranks *r);

#endif
