/* cli_ranks.h — the ranks of a command run with --tensor-parallel N (DESIGN.md decision 6).
 *
 * CPU ranks are processes started by mpirun (`mpirun -np N moeserve logits --tensor-parallel N
 * ...`): each runs the same command over its shard and the collectives join them. The ranks agree
 * on the binary and the command line before any weight is read (a mismatch is refused, naming the
 * rank); rank 0 alone writes outputs and logs at the chosen level, the others only warnings and
 * errors. Without --tensor-parallel a command runs as one rank (under a one-process mpirun too).
 *
 * defines: struct cli_ranks, CLI_RANK_OPTS, cli_ranks_open(), cli_ranks_close()
 */
#ifndef MOESERVE_CLI_CLI_RANKS_H
#define MOESERVE_CLI_CLI_RANKS_H

#include <stdbool.h>

#include "backend/comm/comm.h"
#include "cli/cli_args.h"
#include "engine/model_session.h"

struct cli_ranks {
    struct comm comm;
    bool expert_parallel;
};

/* The two options every command with ranks declares in its table. */
#define CLI_RANK_OPTS                                                                                            \
    {.name = "tensor-parallel", .metavar = "N",                                                                \
     .help = "split the model over N ranks (CPU: start them with mpirun -np N)"},                               \
    {                                                                                                           \
        .name = "expert-parallel", .help = "with --tensor-parallel: routed experts partitioned by expert "        \
                                           "instead of split by width"                                          \
    }

/* Reads --tensor-parallel / --expert-parallel, joins the ranks and checks they agree; sets
 * so->comm and so->expert_parallel. */
enum status cli_ranks_open(struct cli_ranks *r, const struct cli_opt *opts, int n_opts, int argc, char **argv,
                           struct session_opts *so, struct err *err);
/* Safe on a zeroed struct. */
void cli_ranks_close(struct cli_ranks *r);

#endif
