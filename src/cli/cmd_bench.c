/* cmd_bench.c — `moeserve bench`: prefill and decode speed against the roofline.
 *
 * Decode at batch 1 is memory bound: every step must read the attention
 * weights, the router, the k chosen experts of every layer and lm_head once.
 * The bench counts exactly those bytes (from the bound weights, whatever
 * their format), times greedy decode steps after a warm-up pass, and reports
 * the achieved GB/s next to a memcpy bandwidth measured in the same run.
 * Inputs are random token ids (never zeros); the model should be a real-shape
 * checkpoint (tools/make_synth_checkpoint).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "backend/cpu/cpu_membw.h"
#include "base/json.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/cli_args.h"
#include "cli/commands.h"
#include "engine/model_session.h"

/* Weight bytes one batch-1 decode step reads (k experts per MoE layer). */
static double decode_bytes_per_token(const struct model_session *s)
{
    const struct model_desc *d = &s->desc;
    const struct model_weights *w = &s->w;
    double b = (double)weight_bytes(&w->lm_head) + (double)d->d_model * 2; /* + one embedding row */
    for (int l = 0; l < d->n_layers; l++) {
        const struct layer_weights *lw = &w->layers[l];
        b += (double)(weight_bytes(&lw->wq) + weight_bytes(&lw->wk) + weight_bytes(&lw->wv) + weight_bytes(&lw->wo));
        if (lw->has_ffn)
            b += (double)(weight_bytes(&lw->ffn_gate) + weight_bytes(&lw->ffn_up) + weight_bytes(&lw->ffn_down));
        if (d->layers[l].ffn == FFN_MOE) {
            double experts = 0;
            for (int e = 0; e < d->n_experts; e++)
                experts += (double)(weight_bytes(&lw->exp_gate[e]) + weight_bytes(&lw->exp_up[e]) +
                                    weight_bytes(&lw->exp_down[e]));
            b += weight_bytes(&lw->router) + experts / d->n_experts * d->n_experts_used;
        }
    }
    return b;
}

static int bench_run_prefill(struct model_session *s, const int32_t *toks, int n, double *secs, struct err *err)
{
    int32_t *pos = malloc((size_t)n * sizeof *pos), *seq = calloc((size_t)n, sizeof *seq);
    float *logits = malloc((size_t)s->desc.vocab_size * sizeof(float));
    for (int i = 0; i < n; i++)
        pos[i] = i;
    struct kv_seq ks;
    kv_seq_init(&ks);
    struct kv_seq *seqs[1] = {&ks};
    int32_t last = n - 1;
    enum status st = kv_seq_reserve(&ks, &s->kv, n, err);
    double t0 = timer_now();
    if (!st) {
        struct forward_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .n_seqs = 1,
                                  .seqs = seqs, .n_logits = 1, .logit_rows = &last};
        st = forward_run(&s->fwd, &b, logits, err);
    }
    *secs = timer_now() - t0;
    kv_seq_release(&ks, &s->kv);
    free(pos);
    free(seq);
    free(logits);
    return st ? 1 : 0;
}

int cmd_bench(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "checkpoint directory (default: the shipped model)"},
        {.name = "backend", .metavar = "NAME", .help = "cpu (default) or cuda"},
        {.name = "smem-budget", .metavar = "BYTES", .help = "cuda: plan kernels for this shared memory per block "
                                                           "(e.g. 101376, an sm_120's)"},
        {.name = "prompt-len", .metavar = "N", .help = "prefill length in tokens (default 128)"},
        {.name = "decode", .metavar = "N", .help = "decode steps to time (default 32)"},
        {.name = "seed", .metavar = "S", .help = "seed of the random prompt (default 1)"},
        {.name = "json", .help = "print JSON instead of a table"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve bench [--model DIR] [--backend cpu|cuda] [--prompt-len N] [--decode N] [--json]",
                       "Times prefill and batch-1 decode; reports tok/s and weight GB/s against memcpy bandwidth.",
                       opts, n);
        return 0;
    }
    long plen = 128, ndec = 32, seed = 1;
    if (r == CLI_ERROR || cli_int(opts, n, "prompt-len", 1, 1 << 16, &plen, &err) ||
        cli_int(opts, n, "decode", 1, 1 << 16, &ndec, &err) || cli_int(opts, n, "seed", 0, 1L << 30, &seed, &err)) {
        LOG_ERROR("bench: %s", err.msg);
        return 2;
    }
    const char *model = cli_get(opts, n, "model", cli_default_model());
    struct session_opts so = {.backend = cli_get(opts, n, "backend", "cpu"), .max_tokens = (int)plen,
                              .max_seqs = 1, .max_context = (int)(plen + ndec + 1), .smem_budget = cli_smem_budget(opts, n)};
    struct model_session s;
    if (model_session_open(&s, model, &so, &err)) {
        LOG_ERROR("%s", err.msg);
        return 1;
    }
    int rc = 1;
    int V = s.desc.vocab_size;
    int32_t *toks = malloc((size_t)plen * sizeof *toks);
    uint64_t st64 = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    for (long i = 0; i < plen; i++) {
        st64 = st64 * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((st64 >> 33) % (uint64_t)V);
    }
    /* warm-up: page the weights in and settle the threads */
    double t_warm = 0, t_prefill = 0;
    LOG_INFO("bench: warm-up prefill of %ld tokens", plen);
    if (bench_run_prefill(&s, toks, (int)plen, &t_warm, &err) ||
        bench_run_prefill(&s, toks, (int)plen, &t_prefill, &err)) {
        LOG_ERROR("bench: %s", err.msg);
        goto done;
    }
    /* decode: prefill once, then time greedy single-token steps */
    struct kv_seq ks;
    kv_seq_init(&ks);
    struct kv_seq *seqs[1] = {&ks};
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t pos = 0, seq0 = 0, row = 0, last = (int32_t)plen - 1;
    int32_t *ppos = malloc((size_t)plen * sizeof *ppos), *pseq = calloc((size_t)plen, sizeof *pseq);
    for (long i = 0; i < plen; i++)
        ppos[i] = (int32_t)i;
    enum status st = kv_seq_reserve(&ks, &s.kv, (int)(plen + ndec), &err);
    struct forward_batch pb = {.n_tokens = (int)plen, .tokens = toks, .pos = ppos, .seq = pseq, .n_seqs = 1,
                               .seqs = seqs, .n_logits = 1, .logit_rows = &last};
    if (!st)
        st = forward_run(&s.fwd, &pb, logits, &err);
    ks.n_tokens = (int)plen;
    double t0 = timer_now();
    for (long i = 0; i < ndec && !st; i++) {
        int32_t tok = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[tok])
                tok = v;
        pos = ks.n_tokens;
        struct forward_batch b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq0, .n_seqs = 1,
                                  .seqs = seqs, .n_logits = 1, .logit_rows = &row};
        st = forward_run(&s.fwd, &b, logits, &err);
        ks.n_tokens++;
    }
    double t_decode = timer_now() - t0;
    kv_seq_release(&ks, &s.kv);
    free(logits);
    free(ppos);
    free(pseq);
    if (st) {
        LOG_ERROR("bench: %s", err.msg);
        goto done;
    }
    double bytes_tok = decode_bytes_per_token(&s);
    double decode_tps = (double)ndec / t_decode;
    double gbs = bytes_tok * decode_tps / 1e9;
    LOG_INFO("bench: measuring memcpy bandwidth");
    double membw = cpu_memcpy_bandwidth((size_t)1 << 30, 5);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (cli_flag(opts, n, "json")) {
        struct json *o = json_new_object();
        json_add(o, "model", json_new_string(model));
        json_add(o, "backend", json_new_string(s.be.ops->name));
        json_add(o, "prompt_len", json_new_number((double)plen));
        json_add(o, "prefill_tok_s", json_new_number((double)plen / t_prefill));
        json_add(o, "decode_steps", json_new_number((double)ndec));
        json_add(o, "decode_tok_s", json_new_number(decode_tps));
        json_add(o, "decode_weight_bytes_per_token", json_new_number(bytes_tok));
        json_add(o, "decode_weight_gb_s", json_new_number(gbs));
        json_add(o, "memcpy_gb_s", json_new_number(membw));
        json_add(o, "decode_pct_of_memcpy", json_new_number(100.0 * gbs / membw));
        json_add(o, "peak_rss_mib", json_new_number((double)ru.ru_maxrss / 1024.0));
        char *js = json_print(o, true);
        printf("%s\n", js);
        free(js);
        json_free(o);
    } else {
        printf("model                 %s (%s backend)\n", model, s.be.ops->name);
        printf("prefill               %ld tokens in %.3f s: %.1f tok/s\n", plen, t_prefill, (double)plen / t_prefill);
        printf("decode (batch 1)      %ld steps in %.3f s: %.2f tok/s\n", ndec, t_decode, decode_tps);
        printf("weights read / token  %.1f MB\n", bytes_tok / 1e6);
        printf("decode weight stream  %.2f GB/s = %.1f%% of memcpy %.2f GB/s (read+write)\n", gbs,
               100.0 * gbs / membw, membw);
        printf("peak RSS              %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
    }
    rc = 0;
done:
    free(toks);
    model_session_close(&s);
    return rc;
}
