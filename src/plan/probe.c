/* probe.c — fills struct device_caps from a real GPU (CUDA runtime + NVML).
 *
 * What is measured here: name, cc, SMs, opt-in shared memory per block and
 * per SM, registers, memory, L2, SM clock, theoretical memory bandwidth
 * (memory clock x bus width x 2, a lead until `moeserve bench` measures
 * it), peers (cudaDeviceCanAccessPeer), and through NVML the power limit and
 * whether any NVLink is up. The instruction features then come from the
 * capability table (plan_caps_apply_table), never from here.
 *
 * NVML is opened at run time through plan/nvml_lib.h; a machine without it
 * still probes, with power_limit_w 0 and nvlink false.
 *
 * Every CUDA call goes through CUDA_CHECK, every NVML call through
 * NVML_LIB_CHECK. A build without CUDA (no MOESERVE_HAVE_CUDA) returns
 * STATUS_UNSUPPORTED.
 */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "plan/plan.h"

#ifdef MOESERVE_HAVE_CUDA

#include <cuda_runtime.h>

#include "plan/nvml_lib.h"

#define CUDA_CHECK(call)                                                                                     \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess)                                                                               \
            return err_set(err, STATUS_IO, "%s:%d: CUDA device %d: %s: %s (%s)", __FILE__, __LINE__, index,  \
                           #call, cudaGetErrorName(e_), cudaGetErrorString(e_));                             \
    } while (0)

/* Power limit, NVLink and max SM clock from NVML; leaves caps alone where NVML cannot tell. */
static void probe_nvml(struct device_caps *caps, const char *pci_bus_id)
{
    struct nvml_lib nv;
    if (!nvml_lib_open(&nv)) {
        LOG_DEBUG("probe: NVML unavailable: power limit and NVLink unknown");
        return;
    }
    nvml_device dev;
    if (NVML_LIB_CHECK(&nv, nv.handle_by_pci(pci_bus_id, &dev))) {
        unsigned int mw = 0, mhz = 0;
        if (NVML_LIB_CHECK(&nv, nv.power_limit(dev, &mw)))
            caps->power_limit_w = mw / 1000.0;
        if (NVML_LIB_CHECK(&nv, nv.max_clock(dev, NVML_LIB_CLOCK_SM, &mhz)) && mhz)
            caps->sm_clock_ghz = mhz / 1000.0;
        /* Links past the device's count answer an error; any active one is enough. */
        for (unsigned int link = 0; link < NVML_LIB_MAX_LINKS && !caps->nvlink; link++) {
            int active = 0;
            if (nv.nvlink_state(dev, link, &active) != NVML_LIB_OK)
                continue; /* expected for absent links: not worth a message per link */
            caps->nvlink = active != 0;
        }
    }
    nvml_lib_close(&nv);
}

enum status plan_caps_probe(struct device_caps *caps, int index, struct err *err)
{
    memset(caps, 0, sizeof *caps);
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    if (index < 0 || index >= n)
        return err_set(err, STATUS_NOT_FOUND, "CUDA device %d: this machine has %d device%s", index, n,
                       n == 1 ? "" : "s");
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    snprintf(caps->name, sizeof caps->name, "%.*s", (int)sizeof caps->name - 1, prop.name);
    snprintf(caps->source, sizeof caps->source, "probe:%d", index);
    caps->cc_major = prop.major;
    caps->cc_minor = prop.minor;
    caps->sm_count = prop.multiProcessorCount;
    caps->total_mem = prop.totalGlobalMem;
    caps->l2_bytes = (size_t)prop.l2CacheSize;
    caps->regs_per_block = prop.regsPerBlock;
    caps->n_gpus = n;

    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, index));
    caps->smem_per_block_optin = (size_t)v;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, index));
    caps->smem_per_sm = (size_t)v;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, index));
    caps->sm_clock_ghz = v / 1e6; /* kHz */
    int mem_khz = 0, bus_bits = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, index));
    CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index));
    caps->mem_bw_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9; /* double data rate */

    for (int j = 0; j < n; j++) {
        if (j == index)
            continue;
        int can = 0;
        CUDA_CHECK(cudaDeviceCanAccessPeer(&can, index, j));
        caps->peers += can != 0;
    }
    char bus_id[32];
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, (int)sizeof bus_id, index));
    probe_nvml(caps, bus_id);

    if (!plan_caps_apply_table(caps)) {
        char w[256];
        plan_caps_table_warning(caps, w, sizeof w);
        LOG_WARN("%s (%s): %s", caps->name, caps->source, w);
    }
    return STATUS_OK;
}

#else /* no CUDA in this build */

enum status plan_caps_probe(struct device_caps *caps, int index, struct err *err)
{
    memset(caps, 0, sizeof *caps);
    return err_set(err, STATUS_UNSUPPORTED,
                   "CUDA device %d: this build has no CUDA (rebuild where nvcc is found), or plan for a GPU "
                   "you do not have with --profile NAME (%s)",
                   index, plan_profile_names());
}

#endif
