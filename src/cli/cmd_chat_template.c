/* cmd_chat_template.c — `moeserve chat-template`: render a chat as the model sees it.
 *
 * Reads a JSON file holding either a list of messages or an object with
 * "messages" (and optionally "tools"), renders the model's chat template
 * (tokenizer_config.json / chat_template.jinja) exactly as transformers'
 * apply_chat_template(tokenize=False) and prints the text without adding a
 * newline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/log.h"
#include "cli/cli_args.h"
#include "cli/commands.h"
#include "template/chat_template.h"

/* A deep copy through text: our JSON trees are built, not mutated. */
static struct json *json_clone(const struct json *j)
{
    char *txt = json_print(j, false);
    struct json *copy = NULL;
    struct err ignored = {0};
    if (txt)
        json_parse(txt, strlen(txt), "copy", &copy, &ignored);
    free(txt);
    return copy;
}

int cmd_chat_template(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "model directory with tokenizer_config.json (default: the shipped model)"},
        {.name = "messages", .metavar = "FILE", .help = "JSON: a list of messages, or {\"messages\": [...], \"tools\": [...]} (required)"},
        {.name = "add-generation-prompt", .help = "end with the assistant turn's opening"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve chat-template [--model DIR] --messages FILE.json [--add-generation-prompt]",
                       "Prints the chat rendered by the model's chat template, as transformers' apply_chat_template.",
                       opts, n);
        return 0;
    }
    const char *file = cli_get(opts, n, "messages", NULL);
    if (r == CLI_ERROR || !file) {
        LOG_ERROR("chat-template: %s", r == CLI_ERROR ? err.msg : "--messages is required");
        return 2;
    }
    const char *model = cli_get(opts, n, "model", cli_default_model());
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model);
    struct chat_template *ct = NULL;
    struct json *ctx = NULL, *in = NULL;
    char *out = NULL;
    size_t len = 0;
    int rc = 1;
    if (chat_template_from_config(&ct, path, &ctx, &err) || json_parse_file(file, &in, &err)) {
        LOG_ERROR("chat-template: %s", err.msg);
        goto done;
    }
    if (!ctx)
        ctx = json_new_object();
    const struct json *msgs = json_is_array(in) ? in : json_get(in, "messages");
    if (!json_is_array(msgs)) {
        LOG_ERROR("chat-template: %s: expected a list of messages or an object with \"messages\"", file);
        goto done;
    }
    json_add(ctx, "messages", json_clone(msgs));
    const struct json *tools = json_is_object(in) ? json_get(in, "tools") : NULL;
    if (tools && !json_is_null(tools))
        json_add(ctx, "tools", json_clone(tools));
    json_add(ctx, "add_generation_prompt", json_new_bool(cli_flag(opts, n, "add-generation-prompt")));
    if (chat_template_render(ct, ctx, &out, &len, &err)) {
        LOG_ERROR("chat-template: %s", err.msg);
        goto done;
    }
    fwrite(out, 1, len, stdout);
    rc = 0;
done:
    free(out);
    json_free(in);
    json_free(ctx);
    chat_template_free(ct);
    return rc;
}
