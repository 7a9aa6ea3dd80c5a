/* plan_internal.h — inside plan/: the planner's candidates, its cost model's context and the
 * pieces its files share. planner.c holds the chooser and the entry points (its header comment
 * is the cost model's documentation), plan_gemm.c the GEMM families and the ops built on them
 * (linears, experts, lm_head), plan_attention.c attention, MLA and DSA, plan_small_ops.c the
 * memory-bound small ops and the few-token decode kernels. Not API: plan.h is.
 *
 * defines: struct cand, struct plan_ctx, struct work, the pl_*() functions below
 */
#ifndef MOESERVE_PLAN_PLAN_INTERNAL_H
#define MOESERVE_PLAN_PLAN_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#include "plan/plan.h"

/* The reference workload. */
#define REF_PREFILL_TOKENS 2048
#define REF_DECODE_BATCH 32
#define REF_DECODE_CTX 4096

#define SMEM_BYTES_PER_CLK 128.0 /* per SM, lead */
#define L2_BYTES_PER_CLK 32.0    /* L2 -> SM per SM, lead (half the 64 B/clk port) */
#define TIE_TOLERANCE 0.05
#define MAX_REGS_PER_THREAD 255
#define MAX_THREADS_PER_BLOCK 1024
#define MAX_CANDS 1024
#define MAX_PARTS 6

enum feat {
    FEAT_BF16_MMA = 1u << 0,
    FEAT_FP8_MMA = 1u << 1,
    FEAT_WGMMA = 1u << 2,
    FEAT_TCGEN05 = 1u << 3,
    FEAT_FP4_BS = 1u << 4,
    FEAT_TMA = 1u << 5,
};

/* In the order a reason names the first missing one. */
static const struct {
    unsigned bit;
    const char *text;
} FEAT_ABSENT[] = {
    {FEAT_FP4_BS, "fp4 block-scaled mma needs sm_120a features: absent"},
    {FEAT_TCGEN05, "tcgen05 needs sm_100a features: absent"},
    {FEAT_WGMMA, "wgmma needs sm_90a features: absent"},
    {FEAT_TMA, "TMA needs sm_90+ features: absent"},
    {FEAT_FP8_MMA, "fp8 mma needs sm_89+ features: absent"},
    {FEAT_BF16_MMA, "bf16 mma needs sm_80+ features: absent"},
};

enum drop { DROP_NONE, DROP_FEATURE, DROP_FORMAT, DROP_NO_KERNEL, DROP_LOADS, DROP_REGS, DROP_SMEM };

struct work {
    double flops;
    double bytes;    /* DRAM: every byte once */
    double l2_bytes; /* re-reads of tiles other blocks also read (served by L2) */
    double blocks;
};

struct cand {
    const char *kernel;
    enum plan_math math;
    unsigned needs;      /* FEAT_* */
    const char *refused; /* non-NULL: cannot take these weights, and why */
    bool portable;       /* fp32 FMA path that runs anywhere */
    bool library;        /* cuBLAS: chooses its own tiles */
    bool streaming;      /* loads overlap math without smem stages (elementwise kernels) */
    const char *note;    /* what this family does with the weights, for the reason */
    int tm, tn, tk, stages, threads, regs;
    size_t smem;
    double feed; /* FLOP/clk/SM the smem feed allows; 0 = no limit */
    struct work part[MAX_PARTS];
    int n_parts;
    int split_k;
    /* chooser */
    enum drop drop;
    double t_us, t_cmp_us, t_mem_us;
};

struct plan_ctx {
    const struct device_caps *caps;
    const struct plan_request *req;
    struct plan *p;
    struct plan_weights w;
    bool qk_norm;
    bool shapes_router_sigmoid;
    struct cand *c; /* (MAX_CANDS) scratch for one op */
    int n;
    char fallbacks[160]; /* ops that fell back to the portable path */
};

static inline double ceil_div(double a, double b)
{
    return ceil(a / b);
}

static inline int imin(int a, int b)
{
    return a < b ? a : b;
}

static inline int imax(int a, int b)
{
    return a > b ? a : b;
}

/* ---- planner.c: helpers, the chooser ---- */
unsigned pl_caps_features(const struct device_caps *c);
double pl_caps_clock_hz(const struct device_caps *c);
double pl_caps_bw(const struct device_caps *c);
double pl_caps_rate_clk(const struct device_caps *c, enum plan_math m);
struct cand *pl_cand_add(struct plan_ctx *x, const char *kernel, enum plan_math math, unsigned needs);
void pl_cand_part(struct cand *c, double flops, double bytes, double l2_bytes, double blocks);
enum status pl_choose(struct plan_ctx *x, const char *op, enum weight_format wf, const char *note, struct err *err);

/* ---- plan_gemm.c ---- */
double pl_wf_bytes(enum weight_format f);
enum status pl_moe(struct plan_ctx *x, struct err *err);
enum status pl_linear(struct plan_ctx *x, struct err *err);
enum status pl_linear_ffn(struct plan_ctx *x, struct err *err);
enum status pl_tail(struct plan_ctx *x, struct err *err);

/* ---- plan_attention.c ---- */
enum status pl_attention_prefill(struct plan_ctx *x, struct err *err);
enum status pl_attention_decode(struct plan_ctx *x, struct err *err);
enum status pl_mla_dsa(struct plan_ctx *x, struct err *err);

/* ---- plan_small_ops.c ---- */
int pl_row_threads(int width);
struct cand *pl_simple(struct plan_ctx *x, const char *kernel, int tm, int tn, int tk, int threads, size_t smem, double flops, double bytes, double blocks);
enum status pl_front(struct plan_ctx *x, struct err *err);
enum status pl_rope_kv(struct plan_ctx *x, struct err *err);
enum status pl_decode(struct plan_ctx *x, struct err *err);

#endif
