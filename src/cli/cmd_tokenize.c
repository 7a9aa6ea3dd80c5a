/* cmd_tokenize.c — `moeserve tokenize` and `moeserve detokenize`.
 *
 * tokenize prints one JSON array of ids: exactly HF
 * tokenizer.encode(text, add_special_tokens=False) unless --special.
 * detokenize prints the decoded text as is (no newline added), so a caller
 * gets the exact bytes.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/mapped_file.h"
#include "cli/cli_args.h"
#include "cli/commands.h"
#include "format/tokenizer.h"

enum status cli_load_tokenizer(const char *model_dir, struct tokenizer **tok, struct err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    return tokenizer_load(tok, path, err);
}

int cmd_tokenize(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "model directory with tokenizer.json (default: the shipped model)"},
        {.name = "text", .metavar = "TEXT", .help = "text to encode"},
        {.name = "file", .metavar = "FILE", .help = "encode the contents of FILE instead"},
        {.name = "special", .help = "add the post-processor's special tokens (add_special_tokens=True)"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve tokenize [--model DIR] (--text TEXT | --file FILE) [--special]",
                       "Prints the token ids of the text as one JSON array (HF encode, add_special_tokens=False).",
                       opts, n);
        return 0;
    }
    const char *text = cli_get(opts, n, "text", NULL), *file = cli_get(opts, n, "file", NULL);
    if (r == CLI_ERROR || (!text == !file)) {
        LOG_ERROR("tokenize: %s", r == CLI_ERROR ? err.msg : "give exactly one of --text and --file");
        return 2;
    }
    struct tokenizer *tok = NULL;
    if (cli_load_tokenizer(cli_get(opts, n, "model", cli_default_model()), &tok, &err)) {
        LOG_ERROR("%s", err.msg);
        return 1;
    }
    struct mapped_file mf = {0};
    size_t len = 0;
    if (file) {
        if (mapped_file_open(&mf, file, &err)) {
            LOG_ERROR("%s", err.msg);
            tokenizer_free(tok);
            return 1;
        }
        text = mf.data ? mf.data : "";
        len = mf.size;
    } else {
        for (len = 0; text[len]; len++)
            ;
    }
    struct tok_ids ids = {0};
    int rc = 0;
    if (tokenizer_encode(tok, text, len, cli_flag(opts, n, "special"), &ids, &err)) {
        LOG_ERROR("tokenize: %s%s", file ? file : "--text", err.msg[0] ? err.msg : "");
        rc = 1;
    } else {
        putchar('[');
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? ", %d" : "%d", ids.ids[i]);
        puts("]");
    }
    tok_ids_free(&ids);
    mapped_file_close(&mf);
    tokenizer_free(tok);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "model directory with tokenizer.json (default: the shipped model)"},
        {.name = "ids", .metavar = "IDS", .help = "comma-separated token ids (required)"},
        {.name = "skip-special", .help = "drop special tokens (skip_special_tokens=True)"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve detokenize [--model DIR] --ids 1,2,3 [--skip-special]",
                       "Prints the text of the token ids exactly (HF decode), without a trailing newline.", opts, n);
        return 0;
    }
    if (r == CLI_ERROR || !cli_get(opts, n, "ids", NULL)) {
        LOG_ERROR("detokenize: %s", r == CLI_ERROR ? err.msg : "--ids is required");
        return 2;
    }
    int32_t *ids = NULL;
    int n_ids = 0;
    if (cli_parse_ids(cli_get(opts, n, "ids", NULL), "--ids", &ids, &n_ids, &err)) {
        LOG_ERROR("detokenize: %s", err.msg);
        return 2;
    }
    struct tokenizer *tok = NULL;
    if (cli_load_tokenizer(cli_get(opts, n, "model", cli_default_model()), &tok, &err)) {
        LOG_ERROR("%s", err.msg);
        free(ids);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = 0;
    if (tokenizer_decode(tok, ids, (size_t)n_ids, cli_flag(opts, n, "skip-special"), &text, &len, &err)) {
        LOG_ERROR("detokenize: %s", err.msg);
        rc = 1;
    } else {
        fwrite(text, 1, len, stdout);
    }
    free(text);
    free(ids);
    tokenizer_free(tok);
    return rc;
}
