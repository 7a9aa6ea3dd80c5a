/* plan_dispatch.c — the plan's dispatch table: for every op the backend dispatches by the plan
 * (plan.h enum plan_op), token bucket and weight format, the kernels that run, in order of
 * preference; the backend takes the first whose limits fit the call.
 *
 * The order follows from the device's features, the backend's kernel table and what was
 * measured (the figures in each reason; docs/lab/journal.md has the runs), and for the sorted
 * GEMMs from the cost model's choice (planner.c). Nothing here compares compute capabilities.
 * MOESERVE_CUDA_FORCE (plan_request.force) puts a kernel first, validated against the table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"
#include "plan/plan_internal.h"

static const char *const BUCKET_NAMES[PLAN_BUCKET_COUNT] = {"1", "2-8", "9-32", "33-64", "65+"};
static const char *const OP_NAMES[PLAN_OP_COUNT] = {"linear", "moe_experts", "moe_route"};
/* the kernel_desc.op names each dispatched op lists (the many-token and the few-token form) */
static const char *const OP_SERVES[PLAN_OP_COUNT][2] = {
    {"linear", "linear_decode"}, {"moe_experts_gemm", "moe_experts_decode"}, {"moe_route", "moe_route"}};
/* the most tokens of each bucket (the last: none) */
static const int BUCKET_MAX[PLAN_BUCKET_COUNT] = {1, 8, 32, 64, 1 << 30};

enum plan_bucket plan_bucket_of(int n_tokens)
{
    for (int b = 0; b < PLAN_BUCKET_COUNT - 1; b++)
        if (n_tokens <= BUCKET_MAX[b])
            return (enum plan_bucket)b;
    return PLAN_BUCKET_MORE;
}

const char *plan_bucket_name(enum plan_bucket b)
{
    return b >= 0 && b < PLAN_BUCKET_COUNT ? BUCKET_NAMES[b] : "?";
}

const char *plan_op_name(enum plan_op op)
{
    return op >= 0 && op < PLAN_OP_COUNT ? OP_NAMES[op] : "?";
}

bool plan_op_takes(enum plan_op op, const struct kernel_desc *k)
{
    return op >= 0 && op < PLAN_OP_COUNT && (kernel_desc_serves(k, OP_SERVES[op][0]) || kernel_desc_serves(k, OP_SERVES[op][1]));
}

const struct plan_dispatch *plan_dispatch_for(const struct plan *p, enum plan_op op, int n_tokens,
                                              enum weight_format f)
{
    ASSERT(op >= 0 && op < PLAN_OP_COUNT && f >= 0 && f < WEIGHT_FORMAT_COUNT);
    return &p->dispatch[op][plan_bucket_of(n_tokens)][f];
}

const struct kernel_desc *plan_dispatch_pick(const struct plan *p, enum plan_op op, const struct kernel_shape *s)
{
    const struct plan_dispatch *d = plan_dispatch_for(p, op, s->tokens, s->format);
    for (int i = 0; i < d->n; i++)
        if (!d->kernels[i]->fits || d->kernels[i]->fits(s, p->smem_budget))
            return d->kernels[i];
    return NULL;
}

/* ---- filling the table ---- */

struct fill {
    struct plan *p;
    const struct plan_request *req;
};

static bool has_features(const struct device_caps *c, unsigned needs)
{
    return (!(needs & KERNEL_NEEDS_BF16_MMA) || c->bf16_mma) && (!(needs & KERNEL_NEEDS_FP8_MMA) || c->fp8_mma) &&
           (!(needs & KERNEL_NEEDS_WGMMA) || c->wgmma) && (!(needs & KERNEL_NEEDS_TCGEN05) || c->tcgen05) &&
           (!(needs & KERNEL_NEEDS_FP4_MMA) || c->fp4_mma_block_scaled) &&
           (!(needs & KERNEL_NEEDS_CLUSTERS) || c->clusters);
}

/* The descriptor `name` if this device can run it for op and format f (NULL otherwise). */
static const struct kernel_desc *usable(const struct fill *x, const char *name, const char *op, enum weight_format f)
{
    const struct kernel_desc *k = kernel_table_find(x->req->kernels, name);
    if (!k || !kernel_desc_serves(k, op) || !(k->formats & (1u << f)) || !has_features(&x->p->caps, k->needs))
        return NULL;
    if (x->req->variant_loads && !x->req->variant_loads(x->req->variant_ctx, name))
        return NULL;
    return k;
}

static void add(struct plan_dispatch *d, const struct kernel_desc *k)
{
    if (!k || d->n >= PLAN_DISPATCH_MAX)
        return;
    for (int i = 0; i < d->n; i++)
        if (d->kernels[i] == k)
            return;
    d->kernels[d->n++] = k;
}

static void add_named(const struct fill *x, struct plan_dispatch *d, const char *name, const char *op,
                      enum weight_format f)
{
    add(d, usable(x, name, op, f));
}

/* Our sorted / tiled GEMMs for format f, best first: the cost model's choice where it planned
 * this format (op entry `planned`), then wgmma, mma, and the portable GEMM. */
static void add_gemms(const struct fill *x, struct plan_dispatch *d, const char *planned, bool moe,
                      enum weight_format f)
{
    const char *op = moe ? "moe_experts_gemm" : "linear";
    const struct op_plan *o = plan_find(x->p, planned);
    if (o && o->weight_format == f)
        add_named(x, d, o->kernel, op, f);
    static const char *const MOE[] = {"moe_gemm_nvfp4_wo_wgmma", "moe_gemm_bf16_wgmma", "moe_gemm_nvfp4_wo_mma",
                                      "moe_gemm_bf16_mma",       "moe_gemm_nvfp4_wo_fp32", "moe_gemm_fp8_wo_fp32",
                                      "moe_gemm_bf16_fp32"};
    static const char *const LIN[] = {"gemm_nvfp4_wo_wgmma", "gemm_nvfp4_wo_mma", "gemm_nvfp4_wo_fp32",
                                      "gemm_fp8_wo_fp32", "gemm_fp32_tiled"};
    const char *const *names = moe ? MOE : LIN;
    int n = moe ? (int)(sizeof MOE / sizeof MOE[0]) : (int)(sizeof LIN / sizeof LIN[0]);
    for (int i = 0; i < n; i++)
        add_named(x, d, names[i], op, f);
}

static void fill_linear(const struct fill *x, enum plan_bucket b, enum weight_format f)
{
    struct plan_dispatch *d = &x->p->dispatch[PLAN_OP_LINEAR][b][f];
    char *why = d->reason;
    size_t n = sizeof d->reason;
    if (b <= PLAN_BUCKET_2_8)
        add_named(x, d, "gemv_decode_mma_bf16", "linear_decode", f);
    if (b == PLAN_BUCKET_1)
        add_named(x, d, "gemv_x_smem", "linear_decode", f);
    const int gemv = d->n;
    switch (f) {
    case WEIGHT_BF16: add_named(x, d, "cublaslt_bf16", "linear", f); break;
    case WEIGHT_F32: add_named(x, d, "cublas_sgemm", "linear", f); break;
    case WEIGHT_NVFP4: {
        const struct op_plan *o = plan_find(x->p, "linear");
        if (o && !strcmp(o->kernel, "cublas_dequant_bf16"))
            add_named(x, d, "cublas_dequant_bf16", "linear", f);
        add_gemms(x, d, "linear", false, f);
        break;
    }
    default: add_gemms(x, d, "linear", false, f); break;
    }
    if (b <= PLAN_BUCKET_2_8 && gemv > 0 && f == WEIGHT_NVFP4)
        snprintf(why, n, "%s: the rows share each bf16 mma, weights loaded before the PDL wait (H200: b1 412.9 "
                 "vs 403.2 on CUDA cores, b8 906.1 vs 750.9 through the GEMMs)", d->kernels[0]->name);
    else if (b == PLAN_BUCKET_1 && gemv > 0)
        snprintf(why, n, "one row: x staged in smem, every weight load issued first (CUDA cores)");
    else if (f == WEIGHT_NVFP4 && d->n && !strcmp(d->kernels[0]->name, "cublas_dequant_bf16"))
        snprintf(why, n,
                 "weight expanded to bf16 (exact; dense weights' copies resident within 1/8 of memory, "
                 "else per call), cuBLAS on x hi + lo (H200: prefill 128 6548 "
                 "vs 3910, 2048 14024 vs 12472 tok/s against the in-register dequant GEMM)");
    else if (f == WEIGHT_BF16 || f == WEIGHT_F32)
        snprintf(why, n, "cuBLAS (bf16 on x hi + lo: fp32-grade; f32: SGEMM without TF32)");
    else
        snprintf(why, n, "our GEMMs, dequantising the weights in registers");
}

static void fill_moe(const struct fill *x, enum plan_bucket b, enum weight_format f, int pair_max)
{
    struct plan_dispatch *d = &x->p->dispatch[PLAN_OP_MOE_EXPERTS][b][f];
    const bool pairs = BUCKET_MAX[b] <= pair_max;
    const double rows = b == PLAN_BUCKET_MORE ? 1e30
                                              : plan_moe_rows_per_expert(x->p->shapes.n_experts,
                                                                         x->p->shapes.n_experts_used, BUCKET_MAX[b]);
    const bool grouped = BUCKET_MAX[b] >= PLAN_MOE_GROUPED_MIN_TOKENS && rows <= PLAN_MOE_GROUPED_MAX_ROWS;
    if (grouped)
        add_named(x, d, "moe_grouped_mma_bf16", "moe_experts_gemm", f);
    const bool grouped_first = grouped && d->n > 0;
    if (pairs) {
        add_named(x, d, "moe_pair_decode_mma_bf16", "moe_experts_decode", f);
        add_named(x, d, "moe_pair_decode", "moe_experts_decode", f);
    }
    add_gemms(x, d, "moe_experts_gemm", true, f);
    if (grouped_first)
        snprintf(d->reason, sizeof d->reason,
                 "%.1f rows an expert at %d tokens (<= %.0f): sorted by expert in tiles of 8 tokens, each "
                 "expert's rows streamed once a tile with its tokens sharing every bf16 mma (H200 decode tok/s, "
                 "against the pairs / the sorted wgmma GEMM: Qwen3-30B b24 1610.6 vs 1161.9 / 997.7, b64 3192.7 "
                 "vs 2413.6; GLM-5 slice b64 4.58 vs 6.40 ms a layer)",
                 rows, BUCKET_MAX[b], PLAN_MOE_GROUPED_MAX_ROWS);
    else if (pairs)
        snprintf(d->reason, sizeof d->reason,
                 "<= %d tokens (2 pairs an expert): each (token, expert) pair streams its rows, no sort; NVFP4 "
                 "on bf16 mma (H200: b1 330.7 vs 324.4, b8 695.2 vs 628.4 on CUDA cores), its weights through "
                 "smem by cp.async from 2 tokens (b8 939.3 vs 901.5)",
                 pair_max);
    else
        snprintf(d->reason, sizeof d->reason, "> %d tokens: sorted by expert, the grouped GEMM the cost model "
                 "chose (moe_experts_gemm), then the others that fit",
                 pair_max);
}

/* The routing: from 2 tokens up to the pair-by-pair experts' limit the router and the routing
 * in one kernel (a cluster a token where the device has clusters, the norm before them in it
 * where the call offers it; else the counting form), then the router as a linear and the
 * routing kernel. Past that limit the sorted experts' own kernels are long and the rank count's
 * block per token is cheaper than the fused forms' warp per logit. */
static void fill_route(const struct fill *x, enum plan_bucket b, enum weight_format f, int pair_max)
{
    struct plan_dispatch *d = &x->p->dispatch[PLAN_OP_MOE_ROUTE][b][f];
    const bool fused = b != PLAN_BUCKET_1 && BUCKET_MAX[b] <= pair_max;
    if (fused) {
        add_named(x, d, "norm_router_route_cluster", "moe_route", f);
        add_named(x, d, "router_route_cluster", "moe_route", f);
        add_named(x, d, "router_route_count", "moe_route", f);
    }
    const int n_fused = d->n;
    add_named(x, d, x->p->shapes.router_sigmoid ? "moe_route_sigmoid_grouped_topk" : "moe_route_softmax_topk",
              "moe_route", f);
    if (n_fused)
        snprintf(d->reason, sizeof d->reason,
                 "2-%d tokens: %s (H200: norm + router + routing cluster b2 384.3 vs 367.0, b8 747.8 vs 731.2; "
                 "the counting form b8 747.1 vs 735.1), else the router linear, then the routing",
                 pair_max, d->kernels[0]->name);
    else if (b == PLAN_BUCKET_1)
        snprintf(d->reason, sizeof d->reason, "one token: the router linear, then the routing (fused forms "
                 "slower on the H200: b1 386.5 cluster, 346.8 counting vs 408.3 and 367.9)");
    else
        snprintf(d->reason, sizeof d->reason, "the router linear, then the routing kernel");
}

/* "op[@bucket]:kernel,...": each named kernel first in its lists. */
static enum status apply_force(const struct fill *x, struct err *err)
{
    const char *s = x->req->force;
    char item[160];
    while (s && *s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len >= sizeof item)
            return err_set(err, STATUS_INVALID, "MOESERVE_CUDA_FORCE: item \"%.40s...\" is too long", s);
        memcpy(item, s, len);
        item[len] = 0;
        s = e ? e + 1 : NULL;
        char *colon = strchr(item, ':');
        if (!colon)
            return err_set(err, STATUS_INVALID, "MOESERVE_CUDA_FORCE: \"%s\": expected op[@bucket]:kernel", item);
        *colon = 0;
        const char *kernel = colon + 1;
        char *at = strchr(item, '@');
        int b0 = 0, b1 = PLAN_BUCKET_COUNT - 1;
        if (at) {
            *at = 0;
            int b = 0;
            while (b < PLAN_BUCKET_COUNT && strcmp(BUCKET_NAMES[b], at + 1))
                b++;
            if (b == PLAN_BUCKET_COUNT)
                return err_set(err, STATUS_INVALID, "MOESERVE_CUDA_FORCE: bucket \"%s\": expected 1, 2-8, 9-32, "
                               "33-64 or 65+", at + 1);
            b0 = b1 = b;
        }
        int op = 0;
        while (op < PLAN_OP_COUNT && strcmp(OP_NAMES[op], item))
            op++;
        if (op == PLAN_OP_COUNT && !at) {
            /* a plan entry's kernel (the form of an op the backend composes, e.g. mla_prefill) */
            struct op_plan *o = NULL;
            for (int i = 0; i < x->p->n_ops && !o; i++)
                if (!strcmp(x->p->ops[i].op, item))
                    o = &x->p->ops[i];
            const struct kernel_desc *k = kernel_table_find(x->req->kernels, kernel);
            if (!o && k && !strcmp(k->op, item))
                continue; /* a form of an op this model does not have (mla_prefill without MLA) */
            if (o && k && !strcmp(k->op, item)) {
                if (!has_features(&x->p->caps, k->needs))
                    return err_set(err, STATUS_INVALID, "MOESERVE_CUDA_FORCE: %s cannot run on %s", kernel,
                                   x->p->caps.name);
                snprintf(o->kernel, sizeof o->kernel, "%s", kernel);
                snprintf(o->reason, sizeof o->reason, "forced (MOESERVE_CUDA_FORCE)");
                o->forced = true;
                continue;
            }
        }
        if (op == PLAN_OP_COUNT)
            return err_set(err, STATUS_INVALID, "MOESERVE_CUDA_FORCE: op \"%s\": expected linear, moe_experts, "
                           "moe_route or a plan entry with that kernel (mla_prefill, mla_proj)", item);
        const struct kernel_desc *k = kernel_table_find(x->req->kernels, kernel);
        if (!k || !plan_op_takes((enum plan_op)op, k))
            return err_set(err, STATUS_INVALID, "MOESERVE_CUDA_FORCE: the %s backend has no kernel \"%s\" for %s",
                           x->req->kernels->backend, kernel, item);
        if (!has_features(&x->p->caps, k->needs) ||
            (x->req->variant_loads && !x->req->variant_loads(x->req->variant_ctx, kernel)))
            return err_set(err, STATUS_INVALID, "MOESERVE_CUDA_FORCE: %s cannot run on %s", kernel, x->p->caps.name);
        for (int b = b0; b <= b1; b++)
            for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++) {
                struct plan_dispatch *d = &x->p->dispatch[op][b][f];
                if (!(k->formats & (1u << f)))
                    continue;
                int i = 0;
                while (i < d->n && d->kernels[i] != k)
                    i++;
                if (i == d->n && d->n == PLAN_DISPATCH_MAX)
                    i = d->n - 1; /* the least preferred gives way */
                else if (i == d->n)
                    d->n++;
                memmove(&d->kernels[1], &d->kernels[0], (size_t)i * sizeof d->kernels[0]);
                d->kernels[0] = k;
                snprintf(d->reason, sizeof d->reason, "forced (MOESERVE_CUDA_FORCE)");
            }
    }
    return STATUS_OK;
}

enum status plan_dispatch_fill(struct plan *p, const struct plan_request *req, struct err *err)
{
    memset(p->dispatch, 0, sizeof p->dispatch);
    if (!req->kernels)
        return STATUS_OK;
    struct fill x = {.p = p, .req = req};
    const double eb = pl_wf_bytes(p->weights.experts) * 3.0 * p->shapes.d_model * p->shapes.d_expert;
    const int pair_max = plan_moe_pair_max_tokens(p->shapes.n_experts, p->shapes.n_experts_used, eb);
    for (int b = 0; b < PLAN_BUCKET_COUNT; b++)
        for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++) {
            fill_linear(&x, (enum plan_bucket)b, (enum weight_format)f);
            fill_moe(&x, (enum plan_bucket)b, (enum weight_format)f, pair_max);
            fill_route(&x, (enum plan_bucket)b, (enum weight_format)f, pair_max);
        }
    return apply_force(&x, err);
}
