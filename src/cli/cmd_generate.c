/* cmd_generate.c — `moeserve generate`: continue a prompt.
 *
 * --prompt TEXT is encoded with the model's tokenizer and the continuation is
 * streamed to stdout as text (whole UTF-8 characters only); --chat first
 * renders the prompt as a user message through the model's chat template.
 * --tokens 1,2,3 takes and prints token ids instead (one per line).
 * Timings and memory go to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/log.h"
#include "cli/cli_args.h"
#include "cli/cli_ranks.h"
#include "cli/commands.h"
#include "engine/generate.h"
#include "template/chat_template.h"
#include "format/tokenizer.h"

struct printer {
    struct detok_stream ds; /* text mode when ds.tok is set */
    struct err err;
    bool failed;
};

static bool print_token(void *user, int32_t tok)
{
    struct printer *p = user;
    if (!p->ds.tok) {
        printf("%d\n", tok);
        fflush(stdout);
        return true;
    }
    char buf[256];
    size_t n = 0;
    if (detok_stream_push(&p->ds, tok, buf, sizeof buf, &n, &p->err)) {
        p->failed = true;
        return false;
    }
    fwrite(buf, 1, n, stdout);
    fflush(stdout);
    return true;
}

/* Renders the prompt as one user turn with the generation prompt appended. */
static enum status chat_wrap(const char *model, const char *prompt, char **out, struct err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model);
    struct chat_template *ct = NULL;
    struct json *vars = NULL;
    enum status st = chat_template_from_config(&ct, path, &vars, err);
    if (st)
        return st;
    struct json *ctx = vars ? vars : json_new_object();
    struct json *msgs = json_add(ctx, "messages", json_new_array());
    struct json *m = json_append(msgs, json_new_object());
    json_add(m, "role", json_new_string("user"));
    json_add(m, "content", json_new_string(prompt));
    json_add(ctx, "add_generation_prompt", json_new_bool(true));
    size_t len = 0;
    st = chat_template_render(ct, ctx, out, &len, err);
    json_free(ctx);
    chat_template_free(ct);
    return st;
}

/* The options of one run, parsed and checked. */
struct generate_args {
    const char *model, *prompt, *tokens; /* exactly one of prompt and tokens */
    long n_new, top_k, seed, max_ctx;
    double temp, top_p;
    bool chat;
};

/* Fills a from the command line. Returns -1 when generation should go ahead,
 * else the exit code: 0 after --help, 2 for a bad option. */
static int generate_parse_args(int argc, char **argv, struct cli_opt *opts, int n, struct generate_args *a)
{
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
    *a = (struct generate_args){.prompt = cli_get(opts, n, "prompt", NULL), .tokens = cli_get(opts, n, "tokens", NULL),
                                .n_new = 32, .temp = 0.0, .top_p = 1.0};
    if (!a->prompt == !a->tokens) {
        LOG_ERROR("generate: give exactly one of --prompt and --tokens (see --help)");
        return 2;
    }
    if (cli_int(opts, n, "n", 0, 1 << 20, &a->n_new, &err) || cli_int(opts, n, "top-k", 0, 1 << 24, &a->top_k, &err) ||
        cli_int(opts, n, "seed", 0, 0x7fffffffL, &a->seed, &err) ||
        cli_int(opts, n, "max-context", 1, 1 << 24, &a->max_ctx, &err) ||
        cli_float(opts, n, "temperature", 0, 100, &a->temp, &err) ||
        cli_float(opts, n, "top-p", 1e-9, 1, &a->top_p, &err)) {
        LOG_ERROR("generate: %s", err.msg);
        return 2;
    }
    a->model = cli_get(opts, n, "model", cli_default_model());
    a->chat = cli_flag(opts, n, "chat");
    return -1;
}

/* Turns --prompt (through the tokenizer, which *tok keeps for printing the
 * continuation as text) or --tokens into *ids. Returns -1 on success, else the
 * exit code: 1 when the model's files fail, 2 for a bad or empty prompt. */
static int generate_load_prompt(const struct generate_args *a, struct tokenizer **tok, struct printer *pr,
                                int32_t **ids, int *n_ids)
{
    struct err err = {0};
    if (!a->prompt) {
        if (cli_parse_ids(a->tokens, "--tokens", ids, n_ids, &err)) {
            LOG_ERROR("generate: %s", err.msg);
            return 2;
        }
        return -1;
    }
    char *chat = NULL;
    struct tok_ids ti = {0};
    if ((a->chat && chat_wrap(a->model, a->prompt, &chat, &err)) || cli_load_tokenizer(a->model, tok, &err) ||
        tokenizer_encode(*tok, chat ? chat : a->prompt, strlen(chat ? chat : a->prompt), false, &ti, &err)) {
        LOG_ERROR("generate: %s", err.msg);
        free(chat);
        tokenizer_free(*tok);
        *tok = NULL;
        return 1;
    }
    free(chat);
    *ids = ti.ids;
    *n_ids = (int)ti.n;
    detok_stream_init(&pr->ds, *tok, true);
    if (*n_ids == 0) {
        LOG_ERROR("generate: the prompt encodes to no tokens");
        tokenizer_free(*tok);
        *tok = NULL;
        free(*ids);
        *ids = NULL;
        return 2;
    }
    return -1;
}

/* Prints the text the detokenizer held back for whole UTF-8 characters, and
 * ends the line. */
static void generate_flush_text(struct printer *pr, struct err *err)
{
    char buf[256];
    size_t k = 0;
    do {
        if (detok_stream_flush(&pr->ds, buf, sizeof buf, &k, err))
            break;
        fwrite(buf, 1, k, stdout);
    } while (k);
    putchar('\n');
    fflush(stdout);
}

static void generate_log_stats(const struct generate_stats *gs)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    LOG_INFO("prompt: %d tokens in %.3f s (%.1f tok/s); generated: %d tokens, %d decode steps in %.3f s "
             "(%.2f tok/s); peak RSS %.1f MiB",
             gs->n_prompt, gs->t_prefill, gs->t_prefill > 0 ? gs->n_prompt / gs->t_prefill : 0.0, gs->n_generated,
             gs->n_decode_steps, gs->t_decode, gs->t_decode > 0 ? gs->n_generated / gs->t_decode : 0.0,
             (double)ru.ru_maxrss / 1024.0);
}

int cmd_generate(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "checkpoint directory (default: the shipped model)"},
        {.name = "tokens", .metavar = "IDS", .help = "prompt as comma-separated token ids"},
        {.name = "prompt", .metavar = "TEXT", .help = "prompt text, encoded with the model's tokenizer"},
        {.name = "chat", .help = "wrap the prompt in the model's chat template as a user message"},
        {.name = "n", .short_name = 'n', .metavar = "N", .help = "tokens to generate (default 32)"},
        {.name = "temperature", .metavar = "X", .help = "0 = greedy (default 0)"},
        {.name = "top-p", .metavar = "P", .help = "nucleus sampling mass in (0, 1] (default 1)"},
        {.name = "top-k", .metavar = "K", .help = "keep the K most likely tokens (default off)"},
        {.name = "seed", .metavar = "S", .help = "random seed for sampling (default 0)"},
        {.name = "max-context", .metavar = "N", .help = "KV cache size in tokens (default: prompt + n)"},
        {.name = "backend", .metavar = "NAME", .help = "cpu (default) or cuda"},
        {.name = "smem-budget", .metavar = "BYTES", .help = "cuda: plan kernels for this shared memory per block "
                                                           "(e.g. 101376, an sm_120's)"},
        {.name = "allow-long-context", .help = "let the context run past the model's max_position_embeddings"},
        {.name = "kv-cache-dtype", .metavar = "T",
         .help = "MLA latent cache rows: bf16 (default), f32 (reference runs) or fp8 (656 B a GLM-5 token)"},
        {.name = "attention-precision", .metavar = "P", .help = "cuda: prefill attention operands: hi_lo (default, "
                                                                  "fp32-grade), pv_bf16 or bf16 (faster, bf16-grade)"},
        CLI_RANK_OPTS,
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct generate_args a;
    int rc = generate_parse_args(argc, argv, opts, n, &a);
    if (rc >= 0)
        return rc;
    int32_t *ids = NULL;
    int n_ids = 0;
    struct printer pr = {0};
    struct tokenizer *tok = NULL;
    rc = generate_load_prompt(&a, &tok, &pr, &ids, &n_ids);
    if (rc >= 0)
        return rc;
    long max_ctx = a.max_ctx ? a.max_ctx : n_ids + a.n_new;
    struct session_opts so = {.backend = cli_get(opts, n, "backend", "cpu"), .max_tokens = n_ids < 512 ? n_ids : 512,
                              .max_seqs = 1, .max_context = (int)max_ctx, .smem_budget = cli_smem_budget(opts, n),
                              .attention_precision = cli_attention_precision(opts, n),
                              .kv_cache_dtype = cli_get(opts, n, "kv-cache-dtype", NULL), .check_positions = true,
                              .allow_long_context = cli_flag(opts, n, "allow-long-context")};
    struct err err = {0};
    struct model_session s;
    struct cli_ranks ranks;
    if (cli_ranks_open(&ranks, opts, n, argc, argv, &so, &err)) {
        LOG_ERROR("generate: %s", err.msg);
        free(ids);
        tokenizer_free(tok);
        return 2;
    }
    if (cli_ranks_loaded(&ranks, model_session_open(&s, a.model, &so, &err), &err) ||
        cli_ranks_follow(&ranks, &s, &rc)) {
        if (err.code)
            LOG_ERROR("%s", err.msg);
        rc = err.code ? 1 : rc;
        model_session_close(&s);
        cli_ranks_close(&ranks);
        free(ids);
        tokenizer_free(tok);
        detok_stream_free(&pr.ds);
        return rc;
    }
    struct generate_params gp = {
        .max_new = (int)a.n_new,
        .sampling = {.temperature = (float)a.temp, .top_p = (float)a.top_p, .top_k = (int)a.top_k,
                     .seed = (uint64_t)a.seed},
        .stop_ids = s.desc.eos_ids,
        .n_stop = s.desc.n_eos,
    };
    struct generate_stats gs;
    enum status st = generate_run(&s, ids, n_ids, &gp, print_token, &pr, &gs, &err);
    if (!st && pr.failed)
        st = err_set(&err, pr.err.code, "%s", pr.err.msg);
    if (!st && tok)
        generate_flush_text(&pr, &err);
    rc = 0;
    if (st) {
        LOG_ERROR("%s", err.msg);
        rc = 1;
    } else {
        generate_log_stats(&gs);
    }
    cli_ranks_stop(&ranks, &s);
    model_session_close(&s);
    cli_ranks_close(&ranks);
    detok_stream_free(&pr.ds);
    tokenizer_free(tok);
    free(ids);
    return rc;
}
