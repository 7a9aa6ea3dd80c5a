/* jinja_parser.h — parses a chat template's source into a struct jtemplate
 * (jinja2's grammar for the statements chat templates use).
 *
 * Syntax errors name the line and column and what was expected. Filters and
 * tests are resolved to builtin ids here; an unknown one is an error at
 * compile time unless it sits in an if/elif/else or a conditional expression,
 * where jinja2 defers the error to the moment it runs (and so do we).
 *
 * defines: jinja_parse(), jinja_template_free()
 */
#ifndef MOESERVE_TEMPLATE_JINJA_PARSER_H
#define MOESERVE_TEMPLATE_JINJA_PARSER_H

#include <stddef.h>

#include "base/status.h"
#include "template/jinja_ast.h"

/* t is zeroed by the caller; on failure it is left freed. */
enum status jinja_parse(struct jtemplate *t, const char *src, size_t len, struct err *err);
void jinja_template_free(struct jtemplate *t);

#endif
