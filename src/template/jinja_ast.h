/* jinja_ast.h — the syntax tree of a compiled chat template, and the arena
 * that owns it.
 *
 * The parser (jinja_parser.c) builds it once; the evaluator (jinja_eval.c)
 * only reads it, so one tree serves concurrent renders. Every node, array,
 * name and string constant lives in one arena freed at once; constants are
 * JV_IMMORTAL values.
 *
 * defines: struct jarena, jarena_*(), enum jnode_kind, struct jnode, struct jtemplate
 */
#ifndef MOESERVE_TEMPLATE_JINJA_AST_H
#define MOESERVE_TEMPLATE_JINJA_AST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "template/jinja_value.h"

/* ---- arena ----------------------------------------------------------------------------------- */

struct jarena_block;

struct jarena {
    struct jarena_block *head; /* owned chain */
    size_t used;               /* bytes used in head */
    size_t size;               /* capacity of head */
    size_t total;              /* bytes handed out, for the size limit */
};

void *jarena_alloc(struct jarena *a, size_t n); /* zeroed, 16-aligned; NULL on OOM */
char *jarena_strdup(struct jarena *a, const char *s, size_t n);
/* An immortal string value in the arena. */
bool jarena_str(struct jarena *a, const char *s, size_t n, struct jv *out);
void jarena_free(struct jarena *a);

/* ---- nodes ----------------------------------------------------------------------------------- */

#define JINJA_MAX_HEIGHT 256

enum jnode_kind {
    /* expressions */
    JN_CONST,   /* value */
    JN_NAME,    /* name */
    JN_GETATTR, /* a.name */
    JN_GETITEM, /* a[b] */
    JN_SLICE,   /* a[args[0]:args[1]:args[2]], each may be NULL */
    JN_CALL,    /* a(args, kw) */
    JN_FILTER,  /* a|name(args, kw); op = filter id or -1; a NULL = the filtered input */
    JN_TEST,    /* a is name(args, kw); op = test id or -1 */
    JN_NOT,     /* not a */
    JN_NEG,     /* -a */
    JN_POS,     /* +a */
    JN_BINOP,   /* a op b, op = enum jop (arithmetic) */
    JN_AND,     /* a and b */
    JN_OR,      /* a or b */
    JN_CONCAT,  /* args joined with ~ */
    JN_COMPARE, /* a ops[0] args[0] ops[1] args[1] ... */
    JN_COND,    /* b if a else c (c may be NULL) */
    JN_LIST,    /* [args] */
    JN_TUPLE,   /* (args) */
    JN_DICT,    /* {args[i]: vals[i]} */
    /* statements */
    JN_TEXT,         /* value (a string) */
    JN_OUTPUT,       /* {{ a }} */
    JN_IF,           /* if a: body else: else_body (elif = an JN_IF alone in else_body) */
    JN_FOR,          /* for names in a [if b]: body else: else_body */
    JN_SET,          /* names = a (or name.attr = a when attr) */
    JN_SET_BLOCK,    /* name = body rendered, through filter chain b (may be NULL) */
    JN_MACRO,        /* macro name(names = defaults): body */
    JN_FILTER_BLOCK, /* body rendered through filter chain b */
    JN_WITH,         /* with names = args: body */
    JN_SCOPE,        /* body in an inner scope ({% generation %}) */
    JN_BREAK,
    JN_CONTINUE,
};

struct jnode {
    uint8_t kind;    /* enum jnode_kind */
    bool unpack;     /* JN_FOR/JN_SET: the target was a tuple */
    uint16_t height; /* 1 + tallest child, <= JINJA_MAX_HEIGHT: bounds every tree walk */
    bool constant;   /* an expression of literals, which jinja2's optimizer folds */
    bool fold;       /* constant and contains a slice: folding changes its meaning */
    int op;          /* see kinds above */
    uint32_t pos;    /* byte offset in the (normalised) source, for messages */

    const char *name; /* NAME, GETATTR, FILTER, TEST, MACRO, SET target name */
    const char *attr; /* SET: namespace attribute */
    struct jv value;  /* CONST, TEXT: immortal */

    struct jnode *a, *b, *c;

    struct jnode **args; /* (n_args) */
    size_t n_args;
    struct jnode **vals; /* DICT values, MACRO defaults (n_args, NULL = none) */
    int *ops;            /* COMPARE operators (n_args) */

    const char **kw_names; /* (n_kw) call keyword arguments */
    struct jnode **kw_vals;
    size_t n_kw;

    const char **names; /* FOR/SET/WITH targets, MACRO parameters (n_names) */
    size_t n_names;

    struct jnode **body; /* (n_body) statements */
    size_t n_body;
    struct jnode **else_body; /* (n_else) */
    size_t n_else;
};

/* A parsed template: the tree plus the source it came from (for line numbers
 * in runtime errors). */
struct jtemplate {
    struct jarena arena;
    struct jnode **body; /* (n_body) */
    size_t n_body;
    const char *src; /* (src_len) normalised source, in the arena */
    size_t src_len;
};

/* Line and column (1-based) of a byte offset. */
void jtemplate_line_col(const struct jtemplate *t, uint32_t pos, unsigned *line, unsigned *col);

#endif
