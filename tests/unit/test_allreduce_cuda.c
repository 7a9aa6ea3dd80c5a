/* test_allreduce_cuda.c — the peer-to-peer all-reduce kernels (backend/cuda/comm/allreduce.h)
 * between two processes sharing GPU 0 through CUDA IPC, the data movement of the multi-GPU form
 * on the one lent GPU: one-shot and two-shot sums equal the CPU's, bit for bit (rank order), at
 * sizes from one float to 16 MiB; the fused all-reduce + residual add + RMSNorm equals its CPU
 * reference; a captured graph replayed three times meets anew each time (device-side epochs); no
 * barrier times out. The processes are forked before any CUDA call (a child cannot
 * use a context its parent made) and trade their IPC handles over pipes. Two contexts on one GPU
 * are time-sliced, so the times printed are not speed figures. Skips without a GPU.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/comm/allreduce.h"

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            return 1;                                                                                        \
        }                                                                                                    \
    } while (0)

enum { MAX_FLOATS = (16 << 20) / 4, ROWS = 5, DIM = 1536 };

static float input(int r, size_t i)
{
    return (float)((i * 7 + (size_t)r * 13) % 101) * 0.01f - 0.5f + (float)r * 1e-3f;
}

static int xfer(int fd, void *p, size_t n, bool out)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = out ? write(fd, (char *)p + done, n - done) : read(fd, (char *)p + done, n - done);
        if (k <= 0)
            return 1;
        done += (size_t)k;
    }
    return 0;
}

static int run_rank(int rank, int wfd, int rfd)
{
    const int size = 2;
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    const size_t data_bytes = (size_t)MAX_FLOATS * 4, bytes = data_bytes + CUDA_AR_FLAG_BYTES;
    uint8_t *base = NULL, *peer = NULL;
    CK(cudaMalloc((void **)&base, bytes));
    CK(cudaMemset(base, 0, bytes));
    cudaIpcMemHandle_t mine, theirs;
    CK(cudaIpcGetMemHandle(&mine, base));
    if (xfer(wfd, &mine, sizeof mine, true) || xfer(rfd, &theirs, sizeof theirs, false)) {
        fprintf(stderr, "rank %d: handle exchange failed\n", rank);
        return 1;
    }
    CK(cudaIpcOpenMemHandle((void **)&peer, theirs, cudaIpcMemLazyEnablePeerAccess));
    struct cuda_ar_peers p = {.rank = rank, .size = size};
    p.data[rank] = (float *)base, p.data[1 - rank] = (float *)peer;
    p.flags[rank] = (uint32_t *)(base + data_bytes), p.flags[1 - rank] = (uint32_t *)(peer + data_bytes);
    float *h_in = malloc(data_bytes), *h_out = malloc(data_bytes), *d_out = NULL;
    CK(cudaMalloc((void **)&d_out, data_bytes));
    int bad = 0;
    const size_t sizes[] = {1, 7, 1000, 65539, MAX_FLOATS};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t n = sizes[k];
        for (size_t i = 0; i < n; i++)
            h_in[i] = input(rank, i);
        for (int form = 0; form < 2; form++) {
            cudaEvent_t t0, t1;
            CK(cudaEventCreate(&t0));
            CK(cudaEventCreate(&t1));
            CK(cudaMemcpyAsync(p.data[rank], h_in, n * 4, cudaMemcpyHostToDevice, s));
            CK(cudaEventRecord(t0, s));
            CK(cuda_ar_barrier(s, p));
            if (form == 0) {
                CK(cuda_ar_one_shot(s, p, n, d_out));
            } else {
                CK(cuda_ar_reduce_slice(s, p, n));
                CK(cuda_ar_barrier(s, p));
                CK(cuda_ar_gather_slices(s, p, n, d_out));
            }
            CK(cuda_ar_barrier(s, p)); /* no rank rewrites its buffer while another reads it */
            CK(cudaEventRecord(t1, s));
            CK(cudaMemcpyAsync(h_out, d_out, n * 4, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, t0, t1));
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++) {
                const float want = input(0, i) + input(1, i);
                wrong += memcmp(&want, &h_out[i], 4) != 0;
            }
            if (rank == 0)
                printf("    %s %9zu floats: %s (%.1f us, time-sliced)\n", form ? "two-shot" : "one-shot", n,
                       wrong ? "WRONG" : "= the CPU's sum, bit for bit", ms * 1e3);
            bad += wrong != 0;
            cudaEventDestroy(t0), cudaEventDestroy(t1);
        }
    }
    /* captured once, replayed: the barriers count their epochs on the device, so every replay
     * meets anew (an epoch baked into the graph would let the second replay run through) */
    {
        const size_t n = 4099;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CK(cuda_ar_barrier(s, p));
        CK(cuda_ar_one_shot(s, p, n, d_out));
        CK(cuda_ar_barrier(s, p));
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int rep = 1; rep <= 3; rep++) {
            for (size_t i = 0; i < n; i++)
                h_in[i] = input(rank, i) * (float)rep;
            CK(cudaMemcpyAsync(p.data[rank], h_in, n * 4, cudaMemcpyHostToDevice, s));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaMemcpyAsync(h_out, d_out, n * 4, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++) {
                const float want = input(0, i) * (float)rep + input(1, i) * (float)rep;
                wrong += memcmp(&want, &h_out[i], 4) != 0;
            }
            if (rank == 0)
                printf("    graph replay %d, one-shot %zu floats: %s\n", rep, n, wrong ? "WRONG" : "= the CPU's sum");
            bad += wrong != 0;
        }
        cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    }
    /* fused: h += the sum of the ranks' deltas; x = rmsnorm(h) * w */
    static float h0[ROWS * DIM], w[DIM], x[ROWS * DIM], hh[ROWS * DIM];
    for (int i = 0; i < ROWS * DIM; i++)
        h0[i] = sinf((float)i * 0.01f);
    for (int d = 0; d < DIM; d++)
        w[d] = 0.5f + (float)(d % 17) * 0.05f;
    for (size_t i = 0; i < (size_t)ROWS * DIM; i++)
        h_in[i] = input(rank, i);
    float *dh, *dw, *dx;
    CK(cudaMalloc((void **)&dh, sizeof h0));
    CK(cudaMalloc((void **)&dw, sizeof w));
    CK(cudaMalloc((void **)&dx, sizeof x));
    CK(cudaMemcpy(dh, h0, sizeof h0, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, w, sizeof w, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.data[rank], h_in, sizeof h0, cudaMemcpyHostToDevice));
    CK(cuda_ar_barrier(s, p));
    CK(cuda_ar_add_rmsnorm(s, p, ROWS, DIM, dh, dw, 1e-6f, dx));
    CK(cuda_ar_barrier(s, p));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(x, dx, sizeof x, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hh, dh, sizeof hh, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int r = 0; r < ROWS; r++) {
        double ss = 0;
        float hr[DIM];
        for (int d = 0; d < DIM; d++) {
            size_t i = (size_t)r * DIM + d;
            hr[d] = h0[i] + (input(0, i) + input(1, i));
            ss += (double)hr[d] * hr[d];
            bad += memcmp(&hr[d], &hh[i], 4) != 0; /* the residual: exact */
        }
        const double inv = 1.0 / sqrt(ss / DIM + 1e-6);
        for (int d = 0; d < DIM; d++) {
            const double want = hr[d] * inv * w[d], got = x[(size_t)r * DIM + d];
            worst = fmax(worst, fabs(got - want) / (fabs(want) + 1e-3));
        }
    }
    bad += worst > 1e-5;
    if (rank == 0)
        printf("    fused all-reduce + add + RMSNorm %d x %d: residual exact, norm rel err %.2e\n", ROWS, DIM, worst);
    int timed_out = 0;
    CK(cuda_ar_timed_out(p, &timed_out));
    bad += timed_out;
    if (timed_out)
        fprintf(stderr, "rank %d: a barrier timed out\n", rank);
    /* both ranks done reading before either unmaps */
    char ok = 1;
    if (xfer(wfd, &ok, 1, true) || xfer(rfd, &ok, 1, false))
        bad++;
    CK(cudaIpcCloseMemHandle(peer));
    cudaFree(base), cudaFree(d_out), cudaFree(dh), cudaFree(dw), cudaFree(dx);
    free(h_in), free(h_out);
    return bad ? 1 : 0;
}

int main(void)
{
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent))
        return 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    const int rank = pid == 0 ? 1 : 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        if (rank == 1)
            _exit(0);
        waitpid(pid, NULL, 0);
        printf("test_allreduce_cuda: no CUDA device found, skipping (needs a GPU)\n");
        return 0;
    }
    int rc = rank == 0 ? run_rank(0, to_child[1], to_parent[0]) : run_rank(1, to_parent[1], to_child[0]);
    if (rank == 1)
        _exit(rc);
    int status = 0;
    waitpid(pid, &status, 0);
    const int child = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    printf("test_allreduce_cuda: rank 0 %s, rank 1 %s\n", rc ? "FAILED" : "ok", child ? "FAILED" : "ok");
    return rc || child ? 1 : 0;
}
