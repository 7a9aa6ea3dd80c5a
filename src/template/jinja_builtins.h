/* jinja_builtins.h — what a chat template can call: jinja2's filters and
 * tests, transformers' tojson/raise_exception/strftime_now, jinja2's global
 * functions (namespace, range, dict, ...), and the Python methods templates
 * call on values (str.split, dict.get, ...).
 *
 * Every builtin takes its arguments as Python would (positional, then
 * keywords by name) and reports misuse as a render error. Methods that would
 * mutate a list or dict fail as jinja2's ImmutableSandboxedEnvironment does.
 *
 * defines: struct jargs, jinja_filter_*(), jinja_test_*(), jinja_method_*(), jinja_global_*()
 */
#ifndef MOESERVE_TEMPLATE_JINJA_BUILTINS_H
#define MOESERVE_TEMPLATE_JINJA_BUILTINS_H

#include <stdbool.h>
#include <stddef.h>

#include "template/jinja_value.h"

struct jrender;

/* Evaluated call arguments (borrowed). */
struct jargs {
    const struct jv *pos; /* (n_pos) */
    size_t n_pos;
    const char *const *kw_names; /* (n_kw) */
    const struct jv *kw_vals;    /* (n_kw) */
    size_t n_kw;
};

int jinja_filter_find(const char *name); /* -1 when unknown */
int jinja_test_find(const char *name);
int jinja_global_find(const char *name);
/* Method of a value by attribute name (str, dict, list and loop methods), or
 * -1. *unsafe is set for the mutating methods the sandbox refuses. */
int jinja_method_find(const struct jv *self, const char *name, size_t n, bool *unsafe);

/* Each returns false after recording an error in r. */
bool jinja_filter_call(struct jrender *r, int id, const struct jv *input, const struct jargs *args,
                       struct jv *out);
bool jinja_test_call(struct jrender *r, int id, const struct jv *input, const struct jargs *args, bool *out);
bool jinja_global_call(struct jrender *r, int id, const struct jargs *args, struct jv *out);
bool jinja_method_call(struct jrender *r, int id, const struct jv *self, const struct jargs *args,
                       struct jv *out);
/* Runs a lazy generator (struct jv_list.lazy) now; a no-op when it has run. */
bool jinja_gen_force(struct jrender *r, struct jv_list *gen);
/* Python's `fmt % args` (printf-style: %s %r %d %i %f %e %g %x %o %c %%). */
bool jinja_percent_format(struct jrender *r, const struct jv *fmt, const struct jv *args, struct jv *out);

#endif
