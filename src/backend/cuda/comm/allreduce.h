/* allreduce.h — the peer-to-peer all-reduce of GPU ranks (DESIGN.md decision 6: small messages),
 * over buffers every rank maps from every other (CUDA IPC; over NVLink or PCIe P2P between GPUs,
 * or between processes sharing one GPU).
 *
 * Each rank owns one buffer of floats and a row of flags in device memory that the others map.
 * An all-reduce: the rank copies its input into its own buffer, the ranks meet at a barrier,
 * then either every rank sums every buffer (one-shot: size reads a value, best for small
 * messages) or each sums its slice into its own buffer, they meet again and each gathers the
 * slices (two-shot: 2 reads a value, for larger ones); a last barrier keeps a rank from
 * overwriting its buffer while another still reads it. Sums go in rank order, so every rank gets
 * the same bits. The fused form adds the sum into the residual stream and writes the RMSNorm of
 * the result (the next layer's input) in the same pass over the rows.
 *
 * Barriers are epochs: rank r writes epoch e into slot r of every rank's flag row and waits until
 * its own row holds e in every slot (system-scope release / acquire). Each rank counts its epochs
 * in its own flag row (slot CUDA_AR_MAX_RANKS + 1), so a barrier captured into a CUDA graph meets
 * at a new epoch on every replay; rows start zeroed (CUDA_AR_FLAG_BYTES). A rank that never arrives
 * makes the others give up after CUDA_AR_SPIN_NS and return, their output undefined (never a
 * hang); cuda_ar_timed_out() tells.
 *
 * defines: struct cuda_ar_peers, cuda_ar_barrier(), cuda_ar_one_shot(), cuda_ar_reduce_slice(),
 *          cuda_ar_gather_slices(), cuda_ar_add_rmsnorm(), cuda_ar_slice()
 */
#ifndef MOESERVE_BACKEND_CUDA_COMM_ALLREDUCE_H
#define MOESERVE_BACKEND_CUDA_COMM_ALLREDUCE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { CUDA_AR_MAX_RANKS = 8 };
#define CUDA_AR_SPIN_NS 10000000000ull /* 10 s */
#define CUDA_AR_FLAG_BYTES 256           /* a flag row's bytes (zeroed before the first barrier) */

struct cuda_ar_peers {
    float *data[CUDA_AR_MAX_RANKS];     /* rank r's buffer as this process maps it */
    uint32_t *flags[CUDA_AR_MAX_RANKS]; /* rank r's flag row: CUDA_AR_MAX_RANKS slots, a timeout flag, the epoch */
    int rank, size;
};

/* Slice [*off, *off + *len) of n values that rank r reduces in the two-shot form. */
void cuda_ar_slice(size_t n, int r, int size, size_t *off, size_t *len);
/* Every rank's arrival at its next epoch (after this stream's earlier work is visible to the peers). */
cudaError_t cuda_ar_barrier(cudaStream_t s, struct cuda_ar_peers p);
/* out[i] = sum over ranks in order of data[r][i], i < n (after a barrier); out is not a buffer the
 * peers read (they may still be reading this rank's). */
cudaError_t cuda_ar_one_shot(cudaStream_t s, struct cuda_ar_peers p, size_t n, float *out);
/* The rank's slice of the sum into its own buffer (after a barrier). */
cudaError_t cuda_ar_reduce_slice(cudaStream_t s, struct cuda_ar_peers p, size_t n);
/* out[i] = the sum, each slice read from the rank that reduced it (after a barrier). */
cudaError_t cuda_ar_gather_slices(cudaStream_t s, struct cuda_ar_peers p, size_t n, float *out);
/* h[r, :] += sum over ranks of data[.][r, :]; x[r, :] = h[r, :] / sqrt(mean(h[r, :]^2) + eps) * w
 * (after a barrier; rows x dim values in the buffers). */
cudaError_t cuda_ar_add_rmsnorm(cudaStream_t s, struct cuda_ar_peers p, int rows, int dim, float *h,
                                const float *w, float eps, float *x);
/* Whether this rank's barriers gave up waiting for a peer (reads its timeout flag). */
cudaError_t cuda_ar_timed_out(struct cuda_ar_peers p, int *timed_out);

#ifdef __cplusplus
}
#endif

#endif
