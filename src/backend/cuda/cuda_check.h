/* cuda_check.h — the one checked-call macro for CUDA runtime, cuBLAS and NVML calls (host C).
 *
 * CUDA_CHECK(sink, call) evaluates call once; on failure it records
 * "file:line: call: API error NAME (message)" in *sink (the first failure
 * sticks, later ones are only logged) and evaluates to false. Functions that
 * return enum status then copy the sink into their struct err. NVML results
 * are understood where nvml.h is included (MOESERVE_HAVE_NVML; the build does
 * not link NVML, plan/probe.c dlopens it).
 *
 * defines: struct cuda_error_sink, struct cuda_result, CUDA_CHECK(), cuda_check(), cuda_sink_status()
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_CHECK_H
#define MOESERVE_BACKEND_CUDA_CUDA_CHECK_H

#include <stdbool.h>

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#ifdef MOESERVE_HAVE_NVML
#include <nvml.h>
#endif

#include "base/status.h"

struct cuda_error_sink {
    bool failed;
    struct err err; /* the first failure */
};

struct cuda_result {
    bool ok;
    const char *api;
    const char *name;
    const char *msg;
};

static inline struct cuda_result cuda_result_rt(cudaError_t e)
{
    return (struct cuda_result){e == cudaSuccess, "CUDA", cudaGetErrorName(e), cudaGetErrorString(e)};
}

static inline struct cuda_result cuda_result_blas(cublasStatus_t s)
{
    return (struct cuda_result){s == CUBLAS_STATUS_SUCCESS, "cuBLAS", cublasGetStatusName(s),
                                cublasGetStatusString(s)};
}

#ifdef MOESERVE_HAVE_NVML
static inline struct cuda_result cuda_result_nvml(nvmlReturn_t r)
{
    return (struct cuda_result){r == NVML_SUCCESS, "NVML", "nvmlReturn_t", nvmlErrorString(r)};
}
#define CUDA_RESULT_NVML_                                                                                    \
    nvmlReturn_t:                                                                                            \
    cuda_result_nvml,
#else
#define CUDA_RESULT_NVML_
#endif

/* Records a failed result in sink (NULL: only log); returns r.ok. */
bool cuda_check(struct cuda_error_sink *sink, struct cuda_result r, const char *expr, const char *file,
                int line);

#define CUDA_CHECK(sink, call)                                                                               \
    cuda_check((sink),                                                                                       \
               _Generic((call), cudaError_t                                                                  \
                        : cuda_result_rt, cublasStatus_t                                                     \
                        : cuda_result_blas, CUDA_RESULT_NVML_ default                                        \
                        : cuda_result_rt)(call),                                                             \
               #call, __FILE__, __LINE__)

/* STATUS_OK, or the sink's first failure copied into err. */
enum status cuda_sink_status(const struct cuda_error_sink *sink, struct err *err);

#endif
