/* commands.h — the subcommands of the moeserve binary.
 *
 * Each takes the arguments after its name and returns a process exit code:
 * 0 success, 1 failure (message already printed), 2 usage error.
 *
 * defines: cmd_logits(), cmd_generate(), cmd_info(), cmd_bench(), cmd_bench_serve(), cmd_quantize(), cmd_tokenize(),
 *          cmd_detokenize(), cmd_perplexity(), cmd_serve(), cli_default_model(), cli_env_api_key(),
 *          cli_load_tokenizer()
 */
#ifndef MOESERVE_CLI_COMMANDS_H
#define MOESERVE_CLI_COMMANDS_H

#include "base/status.h"

int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* `moeserve bench serve ...`: reached through cmd_bench (argv after "serve"). */
int cmd_bench_serve(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_serve(int argc, char **argv);

struct tokenizer;
/* Loads DIR/tokenizer.json. */
enum status cli_load_tokenizer(const char *model_dir, struct tokenizer **tok, struct err *err);

/* $MOESERVE_MODEL, else the small model shipped in the repository. */
const char *cli_default_model(void);
/* $MOESERVE_API_KEY (base/options.h), or NULL. */
const char *cli_env_api_key(void);

#endif
