/* cli_ranks.c — see cli_ranks.h. */
#include "cli/cli_ranks.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef MOESERVE_HAVE_CUDA
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_comm_nccl.h"
#endif

#include "base/log.h"
#include "base/options.h"
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

#ifdef MOESERVE_HAVE_CUDA
/* Rank 0's watchdog: a rank that exits before rank 0 stops it, or is killed, leaves the others
 * waiting in a collective forever; this ends them all, naming it. */
struct watchdog {
    struct cli_ranks *r;
    pthread_t thread;
    atomic_bool stopping; /* rank 0 is ending the ranks itself */
};

static void *watchdog_run(void *arg)
{
    struct watchdog *w = arg;
    struct cli_ranks *r = w->r;
    while (!atomic_load(&w->stopping)) {
        for (int i = 0; i < r->n_children; i++) {
            int status = 0;
            if (r->children[i] <= 0 || waitpid(r->children[i], &status, WNOHANG) != r->children[i])
                continue;
            if (atomic_load(&w->stopping))
                break;
            char msg[200];
            snprintf(msg, sizeof msg, "rank %d (pid %d) %s %d before rank 0 stopped it", i + 1, r->children[i],
                     WIFSIGNALED(status) ? "was killed by signal" : "exited with",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            LOG_ERROR("%s: stopping every rank", msg);
            r->children[i] = 0;
            for (int j = 0; j < r->n_children; j++)
                if (r->children[j] > 0)
                    kill(r->children[j], SIGKILL);
            void (*lost)(void *, const char *) = __atomic_load_n(&r->on_lost, __ATOMIC_ACQUIRE);
            if (!lost)
                _exit(1);
            lost(r->lost_ctx, msg);
            return NULL;
        }
        usleep(100 * 1000);
    }
    return NULL;
}

/* Rank 0 is ending the ranks itself: the watchdog stops watching. */
static void watchdog_stop(struct cli_ranks *r)
{
    struct watchdog *w = r->watchdog;
    if (!w)
        return;
    atomic_store(&w->stopping, true);
    pthread_join(w->thread, NULL);
    free(w);
    r->watchdog = NULL;
}

/* The GPU ranks: rank 0 makes the NCCL id, then forks ranks 1 .. tp - 1 (before any CUDA call:
 * a forked child cannot use a CUDA context its parent made). */
static enum status ranks_spawn(struct cli_ranks *r, int tp, struct session_opts *so, struct err *err)
{
    if (tp > (int)(sizeof r->children / sizeof r->children[0]) + 1)
        return err_set(err, STATUS_UNSUPPORTED, "--tensor-parallel %d: at most %zu GPU ranks", tp,
                       sizeof r->children / sizeof r->children[0] + 1);
    enum status st = cuda_comm_nccl_unique_id(r->nccl_id, err);
    if (st)
        return st;
    const pid_t parent = getpid();
    r->size = tp;
    for (int k = 1; k < tp; k++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            for (int j = 0; j < r->n_children; j++)
                kill(r->children[j], SIGKILL);
            return err_set(err, STATUS_IO, "cannot start GPU rank %d: fork failed", k);
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* rank 0 gone: nothing to follow */
            if (getppid() != parent)
                _exit(1);
            r->rank = k;
            r->n_children = 0;
            if (log_get_level() > LOG_LEVEL_WARN)
                log_set_level(LOG_LEVEL_WARN);
            break;
        }
        r->children[r->n_children++] = pid;
    }
    if (r->rank == 0 && r->n_children) {
        struct watchdog *w = calloc(1, sizeof *w);
        if (!w || (w->r = r, pthread_create(&w->thread, NULL, watchdog_run, w) != 0)) {
            free(w);
            for (int j = 0; j < r->n_children; j++)
                kill(r->children[j], SIGKILL);
            return err_set(err, STATUS_NOMEM, "cannot start the ranks' watchdog");
        }
        r->watchdog = w;
    }
    const int have = backend_cuda_device_count();
    if (have < tp)
        return err_set(err, STATUS_UNSUPPORTED, "--tensor-parallel %d on the cuda backend needs %d GPUs (one a "
                       "rank); this machine has %d", tp, tp, have);
    so->nccl_id = r->nccl_id;
    so->nccl_rank = r->rank;
    so->nccl_size = tp;
    so->device = r->rank;
    so->expert_parallel = r->expert_parallel;
    return STATUS_OK;
}
#endif

void cli_ranks_on_lost(struct cli_ranks *r, void (*fn)(void *ctx, const char *msg), void *ctx)
{
    r->lost_ctx = ctx;
    __atomic_store_n(&r->on_lost, fn, __ATOMIC_RELEASE); /* the watchdog thread may be running */
}

enum status cli_ranks_open(struct cli_ranks *r, const struct cli_opt *opts, int n_opts, int argc, char **argv,
                           struct session_opts *so, struct err *err)
{
    memset(r, 0, sizeof *r);
    r->size = 1;
    long tp = 1;
    enum status st = cli_int(opts, n_opts, "tensor-parallel", 1, 4096, &tp, err);
    if (st)
        return st;
    r->expert_parallel = cli_flag(opts, n_opts, "expert-parallel");
    const char *coll = cli_get(opts, n_opts, "collectives", "auto");
    if (strcmp(coll, "auto") != 0 && strcmp(coll, "nccl") != 0)
        return err_set(err, STATUS_INVALID, "--collectives: expected auto or nccl, got \"%s\"", coll);
    so->collectives_nccl = r->collectives_nccl = strcmp(coll, "nccl") == 0;
    const char *dpa = cli_get(opts, n_opts, "data-parallel-attention", "auto");
    if (strcmp(dpa, "auto") != 0 && strcmp(dpa, "on") != 0 && strcmp(dpa, "off") != 0)
        return err_set(err, STATUS_INVALID, "--data-parallel-attention: expected on, off or auto, got \"%s\"", dpa);
    r->data_parallel_attention = strcmp(dpa, "on") == 0 ? 1 : strcmp(dpa, "off") == 0 ? -1 : 0;
    so->data_parallel_attention = r->data_parallel_attention;
    if (!cli_get(opts, n_opts, "tensor-parallel", NULL))
        tp = 1;
    const bool cuda = so->backend && strcmp(so->backend, "cuda") == 0;
    const bool given = cli_get(opts, n_opts, "tensor-parallel", NULL) != NULL;
    if (tp == 1 && !comm_mpi_launched() && !(cuda && given)) {
        comm_init_single(&r->comm);
    } else if (!comm_mpi_launched() && cuda) {
        /* GPU ranks; an explicit --tensor-parallel 1 is one NCCL rank (every collective of the
         * multi-GPU path runs, on one GPU) */
        comm_init_single(&r->comm);
#ifdef MOESERVE_HAVE_CUDA
        st = ranks_spawn(r, (int)tp, so, err);
        if (st) { /* every rank returns the error; rank 0 ends the others first */
            watchdog_stop(r);
            for (int j = 0; j < r->n_children; j++)
                kill(r->children[j], SIGKILL);
            cli_ranks_close(r);
        }
        return st;
#else
        return err_set(err, STATUS_UNSUPPORTED, "--backend cuda: not in this build");
#endif
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
        if (so->backend && strcmp(so->backend, "cuda") == 0 && r->comm.size > 1) {
            /* GPU ranks across nodes: NCCL, bootstrapped over MPI (rank 0's id to all); a rank's GPU is its
             * index on its node */
#ifdef MOESERVE_HAVE_CUDA
            enum status ist = r->comm.rank == 0 ? cuda_comm_nccl_unique_id(r->nccl_id, err) : STATUS_OK;
            if ((st = comm_agree(&r->comm, ist, err))) {
                cli_ranks_close(r);
                return st;
            }
            comm_broadcast(&r->comm, r->nccl_id, sizeof r->nccl_id, 0);
            struct options env;
            if ((st = options_read(&env, err))) {
                cli_ranks_close(r);
                return st;
            }
            r->rank = r->comm.rank, r->size = r->comm.size;
            so->nccl_id = r->nccl_id;
            so->nccl_rank = r->comm.rank, so->nccl_size = r->comm.size;
            so->device = env.mpi_local_rank >= 0 ? env.mpi_local_rank : 0;
#else
            cli_ranks_close(r);
            return err_set(err, STATUS_UNSUPPORTED, "--backend cuda: not in this build");
#endif
        }
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
    (void)r;
    if (s->shard.size <= 1 || s->shard.rank == 0)
        return false;
    struct err err = {0};
    *rc = ranks_follow(&s->fwd, &err) ? 1 : 0;
    return true;
}

void cli_ranks_stop(struct cli_ranks *r, struct model_session *s)
{
    (void)r;
    if (s->shard.size > 1 && s->shard.rank == 0 && s->fwd.comm)
        ranks_send_stop(&s->fwd);
}

void cli_ranks_close(struct cli_ranks *r)
{
#ifdef MOESERVE_HAVE_CUDA
    watchdog_stop(r);
    /* the followers end after rank 0's stop message; one that does not within 30 s is killed */
    for (int i = 0; i < r->n_children; i++) {
        if (r->children[i] <= 0)
            continue;
        int status = 0, waited = 0;
        while (waitpid(r->children[i], &status, WNOHANG) == 0 && waited++ < 300)
            usleep(100 * 1000);
        if (waited > 300) {
            LOG_WARN("rank %d (pid %d) did not end after rank 0's stop: killed", i + 1, r->children[i]);
            kill(r->children[i], SIGKILL);
            waitpid(r->children[i], &status, 0);
        }
    }
    r->n_children = 0;
#endif
    comm_free(&r->comm);
}
