/* chat_template.h — Hugging Face chat templates (the Jinja2 subset they use),
 * rendered byte-identically to transformers' apply_chat_template.
 *
 * transformers renders with jinja2's ImmutableSandboxedEnvironment
 * (trim_blocks, lstrip_blocks, loopcontrols), its own tojson filter
 * (json.dumps, ensure_ascii=False) and the globals raise_exception and
 * strftime_now. The context carries messages, tools, documents,
 * add_generation_prompt and the tokenizer's special tokens (bos_token, ...).
 *
 * A compiled template is immutable: any number of threads may render it at
 * once. Renders are bounded (16 MiB of output, a work budget, a recursion
 * limit): a runaway template fails, it never hangs or exhausts the stack.
 *
 * Not supported: {% include/import/extends/block/call %}, recursive loops,
 * star-args in calls and \N{...} escapes (compile errors); the filters
 * groupby, slice, urlize, wordwrap, xmlattr, pprint, random, filesizeformat
 * and striptags (unknown filters); the globals cycler, joiner and lipsum
 * (undefined). Known differences from jinja2:
 * integers are 64-bit (overflow is an error); JSON numbers that are integral
 * become ints ("1.0" prints as 1); generators print with a fixed address and
 * range() objects as lists; a namespace may not hold another namespace; case
 * mapping and str.isprintable() cover the usual scripts, not all of Unicode.
 *
 * defines: struct chat_template, chat_template_compile(), chat_template_render(),
 *          chat_template_free(), chat_template_from_config()
 */
#ifndef MOESERVE_TEMPLATE_CHAT_TEMPLATE_H
#define MOESERVE_TEMPLATE_CHAT_TEMPLATE_H

#include <stddef.h>

#include "base/json.h"
#include "base/status.h"

struct chat_template;

/* Syntax errors: STATUS_FORMAT, "chat template: line L, column C: <what was
 * expected>". Unknown filters/tests fail here too, except inside if blocks
 * and conditional expressions where jinja2 defers them to render time. */
enum status chat_template_compile(struct chat_template **out, const char *source, size_t len,
                                  struct err *err);

/* Renders with the members of `context` (a JSON object, or NULL) as template
 * variables. As transformers always passes them, `tools` and `documents`
 * default to None and `add_generation_prompt` to false when absent.
 * *out is malloc'ed and NUL-terminated; *out_len excludes the NUL.
 * Errors: raise_exception("msg") -> STATUS_INVALID with err->msg == "msg"
 * exactly; other template errors (undefined values misused, type errors,
 * limits) -> STATUS_INVALID with "chat template: line L: ...". */
enum status chat_template_render(const struct chat_template *t, const struct json *context, char **out,
                                 size_t *out_len, struct err *err);

void chat_template_free(struct chat_template *t); /* NULL is fine */

/* Loads the template of a tokenizer_config.json: a chat_template.jinja file
 * in the same directory wins (as in transformers), else the config's
 * "chat_template" (a string, or a list of {name, template} from which
 * "default" is taken). *special_vars (may be NULL to skip) receives an object
 * with bos_token, eos_token, unk_token, pad_token as strings, for those the
 * config sets (a string or an AddedToken {"content": ...}); the caller frees
 * it with json_free. */
enum status chat_template_from_config(struct chat_template **out, const char *tokenizer_config_json_path,
                                      struct json **special_vars, struct err *err);

#endif
