/* cuda_ktrace.cu — writes every instrumented module's phase records (cuda_ktrace.cuh) to a file.
 * Without -DMOESERVE_KERNEL_TRACE=ON there is nothing to write and cuda_ktrace_dump() says so.
 */
#include <stdio.h>

#include "backend/cuda/common/common.h"
#include "backend/cuda/common/cuda_ktrace.cuh"
extern "C" {
#include "base/log.h"
}

#ifdef MOESERVE_KERNEL_TRACE
extern "C" void ktrace_dump_decode_mma(FILE *f);
extern "C" void ktrace_dump_decode(FILE *f);
extern "C" void ktrace_dump_attn_decode(FILE *f);
extern "C" void ktrace_dump_fused(FILE *f);
extern "C" void ktrace_dump_norm(FILE *f);
extern "C" void ktrace_dump_route(FILE *f);
extern "C" void ktrace_dump_router_route(FILE *f);
#endif

extern "C" void cuda_ktrace_dump(const char *path)
{
#ifdef MOESERVE_KERNEL_TRACE
    FILE *f = fopen(path, "w");
    if (!f) {
        LOG_WARN("kernel trace: cannot write %s", path);
        return;
    }
    fprintf(f, "# module kernel t0_ns t1_ns smid block cycles_at_mark_1 ... (tools/ktrace_summary.py)\n");
    ktrace_dump_decode_mma(f);
    ktrace_dump_decode(f);
    ktrace_dump_attn_decode(f);
    ktrace_dump_fused(f);
    ktrace_dump_norm(f);
    ktrace_dump_route(f);
    ktrace_dump_router_route(f);
    fclose(f);
    LOG_INFO("kernel trace written to %s", path);
#else
    LOG_WARN("kernel trace: MOESERVE_TRACE_OUT=%s ignored (built without -DMOESERVE_KERNEL_TRACE=ON)", path);
#endif
}
