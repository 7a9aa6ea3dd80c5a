/* plan_print.c — a plan as a table for people and as JSON for tools.
 *
 * JSON is exactly {"device": {...caps...}, "ops": [{"op", "kernel", "math",
 * "tile" ("MxNxK"), "stages", "smem_bytes", "bound" ("memory" | "compute"),
 * "reason"}, ...]}; the device object carries the effective "smem_budget" so
 * a reader can check every smem_bytes against it. Warnings go to the log
 * (plan_build) and to the end of the table, not into the JSON.
 *
 * Deliberately not here: any decision; this file only formats struct plan.
 */
#include <stdio.h>
#include <string.h>

#include "plan/plan.h"

static void features_str(const struct device_caps *c, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s%s%s%s%s%s", c->bf16_mma ? " bf16_mma" : "", c->fp8_mma ? " fp8_mma" : "",
             c->wgmma ? " wgmma" : "", c->tcgen05 ? " tcgen05" : "",
             c->fp4_mma_block_scaled ? " fp4_mma_block_scaled" : "", c->tma ? " tma" : "", c->pdl ? " pdl" : "",
             c->clusters ? " clusters" : "");
    if (!buf[0])
        snprintf(buf, n, " none (portable fp32 only)");
}

struct json *plan_caps_to_json(const struct device_caps *c, size_t smem_budget)
{
    struct json *o = json_new_object();
    if (!o)
        return NULL;
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", c->cc_major, c->cc_minor);
    json_add(o, "name", json_new_string(c->name));
    json_add(o, "source", json_new_string(c->source));
    json_add(o, "cc", json_new_string(cc));
    json_add(o, "arch", json_new_string(c->arch));
    json_add(o, "known_cc", json_new_bool(c->known_cc));
    json_add(o, "sm_count", json_new_number(c->sm_count));
    json_add(o, "sm_clock_ghz", json_new_number(c->sm_clock_ghz));
    json_add(o, "smem_per_block_optin", json_new_number((double)c->smem_per_block_optin));
    json_add(o, "smem_per_sm", json_new_number((double)c->smem_per_sm));
    json_add(o, "smem_budget",
             json_new_number((double)(smem_budget ? smem_budget : c->smem_per_block_optin)));
    json_add(o, "total_mem", json_new_number((double)c->total_mem));
    json_add(o, "l2_bytes", json_new_number((double)c->l2_bytes));
    json_add(o, "regs_per_block", json_new_number(c->regs_per_block));
    json_add(o, "mem_bw_gbs", json_new_number(c->mem_bw_gbs));
    json_add(o, "power_limit_w", json_new_number(c->power_limit_w));
    json_add(o, "nvlink", json_new_bool(c->nvlink));
    json_add(o, "n_gpus", json_new_number(c->n_gpus));
    json_add(o, "peers", json_new_number(c->peers));
    json_add(o, "bf16_mma", json_new_bool(c->bf16_mma));
    json_add(o, "fp8_mma", json_new_bool(c->fp8_mma));
    json_add(o, "wgmma", json_new_bool(c->wgmma));
    json_add(o, "tcgen05", json_new_bool(c->tcgen05));
    json_add(o, "fp4_mma_block_scaled", json_new_bool(c->fp4_mma_block_scaled));
    json_add(o, "tma", json_new_bool(c->tma));
    json_add(o, "pdl", json_new_bool(c->pdl));
    json_add(o, "clusters", json_new_bool(c->clusters));
    struct json *r = json_add(o, "flops_per_clk_sm", json_new_object());
    for (int m = 0; m < PLAN_MATH_COUNT && r; m++)
        if (c->flops_per_clk_sm[m] > 0)
            json_add(r, plan_math_name((enum plan_math)m), json_new_number(c->flops_per_clk_sm[m]));
    return o;
}

static const char *bound_name(enum plan_bound b)
{
    return b == PLAN_BOUND_COMPUTE ? "compute" : "memory";
}

struct json *plan_to_json(const struct plan *p)
{
    struct json *root = json_new_object();
    if (!root)
        return NULL;
    json_add(root, "device", plan_caps_to_json(&p->caps, p->smem_budget));
    json_add(root, "prefill_chunk_tokens",
             json_new_number(plan_prefill_chunk_tokens(p->shapes.n_experts, p->shapes.n_experts_used)));
    struct json *ops = json_add(root, "ops", json_new_array());
    for (int i = 0; i < p->n_ops && ops; i++) {
        const struct op_plan *o = &p->ops[i];
        struct json *e = json_append(ops, json_new_object());
        if (!e)
            break;
        char tile[48];
        snprintf(tile, sizeof tile, "%dx%dx%d", o->tile_m, o->tile_n, o->tile_k);
        json_add(e, "op", json_new_string(o->op));
        json_add(e, "kernel", json_new_string(o->kernel));
        json_add(e, "math", json_new_string(o->math));
        json_add(e, "tile", json_new_string(tile));
        json_add(e, "stages", json_new_number(o->stages));
        json_add(e, "smem_bytes", json_new_number((double)o->smem_bytes));
        json_add(e, "bound", json_new_string(bound_name(o->bound)));
        json_add(e, "reason", json_new_string(o->reason));
    }
    struct json *dis = json_add(root, "dispatch", json_new_array());
    for (int op = 0; op < PLAN_OP_COUNT && dis; op++)
        for (int b = 0; b < PLAN_BUCKET_COUNT; b++)
            for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++) {
                const struct plan_dispatch *d = &p->dispatch[op][b][f];
                struct json *e = d->n ? json_append(dis, json_new_object()) : NULL;
                if (!e)
                    continue;
                json_add(e, "op", json_new_string(plan_op_name((enum plan_op)op)));
                json_add(e, "tokens", json_new_string(plan_bucket_name((enum plan_bucket)b)));
                json_add(e, "weights", json_new_string(weight_format_name((enum weight_format)f)));
                struct json *ks = json_add(e, "kernels", json_new_array());
                for (int i = 0; i < d->n && ks; i++)
                    json_append(ks, json_new_string(d->kernels[i]->name));
                json_add(e, "reason", json_new_string(d->reason));
            }
    return root;
}

/* The weight formats a model's linears use (the router is bf16 in every checkpoint we read). */
static unsigned linear_formats(const struct plan_weights *w)
{
    return 1u << w->attn | 1u << w->ffn | 1u << w->lm_head | 1u << WEIGHT_BF16;
}

/* The dispatch table, for the formats this plan's weights use. */
static void print_dispatch(const struct plan *p)
{
    const unsigned fmts[PLAN_OP_COUNT] = {linear_formats(&p->weights), 1u << p->weights.experts};
    bool any = false;
    for (int op = 0; op < PLAN_OP_COUNT; op++)
        for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++)
            for (int b = 0; b < PLAN_BUCKET_COUNT; b++) {
                const struct plan_dispatch *d = &p->dispatch[op][b][f];
                if (!d->n || !(fmts[op] & (1u << f)) || (op == PLAN_OP_MOE_EXPERTS && p->shapes.n_experts <= 0))
                    continue;
                if (!any)
                    printf("\ndispatch (op, tokens, weights: the first kernel that takes the call runs)\n");
                any = true;
                char list[256];
                size_t o = 0;
                list[0] = 0;
                for (int i = 0; i < d->n && o < sizeof list; i++)
                    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? " > " : "", d->kernels[i]->name);
                printf("%-12s %-6s %-6s %-56s %s\n", plan_op_name((enum plan_op)op),
                       plan_bucket_name((enum plan_bucket)b), weight_format_name((enum weight_format)f), list,
                       d->reason);
            }
}

void plan_print(const struct plan *p)
{
    const struct device_caps *c = &p->caps;
    const struct plan_shapes *s = &p->shapes;
    const struct plan_weights *w = &p->weights;
    char feats[128];
    features_str(c, feats, sizeof feats);
    printf("device   %s (%s): cc %d.%d%s%s%s, %d SMs @ %.2f GHz, %.1f GB, %.0f GB/s, L2 %.0f MiB%s\n",
           c->name, c->source, c->cc_major, c->cc_minor, c->arch[0] ? " (" : "", c->arch,
           c->arch[0] ? ")" : "", c->sm_count, c->sm_clock_ghz, (double)c->total_mem / 1e9, c->mem_bw_gbs,
           (double)c->l2_bytes / 1048576.0, c->known_cc ? "" : ", NOT IN THE CAPABILITY TABLE");
    printf("features%s; smem %zu B/block opt-in, budget %zu B\n", feats, c->smem_per_block_optin,
           p->smem_budget);
    printf("shapes   %s: d_model %d, heads %d/%d x %d%s, experts %d top-%d x %d, vocab %d; reference: "
           "prefill %d "
           "tokens, decode %d x %d\n",
           s->source, s->d_model, s->n_heads, s->n_kv_heads, s->head_dim, s->mla ? " (MLA)" : "",
           s->n_experts, s->n_experts_used, s->d_expert, s->vocab, s->prefill_tokens, s->decode_batch,
           s->decode_ctx);
    printf("weights  experts %s%s, attention %s, ffn %s, lm_head %s\n\n", weight_format_name(w->experts),
           w->experts == WEIGHT_NVFP4 ? (w->fp4_activations ? " (W4A4)" : " (W4A16)") : "",
           weight_format_name(w->attn), weight_format_name(w->ffn), weight_format_name(w->lm_head));
    printf("%-18s %-28s %-21s %-13s %6s %8s %-8s %s\n", "op", "kernel", "math", "tile", "stages", "smem",
           "bound", "reason");
    for (int i = 0; i < p->n_ops; i++) {
        const struct op_plan *o = &p->ops[i];
        char tile[48];
        snprintf(tile, sizeof tile, "%dx%dx%d", o->tile_m, o->tile_n, o->tile_k);
        printf("%-18s %-28s %-21s %-13s %6d %8zu %-8s %s\n", o->op, o->kernel, o->math, tile, o->stages,
               o->smem_bytes, bound_name(o->bound), o->reason);
    }
    print_dispatch(p);
    printf("\nserving  passes of up to %d tokens (decode rows, then prompt chunks): %d rows an expert a chunk\n",
           plan_prefill_chunk_tokens(s->n_experts, s->n_experts_used), PLAN_PREFILL_ROWS_PER_EXPERT);
    if (p->warnings[0]) {
        printf("\n");
        const char *line = p->warnings;
        while (*line) {
            const char *nl = strchr(line, '\n');
            int len = nl ? (int)(nl - line) : (int)strlen(line);
            printf("WARNING: %.*s\n", len, line);
            line += len + (nl ? 1 : 0);
        }
    }
}

/* "bf16+nvfp4" */
static void formats_str(unsigned formats, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int f = 0; f < WEIGHT_FORMAT_COUNT && o < n; f++)
        if (formats & (1u << f))
            o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? "+" : "", weight_format_name((enum weight_format)f));
    if (!o)
        snprintf(buf, n, "-");
}

static void needs_str(unsigned needs, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s%s%s%s", needs & KERNEL_NEEDS_BF16_MMA ? " bf16_mma" : "",
             needs & KERNEL_NEEDS_FP8_MMA ? " fp8_mma" : "", needs & KERNEL_NEEDS_WGMMA ? " wgmma" : "",
             needs & KERNEL_NEEDS_TCGEN05 ? " tcgen05" : "", needs & KERNEL_NEEDS_FP4_MMA ? " fp4_mma" : "",
             needs & KERNEL_NEEDS_CLUSTERS ? " clusters" : "");
    if (!buf[0])
        snprintf(buf, n, " -");
}

struct json *plan_kernels_to_json(const struct kernel_table *t)
{
    struct json *root = json_new_object();
    if (!root)
        return NULL;
    json_add(root, "backend", json_new_string(t->backend));
    struct json *ks = json_add(root, "kernels", json_new_array());
    for (int i = 0; i < t->n && ks; i++) {
        const struct kernel_desc *k = &t->kernels[i];
        struct json *e = json_append(ks, json_new_object());
        if (!e)
            break;
        char f[96], nd[96];
        formats_str(k->formats, f, sizeof f);
        needs_str(k->needs, nd, sizeof nd);
        json_add(e, "name", json_new_string(k->name));
        json_add(e, "ops", json_new_string(k->op));
        json_add(e, "math", k->math ? json_new_string(k->math) : json_new_null());
        json_add(e, "needs", json_new_string(nd + 1));
        json_add(e, "formats", json_new_string(f));
        json_add(e, "file", json_new_string(k->where));
        json_add(e, "tiles", json_new_number(k->n_tiles));
        json_add(e, "symbols", k->symbols ? json_new_string(k->symbols) : json_new_null());
    }
    return root;
}

void plan_kernels_print(const struct kernel_table *t)
{
    printf("%-32s %-38s %-11s %-10s %-30s %s\n", "kernel", "ops", "math", "needs", "weights", "file");
    for (int i = 0; i < t->n; i++) {
        const struct kernel_desc *k = &t->kernels[i];
        char f[96], nd[96];
        formats_str(k->formats, f, sizeof f);
        needs_str(k->needs, nd, sizeof nd);
        printf("%-32s %-38s %-11s %-10s %-30s %s%s\n", k->name, k->op, k->math ? k->math : "library", nd + 1, f,
               k->where, k->n_tiles ? " (tiles: the table)" : "");
    }
}
