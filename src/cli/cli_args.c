/* cli_args.c — see cli_args.h. */
#include "cli/cli_args.h"

#include "base/log.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct cli_opt *opt_find(struct cli_opt *opts, int n, const char *name, size_t len, char short_name)
{
    for (int i = 0; i < n; i++) {
        if (short_name && opts[i].short_name == short_name)
            return &opts[i];
        if (!short_name && strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
            return &opts[i];
    }
    return NULL;
}

enum cli_result cli_parse(int argc, char **argv, struct cli_opt *opts, int n_opts, struct err *err)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return CLI_HELP;
        struct cli_opt *o = NULL;
        const char *inline_val = NULL;
        if (a[0] == '-' && a[1] == '-' && a[2]) {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            o = opt_find(opts, n_opts, name, len, 0);
            if (eq)
                inline_val = eq + 1;
        } else if (a[0] == '-' && a[1] && !a[2]) {
            o = opt_find(opts, n_opts, NULL, 0, a[1]);
        } else {
            err_set(err, STATUS_INVALID, "unexpected argument \"%s\" (options start with --)", a);
            return CLI_ERROR;
        }
        if (!o) {
            err_set(err, STATUS_INVALID, "unknown option \"%s\" (see --help)", a);
            return CLI_ERROR;
        }
        if (!o->metavar) {
            if (inline_val) {
                err_set(err, STATUS_INVALID, "option --%s takes no value", o->name);
                return CLI_ERROR;
            }
            o->set = true;
            o->value = "1";
            continue;
        }
        if (!inline_val) {
            if (i + 1 >= argc) {
                err_set(err, STATUS_INVALID, "option --%s needs a value (%s)", o->name, o->metavar);
                return CLI_ERROR;
            }
            inline_val = argv[++i];
        }
        o->value = inline_val;
        o->set = true;
    }
    return CLI_OK;
}

void cli_print_help(const char *usage, const char *about, const struct cli_opt *opts, int n_opts)
{
    printf("usage: %s\n\n%s\n\noptions:\n", usage, about);
    for (int i = 0; i < n_opts; i++) {
        char left[64];
        if (opts[i].short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", opts[i].short_name, opts[i].name,
                     opts[i].metavar ? " " : "", opts[i].metavar ? opts[i].metavar : "");
        else
            snprintf(left, sizeof left, "--%s%s%s", opts[i].name, opts[i].metavar ? " " : "",
                     opts[i].metavar ? opts[i].metavar : "");
        printf("  %-28s %s\n", left, opts[i].help);
    }
    printf("  %-28s %s\n", "-h, --help", "show this help");
}

static const struct cli_opt *opt_get(const struct cli_opt *opts, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    return NULL;
}

const char *cli_get(const struct cli_opt *opts, int n_opts, const char *name, const char *def)
{
    const struct cli_opt *o = opt_get(opts, n_opts, name);
    return o && o->set ? o->value : def;
}

bool cli_flag(const struct cli_opt *opts, int n_opts, const char *name)
{
    const struct cli_opt *o = opt_get(opts, n_opts, name);
    return o && o->set;
}

enum status cli_int(const struct cli_opt *opts, int n_opts, const char *name, long lo, long hi, long *out,
                    struct err *err)
{
    const char *v = cli_get(opts, n_opts, name, NULL);
    if (!v)
        return STATUS_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return err_set(err, STATUS_INVALID, "option --%s: \"%s\" is not an integer in [%ld, %ld]", name, v, lo, hi);
    *out = x;
    return STATUS_OK;
}

enum status cli_float(const struct cli_opt *opts, int n_opts, const char *name, double lo, double hi,
                      double *out, struct err *err)
{
    const char *v = cli_get(opts, n_opts, name, NULL);
    if (!v)
        return STATUS_OK;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi))
        return err_set(err, STATUS_INVALID, "option --%s: \"%s\" is not a number in [%g, %g]", name, v, lo, hi);
    *out = x;
    return STATUS_OK;
}

enum status cli_parse_ids(const char *s, const char *what, int32_t **ids, int *n, struct err *err)
{
    *ids = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *c = s; *c; c++)
        cap += *c == ',';
    int32_t *out = malloc(cap * sizeof *out);
    if (!out)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", what);
    int k = 0;
    const char *c = s;
    while (*c) {
        char *end;
        errno = 0;
        long v = strtol(c, &end, 10);
        if (errno || end == c || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(out);
            return err_set(err, STATUS_INVALID, "%s: \"%s\" is not a comma-separated list of token ids", what, s);
        }
        out[k++] = (int32_t)v;
        c = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(out);
        return err_set(err, STATUS_INVALID, "%s: no token ids given", what);
    }
    *ids = out;
    *n = k;
    return STATUS_OK;
}

size_t cli_smem_budget(const struct cli_opt *opts, int n_opts)
{
    const char *v = cli_get(opts, n_opts, "smem-budget", NULL);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || x < 1024) {
        LOG_WARN("--smem-budget \"%s\" is not a byte count >= 1024: using the device's own budget", v);
        return 0;
    }
    return (size_t)x;
}

int cli_attention_precision(const struct cli_opt *opts, int n_opts)
{
    const char *v = cli_get(opts, n_opts, "attention-precision", NULL);
    if (!v || !strcmp(v, "hi_lo"))
        return 0;
    if (!strcmp(v, "pv_bf16"))
        return 1;
    if (!strcmp(v, "bf16"))
        return 2;
    return -1;
}
