/* jinja_lexer.c — jinja2's lexer (root, block, variable, comment and raw
 * states) for the fixed delimiters {{ }} {% %} {# #}, written as a scanner
 * rather than regular expressions (see jinja_lexer.h).
 *
 * Matches jinja2 3.1 in the details that change output: lstrip_blocks only
 * strips when the tag starts a line (or follows a trimmed newline), '-'
 * strips every kind of Python whitespace including newlines, {% raw %}'s own
 * end is not trimmed, and string literals are decoded like Python's
 * unicode-escape after backslashreplace (so "\é" stays a backslash and
 * "xe9"). Not supported: line statements, custom delimiters, \N{...}.
 * Invariant: every token's text points into the source or the arena.
 */
#include "template/jinja_lexer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_text.h"

#define LEX_MAX_BALANCE 256

struct lexer {
    struct jarena *a;
    const char *src;
    size_t len;
    size_t pos;
    struct jtok *toks; /* (cap) */
    size_t n;
    size_t cap;
    bool line_starting;        /* the last match ended with a newline */
    char bal[LEX_MAX_BALANCE]; /* expected closing brackets */
    size_t n_bal;
    struct err *err;
};

void jinja_line_col(const char *src, size_t len, size_t pos, unsigned *line, unsigned *col)
{
    if (pos > len)
        pos = len;
    unsigned l = 1;
    size_t start = 0;
    for (size_t i = 0; i < pos; i++) {
        if (src[i] == '\n') {
            l++;
            start = i + 1;
        }
    }
    *line = l;
    *col = (unsigned)jtext_count_cp(src + start, pos - start) + 1;
}

static enum status lex_fail(struct lexer *L, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum status lex_fail(struct lexer *L, size_t pos, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line, col;
    jinja_line_col(L->src, L->len, pos, &line, &col);
    return err_set(L->err, STATUS_FORMAT, "chat template: line %u, column %u: %s", line, col, msg);
}

char *jinja_normalize_source(struct jarena *a, const char *src, size_t len, size_t *out_len)
{
    char *out = jarena_alloc(a, len + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            out[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            out[n++] = src[i];
        }
    }
    if (n && out[n - 1] == '\n')
        n--;
    out[n] = '\0';
    *out_len = n;
    return out;
}

static bool lex_emit(struct lexer *L, enum jtok_kind kind, size_t pos, const char *s, size_t n)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        struct jtok *t = realloc(L->toks, cap * sizeof *t);
        if (!t)
            return false;
        L->toks = t;
        L->cap = cap;
    }
    struct jtok *t = &L->toks[L->n++];
    memset(t, 0, sizeof *t);
    t->kind = (uint8_t)kind;
    t->pos = (uint32_t)pos;
    t->s = s;
    t->n = n;
    return true;
}

/* Length of the Python whitespace code point at i, or 0. */
static size_t lex_space_at(const struct lexer *L, size_t i)
{
    if (i >= L->len)
        return 0;
    uint32_t cp;
    size_t l = jtext_decode(L->src + i, L->len - i, &cp);
    return jtext_isspace(cp) ? l : 0;
}

static size_t lex_skip_space(const struct lexer *L, size_t i)
{
    size_t l;
    while ((l = lex_space_at(L, i)) != 0)
        i += l;
    return i;
}

/* s[0..n) with trailing Python whitespace removed: the new length. */
static size_t lex_rstrip(const char *s, size_t n)
{
    while (n > 0) {
        size_t start = n - 1;
        while (start > 0 && n - start < 4 && ((unsigned char)s[start] & 0xC0) == 0x80)
            start--;
        uint32_t cp;
        size_t l = jtext_decode(s + start, n - start, &cp);
        if (start + l != n) { /* not one well-formed code point: the last byte alone */
            start = n - 1;
            jtext_decode(s + start, 1, &cp);
        }
        if (!jtext_isspace(cp))
            break;
        n = start;
    }
    return n;
}

static bool lex_all_space(const char *s, size_t n)
{
    if (n == 0)
        return false; /* jinja2 uses \s+ : at least one */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = jtext_decode(s + i, n - i, &cp);
        if (!jtext_isspace(cp))
            return false;
        i += l;
    }
    return true;
}

/* Emits the text before a tag, applying '-' (strip all) or lstrip_blocks. */
static bool lex_emit_text(struct lexer *L, size_t start, size_t len, char sign, bool lstrip_ok)
{
    const char *s = L->src + start;
    if (sign == '-') {
        len = lex_rstrip(s, len);
    } else if (sign != '+' && lstrip_ok) {
        size_t l_pos = 0;
        for (size_t i = len; i > 0; i--) {
            if (s[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        }
        if ((l_pos > 0 || L->line_starting) && lex_all_space(s + l_pos, len - l_pos))
            len = l_pos;
    }
    if (len == 0)
        return true;
    return lex_emit(L, JT_DATA, start, s, len);
}

static bool lex_starts(const struct lexer *L, size_t i, const char *lit)
{
    size_t n = strlen(lit);
    return i + n <= L->len && memcmp(L->src + i, lit, n) == 0;
}

/* {% raw %} after "{%" and its sign: *end receives the position after it. */
static bool lex_match_raw_begin(const struct lexer *L, size_t i, size_t *end)
{
    i = lex_skip_space(L, i);
    if (!lex_starts(L, i, "raw"))
        return false;
    i = lex_skip_space(L, i + 3);
    if (lex_starts(L, i, "-%}")) {
        *end = lex_skip_space(L, i + 3);
        return true;
    }
    if (lex_starts(L, i, "%}")) {
        *end = i + 2;
        return true;
    }
    return false;
}

static enum status lex_raw_body(struct lexer *L)
{
    size_t start = L->pos;
    for (size_t q = start; q + 1 < L->len; q++) {
        if (L->src[q] != '{' || L->src[q + 1] != '%')
            continue;
        size_t i = q + 2;
        char sign = 0;
        if (i < L->len && (L->src[i] == '-' || L->src[i] == '+'))
            sign = L->src[i++];
        i = lex_skip_space(L, i);
        if (!lex_starts(L, i, "endraw"))
            continue;
        i = lex_skip_space(L, i + 6);
        size_t end;
        if (lex_starts(L, i, "+%}")) {
            end = i + 3;
        } else if (lex_starts(L, i, "-%}")) {
            end = lex_skip_space(L, i + 3);
        } else if (lex_starts(L, i, "%}")) {
            end = i + 2;
            if (end < L->len && L->src[end] == '\n')
                end++;
        } else {
            continue;
        }
        if (!lex_emit_text(L, start, q - start, sign, true))
            return err_set(L->err, STATUS_NOMEM, "chat template: out of memory");
        L->pos = end;
        L->line_starting = L->src[end - 1] == '\n';
        return STATUS_OK;
    }
    return lex_fail(L, start, "missing end of raw directive");
}

static enum status lex_comment(struct lexer *L, size_t begin, size_t after)
{
    size_t h = after;
    for (;; h++) {
        if (h + 1 >= L->len)
            return lex_fail(L, begin, "missing end of comment tag");
        if (L->src[h] == '#' && L->src[h + 1] == '}')
            break;
    }
    char sign = (h > after && (L->src[h - 1] == '-' || L->src[h - 1] == '+')) ? L->src[h - 1] : 0;
    size_t pos = h + 2;
    if (sign == '-')
        pos = lex_skip_space(L, pos);
    else if (sign == 0 && pos < L->len && L->src[pos] == '\n')
        pos++;
    L->pos = pos;
    L->line_starting = L->src[pos - 1] == '\n';
    return STATUS_OK;
}

static size_t lex_digits(const struct lexer *L, size_t i)
{
    /* (\d+_)*\d+ : returns the end, or i when no digit */
    size_t j = i;
    if (j >= L->len || L->src[j] < '0' || L->src[j] > '9')
        return i;
    for (;;) {
        while (j < L->len && L->src[j] >= '0' && L->src[j] <= '9')
            j++;
        if (j + 1 < L->len && L->src[j] == '_' && L->src[j + 1] >= '0' && L->src[j + 1] <= '9') {
            j++;
            continue;
        }
        return j;
    }
}

/* float_re of jinja2; returns the end or 0 when it does not match. */
static size_t lex_float_end(const struct lexer *L, size_t i)
{
    if (i > 0 && L->src[i - 1] == '.')
        return 0;
    size_t j = lex_digits(L, i);
    if (j == i)
        return 0;
    /* alternative 1: (\.D)? [eE][+-]? D */
    size_t k = j;
    if (k < L->len && L->src[k] == '.') {
        size_t m = lex_digits(L, k + 1);
        if (m != k + 1)
            k = m;
    }
    for (int pass = 0; pass < 2; pass++) {
        size_t e = pass == 0 ? k : j;
        if (e < L->len && (L->src[e] == 'e' || L->src[e] == 'E')) {
            size_t s = e + 1;
            if (s < L->len && (L->src[s] == '+' || L->src[s] == '-'))
                s++;
            size_t m = lex_digits(L, s);
            if (m != s)
                return m;
        }
        if (k == j)
            break;
    }
    /* alternative 2: \.D */
    if (j < L->len && L->src[j] == '.') {
        size_t m = lex_digits(L, j + 1);
        if (m != j + 1)
            return m;
    }
    return 0;
}

static bool lex_is_digit_in(char c, int base)
{
    if (c >= '0' && c <= '9')
        return c - '0' < base;
    if (base == 16)
        return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    return false;
}

/* integer_re of jinja2; returns the end (> i) and the base. */
static size_t lex_int_end(const struct lexer *L, size_t i, int *base)
{
    const char *s = L->src;
    if (s[i] == '0' && i + 1 < L->len) {
        char p = s[i + 1];
        int b = (p == 'b' || p == 'B') ? 2 : (p == 'o' || p == 'O') ? 8 : (p == 'x' || p == 'X') ? 16 : 0;
        if (b) {
            size_t j = i + 2;
            size_t last = 0;
            for (;;) {
                size_t k = j;
                if (k < L->len && s[k] == '_')
                    k++;
                if (k < L->len && lex_is_digit_in(s[k], b)) {
                    j = k + 1;
                    last = j;
                } else {
                    break;
                }
            }
            if (last) {
                *base = b;
                return last;
            }
        }
    }
    *base = 10;
    if (s[i] == '0') { /* 0(_?0)* */
        size_t j = i + 1;
        for (;;) {
            size_t k = j;
            if (k < L->len && s[k] == '_')
                k++;
            if (k < L->len && s[k] == '0')
                j = k + 1;
            else
                return j;
        }
    }
    size_t j = i + 1; /* [1-9](_?\d)* */
    for (;;) {
        size_t k = j;
        if (k < L->len && s[k] == '_')
            k++;
        if (k < L->len && s[k] >= '0' && s[k] <= '9')
            j = k + 1;
        else
            return j;
    }
}

static enum status lex_number(struct lexer *L)
{
    size_t i = L->pos;
    size_t fend = lex_float_end(L, i);
    char buf[128];
    if (fend) {
        size_t n = 0;
        for (size_t k = i; k < fend; k++) {
            if (L->src[k] == '_')
                continue;
            if (n + 1 >= sizeof buf)
                return lex_fail(L, i, "number literal too long");
            buf[n++] = L->src[k];
        }
        buf[n] = '\0';
        if (!lex_emit(L, JT_FLOAT, i, L->src + i, fend - i))
            return err_set(L->err, STATUS_NOMEM, "chat template: out of memory");
        L->toks[L->n - 1].f = strtod(buf, NULL);
        L->pos = fend;
        return STATUS_OK;
    }
    int base;
    size_t end = lex_int_end(L, i, &base);
    uint64_t v = 0;
    for (size_t k = (base == 10 ? i : i + 2); k < end; k++) {
        char c = L->src[k];
        if (c == '_')
            continue;
        unsigned d = (c >= '0' && c <= '9')   ? (unsigned)(c - '0')
                     : (c >= 'a' && c <= 'f') ? (unsigned)(c - 'a' + 10)
                                              : (unsigned)(c - 'A' + 10);
        if (v > (UINT64_MAX - d) / (uint64_t)base || v * (uint64_t)base + d > (uint64_t)INT64_MAX)
            return lex_fail(L, i, "integer literal too large");
        v = v * (uint64_t)base + d;
    }
    if (!lex_emit(L, JT_INT, i, L->src + i, end - i))
        return err_set(L->err, STATUS_NOMEM, "chat template: out of memory");
    L->toks[L->n - 1].i = (int64_t)v;
    L->pos = end;
    return STATUS_OK;
}

static int lex_hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static enum status lex_string(struct lexer *L)
{
    size_t start = L->pos;
    char q = L->src[start];
    size_t i = start + 1;
    while (i < L->len && L->src[i] != q)
        i += (L->src[i] == '\\') ? 2 : 1;
    if (i >= L->len)
        return lex_fail(L, start, "unterminated string literal");
    size_t end = i; /* closing quote */
    struct jbuf b = {0};
    enum status st = STATUS_OK;
    bool ok = true;
    for (i = start + 1; i < end && ok;) {
        char c = L->src[i];
        if (c != '\\') {
            size_t j = i;
            while (j < end && L->src[j] != '\\')
                j++;
            ok = jbuf_put(&b, L->src + i, j - i);
            i = j;
            continue;
        }
        char e = L->src[i + 1];
        i += 2;
        switch (e) {
        case '\n': break;
        case '\\': ok = jbuf_putc(&b, '\\'); break;
        case '\'': ok = jbuf_putc(&b, '\''); break;
        case '"': ok = jbuf_putc(&b, '"'); break;
        case 'a': ok = jbuf_putc(&b, '\a'); break;
        case 'b': ok = jbuf_putc(&b, '\b'); break;
        case 'f': ok = jbuf_putc(&b, '\f'); break;
        case 'n': ok = jbuf_putc(&b, '\n'); break;
        case 'r': ok = jbuf_putc(&b, '\r'); break;
        case 't': ok = jbuf_putc(&b, '\t'); break;
        case 'v': ok = jbuf_putc(&b, '\v'); break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = i + (size_t)k < end ? lex_hex(L->src[i + (size_t)k]) : -1;
                if (h < 0) {
                    st = lex_fail(L, i - 2, "truncated \\%c escape in string literal", e);
                    goto out;
                }
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF) {
                st = lex_fail(L, i - 2, "illegal Unicode character in string literal");
                goto out;
            }
            i += (size_t)nd;
            ok = jbuf_put_cp(&b, cp);
            break;
        }
        case 'N': st = lex_fail(L, i - 2, "\\N{...} escapes are not supported"); goto out;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < end && L->src[i] >= '0' && L->src[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(L->src[i++] - '0');
                ok = jbuf_put_cp(&b, cp);
            } else if ((unsigned char)e >= 0x80) {
                /* backslashreplace turned the character into its own escape,
                 * whose backslash the preceding one then consumed */
                uint32_t cp;
                size_t l = jtext_decode(L->src + i - 1, end - (i - 1), &cp);
                i = i - 1 + l;
                if (cp < 0x100)
                    ok = jbuf_printf(&b, "\\x%02x", cp);
                else if (cp < 0x10000)
                    ok = jbuf_printf(&b, "\\u%04x", cp);
                else
                    ok = jbuf_printf(&b, "\\U%08x", cp);
            } else {
                ok = jbuf_putc(&b, '\\') && jbuf_putc(&b, e);
            }
            break;
        }
    }
    if (!ok) {
        st = err_set(L->err, STATUS_NOMEM, "chat template: out of memory");
        goto out;
    }
    char *s = jarena_strdup(L->a, b.p ? b.p : "", b.len);
    if (!s || !lex_emit(L, JT_STRING, start, s, b.len)) {
        st = err_set(L->err, STATUS_NOMEM, "chat template: out of memory");
        goto out;
    }
    L->pos = end + 1;
out:
    jbuf_free(&b);
    return st;
}

static bool lex_name_char(char c, bool first)
{
    unsigned char u = (unsigned char)c;
    return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_' || u >= 0x80 ||
           (!first && u >= '0' && u <= '9');
}

static enum status lex_operator(struct lexer *L)
{
    static const struct {
        const char *s;
        enum jop op;
    } ops[] = {
        {"//", JOP_FLOORDIV}, {"**", JOP_POW},   {"==", JOP_EQ},      {"!=", JOP_NE},      {">=", JOP_GTEQ},
        {"<=", JOP_LTEQ},     {"+", JOP_ADD},    {"-", JOP_SUB},      {"/", JOP_DIV},      {"*", JOP_MUL},
        {"%", JOP_MOD},       {"~", JOP_TILDE},  {"[", JOP_LBRACKET}, {"]", JOP_RBRACKET}, {"(", JOP_LPAREN},
        {")", JOP_RPAREN},    {"{", JOP_LBRACE}, {"}", JOP_RBRACE},   {">", JOP_GT},       {"<", JOP_LT},
        {"=", JOP_ASSIGN},    {".", JOP_DOT},    {":", JOP_COLON},    {"|", JOP_PIPE},     {",", JOP_COMMA},
        {";", JOP_SEMICOLON},
    };
    size_t start = L->pos;
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        if (!lex_starts(L, start, ops[k].s))
            continue;
        enum jop op = ops[k].op;
        char c = ops[k].s[0];
        if (op == JOP_LPAREN || op == JOP_LBRACKET || op == JOP_LBRACE) {
            if (L->n_bal == LEX_MAX_BALANCE)
                return lex_fail(L, start, "brackets nested too deeply");
            L->bal[L->n_bal++] = op == JOP_LPAREN ? ')' : op == JOP_LBRACKET ? ']' : '}';
        } else if (op == JOP_RPAREN || op == JOP_RBRACKET || op == JOP_RBRACE) {
            if (L->n_bal == 0)
                return lex_fail(L, start, "unexpected '%c'", c);
            char want = L->bal[--L->n_bal];
            if (want != c)
                return lex_fail(L, start, "unexpected '%c', expected '%c'", c, want);
        }
        if (!lex_emit(L, JT_OP, start, L->src + start, strlen(ops[k].s)))
            return err_set(L->err, STATUS_NOMEM, "chat template: out of memory");
        L->toks[L->n - 1].op = (uint8_t)op;
        L->pos = start + strlen(ops[k].s);
        return STATUS_OK;
    }
    uint32_t cp;
    jtext_decode(L->src + start, L->len - start, &cp);
    if (cp >= 0x20 && cp < 0x7F)
        return lex_fail(L, start, "unexpected char '%c'", (char)cp);
    return lex_fail(L, start, "unexpected char U+%04X", cp);
}

/* Inside {{ }} or {% %}: expression tokens up to the end tag (or EOF, which
 * the parser reports with what it expected). */
static enum status lex_tag(struct lexer *L, bool block)
{
    L->n_bal = 0;
    for (;;) {
        size_t p = L->pos;
        if (p >= L->len)
            return STATUS_OK;
        if (L->n_bal == 0) {
            size_t end = 0;
            if (block) {
                if (lex_starts(L, p, "+%}")) {
                    end = p + 3;
                } else if (lex_starts(L, p, "-%}")) {
                    end = lex_skip_space(L, p + 3);
                } else if (lex_starts(L, p, "%}")) {
                    end = p + 2;
                    if (end < L->len && L->src[end] == '\n')
                        end++;
                }
            } else {
                if (lex_starts(L, p, "-}}"))
                    end = lex_skip_space(L, p + 3);
                else if (lex_starts(L, p, "}}"))
                    end = p + 2;
            }
            if (end) {
                if (!lex_emit(L, block ? JT_BLOCK_END : JT_VAR_END, p, L->src + p, end - p))
                    return err_set(L->err, STATUS_NOMEM, "chat template: out of memory");
                L->pos = end;
                L->line_starting = L->src[end - 1] == '\n';
                return STATUS_OK;
            }
        }
        size_t sp = lex_skip_space(L, p);
        if (sp != p) {
            L->pos = sp;
            continue;
        }
        char c = L->src[p];
        enum status st;
        if (c >= '0' && c <= '9') {
            st = lex_number(L);
        } else if (lex_name_char(c, true)) {
            size_t j = p + 1;
            while (j < L->len && lex_name_char(L->src[j], false))
                j++;
            if (!lex_emit(L, JT_NAME, p, L->src + p, j - p))
                return err_set(L->err, STATUS_NOMEM, "chat template: out of memory");
            L->pos = j;
            st = STATUS_OK;
        } else if (c == '\'' || c == '"') {
            st = lex_string(L);
        } else {
            st = lex_operator(L);
        }
        if (st)
            return st;
    }
}

enum status jinja_lex(struct jarena *a, const char *src, size_t len, struct jtok **toks, size_t *n_toks,
                      struct err *err)
{
    struct lexer L = {.a = a, .src = src, .len = len, .line_starting = true, .err = err};
    enum status st = STATUS_OK;
    *toks = NULL;
    *n_toks = 0;
    if (len > UINT32_MAX - 16) {
        st = err_set(err, STATUS_INVALID, "chat template: source too large");
        goto fail;
    }
    while (L.pos < L.len) {
        /* the next {{ {% {# */
        size_t p = L.pos;
        char tag = 0;
        for (; p + 1 < L.len; p++) {
            if (src[p] == '{' && (src[p + 1] == '{' || src[p + 1] == '%' || src[p + 1] == '#')) {
                tag = src[p + 1];
                break;
            }
        }
        if (!tag) {
            if (!lex_emit(&L, JT_DATA, L.pos, src + L.pos, L.len - L.pos))
                goto nomem;
            L.pos = L.len;
            break;
        }
        size_t after = p + 2;
        char sign = 0;
        if (after < L.len && (src[after] == '-' || src[after] == '+'))
            sign = src[after++];
        size_t raw_end = 0;
        bool raw = tag == '%' && lex_match_raw_begin(&L, after, &raw_end);
        if (!lex_emit_text(&L, L.pos, p - L.pos, sign, tag != '{'))
            goto nomem;
        if (raw) {
            L.pos = raw_end;
            L.line_starting = src[raw_end - 1] == '\n';
            st = lex_raw_body(&L);
        } else if (tag == '#') {
            st = lex_comment(&L, p, after);
        } else {
            L.line_starting = false;
            if (!lex_emit(&L, tag == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, p, src + p, after - p))
                goto nomem;
            L.pos = after;
            st = lex_tag(&L, tag == '%');
        }
        if (st)
            goto fail;
    }
    if (!lex_emit(&L, JT_EOF, L.len, src + L.len, 0))
        goto nomem;
    *toks = L.toks;
    *n_toks = L.n;
    return STATUS_OK;
nomem:
    st = err_set(err, STATUS_NOMEM, "chat template: out of memory");
fail:
    free(L.toks);
    return st;
}
