/* kernel_desc.h — the descriptor each kernel of a backend declares, so that the planner
 * chooses only among kernels that exist, by the rules the kernels themselves state.
 *
 * A backend lists its kernels in a table of these beside their launchers, compiled into every
 * build (CPU-only too), so that `moeserve plan --profile NAME` on a machine without a GPU
 * plans exactly what that backend would run there. A descriptor carries what the planner and
 * the backend's dispatch both need: the op it serves, its instruction family and required
 * device features, the weight formats it reads, and `fits`, the shape and shared-memory limits
 * of one launch. The planner's cost model may know of more families than a backend has; a
 * candidate whose name is in no table is dropped ("no kernel").
 *
 * defines: struct kernel_shape, struct kernel_tile, struct kernel_desc, struct kernel_table, enum kernel_feature,
 *          kernel_table_find(), kernel_desc_serves()
 */
#ifndef MOESERVE_PLAN_KERNEL_DESC_H
#define MOESERVE_PLAN_KERNEL_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/weight.h"

/* What one launch is asked to do, as far as choosing a kernel needs to know. */
struct kernel_shape {
    enum weight_format format;
    int tokens;    /* rows of the activations (a pass's tokens) */
    int n_weights; /* linears sharing x in one launch (q/k/v: 3); 1 otherwise */
    int64_t n, k;  /* a linear: output rows (the widest of them), input width */
    int d_model, d_expert, n_used, n_experts; /* routed experts; routing (k: the router's width) */
    int n_group;     /* routing: expert groups of the top-k (<= 1: none) */
    bool norm_first; /* routing: the call offers the add + RMSNorm before the router as well */
};

/* Device features a kernel needs (struct device_caps's booleans). */
enum kernel_feature {
    KERNEL_NEEDS_BF16_MMA = 1u << 0,
    KERNEL_NEEDS_FP8_MMA = 1u << 1,
    KERNEL_NEEDS_WGMMA = 1u << 2,
    KERNEL_NEEDS_TCGEN05 = 1u << 3,
    KERNEL_NEEDS_FP4_MMA = 1u << 4,
    KERNEL_NEEDS_CLUSTERS = 1u << 5,
};

/* One compiled tile of a tiled kernel (m: tokens, n: weight rows, k: the K step). */
struct kernel_tile {
    enum weight_format format; /* the weights it is compiled for */
    int m, n, k, stages;
};

struct kernel_desc {
    const char *name;  /* as the plan names it, e.g. "moe_pair_decode_mma_bf16" */
    const char *op;    /* the plan ops it serves, comma-separated ("linear,linear_decode") */
    const char *math;  /* its instruction family (plan_math_name()); NULL: a library's own choice */
    unsigned needs;    /* enum kernel_feature bits */
    unsigned formats;  /* weight formats it reads (1u << enum weight_format); 0: an op without weights */
    const char *where; /* the source file of its kernels */
    int id;            /* the backend's own number for it (its dispatch switch) */
    /* Whether one launch takes this shape within smem_budget bytes of shared memory a block;
     * NULL: every shape. Pointer alignment is the launcher's own check on top. */
    bool (*fits)(const struct kernel_shape *s, size_t smem_budget);
    /* Tiled kernels: the tiles compiled (any format; the planner keeps those of the weights'
     * format) and the shared memory a block of tile t uses. NULL / 0: the planner models it. */
    const struct kernel_tile *tiles;
    int n_tiles;
    size_t (*tile_smem)(const struct kernel_tile *t);
    /* The shared memory a block uses for this shape within smem_budget on sm_count SMs, where
     * it depends on the shape and not on a tile (0: the kernel cannot take it so); NULL: none
     * stated. */
    size_t (*shape_smem)(const struct kernel_shape *s, size_t smem_budget, int sm_count);
    /* The GPU kernels its launches show in a profiler, as an extended regex over their names
     * (tools/trace_check.sh compares a step's launches with the plan); NULL: not checked. */
    const char *symbols;
    /* Its launcher (the backend's state, the op's call record; false: it does not take the call's
     * pointers, the backend tries the plan's next kernel); NULL in a build without the backend. */
    bool (*launch)(void *backend, const void *call);
};

struct kernel_table {
    const char *backend; /* "cuda" */
    const struct kernel_desc *kernels;
    int n;
};

/* The descriptor named `name` in t, or NULL. */
const struct kernel_desc *kernel_table_find(const struct kernel_table *t, const char *name);
/* Whether k serves plan op `op` (one of its comma-separated ops). */
bool kernel_desc_serves(const struct kernel_desc *k, const char *op);

#endif
