/* power_sampler.c — see power_sampler.h.
 *
 * One thread per phase (created by start, joined by stop): phases are
 * seconds long, so a thread creation is noise, and the join is the only
 * synchronisation the accumulators need. A failed read is skipped, not
 * fatal: a phase with no good sample reports itself invalid.
 */
#include "plan/power_sampler.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/timer.h"

static bool sampler_read_w(struct power_sampler *ps, double *w)
{
    unsigned int mw = 0;
    if (!NVML_LIB_CHECK(&ps->nv, ps->nv.power_usage(ps->dev, &mw)))
        return false;
    *w = mw / 1000.0;
    return true;
}

static void sampler_take(struct power_sampler *ps)
{
    double w;
    if (!sampler_read_w(ps, &w))
        return;
    ps->n_samples++;
    ps->sum_w += w;
    if (w > ps->max_w)
        ps->max_w = w;
}

static void *sampler_thread(void *arg)
{
    struct power_sampler *ps = arg;
    struct timespec nap = {.tv_sec = ps->interval_ms / 1000, .tv_nsec = (long)(ps->interval_ms % 1000) * 1000000L};
    while (!atomic_load(&ps->stop)) {
        struct timespec left = nap;
        while (nanosleep(&left, &left) != 0 && errno == EINTR) {
        }
        if (!atomic_load(&ps->stop))
            sampler_take(ps);
    }
    return NULL;
}

enum status power_sampler_init(struct power_sampler *ps, const char *pci_bus_id, int interval_ms,
                               struct err *err)
{
    memset(ps, 0, sizeof *ps);
    ps->interval_ms = interval_ms > 0 ? interval_ms : 20;
    if (!nvml_lib_open(&ps->nv))
        return err_set(err, STATUS_UNSUPPORTED, "power: NVML (libnvidia-ml.so.1) is not available");
    int rc = pci_bus_id ? ps->nv.handle_by_pci(pci_bus_id, &ps->dev) : ps->nv.handle_by_index(0, &ps->dev);
    if (!NVML_LIB_CHECK(&ps->nv, rc)) {
        enum status st = err_set(err, STATUS_UNSUPPORTED, "power: NVML does not know GPU %s: %s",
                                 pci_bus_id ? pci_bus_id : "index 0",
                                 ps->nv.error_string ? ps->nv.error_string(rc) : "NVML error");
        nvml_lib_close(&ps->nv);
        return st;
    }
    unsigned int mw = 0;
    if (NVML_LIB_CHECK(&ps->nv, ps->nv.power_limit(ps->dev, &mw)))
        ps->limit_w = mw / 1000.0;
    double w;
    if (!sampler_read_w(ps, &w)) {
        nvml_lib_close(&ps->nv);
        return err_set(err, STATUS_UNSUPPORTED, "power: GPU %s does not report its power draw",
                       pci_bus_id ? pci_bus_id : "index 0");
    }
    return STATUS_OK;
}

void power_sampler_free(struct power_sampler *ps)
{
    if (ps->running) {
        struct power_reading ignored;
        power_sampler_stop(ps, &ignored);
    }
    nvml_lib_close(&ps->nv);
    memset(ps, 0, sizeof *ps);
}

enum status power_sampler_start(struct power_sampler *ps, struct err *err)
{
    if (!ps->nv.lib)
        return err_set(err, STATUS_INVALID, "power: sampler not initialised");
    ASSERT(!ps->running);
    ps->n_samples = 0;
    ps->sum_w = ps->max_w = 0;
    ps->has_energy = ps->nv.total_energy && ps->nv.total_energy(ps->dev, &ps->energy0_mj) == NVML_LIB_OK;
    ps->t0 = timer_now();
    sampler_take(ps);
    atomic_store(&ps->stop, false);
    int rc = pthread_create(&ps->thread, NULL, sampler_thread, ps);
    if (rc != 0)
        return err_set(err, STATUS_NOMEM, "power: cannot start the sampler thread: %s", strerror(rc));
    ps->running = true;
    return STATUS_OK;
}

void power_sampler_stop(struct power_sampler *ps, struct power_reading *out)
{
    memset(out, 0, sizeof *out);
    out->energy_avg_w = -1;
    out->pct_of_limit = -1;
    if (!ps->running)
        return;
    double t1 = timer_now();
    unsigned long long e1 = 0;
    bool energy = ps->has_energy && ps->nv.total_energy(ps->dev, &e1) == NVML_LIB_OK && e1 >= ps->energy0_mj;
    atomic_store(&ps->stop, true);
    pthread_join(ps->thread, NULL);
    ps->running = false;
    sampler_take(ps); /* the closing sample: a short phase still gets two */
    out->seconds = t1 - ps->t0;
    out->limit_w = ps->limit_w;
    out->n_samples = ps->n_samples;
    if (ps->n_samples == 0)
        return;
    out->valid = true;
    out->avg_w = ps->sum_w / ps->n_samples;
    out->max_w = ps->max_w;
    if (energy && out->seconds > 0)
        out->energy_avg_w = (double)(e1 - ps->energy0_mj) / 1000.0 / out->seconds;
    double w = out->energy_avg_w >= 0 ? out->energy_avg_w : out->avg_w;
    if (ps->limit_w > 0)
        out->pct_of_limit = 100.0 * w / ps->limit_w;
}
