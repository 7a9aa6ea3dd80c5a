/* timer.h — monotonic wall clock for progress lines and tokens/s.
 * defines: timer_now() */
#ifndef MOESERVE_BASE_TIMER_H
#define MOESERVE_BASE_TIMER_H

#include <time.h>

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
static inline double timer_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
