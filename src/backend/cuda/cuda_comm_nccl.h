/* cuda_comm_nccl.h — comm.h over NCCL for GPU ranks (DESIGN.md decision 6), one rank a GPU.
 *
 * libnccl.so.2 is loaded at run time (dlopen), like NVML: the binary starts on machines without
 * NCCL and only a run with GPU ranks needs it (a clear error names the library otherwise). The
 * collectives on backend memory (the all-reduce of a half-layer, the logits' gather) are queued on
 * the backend's stream, so they run in order with its kernels and are captured into its decode
 * graphs; the host-memory ones (the step messages of engine/ranks.c, the start-up agreements) go
 * through a device staging buffer and wait for the stream. A failed NCCL call is recorded in the
 * backend's error sink (backend_cuda_status), as its kernels' are.
 *
 * defines: cuda_comm_nccl_unique_id(), cuda_comm_nccl_init(), cuda_comm_nccl_describe()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_COMM_NCCL_H
#define MOESERVE_BACKEND_CUDA_CUDA_COMM_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/comm/comm.h"

enum { CUDA_NCCL_ID_BYTES = 128 };

/* A new communicator's id (ncclGetUniqueId), made by rank 0 and given to every rank. */
enum status cuda_comm_nccl_unique_id(uint8_t id[CUDA_NCCL_ID_BYTES], struct err *err);
/* Rank `rank` of `size` on be's device and stream (ncclCommInitRank; blocks until every rank has
 * joined). p2p: the peer-to-peer all-reduce may take the sizes where the start-up measurement finds
 * it faster (cuda_comm_p2p.h; every rank takes part, rank 0 logs the table); false: NCCL alone. */
enum status cuda_comm_nccl_init(struct comm *c, struct backend *be, int rank, int size,
                                const uint8_t id[CUDA_NCCL_ID_BYTES], bool p2p, struct err *err);
/* The all-reduce's form per message size with the start-up times, or why NCCL takes every size. */
void cuda_comm_nccl_describe(const struct comm *c, char *buf, size_t n);

#endif
