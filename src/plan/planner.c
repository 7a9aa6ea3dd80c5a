/* planner.c — device caps + model shapes -> one kernel choice per op (plan.h).
 *
 * For every op of the forward, the planner lists candidate variants (kernel
 * name, instruction family, tile shape, pipeline stages, threads), computes
 * each one's shared-memory and register footprint from its tile, drops those
 * the device cannot run (missing instruction feature, weights in a form the
 * variant cannot take, not loadable in the backend's build, over the
 * register limits, over the smem budget) and picks among the rest with a
 * cost model over a reference workload (plan_shapes). Every choice records
 * why. Tensor-core variants always have a portable fp32-FMA variant below
 * them, including a smem-free configuration (stages 0), so a plan always
 * exists; choosing it when a tensor-core variant was listed is a "portable
 * fallback" and is said loudly (reason, plan warnings, log).
 *
 * Deliberately not here: any compute-capability test (only the feature
 * booleans and per-SM rates of struct device_caps are read; caps_table.c
 * maps cc to them), and any micro-benchmark refinement (a backend may
 * re-rank variants after measuring; the plan stays data).
 *
 * Shared memory per block (bytes; e(x) = bytes per element of operand x:
 * bf16 2, fp8 1 (+ one f32 scale per 128 elements for activations, per
 * 128x128 for weights), nvfp4 0.5 + one e4m3 scale per 16 = 0.5625):
 *   GEMM (tile_m x tile_n x tile_k):     stages x (tile_m x tile_k x e(A) + tile_n x tile_k x e(B))
 *       A = activations (bf16 in memory, quantised to fp4/fp8 on the way into smem where the
 *       family computes in fp4/fp8), B = weights as stored; weight-only families dequantise B
 *       in registers. The epilogue writes from registers: no C tile in smem.
 *       wgmma with the weights as A from registers (gemm_nvfp4_wo_wgmma, *_bf16_wgmma): the
 *       tiles and the shared-memory formula its kernel table declares (kernel_desc.tiles,
 *       tile_smem; cuda_gemm_limits.h)
 *   attention_prefill (D = qk dim, Dv = v dim):  2 x (tile_m x D + stages x tile_n x (D + Dv))
 *       (Q tile once, K and V tiles per stage, bf16; portable adds the fp32 score tile tile_m x tile_n x 4)
 *       mma (attn_prefill_mma_bf16): 4 x (tile_m x D + stages x tile_n x (D + Dv)) + 16 x tile_m, stages
 *       1..2: every operand as bf16 hi + lo (4 bytes, for fp32-level precision), stage 2 the fp32
 *       copy of the next K/V step (cp.async), 16 bytes of row data per query row
 *   attention_decode:  2 x (tile_m x Dk + stages x tile_n x Dkv)   (Dkv = Dk + Dv, or Dk for
 *       MLA where V is the first Dv dims of the cached latent)
 *   stages 0 (portable only): operands read straight from global memory through L1: 0 bytes.
 *   mla_attention (fp32; Dk = kv_lora_rank + rope, R = kv_lora_rank, warps = threads / 32):
 *       4 x (tile_m x (Dk + R) + tile_n x (Dk + 1) + warps x tile_n + 2 x tile_m);
 *       stages 0: 4 x (warps x tile_n + 2 x tile_m + tile_n) (scores, softmax state, key slots)
 *   dsa_index (fp32; H_I indexer heads of D_I dims):  4 x (H_I x D_I + H_I + tile_n x (D_I + 1));
 *       stages 0: 0
 *
 * Cost model, per part of an op (a GEMM of the op, ...):
 *   t = max(bytes / BW, l2_bytes / L2BW, flops / rate)   (math + the larger of the two memory
 *       terms with fewer than 2 stages: loads cannot overlap math)
 *   bytes = DRAM traffic, each byte once; l2_bytes = tile re-reads (GEMM: A once per column
 *       block, weights once per row block; attention: K/V once per query tile)
 *   L2BW = SMs x clock x 32 B/clk (lead) x p
 *   rate = SMs x clock x min(per-SM rate of the family (caps_table.c), smem feed) x p
 *   smem feed = 128 B/clk/SM (32 banks x 4 B, a lead) x FLOP per smem byte of the tile
 *               (mma.sync reads each fragment from two warps on average: half the intensity)
 *   p = blocks / (ceil(blocks / SMs) x SMs)         (wave quantisation, one block per SM busy)
 *   BW uses min(1, blocks / SMs) of the device bandwidth (too few blocks cannot fill it)
 *   flops count padded rows/columns (tile multiples) and causal tiles whole.
 * Choice: the fastest; within 5% of it (the leads are not more precise), a tensor-core variant over a
 * portable one, then the larger tile (tile_m x tile_n, then tile_k, then stages), then list order (the
 * families are listed fastest-first).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
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

/* ---- small helpers ---- */

static double ceil_div(double a, double b)
{
    return ceil(a / b);
}

static int imin(int a, int b)
{
    return a < b ? a : b;
}

static int imax(int a, int b)
{
    return a > b ? a : b;
}

static void appendf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t n, const char *fmt, ...)
{
    size_t o = strlen(buf);
    if (o + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + o, n - o, fmt, ap);
    va_end(ap);
}

/* Appends "; piece" only when the whole piece fits: reasons keep whole clauses. */
static void reason_add(char *buf, size_t n, const char *piece)
{
    if (!piece || !*piece || strstr(buf, piece))
        return;
    size_t o = strlen(buf), sep = o ? 2 : 0, len = strlen(piece);
    if (o + sep + len + 1 > n)
        return;
    snprintf(buf + o, n - o, "%s%s", sep ? "; " : "", piece);
}

static void plan_warn(struct plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void plan_warn(struct plan *p, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    LOG_WARN("plan: %s", line);
    if (p->warnings[0])
        appendf(p->warnings, sizeof p->warnings, "\n");
    appendf(p->warnings, sizeof p->warnings, "%s", line);
}

const char *plan_math_name(enum plan_math m)
{
    switch (m) {
    case PLAN_MATH_FP32_FMA: return "fp32_fma";
    case PLAN_MATH_BF16_MMA: return "bf16_mma";
    case PLAN_MATH_BF16_WGMMA: return "bf16_wgmma";
    case PLAN_MATH_BF16_TCGEN05: return "bf16_tcgen05";
    case PLAN_MATH_FP8_MMA: return "fp8_mma";
    case PLAN_MATH_FP8_WGMMA: return "fp8_wgmma";
    case PLAN_MATH_FP4_BLOCK_SCALED_MMA: return "fp4_block_scaled_mma";
    case PLAN_MATH_FP4_TCGEN05: return "fp4_tcgen05";
    case PLAN_MATH_COUNT: break;
    }
    return "?";
}

static unsigned caps_features(const struct device_caps *c)
{
    return (c->bf16_mma ? FEAT_BF16_MMA : 0) | (c->fp8_mma ? FEAT_FP8_MMA : 0) | (c->wgmma ? FEAT_WGMMA : 0) |
           (c->tcgen05 ? FEAT_TCGEN05 : 0) | (c->fp4_mma_block_scaled ? FEAT_FP4_BS : 0) |
           (c->tma ? FEAT_TMA : 0);
}

static double caps_clock_hz(const struct device_caps *c)
{
    return (c->sm_clock_ghz > 0 ? c->sm_clock_ghz : 1.5) * 1e9; /* 1.5 GHz when nobody said */
}

static double caps_bw(const struct device_caps *c)
{
    return (c->mem_bw_gbs > 0 ? c->mem_bw_gbs : 1000.0) * 1e9;
}

static double caps_rate_clk(const struct device_caps *c, enum plan_math m)
{
    double r = c->flops_per_clk_sm[m];
    if (r <= 0 && m == PLAN_MATH_FP32_FMA)
        r = 128; /* caps built by hand without the table */
    return r;
}

static struct cand *cand_add(struct plan_ctx *x, const char *kernel, enum plan_math math, unsigned needs)
{
    if (x->n >= MAX_CANDS)
        PANIC("planner: more than %d candidates for one op", MAX_CANDS);
    struct cand *c = &x->c[x->n++];
    memset(c, 0, sizeof *c);
    c->kernel = kernel;
    c->math = math;
    c->needs = needs;
    c->portable = math == PLAN_MATH_FP32_FMA;
    c->split_k = 1;
    return c;
}

static void cand_part(struct cand *c, double flops, double bytes, double l2_bytes, double blocks)
{
    ASSERT(c->n_parts < MAX_PARTS);
    c->part[c->n_parts++] = (struct work){flops, bytes, l2_bytes, blocks > 0 ? blocks : 1};
}

/* ---- the chooser ---- */

static void cand_cost(const struct plan_ctx *x, struct cand *c)
{
    const struct device_caps *caps = x->caps;
    double sms = caps->sm_count, rate = caps_rate_clk(caps, c->math);
    if (c->feed > 0 && c->feed < rate)
        rate = c->feed;
    rate *= sms * caps_clock_hz(caps);
    double l2_rate = sms * L2_BYTES_PER_CLK * caps_clock_hz(caps);
    bool overlap = c->library || c->streaming || c->stages >= 2;
    c->t_us = c->t_cmp_us = c->t_mem_us = 0;
    for (int i = 0; i < c->n_parts; i++) {
        const struct work *w = &c->part[i];
        double waves = ceil_div(w->blocks, sms);
        double p = w->blocks / (waves * sms);
        double pm = w->blocks < sms ? w->blocks / sms : 1.0;
        double tc = w->flops / (rate * p);
        double tm = fmax(w->bytes / (caps_bw(caps) * pm), w->l2_bytes / (l2_rate * p));
        c->t_cmp_us += tc * 1e6;
        c->t_mem_us += tm * 1e6;
        c->t_us += (overlap ? fmax(tc, tm) : tc + tm) * 1e6;
    }
}

static enum drop cand_check(const struct plan_ctx *x, const struct cand *c, size_t budget)
{
    if (c->needs & ~caps_features(x->caps))
        return DROP_FEATURE;
    if (c->refused)
        return DROP_FORMAT;
    if (x->req->kernels && !kernel_table_find(x->req->kernels, c->kernel))
        return DROP_NO_KERNEL;
    if (x->req->variant_loads && !x->req->variant_loads(x->req->variant_ctx, c->kernel))
        return DROP_LOADS;
    int regs_block = x->caps->regs_per_block > 0 ? x->caps->regs_per_block : 65536;
    if (c->regs > MAX_REGS_PER_THREAD || c->threads > MAX_THREADS_PER_BLOCK ||
        (long)c->threads * c->regs > regs_block)
        return DROP_REGS;
    if (c->smem > budget)
        return DROP_SMEM;
    return DROP_NONE;
}

/* Tie-breaks between two candidates of (nearly) the same time: true if a wins. */
static bool cand_preferred(const struct cand *a, const struct cand *b)
{
    if (a->portable != b->portable)
        return !a->portable;
    long aa = (long)a->tm * a->tn, ba = (long)b->tm * b->tn;
    if (aa != ba)
        return aa > ba;
    if (a->tk != b->tk)
        return a->tk > b->tk;
    /* stage counts only compare tiles of one kernel: across families the list order (the
     * stronger instruction family first) decides */
    if (a->stages != b->stages && strcmp(a->kernel, b->kernel) == 0)
        return a->stages > b->stages;
    return false; /* list order: the earlier one stays */
}

/* Index of the best candidate among those whose drop is in `allowed` (a bit set), or -1:
 * among all within the tolerance of the fastest, the tie-breaks decide. */
static int cand_best(const struct plan_ctx *x, unsigned allowed)
{
    double fastest = INFINITY;
    for (int i = 0; i < x->n; i++)
        if (allowed & (1u << x->c[i].drop))
            fastest = fmin(fastest, x->c[i].t_us);
    int best = -1;
    for (int i = 0; i < x->n; i++) {
        const struct cand *c = &x->c[i];
        if (!(allowed & (1u << c->drop)) || c->t_us > fastest * (1 + TIE_TOLERANCE))
            continue;
        if (best < 0 || cand_preferred(c, &x->c[best]))
            best = i;
    }
    return best;
}

static void tile_str(const struct cand *c, char *buf, size_t n)
{
    snprintf(buf, n, "%dx%dx%d x%d stages", c->tm, c->tn, c->tk, c->stages);
}

/* Why kernel `k` (all its candidates) lost; "" when it was merely slower and that says nothing. */
static void kernel_why_not(const struct plan_ctx *x, const char *k, size_t budget, char *buf, size_t n)
{
    buf[0] = 0;
    int best_ok = -1, smallest_smem = -1;
    unsigned missing = 0;
    const char *refused = NULL;
    bool loads = false, regs = false, no_kernel = false;
    for (int i = 0; i < x->n; i++) {
        const struct cand *c = &x->c[i];
        if (strcmp(c->kernel, k) != 0)
            continue;
        switch (c->drop) {
        case DROP_NONE:
            if (best_ok < 0 || c->t_us < x->c[best_ok].t_us)
                best_ok = i;
            break;
        case DROP_SMEM:
            if (smallest_smem < 0 || c->smem < x->c[smallest_smem].smem)
                smallest_smem = i;
            break;
        case DROP_FEATURE: missing |= c->needs & ~caps_features(x->caps); break;
        case DROP_FORMAT: refused = c->refused; break;
        case DROP_NO_KERNEL: no_kernel = true; break;
        case DROP_LOADS: loads = true; break;
        case DROP_REGS: regs = true; break;
        }
    }
    if (best_ok >= 0) {
        snprintf(buf, n, "%s slower (%.1f us)", k, x->c[best_ok].t_us);
    } else if (missing) {
        for (size_t f = 0; f < sizeof FEAT_ABSENT / sizeof FEAT_ABSENT[0]; f++)
            if (missing & FEAT_ABSENT[f].bit) {
                snprintf(buf, n, "%s", FEAT_ABSENT[f].text);
                break;
            }
    } else if (refused) {
        snprintf(buf, n, "%s", refused);
    } else if (no_kernel) {
        snprintf(buf, n, "%s: the %s backend has no such kernel", k, x->req->kernels->backend);
    } else if (loads) {
        snprintf(buf, n, "%s is not loadable here (not in the fatbin, or its self-test failed)", k);
    } else if (smallest_smem >= 0) {
        char t[64];
        tile_str(&x->c[smallest_smem], t, sizeof t);
        snprintf(buf, n, "%s: smallest tile %s needs %zu B > budget %zu B", k, t, x->c[smallest_smem].smem,
                 budget);
    } else if (regs) {
        snprintf(buf, n, "%s exceeds the register limits", k);
    }
}

/* Picks the candidate for `op`, appends it to the plan. `note` is op-specific context. */
static enum status plan_choose(struct plan_ctx *x, const char *op, enum weight_format wf, const char *note,
                               struct err *err)
{
    struct plan *p = x->p;
    size_t budget = p->smem_budget;
    if (p->n_ops >= PLAN_MAX_OPS)
        PANIC("planner: more than %d ops", PLAN_MAX_OPS);
    bool any_fast = false;
    for (int i = 0; i < x->n; i++) {
        struct cand *c = &x->c[i];
        c->drop = cand_check(x, c, budget);
        if (c->drop == DROP_NONE || c->drop == DROP_SMEM)
            cand_cost(x, c);
        any_fast |= !c->portable && !c->library;
    }
    int b = cand_best(x, 1u << DROP_NONE);
    if (log_get_level() >= LOG_LEVEL_DEBUG)
        for (int i = 0; i < x->n; i++) {
            static const char *DROP_NAME[] = {"ok", "feature", "format", "loads", "regs", "smem"};
            const struct cand *c = &x->c[i];
            LOG_DEBUG(
                "plan: %s %c %-28s %3dx%3dx%3d x%d  %7zu B  %3d regs  %-7s %9.2f us (math %.2f, mem %.2f)",
                op, i == b ? '*' : ' ', c->kernel, c->tm, c->tn, c->tk, c->stages, c->smem, c->regs,
                DROP_NAME[c->drop], c->t_us, c->t_cmp_us, c->t_mem_us);
        }
    if (b < 0) {
        size_t least = 0;
        for (int i = 0; i < x->n; i++)
            if (x->c[i].drop == DROP_SMEM && (!least || x->c[i].smem < least))
                least = x->c[i].smem;
        if (least)
            return err_set(err, STATUS_UNSUPPORTED,
                           "plan: op %s: no variant fits the smem budget of %zu B (the smallest needs %zu B)",
                           op, budget, least);
        return err_set(err, STATUS_UNSUPPORTED, "plan: op %s: no variant runs on %s", op, x->caps->name);
    }
    const struct cand *c = &x->c[b];
    struct op_plan *o = &p->ops[p->n_ops++];
    memset(o, 0, sizeof *o);
    snprintf(o->op, sizeof o->op, "%s", op);
    snprintf(o->kernel, sizeof o->kernel, "%s", c->kernel);
    snprintf(o->math, sizeof o->math, "%s", plan_math_name(c->math));
    o->math_id = c->math;
    o->tile_m = c->tm;
    o->tile_n = c->tn;
    o->tile_k = c->tk;
    o->stages = c->stages;
    o->threads = c->threads;
    o->smem_bytes = c->smem;
    o->bound = c->t_cmp_us > c->t_mem_us ? PLAN_BOUND_COMPUTE : PLAN_BOUND_MEMORY;
    o->weight_format = wf;
    o->split_k = c->split_k;
    o->est_us = c->t_us;
    o->portable_fallback = c->portable && any_fast;

    char piece[256];
    if (o->portable_fallback) {
        reason_add(o->reason, sizeof o->reason, "PORTABLE FALLBACK: no tensor-core variant eligible");
        appendf(x->fallbacks, sizeof x->fallbacks, "%s%s", x->fallbacks[0] ? ", " : "", op);
    }
    /* the families listed before the chosen one, and why each lost */
    for (int i = 0; i < x->n && x->c[i].kernel != c->kernel; i++) {
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = x->c[j].kernel == x->c[i].kernel;
        if (seen)
            continue;
        kernel_why_not(x, x->c[i].kernel, budget, piece, sizeof piece);
        reason_add(o->reason, sizeof o->reason, piece);
    }
    /* what the budget cost: the choice without it, when that differs */
    int u = cand_best(x, (1u << DROP_NONE) | (1u << DROP_SMEM));
    if (u >= 0 && u != b && x->c[u].drop == DROP_SMEM) {
        char tu[64], tb[64];
        tile_str(&x->c[u], tu, sizeof tu);
        tile_str(c, tb, sizeof tb);
        bool same = x->c[u].kernel == c->kernel;
        snprintf(piece, sizeof piece, "%s%stile %s needs %zu B > budget %zu B: using %s%s%s (%zu B)",
                 same ? "" : x->c[u].kernel, same ? "" : " ", tu, x->c[u].smem, budget, same ? "" : c->kernel,
                 same ? "" : " ", tb, c->smem);
        reason_add(o->reason, sizeof o->reason, piece);
    }
    reason_add(o->reason, sizeof o->reason, c->note);
    reason_add(o->reason, sizeof o->reason, note);
    snprintf(piece, sizeof piece, "est %.1f us %s-bound", c->t_us,
             o->bound == PLAN_BOUND_COMPUTE ? "compute" : "memory");
    reason_add(o->reason, sizeof o->reason, piece);
    x->n = 0;
    return STATUS_OK;
}

/* ---- operands and GEMM families ---- */

enum opd { OPD_BF16, OPD_FP8_ACT, OPD_FP8_W, OPD_FP4 };

/* smem bytes of a rows x k tile of operand `o` (k a multiple of 16). */
static size_t opd_tile_bytes(enum opd o, int rows, int k)
{
    size_t r = (size_t)rows, kk = (size_t)k;
    switch (o) {
    case OPD_BF16: return r * kk * 2;
    case OPD_FP8_ACT: return r * kk + r * (size_t)ceil_div(k, 128) * 4;
    case OPD_FP8_W: return r * kk + (size_t)ceil_div(rows, 128) * (size_t)ceil_div(k, 128) * 4;
    case OPD_FP4: return r * kk / 2 + r * kk / 16;
    }
    return 0;
}

/* Bytes per weight element in memory. */
static double wf_bytes(enum weight_format f)
{
    switch (f) {
    case WEIGHT_F32: return 4;
    case WEIGHT_BF16:
    case WEIGHT_F16: return 2;
    case WEIGHT_FP8_BLOCK: return 1 + 4.0 / (128 * 128);
    case WEIGHT_NVFP4: return 0.5 + 1.0 / 16;
    case WEIGHT_FORMAT_COUNT: break;
    }
    return 2;
}

enum fam_kind { FAM_MMA, FAM_WGMMA, FAM_TCGEN05, FAM_FP32 };

struct gemm_family {
    const char *moe_kernel, *linear_kernel;
    enum plan_math math;
    unsigned needs;
    enum opd a, b;
    enum fam_kind kind;
    bool fp4_act; /* needs activations quantised to fp4 (W4A4 checkpoints) */
    bool dequant; /* weight-only: B dequantised in registers */
    bool reg_a;   /* cuda_gemm_wgmma.cu: weights as wgmma's A from registers, only x in smem */
    int tk[3];    /* tile_k options, 0-terminated */
};

static const struct gemm_family FAM_NVFP4[] = {
    {.moe_kernel = "moe_gemm_nvfp4_fp4_tcgen05",
     .linear_kernel = "gemm_nvfp4_fp4_tcgen05",
     .math = PLAN_MATH_FP4_TCGEN05,
     .needs = FEAT_TCGEN05 | FEAT_TMA,
     .a = OPD_FP4,
     .b = OPD_FP4,
     .kind = FAM_TCGEN05,
     .fp4_act = true,
     .tk = {256, 128}},
    {.moe_kernel = "moe_gemm_nvfp4_fp4_mma",
     .linear_kernel = "gemm_nvfp4_fp4_mma",
     .math = PLAN_MATH_FP4_BLOCK_SCALED_MMA,
     .needs = FEAT_FP4_BS,
     .a = OPD_FP4,
     .b = OPD_FP4,
     .kind = FAM_MMA,
     .fp4_act = true,
     .tk = {128, 64}},
    {.moe_kernel = "moe_gemm_nvfp4_wo_wgmma",
     .linear_kernel = "gemm_nvfp4_wo_wgmma",
     .math = PLAN_MATH_BF16_WGMMA,
     .needs = FEAT_WGMMA | FEAT_TMA,
     .a = OPD_BF16,
     .b = OPD_FP4,
     .kind = FAM_WGMMA,
     .dequant = true,
     .reg_a = true,
     .tk = {128, 64}},
    {.moe_kernel = "moe_gemm_nvfp4_wo_mma",
     .linear_kernel = "gemm_nvfp4_wo_mma",
     .math = PLAN_MATH_BF16_MMA,
     .needs = FEAT_BF16_MMA,
     .a = OPD_BF16,
     .b = OPD_FP4,
     .kind = FAM_MMA,
     .dequant = true,
     .tk = {64, 32}},
    {.moe_kernel = "moe_gemm_nvfp4_wo_fp32",
     .linear_kernel = "gemm_nvfp4_wo_fp32",
     .math = PLAN_MATH_FP32_FMA,
     .needs = 0,
     .a = OPD_BF16,
     .b = OPD_FP4,
     .kind = FAM_FP32,
     .dequant = true,
     .tk = {32, 16}},
};

static const struct gemm_family FAM_FP8[] = {
    {.moe_kernel = "moe_gemm_fp8_wgmma",
     .linear_kernel = "gemm_fp8_wgmma",
     .math = PLAN_MATH_FP8_WGMMA,
     .needs = FEAT_WGMMA | FEAT_TMA,
     .a = OPD_FP8_ACT,
     .b = OPD_FP8_W,
     .kind = FAM_WGMMA,
     .tk = {128}},
    {.moe_kernel = "moe_gemm_fp8_mma",
     .linear_kernel = "gemm_fp8_mma",
     .math = PLAN_MATH_FP8_MMA,
     .needs = FEAT_FP8_MMA,
     .a = OPD_FP8_ACT,
     .b = OPD_FP8_W,
     .kind = FAM_MMA,
     .tk = {128, 64}},
    {.moe_kernel = "moe_gemm_fp8_wo_mma",
     .linear_kernel = "gemm_fp8_wo_mma",
     .math = PLAN_MATH_BF16_MMA,
     .needs = FEAT_BF16_MMA,
     .a = OPD_BF16,
     .b = OPD_FP8_W,
     .kind = FAM_MMA,
     .dequant = true,
     .tk = {64, 32}},
    {.moe_kernel = "moe_gemm_fp8_wo_fp32",
     .linear_kernel = "gemm_fp8_wo_fp32",
     .math = PLAN_MATH_FP32_FMA,
     .needs = 0,
     .a = OPD_BF16,
     .b = OPD_FP8_W,
     .kind = FAM_FP32,
     .dequant = true,
     .tk = {32, 16}},
};

/* bf16 linears go to cuBLAS (plan_gemm_op); these serve the experts. */
static const struct gemm_family FAM_BF16[] = {
    {.moe_kernel = "moe_gemm_bf16_tcgen05",
     .linear_kernel = NULL,
     .math = PLAN_MATH_BF16_TCGEN05,
     .needs = FEAT_TCGEN05 | FEAT_TMA,
     .a = OPD_BF16,
     .b = OPD_BF16,
     .kind = FAM_TCGEN05,
     .tk = {64}},
    {.moe_kernel = "moe_gemm_bf16_wgmma",
     .linear_kernel = NULL,
     .math = PLAN_MATH_BF16_WGMMA,
     .needs = FEAT_WGMMA | FEAT_TMA,
     .a = OPD_BF16,
     .b = OPD_BF16,
     .kind = FAM_WGMMA,
     .reg_a = true,
     .tk = {64}},
    {.moe_kernel = "moe_gemm_bf16_mma",
     .linear_kernel = NULL,
     .math = PLAN_MATH_BF16_MMA,
     .needs = FEAT_BF16_MMA,
     .a = OPD_BF16,
     .b = OPD_BF16,
     .kind = FAM_MMA,
     .tk = {64, 32}},
    {.moe_kernel = "moe_gemm_bf16_fp32",
     .linear_kernel = NULL,
     .math = PLAN_MATH_FP32_FMA,
     .needs = 0,
     .a = OPD_BF16,
     .b = OPD_BF16,
     .kind = FAM_FP32,
     .tk = {32, 16}},
};

/* A (grouped) GEMM: `groups` independent row sets of `rows` rows each (balanced routing),
 * each multiplied by every part's [n x k] weight. */
struct gemm_problem {
    int groups;
    double rows;
    int n_parts;
    int n[MAX_PARTS], k[MAX_PARTS];
    enum weight_format wf;
};

static void gemm_work(struct cand *c, const struct gemm_problem *g)
{
    for (int i = 0; i < g->n_parts; i++) {
        double n = g->n[i], k = g->k[i], rows = g->groups * g->rows;
        double wbytes = g->groups * n * k * wf_bytes(g->wf);
        double bytes = wbytes + rows * k * 2 + rows * n * 2;
        int tm = c->library ? 128 : c->tm, tn = c->library ? 128 : c->tn;
        double mt = ceil_div(g->rows, tm), nt = ceil_div(n, tn);
        double l2 = rows * k * 2 * nt + wbytes * mt;
        double flops = c->library ? 2 * rows * n * k : 2.0 * g->groups * mt * tm * nt * tn * k;
        cand_part(c, flops, bytes, l2, g->groups * mt * nt);
    }
}

/* The reg_a family's candidates: the tiles its kernel compiles for this weight format, as the
 * backend's table declares them (kernel_desc.tiles; none without a table), with the table's
 * shared-memory formula. The kernel issues two wgmmas a k16 step (x's hi and lo) and keeps only x
 * in shared memory, so the feed is x's bytes. */
static void reg_a_cands(struct plan_ctx *x, const struct gemm_family *f, bool moe,
                        const struct gemm_problem *g)
{
    const char *kernel = moe ? f->moe_kernel : f->linear_kernel;
    const struct kernel_desc *kd = x->req->kernels && kernel ? kernel_table_find(x->req->kernels, kernel) : NULL;
    const enum weight_format wf = f->b == OPD_FP4 ? WEIGHT_NVFP4 : WEIGHT_BF16;
    for (int i = 0; kd && kd->tile_smem && i < kd->n_tiles; i++) {
        const struct kernel_tile *t = &kd->tiles[i];
        if (t->format != wf)
            continue;
        struct cand *c = cand_add(x, kernel, f->math, f->needs);
        c->tm = t->m, c->tn = t->n, c->tk = t->k, c->stages = t->stages;
        c->note = f->dequant ? "weight-only: weights dequantised in registers (wgmma's A), x in smem as bf16 "
                               "hi + lo"
                             : "weights as wgmma's A from registers, x in smem as bf16 hi + lo";
        c->smem = kd->tile_smem(t);
        c->threads = 2 * t->n; /* a warpgroup of 128 threads per 64 weight rows */
        c->regs = t->m / 2 + 48 + (f->dequant ? 16 : 0);
        double kflops = 2.0 * t->m * t->n * t->k;
        c->feed = SMEM_BYTES_PER_CLK * kflops / (double)(2 * t->m * t->k * 2);
        gemm_work(c, g);
    }
}

static void gemm_family_cands(struct plan_ctx *x, const struct gemm_family *f, bool moe,
                              const struct gemm_problem *g)
{
    if (f->reg_a) {
        reg_a_cands(x, f, moe, g);
        return;
    }
    static const int TM_TC[] = {128, 64}, TN_MMA[] = {128, 64, 32}, TN_WG[] = {256, 128, 64},
                     TN_TC05[] = {256, 128}, T_FP32[] = {64, 32, 16};
    static const int ST_MMA[] = {4, 3, 2}, ST_WG[] = {5, 4, 3, 2}, ST_TC05[] = {6, 5, 4, 3, 2},
                     ST_FP32[] = {2, 1, 0};
    const int *tms, *tns, *sts;
    int ntm, ntn, nst;
    switch (f->kind) {
    case FAM_TCGEN05: tms = TM_TC, ntm = 1, tns = TN_TC05, ntn = 2, sts = ST_TC05, nst = 5; break;
    case FAM_WGMMA: tms = TM_TC, ntm = 2, tns = TN_WG, ntn = 3, sts = ST_WG, nst = 4; break;
    case FAM_MMA: tms = TM_TC, ntm = 2, tns = TN_MMA, ntn = 3, sts = ST_MMA, nst = 3; break;
    default: tms = T_FP32, ntm = 3, tns = T_FP32, ntn = 3, sts = ST_FP32, nst = 3; break;
    }
    const char *kernel = moe ? f->moe_kernel : f->linear_kernel;
    for (int a = 0; a < ntm; a++)
        for (int b = 0; b < ntn; b++)
            for (int kk = 0; kk < 3 && f->tk[kk]; kk++)
                for (int s = 0; s < nst; s++) {
                    int tm = tms[a], tn = tns[b], tk = f->tk[kk], st = sts[s];
                    struct cand *c = cand_add(x, kernel, f->math, f->needs);
                    c->tm = tm, c->tn = tn, c->tk = tk, c->stages = st;
                    c->note = f->fp4_act            ? "fp4 activations (W4A4 input scales)"
                              : f->a == OPD_FP8_ACT ? "activations quantised to fp8 per 1x128"
                              : f->dequant          ? "weight-only: weights dequantised in registers"
                                                    : NULL;
                    if (f->fp4_act && !x->w.fp4_activations)
                        c->refused = "fp4 activations need a W4A4 NVFP4 checkpoint (this one is weight-only)";
                    size_t ta = opd_tile_bytes(f->a, tm, tk), tb = opd_tile_bytes(f->b, tn, tk);
                    c->smem = (size_t)st * (ta + tb);
                    double kflops = 2.0 * tm * tn * tk;
                    switch (f->kind) {
                    case FAM_TCGEN05: /* accumulators live in tensor memory */
                        c->threads = 192;
                        c->regs = 64;
                        c->feed = SMEM_BYTES_PER_CLK * kflops / (double)(ta + tb);
                        break;
                    case FAM_WGMMA: /* one producer warpgroup + tile_m/64 consumer warpgroups */
                        c->threads = 128 * (tm / 64 + 1);
                        c->regs = tn / 2 + 48 + (f->dequant ? 16 : 0);
                        c->feed = SMEM_BYTES_PER_CLK * kflops / (double)(ta + tb);
                        break;
                    case FAM_MMA:
                        c->threads = 32 * imin(8, imax(4, tm * tn / 2048));
                        c->regs = tm * tn / c->threads + 48 + (f->dequant ? 16 : 0);
                        c->feed = SMEM_BYTES_PER_CLK * kflops / (2.0 * (double)(ta + tb));
                        break;
                    case FAM_FP32: {
                        c->threads = 256;
                        double r = sqrt(fmax(1.0, (double)tm * tn / c->threads));
                        c->regs = (int)(r * r) + 40;
                        /* per thread and k: r A values and r B values for 2 r^2 FLOP */
                        double bpe = (double)(ta + tb) / ((tm + tn) * (double)tk);
                        c->feed = SMEM_BYTES_PER_CLK * (2 * r * r) / (2 * r * bpe) * (st ? 1.0 : 0.5);
                        if (!st)
                            c->smem = 0;
                        break;
                    }
                    }
                    gemm_work(c, g);
                }
}

static const struct gemm_family *families(enum weight_format wf, int *n)
{
    switch (wf) {
    case WEIGHT_NVFP4: *n = (int)(sizeof FAM_NVFP4 / sizeof FAM_NVFP4[0]); return FAM_NVFP4;
    case WEIGHT_FP8_BLOCK: *n = (int)(sizeof FAM_FP8 / sizeof FAM_FP8[0]); return FAM_FP8;
    default: *n = (int)(sizeof FAM_BF16 / sizeof FAM_BF16[0]); return FAM_BF16;
    }
}

/* The best bf16 family a library (cuBLAS) would use on this device. */
static enum plan_math library_math(const struct device_caps *caps)
{
    if (caps->tcgen05)
        return PLAN_MATH_BF16_TCGEN05;
    if (caps->wgmma)
        return PLAN_MATH_BF16_WGMMA;
    if (caps->bf16_mma)
        return PLAN_MATH_BF16_MMA;
    return PLAN_MATH_FP32_FMA;
}

/* A weight-only NVFP4 linear through a bf16 library GEMM: each call expands the weight to bf16
 * (read 0.5625 bytes a weight, write 2, the GEMM reads 2 again) and the GEMM runs over 2 x rows
 * columns (x as bf16 hi + lo). */
static void gemm_work_expanded(struct cand *c, const struct gemm_problem *g)
{
    for (int i = 0; i < g->n_parts; i++) {
        double n = g->n[i], k = g->k[i], rows = g->groups * g->rows;
        double bytes = g->groups * n * k * (wf_bytes(g->wf) + 4) + 2 * rows * k * 2 + 2 * rows * n * 4;
        cand_part(c, 2 * 2 * rows * n * k, bytes, bytes,
                  g->groups * ceil_div(n, 128) * ceil_div(2 * rows, 128));
    }
}

/* Whether some NVFP4 family that takes fp4 activations can run here: its features on the device
 * and, where the request has a filter, a kernel the backend has. */
static bool fp4_activations_usable(const struct plan_ctx *x, bool moe)
{
    for (size_t i = 0; i < sizeof FAM_NVFP4 / sizeof FAM_NVFP4[0]; i++) {
        const struct gemm_family *f = &FAM_NVFP4[i];
        const char *kernel = moe ? f->moe_kernel : f->linear_kernel;
        if (f->fp4_act && !(f->needs & ~caps_features(x->caps)) &&
            (!x->req->kernels || kernel_table_find(x->req->kernels, kernel)) &&
            (!x->req->variant_loads || x->req->variant_loads(x->req->variant_ctx, kernel)))
            return true;
    }
    return false;
}

/* A linear op: cuBLAS for 16-bit weights, our kernels for quantised ones (weight-only NVFP4,
 * or W4A4 where no fp4-activation kernel can run: cuBLAS on a bf16 copy made per call). */
static enum status plan_gemm_op(struct plan_ctx *x, const char *op, const struct gemm_problem *g, bool moe,
                                const char *note, struct err *err)
{
    bool plain = g->wf == WEIGHT_BF16 || g->wf == WEIGHT_F16 || g->wf == WEIGHT_F32;
    if (!moe && g->wf == WEIGHT_NVFP4 && (!x->w.fp4_activations || !fp4_activations_usable(x, moe))) {
        /* Measured on the H200 (session 12, tools/decode_iter.sh, Qwen3-30B-A3B NVFP4): the whole
         * prefill 1.44x at 32 tokens, 1.68x at 128, 1.48x at 256, 1.32x at 512, 1.12x at 2048
         * against gemm_nvfp4_wo_wgmma (weights dequantised in registers, ~0.11 of the bf16 rate at
         * 2048 rows). The experts stay on our grouped GEMMs: a per-call copy of every expert would
         * cost more than their GEMM. */
        struct cand *c = cand_add(x, "cublas_dequant_bf16", library_math(x->caps), 0);
        c->library = true;
        c->portable = false;
        c->threads = 0;
        gemm_work_expanded(c, g);
        return plan_choose(x, op, g->wf,
                           x->w.fp4_activations
                               ? "W4A4 NVFP4 without an fp4-activation kernel here, so weight-only: from 9 "
                                 "rows weight expanded to bf16 per call (exact), cuBLAS on x hi + lo; H200: "
                                 "prefill 1.12-1.68x the in-register dequant GEMM"
                               : "weight-only NVFP4, from 9 rows: weight expanded to bf16 per call (exact), "
                                 "cuBLAS on x hi + lo; H200: prefill 1.12-1.68x the in-register dequant GEMM",
                           err);
    }
    if (plain && !moe) {
        const char *k = strcmp(op, "lm_head") == 0 ? "cublas_bf16" : "cublaslt_bf16";
        struct cand *c = cand_add(x, k, library_math(x->caps), 0);
        c->library = true;
        c->portable = false;
        c->threads = 0;
        gemm_work(c, g);
        return plan_choose(x, op, g->wf,
                           note ? note : "cuBLAS picks its own tiles; the smem budget does not apply", err);
    }
    int nf;
    const struct gemm_family *f = families(g->wf, &nf);
    for (int i = 0; i < nf; i++)
        gemm_family_cands(x, &f[i], moe, g);
    return plan_choose(x, op, g->wf, note, err);
}

/* ---- attention ---- */

static enum status plan_attention_prefill(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    static const int TM[] = {128, 64}, TN[] = {128, 64, 32}, TP[] = {32, 16, 8};
    int T = s->prefill_tokens, H = s->n_heads, D = s->qk_head_dim, Dv = s->v_head_dim;
    int kvh = s->mla ? H : s->n_kv_heads; /* MLA prefill materialises per-head K and V */
    double bytes = (double)T * H * D * 2 + (double)T * kvh * (D + Dv) * 2 + (double)T * H * Dv * 2;
    for (int fam = 0; fam < 3; fam++) {
        const int *tms = fam == 2 ? TP : TM, *tns = fam == 2 ? TP : TN;
        int ntm = fam == 2 ? 3 : 2, ntn = fam == 0 ? 2 : 3;
        for (int a = 0; a < ntm; a++)
            for (int b = 0; b < ntn; b++)
                for (int st = 3; st >= 0; st--) {
                    int tm = tms[a], tn = tns[b];
                    struct cand *c;
                    if (fam == 0) {
                        if (st < 2)
                            continue;
                        c = cand_add(x, "attn_prefill_wgmma_bf16", PLAN_MATH_BF16_WGMMA,
                                     FEAT_WGMMA | FEAT_TMA);
                        c->threads = 128 * (tm / 64 + 1);
                        c->regs = Dv / 2 + tn / 2 + 32;
                        c->feed = SMEM_BYTES_PER_CLK * 64; /* 64 query rows share each K/V byte read */
                    } else if (fam == 1) {
                        if (st < 1 || st > 2)
                            continue;
                        c = cand_add(x, "attn_prefill_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
                        c->threads = tm / 16 * 32;
                        c->regs = Dv / 2 + tn / 2 + D / 4 + 32;
                        c->feed = SMEM_BYTES_PER_CLK * 16; /* each warp's 16 rows */
                    } else {
                        if (st > 2)
                            continue;
                        c = cand_add(x, "attn_prefill_fp32", PLAN_MATH_FP32_FMA, 0);
                        c->threads = 128;
                        c->regs = 64;
                        c->feed = SMEM_BYTES_PER_CLK * 4 * (st ? 1.0 : 0.5);
                    }
                    c->tm = tm, c->tn = tn, c->tk = D, c->stages = st;
                    c->smem = 2 * ((size_t)tm * D + (size_t)st * tn * (D + Dv));
                    if (fam == 2)
                        c->smem = st ? c->smem + (size_t)tm * tn * 4 : 0;
                    if (fam == 1) /* cuda_attention_mma_smem(): see the formula above */
                        c->smem = 4 * ((size_t)tm * D + (size_t)st * tn * (D + Dv)) + 16 * (size_t)tm;
                    /* causal: query tile i sees keys up to its last row, whole key tiles */
                    double keys = 0;
                    for (int q0 = 0; q0 < T; q0 += tm)
                        keys += tm * ceil_div(imin(q0 + tm, T), tn) * tn;
                    double flops = 2.0 * H * (D + Dv) * keys;
                    cand_part(c, flops, bytes, flops / tm, ceil_div(T, tm) * H); /* K/V bf16 per q tile */
                }
    }
    char note[128];
    snprintf(note, sizeof note, "qk dim %d, v dim %d", D, Dv);
    return plan_choose(x, "attention_prefill", WEIGHT_BF16, note, err);
}

static int decode_splits(int sms, double base_blocks, int ctx, int tn)
{
    double want = ceil_div(2.0 * sms, base_blocks);
    double most = ceil_div(ctx, tn > 0 ? tn : 1);
    return (int)fmax(1, fmin(want, most));
}

static enum status plan_attention_decode(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    int B = s->decode_batch, ctx = s->decode_ctx, Dk = s->decode_k_dim, Dv = s->decode_v_dim;
    int kvh = s->mla ? 1 : s->n_kv_heads, g = s->n_heads / kvh;
    int dkv = s->mla ? Dk : Dk + Dv;
    static const int TM_MMA[] = {64, 32, 16}, TM_FP32[] = {16, 8, 4, 1}, TN_MMA[] = {128, 64, 32},
                     TN_FP32[] = {64, 32, 16};
    /* GQA with head_dim <= 128 and <= 16 query heads per KV head: the CUDA backend's split kernel
     * (cuda_attn_decode.cu) has one shape: the group padded to NH = 4, 8 or 16 heads, rounds of 32
     * keys (16 at NH = 16), 128 threads, static smem for scores, the warps' partial outputs and the
     * in-kernel merge; tile_m = NH, tile_n = keys per round. */
    bool split_kernel = !s->mla && g <= 16 && Dk <= 128 && Dk % 4 == 0;
    bool split_fits = false; /* then the backend runs it at every split decode: no other family */
    if (split_kernel) {
        int nh = g <= 4 ? 4 : g <= 8 ? 8 : 16, round = nh >= 16 ? 16 : 32;
        struct cand *c = cand_add(x, "attn_decode_split_fp32", PLAN_MATH_FP32_FMA, 0);
        c->threads = 128;
        c->regs = 246;
        c->tm = nh, c->tn = round, c->tk = Dk, c->stages = 1;
        c->smem = (size_t)nh * round * 4 + (size_t)nh * 5 * 4 + (size_t)4 * nh * 32 * 16 + (size_t)64 * nh * 4 + 4;
        /* with clusters the 7 other splits of a cluster push their partial outputs and (max, sum)
         * into the leader's dynamic shared memory where the budget holds them (else the leader
         * pulls them: static only); cuda_attn_decode.cu adec_push_smem */
        size_t push = x->caps->clusters ? (size_t)7 * (size_t)g * ((size_t)Dk * 4 + 8) : 0;
        if (push && c->smem + push <= x->p->smem_budget)
            c->smem += push;
        split_fits = c->smem <= x->p->smem_budget;
        c->streaming = true; /* every lane's K/V loads of a round are issued at once */
        double base = (double)B * kvh;
        c->split_k = decode_splits(x->caps->sm_count, base, ctx, round);
        double cache = (double)B * ctx * kvh * dkv * 2;
        cand_part(c, 2.0 * B * kvh * nh * (double)ctx * (Dk + Dv), cache + (double)B * s->n_heads * (Dk + Dv) * 4,
                  cache, base * c->split_k);
    }
    /* fam 0 (bf16 mma tiles) only where the split kernel does not take the shape: the backend
     * has no tensor-core split decode kernel for GQA, and at splits == 1 (many sequences) it runs
     * attention_prefill's kernel; listing it beside the split kernel made the plan name a kernel
     * that never ran at decode (sessions 3-8) */
    for (int fam = split_fits ? 1 : 0; fam < 2; fam++) {
        const int *tms = fam ? TM_FP32 : TM_MMA, *tns = fam ? TN_FP32 : TN_MMA;
        int ntm = fam ? 4 : 3;
        for (int a = 0; a < ntm; a++) {
            /* no taller tile than the head group needs: mma rows come in 16s, fp32 rows are clipped */
            int tm = fam ? imin(tms[a], g) : tms[a];
            if (!fam && tm > 16 && tm >= 2 * g)
                continue;
            if (fam && a > 0 && tm == imin(tms[a - 1], g))
                continue;
            for (int b = 0; b < 3; b++)
                for (int st = 4; st >= 0; st--) {
                    int tn = tns[b];
                    struct cand *c;
                    if (!fam) {
                        if (st < 2)
                            continue;
                        c = cand_add(x, "attn_decode_split_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
                        c->threads = 128;
                        c->regs = tm * Dv / c->threads + tm * tn / c->threads + 40;
                    } else {
                        /* with the split kernel above, only the unstaged form stays: what a budget
                         * too small for the kernel's shared memory still runs */
                        if (st > 2 || (split_kernel && st > 0))
                            continue;
                        c = cand_add(x, "attn_decode_split_fp32", PLAN_MATH_FP32_FMA, 0);
                        c->threads = 128;
                        c->regs = 64;
                    }
                    c->tm = tm, c->tn = tn, c->tk = Dk, c->stages = st;
                    c->smem = 2 * ((size_t)tm * Dk + (size_t)st * tn * dkv);
                    if (fam && !st)
                        c->smem = 0;
                    double intensity = (double)tm * (Dk + Dv) / dkv; /* FLOP per cached byte x 2 */
                    c->feed = SMEM_BYTES_PER_CLK * intensity * (st ? 1.0 : 0.5);
                    double head_blocks = ceil_div(g, tm), base = (double)B * kvh * head_blocks;
                    c->split_k = decode_splits(x->caps->sm_count, base, ctx, tn);
                    double flops = 2.0 * B * kvh * head_blocks * tm * (double)ctx * (Dk + Dv);
                    double cache = (double)B * ctx * kvh * dkv * 2;
                    double bytes = cache + (double)B * s->n_heads * (Dk + Dv) * 2 * 2;
                    cand_part(c, flops, bytes, cache * head_blocks, base * c->split_k);
                }
        }
    }
    char note[256];
    snprintf(note, sizeof note, "%d query heads per kv head, k dim %d, v dim %d; split-K over %d keys%s", g,
             Dk, Dv, ctx,
             split_kernel && x->caps->clusters
                 ? "; splits merged 8 at a time in a cluster's shared memory (pushed "
                   "to the cluster's first block where the budget holds them)"
                 : "");
    return plan_choose(x, "attention_decode", WEIGHT_BF16, note, err);
}

int plan_decode_splits(const struct plan *p, int n_seqs, int max_ctx)
{
    const struct op_plan *o = plan_find(p, "attention_decode");
    if (!o || o->tile_m <= 0 || n_seqs <= 0)
        return 1;
    const struct plan_shapes *s = &p->shapes;
    int kvh = s->mla ? 1 : s->n_kv_heads, g = s->n_heads / (kvh > 0 ? kvh : 1);
    double base = (double)n_seqs * kvh * ceil_div(g, o->tile_m);
    return decode_splits(p->caps.sm_count, base, max_ctx, o->tile_n);
}

/* Pair by pair re-reads an expert for each of its pairs, the sorted GEMM reads it once but pads
 * each expert's rows to a tile and sorts first. H200, Qwen3-30B-A3B NVFP4 (128 experts, top-8),
 * session 13, pair kernels up to 32 tokens against the grouped GEMMs from 9: batch 9 864.7 vs
 * 529.9 tok/s, 16 1046.0 vs 773.8, 32 (2 pairs an expert) 1225.3 vs 1201.1. */
int plan_moe_pair_max_tokens(int n_experts, int n_used)
{
    int t = n_used > 0 ? 2 * n_experts / n_used : 8;
    return t >= 64 ? 64 : t >= 32 ? 32 : 8;
}

/* ---- MLA + DSA (glm_moe_dsa) ---- */

/* GLM-5's dims stand in when the plan has no MLA model (a backend plans before it knows
 * the model; its kernels fit the tile to the real dims at launch). */
struct mla_ref {
    int heads, kv_rank, rope, idx_heads, idx_dim, topk;
};

static void mla_ref_dims(const struct plan_ctx *x, struct mla_ref *r)
{
    const struct plan_shapes *s = &x->p->shapes;
    *r = (struct mla_ref){.heads = 64, .kv_rank = 512, .rope = 64, .idx_heads = 32, .idx_dim = 128, .topk = 2048};
    if (x->req->shapes && s->mla) {
        r->heads = s->n_heads, r->kv_rank = s->kv_lora_rank, r->rope = s->qk_rope_dim;
        r->idx_heads = s->index_n_heads, r->idx_dim = s->index_head_dim, r->topk = s->index_topk;
    }
}

size_t plan_mla_attention_smem(int rows, int keys, int threads, int k_dim, int v_dim, int stages)
{
    size_t warps = (size_t)(threads / 32), r = (size_t)rows, k = (size_t)keys;
    if (stages <= 0) /* queries, keys and the accumulators stay in global memory: scores and key slots */
        return 4 * (warps * k + 2 * r + k);
    return 4 * (r * (size_t)(k_dim + v_dim) + k * (size_t)(k_dim + 1) + warps * k + 2 * r);
}

size_t plan_dsa_index_smem(int keys, int idx_heads, int idx_dim, int stages)
{
    if (stages <= 0)
        return 0;
    return 4 * ((size_t)idx_heads * (size_t)idx_dim + (size_t)idx_heads + (size_t)keys * (size_t)(idx_dim + 1));
}

/* mla_attention: attention in latent space over the cached [c_kv | k_r] rows (the query
 * absorbed through W_uk, values = the c_kv part of the same rows): one token's tile_m heads
 * per block share every staged key; split-K over the selected keys. dsa_index: the indexer's
 * scores, one key per thread (tile_n keys per block), then a radix top-k per query. */
static enum status plan_mla_dsa(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    if (x->req->shapes && !s->mla)
        return STATUS_OK;
    struct mla_ref r;
    mla_ref_dims(x, &r);
    int Dk = r.kv_rank + r.rope, R = r.kv_rank, B = s->decode_batch;
    int keys_q = imin(s->decode_ctx, r.topk); /* keys each decode query attends to */
    static const int TM[] = {64, 32, 16, 8, 4, 2, 1}, TN[] = {64, 32, 16, 8};
    for (int a = 0; a < 7; a++) {
        int tm = imin(TM[a], r.heads);
        if (a > 0 && tm == imin(TM[a - 1], r.heads))
            continue;
        for (int b = 0; b < 4; b++)
            for (int st = 1; st >= 0; st--) {
                int tn = TN[b];
                struct cand *c = cand_add(x, "mla_latent_attn_fp32", PLAN_MATH_FP32_FMA, 0);
                c->threads = 128;
                c->regs = 64;
                c->tm = tm, c->tn = tn, c->tk = Dk, c->stages = st;
                c->smem = plan_mla_attention_smem(tm, tn, c->threads, Dk, R, st);
                /* each staged key serves tm heads; unstaged, every operand comes through L1 */
                c->feed = SMEM_BYTES_PER_CLK * 4 * tm / (double)(tm + 1) * (st ? 1.0 : 0.5);
                double head_blocks = ceil_div(r.heads, tm), base = (double)B * head_blocks;
                c->split_k = decode_splits(x->caps->sm_count, base, keys_q, tn);
                double flops = 2.0 * B * r.heads * (double)keys_q * (Dk + R);
                double cache = (double)B * keys_q * Dk * 4;
                cand_part(c, flops, cache + (double)B * r.heads * (Dk + R) * 4, cache * head_blocks,
                          base * c->split_k);
            }
    }
    char note[192];
    snprintf(note, sizeof note, "%d heads on one latent row of %d (values: its first %d); %d keys per query", r.heads,
             Dk, R, keys_q);
    enum status st = plan_choose(x, "mla_attention", WEIGHT_BF16, note, err);
    if (st)
        return st;

    static const int KN[] = {512, 256, 128, 64, 32};
    double T = s->prefill_tokens, ctx = s->decode_ctx;
    for (int b = 0; b < 10; b++) {
        int st = b < 5 ? 1 : 0;
        struct cand *c = cand_add(x, "dsa_index_score_fp32", PLAN_MATH_FP32_FMA, 0);
        c->threads = KN[b % 5];
        c->regs = 48;
        c->tm = 1, c->tn = KN[b % 5], c->tk = r.idx_dim, c->stages = st;
        c->smem = plan_dsa_index_smem(c->tn, r.idx_heads, r.idx_dim, st);
        /* q broadcast + the thread's own key: ~2 FLOP per smem byte; unstaged through L1 */
        c->feed = SMEM_BYTES_PER_CLK * (st ? 2.0 : 1.0);
        /* prefill: every query scores its causal keys (half the square on average) */
        double pairs = T * ctx / 2;
        double flops = 2.0 * pairs * r.idx_heads * r.idx_dim;
        cand_part(c, flops, ctx * r.idx_dim * 4 + T * ctx * 4, pairs * r.idx_dim * 4 / c->tn,
                  T * ceil_div(ctx / 2, c->tn));
    }
    snprintf(note, sizeof note, "%d indexer heads x %d dims; radix top-%d per query (1024 threads, 1 KiB smem)",
             r.idx_heads, r.idx_dim, r.topk);
    return plan_choose(x, "dsa_index", WEIGHT_BF16, note, err);
}

/* ---- the small ops: one or a few variants each, all memory-bound ---- */

static int row_threads(int width)
{
    int t = (width / 8 + 31) / 32 * 32;
    return imax(32, imin(MAX_THREADS_PER_BLOCK, t));
}

static struct cand *simple(struct plan_ctx *x, const char *kernel, int tm, int tn, int tk, int threads,
                           size_t smem, double flops, double bytes, double blocks)
{
    struct cand *c = cand_add(x, kernel, PLAN_MATH_FP32_FMA, 0);
    c->portable = false; /* not a fallback: these ops have no tensor-core form */
    c->tm = tm, c->tn = tn, c->tk = tk, c->threads = threads, c->regs = 48, c->smem = smem;
    c->stages = 0;
    c->streaming = true;
    cand_part(c, flops, bytes, 0, blocks);
    return c;
}

static enum status plan_front(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    double T = s->prefill_tokens, d = s->d_model;
    enum status st;
    simple(x, "embedding_gather_bf16", 1, s->d_model, 1, row_threads(s->d_model), 0, 0, T * d * 4, T);
    if ((st = plan_choose(x, "embedding", WEIGHT_BF16, "one token row per block", err)))
        return st;

    /* warp per row while the row (x and residual) fits in registers; else block per row */
    struct cand *c =
        simple(x, "rmsnorm_residual_warp", 8, s->d_model, 1, 256, 0, T * d * 4, T * d * 8, T / 8);
    c->regs = 2 * s->d_model / 32 + 24;
    int bt = row_threads(s->d_model);
    simple(x, "rmsnorm_residual_block", 1, s->d_model, 1, bt, (size_t)(bt / 32) * 4, T * d * 4, T * d * 8, T);
    return plan_choose(x, "rmsnorm", WEIGHT_BF16, "residual add fused", err);
}

static enum status plan_rope_kv(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    double T = s->prefill_tokens;
    enum status st;
    int heads = s->mla ? s->n_heads + 1 : s->n_heads + s->n_kv_heads;
    int hd = s->mla ? s->qk_head_dim : s->head_dim;
    const char *k = s->mla ? "rope_mla_bf16" : x->qk_norm ? "rope_qk_norm_bf16" : "rope_bf16";
    simple(x, k, 1, heads, hd, imin(MAX_THREADS_PER_BLOCK, 32 * heads), (size_t)hd / 2 * 4,
           T * heads * hd * 8, T * heads * hd * 4, T);
    const char *note = s->mla       ? "rope on the q/k rope dims"
                       : x->qk_norm ? "per-head q/k RMSNorm fused"
                                    : "no q/k norm";
    if ((st = plan_choose(x, "rope_qk_norm", WEIGHT_BF16, note, err)))
        return st;

    int kv_w = s->mla ? s->decode_k_dim : s->n_kv_heads * 2 * s->head_dim;
    simple(x, "kv_cache_write_bf16", 1, kv_w, 1, row_threads(kv_w), 0, 0, T * kv_w * 4, T);
    return plan_choose(x, "kv_cache_write", WEIGHT_BF16, s->mla ? "latent + rope key" : "paged, bf16", err);
}

static enum status plan_moe(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    double T = s->prefill_tokens, E = s->n_experts, k = s->n_experts_used;
    enum status st;
    const char *rk =
        x->shapes_router_sigmoid ? "moe_route_sigmoid_grouped_topk" : "moe_route_softmax_topk";
    static const int TOK[] = {8, 4, 1};
    for (int i = 0; i < 3; i++)
        simple(x, rk, TOK[i], s->n_experts, s->n_experts_used, 32 * TOK[i], (size_t)TOK[i] * s->n_experts * 4,
               T * E * 8, T * E * 4 + T * k * 8, ceil_div(T, TOK[i]));
    /* cuda_moe_route.cu; with clusters cuda_router_route.cu's cluster form from 2 tokens */
    const char *route_note = x->caps->clusters
                                 ? "a block per token counting ranks, logits from a bf16 GEMM; 2-8 "
                                   "decode tokens: norm + router + routing in one cluster per token"
                                 : "one warp per token (<= 256 tokens and experts: a block per token "
                                   "that counts each expert's rank); router logits come from a bf16 "
                                   "GEMM";
    if ((st = plan_choose(x, "moe_route", WEIGHT_BF16, route_note, err)))
        return st;

    /* The GEMM decides the padding, so it is planned first and moe_align slotted before it. */
    struct gemm_problem g = {.groups = s->n_experts, .rows = T * k / E, .n_parts = 2, .wf = x->w.experts};
    g.n[0] = 2 * s->d_expert, g.k[0] = s->d_model; /* gate_up */
    g.n[1] = s->d_model, g.k[1] = s->d_expert;     /* down */
    int align_at = x->p->n_ops;
    x->p->n_ops++; /* reserved */
    if ((st = plan_gemm_op(x, "moe_experts_gemm", &g, true, NULL, err)))
        return st;
    struct op_plan gemm = x->p->ops[x->p->n_ops - 1];
    x->p->n_ops -= 2;
    simple(x, "moe_align_count_sort", gemm.tile_m, s->n_experts, 1, 1024, ((size_t)s->n_experts + 1) * 4 * 2,
           0, T * k * 4 * 3, 1);
    char note[96];
    snprintf(note, sizeof note, "pads each expert's rows to moe_experts_gemm tile_m = %d", gemm.tile_m);
    if ((st = plan_choose(x, "moe_align", WEIGHT_BF16, note, err)))
        return st;
    ASSERT(x->p->n_ops == align_at + 1);
    x->p->ops[x->p->n_ops++] = gemm;

    double rows = T * k;
    simple(x, "moe_silu_mul_bf16", 4, s->d_expert, 1, 256, 0, rows * s->d_expert * 4, rows * s->d_expert * 6,
           rows / 4);
    return plan_choose(x, "moe_silu_mul", WEIGHT_BF16, "separate pass over the gate_up output", err);
}

static enum status plan_linear(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    struct gemm_problem g = {.groups = 1, .rows = s->prefill_tokens, .wf = x->w.attn};
    int H = s->n_heads;
    if (s->mla) {
        int q_lora = s->q_lora_rank, kv_lora = s->kv_lora_rank;
        int nope = s->qk_nope_dim, rope = s->qk_rope_dim;
        int i = 0;
        if (q_lora > 0) {
            g.n[i] = q_lora, g.k[i++] = s->d_model;
            g.n[i] = H * (nope + rope), g.k[i++] = q_lora;
        } else {
            g.n[i] = H * (nope + rope), g.k[i++] = s->d_model;
        }
        g.n[i] = kv_lora + rope, g.k[i++] = s->d_model;
        g.n[i] = H * (nope + s->v_head_dim), g.k[i++] = kv_lora;
        g.n[i] = s->d_model, g.k[i++] = H * s->v_head_dim;
        g.n_parts = i;
    } else {
        g.n[0] = (H + 2 * s->n_kv_heads) * s->head_dim, g.k[0] = s->d_model; /* qkv */
        g.n[1] = s->d_model, g.k[1] = H * s->head_dim;                       /* o */
        g.n_parts = 2;
    }
    return plan_gemm_op(x, "linear", &g, false, NULL, err);
}

static enum status plan_linear_ffn(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    if (s->d_ff <= 0)
        return STATUS_OK;
    struct gemm_problem f = {.groups = 1, .rows = s->prefill_tokens, .n_parts = 2, .wf = x->w.ffn};
    f.n[0] = 2 * s->d_ff, f.k[0] = s->d_model;
    f.n[1] = s->d_model, f.k[1] = s->d_ff;
    return plan_gemm_op(x, "linear_ffn", &f, false, NULL, err);
}

static enum status plan_tail(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    enum status st;
    struct gemm_problem g = {.groups = 1, .rows = s->decode_batch, .n_parts = 1, .wf = x->w.lm_head};
    g.n[0] = s->vocab, g.k[0] = s->d_model;
    if ((st = plan_gemm_op(x, "lm_head", &g, false, NULL, err)))
        return st;
    double B = s->decode_batch, V = s->vocab;
    static const int CANDS[] = {1024, 512, 256};
    for (int i = 0; i < 3; i++)
        simple(x, "sample_topk_topp", 1, CANDS[i], 1, 1024, (size_t)CANDS[i] * 8 + 32 * 8, B * V * 4,
               B * V * 4 * 2, B);
    if ((st = plan_choose(x, "sample", WEIGHT_BF16, "one row per block; tile_n = top-k candidates kept in smem",
                          err)))
        return st;
    /* greedy decoding: a block per 8192 logits of a row (tile_n), each thread's 8 float4 loads
     * issued at once, the row's last block reducing the partials in order. One block a row
     * took 64 us on the H200 for a 151936 vocab (a chain of ~150 loads a thread); 19 blocks
     * take 6.4 us (session 5). */
    double slices = ceil_div(V, 8192);
    simple(x, "argmax_split", 1, 8192, 1, 256, 0, B * V, B * V * 4, B * slices);
    return plan_choose(x, "argmax", WEIGHT_BF16, "greedy decoding: rows split over blocks, the last block of a "
                       "row reduces the partials", err);
}

/* ---- decode at batch 1 (cuda_decode.cu): what runs when a step has one or a few tokens ---- */

/* The GEMV every linear takes at one token (q/k/v in one launch, o, router, lm_head): x (K
 * floats) staged once per block in shared memory, R weight rows per warp with every load issued
 * first. R = 2 below 16384 rows, 4 above (measured on the H200, NOTES.md session 3); tile_m = R,
 * tile_k = the widest K. Without room for x the tiled fp32 GEMM serves one row. */
static enum status plan_decode(struct plan_ctx *x, struct err *err)
{
    const struct plan_shapes *s = &x->p->shapes;
    int H = s->n_heads, kq = s->mla ? s->d_model : H * s->head_dim;
    int K = s->d_model > kq ? s->d_model : kq;
    double qkv = s->mla ? 0 : (double)(H + 2 * s->n_kv_heads) * s->head_dim * s->d_model;
    double params = qkv + (double)s->d_model * kq + (double)s->vocab * s->d_model;
    double bytes = (qkv + (double)s->d_model * kq) * wf_bytes(x->w.attn) + (double)s->vocab * s->d_model * wf_bytes(x->w.lm_head);
    int rows_qkv = s->mla ? s->d_model : (H + 2 * s->n_kv_heads) * s->head_dim;
    struct cand *c = simple(x, "gemv_x_smem", rows_qkv >= 16384 ? 4 : 2, 1, K, 256, (size_t)K * 4 + 1024,
                            2 * params, bytes, ceil_div(rows_qkv, 16));
    c->regs = 128;
    if (x->w.attn == WEIGHT_NVFP4 && s->d_model % 128 == 0 && kq % 128 == 0) {
        /* cuda_decode_mma.cu gemv_mma: a warp's 8 weight rows as the mma B operand, x hi/lo as A
         * (the MoE decode kernels' pieces), K split over the block's warps until every SM has a
         * block; the first weight groups loaded before the PDL wait. After the wait the CUDA-core
         * GEMV is bound by instruction issue (~5 a weight), this one needs ~2.5: measured on the
         * H200 (session 7) 380.9 vs 348.3 tok/s at batch 1. The backend also runs NVFP4 linears
         * of 2-8 rows through it (the rows share each mma, x staged per row: rows x K x 4 bytes
         * where that fits, else the tiled GEMM): session 8, batch 8 906.8 vs 750.3 tok/s. */
        c = cand_add(x, "gemv_decode_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
        c->portable = false;
        c->tm = 1, c->tn = 8, c->tk = 32, c->threads = 256, c->regs = 128, c->stages = 0;
        c->smem = (size_t)K * 4;
        c->streaming = true;
        cand_part(c, 16.0 / 2 * params, bytes, 0, ceil_div(rows_qkv, 8));
        /* cuda_dec16.cu (a second copy of the dense weights laid out for a one-token GEMV) is
         * not a candidate: faster alone (tools/bench_dot.cu) but not in a step (H200, session
         * 10: 405.1 / 407.3 vs 412.0 / 409.3 tok/s), since this kernel's weights are already
         * loaded before its PDL wait; the backend runs it only with MOESERVE_DEC16=1. */
    }
    c = simple(x, "gemm_fp32_tiled", 16, 64, 32, 256, 0, 2 * params, bytes, ceil_div(rows_qkv, 64));
    c->portable = true;
    /* programmatic dependent launch (caps "pdl"): the next kernel's blocks start once this one's
     * arithmetic is done and load their weights while it drains (measured +6% at batch 1) */
    const char *pdl = x->p->caps.pdl ? "; PDL: next kernel starts early" : "; no PDL on this device";
    char note[256];
    snprintf(note, sizeof note,
             "one token: every weight read once; x (K = %d floats) staged in smem, all loads issued "
             "first%s", K, pdl);
    enum status st = plan_choose(x, "linear_decode", x->w.attn, note, err);
    if (st || s->n_experts <= 0)
        return st;
    /* MoE at few tokens: each (token, slot) pair streams its expert, no sort; gate/up stage x (D
     * floats), down stages the 8 warps' activations (8 x I floats). tile_m = gate/up rows per warp,
     * tile_n = down rows per warp (2 and 4: more spill at two blocks per SM). */
    size_t smem = (size_t)(s->d_model > 8 * s->d_expert ? s->d_model : 8 * s->d_expert) * 4 + 2048;
    double k = s->n_experts_used, eb = wf_bytes(x->w.experts) * 3.0 * s->d_model * s->d_expert;
    c = simple(x, "moe_pair_decode", 2, 4, s->d_model, 256, smem, 6.0 * k * s->d_model * s->d_expert, k * eb,
               k * ceil_div(s->d_expert, 16));
    c->regs = 124;
    if (x->w.experts == WEIGHT_NVFP4 && s->d_model % 128 == 0 && s->d_expert % 128 == 0) {
        /* cuda_decode_mma.cu: a warp's 8 weight rows as the mma B operand, x hi/lo as A; the
         * lanes only build bf16 pairs (~2.4 instead of ~4.6 instructions a weight). Measured on
         * the H200 (session 4): batch 1 330.7 vs 324.4 tok/s, batch 8 695.2 vs 628.4. Tile:
         * 8 rows a warp (tile_n), gate/up 4 + 4 (tile_m), k 32 a lane step; 8 groups of 128 k
         * in flight per warp (session 5: 335.8 vs 325.7 tok/s with 4), x asked for before the
         * weights (session 6: 368.4 tok/s), hence up to 127 registers (down). */
        c = cand_add(x, "moe_pair_decode_mma_bf16", PLAN_MATH_BF16_MMA, FEAT_BF16_MMA);
        c->portable = false;
        c->tm = 4, c->tn = 8, c->tk = 32, c->threads = 256, c->regs = 127, c->stages = 0;
        c->smem = (size_t)(s->d_model > 8 * s->d_expert ? s->d_model : 8 * s->d_expert) * 4;
        /* From 2 tokens the backend runs the form whose weights go through shared memory where
         * it fits the budget (cuda_moe_decode_mma_smem_supported): gate/up x plus 4 warps x
         * D / 128 groups of 576 bytes; down 8 warps' act plus 8 warps x tpw 8-row tiles of
         * I / 128 groups, tpw 2 where D / 8 rows exceed the SMs (one block an SM), plus its
         * ~5.4 KB of static arrays. That form's bytes are what the op needs then. */
        const int tpw = ceil_div(s->d_model, 8) > x->caps->sm_count ? 2 : 1;
        const size_t gu = (size_t)s->d_model * 4 + 4 * (size_t)(s->d_model / 128) * 576,
                     dn = (size_t)8 * s->d_expert * 4 + 8 * (size_t)tpw * (size_t)(s->d_expert / 128) * 576 +
                          5376;
        const size_t sm = gu > dn ? gu : dn;
        if (sm + 1024 <= x->p->smem_budget) {
            c->smem = sm > c->smem ? sm : c->smem;
            c->regs = 75;
        }
        c->streaming = true;
        /* 16 flops a weight on the tensor core (n = 8 columns, 2 of them used); the lanes' work
         * counted as fp32 flops would overstate it: the bytes decide */
        cand_part(c, 16.0 / 2 * k * 3.0 * s->d_model * s->d_expert, k * eb, 0, k * ceil_div(s->d_expert, 4));
    }
    c = simple(x, "moe_experts_gemm_sorted", 16, 64, 32, 256, 0, 6.0 * k * s->d_model * s->d_expert, k * eb,
               k * ceil_div(s->d_expert, 64));
    c->portable = true;
    /* from 2 tokens the backend's NVFP4 pair kernels copy their weights into shared memory
     * (cp.async) instead of registers: more blocks resident (session 9, H200: batch 8 933.5 vs
     * 898.9 tok/s; slower at batch 1) */
    snprintf(note, sizeof note,
             "<= %d tokens (2 pairs an expert): each (token, expert) pair streams its rows, no sort; "
             "routing one warp per token; %.1f MB of experts per token and layer; from 2 tokens NVFP4 "
             "weights via shared memory (cp.async)%s",
             plan_moe_pair_max_tokens(s->n_experts, s->n_experts_used), k * eb / 1e6, pdl);
    return plan_choose(x, "moe_experts_decode", x->w.experts, note, err);
}

/* ---- shapes, weights, entry points ---- */

static void shapes_default(struct plan_shapes *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "default (Qwen3-30B-A3B-like)");
    s->d_model = 2048, s->vocab = 151936;
    s->n_heads = 32, s->n_kv_heads = 4, s->head_dim = 128;
    s->n_experts = 128, s->n_experts_used = 8, s->d_expert = 768;
}

/* A model's shapes (model/model_plan.c fills them) as the planner needs them. */
static enum status shapes_check(const struct plan_shapes *s, struct err *err)
{
    if (s->d_model <= 0 || s->n_heads <= 0 || s->vocab <= 0)
        return err_set(err, STATUS_INVALID, "plan: shapes of %s lack heads, width or vocab", s->source);
    if (!s->mla && (s->head_dim <= 0 || s->n_kv_heads <= 0 || s->n_heads % s->n_kv_heads))
        return err_set(err, STATUS_INVALID, "plan: shapes of %s: head_dim %d, %d heads over %d kv heads", s->source,
                       s->head_dim, s->n_heads, s->n_kv_heads);
    if (s->n_experts > 0 && (s->n_experts_used <= 0 || s->d_expert <= 0))
        return err_set(err, STATUS_INVALID, "plan: shapes of %s: %d experts with top-%d of width %d", s->source,
                       s->n_experts, s->n_experts_used, s->d_expert);
    if (s->mla && (s->kv_lora_rank <= 0 || s->qk_rope_dim <= 0 || s->v_head_dim <= 0))
        return err_set(err, STATUS_INVALID, "plan: shapes of %s: MLA without kv_lora_rank/rope/v dims", s->source);
    return STATUS_OK;
}

static void shapes_finish(struct plan_shapes *s)
{
    if (s->mla) {
        s->qk_head_dim = s->qk_nope_dim + s->qk_rope_dim;
        s->decode_k_dim = s->kv_lora_rank + s->qk_rope_dim;
        s->decode_v_dim = s->kv_lora_rank;
    } else {
        s->qk_head_dim = s->v_head_dim = s->head_dim;
        s->decode_k_dim = s->decode_v_dim = s->head_dim;
    }
    s->prefill_tokens = REF_PREFILL_TOKENS;
    s->decode_batch = REF_DECODE_BATCH;
    s->decode_ctx = REF_DECODE_CTX;
}

void plan_weights_default(struct plan_weights *w, enum weight_format f, bool fp4_activations)
{
    w->experts = w->attn = w->ffn = f;
    w->lm_head = WEIGHT_BF16;
    w->fp4_activations = f == WEIGHT_NVFP4 && fp4_activations;
}

enum status plan_build(struct plan *p, const struct device_caps *caps, const struct plan_shapes *shapes,
                       size_t smem_budget, struct err *err)
{
    struct plan_request req = {.shapes = shapes, .smem_budget = smem_budget};
    return plan_build_request(p, caps, &req, err);
}

enum status plan_build_request(struct plan *p, const struct device_caps *caps, const struct plan_request *req,
                               struct err *err)
{
    memset(p, 0, sizeof *p);
    if (!caps || caps->sm_count <= 0 || !caps->smem_per_block_optin)
        return err_set(err, STATUS_INVALID,
                       "plan: device caps \"%s\" lack an SM count or a shared-memory size",
                       caps ? caps->name : "(null)");
    p->caps = *caps;
    struct plan_ctx x = {.caps = &p->caps, .req = req, .p = p, .qk_norm = true};
    if (req->weights)
        x.w = *req->weights;
    else
        plan_weights_default(&x.w, WEIGHT_BF16, false);
    p->weights = x.w;
    enum status st;
    if (req->shapes) {
        if ((st = shapes_check(req->shapes, err)))
            return st;
        p->shapes = *req->shapes;
        x.qk_norm = req->shapes->qk_norm;
        x.shapes_router_sigmoid = req->shapes->router_sigmoid;
    } else {
        shapes_default(&p->shapes);
    }
    if (req->model_name)
        snprintf(p->shapes.source, sizeof p->shapes.source, "%s", req->model_name);
    shapes_finish(&p->shapes);

    p->smem_budget = caps->smem_per_block_optin;
    if (req->smem_budget && req->smem_budget < p->smem_budget)
        p->smem_budget = req->smem_budget;
    if (!caps->known_cc) {
        char w[256];
        plan_caps_table_warning(caps, w, sizeof w);
        plan_warn(p, "%s (%s): %s", caps->name, caps->source, w[0] ? w : "not in the capability table");
    }
    if (req->smem_budget > caps->smem_per_block_optin)
        plan_warn(p, "smem budget %zu B is above the device's %zu B per block: using %zu B", req->smem_budget,
                  caps->smem_per_block_optin, p->smem_budget);

    x.c = malloc(sizeof *x.c * MAX_CANDS);
    if (!x.c)
        return err_set(err, STATUS_NOMEM, "plan: out of memory for candidates");
    /* forward order */
    if (!(st = plan_front(&x, err)) && !(st = plan_linear(&x, err)) && !(st = plan_rope_kv(&x, err)) &&
        !(st = plan_attention_prefill(&x, err)) && !(st = plan_attention_decode(&x, err)) &&
        !(st = plan_mla_dsa(&x, err)) &&
        !(st = plan_linear_ffn(&x, err)) && !(p->shapes.n_experts > 0 && (st = plan_moe(&x, err))) &&
        !(st = plan_decode(&x, err)))
        st = plan_tail(&x, err);
    free(x.c);
    if (st || (st = plan_dispatch_fill(p, req, err)))
        return st;
    if (x.fallbacks[0])
        plan_warn(p, "portable fallback (no tensor-core variant eligible within %zu B of smem): %s",
                  p->smem_budget, x.fallbacks);
    return STATUS_OK;
}

const struct op_plan *plan_find(const struct plan *p, const char *op)
{
    for (int i = 0; i < p->n_ops; i++)
        if (strcmp(p->ops[i].op, op) == 0)
            return &p->ops[i];
    return NULL;
}
