/* api_format.h — structured output requests: response_format (chat, completions) and the
 * Responses API's text.format, parsed and compiled to a grammar (engine/grammar_json.h).
 *
 * {"type": "text"} asks nothing; "json_object": any JSON object; "json_schema": {"name",
 * "schema", "strict", "description"} the schema's JSON text (strict or not: the grammar is the
 * schema's either way). A malformed value or a schema outside the compiler's subset is a 400
 * naming the field and the keyword ("response_format.json_schema.schema.properties.age: 'minimum'
 * is not supported"). The grammar is compiled here, once a request, bounded in size (the
 * compiler's limits; the body's size bounds the schema). Pure, like api_request.c: fuzzed
 * through tests/fuzz/fuzz_grammar_json.c and fuzz_request.c.
 *
 * defines: api_format_parse(), api_format_takes(), api_format_vocab_new(), api_format_vocab_free(),
 *          api_format_bind()
 */
#ifndef MOESERVE_SERVER_API_FORMAT_H
#define MOESERVE_SERVER_API_FORMAT_H

#include <stdbool.h>

#include "base/json.h"
#include "engine/scheduler.h"
#include "server/api_request.h"

struct tokenizer;
struct model_desc;

/* Reads body's response_format (rq->kind API_CHAT, API_COMPLETIONS) or text.format
 * (API_RESPONSES) into rq->grammar (left NULL for none or "text"). */
enum status api_format_parse(const struct json *body, struct api_request *rq, struct api_error *e);
/* Whether a Responses API text.format is one api_format_parse takes (text, json_object, json_schema). */
bool api_format_takes(const struct json *format);
/* The vocabulary's bytes for token masks, built once at server start; NULL (logged) when the
 * tokenizer's tokens have no fixed bytes or memory is short: structured output is then refused. */
struct token_vocab *api_format_vocab_new(const struct tokenizer *tok, const struct model_desc *d);
void api_format_vocab_free(struct token_vocab *tv);
/* Puts rq's grammar (if any) into sp; 400 when the server has no vocabulary for it. think: the
 * answer may start with a reasoning block ("<think>" ... "</think>", server/reasoning.h) that the
 * grammar leaves free; rq->grammar is then replaced by that wider grammar. */
enum status api_format_bind(struct api_request *rq, const struct token_vocab *tv, bool think, struct sched_params *sp,
                            struct api_error *e);

#endif
