/* cmd_perplexity.c — `moeserve perplexity`: how well a model predicts a text.
 *
 * Protocol (tools/eval_ppl_hf.py computes the same with transformers): the
 * file is encoded without special tokens and cut into consecutive windows of
 * W tokens (the last may be shorter, at least 2); each window runs from a
 * fresh context; perplexity = exp(mean negative log-likelihood of tokens
 * 1..n-1 of every window).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/json.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "base/timer.h"
#include "cli/cli_args.h"
#include "cli/cli_ranks.h"
#include "cli/commands.h"
#include "engine/model_session.h"
#include "format/tokenizer.h"

/* -log softmax(l)[target] over V logits, max-shifted so exp() cannot overflow. */
static double perplexity_token_nll(const float *l, size_t V, int32_t target)
{
    float mx = l[0];
    for (size_t v = 1; v < V; v++)
        mx = l[v] > mx ? l[v] : mx;
    double sum = 0;
    for (size_t v = 0; v < V; v++)
        sum += exp((double)(l[v] - mx));
    return log(sum) + mx - l[target];
}

/* Runs every window of ids from a fresh context, summing the NLL of its tokens 1..n-1 into
 * *nll and counting them in *predicted; *dt is the seconds the windows took. 1 on an error
 * (logged). */
static int perplexity_score_windows(struct model_session *s, const struct tok_ids *ids, long window, double *nll,
                                    long *predicted, double *dt)
{
    struct err err = {0};
    size_t V = (size_t)s->desc.vocab_size;
    float *logits = malloc((size_t)window * V * sizeof(float));
    int32_t *pos = malloc((size_t)window * sizeof(int32_t)), *seq = calloc((size_t)window, sizeof(int32_t));
    int32_t *rows = malloc((size_t)window * sizeof(int32_t));
    for (long i = 0; i < window; i++)
        pos[i] = rows[i] = (int32_t)i;
    int rc = 0;
    double t0 = timer_now();
    for (size_t w0 = 0; w0 < ids->n && !rc; w0 += (size_t)window) {
        int len = (int)(ids->n - w0 < (size_t)window ? ids->n - w0 : (size_t)window);
        if (len < 2)
            break;
        struct kv_seq ks;
        kv_seq_init(&ks);
        struct kv_seq *seqs[1] = {&ks};
        struct forward_batch b = {.n_tokens = len, .tokens = ids->ids + w0, .pos = pos, .seq = seq, .n_seqs = 1,
                                  .seqs = seqs, .n_logits = len - 1, .logit_rows = rows};
        if (kv_seq_reserve(&ks, &s->kv, len, &err) || forward_run(&s->fwd, &b, logits, &err)) {
            LOG_ERROR("perplexity: %s", err.msg);
            rc = 1;
        }
        kv_seq_release(&ks, &s->kv);
        for (int i = 0; i < len - 1 && !rc; i++) {
            *nll += perplexity_token_nll(logits + (size_t)i * V, V, ids->ids[w0 + (size_t)i + 1]);
            (*predicted)++;
        }
    }
    *dt = timer_now() - t0;
    free(logits);
    free(pos);
    free(seq);
    free(rows);
    return rc;
}

/* Prints the score, a line of text or (json) one JSON object. */
static void perplexity_print_report(const char *model, const char *file, size_t tokens, long window, double nll,
                                    long predicted, double dt, bool json)
{
    double ppl = exp(nll / (double)predicted);
    if (json) {
        struct json *o = json_new_object();
        json_add(o, "model", json_new_string(model));
        json_add(o, "file", json_new_string(file));
        json_add(o, "tokens", json_new_number((double)tokens));
        json_add(o, "predicted", json_new_number((double)predicted));
        json_add(o, "window", json_new_number((double)window));
        json_add(o, "nll", json_new_number(nll / (double)predicted));
        json_add(o, "perplexity", json_new_number(ppl));
        json_add(o, "tokens_per_second", json_new_number((double)tokens / dt));
        char *js = json_print(o, false);
        printf("%s\n", js);
        free(js);
        json_free(o);
    } else {
        printf("perplexity %.4f (mean NLL %.5f over %ld predicted tokens of %zu, windows of %ld) in %.1f s, "
               "%.0f tok/s\n",
               ppl, nll / (double)predicted, predicted, tokens, window, dt, (double)tokens / dt);
    }
}

int cmd_perplexity(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "model directory (default: the shipped model)"},
        {.name = "file", .metavar = "FILE", .help = "text to score (required)"},
        {.name = "window", .metavar = "N", .help = "tokens per window (default 256)"},
        {.name = "backend", .metavar = "NAME", .help = "cpu (default) or cuda"},
        {.name = "smem-budget", .metavar = "BYTES", .help = "cuda: plan kernels for this shared memory per block "
                                                           "(e.g. 101376, an sm_120's)"},
        {.name = "allow-long-context", .help = "let the context run past the model's max_position_embeddings"},
        {.name = "kv-cache-dtype", .metavar = "T",
         .help = "MLA latent cache rows: bf16 (default), f32 (reference runs) or fp8 (656 B a GLM-5 token)"},
        {.name = "attention-precision", .metavar = "P", .help = "cuda: prefill attention operands: hi_lo (default, "
                                                                  "fp32-grade), pv_bf16 or bf16 (faster, bf16-grade)"},
        {.name = "json", .help = "print JSON"},
        CLI_RANK_OPTS,
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve perplexity [--model DIR] --file FILE [--window N] [--json]",
                       "Scores a text: perplexity over consecutive windows, each from a fresh context.", opts, n);
        return 0;
    }
    long window = 256;
    if (r == CLI_ERROR || cli_int(opts, n, "window", 2, 1 << 16, &window, &err) || !cli_get(opts, n, "file", NULL)) {
        LOG_ERROR("perplexity: %s", err.msg[0] ? err.msg : "--file is required");
        return 2;
    }
    const char *model = cli_get(opts, n, "model", cli_default_model());
    const char *file = cli_get(opts, n, "file", NULL);
    struct tokenizer *tok = NULL;
    struct mapped_file mf = {0};
    struct tok_ids ids = {0};
    if (cli_load_tokenizer(model, &tok, &err) || mapped_file_open(&mf, file, &err) ||
        tokenizer_encode(tok, mf.data ? mf.data : "", mf.size, false, &ids, &err)) {
        LOG_ERROR("perplexity: %s", err.msg);
        tokenizer_free(tok);
        mapped_file_close(&mf);
        return 1;
    }
    mapped_file_close(&mf);
    struct session_opts so = {.backend = cli_get(opts, n, "backend", "cpu"), .max_tokens = (int)window,
                              .max_seqs = 1, .max_context = (int)window, .smem_budget = cli_smem_budget(opts, n),
                              .attention_precision = cli_attention_precision(opts, n),
                              .kv_cache_dtype = cli_get(opts, n, "kv-cache-dtype", NULL), .check_positions = true,
                              .allow_long_context = cli_flag(opts, n, "allow-long-context")};
    struct model_session s;
    struct cli_ranks ranks;
    if (cli_ranks_open(&ranks, opts, n, argc, argv, &so, &err)) {
        LOG_ERROR("perplexity: %s", err.msg);
        tokenizer_free(tok);
        tok_ids_free(&ids);
        return 2;
    }
    int frc = 0;
    if (cli_ranks_loaded(&ranks, model_session_open(&s, model, &so, &err), &err) ||
        cli_ranks_follow(&ranks, &s, &frc)) {
        if (err.code)
            LOG_ERROR("%s", err.msg);
        model_session_close(&s);
        cli_ranks_close(&ranks);
        tokenizer_free(tok);
        tok_ids_free(&ids);
        return err.code ? 1 : frc;
    }
    double nll = 0, dt = 0;
    long predicted = 0;
    int rc = perplexity_score_windows(&s, &ids, window, &nll, &predicted, &dt);
    if (!rc && predicted == 0) {
        LOG_ERROR("perplexity: %s has fewer than 2 tokens", file);
        rc = 1;
    }
    if (!rc)
        perplexity_print_report(model, file, ids.n, window, nll, predicted, dt, cli_flag(opts, n, "json"));
    tok_ids_free(&ids);
    tokenizer_free(tok);
    cli_ranks_stop(&ranks, &s);
    model_session_close(&s);
    cli_ranks_close(&ranks);
    return rc;
}
