/* grammar_regex.c — a simple regular expression to grammar rules (see grammar_regex.h).
 *
 * Recursive descent over the pattern (alternation, then sequences, then atoms with their
 * quantifiers), each construct becoming a rule. A set of ASCII characters becomes one rule with
 * the printable ones as a byte class and the ones JSON must escape as their escape sequences.
 * Recursion is bounded by the pattern's length (GRAMMAR_REGEX_MAX_LEN) and group depth 32.
 */
#include "engine/grammar_regex.h"

#include <stdio.h>
#include <string.h>

struct rx {
    struct gram_builder *b;
    const char *s, *p; /* the pattern, the parse position */
    int utf8;          /* rule: one non-ASCII character */
    int depth;
    struct err *err;
    bool failed;
};

static int rx_fail(struct rx *x, enum status st, const char *what)
{
    if (!x->failed)
        err_set(x->err, st, "'pattern' \"%.64s\": %s at offset %d", x->s, what, (int)(x->p - x->s));
    x->failed = true;
    return -1;
}

/* A set of ASCII characters (as decoded values) plus, optionally, every non-ASCII character. */
struct rx_set {
    struct gram_class c; /* bits 0..127 */
    bool non_ascii;
};

static void set_add(struct rx_set *s, unsigned lo, unsigned hi)
{
    gram_class_range(&s->c, lo, hi);
}

static void set_negate(struct rx_set *s)
{
    for (unsigned b = 0; b < 128; b++)
        s->c.w[b >> 6] ^= 1ull << (b & 63);
    s->non_ascii = true;
}

/* The rule for a character set in JSON-encoded form. */
static int set_rule(struct rx *x, const struct rx_set *s)
{
    struct gram_builder *b = x->b;
    int r = gram_rule(b);
    struct gram_class plain = {{0}};
    for (unsigned c = 0x20; c < 0x7f; c++)
        if (c != '"' && c != '\\' && gram_class_has(&s->c, c))
            gram_class_range(&plain, c, c);
    if (plain.w[0] | plain.w[1])
        gram_push_class(b, gram_alt(b, r), &plain);
    static const struct {
        unsigned ch;
        const char *esc;
    } escs[] = {{'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"}, {'\b', "\\b"}, {'\f', "\\f"}};
    for (size_t i = 0; i < sizeof escs / sizeof escs[0]; i++)
        if (gram_class_has(&s->c, escs[i].ch))
            gram_push_bytes(b, gram_alt(b, r), escs[i].esc, 2);
    if (s->non_ascii)
        gram_push_ref(b, gram_alt(b, r), x->utf8);
    return r;
}

/* \d \w \s and their negations into s; false if c is none of them. */
static bool class_escape(char c, struct rx_set *s)
{
    struct rx_set t = {0};
    switch (c) {
    case 'd': case 'D': set_add(&t, '0', '9'); break;
    case 'w': case 'W': set_add(&t, '0', '9'), set_add(&t, 'a', 'z'), set_add(&t, 'A', 'Z'), set_add(&t, '_', '_'); break;
    case 's': case 'S': set_add(&t, ' ', ' '), set_add(&t, '\t', '\r'); break;
    default: return false;
    }
    if (c == 'D' || c == 'W' || c == 'S')
        set_negate(&t);
    for (int k = 0; k < 4; k++)
        s->c.w[k] |= t.c.w[k];
    s->non_ascii |= t.non_ascii;
    return true;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One escaped character after the backslash (x->p past it): its code point, or -1 (refused). */
static long escape_char(struct rx *x)
{
    char c = *x->p;
    if (!c)
        return rx_fail(x, STATUS_INVALID, "a pattern ends with a backslash");
    x->p++;
    switch (c) {
    case 't': return '\t';
    case 'n': return '\n';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'u': {
        long v = 0;
        for (int i = 0; i < 4; i++) {
            int h = hexval(x->p[0]);
            if (h < 0)
                return rx_fail(x, STATUS_INVALID, "\\u needs 4 hex digits");
            v = v * 16 + h;
            x->p++;
        }
        if (v >= 0xd800 && v <= 0xdfff)
            return rx_fail(x, STATUS_UNSUPPORTED, "a surrogate \\u escape is not supported");
        return v;
    }
    }
    if (strchr("\\/.-^$*+?()[]{}|\"'", c))
        return (unsigned char)c;
    x->p--;
    return rx_fail(x, STATUS_UNSUPPORTED, "this escape is not supported (\\d \\w \\s \\D \\W \\S, \\t \\n \\r \\f \\v, "
                                          "\\uXXXX and escaped punctuation are)");
}

/* A literal code point as a rule: ASCII through set_rule (escaping), others as their UTF-8 bytes. */
static int char_rule(struct rx *x, long cp)
{
    if (cp < 0x80) {
        if (cp < 0x20 && !strchr("\t\n\r\b\f", (int)cp))
            return rx_fail(x, STATUS_UNSUPPORTED, "a control character other than \\t \\n \\r \\b \\f is not supported");
        struct rx_set s = {0};
        set_add(&s, (unsigned)cp, (unsigned)cp);
        return set_rule(x, &s);
    }
    char u[4];
    int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (n == 2)
        u[0] = (char)(0xc0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3f));
    else if (n == 3)
        u[0] = (char)(0xe0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[2] = (char)(0x80 | (cp & 0x3f));
    else
        u[0] = (char)(0xf0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3f)),
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f));
    return gram_rule_bytes(x->b, u, (size_t)n);
}

/* [...] with x->p past the '[' */
static int class_rule(struct rx *x)
{
    struct rx_set s = {0};
    bool neg = *x->p == '^';
    if (neg)
        x->p++;
    bool first = true;
    while (*x->p && (*x->p != ']' || first)) {
        first = false;
        long lo;
        if (*x->p == '\\') {
            x->p++;
            if (class_escape(*x->p, &s)) {
                x->p++;
                continue;
            }
            lo = escape_char(x);
        } else if ((unsigned char)*x->p >= 0x80) {
            return rx_fail(x, STATUS_UNSUPPORTED, "a non-ASCII character in a class is not supported");
        } else {
            lo = (unsigned char)*x->p++;
        }
        if (lo < 0)
            return -1;
        long hi = lo;
        if (x->p[0] == '-' && x->p[1] && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\') {
                x->p++;
                hi = escape_char(x);
            } else {
                hi = (unsigned char)*x->p++;
            }
            if (hi < 0)
                return -1;
            if (hi < lo)
                return rx_fail(x, STATUS_INVALID, "a class range runs backwards");
        }
        if (hi >= 0x80)
            return rx_fail(x, STATUS_UNSUPPORTED, "a non-ASCII character in a class is not supported");
        set_add(&s, (unsigned)lo, (unsigned)hi);
    }
    if (*x->p != ']')
        return rx_fail(x, STATUS_INVALID, "a class is not closed");
    x->p++;
    if (neg)
        set_negate(&s);
    for (unsigned c = 0; c < 0x20; c++) /* controls JSON cannot carry short: never generated */
        if (!strchr("\t\n\r\b\f", (int)c) || c == 0)
            s.c.w[0] &= ~(1ull << c);
    s.c.w[1] &= ~(1ull << (0x7f - 64)); /* DEL is fine in JSON, but keep classes printable */
    return set_rule(x, &s);
}

static int parse_alt(struct rx *x);

static int parse_atom(struct rx *x)
{
    char c = *x->p;
    if (c == '(') {
        x->p++;
        if (x->p[0] == '?') {
            if (x->p[1] != ':')
                return rx_fail(x, STATUS_UNSUPPORTED, "lookaround and named groups are not supported");
            x->p += 2;
        }
        if (++x->depth > 32)
            return rx_fail(x, STATUS_INVALID, "groups nest deeper than 32");
        int r = parse_alt(x);
        x->depth--;
        if (r < 0)
            return -1;
        if (*x->p != ')')
            return rx_fail(x, STATUS_INVALID, "a group is not closed");
        x->p++;
        return r;
    }
    if (c == '[') {
        x->p++;
        return class_rule(x);
    }
    if (c == '.') {
        x->p++;
        struct rx_set s = {0};
        set_add(&s, 0x20, 0x7e);
        set_add(&s, '\t', '\t');
        s.non_ascii = true;
        return set_rule(x, &s);
    }
    if (c == '\\') {
        x->p++;
        struct rx_set s = {0};
        if (class_escape(*x->p, &s)) {
            x->p++;
            return set_rule(x, &s);
        }
        long cp = escape_char(x);
        return cp < 0 ? -1 : char_rule(x, cp);
    }
    if (c == '^' || c == '$')
        return rx_fail(x, STATUS_UNSUPPORTED, "an anchor other than a leading ^ or a trailing $ is not supported");
    if (strchr("*+?{", c))
        return rx_fail(x, STATUS_INVALID, "a quantifier follows nothing");
    if (c == ')' || c == ']' || c == '}')
        return rx_fail(x, STATUS_INVALID, "an unmatched bracket");
    /* a literal character: one whole UTF-8 sequence */
    unsigned char u = (unsigned char)c;
    int n = u < 0x80 ? 1 : u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : 2;
    long cp = n == 1 ? u : (long)(u & (0x3f >> (n - 1)));
    for (int i = 1; i < n; i++) {
        unsigned char k = (unsigned char)x->p[i];
        if ((k & 0xc0) != 0x80)
            return rx_fail(x, STATUS_INVALID, "broken UTF-8");
        cp = (cp << 6) | (k & 0x3f);
    }
    x->p += n;
    return char_rule(x, cp);
}

static bool read_int(struct rx *x, int *out)
{
    if (*x->p < '0' || *x->p > '9')
        return false;
    long v = 0;
    while (*x->p >= '0' && *x->p <= '9' && v <= GRAMMAR_REGEX_MAX_REPEAT)
        v = v * 10 + (*x->p++ - '0');
    *out = (int)v;
    return true;
}

/* atom with an optional quantifier */
static int parse_piece(struct rx *x)
{
    int r = parse_atom(x);
    if (r < 0)
        return -1;
    int min = 1, max = 1;
    char c = *x->p;
    if (c == '*')
        min = 0, max = -1, x->p++;
    else if (c == '+')
        min = 1, max = -1, x->p++;
    else if (c == '?')
        min = 0, max = 1, x->p++;
    else if (c == '{') {
        const char *at = x->p++;
        if (!read_int(x, &min)) {
            x->p = at;
            return rx_fail(x, STATUS_UNSUPPORTED, "'{' is a quantifier here and needs {n}, {n,} or {n,m}");
        }
        max = min;
        if (*x->p == ',') {
            x->p++;
            max = -1;
            if (*x->p != '}' && !read_int(x, &max))
                return rx_fail(x, STATUS_INVALID, "a bad {n,m}");
        }
        if (*x->p != '}')
            return rx_fail(x, STATUS_INVALID, "a bad {n,m}");
        x->p++;
        if (min > GRAMMAR_REGEX_MAX_REPEAT || max > GRAMMAR_REGEX_MAX_REPEAT)
            return rx_fail(x, STATUS_INVALID, "a repetition bound above 1000");
        if (max >= 0 && max < min)
            return rx_fail(x, STATUS_INVALID, "{n,m} with m < n");
    } else {
        return r;
    }
    if (*x->p == '?' || *x->p == '+')
        return rx_fail(x, STATUS_UNSUPPORTED, "lazy and possessive quantifiers are not supported");
    return gram_repeat(x->b, r, -1, min, max);
}

static int parse_seq(struct rx *x)
{
    int r = gram_rule(x->b);
    int a = gram_alt(x->b, r);
    while (*x->p && *x->p != '|' && *x->p != ')' && !(x->p[0] == '$' && x->p[1] == 0 && x->depth == 0)) {
        int piece = parse_piece(x);
        if (piece < 0)
            return -1;
        gram_push_ref(x->b, a, piece);
    }
    return r;
}

static int parse_alt(struct rx *x)
{
    int r = gram_rule(x->b);
    for (;;) {
        int s = parse_seq(x);
        if (s < 0)
            return -1;
        gram_push_ref(x->b, gram_alt(x->b, r), s);
        if (*x->p != '|')
            return r;
        x->p++;
    }
}

int grammar_regex_rule(struct gram_builder *b, const char *pattern, int utf8, struct err *err)
{
    struct rx x = {.b = b, .s = pattern, .p = pattern, .utf8 = utf8, .err = err};
    if (strlen(pattern) > GRAMMAR_REGEX_MAX_LEN)
        return rx_fail(&x, STATUS_INVALID, "longer than 1024 bytes");
    bool start = *x.p == '^';
    if (start)
        x.p++;
    int body = parse_alt(&x);
    if (body < 0)
        return -1;
    bool end = *x.p == '$';
    if (end)
        x.p++;
    if (*x.p)
        return rx_fail(&x, STATUS_INVALID, "an unmatched ')'");
    /* unanchored sides: any characters there */
    struct rx_set any = {0};
    set_add(&any, 0x20, 0x7e);
    set_add(&any, '\t', '\n');
    set_add(&any, '\r', '\r');
    any.non_ascii = true;
    int r = gram_rule(b);
    int a = gram_alt(b, r);
    if (!start)
        gram_push_ref(b, a, gram_repeat(b, set_rule(&x, &any), -1, 0, -1));
    gram_push_ref(b, a, body);
    if (!end)
        gram_push_ref(b, a, gram_repeat(b, set_rule(&x, &any), -1, 0, -1));
    return r;
}
