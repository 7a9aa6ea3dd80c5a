/* bench_allreduce.c — see bench_allreduce.h. */
#include "cli/bench_allreduce.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/json.h"
#include "base/log.h"
#include "base/timer.h"
#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/cuda_comm_nccl.h"
#endif

enum { AR_MIN_BYTES = 256, AR_MAX_BYTES = 16 << 20, AR_WARMUP = 3 };

int bench_allreduce_run(struct model_session *s, struct comm *c, bool json)
{
    struct backend *be = &s->be;
    float *buf = be->ops->alloc(be, AR_MAX_BYTES);
    if (!buf) {
        LOG_ERROR("bench --allreduce: cannot allocate %d bytes on %s", AR_MAX_BYTES, be->ops->name);
        return 1;
    }
    float *zeros = calloc(1, AR_MAX_BYTES); /* finite values: the sums' time does not depend on them */
    if (!zeros) {
        be->ops->free(be, buf);
        LOG_ERROR("bench --allreduce: out of host memory");
        return 1;
    }
    be->ops->upload(be, buf, zeros, AR_MAX_BYTES);
    free(zeros);
    struct json *rows = json_new_array();
    if (c->rank == 0 && !json)
        printf("all-reduce over %d rank%s (%s, %s backend)\n%10s %8s %12s %12s %12s\n", c->size, c->size == 1 ? "" : "s",
               c->ops->name, be->ops->name, "bytes", "iters", "us a call", "algbw GB/s", "busbw GB/s");
    for (size_t bytes = AR_MIN_BYTES; bytes <= AR_MAX_BYTES; bytes *= 2) {
        const size_t n = bytes / sizeof(float);
        /* enough calls for ~10 ms at 10 GB/s, at least 20 */
        const int iters = bytes < 100000 ? 200 : bytes < 2000000 ? 50 : 20;
        for (int i = 0; i < AR_WARMUP; i++)
            comm_all_reduce_sum(c, buf, n);
        be->ops->synchronize(be);
        comm_barrier(c);
        const double t0 = timer_now();
        for (int i = 0; i < iters; i++)
            comm_all_reduce_sum(c, buf, n);
        be->ops->synchronize(be);
        const double us = (timer_now() - t0) / iters * 1e6;
        const double alg = (double)bytes / (us * 1e3), bus = alg * 2.0 * (c->size - 1) / (c->size > 1 ? c->size : 1);
        if (c->rank == 0 && !json)
            printf("%10zu %8d %12.2f %12.3f %12.3f\n", bytes, iters, us, alg, bus);
        struct json *r = json_new_object();
        json_add(r, "bytes", json_new_number((double)bytes));
        json_add(r, "us", json_new_number(us));
        json_add(r, "algbw_gb_s", json_new_number(alg));
        json_add(r, "busbw_gb_s", json_new_number(bus));
        json_append(rows, r);
    }
    be->ops->free(be, buf);
    char choice[4096] = "";
#ifdef MOESERVE_HAVE_CUDA
    cuda_comm_nccl_describe(c, choice, sizeof choice); /* the GPU ranks' form per size (cuda_comm_p2p.h) */
#else
    snprintf(choice, sizeof choice, "all-reduce: %s", c->ops->name);
#endif
    if (c->rank == 0 && !json)
        printf("%s\n", choice);
    if (c->rank == 0 && json) {
        struct json *o = json_new_object();
        json_add(o, "ranks", json_new_number(c->size));
        json_add(o, "comm", json_new_string(c->ops->name));
        json_add(o, "backend", json_new_string(be->ops->name));
        json_add(o, "allreduce", rows);
        json_add(o, "choice", json_new_string(choice));
        char *text = json_print(o, true);
        if (text)
            printf("%s\n", text);
        free(text);
        json_free(o);
    } else {
        json_free(rows);
    }
    return 0;
}
