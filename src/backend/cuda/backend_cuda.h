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
 * defines: backend_cuda_create(), backend_cuda_create_for(), backend_cuda_device_count(),
 * backend_cuda_status(), backend_cuda_plan(), backend_cuda_set_attention_splits(),
 *          backend_cuda_set_legacy_decode(), backend_cuda_set_stream(),
 *          backend_cuda_set_decode_mma_dense(), backend_cuda_set_decode_fp8(),
 *          backend_cuda_set_router_route(), backend_cuda_set_fuse_moe(),
 *          backend_cuda_set_prep_attention()
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

/* As backend_cuda_create, planned for this model's shapes and weight formats (desc and
 * weights borrowed for the call), so that the plan `moeserve plan --model DIR` prints is the
 * plan that runs; NULL for either: generic shapes / bf16 weights. MOESERVE_PLAN_GENERIC=1
 * ignores them (the generic plan, for comparisons). */
enum status backend_cuda_create_for(struct backend *be, int device, size_t smem_budget,
                                    const struct model_desc *desc, const struct plan_weights *weights,
                                    struct err *err);

/* Usable CUDA devices; 0 without a driver or a GPU (never fails). */
int backend_cuda_device_count(void);

/* STATUS_OK, or the first CUDA/cuBLAS failure of an op on this backend. */
enum status backend_cuda_status(const struct backend *be, struct err *err);

/* The plan the backend's kernels follow (borrowed, lives as long as be). */
const struct plan *backend_cuda_plan(const struct backend *be);

/* For tests: n > 0 forces the split-K (decode) attention kernel with n key
 * splits, -1 forces the unsplit (prefill) kernel, 0 restores the automatic
 * choice. */
void backend_cuda_set_attention_splits(struct backend *be, int n);
/* Tests: split decode attention through the older kernel + merge pair (true) or the default
 * kernel that merges in its last block (false). */
void backend_cuda_set_legacy_decode(struct backend *be, bool on);
/* Tests: the one-token stream kernels (cuda_decode_stream.cu) and the decode fusions on or off
 * (off is the default unless MOESERVE_STREAM / MOESERVE_FUSE ask), and the stream kernels' per-block
 * shared memory (0: the budgets derived from the device, > 0: that many bytes for each kernel,
 * so that small budgets take the two-buffer tile ring). */
void backend_cuda_set_stream(struct backend *be, bool on, size_t smem);
/* Tests: the one-token NVFP4 GEMVs on tensor cores (cuda_gemv_mma; the default) on or off
 * (stays off where the device has no bf16 mma). */
void backend_cuda_set_decode_mma_dense(struct backend *be, bool on);
/* Tests: the split decode attention merging in clusters (the default where caps has them) or
 * through global memory. */
void backend_cuda_set_attn_cluster(struct backend *be, bool on);
/* Whether a cluster's splits push their partials into the leader's shared memory (default; where
 * the budget holds them) or the leader pulls them. */
void backend_cuda_set_attn_push(struct backend *be, bool on);
/* The few-token NVFP4 MoE pair with its weights through shared memory (cp.async) from
 * min_tokens tokens on (default 2; 0: never, always through registers); down_below: below that,
 * the down kernel alone in that form (MOESERVE_MOE_SMEM_DOWN=1). */
void backend_cuda_set_moe_smem(struct backend *be, int min_tokens, bool down_below);
/* Tests: whether weights loaded from now on with WEIGHT_LOAD_DENSE get a dec16 copy and one-token
 * NVFP4 linears read those copies (cuda_dec16.cu; MOESERVE_DEC16=1 does the same; only where the
 * device has bf16 mma). */
void backend_cuda_set_dec16(struct backend *be, bool on);
/* Tests: whether routed experts loaded from now on (WEIGHT_LOAD_EXPERT) get dec16 copies of gate
 * and up, and one-token MoE reads them (cuda_dec16_moe_gate_up; MOESERVE_DEC16_MOE=1). */
void backend_cuda_set_dec16_moe(struct backend *be, bool on);
/* Tests: NVFP4 linears of at least `rows` rows expand the weight to bf16 and run cuBLAS
 * (MOESERVE_LINEAR_DEQUANT=rows; 0: never). */
void backend_cuda_set_linear_dequant(struct backend *be, int rows);
/* ... and the rows it is set to (0: never). */
int backend_cuda_linear_dequant_rows(struct backend *be);
/* The most rows an NVFP4 linear takes through the tensor-core GEMV (1..8; default 8). */
void backend_cuda_set_gemv_mma_tokens(struct backend *be, int n);
/* Launches of that GEMV an NVFP4 linear of more rows may take, in chunks (1..8; default 1:
 * none, the bf16 copy + cuBLAS instead; MOESERVE_GEMV_MMA_CHUNKS), and the number set. */
void backend_cuda_set_gemv_mma_chunks(struct backend *be, int n);
int backend_cuda_gemv_mma_chunks(struct backend *be);
/* NVFP4 experts from `rows` rows an expert on average through bf16 copies and cuBLAS (0: never;
 * MOESERVE_MOE_BF16), in passes of at most pass_bytes of scratch (0: unchanged;
 * MOESERVE_MOE_BF16_MB), and the rows set. */
void backend_cuda_set_moe_bf16(struct backend *be, int rows, size_t pass_bytes);
int backend_cuda_moe_bf16_rows(struct backend *be);
/* The most tokens the MoE block runs pair by pair, without the sort (1..64; 0, the default:
 * plan_moe_pair_max_tokens() for the model; MOESERVE_MOE_DECODE_MAX), and the number set. */
void backend_cuda_set_moe_decode_max(struct backend *be, int n);
int backend_cuda_moe_decode_max(struct backend *be);
/* Tests: the few-token NVFP4 MoE on e4m3 tensor cores (cuda_decode_fp8.cu) where caps say
 * fp8_mma (MOESERVE_DECODE_FP8=1 does the same). */
void backend_cuda_set_decode_fp8(struct backend *be, bool on);
/* Tests: the router GEMV + routing in one kernel at few tokens from one token on
 * (cuda_router_route.cu; by default only its cluster form from 2 tokens, where the device has
 * clusters; MOESERVE_ROUTER_ROUTE=1 does the same as on). */
void backend_cuda_set_router_route(struct backend *be, bool on);
/* Tests: router_route in its thread-block-cluster form (where caps has clusters; else no-op). */
void backend_cuda_set_router_route_cluster(struct backend *be, bool on);
/* Tests: the MoE block fusion alone (norm + router GEMV, routing in the MoE kernel, residual in
 * down; MOESERVE_FUSE=moe does the same), without the stream kernels. */
void backend_cuda_set_fuse_moe(struct backend *be, bool on);
/* Tests: attn_prep folded into the decode attention at one token (MOESERVE_PREP_ATTN=1). */
void backend_cuda_set_prep_attention(struct backend *be, bool on);
/* With prep_attention: its cluster form where the attention takes clusters (caps "clusters"). */
void backend_cuda_set_prep_attention_cluster(struct backend *be, bool on);

#endif
