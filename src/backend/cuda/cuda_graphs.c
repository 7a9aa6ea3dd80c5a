/* cuda_graphs.c — decode steps captured as CUDA graphs (thread-local capture) and replayed by key
 * (see cuda_backend_internal.h).
 *
 * The cache is bounded (CUDA_MAX_GRAPHS, the least recently replayed graph dropped past it) and
 * counted: each graph's nodes, the device memory its instantiation took and the resident host
 * memory it added, logged at every capture with the totals, so that a server's memory over a
 * soak can be told apart from its graphs'. The forward keeps the keys few (one per graph size
 * and sampling mode, engine/forward.h).
 */
#include "backend/cuda/cuda_backend_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

/* ---------------------------------------------------------------- graphs */

/* The process's resident bytes (/proc/self/statm), or -1 where it cannot be read. */
static long long resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, rss = -1;
    if (!f)
        return -1;
    if (fscanf(f, "%lld %lld", &size, &rss) != 2)
        rss = -1;
    fclose(f);
    return rss < 0 ? -1 : rss * (long long)sysconf(_SC_PAGESIZE);
}

static void graph_destroy(struct cuda_backend *c, int i)
{
    CHECK(c, cudaGraphExecDestroy(c->graphs[i].exec));
    c->graph_dev_bytes -= c->graphs[i].dev_bytes;
    c->graph_host_bytes -= c->graphs[i].host_bytes;
    c->graphs[i] = c->graphs[--c->n_graphs];
}

void cuda_graphs_drop(struct cuda_backend *c)
{
    while (c->n_graphs > 0)
        graph_destroy(c, c->n_graphs - 1);
}

bool cu_graph_replay(struct backend *be, uint64_t key)
{
    struct cuda_backend *c = cuda_ctx(be);
    for (int i = 0; i < c->n_graphs; i++) {
        if (c->graphs[i].key == key) {
            c->graphs[i].last_use = ++c->graph_tick;
            return CHECK(c, cudaGraphLaunch(c->graphs[i].exec, c->stream));
        }
    }
    return false;
}

bool cu_graph_capture_begin(struct backend *be)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (c->capturing)
        return false;
    if (!c->graphs && !(c->graphs = calloc(CUDA_MAX_GRAPHS, sizeof *c->graphs)))
        return false;
    /* thread-local: another thread's CUDA calls (a server's HTTP threads) cannot invalidate it */
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        LOG_DEBUG("cuda: graph capture not started: %s", cudaGetErrorString(e));
        return false;
    }
    c->capturing = true;
    c->capture_broken = false;
    return true;
}

bool cu_graph_capture_end(struct backend *be, uint64_t key)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (!c->capturing)
        return false;
    c->capturing = false;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    size_t n_nodes = 0, free0 = 0, free1 = 0, total = 0;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e == cudaSuccess && c->capture_broken)
        e = cudaErrorStreamCaptureInvalidated;
    if (e == cudaSuccess && c->n_graphs == CUDA_MAX_GRAPHS) { /* full: the least recently replayed goes */
        int old = 0;
        for (int i = 1; i < c->n_graphs; i++)
            if (c->graphs[i].last_use < c->graphs[old].last_use)
                old = i;
        LOG_INFO("cuda: %d decode graphs cached: dropping key %llu (least recently run)", c->n_graphs,
                 (unsigned long long)c->graphs[old].key);
        graph_destroy(c, old);
    }
    long long rss0 = resident_bytes();
    if (e == cudaSuccess)
        e = cudaGraphGetNodes(g, NULL, &n_nodes);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&free0, &total);
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&exec, g, 0);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&free1, &total);
    long long rss1 = resident_bytes();
    if (g)
        (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        /* a capture that failed (an op that cannot be captured) is not an error of the run:
         * the caller runs the ops eagerly instead */
        if (exec)
            (void)cudaGraphExecDestroy(exec);
        (void)cudaGetLastError();
        LOG_DEBUG("cuda: graph capture of key %llu failed: %s", (unsigned long long)key, cudaGetErrorString(e));
        return false;
    }
    struct cuda_graph *n = &c->graphs[c->n_graphs++];
    *n = (struct cuda_graph){.key = key, .exec = exec, .last_use = ++c->graph_tick, .n_nodes = n_nodes,
                             .dev_bytes = (long long)free0 - (long long)free1,
                             /* the process's growth while instantiating: other threads' frees meanwhile
                              * (a server's) can make it negative, read as none */
                             .host_bytes = rss0 >= 0 && rss1 > rss0 ? rss1 - rss0 : 0};
    c->graph_dev_bytes += n->dev_bytes;
    c->graph_host_bytes += n->host_bytes;
    c->graph_captures++;
    /* key: rows << BACKEND_GRAPH_KEY_MODE_BITS | the pass's mode (engine/forward.c) */
    LOG_INFO("cuda: decode graph of %llu rows (mode %llu) captured: %zu nodes, %.1f MiB device, %.1f MiB host; "
             "%d graphs hold %.1f MiB device, %.1f MiB host (%lld captured since start)",
             (unsigned long long)(key >> BACKEND_GRAPH_KEY_MODE_BITS),
             (unsigned long long)(key & ((1u << BACKEND_GRAPH_KEY_MODE_BITS) - 1)), n_nodes, (double)n->dev_bytes / 1048576.0,
             (double)n->host_bytes / 1048576.0, c->n_graphs, (double)c->graph_dev_bytes / 1048576.0,
             (double)c->graph_host_bytes / 1048576.0, c->graph_captures);
    return true;
}
