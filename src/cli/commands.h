/* commands.h — the subcommands of the moeserve binary.
 *
 * Each takes the arguments after its name and returns a process exit code:
 * 0 success, 1 failure (message already printed), 2 usage error.
 *
 * defines: cmd_logits(), cmd_generate(), cmd_info(), cmd_bench(), cmd_quantize(), cli_default_model()
 */
#ifndef MOESERVE_CLI_COMMANDS_H
#define MOESERVE_CLI_COMMANDS_H

int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

/* $MOESERVE_MODEL, else the small model shipped in the repository. */
const char *cli_default_model(void);

#endif
