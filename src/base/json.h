/* json.h — the one wrapper over cJSON (swap the library by editing json.c).
 *
 * Reading: parse text or a file into a tree of opaque struct json nodes; key
 * lookup is case-sensitive (cJSON's default is not) and linear, so callers
 * walk big objects once with json_child()/json_next() into their own map.
 * Numbers are doubles (exact up to 2^53).
 * Writing: build a tree with json_new_*() / json_add_*() and print it.
 *
 * defines: struct json, json_parse(), json_parse_file(), json_free(), json_duplicate_key(),
 *          json_count_values(), json_has_nul_escape(), json_get(),
 *          json_child(), json_next(), json_key(), json_is_*(), json_string(),
 *          json_number(), json_bool(), json_array_size(), json_array_at(),
 *          json_new_object(), json_new_array(), json_add_*(), json_print()
 */
#ifndef MOESERVE_BASE_JSON_H
#define MOESERVE_BASE_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

struct json; /* opaque node */

/* `what` names the source in error messages (a path, "request body"). One value, then only
 * white space: bytes after it are an error. */
enum status json_parse(const char *text, size_t len, const char *what, struct json **out,
                       struct err *err);
enum status json_parse_file(const char *path, struct json **out, struct err *err);
void json_free(struct json *j);
/* The first key that an object anywhere in j holds twice, or NULL (cJSON keeps both, and
 * lookups see the first where most parsers keep the last). */
const char *json_duplicate_key(const struct json *j);
/* About how many values (members, elements, containers) the JSON text holds, counted without
 * parsing: what a parse would allocate nodes for (one per element and member, plus one per
 * container). */
size_t json_count_values(const char *text, size_t len);
/* Whether a JSON string in text holds the escape \u0000: parsed, the C string would end there. */
bool json_has_nul_escape(const char *text, size_t len);

const struct json *json_get(const struct json *obj, const char *key); /* NULL if absent */
const struct json *json_child(const struct json *j); /* first member/element */
const struct json *json_next(const struct json *j);
const char *json_key(const struct json *member);

bool json_is_object(const struct json *j);
bool json_is_array(const struct json *j);
bool json_is_string(const struct json *j);
bool json_is_number(const struct json *j);
bool json_is_bool(const struct json *j);
bool json_is_null(const struct json *j); /* also true for j == NULL */

const char *json_string(const struct json *j); /* NULL unless a string */
double json_number(const struct json *j);      /* 0 unless a number */
bool json_bool(const struct json *j);          /* false unless true */
size_t json_array_size(const struct json *j);
const struct json *json_array_at(const struct json *j, size_t i);

/* Builders. json_add_* take ownership of `val`; they return val (or NULL on OOM). */
struct json *json_new_object(void);
struct json *json_new_array(void);
struct json *json_new_string(const char *s);
struct json *json_new_number(double v);
struct json *json_new_bool(bool v);
struct json *json_new_null(void);
struct json *json_add(struct json *obj, const char *key, struct json *val);
struct json *json_append(struct json *arr, struct json *val);
/* A deep copy of j for another tree to own; NULL (a missing member) copies as a JSON null. NULL on OOM. */
struct json *json_copy(const struct json *j);
/* Returns a malloc'ed string (caller frees), NULL on OOM. */
char *json_print(const struct json *j, bool pretty);

#endif
