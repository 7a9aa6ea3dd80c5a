/* cmd_logits.c — `moeserve logits`: raw logits of one forward pass.
 *
 * Output: little-endian float32 [n_tokens, vocab], row i = logits after
 * token i. This is the contract our parity tests and outside tools use.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "cli/cli_args.h"
#include "cli/cli_ranks.h"
#include "cli/cli_synth.h"
#include "cli/commands.h"
#include "engine/model_session.h"

int cmd_logits(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "checkpoint directory (default: the shipped model)"},
        {.name = "tokens", .metavar = "IDS", .help = "comma-separated token ids, e.g. 1,2,3 (required)"},
        {.name = "out", .metavar = "FILE", .help = "output file: float32 LE [n_tokens, vocab] (required)"},
        {.name = "seq-lens", .metavar = "LENS", .help = "the tokens as several sequences of these lengths in one "
                                                       "pass (e.g. 5,3,7; default: one sequence)"},
        {.name = "backend", .metavar = "NAME", .help = "cpu (default) or cuda"},
        {.name = "smem-budget", .metavar = "BYTES", .help = "cuda: plan kernels for this shared memory per block "
                                                           "(e.g. 101376, an sm_120's)"},
        {.name = "allow-long-context", .help = "let the context run past the model's max_position_embeddings"},
        {.name = "kv-cache-dtype", .metavar = "T",
         .help = "MLA latent cache rows: bf16 (default), f32 (reference runs) or fp8 (656 B a GLM-5 token)"},
        {.name = "attention-precision", .metavar = "P", .help = "cuda: prefill attention operands: hi_lo (default, "
                                                                  "fp32-grade), pv_bf16 or bf16 (faster, bf16-grade)"},
        CLI_RANK_OPTS,
        CLI_SYNTH_OPTS,
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve logits --model DIR --tokens 1,2,3 --out FILE [--backend cpu|cuda]",
                       "Runs one forward pass over the tokens and writes the logits at every position.", opts, n);
        return 0;
    }
    if (r == CLI_ERROR || !cli_get(opts, n, "tokens", NULL) || !cli_get(opts, n, "out", NULL)) {
        LOG_ERROR("logits: %s", r == CLI_ERROR ? err.msg : "--tokens and --out are required (see --help)");
        return 2;
    }
    int32_t *ids = NULL;
    int n_ids = 0;
    if (cli_parse_ids(cli_get(opts, n, "tokens", NULL), "--tokens", &ids, &n_ids, &err)) {
        LOG_ERROR("logits: %s", err.msg);
        return 2;
    }
    /* the batch's sequences: each a run of the tokens, its positions from 0 */
    int32_t *lens = NULL;
    int n_seqs = 1, longest = n_ids;
    if (cli_get(opts, n, "seq-lens", NULL)) {
        long total = 0;
        enum status lst = cli_parse_ids(cli_get(opts, n, "seq-lens", NULL), "--seq-lens", &lens, &n_seqs, &err);
        for (int i = 0; !lst && i < n_seqs; i++) {
            if (lens[i] < 1)
                lst = err_set(&err, STATUS_INVALID, "--seq-lens: sequence %d has length %d (must be >= 1)", i, lens[i]);
            total += lens[i];
        }
        if (!lst && total != n_ids)
            lst = err_set(&err, STATUS_INVALID, "--seq-lens: the lengths sum to %ld, --tokens has %d", total, n_ids);
        if (lst) {
            LOG_ERROR("logits: %s", err.msg);
            free(ids);
            free(lens);
            return 2;
        }
        longest = 0;
        for (int i = 0; i < n_seqs; i++)
            longest = lens[i] > longest ? lens[i] : longest;
    }
    const char *model = cli_get(opts, n, "model", cli_default_model());
    struct session_opts so = {.backend = cli_get(opts, n, "backend", "cpu"), .max_tokens = n_ids,
                              .max_seqs = n_seqs, .max_context = longest, .block_size = 16, .smem_budget = cli_smem_budget(opts, n),
                              .attention_precision = cli_attention_precision(opts, n),
                              .kv_cache_dtype = cli_get(opts, n, "kv-cache-dtype", NULL), .check_positions = true,
                              .allow_long_context = cli_flag(opts, n, "allow-long-context")};
    const char *synth = NULL;
    if (cli_synth_apply(opts, n, &so, &synth, &err)) {
        LOG_ERROR("logits: %s", err.msg);
        free(ids);
        free(lens);
        return 2;
    }
    struct model_session s;
    int rc = 1;
    float *logits = NULL;
    int32_t *pos = NULL, *seq = NULL, *rows = NULL;
    struct kv_seq *ks = NULL, **seqs = NULL;
    FILE *fp = NULL;
    struct cli_ranks ranks;
    if (cli_ranks_open(&ranks, opts, n, argc, argv, &so, &err)) {
        LOG_ERROR("logits: %s", err.msg);
        free(ids);
        free(lens);
        return 2;
    }
    if (cli_ranks_loaded(&ranks, model_session_open(&s, model, &so, &err), &err)) {
        LOG_ERROR("%s", err.msg);
        free(ids);
        free(lens);
        model_session_close(&s);
        cli_ranks_close(&ranks);
        return 1;
    }
    if (cli_ranks_follow(&ranks, &s, &rc)) { /* ranks > 0: rank 0's passes, then done */
        free(ids);
        free(lens);
        model_session_close(&s);
        cli_ranks_close(&ranks);
        return rc;
    }
    size_t V = (size_t)s.desc.vocab_size;
    logits = malloc((size_t)n_ids * V * sizeof(float));
    pos = malloc((size_t)n_ids * sizeof(int32_t));
    seq = calloc((size_t)n_ids, sizeof(int32_t));
    rows = malloc((size_t)n_ids * sizeof(int32_t));
    if (!logits || !pos || !seq || !rows) {
        LOG_ERROR("logits: out of memory for %d x %zu logits", n_ids, V);
        goto done;
    }
    ks = calloc((size_t)n_seqs, sizeof *ks);
    seqs = calloc((size_t)n_seqs, sizeof *seqs);
    if (!ks || !seqs) {
        LOG_ERROR("logits: out of memory for %d sequences", n_seqs);
        goto done;
    }
    for (int q = 0, i = 0; q < n_seqs; q++) {
        const int len = lens ? lens[q] : n_ids;
        kv_seq_init(&ks[q]);
        seqs[q] = &ks[q];
        for (int p = 0; p < len; p++, i++)
            pos[i] = p, seq[i] = q, rows[i] = i;
        if (kv_seq_reserve(&ks[q], &s.kv, len, &err)) {
            LOG_ERROR("%s", err.msg);
            goto done;
        }
    }
    struct forward_batch b = {.n_tokens = n_ids, .tokens = ids, .pos = pos, .seq = seq, .n_seqs = n_seqs,
                              .seqs = seqs, .n_logits = n_ids, .logit_rows = rows};
    enum status st = forward_run(&s.fwd, &b, logits, &err);
    if (st) {
        LOG_ERROR("logits: %s", err.msg);
        goto done;
    }
    const char *out = cli_get(opts, n, "out", NULL);
    fp = fopen(out, "wb");
    if (!fp || fwrite(logits, sizeof(float), (size_t)n_ids * V, fp) != (size_t)n_ids * V) {
        LOG_ERROR("logits: cannot write %s", out);
        goto done;
    }
    if (fclose(fp) != 0) {
        fp = NULL;
        LOG_ERROR("logits: cannot write %s", out);
        goto done;
    }
    fp = NULL;
    LOG_INFO("wrote %d x %zu float32 logits to %s", n_ids, V, out);
    rc = 0;
done:
    for (int q = 0; ks && q < n_seqs; q++)
        kv_seq_release(&ks[q], &s.kv);
    free(ks);
    free(seqs);
    free(lens);
    if (fp)
        fclose(fp);
    free(logits);
    free(pos);
    free(seq);
    free(rows);
    free(ids);
    cli_ranks_stop(&ranks, &s);
    model_session_close(&s);
    cli_ranks_close(&ranks);
    return rc;
}
