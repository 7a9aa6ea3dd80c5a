/* cmd_bench.c — `moeserve bench`: prefill and decode speed against the roofline.
 *
 * Decode at batch 1 is memory bound: every step must read the attention
 * weights, the router, the k chosen experts of every layer and lm_head once.
 * The bench counts exactly those bytes (from the bound weights, whatever
 * their format: bench_decode_bytes) and reports the achieved GB/s next to a
 * copy bandwidth measured in the same run: a device-to-device cudaMemcpy on
 * the cuda backend, an all-threads memcpy on the cpu backend. Decode is
 * timed at every --batch size (each sequence with its own random prompt of
 * --decode-context tokens), prefill on one --prompt-len prompt. On a GPU,
 * NVML power is sampled over each timed phase (n/a without NVML), and the
 * device memory in use after the load is reported with the peak RSS.
 *
 * Inputs are random token ids (never zeros); the model should be a
 * real-shape checkpoint (tools/make_synth_checkpoint). A batch size that
 * fails (out of cache, say) is reported as such and the others still run;
 * the exit status is then 1.
 *
 * `moeserve bench serve ...` is the HTTP serving benchmark (cmd_bench_serve).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/cpu/cpu_membw.h"
#include "base/json.h"
#include "base/log.h"
#include "cli/bench_runs.h"
#include "cli/cli_args.h"
#include "cli/bench_allreduce.h"
#include "cli/cli_ranks.h"
#include "cli/cli_synth.h"
#include "cli/commands.h"
#include "engine/model_session.h"
#include "plan/power_sampler.h"
#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/cuda_device_info.h"
#include "backend/cuda/cuda_membw.h"
#endif

enum {
    BENCH_CUDA_DEVICE = 0, /* model_session_open puts the cuda backend on device 0 */
    BENCH_MAX_BATCHES = 16,
    BENCH_BLOCK = 16,      /* KV block size in tokens (the session default) */
};

/* Everything the report prints; -1 (or 0 for sizes) marks a figure this run could not take. */
struct bench_report {
    const char *model, *backend;
    char device[256];
    long prompt_len, steps, context, reps, seed, copy_mib;
    bool fill_random; /* --context-fill random: the decode contexts are random cache rows, not prefilled */
    double weights_bytes;
    double gpu_used_mib, gpu_total_mib; /* after the load */
    double gpu_used_end_mib;            /* after every timed phase: scratch grown to the largest shape */
    double peak_rss_mib;
    double copy_gbs;
    const char *copy_method;
    double power_limit_w;
    struct bench_timing prefill;
    int n_batches;
    int batches[BENCH_MAX_BATCHES];
    struct bench_timing decode[BENCH_MAX_BATCHES];
    double step_bytes[BENCH_MAX_BATCHES]; /* weight bytes one step reads (expected, see bench_decode_bytes) */
    char error[BENCH_MAX_BATCHES][256];   /* "" when the batch ran */
};

/* "1,8,64" -> sizes in 1..4096, at most BENCH_MAX_BATCHES of them. */
static enum status bench_parse_batches(const char *s, struct bench_report *r, struct err *err)
{
    r->n_batches = 0;
    const char *c = s;
    while (*c) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c || v < 1 || v > 4096 || (*end && *end != ',') || r->n_batches == BENCH_MAX_BATCHES)
            return err_set(err, STATUS_INVALID,
                           "--batch: \"%s\" is not a list of at most %d batch sizes in 1..4096 (e.g. 1,8,64)", s,
                           BENCH_MAX_BATCHES);
        r->batches[r->n_batches++] = (int)v;
        c = *end ? end + 1 : end;
    }
    return r->n_batches ? STATUS_OK : err_set(err, STATUS_INVALID, "--batch: no batch size given");
}

/* n random ids in [0, vocab) from a 64-bit LCG (never all zeros, unlike a zeroed buffer). */
static void bench_random_tokens(uint64_t *state, int32_t *out, size_t n, int vocab)
{
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = (int32_t)((*state >> 33) % (uint64_t)vocab);
    }
}

/* Device memory in use now, MiB; -1 when not on cuda or unknown. */
static double bench_gpu_used_mib(const struct bench_report *r)
{
#ifdef MOESERVE_HAVE_CUDA
    struct err e = {0};
    struct cuda_device_info info;
    if (strcmp(r->backend, "cuda") == 0 && cuda_device_info_get(BENCH_CUDA_DEVICE, &info, &e) == STATUS_OK)
        return (double)info.mem_used / (1 << 20);
#endif
    (void)r;
    return -1;
}

/* GPU name and memory after the load, and the power sampler: cuda only. */
static void bench_device_figures(struct bench_report *r, struct power_sampler *ps, bool *have_ps)
{
    *have_ps = false;
    r->gpu_used_mib = r->gpu_total_mib = -1;
    r->power_limit_w = -1;
#ifdef MOESERVE_HAVE_CUDA
    if (strcmp(r->backend, "cuda") == 0) {
        struct err e = {0};
        struct cuda_device_info info;
        if (cuda_device_info_get(BENCH_CUDA_DEVICE, &info, &e) == STATUS_OK) {
            snprintf(r->device, sizeof r->device, "%s", info.name);
            r->gpu_used_mib = (double)info.mem_used / (1 << 20);
            r->gpu_total_mib = (double)info.mem_total / (1 << 20);
        } else {
            LOG_WARN("bench: %s", e.msg);
        }
        if (power_sampler_init(ps, info.pci_bus_id[0] ? info.pci_bus_id : NULL, 20, &e) == STATUS_OK) {
            *have_ps = true;
            r->power_limit_w = ps->limit_w > 0 ? ps->limit_w : -1;
        } else {
            LOG_INFO("bench: power n/a: %s", e.msg);
        }
        return;
    }
#endif
    (void)ps;
    snprintf(r->device, sizeof r->device, "cpu");
}

static void bench_copy_bandwidth(struct bench_report *r)
{
    LOG_INFO("bench: measuring copy bandwidth (%ld MiB buffers)", r->copy_mib);
    size_t bytes = (size_t)r->copy_mib << 20;
#ifdef MOESERVE_HAVE_CUDA
    if (strcmp(r->backend, "cuda") == 0) {
        struct err e = {0};
        r->copy_method = "cuda device-to-device memcpy";
        if (cuda_memcpy_bandwidth(BENCH_CUDA_DEVICE, bytes, 10, &r->copy_gbs, &e) != STATUS_OK) {
            LOG_WARN("bench: copy bandwidth n/a: %s", e.msg);
            r->copy_gbs = -1;
        }
        return;
    }
#endif
    r->copy_method = "cpu memcpy, all threads";
    r->copy_gbs = cpu_memcpy_bandwidth(bytes, 5);
    if (r->copy_gbs <= 0)
        r->copy_gbs = -1;
}

/* JSON number, or null for a figure marked unknown (< 0). */
static struct json *num_or_null(double v)
{
    return v < 0 ? json_new_null() : json_new_number(v);
}

static double power_w(const struct power_reading *p)
{
    return !p->valid ? -1 : p->energy_avg_w >= 0 ? p->energy_avg_w : p->avg_w;
}

static void json_add_power(struct json *o, const struct power_reading *p)
{
    json_add(o, "power_avg_w", num_or_null(power_w(p)));
    json_add(o, "power_pct_of_limit", num_or_null(p->valid ? p->pct_of_limit : -1));
    json_add(o, "power_sampled_avg_w", num_or_null(p->valid ? p->avg_w : -1));
    json_add(o, "power_sampled_max_w", num_or_null(p->valid ? p->max_w : -1));
    json_add(o, "power_samples", json_new_number(p->n_samples));
}

static double pct(double part, double whole)
{
    return part < 0 || whole <= 0 ? -1 : 100.0 * part / whole;
}

/* The row that stands for "decode" in the flat keys: batch 1 if it ran, else the first that did; -1 if none. */
static int bench_main_row(const struct bench_report *r)
{
    for (int i = 0; i < r->n_batches; i++)
        if (!r->error[i][0] && r->batches[i] == 1)
            return i;
    for (int i = 0; i < r->n_batches; i++)
        if (!r->error[i][0])
            return i;
    return -1;
}

static void bench_print_json(const struct bench_report *r)
{
    struct json *o = json_new_object();
    json_add(o, "model", json_new_string(r->model));
    json_add(o, "backend", json_new_string(r->backend));
    json_add(o, "device", json_new_string(r->device));
    json_add(o, "weights_bytes", json_new_number(r->weights_bytes));
    json_add(o, "gpu_mem_used_mib", num_or_null(r->gpu_used_mib));
    json_add(o, "gpu_mem_total_mib", num_or_null(r->gpu_total_mib));
    json_add(o, "gpu_mem_used_end_mib", num_or_null(r->gpu_used_end_mib));
    json_add(o, "peak_rss_mib", json_new_number(r->peak_rss_mib));
    json_add(o, "copy_gb_s", num_or_null(r->copy_gbs));
    json_add(o, "copy_method", json_new_string(r->copy_method));
    json_add(o, "copy_mib", json_new_number((double)r->copy_mib));
    json_add(o, "power_limit_w", num_or_null(r->power_limit_w));
    json_add(o, "seed", json_new_number((double)r->seed));
    struct json *p = json_add(o, "prefill", json_new_object());
    json_add(p, "tokens", json_new_number((double)r->prompt_len));
    json_add(p, "reps", json_new_number((double)r->reps));
    json_add(p, "seconds", json_new_number(r->prefill.seconds));
    json_add(p, "tok_s", json_new_number((double)r->prefill.tokens / r->prefill.seconds));
    json_add_power(p, &r->prefill.power);
    struct json *rows = json_add(o, "decode", json_new_array());
    for (int i = 0; i < r->n_batches; i++) {
        const struct bench_timing *t = &r->decode[i];
        struct json *d = json_append(rows, json_new_object());
        json_add(d, "batch", json_new_number(r->batches[i]));
        json_add(d, "context", json_new_number((double)r->context));
        json_add(d, "steps", json_new_number((double)r->steps));
        if (r->error[i][0]) {
            json_add(d, "error", json_new_string(r->error[i]));
            continue;
        }
        double gbs = r->step_bytes[i] * (double)r->steps / t->seconds / 1e9;
        json_add(d, "seconds", json_new_number(t->seconds));
        json_add(d, "tok_s", json_new_number((double)t->tokens / t->seconds));
        json_add(d, "ms_per_step", json_new_number(1e3 * t->seconds / (double)r->steps));
        json_add(d, "weight_bytes_per_step", json_new_number(r->step_bytes[i]));
        json_add(d, "weight_gb_s", json_new_number(gbs));
        json_add(d, "pct_of_copy", num_or_null(pct(gbs, r->copy_gbs)));
        json_add_power(d, &t->power);
    }
    /* flat keys of the first version of this command, for scripts that read them */
    json_add(o, "prompt_len", json_new_number((double)r->prompt_len));
    json_add(o, "prefill_tok_s", json_new_number((double)r->prefill.tokens / r->prefill.seconds));
    json_add(o, "decode_steps", json_new_number((double)r->steps));
    int m = bench_main_row(r);
    if (m >= 0) {
        double gbs = r->step_bytes[m] * (double)r->steps / r->decode[m].seconds / 1e9;
        json_add(o, "decode_batch", json_new_number(r->batches[m]));
        json_add(o, "decode_tok_s", json_new_number((double)r->decode[m].tokens / r->decode[m].seconds));
        json_add(o, "decode_weight_bytes_per_token", json_new_number(r->step_bytes[m] / r->batches[m]));
        json_add(o, "decode_weight_gb_s", json_new_number(gbs));
        json_add(o, "memcpy_gb_s", num_or_null(r->copy_gbs));
        json_add(o, "decode_pct_of_memcpy", num_or_null(pct(gbs, r->copy_gbs)));
    }
    char *js = json_print(o, true);
    printf("%s\n", js);
    free(js);
    json_free(o);
}

/* "  512.3   73.2" or "    n/a    n/a" */
static void print_power(const struct power_reading *p)
{
    if (p->valid && p->pct_of_limit >= 0)
        printf(" %8.1f %8.1f\n", power_w(p), p->pct_of_limit);
    else if (p->valid)
        printf(" %8.1f %8s\n", power_w(p), "n/a");
    else
        printf(" %8s %8s\n", "n/a", "n/a");
}

static void bench_print_table(const struct bench_report *r)
{
    printf("model        %s (%s backend, %s)\n", r->model, r->backend, r->device);
    printf("weights      %.2f GB; a batch-1 decode step reads %.3f GB of them\n", r->weights_bytes / 1e9,
           bench_main_row(r) >= 0 ? r->step_bytes[bench_main_row(r)] / r->batches[bench_main_row(r)] / 1e9 : 0.0);
    if (r->gpu_used_mib >= 0)
        printf("memory       GPU %.1f of %.1f GiB in use after load, %.1f GiB after the runs; peak RSS %.1f MiB\n",
               r->gpu_used_mib / 1024, r->gpu_total_mib / 1024, r->gpu_used_end_mib / 1024, r->peak_rss_mib);
    else
        printf("memory       peak RSS %.1f MiB\n", r->peak_rss_mib);
    if (r->copy_gbs > 0)
        printf("copy         %.1f GB/s (%s of %ld MiB, read+write)\n", r->copy_gbs, r->copy_method, r->copy_mib);
    else
        printf("copy         n/a (%s)\n", r->copy_method);
    if (r->power_limit_w > 0)
        printf("power limit  %.0f W (NVML)\n", r->power_limit_w);
    else
        printf("power limit  n/a\n");
    printf("\n%-8s %6s %6s %8s %9s %10s %8s %11s %7s %8s %8s\n", "phase", "batch", "ctx", "tokens", "seconds",
           "tok/s", "ms/step", "weight GB/s", "% copy", "power W", "% limit");
    printf("%-8s %6d %6s %8ld %9.3f %10.1f %8s %11s %7s", "prefill", 1, "-", r->prefill.tokens,
           r->prefill.seconds, (double)r->prefill.tokens / r->prefill.seconds, "-", "-", "-");
    print_power(&r->prefill.power);
    for (int i = 0; i < r->n_batches; i++) {
        const struct bench_timing *t = &r->decode[i];
        if (r->error[i][0]) {
            printf("%-8s %6d %6ld  failed: %s\n", "decode", r->batches[i], r->context, r->error[i]);
            continue;
        }
        double gbs = r->step_bytes[i] * (double)r->steps / t->seconds / 1e9, p = pct(gbs, r->copy_gbs);
        char pc[16] = "n/a";
        if (p >= 0)
            snprintf(pc, sizeof pc, "%.1f", p);
        printf("%-8s %6d %6ld %8ld %9.3f %10.2f %8.2f %11.1f %7s", "decode", r->batches[i], r->context, t->tokens,
               t->seconds, (double)t->tokens / t->seconds, 1e3 * t->seconds / (double)r->steps, gbs, pc);
        print_power(&t->power);
    }
    printf("(decode tokens = batch x steps; weight GB/s counts the experts a step touches, expected under uniform "
           "routing above batch 1;\n power = NVML energy counter over the timed phase where the driver has one)\n");
}

/* The session the phases need: a pass takes the whole prompt, or one whole decode prompt, or one
 * token per sequence. The cache is one pool of blocks that any sequence may draw from
 * (forward.max_blocks = kv.n_blocks), so it is sized for the largest phase, not max_seqs x the
 * longest sequence: the forward uploads a block-table row of that many ids per sequence every
 * pass. */
static struct session_opts bench_session_opts(const struct bench_report *r, int max_batch,
                                              const struct cli_opt *opts, int n)
{
    long max_tokens = r->fill_random || r->prompt_len > r->context ? r->prompt_len : r->context;
    max_tokens = max_tokens > max_batch ? max_tokens : max_batch;
    long per_seq_blocks = (r->context + BENCH_WARMUP_STEPS + r->steps + BENCH_BLOCK - 1) / BENCH_BLOCK;
    long blocks = (r->prompt_len + BENCH_BLOCK - 1) / BENCH_BLOCK;
    blocks = blocks > max_batch * per_seq_blocks ? blocks : max_batch * per_seq_blocks;
    long max_context = (blocks + max_batch - 1) / max_batch * BENCH_BLOCK; /* model_session: per sequence */
    struct session_opts so = {.backend = cli_get(opts, n, "backend", "cpu"), .max_tokens = (int)max_tokens,
                              .max_seqs = max_batch, .max_context = (int)max_context, .block_size = BENCH_BLOCK,
                              .smem_budget = cli_smem_budget(opts, n),
                              .attention_precision = cli_attention_precision(opts, n),
                              .kv_cache_dtype = cli_get(opts, n, "kv-cache-dtype", NULL)};
    return so;
}

/* Times prefill, then decode at every batch size, into r. A failed batch size is recorded in
 * r->error and clears *all_ok, and the others still run; 1 (logged) when nothing could be
 * reported: no memory for the prompts, or the prefill failed. */
static int bench_run_phases(struct model_session *s, struct bench_report *r, int max_batch,
                            struct power_sampler *ps, bool *all_ok)
{
    struct err err = {0};
    int rc = 1, V = s->desc.vocab_size;
    uint64_t rng = (uint64_t)r->seed * 0x9e3779b97f4a7c15ull + 1;
    int32_t *prompt = malloc((size_t)r->prompt_len * sizeof *prompt);
    int32_t *prompts = malloc((size_t)max_batch * (size_t)r->context * sizeof *prompts);
    if (!prompt || !prompts) {
        LOG_ERROR("bench: out of memory for the prompts");
        goto done;
    }
    bench_random_tokens(&rng, prompt, (size_t)r->prompt_len, V);
    bench_random_tokens(&rng, prompts, (size_t)max_batch * (size_t)r->context, V);

    LOG_INFO("bench: prefill of %ld tokens (%ld timed pass%s after one warm-up)", r->prompt_len, r->reps,
             r->reps == 1 ? "" : "es");
    if (bench_prefill(s, prompt, (int)r->prompt_len, (int)r->reps, ps, &r->prefill, &err)) {
        LOG_ERROR("bench: prefill: %s", err.msg);
        goto done;
    }
    if (r->fill_random) {
        LOG_INFO("bench: filling the whole KV cache with random rows (the decode contexts, not prefilled)");
        if (kv_cache_fill_random(&s->kv, (uint64_t)r->seed, &err)) {
            LOG_ERROR("bench: %s", err.msg);
            goto done;
        }
    }
    for (int i = 0; i < r->n_batches; i++) {
        LOG_INFO("bench: decode at batch %d (%ld-token %s, %ld timed steps)", r->batches[i], r->context,
                 r->fill_random ? "random contexts" : "prompts", r->steps);
        struct bench_decode_args a = {.batch = r->batches[i], .context = (int)r->context, .steps = (int)r->steps,
                                      .prompts = prompts, .fill_random = r->fill_random};
        if (bench_decode(s, &a, ps, &r->decode[i], &err)) {
            LOG_ERROR("bench: decode at batch %d: %s", r->batches[i], err.msg);
            snprintf(r->error[i], sizeof r->error[i], "%s", err.msg);
            *all_ok = false;
        }
        r->step_bytes[i] = bench_decode_bytes(s, r->batches[i]);
    }
    rc = 0;
done:
    free(prompt);
    free(prompts);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    if (argc > 0 && strcmp(argv[0], "serve") == 0)
        return cmd_bench_serve(argc - 1, argv + 1);
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "checkpoint directory (default: the shipped model)"},
        {.name = "backend", .metavar = "NAME", .help = "cpu (default) or cuda"},
        {.name = "smem-budget", .metavar = "BYTES", .help = "cuda: plan kernels for this shared memory per block "
                                                           "(e.g. 101376, an sm_120's)"},
        {.name = "kv-cache-dtype", .metavar = "T",
         .help = "MLA latent cache rows: bf16 (default), f32 (reference runs) or fp8 (656 B a GLM-5 token)"},
        {.name = "attention-precision", .metavar = "P", .help = "cuda: prefill attention operands: hi_lo (default, "
                                                                  "fp32-grade), pv_bf16 or bf16 (faster, bf16-grade)"},
        {.name = "prompt-len", .metavar = "N", .help = "prefill length in tokens (default 128)"},
        {.name = "prefill-reps", .metavar = "N", .help = "timed prefill passes (default 1)"},
        {.name = "batch", .metavar = "B,B,..", .help = "decode batch sizes (default 1), e.g. 1,8,64"},
        {.name = "decode", .metavar = "N", .help = "timed decode steps per batch size (default 32)"},
        {.name = "decode-context", .metavar = "N", .help = "prompt tokens in each decoding sequence's cache "
                                                             "(default: --prompt-len)"},
        {.name = "context-fill", .metavar = "HOW", .help = "prefill (default): the decode contexts are prompts run "
                                                           "through the model; random: random cache rows (long "
                                                           "contexts without their prefill)"},
        {.name = "seed", .metavar = "S", .help = "seed of the random prompts (default 1)"},
        {.name = "copy-mib", .metavar = "N", .help = "buffer of the copy-bandwidth measurement, far above the "
                                                     "last-level cache (default 1024)"},
        {.name = "json", .help = "print JSON instead of a table"},
        {.name = "allreduce", .help = "time the ranks' all-reduce at 256 B .. 16 MiB instead of the model (with "
                                      "--tensor-parallel N: the communicator a pass uses)"},
        CLI_RANK_OPTS,
        CLI_SYNTH_OPTS,
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result cr = cli_parse(argc, argv, opts, n, &err);
    if (cr == CLI_HELP) {
        cli_print_help("moeserve bench [--model DIR] [--backend cpu|cuda] [--prompt-len N] [--batch 1,8,64] "
                       "[--decode N] [--decode-context N] [--context-fill prefill|random] [--synthetic PRESET] [--json]",
                       "Times prefill and decode at each batch size; reports tok/s, weight GB/s against the "
                       "measured copy bandwidth, NVML power and memory.",
                       opts, n);
        return 0;
    }
    struct bench_report r;
    memset(&r, 0, sizeof r);
    r.prompt_len = 128;
    r.steps = 32;
    r.reps = 1;
    r.seed = 1;
    r.copy_mib = 1024;
    if (cr == CLI_ERROR || cli_int(opts, n, "prompt-len", 1, 1 << 20, &r.prompt_len, &err) ||
        cli_int(opts, n, "decode", 1, 1 << 16, &r.steps, &err) || cli_int(opts, n, "seed", 0, 1L << 30, &r.seed, &err) ||
        cli_int(opts, n, "prefill-reps", 1, 1000, &r.reps, &err) ||
        cli_int(opts, n, "copy-mib", 1, 1 << 16, &r.copy_mib, &err) ||
        (r.context = r.prompt_len, cli_int(opts, n, "decode-context", 1, 1 << 20, &r.context, &err)) ||
        bench_parse_batches(cli_get(opts, n, "batch", "1"), &r, &err)) {
        LOG_ERROR("bench: %s", err.msg);
        return 2;
    }
    const char *fill = cli_get(opts, n, "context-fill", "prefill");
    if (strcmp(fill, "prefill") != 0 && strcmp(fill, "random") != 0) {
        LOG_ERROR("bench: --context-fill: expected prefill or random, got \"%s\"", fill);
        return 2;
    }
    r.fill_random = strcmp(fill, "random") == 0;
    r.model = cli_get(opts, n, "model", cli_default_model());
    int max_batch = 0;
    for (int i = 0; i < r.n_batches; i++)
        max_batch = r.batches[i] > max_batch ? r.batches[i] : max_batch;
    struct session_opts so = bench_session_opts(&r, max_batch, opts, n);
    const char *synth = NULL;
    char label[96];
    if (cli_synth_apply(opts, n, &so, &synth, &err)) {
        LOG_ERROR("bench: %s", err.msg);
        return 2;
    }
    if (synth) {
        snprintf(label, sizeof label, "synthetic %s (%s, weights made on the device)", synth,
                 so.synthetic_bf16 ? "bf16" : "nvfp4");
        r.model = label;
    }
    struct model_session s;
    struct cli_ranks ranks;
    if (cli_ranks_open(&ranks, opts, n, argc, argv, &so, &err)) {
        LOG_ERROR("bench: %s", err.msg);
        return 2;
    }
    int frc = 0;
    if (!cli_ranks_loaded(&ranks, model_session_open(&s, r.model, &so, &err), &err) &&
        cli_flag(opts, n, "allreduce")) { /* every rank times the collective; none follows */
        struct comm *c = s.fwd.comm ? s.fwd.comm : &ranks.comm;
        frc = bench_allreduce_run(&s, c, cli_flag(opts, n, "json"));
        model_session_close(&s);
        cli_ranks_close(&ranks);
        return frc;
    }
    if (err.code || cli_ranks_follow(&ranks, &s, &frc)) {
        if (err.code)
            LOG_ERROR("%s", err.msg);
        model_session_close(&s);
        cli_ranks_close(&ranks);
        return err.code ? 1 : frc;
    }
    r.backend = s.be.ops->name;
    for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++)
        r.weights_bytes += (double)s.w.bytes_by_format[f];
    struct power_sampler ps_store;
    memset(&ps_store, 0, sizeof ps_store);
    bool have_ps;
    bench_device_figures(&r, &ps_store, &have_ps);
    struct power_sampler *ps = have_ps ? &ps_store : NULL;

    int rc = 1;
    bool all_ok = true;
    if (!bench_run_phases(&s, &r, max_batch, ps, &all_ok)) {
        r.gpu_used_end_mib = bench_gpu_used_mib(&r);
        bench_copy_bandwidth(&r);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        r.peak_rss_mib = (double)ru.ru_maxrss / 1024.0;
        if (cli_flag(opts, n, "json"))
            bench_print_json(&r);
        else
            bench_print_table(&r);
        rc = all_ok ? 0 : 1;
    }
    power_sampler_free(&ps_store);
    cli_ranks_stop(&ranks, &s);
    model_session_close(&s);
    cli_ranks_close(&ranks);
    return rc;
}
