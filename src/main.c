/* main.c — the moeserve command line: picks a subcommand and runs it.
 * Parsing of each command's options lives with the command (src/cli/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "cli/commands.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *about;
} COMMANDS[] = {
    {"generate", cmd_generate, "continue a prompt"},
    {"logits", cmd_logits, "write the logits of one forward pass (float32 [tokens, vocab])"},
    {"info", cmd_info, "describe a checkpoint: family, layers, parameters, formats, memory"},
    {"bench", cmd_bench, "measure prefill and decode speed against memory bandwidth"},
    {"quantize", cmd_quantize, "write an NVFP4 or FP8 copy of a checkpoint"},
    {"tokenize", cmd_tokenize, "text -> token ids (JSON array), exactly as HF tokenizers"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"chat-template", cmd_chat_template, "render a chat with the model's chat template"},
    {"perplexity", cmd_perplexity, "score a text file: perplexity over windows"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (completions, chat, models, health, metrics)"},
    {"plan", cmd_plan, "which kernel, tile and shared memory each op gets on a GPU (or --profile NAME)"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: moeserve COMMAND [options]   (moeserve COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(out, "  %-12s %s\n", COMMANDS[i].name, COMMANDS[i].about);
    fprintf(out, "\nenvironment: MOESERVE_MODEL (default --model), MOESERVE_LOG=quiet|debug\n");
}

int main(int argc, char **argv)
{
    const char *lvl = getenv("MOESERVE_LOG");
    if (lvl && strcmp(lvl, "quiet") == 0)
        log_set_level(LOG_LEVEL_WARN);
    else if (lvl && strcmp(lvl, "debug") == 0)
        log_set_level(LOG_LEVEL_DEBUG);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (strcmp(argv[1], COMMANDS[i].name) == 0)
            return COMMANDS[i].run(argc - 2, argv + 2);
    fprintf(stderr, "moeserve: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
