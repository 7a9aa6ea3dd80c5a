/* cuda_device_info.c — see cuda_device_info.h. */
#include "backend/cuda/cuda_device_info.h"

#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"

enum status cuda_device_info_get(int device, struct cuda_device_info *info, struct err *err)
{
    memset(info, 0, sizeof *info);
    struct cuda_error_sink sink = {0};
    struct cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    if (CUDA_CHECK(&sink, cudaSetDevice(device)) && CUDA_CHECK(&sink, cudaGetDeviceProperties(&prop, device)) &&
        CUDA_CHECK(&sink, cudaDeviceGetPCIBusId(info->pci_bus_id, (int)sizeof info->pci_bus_id, device)) &&
        CUDA_CHECK(&sink, cudaMemGetInfo(&free_b, &total_b))) {
        snprintf(info->name, sizeof info->name, "%.*s", (int)sizeof info->name - 1, prop.name);
        info->mem_total = total_b;
        info->mem_used = total_b - free_b;
    }
    return cuda_sink_status(&sink, err);
}
