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
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "base/timer.h"
#include "cli/cli_args.h"
#include "cli/cli_ranks.h"
#include "cli/cli_synth.h"
#include "cli/commands.h"
#include "engine/scheduler.h"
#include "template/chat_template.h"
#include "format/tokenizer.h"
#include "model/synth_preset.h"
#include "plan/plan.h"
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

/* The options of one run, parsed and checked. */
struct serve_args {
    const char *model, *served, *api_key, *backend, *host, *allowed_origins;
    char name[256]; /* the model directory's name: served's default */
    long port, max_seqs, max_tokens, max_ctx, kv_blocks, block, max_queue, max_body;
    long max_conns, max_per_client, idle_timeout;
    double timeout;
    double shutdown_grace; /* seconds running requests get after SIGTERM / SIGINT */
    int attention_precision;
    const char *kv_cache_dtype;
    bool allow_long_context;
    bool lenient;
    bool no_prefix_cache, batch_invariant;
    bool max_tokens_given;     /* else serve_size_cache picks the backend's */
    const char *reasoning_parser; /* auto, none, think */
    const char *tool_call_parser; /* auto, none, qwen3, glm45 */
    struct session_opts synth; /* --synthetic: its fields only */
    char synth_dir[64];        /* --synthetic: the preset's config and --tokenizer's files (a->model) */
};

/* What a run holds; zeroed, every member may be released by serve_state_free. */
struct serve_state {
    struct tokenizer *tok;
    struct chat_template *tmpl;
    struct json *vars;
    struct model_session s;
    struct scheduler sch;
    struct server srv;
    struct cli_ranks ranks; /* --tensor-parallel: rank 0 serves, the others follow its passes */
    bool follower;          /* this rank followed rank 0 (no HTTP, no scheduler) */
};

static void serve_state_free(struct serve_state *st)
{
    server_stop(&st->srv);
    scheduler_free(&st->sch); /* its thread has run its last pass */
    if (!st->follower)
        cli_ranks_stop(&st->ranks, &st->s);
    model_session_close(&st->s);
    cli_ranks_close(&st->ranks);
    json_free(st->vars);
    chat_template_free(st->tmpl);
    tokenizer_free(st->tok);
}

/* Fills a from the command line. Returns -1 when the server should start,
 * else the exit code: 0 after --help, 2 for a bad option. */
static int serve_parse_args(int argc, char **argv, struct cli_opt *opts, int n, struct serve_args *a)
{
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
    *a = (struct serve_args){.port = 8000, .max_seqs = 64, .max_tokens = 512, .block = 16, .max_queue = 256,
                             .max_body = 4L << 20, .timeout = 600, .shutdown_grace = 30, .max_conns = 1024,
                             .idle_timeout = 600};
    if (cli_int(opts, n, "port", 0, 65535, &a->port, &err) ||
        cli_int(opts, n, "max-seqs", 1, 4096, &a->max_seqs, &err) ||
        cli_int(opts, n, "max-tokens", 1, 1 << 20, &a->max_tokens, &err) ||
        cli_int(opts, n, "max-context", 2, 1 << 24, &a->max_ctx, &err) ||
        cli_int(opts, n, "kv-blocks", 1, 1 << 26, &a->kv_blocks, &err) ||
        cli_int(opts, n, "block-size", 1, 4096, &a->block, &err) ||
        cli_int(opts, n, "max-queue", 1, 1 << 24, &a->max_queue, &err) ||
        cli_int(opts, n, "max-body-bytes", 1024, 1L << 34, &a->max_body, &err) ||
        cli_int(opts, n, "max-connections", 1, 1 << 20, &a->max_conns, &err) ||
        cli_int(opts, n, "max-connections-per-client", 1, 1 << 20, &a->max_per_client, &err) ||
        cli_int(opts, n, "idle-timeout", 1, 1 << 20, &a->idle_timeout, &err) ||
        cli_float(opts, n, "request-timeout", 0, 1e9, &a->timeout, &err) ||
        cli_float(opts, n, "shutdown-grace", 0, 1e6, &a->shutdown_grace, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        return 2;
    }
    a->max_tokens_given = cli_get(opts, n, "max-tokens", NULL) != NULL;
    if (a->max_tokens_given && a->max_tokens < a->max_seqs) {
        LOG_ERROR("serve: --max-tokens %ld must be at least --max-seqs %ld (every running sequence decodes one "
                  "token per pass)",
                  a->max_tokens, a->max_seqs);
        return 2;
    }
    a->model = cli_get(opts, n, "model", cli_default_model());
    model_name_of(a->model, a->name, sizeof a->name);
    a->served = cli_get(opts, n, "served-model-name", a->name);
    a->api_key = cli_get(opts, n, "api-key", cli_env_api_key());
    if (a->api_key && !*a->api_key) {
        /* an empty key would serve everyone while the operator believes it does not */
        LOG_ERROR("serve: %s is empty: give a key, or leave it out to serve without one",
                  cli_get(opts, n, "api-key", NULL) ? "--api-key" : "MOESERVE_API_KEY");
        return 2;
    }
    a->backend = cli_get(opts, n, "backend", "cpu");
    a->host = cli_get(opts, n, "host", "127.0.0.1");
    a->attention_precision = cli_attention_precision(opts, n);
    a->kv_cache_dtype = cli_get(opts, n, "kv-cache-dtype", NULL);
    a->allow_long_context = cli_flag(opts, n, "allow-long-context");
    a->lenient = cli_flag(opts, n, "lenient");
    a->reasoning_parser = cli_get(opts, n, "reasoning-parser", "auto");
    if (strcmp(a->reasoning_parser, "auto") && strcmp(a->reasoning_parser, "none") && strcmp(a->reasoning_parser, "think")) {
        LOG_ERROR("serve: --reasoning-parser: expected auto, none or think, got \"%s\"", a->reasoning_parser);
        return 2;
    }
    a->tool_call_parser = cli_get(opts, n, "tool-call-parser", "auto");
    enum tool_format tf;
    if (strcmp(a->tool_call_parser, "auto") && !tool_format_from_name(a->tool_call_parser, &tf)) {
        LOG_ERROR("serve: --tool-call-parser: expected auto, none, qwen3 or glm45, got \"%s\"", a->tool_call_parser);
        return 2;
    }
    a->allowed_origins = cli_get(opts, n, "allowed-origins", NULL);
    a->no_prefix_cache = cli_flag(opts, n, "no-prefix-cache");
    a->batch_invariant = cli_flag(opts, n, "batch-invariant");
    const char *synth = NULL, *tok_dir = cli_get(opts, n, "tokenizer", NULL);
    if (cli_synth_apply(opts, n, &a->synth, &synth, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        return 2;
    }
    if (synth && !tok_dir) {
        LOG_ERROR("serve: --synthetic %s has no tokenizer: give one with --tokenizer DIR (a directory with "
                  "tokenizer.json)", synth);
        return 2;
    }
    if (tok_dir && !synth) {
        LOG_ERROR("serve: --tokenizer is for --synthetic models (a checkpoint serves with its own tokenizer)");
        return 2;
    }
    if (synth) { /* every file the command reads from a model directory, without weights */
        if (synth_preset_dir(synth, !a->synth.synthetic_bf16, a->synth.synthetic_layers, tok_dir, a->synth.tmp_dir,
                             a->synth_dir, &err)) {
            LOG_ERROR("serve: %s", err.msg);
            return 1;
        }
        a->model = a->synth_dir;
        snprintf(a->name, sizeof a->name, "%s", synth);
    }
    return -1;
}

/* Blocks SIGINT and SIGTERM (returned in sigs, for sigwait) and ignores SIGPIPE.
 * Called before any thread exists (OpenMP's, the scheduler's, the server's), so
 * that all inherit the mask and only sigwait in serve_run_until_signal sees these. */
static void serve_block_signals(sigset_t *sigs)
{
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    sigaddset(sigs, SIGUSR1); /* serve_rank_lost: a GPU rank died */
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not death */
}

/* A checkpoint without a chat template still serves /v1/completions, so its
 * absence is a warning, not an error. */
static void serve_load_template(struct serve_state *st, const char *model)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model);
    struct err terr = {0};
    if (chat_template_from_config(&st->tmpl, path, &st->vars, &terr)) {
        LOG_WARN("serve: no chat template (%s): /v1/chat/completions will refuse requests", terr.msg);
        st->tmpl = NULL;
        st->vars = NULL;
    }
}

/* --chat-template FILE: this template instead of the model's (its special tokens stay). */
static enum status serve_template_file(struct serve_state *st, const char *file, struct err *err)
{
    struct mapped_file mf = {0};
    enum status s = mapped_file_open(&mf, file, err); /* refuses what is not a regular file */
    struct chat_template *t = NULL;
    if (!s)
        s = chat_template_compile(&t, mf.data ? mf.data : "", mf.size, err);
    mapped_file_close(&mf);
    if (s)
        return s;
    chat_template_free(st->tmpl);
    st->tmpl = t;
    LOG_INFO("serve: chat template from %s", file);
    return STATUS_OK;
}

/* The model's sampling defaults from DIR/generation_config.json (HF's: do_sample false is greedy;
 * temperature, top_p, top_k), for requests that leave them out. Absent file or keys: none. */
static void serve_sampling_defaults(const char *dir, struct server_opts *o)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct json *g = NULL;
    struct err err = {0};
    if (json_parse_file(path, &g, &err))
        return;
    const struct json *t = json_get(g, "temperature"), *p = json_get(g, "top_p"), *k = json_get(g, "top_k"),
                      *ds = json_get(g, "do_sample");
    if (json_is_bool(ds) && !json_bool(ds)) {
        o->has_temperature = true, o->temperature = 0.0; /* greedy, whatever else the file says */
    } else {
        if (json_is_number(t) && json_number(t) >= 0 && json_number(t) <= 2)
            o->has_temperature = true, o->temperature = json_number(t);
        if (json_is_number(p) && json_number(p) > 0 && json_number(p) <= 1)
            o->has_top_p = true, o->top_p = json_number(p);
        if (json_is_number(k) && json_number(k) >= 0 && json_number(k) == (int)json_number(k))
            o->has_top_k = true, o->top_k = (int)json_number(k);
    }
    json_free(g);
    if (o->has_temperature || o->has_top_p || o->has_top_k)
        LOG_INFO("serve: sampling defaults from %s: temperature %s%g, top_p %s%g, top_k %s%d (a request's own win)",
                 path, o->has_temperature ? "" : "(none) ", o->has_temperature ? o->temperature : 1.0,
                 o->has_top_p ? "" : "(none) ", o->has_top_p ? o->top_p : 1.0, o->has_top_k ? "" : "(none) ",
                 o->has_top_k ? o->top_k : 0);
}

/* Fills in the defaults of --max-context (the model's context, at most 32768), --max-tokens
 * (a GPU's: the plan's pass, plan_prefill_chunk_tokens) and --kv-blocks (see the top of this
 * file), which need the model's config; refuses a tokenizer with more ids than the model has
 * embeddings. */
static enum status serve_size_cache(struct serve_args *a, const struct tokenizer *tok, struct err *err)
{
    struct model_desc desc;
    enum status st = model_desc_load(&desc, a->model, err);
    if (st)
        return st;
    if (tokenizer_vocab_size(tok) > desc.vocab_size) { /* its ids would index past the embeddings */
        st = err_set(err, STATUS_INVALID, "the tokenizer has %d ids, the model's vocabulary %d: they do not belong "
                     "together", tokenizer_vocab_size(tok), desc.vocab_size);
        model_desc_free(&desc);
        return st;
    }
    if (!a->max_ctx)
        a->max_ctx = desc.max_position_embeddings > 0 && desc.max_position_embeddings < 32768
                         ? desc.max_position_embeddings
                         : 32768;
    int max_pos = desc.max_position_embeddings;
    if (!a->max_tokens_given && strcmp(a->backend, "cpu") != 0) {
        a->max_tokens = plan_prefill_chunk_tokens(desc.n_experts, desc.n_experts_used);
        a->max_tokens = a->max_tokens > a->max_seqs ? a->max_tokens : a->max_seqs;
    }
    model_desc_free(&desc);
    if (max_pos > 0 && a->max_ctx > max_pos && !a->allow_long_context)
        return err_set(err, STATUS_INVALID,
                       "--max-context %ld is past the model's max_position_embeddings (%d): positions it never "
                       "saw; pass --allow-long-context to go on anyway",
                       a->max_ctx, max_pos);
    if (!a->kv_blocks) {
        long per_seq = (1024 + a->block - 1) / a->block, one = (a->max_ctx + a->block - 1) / a->block;
        a->kv_blocks = per_seq * a->max_seqs > one ? per_seq * a->max_seqs : one;
    }
    return STATUS_OK;
}

/* Whether chat answers split <think> ... </think> off as reasoning_content: asked, or (auto) where
 * the tokenizer has both tags as tokens (Qwen3, GLM-4.5, GLM-5: a thinking model's vocabulary). */
static bool serve_reasoning(const struct serve_args *a, const struct tokenizer *tok)
{
    if (strcmp(a->reasoning_parser, "auto") != 0)
        return strcmp(a->reasoning_parser, "think") == 0;
    bool on = tokenizer_token_id(tok, "<think>") >= 0 && tokenizer_token_id(tok, "</think>") >= 0;
    if (on)
        LOG_INFO("serve: the tokenizer has <think> and </think>: chat answers carry reasoning_content "
                 "(--reasoning-parser none: off)");
    return on;
}

/* How the model writes tool calls: asked, or (auto) told by its vocabulary: GLM-4.5/GLM-5 have
 * <arg_key> as a token beside <tool_call>, Qwen3 only <tool_call>. */
static enum tool_format serve_tool_format(const struct serve_args *a, const struct tokenizer *tok)
{
    enum tool_format f = TOOL_FORMAT_NONE;
    if (strcmp(a->tool_call_parser, "auto") != 0) {
        tool_format_from_name(a->tool_call_parser, &f); /* checked with the arguments */
        return f;
    }
    if (tokenizer_token_id(tok, "<tool_call>") >= 0)
        f = tokenizer_token_id(tok, "<arg_key>") >= 0 ? TOOL_FORMAT_GLM45 : TOOL_FORMAT_QWEN3;
    if (f != TOOL_FORMAT_NONE)
        LOG_INFO("serve: the tokenizer has <tool_call>%s: tool calls are read as %s's (--tool-call-parser to change)",
                 f == TOOL_FORMAT_GLM45 ? " and <arg_key>" : "", tool_format_name(f));
    return f;
}

/* Opens the session and starts the scheduler and the HTTP server. smem_budget
 * comes from cli_smem_budget, which warns about a bad value: the caller reads
 * it only once the tokenizer and the model's config have loaded. */
static enum status serve_start(struct serve_state *st, const struct serve_args *a, size_t smem_budget,
                               struct err *err)
{
    /* model_session sizes its cache as ceil(max_context / block) * max_seqs blocks */
    long per_seq_blocks = (a->kv_blocks + a->max_seqs - 1) / a->max_seqs;
    struct session_opts so = {.backend = a->backend, .max_tokens = (int)a->max_tokens, .max_seqs = (int)a->max_seqs,
                              .max_context = (int)(per_seq_blocks * a->block), .block_size = (int)a->block,
                              .smem_budget = smem_budget, .attention_precision = a->attention_precision,
                              .kv_cache_dtype = a->kv_cache_dtype,
                              .batch_invariant = a->batch_invariant, .comm = st->ranks.comm.ops ? &st->ranks.comm : NULL,
                              .expert_parallel = st->ranks.expert_parallel,
                              .data_parallel_attention = st->ranks.data_parallel_attention,
                              .collectives_nccl = st->ranks.collectives_nccl, .synthetic = a->synth.synthetic,
                              .synthetic_bf16 = a->synth.synthetic_bf16, .synthetic_layers = a->synth.synthetic_layers};
    if (st->ranks.size > 1) { /* GPU ranks this command started (cli_ranks.h) */
        so.nccl_id = st->ranks.nccl_id;
        so.nccl_rank = st->ranks.rank, so.nccl_size = st->ranks.size, so.device = st->ranks.rank;
    }
    enum status s = cli_ranks_loaded(&st->ranks, model_session_open(&st->s, a->model, &so, err), err);
    if (s)
        return s;
    int rc = 0;
    if (cli_ranks_follow(&st->ranks, &st->s, &rc)) {
        st->follower = true;
        return rc ? err_set(err, STATUS_INVALID, "rank %d stopped following rank 0", st->ranks.comm.rank) : STATUS_OK;
    }
    struct scheduler_opts sco = {.max_queue = (int)a->max_queue, .max_seqs = (int)a->max_seqs,
                                 .max_context = (int)a->max_ctx, .no_prefix_cache = a->no_prefix_cache};
    if ((s = scheduler_init(&st->sch, &st->s, &sco, err)) || (s = scheduler_start(&st->sch, err)))
        return s;
    struct server_opts sro = {.host = a->host, .port = (int)a->port, .api_key = a->api_key,
                              .model_name = a->served, .max_body_bytes = (size_t)a->max_body,
                              .max_connections = (int)a->max_conns, .max_per_client = (int)a->max_per_client,
                              .idle_timeout = (int)a->idle_timeout, .lenient = a->lenient,
                              .reasoning = serve_reasoning(a, st->tok),
                              .tool_format = serve_tool_format(a, st->tok),
                              .request_timeout = a->timeout, .allowed_origins = a->allowed_origins};
    serve_sampling_defaults(a->model, &sro);
    struct server_model sm = {
        .sch = &st->sch,
        .max_context = (int)a->max_ctx,
        .pm = {.tok = st->tok, .tmpl = st->tmpl, .special_vars = st->vars, .vocab = st->s.desc.vocab_size}};
    return server_start(&st->srv, &sro, &sm, err);
}

/* The ranks' watchdog (its thread): a rank died, the others are stopped, the scheduler may wait
 * in a collective for good. Every request gets a 503 naming the rank; the main thread ends the
 * process. */
static void serve_rank_lost(void *ctx, const char *msg)
{
    struct serve_state *st = ctx;
    char m[256];
    snprintf(m, sizeof m, "the model stopped: %s; the server is exiting", msg);
    server_fail(&st->srv, m);
    kill(getpid(), SIGUSR1);
}

/* Reports the running server (the port line is what tests read) and waits for
 * SIGINT or SIGTERM (or SIGUSR1: serve_rank_lost). */
static void serve_run_until_signal(struct serve_state *st, const struct serve_args *a, const sigset_t *sigs)
{
    const struct model_session *s = &st->s;
    LOG_INFO("serve: %s on %s: %d KV blocks of %d tokens (%.1f MiB), %ld sequences, %ld tokens per pass, context %ld%s%s",
             a->served, s->be.ops->name, s->kv.n_blocks, s->kv.block_size,
             (double)kv_cache_bytes(&s->local, s->kv.latent_dtype, s->kv.n_blocks, s->kv.block_size) / 1048576.0, a->max_seqs,
             a->max_tokens, a->max_ctx, a->no_prefix_cache ? ", no prefix cache" : "",
             a->api_key ? ", API key required" : "");
    if (st->s.shard.size > 1) /* under mpirun a SIGTERM to mpirun kills every rank: stop this process */
        LOG_INFO("serve: rank 0 of %d, pid %ld: SIGTERM here drains and stops every rank", st->s.shard.size,
                 (long)getpid());
    printf("listening on http://%s:%d\n", a->host, server_port(&st->srv));
    fflush(stdout);
    cli_ranks_on_lost(&st->ranks, serve_rank_lost, st);
    int sig = 0;
    sigwait(sigs, &sig);
    if (sig == SIGUSR1) {
        /* the 503s and the streams' error events go out; no cleanup: it would wait on the dead rank */
        LOG_ERROR("serve: %s", st->srv.fail_msg);
        for (double t0 = timer_now(); atomic_load(&st->srv.n_live) > 0 && timer_now() - t0 < 2.0;)
            usleep(20 * 1000);
        fflush(stdout);
        fflush(stderr);
        synth_preset_dir_remove(a->synth_dir);
        _exit(1);
    }
    LOG_INFO("serve: %s, shutting down: no new requests; the %d in flight get up to %g s",
             sig == SIGINT ? "SIGINT" : "SIGTERM", atomic_load(&st->srv.n_live), a->shutdown_grace);
    server_drain(&st->srv, a->shutdown_grace);
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
        {.name = "max-tokens", .metavar = "N", .help = "tokens per forward pass, decode + prefill chunks (default: cpu "
                                                       "512; cuda the plan's, ~256 rows an expert a chunk)"},
        {.name = "max-context", .metavar = "N", .help = "prompt + generated tokens per request (default: the model's "
                                                       "max_position_embeddings, at most 32768)"},
        {.name = "kv-blocks",
         .metavar = "N",
         .help = "KV cache blocks of --block-size tokens (default: --max-seqs sequences of 1024 tokens, or one of "
                 "--max-context tokens if that is more)"},
        {.name = "block-size", .metavar = "N", .help = "tokens per KV block (default 16)"},
        {.name = "max-queue", .metavar = "N", .help = "requests waiting before new ones get 503 (default 256)"},
        {.name = "max-body-bytes", .metavar = "N", .help = "largest request body (default 4194304)"},
        {.name = "max-connections", .metavar = "N", .help = "open connections answered; past it 503 (default 1024)"},
        {.name = "max-connections-per-client", .metavar = "N",
         .help = "open connections of one client address; past it 503 (default: --max-connections)"},
        {.name = "idle-timeout", .metavar = "S", .help = "seconds a silent connection stays open (default 600)"},
        {.name = "chat-template", .metavar = "FILE", .help = "a Jinja chat template instead of the model's"},
        {.name = "reasoning-parser", .metavar = "P", .help = "think: chat answers carry the <think> part as "
                                                            "reasoning_content; none: off; auto (default): think "
                                                            "where the tokenizer has both tags"},
        {.name = "tool-call-parser", .metavar = "P", .help = "how the model writes tool calls: qwen3 "
                                                            "(<tool_call>{json}</tool_call>), glm45 (<tool_call>name"
                                                            "<arg_key>..), none (requests with tools refused); auto "
                                                            "(default): from the tokenizer's tokens"},
        {.name = "lenient", .help = "ignore the request fields this server does not implement (response_format, "
                                    "suffix, ...) with a logged warning instead of a 400"},
        {.name = "allowed-origins", .metavar = "LIST",
         .help = "browser origins that may read the answers (CORS), comma-separated, or * for any (default: none)"},
        {.name = "request-timeout", .metavar = "S", .help = "seconds a request may take, queue included (default 600; "
                                                           "0 = none)"},
        {.name = "shutdown-grace", .metavar = "S", .help = "seconds running requests may take to finish after "
                                                          "SIGTERM or SIGINT (default 30); the rest end with an "
                                                          "error event"},
        {.name = "no-prefix-cache", .help = "do not reuse the KV blocks of earlier prompts"},
        {.name = "batch-invariant",
         .help = "cpu: a request's logits never depend on the requests batched with it (slower prefill)"},
        {.name = "smem-budget", .metavar = "BYTES", .help = "cuda: plan kernels for this shared memory per block"},
        {.name = "allow-long-context", .help = "let the context run past the model's max_position_embeddings"},
        {.name = "kv-cache-dtype", .metavar = "T",
         .help = "MLA latent cache rows: bf16 (default), f32 (reference runs) or fp8 (656 B a GLM-5 token)"},
        {.name = "attention-precision", .metavar = "P", .help = "cuda: prefill attention operands: hi_lo (default, "
                                                                  "fp32-grade), pv_bf16 or bf16 (faster, bf16-grade)"},
        {.name = "tokenizer", .metavar = "DIR", .help = "with --synthetic: tokenizer.json, tokenizer_config.json (the "
                                                       "chat template) and generation_config.json from DIR"},
        CLI_RANK_OPTS,
        CLI_SYNTH_OPTS,
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct serve_args a;
    int rc = serve_parse_args(argc, argv, opts, n, &a);
    if (rc >= 0)
        return rc;
    sigset_t sigs;
    serve_block_signals(&sigs);

    struct serve_state st = {0};
    struct err err = {0};
    if (cli_load_tokenizer(a.model, &st.tok, &err)) {
        LOG_ERROR("serve: %s", err.msg);
        synth_preset_dir_remove(a.synth_dir);
        return 1;
    }
    serve_load_template(&st, a.model);
    const char *tfile = cli_get(opts, n, "chat-template", NULL);
    if (tfile && serve_template_file(&st, tfile, &err)) {
        LOG_ERROR("serve: --chat-template %s: %s", tfile, err.msg);
        serve_state_free(&st);
        synth_preset_dir_remove(a.synth_dir);
        return 1;
    }
    struct session_opts rso = {.backend = a.backend};
    if (serve_size_cache(&a, st.tok, &err) || cli_ranks_open(&st.ranks, opts, n, argc, argv, &rso, &err) ||
        serve_start(&st, &a, cli_smem_budget(opts, n), &err)) {
        LOG_ERROR("serve: %s", err.msg);
        rc = 1;
    } else if (st.follower) {
        rc = 0;
    } else {
        serve_run_until_signal(&st, &a, &sigs);
        rc = 0;
    }
    serve_state_free(&st);
    synth_preset_dir_remove(a.synth_dir);
    return rc;
}
