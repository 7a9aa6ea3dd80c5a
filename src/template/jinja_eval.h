/* jinja_eval.h — runs a parsed chat template (struct jtemplate) against a
 * context, with jinja2's semantics: scoping (a `set` inside a loop or macro
 * does not leak out), Undefined (prints empty, fails on any other use),
 * attribute access falling back to item access, Python operators.
 *
 * Also the services the builtins need from the render: error reporting with
 * line numbers, the step budget, attribute/item access, calls, iteration.
 *
 * Limits (every render): JINJA_MAX_OUTPUT bytes of output (and of any one
 * string), JINJA_MAX_STEPS units of work (node evaluations, loop iterations
 * at JINJA_LOOP_STEP_COST, bytes copied / 64), JINJA_MAX_EVAL_DEPTH nested
 * evaluations (macro recursion included). Passing one fails the render;
 * nothing hangs and the C stack stays bounded.
 *
 * defines: struct jrender, jr_*(), jinja_render()
 */
#ifndef MOESERVE_TEMPLATE_JINJA_EVAL_H
#define MOESERVE_TEMPLATE_JINJA_EVAL_H

#include <locale.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "template/jinja_ast.h"
#include "template/jinja_builtins.h"
#include "template/jinja_value.h"

#define JINJA_MAX_OUTPUT ((size_t)16 << 20)
#define JINJA_MAX_STEPS ((uint64_t)10000000)
#define JINJA_LOOP_STEP_COST 8 /* a loop iteration allocates a scope */
#define JINJA_MAX_EVAL_DEPTH 600
#define JINJA_MAX_RANGE 100000 /* jinja2's sandbox MAX_RANGE */

struct jrender {
    const struct jtemplate *t;
    struct err *err;
    enum status st;   /* first failure, STATUS_OK while running */
    struct jbuf *out; /* where {{ }} and text go now */
    unsigned depth;
    uint64_t steps_left;
    locale_t loc; /* C.UTF-8 for case mapping, or 0 */
    uint32_t pos; /* source offset of the node being run, for messages */
    bool folding; /* evaluating a constant {{ }} that jinja2 folds at compile time */
};

/* Record a failure (only the first one sticks); they return false. */
bool jr_fail(struct jrender *r, enum status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool jr_raise(struct jrender *r, const char *msg, size_t n); /* raise_exception: message verbatim */
bool jr_nomem(struct jrender *r);
bool jr_undefined_error(struct jrender *r, const struct jv *undef);
bool jr_step(struct jrender *r, uint64_t n);

/* A new string value, charged to the budget and capped at JINJA_MAX_OUTPUT. */
bool jr_str_new(struct jrender *r, const char *s, size_t n, struct jv *out);
bool jr_str_from_buf(struct jrender *r, struct jbuf *b, struct jv *out);
/* str(v) / repr(v) as a new string value. */
bool jr_to_str(struct jrender *r, const struct jv *v, struct jv *out);
/* A buffer for building strings under the output cap. */
static inline struct jbuf jr_buf(void)
{
    return (struct jbuf){.limit = JINJA_MAX_OUTPUT};
}
bool jr_buf_fail(struct jrender *r, const struct jbuf *b); /* over the cap, or OOM */

bool jr_list_push(struct jrender *r, struct jv *list, struct jv item); /* steals item */
bool jr_dict_set(struct jrender *r, struct jv *dict, struct jv key, struct jv val);
bool jr_hashable(struct jrender *r, const struct jv *key);

/* Python's iter(): a list of the items (a dict's keys, a str's characters);
 * Undefined iterates as empty. */
bool jr_iterate(struct jrender *r, const struct jv *v, struct jv *out_list);
/* obj.name and obj[key] (jinja2 sandbox getattr/getitem). `hint` (borrowed
 * from the template so that it outlives the render, or NULL) names the key
 * in undefined errors. */
bool jr_getattr_hint(struct jrender *r, const struct jv *obj, const char *name, size_t n, const char *hint,
                     struct jv *out);
bool jr_getitem(struct jrender *r, const struct jv *obj, const struct jv *key, const char *hint,
                struct jv *out);
/* getattr(obj, name) only, no item fallback (the attr filter). */
bool jr_pyattr(struct jrender *r, const struct jv *obj, const char *name, size_t n, const char *hint,
               struct jv *out);
/* a op b for the arithmetic operators (enum jop), with Python's semantics. */
bool jr_binop(struct jrender *r, int op, const struct jv *a, const struct jv *b, struct jv *out);
bool jr_call(struct jrender *r, const struct jv *fn, const struct jargs *args, struct jv *out);
/* `item in container` */
bool jr_contains(struct jrender *r, const struct jv *container, const struct jv *item, bool *out);
/* a < b etc. with Python's TypeError for unorderable types. */
bool jr_compare(struct jrender *r, const struct jv *a, const struct jv *b, bool fold, int *cmp);

/* Renders t with the variables of `globals` (borrowed; the template's own
 * top-level scope is a child of it) into *out (malloc'ed, NUL-terminated). */
enum status jinja_render(const struct jtemplate *t, struct jscope *globals, locale_t loc, char **out,
                         size_t *out_len, struct err *err);

#endif
