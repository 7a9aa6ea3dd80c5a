/* cli_ranks.c — see cli_ranks.h. */
#include "cli/cli_ranks.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/ranks.h"

/* What must be the same on every rank: the build and the whole command line. */
static enum status ranks_agree(struct comm *c, int argc, char **argv, struct err *err)
{
    static const char build[] = __DATE__ " " __TIME__ " " __FILE__;
    enum status st = comm_check_same(c, build, sizeof build, "moeserve binary", err);
    size_t len = 0;
    for (int i = 0; i < argc; i++)
        len += strlen(argv[i]) + 1;
    char *line = malloc(len + 1);
    if (!line)
        return err_set(err, STATUS_NOMEM, "out of memory for the command line");
    size_t o = 0;
    for (int i = 0; i < argc; i++) {
        size_t k = strlen(argv[i]) + 1;
        memcpy(line + o, argv[i], k);
        o += k;
    }
    if (!st)
        st = comm_check_same(c, line, o, "command line (model, options)", err);
    free(line);
    return st;
}

enum status cli_ranks_open(struct cli_ranks *r, const struct cli_opt *opts, int n_opts, int argc, char **argv,
                           struct session_opts *so, struct err *err)
{
    memset(r, 0, sizeof *r);
    long tp = 1;
    enum status st = cli_int(opts, n_opts, "tensor-parallel", 1, 4096, &tp, err);
    if (st)
        return st;
    r->expert_parallel = cli_flag(opts, n_opts, "expert-parallel");
    if (!cli_get(opts, n_opts, "tensor-parallel", NULL))
        tp = 1;
    if (tp == 1 && !comm_mpi_launched()) {
        comm_init_single(&r->comm);
    } else {
        if (!comm_mpi_launched())
            return err_set(err, STATUS_UNSUPPORTED,
                           "--tensor-parallel %ld: start the ranks with mpirun -np %ld (CPU ranks; ranks a "
                           "process starts itself, for GPUs, are not built yet)",
                           tp, tp);
        st = comm_init_mpi(&r->comm, err);
        if (st)
            return st;
        if (r->comm.size != tp) {
            int size = r->comm.size;
            cli_ranks_close(r);
            return err_set(err, STATUS_INVALID, "mpirun started %d ranks but --tensor-parallel is %ld", size, tp);
        }
        if ((st = ranks_agree(&r->comm, argc, argv, err))) {
            cli_ranks_close(r);
            return st;
        }
        if (r->comm.rank != 0 && log_get_level() > LOG_LEVEL_WARN)
            log_set_level(LOG_LEVEL_WARN);
    }
    so->comm = &r->comm;
    so->expert_parallel = r->expert_parallel;
    return STATUS_OK;
}

enum status cli_ranks_loaded(struct cli_ranks *r, enum status st, struct err *err)
{
    return comm_agree(&r->comm, st, err);
}

bool cli_ranks_follow(struct cli_ranks *r, struct model_session *s, int *rc)
{
    if (r->comm.size <= 1 || r->comm.rank == 0)
        return false;
    struct err err = {0};
    *rc = ranks_follow(&s->fwd, &err) ? 1 : 0;
    return true;
}

void cli_ranks_stop(struct cli_ranks *r, struct model_session *s)
{
    if (r->comm.size > 1 && r->comm.rank == 0 && s->fwd.comm)
        ranks_send_stop(&s->fwd);
}

void cli_ranks_close(struct cli_ranks *r)
{
    comm_free(&r->comm);
}
