/* backend_cuda.h — the CUDA backend: every op of struct backend_ops on one GPU.
 *
 * Exists only in a build with MOESERVE_HAVE_CUDA. At creation the backend
 * probes its device and builds a struct plan (plan/plan.h); every kernel
 * takes its tile, thread count and shared-memory budget from that plan and
 * never looks at the compute capability. Weights are copied to the device
 * once, in their file format (DESIGN.md decision 3); activations stay fp32.
 *
 * Errors: ops return nothing, so the first failing CUDA/cuBLAS call is
 * recorded (with file:line) and logged; backend_cuda_status() returns it.
 *
 * defines: backend_cuda_create(), backend_cuda_create_for(), backend_cuda_device_count(), backend_cuda_stream(),
 *          backend_cuda_status(), backend_cuda_plan(), backend_cuda_set_*() (test hooks)
 */
#ifndef MOESERVE_BACKEND_CUDA_BACKEND_CUDA_H
#define MOESERVE_BACKEND_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "backend/backend.h"
#include "plan/plan.h"

/* Creates the backend on CUDA device `device`. smem_budget (bytes per block)
 * lowers the planner's shared-memory budget, so an H200 can run the tiles
 * an sm_120 would get; 0 = the environment variable MOESERVE_SMEM_BUDGET if
 * set, else the device's own opt-in limit. */
enum status backend_cuda_create(struct backend *be, int device, size_t smem_budget, struct err *err);

/* As backend_cuda_create, planned for this model's shapes and weight formats (model/model_plan.h;
 * borrowed for the call), so that the plan `moeserve plan --model DIR` prints is the plan that
 * runs; NULL for either: generic shapes / bf16 weights. */
enum status backend_cuda_create_for(struct backend *be, int device, size_t smem_budget,
                                    const struct plan_shapes *shapes, const struct plan_weights *weights,
                                    struct err *err);

/* Usable CUDA devices; 0 without a driver or a GPU (never fails). */
int backend_cuda_device_count(void);

/* STATUS_OK, or the first CUDA/cuBLAS failure of an op on this backend. */
enum status backend_cuda_status(const struct backend *be, struct err *err);

/* The plan the backend's kernels follow (borrowed, lives as long as be). */
const struct plan *backend_cuda_plan(const struct backend *be);
/* The backend's one stream (a cudaStream_t), where every op and collective runs: for tests that
 * capture its work into a graph of their own. */
void *backend_cuda_stream(struct backend *be);

/* The prefill tensor-core attention's operands: 0 bf16 hi + lo (fp32-grade, the default), 1 P and
 * V single bf16, 2 all single bf16 (faster, bf16-grade; --attention-precision). */
void backend_cuda_set_attention_precision(struct backend *be, int prec);
/* For tests: n > 0 forces the split-K (decode) attention kernel with n key
 * splits, -1 forces the unsplit (prefill) kernel, 0 restores the automatic
 * choice. */
void backend_cuda_set_attention_splits(struct backend *be, int n);
/* Tests: split decode attention through the older kernel + merge pair (true; what shapes the
 * merging kernel does not take run) or the default kernel that merges in its last block. */
void backend_cuda_set_legacy_decode(struct backend *be, bool on);
/* Tests: the split decode attention merging in clusters (the default where caps has them) or
 * through global memory. */
void backend_cuda_set_attn_cluster(struct backend *be, bool on);
/* Tests: whether a cluster's splits push their partials into the leader's shared memory
 * (default; where the budget holds them) or the leader pulls them (what smaller budgets run). */
void backend_cuda_set_attn_push(struct backend *be, bool on);
/* Tests: the few-token NVFP4 MoE pair with its weights through shared memory (cp.async) from
 * min_tokens tokens on (default 2; 0: never, always through registers). */
void backend_cuda_set_moe_smem(struct backend *be, int min_tokens);
/* Tests: the bytes of device memory resident bf16 copies of dense NVFP4 weights may take from here
 * on (cuda_dense_copy.c; 0: none, every 9+-row linear expands its weight per call). */
void backend_cuda_set_dense_copy_budget(struct backend *be, size_t bytes);
/* The bytes those copies take now. */
size_t backend_cuda_dense_copy_bytes(const struct backend *be);
/* Re-plans the dispatch table with `force` first ("op[@bucket]:kernel,...", as
 * MOESERVE_CUDA_FORCE; NULL or "": the plan's own choices). Captured graphs are dropped. */
enum status backend_cuda_force(struct backend *be, const char *force, struct err *err);

#endif
