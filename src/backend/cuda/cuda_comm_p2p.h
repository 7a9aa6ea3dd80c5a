/* cuda_comm_p2p.h — the peer-to-peer all-reduce beside NCCL (comm/allreduce.h's kernels), chosen
 * per message size by a measurement the ranks take together at start-up.
 *
 * Never by link type or GPU name: where every pair of the ranks' GPUs can reach each other
 * (cudaDeviceCanAccessPeer) each rank maps every other's buffer (CUDA IPC), then all time NCCL,
 * the one-shot and the two-shot all-reduce at 256 B .. CUDA_P2P_MAX_BYTES, take the slowest
 * rank's time of each and keep, per size class, the fastest form: the same table on every rank,
 * so all ranks always run the same form. Messages above the table, a rank count above
 * CUDA_AR_MAX_RANKS, GPUs that cannot reach each other or `--collectives nccl`: NCCL alone, and
 * the table says why. Everything runs on the backend's stream (graphs capture it).
 *
 * defines: struct cuda_p2p, enum cuda_p2p_form, CUDA_P2P_CLASSES, CUDA_P2P_MAX_BYTES,
 *          cuda_p2p_init(), cuda_p2p_all_reduce(), cuda_p2p_fuses_add_rmsnorm(),
 *          cuda_p2p_all_reduce_add_rmsnorm(), cuda_p2p_describe(), cuda_p2p_free(),
 *          cuda_p2p_form_name()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_COMM_P2P_H
#define MOESERVE_BACKEND_CUDA_CUDA_COMM_P2P_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/comm/comm.h"
#include "backend/cuda/comm/allreduce.h"

struct backend;
struct cuda_backend;

enum cuda_p2p_form { CUDA_P2P_NCCL, CUDA_P2P_ONE_SHOT, CUDA_P2P_TWO_SHOT, CUDA_P2P_FORMS };

/* size class k: messages of up to 256 << k bytes; the last is CUDA_P2P_MAX_BYTES */
enum { CUDA_P2P_CLASSES = 17 };
#define CUDA_P2P_MAX_BYTES ((size_t)256 << (CUDA_P2P_CLASSES - 1)) /* 16 MiB */

/* NCCL's all-reduce of n floats in place on the backend's stream, for the measurement. */
typedef void (*cuda_p2p_nccl_fn)(struct comm *c, float *buf, size_t n);

struct cuda_p2p {
    struct cuda_ar_peers peers;
    struct cuda_backend *be;          /* borrowed: its stream */
    void *base;                       /* this rank's IPC allocation: data, then its flag row */
    void *mapped[CUDA_AR_MAX_RANKS];  /* the peers' allocations as opened here */
    bool on;                          /* the table may choose P2P forms */
    char why_off[160];                /* when not on */
    enum cuda_p2p_form form[CUDA_P2P_CLASSES];
    float us[CUDA_P2P_CLASSES][CUDA_P2P_FORMS]; /* slowest rank's time of one all-reduce */
};

/* Sets up *p for communicator c (NCCL's, already joined; its host collectives exchange the
 * handles and times). allow false: NCCL alone (--collectives nccl). A machine where P2P cannot
 * work is not an error: p->on false, p->why_off says why; errors are CUDA failures only. */
enum status cuda_p2p_init(struct cuda_p2p *p, struct comm *c, struct backend *be, bool allow,
                          cuda_p2p_nccl_fn nccl, struct err *err);
/* The all-reduce of n floats in buf by the table's form; false (nothing done) where it is NCCL's. */
bool cuda_p2p_all_reduce(struct cuda_p2p *p, float *buf, size_t n);
/* Whether the table runs n floats' all-reduce as the one-shot form, which has a fused variant
 * (cuda_ar_add_rmsnorm): the sizes where the fused all-reduce + residual add + RMSNorm is taken. */
bool cuda_p2p_fuses_add_rmsnorm(const struct cuda_p2p *p, size_t n);
/* h += the sum over the ranks of delta (rows x dim), x = rmsnorm(h) * w, in the one-shot form's
 * one reading kernel; false (nothing done) where cuda_p2p_fuses_add_rmsnorm is false. */
bool cuda_p2p_all_reduce_add_rmsnorm(struct cuda_p2p *p, const float *delta, float *h, const float *w, int rows,
                                     int dim, float eps, float *x);
/* The table as text (one line a size class, then the crossovers), into buf. */
void cuda_p2p_describe(const struct cuda_p2p *p, char *buf, size_t n);
const char *cuda_p2p_form_name(enum cuda_p2p_form f);
/* Safe on a zeroed struct. */
void cuda_p2p_free(struct cuda_p2p *p);

#endif
