/* cuda_ktrace.cuh — per-block phase timestamps inside kernels: where a kernel's time goes while
 * it runs in a CUDA graph with programmatic dependent launch (ncu cannot show that: it runs
 * kernels one at a time, without PDL). Compiled in only with -DMOESERVE_KERNEL_TRACE=ON (cmake);
 * otherwise every mark below is empty and costs nothing.
 *
 * Each mark is a statement (ends with a semicolon). A kernel says KT_BEGIN() first, KT_MARK(i) at
 * its phase boundaries (i = 1 .. KT_PHASES - 1, increasing) and KT_END(module, kernel) where a
 * block that did the whole work finishes (blocks that return early are not recorded). Thread 0
 * of each block keeps clock64() at every mark (SM cycles) and %globaltimer (ns, one clock for the
 * whole GPU) at the start and the end, and writes one record into a ring of KT_CAP records of its
 * .cu file. Each instrumented .cu file says KT_MODULE(name, "kernel 0", "kernel 1", ...) once at
 * file scope: the ring, and an extern "C" ktrace_dump_<name>(FILE *) that prints the ring as text
 * (cuda_ktrace.cu calls every module's when the backend closes and MOESERVE_TRACE_OUT names a
 * file). tools/ktrace_summary.py turns the file into per-kernel phase medians and an in-graph
 * timeline.
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_KTRACE_CUH
#define MOESERVE_BACKEND_CUDA_CUDA_KTRACE_CUH

#include <stdio.h>

enum { KT_PHASES = 8, KT_CAP = 16384 };

struct ktrace_rec {
    unsigned long long t0, t1; /* globaltimer at KT_BEGIN and KT_END */
    unsigned kernel, smid, block, marks;
    long long cyc[KT_PHASES]; /* clock64 at each mark, relative to KT_BEGIN */
};

#ifdef MOESERVE_KERNEL_TRACE

__device__ __forceinline__ unsigned long long kt_globaltimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#define KT_MODULE(name, ...)                                                                                  \
    __device__ ktrace_rec ktrace_ring_##name[KT_CAP];                                                         \
    __device__ unsigned ktrace_n_##name;                                                                      \
    extern "C" void ktrace_dump_##name(FILE *f)                                                               \
    {                                                                                                         \
        static const char *const names[] = {__VA_ARGS__};                                                    \
        static ktrace_rec h[KT_CAP];                                                                          \
        unsigned n = 0;                                                                                       \
        if (cudaMemcpyFromSymbol(&n, ktrace_n_##name, sizeof n) != cudaSuccess ||                             \
            cudaMemcpyFromSymbol(h, ktrace_ring_##name, sizeof h) != cudaSuccess)                             \
            return;                                                                                           \
        for (unsigned i = 0; i < (n < KT_CAP ? n : (unsigned)KT_CAP); i++) {                                  \
            const ktrace_rec &r = h[i];                                                                       \
            const unsigned k = r.kernel;                                                                      \
            fprintf(f, "%s %s %llu %llu %u %u", #name,                                                        \
                    k < sizeof names / sizeof names[0] ? names[k] : "?", r.t0, r.t1, r.smid, r.block);        \
            for (unsigned m = 1; m < r.marks && m < KT_PHASES; m++)                                           \
                fprintf(f, " %lld", r.cyc[m]);                                                                \
            fputc('\n', f);                                                                                   \
        }                                                                                                     \
    }

#define KT_BEGIN()                                                                                            \
    long long kt_c0 = 0, kt_c[KT_PHASES] = {0};                                                               \
    unsigned long long kt_t0 = 0;                                                                             \
    unsigned kt_marks = 1;                                                                                    \
    if (threadIdx.x == 0) {                                                                                   \
        kt_t0 = kt_globaltimer();                                                                             \
        kt_c0 = clock64();                                                                                    \
    }                                                                                                         \
    (void)0

#define KT_MARK(i)                                                                                            \
    do {                                                                                                      \
        if (threadIdx.x == 0) {                                                                               \
            kt_c[i] = clock64() - kt_c0;                                                                      \
            kt_marks = (i) + 1 > kt_marks ? (i) + 1 : kt_marks;                                               \
        }                                                                                                     \
    } while (0)

#define KT_END(name, kernel_id)                                                                               \
    do {                                                                                                      \
        if (threadIdx.x != 0)                                                                                 \
            break;                                                                                            \
        const unsigned kt_s = atomicAdd(&ktrace_n_##name, 1u) % KT_CAP;                                       \
        ktrace_rec &kt_r = ktrace_ring_##name[kt_s];                                                          \
        unsigned kt_sm;                                                                                       \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(kt_sm));                                                    \
        kt_r.t0 = kt_t0;                                                                                      \
        kt_r.t1 = kt_globaltimer();                                                                           \
        kt_r.kernel = (kernel_id);                                                                            \
        kt_r.smid = kt_sm;                                                                                    \
        kt_r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);                          \
        kt_r.marks = kt_marks;                                                                                \
        for (int kt_i = 0; kt_i < KT_PHASES; kt_i++)                                                          \
            kt_r.cyc[kt_i] = kt_c[kt_i];                                                                      \
    } while (0)

#else

#define KT_MODULE(name, ...)
#define KT_BEGIN() (void)0
#define KT_MARK(i) (void)0
#define KT_END(name, kernel_id) (void)0

#endif

#endif
