/* cuda_build_info.cu — which GPU families this binary carries code for.
 *
 * nvcc defines __CUDA_ARCH_LIST__ (every virtual architecture of the build,
 * e.g. 800,900,1000,1200) in the host pass too, so the list is recorded as a
 * plain string in the binary: `moeserve plan` reports it and
 * tests/cli/fatbin.sh checks it where cuobjdump is not installed.
 */
#include "backend/cuda/common/common.h"

#define MS_STR2(...) #__VA_ARGS__
#define MS_STR(...) MS_STR2(__VA_ARGS__)

extern "C" const char *cuda_build_arch_list(void)
{
#ifdef __CUDA_ARCH_LIST__
    return "moeserve-cuda-archs: " MS_STR(__CUDA_ARCH_LIST__);
#else
    return "moeserve-cuda-archs: unknown";
#endif
}
