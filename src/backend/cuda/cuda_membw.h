/* cuda_membw.h — a GPU's achievable memory bandwidth, the roofline that
 * memory-bound GPU work (batch-1 decode) is measured against.
 *
 * The figure is a device-to-device cudaMemcpyAsync of a buffer far larger
 * than L2, counted like cpu_memcpy_bandwidth(): bytes read plus bytes
 * written, so a kernel that only streams weights in (reads) can be compared
 * with it directly.
 *
 * defines: cuda_memcpy_bandwidth()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_MEMBW_H
#define MOESERVE_BACKEND_CUDA_CUDA_MEMBW_H

#include <stddef.h>

#include "base/status.h"

/* Copies a bytes-sized device buffer into another on `device`, reps times
 * after one untimed copy, timed with CUDA events; *gbs = the median rate in
 * GB/s (1e9 bytes, read + write = 2 * bytes per copy). Takes 2 * bytes of
 * device memory for the call's duration; a failed allocation is a
 * STATUS_NOMEM naming the size. */
enum status cuda_memcpy_bandwidth(int device, size_t bytes, int reps, double *gbs, struct err *err);

#endif
