/* power_sampler.h — a GPU's board power over a timed phase (NVML).
 *
 * Between power_sampler_start() and power_sampler_stop() a thread reads
 * nvmlDeviceGetPowerUsage every interval_ms; stop() joins it and returns the
 * average and peak of those samples, the device's enforced power limit, and,
 * where the driver has an energy counter, the exact average over the phase
 * (energy difference / wall time). The counter is preferred for the % of
 * the limit: on Ampere and newer, PowerUsage is itself a ~1 s moving average,
 * so samples lag a phase shorter than a few seconds.
 *
 * A machine without NVML (or without that GPU) makes init return
 * STATUS_UNSUPPORTED with the reason; callers print "n/a" and carry on.
 * Not here: per-rail power, clocks, temperatures.
 *
 * defines: struct power_sampler, struct power_reading, power_sampler_init(), power_sampler_free(),
 *          power_sampler_start(), power_sampler_stop()
 */
#ifndef MOESERVE_PLAN_POWER_SAMPLER_H
#define MOESERVE_PLAN_POWER_SAMPLER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/status.h"
#include "plan/nvml_lib.h"

struct power_reading {
    bool valid;          /* false: no samples (NVML missing, or the phase was not sampled) */
    int n_samples;
    double avg_w;        /* mean of the samples */
    double max_w;
    double energy_avg_w; /* energy counter / seconds; < 0 when the driver has no counter */
    double limit_w;      /* enforced power limit; 0 when unknown */
    double pct_of_limit; /* energy_avg_w (or avg_w without a counter) / limit_w * 100; < 0 unknown */
    double seconds;      /* length of the phase */
};

struct power_sampler {
    struct nvml_lib nv;     /* owned */
    nvml_device dev;
    int interval_ms;
    double limit_w;
    pthread_t thread;
    bool running;
    atomic_bool stop;       /* set by stop(), read by the thread */
    /* phase state: written by the thread, read after the join */
    int n_samples;
    double sum_w, max_w;
    /* energy counter at start (mJ); has_energy false when the driver has none */
    bool has_energy;
    unsigned long long energy0_mj;
    double t0;
};

/* pci_bus_id: the GPU as CUDA names it (cudaDeviceGetPCIBusId), so NVML and
 * CUDA agree on the device whatever CUDA_VISIBLE_DEVICES says; NULL = NVML
 * index 0. interval_ms <= 0 means 20. */
enum status power_sampler_init(struct power_sampler *ps, const char *pci_bus_id, int interval_ms,
                               struct err *err);
/* Safe on a zeroed struct; stops a running phase first. */
void power_sampler_free(struct power_sampler *ps);

/* Begins a phase (takes the first sample at once). */
enum status power_sampler_start(struct power_sampler *ps, struct err *err);
/* Ends the phase begun by start(); *out is invalid when nothing was sampled. */
void power_sampler_stop(struct power_sampler *ps, struct power_reading *out);

#endif
