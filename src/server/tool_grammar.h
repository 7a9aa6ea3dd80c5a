/* tool_grammar.h — tool_choice "required" or a named function as a grammar of the answer.
 *
 * A forced call is constrained decoding (engine/grammar_json.h): the answer must be one call
 * written in the model's format, its arguments valid for the function's parameters schema, then
 * the end of the sequence; "required" is one such call per tool, as alternatives.
 *   qwen3: "<tool_call>\n{\"name\": \"NAME\", \"arguments\": " + a value of the schema +
 *          "}\n</tool_call>", exactly as Qwen3's template writes calls.
 *   glm45: "<tool_call>NAME\n" + "<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n" per
 *          argument + "</tool_call>", as GLM-4.5's template writes calls (each "\n" optional:
 *          GLM-4.7/5 write none); keys in the schema's order, required ones present; a string
 *          parameter's VALUE is raw text (enum, const, format, minLength/maxLength honoured;
 *          pattern refused), any other one's the JSON text of its schema. tool_grammar.c says
 *          what exactly is taken. The parameters must be one object schema (no anyOf, $ref, ...
 *          at the top).
 * A schema outside the compilers' subset is a 400 naming the tool's parameters and the keyword.
 * Where the server splits reasoning off, a thinking block may come first (api_format_bind).
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
