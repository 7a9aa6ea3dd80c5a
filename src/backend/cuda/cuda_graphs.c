/* cuda_graphs.c — decode steps captured as CUDA graphs (thread-local capture) and replayed by key
 * (see cuda_backend_internal.h). */
#include "backend/cuda/cuda_backend_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* ---------------------------------------------------------------- graphs */

void cuda_graphs_drop(struct cuda_backend *c)
{
    for (int i = 0; i < c->n_graphs; i++)
        CHECK(c, cudaGraphExecDestroy(c->graphs[i].exec));
    c->n_graphs = 0;
}

bool cu_graph_replay(struct backend *be, uint64_t key)
{
    struct cuda_backend *c = cuda_ctx(be);
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key)
            return CHECK(c, cudaGraphLaunch(c->graphs[i].exec, c->stream));
    return false;
}

bool cu_graph_capture_begin(struct backend *be)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (c->capturing || c->n_graphs >= CUDA_MAX_GRAPHS)
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
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e == cudaSuccess && c->capture_broken)
        e = cudaErrorStreamCaptureInvalidated;
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&exec, g, 0);
    if (g)
        (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        /* a capture that failed (an op that cannot be captured) is not an error of the run:
         * the caller runs the ops eagerly instead */
        (void)cudaGetLastError();
        LOG_DEBUG("cuda: graph capture of key %llu failed: %s", (unsigned long long)key, cudaGetErrorString(e));
        return false;
    }
    struct cuda_graph *n = realloc(c->graphs, (size_t)(c->n_graphs + 1) * sizeof *n);
    if (!n) {
        (void)cudaGraphExecDestroy(exec);
        return false;
    }
    c->graphs = n;
    c->graphs[c->n_graphs++] = (struct cuda_graph){.key = key, .exec = exec};
    return true;
}
