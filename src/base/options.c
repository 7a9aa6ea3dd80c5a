/* options.c — see options.h. The only reader of the environment besides main.c. */
#include "base/options.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

enum status options_read(struct options *o, struct err *err)
{
    memset(o, 0, sizeof *o);
    o->model = env("MOESERVE_MODEL");
    o->api_key = getenv("MOESERVE_API_KEY");
    const char *s = env("MOESERVE_SMEM_BUDGET");
    if (s) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || !end || *end || v < 1024 || v > (1ull << 30))
            return err_set(err, STATUS_INVALID, "MOESERVE_SMEM_BUDGET=\"%s\": expected a byte count >= 1024", s);
        o->smem_budget = (size_t)v;
    }
    if ((s = env("MOESERVE_ATTN_SPLITS"))) {
        char *end = NULL;
        errno = 0;
        long v = strcmp(s, "none") == 0 ? 0 : strtol(s, &end, 10);
        if (strcmp(s, "none") != 0 && (errno || !end || *end || v < 1 || v > 64))
            return err_set(err, STATUS_INVALID, "MOESERVE_ATTN_SPLITS=\"%s\": expected \"none\" or a split count 1..64",
                           s);
        o->attn_splits_none = v == 0;
        o->attn_splits = (int)v;
    }
    s = env("MOESERVE_NO_GRAPHS");
    o->no_graphs = s && strcmp(s, "0") != 0;
    s = env("MOESERVE_CUDA_FORCE");
    o->cuda_force = s ? s : "";
    s = env("MOESERVE_TRACE_OUT");
    o->trace_out = s ? s : "";
    o->mpi_launched = env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK");
    s = env("OMPI_COMM_WORLD_LOCAL_RANK");
    o->mpi_local_rank = s ? atoi(s) : -1;
    s = env("TMPDIR");
    o->tmp_dir = s && *s ? s : "/tmp";
    return STATUS_OK;
}
