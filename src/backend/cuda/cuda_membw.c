/* cuda_membw.c — see cuda_membw.h.
 *
 * Own stream and own buffers, so the measurement neither waits on nor
 * disturbs the backend's stream; the median of the reps resists one slow
 * copy (a clock ramp, another process). Not here: read-only or write-only
 * kernels, or the theoretical bus figure (plan/probe.c has that one).
 */
#include "backend/cuda/cuda_membw.h"

#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"

enum { MEMBW_MAX_REPS = 64 };

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

enum status cuda_memcpy_bandwidth(int device, size_t bytes, int reps, double *gbs, struct err *err)
{
    *gbs = 0;
    if (bytes == 0 || reps <= 0 || reps > MEMBW_MAX_REPS)
        return err_set(err, STATUS_INVALID, "cuda membw: bytes %zu and reps %d (1..%d) make no measurement",
                       bytes, reps, MEMBW_MAX_REPS);
    struct cuda_error_sink sink = {0};
    cudaStream_t stream = NULL;
    cudaEvent_t ev[MEMBW_MAX_REPS + 1] = {0};
    void *src = NULL, *dst = NULL;
    float ms[MEMBW_MAX_REPS];
    bool ok = CUDA_CHECK(&sink, cudaSetDevice(device)) &&
              CUDA_CHECK(&sink, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    /* out of memory is the likely failure (the model is loaded): its own status, not the sink's */
    bool room = !ok || (CUDA_CHECK(NULL, cudaMalloc(&src, bytes)) && CUDA_CHECK(NULL, cudaMalloc(&dst, bytes)));
    if (!room)
        (void)cudaGetLastError(); /* clear it: the backend's launch checks must not see our failure */
    ok = ok && room;
    for (int i = 0; ok && i <= reps; i++)
        ok = CUDA_CHECK(&sink, cudaEventCreate(&ev[i]));
    ok = ok && CUDA_CHECK(&sink, cudaMemsetAsync(src, 0x5a, bytes, stream)) &&
         CUDA_CHECK(&sink, cudaMemsetAsync(dst, 0, bytes, stream)) &&
         CUDA_CHECK(&sink, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)) && /* warm-up */
         CUDA_CHECK(&sink, cudaEventRecord(ev[0], stream));
    /* back-to-back copies, one event between each pair: rep r spans ev[r]..ev[r+1] */
    for (int r = 0; ok && r < reps; r++)
        ok = CUDA_CHECK(&sink, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)) &&
             CUDA_CHECK(&sink, cudaEventRecord(ev[r + 1], stream));
    ok = ok && CUDA_CHECK(&sink, cudaStreamSynchronize(stream));
    for (int r = 0; ok && r < reps; r++)
        ok = CUDA_CHECK(&sink, cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]));
    if (ok) {
        qsort(ms, (size_t)reps, sizeof ms[0], cmp_float);
        double secs = ms[reps / 2] / 1e3;
        *gbs = secs > 0 ? 2.0 * (double)bytes / secs / 1e9 : 0;
    }
    for (int i = 0; i <= reps; i++)
        if (ev[i])
            CUDA_CHECK(NULL, cudaEventDestroy(ev[i]));
    if (src)
        CUDA_CHECK(NULL, cudaFree(src));
    if (dst)
        CUDA_CHECK(NULL, cudaFree(dst));
    if (stream)
        CUDA_CHECK(NULL, cudaStreamDestroy(stream));
    if (!room)
        return err_set(err, STATUS_NOMEM, "cuda membw: device %d cannot hold two buffers of %.2f GiB", device,
                       (double)bytes / (1u << 30));
    return cuda_sink_status(&sink, err);
}
