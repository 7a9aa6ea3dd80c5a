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
 * defines: GRAMMAR_JSON_WS_MAX, GRAMMAR_JSON_MAX_DEPTH, struct grammar_json_part,
 *          struct grammar_json_opts, grammar_json_compile(), grammar_json_compile_text()
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

#endif
