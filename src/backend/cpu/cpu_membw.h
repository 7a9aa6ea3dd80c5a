/* cpu_membw.h — the machine's achievable memory bandwidth, the roofline of
 * memory-bound CPU kernels (decode GEMMs are measured against it).
 *
 * defines: cpu_memcpy_bandwidth()
 */
#ifndef MOESERVE_BACKEND_CPU_CPU_MEMBW_H
#define MOESERVE_BACKEND_CPU_CPU_MEMBW_H

#include <stddef.h>

/* Copies a bytes-sized buffer into another with all OpenMP threads (each its
 * own contiguous slice), reps times, and returns the median rate in GB/s
 * (1e9 bytes), counting bytes read plus bytes written (2 * bytes per copy).
 * bytes should be far larger than the last-level cache. Returns 0 when the
 * buffers cannot be allocated or bytes or reps is 0. */
double cpu_memcpy_bandwidth(size_t bytes, int reps);

#endif
