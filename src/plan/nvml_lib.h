/* nvml_lib.h — the NVIDIA management library, opened at run time.
 *
 * NVML is a driver library, not a toolkit one (nvml.h is missing from some
 * toolkit installs, and linking its stub would make every binary, CPU-only
 * runs included, need the driver's libnvidia-ml.so.1), so it is opened with
 * dlopen and the functions used are declared here with their documented
 * ABI. Every user (plan/probe.c, plan/power_sampler.c) goes through this one
 * loader. A machine without NVML simply fails nvml_lib_open(); callers then
 * report the NVML figures as unknown, never as an error.
 *
 * nvmlInit/nvmlShutdown are reference counted by the library, so several
 * open handles (the probe inside the backend, a power sampler) coexist.
 *
 * defines: struct nvml_lib, nvml_device, enum nvml_lib_const, nvml_lib_open(), nvml_lib_close(),
 *          nvml_lib_ok(), NVML_LIB_CHECK()
 */
#ifndef MOESERVE_PLAN_NVML_LIB_H
#define MOESERVE_PLAN_NVML_LIB_H

#include <stdbool.h>

/* NVML ABI subset (nvml.h): nvmlReturn_t is an int enum, 0 = NVML_SUCCESS. */
typedef struct nvml_device_st *nvml_device;
enum nvml_lib_const { NVML_LIB_OK = 0, NVML_LIB_CLOCK_SM = 1, NVML_LIB_MAX_LINKS = 18 };

struct nvml_lib {
    void *lib; /* dlopen handle; NULL when closed */
    int (*init)(void);
    int (*shutdown)(void);
    const char *(*error_string)(int);
    int (*handle_by_pci)(const char *bus_id, nvml_device *dev);
    int (*handle_by_index)(unsigned int index, nvml_device *dev);
    int (*power_limit)(nvml_device dev, unsigned int *milliwatts);   /* current enforced limit */
    int (*power_usage)(nvml_device dev, unsigned int *milliwatts);   /* board draw */
    int (*total_energy)(nvml_device dev, unsigned long long *mj);    /* since driver load; may be NULL */
    int (*nvlink_state)(nvml_device dev, unsigned int link, int *is_active);
    int (*max_clock)(nvml_device dev, int type, unsigned int *mhz);
};

/* Loads libnvidia-ml.so.1 and calls nvmlInit. false (and *nv zeroed) when
 * the library, one of its required functions, or the init is missing. */
bool nvml_lib_open(struct nvml_lib *nv);
/* Safe on a zeroed or closed struct. */
void nvml_lib_close(struct nvml_lib *nv);

/* Logs a failed NVML result at debug level (NVML figures are optional);
 * returns rc == NVML_LIB_OK. */
bool nvml_lib_ok(const struct nvml_lib *nv, int rc, const char *what);
#define NVML_LIB_CHECK(nv, call) nvml_lib_ok((nv), (call), #call)

#endif
