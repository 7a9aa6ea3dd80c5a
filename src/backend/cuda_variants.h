/* cuda_variants.h — which of the planner's kernel variants the CUDA backend implements.
 *
 * The planner knows every variant a GPU could run (wgmma, tcgen05, native FP4 ...); the CUDA
 * backend has kernels for a subset. This predicate is that subset, kept outside the CUDA
 * sources so that `moeserve plan --runnable` can show, in any build, the plan the backend
 * actually runs (plan_request.variant_loads).
 *
 * defines: cuda_variant_implemented()
 */
#ifndef MOESERVE_BACKEND_CUDA_VARIANTS_H
#define MOESERVE_BACKEND_CUDA_VARIANTS_H

#include <stdbool.h>

/* ctx is unused (the plan_request.variant_loads signature). */
bool cuda_variant_implemented(void *ctx, const char *kernel);

#endif
