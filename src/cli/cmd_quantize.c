/* cmd_quantize.c — `moeserve quantize`: write an NVFP4 or FP8 copy of a checkpoint. */
#include <string.h>

#include "base/log.h"
#include "cli/cli_args.h"
#include "cli/commands.h"
#include "engine/quantize.h"

#define MAX_EXCLUDES 64

int cmd_quantize(int argc, char **argv)
{
    /* --exclude may repeat: collect those first, hand the rest to the parser */
    const char *excl[MAX_EXCLUDES];
    int n_excl = 0;
    char *rest[256];
    int n_rest = 0;
    for (int i = 0; i < argc && n_rest < 256; i++) {
        if (!strcmp(argv[i], "--exclude") && i + 1 < argc && n_excl < MAX_EXCLUDES)
            excl[n_excl++] = argv[++i];
        else if (!strncmp(argv[i], "--exclude=", 10) && n_excl < MAX_EXCLUDES)
            excl[n_excl++] = argv[i] + 10;
        else
            rest[n_rest++] = argv[i];
    }
    struct cli_opt opts[] = {
        {.name = "in", .metavar = "DIR", .help = "BF16/F16/F32 checkpoint directory (required)"},
        {.name = "out", .metavar = "DIR", .help = "output directory (required)"},
        {.name = "format", .metavar = "FMT", .help = "nvfp4 (ModelOpt layout) or fp8 (128x128 blocks) (required)"},
        {.name = "exclude", .metavar = "PATTERN", .help = "keep modules matching this shell pattern unquantized (repeatable)"},
        {.name = "calib-tokens", .metavar = "N", .help = "nvfp4: tokens of the input-scale calibration pass (default 256; "
                                                         "0 = weight-only W4A16_NVFP4)"},
        {.name = "seed", .metavar = "S", .help = "seed of the calibration tokens (default 1)"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(n_rest, rest, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve quantize --in DIR --out DIR --format nvfp4|fp8 [--exclude PATTERN ...]",
                       "Writes a quantized copy of a checkpoint in the producer's layout (ModelOpt NVFP4 or block FP8),\n"
                       "sharded like the input. lm_head, embeddings, router gates and MTP layers stay unquantized.",
                       opts, n);
        return 0;
    }
    const char *in = cli_get(opts, n, "in", NULL), *out = cli_get(opts, n, "out", NULL);
    const char *fmt = cli_get(opts, n, "format", NULL);
    long calib = 256, seed = 1;
    if (r == CLI_ERROR || cli_int(opts, n, "calib-tokens", 0, 1 << 16, &calib, &err) ||
        cli_int(opts, n, "seed", 0, 1L << 30, &seed, &err)) {
        LOG_ERROR("quantize: %s", err.msg);
        return 2;
    }
    if (!in || !out || !fmt || (strcmp(fmt, "nvfp4") != 0 && strcmp(fmt, "fp8") != 0)) {
        LOG_ERROR("quantize: --in, --out and --format nvfp4|fp8 are required (see --help)");
        return 2;
    }
    struct quantize_opts qo = {.format = strcmp(fmt, "nvfp4") == 0 ? WEIGHT_NVFP4 : WEIGHT_FP8_BLOCK,
                               .exclude = excl, .n_exclude = n_excl,
                               .calib_tokens = strcmp(fmt, "nvfp4") == 0 ? (int)calib : 0,
                               .calib_seed = (unsigned)seed};
    if (quantize_checkpoint(in, out, &qo, &err)) {
        LOG_ERROR("quantize: %s", err.msg);
        return 1;
    }
    return 0;
}
