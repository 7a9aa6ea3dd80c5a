/* cli_synth.c — see cli_synth.h. */
#include "cli/cli_synth.h"

#include <string.h>

#include "base/options.h"
#include "model/synth_preset.h"

enum status cli_synth_apply(const struct cli_opt *opts, int n_opts, struct session_opts *so, const char **label,
                            struct err *err)
{
    const char *preset = cli_get(opts, n_opts, "synthetic", NULL);
    *label = preset;
    if (!preset) {
        if (cli_get(opts, n_opts, "synthetic-format", NULL) || cli_get(opts, n_opts, "synthetic-layers", NULL))
            return err_set(err, STATUS_INVALID, "--synthetic-format and --synthetic-layers need --synthetic PRESET");
        return STATUS_OK;
    }
    if (cli_get(opts, n_opts, "model", NULL))
        return err_set(err, STATUS_INVALID, "--synthetic %s and --model: give one of them", preset);
    if (!synth_preset_find(preset))
        return err_set(err, STATUS_INVALID, "--synthetic %s: no such preset (have: %s)", preset,
                       synth_preset_names());
    const char *f = cli_get(opts, n_opts, "synthetic-format", "nvfp4");
    if (strcmp(f, "nvfp4") != 0 && strcmp(f, "bf16") != 0)
        return err_set(err, STATUS_INVALID, "--synthetic-format: expected nvfp4 or bf16, got \"%s\"", f);
    long layers = 0;
    enum status st = cli_int(opts, n_opts, "synthetic-layers", 1, 4096, &layers, err);
    if (st)
        return st;
    struct options env;
    if ((st = options_read(&env, err)))
        return st;
    so->tmp_dir = env.tmp_dir; /* points into the environment: lives as long as the process */
    so->synthetic = preset;
    so->synthetic_bf16 = strcmp(f, "bf16") == 0;
    so->synthetic_layers = (int)layers;
    return STATUS_OK;
}
