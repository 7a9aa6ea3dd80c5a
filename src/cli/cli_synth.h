/* cli_synth.h — `--synthetic PRESET` on the commands that run a model without its checkpoint.
 *
 * The preset's shapes (model/synth_preset.h) with random weights made on each rank's device: the
 * whole GLM-5 runs where no disk holds its 421 GB. --model is then refused, not ignored.
 *
 * defines: CLI_SYNTH_OPTS, cli_synth_apply()
 */
#ifndef MOESERVE_CLI_CLI_SYNTH_H
#define MOESERVE_CLI_CLI_SYNTH_H

#include "cli/cli_args.h"
#include "engine/model_session.h"

#define CLI_SYNTH_OPTS                                                                                          \
    {.name = "synthetic", .metavar = "PRESET",                                                                 \
     .help = "no checkpoint: a preset's shapes with random weights made on the device (tiny, cpu-bench, "      \
             "qwen3-30b-a3b, glm-tiny, glm5-slice, glm5)"},                                                              \
    {.name = "synthetic-format", .metavar = "F", .help = "with --synthetic: nvfp4 (default) or bf16 weights"}, \
    {                                                                                                           \
        .name = "synthetic-layers", .metavar = "N", .help = "with --synthetic: the preset's first N layers"     \
    }

/* Reads the options into so (nothing without --synthetic); *label = the preset's name or NULL.
 * STATUS_INVALID naming the option on a bad value or with --model. */
enum status cli_synth_apply(const struct cli_opt *opts, int n_opts, struct session_opts *so, const char **label,
                            struct err *err);

#endif
