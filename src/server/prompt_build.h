/* prompt_build.h — an API request's prompt as token ids.
 *
 * Chat: the messages go through the model's chat template (with the
 * tokenizer's special tokens as template variables and the generation prompt
 * appended), then the tokenizer, without added special tokens (as
 * transformers' apply_chat_template). Completions: the text is encoded with
 * the tokenizer's post-processor (BOS where the model has one), or token ids
 * are taken as they are after a range check. Failures are the client's (400)
 * except running out of memory (500).
 *
 * defines: struct prompt_model, prompt_render_chat(), prompt_build()
 */
#ifndef MOESERVE_SERVER_PROMPT_BUILD_H
#define MOESERVE_SERVER_PROMPT_BUILD_H

#include "base/json.h"
#include "template/chat_template.h"
#include "format/tokenizer.h"
#include "server/api_request.h"

struct prompt_model {
    const struct tokenizer *tok;        /* borrowed */
    const struct chat_template *tmpl;   /* borrowed; NULL: the model has none (chat is refused) */
    const struct json *special_vars;    /* borrowed; {bos_token: "...", ...} or NULL */
    int vocab;                          /* the model's, bounds token-id prompts */
};

/* Chat (and the Responses API): the text the template renders for rq, which prompt_build then
 * tokenizes: the messages (with their tool calls, tool_call_id, ...), the tools unless
 * tool_choice is "none" (the model is not offered them), chat_template_kwargs, the generation
 * prompt. *text is malloc'ed, NUL-terminated; *len excludes the NUL. */
enum status prompt_render_chat(const struct prompt_model *pm, const struct api_request *rq, char **text, size_t *len,
                               struct api_error *e);
/* Appends the prompt's ids to *ids (empty on entry). */
enum status prompt_build(const struct prompt_model *pm, const struct api_request *rq, struct tok_ids *ids,
                         struct api_error *e);

#endif
