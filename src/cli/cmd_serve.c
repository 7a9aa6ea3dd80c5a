/* cmd_serve.c — `moeserve serve`: the OpenAI-compatible server.
 *
 * Opens the model (one session: forward, KV cache), starts the scheduler
 * thread and the HTTP server, prints "listening on http://HOST:PORT" on
 * stdout (tests start it with --port 0 and read the port there), and runs
 * until SIGINT or SIGTERM. Those two signals are blocked in every thread and
 * taken by sigwait here, so no handler and no global flag is needed.
 *
 * The KV cache holds --kv-blocks blocks (rounded up to a multiple of
 * --max-seqs); by default enough for --max-seqs sequences of 1024 tokens, or
 * one of --max-context tokens if that is more.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "cli/cli_args.h"
#include "cli/commands.h"
#include "engine/scheduler.h"
#include "template/chat_template.h"
#include "format/tokenizer.h"
#include "server/server.h"

/* The last path component of dir, without trailing slashes. */
static void model_name_of(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

int cmd_serve(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "checkpoint directory (default: the shipped model)"},
        {.name = "backend", .metavar = "NAME", .help = "cpu (default) or cuda"},
        {.name = "host", .metavar = "ADDR", .help = "address to bind (default 127.0.0.1: this machine only)"},
        {.name = "port", .metavar = "N", .help = "TCP port (default 8000; 0 = any free port)"},
        {.name = "api-key", .metavar = "KEY", .help = "require \"Authorization: Bearer KEY\" on /v1/ routes "
                                                       "(default: $MOESERVE_API_KEY, else none)"},
        {.name = "served-model-name", .metavar = "NAME", .help = "model id for clients (default: the directory's name)"},
        {.name = "max-seqs", .metavar = "N", .help = "sequences decoded together (default 64)"},
        {.name = "max-tokens", .metavar = "N", .help = "tokens per forward pass, decode + prefill chunks (default 512)"},
        {.name = "max-context", .metavar = "N", .help = "prompt + generated tokens per request (default: the model's "
                                                       "max_position_embeddings, at most 32768)"},
        {.name = "kv-blocks", .metavar = "N", .help = "KV cache blocks of --block-size tokens (default: see above)"},
        {.name = "block-size", .metavar = "N", .help = "tokens per KV block (default 16)"},
        {.name = "max-queue", .metavar = "N", .help = "requests waiting before new ones get 503 (default 256)"},
        {.name = "max-body-bytes", .metavar = "N", .help = "largest request body (default 4194304)"},
        {.name = "request-timeout", .metavar = "S", .help = "seconds a request may take, queue included (default 600; "
                                                           "0 = none)"},
        {.name = "no-prefix-cache", .help = "do not reuse the KV blocks of earlier prompts"},
        {.name = "batch-invariant",
         .help = "cpu: a request's logits never depend on the requests batched with it (slower prefill)"},
        {.name = "smem-budget", .metavar = "BYTES", .help = "cuda: plan kernels for this shared memory per block"},
        {.name = "attention-precision", .metavar = "P", .help = "cuda: prefill attention operands: hi_lo (default, "
                                                                  "fp32-grade), pv_bf16 or bf16 (faster, bf16-grade)"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve serve [--model DIR] [--host ADDR] [--port N] [--api-key KEY] [--backend cpu|cuda] ...",
                       "Serves the model over an OpenAI-compatible HTTP API: POST /v1/completions, "
                       "POST /v1/chat/completions (streamed or not), GET /v1/models, /health, /metrics.",
                       opts, n);
        return 0;
    }
    if (r == CLI_ERROR) {
        LOG_ERROR("serve: %s", err.msg);
        return 2;
    }
    long port = 8000, max_seqs = 64, max_tokens = 512, max_ctx = 0, kv_blocks = 0, block = 16, max_queue = 256,
         max_body = 4L << 20;
    double timeout = 600;
    if (cli_int(opts, n, "port", 0, 65535, &port, &err) || cli_int(opts, n, "max-seqs", 1, 4096, &max_seqs, &err) ||
        cli_int(opts, n, "max-tokens", 1, 1 << 20, &max_tokens, &err) ||
        cli_int(opts, n, "max-context", 2, 1 << 24, &max_ctx, &err) ||
        cli_int(opts, n, "kv-blocks", 1, 1 << 26, &kv_blocks, &err) ||
        cli_int(opts, n, "block-size", 1, 4096, &block, &err) ||
        cli_int(opts, n, "max-queue", 1, 1 << 24, &max_queue, &err) ||
        cli_int(opts, n, "max-body-bytes", 1024, 1L << 34, &max_body, &err) ||
        cli_float(opts, n, "request-timeout", 0, 1e9, &timeout, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        return 2;
    }
    if (max_tokens < max_seqs) {
        LOG_ERROR("serve: --max-tokens %ld must be at least --max-seqs %ld (every running sequence decodes one "
                  "token per pass)",
                  max_tokens, max_seqs);
        return 2;
    }
    const char *model = cli_get(opts, n, "model", cli_default_model());
    char name[256];
    model_name_of(model, name, sizeof name);
    const char *served = cli_get(opts, n, "served-model-name", name);
    const char *api_key = cli_get(opts, n, "api-key", cli_env_api_key());
    if (api_key && !*api_key)
        api_key = NULL;

    /* Before any thread exists (OpenMP's, the scheduler's, the server's), so
     * that all inherit the mask and only sigwait below sees these. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not death */

    struct tokenizer *tok = NULL;
    struct chat_template *tmpl = NULL;
    struct json *vars = NULL;
    struct model_session s = {0};
    struct scheduler sch = {0};
    struct server srv = {0};
    int rc = 1;
    if (cli_load_tokenizer(model, &tok, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model);
    struct err terr = {0};
    if (chat_template_from_config(&tmpl, path, &vars, &terr)) {
        LOG_WARN("serve: no chat template (%s): /v1/chat/completions will refuse requests", terr.msg);
        tmpl = NULL;
        vars = NULL;
    }
    /* the model's context, unless asked otherwise */
    struct model_desc desc;
    if (model_desc_load(&desc, model, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        goto done;
    }
    if (!max_ctx)
        max_ctx = desc.max_position_embeddings > 0 && desc.max_position_embeddings < 32768
                      ? desc.max_position_embeddings
                      : 32768;
    model_desc_free(&desc);
    if (!kv_blocks) {
        long per_seq = (1024 + block - 1) / block, one = (max_ctx + block - 1) / block;
        kv_blocks = per_seq * max_seqs > one ? per_seq * max_seqs : one;
    }
    /* model_session sizes its cache as ceil(max_context / block) * max_seqs blocks */
    long per_seq_blocks = (kv_blocks + max_seqs - 1) / max_seqs;
    struct session_opts so = {.backend = cli_get(opts, n, "backend", "cpu"), .max_tokens = (int)max_tokens,
                              .max_seqs = (int)max_seqs, .max_context = (int)(per_seq_blocks * block),
                              .block_size = (int)block, .smem_budget = cli_smem_budget(opts, n),
                              .attention_precision = cli_attention_precision(opts, n),
                              .batch_invariant = cli_flag(opts, n, "batch-invariant")};
    if (model_session_open(&s, model, &so, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        goto done;
    }
    struct scheduler_opts sco = {.max_queue = (int)max_queue, .max_seqs = (int)max_seqs, .max_context = (int)max_ctx,
                                 .no_prefix_cache = cli_flag(opts, n, "no-prefix-cache")};
    if (scheduler_init(&sch, &s, &sco, &err) || scheduler_start(&sch, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        goto done;
    }
    struct server_opts sro = {.host = cli_get(opts, n, "host", "127.0.0.1"), .port = (int)port, .api_key = api_key,
                              .model_name = served, .max_body_bytes = (size_t)max_body, .request_timeout = timeout};
    struct server_model sm = {.sch = &sch, .max_context = (int)max_ctx,
                              .pm = {.tok = tok, .tmpl = tmpl, .special_vars = vars, .vocab = s.desc.vocab_size}};
    if (server_start(&srv, &sro, &sm, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        goto done;
    }
    LOG_INFO("serve: %s on %s: %d KV blocks of %d tokens (%.1f MiB), %ld sequences, %ld tokens per pass, context %ld%s%s",
             served, s.be.ops->name, s.kv.n_blocks, s.kv.block_size,
             (double)kv_cache_bytes(&s.desc, s.kv.n_blocks, s.kv.block_size) / 1048576.0, max_seqs, max_tokens, max_ctx,
             sco.no_prefix_cache ? ", no prefix cache" : "", api_key ? ", API key required" : "");
    printf("listening on http://%s:%d\n", sro.host, server_port(&srv));
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    LOG_INFO("serve: %s, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
done:
    server_stop(&srv);
    scheduler_free(&sch);
    model_session_close(&s);
    json_free(vars);
    chat_template_free(tmpl);
    tokenizer_free(tok);
    return rc;
}
