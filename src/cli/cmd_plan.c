/* cmd_plan.c — `moeserve plan`: which kernel each op runs on a GPU, and why.
 *
 * The device is a probed CUDA device (--device N, default 0 in a CUDA
 * build) or a named profile (--profile NAME) for a GPU you do not have;
 * --smem-budget lowers the per-block shared-memory budget (an H200 planning
 * exactly the tiles an sm_120 gets). Shapes come from --model DIR's
 * config.json and its quantization config, else Qwen3-30B-A3B-like
 * defaults; --weights overrides the weight format of experts and linears;
 * Only kernels the CUDA backend has are planned (backend/cuda/cuda_registry.c), in every
 * build: the plan printed is the plan that runs.
 *
 * Deliberately not here: any choice; this only gathers inputs for
 * plan_build_request() and prints its plan (table, or --json).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_registry.h"
#include "base/json.h"
#include "model/model_shard.h"
#include "base/log.h"
#include "base/options.h"
#include "cli/cli_args.h"
#include "cli/commands.h"
#include "engine/forward.h"
#include "format/quant_config.h"
#include "model/model_desc.h"
#include "model/model_plan.h"
#include "plan/plan.h"

/* "bf16" | "fp8" | "nvfp4" (W4A4) | "nvfp4-w4a16". */
static bool plan_parse_weights(const char *s, struct plan_weights *w)
{
    if (!strcmp(s, "bf16"))
        plan_weights_default(w, WEIGHT_BF16, false);
    else if (!strcmp(s, "fp8"))
        plan_weights_default(w, WEIGHT_FP8_BLOCK, false);
    else if (!strcmp(s, "nvfp4"))
        plan_weights_default(w, WEIGHT_NVFP4, true);
    else if (!strcmp(s, "nvfp4-w4a16"))
        plan_weights_default(w, WEIGHT_NVFP4, false);
    else
        return false;
    return true;
}

/* Prints j (JSON) and frees it; 1 when there was no memory for it. */
static int print_json(struct json *j)
{
    char *s = j ? json_print(j, true) : NULL;
    json_free(j);
    if (!s) {
        LOG_ERROR("plan: out of memory printing JSON");
        return 1;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}

/* The model's shapes and, unless --weights said, its checkpoint's weight formats; 1 on an error
 * (logged). */
static int load_model(const char *dir, bool weights_given, struct model_desc *d, struct plan_shapes *shapes,
                      struct plan_weights *w, const struct model_shard *shard)
{
    struct err err = {0};
    if (model_desc_load(d, dir, &err)) {
        LOG_ERROR("plan: %s", err.msg);
        return 1;
    }
    /* with ranks: one rank's shapes (heads and widths divided) are what its kernels run */
    struct model_desc local = {0};
    if (model_shard_desc(d, shard, &local, &err) || model_plan_shapes(&local, dir, shapes, &err)) {
        LOG_ERROR("plan: %s", err.msg);
        model_desc_free(&local);
        return 1;
    }
    model_desc_free(&local);
    if (!weights_given) {
        struct quant_config qc;
        if (quant_config_load(&qc, dir, &err)) {
            LOG_ERROR("plan: %s", err.msg);
            return 1;
        }
        model_plan_weights(d, &qc, w);
        quant_config_free(&qc);
    }
    return 0;
}

/* The device to plan for: a named profile, else probed CUDA device `device`; 0, or the exit
 * code (logged): 2 for an unknown profile (a usage error), 1 when probing failed. */
static int plan_load_caps(const char *profile, int device, struct device_caps *caps)
{
    struct err err = {0};
    if (profile) {
        if (plan_caps_from_profile(caps, profile, &err)) {
            LOG_ERROR("plan: %s", err.msg);
            return 2;
        }
    } else if (plan_caps_probe(caps, device, &err)) {
        if (strstr(err.msg, "--profile"))
            LOG_ERROR("plan: %s", err.msg);
        else
            LOG_ERROR("plan: %s; to plan for a GPU you do not have: --profile NAME (%s)", err.msg,
                      plan_profile_names());
        return 1;
    }
    return 0;
}

/* The layout over the ranks: a table after the plan, or the JSON's "layout". */
static struct json *layout_json(const struct shard_part *parts, int n, const struct model_shard *sh)
{
    struct json *o = json_new_object();
    json_add(o, "ranks", json_new_number(sh->size));
    json_add(o, "expert_parallel", json_new_bool(sh->expert_parallel));
    struct json *a = json_new_array();
    for (int i = 0; i < n; i++) {
        struct json *e = json_new_object();
        json_add(e, "part", json_new_string(parts[i].part));
        json_add(e, "split", json_new_string(parts[i].split));
        json_add(e, "rank0", json_new_string(parts[i].per_rank));
        json_add(e, "why", json_new_string(parts[i].why));
        json_append(a, e);
    }
    json_add(o, "parts", a);
    return o;
}

static void layout_print(const struct shard_part *parts, int n, const struct model_shard *sh)
{
    printf("\nlayout over %d ranks (rank 0 shown; every rank runs the plan above on its share):\n", sh->size);
    for (int i = 0; i < n; i++)
        printf("  %-26s %-18s %s\n  %-26s %-18s   why: %s\n", parts[i].part, parts[i].split, parts[i].per_rank, "",
               "", parts[i].why);
}

/* The collectives of one step over the ranks at a few token counts: what each moves, which are
 * fused with the residual add and the next RMSNorm, and how the GPU ranks choose the all-reduce's
 * form (measured at start-up, so a plan made without the GPUs cannot name it). By heads: an
 * all-reduce a half-layer, each but the last with the add and the next norm in one comm op
 * (engine/forward.c forward_reduce). Data-parallel attention: per layer the FFN's all-gather of
 * every rank's rows (the step's tokens spread over the ranks, padded to the largest share) and
 * its reduce-scatter, then one all-gather of the residual rows for the lm_head; nothing fused. */
static const int STEP_TOKENS[] = {1, 8, 64, 512};

static struct json *collectives_json(const struct model_desc *d, const struct model_shard *sh)
{
    struct json *a = json_new_array();
    const size_t vocab_share = (size_t)model_shard_vocab(d, sh).n, D = (size_t)d->d_model;
    for (size_t i = 0; i < sizeof STEP_TOKENS / sizeof STEP_TOKENS[0]; i++) {
        const size_t t = (size_t)STEP_TOKENS[i], share = (t + (size_t)sh->size - 1) / (size_t)sh->size;
        struct json *e = json_new_object();
        json_add(e, "tokens", json_new_number((double)t));
        if (sh->data_parallel_attention) {
            json_add(e, "all_reduce_count", json_new_number(0));
            json_add(e, "all_gather_count", json_new_number(d->n_layers + 1.0));
            json_add(e, "reduce_scatter_count", json_new_number(d->n_layers));
            json_add(e, "rank_rows", json_new_number((double)share));
            json_add(e, "all_gather_bytes_per_rank", json_new_number((double)(share * D * sizeof(float))));
            json_add(e, "fused_add_rmsnorm_count", json_new_number(0));
        } else {
            json_add(e, "all_reduce_count", json_new_number(2.0 * d->n_layers));
            json_add(e, "all_reduce_bytes", json_new_number((double)(t * D * sizeof(float))));
            json_add(e, "fused_add_rmsnorm_count", json_new_number(2.0 * d->n_layers - 1));
        }
        json_add(e, "logits_all_gather_bytes_per_rank", json_new_number((double)(vocab_share * sizeof(float))));
        json_append(a, e);
    }
    return a;
}

static void collectives_print(const struct model_desc *d, const struct model_shard *sh)
{
    const size_t vocab_share = (size_t)model_shard_vocab(d, sh).n;
    if (sh->data_parallel_attention) {
        printf("  collectives of a step (data-parallel attention): per layer an all-gather of the FFN's input rows "
               "and a reduce-scatter of its output (each rank's rows x %d floats, padded to the largest rank's), "
               "then an all-gather of the residual rows for the lm_head and the logits' all-gather of %zu floats "
               "a row a rank; none fused with a norm (each rank norms its own rows)\n",
               d->d_model, vocab_share);
        for (size_t i = 0; i < sizeof STEP_TOKENS / sizeof STEP_TOKENS[0]; i++) {
            const int share = (STEP_TOKENS[i] + sh->size - 1) / sh->size;
            printf("    %4d tokens: %d rows a rank, all-gather of %.1f KiB a rank, %d all-gathers + %d "
                   "reduce-scatters\n", STEP_TOKENS[i], share, (double)share * d->d_model * sizeof(float) / 1024.0,
                   d->n_layers + 1, d->n_layers);
        }
        return;
    }
    printf("  collectives of a step: %d all-reduces (one a half-layer) of tokens x %d floats, the logits' "
           "all-gather of %zu floats a row a rank\n",
           2 * d->n_layers, d->d_model, vocab_share);
    for (size_t i = 0; i < sizeof STEP_TOKENS / sizeof STEP_TOKENS[0]; i++) {
        const double kib = (double)STEP_TOKENS[i] * d->d_model * sizeof(float) / 1024.0;
        printf("    %4d tokens: all-reduce of %.1f KiB%s\n", STEP_TOKENS[i], kib,
               kib * 1024.0 > 16.0 * 1048576.0 ? " (above the P2P table: NCCL)" : "");
    }
    printf("  fused: %d of the %d all-reduces with the residual add and the next RMSNorm (all but the last "
           "layer's FFN, whose norm is the final one, per logit row): one P2P one-shot kernel at the sizes the "
           "start-up table runs one-shot; elsewhere the all-reduce (NCCL or two-shot) then the add+norm kernel "
           "(CPU ranks: MPI's all-reduce then add+norm, the same bits as apart); before a MoE router on GPU ranks "
           "only at one-shot sizes (else the norm+router kernel keeps the norm)\n",
           2 * d->n_layers - 1, 2 * d->n_layers);
    printf("  the all-reduce's form per size (NCCL, P2P one-shot, two-shot): measured by the GPU ranks at start-up\n"
           "  where every pair of their GPUs can reach each other (cudaDeviceCanAccessPeer), else NCCL alone; the "
           "ranks log the table, `bench --allreduce --tensor-parallel N` prints it\n");
}

/* The batch sizes a server's decode steps are captured at (plan_decode_graph_sizes): JSON, or a
 * line after the plan. max_rows: --max-seqs, within the logits rows a graph computes at once. */
static struct json *graphs_json(int max_seqs, int max_rows)
{
    int sizes[PLAN_MAX_DECODE_GRAPHS];
    int n = plan_decode_graph_sizes(max_rows, sizes, PLAN_MAX_DECODE_GRAPHS);
    struct json *o = json_new_object();
    json_add(o, "max_seqs", json_new_number(max_seqs));
    struct json *a = json_add(o, "batch_sizes", json_new_array());
    for (int i = 0; i < n && a; i++)
        json_append(a, json_new_number(sizes[i]));
    return o;
}

static void graphs_print(int max_seqs, int max_rows)
{
    int sizes[PLAN_MAX_DECODE_GRAPHS];
    int n = plan_decode_graph_sizes(max_rows, sizes, PLAN_MAX_DECODE_GRAPHS);
    printf("decode graphs (--max-seqs %d): %d batch sizes,", max_seqs, n);
    for (int i = 0; i < n; i++)
        printf(" %d", sizes[i]);
    printf("; a decode step runs as the graph of the next size up, its extra rows padding%s\n",
           max_rows < max_seqs ? " (larger steps: op by op)" : "");
}

/* Plans for caps (sized by model dir `dir` when given) and prints the plan, a table or JSON;
 * the command's exit code (errors logged). */
static int plan_build_print(const struct device_caps *caps, const char *dir, bool weights_given,
                            struct plan_weights *w, size_t budget, bool json, struct model_shard *shard,
                            bool ep_given, int max_seqs, int max_context, int dpa)
{
    /* the forward's rule (engine/forward.c): graphs of up to FORWARD_MAX_GRAPH_ROWS rows */
    const int graph_rows = max_seqs < FORWARD_MAX_GRAPH_ROWS ? max_seqs : FORWARD_MAX_GRAPH_ROWS;
    struct err err = {0};
    struct options env;
    if (options_read(&env, &err)) {
        LOG_ERROR("plan: %s", err.msg);
        return 2;
    }
    struct model_desc d;
    struct plan_shapes shapes;
    memset(&d, 0, sizeof d);
    /* first as data-parallel attention, which needs no head to divide, when it may be chosen; the
     * layout by heads is loaded below where the rule (or the user) keeps it */
    struct model_shard first = *shard;
    first.data_parallel_attention = shard->size > 1 && dpa >= 0;
    if (dir && load_model(dir, weights_given, &d, &shapes, w, &first)) {
        model_desc_free(&d);
        return 1;
    }
    const char *ep_why = "--expert-parallel";
    if (dir && shard->size > 1 && !ep_given) { /* the session's own choice (model_session.c) */
        shard->expert_parallel = model_shard_choose_experts(&d, shard->size, w->experts, &ep_why);
    }
    /* the attention's layout: the session's rule for --max-seqs sequences of --max-context / 2 tokens
     * (a bf16 latent cache), unless --data-parallel-attention says */
    char attn_why[400];
    snprintf(attn_why, sizeof attn_why, "--data-parallel-attention %s", dpa > 0 ? "on" : "off");
    if (dir && shard->size > 1 && dpa >= 0) {
        bool on = dpa > 0;
        if (!dpa)
            on = model_shard_choose_attention(&d, shard->size, max_seqs, max_context / 2,
                                              model_shard_elem_bytes(w->attn), model_shard_cache_elem_bytes(&d, 2.0),
                                              attn_why, sizeof attn_why);
        shard->data_parallel_attention = on;
    }
    if (dir && first.data_parallel_attention != shard->data_parallel_attention) { /* by heads after all */
        model_desc_free(&d);
        memset(&d, 0, sizeof d);
        if (load_model(dir, true, &d, &shapes, w, shard)) {
            model_desc_free(&d);
            return 1;
        }
    }
    struct shard_part parts[12];
    const int n_parts = dir && shard->size > 1 ? model_shard_layout(&d, shard, parts, 12) : 0;
    struct plan_request req = {.shapes = dir ? &shapes : NULL,
                               .weights = w,
                               .model_name = dir,
                               .smem_budget = budget,
                               .kernels = &CUDA_KERNELS,
                               .force = env.cuda_force[0] ? env.cuda_force : NULL};
    struct plan *p = malloc(sizeof *p);
    int rc = 1;
    if (!p) {
        LOG_ERROR("plan: out of memory");
        goto done;
    }
    if (plan_build_request(p, caps, &req, &err)) {
        LOG_ERROR("%s", err.msg);
        goto done;
    }
    if (json) {
        struct json *j = plan_to_json(p);
        if (n_parts) {
            struct json *l = layout_json(parts, n_parts, shard);
            json_add(l, "experts_why", json_new_string(ep_why));
            json_add(l, "data_parallel_attention", json_new_bool(shard->data_parallel_attention));
            json_add(l, "attention_why", json_new_string(attn_why));
            json_add(l, "collectives", collectives_json(&d, shard));
            json_add(j, "layout", l);
        }
        json_add(j, "decode_graphs", graphs_json(max_seqs, graph_rows));
        rc = print_json(j);
    } else {
        plan_print(p), rc = 0;
        graphs_print(max_seqs, graph_rows);
        if (n_parts) {
            layout_print(parts, n_parts, shard);
            printf("  routed experts: %s\n", ep_why);
            printf("  attention: %s\n", attn_why);
            collectives_print(&d, shard);
        }
    }
done:
    free(p);
    model_desc_free(&d);
    return rc;
}

int cmd_plan(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model",
         .metavar = "DIR",
         .help = "size the ops with this checkpoint (default: Qwen3-30B-A3B-like)"},
        {.name = "device", .metavar = "N", .help = "probe CUDA device N (default 0 in a CUDA build)"},
        {.name = "profile", .metavar = "NAME", .help = "plan for a named GPU instead of probing one"},
        {.name = "smem-budget", .metavar = "BYTES", .help = "lower the per-block shared-memory budget"},
        {.name = "weights",
         .metavar = "FORMAT",
         .help = "weight format of experts and linears: bf16, fp8, nvfp4 (W4A4), nvfp4-w4a16"},
        {.name = "kernels", .help = "list the CUDA backend's kernels (the planner's choices) instead of a plan"},
        {.name = "json", .help = "print JSON instead of a table"},
        {.name = "tensor-parallel", .metavar = "N", .help = "with --model: plan one of N ranks and print the layout"},
        {.name = "expert-parallel", .help = "with --tensor-parallel: routed experts by expert"},
        {.name = "max-seqs", .metavar = "N", .help = "a server's --max-seqs: its decode graph sizes (default 64)"},
        {.name = "max-context", .metavar = "N", .help = "with --tensor-parallel: tokens a sequence may reach (default "
                                                        "4096); the attention's layout assumes half on average"},
        {.name = "data-parallel-attention", .metavar = "WHEN",
         .help = "with --tensor-parallel: on, off or auto (default: data-parallel where --max-seqs sequences read "
                 "fewer bytes a rank that way)"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        char about[512];
        snprintf(about, sizeof about,
                 "Plans every op for a GPU: kernel variant, instruction family, tile, stages, shared memory, "
                 "expected bound and why.\nProfiles: %s.",
                 plan_profile_names());
        cli_print_help("moeserve plan [--model DIR] [--device N | --profile NAME] [--smem-budget BYTES] "
                       "[--weights FORMAT] [--tensor-parallel N [--expert-parallel] [--data-parallel-attention WHEN]] [--max-seqs N] [--kernels] [--json]",
                       about, opts, n);
        return 0;
    }
    if (r == CLI_ERROR) {
        LOG_ERROR("plan: %s", err.msg);
        return 2;
    }
    if (cli_flag(opts, n, "kernels")) {
        if (cli_flag(opts, n, "json"))
            return print_json(plan_kernels_to_json(&CUDA_KERNELS));
        plan_kernels_print(&CUDA_KERNELS);
        return 0;
    }
    const char *profile = cli_get(opts, n, "profile", NULL);
    if (profile && cli_get(opts, n, "device", NULL)) {
        LOG_ERROR("plan: --device and --profile exclude each other");
        return 2;
    }
    long device = 0, budget = 0, tp = 1, max_seqs = 64, max_context = 4096;
    const char *dpa = cli_get(opts, n, "data-parallel-attention", "auto");
    if (strcmp(dpa, "auto") != 0 && strcmp(dpa, "on") != 0 && strcmp(dpa, "off") != 0) {
        LOG_ERROR("plan: --data-parallel-attention: expected on, off or auto, got \"%s\"", dpa);
        return 2;
    }
    if (cli_int(opts, n, "device", 0, 1023, &device, &err) || cli_int(opts, n, "max-seqs", 1, 4096, &max_seqs, &err) ||
        cli_int(opts, n, "max-context", 1, 1L << 24, &max_context, &err) ||
        cli_int(opts, n, "smem-budget", 1, 1L << 30, &budget, &err) ||
        cli_int(opts, n, "tensor-parallel", 1, 4096, &tp, &err)) {
        LOG_ERROR("plan: %s", err.msg);
        return 2;
    }
    if (!cli_get(opts, n, "tensor-parallel", NULL))
        tp = 1;
    if (tp > 1 && !cli_get(opts, n, "model", NULL)) {
        LOG_ERROR("plan: --tensor-parallel needs --model (the layout is the model's)");
        return 2;
    }
    struct model_shard shard = {.rank = 0, .size = (int)tp, .expert_parallel = cli_flag(opts, n, "expert-parallel")};
    struct plan_weights w;
    plan_weights_default(&w, WEIGHT_BF16, false);
    const char *wopt = cli_get(opts, n, "weights", NULL);
    if (wopt && !plan_parse_weights(wopt, &w)) {
        LOG_ERROR("plan: option --weights: \"%s\" is not one of bf16, fp8, nvfp4, nvfp4-w4a16", wopt);
        return 2;
    }

    struct device_caps caps;
    int rc = plan_load_caps(profile, (int)device, &caps);
    if (rc)
        return rc;
    return plan_build_print(&caps, cli_get(opts, n, "model", NULL), wopt != NULL, &w, (size_t)budget,
                            cli_flag(opts, n, "json"), &shard, shard.expert_parallel, (int)max_seqs, (int)max_context,
                            strcmp(dpa, "on") == 0 ? 1 : strcmp(dpa, "off") == 0 ? -1 : 0);
}
