/* cpu_membw.c — see cpu_membw.h.
 *
 * Pages are first touched by the thread that later copies them, so on a NUMA
 * machine each thread copies local memory (as the GEMM threads read theirs).
 * One untimed copy warms page tables and TLBs. Not here: read-only or
 * write-only kernels, non-temporal tuning (memcpy picks its own stores).
 */
#include "backend/cpu/cpu_membw.h"

#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "base/timer.h"

/* This thread's page-aligned share of [0, bytes). */
static void slice(size_t bytes, size_t *lo, size_t *hi)
{
    const size_t page = 4096;
    size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
    size_t pages = (bytes + page - 1) / page;
    *lo = pages * t / nt * page;
    *hi = pages * (t + 1) / nt * page;
    if (*hi > bytes)
        *hi = bytes;
    if (*lo > *hi)
        *lo = *hi;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double cpu_memcpy_bandwidth(size_t bytes, int reps)
{
    if (bytes == 0 || reps <= 0)
        return 0.0;
    size_t alloc = (bytes + 4095) / 4096 * 4096;
    char *src = aligned_alloc(4096, alloc);
    char *dst = aligned_alloc(4096, alloc);
    double *secs = malloc((size_t)reps * sizeof(double));
    double rate = 0.0;
    if (src && dst && secs) {
#pragma omp parallel
        {
            size_t lo, hi;
            slice(bytes, &lo, &hi);
            memset(src + lo, 0x5a, hi - lo);
            memset(dst + lo, 0, hi - lo);
        }
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            double t0 = timer_now();
#pragma omp parallel
            {
                size_t lo, hi;
                slice(bytes, &lo, &hi);
                memcpy(dst + lo, src + lo, hi - lo);
            }
            if (r >= 0)
                secs[r] = timer_now() - t0;
        }
        qsort(secs, (size_t)reps, sizeof(double), cmp_double);
        rate = 2.0 * (double)bytes / secs[reps / 2] / 1e9;
    }
    free(src);
    free(dst);
    free(secs);
    return rate;
}
