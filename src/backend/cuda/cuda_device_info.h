/* cuda_device_info.h — what a report says about the GPU a run used.
 *
 * Name, PCI bus id (the key NVML and CUDA agree on, see plan/power_sampler.h)
 * and memory in use. Read-only queries: nothing here allocates on the device.
 *
 * defines: struct cuda_device_info, cuda_device_info_get()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_DEVICE_INFO_H
#define MOESERVE_BACKEND_CUDA_CUDA_DEVICE_INFO_H

#include <stddef.h>

#include "base/status.h"

struct cuda_device_info {
    char name[256];
    char pci_bus_id[32]; /* "0000:19:00.0" */
    size_t mem_total;    /* bytes */
    size_t mem_used;     /* bytes in use on the device, by every process (cudaMemGetInfo) */
};

enum status cuda_device_info_get(int device, struct cuda_device_info *info, struct err *err);

#endif
