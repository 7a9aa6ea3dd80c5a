/* jinja_json.h — JSON in and out of the chat-template value model: the
 * render context arrives as a struct json tree; templates print JSON with
 * transformers' `tojson` filter, which is Python's json.dumps (not jinja2's
 * HTML-safe tojson).
 *
 * JSON numbers become Python ints when they are integral and within 2^53,
 * floats otherwise (cJSON keeps no int/float distinction, so a "1.0" in the
 * context prints as 1).
 *
 * defines: jinja_json_to_value(), struct jinja_json_opts, jinja_tojson()
 */
#ifndef MOESERVE_TEMPLATE_JINJA_JSON_H
#define MOESERVE_TEMPLATE_JINJA_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "base/json.h"
#include "base/status.h"
#include "template/jinja_value.h"

struct jrender;

/* A new value for j (NULL = None). Fails past JV_MAX_DEPTH levels. */
enum status jinja_json_to_value(const struct json *j, struct jv *out, struct err *err);

/* json.dumps(obj, ensure_ascii, indent, separators, sort_keys). */
struct jinja_json_opts {
    bool ensure_ascii;
    bool sort_keys;
    const char *indent; /* NULL = compact (no newlines) */
    size_t indent_len;
    const char *item_sep; /* ", " or "," (with indent) unless given */
    size_t item_sep_len;
    const char *key_sep; /* ": " unless given */
    size_t key_sep_len;
};

bool jinja_tojson(struct jrender *r, const struct jv *v, const struct jinja_json_opts *o, struct jbuf *out);

#endif
