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
#include "plan/plan_internal.h"

/* ---- small helpers ---- */




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

unsigned pl_caps_features(const struct device_caps *c)
{
    return (c->bf16_mma ? FEAT_BF16_MMA : 0) | (c->fp8_mma ? FEAT_FP8_MMA : 0) | (c->wgmma ? FEAT_WGMMA : 0) |
           (c->tcgen05 ? FEAT_TCGEN05 : 0) | (c->fp4_mma_block_scaled ? FEAT_FP4_BS : 0) |
           (c->tma ? FEAT_TMA : 0);
}

double pl_caps_clock_hz(const struct device_caps *c)
{
    return (c->sm_clock_ghz > 0 ? c->sm_clock_ghz : 1.5) * 1e9; /* 1.5 GHz when nobody said */
}

double pl_caps_bw(const struct device_caps *c)
{
    return (c->mem_bw_gbs > 0 ? c->mem_bw_gbs : 1000.0) * 1e9;
}

double pl_caps_rate_clk(const struct device_caps *c, enum plan_math m)
{
    double r = c->flops_per_clk_sm[m];
    if (r <= 0 && m == PLAN_MATH_FP32_FMA)
        r = 128; /* caps built by hand without the table */
    return r;
}

struct cand *pl_cand_add(struct plan_ctx *x, const char *kernel, enum plan_math math, unsigned needs)
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

void pl_cand_part(struct cand *c, double flops, double bytes, double l2_bytes, double blocks)
{
    ASSERT(c->n_parts < MAX_PARTS);
    c->part[c->n_parts++] = (struct work){flops, bytes, l2_bytes, blocks > 0 ? blocks : 1};
}

/* ---- the chooser ---- */

static void cand_cost(const struct plan_ctx *x, struct cand *c)
{
    const struct device_caps *caps = x->caps;
    double sms = caps->sm_count, rate = pl_caps_rate_clk(caps, c->math);
    if (c->feed > 0 && c->feed < rate)
        rate = c->feed;
    rate *= sms * pl_caps_clock_hz(caps);
    double l2_rate = sms * L2_BYTES_PER_CLK * pl_caps_clock_hz(caps);
    bool overlap = c->library || c->streaming || c->stages >= 2;
    c->t_us = c->t_cmp_us = c->t_mem_us = 0;
    for (int i = 0; i < c->n_parts; i++) {
        const struct work *w = &c->part[i];
        double waves = ceil_div(w->blocks, sms);
        double p = w->blocks / (waves * sms);
        double pm = w->blocks < sms ? w->blocks / sms : 1.0;
        double tc = w->flops / (rate * p);
        double tm = fmax(w->bytes / (pl_caps_bw(caps) * pm), w->l2_bytes / (l2_rate * p));
        c->t_cmp_us += tc * 1e6;
        c->t_mem_us += tm * 1e6;
        c->t_us += (overlap ? fmax(tc, tm) : tc + tm) * 1e6;
    }
}

static enum drop cand_check(const struct plan_ctx *x, const struct cand *c, size_t budget)
{
    if (c->needs & ~pl_caps_features(x->caps))
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
        case DROP_FEATURE: missing |= c->needs & ~pl_caps_features(x->caps); break;
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
enum status pl_choose(struct plan_ctx *x, const char *op, enum weight_format wf, const char *note,
                               struct err *err)
{
    struct plan *p = x->p;
    size_t budget = p->smem_budget;
    if (p->n_ops >= PLAN_MAX_OPS)
        PANIC("planner: more than %d ops", PLAN_MAX_OPS);
    /* a portable choice is a fallback where the op has tensor-core variants and none of them could
     * run; one that ran and lost on cost is the cost model's choice, not a fallback */
    bool any_fast = false, fast_eligible = false;
    for (int i = 0; i < x->n; i++) {
        struct cand *c = &x->c[i];
        c->drop = cand_check(x, c, budget);
        if (c->drop == DROP_NONE || c->drop == DROP_SMEM)
            cand_cost(x, c);
        any_fast |= !c->portable && !c->library;
        fast_eligible |= !c->portable && !c->library && c->drop == DROP_NONE;
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
    o->portable_fallback = c->portable && any_fast && !fast_eligible;

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
    if (!(st = pl_front(&x, err)) && !(st = pl_linear(&x, err)) && !(st = pl_rope_kv(&x, err)) &&
        !(st = pl_attention_prefill(&x, err)) && !(st = pl_attention_decode(&x, err)) &&
        !(st = pl_mla_dsa(&x, err)) &&
        !(st = pl_linear_ffn(&x, err)) && !(p->shapes.n_experts > 0 && (st = pl_moe(&x, err))) &&
        !(st = pl_decode(&x, err)))
        st = pl_tail(&x, err);
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
