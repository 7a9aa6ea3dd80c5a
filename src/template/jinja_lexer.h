/* jinja_lexer.h — splits a chat template into tokens the way jinja2's lexer
 * does with trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False.
 *
 * Whitespace control ({%- -%} {{- -}} {#- -#}, '+' to opt out), trim_blocks,
 * lstrip_blocks, comments and {% raw %} are all resolved here, so the parser
 * sees only data, tags and expression tokens. The input must already be
 * newline-normalised (see jinja_normalize_source).
 *
 * defines: enum jtok_kind, enum jop, struct jtok, jinja_normalize_source(),
 *          jinja_lex(), jinja_line_col()
 */
#ifndef MOESERVE_TEMPLATE_JINJA_LEXER_H
#define MOESERVE_TEMPLATE_JINJA_LEXER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "template/jinja_ast.h"

enum jtok_kind {
    JT_EOF,
    JT_DATA, /* s/n: template text (already stripped) */
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,   /* s/n */
    JT_STRING, /* s/n: decoded bytes */
    JT_INT,    /* i */
    JT_FLOAT,  /* f */
    JT_OP,     /* op */
};

enum jop {
    JOP_ADD,
    JOP_SUB,
    JOP_DIV,
    JOP_FLOORDIV,
    JOP_MUL,
    JOP_MOD,
    JOP_POW,
    JOP_TILDE,
    JOP_LBRACKET,
    JOP_RBRACKET,
    JOP_LPAREN,
    JOP_RPAREN,
    JOP_LBRACE,
    JOP_RBRACE,
    JOP_EQ,
    JOP_NE,
    JOP_GT,
    JOP_GTEQ,
    JOP_LT,
    JOP_LTEQ,
    JOP_ASSIGN,
    JOP_DOT,
    JOP_COLON,
    JOP_PIPE,
    JOP_COMMA,
    JOP_SEMICOLON,
    JOP_IN, /* comparison operators made by the parser, never lexed */
    JOP_NOTIN,
};

struct jtok {
    uint8_t kind;  /* enum jtok_kind */
    uint8_t op;    /* enum jop */
    uint32_t pos;  /* byte offset in the source */
    const char *s; /* (n) borrowed from the source or the arena */
    size_t n;
    int64_t i;
    double f;
};

/* Converts \r\n and \r to \n and drops one trailing newline, into the arena. */
char *jinja_normalize_source(struct jarena *a, const char *src, size_t len, size_t *out_len);

/* Tokens end with one JT_EOF. *toks is malloc'ed (caller frees). */
enum status jinja_lex(struct jarena *a, const char *src, size_t len, struct jtok **toks, size_t *n_toks,
                      struct err *err);

void jinja_line_col(const char *src, size_t len, size_t pos, unsigned *line, unsigned *col);

#endif
