/* tool_grammar.h — tool_choice "required" or a named function as a grammar of the answer.
 *
 * A forced call is constrained decoding (engine/grammar_json.h): the answer must be one call
 * written in the model's format, its arguments valid for the function's parameters schema, then
 * the end of the sequence. qwen3: "<tool_call>\n{\"name\": \"NAME\", \"arguments\": " + a value
 * of the schema + "}\n</tool_call>", exactly as Qwen3's template writes calls; "required" is one
 * such part per tool, as alternatives. glm45 writes arguments as tag pairs, not JSON, which the
 * JSON-schema compiler cannot express: refused (400). A schema outside the compiler's subset is a
 * 400 naming the tool's parameters and the keyword. The call is forced from the answer's first
 * token, so a thinking model does not think first.
 *
 * defines: tool_grammar_compile()
 */
#ifndef MOESERVE_SERVER_TOOL_GRAMMAR_H
#define MOESERVE_SERVER_TOOL_GRAMMAR_H

#include "base/json.h"
#include "engine/grammar.h"
#include "server/api_request.h"
#include "server/tool_parse.h"

/* tools: the request's (checked) tools array; name: the function, or NULL for any of them.
 * *out: a new grammar (the caller's reference). */
enum status tool_grammar_compile(enum tool_format fmt, const struct json *tools, const char *name,
                                 struct grammar **out, struct api_error *e);

#endif
