/* cmd_generate.c — `moeserve generate`: continue a prompt.
 *
 * Until the tokenizer lands the prompt is given as token ids and the output
 * is token ids, one per line on stdout; timings go to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "base/log.h"
#include "cli/cli_args.h"
#include "cli/commands.h"
#include "engine/generate.h"

static bool print_token(void *user, int32_t tok)
{
    (void)user;
    printf("%d\n", tok);
    fflush(stdout);
    return true;
}

int cmd_generate(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "checkpoint directory (default: the shipped model)"},
        {.name = "tokens", .metavar = "IDS", .help = "prompt as comma-separated token ids"},
        {.name = "prompt", .metavar = "TEXT", .help = "prompt text (needs the tokenizer)"},
        {.name = "n", .short_name = 'n', .metavar = "N", .help = "tokens to generate (default 32)"},
        {.name = "temperature", .metavar = "X", .help = "0 = greedy (default 0)"},
        {.name = "top-p", .metavar = "P", .help = "nucleus sampling mass in (0, 1] (default 1)"},
        {.name = "top-k", .metavar = "K", .help = "keep the K most likely tokens (default off)"},
        {.name = "seed", .metavar = "S", .help = "random seed for sampling (default 0)"},
        {.name = "max-context", .metavar = "N", .help = "KV cache size in tokens (default: prompt + n)"},
        {.name = "backend", .metavar = "NAME", .help = "cpu (default) or cuda"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve generate [--model DIR] (--tokens 1,2,3 | --prompt TEXT) [-n N] [--temperature X] "
                       "[--top-p P] [--seed S] [--backend cpu|cuda]",
                       "Generates a continuation of the prompt; prints one token id per line.", opts, n);
        return 0;
    }
    if (r == CLI_ERROR) {
        LOG_ERROR("generate: %s", err.msg);
        return 2;
    }
    if (cli_get(opts, n, "prompt", NULL)) {
        LOG_ERROR("generate: --prompt needs the tokenizer, which this build does not have yet; use --tokens");
        return 2;
    }
    if (!cli_get(opts, n, "tokens", NULL)) {
        LOG_ERROR("generate: --tokens is required (see --help)");
        return 2;
    }
    long n_new = 32, top_k = 0, seed = 0, max_ctx = 0;
    double temp = 0.0, top_p = 1.0;
    if (cli_int(opts, n, "n", 0, 1 << 20, &n_new, &err) || cli_int(opts, n, "top-k", 0, 1 << 24, &top_k, &err) ||
        cli_int(opts, n, "seed", 0, 0x7fffffffL, &seed, &err) ||
        cli_int(opts, n, "max-context", 1, 1 << 24, &max_ctx, &err) ||
        cli_float(opts, n, "temperature", 0, 100, &temp, &err) ||
        cli_float(opts, n, "top-p", 1e-9, 1, &top_p, &err)) {
        LOG_ERROR("generate: %s", err.msg);
        return 2;
    }
    int32_t *ids = NULL;
    int n_ids = 0;
    if (cli_parse_ids(cli_get(opts, n, "tokens", NULL), "--tokens", &ids, &n_ids, &err)) {
        LOG_ERROR("generate: %s", err.msg);
        return 2;
    }
    if (!max_ctx)
        max_ctx = n_ids + n_new;
    const char *model = cli_get(opts, n, "model", cli_default_model());
    struct session_opts so = {.backend = cli_get(opts, n, "backend", "cpu"), .max_tokens = n_ids < 512 ? n_ids : 512,
                              .max_seqs = 1, .max_context = (int)max_ctx};
    struct model_session s;
    if (model_session_open(&s, model, &so, &err)) {
        LOG_ERROR("%s", err.msg);
        free(ids);
        return 1;
    }
    struct generate_params gp = {
        .max_new = (int)n_new,
        .sampling = {.temperature = (float)temp, .top_p = (float)top_p, .top_k = (int)top_k, .seed = (uint64_t)seed},
        .stop_ids = s.desc.eos_ids,
        .n_stop = s.desc.n_eos,
    };
    struct generate_stats gs;
    enum status st = generate_run(&s, ids, n_ids, &gp, print_token, NULL, &gs, &err);
    int rc = 0;
    if (st) {
        LOG_ERROR("%s", err.msg);
        rc = 1;
    } else {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        LOG_INFO("prompt: %d tokens in %.3f s (%.1f tok/s); generated: %d tokens, %d decode steps in %.3f s "
                 "(%.2f tok/s); peak RSS %.1f MiB",
                 gs.n_prompt, gs.t_prefill, gs.t_prefill > 0 ? gs.n_prompt / gs.t_prefill : 0.0, gs.n_generated,
                 gs.n_decode_steps, gs.t_decode, gs.t_decode > 0 ? gs.n_generated / gs.t_decode : 0.0,
                 (double)ru.ru_maxrss / 1024.0);
    }
    model_session_close(&s);
    free(ids);
    return rc;
}
