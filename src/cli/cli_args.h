/* cli_args.h — a small, strict option parser shared by every subcommand.
 *
 * Each command declares a table of options; `--name value`, `--name=value`
 * and flags are accepted, anything unknown is an error that names it, and
 * `--help` prints the command's usage built from the same table (so help and
 * parser cannot drift apart).
 *
 * defines: struct cli_opt, enum cli_result, cli_parse(), cli_print_help(),
 *          cli_get(), cli_flag(), cli_int(), cli_float(), cli_parse_ids()
 */
#ifndef MOESERVE_CLI_CLI_ARGS_H
#define MOESERVE_CLI_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

struct cli_opt {
    const char *name;    /* "model" for --model */
    char short_name;     /* 'n' for -n, or 0 */
    const char *metavar; /* NULL for a flag */
    const char *help;
    const char *value;   /* filled by cli_parse */
    bool set;
};

enum cli_result { CLI_OK, CLI_HELP, CLI_ERROR };

enum cli_result cli_parse(int argc, char **argv, struct cli_opt *opts, int n_opts, struct err *err);
void cli_print_help(const char *usage, const char *about, const struct cli_opt *opts, int n_opts);

const char *cli_get(const struct cli_opt *opts, int n_opts, const char *name, const char *def);
bool cli_flag(const struct cli_opt *opts, int n_opts, const char *name);
/* Parse the option's value; STATUS_INVALID naming the option on a bad value. */
enum status cli_int(const struct cli_opt *opts, int n_opts, const char *name, long lo, long hi, long *out,
                    struct err *err);
enum status cli_float(const struct cli_opt *opts, int n_opts, const char *name, double lo, double hi,
                      double *out, struct err *err);
/* --smem-budget BYTES as a number (0 when absent or not a positive integer;
 * the CUDA backend then uses the device's own budget). */
size_t cli_smem_budget(const struct cli_opt *opts, int n_opts);
/* --attention-precision: 0 hi_lo (also when absent), 1 pv_bf16, 2 bf16; -1 for another value, which
 * model_session_open refuses with a message naming the flag. */
int cli_attention_precision(const struct cli_opt *opts, int n_opts);
/* "1,2,3" -> malloc'ed array (caller frees). */
enum status cli_parse_ids(const char *s, const char *what, int32_t **ids, int *n, struct err *err);

#endif
