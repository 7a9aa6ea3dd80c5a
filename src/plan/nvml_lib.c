/* nvml_lib.c — see nvml_lib.h. */
#include "plan/nvml_lib.h"

#include <dlfcn.h>
#include <string.h>

#include "base/log.h"

bool nvml_lib_ok(const struct nvml_lib *nv, int rc, const char *what)
{
    if (rc == NVML_LIB_OK)
        return true;
    LOG_DEBUG("nvml: %s: %s", what, nv && nv->error_string ? nv->error_string(rc) : "NVML error");
    return false;
}

bool nvml_lib_open(struct nvml_lib *nv)
{
    memset(nv, 0, sizeof *nv);
    nv->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nv->lib) {
        LOG_DEBUG("nvml: cannot load libnvidia-ml.so.1: %s", dlerror());
        return false;
    }
    /* POSIX: dlsym results convert to function pointers through this memcpy. */
#define NVML_SYM(field, name)                                                                                \
    do {                                                                                                     \
        void *s_ = dlsym(nv->lib, name);                                                                     \
        memcpy(&nv->field, &s_, sizeof s_);                                                                  \
    } while (0)
    NVML_SYM(init, "nvmlInit_v2");
    NVML_SYM(shutdown, "nvmlShutdown");
    NVML_SYM(error_string, "nvmlErrorString");
    NVML_SYM(handle_by_pci, "nvmlDeviceGetHandleByPciBusId_v2");
    NVML_SYM(handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
    NVML_SYM(power_limit, "nvmlDeviceGetPowerManagementLimit");
    NVML_SYM(power_usage, "nvmlDeviceGetPowerUsage");
    NVML_SYM(total_energy, "nvmlDeviceGetTotalEnergyConsumption");
    NVML_SYM(nvlink_state, "nvmlDeviceGetNvLinkState");
    NVML_SYM(max_clock, "nvmlDeviceGetMaxClockInfo");
#undef NVML_SYM
    /* total_energy is optional (pre-Volta drivers lack it); the rest every supported driver has. */
    if (!nv->init || !nv->shutdown || !nv->handle_by_pci || !nv->handle_by_index || !nv->power_limit ||
        !nv->power_usage || !nv->nvlink_state || !nv->max_clock) {
        LOG_DEBUG("nvml: libnvidia-ml.so.1 lacks a required function");
        dlclose(nv->lib);
        memset(nv, 0, sizeof *nv);
        return false;
    }
    if (!NVML_LIB_CHECK(nv, nv->init())) {
        dlclose(nv->lib);
        memset(nv, 0, sizeof *nv);
        return false;
    }
    return true;
}

void nvml_lib_close(struct nvml_lib *nv)
{
    if (!nv->lib)
        return;
    NVML_LIB_CHECK(nv, nv->shutdown());
    dlclose(nv->lib);
    memset(nv, 0, sizeof *nv);
}
