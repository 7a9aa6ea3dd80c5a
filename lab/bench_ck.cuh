/* bench_ck.cuh — CK(call): the CUDA benchmark tools' check of a runtime call (file, line, the
 * call, the error), exiting with status 1 on failure. */
#ifndef MOESERVE_TOOLS_BENCH_CK_CUH
#define MOESERVE_TOOLS_BENCH_CK_CUH

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                                \
    do {                                                                                                     \
        cudaError_t e_ = (x);                                                                                \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));               \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#endif
