/* grammar_json.h — JSON Schema to a grammar (structured output, tool calls).
 *
 * The strict subset OpenAI's structured outputs take, compiled to a grammar of the JSON text that
 * validates: type (object, array, string, number, integer, boolean, null, or a list of them),
 * properties, required, additionalProperties (false, or absent = false as strict mode has it, but for
 * an object schema without properties: any keys; true
 * or a schema: any other key with such a value), enum, const, items, prefixItems, minItems,
 * maxItems, anyOf / oneOf (as anyOf), $ref to "#", "#/$defs/..." or "#/definitions/..."
 * (recursion allowed: the stack grows with the nesting of the output), string minLength,
 * maxLength, format date, time, date-time, uuid, email, pattern (a simple regular expression:
 * engine/grammar_regex.h; not with format or lengths). Keys are
 * written in the order properties lists them; optional ones may be left out. Annotations (title,
 * description, default, examples, $schema, $id, $comment, strict, deprecated, readOnly, writeOnly)
 * are ignored. Anything else (minimum, maximum, multipleOf, patternProperties, allOf, not, if,
 * dependentRequired, uniqueItems, contains, ...) is STATUS_UNSUPPORTED naming the keyword and
 * where it is ("schema.properties.age: 'minimum' is not supported"): refused, never ignored.
 *
 * Whitespace: at most ws_max bytes of space, tab or newline wherever JSON allows whitespace, so a
 * model cannot loop on blanks forever. Strings: any character but " \ and controls, or an escape
 * (\" \\ \/ \b \f \n \r \t \uXXXX); characters count toward minLength/maxLength as JSON Schema
 * counts them (one a code point, one an escape). Numbers: JSON's grammar, integers without a
 * fraction or exponent, with at most 20 digits before the point and 20 after (and 3 in an
 * exponent) so that a number ends.
 *
 * Tool calls: a part is a literal prefix, a value of a schema, a literal suffix; several parts
 * are alternatives (one of several tools). E.g. tool_choice named "f" with parameters P:
 *   {.prefix = "<tool_call>\n{\"name\": \"f\", \"arguments\": ", .schema = P, .suffix = "}\n</tool_call>"}
 *
 * Schemas inside another grammar: a format that is not one JSON value between literals (GLM's
 * tool calls: tag pairs, a JSON value or raw text in each) builds its own rules and asks a sub
 * for a schema's rules in the same builder: grammar_json_sub_value (the JSON text) and
 * grammar_json_sub_format_text (a string format's text, unquoted).
 *
 * defines: GRAMMAR_JSON_WS_MAX, GRAMMAR_JSON_MAX_DEPTH, struct grammar_json_part,
 *          struct grammar_json_opts, grammar_json_compile(), grammar_json_compile_text(),
 *          struct grammar_json_sub, grammar_json_sub_init(), grammar_json_sub_free(),
 *          grammar_json_sub_value(), grammar_json_sub_format_text(), grammar_json_sub_utf8(),
 *          grammar_json_is_annotation()
 */
#ifndef MOESERVE_ENGINE_GRAMMAR_JSON_H
#define MOESERVE_ENGINE_GRAMMAR_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "base/json.h"
#include "base/status.h"
#include "engine/grammar.h"

enum {
    GRAMMAR_JSON_WS_MAX = 20,   /* default whitespace run */
    GRAMMAR_JSON_MAX_DEPTH = 64 /* nesting of a schema (subschemas within subschemas) */
};

struct grammar_json_part {
    const char *prefix;        /* literal text before the value, or NULL */
    const struct json *schema; /* the value's schema (borrowed); NULL: any JSON object (json_object) */
    const char *suffix;        /* literal text after it, or NULL */
};

struct grammar_json_opts {
    int ws_max;                /* whitespace bytes at each place; 0: GRAMMAR_JSON_WS_MAX, -1: none */
    const char *path;          /* the schema's name in messages; NULL: "schema" */
};

/* One grammar: any of the parts (each prefix, value, suffix). o may be NULL (defaults). *out is
 * a new grammar (one reference, the caller's). STATUS_UNSUPPORTED: a keyword or form outside the
 * subset; STATUS_INVALID: a malformed schema or one past the grammar's bounds. */
enum status grammar_json_compile(const struct grammar_json_part *parts, int n_parts, const struct grammar_json_opts *o,
                                 struct grammar **out, struct err *err);
/* The same for one schema given as JSON text (NULL: any JSON object), without prefix or suffix. */
enum status grammar_json_compile_text(const char *schema, size_t len, const struct grammar_json_opts *o,
                                      struct grammar **out, struct err *err);

/* A compiler of schemas into rules of b (borrowed: the caller's builder, which it finishes). o may
 * be NULL; err (borrowed) gets the first failure, which every later call returns again. */
struct grammar_json_sub;
enum status grammar_json_sub_init(struct grammar_json_sub **out, struct gram_builder *b,
                                  const struct grammar_json_opts *o, struct err *err);
/* Safe on NULL. */
void grammar_json_sub_free(struct grammar_json_sub *sub);
/* *rule: the JSON text of a value of schema (NULL: any JSON value), a part of root (the document
 * its $refs resolve in); path names it in messages ("tools[0].function.parameters.properties.x").
 * Rules of one root are memoised: the same subschema twice is one rule. *rule is -1 on a failure
 * or once b has failed (gram_builder_finish then says why). */
enum status grammar_json_sub_value(struct grammar_json_sub *sub, const struct json *root, const struct json *schema,
                                   const char *path, int *rule);
/* *rule: the text of a string schema's 'format' (required; with 'pattern', minLength or maxLength:
 * STATUS_UNSUPPORTED), without quotes: the formats' characters need no escaping. */
enum status grammar_json_sub_format_text(struct grammar_json_sub *sub, const struct json *root,
                                         const struct json *schema, const char *path, int *rule);
/* A rule of one whole non-ASCII UTF-8 character (no surrogates, no overlongs); -1 once failed. */
int grammar_json_sub_utf8(struct grammar_json_sub *sub);
/* Whether a schema keyword is one of the annotations the compiler ignores ("description", ...). */
bool grammar_json_is_annotation(const char *key);

#endif
