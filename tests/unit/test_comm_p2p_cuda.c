/* test_comm_p2p_cuda.c — the P2P all-reduce as the GPU communicator runs it (cuda_comm_p2p.h),
 * between two processes sharing GPU 0: NCCL will not put two ranks on one GPU, so a pipe carries
 * the host collectives the set-up needs (the devices' reach, the IPC handles, the times) and a
 * stand-in takes NCCL's place in the measurement. Checked: the set-up maps the peer and measures
 * every size class on both ranks, both ranks hold the same table (so they always run the same
 * form), the dispatch by the table sums exactly as the CPU (rank order) with one-shot and
 * two-shot, NCCL's sizes are left to NCCL, the fused all-reduce + residual add + RMSNorm runs at
 * the one-shot sizes only (h exact, x its norm), and the same all-reduce captured into a CUDA graph
 * and replayed gives the sums of each replay's inputs. Two contexts on one GPU are time-sliced:
 * the times are not speed figures. Skips without a GPU.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_comm_p2p.h"
#include "base/log.h"

/* ---- a two-rank comm over pipes (host collectives only: what the set-up uses) ---- */
struct pipe_comm {
    int wfd, rfd;
};

static void xfer(int fd, void *p, size_t n, bool out)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = out ? write(fd, (char *)p + done, n - done) : read(fd, (char *)p + done, n - done);
        if (k <= 0) {
            fprintf(stderr, "test_comm_p2p_cuda: pipe closed\n");
            _exit(3);
        }
        done += (size_t)k;
    }
}

static void pipe_all_gather(struct comm *c, const void *in, void *out, size_t bytes)
{
    struct pipe_comm *pc = c->impl;
    xfer(pc->wfd, (void *)in, bytes, true);
    memcpy((char *)out + (size_t)c->rank * bytes, in, bytes);
    xfer(pc->rfd, (char *)out + (size_t)(1 - c->rank) * bytes, bytes, false);
}

static void pipe_barrier(struct comm *c)
{
    char a = 1, b[2];
    pipe_all_gather(c, &a, b, 1);
}

static const struct comm_ops PIPE_OPS = {.name = "pipe", .all_gather = pipe_all_gather, .barrier = pipe_barrier};

/* NCCL's place in the measurement: any collective both ranks call (its sums are not read) */
static void stand_in(struct comm *c, float *buf, size_t n)
{
    (void)c, (void)buf, (void)n;
}

static float input(int r, size_t i)
{
    return (float)((i * 2654435761u + (size_t)r * 97u) % 1000u) * 0.001f - 0.5f + (float)r;
}

#define FAIL(...)                                                                                            \
    do {                                                                                                     \
        fprintf(stderr, __VA_ARGS__);                                                                        \
        return 1;                                                                                            \
    } while (0)

static int check_sum(const float *got, size_t n, float scale)
{
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        const float want = input(0, i) * scale + input(1, i) * scale;
        wrong += memcmp(&want, &got[i], 4) != 0;
    }
    return wrong != 0;
}

static int run_rank(int rank, int wfd, int rfd)
{
    log_set_level(LOG_LEVEL_WARN);
    struct backend be;
    struct err err = {0};
    if (backend_cuda_create(&be, 0, 0, &err))
        FAIL("rank %d: %s\n", rank, err.msg);
    struct pipe_comm pc = {wfd, rfd};
    struct comm c = {.ops = &PIPE_OPS, .rank = rank, .size = 2, .impl = &pc};
    struct cuda_p2p p;
    if (cuda_p2p_init(&p, &c, &be, true, stand_in, &err))
        FAIL("rank %d: cuda_p2p_init: %s\n", rank, err.msg);
    if (!p.on)
        FAIL("rank %d: P2P off: %s\n", rank, p.why_off);
    /* the same table on both ranks */
    struct cuda_p2p other;
    xfer(wfd, &p, sizeof p, true);
    xfer(rfd, &other, sizeof other, false);
    if (memcmp(p.form, other.form, sizeof p.form) || memcmp(p.us, other.us, sizeof p.us))
        FAIL("rank %d: the ranks' tables differ\n", rank);
    for (int k = 0; k < CUDA_P2P_CLASSES; k++)
        if (!(p.us[k][CUDA_P2P_ONE_SHOT] > 0) || !(p.us[k][CUDA_P2P_TWO_SHOT] > 0))
            FAIL("rank %d: size class %d not measured\n", rank, k);
    char table[4096];
    cuda_p2p_describe(&p, table, sizeof table);
    if (rank == 0)
        printf("%s\n", table);
    /* the dispatch: small sizes one-shot, middle two-shot, the rest NCCL's */
    for (int k = 0; k < CUDA_P2P_CLASSES; k++)
        p.form[k] = k < 6 ? CUDA_P2P_ONE_SHOT : k < 12 ? CUDA_P2P_TWO_SHOT : CUDA_P2P_NCCL;
    const size_t sizes[] = {1, 37, 4000, 100000, 300000};
    const size_t max_n = 300000;
    float *h = malloc(max_n * 4), *d = be.ops->alloc(&be, max_n * 4);
    int bad = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t n = sizes[k];
        for (size_t i = 0; i < n; i++)
            h[i] = input(rank, i);
        be.ops->upload(&be, d, h, n * 4);
        bool taken = cuda_p2p_all_reduce(&p, d, n);
        be.ops->download(&be, h, d, n * 4);
        const bool want_taken = n * 4 <= ((size_t)256 << 11);
        int wrong = taken ? check_sum(h, n, 1.0f) : 0;
        if (rank == 0)
            printf("    %7zu floats: %s%s\n", n, taken ? "P2P, " : "left to NCCL", taken ? (wrong ? "WRONG" : "= the CPU's sum") : "");
        bad += wrong || taken != want_taken;
    }
    /* the fused all-reduce + residual add + RMSNorm (what the forward's comm_all_reduce_add_rmsnorm
     * runs on GPU ranks): taken at a one-shot size, h = h + the CPU's sum bit for bit, x = its norm;
     * left to the caller (NCCL or two-shot, then the add+norm kernel) at a two-shot size */
    {
        const int rows = 3, dims[2] = {256, 4096}; /* 3 KiB: one-shot; 48 KiB: two-shot */
        const float eps = 1e-6f;
        for (int k = 0; k < 2; k++) {
            const int dim = dims[k];
            const size_t nn = (size_t)rows * (size_t)dim;
            float *hh = malloc(nn * 4), *h0 = malloc(nn * 4), *dl = malloc(nn * 4), *xx = malloc(nn * 4);
            float *wh = malloc((size_t)dim * 4);
            float *d_h = be.ops->alloc(&be, nn * 4), *d_dl = be.ops->alloc(&be, nn * 4), *d_x = be.ops->alloc(&be, nn * 4);
            float *d_w = be.ops->alloc(&be, (size_t)dim * 4);
            for (size_t i = 0; i < nn; i++)
                h0[i] = input(7, i) * 0.25f, dl[i] = input(rank, i);
            for (int i = 0; i < dim; i++)
                wh[i] = 0.5f + 0.1f * (float)(i % 7);
            be.ops->upload(&be, d_h, h0, nn * 4);
            be.ops->upload(&be, d_dl, dl, nn * 4);
            be.ops->upload(&be, d_w, wh, (size_t)dim * 4);
            const bool want = cuda_p2p_fuses_add_rmsnorm(&p, nn);
            const bool taken = cuda_p2p_all_reduce_add_rmsnorm(&p, d_dl, d_h, d_w, rows, dim, eps, d_x);
            int wrong = taken != want || want != (k == 0);
            if (taken) {
                be.ops->download(&be, hh, d_h, nn * 4);
                be.ops->download(&be, xx, d_x, nn * 4);
                double worst = 0, top = 0;
                for (int r = 0; r < rows; r++) {
                    double ss = 0;
                    for (int i = 0; i < dim; i++) {
                        const size_t j = (size_t)r * (size_t)dim + (size_t)i;
                        const float sum = input(0, j) + input(1, j), v = h0[j] + sum;
                        wrong += memcmp(&v, &hh[j], 4) != 0;
                        ss += (double)v * v;
                    }
                    const double inv = 1.0 / sqrt(ss / dim + eps);
                    for (int i = 0; i < dim; i++) {
                        const size_t j = (size_t)r * (size_t)dim + (size_t)i;
                        const double want_x = (double)hh[j] * inv * wh[i];
                        worst = fmax(worst, fabs(want_x - xx[j]));
                        top = fmax(top, fabs(want_x));
                    }
                }
                wrong += !(worst <= 1e-5 * top);
                if (rank == 0)
                    printf("    fused add+norm %d x %d: P2P one-shot, h %s, x rel %.1e\n", rows, dim,
                           wrong ? "WRONG" : "= h + the CPU's sum", worst / top);
            } else if (rank == 0) {
                printf("    fused add+norm %d x %d: %s\n", rows, dim, wrong ? "WRONG (taken/not)" : "left to the caller");
            }
            bad += wrong;
            be.ops->free(&be, d_h), be.ops->free(&be, d_dl), be.ops->free(&be, d_x), be.ops->free(&be, d_w);
            free(hh), free(h0), free(dl), free(xx), free(wh);
        }
    }
    /* captured once, replayed with new inputs */
    const size_t n = 1000;
    cudaStream_t s = (cudaStream_t)backend_cuda_stream(&be);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess || !cuda_p2p_all_reduce(&p, d, n) ||
        cudaStreamEndCapture(s, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
        FAIL("rank %d: capture failed\n", rank);
    for (int rep = 1; rep <= 3; rep++) {
        for (size_t i = 0; i < n; i++)
            h[i] = input(rank, i) * (float)rep;
        be.ops->upload(&be, d, h, n * 4);
        if (cudaGraphLaunch(ge, s) != cudaSuccess)
            FAIL("rank %d: graph launch failed\n", rank);
        be.ops->download(&be, h, d, n * 4);
        int wrong = check_sum(h, n, (float)rep);
        if (rank == 0)
            printf("    graph replay %d: %s\n", rep, wrong ? "WRONG" : "= the CPU's sum");
        bad += wrong;
    }
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    int timed_out = 0;
    cuda_ar_timed_out(p.peers, &timed_out);
    if (backend_cuda_status(&be, &err))
        FAIL("rank %d: CUDA error: %s\n", rank, err.msg);
    be.ops->free(&be, d);
    free(h);
    pipe_barrier(&c); /* neither unmaps while the other may still read */
    cuda_p2p_free(&p);
    backend_destroy(&be);
    return bad || timed_out;
}

int main(void)
{
    int to1[2], to0[2];
    if (pipe(to1) || pipe(to0))
        return 1;
    pid_t child = fork(); /* before any CUDA call */
    if (child == 0)
        _exit(run_rank(1, to0[1], to1[0]));
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("test_comm_p2p_cuda: no CUDA device found, skipping (needs a GPU)\n");
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        return 0;
    }
    int rc0 = run_rank(0, to1[1], to0[0]), st = 0;
    waitpid(child, &st, 0);
    const int rc1 = WIFEXITED(st) ? WEXITSTATUS(st) : 99;
    printf("test_comm_p2p_cuda: rank 0 %s, rank 1 %s\n", rc0 ? "FAILED" : "ok", rc1 ? "FAILED" : "ok");
    return rc0 || rc1;
}
